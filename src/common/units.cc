#include "common/units.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

namespace farpool {
namespace {

// Splits "12.5MiB" into 12.5 and "MiB"; rejects anything that is not number + suffix.
Result<std::pair<double, std::string_view>> SplitNumber(std::string_view text,
                                                        std::string_view what) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("invalid " + std::string(what) + " '" + std::string(text) +
                                   "': " + std::string(why));
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return bad("expected a number first");
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, value);
  if (ec != std::errc() || ptr != text.data() + i) return bad("not a number");
  std::string_view suffix = text.substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  return std::pair{value, suffix};
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text) {
  FARPOOL_ASSIGN_OR_RETURN(auto parts, SplitNumber(text, "size"));
  auto [value, suffix] = parts;
  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr std::array<Unit, 14> kUnits = {{
      {"", 1},
      {"B", 1},
      {"K", 1024.0},
      {"KiB", 1024.0},
      {"KB", 1e3},
      {"M", 1024.0 * 1024},
      {"MiB", 1024.0 * 1024},
      {"MB", 1e6},
      {"G", 1024.0 * 1024 * 1024},
      {"GiB", 1024.0 * 1024 * 1024},
      {"GB", 1e9},
      {"T", 1024.0 * 1024 * 1024 * 1024},
      {"TiB", 1024.0 * 1024 * 1024 * 1024},
      {"TB", 1e12},
  }};
  for (const Unit& u : kUnits) {
    if (u.name == suffix) {
      double bytes = value * u.factor;
      if (bytes > 1.8e19) {
        return Status::InvalidArgument("invalid size '" + std::string(text) + "': too large");
      }
      if (bytes != std::floor(bytes)) {
        return Status::InvalidArgument("invalid size '" + std::string(text) +
                                       "': not a whole number of bytes");
      }
      return static_cast<uint64_t>(bytes);
    }
  }
  return Status::InvalidArgument("invalid size '" + std::string(text) + "': unknown unit '" +
                                 std::string(suffix) +
                                 "' (use B, KiB, MiB, GiB, TiB or KB, MB, GB, TB)");
}

std::string FormatSize(uint64_t bytes) {
  static constexpr std::array<const char*, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < kNames.size()) {
    v /= 1024.0;
    ++unit;
  }
  char buf[48];
  if (unit == 0 || v == std::floor(v)) {
    std::snprintf(buf, sizeof(buf), "%.0f %s", v, kNames[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kNames[unit]);
  }
  return buf;
}

Result<std::chrono::nanoseconds> ParseDuration(std::string_view text) {
  FARPOOL_ASSIGN_OR_RETURN(auto parts, SplitNumber(text, "duration"));
  auto [value, suffix] = parts;
  double ns_per_unit = 0;
  if (suffix == "ns") {
    ns_per_unit = 1;
  } else if (suffix == "us") {
    ns_per_unit = 1e3;
  } else if (suffix == "ms") {
    ns_per_unit = 1e6;
  } else if (suffix == "s" || suffix.empty()) {
    ns_per_unit = 1e9;
  } else {
    return Status::InvalidArgument("invalid duration '" + std::string(text) + "': unknown unit '" +
                                   std::string(suffix) + "' (use ns, us, ms or s)");
  }
  return std::chrono::nanoseconds(static_cast<int64_t>(std::llround(value * ns_per_unit)));
}

}  // namespace farpool
