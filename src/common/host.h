// What this host can give a process: memory that can be had without swapping or the OOM killer,
// and the CPUs this process may run on. Start-up checks use them to refuse, with a reason,
// what would otherwise take the machine down (a typo such as --memory 100TiB) or starve it
// (more busy-polling servers than cores). And what names a process for good on this host: the
// boot id and a process's start time (a memory server pins the clients that map its region
// by them, see transport/wire.h HelloRequest).
//
// Thread-safety: plain functions reading /proc and the affinity mask; no shared state.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "farpool/status.h"

namespace farpool {

// MemAvailable of /proc/meminfo, in bytes: the kernel's estimate of what can be allocated
// without swapping.
Result<uint64_t> AvailableMemory();

// Ok if `bytes` fit in AvailableMemory(); else InvalidArgument naming `what` (e.g. "--memory
// 100 TiB"), the size and the memory available. Ok too if /proc/meminfo cannot be read (no
// basis for refusing).
Status CheckFitsInAvailableMemory(uint64_t bytes, const std::string& what);

// The CPUs this process may run on (its affinity mask, as `nproc` counts them); at least 1.
int UsableCores();

// The kernel's boot id (/proc/sys/kernel/random/boot_id, 32 hex digits) as 16 raw bytes. Two
// processes see the same one iff they run on the same host in the same boot: only then does a
// pid of one name a process of the other.
using BootIdBytes = std::array<uint8_t, 16>;
Result<BootIdBytes> BootId();

// When process `pid` started: field 22 of /proc/<pid>/stat, in clock ticks since boot. A pid
// that is reused gets another start time, so (boot id, pid, start time) names one process.
// NotFound if there is no such process.
Result<uint64_t> ProcessStartTime(int64_t pid);

}  // namespace farpool
