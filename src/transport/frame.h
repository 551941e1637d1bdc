// The frame every farpool message travels in, and its one codec. Two wire formats use it: the
// pool's control messages (transport/wire.h: client <-> memory server) and the sharded engine's
// messages (db/shard_wire.h: coordinator <-> partition server). A format is a FrameFormat: its
// magic, version, error opcode, and the body layout of each of its opcodes; its body structs
// and their meaning stay with the format.
//
//   | magic u32 | version u16 | opcode u16 | body_size u32 | flags u32 | request_id u64 |
//   | body (the opcode's fixed struct) | tail (see TailRule) |
//
// All fields are fixed-width little-endian (structs are copied with memcpy; a static_assert pins
// the host to little-endian). request_id is the sender's and is echoed in the reply; flags are
// reserved and must be 0.
//
// How decoding works: DecodeFrame never trusts a length. It checks, in this order, that the
// bytes hold a header and at most kMaxFrame bytes, the magic, the version, the flags, that the
// opcode is one of the format's, that body_size is exactly the bytes after the header, that the
// opcode's fixed body is there, and the tail rule of the opcode. Each failure is a Protocol
// status naming the format, the opcode and the numbers. Whatever it accepts, every byte of the
// input is in exactly one of header, body and tail.
//
// Error replies: every format has one opcode (FrameFormat::error_opcode) whose body is
// ErrorBody and whose tail is the reason; EncodeErrorFrame / DecodeErrorFrame carry a Status
// across.
//
// Thread-safety: pure functions; FrameFormat values are immutable.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "farpool/status.h"

namespace farpool::transport {

static_assert(std::endian::native == std::endian::little,
              "farpool's wire formats are little-endian");

struct FrameHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t opcode;
  uint32_t body_size;   // bytes after this header
  uint32_t flags;       // reserved, must be 0
  uint64_t request_id;  // echoed in the reply
};
static_assert(sizeof(FrameHeader) == 24);

// A whole frame, header included, is at most this long.
inline constexpr size_t kMaxFrame = 64ull << 20;
// A declared tail (TailRule::kDeclared) is at most this long: rkeys and error texts.
inline constexpr size_t kMaxDeclaredTail = 4096;

// What may follow an opcode's fixed body.
enum class TailRule : uint8_t {
  kNone,      // nothing: the frame ends with the body
  kDeclared,  // exactly the u32 length at `length_offset` inside the body (<= max_tail)
  kItems,     // any number of bytes: items that the format's own parsers check
};

struct BodyLayout {
  size_t size;  // the fixed body
  TailRule tail = TailRule::kNone;
  size_t length_offset = 0;            // kDeclared only
  size_t max_tail = kMaxDeclaredTail;  // kDeclared only
};
constexpr BodyLayout FixedBody(size_t size) { return {size, TailRule::kNone, 0, 0}; }
constexpr BodyLayout DeclaredTail(size_t size, size_t length_offset,
                                  size_t max_tail = kMaxDeclaredTail) {
  return {size, TailRule::kDeclared, length_offset, max_tail};
}
constexpr BodyLayout ItemsTail(size_t size) { return {size, TailRule::kItems, 0, 0}; }

// The body of every format's error reply. Tail: text_size bytes of UTF-8 reason.
struct ErrorBody {
  uint32_t code;  // a farpool::StatusCode
  uint32_t text_size;
};
static_assert(sizeof(ErrorBody) == 8);
inline constexpr BodyLayout kErrorLayout =
    DeclaredTail(sizeof(ErrorBody), offsetof(ErrorBody, text_size));

// One wire format. REQUIRES: layout(error_opcode) is kErrorLayout.
struct FrameFormat {
  std::string_view name;  // in errors: "truncated shard message: ..."
  uint32_t magic;
  uint16_t version;
  uint16_t error_opcode;
  // The body layout of `opcode`; nullopt if the format has no such opcode.
  std::optional<BodyLayout> (*layout)(uint16_t opcode);
  // For errors; any text for unknown opcodes.
  std::string_view (*opcode_name)(uint16_t opcode);
};

// A decoded frame: the header plus views into the caller's buffer.
struct Frame {
  FrameHeader header;
  std::span<const std::byte> body;  // exactly the opcode's fixed body
  std::span<const std::byte> tail;

  // REQUIRES: sizeof(Body) == body.size() (DecodeFrame guarantees it for the matching opcode)
  template <typename Body>
  Body As() const {
    static_assert(std::is_trivially_copyable_v<Body>);
    Body b;
    std::memcpy(&b, body.data(), sizeof(Body));
    return b;
  }
};

// A frame of a format whose opcodes are the enum Opcode.
template <typename Opcode>
struct Message : Frame {
  Opcode opcode;
};

Result<Frame> DecodeFrame(const FrameFormat& format, std::span<const std::byte> bytes);

template <typename Opcode>
Result<Message<Opcode>> DecodeMessage(const FrameFormat& format, std::span<const std::byte> bytes) {
  FARPOOL_ASSIGN_OR_RETURN(Frame frame, DecodeFrame(format, bytes));
  return Message<Opcode>{frame, static_cast<Opcode>(frame.header.opcode)};
}

// header + body + tail in one buffer.
std::vector<std::byte> EncodeFrame(const FrameFormat& format, uint64_t request_id, uint16_t opcode,
                                   std::span<const std::byte> body,
                                   std::span<const std::byte> tail);

template <typename Body>
std::span<const std::byte> BodyBytes(const Body& body) {
  static_assert(std::is_trivially_copyable_v<Body>);
  return std::as_bytes(std::span(&body, 1));
}

// An error reply carrying `status` (its message cut to kMaxDeclaredTail bytes).
std::vector<std::byte> EncodeErrorFrame(const FrameFormat& format, uint64_t request_id,
                                        const Status& status);
// The Status an error reply carries; Protocol if its code is not an error code.
// REQUIRES: `frame` decoded with the error opcode of its format.
Status DecodeErrorFrame(const Frame& frame);

// The request id in the header of `bytes`, if they hold a header: a server echoes it in the
// error reply to a message it could not decode.
std::optional<uint64_t> RequestIdOf(std::span<const std::byte> bytes);

}  // namespace farpool::transport
