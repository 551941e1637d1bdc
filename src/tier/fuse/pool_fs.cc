#include "tier/fuse/pool_fs.h"

#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>  // FUSE_SET_ATTR_*: SetAttr's mask
#include <linux/falloc.h>
#include <linux/fs.h>  // RENAME_*

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace farpool::fuse {
namespace {

using files::InodeAttr;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

timespec ToTimespec(int64_t ns) { return {ns / 1000000000, ns % 1000000000}; }
int64_t FromTimespec(const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }

uint32_t TypeOf(uint64_t mode) { return static_cast<uint32_t>((mode & S_IFMT) >> 12); }

}  // namespace

int PoolFs::Fail(const Status& s) const {
  std::fprintf(stderr, "farpool mount: %s\n", s.ToString().c_str());
  switch (s.code()) {
    case StatusCode::kOutOfMemory:
    case StatusCode::kResourceExhausted:
      return ENOSPC;
    case StatusCode::kAlreadyExists:
      return EEXIST;
    case StatusCode::kNotFound:
      return ENOENT;
    case StatusCode::kInvalidArgument:
      return EINVAL;
    case StatusCode::kPermissionDenied:
      return EACCES;
    case StatusCode::kEvicted:  // fenced off the pool (a mount went ahead): remount
      return ESHUTDOWN;
    default:
      return EIO;
  }
}

int PoolFs::CheckLease() const {
  Status s = leases_->Check();
  return s.ok() ? 0 : Fail(s.WithContext("mount lease lost; remount"));
}

int PoolFs::CheckName(std::string_view name) const {
  if (name.size() > files::kMaxNameLength) return ENAMETOOLONG;
  if (name.empty() || name == "." || name == "..") return EINVAL;
  return 0;
}

GlobalAddress PoolFs::Header(uint64_t ino) const {
  return ino == kRootIno ? root_ : GlobalAddress::FromRaw(ino);
}

uint64_t PoolFs::Ino(GlobalAddress header) const {
  return header == root_ ? kRootIno : header.raw();
}

// ---------------------------------------------------------------------------- mount

Result<std::unique_ptr<PoolFs>> PoolFs::Open(const std::string& cluster_file,
                                             const std::string& name, const std::string& holder) {
  const std::string where = "filesystem '" + name + "'";
  auto fs = std::unique_ptr<PoolFs>(new PoolFs());
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(cluster_file));
  FARPOOL_ASSIGN_OR_RETURN(fs->pool_, Pool::Connect(config));
  FARPOOL_ASSIGN_OR_RETURN(fs->store_, files::FileStore::Open(*fs->pool_));
  files::FileStore& store = *fs->store_;
  FARPOOL_ASSIGN_OR_RETURN(fs->leases_, files::LeaseTable::Attach(store, [&store](int slot) {
                             return files::ClearSlot(store, slot);
                           }));
  FARPOOL_ASSIGN_OR_RETURN(fs->superblock_,
                           store.OpenFile("fuse:" + name, files::OpenMode::kCreate));
  fs->mount_lock_ =
      std::make_unique<files::FileLock>(*fs->pool_, fs->superblock_->lock_word(), *fs->leases_);

  // The mount lease: a live holder renews its slot every lease/8, a dead one is found dead
  // (and swept) once its slot stood still for lease + margin, so that long is enough to decide.
  const auto lease = fs->leases_->lease();
  const auto deadline =
      std::chrono::steady_clock::now() + lease + fs->leases_->margin() + lease / 4;
  for (;;) {
    Status s = fs->mount_lock_->Lock(files::LockLevel::kExclusive);
    if (s.ok()) break;
    if (s.code() != StatusCode::kAborted) return s.WithContext(where + ": mount lease");
    if (std::chrono::steady_clock::now() > deadline) {
      Superblock sb{};
      FARPOOL_RETURN_IF_ERROR(fs->superblock_->Refresh());
      FARPOOL_RETURN_IF_ERROR(fs->superblock_->Read(0, &sb, sizeof(sb)).status());
      sb.holder[sizeof(sb.holder) - 1] = 0;
      return Status::Aborted(where + " is mounted by " +
                             (sb.holder[0] ? std::string(sb.holder) : "another process") + " (" +
                             s.message() + "); one mount at a time");
    }
    std::this_thread::sleep_for(lease / 8);
  }

  FARPOOL_RETURN_IF_ERROR(fs->superblock_->Refresh());
  Superblock sb{};
  FARPOOL_RETURN_IF_ERROR(fs->superblock_->Read(0, &sb, sizeof(sb)).status());
  if (sb.magic == 0) {  // the first mount: an empty root directory
    const int64_t now = NowNs();
    InodeAttr attr{S_IFDIR | 0755, getuid(), getgid(), 1, 0, now, now, now};
    FARPOOL_ASSIGN_OR_RETURN(std::unique_ptr<files::File> root, store.CreateInode(attr));
    attr.parent = root->header().raw();
    FARPOOL_RETURN_IF_ERROR(root->WriteAttr(attr));
    sb.magic = kSuperblockMagic;
    sb.version = kSuperblockVersion;
    sb.root = root->header().raw();
  } else if (sb.magic != kSuperblockMagic || sb.version != kSuperblockVersion) {
    return Status::Protocol(where + ": superblock is not a version-" +
                            std::to_string(kSuperblockVersion) + " farpool filesystem");
  }
  std::snprintf(sb.holder, sizeof(sb.holder), "%s", holder.c_str());
  FARPOOL_RETURN_IF_ERROR(fs->superblock_->Write(0, &sb, sizeof(sb)));
  fs->root_ = GlobalAddress::FromRaw(sb.root);
  return fs;
}

PoolFs::~PoolFs() {
  if (!mount_lock_) return;
  inodes_.clear();
  Status s = mount_lock_->Unlock(files::LockLevel::kNone);
  if (!s.ok()) Fail(s.WithContext("releasing the mount lease"));
}

// ---------------------------------------------------------------------------- inodes

Result<std::shared_ptr<PoolFs::Inode>> PoolFs::Get(uint64_t ino) {
  auto it = inodes_.find(ino);
  if (it != inodes_.end()) return it->second;
  auto inode = std::make_shared<Inode>();
  FARPOOL_ASSIGN_OR_RETURN(inode->file, store_->OpenInode(Header(ino), &inode->attr));
  inodes_.emplace(ino, inode);
  return inode;
}

Result<std::shared_ptr<PoolFs::Inode>> PoolFs::GetLocking(uint64_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  return Get(ino);
}

void PoolFs::Fill(uint64_t ino, Inode& inode, struct stat* st) const {
  *st = {};
  st->st_ino = ino;
  st->st_mode = static_cast<mode_t>(inode.attr.mode);
  // Directories say 1 like btrfs: no subdirectory count (find then does not assume one).
  st->st_nlink = inode.is_dir() ? 1 : inode.attr.nlink;
  st->st_uid = static_cast<uid_t>(inode.attr.uid);
  st->st_gid = static_cast<gid_t>(inode.attr.gid);
  st->st_size = static_cast<off_t>(inode.file->size());
  st->st_blksize = files::kExtentSize;
  st->st_blocks = static_cast<blkcnt_t>((inode.file->size() + 511) / 512);
  st->st_atim = ToTimespec(inode.attr.atime_ns);
  st->st_mtim = ToTimespec(inode.attr.mtime_ns);
  st->st_ctim = ToTimespec(inode.attr.ctime_ns);
}

int PoolFs::GetAttr(uint64_t ino, struct stat* st) {
  std::lock_guard<std::mutex> lock(mu_);
  auto inode = Get(ino);
  if (!inode.ok()) return Fail(inode.status());
  std::lock_guard<std::mutex> l((*inode)->mu);
  Fill(ino, **inode, st);
  return 0;
}

int PoolFs::SetAttr(uint64_t ino, const struct stat& values, int set, struct stat* st) {
  if (int e = CheckLease()) return e;
  std::lock_guard<std::mutex> lock(mu_);
  auto found = Get(ino);
  if (!found.ok()) return Fail(found.status());
  Inode& inode = **found;
  std::lock_guard<std::mutex> l(inode.mu);
  InodeAttr attr = inode.attr;
  const int64_t now = NowNs();
  if (set & FUSE_SET_ATTR_SIZE) {
    if (inode.is_dir()) return EISDIR;
    Status s = inode.file->Truncate(static_cast<uint64_t>(values.st_size));
    if (!s.ok()) return Fail(s);
    attr.mtime_ns = now;
  }
  if (set & FUSE_SET_ATTR_MODE) attr.mode = (attr.mode & S_IFMT) | (values.st_mode & 07777);
  if (set & FUSE_SET_ATTR_UID) attr.uid = values.st_uid;
  if (set & FUSE_SET_ATTR_GID) attr.gid = values.st_gid;
  if (set & FUSE_SET_ATTR_ATIME) attr.atime_ns = FromTimespec(values.st_atim);
  if (set & FUSE_SET_ATTR_ATIME_NOW) attr.atime_ns = now;
  if (set & FUSE_SET_ATTR_MTIME) attr.mtime_ns = FromTimespec(values.st_mtim);
  if (set & FUSE_SET_ATTR_MTIME_NOW) attr.mtime_ns = now;
  attr.ctime_ns = (set & FUSE_SET_ATTR_CTIME) ? FromTimespec(values.st_ctim) : now;
  Status s = inode.file->WriteAttr(attr);
  if (!s.ok()) return Fail(s);
  inode.attr = attr;
  Fill(ino, inode, st);
  return 0;
}

Status PoolFs::ReleaseIfUnused(uint64_t ino) {
  auto it = inodes_.find(ino);
  if (it == inodes_.end() || ino == kRootIno) return Status::Ok();
  std::shared_ptr<Inode> inode = it->second;
  if (inode->opens > 0) return Status::Ok();
  std::lock_guard<std::mutex> l(inode->mu);
  if (inode->lookups > 0) {
    // Unlinked and closed: nobody can reach its bytes any more, so its space comes back now
    // (a full pool gets room from an unlink at once); the header waits for the kernel's forget.
    return inode->attr.nlink == 0 ? inode->file->Truncate(0) : Status::Ok();
  }
  inodes_.erase(it);  // unused: the pool copy is complete, a later Get reloads it
  if (inode->attr.nlink != 0) return Status::Ok();
  return store_->DeleteInode(std::move(inode->file));
}

Status PoolFs::Orphan(uint64_t ino) {
  FARPOOL_ASSIGN_OR_RETURN(std::shared_ptr<Inode> inode, Get(ino));
  {
    std::lock_guard<std::mutex> l(inode->mu);
    InodeAttr attr = inode->attr;
    attr.nlink = 0;
    attr.ctime_ns = NowNs();
    FARPOOL_RETURN_IF_ERROR(inode->file->WriteAttr(attr));
    inode->attr = attr;
  }
  return ReleaseIfUnused(ino);
}

void PoolFs::Forget(uint64_t ino, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return;
  Inode& inode = *it->second;
  inode.lookups = n >= inode.lookups ? 0 : inode.lookups - n;
  Status s = ReleaseIfUnused(ino);
  if (!s.ok()) Fail(s.WithContext("releasing an unlinked inode"));
}

// ---------------------------------------------------------------------------- directories

Result<PoolFs::Dir*> PoolFs::Entries(Inode& inode) {
  if (inode.dir) return inode.dir.get();
  auto dir = std::make_unique<Dir>();
  std::lock_guard<std::mutex> l(inode.mu);
  const uint64_t size = inode.file->size();
  dir->slots = size / sizeof(DirEntry);
  std::vector<DirEntry> records(dir->slots);
  if (!records.empty()) {
    FARPOOL_RETURN_IF_ERROR(
        inode.file->Read(0, records.data(), records.size() * sizeof(DirEntry)).status());
  }
  for (uint64_t i = 0; i < records.size(); ++i) {
    const DirEntry& e = records[i];
    if (e.ino == 0) {
      dir->free.push_back(i);
      continue;
    }
    if (e.name_length == 0 || e.name_length > files::kMaxNameLength) {
      return Status::Protocol(inode.file->name() + ": directory record " + std::to_string(i) +
                              " has a name of " + std::to_string(e.name_length) + " bytes");
    }
    std::string name(e.name, e.name_length);
    dir->by_index.emplace(i, name);
    dir->names.emplace(std::move(name), Slot{i, e.ino, e.type});
  }
  inode.dir = std::move(dir);
  return inode.dir.get();
}

Status PoolFs::PutEntry(Inode& dir_inode, std::string_view name, uint64_t ino, uint32_t type) {
  FARPOOL_ASSIGN_OR_RETURN(Dir * dir, Entries(dir_inode));
  uint64_t index = dir->slots;
  if (!dir->free.empty()) index = dir->free.back();
  DirEntry e{};
  e.ino = ino;
  e.type = type;
  e.name_length = static_cast<uint32_t>(name.size());
  std::memcpy(e.name, name.data(), name.size());
  {
    std::lock_guard<std::mutex> l(dir_inode.mu);
    FARPOOL_RETURN_IF_ERROR(dir_inode.file->Write(index * sizeof(DirEntry), &e, sizeof(e)));
  }
  if (index == dir->slots) {
    ++dir->slots;
  } else {
    dir->free.pop_back();
  }
  dir->by_index.emplace(index, std::string(name));
  dir->names.emplace(std::string(name), Slot{index, ino, type});
  return Status::Ok();
}

Status PoolFs::ClearEntry(Inode& dir_inode, std::string_view name) {
  FARPOOL_ASSIGN_OR_RETURN(Dir * dir, Entries(dir_inode));
  auto it = dir->names.find(name);
  if (it == dir->names.end()) return Status::Internal("no entry '" + std::string(name) + "'");
  const uint64_t index = it->second.index;
  const uint64_t zero = 0;
  {
    std::lock_guard<std::mutex> l(dir_inode.mu);
    FARPOOL_RETURN_IF_ERROR(dir_inode.file->Write(index * sizeof(DirEntry), &zero, 8));
  }
  dir->names.erase(it);
  dir->by_index.erase(index);
  dir->free.push_back(index);
  return Status::Ok();
}

int PoolFs::Lookup(uint64_t parent, std::string_view name, struct stat* st) {
  if (name.size() > files::kMaxNameLength) return ENAMETOOLONG;
  std::lock_guard<std::mutex> lock(mu_);
  auto dir_inode = Get(parent);
  if (!dir_inode.ok()) return Fail(dir_inode.status());
  if (!(*dir_inode)->is_dir()) return ENOTDIR;
  auto dir = Entries(**dir_inode);
  if (!dir.ok()) return Fail(dir.status());
  auto it = (*dir)->names.find(name);
  if (it == (*dir)->names.end()) return ENOENT;
  const uint64_t ino = it->second.ino == root_.raw() ? kRootIno : it->second.ino;
  auto inode = Get(ino);
  if (!inode.ok()) return Fail(inode.status());
  ++(*inode)->lookups;
  std::lock_guard<std::mutex> l((*inode)->mu);
  Fill(ino, **inode, st);
  return 0;
}

int PoolFs::MakeNode(uint64_t parent, std::string_view name, mode_t mode, uid_t uid, gid_t gid,
                     struct stat* st) {
  if (int e = CheckLease()) return e;
  if (int e = CheckName(name)) return e;
  if (!S_ISREG(mode) && !S_ISDIR(mode)) return EPERM;  // no devices, fifos or sockets
  std::lock_guard<std::mutex> lock(mu_);
  auto dir_inode = Get(parent);
  if (!dir_inode.ok()) return Fail(dir_inode.status());
  if (!(*dir_inode)->is_dir()) return ENOTDIR;
  if ((*dir_inode)->attr.nlink == 0) return ENOENT;  // a removed directory
  auto dir = Entries(**dir_inode);
  if (!dir.ok()) return Fail(dir.status());
  if ((*dir)->names.count(name) != 0) return EEXIST;
  const int64_t now = NowNs();
  InodeAttr attr{mode, uid, gid, 1, S_ISDIR(mode) ? Header(parent).raw() : 0, now, now, now};
  auto file = store_->CreateInode(attr);
  if (!file.ok()) return Fail(file.status());
  const uint64_t ino = (*file)->header().raw();
  Status s = PutEntry(**dir_inode, name, ino, TypeOf(mode));
  if (!s.ok()) {
    Status undone = store_->DeleteInode(std::move(*file));
    if (!undone.ok()) Fail(undone.WithContext("undoing a create"));
    return Fail(s);
  }
  auto inode = std::make_shared<Inode>();
  inode->file = std::move(*file);
  inode->attr = attr;
  inode->lookups = 1;
  if (S_ISDIR(mode)) inode->dir = std::make_unique<Dir>();
  inodes_.emplace(ino, inode);
  std::lock_guard<std::mutex> l(inode->mu);
  Fill(ino, *inode, st);
  return 0;
}

int PoolFs::Unlink(uint64_t parent, std::string_view name) { return Remove(parent, name, false); }

int PoolFs::Rmdir(uint64_t parent, std::string_view name) { return Remove(parent, name, true); }

int PoolFs::Remove(uint64_t parent, std::string_view name, bool directory) {
  if (int e = CheckLease()) return e;
  if (name.size() > files::kMaxNameLength) return ENAMETOOLONG;
  std::lock_guard<std::mutex> lock(mu_);
  auto dir_inode = Get(parent);
  if (!dir_inode.ok()) return Fail(dir_inode.status());
  auto dir = Entries(**dir_inode);
  if (!dir.ok()) return Fail(dir.status());
  auto it = (*dir)->names.find(name);
  if (it == (*dir)->names.end()) return ENOENT;
  if ((it->second.type == TypeOf(S_IFDIR)) != directory) return directory ? ENOTDIR : EISDIR;
  const uint64_t ino = it->second.ino;
  if (directory) {
    auto victim = Get(ino);
    if (!victim.ok()) return Fail(victim.status());
    auto entries = Entries(**victim);
    if (!entries.ok()) return Fail(entries.status());
    if (!(*entries)->names.empty()) return ENOTEMPTY;
  }
  Status s = ClearEntry(**dir_inode, name);
  if (s.ok()) s = Orphan(ino);
  return s.ok() ? 0 : Fail(s);
}

int PoolFs::Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                   std::string_view new_name, unsigned flags) {
  if ((flags & ~unsigned{RENAME_NOREPLACE}) != 0) return EINVAL;  // RENAME_EXCHANGE, WHITEOUT
  if (int e = CheckLease()) return e;
  if (int e = CheckName(name)) return e;
  if (int e = CheckName(new_name)) return e;
  std::lock_guard<std::mutex> lock(mu_);
  auto from_inode = Get(parent);
  if (!from_inode.ok()) return Fail(from_inode.status());
  auto to_inode = Get(new_parent);
  if (!to_inode.ok()) return Fail(to_inode.status());
  if (!(*to_inode)->is_dir()) return ENOTDIR;
  auto from = Entries(**from_inode);
  if (!from.ok()) return Fail(from.status());
  auto to = Entries(**to_inode);
  if (!to.ok()) return Fail(to.status());
  auto src = (*from)->names.find(name);
  if (src == (*from)->names.end()) return ENOENT;
  const Slot moving = src->second;
  const bool is_dir = moving.type == TypeOf(S_IFDIR);
  if (parent == new_parent && name == new_name) return 0;
  if (is_dir) {  // not into itself or its own subtree
    for (uint64_t at = new_parent;;) {
      if (Header(at).raw() == moving.ino) return EINVAL;
      if (at == kRootIno) break;
      auto up = Get(at);
      if (!up.ok()) return Fail(up.status());
      at = Ino(GlobalAddress::FromRaw((*up)->attr.parent));
    }
  }
  Status s;
  auto dst = (*to)->names.find(new_name);
  if (dst != (*to)->names.end()) {
    if (flags & RENAME_NOREPLACE) return EEXIST;
    const Slot victim = dst->second;
    const bool victim_dir = victim.type == TypeOf(S_IFDIR);
    if (is_dir && !victim_dir) return ENOTDIR;
    if (!is_dir && victim_dir) return EISDIR;
    if (victim_dir) {
      auto v = Get(victim.ino);
      if (!v.ok()) return Fail(v.status());
      auto ventries = Entries(**v);
      if (!ventries.ok()) return Fail(ventries.status());
      if (!(*ventries)->names.empty()) return ENOTEMPTY;
    }
    // One write turns the target name from the old inode to the new one.
    const struct {
      uint64_t ino;
      uint32_t type;
    } head{moving.ino, moving.type};
    {
      std::lock_guard<std::mutex> l((*to_inode)->mu);
      s = (*to_inode)->file->Write(victim.index * sizeof(DirEntry), &head, 12);
    }
    if (!s.ok()) return Fail(s);
    dst->second.ino = moving.ino;
    dst->second.type = moving.type;
    s = ClearEntry(**from_inode, name);
    if (s.ok()) s = Orphan(victim.ino);
  } else {
    s = PutEntry(**to_inode, new_name, moving.ino, moving.type);
    if (s.ok()) s = ClearEntry(**from_inode, name);
  }
  if (s.ok() && is_dir && parent != new_parent) {
    auto moved = Get(moving.ino);
    if (!moved.ok()) return Fail(moved.status());
    std::lock_guard<std::mutex> l((*moved)->mu);
    InodeAttr attr = (*moved)->attr;
    attr.parent = Header(new_parent).raw();
    s = (*moved)->file->WriteAttr(attr);
    if (s.ok()) (*moved)->attr = attr;
  }
  return s.ok() ? 0 : Fail(s);
}

int PoolFs::ReadDir(uint64_t ino, uint64_t offset, std::vector<DirItem>* items) {
  std::lock_guard<std::mutex> lock(mu_);
  auto inode = Get(ino);
  if (!inode.ok()) return Fail(inode.status());
  if (!(*inode)->is_dir()) return ENOTDIR;
  auto dir = Entries(**inode);
  if (!dir.ok()) return Fail(dir.status());
  if (offset < 1) items->push_back({".", ino, S_IFDIR, 1});
  if (offset < 2) {
    items->push_back({"..", Ino(GlobalAddress::FromRaw((*inode)->attr.parent)), S_IFDIR, 2});
  }
  // Record i is at offset i + 3: stable while other names come and go.
  for (auto it = (*dir)->by_index.lower_bound(offset < 3 ? 0 : offset - 2);
       it != (*dir)->by_index.end(); ++it) {
    const Slot& slot = (*dir)->names.at(it->second);
    items->push_back({it->second, slot.ino == root_.raw() ? kRootIno : slot.ino, slot.type << 12,
                      it->first + 3});
  }
  return 0;
}

// ---------------------------------------------------------------------------- data

int PoolFs::Open(uint64_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  auto inode = Get(ino);
  if (!inode.ok()) return Fail(inode.status());
  ++(*inode)->opens;
  return 0;
}

int PoolFs::Release(uint64_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return 0;
  if (it->second->opens > 0) --it->second->opens;
  Status s = ReleaseIfUnused(ino);
  return s.ok() ? 0 : Fail(s.WithContext("releasing an unlinked inode"));
}

int PoolFs::Read(uint64_t ino, uint64_t offset, void* out, uint64_t n, uint64_t* done) {
  auto found = GetLocking(ino);
  if (!found.ok()) return Fail(found.status());
  const std::shared_ptr<Inode> inode = *found;
  std::lock_guard<std::mutex> l(inode->mu);
  if (inode->is_dir()) return EISDIR;
  auto r = inode->file->Read(offset, out, n);
  if (!r.ok()) return Fail(r.status());
  *done = *r;
  return 0;
}

int PoolFs::Write(uint64_t ino, uint64_t offset, const void* data, uint64_t n) {
  if (int e = CheckLease()) return e;
  auto found = GetLocking(ino);
  if (!found.ok()) return Fail(found.status());
  const std::shared_ptr<Inode> inode = *found;
  std::lock_guard<std::mutex> l(inode->mu);
  if (inode->is_dir()) return EISDIR;
  if (offset + n > files::kMaxFileSize || offset + n < offset) return EFBIG;
  Status s = inode->file->Write(offset, data, n);
  return s.ok() ? 0 : Fail(s);
}

int PoolFs::Fallocate(uint64_t ino, int mode, uint64_t offset, uint64_t length) {
  if (int e = CheckLease()) return e;
  const bool punch = (mode & FALLOC_FL_PUNCH_HOLE) != 0;
  const bool keep_size = (mode & FALLOC_FL_KEEP_SIZE) != 0;
  if ((mode & ~(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)) != 0) return EOPNOTSUPP;
  if (punch && !keep_size) return EINVAL;  // what Linux requires of PUNCH_HOLE
  if (offset >= files::kMaxFileSize) return punch ? 0 : EFBIG;
  length = std::min(length, files::kMaxFileSize - offset);
  auto found = GetLocking(ino);
  if (!found.ok()) return Fail(found.status());
  const std::shared_ptr<Inode> inode = *found;
  std::lock_guard<std::mutex> l(inode->mu);
  if (inode->is_dir()) return EISDIR;
  Status s;
  if (punch) {
    s = inode->file->PunchHole(offset, length);
  } else {
    s = inode->file->Allocate(offset, length);
    if (s.ok() && !keep_size && offset + length > inode->file->size()) {
      s = inode->file->Truncate(offset + length);
    }
  }
  return s.ok() ? 0 : Fail(s);
}

int PoolFs::Sync() { return CheckLease(); }

int PoolFs::StatFs(struct statvfs* st) {
  uint64_t capacity = 0, free = 0;
  for (uint16_t id : pool_->server_ids()) {
    auto stats = pool_->Stats(id);
    if (!stats.ok()) return Fail(stats.status().WithContext("statfs"));
    capacity += stats->capacity;
    free += stats->capacity - std::min(stats->capacity, stats->leased);
  }
  auto recycled = store_->FreeBytes();
  if (!recycled.ok()) return Fail(recycled.status().WithContext("statfs"));
  free += *recycled;
  constexpr uint64_t kBlock = 4096;
  *st = {};
  st->f_bsize = kBlock;
  st->f_frsize = kBlock;
  st->f_blocks = capacity / kBlock;
  st->f_bfree = std::min(capacity, free) / kBlock;
  st->f_bavail = st->f_bfree;
  st->f_files = uint64_t{1} << 32;  // inodes are pool objects: no table to run out of
  st->f_ffree = st->f_files;
  st->f_favail = st->f_files;
  st->f_namemax = files::kMaxNameLength;
  return 0;
}

}  // namespace farpool::fuse
