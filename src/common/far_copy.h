// Copies to and from memory that other threads and processes read and write concurrently
// (mapped far memory: a memory server's region over shared memory, or the local engine's
// simulated far memory). The API promises no more than 8-byte-word atomicity for aligned words;
// the protocols above validate what they read (versions, lock words, checksums).
//
// Release builds use memcpy, which makes exactly those word accesses on x86-64 and is several
// times faster than a loop of atomic words for 4 KiB (SIMD). Under ThreadSanitizer the copies
// are relaxed atomic words (bytes at unaligned ends): the same accesses, in a form TSan
// understands, so that it checks farpool's own state instead of flagging this intended sharing.
#pragma once

#include <cstddef>
#include <cstdint>

namespace farpool {

// REQUIRES: [src, src + size) is mapped; `dst` is private to the caller.
void FarRead(void* dst, const std::byte* src, uint64_t size);
// REQUIRES: [dst, dst + size) is mapped; `src` is private to the caller.
void FarWrite(std::byte* dst, const void* src, uint64_t size);

}  // namespace farpool
