#include "pool/server/backup_link.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/far_copy.h"

namespace farpool {

using Clock = std::chrono::steady_clock;

Result<std::unique_ptr<BackupLink>> BackupLink::Connect(const Target& backup, uint16_t primary_id,
                                                        uint64_t region_size,
                                                        const transport::ClusterSecret* secret,
                                                        Fabric fabric,
                                                        std::chrono::milliseconds timeout) {
  std::unique_ptr<BackupLink> link(new BackupLink());
  link->name_ = "backup server " + std::to_string(backup.id) + " (" + backup.host + ":" +
                std::to_string(backup.port) + ")";
  link->primary_id_ = primary_id;
  link->id_ = backup.id;
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  std::random_device rd;
  hello.client_nonce = (uint64_t{rd()} << 32) | rd() | 1;  // the low 32 bits, a tag, nonzero
  // TCP even on one host: a backup learns that its primary's process is gone from the closed
  // socket at once (UCX's shared-memory lanes notice it only by keepalive), and promotes then.
  (void)fabric;
  control::Connection::Options o{link->name_, backup.host,  backup.port,
                                 secret,      Fabric::kTcp, timeout};
  FARPOOL_ASSIGN_OR_RETURN(auto server, control::Connection::Open(o, hello));
  const wire::HelloReply& h = server->hello();
  if (h.server_id != backup.id) {
    return Status::InvalidArgument(link->name_ + ": it says it is server " +
                                   std::to_string(h.server_id));
  }
  if (h.mirror_port == 0) {
    return Status::InvalidArgument(link->name_ +
                                   ": it mirrors nobody (start it with --mirror-slots)");
  }
  o.port = h.mirror_port;
  FARPOOL_ASSIGN_OR_RETURN(link->mirror_, control::Connection::Open(o, hello));
  const wire::HelloReply& m = link->mirror_->hello();
  if (m.region_size < region_size) {
    return Status::InvalidArgument(
        link->name_ + ": its mirror slots (" + std::to_string(m.region_size) +
        " bytes) cannot hold this server's region of " + std::to_string(region_size) + " bytes");
  }
  link->slot_ = backup.slot;
  FARPOOL_RETURN_IF_ERROR(link->mirror_
                              ->Call(
                                  [&](uint64_t id) {
                                    return wire::Encode(
                                        id, wire::ReplicateRequest{primary_id, backup.slot, 0, 0,
                                                                   wire::kReplicateAttach});
                                  },
                                  wire::Opcode::kReplicateReply)
                              .status());
  return link;
}

Status BackupLink::Forward(const std::byte* region, std::span<const memory_ops::Range> changed,
                           std::span<const LeaseChange> leases,
                           const std::function<bool()>& give_up) {
  // Sorted and merged: a word written by several requests of the round goes once.
  std::vector<memory_ops::Range> ranges(changed.begin(), changed.end());
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<memory_ops::Range> merged;
  for (const memory_ops::Range& r : ranges) {
    if (!merged.empty() && r.offset <= merged.back().offset + merged.back().size) {
      const uint64_t end = std::max(merged.back().offset + merged.back().size, r.offset + r.size);
      merged.back().size = end - merged.back().offset;
    } else {
      merged.push_back(r);
    }
  }
  std::vector<std::vector<std::byte>> messages;
  std::vector<wire::Opcode> expected;
  memory_ops::RequestBuilder request;
  std::vector<std::byte> bytes;
  auto flush = [&] {
    if (request.empty()) return;
    messages.push_back(
        wire::Encode(mirror_->NextId(),
                     wire::ReplicateRequest{primary_id_, slot_, request.op_count(),
                                            static_cast<uint32_t>(request.bytes().size()), 0},
                     request.bytes()));
    expected.push_back(wire::Opcode::kReplicateReply);
    request.Clear();
  };
  for (const memory_ops::Range& r : merged) {
    for (uint64_t done = 0; done < r.size;) {
      const auto piece =
          static_cast<uint32_t>(std::min(r.size - done, memory_ops::kMaxInlineBytes));
      if (!request.Fits(memory_ops::OpKind::kWrite, piece)) flush();
      bytes.resize(piece);
      FarRead(bytes.data(), region + r.offset + done, piece);
      request.Write(r.offset + done, bytes.data(), piece);
      done += piece;
    }
  }
  flush();
  if (messages.empty() && leases.empty()) {
    // Nothing changed: an empty forward renews the primary's lease (mirror.h).
    messages.push_back(
        wire::Encode(mirror_->NextId(), wire::ReplicateRequest{primary_id_, slot_, 0, 0, 0}));
    expected.push_back(wire::Opcode::kReplicateReply);
  }
  for (const LeaseChange& l : leases) {
    messages.push_back(
        wire::Encode(mirror_->NextId(),
                     wire::MirrorLeaseRequest{l.offset, l.size, primary_id_,
                                              static_cast<uint16_t>(l.leased ? 1 : 0), slot_, 0}));
    expected.push_back(wire::Opcode::kMirrorLeaseReply);
  }
  const auto deadline = Clock::now() + mirror_->timeout();
  std::vector<uint64_t> ids;
  for (const std::vector<std::byte>& m : messages) {
    ids.push_back(*transport::RequestIdOf(m));
    FARPOOL_RETURN_IF_ERROR(mirror_->Send(m));
  }
  Status first = Status::Ok();
  for (size_t i = 0; i < ids.size(); ++i) {
    auto r = mirror_->Await(ids[i], expected[i], deadline, give_up);
    if (!r.ok() && (r.status().code() == StatusCode::kUnavailable ||
                    r.status().code() == StatusCode::kTimedOut)) {
      return r.status();
    }
    if (!r.ok() && first.ok()) first = r.status();
  }
  return first;
}

}  // namespace farpool
