// ChunkAllocator: a memory server's book of which parts of its region are leased.
//
// The region is [root area | chunk 0 | chunk 1 | ...]. The root area (wire::kRootAreaSize bytes
// at offset 0) is never leased: it holds well-known roots (the database catalog lives at server
// 0's root) and keeps offset 0 of server 0, the null address, out of every allocation. A lease
// is one contiguous run of whole chunks, found first-fit; a release must name exactly one
// earlier lease. Leases are owned by the pool, not by the connection that asked for them:
// data outlives the compute process that wrote it (that is the point of a memory pool), and
// is given back only by an explicit release.
//
// Thread-safety: not thread-safe; the server calls it from its progress thread only.
#pragma once

#include <cstdint>
#include <map>

#include "farpool/status.h"
#include "transport/wire.h"

namespace farpool {

class ChunkAllocator {
 public:
  // REQUIRES: chunk_size > 0. Capacity is the whole chunks that fit in `capacity_hint`.
  ChunkAllocator(uint64_t capacity_hint, uint64_t chunk_size);

  // Leases `size` bytes. Errors: InvalidArgument if size is 0 or not a multiple of the chunk
  // size; OutOfMemory (naming capacity, free and largest run) if no run is large enough.
  Result<uint64_t> Lease(uint64_t size);
  // Leases exactly [offset, offset + size) (a backup mirroring its primary's book). Errors:
  // InvalidArgument unless it is a run of whole chunks that is free.
  Status LeaseAt(uint64_t offset, uint64_t size);
  // Errors: InvalidArgument unless [offset, offset+size) is exactly one current lease.
  Status Release(uint64_t offset, uint64_t size);
  // Whether [offset, offset+size) lies inside the root area (past the null word) or inside
  // one current lease: what a client may touch.
  bool Covers(uint64_t offset, uint64_t size) const;

  uint64_t chunk_size() const { return chunk_size_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t leased() const { return leased_; }
  uint64_t largest_free() const;
  // The leases, offset -> length (a primary copies its book to a new backup).
  const std::map<uint64_t, uint64_t>& leases() const { return leases_; }
  // Bytes the region must span: root area + capacity.
  uint64_t region_size() const { return wire::kRootAreaSize + capacity_; }

 private:
  uint64_t chunk_size_;
  uint64_t capacity_;
  uint64_t leased_ = 0;
  std::map<uint64_t, uint64_t> free_;    // offset -> length, coalesced
  std::map<uint64_t, uint64_t> leases_;  // offset -> length
};

}  // namespace farpool
