// `farpool mount` and `farpool umount`: the FUSE 3 daemon (low-level API, multithreaded,
// writeback cache, 1 MiB writes) that serves a PoolFs (pool_fs.h) at a mount point.
//
// Mount returns once the filesystem is mounted, like mount(8): it forks a daemon that connects
// to the pool, takes the mount lease, mounts, and reports success or the reason for failure
// through a pipe; the parent prints it and exits. With `foreground` it serves in this process
// until unmounted (or SIGTERM/SIGINT). The daemon's log (pool errors with their reasons) goes
// to `log`.
//
// The mount's source in /proc/self/mountinfo is "farpool:<name>:<daemon pid>" (type
// fuse.farpool): Unmount finds the daemon there and waits for it to release the mount lease.
#pragma once

#include <string>

#include "farpool/status.h"

namespace farpool::fuse {

struct MountOptions {
  std::string cluster_file;
  std::string mountpoint;
  std::string name = "fs";  // the filesystem in the pool: several may share one cluster
  bool foreground = false;
  std::string log;  // the daemon's stderr; empty: /tmp/farpool-mount-<name>.log
  // The share (percent, 1..100) of the kernel's dirty page limit (vm.dirty_ratio of memory) that
  // this mount's page cache may hold dirty: written to /sys/class/bdi/<dev>/max_ratio once
  // mounted. The kernel gives a FUSE mount 1, with its strict limit on, which throttles buffered
  // writes of more than ~1% of the limit to the daemon's pace; the strict limit stays. Needs
  // root; without it the daemon logs why and the kernel's share stays.
  static constexpr int kDefaultDirtyShare = 50;
  int dirty_share = kDefaultDirtyShare;
  // Every open file bypasses the page cache (FOPEN_DIRECT_IO): each read and write is a request
  // to the daemon, a truncate waits for no writeback, and the writer's memory cgroup is charged
  // no page cache for the file. For spill directories (files written once and read back once,
  // e.g. DuckDB's temp_directory); a database that rereads its pages (PostgreSQL, SQLite) wants
  // the cache. mmap(MAP_SHARED) of such a file fails with ENODEV (libfuse 3.14 cannot ask the
  // kernel to allow it); MAP_PRIVATE works.
  bool direct_io = false;
};

// Mounts and returns the message to print ("mounted ... (daemon pid P, log L)"); in the
// foreground, returns once unmounted.
Result<std::string> Mount(const MountOptions& options);

// Unmounts a farpool mount and waits until its daemon has exited (so the next mount gets the
// lease at once). Busy (open files, a working directory inside) fails with the reason unless
// `lazy`, which detaches now: the daemon exits once the last file is closed.
Status Unmount(const std::string& mountpoint, bool lazy);

// For a process started in a mount namespace of its own, which began as a copy of its
// starter's (`ip netns exec` gives each server of a `--netns` cluster one): detaches its copies
// of farpool mounts. A copy keeps the filesystem mounted, so its daemon would go on serving after
// `farpool umount` in the original namespace, until this process ends. Does nothing unless this
// process's mount namespace differs from its parent's (the starter's), so it never unmounts a
// mount that someone else sees. Returns how many it detached.
int DetachCopiedMounts();

}  // namespace farpool::fuse
