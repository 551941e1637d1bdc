// libFuzzer target of the sharded engine's wire format (`make fuzz`). Any bytes handed to a
// partition (the frame decoder and the request parsers behind it) must give a well-formed reply
// and never crash or read out of bounds; the same bytes taken as a reply go through the
// coordinator's parsers (DecodeError and every reply Parse*), which must reject what is not
// exactly their items. Build with -DFARPOOL_FUZZ=ON (clang); the seeded corruption test in
// shard_test.cc runs the first property in the normal suite.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "db/shard_server.h"
#include "db/shard_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace farpool::db::shard;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  static PartitionState partition(0);
  const std::vector<std::byte> reply = partition.Handle(bytes);
  if (!Decode(reply).ok()) std::abort();

  auto m = Decode(bytes);
  if (!m.ok()) return 0;
  if (sizeof(farpool::transport::FrameHeader) + m->body.size() + m->tail.size() != size) {
    std::abort();
  }
  switch (m->opcode) {
    case Opcode::kErrorReply:
      (void)DecodeError(*m);
      break;
    case Opcode::kReadReply:
    case Opcode::kScanReply:
      (void)ParseReadItems(*m);
      break;
    case Opcode::kListTablesReply:
      (void)ParseNames(*m);
      break;
    case Opcode::kLockedReply:
      (void)ParseHolders(*m);
      break;
    case Opcode::kTableReply:
      (void)NameOf(m->As<TableDesc>().name);
      break;
    default:
      break;  // requests: parsed by the partition above
  }
  return 0;
}
