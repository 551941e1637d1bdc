#include "pool/server/mirror.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "pool/memory_ops.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool {

Status Mirror::Start(const std::string& host, Fabric fabric, const std::string& name) {
  name_ = name + " mirror of server " + std::to_string(primary_id_);
  transport::AmServerOptions ao;
  ao.host = host;
  ao.am_id = transport::kControlAm;
  ao.progress = ProgressMode::kEvent;  // forwards come in bursts; an idle mirror sleeps
  // At once, no spin: the primary no longer waits with its loop for the acknowledgement, and
  // on a host with few cores a spinning mirror took the core its primary and clients needed
  // (docs/pool.md "Pipelined forwards": measured with a 50 µs spin before).
  ao.event_spin = std::chrono::microseconds(0);
  ao.fabric = fabric;
  FARPOOL_ASSIGN_OR_RETURN(am_, transport::AmServer::Listen(ao));
  am_->Start(*this);
  return Status::Ok();
}

Result<wire::PromoteReply> Mirror::Promote(bool primary_connected) {
  const auto since = std::chrono::steady_clock::now() - last_contact_;
  std::lock_guard lock(mu_);
  if (!promoted_ && primary_connected && since < kServeLease + kLeaseMargin) {
    return Status::Aborted(
        name_ + ": not yet: server " + std::to_string(primary_id_) + " renewed its lease " +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(since).count()) +
        " ms ago and may serve until it lapses; ask again");
  }
  if (!promoted_) {
    std::fprintf(stderr, "%s: taking server %d's data over\n", name_.c_str(), primary_id_);
  }
  promoted_ = true;
  return wire::PromoteReply{book_.leased()};
}

bool Mirror::promoted() const {
  std::lock_guard lock(mu_);
  return promoted_;
}

ChunkAllocator::Access Mirror::Check(uint64_t offset, uint64_t size, uint32_t owner) const {
  std::lock_guard lock(mu_);
  return promoted_ ? book_.Check(offset, size, owner) : ChunkAllocator::Access::kOutside;
}

std::optional<uint64_t> Mirror::RootOf(uint32_t owner) const {
  std::lock_guard lock(mu_);
  return book_.RootOf(owner);
}

Result<uint64_t> Mirror::Lease(uint64_t size, uint32_t owner) {
  std::lock_guard lock(mu_);
  if (!promoted_) return NotPromoted();
  return book_.Lease(size, owner);
}

Status Mirror::Release(uint64_t offset, uint64_t size, uint32_t owner) {
  std::lock_guard lock(mu_);
  if (!promoted_) return NotPromoted();
  return book_.Release(offset, size, owner);
}

Status Mirror::NotPromoted() const {
  return Status::InvalidArgument(name_ + ": server " + std::to_string(primary_id_) +
                                 " has not been failed over to this server (PromoteRequest)");
}

Status Mirror::AdmitForward(uint16_t primary_id, uint64_t id, const transport::Peer* from) {
  if (primary_id != primary_id_) {
    return Status::InvalidArgument(name_ + ": a forward from server " + std::to_string(primary_id) +
                                   ", not from its primary");
  }
  if (promoted_) return Fenced();
  const uint64_t connection = from == nullptr ? 0 : from->id;
  if (connection == forward_connection_ && id <= forward_id_) {
    return Status::Protocol(name_ + ": forward " + std::to_string(id) + " arrived after forward " +
                            std::to_string(forward_id_) + ": out of order, not applied");
  }
  forward_connection_ = connection;
  forward_id_ = id;
  if (from != nullptr) primary_tag_ = from->tag;
  last_contact_ = std::chrono::steady_clock::now();
  return Status::Ok();
}

Status Mirror::Fenced() const {
  return Status::PermissionDenied(
      name_ + ": fenced: this server has taken server " + std::to_string(primary_id_) +
      "'s data over (a client found it gone) and takes no more of its forwards");
}

std::vector<std::byte> Mirror::Refuse(const Status& reason) {
  return wire::EncodeError(0, reason.WithContext(name_));
}

std::vector<std::byte> Mirror::Handle(std::span<const std::byte> bytes, transport::Peer* from) {
  auto reply = Answer(bytes, from);
  if (reply.ok()) return std::move(*reply);
  return wire::EncodeError(transport::RequestIdOf(bytes).value_or(0), reply.status());
}

Result<std::vector<std::byte>> Mirror::Answer(std::span<const std::byte> bytes,
                                              transport::Peer* from) {
  FARPOOL_ASSIGN_OR_RETURN(wire::Message m, wire::Decode(bytes));
  const uint64_t id = m.header.request_id;
  FARPOOL_RETURN_IF_ERROR(auth_.Admit(m.opcode, from));
  // A pool's client may ask for a promotion (it found the primary gone), nothing else here:
  // forwards and degrades are the cluster's own servers' and tools'.
  if (from != nullptr && from->pool != 0 && m.opcode != wire::Opcode::kChallengeRequest &&
      m.opcode != wire::Opcode::kHelloRequest && m.opcode != wire::Opcode::kPromoteRequest) {
    return Status::PermissionDenied(name_ + ": pool '" + from->pool_name +
                                    "': " + std::string(wire::OpcodeName(m.opcode)) +
                                    " refused: only the cluster's own servers send it");
  }
  switch (m.opcode) {
    case wire::Opcode::kChallengeRequest: {
      FARPOOL_ASSIGN_OR_RETURN(wire::ChallengeReply r,
                               auth_.Challenge(m.As<wire::ChallengeRequest>(), from));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kHelloRequest: {
      wire::HelloReply r{};
      FARPOOL_RETURN_IF_ERROR(auth_.Hello(m.As<wire::HelloRequest>(), from, r));
      if (from != nullptr)
        from->tag = static_cast<uint32_t>(m.As<wire::HelloRequest>().client_nonce);
      r.server_pid = static_cast<uint64_t>(getpid());
      r.mirror_of = primary_id_;
      r.region_size = size_;
      return wire::Encode(id, r);
    }
    case wire::Opcode::kReplicateRequest: {
      const auto req = m.As<wire::ReplicateRequest>();
      std::lock_guard lock(mu_);
      FARPOOL_RETURN_IF_ERROR(AdmitForward(req.primary_id, id, from));
      std::vector<memory_ops::Range> written;
      memory_ops::Region region{memory_,     size_,    [](uint64_t, uint64_t) { return true; },
                                primary_id_, &written, /*writes_only=*/true};
      FARPOOL_RETURN_IF_ERROR(
          memory_ops::Execute(req.op_count, m.tail, region).status().WithContext(name_));
      uint64_t applied = 0;
      for (const memory_ops::Range& r : written) applied += r.size;
      return wire::Encode(id, wire::ReplicateReply{applied});
    }
    case wire::Opcode::kMirrorLeaseRequest: {
      const auto req = m.As<wire::MirrorLeaseRequest>();
      std::lock_guard lock(mu_);
      FARPOOL_RETURN_IF_ERROR(AdmitForward(req.primary_id, id, from));
      FARPOOL_RETURN_IF_ERROR((req.leased != wire::kMirrorRelease
                                   ? book_.LeaseAt(req.offset, req.size, req.owner,
                                                   req.leased == wire::kMirrorLeaseRoot)
                                   : book_.Release(req.offset, req.size, req.owner))
                                  .WithContext(name_));
      return wire::Encode(id, wire::MirrorLeaseReply{0});
    }
    case wire::Opcode::kPromoteRequest: {
      if (m.As<wire::PromoteRequest>().id != primary_id_) {
        return Status::InvalidArgument(name_ + ": cannot take server " +
                                       std::to_string(m.As<wire::PromoteRequest>().id) +
                                       "'s data over: it does not mirror it");
      }
      const auto tags = am_->tags();
      const bool connected =
          primary_tag_ != 0 && std::find(tags.begin(), tags.end(), primary_tag_) != tags.end();
      FARPOOL_ASSIGN_OR_RETURN(wire::PromoteReply r, Promote(connected));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kDegradeRequest:
      on_degrade_(m.As<wire::DegradeRequest>().backup_id);
      return wire::Encode(id, wire::DegradeReply{0});
    default:
      return Status::InvalidArgument(name_ + ": " + std::string(wire::OpcodeName(m.opcode)) +
                                     " is not served on a mirror's port (a primary's "
                                     "forwards and degrades are)");
  }
}

}  // namespace farpool
