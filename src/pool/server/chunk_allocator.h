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
// Pools (tenants; docs/pool.md "Pools"): every lease records its owner (transport::PoolId, 0:
// the default pool), and only the owner's clients may touch, or release, it. The root area
// is the default pool's; every other pool has a root area of its own, one chunk it is leased
// at its first hello on this server (LeaseRoot) and never released.
//
// Thread-safety: not thread-safe; the server calls it from its progress thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>

#include "farpool/status.h"
#include "transport/wire.h"

namespace farpool {

class ChunkAllocator {
 public:
  // REQUIRES: chunk_size > 0. Capacity is the whole chunks that fit in `capacity_hint`.
  ChunkAllocator(uint64_t capacity_hint, uint64_t chunk_size);

  // Leases `size` bytes to pool `owner`. Errors: InvalidArgument if size is 0 or not a
  // multiple of the chunk size; OutOfMemory (naming capacity, free and largest run) if no run
  // is large enough.
  Result<uint64_t> Lease(uint64_t size, uint32_t owner);
  // Leases exactly [offset, offset + size) to `owner`, as its root area if `root` (a backup
  // mirroring its primary's book). A root that `owner` has there already is Ok, nothing
  // changed (a primary resends its root leases after a failed forward: backup_link.h).
  // Errors: InvalidArgument unless it is a run of whole chunks that is free (and, for a root,
  // one chunk, `owner` nonzero and without another root).
  Status LeaseAt(uint64_t offset, uint64_t size, uint32_t owner, bool root);
  // The root area of pool `owner` (REQUIRES: owner != 0): its offset, leased now (one chunk)
  // if it has none yet (`created` says so). Errors: those of Lease.
  Result<uint64_t> LeaseRoot(uint32_t owner, bool* created);
  std::optional<uint64_t> RootOf(uint32_t owner) const;
  // Errors: InvalidArgument unless [offset, offset+size) is exactly one current lease, or if it
  // is a pool's root area; PermissionDenied if another pool than `owner` holds it.
  Status Release(uint64_t offset, uint64_t size, uint32_t owner);

  // Whether pool `owner` may touch [offset, offset+size): kOk inside one of its leases or,
  // for the default pool, inside the root area past the null word; kOtherPool if the range
  // begins in another pool's lease or (for a pool) in the root area; else kOutside.
  enum class Access : uint8_t { kOk, kOutside, kOtherPool };
  Access Check(uint64_t offset, uint64_t size, uint32_t owner) const;

  uint64_t chunk_size() const { return chunk_size_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t leased() const { return leased_; }
  uint64_t largest_free() const;
  // A lease: its length, its pool, whether it is that pool's root area.
  struct Held {
    uint64_t length;
    uint32_t owner;
    bool root;
  };
  // The leases by offset (a primary copies its book, owners and roots, to a new backup).
  const std::map<uint64_t, Held>& leases() const { return leases_; }
  // Bytes the region must span: root area + capacity.
  uint64_t region_size() const { return wire::kRootAreaSize + capacity_; }

 private:
  uint64_t chunk_size_;
  uint64_t capacity_;
  uint64_t leased_ = 0;
  std::map<uint64_t, uint64_t> free_;             // offset -> length, coalesced
  std::map<uint64_t, Held> leases_;               // by offset
  std::unordered_map<uint32_t, uint64_t> roots_;  // pool -> its root area's offset
};

}  // namespace farpool
