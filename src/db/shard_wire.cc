#include "db/shard_wire.h"

#include <cstring>

namespace farpool::db::shard {
namespace {

// The fixed body size of each opcode; 0 for unknown opcodes.
size_t BodySize(uint16_t op) {
  switch (static_cast<Opcode>(op)) {
    case Opcode::kErrorReply:
      return sizeof(ErrorReply);
    case Opcode::kBeginRequest:
      return sizeof(BeginRequest);
    case Opcode::kBeginReply:
      return sizeof(BeginReply);
    case Opcode::kReadRequest:
      return sizeof(ReadRequest);
    case Opcode::kReadReply:
      return sizeof(ReadReply);
    case Opcode::kScanRequest:
      return sizeof(ScanRequest);
    case Opcode::kScanReply:
      return sizeof(ReadReply);
    case Opcode::kPrepareRequest:
      return sizeof(PrepareRequest);
    case Opcode::kPrepareReply:
      return sizeof(PrepareReply);
    case Opcode::kDecideRequest:
      return sizeof(DecideRequest);
    case Opcode::kDecideReply:
      return sizeof(DecideReply);
    case Opcode::kResolveRequest:
      return sizeof(ResolveRequest);
    case Opcode::kResolveReply:
      return sizeof(ResolveReply);
    case Opcode::kCommitRequest:
      return sizeof(CommitRequest);
    case Opcode::kCommitReply:
      return sizeof(CommitReply);
    case Opcode::kCreateTableRequest:
      return sizeof(TableDesc);
    case Opcode::kTableReply:
      return sizeof(TableDesc);
    case Opcode::kOpenTableRequest:
      return sizeof(NameRequest);
    case Opcode::kDropTableRequest:
      return sizeof(NameRequest);
    case Opcode::kDropTableReply:
      return sizeof(DropTableReply);
    case Opcode::kListTablesRequest:
      return sizeof(ListTablesRequest);
    case Opcode::kListTablesReply:
      return sizeof(ListTablesReply);
    case Opcode::kLockedRequest:
      return sizeof(LockedRequest);
    case Opcode::kLockedReply:
      return sizeof(LockedReply);
  }
  return 0;
}

// Opcodes whose tail is free-form or item lists; all others must have an empty tail.
bool HasTail(Opcode op) {
  switch (op) {
    case Opcode::kErrorReply:
    case Opcode::kReadRequest:
    case Opcode::kReadReply:
    case Opcode::kScanReply:
    case Opcode::kPrepareRequest:
    case Opcode::kListTablesReply:
    case Opcode::kLockedReply:
      return true;
    default:
      return false;
  }
}

// Bounds-checked reads from a tail.
class Reader {
 public:
  Reader(const Message& m) : m_(m), rest_(m.tail) {}
  template <typename T>
  Status Take(T* out, size_t index) {
    if (rest_.size() < sizeof(T)) return Short(index, sizeof(T));
    std::memcpy(out, rest_.data(), sizeof(T));
    rest_ = rest_.subspan(sizeof(T));
    return Status::Ok();
  }
  Status TakeBytes(size_t n, std::string_view* out, size_t index) {
    if (n > kMaxValue) {
      return Status::Protocol(Name() + ": item " + std::to_string(index) + " declares a value of " +
                              std::to_string(n) + " bytes (limit " + std::to_string(kMaxValue) +
                              ")");
    }
    if (rest_.size() < n) return Short(index, n);
    *out = std::string_view(reinterpret_cast<const char*>(rest_.data()), n);
    rest_ = rest_.subspan(n);
    return Status::Ok();
  }
  Status CheckCount(uint64_t count, size_t min_item) const {
    if (min_item != 0 && count > rest_.size() / min_item) {
      return Status::Protocol(Name() + ": declares " + std::to_string(count) +
                              " items but the tail has " + std::to_string(rest_.size()) + " bytes");
    }
    return Status::Ok();
  }
  Status Done() const {
    if (!rest_.empty()) {
      return Status::Protocol(Name() + ": " + std::to_string(rest_.size()) +
                              " bytes after the last item");
    }
    return Status::Ok();
  }
  std::string Name() const { return std::string(OpcodeName(m_.opcode)); }

 private:
  Status Short(size_t index, size_t need) const {
    return Status::Protocol(Name() + ": item " + std::to_string(index) + " truncated (needs " +
                            std::to_string(need) + " bytes, " + std::to_string(rest_.size()) +
                            " left)");
  }
  const Message& m_;
  std::span<const std::byte> rest_;
};

}  // namespace

std::string_view OpcodeName(Opcode op) {
  switch (op) {
    case Opcode::kErrorReply:
      return "ErrorReply";
    case Opcode::kBeginRequest:
      return "BeginRequest";
    case Opcode::kBeginReply:
      return "BeginReply";
    case Opcode::kReadRequest:
      return "ReadRequest";
    case Opcode::kReadReply:
      return "ReadReply";
    case Opcode::kScanRequest:
      return "ScanRequest";
    case Opcode::kScanReply:
      return "ScanReply";
    case Opcode::kPrepareRequest:
      return "PrepareRequest";
    case Opcode::kPrepareReply:
      return "PrepareReply";
    case Opcode::kDecideRequest:
      return "DecideRequest";
    case Opcode::kDecideReply:
      return "DecideReply";
    case Opcode::kResolveRequest:
      return "ResolveRequest";
    case Opcode::kResolveReply:
      return "ResolveReply";
    case Opcode::kCommitRequest:
      return "CommitRequest";
    case Opcode::kCommitReply:
      return "CommitReply";
    case Opcode::kCreateTableRequest:
      return "CreateTableRequest";
    case Opcode::kTableReply:
      return "TableReply";
    case Opcode::kOpenTableRequest:
      return "OpenTableRequest";
    case Opcode::kDropTableRequest:
      return "DropTableRequest";
    case Opcode::kDropTableReply:
      return "DropTableReply";
    case Opcode::kListTablesRequest:
      return "ListTablesRequest";
    case Opcode::kListTablesReply:
      return "ListTablesReply";
    case Opcode::kLockedRequest:
      return "LockedRequest";
    case Opcode::kLockedReply:
      return "LockedReply";
  }
  return "Unknown";
}

Result<Message> Decode(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(Header)) {
    return Status::Protocol("truncated shard message: " + std::to_string(bytes.size()) +
                            " bytes, the header needs " + std::to_string(sizeof(Header)));
  }
  if (bytes.size() > kMaxMessage) {
    return Status::Protocol("shard message of " + std::to_string(bytes.size()) +
                            " bytes exceeds the limit of " + std::to_string(kMaxMessage));
  }
  Message m{};
  std::memcpy(&m.header, bytes.data(), sizeof(Header));
  if (m.header.magic != kMagic) return Status::Protocol("bad magic (not a farpool shard message)");
  if (m.header.version != kVersion) {
    return Status::Protocol("shard protocol version " + std::to_string(m.header.version) +
                            " not supported (this build speaks version " +
                            std::to_string(kVersion) + ")");
  }
  if (m.header.flags != 0) return Status::Protocol("reserved header flags are not zero");
  const size_t body = BodySize(m.header.opcode);
  if (body == 0) return Status::Protocol("unknown shard opcode " + std::to_string(m.header.opcode));
  m.opcode = static_cast<Opcode>(m.header.opcode);
  const size_t available = bytes.size() - sizeof(Header);
  if (m.header.body_size != available) {
    return Status::Protocol(std::string(OpcodeName(m.opcode)) + ": header says " +
                            std::to_string(m.header.body_size) + " body bytes, message has " +
                            std::to_string(available));
  }
  if (available < body) {
    return Status::Protocol(std::string(OpcodeName(m.opcode)) + ": body truncated (" +
                            std::to_string(available) + " of " + std::to_string(body) + " bytes)");
  }
  if (!HasTail(m.opcode) && available != body) {
    return Status::Protocol(std::string(OpcodeName(m.opcode)) + ": " +
                            std::to_string(available - body) + " unexpected bytes after the body");
  }
  m.body = bytes.subspan(sizeof(Header), body);
  m.tail = bytes.subspan(sizeof(Header) + body);
  return m;
}

template <typename Body>
Body Message::As() const {
  Body b;
  std::memcpy(&b, body.data(), sizeof(Body));
  return b;
}

template <typename Body>
std::vector<std::byte> Encode(uint64_t request_id, Opcode op, const Body& body,
                              std::span<const std::byte> tail) {
  Header h{kMagic,
           kVersion,
           static_cast<uint16_t>(op),
           static_cast<uint32_t>(sizeof(Body) + tail.size()),
           0,
           request_id};
  std::vector<std::byte> out(sizeof(Header) + sizeof(Body) + tail.size());
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + sizeof(h), &body, sizeof(Body));
  if (!tail.empty()) std::memcpy(out.data() + sizeof(h) + sizeof(Body), tail.data(), tail.size());
  return out;
}

#define FARPOOL_SHARD_BODY(T)        \
  template T Message::As<T>() const; \
  template std::vector<std::byte> Encode<T>(uint64_t, Opcode, const T&, std::span<const std::byte>);
FARPOOL_SHARD_BODY(ErrorReply)
FARPOOL_SHARD_BODY(BeginRequest)
FARPOOL_SHARD_BODY(ReadRequest)
FARPOOL_SHARD_BODY(ReadReply)
FARPOOL_SHARD_BODY(ScanRequest)
FARPOOL_SHARD_BODY(PrepareRequest)
FARPOOL_SHARD_BODY(PrepareReply)
FARPOOL_SHARD_BODY(DecideRequest)
FARPOOL_SHARD_BODY(ResolveRequest)
FARPOOL_SHARD_BODY(CommitRequest)
FARPOOL_SHARD_BODY(TableDesc)
FARPOOL_SHARD_BODY(NameRequest)
FARPOOL_SHARD_BODY(ListTablesReply)
FARPOOL_SHARD_BODY(LockedRequest)
FARPOOL_SHARD_BODY(LockedReply)
FARPOOL_SHARD_BODY(BeginReply)
FARPOOL_SHARD_BODY(DecideReply)
FARPOOL_SHARD_BODY(ResolveReply)
FARPOOL_SHARD_BODY(CommitReply)
FARPOOL_SHARD_BODY(DropTableReply)
FARPOOL_SHARD_BODY(ListTablesRequest)
#undef FARPOOL_SHARD_BODY

std::vector<std::byte> EncodeError(uint64_t request_id, const Status& status) {
  std::string text(status.message());
  if (text.size() > 4096) text.resize(4096);
  ErrorReply e{static_cast<uint32_t>(status.code()), static_cast<uint32_t>(text.size())};
  return Encode(request_id, Opcode::kErrorReply, e,
                std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

Status DecodeError(const Message& m) {
  auto e = m.As<ErrorReply>();
  if (e.text_size != m.tail.size()) {
    return Status::Protocol("ErrorReply: declares " + std::to_string(e.text_size) +
                            " text bytes, has " + std::to_string(m.tail.size()));
  }
  std::string text(reinterpret_cast<const char*>(m.tail.data()), m.tail.size());
  if (e.code == 0 || e.code > static_cast<uint32_t>(StatusCode::kInternal)) {
    return Status::Protocol("ErrorReply with unknown code " + std::to_string(e.code) + ": " + text);
  }
  return Status(static_cast<StatusCode>(e.code), std::move(text));
}

Result<std::vector<int64_t>> ParseReadKeys(const Message& m) {
  auto body = m.As<ReadRequest>();
  Reader r(m);
  FARPOOL_RETURN_IF_ERROR(r.CheckCount(body.count, sizeof(int64_t)));
  std::vector<int64_t> keys(body.count);
  for (uint32_t i = 0; i < body.count; ++i) FARPOOL_RETURN_IF_ERROR(r.Take(&keys[i], i));
  FARPOOL_RETURN_IF_ERROR(r.Done());
  return keys;
}

Result<std::vector<ReadValue>> ParseReadItems(const Message& m) {
  auto body = m.As<ReadReply>();
  Reader r(m);
  FARPOOL_RETURN_IF_ERROR(r.CheckCount(body.count, sizeof(ReadItem)));
  std::vector<ReadValue> out(body.count);
  for (uint32_t i = 0; i < body.count; ++i) {
    FARPOOL_RETURN_IF_ERROR(r.Take(&out[i].item, i));
    const auto state = static_cast<ReadState>(out[i].item.state);
    if (state != ReadState::kFound && state != ReadState::kNotFound && state != ReadState::kBusy) {
      return Status::Protocol(r.Name() + ": item " + std::to_string(i) + " has unknown state " +
                              std::to_string(out[i].item.state));
    }
    if (state != ReadState::kFound && out[i].item.value_size != 0) {
      return Status::Protocol(r.Name() + ": item " + std::to_string(i) + " has a value but no row");
    }
    FARPOOL_RETURN_IF_ERROR(r.TakeBytes(out[i].item.value_size, &out[i].value, i));
  }
  FARPOOL_RETURN_IF_ERROR(r.Done());
  return out;
}

Result<std::vector<WriteValue>> ParseWriteItems(const Message& m) {
  auto body = m.As<PrepareRequest>();
  Reader r(m);
  FARPOOL_RETURN_IF_ERROR(r.CheckCount(body.count, sizeof(WriteItem)));
  std::vector<WriteValue> out(body.count);
  for (uint32_t i = 0; i < body.count; ++i) {
    FARPOOL_RETURN_IF_ERROR(r.Take(&out[i].item, i));
    const auto op = static_cast<WriteOp>(out[i].item.op);
    if (op != WriteOp::kPut && op != WriteOp::kDelete) {
      return Status::Protocol(r.Name() + ": item " + std::to_string(i) + " has unknown op " +
                              std::to_string(out[i].item.op));
    }
    if (op == WriteOp::kDelete && out[i].item.value_size != 0) {
      return Status::Protocol(r.Name() + ": item " + std::to_string(i) + " deletes with a value");
    }
    FARPOOL_RETURN_IF_ERROR(r.TakeBytes(out[i].item.value_size, &out[i].value, i));
  }
  FARPOOL_RETURN_IF_ERROR(r.Done());
  return out;
}

Result<std::vector<std::string>> ParseNames(const Message& m) {
  auto body = m.As<ListTablesReply>();
  Reader r(m);
  FARPOOL_RETURN_IF_ERROR(r.CheckCount(body.count, kNameSize));
  std::vector<std::string> out;
  for (uint32_t i = 0; i < body.count; ++i) {
    NameRequest n;
    FARPOOL_RETURN_IF_ERROR(r.Take(&n, i));
    FARPOOL_ASSIGN_OR_RETURN(std::string name, NameOf(n.name));
    out.push_back(std::move(name));
  }
  FARPOOL_RETURN_IF_ERROR(r.Done());
  return out;
}

Result<std::vector<uint64_t>> ParseHolders(const Message& m) {
  auto body = m.As<LockedReply>();
  Reader r(m);
  FARPOOL_RETURN_IF_ERROR(r.CheckCount(body.count, sizeof(uint64_t)));
  std::vector<uint64_t> out(body.count);
  for (uint32_t i = 0; i < body.count; ++i) FARPOOL_RETURN_IF_ERROR(r.Take(&out[i], i));
  FARPOOL_RETURN_IF_ERROR(r.Done());
  return out;
}

Result<std::string> NameOf(const char (&field)[kNameSize]) {
  const size_t n = strnlen(field, kNameSize);
  if (n == 0 || n == kNameSize) {
    return Status::Protocol("table name field is empty or not zero-terminated");
  }
  return std::string(field, n);
}

}  // namespace farpool::db::shard
