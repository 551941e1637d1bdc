#include "farpool/fabric.h"

#include <string>

namespace farpool {

Result<Fabric> ParseFabric(std::string_view text) {
  if (text == "auto") return Fabric::kAuto;
  if (text == "shm") return Fabric::kShm;
  if (text == "tcp") return Fabric::kTcp;
  return Status::InvalidArgument("unknown transport '" + std::string(text) +
                                 "' (expected auto, shm or tcp)");
}

std::string_view FabricName(Fabric fabric) {
  switch (fabric) {
    case Fabric::kAuto:
      return "auto";
    case Fabric::kShm:
      return "shm";
    case Fabric::kTcp:
      return "tcp";
  }
  return "unknown";
}

}  // namespace farpool
