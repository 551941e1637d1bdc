// GlobalAddress: a location in the memory pool.
//
// 64 bits: the memory server's id in the top 16 bits, the byte offset inside that server's
// donated region in the low 48 bits (256 TiB per server, 65,536 servers). 0 is null: a server
// never hands out offset 0 of server 0 (the first 64 bytes of every region are reserved), so
// a zero-initialised pointer field in a pooled structure is never a valid address.
//
// Thread-safety: a value type.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace farpool {

class GlobalAddress {
 public:
  static constexpr int kOffsetBits = 48;
  static constexpr uint64_t kOffsetMask = (uint64_t{1} << kOffsetBits) - 1;
  static constexpr uint32_t kMaxServers = 1u << 16;

  constexpr GlobalAddress() = default;
  // REQUIRES: offset <= kOffsetMask
  constexpr GlobalAddress(uint16_t server, uint64_t offset)
      : raw_((uint64_t{server} << kOffsetBits) | (offset & kOffsetMask)) {}

  static constexpr GlobalAddress FromRaw(uint64_t raw) {
    GlobalAddress a;
    a.raw_ = raw;
    return a;
  }

  constexpr uint64_t raw() const { return raw_; }
  constexpr uint16_t server() const { return static_cast<uint16_t>(raw_ >> kOffsetBits); }
  constexpr uint64_t offset() const { return raw_ & kOffsetMask; }
  constexpr bool is_null() const { return raw_ == 0; }

  // REQUIRES: offset() + delta <= kOffsetMask (stays on the same server)
  constexpr GlobalAddress operator+(uint64_t delta) const {
    return GlobalAddress(server(), offset() + delta);
  }

  constexpr bool operator==(const GlobalAddress&) const = default;
  constexpr auto operator<=>(const GlobalAddress&) const = default;

  // "s3+0x1f40" (server 3, offset 0x1f40), or "null".
  std::string ToString() const;

 private:
  uint64_t raw_ = 0;
};

}  // namespace farpool

template <>
struct std::hash<farpool::GlobalAddress> {
  size_t operator()(const farpool::GlobalAddress& a) const noexcept {
    return std::hash<uint64_t>()(a.raw());
  }
};
