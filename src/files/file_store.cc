#include "files/file_store.h"

#include <algorithm>
#include <cstring>

namespace farpool::files {
namespace {

constexpr uint64_t kNameBuckets = kNameSlots / kBucketSlots;
constexpr uint64_t kFreeWindow = 512;  // free-list words read at once (4 KiB)

const unsigned char* Zeros() {
  static const auto* zeros = new unsigned char[kExtentSize]();
  return zeros;
}

uint64_t HashName(std::string_view name) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The `probe`-th bucket of `name`'s chain in the name table of the store at `image`.
GlobalAddress NameBucket(GlobalAddress image, std::string_view name, uint64_t probe) {
  return image + offsetof(StoreImage, names) +
         ((HashName(name) % kNameBuckets + probe) % kNameBuckets) * 8 * kBucketSlots;
}

Status CheckName(std::string_view name) {
  if (name.empty()) return Status::InvalidArgument("file name is empty");
  if (name.size() > kMaxNameLength) {
    return Status::InvalidArgument("file name '" + std::string(name.substr(0, 40)) + "...' is " +
                                   std::to_string(name.size()) + " bytes; at most " +
                                   std::to_string(kMaxNameLength) + " are allowed");
  }
  if (name.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("file name contains a NUL byte");
  }
  return Status::Ok();
}

GlobalAddress Field(GlobalAddress base, uint64_t offset) { return base + offset; }

}  // namespace

// ---------------------------------------------------------------------------- FileStore

Result<std::unique_ptr<FileStore>> FileStore::Open(Pool& pool) {
  const std::vector<uint16_t> ids = pool.server_ids();
  if (ids.empty()) return Status::InvalidArgument("file store: the cluster has no servers");
  const GlobalAddress root =
      pool.RootArea(*std::min_element(ids.begin(), ids.end())) + kStoreRootOffset;
  uint64_t image_raw = 0;
  FARPOOL_RETURN_IF_ERROR(pool.Read(root, &image_raw, 8).WithContext("file store root"));
  if (image_raw == 0) {
    // Nobody created the store yet: build a complete image, then publish it with one CAS.
    auto image = std::make_unique<StoreImage>();
    image->magic = kStoreMagic;
    image->version = kStoreVersion;
    image->extent_size = kExtentSize;
    image->lease_ms = 1500;
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress mine, pool.Alloc(sizeof(StoreImage)));
    FARPOOL_RETURN_IF_ERROR(pool.Write(mine, image.get(), sizeof(StoreImage)));
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, pool.CompareAndSwap(root, 0, mine.raw()));
    if (prev == 0) {
      image_raw = mine.raw();
    } else {
      FARPOOL_RETURN_IF_ERROR(pool.Free(mine));
      image_raw = prev;
    }
  }
  const GlobalAddress image = GlobalAddress::FromRaw(image_raw);
  uint64_t head[4];
  FARPOOL_RETURN_IF_ERROR(pool.Read(image, head, sizeof(head)).WithContext("file store image"));
  if (head[0] != kStoreMagic || head[1] != kStoreVersion || head[2] != kExtentSize) {
    return Status::Protocol("file store at " + image.ToString() + " (root word " + root.ToString() +
                            ") is not a version-" + std::to_string(kStoreVersion) +
                            " store (magic " + std::to_string(head[0]) + ", version " +
                            std::to_string(head[1]) + ")");
  }
  return std::unique_ptr<FileStore>(new FileStore(pool, image, head[3]));
}

Result<GlobalAddress> FileStore::Lookup(std::string_view name, bool insert) {
  FARPOOL_RETURN_IF_ERROR(CheckName(name));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = headers_.find(name);
    if (it != headers_.end()) return it->second;
  }
  GlobalAddress mine;  // a header of ours not yet published
  auto finish = [&](GlobalAddress found) -> Result<GlobalAddress> {
    if (!mine.is_null() && mine != found) FARPOOL_RETURN_IF_ERROR(Push(Spares(), mine));
    if (!found.is_null()) {
      std::lock_guard<std::mutex> lock(mu_);
      headers_.emplace(std::string(name), found);
    }
    return found;
  };
  for (uint64_t probe = 0; probe < kNameBuckets; ++probe) {
    const GlobalAddress bucket = NameBucket(image_, name, probe);
    for (;;) {
      uint64_t slots[kBucketSlots];
      FARPOOL_RETURN_IF_ERROR(pool_.Read(bucket, slots, sizeof(slots)));
      struct Candidate {
        uint64_t length;
        char name[kMaxNameLength + 1];
      };
      std::vector<Candidate> names(kBucketSlots);
      Batch batch(pool_);
      int empty = -1;
      for (int i = 0; i < kBucketSlots; ++i) {
        if (slots[i] == 0) {
          empty = i;
          break;
        }
        FARPOOL_RETURN_IF_ERROR(
            batch.Read(Field(GlobalAddress::FromRaw(slots[i]), offsetof(FileHeader, name_length)),
                       &names[i], sizeof(Candidate)));
      }
      FARPOOL_RETURN_IF_ERROR(batch.Wait());
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (int i = 0; i < (empty < 0 ? kBucketSlots : empty); ++i) {
          if (names[i].length <= kMaxNameLength) {
            names_.emplace(slots[i], std::string(names[i].name, names[i].length));
          }
        }
      }
      for (int i = 0; i < (empty < 0 ? kBucketSlots : empty); ++i) {
        if (names[i].length == name.size() &&
            std::memcmp(names[i].name, name.data(), name.size()) == 0) {
          return finish(GlobalAddress::FromRaw(slots[i]));
        }
      }
      if (empty < 0) break;  // full bucket: the name may be further along
      if (!insert) return finish(GlobalAddress());
      if (mine.is_null()) {
        auto header = std::make_unique<FileHeader>();
        header->magic = kHeaderMagic;
        header->name_length = name.size();
        std::memcpy(header->name, name.data(), name.size());
        FARPOOL_ASSIGN_OR_RETURN(mine, NewHeader());
        FARPOOL_RETURN_IF_ERROR(pool_.Write(mine, header.get(), sizeof(FileHeader)));
      }
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev,
                               pool_.CompareAndSwap(bucket + empty * 8, 0, mine.raw()));
      if (prev == 0) return finish(mine);
      // Another creator took the slot (maybe for this very name): look at the bucket again.
    }
  }
  if (!mine.is_null()) FARPOOL_RETURN_IF_ERROR(Push(Spares(), mine));
  return Status::ResourceExhausted("file store: the name table is full (" +
                                   std::to_string(kNameSlots) + " names)");
}

Result<std::unique_ptr<File>> FileStore::OpenFile(std::string_view name, OpenMode mode) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress header, Lookup(name, mode != OpenMode::kExisting));
  const std::string where = "file '" + std::string(name) + "'";
  if (header.is_null()) return Status::NotFound(where + " does not exist");
  const GlobalAddress exists = header + offsetof(FileHeader, exists);
  if (mode == OpenMode::kExisting) {
    uint64_t e = 0;
    FARPOOL_RETURN_IF_ERROR(pool_.Read(exists, &e, 8).WithContext(where));
    if (e == 0) return Status::NotFound(where + " does not exist");
  } else {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, pool_.CompareAndSwap(exists, 0, 1));
    if (prev != 0 && mode == OpenMode::kCreateExclusive) {
      return Status::AlreadyExists(where + " already exists");
    }
  }
  auto file = std::unique_ptr<File>(new File(*this, std::string(name), header));
  FARPOOL_RETURN_IF_ERROR(file->Refresh());
  return file;
}

Status FileStore::Delete(std::string_view name) {
  FARPOOL_ASSIGN_OR_RETURN(std::unique_ptr<File> file, OpenFile(name, OpenMode::kExisting));
  FARPOOL_RETURN_IF_ERROR(file->Truncate(0));
  FARPOOL_ASSIGN_OR_RETURN(
      uint64_t prev, pool_.CompareAndSwap(file->header() + offsetof(FileHeader, exists), 1, 0));
  if (prev != 1) return Status::NotFound("file '" + std::string(name) + "' does not exist");
  return Status::Ok();
}

Result<bool> FileStore::Exists(std::string_view name) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress header, Lookup(name, false));
  if (header.is_null()) return false;
  uint64_t e = 0;
  FARPOOL_RETURN_IF_ERROR(pool_.Read(header + offsetof(FileHeader, exists), &e, 8));
  return e != 0;
}

Status FileStore::PostExists(Batch& batch, std::string_view name, uint16_t server,
                             ExistsProbe* probe) {
  FARPOOL_RETURN_IF_ERROR(CheckName(name));
  probe->name = std::string(name);
  probe->posted = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = headers_.find(name);
    probe->header = it == headers_.end() ? GlobalAddress() : it->second;
  }
  if (!probe->header.is_null()) {
    if (probe->header.server() != server) return Status::Ok();
    probe->posted = true;
    return batch.Read(probe->header + offsetof(FileHeader, exists), &probe->exists, 8);
  }
  probe->bucket = NameBucket(image_, name, 0);
  if (probe->bucket.server() != server) return Status::Ok();
  probe->posted = true;
  return batch.Read(probe->bucket, probe->slots, sizeof(probe->slots));
}

Result<bool> FileStore::FinishExists(ExistsProbe& probe) {
  if (!probe.posted) return Exists(probe.name);
  if (!probe.header.is_null()) return probe.exists != 0;
  // The first bucket: the name is absent if no slot before the first empty one names it (an
  // inserter takes the first empty slot of the first bucket that has one, Lookup). A slot that
  // names it makes its header known, so the long way below costs one read.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t slot : probe.slots) {
      if (slot == 0) return false;
      auto it = names_.find(slot);
      if (it == names_.end()) break;  // a header this process has not seen: the long way
      if (it->second == probe.name) {
        headers_.emplace(probe.name, GlobalAddress::FromRaw(slot));
        break;
      }
    }
  }
  return Exists(probe.name);
}

Result<std::vector<GlobalAddress>> FileStore::Headers() {
  std::vector<uint64_t> slots(kNameSlots);
  FARPOOL_RETURN_IF_ERROR(
      pool_.Read(image_ + offsetof(StoreImage, names), slots.data(), slots.size() * 8));
  std::vector<GlobalAddress> headers;
  for (uint64_t s : slots) {
    if (s != 0) headers.push_back(GlobalAddress::FromRaw(s));
  }
  return headers;
}

Status FileStore::ZeroBlock(GlobalAddress block) {
  return pool_.Write(block, Zeros(), kExtentSize);
}

Result<GlobalAddress> FileStore::Pop(const Recycler& list) {
  const GlobalAddress count = image_ + list.count_offset;
  uint64_t available = 0;
  FARPOOL_RETURN_IF_ERROR(pool_.Read(count, &available, 8));
  if (available == 0 || available > list.slots) return GlobalAddress();
  uint64_t hint;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hint = *list.hint;
  }
  const uint64_t windows = list.slots / kFreeWindow;
  std::vector<uint64_t> window(kFreeWindow);
  for (uint64_t w = 0; w < windows; ++w) {
    const uint64_t first = ((hint + w) % windows) * kFreeWindow;
    const GlobalAddress at = image_ + list.slots_offset + first * 8;
    FARPOOL_RETURN_IF_ERROR(pool_.Read(at, window.data(), kFreeWindow * 8));
    for (uint64_t i = 0; i < kFreeWindow; ++i) {
      if (window[i] == 0) continue;
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, pool_.CompareAndSwap(at + i * 8, window[i], 0));
      if (prev != window[i]) continue;
      FARPOOL_RETURN_IF_ERROR(pool_.FetchAdd(count, ~uint64_t{0}).status());
      {
        std::lock_guard<std::mutex> lock(mu_);
        *list.hint = first / kFreeWindow;
      }
      return GlobalAddress::FromRaw(prev);
    }
  }
  return GlobalAddress();
}

Status FileStore::Push(const Recycler& list, GlobalAddress object) {
  std::vector<uint64_t> window(kFreeWindow);
  for (uint64_t first = 0; first < list.slots; first += kFreeWindow) {
    const GlobalAddress at = image_ + list.slots_offset + first * 8;
    FARPOOL_RETURN_IF_ERROR(pool_.Read(at, window.data(), kFreeWindow * 8));
    for (uint64_t i = 0; i < kFreeWindow; ++i) {
      if (window[i] != 0) continue;
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, pool_.CompareAndSwap(at + i * 8, 0, object.raw()));
      if (prev != 0) continue;
      return pool_.FetchAdd(image_ + list.count_offset, 1).status();
    }
  }
  if (pool_.Free(object).ok()) return Status::Ok();
  // Another process's object with the list full: it stays allocated, counted.
  return pool_.FetchAdd(image_ + offsetof(StoreImage, leaked), 1).status();
}

Result<GlobalAddress> FileStore::TakeBlock(bool zeroed, std::optional<uint16_t> server) {
  GlobalAddress block;
  if (server) {
    // New memory there rather than a search of the free list for a block on that server (up
    // to kFreeSlots / kFreeWindow reads); a full server leaves the choice to the list.
    auto placed = pool_.Alloc(kExtentSize, Placement::OnServer(*server));
    if (placed.ok()) {
      block = *placed;
    } else if (placed.status().code() != StatusCode::kOutOfMemory) {
      return placed.status();
    }
  }
  if (block.is_null()) {
    FARPOOL_ASSIGN_OR_RETURN(block, Pop(Blocks()));
  }
  if (block.is_null()) {
    FARPOOL_ASSIGN_OR_RETURN(block, pool_.Alloc(kExtentSize));
  }
  if (zeroed) FARPOOL_RETURN_IF_ERROR(ZeroBlock(block));
  return block;
}

Status FileStore::ReleaseBlock(GlobalAddress block) { return Push(Blocks(), block); }

Result<GlobalAddress> FileStore::NewHeader() {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress header, Pop(Spares()));
  if (!header.is_null()) return header;
  // Carve a block into headers: they come from the same recycled memory as data, so a pool
  // that is full of freed extents still has room for new files.
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress block, TakeBlock());
  for (uint64_t at = kHeaderStride; at < kExtentSize; at += kHeaderStride) {
    FARPOOL_RETURN_IF_ERROR(Push(Spares(), block + at));
  }
  return block;
}

Result<uint64_t> FileStore::FreeBytes() {
  uint64_t count = 0;
  FARPOOL_RETURN_IF_ERROR(pool_.Read(image_ + offsetof(StoreImage, free_count), &count, 8));
  return std::min<uint64_t>(count, kFreeSlots) * kExtentSize;
}

Result<std::unique_ptr<File>> FileStore::CreateInode(const InodeAttr& attr) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress header, NewHeader());
  auto image = std::make_unique<FileHeader>();
  image->magic = kHeaderMagic;
  image->exists = 1;
  image->attr = attr;
  FARPOOL_RETURN_IF_ERROR(pool_.Write(header, image.get(), sizeof(FileHeader)));
  auto file = std::unique_ptr<File>(new File(*this, "inode " + header.ToString(), header));
  FARPOOL_RETURN_IF_ERROR(file->Refresh());
  return file;
}

Result<std::unique_ptr<File>> FileStore::OpenInode(GlobalAddress header, InodeAttr* attr) {
  auto file = std::unique_ptr<File>(new File(*this, "inode " + header.ToString(), header));
  auto image = std::make_unique<FileHeader>();
  FARPOOL_RETURN_IF_ERROR(
      pool_.Read(header, image.get(), sizeof(FileHeader)).WithContext(file->Where()));
  if (image->magic != kHeaderMagic || image->exists == 0) {
    return Status::NotFound(file->Where() + " does not exist");
  }
  std::memcpy(&file->fresh_, reinterpret_cast<const char*>(image.get()) + kHeaderStateOffset,
              sizeof(file->fresh_));
  file->FinishRefresh();
  if (attr != nullptr) *attr = image->attr;
  return file;
}

Status FileStore::DeleteInode(std::unique_ptr<File> inode) {
  FARPOOL_RETURN_IF_ERROR(inode->Truncate(0));
  const uint64_t zero = 0;
  FARPOOL_RETURN_IF_ERROR(pool_.Write(inode->header() + offsetof(FileHeader, exists), &zero, 8)
                              .WithContext(inode->Where()));
  return Push(Spares(), inode->header());
}

// ---------------------------------------------------------------------------- File

Status File::Refresh() {
  Batch batch(store_.pool());
  FARPOOL_RETURN_IF_ERROR(PostRefresh(batch));
  FARPOOL_RETURN_IF_ERROR(batch.Wait().WithContext(Where()));
  FinishRefresh();
  return Status::Ok();
}

Status File::PostRefresh(Batch& batch) {
  return batch.Read(header_ + kHeaderStateOffset, &fresh_, sizeof(fresh_)).WithContext(Where());
}

void File::FinishRefresh() {
  if (fresh_.generation != state_.generation) extents_.clear();
  state_ = fresh_;
  // The direct map words came with the header: a published word changes only by a release,
  // which bumps the generation, so they are as current as a read of the map.
  if (extents_.size() < kDirectEntries) extents_.resize(kDirectEntries, 0);
  for (uint64_t i = 0; i < kDirectEntries; ++i) {
    if (state_.direct[i] != 0) extents_[i] = state_.direct[i];
  }
}

Status File::SetCompanions(uint64_t bits, bool set) {
  uint64_t seen = state_.companions;
  for (;;) {
    const uint64_t desired = set ? seen | bits : seen & ~bits;
    if (desired == seen) break;
    auto found =
        store_.pool().CompareAndSwap(header_ + offsetof(FileHeader, companions), seen, desired);
    if (!found.ok()) return found.status().WithContext(Where() + ": companions");
    if (*found == seen) {
      seen = desired;
      break;
    }
    seen = *found;  // changed since we looked: again from what is there
  }
  state_.companions = seen;
  return Status::Ok();
}

Result<File::PostedRead> File::PostRead(Batch& batch, uint64_t offset, void* out, uint64_t n,
                                        uint16_t server) {
  const uint64_t i = offset / kExtentSize;
  if (n == 0 || i >= kDirectEntries || (offset + n - 1) / kExtentSize != i ||
      extents_.size() <= i || extents_[i] == 0) {
    return PostedRead{};
  }
  const GlobalAddress extent = GlobalAddress::FromRaw(extents_[i]);
  if (extent.server() != server) return PostedRead{};
  FARPOOL_RETURN_IF_ERROR(
      batch.Read(extent + offset % kExtentSize, out, n).WithContext(Where() + ": read"));
  return PostedRead{offset, n, extents_[i]};
}

bool File::ReadCurrent(const PostedRead& read) const {
  return read.extent != 0 && read.offset + read.n <= state_.size &&
         state_.direct[read.offset / kExtentSize] == read.extent;
}

Status File::EnsureLeaf(int top) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress leaf, store_.TakeBlock());
  FARPOOL_ASSIGN_OR_RETURN(
      uint64_t prev, store_.pool().CompareAndSwap(header_ + offsetof(FileHeader, leaves) + top * 8,
                                                  0, leaf.raw()));
  if (prev != 0) {
    FARPOOL_RETURN_IF_ERROR(store_.ReleaseBlock(leaf));
    state_.leaves[top] = prev;
  } else {
    state_.leaves[top] = leaf.raw();
  }
  return Status::Ok();
}

GlobalAddress File::MapWord(uint64_t i) const {
  if (i < kDirectEntries) return header_ + offsetof(FileHeader, direct) + i * 8;
  return GlobalAddress::FromRaw(state_.leaves[i / kLeafEntries]) + (i % kLeafEntries) * 8;
}

Status File::LoadExtents(uint64_t first, uint64_t last, bool allocate, const Fill* fill,
                         std::vector<bool>* filled) {
  if (filled != nullptr) filled->assign(last + 1 - first, false);
  if (extents_.size() <= last) extents_.resize(last + 1, 0);
  auto missing = [&] {
    return std::any_of(extents_.begin() + first, extents_.begin() + last + 1,
                       [](uint64_t e) { return e == 0; });
  };
  if (!missing()) return Status::Ok();
  const int top_first = static_cast<int>(first / kLeafEntries);
  const int top_last = static_cast<int>(last / kLeafEntries);
  // Leaf t holds [lo, hi] of the range, if any.
  auto range = [&](int t, uint64_t* lo, uint64_t* hi) {
    *lo = std::max<uint64_t>(first, LeafStart(t));
    *hi = std::min<uint64_t>(last, (t + 1) * kLeafEntries - 1);
    return *lo <= *hi;
  };
  uint64_t lo, hi;
  for (int t = top_first; t <= top_last; ++t) {
    if (!range(t, &lo, &hi) || state_.leaves[t] != 0) continue;
    // Another process may have added the leaf since this handle read the header.
    FARPOOL_RETURN_IF_ERROR(Refresh());
    if (extents_.size() <= last) extents_.resize(last + 1, 0);
    break;
  }
  Batch batch(store_.pool());
  if (first < kDirectEntries) {
    const uint64_t end = std::min<uint64_t>(last, kDirectEntries - 1);
    FARPOOL_RETURN_IF_ERROR(batch.Read(MapWord(first), &extents_[first], (end - first + 1) * 8));
  }
  for (int t = top_first; t <= top_last; ++t) {
    if (!range(t, &lo, &hi)) continue;
    if (state_.leaves[t] == 0) {
      if (!allocate) continue;
      FARPOOL_RETURN_IF_ERROR(EnsureLeaf(t));
    }
    FARPOOL_RETURN_IF_ERROR(batch.Read(MapWord(lo), &extents_[lo], (hi - lo + 1) * 8));
  }
  FARPOOL_RETURN_IF_ERROR(batch.Wait().WithContext(Where() + ": extent map"));
  if (!allocate || !missing()) return Status::Ok();

  // Publish an extent for every hole in the range, once its content is in it (so that nobody,
  // not even the next mount after a crash here, reads a recycled block's old bytes); a
  // concurrent writer's wins.
  std::vector<uint64_t> mine(last + 1 - first, 0), prev(last + 1 - first, 0);
  auto give_back = [&] {
    for (uint64_t m : mine) {
      if (m != 0) (void)store_.ReleaseBlock(GlobalAddress::FromRaw(m));
    }
  };
  for (uint64_t i = first; i <= last; ++i) {
    if (extents_[i] != 0) continue;
    // Extent 0 on the header's server: a reader's first page comes with the lock's batch
    // (PostRead), which reaches that server only.
    auto block = store_.TakeBlock(
        fill == nullptr, i == 0 ? std::optional<uint16_t>(header_.server()) : std::nullopt);
    if (!block.ok()) {
      give_back();
      return block.status().WithContext(Where());
    }
    mine[i - first] = block->raw();
    if (fill == nullptr) continue;
    // The write's bytes in this extent, [lo, hi) of it, and zeros around them.
    const uint64_t start = i * kExtentSize;
    const uint64_t lo = std::max(fill->offset, start) - start;
    const uint64_t hi = std::min(fill->offset + fill->n, start + kExtentSize) - start;
    Status s = lo > 0 ? batch.Write(*block, Zeros(), lo) : Status::Ok();
    if (s.ok()) s = batch.Write(*block + lo, fill->data + (start + lo - fill->offset), hi - lo);
    if (s.ok() && hi < kExtentSize) s = batch.Write(*block + hi, Zeros(), kExtentSize - hi);
    if (!s.ok()) {
      give_back();
      return s.WithContext(Where());
    }
  }
  if (fill != nullptr) {
    Status s = batch.Wait();
    if (!s.ok()) {
      give_back();
      return s.WithContext(Where() + ": new extents");
    }
  }
  for (uint64_t i = first; i <= last; ++i) {
    if (mine[i - first] == 0) continue;
    FARPOOL_RETURN_IF_ERROR(batch.CompareAndSwap(MapWord(i), 0, mine[i - first], &prev[i - first]));
  }
  FARPOOL_RETURN_IF_ERROR(batch.Wait().WithContext(Where() + ": extent map"));
  for (uint64_t i = first; i <= last; ++i) {
    const uint64_t m = mine[i - first];
    if (m == 0) continue;
    if (prev[i - first] == 0) {
      extents_[i] = m;
      if (filled != nullptr && fill != nullptr) (*filled)[i - first] = true;
    } else {
      extents_[i] = prev[i - first];
      FARPOOL_RETURN_IF_ERROR(store_.ReleaseBlock(GlobalAddress::FromRaw(m)));
    }
  }
  return Status::Ok();
}

Result<uint64_t> File::Read(uint64_t offset, void* out, uint64_t n) {
  const uint64_t avail = offset >= state_.size ? 0 : std::min(n, state_.size - offset);
  auto* dst = static_cast<unsigned char*>(out);
  std::memset(dst + avail, 0, n - avail);
  if (avail == 0) return uint64_t{0};
  const uint64_t first = offset / kExtentSize, last = (offset + avail - 1) / kExtentSize;
  FARPOOL_RETURN_IF_ERROR(LoadExtents(first, last, false));
  Batch batch(store_.pool());
  for (uint64_t pos = offset; pos < offset + avail;) {
    const uint64_t i = pos / kExtentSize, in = pos % kExtentSize;
    const uint64_t len = std::min(kExtentSize - in, offset + avail - pos);
    if (extents_[i] == 0) {
      std::memset(dst + (pos - offset), 0, len);  // a hole
    } else {
      FARPOOL_RETURN_IF_ERROR(
          batch.Read(GlobalAddress::FromRaw(extents_[i]) + in, dst + (pos - offset), len));
    }
    pos += len;
  }
  FARPOOL_RETURN_IF_ERROR(batch.Wait().WithContext(Where() + ": read"));
  return avail;
}

Status File::Write(uint64_t offset, const void* data, uint64_t n) {
  if (n == 0) return Status::Ok();
  FARPOOL_RETURN_IF_ERROR(CheckRange(offset, n, "a write"));
  const uint64_t end = offset + n;
  const uint64_t first = offset / kExtentSize;
  const auto* src = static_cast<const unsigned char*>(data);
  const Fill fill{offset, n, src};
  std::vector<bool> filled;
  FARPOOL_RETURN_IF_ERROR(LoadExtents(first, (end - 1) / kExtentSize, true, &fill, &filled));
  Batch batch(store_.pool());
  for (uint64_t pos = offset; pos < end;) {
    const uint64_t i = pos / kExtentSize, in = pos % kExtentSize;
    const uint64_t len = std::min(kExtentSize - in, end - pos);
    if (!filled[i - first]) {
      FARPOOL_RETURN_IF_ERROR(
          batch.Write(GlobalAddress::FromRaw(extents_[i]) + in, src + (pos - offset), len));
    }
    pos += len;
  }
  // A new size goes with the data: bytes beyond the old size read as zeros (layout.h), so a
  // failed batch leaves at worst a longer file with zeros where the write did not land.
  const bool grows = end > state_.size;
  if (grows) {
    FARPOOL_RETURN_IF_ERROR(batch.Write(header_ + offsetof(FileHeader, size), &end, 8));
  }
  FARPOOL_RETURN_IF_ERROR(batch.Wait().WithContext(Where() + ": write"));
  if (grows) state_.size = end;
  return Status::Ok();
}

Status File::WriteSize(uint64_t size) {
  FARPOOL_RETURN_IF_ERROR(
      store_.pool().Write(header_ + offsetof(FileHeader, size), &size, 8).WithContext(Where()));
  state_.size = size;
  return Status::Ok();
}

Status File::CheckRange(uint64_t offset, uint64_t n, const char* what) const {
  if (offset > kMaxFileSize || n > kMaxFileSize - offset) {
    return Status::InvalidArgument(Where() + ": " + what + " ending at " +
                                   std::to_string(offset + n) + " is beyond the largest file (" +
                                   std::to_string(kMaxFileSize) + " bytes)");
  }
  return Status::Ok();
}

Status File::ZeroRange(uint64_t from, uint64_t to, const char* what) {
  if (from >= to) return Status::Ok();
  const uint64_t first = from / kExtentSize, last = (to - 1) / kExtentSize;
  FARPOOL_RETURN_IF_ERROR(LoadExtents(first, last, false));
  Batch batch(store_.pool());
  for (uint64_t pos = from; pos < to;) {
    const uint64_t i = pos / kExtentSize, in = pos % kExtentSize;
    const uint64_t len = std::min(kExtentSize - in, to - pos);
    if (extents_[i] != 0) {
      FARPOOL_RETURN_IF_ERROR(batch.Write(GlobalAddress::FromRaw(extents_[i]) + in, Zeros(), len));
    }
    pos += len;
  }
  return batch.Wait().WithContext(Where() + ": " + what);
}

Status File::ReleaseExtents(uint64_t first, uint64_t last, const char* what) {
  FARPOOL_RETURN_IF_ERROR(LoadExtents(first, last, false));
  std::vector<uint64_t> prev(last + 1 - first, 0);
  Batch batch(store_.pool());
  for (uint64_t i = first; i <= last; ++i) {
    if (extents_[i] == 0) continue;
    FARPOOL_RETURN_IF_ERROR(batch.CompareAndSwap(MapWord(i), extents_[i], 0, &prev[i - first]));
  }
  FARPOOL_RETURN_IF_ERROR(batch.Wait().WithContext(Where() + ": " + what));
  for (uint64_t i = first; i <= last; ++i) {
    if (extents_[i] != 0 && prev[i - first] == extents_[i]) {
      FARPOOL_RETURN_IF_ERROR(store_.ReleaseBlock(GlobalAddress::FromRaw(extents_[i])));
    }
    extents_[i] = 0;
  }
  return Status::Ok();
}

Status File::Truncate(uint64_t size) {
  FARPOOL_RETURN_IF_ERROR(CheckRange(size, 0, "a truncate"));
  const uint64_t old = state_.size;
  if (size >= old) return WriteSize(size);  // the new bytes are zero already (layout.h)
  FARPOOL_RETURN_IF_ERROR(WriteSize(size));
  Pool& pool = store_.pool();
  // Zero the cut extent's tail, so the bytes beyond the end read as zeros when it grows again.
  const uint64_t keep = (size + kExtentSize - 1) / kExtentSize;  // extents that stay
  FARPOOL_RETURN_IF_ERROR(ZeroRange(size, std::min(keep * kExtentSize, old), "truncate"));
  const uint64_t last = (old - 1) / kExtentSize;
  if (keep > last) return Status::Ok();
  FARPOOL_RETURN_IF_ERROR(ReleaseExtents(keep, last, "truncate"));
  // Leaves wholly beyond the new end (their entries are all 0 now).
  for (int t = 0; t < kTopEntries; ++t) {
    if (LeafStart(t) < keep || state_.leaves[t] == 0) continue;
    FARPOOL_ASSIGN_OR_RETURN(
        uint64_t was,
        pool.CompareAndSwap(header_ + offsetof(FileHeader, leaves) + t * 8, state_.leaves[t], 0));
    if (was == state_.leaves[t]) {
      FARPOOL_RETURN_IF_ERROR(store_.ReleaseBlock(GlobalAddress::FromRaw(was)));
    }
    state_.leaves[t] = 0;
  }
  return BumpGeneration();
}

Status File::BumpGeneration() {
  FARPOOL_ASSIGN_OR_RETURN(uint64_t generation,
                           store_.pool().FetchAdd(header_ + offsetof(FileHeader, generation), 1));
  state_.generation = generation + 1;
  return Status::Ok();
}

Status File::PunchHole(uint64_t offset, uint64_t n) {
  FARPOOL_RETURN_IF_ERROR(CheckRange(offset, n, "a hole"));
  const uint64_t end = offset + n;
  const uint64_t first = (offset + kExtentSize - 1) / kExtentSize;  // whole extents: first..
  const uint64_t after = end / kExtentSize;                         // ..after - 1
  if (first >= after) return ZeroRange(offset, end, "punch hole");
  FARPOOL_RETURN_IF_ERROR(ZeroRange(offset, first * kExtentSize, "punch hole"));
  FARPOOL_RETURN_IF_ERROR(ZeroRange(after * kExtentSize, end, "punch hole"));
  // Only the leaves that exist hold extents: a hole over unmapped space costs nothing.
  if (first < std::min(after, kDirectEntries)) {
    FARPOOL_RETURN_IF_ERROR(
        ReleaseExtents(first, std::min(after, kDirectEntries) - 1, "punch hole"));
  }
  for (int t = 0; t < kTopEntries; ++t) {
    const uint64_t lo = std::max<uint64_t>(first, LeafStart(t));
    const uint64_t hi = std::min<uint64_t>(after, (t + 1) * kLeafEntries);
    if (lo >= hi || state_.leaves[t] == 0) continue;
    FARPOOL_RETURN_IF_ERROR(ReleaseExtents(lo, hi - 1, "punch hole"));
  }
  return BumpGeneration();
}

Status File::Allocate(uint64_t offset, uint64_t n) {
  FARPOOL_RETURN_IF_ERROR(CheckRange(offset, n, "an allocation"));
  if (n == 0) return Status::Ok();
  return LoadExtents(offset / kExtentSize, (offset + n - 1) / kExtentSize, true);
}

Result<InodeAttr> File::ReadAttr() {
  InodeAttr attr;
  FARPOOL_RETURN_IF_ERROR(store_.pool()
                              .Read(header_ + offsetof(FileHeader, attr), &attr, sizeof(attr))
                              .WithContext(Where() + ": attributes"));
  return attr;
}

Status File::WriteAttr(const InodeAttr& attr) {
  return store_.pool()
      .Write(header_ + offsetof(FileHeader, attr), &attr, sizeof(attr))
      .WithContext(Where() + ": attributes");
}

}  // namespace farpool::files
