#include "pool/server/shared_pages.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/host.h"
#include "common/process.h"

namespace farpool {

namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

Result<SharedFile> DescribeSharedFile(const std::byte* address, uint64_t size) {
  const auto begin = reinterpret_cast<uintptr_t>(address);
  const uintptr_t end = begin + size;
  // /proc/self/maps: "start-end perms offset dev inode path"; UCX maps a region in one piece.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0;
    uintptr_t hi = 0;
    char perms[8] = {};
    unsigned long long offset = 0;
    unsigned dev_major = 0;
    unsigned dev_minor = 0;
    unsigned long long inode = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %7s %llx %x:%x %llu", &lo, &hi, perms,
                    &offset, &dev_major, &dev_minor, &inode) != 7) {
      continue;
    }
    if (begin < lo || begin >= hi) continue;
    // The file's offset 0 must be at `address`: a backup maps the file from there.
    if (end > hi || perms[3] != 's' || inode == 0 || offset + (begin - lo) != 0) {
      return Status::NotFound("the region at " + std::to_string(begin) +
                              " is not one shared file mapping from its offset 0 (" + line + ")");
    }
    // The descriptor UCX keeps open for its peers (UCX_POSIX_USE_PROC_LINK).
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return Status::Internal(Errno("opendir /proc/self/fd"));
    int found = -1;
    while (dirent* e = readdir(dir)) {
      char* rest = nullptr;
      const long fd = std::strtol(e->d_name, &rest, 10);
      if (rest == e->d_name || *rest != '\0') continue;
      struct stat st {};
      if (fstat(static_cast<int>(fd), &st) == 0 && st.st_ino == inode &&
          major(st.st_dev) == dev_major && minor(st.st_dev) == dev_minor &&
          static_cast<uint64_t>(st.st_size) >= (hi - lo)) {
        found = static_cast<int>(fd);
        break;
      }
    }
    closedir(dir);
    if (found < 0) {
      return Status::NotFound("no open descriptor of the region's file (inode " +
                              std::to_string(inode) + ")");
    }
    FARPOOL_ASSIGN_OR_RETURN(uint64_t started, ProcessStartTime(getpid()));
    return SharedFile{static_cast<uint64_t>(getpid()), started, inode, found};
  }
  return Status::NotFound("no mapping at " + std::to_string(begin) + " in /proc/self/maps");
}

Result<std::unique_ptr<AdoptedPages>> AdoptedPages::Adopt(const SharedFile& file, std::byte* at,
                                                          uint64_t size, const SharedFile& own,
                                                          uint64_t own_offset) {
  const std::string whose = "process " + std::to_string(file.pid);
  std::unique_ptr<AdoptedPages> pages(new AdoptedPages());
  pages->owner_pid_ = file.pid;
  pages->pidfd_ = PidfdOpen(static_cast<pid_t>(file.pid));
  if (pages->pidfd_ < 0) return Status::NotFound(Errno("pidfd_open of " + whose));
  // Read after the pidfd is open: if the start time is the one named, the pidfd is that
  // process (a pid is not reused while its process lives, and a pidfd never follows a reuse).
  auto started = ProcessStartTime(static_cast<int64_t>(file.pid));
  if (!started.ok() || *started != file.start_time) {
    return Status::NotFound(whose + " is not the primary that described its region (it exited)");
  }
  const std::string path = "/proc/" + std::to_string(file.pid) + "/fd/" + std::to_string(file.fd);
  pages->fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (pages->fd_ < 0) {
    return Status::PermissionDenied(
        Errno("opening the region file " + path + " (the same user, or CAP_SYS_PTRACE)"));
  }
  struct stat st {};
  if (fstat(pages->fd_, &st) != 0) return Status::Internal(Errno("fstat " + path));
  if (st.st_ino != file.inode) {
    return Status::InvalidArgument(path + " is inode " + std::to_string(st.st_ino) +
                                   ", not the region's " + std::to_string(file.inode));
  }
  if (static_cast<uint64_t>(st.st_size) < size) {
    return Status::InvalidArgument(path + " has " + std::to_string(st.st_size) +
                                   " bytes, fewer than the " + std::to_string(size) + " adopted");
  }
  pages->inode_ = file.inode;
  pages->own_pid_ = own.pid;
  pages->own_start_time_ = own.start_time;
  if (mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, pages->fd_, 0) == MAP_FAILED) {
    return Status::Internal(Errno("mapping " + path + " over the mirror slot"));
  }
  // The slot's pages in this server's own file are no longer mapped here: give them back, so a
  // backup does not hold the memory of a copy it does not keep. Best effort (memory, not data).
  if (fallocate(own.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(own_offset),
                static_cast<off_t>(size)) != 0) {
    std::fprintf(stderr, "%s\n", Errno("giving back the mirror slot's own pages").c_str());
  }
  return pages;
}

AdoptedPages::~AdoptedPages() {
  if (pidfd_ >= 0) close(pidfd_);
  if (fd_ >= 0) close(fd_);
}

Status AdoptedPages::KillOwner(std::chrono::milliseconds timeout) {
  if (PidfdExited(pidfd_)) return Status::Ok();
  if (PidfdSendSignal(pidfd_, SIGKILL) != 0 && errno != ESRCH) {
    return Status::PermissionDenied(
        Errno("killing the primary, process " + std::to_string(owner_pid_)));
  }
  if (PidfdExited(pidfd_, timeout)) return Status::Ok();
  return Status::TimedOut("the primary, process " + std::to_string(owner_pid_) +
                          ", got SIGKILL but has not exited after " +
                          std::to_string(timeout.count()) + " ms");
}

SharedFile AdoptedPages::Describe() const {
  return SharedFile{own_pid_, own_start_time_, inode_, fd_};
}

}  // namespace farpool
