// IndexRedo: the format of a lock owner's index redo area (LockOwner::index_log()).
//
// An index writer that is about to overwrite a node in place (a write of more than one word,
// which the pool does not make atomic) first writes one redo entry here: the node's address,
// the lock word it holds on the node, and the node's whole new image. A process that breaks
// the lock of a dead holder and finds the node torn rewrites the image from the entry. The
// entry is never cleared: the next entry supersedes it (why that is safe: btree.h,
// "Invariants / How it works").
//
// The area has two entry positions. Every write is logged at the primary one (offset 0),
// except one case: an owner that inherited its area from a dead earlier owner (a session slot
// reused by a new epoch) and repairs a node that owner tore copies the dead owner's entry to
// the other position, so the entry it replays survives until the repair is done (btree.h,
// invariant 5). A reader of an area takes the alternate entry first if it matches.
//
// Each entry: | magic | target | lock | size | checksum | image[size] |,
// `checksum` over the four words before it and the image. The image is the node's body: its
// bytes from target + kIndexRedoImageOffset on (everything but the lock word). An entry that does
// not verify was never written whole, so its node was not touched yet.
#pragma once

#include <cstdint>

#include "db/layout.h"
#include "db/lock_owner.h"

namespace farpool::db {

struct IndexRedoHeader {
  uint64_t magic;   // kIndexRedoMagic once an entry was ever written
  uint64_t target;  // raw GlobalAddress of the node; the image replaces what follows its lock
  uint64_t lock;    // the lock word held on the node while the entry is current
  uint64_t size;    // bytes of image that follow
  uint64_t checksum;
};
static_assert(sizeof(IndexRedoHeader) == 40);

inline constexpr uint64_t kIndexRedoMagic = 0x4944585245444f31ULL;  // "IDXREDO1"
inline constexpr uint64_t kIndexRedoImageOffset = 8;
inline constexpr uint64_t kIndexRedoPrimary = 0;
inline constexpr uint64_t kIndexRedoAlternate = LockOwner::kIndexLogBytes / 2;
inline constexpr uint64_t kIndexRedoMaxImage = LockOwner::kIndexLogBytes - sizeof(IndexRedoHeader);

inline uint64_t IndexRedoSum(const IndexRedoHeader& h, const void* image) {
  return Checksum(&h, 32) ^ Mix64(Checksum(image, h.size) + h.size);
}

}  // namespace farpool::db
