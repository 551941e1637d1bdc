// What this host can give a process: memory that can be had without swapping or the OOM killer,
// and the CPUs this process may run on. Start-up checks use them to refuse, with a reason,
// what would otherwise take the machine down (a typo such as --memory 100TiB) or starve it
// (more busy-polling servers than cores).
//
// Thread-safety: plain functions reading /proc and the affinity mask; no shared state.
#pragma once

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

}  // namespace farpool
