#include "pool/server/backup_link.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "common/far_copy.h"

namespace farpool {

using Clock = std::chrono::steady_clock;

Result<std::unique_ptr<BackupLink>> BackupLink::Connect(const Target& backup, uint16_t primary_id,
                                                        uint64_t region_size,
                                                        const transport::ClusterSecret* secret,
                                                        Fabric fabric,
                                                        std::chrono::milliseconds timeout,
                                                        const SharedFile* share) {
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
  wire::ReplicateRequest attach{primary_id, backup.slot, 0, 0, wire::kReplicateAttach};
  if (share != nullptr) {
    attach.flags |= wire::kReplicateShare;
    attach.share_pid = share->pid;
    attach.share_start_time = share->start_time;
    attach.share_inode = share->inode;
    attach.share_fd = share->fd;
  }
  FARPOOL_RETURN_IF_ERROR(link->mirror_
                              ->Call([&](uint64_t id) { return wire::Encode(id, attach); },
                                     wire::Opcode::kReplicateReply)
                              .status());
  return link;
}

Status BackupLink::Detach() {
  pending_ = Pending{};
  wire::ReplicateRequest detach{primary_id_, slot_, 0, 0, wire::kReplicateDetach};
  return mirror_->Send(wire::Encode(mirror_->NextId(), detach))
      .WithContext("telling " + name_ + " that its copy is given up");
}

namespace {

// Sorted and merged: a word written by several requests or rounds goes once.
std::vector<memory_ops::Range> Merged(std::vector<memory_ops::Range> ranges) {
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
  return merged;
}

}  // namespace

uint64_t BackupLink::Post(const std::byte* region, std::span<const memory_ops::Range> changed,
                          std::span<const LeaseChange> leases,
                          const std::function<bool()>& give_up) {
  region_ = region;
  const uint64_t ticket = ++posted_;
  pending_.any = true;
  pending_.ticket = ticket;
  pending_.ranges.insert(pending_.ranges.end(), changed.begin(), changed.end());
  pending_.leases.insert(pending_.leases.end(), leases.begin(), leases.end());
  for (const memory_ops::Range& r : changed) pending_.bytes += r.size;
  if (pending_.bytes > kMaxPendingBytes) {
    pending_.ranges = Merged(std::move(pending_.ranges));  // a round's ranges repeat rounds'
    pending_.bytes = 0;
    for (const memory_ops::Range& r : pending_.ranges) pending_.bytes += r.size;
  }
  const auto spin_until = Clock::now() + std::chrono::microseconds(20);
  while (in_flight_.size() >= kMaxInFlight && pending_.any && pending_.bytes > kMaxPendingBytes) {
    if (give_up && give_up()) return ticket;
    Poll();
    if (in_flight_.size() >= kMaxInFlight) Wait(spin_until);
  }
  if (pending_.any && in_flight_.size() < kMaxInFlight) SendPending();
  return ticket;
}

void BackupLink::SendPending() {
  Flight f;
  f.ticket = pending_.ticket;
  f.ranges = Merged(std::move(pending_.ranges));
  const std::vector<LeaseChange> leases = std::move(pending_.leases);
  pending_ = Pending{};
  for (const LeaseChange& l : leases) {
    if (l.kind == wire::kMirrorLeaseRoot) f.roots.push_back(l);
  }
  std::vector<std::vector<std::byte>> messages;
  memory_ops::RequestBuilder request;
  std::vector<std::byte> bytes;
  auto flush = [&] {
    if (request.empty()) return;
    messages.push_back(
        wire::Encode(mirror_->NextId(),
                     wire::ReplicateRequest{primary_id_, slot_, request.op_count(),
                                            static_cast<uint32_t>(request.bytes().size()), 0},
                     request.bytes()));
    f.expected.push_back(wire::Opcode::kReplicateReply);
    request.Clear();
  };
  for (const memory_ops::Range& r : f.ranges) {
    for (uint64_t done = 0; done < r.size;) {
      const auto piece =
          static_cast<uint32_t>(std::min(r.size - done, memory_ops::kMaxInlineBytes));
      if (!request.Fits(memory_ops::OpKind::kWrite, piece)) flush();
      bytes.resize(piece);
      FarRead(bytes.data(), region_ + r.offset + done, piece);
      request.Write(r.offset + done, bytes.data(), piece);
      done += piece;
    }
  }
  flush();
  if (messages.empty() && leases.empty()) {
    // Nothing changed: an empty forward renews the primary's lease (mirror.h).
    messages.push_back(
        wire::Encode(mirror_->NextId(), wire::ReplicateRequest{primary_id_, slot_, 0, 0, 0}));
    f.expected.push_back(wire::Opcode::kReplicateReply);
  }
  for (const LeaseChange& l : leases) {
    messages.push_back(wire::Encode(
        mirror_->NextId(), wire::MirrorLeaseRequest{l.offset, l.size, primary_id_, l.kind,
                                                    static_cast<uint8_t>(slot_), l.owner}));
    f.expected.push_back(wire::Opcode::kMirrorLeaseReply);
  }
  f.sent = Clock::now();
  f.deadline = f.sent + mirror_->timeout();
  for (const std::vector<std::byte>& m : messages) {
    f.ids.push_back(*transport::RequestIdOf(m));
    // A send that fails (the connection is lost) leaves the forward to fail at its deadline:
    // until then the backup may still be declared gone, and the forward's rounds then stand.
    Status sent = mirror_->Send(m);
    (void)sent;
  }
  in_flight_.push_back(std::move(f));
}

void BackupLink::Poll() {
  if (in_flight_.empty()) {
    if (pending_.any) SendPending();
    return;
  }
  mirror_->Progress();
  mirror_->DropRepliesBelow(first_live_id_);
  while (!in_flight_.empty()) {
    Flight& f = in_flight_.front();
    while (f.replied < f.ids.size()) {
      auto r = mirror_->Take(f.ids[f.replied], f.expected[f.replied]);
      if (!r) break;
      if (!r->ok()) return Fail(r->status(), /*refused=*/true);
      ++f.replied;
    }
    if (f.replied < f.ids.size()) {
      if (Clock::now() <= f.deadline) break;
      return Fail(mirror_->failed()
                      ? Status::Unavailable(name_ + ": connection lost")
                      : Status::TimedOut(name_ + ": a forward was not acknowledged within " +
                                         std::to_string(mirror_->timeout().count()) + " ms"),
                  /*refused=*/false);
    }
    settled_ = f.ticket;
    acknowledged_sent_ = f.sent;
    in_flight_.pop_front();
  }
  if (pending_.any && in_flight_.size() < kMaxInFlight) SendPending();
}

void BackupLink::Fail(const Status& why, bool refused) {
  failures_.push_back({settled_ + 1, posted_, why});
  if (refused && why.code() == StatusCode::kNotFound) misplaced_ = true;
  std::vector<memory_ops::Range> again = std::move(pending_.ranges);
  std::vector<LeaseChange> roots;  // resent: a later hello shows a root that exists here
  for (const LeaseChange& l : pending_.leases) {
    if (l.kind == wire::kMirrorLeaseRoot) roots.push_back(l);
  }
  for (Flight& f : in_flight_) {
    again.insert(again.end(), f.ranges.begin(), f.ranges.end());
    roots.insert(roots.end(), f.roots.begin(), f.roots.end());
  }
  in_flight_.clear();
  pending_ = Pending{};
  first_live_id_ = mirror_->NextId();  // replies still to come for the failed ones: dropped
  settled_ = posted_;                  // settled: failed
  // Roots go again only after a forward that may not have arrived: one the mirror refused
  // would be refused again, failing every round until the serving lease lapses.
  if (refused) roots.clear();
  if (why.code() != StatusCode::kPermissionDenied && (!again.empty() || !roots.empty())) {
    Post(region_, again, roots, nullptr);
  }
}

void BackupLink::Wait(Clock::time_point spin_until) {
  if (Clock::now() < spin_until) return;
  // Polls for a short while, then sleeps on the worker: on a host with fewer cores than busy
  // threads, a waiter that keeps polling takes the core the backup needs.
  Status waited = mirror_->worker().Wait(std::chrono::milliseconds(1));
  (void)waited;  // a failed wait only means we poll again sooner
}

Status BackupLink::Forward(const std::byte* region, std::span<const memory_ops::Range> changed,
                           std::span<const LeaseChange> leases,
                           const std::function<bool()>& give_up) {
  const size_t failed_before = failures_.size();
  const uint64_t ticket = Post(region, changed, leases, give_up);
  const auto spin_until = Clock::now() + std::chrono::microseconds(20);
  for (;;) {
    for (size_t i = failed_before; i < failures_.size(); ++i) {
      if (failures_[i].from <= ticket && ticket <= failures_[i].through) return failures_[i].why;
    }
    if (settled_ >= ticket) return Status::Ok();
    if (give_up && give_up()) return Status::Aborted(name_ + ": given up");
    Poll();
    if (settled_ < ticket) Wait(spin_until);
  }
}

}  // namespace farpool
