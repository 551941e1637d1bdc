#include "common/host.h"

#include <sched.h>

#include <fstream>
#include <string>

#include "common/units.h"

namespace farpool {

Result<uint64_t> AvailableMemory() {
  std::ifstream in("/proc/meminfo");
  if (!in) return Status::IoError("cannot read /proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return Status::NotFound("/proc/meminfo has no MemAvailable line");
}

Status CheckFitsInAvailableMemory(uint64_t bytes, const std::string& what) {
  auto available = AvailableMemory();
  if (!available.ok() || bytes <= *available) return Status::Ok();
  return Status::InvalidArgument(
      what + " is more memory than this host can give: " + FormatSize(*available) +
      " available (MemAvailable in /proc/meminfo)");
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

}  // namespace farpool
