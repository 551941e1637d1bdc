// The file store's objects in the pool: what every process (on any host, any fabric) reads
// and changes with one-sided operations. docs/files.md draws the same picture.
//
//   root word (Pool::RootArea(lowest server id) + kStoreRootOffset)
//     └─> StoreImage          one object, created once (allocated, filled, then CAS 0 → its
//         ├─ leases[56]       address into the root word; the loser frees its copy)
//         ├─ free[8192]       recycled extents (any process may take one)
//         ├─ spare[4096]      recycled headers of deleted inodes (the FUSE mount's files)
//         └─ names[4096]      open-addressing table of FileHeader addresses, 8 per bucket
//              └─> FileHeader one per name ever created, never moved or freed; inodes
//                  (headers outside the name table, named by address) are recycled.
//                  Headers are carved from blocks (kHeaderStride apart), like extents
//                  recycled inside the store
//                  ├─ direct[8] ─> extents 0..7 (the first 2 MiB)
//                  └─ leaves[8] ─> leaf (an extent-sized block of 32768 extent addresses)
//                                   └─> extent (kExtentSize bytes of file data)
//
// Invariants:
//   - A names[] slot changes only 0 → header (CAS). A header's name never changes, so a
//     process may cache name → header forever. Names fill their probe sequence from the
//     front: a lookup stops at the first 0 slot.
//   - A leaf or extent address (in a leaf or in direct[]) changes only 0 → block (CAS, by a writer
//   that zeroed the block
//     first) and block → 0 (a truncate or delete, which then bumps `generation`). Handles
//     that cached addresses drop them when they see a new generation.
//   - Bytes of a file at or beyond `size` read as zero: extents are zeroed before they are
//     published, and a truncate zeroes the tail of the extent it cuts.
//   - free[] holds each recycled block at most once (push CAS 0 → block, take CAS block → 0),
//     so a taker that wins the CAS owns the block, whatever happened to the slot in between;
//     spare[] likewise for inode headers.
//
// Version 2 (the FUSE mount) added FileHeader::attr and StoreImage::spare[]; version 3 added
// FileHeader::data_version (the SQLite VFS's page cache); version 4 added FileHeader::companions
// (the VFS's journal probe). An older store is refused by name
// (FileStore::Open), not misread, and so is a process of an older build on a newer store.
#pragma once

#include <cstddef>
#include <cstdint>

#include "farpool/pool.h"

namespace farpool::files {

// The file store's part of the root area (see Pool::kRootSize): its last 64 bytes, whose
// first word points to the StoreImage. The database catalog uses the start of the area.
inline constexpr uint64_t kStoreRootOffset = Pool::kRootSize - 64;

inline constexpr uint64_t kStoreMagic = 0x666172706f6f6c46;  // "farpoolF"
inline constexpr uint64_t kStoreVersion = 4;
inline constexpr uint64_t kHeaderMagic = 0x4644482d6c6f6f70;

inline constexpr uint64_t kExtentSize = 256 << 10;
inline constexpr uint64_t kLeafEntries = kExtentSize / 8;  // a leaf maps 8 GiB
inline constexpr int kTopEntries = 8;
// Extents 0..7 (the first 2 MiB) are mapped from the header itself, so a small file needs no
// leaf: one extent, not an extent and a leaf. Leaf 0's first kDirectEntries words stay 0.
inline constexpr uint64_t kDirectEntries = 8;
inline constexpr uint64_t kMaxFileSize = kTopEntries * kLeafEntries * kExtentSize;  // 64 GiB
inline constexpr size_t kMaxNameLength = 255;

inline constexpr int kLeaseSlots = 56;  // one reader bit each in a lock word
inline constexpr int kNameSlots = 4096;
inline constexpr int kBucketSlots = 8;
inline constexpr int kFreeSlots = 8192;
inline constexpr int kSpareSlots = 4096;

struct LeaseSlot {
  // 0: free. A live owner's token (bit 63 clear), or kSweeping | the token of a process that
  // is clearing this slot's lock bits from every file (file_lock.h). A token's low 32 bits are
  // its process's pool process tag (Pool::process_tag): whoever takes the slot over evicts
  // that process first (lease.h).
  uint64_t owner;
  uint64_t heartbeat;  // the owner adds 1 every lease/8
};
inline constexpr uint64_t kSweeping = uint64_t{1} << 63;

struct StoreImage {
  uint64_t magic;
  uint64_t version;
  uint64_t extent_size;
  uint64_t lease_ms;     // how long a lease lasts without renewal
  uint64_t free_count;   // blocks in free[] (a hint: pushes and takes adjust it afterwards)
  uint64_t leaked;       // blocks and headers that neither list nor Pool::Free could take back
  uint64_t spare_count;  // headers in spare[] (a hint, like free_count)
  uint64_t reserved;
  LeaseSlot leases[kLeaseSlots];
  uint64_t free[kFreeSlots];
  uint64_t spare[kSpareSlots];
  uint64_t names[kNameSlots];
};

// An inode's attributes (the FUSE mount, src/tier/fuse/): zero for the store's named files.
struct InodeAttr {
  uint64_t mode;  // st_mode: type and permissions
  uint64_t uid, gid;
  uint64_t nlink;   // 1 while a directory entry names the inode, 0 once unlinked
  uint64_t parent;  // a directory's parent (header address; the root's is itself)
  int64_t atime_ns, mtime_ns, ctime_ns;  // since the Unix epoch
};

struct FileHeader {
  uint64_t magic;
  uint64_t exists;      // 1 while the file exists: create CASes 0 → 1, delete 1 → 0
  uint64_t lock;        // the lock word (file_lock.h)
  uint64_t generation;  // +1 whenever a leaf or extent is released
  uint64_t size;
  uint64_t leaves[kTopEntries];
  uint64_t direct[kDirectEntries];  // extents 0..kDirectEntries - 1
  // +1 by every writer before it changes the file's bytes, while no reader holds the lock
  // (the SQLite VFS: with the CAS that takes EXCLUSIVE). A reader that sees the same value at
  // two of its lock acquisitions knows nobody wrote in between: its cached pages are current.
  uint64_t data_version;
  // Kept by the file's user, read with the header: the SQLite VFS sets bit i before it creates
  // the database's companion file i (its "-journal", "-wal") and clears it after deleting that
  // file under the database's write lock, so a clear bit says the file does not exist (the
  // invariant and why it holds: src/tier/sqlite_vfs.cc). 0 for other files.
  uint64_t companions;
  uint64_t name_length;
  char name[kMaxNameLength + 1];
  InodeAttr attr;
};

// Headers are carved from extent-sized blocks, kHeaderStride bytes apart.
inline constexpr uint64_t kHeaderStride = 512;
static_assert(sizeof(FileHeader) <= kHeaderStride && kExtentSize % kHeaderStride == 0);

// What a handle refreshes in one read: lock .. companions.
inline constexpr uint64_t kHeaderStateOffset = offsetof(FileHeader, lock);
inline constexpr uint64_t kHeaderStateSize = offsetof(FileHeader, name_length) - kHeaderStateOffset;

}  // namespace farpool::files
