#include "farpool/address.h"

#include <charconv>
#include <sstream>

#include "farpool/cluster.h"

namespace farpool {

std::string GlobalAddress::ToString() const {
  if (is_null()) return "null";
  std::ostringstream os;
  os << 's' << server() << "+0x" << std::hex << offset();
  return os.str();
}

// Declared in farpool/cluster.h; defined here, in farpool_common, for the libraries below
// farpool_pool that parse HOST:PORT too (coord/membership.cc).
Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("invalid address '" + std::string(text) +
                                   "': " + std::string(why) + " (expected HOST:PORT)");
  };
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad("no host or port");
  std::string_view host = text.substr(0, colon);
  std::string_view port_text = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || ptr != port_text.data() + port_text.size() ||
      port > 65535) {
    return bad("port is not a number from 0 to 65535");
  }
  return std::pair{std::string(host), static_cast<uint16_t>(port)};
}

}  // namespace farpool
