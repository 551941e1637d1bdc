#include "tier/fuse/fuse_mount.h"

#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "common/process.h"
#include "tier/fuse/pool_fs.h"

namespace farpool::fuse {
namespace {

// The mount is alone with its files (the mount lease), so the kernel may cache names and
// attributes for long: nothing changes them behind its back.
constexpr double kCacheSeconds = 60.0;
constexpr unsigned kMaxWrite = 1u << 20;
constexpr unsigned kMaxThreads = 16;  // the FUSE loop's worker threads

// The session's userdata: what the operations serve, and how they open files.
struct Served {
  PoolFs& fs;
  bool direct_io;  // MountOptions::direct_io
};

PoolFs& Fs(fuse_req_t req) { return static_cast<Served*>(fuse_req_userdata(req))->fs; }

// How an opened file is cached: the page cache stays valid across opens (only this mount
// writes), unless the mount bypasses it.
void SetOpenFlags(fuse_req_t req, fuse_file_info* fi) {
  fi->keep_cache = 1;
  fi->direct_io = static_cast<Served*>(fuse_req_userdata(req))->direct_io ? 1 : 0;
}

// The reply of a lookup or create for the inode of `st`, cached by the kernel for kCacheSeconds.
fuse_entry_param EntryOf(const struct stat& st) {
  fuse_entry_param e{};
  e.ino = st.st_ino;
  e.attr = st;
  e.attr_timeout = kCacheSeconds;
  e.entry_timeout = kCacheSeconds;
  return e;
}

void ReplyEntry(fuse_req_t req, int err, const struct stat& st) {
  if (err != 0) {
    fuse_reply_err(req, err);
    return;
  }
  const fuse_entry_param e = EntryOf(st);
  fuse_reply_entry(req, &e);
}

void ReplyAttr(fuse_req_t req, int err, const struct stat& st) {
  if (err != 0) {
    fuse_reply_err(req, err);
  } else {
    fuse_reply_attr(req, &st, kCacheSeconds);
  }
}

// The page cache is this mount's to keep (the mount lease: nothing else changes the files), so
// cached pages are never dropped for attributes: no AUTO_INVAL_DATA (libfuse's default), and
// opens keep the cache (Open). No splice: the daemon copies pool bytes into a buffer either
// way, and for 4 KiB one writev is fewer system calls than vmsplice and splice.
// max_background bounds the kernel's asynchronous requests (readahead, writeback): as many as
// the loop has threads.
void Init(void*, fuse_conn_info* conn) {
  if (conn->capable & FUSE_CAP_WRITEBACK_CACHE) conn->want |= FUSE_CAP_WRITEBACK_CACHE;
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
  conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;  // always plus: one request per batch of names
  conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
  conn->max_write = kMaxWrite;
  conn->max_readahead = kMaxWrite;
  conn->max_background = kMaxThreads;
  conn->congestion_threshold = kMaxThreads * 3 / 4;
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  struct stat st;
  ReplyEntry(req, Fs(req).Lookup(parent, name, &st), st);
}

void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  Fs(req).Forget(ino, n);
  fuse_reply_none(req);
}

void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) Fs(req).Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  ReplyAttr(req, Fs(req).GetAttr(ino, &st), st);
}

void SetAttr(fuse_req_t req, fuse_ino_t ino, struct stat* values, int set, fuse_file_info*) {
  struct stat st;
  ReplyAttr(req, Fs(req).SetAttr(ino, *values, set, &st), st);
}

void MakeNode(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  struct stat st;
  const int err = Fs(req).MakeNode(parent, name, mode & ~ctx->umask, ctx->uid, ctx->gid, &st);
  if (err != 0 || fi == nullptr) {
    ReplyEntry(req, err, st);
    return;
  }
  const int open_err = Fs(req).Open(st.st_ino);
  if (open_err != 0) {
    fuse_reply_err(req, open_err);
    return;
  }
  SetOpenFlags(req, fi);
  const fuse_entry_param e = EntryOf(st);
  fuse_reply_create(req, &e, fi);
}

void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  MakeNode(req, parent, name, (mode & ~S_IFMT) | S_IFREG, fi);
}

void Mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  MakeNode(req, parent, name, (mode & ~S_IFMT) | S_IFDIR, nullptr);
}

void Mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t) {
  MakeNode(req, parent, name, mode, nullptr);  // regular files only: EPERM for the rest
}

void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, Fs(req).Unlink(parent, name));
}

void Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, Fs(req).Rmdir(parent, name));
}

void Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
            const char* new_name, unsigned flags) {
  fuse_reply_err(req, Fs(req).Rename(parent, name, new_parent, new_name, flags));
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  const int err = Fs(req).Open(ino);
  if (err != 0) {
    fuse_reply_err(req, err);
    return;
  }
  SetOpenFlags(req, fi);
  fuse_reply_open(req, fi);
}

void Release(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  fuse_reply_err(req, Fs(req).Release(ino));
}

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  const std::unique_ptr<char[]> buf(new char[size]);  // Read fills it: no zeroing first
  uint64_t done = 0;
  const int err = Fs(req).Read(ino, static_cast<uint64_t>(off), buf.get(), size, &done);
  if (err != 0) {
    fuse_reply_err(req, err);
  } else {
    fuse_reply_buf(req, buf.get(), done);
  }
}

void Write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off,
           fuse_file_info*) {
  const int err = Fs(req).Write(ino, static_cast<uint64_t>(off), data, size);
  if (err != 0) {
    fuse_reply_err(req, err);
  } else {
    fuse_reply_write(req, size);
  }
}

// Flush (every close), fsync and fsyncdir: the kernel has already sent its dirty pages as
// writes, and each write was in the servers' memory when it was answered.
void Flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, Fs(req).Sync()); }
void Fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  fuse_reply_err(req, Fs(req).Sync());
}

void Fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
               fuse_file_info*) {
  if (offset < 0 || length <= 0) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  fuse_reply_err(req, Fs(req).Fallocate(ino, mode, static_cast<uint64_t>(offset),
                                        static_cast<uint64_t>(length)));
}

void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  struct stat st;
  const int err = Fs(req).GetAttr(ino, &st);
  if (err != 0) {
    fuse_reply_err(req, err);
  } else if (!S_ISDIR(st.st_mode)) {
    fuse_reply_err(req, ENOTDIR);
  } else {
    fuse_reply_open(req, fi);
  }
}

void ReadDirAny(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  std::vector<DirItem> items;
  const int err = Fs(req).ReadDir(ino, static_cast<uint64_t>(off), &items);
  if (err != 0) {
    fuse_reply_err(req, err);
    return;
  }
  std::vector<char> buf(size);
  size_t used = 0;
  for (const DirItem& item : items) {
    const bool dots = item.name == "." || item.name == "..";
    size_t need;
    if (plus) {
      fuse_entry_param e{};
      e.attr.st_ino = item.ino;
      e.attr.st_mode = item.mode;
      // The kernel counts a lookup of every named entry it takes (not of "." and "..").
      if (!dots) {
        struct stat st;
        if (Fs(req).Lookup(ino, item.name, &st) != 0) continue;  // gone since the listing
        e.ino = st.st_ino;
        e.attr = st;
        e.attr_timeout = kCacheSeconds;
        e.entry_timeout = kCacheSeconds;
      }
      need = fuse_add_direntry_plus(req, buf.data() + used, size - used, item.name.c_str(), &e,
                                    static_cast<off_t>(item.offset));
      if (need > size - used) {
        if (!dots) Fs(req).Forget(e.ino, 1);  // not sent: not taken
        break;
      }
    } else {
      struct stat st {};
      st.st_ino = item.ino;
      st.st_mode = item.mode;
      need = fuse_add_direntry(req, buf.data() + used, size - used, item.name.c_str(), &st,
                               static_cast<off_t>(item.offset));
      if (need > size - used) break;
    }
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  ReadDirAny(req, ino, size, off, false);
}
void ReadDirPlus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  ReadDirAny(req, ino, size, off, true);
}
void ReleaseDir(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void StatFs(fuse_req_t req, fuse_ino_t) {
  struct statvfs st;
  const int err = Fs(req).StatFs(&st);
  if (err != 0) {
    fuse_reply_err(req, err);
  } else {
    fuse_reply_statfs(req, &st);
  }
}

fuse_lowlevel_ops Operations() {
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  ops.lookup = Lookup;
  ops.forget = Forget;
  ops.forget_multi = ForgetMulti;
  ops.getattr = GetAttr;
  ops.setattr = SetAttr;
  ops.mknod = Mknod;
  ops.mkdir = Mkdir;
  ops.unlink = Unlink;
  ops.rmdir = Rmdir;
  ops.rename = Rename;
  ops.create = Create;
  ops.open = Open;
  ops.read = Read;
  ops.write = Write;
  ops.flush = Flush;
  ops.release = Release;
  ops.fsync = Fsync;
  ops.opendir = OpenDir;
  ops.readdir = ReadDir;
  ops.readdirplus = ReadDirPlus;
  ops.releasedir = ReleaseDir;
  ops.fsyncdir = Fsync;
  ops.statfs = StatFs;
  ops.fallocate = Fallocate;
  return ops;
}

// mountinfo escapes blanks and backslashes as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A farpool mount's line of /proc/self/mountinfo.
struct MountEntry {
  std::string point;   // where it is mounted (unescaped)
  std::string device;  // "major:minor" of its superblock: the name of its backing device info
  pid_t daemon = 0;    // from its source, farpool:<name>:<daemon pid>
};

// Every farpool mount this process's mount namespace has, in mount order.
std::vector<MountEntry> FarpoolMounts() {
  std::vector<MountEntry> mounts;
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    // id parent major:minor root mountpoint options [optional...] - type source superoptions
    std::istringstream fields(line);
    std::string id, parent, dev, root, point, word;
    fields >> id >> parent >> dev >> root >> point;
    while (fields >> word && word != "-") {
    }
    std::string type, source;
    fields >> type >> source;
    if (type != "fuse.farpool") continue;
    MountEntry e{Unescape(point), dev, 0};
    const size_t colon = source.rfind(':');
    if (colon != std::string::npos) e.daemon = std::atoi(source.c_str() + colon + 1);
    mounts.push_back(std::move(e));
  }
  return mounts;
}

// The farpool mount at `path`; of mounts stacked there, the last (the one on top).
std::optional<MountEntry> FindMount(const std::string& path) {
  std::optional<MountEntry> found;
  for (MountEntry& e : FarpoolMounts()) {
    if (e.point == path) found = std::move(e);
  }
  return found;
}

// Lets the mount's page cache hold `share` percent of the kernel's dirty page limit (see
// MountOptions::dirty_share). Reads mountinfo, not the mount point: a stat of the mount point
// would be a request to this daemon, which does not serve yet.
Status SetDirtyShare(const std::string& mountpoint, int share) {
  const auto entry = FindMount(mountpoint);
  if (!entry) return Status::NotFound(mountpoint + " is not in /proc/self/mountinfo");
  const std::string knob = "/sys/class/bdi/" + entry->device + "/max_ratio";
  const std::string value = std::to_string(share);
  const int fd = open(knob.c_str(), O_WRONLY | O_CLOEXEC);
  const bool written =
      fd >= 0 && write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  const int err = errno;
  if (fd >= 0) close(fd);
  if (!written) {
    return Status::PermissionDenied("cannot write " + value + " to " + knob + ": " +
                                    std::strerror(err));
  }
  return Status::Ok();
}

std::string Hostname() {
  char host[HOST_NAME_MAX + 1] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Serves the filesystem until unmounted. `ready` is called once mounted (or with the reason it
// could not be).
Status Serve(const MountOptions& o, const std::function<void(const Status&)>& ready) {
  char since[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc;
  std::strftime(since, sizeof(since), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &utc));
  const std::string holder = Hostname() + " pid " + std::to_string(getpid()) + " mountpoint " +
                             o.mountpoint + " since " + since;
  auto fs = PoolFs::Open(o.cluster_file, o.name, holder);
  if (!fs.ok()) return fs.status();
  const std::string options = "allow_other,default_permissions,fsname=farpool:" + o.name + ":" +
                              std::to_string(getpid()) + ",subtype=farpool";
  std::vector<std::string> argv = {"farpool", "-o", options};
  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(raw.size()), raw.data());
  const fuse_lowlevel_ops ops = Operations();
  Served served{**fs, o.direct_io};
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), &served);
  if (se == nullptr) return Status::Internal("fuse_session_new failed (options '" + options + "')");
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_destroy(se);
    return Status::Internal("fuse_set_signal_handlers failed");
  }
  if (fuse_session_mount(se, o.mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return Status::IoError("cannot mount on " + o.mountpoint +
                           " (is /dev/fuse there, the directory empty and not mounted?)");
  }
  if (Status s = SetDirtyShare(o.mountpoint, o.dirty_share); !s.ok()) {
    std::fprintf(stderr,
                 "farpool mount: the kernel's dirty page share for FUSE (1%%) stays, so buffered "
                 "writes beyond it wait for the daemon: %s\n",
                 s.ToString().c_str());
  }
  ready(Status::Ok());
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, kMaxThreads);
  const int rc = fuse_session_loop_mt(se, config);
  fuse_loop_cfg_destroy(config);
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  fs->reset();  // releases the mount lease
  if (rc != 0 && rc != SIGTERM && rc != SIGINT && rc != SIGHUP) {
    return Status::IoError("the FUSE session ended with error " + std::to_string(rc));
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> Mount(const MountOptions& options) {
  MountOptions o = options;
  char real[PATH_MAX];
  if (realpath(o.mountpoint.c_str(), real) == nullptr) {
    return Status::InvalidArgument("mount point " + o.mountpoint + ": " + std::strerror(errno));
  }
  o.mountpoint = real;
  if (o.log.empty()) o.log = "/tmp/farpool-mount-" + o.name + ".log";
  // The daemon works in "/": paths the caller gave relative to its directory are made absolute.
  o.cluster_file = std::filesystem::absolute(o.cluster_file);
  o.log = std::filesystem::absolute(o.log);
  if (o.foreground) {
    FARPOOL_RETURN_IF_ERROR(Serve(o, [&](const Status&) {
      std::fprintf(stderr, "farpool: mounted '%s' on %s\n", o.name.c_str(), o.mountpoint.c_str());
    }));
    return "unmounted " + o.mountpoint;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::IoError(std::string("pipe: ") + strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) return Status::IoError(std::string("fork: ") + strerror(errno));
  if (pid == 0) {  // the daemon
    close(fds[0]);
    DetachFromTerminal();  // the caller's session: its scheduling autogroup, not one alone
    if (chdir("/") != 0) _exit(1);
    const int null = open("/dev/null", O_RDWR);
    const int log = open(o.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    dup2(null, STDIN_FILENO);
    dup2(null, STDOUT_FILENO);
    if (log >= 0) dup2(log, STDERR_FILENO);
    auto tell = [&](const Status& s) {
      const std::string msg = s.ok() ? "ok" : s.ToString();
      (void)!write(fds[1], msg.data(), msg.size());
      close(fds[1]);
      fds[1] = -1;
    };
    Status s = Serve(o, tell);
    if (!s.ok()) std::fprintf(stderr, "farpool mount: %s\n", s.ToString().c_str());
    if (fds[1] >= 0) tell(s);
    _exit(s.ok() ? 0 : 1);
  }
  close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (msg == "ok") {
    return "mounted '" + o.name + "' on " + o.mountpoint + " (daemon pid " + std::to_string(pid) +
           ", log " + o.log + ")";
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (msg.empty()) {
    return Status::Internal("the mount daemon (pid " + std::to_string(pid) +
                            ") ended without a word; see " + o.log);
  }
  return Status::IoError("mount failed: " + msg);
}

Status Unmount(const std::string& mountpoint, bool lazy) {
  char real[PATH_MAX];
  const std::string path = realpath(mountpoint.c_str(), real) != nullptr ? real : mountpoint;
  const auto entry = FindMount(path);
  if (!entry) return Status::NotFound(path + " is not a farpool mount");
  const pid_t daemon = entry->daemon;
  int pidfd = daemon > 0 ? static_cast<int>(syscall(SYS_pidfd_open, daemon, 0)) : -1;
  if (umount2(path.c_str(), lazy ? MNT_DETACH : 0) != 0) {
    const int err = errno;
    if (pidfd >= 0) close(pidfd);
    if (err == EBUSY) {
      return Status::Aborted(path +
                             " is busy: files are open or a process works inside it; close them, "
                             "or `farpool umount --lazy` detaches it now and the daemon ends when "
                             "the last one is closed");
    }
    return Status::IoError("umount " + path + ": " + std::strerror(err));
  }
  if (lazy || pidfd < 0) {
    if (pidfd >= 0) close(pidfd);
    return Status::Ok();
  }
  // The daemon sees the session end, releases the mount lease and exits.
  pollfd p{pidfd, POLLIN, 0};
  const int ready = poll(&p, 1, 60000);
  close(pidfd);
  if (ready <= 0) {
    return Status::TimedOut("unmounted " + path + ", but its daemon (pid " +
                            std::to_string(daemon) + ") has not exited within 60 s");
  }
  return Status::Ok();
}

int DetachCopiedMounts() {
  // The parent is the starter (`ip netns exec` execs in place): a namespace other than its own
  // is a copy made for this process. (PID 1's namespace may not be readable, e.g. in a VM's
  // sandbox.) When in doubt, nothing is detached.
  struct stat mine, parent;
  const std::string parents = "/proc/" + std::to_string(getppid()) + "/ns/mnt";
  if (stat("/proc/self/ns/mnt", &mine) != 0 || stat(parents.c_str(), &parent) != 0) return 0;
  if (mine.st_ino == parent.st_ino && mine.st_dev == parent.st_dev) return 0;
  int detached = 0;
  for (const MountEntry& e : FarpoolMounts()) {
    if (umount2(e.point.c_str(), MNT_DETACH) == 0) ++detached;
  }
  return detached;
}

}  // namespace farpool::fuse
