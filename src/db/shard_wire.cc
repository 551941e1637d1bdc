#include "db/shard_wire.h"

#include <cstring>

namespace farpool::db::shard {
namespace {

using transport::BodyLayout;
using transport::FixedBody;
using transport::ItemsTail;

std::optional<BodyLayout> LayoutOf(uint16_t op) {
  switch (static_cast<Opcode>(op)) {
    case Opcode::kErrorReply:
      return transport::kErrorLayout;
    case Opcode::kBeginRequest:
      return FixedBody(sizeof(BeginRequest));
    case Opcode::kBeginReply:
      return FixedBody(sizeof(BeginReply));
    case Opcode::kReadRequest:
      return ItemsTail(sizeof(ReadRequest));
    case Opcode::kReadReply:
      return ItemsTail(sizeof(ReadReply));
    case Opcode::kScanRequest:
      return FixedBody(sizeof(ScanRequest));
    case Opcode::kScanReply:
      return ItemsTail(sizeof(ReadReply));
    case Opcode::kPrepareRequest:
      return ItemsTail(sizeof(PrepareRequest));
    case Opcode::kPrepareReply:
      return FixedBody(sizeof(PrepareReply));
    case Opcode::kDecideRequest:
      return FixedBody(sizeof(DecideRequest));
    case Opcode::kDecideReply:
      return FixedBody(sizeof(DecideReply));
    case Opcode::kResolveRequest:
      return FixedBody(sizeof(ResolveRequest));
    case Opcode::kResolveReply:
      return FixedBody(sizeof(ResolveReply));
    case Opcode::kCommitRequest:
      return FixedBody(sizeof(CommitRequest));
    case Opcode::kCommitReply:
      return FixedBody(sizeof(CommitReply));
    case Opcode::kCreateTableRequest:
      return FixedBody(sizeof(TableDesc));
    case Opcode::kTableReply:
      return FixedBody(sizeof(TableDesc));
    case Opcode::kOpenTableRequest:
      return FixedBody(sizeof(NameRequest));
    case Opcode::kDropTableRequest:
      return FixedBody(sizeof(NameRequest));
    case Opcode::kDropTableReply:
      return FixedBody(sizeof(DropTableReply));
    case Opcode::kListTablesRequest:
      return FixedBody(sizeof(ListTablesRequest));
    case Opcode::kListTablesReply:
      return ItemsTail(sizeof(ListTablesReply));
    case Opcode::kLockedRequest:
      return FixedBody(sizeof(LockedRequest));
    case Opcode::kLockedReply:
      return ItemsTail(sizeof(LockedReply));
  }
  return std::nullopt;
}

std::string_view OpcodeNameOf(uint16_t op) { return OpcodeName(static_cast<Opcode>(op)); }

constexpr transport::FrameFormat kFormat{"shard",   kMagic,
                                         kVersion,  static_cast<uint16_t>(Opcode::kErrorReply),
                                         &LayoutOf, &OpcodeNameOf};

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

const transport::FrameFormat& Format() { return kFormat; }

Result<Message> Decode(std::span<const std::byte> bytes) {
  return transport::DecodeMessage<Opcode>(kFormat, bytes);
}

std::vector<std::byte> EncodeError(uint64_t request_id, const Status& status) {
  return transport::EncodeErrorFrame(kFormat, request_id, status);
}

Status DecodeError(const Message& m) { return transport::DecodeErrorFrame(m); }

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
