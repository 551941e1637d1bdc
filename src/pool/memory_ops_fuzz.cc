// libFuzzer target for the memory server's batch executor (`make fuzz`): the first 4 bytes are
// the operation count, the rest the request's tail. Execute must never touch memory outside
// its region or outside what `accessible` allows, and a reply must hold exactly the bytes the
// accepted operations promise. The request runs as a memory server runs it: stopped at every
// wait-compare-and-swap that finds its word held, then resumed (Execution). A request of
// operations that only read (reads, lookup-reads, wait-only waits) must change no byte.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pool/memory_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace farpool::memory_ops;
  if (size < 4) return 0;
  uint32_t count = 0;
  std::memcpy(&count, data, 4);
  std::vector<std::byte> ops(reinterpret_cast<const std::byte*>(data) + 4,
                             reinterpret_cast<const std::byte*>(data) + size);
  // 16 KiB region; the first 4 KiB are off limits (ASan catches any access past the end).
  std::vector<std::byte> memory(16 << 10);
  Region region{memory.data(), memory.size(), [](uint64_t offset, uint64_t length) {
                  return offset >= 4096 && length <= (16 << 10) - offset;
                }};
  auto execution = Execution::Check(count, ops, region);
  if (!execution.ok()) return 0;
  const std::vector<std::byte> before = memory;
  for (auto wait = Execution::Wait::kMay; !execution->Run(region, wait);) {
    if (!execution->Recheck(region).ok()) std::abort();  // the leases did not change
    wait = Execution::Wait::kExpireCurrent;
  }
  const std::vector<std::byte> reply = execution->TakeReply();
  for (size_t i = 0; i < 4096; ++i) {
    if (memory[i] != std::byte{0}) std::abort();  // a write landed where it may not
  }
  uint64_t expected = 0;
  size_t at = 0;
  bool only_reads = true;
  for (uint32_t i = 0; i < count; ++i) {
    OpHeader h;
    std::memcpy(&h, ops.data() + at, sizeof(h));
    const auto kind = static_cast<OpKind>(h.kind);
    if (kind == OpKind::kWaitCompareAndSwap) {
      WaitParams p;
      std::memcpy(&p, ops.data() + at + sizeof(h), sizeof(p));
      only_reads = only_reads && (p.flags & kWaitOnly) != 0;
    } else {
      only_reads = only_reads && (kind == OpKind::kRead || kind == OpKind::kLookupRead);
    }
    expected += RequestBuilder::ReplyBytes(kind, h.size);
    at += RequestBuilder::RequestBytes(kind, h.size);
  }
  if (at != ops.size() || expected != reply.size()) std::abort();
  if (only_reads && memory != before) std::abort();  // a read or a wait-only changed memory
  return 0;
}
