// Where UCX's POSIX shared-memory transport puts its files, so that no process of farpool
// leaves any behind in /dev/shm, whatever kills it.
//
// How it works: UCX's posix memory domain creates each segment (a memory server's region, the
// receive FIFOs of every worker) as a file in UCX_POSIX_DIR (default /dev/shm), writes every
// page of it (its check that the space exists, which for a large region takes seconds), and
// only then unlinks it (peers open it through /proc/<pid>/fd/<fd>, UCX_POSIX_USE_PROC_LINK=y).
// A process killed in that window, e.g. by the OOM killer while a too-large region is being
// written, leaves the file, and its memory, in /dev/shm for good. A process cannot clean up
// after SIGKILL, so the design does not rely on it:
//   - every farpool process gives UCX a directory of its own, /dev/shm/farpool-ucx-<pid>
//     (ShmDirectory), which it removes at a normal exit;
//   - `farpool server` starts a janitor process (StartShmJanitor) that waits for the server to
//     die, by any signal, and then removes the server's directory;
//   - directories whose process is gone (a client or a server killed along with its janitor)
//     are removed by the next farpool process that creates a UCX context, and by `cluster
//     up|down` (RemoveStaleShmDirectories).
// A user's own UCX_POSIX_DIR is respected: then none of this applies. UCX reads the setting of
// its memory domains from the environment only, so ShmDirectory sets UCX_POSIX_DIR in this
// process's environment (once, before its first UCX context); children that inherit it
// replace it with their own.
//
// Thread-safety: ShmDirectory and RemoveStaleShmDirectories from any thread;
// StartShmJanitor only while the process has a single thread (it forks).
#pragma once

#include <string>

#include "farpool/status.h"

namespace farpool::transport {

// The directory for UCX_POSIX_DIR, created and set in the environment on first use (and stale
// ones removed then); empty if the user set UCX_POSIX_DIR or it cannot be created (UCX then
// uses its default). Call before creating a UCX context.
std::string ShmDirectory();

// Removes /dev/shm/farpool-ucx-<pid> directories of processes that no longer run.
void RemoveStaleShmDirectories();

// Forks a process that removes this process's ShmDirectory when this process dies.
// REQUIRES: the process has one thread.
Status StartShmJanitor();

}  // namespace farpool::transport
