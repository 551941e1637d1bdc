#include "db/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/far_copy.h"
#include "pool/memory_ops.h"

namespace farpool::db {
namespace {

// ---------------------------------------------------------------- pool

class PoolBatch final : public MemoryBatch {
 public:
  explicit PoolBatch(Pool& pool) : batch_(pool) {}
  Status Read(GlobalAddress s, void* d, uint64_t n) override { return batch_.Read(s, d, n); }
  Status Write(GlobalAddress d, const void* s, uint64_t n) override {
    return batch_.Write(d, s, n);
  }
  Status CompareAndSwap(GlobalAddress a, uint64_t e, uint64_t d, uint64_t* p) override {
    return batch_.CompareAndSwap(a, e, d, p);
  }
  Status FetchAdd(GlobalAddress a, uint64_t d, uint64_t* p) override {
    return batch_.FetchAdd(a, d, p);
  }
  Status WaitCompareAndSwap(GlobalAddress a, uint64_t e, uint64_t d, const WaitSpec& spec,
                            WaitCasResult* result) override {
    return batch_.WaitCompareAndSwap(a, e, d, spec, result);
  }
  Status LookupRead(GlobalAddress b, const LookupSpec& spec, uint64_t key, void* record,
                    uint32_t size, LookupResult* result) override {
    return batch_.LookupRead(b, spec, key, record, size, result);
  }
  Status LookupLockRead(GlobalAddress b, const LookupSpec& spec, uint64_t key, uint32_t lock_offset,
                        uint64_t held_mask, uint64_t lock_word, void* record, uint32_t size,
                        LockReadResult* result) override {
    return batch_.LookupLockRead(b, spec, key, lock_offset, held_mask, lock_word, record, size,
                                 result);
  }
  Status InsertIfAbsent(GlobalAddress b, const LookupSpec& spec, uint32_t lock_offset,
                        uint64_t lock_word, uint64_t key, uint64_t value,
                        InsertResult* result) override {
    return batch_.InsertIfAbsent(b, spec, lock_offset, lock_word, key, value, result);
  }
  Status Fence() override { return batch_.Fence(); }
  Status Wait() override { return batch_.Wait(); }
  size_t posted() const override { return batch_.posted(); }

 private:
  Batch batch_;
};

class PoolMemory final : public Memory {
 public:
  explicit PoolMemory(Pool& pool) : pool_(pool) {
    auto ids = pool.server_ids();
    root_ = pool.RootArea(ids.empty() ? 0 : *std::min_element(ids.begin(), ids.end()));
    mapped_ = std::all_of(ids.begin(), ids.end(),
                          [&](uint16_t id) { return pool.AccessPath(id) == "direct"; });
  }
  Status Read(GlobalAddress s, void* d, uint64_t n) override { return pool_.Read(s, d, n); }
  Status Write(GlobalAddress d, const void* s, uint64_t n) override { return pool_.Write(d, s, n); }
  Result<uint64_t> CompareAndSwap(GlobalAddress a, uint64_t e, uint64_t d) override {
    return pool_.CompareAndSwap(a, e, d);
  }
  Result<uint64_t> FetchAdd(GlobalAddress a, uint64_t d) override { return pool_.FetchAdd(a, d); }
  Result<GlobalAddress> Alloc(uint64_t size, Placement p) override { return pool_.Alloc(size, p); }
  Status Free(GlobalAddress a) override { return pool_.Free(a); }
  Result<GlobalAddress> LeaseRun(uint16_t server, uint64_t size) override {
    return pool_.LeaseRun(server, size);
  }
  Status ReleaseRun(GlobalAddress start, uint64_t size) override {
    return pool_.ReleaseRun(start, size);
  }
  Result<RegionGeometry> Geometry(uint16_t server) const override { return pool_.Geometry(server); }
  Result<uint16_t> ServerFor(Placement placement) override { return pool_.ServerFor(placement); }
  // A pool Batch costs a few allocations and belongs to the thread that made it: each thread
  // reuses its own (a transaction makes several batches, and on mapped shared memory their
  // operations take less time than the allocations would).
  std::unique_ptr<MemoryBatch> NewBatch() override {
    {
      std::lock_guard<std::mutex> l(idle_mu_);
      auto it = idle_.find(std::this_thread::get_id());
      if (it != idle_.end() && !it->second.empty()) {
        std::unique_ptr<MemoryBatch> b = std::move(it->second.back());
        it->second.pop_back();
        return b;
      }
    }
    return std::make_unique<PoolBatch>(pool_);
  }
  void RecycleBatch(std::unique_ptr<MemoryBatch> batch) override {
    constexpr size_t kIdlePerThread = 4;
    std::lock_guard<std::mutex> l(idle_mu_);
    auto& idle = idle_[std::this_thread::get_id()];
    if (idle.size() < kIdlePerThread) idle.push_back(std::move(batch));
  }
  std::vector<uint16_t> servers() const override { return pool_.server_ids(); }
  GlobalAddress Root() const override { return root_; }
  uint32_t process_tag() const override { return pool_.process_tag(); }
  Status Evict(uint32_t tag) override { return pool_.Evict(tag); }
  bool mapped() const override { return mapped_; }
  bool replicated() const override { return pool_.replicated(); }
  Status ConnectThread() override { return pool_.ConnectThread(); }

 private:
  Pool& pool_;
  GlobalAddress root_;
  bool mapped_ = false;
  std::mutex idle_mu_;  // guards idle_
  std::unordered_map<std::thread::id, std::vector<std::unique_ptr<MemoryBatch>>> idle_;
};

// ---------------------------------------------------------------- local

// Objects are rounded up to 64 bytes (cache lines, 8-byte atomics stay aligned) and carved by
// a bump pointer per region; freed objects go to a free list of their size.
class LocalMemory final : public Memory {
 public:
  static constexpr uint64_t kFirstObject = 4096;  // [64, 4096) is the root area

  ~LocalMemory() override {
    for (auto& r : regions_) munmap(r.base, size_);
  }

  static Result<std::unique_ptr<Memory>> Create(int servers, uint64_t bytes) {
    if (servers < 1 || servers > 1024) {
      return Status::InvalidArgument("local memory: " + std::to_string(servers) +
                                     " servers (expected 1..1024)");
    }
    if (bytes < (1u << 20)) return Status::InvalidArgument("local memory: regions below 1 MiB");
    std::unique_ptr<LocalMemory> m(new LocalMemory(bytes));
    m->regions_ = std::vector<Region>(servers);
    for (auto& r : m->regions_) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        return Status::OutOfMemory("local memory: cannot reserve " + std::to_string(bytes) +
                                   " bytes: " + std::strerror(errno));
      }
      r.base = static_cast<std::byte*>(p);
      r.next = kFirstObject;
      r.floor = (bytes - kFirstObject) / m->chunk_;
    }
    return std::unique_ptr<Memory>(std::move(m));
  }

  Status Read(GlobalAddress s, void* d, uint64_t n) override {
    std::byte* p;
    FARPOOL_RETURN_IF_ERROR(Resolve(s, n, false, &p));
    FarRead(d, p, n);
    return Status::Ok();
  }
  Status Write(GlobalAddress d, const void* s, uint64_t n) override {
    std::byte* p;
    FARPOOL_RETURN_IF_ERROR(Resolve(d, n, false, &p));
    FarWrite(p, s, n);
    return Status::Ok();
  }
  Result<uint64_t> CompareAndSwap(GlobalAddress a, uint64_t e, uint64_t d) override {
    std::byte* p;
    FARPOOL_RETURN_IF_ERROR(Resolve(a, 8, true, &p));
    std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(p));
    word.compare_exchange_strong(e, d);
    return e;
  }
  Result<uint64_t> FetchAdd(GlobalAddress a, uint64_t d) override {
    std::byte* p;
    FARPOOL_RETURN_IF_ERROR(Resolve(a, 8, true, &p));
    std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(p));
    return word.fetch_add(d);
  }
  Result<GlobalAddress> Alloc(uint64_t size, Placement placement) override {
    if (size == 0) return Status::InvalidArgument("local memory: zero-byte allocation");
    const uint64_t rounded = (size + 63) & ~uint64_t{63};
    const size_t n = regions_.size();
    size_t first;
    switch (placement.kind()) {
      case Placement::Kind::kOnServer:
        if (placement.value() >= n) {
          return Status::InvalidArgument("local memory: no server " +
                                         std::to_string(placement.value()));
        }
        first = placement.value();
        break;
      case Placement::Kind::kByKey:
        first = (placement.value() * 0x9E3779B97F4A7C15ull >> 32) % n;
        break;
      default:
        first = stripe_.fetch_add(1, std::memory_order_relaxed) % n;
    }
    const size_t tries = placement.kind() == Placement::Kind::kOnServer ? 1 : n;
    for (size_t t = 0; t < tries; ++t) {
      const size_t s = (first + t) % n;
      Region& r = regions_[s];
      {
        std::lock_guard<std::mutex> lock(r.mu);
        auto it = r.free.find(rounded);
        if (it != r.free.end() && !it->second.empty()) {
          uint64_t off = it->second.back();
          it->second.pop_back();
          r.sizes[off] = rounded;
          return GlobalAddress(static_cast<uint16_t>(s), off);
        }
      }
      std::lock_guard<std::mutex> lock(r.mu);
      const uint64_t off = r.next;
      if (off + rounded <= ChunkStart(r.floor)) {
        r.next += rounded;
        r.sizes[off] = rounded;
        return GlobalAddress(static_cast<uint16_t>(s), off);
      }
    }
    return Status::OutOfMemory("local memory: no room for " + std::to_string(size) + " bytes (" +
                               std::to_string(n) + " regions of " + std::to_string(size_) +
                               " bytes)");
  }
  Status Free(GlobalAddress a) override {
    if (a.server() >= regions_.size())
      return Status::InvalidArgument("local memory: bad free " + a.ToString());
    Region& r = regions_[a.server()];
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.sizes.find(a.offset());
    if (it == r.sizes.end()) {
      return Status::InvalidArgument("local memory: free of " + a.ToString() +
                                     ", which is not an allocated object");
    }
    r.free[it->second].push_back(a.offset());
    r.sizes.erase(it);
    return Status::Ok();
  }
  // Shared leases: runs of whole chunks taken from the top of the region down (objects grow up
  // from the bottom), released runs reused.
  Result<GlobalAddress> LeaseRun(uint16_t server, uint64_t size) override {
    if (server >= regions_.size() || size == 0 || size % chunk_ != 0) {
      return Status::InvalidArgument("local memory: LeaseRun(" + std::to_string(server) + ", " +
                                     std::to_string(size) + ")");
    }
    const uint64_t n = size / chunk_;
    Region& r = regions_[server];
    std::lock_guard<std::mutex> lock(r.mu);
    uint64_t first = 0;
    bool found = false;
    for (auto it = r.free_chunks.begin(); it != r.free_chunks.end() && !found; ++it) {
      uint64_t k = 1;
      while (k < n && r.free_chunks.count(*it + k)) ++k;
      if (k == n) first = *it, found = true;
    }
    if (found) {
      for (uint64_t k = 0; k < n; ++k) r.free_chunks.erase(first + k);
    } else if (r.floor >= n && ChunkStart(r.floor - n) >= r.next) {
      first = r.floor -= n;
    } else {
      return Status::OutOfMemory("local memory: no room for a run of " + std::to_string(size) +
                                 " bytes on server " + std::to_string(server));
    }
    r.runs[first] = n;
    return GlobalAddress(server, ChunkStart(first));
  }
  Status ReleaseRun(GlobalAddress start, uint64_t size) override {
    if (start.server() >= regions_.size() || start.offset() < kFirstObject ||
        (start.offset() - kFirstObject) % chunk_ != 0) {
      return Status::InvalidArgument("local memory: ReleaseRun of " + start.ToString() +
                                     ", not the start of a chunk");
    }
    Region& r = regions_[start.server()];
    std::lock_guard<std::mutex> lock(r.mu);
    const uint64_t first = (start.offset() - kFirstObject) / chunk_;
    auto it = r.runs.find(first);
    if (it == r.runs.end() || it->second * chunk_ != size) {
      return Status::InvalidArgument("local memory: ReleaseRun(" + start.ToString() + ", " +
                                     std::to_string(size) + ") names no leased run");
    }
    for (uint64_t k = 0; k < it->second; ++k) r.free_chunks.insert(first + k);
    r.runs.erase(it);
    return Status::Ok();
  }
  Result<RegionGeometry> Geometry(uint16_t server) const override {
    if (server >= regions_.size())
      return Status::InvalidArgument("local memory: no server " + std::to_string(server));
    return RegionGeometry{size_, chunk_};
  }
  Result<uint16_t> ServerFor(Placement placement) override {
    const size_t n = regions_.size();
    switch (placement.kind()) {
      case Placement::Kind::kOnServer:
        if (placement.value() >= n) {
          return Status::InvalidArgument("local memory: no server " +
                                         std::to_string(placement.value()));
        }
        return static_cast<uint16_t>(placement.value());
      case Placement::Kind::kByKey:
        return static_cast<uint16_t>((placement.value() * 0x9E3779B97F4A7C15ull >> 32) % n);
      default:
        return static_cast<uint16_t>(stripe_.fetch_add(1, std::memory_order_relaxed) % n);
    }
  }
  std::unique_ptr<MemoryBatch> NewBatch() override;
  // The memory server's lookup-read (memory_ops), on this process's regions.
  Status LookupRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key, void* record,
                    uint32_t size, LookupResult* result) const {
    const memory_ops::LookupParams params = memory_ops::ParamsOf(spec);
    if (std::string why = memory_ops::CheckLookupParams(params); !why.empty()) {
      return Status::InvalidArgument("local memory: lookup-read at " + bucket.ToString() + ": " +
                                     why);
    }
    if (size > memory_ops::kMaxInlineBytes) {
      return Status::InvalidArgument("local memory: lookup-read of a record of " +
                                     std::to_string(size) + " bytes");
    }
    FARPOOL_ASSIGN_OR_RETURN(const memory_ops::Region region, BucketRegion(bucket, spec));
    std::vector<std::byte> out(sizeof(memory_ops::LookupReply) + size);
    memory_ops::ExecuteLookupRead(region, bucket.offset(), params, key, size, out.data());
    FARPOOL_RETURN_IF_ERROR(memory_ops::DecodeLookupReply(out.data(), bucket.server(), result)
                                .WithContext("local memory"));
    if (result->outcome == LookupResult::Outcome::kFound) {
      std::memcpy(record, out.data() + sizeof(memory_ops::LookupReply), size);
    }
    return Status::Ok();
  }
  // One attempt of the memory server's wait-compare-and-swap (memory_ops).
  Status WaitCompareAndSwap(GlobalAddress a, uint64_t e, uint64_t d, const WaitSpec& spec,
                            WaitCasResult* result) {
    const memory_ops::WaitParams params = memory_ops::ParamsOf(spec);
    if (std::string why = memory_ops::CheckWaitParams(params, d); !why.empty()) {
      return Status::InvalidArgument("local memory: wait-compare-and-swap at " + a.ToString() +
                                     ": " + why);
    }
    std::byte* p;
    FARPOOL_RETURN_IF_ERROR(Resolve(a, 8, true, &p));
    const memory_ops::WaitAttempt attempt =
        memory_ops::AttemptWaitCompareAndSwap(reinterpret_cast<uint64_t*>(p), e, d, params);
    *result = {attempt.previous,
               memory_ops::WaitCompareAndSwapSwapped(attempt.previous, e, params)};
    return Status::Ok();
  }
  // The memory server's lookup-lock-read (memory_ops), on this process's regions.
  Status LookupLockRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key,
                        uint32_t lock_offset, uint64_t held_mask, uint64_t lock_word, void* record,
                        uint32_t size, LockReadResult* result) const {
    const memory_ops::LockReadParams params{memory_ops::ParamsOf(spec), held_mask, lock_offset, 0};
    std::string why = memory_ops::CheckLockReadParams(params, size, lock_word);
    if (why.empty() && size > memory_ops::kMaxInlineBytes) why = "record out of range";
    if (!why.empty()) {
      return Status::InvalidArgument("local memory: lookup-lock-read at " + bucket.ToString() +
                                     ": " + why);
    }
    FARPOOL_ASSIGN_OR_RETURN(const memory_ops::Region region, BucketRegion(bucket, spec));
    std::vector<std::byte> out(sizeof(memory_ops::LookupReply) + sizeof(uint64_t) + size);
    memory_ops::ExecuteLookupLockRead(region, bucket.offset(), params, key, lock_word, size,
                                      out.data());
    return memory_ops::DecodeLockReadReply(out.data(), bucket.server(), held_mask, size, record,
                                           result)
        .WithContext("local memory");
  }
  // The memory server's insert-if-absent (memory_ops), on this process's regions.
  Status InsertIfAbsent(GlobalAddress bucket, const LookupSpec& spec, uint32_t lock_offset,
                        uint64_t lock_word, uint64_t key, uint64_t value,
                        InsertResult* result) const {
    const memory_ops::InsertParams params{
        memory_ops::ParamsOf(spec), lock_word, static_cast<uint16_t>(lock_offset), {}};
    std::string why = memory_ops::CheckInsertParams(params);
    if (why.empty() && (lock_offset != params.lock_offset || value == 0))
      why = "bad lock offset or zero value";
    if (!why.empty()) {
      return Status::InvalidArgument("local memory: insert-if-absent at " + bucket.ToString() +
                                     ": " + why);
    }
    FARPOOL_ASSIGN_OR_RETURN(const memory_ops::Region region, BucketRegion(bucket, spec));
    std::byte out[sizeof(memory_ops::InsertReply)];
    memory_ops::ExecuteInsertIfAbsent(region, bucket.offset(), params, key, value, out);
    return memory_ops::DecodeInsertReply(out, bucket.server(), result).WithContext("local memory");
  }
  std::vector<uint16_t> servers() const override {
    std::vector<uint16_t> ids(regions_.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i);
    return ids;
  }
  GlobalAddress Root() const override { return GlobalAddress(0, 64); }
  // Private memory of one process: every session is this process's, none is ever evicted.
  uint32_t process_tag() const override { return 1; }
  Status Evict(uint32_t tag) override {
    return Status::InvalidArgument("local memory belongs to one process: there is no process " +
                                   std::to_string(tag) + " to evict");
  }
  bool mapped() const override { return true; }
  bool replicated() const override { return false; }
  Status ConnectThread() override { return Status::Ok(); }

 private:
  struct Region {
    std::byte* base = nullptr;
    std::mutex mu;                      // guards everything below
    uint64_t next = 0;                  // the bump pointer of objects
    uint64_t floor = 0;                 // the lowest chunk ever leased (chunks() when none)
    std::set<uint64_t> free_chunks;     // released chunks at or above floor
    std::map<uint64_t, uint64_t> runs;  // leased run: first chunk -> chunks
    std::unordered_map<uint64_t, std::vector<uint64_t>> free;  // size -> offsets
    std::unordered_map<uint64_t, uint64_t> sizes;              // live offset -> size
  };
  // Chunks of 64 KiB .. 4 MiB, about 64 per region.
  explicit LocalMemory(uint64_t size)
      : size_(size),
        chunk_(
            std::min<uint64_t>(4 << 20, std::bit_floor(std::max<uint64_t>(64 << 10, size / 64)))) {}
  uint64_t ChunkStart(uint64_t chunk) const { return kFirstObject + chunk * chunk_; }

  // The region a lookup operation on `bucket` runs in, once the bucket itself resolves.
  Result<memory_ops::Region> BucketRegion(GlobalAddress bucket, const LookupSpec& spec) const {
    std::byte* p;
    FARPOOL_RETURN_IF_ERROR(Resolve(bucket, spec.bucket_size, true, &p));
    return memory_ops::Region{regions_[bucket.server()].base, size_,
                              [](uint64_t offset, uint64_t) { return offset >= 64; },
                              bucket.server()};
  }
  Status Resolve(GlobalAddress a, uint64_t n, bool atomic, std::byte** out) const {
    if (a.is_null()) return Status::InvalidArgument("local memory: null address");
    if (a.server() >= regions_.size()) {
      return Status::InvalidArgument("local memory: address " + a.ToString() + " names no server");
    }
    if (a.offset() < 64 || a.offset() + n > size_ || n > size_) {
      return Status::InvalidArgument("local memory: range " + a.ToString() + " + " +
                                     std::to_string(n) + " is outside the region");
    }
    if (atomic && (a.offset() & 7) != 0) {
      return Status::InvalidArgument("local memory: atomic on misaligned " + a.ToString());
    }
    *out = regions_[a.server()].base + a.offset();
    return Status::Ok();
  }

  uint64_t size_;
  uint64_t chunk_;
  std::vector<Region> regions_;
  std::atomic<uint64_t> stripe_{0};
};

// Local operations complete at once; the batch only remembers the first error.
class LocalBatch final : public MemoryBatch {
 public:
  explicit LocalBatch(LocalMemory& m) : m_(m) {}
  Status LookupRead(GlobalAddress b, const LookupSpec& spec, uint64_t key, void* record,
                    uint32_t size, LookupResult* result) override {
    return Note(m_.LookupRead(b, spec, key, record, size, result));
  }
  Status LookupLockRead(GlobalAddress b, const LookupSpec& spec, uint64_t key, uint32_t lock_offset,
                        uint64_t held_mask, uint64_t lock_word, void* record, uint32_t size,
                        LockReadResult* result) override {
    return Note(
        m_.LookupLockRead(b, spec, key, lock_offset, held_mask, lock_word, record, size, result));
  }
  Status InsertIfAbsent(GlobalAddress b, const LookupSpec& spec, uint32_t lock_offset,
                        uint64_t lock_word, uint64_t key, uint64_t value,
                        InsertResult* result) override {
    return Note(m_.InsertIfAbsent(b, spec, lock_offset, lock_word, key, value, result));
  }
  Status Read(GlobalAddress s, void* d, uint64_t n) override { return Note(m_.Read(s, d, n)); }
  Status Write(GlobalAddress d, const void* s, uint64_t n) override {
    return Note(m_.Write(d, s, n));
  }
  Status CompareAndSwap(GlobalAddress a, uint64_t e, uint64_t d, uint64_t* p) override {
    auto r = m_.CompareAndSwap(a, e, d);
    if (!r.ok()) return r.status();
    *p = *r;
    ++posted_;
    return Status::Ok();
  }
  Status FetchAdd(GlobalAddress a, uint64_t d, uint64_t* p) override {
    auto r = m_.FetchAdd(a, d);
    if (!r.ok()) return r.status();
    *p = *r;
    ++posted_;
    return Status::Ok();
  }
  // One attempt, as on the pool's mapped path (the caller polls).
  Status WaitCompareAndSwap(GlobalAddress a, uint64_t e, uint64_t d, const WaitSpec& spec,
                            WaitCasResult* result) override {
    return Note(m_.WaitCompareAndSwap(a, e, d, spec, result));
  }
  Status Fence() override { return Status::Ok(); }  // every operation is already complete
  Status Wait() override {
    posted_ = 0;
    return Status::Ok();
  }
  size_t posted() const override { return posted_; }

 private:
  Status Note(Status s) {
    if (s.ok()) ++posted_;
    return s;
  }
  LocalMemory& m_;
  size_t posted_ = 0;
};

std::unique_ptr<MemoryBatch> LocalMemory::NewBatch() { return std::make_unique<LocalBatch>(*this); }

}  // namespace

std::unique_ptr<Memory> NewPoolMemory(Pool& pool) { return std::make_unique<PoolMemory>(pool); }

Result<std::unique_ptr<Memory>> NewLocalMemory(int servers, uint64_t bytes_per_server) {
  return LocalMemory::Create(servers, bytes_per_server);
}

Status WriteZeros(const Access& access, GlobalAddress address, uint64_t size) {
  std::vector<unsigned char> zeros(std::min<uint64_t>(size, 1 << 20), 0);
  for (uint64_t off = 0; off < size; off += zeros.size()) {
    FARPOOL_RETURN_IF_ERROR(
        access.Write(address + off, zeros.data(), std::min<uint64_t>(zeros.size(), size - off)));
  }
  return Status::Ok();
}

Result<GlobalAddress> AllocZeroed(const Access& access, uint64_t size, Placement placement) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress a, access.Alloc(size, placement));
  FARPOOL_RETURN_IF_ERROR(WriteZeros(access, a, size));
  return a;
}

}  // namespace farpool::db
