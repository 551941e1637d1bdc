#include "transport/frame.h"

#include <string>

namespace farpool::transport {

Result<Frame> DecodeFrame(const FrameFormat& format, std::span<const std::byte> bytes) {
  // Names are made into strings only for an error: this runs for every message a server or a
  // client receives (docs/pool.md, "Measured: the cost of a round trip over TCP").
  const std::string_view kind = format.name;
  if (bytes.size() < sizeof(FrameHeader)) {
    return Status::Protocol("truncated " + std::string(kind) +
                            " message: " + std::to_string(bytes.size()) +
                            " bytes, the header needs " + std::to_string(sizeof(FrameHeader)));
  }
  if (bytes.size() > kMaxFrame) {
    return Status::Protocol(std::string(kind) + " message of " + std::to_string(bytes.size()) +
                            " bytes exceeds the limit of " + std::to_string(kMaxFrame));
  }
  Frame f{};
  std::memcpy(&f.header, bytes.data(), sizeof(FrameHeader));
  if (f.header.magic != format.magic) {
    return Status::Protocol("bad magic (not a farpool " + std::string(kind) + " message)");
  }
  if (f.header.version != format.version) {
    return Status::Protocol(
        std::string(kind) + " protocol version " + std::to_string(f.header.version) +
        " not supported (this build speaks version " + std::to_string(format.version) + ")");
  }
  if (f.header.flags != 0) return Status::Protocol("reserved header flags are not zero");
  const std::optional<BodyLayout> layout = format.layout(f.header.opcode);
  if (!layout) {
    return Status::Protocol("unknown opcode " + std::to_string(f.header.opcode) + " in a " +
                            std::string(kind) + " message");
  }
  const auto op = [&] { return std::string(format.opcode_name(f.header.opcode)); };
  const size_t available = bytes.size() - sizeof(FrameHeader);
  if (f.header.body_size != available) {
    return Status::Protocol(op() + ": header says " + std::to_string(f.header.body_size) +
                            " body bytes, message has " + std::to_string(available));
  }
  if (available < layout->size) {
    return Status::Protocol(op() + ": body truncated (" + std::to_string(available) + " of " +
                            std::to_string(layout->size) + " bytes)");
  }
  const size_t extra = available - layout->size;
  switch (layout->tail) {
    case TailRule::kNone:
      if (extra != 0) {
        return Status::Protocol(op() + ": " + std::to_string(extra) +
                                " unexpected bytes after the body");
      }
      break;
    case TailRule::kDeclared: {
      uint32_t declared = 0;
      std::memcpy(&declared, bytes.data() + sizeof(FrameHeader) + layout->length_offset,
                  sizeof(declared));
      if (declared > layout->max_tail) {
        return Status::Protocol(op() + ": tail of " + std::to_string(declared) +
                                " bytes exceeds the limit of " + std::to_string(layout->max_tail));
      }
      if (extra != declared) {
        return Status::Protocol(op() + ": body declares a tail of " + std::to_string(declared) +
                                " bytes, message has " + std::to_string(extra));
      }
      break;
    }
    case TailRule::kItems:
      break;
  }
  f.body = bytes.subspan(sizeof(FrameHeader), layout->size);
  f.tail = bytes.subspan(sizeof(FrameHeader) + layout->size);
  return f;
}

std::vector<std::byte> EncodeFrame(const FrameFormat& format, uint64_t request_id, uint16_t opcode,
                                   std::span<const std::byte> body,
                                   std::span<const std::byte> tail) {
  const FrameHeader h{
      format.magic, format.version, opcode, static_cast<uint32_t>(body.size() + tail.size()), 0,
      request_id};
  std::vector<std::byte> out(sizeof(h) + body.size() + tail.size());
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + sizeof(h), body.data(), body.size());
  if (!tail.empty()) std::memcpy(out.data() + sizeof(h) + body.size(), tail.data(), tail.size());
  return out;
}

std::vector<std::byte> EncodeErrorFrame(const FrameFormat& format, uint64_t request_id,
                                        const Status& status) {
  const std::string_view text = std::string_view(status.message()).substr(0, kMaxDeclaredTail);
  const ErrorBody body{static_cast<uint32_t>(status.code()), static_cast<uint32_t>(text.size())};
  return EncodeFrame(format, request_id, format.error_opcode, BodyBytes(body),
                     std::as_bytes(std::span(text)));
}

Status DecodeErrorFrame(const Frame& frame) {
  const auto body = frame.As<ErrorBody>();
  std::string text(reinterpret_cast<const char*>(frame.tail.data()), frame.tail.size());
  if (body.code == static_cast<uint32_t>(StatusCode::kOk) ||
      body.code > static_cast<uint32_t>(kLastStatusCode)) {
    return Status::Protocol("error reply with invalid code " + std::to_string(body.code) + ": " +
                            text);
  }
  return Status(static_cast<StatusCode>(body.code), std::move(text));
}

std::optional<uint64_t> RequestIdOf(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(FrameHeader)) return std::nullopt;
  FrameHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  return h.request_id;
}

}  // namespace farpool::transport
