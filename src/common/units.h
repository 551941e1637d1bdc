// Parsing and printing of byte sizes and durations as users type them on command lines and in
// cluster files: "512MiB", "4GiB", "1.5GB", "4096"; "20us", "1.5ms", "2s".
//
// Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB) powers
// of 1000; a bare number is bytes. Errors name the input and what was expected.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "farpool/status.h"

namespace farpool {

Result<uint64_t> ParseSize(std::string_view text);
// "1.5 GiB", "512 MiB", "64 B": the largest binary unit that keeps the value >= 1.
std::string FormatSize(uint64_t bytes);

Result<std::chrono::nanoseconds> ParseDuration(std::string_view text);

}  // namespace farpool
