// libFuzzer target of the sharded engine's wire format: any bytes handed to a partition (Decode
// and every Parse* behind it) must give a well-formed reply and never crash or read out of
// bounds. Build with -DFARPOOL_FUZZ=ON (clang); the seeded corruption test in shard_test.cc runs
// the same property in the normal suite.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "db/shard_server.h"
#include "db/shard_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static farpool::db::shard::PartitionState partition(0);
  auto reply = partition.Handle({reinterpret_cast<const std::byte*>(data), size});
  if (!farpool::db::shard::Decode(reply).ok()) std::abort();
  return 0;
}
