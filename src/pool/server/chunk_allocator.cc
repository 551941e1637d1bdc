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

Result<uint64_t> ChunkAllocator::Lease(uint64_t size) {
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
    leases_.emplace(offset, size);
    leased_ += size;
    return offset;
  }
  return Status::OutOfMemory("pool full: cannot lease " + FormatSize(size) + "; " +
                             FormatSize(capacity_ - leased_) + " free of " + FormatSize(capacity_) +
                             ", largest contiguous run " + FormatSize(largest_free()));
}

Status ChunkAllocator::LeaseAt(uint64_t offset, uint64_t size) {
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
  leases_.emplace(offset, size);
  leased_ += size;
  return Status::Ok();
}

Status ChunkAllocator::Release(uint64_t offset, uint64_t size) {
  auto lease = leases_.find(offset);
  if (lease == leases_.end() || lease->second != size) {
    return Status::InvalidArgument("no lease of " + std::to_string(size) + " bytes at offset " +
                                   std::to_string(offset) + " (already released or never leased)");
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

bool ChunkAllocator::Covers(uint64_t offset, uint64_t size) const {
  if (offset >= wire::kRootReserved && offset <= wire::kRootAreaSize &&
      size <= wire::kRootAreaSize - offset) {
    return true;
  }
  auto lease = leases_.upper_bound(offset);
  if (lease == leases_.begin()) return false;
  --lease;
  const uint64_t end = lease->first + lease->second;
  return offset < end && size <= end - offset;
}

}  // namespace farpool
