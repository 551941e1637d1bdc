// PoolFs: a POSIX filesystem whose inodes, directories, extent maps and data all live in the
// file store (src/files/), so an unmount and a mount from any host see the same files while
// the memory servers live. The FUSE daemon (fuse_mount.h) turns kernel requests into these
// calls; nothing here knows FUSE.
//
// How it works (docs/files.md, "The FUSE mount"):
//   - An inode is a store inode (FileStore::CreateInode: a FileHeader outside the name table
//     with InodeAttr); its number for the kernel is the header's address, except the root,
//     which is FUSE's 1. A directory is an inode whose bytes are an array of DirEntry records
//     (ino 0: a free slot).
//   - The filesystem's superblock is the store's named file "fuse:<name>": its bytes hold the
//     root directory's address and who holds the mount; its lock word is the **mount lease**.
//     Open takes it EXCLUSIVE with the store's leases (files/lease.h), so one mount at a time
//     has the filesystem; a second is refused, naming the holder; a dead holder (killed daemon,
//     host gone) stops renewing and is evicted (Pool::Evict) and swept by the next mount after
//     lease + margin (about 2 s). Because the mount is alone, the daemon caches inodes and
//     directories: the pool copy is the truth, the cache never holds anything the pool lacks.
//   - Every metadata change (create, mkdir, unlink, rmdir, rename, setattr, a size change by a
//     write) is written to the pool before the call returns, so a killed daemon loses nothing
//     it acknowledged. A rename writes the target entry (one write: a replaced target's name
//     points to the old inode, then to the new one, never to nothing) before clearing the
//     source entry: a daemon killed between the two leaves the inode under both names.
//   - An unlinked inode's data is released once no handle is open (POSIX: an open file
//     outlives its name), its header once the kernel forgets it too. A daemon killed before
//     that leaks them (they are not reachable from the root; there is no fsck yet).
//
// Errors: each call returns 0 or an errno for the kernel. Pool failures are EIO (ENOSPC when
// the pool is full; ESHUTDOWN once the pool evicted this process) and their reasons (Status
// messages naming the file and the server) go to stderr, the daemon's log; a mount that lost
// its lease answers EIO to every change.
//
// Thread-safety: safe for concurrent use (the FUSE loop is multithreaded). Namespace changes
// are serialised by one mutex; reads and writes of different files run in parallel.
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/pool.h"
#include "files/file_lock.h"
#include "files/file_store.h"
#include "files/lease.h"

namespace farpool::fuse {

// A directory's record for one name, in the directory inode's bytes.
struct DirEntry {
  uint64_t ino;   // the inode's header address; 0: a free slot
  uint32_t type;  // the inode's S_IFMT bits >> 12 (for readdir without reading the inode)
  uint32_t name_length;
  char name[files::kMaxNameLength + 1];
};
static_assert(sizeof(DirEntry) == 272);

// The superblock's bytes (the store file "fuse:<name>").
struct Superblock {
  uint64_t magic;
  uint64_t version;
  uint64_t root;  // the root directory's header address
  uint64_t reserved;
  char holder[256];  // "host pid P mountpoint M since T" of the mount that holds the lease
};
inline constexpr uint64_t kSuperblockMagic = 0x73662d6c6f6f7066;  // "fpool-fs"
inline constexpr uint64_t kSuperblockVersion = 1;

// One name in a directory listing; `offset` is what the kernel passes back to continue after it.
struct DirItem {
  std::string name;
  uint64_t ino;
  uint32_t mode;  // type bits only
  uint64_t offset;
};

class PoolFs {
 public:
  static constexpr uint64_t kRootIno = 1;  // FUSE_ROOT_ID

  // Connects to the cluster, takes the mount lease of filesystem `name` (creating the
  // filesystem on its first mount) and records `holder` in it. Aborted, naming the holder,
  // when another live mount has it (after watching it for lease + margin).
  static Result<std::unique_ptr<PoolFs>> Open(const std::string& cluster_file,
                                              const std::string& name, const std::string& holder);
  // Releases the mount lease.
  ~PoolFs();

  // Each successful call that returns an inode to the kernel counts one lookup of it, which
  // Forget gives back (fuse_lowlevel.h's contract).
  int Lookup(uint64_t parent, std::string_view name, struct stat* st);
  void Forget(uint64_t ino, uint64_t n);
  int GetAttr(uint64_t ino, struct stat* st);
  // `set` is FUSE's FUSE_SET_ATTR_* mask; `st` carries the new values.
  int SetAttr(uint64_t ino, const struct stat& values, int set, struct stat* st);
  // A new file (S_IFREG in mode) or directory (S_IFDIR) owned by uid/gid. EEXIST if taken.
  int MakeNode(uint64_t parent, std::string_view name, mode_t mode, uid_t uid, gid_t gid,
               struct stat* st);
  int Unlink(uint64_t parent, std::string_view name);
  int Rmdir(uint64_t parent, std::string_view name);
  // RENAME_NOREPLACE is honoured; RENAME_EXCHANGE is EINVAL.
  int Rename(uint64_t parent, std::string_view name, uint64_t new_parent, std::string_view new_name,
             unsigned flags);
  // `items` gets the names after `offset` (0: from the start, with "." and "..").
  int ReadDir(uint64_t ino, uint64_t offset, std::vector<DirItem>* items);

  int Open(uint64_t ino);
  int Release(uint64_t ino);
  // Reads up to n bytes; *done is how many were before the end of the file.
  int Read(uint64_t ino, uint64_t offset, void* out, uint64_t n, uint64_t* done);
  int Write(uint64_t ino, uint64_t offset, const void* data, uint64_t n);
  // FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE (with KEEP_SIZE) and plain allocation.
  int Fallocate(uint64_t ino, int mode, uint64_t offset, uint64_t length);
  // fsync/fsyncdir: a write is in the servers' memory when Write returns, so this only checks
  // that the mount still holds its lease (EIO if not).
  int Sync();
  // The pool's capacity and free space (free server memory plus the store's free list).
  int StatFs(struct statvfs* st);

 private:
  struct Inode;
  struct Slot {
    uint64_t index;  // DirEntry index in the directory's bytes
    uint64_t ino;
    uint32_t type;
  };
  struct Dir {
    std::map<std::string, Slot, std::less<>> names;
    std::map<uint64_t, std::string> by_index;
    std::vector<uint64_t> free;  // indexes of free slots
    uint64_t slots = 0;          // records in the directory's bytes
  };
  struct Inode {
    std::mutex mu;  // guards file and attr (lock order: PoolFs::mu_, then this)
    std::unique_ptr<files::File> file;
    files::InodeAttr attr{};
    uint64_t lookups = 0;      // GUARDED_BY(PoolFs::mu_)
    int opens = 0;             // GUARDED_BY(PoolFs::mu_)
    std::unique_ptr<Dir> dir;  // GUARDED_BY(PoolFs::mu_); loaded on first use
    bool is_dir() const { return S_ISDIR(attr.mode); }
  };

  PoolFs() = default;
  // Logs `s` and returns its errno.
  int Fail(const Status& s) const;
  // The inode numbered `ino`, loaded from the pool on first use. REQUIRES: mu_ held.
  Result<std::shared_ptr<Inode>> Get(uint64_t ino);
  // Get, taking mu_ itself (REQUIRES: mu_ not held), for callers that then work under the
  // inode's own lock only.
  Result<std::shared_ptr<Inode>> GetLocking(uint64_t ino);
  GlobalAddress Header(uint64_t ino) const;
  uint64_t Ino(GlobalAddress header) const;
  // The directory's names, loaded on first use. REQUIRES: mu_ held; inode is a directory.
  Result<Dir*> Entries(Inode& inode);
  Status PutEntry(Inode& dir, std::string_view name, uint64_t ino, uint32_t type);
  Status ClearEntry(Inode& dir, std::string_view name);
  // Sets nlink to 0 and releases the inode if nothing refers to it any more. REQUIRES: mu_.
  Status Orphan(uint64_t ino);
  // Unlink (a non-directory) and Rmdir (an empty directory): the entry goes and its inode is
  // orphaned.
  int Remove(uint64_t parent, std::string_view name, bool directory);
  Status ReleaseIfUnused(uint64_t ino);
  void Fill(uint64_t ino, Inode& inode, struct stat* st) const;  // REQUIRES: inode.mu held
  int CheckName(std::string_view name) const;
  // 0 if changes may be made: the mount holds its lease.
  int CheckLease() const;

  std::unique_ptr<Pool> pool_;
  std::unique_ptr<files::FileStore> store_;
  std::unique_ptr<files::LeaseTable> leases_;
  std::unique_ptr<files::File> superblock_;
  std::unique_ptr<files::FileLock> mount_lock_;
  GlobalAddress root_;

  std::mutex mu_;  // the namespace: inodes_, directories, lookups and opens
  std::map<uint64_t, std::shared_ptr<Inode>> inodes_;  // GUARDED_BY(mu_)
};

}  // namespace farpool::fuse
