#include "transport/wire.h"

namespace farpool::wire {
namespace {

using transport::BodyLayout;
using transport::DeclaredTail;
using transport::FixedBody;

std::optional<BodyLayout> LayoutOf(uint16_t opcode) {
  switch (static_cast<Opcode>(opcode)) {
    case Opcode::kHelloRequest:
      return FixedBody(sizeof(HelloRequest));
    case Opcode::kHelloReply:
      return DeclaredTail(sizeof(HelloReply), offsetof(HelloReply, rkey_size));
    case Opcode::kLeaseRequest:
      return FixedBody(sizeof(LeaseRequest));
    case Opcode::kLeaseReply:
      return FixedBody(sizeof(LeaseReply));
    case Opcode::kReleaseRequest:
      return FixedBody(sizeof(ReleaseRequest));
    case Opcode::kReleaseReply:
      return FixedBody(sizeof(ReleaseReply));
    case Opcode::kStatsRequest:
      return FixedBody(sizeof(StatsRequest));
    case Opcode::kStatsReply:
      return FixedBody(sizeof(StatsReply));
    case Opcode::kErrorReply:
      return transport::kErrorLayout;
    case Opcode::kBatchRequest:
      return DeclaredTail(sizeof(BatchRequest), offsetof(BatchRequest, ops_size), kMaxBatchTail);
    case Opcode::kBatchReply:
      return DeclaredTail(sizeof(BatchReply), offsetof(BatchReply, results_size), kMaxBatchTail);
    case Opcode::kEvictRequest:
      return FixedBody(sizeof(EvictRequest));
    case Opcode::kEvictReply:
      return FixedBody(sizeof(EvictReply));
    case Opcode::kGoodbyeRequest:
      return FixedBody(sizeof(GoodbyeRequest));
    case Opcode::kGoodbyeReply:
      return FixedBody(sizeof(GoodbyeReply));
    case Opcode::kChallengeRequest:
      return FixedBody(sizeof(ChallengeRequest));
    case Opcode::kChallengeReply:
      return FixedBody(sizeof(ChallengeReply));
    case Opcode::kBackupRequest:
      return DeclaredTail(sizeof(BackupRequest), offsetof(BackupRequest, backups_size));
    case Opcode::kBackupReply:
      return FixedBody(sizeof(BackupReply));
    case Opcode::kReplicateRequest:
      return DeclaredTail(sizeof(ReplicateRequest), offsetof(ReplicateRequest, ops_size),
                          kMaxBatchTail);
    case Opcode::kReplicateReply:
      return FixedBody(sizeof(ReplicateReply));
    case Opcode::kMirrorLeaseRequest:
      return FixedBody(sizeof(MirrorLeaseRequest));
    case Opcode::kMirrorLeaseReply:
      return FixedBody(sizeof(MirrorLeaseReply));
    case Opcode::kPromoteRequest:
      return FixedBody(sizeof(PromoteRequest));
    case Opcode::kPromoteReply:
      return FixedBody(sizeof(PromoteReply));
    case Opcode::kDegradeRequest:
      return FixedBody(sizeof(DegradeRequest));
    case Opcode::kDegradeReply:
      return FixedBody(sizeof(DegradeReply));
    case Opcode::kMovingReply:
      return FixedBody(sizeof(MovingReply));
    case Opcode::kMovedFileRequest:
      return FixedBody(sizeof(MovedFileRequest));
    case Opcode::kMovedFileReply:
      return FixedBody(sizeof(MovedFileReply));
  }
  return std::nullopt;
}

std::string_view OpcodeNameOf(uint16_t opcode) { return OpcodeName(static_cast<Opcode>(opcode)); }

constexpr transport::FrameFormat kFormat{"control", kMagic,
                                         kVersion,  static_cast<uint16_t>(Opcode::kErrorReply),
                                         &LayoutOf, &OpcodeNameOf};

}  // namespace

template <typename Body>
Opcode OpcodeOf();

Result<BackupRequest> MakeBackupRequest(uint16_t backup_id, std::string_view host, uint16_t port,
                                        uint16_t region, uint16_t slot, int64_t term,
                                        std::span<const MapBackup> backups) {
  BackupRequest request{};
  if (host.size() >= sizeof(request.host)) {
    return Status::InvalidArgument("host name too long: " + std::string(host));
  }
  if (backups.size_bytes() > transport::kMaxDeclaredTail) {
    return Status::InvalidArgument("a BackupRequest carries at most " +
                                   std::to_string(transport::kMaxDeclaredTail / sizeof(MapBackup)) +
                                   " backups of a region, not " + std::to_string(backups.size()));
  }
  request.backup_id = backup_id;
  request.port = port;
  request.slot = slot;
  request.region = region;
  std::memcpy(request.host, host.data(), host.size());
  request.term = term;
  request.backups_size = static_cast<uint32_t>(backups.size_bytes());
  return request;
}

std::vector<std::byte> EncodeBackupRequest(uint64_t request_id, BackupRequest request,
                                           std::span<const MapBackup> backups) {
  request.backups_size = static_cast<uint32_t>(backups.size_bytes());  // the tail sent
  return Encode(request_id, request, std::as_bytes(backups));
}

Result<std::vector<MapBackup>> MapBackupsOf(const transport::Frame& request) {
  if (request.tail.size() % sizeof(MapBackup) != 0) {
    return Status::InvalidArgument(
        "BackupRequest: its map's backups take " + std::to_string(request.tail.size()) +
        " bytes, not a multiple of " + std::to_string(sizeof(MapBackup)));
  }
  std::vector<MapBackup> backups(request.tail.size() / sizeof(MapBackup));
  if (!backups.empty()) std::memcpy(backups.data(), request.tail.data(), request.tail.size());
  return backups;
}

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
    case Opcode::kEvictRequest:
      return "EvictRequest";
    case Opcode::kEvictReply:
      return "EvictReply";
    case Opcode::kGoodbyeRequest:
      return "GoodbyeRequest";
    case Opcode::kGoodbyeReply:
      return "GoodbyeReply";
    case Opcode::kChallengeRequest:
      return "ChallengeRequest";
    case Opcode::kChallengeReply:
      return "ChallengeReply";
    case Opcode::kBackupRequest:
      return "BackupRequest";
    case Opcode::kBackupReply:
      return "BackupReply";
    case Opcode::kReplicateRequest:
      return "ReplicateRequest";
    case Opcode::kReplicateReply:
      return "ReplicateReply";
    case Opcode::kMirrorLeaseRequest:
      return "MirrorLeaseRequest";
    case Opcode::kMirrorLeaseReply:
      return "MirrorLeaseReply";
    case Opcode::kPromoteRequest:
      return "PromoteRequest";
    case Opcode::kPromoteReply:
      return "PromoteReply";
    case Opcode::kDegradeRequest:
      return "DegradeRequest";
    case Opcode::kDegradeReply:
      return "DegradeReply";
    case Opcode::kMovingReply:
      return "MovingReply";
    case Opcode::kMovedFileRequest:
      return "MovedFileRequest";
    case Opcode::kMovedFileReply:
      return "MovedFileReply";
  }
  return "Unknown";
}

std::string HelloMapRefusal(uint16_t flags) {
  if (flags & kHelloMayMap) return "";
  std::string why;
  auto add = [&](uint16_t bit, const char* text) {
    if (!(flags & bit)) return;
    if (!why.empty()) why += "; ";
    why += text;
  };
  add(kHelloOtherBoot, "the server runs on another host or boot (boot ids differ)");
  add(kHelloNoPidfd, "the server cannot open a pidfd for this process (another pid namespace?)");
  add(kHelloStartMismatch, "this pid is another process for the server (start times differ)");
  add(kHelloNoSignal, "the server may not signal this process (another user?)");
  add(kHelloPinRefused, "the server has this process tag pinned to another pid");
  return why.empty() ? "the server did not pin this process" : why;
}

Result<Message> Decode(std::span<const std::byte> bytes) {
  return transport::DecodeMessage<Opcode>(kFormat, bytes);
}

template <typename Body>
std::vector<std::byte> Encode(uint64_t request_id, const Body& body,
                              std::span<const std::byte> tail) {
  return transport::EncodeFrame(kFormat, request_id, static_cast<uint16_t>(OpcodeOf<Body>()),
                                transport::BodyBytes(body), tail);
}

#define FARPOOL_WIRE_BODY(Type) \
  template <>                   \
  Opcode OpcodeOf<Type>() {     \
    return Opcode::k##Type;     \
  }                             \
  template std::vector<std::byte> Encode<Type>(uint64_t, const Type&, std::span<const std::byte>);

FARPOOL_WIRE_BODY(HelloRequest)
FARPOOL_WIRE_BODY(HelloReply)
FARPOOL_WIRE_BODY(LeaseRequest)
FARPOOL_WIRE_BODY(LeaseReply)
FARPOOL_WIRE_BODY(ReleaseRequest)
FARPOOL_WIRE_BODY(ReleaseReply)
FARPOOL_WIRE_BODY(StatsRequest)
FARPOOL_WIRE_BODY(StatsReply)
FARPOOL_WIRE_BODY(BatchRequest)
FARPOOL_WIRE_BODY(BatchReply)
FARPOOL_WIRE_BODY(EvictRequest)
FARPOOL_WIRE_BODY(EvictReply)
FARPOOL_WIRE_BODY(GoodbyeRequest)
FARPOOL_WIRE_BODY(GoodbyeReply)
FARPOOL_WIRE_BODY(ChallengeRequest)
FARPOOL_WIRE_BODY(ChallengeReply)
FARPOOL_WIRE_BODY(BackupRequest)
FARPOOL_WIRE_BODY(BackupReply)
FARPOOL_WIRE_BODY(ReplicateRequest)
FARPOOL_WIRE_BODY(ReplicateReply)
FARPOOL_WIRE_BODY(MirrorLeaseRequest)
FARPOOL_WIRE_BODY(MirrorLeaseReply)
FARPOOL_WIRE_BODY(PromoteRequest)
FARPOOL_WIRE_BODY(PromoteReply)
FARPOOL_WIRE_BODY(DegradeRequest)
FARPOOL_WIRE_BODY(DegradeReply)
FARPOOL_WIRE_BODY(MovingReply)
FARPOOL_WIRE_BODY(MovedFileRequest)
FARPOOL_WIRE_BODY(MovedFileReply)
#undef FARPOOL_WIRE_BODY

std::vector<std::byte> EncodeError(uint64_t request_id, const Status& status) {
  return transport::EncodeErrorFrame(kFormat, request_id, status);
}

Status DecodeError(const Message& message) { return transport::DecodeErrorFrame(message); }

}  // namespace farpool::wire
