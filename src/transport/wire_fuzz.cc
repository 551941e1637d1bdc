// libFuzzer target for the control-message decoder (`make fuzz`): Decode must never read
// outside its input, and whatever it accepts must be self-consistent and re-decodable.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "transport/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace farpool::wire;
  std::vector<std::byte> copy(reinterpret_cast<const std::byte*>(data),
                              reinterpret_cast<const std::byte*>(data) + size);
  auto m = Decode(copy);
  if (!m.ok()) return 0;
  if (sizeof(farpool::transport::FrameHeader) + m->body.size() + m->tail.size() != size)
    std::abort();
  if (m->opcode == Opcode::kErrorReply) (void)DecodeError(*m);
  if (m->opcode == Opcode::kBackupRequest) (void)MapBackupsOf(*m);
  return 0;
}
