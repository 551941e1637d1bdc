// Shared pages: a backup on the same host holds its primary's region itself, not a copy
// (docs/pool.md "Shared-pages backups").
//
// How it works: a memory server's region is a POSIX shared-memory file that UCX created in
// /dev/shm/farpool-ucx-<pid>, unlinked at once and kept open (transport/shm_dir.h). Such a file
// lives as long as anything holds it, a descriptor or a mapping, whatever happens to the process
// that created it. So:
//   - the primary describes its region's file (DescribeSharedFile: its pid and start time, the
//     descriptor number and the file's inode) when it attaches its backup;
//   - the backup opens it through /proc/<pid>/fd/<fd> while the primary lives (allowed to a
//     process that may ptrace it: the same user), checks that it is the file named (inode) of
//     the process named (pidfd, then the start time read after opening it: not a reused pid),
//     and maps it MAP_SHARED|MAP_FIXED over the mirror slot that would have held the copy
//     (AdoptedPages::Adopt). From then on the slot *is* the primary's region: every store of the
//     primary, of its clients' mappings and of the backup land in the same pages, and nothing
//     needs forwarding but the lease book (process memory);
//   - before the backup serves those pages it makes sure that the primary process is dead
//     (AdoptedPages::KillOwner: SIGKILL through the pidfd, then the pidfd readable, which the
//     kernel signals after the process has unmapped everything): a primary that is only stalled
//     (SIGSTOP, a long pause) would otherwise run a half-done compound operation on the pages
//     the backup serves.
// The slot's own pages in the backup's file are given back (hole punched), so the backup does
// not hold a second copy's memory.
//
// Scope: the death of a server *process* on one host. The host's death takes the pages (and
// every client on it) with it; a copy on another host is re-replication's job with forwards.
//
// Thread-safety: AdoptedPages is not synchronized; its owner (pool/server/mirror.h) guards it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "farpool/status.h"

namespace farpool {

// What a process tells another on the same host so that it can open its shared-memory file.
struct SharedFile {
  uint64_t pid = 0;
  uint64_t start_time = 0;  // of pid (common/host.h ProcessStartTime)
  uint64_t inode = 0;
  int32_t fd = -1;  // in pid's descriptor table
};

// The file backing [address, address + size) of this process: one MAP_SHARED mapping of a
// shared-memory file from its offset 0, and a descriptor of it open in this process. NotFound
// with the reason otherwise (anonymous memory, not mapped from offset 0, no descriptor open).
Result<SharedFile> DescribeSharedFile(const std::byte* address, uint64_t size);

// A primary's region adopted by its backup: the mapping over the backup's slot, a descriptor of
// the file (so that this server can describe it to a backup of its own once it serves it), and
// a pidfd of the primary process.
class AdoptedPages {
 public:
  // Opens `file` (of another process, alive) and maps its first `size` bytes over [at, at +
  // size), which must be a page-aligned part of this process's own shared region; then gives
  // that part of this process's own file back (`own`: DescribeSharedFile of the region,
  // `own_offset`: where `at` lies in it). Errors name what failed (no such process, a reused pid,
  // another file, too small, permission).
  static Result<std::unique_ptr<AdoptedPages>> Adopt(const SharedFile& file, std::byte* at,
                                                     uint64_t size, const SharedFile& own,
                                                     uint64_t own_offset);
  ~AdoptedPages();
  AdoptedPages(const AdoptedPages&) = delete;
  AdoptedPages& operator=(const AdoptedPages&) = delete;

  // Makes sure the primary process is dead: SIGKILL through its pidfd (a stopped process dies
  // too), then waits until it has exited. Ok once it has (at once if it had); TimedOut if it
  // has not within `timeout`; another error if it may not be signalled.
  Status KillOwner(std::chrono::milliseconds timeout);
  // This process's description of the adopted file (for a backup of the adopted region).
  SharedFile Describe() const;
  uint64_t owner_pid() const { return owner_pid_; }

 private:
  AdoptedPages() = default;
  uint64_t owner_pid_ = 0;
  int pidfd_ = -1;
  int fd_ = -1;
  uint64_t inode_ = 0;
  uint64_t own_pid_ = 0;  // this process, as `own` of Adopt named it
  uint64_t own_start_time_ = 0;
};

}  // namespace farpool
