// Internals of the NAM engines (`pool` and `local`), shared by the files of src/db/nam/:
//   catalog.cc   the root, table descriptors, DDL, opening the database
//   sessions.cc  session slots, leases, fencing, the renewal and maintenance threads, Begin
//   recovery.cc  finishing a dead session's decided commit, breaking its locks
//   read.cc      consistent record images, snapshot visibility, Get/Put/Delete/Scan
//   commit.cc    Commit as phases: resolve, lock+validate, decide (log), install, release
//   gc.cc        the low-water mark, the recycler (slab chunks in the pool), reclamation
//
// How it works (docs/database.md has the full story and the reasoning):
//
// Timestamps: one commit counter in the root. A transaction's first read reads it (8 bytes,
// in the same round trip as that read's index lookups; the records are read after it
// returned); a commit takes its stamp with one fetch-and-add after it has locked its write
// set, so a reader whose snapshot includes a stamp meets that writer's lock until the version
// is installed and waits for it.
//
// Leases and fencing: a session owns a slot whose owner word is | renewals | epoch | state |.
// The process's renewal thread renews it (CAS, renewals + 1) every lease/4; that thread does
// nothing else, so no amount of reclamation work can delay a renewal. A session trusts its
// lease for lease - margin after sending its last successful renewal (monotonic clock); others
// judge it expired only after seeing its owner word unchanged for lease + margin on their own
// monotonic clock, and act on an expired slot only after fencing it (CAS that bumps the epoch).
// No wall clock is compared across processes. A session's lock word carries its epoch, so a
// fenced session's locks are recognisable; it releases them only by CAS from its own word.
// What a lock proves, and when: reads made under a lock count only once a later lease check
// passed (until then the lock may have been broken and the data rewritten, freed, recycled);
// a store follows a passed check directly (one batch); and memory freed on the strength of a
// lock (a trimmed chain) is freed only after the release CAS from our own word succeeded.
//
// Locking reads (GetForUpdate) and read committed: see read.cc. A record locked at read carries
// the holder's read-lock word, which readers pass by and recovery treats as an undecided lock
// (layout.h ReadLockWord); the commit takes such locks over in its lock round. With the update
// intent (LockIntent::kUpdate) it carries the plain lock word, readers wait for it, and the
// round that took it also inserted the pending new keys and read what the commit's lock round
// reads (NamTxn::CommitPrep), so that round is skipped (CommitRun::LockedAtRead). A read committed
// transaction's locking read announces records-only (kAnnounceRecordsOnly): it needs records
// not freed, never an old version.
//
// Garbage collection: each session announces a lower bound of its snapshot in the
// announcement array (one word per slot, 0 when idle); it writes the bound before it reads the
// counter, so a snapshot is never smaller than what any reader of the array may have seen or
// later snapshots will be. A version can be read only by a snapshot older than its
// successor's stamp. A commit that evicts the oldest cell S-3 of a record reads the array (in
// the lock batch: no extra round trip) and spills S-3 to the record's chain only if some
// announcement is below stamp(S-2); otherwise it drops it and frees its blobs. If no
// announcement is below stamp(S-3), the chain of older versions is garbage: the commit cuts it
// and hands it to the maintenance thread to free. Freed
// objects go back to their slab chunks in the pool (see Recycler): any process may free any
// process's objects, and a chunk whose objects are all free goes back to its server. The low-water
// mark (min of the array, or the counter when all are idle) is kept per process by the maintenance
// thread for dropped tables and for reports.
#pragma once

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "db/index/btree.h"
#include "db/index/hash_index.h"
#include "db/layout.h"
#include "db/lock_owner.h"
#include "db/memory.h"
#include "db/testing_hooks.h"
#include "farpool/db.h"

namespace farpool::db {

// ---------------------------------------------------------------- layouts in memory

inline constexpr uint64_t kMagic = 0x4650444200000007ULL;  // "FPDB" v7
// An announcement (a lower bound of a session's snapshot, in the announcement array) with this
// bit set protects only records, not versions: its session reads no version older than the
// newest (NamSession::PostSnapshot, versions = false). The LWM counts it (bit cleared); the
// decisions of version GC (a commit's spills, cuts and trims) pass it by. Counters never reach
// the bit.
inline constexpr uint64_t kAnnounceRecordsOnly = uint64_t{1} << 62;
inline constexpr uint64_t kMaxTables = 256;
inline constexpr uint64_t kDescSize = 1024;
inline constexpr uint64_t kSlotSize = 64;
inline constexpr uint64_t kLogBytes = 256 << 10;
inline constexpr uint64_t kStateCreating = 1, kStateReady = 2;

// The catalog root at Memory::Root().
struct RootImage {
  uint64_t state, magic, max_slots, lease_ms;
  uint64_t slots;         // slot table: max_slots × kSlotSize
  uint64_t tables;        // kMaxTables descriptors of kDescSize
  uint64_t counter;       // the commit counter (fetch-and-add); starts at 1
  uint64_t ddl;           // DDL lock: holder's lock word, 0 when free
  uint64_t chunk_dirs;    // Recycler: the table of per-server chunk directories
  uint64_t incarnations;  // counter: every created table gets a new incarnation
  uint64_t snapshots;     // announcement array: max_slots words
};
inline constexpr uint64_t kRootCounter = offsetof(RootImage, counter);
inline constexpr uint64_t kRootDdl = offsetof(RootImage, ddl);
inline constexpr uint64_t kRootIncarnations = offsetof(RootImage, incarnations);

struct TableDesc {
  uint64_t state;        // kDescEmpty, kDescLive, kDescDropped
  uint64_t incarnation;  // next to the state: one 16-byte read says "still this live table"
  char name[64];
  uint64_t flags;  // bit 0: ordered
  uint64_t payload;
  // The hash index: hash_arrays arrays of hash_count buckets, the first at hash_addr, the
  // others in hash_more (one per memory server, up to kMaxHashArrays; HashIndex::CreateStriped).
  uint64_t hash_addr, hash_count, hash_seed;
  uint64_t btree_root;  // root word of the B+tree (this field's address is the root word)
  // Dropped: the lock word of the system session that is to reclaim the table (whoever CASes
  // it from a dead holder's word to its own takes the job over), kReclaimStarted once its
  // reclamation began.
  uint64_t reclaimer;
  uint64_t ncols;
  struct {
    char name[24];
    uint32_t type;
    uint32_t length;
  } cols[Schema::kMaxColumns];
  uint64_t hash_arrays;
  uint64_t hash_more[31];
};
inline constexpr uint64_t kMaxHashArrays = 32;
static_assert(sizeof(TableDesc) <= kDescSize);
static_assert(sizeof(TableDesc::hash_more) / 8 == kMaxHashArrays - 1);
inline constexpr uint64_t kDescEmpty = 0, kDescLive = 1, kDescDropped = 2;
// A table being bulk loaded (bulk_load.cc): invisible (only kDescLive tables are opened), its
// `reclaimer` the loader session's lock word until it is published (kDescLive) or handed to
// the garbage collector. The GC adopts it as a dropped table once that session is dead.
inline constexpr uint64_t kDescLoading = 3;
inline constexpr uint64_t kDescBtreeRoot = offsetof(TableDesc, btree_root);
inline constexpr uint64_t kDescReclaimer = offsetof(TableDesc, reclaimer);
inline constexpr uint64_t kReclaimStarted = 2;  // no lock word is even

// A session slot.
struct SlotImage {
  uint64_t owner;      // OwnerWord
  uint64_t log;        // commit log (kLogBytes), allocated once per slot
  uint64_t index_log;  // index redo area (LockOwner::kIndexLogBytes)
  uint64_t pid;
  uint64_t pad[4];
};
static_assert(sizeof(SlotImage) == kSlotSize);
inline constexpr uint64_t kSlotLog = offsetof(SlotImage, log);
inline constexpr uint64_t kSlotIndexLog = offsetof(SlotImage, index_log);
inline constexpr uint64_t kSlotPid = offsetof(SlotImage, pid);

// Owner word: tag (32 bits) << 32 | renewals (6 bits) << 26 | epoch (24 bits) << 2 | state.
// The tag is the pool process tag (Pool::process_tag) of the process that may write on the
// slot's behalf: the session's while active, the recoverer's while recovering (0: a recovery
// given up, nobody writes for it), 0 when free. Fencing an active or recovering slot first
// evicts that process from every memory server (FenceAndRecover): a process stopped between a
// lease check and a store can then never land that store. Renewals only need to change the
// word between two observations lease + margin apart, so 6 bits (wrapping) are plenty.
inline constexpr uint64_t kSlotFree = 0, kSlotActive = 1, kSlotRecovering = 2;
inline constexpr uint64_t kOwnerEpochMask = (1u << 24) - 1;
inline uint64_t OwnerWord(uint64_t epoch, uint64_t state, uint32_t tag, uint64_t renewals = 0) {
  return (uint64_t{tag} << 32) | ((renewals & 63) << 26) | ((epoch & kOwnerEpochMask) << 2) | state;
}
inline uint64_t OwnerEpoch(uint64_t w) { return (w >> 2) & kOwnerEpochMask; }
inline uint64_t OwnerState(uint64_t w) { return w & 3; }
inline uint32_t OwnerTag(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
inline uint64_t OwnerRenewed(uint64_t w) {
  return OwnerWord(OwnerEpoch(w), OwnerState(w), OwnerTag(w), ((w >> 26) & 63) + 1);
}

// Commit log: header, then per record a LogEntry, the new cell image and (if spill) the
// spilled old version's image. The log is written in the same batch as the fetch-and-add that
// gives the commit its stamp, so its cell images carry stamp 0: recovery stamps them (with the
// stamp of a new cell the writer installed, or with a stamp of its own if it installed none;
// see recovery.cc).
struct LogHeader {
  uint64_t state;   // LogState(epoch, number) while a decided commit may be unfinished, else 0
  uint64_t number;  // the session's count of logged commits: no two logs of an epoch alike
  uint64_t count;
  uint64_t bytes;
  uint64_t checksum;  // LogChecksum: of the four words above and the entries
  uint64_t pad[3];
};
static_assert(sizeof(LogHeader) == 64);
// The state names the writer's epoch and (36 bits of) its commit number, and the checksum
// covers the header: a log torn by a crash mid-write never verifies with a previous commit's
// checksum and entries, which stay in the area after it is cleared (clearing is one CAS of
// the state word).
inline uint64_t LogState(uint64_t epoch, uint64_t number) {
  return ((number & ((uint64_t{1} << 36) - 1)) << 28) | ((epoch & kOwnerEpochMask) << 2) | 1;
}
inline bool LogDecided(uint64_t state) { return (state & 3) == 1; }
inline uint64_t LogEpoch(uint64_t state) { return (state >> 2) & kOwnerEpochMask; }
inline uint64_t LogChecksum(const LogHeader& h, const unsigned char* entries) {
  return Checksum(&h, 32) ^ Mix64(Checksum(entries, h.bytes));
}
// An entry names its record by address, key and version: the address alone may name memory
// freed and reused since by another key's record (recovery.cc rolls an entry only into a
// record that holds `key` at `new_seq` or the version before it).
struct LogEntry {
  uint64_t record;
  uint64_t spill;  // address of the spilled old version, 0 if none
  uint64_t new_seq;
  int64_t key;  // the key the record holds (its header's second word)
  uint32_t cell_offset;
  uint32_t cell_size;
};
static_assert(sizeof(LogEntry) == 40);
// After the entries the log lists the addresses (8 bytes each) of the committing session's
// stamp words on the servers of its records. The third round of a commit writes the stamp
// into the word on each server, then installs and unlocks there (behind a fence): a record
// the commit unlocked proves that its server's word holds the stamp, so recovery finds it
// even when every record still locked shows nothing installed (commit.cc, recovery.cc).
struct StampWordImage {
  uint64_t stamp;
  uint64_t check;  // StampCheck: ties the stamp to one commit log; a stale or torn word fails
};
static_assert(sizeof(StampWordImage) == 16);
inline uint64_t StampCheck(uint64_t stamp, uint32_t slot, uint64_t log_state) {
  return Mix64(stamp ^ Mix64(log_state + slot));
}

// ---------------------------------------------------------------- helpers

// Lease time: CLOCK_BOOTTIME, monotonic and (unlike CLOCK_MONOTONIC) still running while the
// host is suspended, so a session never trusts a lease across a suspend.
inline int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

class NamDatabase;
class NamSession;

// ---------------------------------------------------------------- tables

class NamTable final : public Table {
 public:
  uint32_t id() const override { return id_; }
  const std::string& name() const override { return name_; }
  const Schema& schema() const override { return schema_; }
  bool ordered() const override { return btree_.has_value(); }

  uint32_t id_ = 0;
  uint64_t incarnation_ = 0;
  std::string name_;
  Schema schema_;
  RecordLayout layout_;
  GlobalAddress desc_;
  std::optional<HashIndex> hash_;
  std::optional<BTree> btree_;
  std::vector<uint32_t> bytes_columns_;
};

// The blob references (address, length) held in a version's payload.
std::vector<std::pair<GlobalAddress, uint64_t>> BlobRefs(const NamTable& t,
                                                         const unsigned char* payload);

// ---------------------------------------------------------------- recycler

// Recycler: the database's allocator for objects that any process may free (records, versions
// spilled to chains, blobs, index nodes and arrays). The pool's own allocator is per client: a
// client can free only what it allocated, and a compute process that dies leaves its objects
// leased. Database objects outlive processes and are freed by whichever process finds them
// garbage; and memory that the database no longer uses goes back to the memory servers.
//
// How it works: power-of-two size classes (64 B .. 2^40). Objects of up to a quarter chunk
// live in *slab chunks*: shared leases (Memory::LeaseRun) of one chunk each, holding objects
// of one class, a bitmap of the slots in use at the chunk's start, then the slots. Each server
// has a *directory* on itself, one word per chunk of its region (root: chunk_dirs), that says
// for every chunk: state (open / withdrawn / neither), class, generation, and `live`, the
// number of its slots handed out (in use, or cached by some process). Bigger objects are
// runs of whole chunks of their own, leased at Alloc and released at Free.
//   - Reserve (a process's cache of a class on a server is empty): read the server's
//     directory, pick the fullest open chunk of the class with room for a whole reservation
//     (else the fullest with any room), CAS its word live ->
//     live + k (only from an open word: a withdrawn chunk is never reserved from), then claim
//     k clear bits of its bitmap by CAS. No open chunk with room: lease a new one, write its
//     bitmap (k bits set) and CAS its word to open with the next generation, live = k.
//   - Return (a cache past its bound; a cache idle for a maintenance period; Flush at close):
//     in one batch per server, clear the objects' bits (fetch-and-add of minus the mask), a
//     fence, then fetch-and-add the word by minus the count. The process whose subtraction
//     brought live to 0 CASes the word from (open, live 0) to withdrawn; if that CAS wins it
//     alone owns the chunk and releases it to its server (Memory::ReleaseRun). A reserver's
//     CAS from (open, live 0) to live k that lands first makes the withdrawal fail: the chunk
//     stays open. The chunk's memory is touched only by holders of a count on it (bits are
//     cleared before the count is given back), so nobody touches a released chunk.
// Invariants: for an open chunk, bits set (padding bits past the last slot excluded) <= live
// <= slots; a withdrawn chunk has live 0 and exactly one process releasing it; an object is in
// at most one process's cache or in use, never both.
// What a death leaks (bounded, documented in docs/database.md): a process killed with objects
// in its caches leaves their bits set and their counts held, so those chunks never empty (at
// most 2 reservations per class and server it used, returned within a maintenance period when
// idle); one killed between a return's bit clearing and its count subtraction, between a
// withdrawal and its release, or between leasing a chunk and opening it, leaks that chunk.
//
// Thread-safety: safe for concurrent use (one mutex per process; pool-side words by CAS/FAA).
class Recycler {
 public:
  static constexpr int kMinClass = 6, kClasses = 41;  // 64 B .. 2^40

  // Writes the per-server directories and the table naming them; returns the table's
  // address (RootImage::chunk_dirs). At database creation.
  static Result<GlobalAddress> CreateDirectories(const Access& access);
  // Reads the table at `dirs` (made by CreateDirectories).
  static Result<std::unique_ptr<Recycler>> Open(const Access& access, GlobalAddress dirs);

  // An object of at least `size` bytes, on the server `placement` names (striped: the next in
  // turn); a preference: on the next server if that one is full. Uninitialised.
  Result<GlobalAddress> Alloc(const Access& access, LockOwner& owner, uint64_t size,
                              Placement placement);
  // REQUIRES: `address` came from Alloc with the same `size` and nobody can reach it any more.
  Status Free(const Access& access, LockOwner& owner, GlobalAddress address, uint64_t size);
  // Bulk loading: leases a new slab chunk of `size`'s class on server `server` with every slot
  // reserved for the caller, and appends its objects to *objects in address order, SlotBytes
  // apart (each object is then the caller's, freed with Free(size) as any other). Chunks that
  // are leased whole cost a few round trips per chunk instead of a few per Want(c) objects.
  // OutOfMemory if the server has no chunk left; InvalidArgument if `size` is not a slab
  // class on it. A process killed before it frees or uses them leaks the chunk.
  Status ReserveChunk(const Access& access, LockOwner& owner, uint16_t server, uint64_t size,
                      std::vector<GlobalAddress>* objects);
  // Free of many objects of `size` bytes at once, straight back to their chunks (one batch per
  // server, not through the cache): a bulk load's unused slots. REQUIRES: as Free, each.
  Status FreeMany(const Access& access, LockOwner& owner, uint64_t size,
                  std::span<const GlobalAddress> objects);
  // The stride of objects of `size` bytes in a slab chunk (their class's size).
  static uint64_t SlotBytes(uint64_t size) { return ClassBytes(ClassOf(size)); }
  // Returns the cached objects of every class not allocated from since the last call (the
  // maintenance thread, every pass): an idle process holds no memory back.
  Status ReturnIdle(const Access& access, LockOwner& owner);
  // Returns every cached object to its chunk (at close).
  Status Flush(const Access& access, LockOwner& owner);

  // Objects freed by this process; allocations it served with objects it had freed (its
  // cache); objects it reserved from slab chunks (new or freed earlier by anyone) or leased as
  // runs; slab chunks it opened and released to their servers (for the GC's figures).
  struct Stats {
    uint64_t freed = 0, reused = 0, fresh = 0, chunks_opened = 0, chunks_released = 0;
  };
  Stats stats() const;

 private:
  struct Server {
    uint16_t id;
    GlobalAddress dir;  // one word per chunk
    uint64_t chunks, chunk_size;
  };
  // A class's layout in a slab chunk: the bitmap's bytes (a multiple of 64), then `slots`.
  struct Slab {
    uint64_t bitmap_bytes, slots;
  };
  struct Cache {
    std::vector<uint64_t> objects;  // raw addresses, reserved from their chunks
    uint64_t freed_on_top = 0;      // the last ones came from Free (reserved ones below)
    bool used = false;              // allocated from since the last ReturnIdle
    int64_t scan_after = 0;         // a scan found no room: open new chunks until then
    bool has_hint = false;          // the chunk reserved from last (tried first)
    uint64_t hint_chunk = 0, hint_word = 0;
  };
  // Entry word of the directory: state 2 | class 6 | generation 24 | live 32.
  static constexpr uint64_t kOpen = 1, kWithdrawn = 2;
  static uint64_t Entry(uint64_t state, int c, uint64_t gen, uint64_t live) {
    return state << 62 | uint64_t(c) << 56 | (gen & 0xffffff) << 32 | live;
  }
  static uint64_t EntryState(uint64_t w) { return w >> 62; }
  static int EntryClass(uint64_t w) { return int(w >> 56) & 63; }
  static uint64_t EntryGen(uint64_t w) { return (w >> 32) & 0xffffff; }
  static uint64_t EntryLive(uint64_t w) { return w & 0xffffffff; }

  explicit Recycler(Memory& memory, std::vector<Server> servers);
  static int ClassOf(uint64_t size);
  static uint64_t ClassBytes(int c) { return uint64_t{1} << c; }
  static Slab SlabOf(uint64_t chunk_size, int c);
  bool IsSlabClass(size_t si, int c) const { return ClassBytes(c) <= servers_[si].chunk_size / 4; }
  // Objects reserved at a time: 64 KiB worth, 1 .. 32.
  static uint64_t Want(int c) { return std::clamp<uint64_t>((64 << 10) >> c, 1, 32); }
  Result<size_t> IndexOf(uint16_t id) const;
  GlobalAddress ChunkBase(size_t si, uint64_t chunk) const {
    return GlobalAddress(servers_[si].id,
                         RegionGeometry::kRootAreaSize + chunk * servers_[si].chunk_size);
  }
  Result<GlobalAddress> AllocOn(const Access& access, LockOwner& owner, size_t si, int c,
                                uint64_t size);
  // REQUIRES (these three): mu_ held.
  // Fills the cache of class c on server si with newly reserved objects.
  Status Reserve(const Access& access, LockOwner& owner, size_t si, int c);
  // Reserves up to `want` slots of `chunk`, whose word is believed to be *word (a guess: the
  // CAS corrects it, a few times); returns the count taken (0: no room, or not an open chunk
  // of the class) and leaves the word as it last saw it in *word.
  Result<uint64_t> ReserveFrom(const Access& access, LockOwner& owner, size_t si, int c,
                               uint64_t chunk, uint64_t* word, uint64_t want);
  // Turns *left counts held on `chunk` into objects in the cache (claims clear bits by CAS);
  // *left is what is still to claim when it fails.
  Status ClaimBits(const Access& access, LockOwner& owner, size_t si, int c, uint64_t chunk,
                   uint64_t* left);
  // Leases a new chunk for class c, opens it with `Want(c)` objects reserved for the cache.
  Status OpenChunk(const Access& access, LockOwner& owner, size_t si, int c);
  // Writes the bitmap of the chunk leased at `base` (`take` slots ours) and opens its word;
  // returns the word written. On an error the chunk goes back to its server (ReleaseRun)
  // unless the directory may name it: an open CAS whose outcome is unknown (Unavailable,
  // TimedOut: a failover, or a primary whose backup did not acknowledge the change) is settled
  // by reading the word again. Landed (the next generation, open): published, the counts are
  // ours, Ok. Not landed: released, the error. That read failing too (for kSettleOpenNs while
  // the memory fails, under mu_: the process allocates nothing meanwhile): the chunk stays leased
  // (a leak of one chunk, never a released chunk that an open word names, whose bitmap the
  // next reserver would read from a server that refuses it).
  Result<uint64_t> Publish(const Access& access, LockOwner& owner, size_t si, int c,
                           GlobalAddress base, uint64_t take);
  // Gives `objects` (of class c on server si, all held by this process) back to their chunks,
  // releasing the chunks that empty.
  Status Return(const Access& access, LockOwner& owner, size_t si, int c,
                std::span<const uint64_t> objects);

  static constexpr int64_t kScanRetryNs = 10'000'000;
  // How long Publish tries to read a word again after an open of unknown outcome.
  static constexpr int64_t kSettleOpenNs = 5'000'000'000;
  Memory& memory_;
  const std::vector<Server> servers_;
  mutable std::mutex mu_;      // guards caches_ and stats_
  std::vector<Cache> caches_;  // [server index * kClasses + class]
  Stats stats_;
};

// ---------------------------------------------------------------- sessions

// A session slot claimed by this process: its epoch, lease and GC announcement. Shared by
// the session that uses it (one thread) and the renewal thread.
struct SlotLease {
  uint32_t slot = 0;
  uint64_t epoch = 0;
  // Guards `owner` and serialises renewals. Held across nothing but a renewal's CAS: the
  // announcement (`mu`) is written under its own mutex, and a renewal waiting behind a write
  // that a failover held up for seconds left every slot of the process unrenewed, and others
  // evicted the live process (the network soak with kills, 2026-11-29).
  std::mutex renew_mu;
  uint64_t owner = 0;                   // the owner word we last wrote
  std::mutex mu;                        // guards announced, open, idle_since
  uint64_t announced = 0;               // what the slot's announcement word holds (0: idle)
  int open = 0;                         // transactions running (their oldest snapshot is
                                        // what `announced` protects)
  int64_t idle_since = 0;               // monotonic ns when the last transaction ended
  std::atomic<int64_t> valid_until{0};  // monotonic ns; 0 once fenced
  std::atomic<bool> fenced{false};
};

class NamSession final : public Session, public LockOwner {
 public:
  NamSession(NamDatabase& db, std::shared_ptr<SlotLease> lease, GlobalAddress log,
             GlobalAddress index_log);
  ~NamSession() override;

  Result<std::unique_ptr<Transaction>> Begin() override;
  Result<std::unique_ptr<Transaction>> Begin(const TransactionOptions& options) override;
  const TxnCounters& counters() const override;

  // LockOwner
  uint64_t lock_word() const override { return LockWord(lease_->slot, lease_->epoch); }
  Result<bool> HolderDead(uint64_t word) override;
  Status CheckLease() override;
  GlobalAddress index_log() const override { return index_log_; }
  Result<GlobalAddress> IndexLogOf(uint64_t word) override;
  // Index memory comes from the recycler (any process frees a dropped table's index).
  Result<GlobalAddress> AllocObject(const Access& access, uint64_t size,
                                    Placement placement) override;
  Status FreeObject(const Access& access, GlobalAddress address, uint64_t size) override;
  void FaultPoint(std::string_view point) override;
  void Abandon() override;

  // The record of (table, key) or null; consults the cache first.
  Result<GlobalAddress> FindRecord(const NamTable& t, int64_t key);
  // The cached record of (table, key), or null if it is not cached.
  GlobalAddress CachedRecord(const NamTable& t, int64_t key) const;
  // An index entry of `key` named `record`, which is removed (kRemovedLock): finishes its
  // removal from the indexes (its remover may have died half-way) and forgets the address.
  Status HelpUnlink(const NamTable& t, int64_t key, GlobalAddress record);
  void ForgetRecord(const NamTable& t, int64_t key);
  void RememberRecord(const NamTable& t, int64_t key, GlobalAddress record);
  // Marks the running transaction finished (its snapshot no longer needs protecting).
  // `withdraw`: also clear the announcement now, instead of after 50 ms idle (a session that
  // begins rarely, such as the maintenance pass, should not hold the GC back meanwhile).
  void EndTransaction(bool withdraw = false);
  // Taking a snapshot: the announcement (a lower bound of the snapshot) is visible before the
  // counter is read (see sessions.cc). PostSnapshot posts the counter read into `batch`, so
  // that it shares a round trip with other work that does not depend on the snapshot (index
  // lookups): with the raise of the announcement when one is in place already (its older,
  // smaller bound protects meanwhile), after a synchronous announcement when the session is
  // idle. On OK the snapshot counts as open and FinishSnapshot must follow, with the batch's
  // outcome; on an error nothing changed. FinishSnapshot returns the snapshot, or the error
  // (the snapshot is closed again); *cache_cleared says that addresses taken from the
  // session's record cache before it may be stale (records were removed meanwhile).
  struct SnapshotRead {
    uint64_t word = 0;      // the counter word
    uint64_t floor = 0;     // the bound announced with it
    bool raised = false;    // the announcement is raised to `floor` in the batch
    uint64_t clearing = 0;  // log_to_clear_ when its clear was posted with it (0: none)
    uint64_t clear_prev = 0;
  };
  // `versions` false: the snapshot reads no versions, only finds records (a locking read of
  // read committed, which reads only what it locks): its announcement is marked
  // kAnnounceRecordsOnly, and holds back the freeing of records (the LWM) but not version GC.
  Status PostSnapshot(Access::Batch& batch, SnapshotRead* read, bool versions = true);
  Result<uint64_t> FinishSnapshot(const SnapshotRead& read, const Status& batch_status,
                                  bool* cache_cleared);
  // Both, in a batch of their own.
  Result<uint64_t> TakeSnapshot();
  // The number of the next commit log this session writes (LogHeader::number).
  uint64_t NextLogNumber() { return ++logs_written_; }
  // The commit log of the last commit stays whole after the commit finished, until it is
  // cleared: its last round may not carry the clear (commit.cc). The clear rides in the
  // session's next snapshot round (PostSnapshot); a commit whose locks would come first
  // clears it in a round trip of its own (ClearLog): no lock of this session may be taken
  // while a finished log is whole, or recovery would roll that log into records it locks.
  // Nonzero: the log's state word, to be CASed to 0.
  uint64_t log_to_clear_ = 0;
  // The records that log names (raw addresses; meaningful only while log_to_clear_ != 0). A
  // record freed and reused since as a new record of ours must not be locked in the round that
  // clears the log: if it is the same key's, recovery would roll the log into it
  // (NamTxn::NewPending; a record of another key it passes by, recovery.cc).
  std::vector<uint64_t> logged_records_;
  Status ClearLog();
  // This session's stamp word on `server` (StampWordImage; allocated there with the memory's
  // own allocator, which places it exactly, for every server when the session opens; freed
  // when the session closes cleanly; a session that dies leaks its words: 16 bytes per
  // server). OutOfMemory if that server has no room for it.
  Result<GlobalAddress> StampWord(uint16_t server);

  NamDatabase& db_;
  std::shared_ptr<SlotLease> lease_;
  const GlobalAddress log_;
  const GlobalAddress index_log_;
  OpCount count_;
  Access access_;
  mutable TxnCounters counters_;

 private:
  // Frees the slot at close (the last log cleared or rolled forward first); false if it could
  // not, and the slot may still be ours (the destructor gives it up: NamDatabase::GaveUp).
  bool FreeSlot();
  static uint64_t CacheKey(const NamTable& t, int64_t key);
  std::unordered_map<uint64_t, GlobalAddress> cache_;  // (table, key) -> record
  uint64_t cache_epoch_ = 0;                           // removal epoch the cache is valid for
  int64_t last_begin_ = 0;
  uint64_t logs_written_ = 0;
  std::map<uint16_t, GlobalAddress> stamp_words_;
};

// ---------------------------------------------------------------- transactions

struct WriteEntry {
  const NamTable* table = nullptr;
  int64_t key = 0;
  bool deleted = false;
  std::string payload;
  std::vector<std::string> bytes;  // per column, for kBytes columns
};

struct ReadEntry {
  GlobalAddress record;
  uint64_t newest_seq = 0;
  bool newest_visible = true;
  std::vector<unsigned char> image;  // the record copy the read decided on
};

// A record this transaction locked when it read it (GetForUpdate), or a new key's record it
// inserted locked (LockIntent::kUpdate): released by CAS from `word` back to `expected` unless
// a commit installs a version of it.
struct HeldLock {
  const NamTable* t = nullptr;
  GlobalAddress record;
  uint64_t expected = 0;             // the unlocked word it had (its newest version)
  std::vector<unsigned char> image;  // the record as locked (lock word ours, cells unchanged)
  // Our word on it: the read-lock word (LockIntent::kRead), or the session's plain lock word
  // (kUpdate: a commit's lock from the start; the commit does not change it).
  uint64_t word = 0;
};

// A new empty record of `key` for table `t` (no version, unlocked; its image in *image, not yet
// written anywhere), allocated on the server of the key's head bucket: a near-memory
// lookup-read then returns it with its bucket, and a table is spread over the servers as its
// buckets are. The caller frees it unless it goes into the index.
Result<GlobalAddress> NewRecord(NamSession& s, const NamTable& t, int64_t key,
                                std::vector<unsigned char>* image);

// The bounded wait for a record lock held by another transaction, shared by the commit's lock
// round (commit.cc) and locking reads (read.cc): pauses doubling from kFirstPauseNs up to
// max_pause_ns, for at most limit_ns in all; and every millisecond a check whether the holders
// died (CheckDue), so that a dead holder's lock is broken instead of waited out. Bounded, so
// two transactions waiting for each other's locks both give up (one aborts) instead of
// deadlocking.
class LockWait {
 public:
  static constexpr int64_t kLimitNs = 4'000'000, kFirstPauseNs = 50'000, kMaxPauseNs = 1'000'000;
  explicit LockWait(int64_t limit_ns = kLimitNs, int64_t first_pause_ns = kFirstPauseNs,
                    int64_t max_pause_ns = kMaxPauseNs)
      : start_(MonoNs()),
        next_check_(start_ + 1'000'000),
        limit_ns_(limit_ns),
        pause_ns_(first_pause_ns),
        max_pause_ns_(max_pause_ns) {}
  // Sleeps the next pause and returns true; false (without sleeping) once the time is up.
  bool Pause() {
    if (MonoNs() - start_ >= limit_ns_) return false;
    std::this_thread::sleep_for(std::chrono::nanoseconds(pause_ns_));
    pause_ns_ = std::min<int64_t>(2 * pause_ns_, max_pause_ns_);
    return true;
  }
  // Whether the time is up (without sleeping): where the memory server waits for the holder
  // (a waiting compare-and-swap over messages), the caller retries at once instead of pausing.
  bool Expired() const { return MonoNs() - start_ >= limit_ns_; }
  // What a waiting compare-and-swap may wait for now: held means bit 0 set (a removed record's
  // word is never waited for), for the time left, at most `slice_us` (so that the caller
  // checks every slice whether the holder died).
  WaitSpec ServerWait(int64_t slice_us, bool take_free) const {
    const int64_t left_us = std::max<int64_t>(0, (limit_ns_ - (MonoNs() - start_)) / 1000);
    return WaitSpec{1, kRemovedLock, std::chrono::microseconds(std::min(left_us, slice_us)),
                    take_free};
  }
  // True at most once a millisecond: time to ask whether the holders died (it costs a read).
  bool CheckDue() {
    const int64_t now = MonoNs();
    if (now <= next_check_) return false;
    next_check_ = now + 1'000'000;
    return true;
  }

 private:
  int64_t start_, next_check_, limit_ns_, pause_ns_, max_pause_ns_;
};

// One key being read (MultiGet, Get, Delete): where its record is, the copy read, and the
// version the snapshot sees.
struct KeyRead {
  const NamTable* t = nullptr;
  int64_t key = 0;
  GlobalAddress record;         // null: the key has no record
  bool cached = false;          // `record` came from the session's address cache
  bool done = false;            // read (or known absent)
  bool prefetched = false;      // `image.bytes` hold the record, read with its lookup
  LookupResult lookup;          // of HashIndex::PostLookupRead
  LockReadResult lock_read;     // of HashIndex::PostLookupLockRead (NamTxn::LockAtLookup)
  bool held_at_lookup = false;  // locked by LockAtLookup, not yet taken into LockKeys' wants
  RecordImage image;
  bool found = false, deleted = false;
  std::string payload;  // the visible version's fixed payload, if found
};

// A row to fill from a version's payload (the kBytes values of `columns` read from their
// blobs; the other columns zero, as ColumnSet says).
struct RowLoad {
  const NamTable* t;
  const std::string* payload;
  Row* row;
  ColumnSet columns;
};

class NamTxn final : public Transaction {
 public:
  NamTxn(NamSession& s, const TransactionOptions& options)
      : s_(s),
        rc_(options.isolation == Isolation::kReadCommitted),
        round_trips_at_begin_(s.count_.round_trips.load(std::memory_order_relaxed)) {}
  ~NamTxn() override { Rollback(); }

  using Transaction::Get;
  using Transaction::GetForUpdate;
  using Transaction::MultiGetForUpdate;
  using Transaction::Scan;
  Status Get(const Table& table, int64_t key, Row* row, ColumnSet columns) override;
  Status MultiGet(std::span<const TableKey> keys, std::vector<Row>* rows,
                  std::vector<Status>* statuses) override;
  Status GetForUpdate(const Table& table, int64_t key, Row* row, LockIntent intent) override;
  Status MultiGetForUpdate(std::span<const TableKey> keys, std::vector<Row>* rows,
                           std::vector<Status>* statuses, LockIntent intent) override;
  Status Put(const Table& table, int64_t key, const Row& row) override;
  Status Delete(const Table& table, int64_t key) override;
  Status ScanMany(
      std::span<const ScanRange> ranges,
      const std::function<bool(size_t range, int64_t key, const Row& row)>& visit) override;
  Status ScanThenGet(std::span<const ScanRange> ranges, const Table& target, ColumnSet columns,
                     const std::function<int64_t(size_t range, int64_t key)>& target_key,
                     const std::function<bool(size_t range, int64_t key, const Status& status,
                                              const Row& row)>& visit) override;
  Status Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
              ColumnSet columns, const std::function<bool(int64_t, const Row&)>& visit) override;
  Status Commit() override;
  void Rollback() override;

  // REQUIRES: the snapshot was taken.
  bool Visible(uint64_t stamp) const { return stamp <= snapshot_; }

 private:
  friend class CommitRun;
  using Key = std::pair<uint32_t, int64_t>;
  // Ok, or why no call may be made: InvalidArgument once finished, Aborted once a call returned
  // Aborted (as in PostgreSQL's failed transaction block, only Rollback ends it; Commit then
  // commits nothing and returns Aborted).
  Status Usable() const;
  // `s`, the outcome of a public call: an Aborted aborts the transaction (aborted_).
  Status Outcome(Status s) {
    if (s.code() == StatusCode::kAborted) aborted_ = true;
    return s;
  }
  // The bodies of Get, Delete, Scan, ScanMany and ScanThenGet (which keep their Outcome).
  Status GetOne(const Table& table, int64_t key, Row* row, ColumnSet columns);
  Status DeleteOne(const Table& table, int64_t key);
  Status ScanTable(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
                   ColumnSet columns, const std::function<bool(int64_t, const Row&)>& visit);
  Status ScanManyRanges(std::span<const ScanRange> ranges,
                        const std::function<bool(size_t, int64_t, const Row&)>& visit);
  Status ScanThenGetRows(std::span<const ScanRange> ranges, const Table& target, ColumnSet columns,
                         const std::function<int64_t(size_t range, int64_t key)>& target_key,
                         const std::function<bool(size_t range, int64_t key, const Status& status,
                                                  const Row& row)>& visit);
  // Record copies read ahead (GuessRound), by address: each is taken (moved out) by the first
  // entry or key that names its address, as its first copy if it holds that key's record
  // (TakeGuess).
  using GuessedRecords = std::unordered_map<uint64_t, std::vector<unsigned char>>;
  // Moves the copy of `record` out of `guessed` into image->bytes (decoded) and returns true if
  // there is one and it holds `key`'s record (not removed); the copy is dropped either way.
  static bool TakeGuess(GuessedRecords& guessed, const NamTable& t, GlobalAddress record,
                        int64_t key, RecordImage* image);
  // The snapshot is taken by the transaction's first read, its counter read in the round trip
  // of that read's index lookups (PostSnapshot into the lookup batch, then FinishSnapshot).
  // With nothing to look up, TakeSnapshot takes it in a round trip of its own.
  Status TakeSnapshot();
  Status FinishSnapshot(const NamSession::SnapshotRead& read, const Status& batch_status,
                        bool* cache_cleared);
  // Finds the records of `keys` (one round trip for every lookup the cache does not answer,
  // with the counter read if the snapshot is not taken yet), reads them (one round trip),
  // settles each copy (SettleRecord) and finds the version the snapshot sees; records the
  // read of every key with a record in reads_.
  // The transaction's first read takes the snapshot again (up to kSnapshotRetakes times) while
  // a key it read has a version newer than the snapshot (ReadKeys in read.cc).
  // `guessed`: first copies read ahead (ScanThenGet), taken instead of reads (TakeGuess).
  Status ReadKeys(std::span<KeyRead> keys, GuessedRecords* guessed = nullptr);
  Status ReadKeysOnce(std::span<KeyRead> keys, GuessedRecords* guessed);
  // Round 1 of ReadKeysOnce: the records of `keys` (cache, else index lookups) and the
  // snapshot if none is taken, in one round trip; keys whose record was read along have
  // `prefetched` set. `copies`: also read every cached record in that round (and make the
  // round for them if there is no other reason for it), unordered with the counter read: the
  // copies are only guesses of the words to expect (LockKeys), never data a snapshot sees.
  Status FindRecords(std::span<KeyRead> keys, bool copies);
  // The locking read (GetForUpdate, MultiGetForUpdate): finds and copies the records
  // (FindRecords), then in one batch CASes each lock word from the unlocked word expected to
  // ours and, behind a fence, reads the record: one message per server. A word that moved on
  // is retried at once with the word seen; a lock held by another is waited for (LockWait,
  // lowest address first, without holding higher ones meanwhile), then Aborted. The locked
  // records go into held_ (and reads_) and each KeyRead gets the version it returns (see
  // db.h: if this was SI's first read and a locked version is newer than the snapshot, the
  // snapshot moves up to the newest version locked, without a round trip; otherwise Aborted).
  // A snapshot taken here is announced records-only (records_only_). SI, keys found absent:
  // remembered in absent_ while the snapshot is records-only, or, in a first read that locked a
  // record after its lookups or past the snapshot, read again in a snapshot taken again (read.cc).
  // With LockIntent::kUpdate the locks carry the session's plain lock word, and the first
  // round also inserts the transaction's pending new keys and reads what the commit's lock
  // round would (PrepareCommit).
  Status LockKeys(std::span<KeyRead> keys, LockIntent intent);
  // LockKeys' first round where one operation per key can look it up, lock it and copy it
  // (HashIndex::PostLookupLockRead; with the snapshot's counter read if none is taken): a key
  // whose record was free is locked (in held_, `held_at_lookup`), one held by another or
  // removed gets its copy (`prefetched`), one not found is done. LockKeys goes on from there
  // (waits, words moved on, records not read along). A failed batch abandons the session (a
  // lock may have been taken from a word it did not learn).
  Status LockAtLookup(std::span<KeyRead> keys, uint64_t mine, LockIntent intent);
  // What a commit after locking reads of LockIntent::kUpdate needs from its lock round,
  // posted into LockAtLookup's batch instead (commit.cc, CommitRun::LockedAtRead):
  //   - the pending new keys (buffered Puts of keys not read, not known to the session's
  //     cache, in tables without a B+tree): each a new record written whole with our plain
  //     lock word and, behind a fence, inserted near memory (HashIndex::PostInsert), exactly as
  //     the lock round inserts them; those that went live are in held_ (from the empty
  //     record's unlocked word);
  //   - the descriptors of the tables written and locked (a dropped table's memory is never
  //     written): proof while the snapshot taken in (or before) this round stays open, so
  //     only for the commit of that snapshot (prep_.snapshot);
  //   - the announcement array, for the commit's version GC decisions, with the counter that
  //     this process had seen before the round (prep_.announced_upto): a session missing
  //     from that copy announced after it was read, so its snapshot is at least that counter.
  struct CommitPrep {
    uint64_t snapshot = 0;  // snapshot_gen_ the descriptors are proof for (0: none)
    std::map<const NamTable*, std::array<uint64_t, 2>> descs;  // state, incarnation
    std::vector<uint64_t> announced;
    uint64_t announced_upto = 0;
    // The new records being inserted (index in the batch's order).
    struct Insert {
      const NamTable* t;
      int64_t key;
      GlobalAddress record;
      std::vector<unsigned char> image;  // written with our lock word
      InsertResult inserted;
      bool posted = false;  // its insert was posted: the entry may be live
    };
    std::vector<Insert> inserts;
  };
  // Before the round's lease check: starts prep_ for a round locking `keys` with word `mine`
  // and allocates the pending new keys' records.
  Status NewPending(std::span<const KeyRead> keys, uint64_t mine);
  // Posts into the round's batch the reads and inserts that prep_ names.
  Status PostPrepare(Access::Batch& b);
  // After the batch of PostPrepare (`ok`: it succeeded), or instead of it (false): the inserts
  // that went live go into held_, the others' records are freed (or kept, if the insert's
  // outcome is unknown: in held_ too).
  Status FinishPrepare(bool ok, uint64_t mine);
  CommitPrep prep_;
  // Counts the snapshots taken: a snapshot taken again (read committed's next call, SI's
  // retake) ends the proof of descriptors read under the previous one.
  uint64_t snapshot_gen_ = 0;
  // How long a locking read waits for a live holder. Much longer than a commit waits
  // (LockWait::kLimitNs): a holder keeps the lock for its whole transaction, and waiters take
  // turns in no order (each retries on its own), so with 8 clients on one row of a 2-core
  // machine 20 ms still timed out 5-30% of them (TPC-B over TCP). A dead holder's lock is
  // broken after its lease whatever this is; this bounds what a cycle of waits across calls
  // (which the address order within a call does not prevent) costs before one aborts.
  static constexpr int64_t kLockingReadWaitNs = 100'000'000;
  // Over messages, how long one waiting compare-and-swap of a locking read (or wait-until-free
  // of a reader, SettleRecord) may wait at the server before the caller checks whether the
  // holder died (and sends it again).
  static constexpr int64_t kServerWaitSliceUs = 10'000;
  // MultiGet and MultiGetForUpdate: own writes and keys locked earlier answered without a
  // round trip, the others read (ReadKeys) or locked (LockKeys). With `guessed` (ScanThenGet:
  // copies read in the round of the caller's scan), the read goes on in the caller's snapshot
  // (read committed takes no fresh one) and takes the copies instead of reads.
  // `lock`: a locking read (MultiGetForUpdate) with that intent; none: a plain read.
  // REQUIRES: guessed is null if lock is set.
  Status ReadMany(std::span<const TableKey> keys, std::optional<LockIntent> lock,
                  std::vector<Row>* rows, std::vector<Status>* statuses,
                  GuessedRecords* guessed = nullptr);
  // Releases every lock in held_ (one batch); abandons the session if that fails.
  void ReleaseHeld();
  // The version a read of locked key returns (from held_): sets k's found/deleted/payload.
  Status ReadHeld(const HeldLock& h, KeyRead* k);
  // Read committed: each read call takes a snapshot of its own (the previous one ends). Either
  // level: a snapshot taken by a locking read announced records-only, so a read that reads
  // versions ends it and takes one of its own (records_only_). SI: the keys in absent_ are read
  // in that snapshot first (its counter read in a round of its own, then their lookups);
  // Aborted if one of them exists there.
  Status FreshSnapshotForRead();
  // Reads `absent` (keys a locking read found absent) in the snapshot taken: Aborted if one
  // has a version there.
  Status CheckStillAbsent(std::span<KeyRead> absent);
  static constexpr int kSnapshotRetakes = 2;
  // Get from the transaction's own writes: true if it has written `key` (the answer is then in
  // *row and *status).
  bool ReadOwnWrite(const NamTable& t, int64_t key, Row* row, Status* status) const;
  // Given the first copy of `record` in image->bytes (read by the caller, maybe in a batch),
  // reads again until the copy is consistent (see read.cc). `key_ok` false if the record is
  // not key's (a raced or stale index entry).
  Status SettleRecord(const NamTable& t, GlobalAddress record, int64_t key, RecordImage* image,
                      bool* key_ok);
  // A copy to take again once the commit holding the record let go of it.
  struct Recopy {
    GlobalAddress record;
    uint64_t holder;     // the commit's lock word the copy showed
    RecordImage* image;  // its bytes are overwritten
  };
  // One batch: per record a wait at the memory server until its lock word is no longer its
  // holder (a wait-until-free: changes nothing; at most `wait_us`), then, behind a fence, the
  // copies: each taken the moment the server executed its holder's release (one round trip
  // for all, however many servers). On mapped memory and one-sided paths one look at the word
  // (no wait): the caller polls there.
  Status ReadAfterRelease(std::span<const Recopy> recopies, int64_t wait_us);
  // A first copy of `key`'s record, read by the caller (maybe in a batch with others).
  struct LockedCopy {
    const NamTable* t;
    int64_t key;
    GlobalAddress record;
    RecordImage* image;
  };
  // The copies that show a commit's lock (not a locking read's) on their key's record are
  // taken again with one ReadAfterRelease, so a read that met several commits' locks waits for
  // all of them in one round trip; SettleRecord then settles each copy as usual (a record
  // locked again since is waited for there). Counts read_lock_waits. REQUIRES: the memory is
  // not mapped (there SettleRecord polls locally; a wait would be one look).
  Status RecopyLocked(std::span<const LockedCopy> copies);
  // Reads `record` and settles it.
  Status ReadRecord(const NamTable& t, GlobalAddress record, int64_t key, RecordImage* image,
                    bool* key_ok);
  // The version of `image` visible in the snapshot: sets *found, *deleted and copies payload.
  Status VisibleVersion(const NamTable& t, const RecordImage& image, bool* found, bool* deleted,
                        std::string* payload);
  // Fills the rows, reading the wanted blobs of all of them in one round trip (none if no
  // blob is wanted).
  Status LoadRows(std::span<const RowLoad> loads);
  // Scans: the rows that index entries name, visible in the snapshot, with the entries'
  // columns: every record in one round trip, their wanted blobs in the next, then the lease
  // check; (*found)[i] says whether entry i has one, in (*rows)[i].
  struct IndexEntry {
    const NamTable* t;
    int64_t key;
    GlobalAddress record;
    ColumnSet columns;
  };
  // `along`: records read in the batch of the entries' records if it reads any (never in a
  // round trip of their own), their copies put into *guessed: a join's target records
  // (ScanRanges). REQUIRES: the snapshot is taken; guessed is not null if along is not empty.
  Status ReadIndexed(std::span<const IndexEntry> entries, std::vector<Row>* rows,
                     std::vector<uint8_t>* found, GuessedRecords* guessed = nullptr,
                     std::span<const std::pair<const NamTable*, GlobalAddress>> along = {});
  // The snapshot's counter read for a B+tree walk's first round (BTree::FirstRound).
  BTree::FirstRound SnapshotRound(NamSession::SnapshotRead* snap);
  // ScanMany's first round: the snapshot's counter read if none is taken, then (behind a fence)
  // copies of the records `guesses` name (table, address: what the cached leaves name, BTree
  // invariant 13). The copies that may serve the snapshot (see read.cc) go to *out once the
  // round is done. REQUIRES: guesses and *out outlive the round.
  // `lookups` (table, key): keys whose records are looked up and read together
  // (HashIndex::PostLookupRead) in that round, the addresses found remembered in the session's
  // cache and the copies, under the same rule, put in *out.
  BTree::FirstRound GuessRound(NamSession::SnapshotRead* snap,
                               std::span<const std::pair<const NamTable*, uint64_t>> guesses,
                               std::span<const std::pair<const NamTable*, int64_t>> lookups,
                               GuessedRecords* out);
  // ScanThenGet's addition to ScanMany's first round: the target records that the guessed
  // entries name (read at the address the session's cache knows, else looked up and read).
  struct JoinGuess {
    const NamTable* target;
    const std::function<int64_t(size_t range, int64_t key)>* target_key;
  };
  // ScanMany after its checks and read committed's fresh snapshot. With `join`, the first
  // round also copies the join's target records (GuessRound, under the same rule), and the
  // copies the scan did not take are left in *guessed for the target's reads.
  // REQUIRES: guessed is not null if join is not.
  Status ScanRanges(std::span<const ScanRange> ranges, const JoinGuess* join,
                    GuessedRecords* guessed,
                    const std::function<bool(size_t range, int64_t key, const Row& row)>& visit);
  // Scan without taking a fresh snapshot first (read committed: ScanMany's ranges share one).
  Status ScanOne(const NamTable& t, int64_t lo, int64_t hi, size_t limit, bool reverse,
                 ColumnSet columns, const std::function<bool(int64_t, const Row&)>& visit);
  // Ends the transaction: counts it, frees blobs of an undecided commit, ends the snapshot.
  Status Finish(Status s);

  NamSession& s_;
  const bool rc_;  // read committed (else snapshot isolation)
  // The session's round trips when the transaction began (TxnCounters::round_trips_aborted).
  const uint64_t round_trips_at_begin_;
  uint64_t snapshot_ = 0;
  bool has_snapshot_ = false;  // taken (and open in the session) until Finish
  // The snapshot was taken by a locking read and announced records-only (NamSession::
  // PostSnapshot): the transaction has read nothing but the records it holds locked, at their
  // newest versions, so it needs no older version of any record, and the version GC passes its
  // announcement by (a waiting SI locker pinned every version of the hot row committed during
  // its wait: 2.1 round trips per TPC-B transaction of Trim walks at 16 clients over TCP). A
  // read of versions first takes a snapshot of its own (FreshSnapshotForRead): a counter read
  // after an ordinary announcement; the records held locked are still at their newest then.
  bool records_only_ = false;
  // SI: keys that locking reads found absent while records_only_ (their absence holds in the
  // snapshot, LockKeys): a read of versions takes a later snapshot, and reads them in it first.
  std::vector<std::pair<const NamTable*, int64_t>> absent_;
  Status absent_check_;  // of absent_'s keys, once read again: its failure is sticky
  std::map<Key, WriteEntry> writes_;
  std::map<Key, ReadEntry> reads_;
  // Locked by locking reads; a commit takes over those it writes (CommitRun::Lock) and
  // releases the others in its last round; Finish releases what is left.
  std::map<Key, HeldLock> held_;
  std::vector<std::pair<GlobalAddress, uint64_t>> blobs_;  // allocated here, freed unless decided
  bool decided_ = false;
  // A call returned Aborted: the transaction is aborted (Usable refuses every later call,
  // Commit commits nothing) and counts as aborted however it ends.
  bool aborted_ = false;
  bool finished_ = false;
};

// ---------------------------------------------------------------- the database

class NamDatabase final : public Database {
 public:
  NamDatabase(Engine engine, Memory& memory, const DatabaseOptions& options)
      : engine_(engine), memory_(memory), options_(options) {}
  ~NamDatabase() override;

  Status Init();

  Engine engine() const override { return engine_; }
  Result<const Table*> CreateTable(const std::string& name, const Schema& schema,
                                   const TableOptions& options) override;
  Result<const Table*> OpenTable(const std::string& name) override;
  // The bulk loader of the NAM engines (bulk_load.cc; db.h, Loader).
  Result<std::unique_ptr<Loader>> NewLoader(const std::string& name, const Schema& schema,
                                            const TableOptions& options) override;
  Status DropTable(const std::string& name) override;
  Result<std::vector<std::string>> ListTables() override;
  Result<std::unique_ptr<Session>> NewSession() override;
  Status RecoverExpired() override;
  Result<uint64_t> CountLocked(const Table& table) override;
  Result<GcStats> CollectGarbage() override;

  // ---- used by sessions, transactions and the files of src/db/nam/
  Memory& memory() { return memory_; }
  const DatabaseOptions& options() const { return options_; }
  const RootImage& root() const { return root_; }
  GlobalAddress RootField(uint64_t off) const { return memory_.Root() + off; }
  GlobalAddress SlotAddr(uint32_t s) const {
    return GlobalAddress::FromRaw(root_.slots) + s * kSlotSize;
  }
  GlobalAddress AnnounceAddr(uint32_t s) const {
    return GlobalAddress::FromRaw(root_.snapshots) + s * 8;
  }
  int64_t lease_ns() const { return int64_t(root_.lease_ms) * 1000000; }
  int64_t margin_ns() const { return lease_ns() / 4; }
  Recycler& recycler() { return *recycler_; }
  uint64_t lwm() const { return lwm_.load(std::memory_order_acquire); }
  uint64_t latest_counter() const { return latest_counter_.load(std::memory_order_relaxed); }
  void NoteCounter(uint64_t c);

  // sessions.cc
  // True once the owner word of `slot` was seen equal to `owner` for lease + margin, or at
  // once for a recovery given up (recovering, tag 0: nobody writes for it). `read_at`: the
  // monotonic time taken right before the read that returned `owner` was issued. The word
  // is known unchanged only from the first sighting to that read, so the span ends there:
  // measured to the time of the call instead, a caller slowed between its read and this call
  // (ScanSlots fencing an earlier slot of the same pass, a preempted thread) counted its own
  // delay as the owner's silence and evicted live processes (db_process_test, under load).
  //
  // The silence counts only while the memory of the slots took this process's own renewals
  // in time: not from before the end of an own renewal that failed or took longer than
  // SlowRenewalNs(), and not at all while one has been in flight for longer than that. A
  // primary that waits for its dead backup (until a client or the coordinator says it is
  // gone) answers reads but no write for seconds, so nobody's renewal lands; judged by reads
  // alone, every process was evicted by the first to look (the network soak with kills,
  // 2026-11-29; DbProcessTest.AStallOfEveryRenewalEvictsNoLiveProcess). A process that
  // really stalled is still judged by everyone whose renewals go through.
  bool ObservedExpired(uint32_t slot, uint64_t owner, int64_t read_at);
  // A session of this process gave its slot up without freeing it (abandoned after a failure
  // of the memory, or closed when it could not free it): `owner` is its owner word as last
  // written. Nothing of this process writes for it any more (the session is fenced locally),
  // so the maintenance thread fences and recovers it at its next pass (TakeOverGivenUp), as
  // recovery of a dead session would, without waiting for its lease and without an eviction.
  // Left to others, they fenced it after lease + margin, and evicted this live process first
  // (the network soak with kills, 2026-11-29: every failover that cut a commit did so).
  // `replace`: false keeps an entry the slot has already (FenceAndRecover's own calls).
  void GaveUp(uint32_t slot, uint64_t owner, bool replace = true);
  // Fences and recovers the slots given up (GaveUp) whose word in `slots` (read by ScanSlots)
  // is still ours; returns the slots dealt with (fenced now, or someone else's by now).
  // `read_at`: when `slots` was read (entries given up since wait for the next pass).
  std::set<uint32_t> TakeOverGivenUp(const Access& access, const std::vector<SlotImage>& slots,
                                     int64_t read_at);
  // A renewal's CAS is out since `sent` / came back (`failed`: with an error, not a
  // refusal); for ObservedExpired.
  void RenewalSent(int64_t sent);
  void RenewalDone(int64_t sent, bool failed);
  // A renewal that takes longer than this eats into the slack of every other process's
  // (renewed every lease/4, judged after lease + margin unchanged).
  int64_t SlowRenewalNs() const { return lease_ns() / 4; }
  // ObservedExpired judges a word unchanged for this many times lease + margin whatever its
  // own renewals saw (clients of the soak with kills waited 8 s for a coordinator's failover
  // that did not come, and then asked the backup themselves).
  static constexpr int64_t kMaxSilenceDeferral = 4;
  static constexpr int64_t kMinSilenceCapNs = 30'000'000'000;  // and at least this
  Result<bool> HolderDead(const Access& access, uint64_t word);
  // Renews `lease` now (CAS on its owner word); fences it locally if that fails.
  Status Renew(const Access& access, SlotLease& lease);
  Status CheckLease(const Access& access, SlotLease& lease);
  void Register(const std::shared_ptr<SlotLease>& lease);
  void Unregister(const SlotLease* lease);
  // Claims a free or expired slot for a session of this process.
  Result<std::shared_ptr<SlotLease>> ClaimSlot(const Access& access, SlotImage* image);
  // A session on a newly claimed slot, with the index writes a dead previous owner of the
  // slot left half done finished first (BTree::RecoverRedo).
  Result<std::unique_ptr<NamSession>> OpenSession(const Access& access);
  // How long index operations wait for a live lock holder: past any lease.
  std::chrono::milliseconds IndexWaitLimit() const;

  // recovery.cc
  // Evicts the process that may write for `slot` while its owner word is `owner` (its tag),
  // so that the slot may be fenced. False if that is this process and it still uses the slot
  // (a live session, a recovery under way), or another live Pool of this process.
  Result<bool> EvictWriterOf(uint32_t slot, uint64_t owner);
  // Fences slot `slot` from owner word `owner` (expired, or free) after EvictWriterOf,
  // finishes its decided commit, and leaves it in `final_state` (active: claimed by the
  // caller). False if someone else changed the slot first or its writer may not be evicted.
  Result<bool> FenceAndRecover(const Access& access, uint32_t slot, uint64_t owner,
                               uint64_t final_state, uint64_t* final_owner = nullptr);
  // Rolls forward the decided commit in slot `slot`'s log, if any. `deadline` (monotonic ns)
  // bounds the caller's right to write. `known_stamp`: the commit's stamp when the caller is
  // its writer and took it (a session settling its own cut commit); 0: found as recovery.cc
  // says, or taken anew.
  Status RecoverLog(const Access& access, uint32_t slot, int64_t deadline,
                    uint64_t known_stamp = 0);
  // Restores a record lock held by a dead session to the unlocked word of its newest version.
  Status BreakRecordLock(const Access& access, GlobalAddress record, const NamTable& t,
                         uint64_t word);

  // catalog.cc
  // Creates a table's descriptor under the DDL lock: name, schema, an empty hash index (and
  // B+tree), then the state word `state` (kDescLive: CreateTable; kDescLoading: a loader, with
  // `reclaimer` its session's lock word). Returns the descriptor's id. AlreadyExists if a live
  // table has the name.
  Result<uint32_t> NewDescriptor(const std::string& name, const Schema& schema,
                                 const TableOptions& options, uint64_t state, uint64_t reclaimer);
  // A table object for descriptor `id` as it is in memory now.
  Result<std::unique_ptr<NamTable>> ReadTable(const Access& access, uint32_t id);
  // bulk_load.cc
  // Makes loaded table `t` live (kDescLoading -> kDescLive) under the DDL lock, unless a live
  // table has its name (AlreadyExists) or the loader's session lost its claim on it (its
  // reclaimer word is no longer `loader`: Unavailable). Returns the table's handle.
  Result<const Table*> PublishLoaded(const NamTable& t, LockOwner& loader);
  // Hands abandoned load `t` (its reclaimer word `loader`) to the garbage collector, which
  // frees it as a dropped table.
  void AbandonLoad(std::unique_ptr<NamTable> t, uint64_t loader);

  // gc.cc
  // Hands a cut version chain (and its versions' blobs) to the maintenance thread.
  void RetireChain(const NamTable* t, GlobalAddress chain);
  // A committed deletion: once every snapshot sees it (LWM >= stamp), the maintenance thread
  // unlinks the record from the indexes and frees it (see gc.cc).
  void QueueRemoval(const NamTable* t, GlobalAddress record, int64_t key, uint64_t seq,
                    uint64_t stamp);
  // Frees a version's blobs now (the caller proved it garbage).
  Status FreeBlobs(const Access& access, LockOwner& owner, const NamTable& t,
                   const unsigned char* payload);

  // The internal session of this process (DDL lock, recycler locks, reclamation). One that
  // lost its lease (the process stalled past it, or it was abandoned) is replaced by a newly
  // claimed one here; others recover the old slot like any fenced session's, and the old
  // object ends when its last user lets go. Callers hold the result for one operation.
  Result<std::shared_ptr<NamSession>> System();
  void Hook(std::string_view point) const { TestingHook(options_, point); }

 private:
  Status LoadTables(const Access& access);
  Result<std::unique_ptr<NamTable>> MakeTable(uint32_t id, const TableDesc& d) const;
  Status LockDdl(NamSession& me);
  Status UnlockDdl(NamSession& me);
  // The background threads (sessions.cc). The renewal thread renews leases; the maintenance
  // thread marks idle sessions idle, computes the LWM, fences expired slots, frees
  // retired chains, deleted records and dropped tables. Each runs `pass` every `period` until
  // `*stop` (under stop_mu_).
  void RunEvery(std::chrono::milliseconds period, const bool* stop,
                const std::function<void()>& pass);
  // The renewal thread starts before the system session is claimed (a claimed slot is renewed
  // from the start), the maintenance thread once Open is done. StartRenewals returns once the
  // renewal thread has connected to every memory server (Memory::ConnectThread), so that no
  // renewal of a claimed slot waits for a connection set-up, also after a failover moved the
  // slots; an error if it could not (the thread runs on: the destructor stops it).
  Status StartRenewals();
  void StartMaintenance();
  void StopThread(bool* stop, std::thread& thread);
  // Renews every lease of this process that is due (the renewal thread), and nothing else: a
  // renewal never waits behind another memory operation. RenewAll used to mark idle sessions
  // idle too, and an announcement write that a failover held up for seconds left every slot
  // of the process unrenewed: others evicted the live process (the network soak with kills,
  // 2026-11-29).
  Status RenewAll(const Access& access);
  // A copy of leases_ (taken under mu_), for passes over this process's leases.
  std::vector<std::shared_ptr<SlotLease>> Leases();
  // Marks the sessions of this process idle for kIdleAfterNs idle (their announcement
  // withdrawn: the LWM may pass them); on the maintenance thread.
  void MarkIdle(const Access& access);
  Status ScanSlots(const Access& access);
  Status ReclaimRetired(const Access& access);
  // The recycler's caches that were not allocated from since the last pass go back to their
  // chunks (and chunks that empty, to their servers). Each maintenance pass.
  Status ReturnIdleMemory(const Access& access);
  // Removes one deleted record (see gc.cc); false if it changed (re-inserted) meanwhile.
  // `unlinked`: its index entries are gone too (else helpers finish, and it is not freed).
  Result<bool> RemoveRecord(const Access& access, NamSession& me, const NamTable& t,
                            GlobalAddress record, int64_t key, uint64_t seq, uint64_t stamp,
                            bool* unlinked);
  // Whether table `t` is still live in the catalog (not dropped, not re-created).
  Result<bool> TableLive(const Access& access, const NamTable& t);
  Status ReclaimTable(const Access& access, NamSession& me, const NamTable& t);
  // What a dead process had queued for collection is lost with it. Once every snapshot from
  // before a session died has ended (LWM >= the counter when it was fenced), a sweep finds it
  // again: dropped tables whose reclaimer is dead are adopted (AdoptDroppedTables), and every
  // tombstone all snapshots see is queued for removal (QueueTombstones). See gc.cc.
  void ScheduleSweep(uint64_t counter);
  Status SweepOrphans(const Access& access);
  Status AdoptDroppedTables(const Access& access, NamSession& me);
  Status QueueTombstones(const Access& access);

  Engine engine_;
  Memory& memory_;
  DatabaseOptions options_;
  RootImage root_{};
  std::unique_ptr<Recycler> recycler_;
  std::mutex system_mu_;  // guards system_ (the pointer; the session is safe to share)
  std::shared_ptr<NamSession> system_;

  std::mutex mu_;  // guards tables_, by_id_, leases_, recovering_here_, given_up_, dropped_
  std::map<std::string, std::unique_ptr<NamTable>> tables_;
  std::unordered_map<uint32_t, NamTable*> by_id_;
  std::vector<std::shared_ptr<SlotLease>> leases_;
  std::multiset<uint32_t> recovering_here_;  // slots threads of this process recover
  struct GivenUp {
    uint64_t owner;  // the owner word as last written
    int64_t at;      // MonoNs() when given up
  };
  std::map<uint32_t, GivenUp> given_up_;            // by slot (GaveUp)
  std::vector<std::unique_ptr<NamTable>> dropped_;  // kept for handles still held

  std::mutex observe_mu_;  // guards observed_
  struct Observed {
    uint64_t owner = 0;
    int64_t since = 0;
    bool evicting_said = false;  // EvictWriterOf logged its eviction of this owner's process
  };
  std::vector<Observed> observed_;
  std::mutex renewal_health_mu_;               // guards the two below (after observe_mu_, if both)
  std::multiset<int64_t> renewals_in_flight_;  // send times of this process's renewals out
  int64_t renewal_trouble_at_ = 0;             // the end of the latest that failed or was slow

  std::mutex retire_mu_;  // guards retired_, drop_queue_, removals_, unlinked_, sweep_at_
  // Serialises ReclaimRetired (the maintenance thread, CollectGarbage, the destructor): its
  // index and record writes use the system session as their lock owner, and an owner is used
  // by one thread at a time (index/btree.h: a second thread would meet its own lock word and
  // share its index redo area).
  std::mutex reclaim_mu_;
  struct Retired {
    const NamTable* table;
    GlobalAddress chain;
  };
  std::deque<Retired> retired_;
  struct DropWait {
    const NamTable* table;
    uint64_t stamp;  // reclaimed once the LWM passes it
    uint64_t word;   // the descriptor's reclaimer word we expect (our system session's)
  };
  std::deque<DropWait> drop_queue_;
  struct Removal {
    const NamTable* table;
    GlobalAddress record;
    int64_t key;
    uint64_t seq;    // the tombstone's version
    uint64_t stamp;  // its commit stamp
  };
  std::deque<Removal> removals_;
  struct Unlinked {
    GlobalAddress record;
    uint64_t size;
    uint64_t stamp;  // freed once the LWM reaches it: no transaction holds the address then
  };
  std::deque<Unlinked> unlinked_;
  uint64_t sweep_at_ = 0;  // a sweep is due once the LWM reaches this (0: none)

  std::atomic<uint64_t> lwm_{0};
  std::atomic<uint64_t> latest_counter_{1};
  std::atomic<uint64_t> live_sessions_{0};

 public:
  // What collection has done (GcStats), counted by commits and the maintenance thread.
  struct GcCounters {
    std::atomic<uint64_t> dropped{0}, spilled{0}, chains_cut{0}, nodes_freed{0}, blobs_freed{0},
        tables_reclaimed{0}, records_removed{0};
  };
  GcCounters gc_;

 private:
  // The process's own operations that need no lock owner (renewals, slot scans, claims).
  OpCount count_;
  Access access_{memory_, count_};
  // Shutdown: the maintenance thread stops first (its last reclamation pass needs the system
  // session's lease), then the destructor's final pass, then the renewal thread.
  std::thread maintenance_, renewals_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_maintenance_ = false, stop_renewals_ = false;

 public:
  std::unique_ptr<Pool> owned_pool_;      // pool engine: the connection
  std::unique_ptr<Memory> owned_memory_;  // the Memory above
};

}  // namespace farpool::db
