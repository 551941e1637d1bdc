// Memory: what the database code is written against. Global addresses (server 16 bits +
// offset 48), reads, writes, 8-byte compare-and-swap and fetch-and-add, allocation, and
// batches (post many, wait once). Two implementations with the same address format:
//   PoolMemory   the memory pool (include/farpool/pool.h): the `pool` engine.
//   LocalMemory  regions of this process's RAM: the `local` engine (and the index tests).
// The same database code runs on both. (The `sharded` engine's partitions keep their rows in
// ordinary maps, db/shard_server.h, not in a Memory.)
//
// Semantics follow Pool: atomics are atomic w.r.t. each other on 8-byte aligned words; plain
// reads and writes of the same bytes race (the database detects torn reads by checksums);
// a sync call is complete (visible to everyone) when it returns; operations of one batch are
// unordered except across a Fence (per server); Wait completes them all.
//
// Thread-safety: Memory is safe for concurrent use; a MemoryBatch belongs to one thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "farpool/address.h"
#include "farpool/db.h"
#include "farpool/pool.h"
#include "farpool/status.h"

namespace farpool::db {

// Operation counts of a session (the caller passes its own). Safe for concurrent use: the
// process's system session (DDL, recycler, reclamation) is used by the maintenance thread and
// by the threads that open sessions or run DDL at the same time, so its counts are shared.
// Relaxed: the counts order nothing.
//
// `round_trips` is the dependency depth of the session's memory accesses, the same on every
// fabric: a sync operation is one round trip, a batch is one round trip however many
// operations (and servers) it has, since its operations go out together and one Wait
// completes them. Across a network each round trip costs one network latency, so this count
// times the fabric's latency is what a transaction waits for (allocation is local but for the
// occasional chunk lease, which is not counted).
//
// `by_cause` splits round_trips by what they were for (RoundTripCause of db.h): the cause the
// calling thread's innermost RoundTripScope names (kOther outside any).
struct OpCount {
  std::atomic<uint64_t> reads{0}, writes{0}, cas{0}, faa{0}, round_trips{0};
  std::array<std::atomic<uint64_t>, kRoundTripCauses> by_cause{};
  static void Bump(std::atomic<uint64_t>& n) { n.fetch_add(1, std::memory_order_relaxed); }
  // One round trip, under the calling thread's cause.
  void Trip();
};

// Names the cause of the round trips the calling thread waits for while it lives (OpCount::
// by_cause); scopes nest, and the innermost counts. Per thread: a session belongs to one thread
// at a time, and threads that share the process's system session count each their own cause.
class RoundTripScope {
 public:
  explicit RoundTripScope(RoundTripCause cause) : previous_(current_) { current_ = cause; }
  ~RoundTripScope() { current_ = previous_; }
  RoundTripScope(const RoundTripScope&) = delete;
  RoundTripScope& operator=(const RoundTripScope&) = delete;
  // Changes the innermost scope's cause (for a step whose cause is known only once it is
  // posted).
  static void Set(RoundTripCause cause) { current_ = cause; }
  static RoundTripCause current() { return current_; }

 private:
  RoundTripCause previous_;
  static inline thread_local RoundTripCause current_ = RoundTripCause::kOther;
};

inline void OpCount::Trip() {
  Bump(round_trips);
  Bump(by_cause[static_cast<size_t>(RoundTripScope::current())]);
}

class MemoryBatch {
 public:
  virtual ~MemoryBatch() = default;
  virtual Status Read(GlobalAddress source, void* destination, uint64_t size) = 0;
  virtual Status Write(GlobalAddress destination, const void* source, uint64_t size) = 0;
  virtual Status CompareAndSwap(GlobalAddress address, uint64_t expected, uint64_t desired,
                                uint64_t* previous) = 0;
  virtual Status FetchAdd(GlobalAddress address, uint64_t delta, uint64_t* previous) = 0;
  // Batch::WaitCompareAndSwap of pool.h: a compare-and-swap that the memory server holds back
  // while the word is held (up to spec.wait; the operations after it to that server wait with
  // it), where the memory has one (the pool over messages); one attempt everywhere else.
  virtual Status WaitCompareAndSwap(GlobalAddress address, uint64_t expected, uint64_t desired,
                                    const WaitSpec& spec, WaitCasResult* result) = 0;
  // Batch::LookupRead of pool.h: find `key` in the bucket chain at `bucket` and read
  // `record_size` bytes at its value, in this batch's round trip where the memory allows
  // (the pool over messages or mapped, local memory); `result` says what was done.
  virtual Status LookupRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key,
                            void* record, uint32_t record_size, LookupResult* result) = 0;
  // Batch::LookupLockRead of pool.h: LookupRead, and where the record is read in this round
  // trip its lock word (at `lock_offset`) taken first if free ((word & held_mask) == 0; never
  // waits); `result` says what was found and whether it was locked.
  virtual Status LookupLockRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key,
                                uint32_t lock_offset, uint64_t held_mask, uint64_t lock_word,
                                void* record, uint32_t record_size, LockReadResult* result) = 0;
  // Batch::InsertIfAbsent of pool.h: insert (key, value) into the bucket chain at `bucket`
  // under its lock word, as one operation where the memory allows it (the pool over messages
  // or mapped, local memory); kNotDone where it does not (the caller inserts one-sided).
  virtual Status InsertIfAbsent(GlobalAddress bucket, const LookupSpec& spec, uint32_t lock_offset,
                                uint64_t lock_word, uint64_t key, uint64_t value,
                                InsertResult* result) = 0;
  // Operations posted after it take effect at a server after those posted before it to that
  // server (Batch::Fence of pool.h): e.g. install a record's cells, fence, unlock it, in one
  // round trip. No order across servers.
  virtual Status Fence() = 0;
  virtual Status Wait() = 0;
  virtual size_t posted() const = 0;
};

class Memory {
 public:
  virtual ~Memory() = default;
  virtual Status Read(GlobalAddress source, void* destination, uint64_t size) = 0;
  virtual Status Write(GlobalAddress destination, const void* source, uint64_t size) = 0;
  virtual Result<uint64_t> CompareAndSwap(GlobalAddress address, uint64_t expected,
                                          uint64_t desired) = 0;
  virtual Result<uint64_t> FetchAdd(GlobalAddress address, uint64_t delta) = 0;
  // Zero-filled is NOT promised: callers initialise what they allocate.
  virtual Result<GlobalAddress> Alloc(uint64_t size, Placement placement) = 0;
  virtual Status Free(GlobalAddress address) = 0;
  // Shared leases (Pool::LeaseRun): runs of whole chunks that any process may release.
  virtual Result<GlobalAddress> LeaseRun(uint16_t server, uint64_t size) = 0;
  virtual Status ReleaseRun(GlobalAddress start, uint64_t size) = 0;
  virtual Result<RegionGeometry> Geometry(uint16_t server) const = 0;
  // The server Alloc(size, placement) would use first (Pool::ServerFor).
  virtual Result<uint16_t> ServerFor(Placement placement) = 0;
  virtual std::unique_ptr<MemoryBatch> NewBatch() = 0;
  // Takes back a batch of NewBatch for reuse by later NewBatch calls of the same thread (a
  // batch may be bound to the thread that made it), or drops it.
  // REQUIRES: `batch` came from this Memory's NewBatch on this thread and has nothing posted.
  virtual void RecycleBatch(std::unique_ptr<MemoryBatch> batch) { batch.reset(); }
  virtual std::vector<uint16_t> servers() const = 0;
  // The well-known root area (Pool::kRootSize bytes, zero at start) of the first server.
  virtual GlobalAddress Root() const = 0;
  // This process's identity to the memory (Pool::process_tag): nonzero, the same for every
  // thread of the process, another for every other process.
  virtual uint32_t process_tag() const = 0;
  // Pool::Evict: once Ok, the process tagged `tag` can reach this memory no more (killed if it
  // mapped it, disconnected otherwise). REQUIRES: `tag` is not process_tag().
  virtual Status Evict(uint32_t tag) = 0;
  // Whether every server's memory is mapped into this process at construction (Pool::
  // AccessPath "direct", and local memory): reads are loads and a round trip waits for
  // nothing, so reading ahead on a guess saves no time and costs copies.
  virtual bool mapped() const = 0;
  // Pool::replicated: a failure of a server may pass (failover to its backup).
  virtual bool replicated() const = 0;
  // Pool::ConnectThread: the calling thread connected to every memory server now, for a
  // thread whose later calls have deadlines (local memory has nothing to connect).
  virtual Status ConnectThread() = 0;
};

// REQUIRES: `pool` outlives the PoolMemory.
std::unique_ptr<Memory> NewPoolMemory(Pool& pool);

// `servers` regions of `bytes_per_server` bytes each (reserved, committed on first touch).
Result<std::unique_ptr<Memory>> NewLocalMemory(int servers, uint64_t bytes_per_server);

// The database's handle on memory: forwards to a Memory and counts every operation in the
// calling session's OpCount (reads_per_txn etc. of the benchmark). Not owning; safe for
// concurrent use (a Batch belongs to one thread).
class Access {
 public:
  Access(Memory& memory, OpCount& count) : memory_(&memory), count_(&count) {}
  Memory& memory() const { return *memory_; }
  OpCount& count() const { return *count_; }

  // Sync operations: one round trip each.
  Status Read(GlobalAddress a, void* d, uint64_t n) const {
    Sync(count_->reads);
    return memory_->Read(a, d, n);
  }
  Status Write(GlobalAddress a, const void* s, uint64_t n) const {
    Sync(count_->writes);
    return memory_->Write(a, s, n);
  }
  Result<uint64_t> Cas(GlobalAddress a, uint64_t expected, uint64_t desired) const {
    Sync(count_->cas);
    return memory_->CompareAndSwap(a, expected, desired);
  }
  Result<uint64_t> Faa(GlobalAddress a, uint64_t delta) const {
    Sync(count_->faa);
    return memory_->FetchAdd(a, delta);
  }
  Result<GlobalAddress> Alloc(uint64_t size, Placement p = Placement::Striped()) const {
    return memory_->Alloc(size, p);
  }
  Status Free(GlobalAddress a) const { return memory_->Free(a); }

  // A batch that counts what it posts, and one round trip per Wait that has something to wait
  // for. The memory's batch is made at the first post, so a batch that turns out empty costs
  // nothing.
  class Batch {
   public:
    explicit Batch(const Access& access) : memory_(access.memory_), count_(access.count_) {}
    ~Batch() {
      if (!batch_) return;
      if (batch_->posted() > 0) (void)batch_->Wait();  // an error path: completes them
      memory_->RecycleBatch(std::move(batch_));
    }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
    Status Read(GlobalAddress a, void* d, uint64_t n) {
      OpCount::Bump(count_->reads);
      return Get().Read(a, d, n);
    }
    Status Write(GlobalAddress a, const void* s, uint64_t n) {
      OpCount::Bump(count_->writes);
      return Get().Write(a, s, n);
    }
    Status Cas(GlobalAddress a, uint64_t expected, uint64_t desired, uint64_t* previous) {
      OpCount::Bump(count_->cas);
      return Get().CompareAndSwap(a, expected, desired, previous);
    }
    Status Faa(GlobalAddress a, uint64_t delta, uint64_t* previous) {
      OpCount::Bump(count_->faa);
      return Get().FetchAdd(a, delta, previous);
    }
    // Counted as one CAS, or with spec.wait_only as one read (however long the server held
    // it).
    Status WaitCas(GlobalAddress a, uint64_t expected, uint64_t desired, const WaitSpec& spec,
                   WaitCasResult* result) {
      OpCount::Bump(spec.wait_only ? count_->reads : count_->cas);
      return Get().WaitCompareAndSwap(a, expected, desired, spec, result);
    }
    // Counted as one read (what it replaces: the head bucket's read, and the record's when
    // that is read too, which the caller's next round trip no longer does).
    Status LookupRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key, void* record,
                      uint32_t record_size, LookupResult* result) {
      OpCount::Bump(count_->reads);
      return Get().LookupRead(bucket, spec, key, record, record_size, result);
    }
    // Counted as one read and one CAS (the lookup-read and the lock it replaces).
    Status LookupLockRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key,
                          uint32_t lock_offset, uint64_t held_mask, uint64_t lock_word,
                          void* record, uint32_t record_size, LockReadResult* result) {
      OpCount::Bump(count_->reads);
      OpCount::Bump(count_->cas);
      return Get().LookupLockRead(bucket, spec, key, lock_offset, held_mask, lock_word, record,
                                  record_size, result);
    }
    // Counted as one CAS (the head lock's: what a one-sided insert would start with).
    Status InsertIfAbsent(GlobalAddress bucket, const LookupSpec& spec, uint32_t lock_offset,
                          uint64_t lock_word, uint64_t key, uint64_t value, InsertResult* result) {
      OpCount::Bump(count_->cas);
      return Get().InsertIfAbsent(bucket, spec, lock_offset, lock_word, key, value, result);
    }
    Status Fence() { return Get().Fence(); }
    Status Wait() {
      if (posted() == 0) return batch_ ? batch_->Wait() : Status::Ok();
      count_->Trip();
      return batch_->Wait();
    }
    size_t posted() const { return batch_ ? batch_->posted() : 0; }

   private:
    MemoryBatch& Get() {
      if (!batch_) batch_ = memory_->NewBatch();
      return *batch_;
    }
    Memory* memory_;
    std::unique_ptr<MemoryBatch> batch_;
    OpCount* count_;
  };

 private:
  void Sync(std::atomic<uint64_t>& op) const {
    OpCount::Bump(op);
    count_->Trip();
  }
  Memory* memory_;
  OpCount* count_;
};

// Writes zeros over `size` bytes at `address` (in writes of at most 1 MiB).
Status WriteZeros(const Access& access, GlobalAddress address, uint64_t size);

// Allocates `size` bytes and writes zeros over them (Memory::Alloc does not promise zeroed
// memory): what the database's fixed structures start from.
Result<GlobalAddress> AllocZeroed(const Access& access, uint64_t size, Placement placement);

}  // namespace farpool::db
