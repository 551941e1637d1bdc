#include "transport/wire.h"

#include <cstring>

namespace farpool::wire {
namespace {

struct BodyLayout {
  size_t body_size;
  // Offset of the u32 tail-length field inside the body, or kNoTail.
  size_t tail_len_offset;
  size_t max_tail = kMaxTail;
};
constexpr size_t kNoTail = ~size_t{0};

Result<BodyLayout> LayoutOf(uint16_t opcode) {
  switch (static_cast<Opcode>(opcode)) {
    case Opcode::kHelloRequest:
      return BodyLayout{sizeof(HelloRequest), kNoTail};
    case Opcode::kHelloReply:
      return BodyLayout{sizeof(HelloReply), offsetof(HelloReply, rkey_size)};
    case Opcode::kLeaseRequest:
      return BodyLayout{sizeof(LeaseRequest), kNoTail};
    case Opcode::kLeaseReply:
      return BodyLayout{sizeof(LeaseReply), kNoTail};
    case Opcode::kReleaseRequest:
      return BodyLayout{sizeof(ReleaseRequest), kNoTail};
    case Opcode::kReleaseReply:
      return BodyLayout{sizeof(ReleaseReply), kNoTail};
    case Opcode::kStatsRequest:
      return BodyLayout{sizeof(StatsRequest), kNoTail};
    case Opcode::kStatsReply:
      return BodyLayout{sizeof(StatsReply), kNoTail};
    case Opcode::kErrorReply:
      return BodyLayout{sizeof(ErrorReply), offsetof(ErrorReply, text_size)};
    case Opcode::kBatchRequest:
      return BodyLayout{sizeof(BatchRequest), offsetof(BatchRequest, ops_size), kMaxBatchTail};
    case Opcode::kBatchReply:
      return BodyLayout{sizeof(BatchReply), offsetof(BatchReply, results_size), kMaxBatchTail};
  }
  return Status::Protocol("unknown opcode " + std::to_string(opcode));
}

}  // namespace

std::string_view OpcodeName(Opcode op) {
  switch (op) {
    case Opcode::kHelloRequest:
      return "HelloRequest";
    case Opcode::kHelloReply:
      return "HelloReply";
    case Opcode::kLeaseRequest:
      return "LeaseRequest";
    case Opcode::kLeaseReply:
      return "LeaseReply";
    case Opcode::kReleaseRequest:
      return "ReleaseRequest";
    case Opcode::kReleaseReply:
      return "ReleaseReply";
    case Opcode::kStatsRequest:
      return "StatsRequest";
    case Opcode::kStatsReply:
      return "StatsReply";
    case Opcode::kErrorReply:
      return "ErrorReply";
    case Opcode::kBatchRequest:
      return "BatchRequest";
    case Opcode::kBatchReply:
      return "BatchReply";
  }
  return "Unknown";
}

Result<Message> Decode(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(MessageHeader)) {
    return Status::Protocol("truncated message: " + std::to_string(bytes.size()) +
                            " bytes, header needs " + std::to_string(sizeof(MessageHeader)));
  }
  Message m{};
  std::memcpy(&m.header, bytes.data(), sizeof(MessageHeader));
  if (m.header.magic != kMagic) return Status::Protocol("bad magic (not a farpool message)");
  if (m.header.version != kVersion) {
    return Status::Protocol("protocol version " + std::to_string(m.header.version) +
                            " not supported (this build speaks version " +
                            std::to_string(kVersion) + ")");
  }
  if (m.header.flags != 0) return Status::Protocol("reserved header flags are not zero");
  FARPOOL_ASSIGN_OR_RETURN(BodyLayout layout, LayoutOf(m.header.opcode));
  m.opcode = static_cast<Opcode>(m.header.opcode);
  const size_t available = bytes.size() - sizeof(MessageHeader);
  if (m.header.body_size != available) {
    return Status::Protocol(std::string(OpcodeName(m.opcode)) + ": header says " +
                            std::to_string(m.header.body_size) + " body bytes, message has " +
                            std::to_string(available));
  }
  if (available < layout.body_size) {
    return Status::Protocol(std::string(OpcodeName(m.opcode)) + ": body truncated (" +
                            std::to_string(available) + " of " + std::to_string(layout.body_size) +
                            " bytes)");
  }
  size_t tail_size = 0;
  if (layout.tail_len_offset != kNoTail) {
    uint32_t declared = 0;
    std::memcpy(&declared, bytes.data() + sizeof(MessageHeader) + layout.tail_len_offset,
                sizeof(declared));
    if (declared > layout.max_tail) {
      return Status::Protocol(std::string(OpcodeName(m.opcode)) + ": tail of " +
                              std::to_string(declared) + " bytes exceeds the limit of " +
                              std::to_string(layout.max_tail));
    }
    tail_size = declared;
  }
  if (available != layout.body_size + tail_size) {
    return Status::Protocol(std::string(OpcodeName(m.opcode)) + ": expected " +
                            std::to_string(layout.body_size + tail_size) + " body bytes, got " +
                            std::to_string(available));
  }
  m.body = bytes.subspan(sizeof(MessageHeader), layout.body_size);
  m.tail = bytes.subspan(sizeof(MessageHeader) + layout.body_size, tail_size);
  return m;
}

template <typename Body>
Body Message::As() const {
  Body b;
  std::memcpy(&b, body.data(), sizeof(Body));
  return b;
}

template <typename Body>
Opcode OpcodeOf();

template <typename Body>
std::vector<std::byte> Encode(uint64_t request_id, const Body& body,
                              std::span<const std::byte> tail) {
  MessageHeader h{kMagic,
                  kVersion,
                  static_cast<uint16_t>(OpcodeOf<Body>()),
                  static_cast<uint32_t>(sizeof(Body) + tail.size()),
                  0,
                  request_id};
  std::vector<std::byte> out(sizeof(h) + sizeof(Body) + tail.size());
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + sizeof(h), &body, sizeof(Body));
  if (!tail.empty()) std::memcpy(out.data() + sizeof(h) + sizeof(Body), tail.data(), tail.size());
  return out;
}

#define FARPOOL_WIRE_BODY(Type)            \
  template <>                              \
  Opcode OpcodeOf<Type>() {                \
    return Opcode::k##Type;                \
  }                                        \
  template Type Message::As<Type>() const; \
  template std::vector<std::byte> Encode<Type>(uint64_t, const Type&, std::span<const std::byte>);

FARPOOL_WIRE_BODY(HelloRequest)
FARPOOL_WIRE_BODY(HelloReply)
FARPOOL_WIRE_BODY(LeaseRequest)
FARPOOL_WIRE_BODY(LeaseReply)
FARPOOL_WIRE_BODY(ReleaseRequest)
FARPOOL_WIRE_BODY(ReleaseReply)
FARPOOL_WIRE_BODY(StatsRequest)
FARPOOL_WIRE_BODY(StatsReply)
FARPOOL_WIRE_BODY(ErrorReply)
FARPOOL_WIRE_BODY(BatchRequest)
FARPOOL_WIRE_BODY(BatchReply)
#undef FARPOOL_WIRE_BODY

std::vector<std::byte> EncodeError(uint64_t request_id, const Status& status) {
  std::string text = status.message().substr(0, kMaxTail);
  ErrorReply body{static_cast<uint32_t>(status.code()), static_cast<uint32_t>(text.size())};
  return Encode(request_id, body, std::as_bytes(std::span(text)));
}

Status DecodeError(const Message& message) {
  auto body = message.As<ErrorReply>();
  std::string text(reinterpret_cast<const char*>(message.tail.data()), message.tail.size());
  auto code = static_cast<StatusCode>(body.code);
  if (body.code > static_cast<uint32_t>(StatusCode::kInternal) || code == StatusCode::kOk) {
    return Status::Protocol("error reply with invalid code " + std::to_string(body.code) + ": " +
                            text);
  }
  return Status(code, std::move(text));
}

}  // namespace farpool::wire
