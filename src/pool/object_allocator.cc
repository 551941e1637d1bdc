#include "pool/object_allocator.h"

#include <algorithm>
#include <bit>
#include <string>

#include "transport/wire.h"

namespace farpool {
namespace {

constexpr unsigned kMinSlotShift = 6;  // 64-byte slots

enum Kind : uint32_t { kNone = 0, kSlab = 1, kRun = 2, kFreed = 3 };

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

struct ObjectAllocator::ChunkState {
  std::atomic<uint32_t> kind{kNone};
  std::atomic<uint32_t> slot_shift{0};  // slab: log2(slot size)
  std::atomic<uint64_t> run_offset{0};  // run: the object's first byte
  std::atomic<uint64_t> run_size{0};    // run: the object's leased size
  // Slab: one bit per slot; allocated on first use as a slab and kept (never freed while the
  // allocator lives, so CheckLive may read it without a lock).
  std::unique_ptr<std::atomic<uint64_t>[]> live;
  uint32_t live_count = 0;  // guarded by mu_
  uint32_t hint = 0;        // guarded by mu_: first bitmap word that may have a free slot
};

struct ObjectAllocator::Server {
  Geometry geometry;
  uint64_t num_chunks;
  std::unique_ptr<ChunkState[]> chunks;
  std::vector<std::vector<uint64_t>> partial;           // per class: slab chunks with a free slot
  std::vector<std::pair<uint64_t, uint64_t>> retained;  // freed runs still leased

  uint64_t ChunkBase(uint64_t chunk) const {
    return wire::kRootAreaSize + chunk * geometry.chunk_size;
  }
  unsigned NumClasses() const {
    return static_cast<unsigned>(std::bit_width(geometry.chunk_size / 4) - kMinSlotShift);
  }
};

ObjectAllocator::ObjectAllocator(const std::vector<Geometry>& servers, size_t capacity,
                                 LeaseFn lease, ReleaseFn release)
    : lease_(std::move(lease)), release_(std::move(release)), servers_(capacity) {
  for (const Geometry& g : servers) servers_[count_++] = MakeServer(g);
}

std::unique_ptr<ObjectAllocator::Server> ObjectAllocator::MakeServer(const Geometry& g) {
  auto s = std::make_unique<Server>();
  s->geometry = g;
  s->num_chunks = g.region_size > wire::kRootAreaSize
                      ? (g.region_size - wire::kRootAreaSize) / g.chunk_size
                      : 0;
  s->chunks = std::make_unique<ChunkState[]>(s->num_chunks);
  s->partial.resize(s->NumClasses());
  return s;
}

Result<size_t> ObjectAllocator::AddServer(const Geometry& geometry) {
  std::lock_guard lock(mu_);
  const size_t index = count_.load(std::memory_order_relaxed);
  if (index == servers_.size()) {
    return Status::ResourceExhausted("the allocator's table of " + std::to_string(servers_.size()) +
                                     " servers is full");
  }
  servers_[index] = MakeServer(geometry);
  count_.store(index + 1, std::memory_order_release);
  return index;
}

ObjectAllocator::~ObjectAllocator() = default;

uint64_t ObjectAllocator::max_slab_object(size_t index) const {
  return servers_[index]->geometry.chunk_size / 4;
}

Result<uint64_t> ObjectAllocator::Allocate(size_t index, uint64_t size) {
  if (size == 0) return Status::InvalidArgument("cannot allocate 0 bytes");
  std::lock_guard lock(mu_);
  if (size > max_slab_object(index)) return AllocateRun(index, size);
  unsigned shift = std::max<unsigned>(kMinSlotShift, std::bit_width(size - 1));
  return AllocateSlot(index, shift - kMinSlotShift);
}

Result<uint64_t> ObjectAllocator::AllocateRun(size_t index, uint64_t size) {
  Server& s = *servers_[index];
  const uint64_t chunk = s.geometry.chunk_size;
  const uint64_t leased = (size + chunk - 1) / chunk * chunk;
  FARPOOL_ASSIGN_OR_RETURN(uint64_t offset, TakeRun(index, leased));
  const uint64_t first = (offset - wire::kRootAreaSize) / chunk;
  for (uint64_t c = first; c < first + leased / chunk; ++c) {
    ChunkState& cs = s.chunks[c];
    cs.run_offset.store(offset, std::memory_order_relaxed);
    cs.run_size.store(leased, std::memory_order_relaxed);
    cs.kind.store(kRun, std::memory_order_release);
  }
  return offset;
}

Result<uint64_t> ObjectAllocator::TakeRun(size_t index, uint64_t size) {
  Server& s = *servers_[index];
  for (auto it = s.retained.begin(); it != s.retained.end(); ++it) {
    if (it->second != size) continue;
    const uint64_t offset = it->first;
    s.retained.erase(it);
    return offset;
  }
  auto leased = lease_(index, size);
  if (leased.ok() || leased.status().code() != StatusCode::kOutOfMemory || s.retained.empty()) {
    return leased;
  }
  // Our own freed runs may be what fills the server: give them back and try once more.
  FARPOOL_RETURN_IF_ERROR(TrimLocked(index));
  return lease_(index, size);
}

void ObjectAllocator::Retain(size_t index, uint64_t offset, uint64_t size) {
  Server& s = *servers_[index];
  const uint64_t first = (offset - wire::kRootAreaSize) / s.geometry.chunk_size;
  for (uint64_t c = first; c < first + size / s.geometry.chunk_size; ++c) {
    s.chunks[c].kind.store(kFreed, std::memory_order_release);
  }
  s.retained.emplace_back(offset, size);
}

Status ObjectAllocator::TrimLocked(size_t index) {
  Server& s = *servers_[index];
  Status first_error;
  std::vector<std::pair<uint64_t, uint64_t>> kept;
  for (auto [offset, size] : s.retained) {
    Status st = release_(index, offset, size);
    if (!st.ok()) {
      if (first_error.ok()) first_error = st;
      kept.emplace_back(offset, size);
      continue;
    }
    const uint64_t first = (offset - wire::kRootAreaSize) / s.geometry.chunk_size;
    for (uint64_t c = first; c < first + size / s.geometry.chunk_size; ++c) {
      s.chunks[c].kind.store(kNone, std::memory_order_release);
    }
  }
  s.retained = std::move(kept);
  return first_error;
}

Status ObjectAllocator::Trim() {
  std::lock_guard lock(mu_);
  Status first_error;
  for (size_t i = 0; i < count_.load(std::memory_order_relaxed); ++i) {
    Status st = TrimLocked(i);
    if (first_error.ok() && !st.ok()) first_error = st;
  }
  return first_error;
}

Result<uint64_t> ObjectAllocator::AllocateSlot(size_t index, unsigned cls) {
  Server& s = *servers_[index];
  const unsigned shift = cls + kMinSlotShift;
  const uint64_t slots = s.geometry.chunk_size >> shift;
  const uint64_t words = (slots + 63) / 64;
  auto& partial = s.partial[cls];
  if (partial.empty()) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t offset, TakeRun(index, s.geometry.chunk_size));
    const uint64_t c = (offset - wire::kRootAreaSize) / s.geometry.chunk_size;
    ChunkState& cs = s.chunks[c];
    const uint64_t max_words = (s.geometry.chunk_size >> kMinSlotShift) / 64;
    if (!cs.live) cs.live = std::make_unique<std::atomic<uint64_t>[]>(max_words);
    for (uint64_t w = 0; w < max_words; ++w) cs.live[w].store(0, std::memory_order_relaxed);
    cs.live_count = 0;
    cs.hint = 0;
    cs.slot_shift.store(shift, std::memory_order_relaxed);
    cs.kind.store(kSlab, std::memory_order_release);
    partial.push_back(c);
  }
  const uint64_t c = partial.back();
  ChunkState& cs = s.chunks[c];
  for (uint64_t w = cs.hint; w < words; ++w) {
    uint64_t bits = cs.live[w].load(std::memory_order_relaxed);
    if (bits == ~uint64_t{0}) continue;
    const unsigned bit = std::countr_one(bits);
    const uint64_t slot = w * 64 + bit;
    if (slot >= slots) break;
    cs.live[w].store(bits | (uint64_t{1} << bit), std::memory_order_release);
    cs.hint = static_cast<uint32_t>(w);
    if (++cs.live_count == slots) partial.pop_back();
    return s.ChunkBase(c) + (slot << shift);
  }
  return Status::Internal("slab chunk " + std::to_string(c) +
                          " in the partial list has no free slot");
}

Status ObjectAllocator::Free(size_t index, uint64_t offset) {
  std::lock_guard lock(mu_);
  Server& s = *servers_[index];
  const uint64_t chunk = s.geometry.chunk_size;
  auto not_ours = [&] {
    return Status::InvalidArgument("offset " + Hex(offset) +
                                   " is not a live object allocated by this client");
  };
  if (offset < wire::kRootAreaSize) return not_ours();
  const uint64_t c = (offset - wire::kRootAreaSize) / chunk;
  if (c >= s.num_chunks) return not_ours();
  ChunkState& cs = s.chunks[c];
  switch (cs.kind.load(std::memory_order_relaxed)) {
    case kRun: {
      const uint64_t run = cs.run_offset.load(std::memory_order_relaxed);
      const uint64_t size = cs.run_size.load(std::memory_order_relaxed);
      if (run != offset) return not_ours();
      Retain(index, run, size);
      return Status::Ok();
    }
    case kSlab: {
      const unsigned shift = cs.slot_shift.load(std::memory_order_relaxed);
      const uint64_t rel = offset - s.ChunkBase(c);
      if ((rel & ((uint64_t{1} << shift) - 1)) != 0) return not_ours();
      const uint64_t slot = rel >> shift;
      const uint64_t mask = uint64_t{1} << (slot % 64);
      const uint64_t bits = cs.live[slot / 64].load(std::memory_order_relaxed);
      if ((bits & mask) == 0) {
        return Status::InvalidArgument("offset " + Hex(offset) + " was already freed");
      }
      const uint64_t slots = chunk >> shift;
      auto& partial = s.partial[shift - kMinSlotShift];
      if (cs.live_count == slots) partial.push_back(c);  // was full: has a free slot now
      cs.live[slot / 64].store(bits & ~mask, std::memory_order_release);
      cs.hint = std::min<uint32_t>(cs.hint, static_cast<uint32_t>(slot / 64));
      if (--cs.live_count == 0) {
        partial.erase(std::find(partial.begin(), partial.end(), c));
        Retain(index, s.ChunkBase(c), chunk);
      }
      return Status::Ok();
    }
    case kFreed:
      return Status::InvalidArgument("offset " + Hex(offset) + " was already freed");
    default:
      return not_ours();
  }
}

Status ObjectAllocator::CheckLive(size_t index, uint64_t offset, uint64_t size) const {
  const Server& s = *servers_[index];
  if (offset < wire::kRootAreaSize) return Status::Ok();
  const uint64_t chunk = s.geometry.chunk_size;
  const uint64_t c = (offset - wire::kRootAreaSize) / chunk;
  if (c >= s.num_chunks) return Status::Ok();  // the caller checks region bounds
  const ChunkState& cs = s.chunks[c];
  switch (cs.kind.load(std::memory_order_acquire)) {
    case kRun: {
      const uint64_t run = cs.run_offset.load(std::memory_order_relaxed);
      const uint64_t run_size = cs.run_size.load(std::memory_order_relaxed);
      if (offset + size > run + run_size) {
        return Status::InvalidArgument("range " + Hex(offset) + "+" + std::to_string(size) +
                                       " crosses the end of the object at " + Hex(run));
      }
      return Status::Ok();
    }
    case kFreed:
      return Status::InvalidArgument("address " + Hex(offset) +
                                     " is inside memory this client freed");
    case kSlab: {
      const unsigned shift = cs.slot_shift.load(std::memory_order_relaxed);
      const uint64_t rel = offset - s.ChunkBase(c);
      const uint64_t slot = rel >> shift;
      const uint64_t bits = cs.live[slot / 64].load(std::memory_order_acquire);
      if ((bits & (uint64_t{1} << (slot % 64))) == 0) {
        return Status::InvalidArgument("address " + Hex(offset) +
                                       " is inside an object that was freed");
      }
      if (rel + size > ((slot + 1) << shift)) {
        return Status::InvalidArgument("range " + Hex(offset) + "+" + std::to_string(size) +
                                       " crosses the end of its " +
                                       std::to_string(uint64_t{1} << shift) + "-byte object");
      }
      return Status::Ok();
    }
    default:
      return Status::Ok();
  }
}

}  // namespace farpool
