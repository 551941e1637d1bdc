#include "pool/server/chunk_allocator.h"

#include <algorithm>
#include <iterator>

#include "common/units.h"

namespace farpool {

ChunkAllocator::ChunkAllocator(uint64_t capacity_hint, uint64_t chunk_size)
    : chunk_size_(chunk_size), capacity_(capacity_hint / chunk_size * chunk_size) {
  if (capacity_ > 0) free_.emplace(wire::kRootAreaSize, capacity_);
}

uint64_t ChunkAllocator::largest_free() const {
  uint64_t best = 0;
  for (const auto& [offset, length] : free_) best = std::max(best, length);
  return best;
}

Result<uint64_t> ChunkAllocator::Lease(uint64_t size, uint32_t owner) {
  if (size == 0 || size % chunk_size_ != 0) {
    return Status::InvalidArgument("lease size " + std::to_string(size) +
                                   " is not a positive multiple of the chunk size " +
                                   std::to_string(chunk_size_));
  }
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    uint64_t offset = it->first;
    uint64_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + size, rest);
    leases_.emplace(offset, Held{size, owner, false});
    leased_ += size;
    return offset;
  }
  return Status::OutOfMemory("pool full: cannot lease " + FormatSize(size) + "; " +
                             FormatSize(capacity_ - leased_) + " free of " + FormatSize(capacity_) +
                             ", largest contiguous run " + FormatSize(largest_free()));
}

Status ChunkAllocator::LeaseAt(uint64_t offset, uint64_t size, uint32_t owner, bool root) {
  if (root && size == chunk_size_ && RootOf(owner) == offset) return Status::Ok();
  if (root && (size != chunk_size_ || owner == 0 || roots_.count(owner) != 0)) {
    return Status::InvalidArgument("cannot lease a root area of " + std::to_string(size) +
                                   " bytes to pool id " + std::to_string(owner) +
                                   ": one chunk, for a pool other than the default, once");
  }
  auto it = free_.upper_bound(offset);
  if (size == 0 || size % chunk_size_ != 0 || offset < wire::kRootAreaSize ||
      (offset - wire::kRootAreaSize) % chunk_size_ != 0 || it == free_.begin() ||
      (--it, offset + size > it->first + it->second)) {
    return Status::InvalidArgument("cannot lease " + std::to_string(size) + " bytes at offset " +
                                   std::to_string(offset) + ": not a free run of whole chunks of " +
                                   std::to_string(chunk_size_) + " bytes");
  }
  const uint64_t run = it->first, length = it->second;
  free_.erase(it);
  if (offset > run) free_.emplace(run, offset - run);
  if (run + length > offset + size) free_.emplace(offset + size, run + length - offset - size);
  leases_.emplace(offset, Held{size, owner, root});
  if (root) roots_.emplace(owner, offset);
  leased_ += size;
  return Status::Ok();
}

Result<uint64_t> ChunkAllocator::LeaseRoot(uint32_t owner, bool* created) {
  *created = false;
  if (auto root = RootOf(owner)) return *root;
  FARPOOL_ASSIGN_OR_RETURN(uint64_t offset, Lease(chunk_size_, owner));
  leases_.at(offset).root = true;
  roots_.emplace(owner, offset);
  *created = true;
  return offset;
}

std::optional<uint64_t> ChunkAllocator::RootOf(uint32_t owner) const {
  auto it = roots_.find(owner);
  if (it == roots_.end()) return std::nullopt;
  return it->second;
}

Status ChunkAllocator::Release(uint64_t offset, uint64_t size, uint32_t owner) {
  auto lease = leases_.find(offset);
  if (lease == leases_.end() || lease->second.length != size) {
    return Status::InvalidArgument("no lease of " + std::to_string(size) + " bytes at offset " +
                                   std::to_string(offset) + " (already released or never leased)");
  }
  if (lease->second.owner != owner) {
    return Status::PermissionDenied("the lease of " + std::to_string(size) + " bytes at offset " +
                                    std::to_string(offset) + " belongs to another pool");
  }
  if (lease->second.root) {
    return Status::InvalidArgument("the lease at offset " + std::to_string(offset) +
                                   " is its pool's root area, which is never released");
  }
  leases_.erase(lease);
  leased_ -= size;
  // Insert and coalesce with the neighbours.
  auto [it, inserted] = free_.emplace(offset, size);
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
      it = prev;
    }
  }
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  return Status::Ok();
}

ChunkAllocator::Access ChunkAllocator::Check(uint64_t offset, uint64_t size, uint32_t owner) const {
  if (offset < wire::kRootAreaSize) {
    if (owner != 0) return Access::kOtherPool;  // the default pool's root area
    return offset >= wire::kRootReserved && size <= wire::kRootAreaSize - offset ? Access::kOk
                                                                                 : Access::kOutside;
  }
  auto lease = leases_.upper_bound(offset);
  if (lease == leases_.begin()) return Access::kOutside;
  --lease;
  const uint64_t end = lease->first + lease->second.length;
  if (offset >= end) return Access::kOutside;
  if (lease->second.owner != owner) return Access::kOtherPool;
  return size <= end - offset ? Access::kOk : Access::kOutside;
}

}  // namespace farpool
