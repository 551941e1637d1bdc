// FileStore: named files whose bytes live in the pool, shared by every process (on any host)
// that connects to the same cluster. The SQLite VFS (src/tier/sqlite_vfs.cc) keeps databases
// and their journals here; a FUSE mount is to use the same store.
//
//   auto store = FileStore::Open(pool);                       // creates it on first use
//   auto f = (*store)->Open("social.db", OpenMode::kCreate);
//   Status s = (*f)->Write(0, page, 4096);                    // one round trip
//   auto n = (*f)->Read(0, page, 4096);                       // bytes before end of file
//
// How it works (layout.h has the objects and their invariants): a file is a header with its
// size and a map (8 direct extents of 256 KiB in the header, then 8 leaves × 32768 extents,
// 64 GiB at most); the name
// table maps names to headers. A handle caches the header state and the extent addresses it
// has used, so a read or write inside existing extents is one Batch (one round trip however
// many extents it spans, and a new size goes in the same Batch); growing a file into extents it
// has not mapped adds the round trips that publish the new extents. Released leaves and extents go
// to the store's free list, from which any process's later growth takes them (Pool::Free only frees
// this process's own objects, so memory is recycled inside the store rather than given back to the
// servers).
//
// Concurrency: creation is safe among any number of processes (two creators of one name end
// with one file), and so is extent allocation. Beyond that a file has one writer at a time:
// REQUIRES that writes, truncates and deletes of a file are serialised by the caller across
// processes (the VFS holds the file's lock), and that a handle whose file another process may
// have changed is Refresh()ed before use (the VFS does it whenever it raises a lock).
//
// Inodes: files without a name (CreateInode), named by their header's address and carrying
// POSIX attributes (InodeAttr). The FUSE mount (src/tier/fuse/) builds its directories and
// files from them; their headers are recycled through the store's spare[] list on delete.
//
// Errors: InvalidArgument for bad names and ranges, NotFound, AlreadyExists (exclusive
// create), ResourceExhausted when the name table is full, OutOfMemory when the pool is full
// (the file is intact up to the last successful write), and the pool's errors, each naming
// the file.
//
// Thread-safety: FileStore is safe for concurrent use; a File handle belongs to one thread at
// a time. REQUIRES: the Pool outlives the store and the store outlives its handles.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/pool.h"
#include "files/layout.h"

namespace farpool::files {

enum class OpenMode {
  kExisting,         // NotFound if the file does not exist
  kCreate,           // creates it if need be
  kCreateExclusive,  // AlreadyExists if it exists
};

class File;

class FileStore {
 public:
  // Finds the store through the root word, creating it if no process did yet.
  static Result<std::unique_ptr<FileStore>> Open(Pool& pool);

  Result<std::unique_ptr<File>> OpenFile(std::string_view name, OpenMode mode);
  // Releases the file's extents and marks it absent. NotFound if it does not exist.
  Status Delete(std::string_view name);
  Result<bool> Exists(std::string_view name);

  // Exists in a caller's batch (the SQLite VFS probes a database's journal in the batch that
  // takes its lock): PostExists posts the reads that can decide, on `server` only (so they are
  // ordered after whatever the caller posted there before a fence): the name's `exists` word
  // if this process knows its header, else the first bucket of its name chain. After the
  // batch's Wait, FinishExists decides, with round trips of its own only for what the batch
  // did not settle (nothing posted, a slot naming a header this process has not seen, a full
  // bucket, a name found whose `exists` word was not read).
  struct ExistsProbe {
    std::string name;
    GlobalAddress header;  // the name's header, when known before posting
    GlobalAddress bucket;  // the chain's first bucket, when it was read instead
    bool posted = false;
    uint64_t exists = 0;
    uint64_t slots[kBucketSlots] = {};
  };
  Status PostExists(Batch& batch, std::string_view name, uint16_t server, ExistsProbe* probe);
  Result<bool> FinishExists(ExistsProbe& probe);

  // A new inode: a header outside the name table with `attr`, size 0. OutOfMemory when the
  // pool is full.
  Result<std::unique_ptr<File>> CreateInode(const InodeAttr& attr);
  // A handle on the inode whose header is at `header`, and its attributes into *attr when not
  // null: one read of the header. NotFound if it was deleted.
  Result<std::unique_ptr<File>> OpenInode(GlobalAddress header, InodeAttr* attr = nullptr);
  // Releases the inode's extents and recycles its header. REQUIRES: no other handle on it is
  // used afterwards (in any process).
  Status DeleteInode(std::unique_ptr<File> inode);
  // Bytes on the store's free list: pool memory the store holds but no file uses.
  Result<uint64_t> FreeBytes();

  // The header of every name ever created (existing or not), for sweeps over all lock words.
  Result<std::vector<GlobalAddress>> Headers();

  Pool& pool() { return pool_; }
  GlobalAddress image() const { return image_; }
  uint64_t lease_ms() const { return lease_ms_; }

  // An extent-sized block (leaf or extent): from the free list, else a new Alloc; zeroed unless
  // `zeroed` is false (the caller writes all of it before anyone can read it: a recycled block
  // holds another file's old bytes). With `server`, a new Alloc there first (a file's extent
  // 0 goes on its header's server); the free list and other servers if it is full.
  Result<GlobalAddress> TakeBlock(bool zeroed = true, std::optional<uint16_t> server = {});
  // Gives a block back: to the free list; if it is full, Pool::Free (this process's own
  // blocks); else it is counted in StoreImage::leaked.
  Status ReleaseBlock(GlobalAddress block);

 private:
  FileStore(Pool& pool, GlobalAddress image, uint64_t lease_ms)
      : pool_(pool), image_(image), lease_ms_(lease_ms) {}
  // The header of `name`, inserting a new (absent) one when `insert`; a null address if the
  // name is not there and !insert.
  Result<GlobalAddress> Lookup(std::string_view name, bool insert);
  Status ZeroBlock(GlobalAddress block);
  // Pool memory for a FileHeader: from spare[], else a block carved into kHeaderStride pieces
  // (the rest go to spare[]).
  Result<GlobalAddress> NewHeader();

  // A recycling list in the StoreImage: `slots` words from `slots_offset`, a count at
  // `count_offset` (layout.h: free[] for blocks, spare[] for headers).
  struct Recycler {
    uint64_t slots_offset, count_offset, slots;
    uint64_t* hint;  // the window where the last pop succeeded; GUARDED_BY(mu_)
  };
  // Takes an address off the list; null if it is empty.
  Result<GlobalAddress> Pop(const Recycler& list);
  // Puts `object` on the list; if it is full, Pool::Free (this process's own objects); else
  // it is counted in StoreImage::leaked.
  Status Push(const Recycler& list, GlobalAddress object);
  Recycler Blocks() {
    return {offsetof(StoreImage, free), offsetof(StoreImage, free_count), kFreeSlots, &free_hint_};
  }
  Recycler Spares() {
    return {offsetof(StoreImage, spare), offsetof(StoreImage, spare_count), kSpareSlots,
            &spare_hint_};
  }

  Pool& pool_;
  const GlobalAddress image_;
  const uint64_t lease_ms_;
  std::mutex mu_;
  std::map<std::string, GlobalAddress, std::less<>> headers_;  // GUARDED_BY(mu_)
  // Names of headers this process has read (a name slot never changes once set).
  std::map<uint64_t, std::string> names_;  // GUARDED_BY(mu_)
  uint64_t free_hint_ = 0;                 // GUARDED_BY(mu_)
  uint64_t spare_hint_ = 0;                // GUARDED_BY(mu_)
};

class File {
 public:
  const std::string& name() const { return name_; }
  GlobalAddress header() const { return header_; }
  GlobalAddress lock_word() const { return header_ + offsetof(FileHeader, lock); }

  // Reads the header again (size, leaves and the direct extents' map words; a new generation
  // drops the cached extents).
  Status Refresh();
  // Refresh in a caller's batch: PostRefresh posts the header's read (to the header's server,
  // the lock word's: ordered after what the caller posted there before a fence); after the
  // batch's Wait returned OK, FinishRefresh applies it as Refresh does.
  Status PostRefresh(Batch& batch);
  void FinishRefresh();
  // The size as of the last Refresh or this handle's own changes.
  uint64_t size() const { return state_.size; }
  // As of the last Refresh (or this handle's own truncates): FileHeader::generation and
  // FileHeader::data_version (layout.h).
  uint64_t generation() const { return state_.generation; }
  uint64_t data_version() const { return state_.data_version; }
  GlobalAddress data_version_word() const { return header_ + offsetof(FileHeader, data_version); }
  // FileHeader::companions (layout.h) as of the last Refresh or this handle's own changes.
  uint64_t companions() const { return state_.companions; }
  // Sets or clears `bits` of FileHeader::companions (a CAS from the last value seen: one round
  // trip when nobody else changed it). REQUIRES: the caller follows the word's protocol
  // (layout.h).
  Status SetCompanions(uint64_t bits, bool set);

  // A read in a caller's batch (the SQLite VFS reads page 1 with the CAS that takes the
  // database's lock): PostRead posts the read of [offset, offset + n) into `out` if the range
  // lies in one of the direct extents (the first 2 MiB), this handle knows that extent and it
  // is on `server` (so that it is ordered after what the caller posted there before a fence);
  // otherwise it posts nothing. After the batch's Wait and FinishRefresh of a PostRefresh in
  // the same batch, ReadCurrent says whether the bytes read are the file's: the range is
  // inside the refreshed size and the extent is still the one read.
  // REQUIRES: nobody changes the file between the batch and the use of the bytes (the caller
  // holds a lock the batch took before the reads).
  struct PostedRead {
    uint64_t offset = 0, n = 0;
    uint64_t extent = 0;  // the extent read from; 0: nothing posted
  };
  Result<PostedRead> PostRead(Batch& batch, uint64_t offset, void* out, uint64_t n,
                              uint16_t server);
  bool ReadCurrent(const PostedRead& read) const;

  // Reads up to `n` bytes at `offset`; returns how many were before the end of the file
  // (the rest of `out` is zero-filled).
  Result<uint64_t> Read(uint64_t offset, void* out, uint64_t n);
  // Writes `n` bytes at `offset`, growing the file if it ends beyond its size (a gap reads
  // as zeros): one round trip inside mapped extents, the new size included. On failure the
  // bytes may have landed in part, and the size grown with zeros where they did not.
  // REQUIRES: the caller is the file's only writer.
  Status Write(uint64_t offset, const void* data, uint64_t n);
  // Sets the size; shrinking releases whole extents beyond it.
  Status Truncate(uint64_t size);
  // Makes [offset, offset + n) read as zeros without changing the size: whole extents in the
  // range go back to the store's free list, the partial ones at its ends are zeroed.
  Status PunchHole(uint64_t offset, uint64_t n);
  // Publishes extents for [offset, offset + n) so that later writes there find their space
  // (OutOfMemory now rather than then); the size does not change.
  Status Allocate(uint64_t offset, uint64_t n);

  // An inode's attributes (layout.h: InodeAttr): read, and written in one operation.
  Result<InodeAttr> ReadAttr();
  Status WriteAttr(const InodeAttr& attr);

 private:
  friend class FileStore;
  struct State {
    uint64_t lock, generation, size;
    uint64_t leaves[kTopEntries];
    uint64_t direct[kDirectEntries];
    uint64_t data_version;
    uint64_t companions;
  };
  static_assert(sizeof(State) == kHeaderStateSize);

  File(FileStore& store, std::string name, GlobalAddress header)
      : store_(store), name_(std::move(name)), header_(header) {}
  // What a write puts in the extents it maps: `n` bytes at file offset `offset`.
  struct Fill {
    uint64_t offset, n;
    const unsigned char* data;
  };
  // Makes extents_[first..last] current: entries this handle has not seen are read from the
  // leaves (one round trip); with `allocate`, missing leaves and extents are created. A new
  // extent is published once its content is in it: zeros, or with `fill` the write's bytes where
  // they land and zeros around them; then (*filled)[i - first] says that extent i has the
  // write's bytes already (its block won the publish; another writer's may have).
  Status LoadExtents(uint64_t first, uint64_t last, bool allocate, const Fill* fill = nullptr,
                     std::vector<bool>* filled = nullptr);
  Status EnsureLeaf(int top);
  // The map word of extent i: in the header for the first kDirectEntries, else in its leaf.
  // REQUIRES: i < kDirectEntries or its leaf is in state_.
  GlobalAddress MapWord(uint64_t i) const;
  // The first extent that leaf t maps (leaf 0 starts after the direct extents).
  static uint64_t LeafStart(int t) { return t == 0 ? kDirectEntries : t * kLeafEntries; }
  Status WriteSize(uint64_t size);
  Status CheckRange(uint64_t offset, uint64_t n, const char* what) const;
  // Zeroes [from, to) of the extents that exist (to within one extent's end).
  Status ZeroRange(uint64_t from, uint64_t to, const char* what);
  // CASes extents first..last out of the map and recycles them; bumps the generation.
  Status ReleaseExtents(uint64_t first, uint64_t last, const char* what);
  Status BumpGeneration();
  std::string Where() const { return "file '" + name_ + "'"; }

  FileStore& store_;
  const std::string name_;
  const GlobalAddress header_;
  State state_{};
  State fresh_{};                  // PostRefresh's destination
  std::vector<uint64_t> extents_;  // cached extent addresses by index; 0: not known
};

}  // namespace farpool::files
