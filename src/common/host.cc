#include "common/host.h"

#include <sched.h>

#include <fstream>
#include <sstream>
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

Result<BootIdBytes> BootId() {
  const char* path = "/proc/sys/kernel/random/boot_id";
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return Status::IoError(std::string("cannot read ") + path);
  BootIdBytes id{};
  size_t digits = 0;
  for (char c : text) {
    if (c == '-') continue;
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (v < 0 || digits >= 32) {
      return Status::IoError(std::string(path) + " holds '" + text + "', not a 128-bit id");
    }
    id[digits / 2] = static_cast<uint8_t>(id[digits / 2] | (v << (digits % 2 == 0 ? 4 : 0)));
    ++digits;
  }
  if (digits != 32) {
    return Status::IoError(std::string(path) + " holds '" + text + "', not a 128-bit id");
  }
  return id;
}

Result<uint64_t> ProcessStartTime(int64_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return Status::NotFound("no process " + std::to_string(pid));
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; it ends at the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return Status::IoError(path + ": no ')' after the command");
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int n = 3; n <= 22; ++n) {  // field 3 (state) is the first after the command
    if (!(fields >> field)) return Status::IoError(path + ": fewer than 22 fields");
  }
  try {
    return static_cast<uint64_t>(std::stoull(field));
  } catch (const std::exception&) {
    return Status::IoError(path + ": field 22 is '" + field + "', not a start time");
  }
}

}  // namespace farpool
