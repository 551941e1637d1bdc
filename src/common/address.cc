#include "farpool/address.h"

#include <sstream>

namespace farpool {

std::string GlobalAddress::ToString() const {
  if (is_null()) return "null";
  std::ostringstream os;
  os << 's' << server() << "+0x" << std::hex << offset();
  return os.str();
}

}  // namespace farpool
