#include "pool/server/mirror.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/host.h"
#include "common/units.h"
#include "pool/memory_ops.h"
#include "pool/server/coordinator.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool {

Mirror::Mirror(std::optional<uint16_t> first, uint32_t slots, std::byte* memory, uint64_t size,
               uint64_t chunk_size, ServerAuth& auth, std::function<void(uint16_t)> on_degrade,
               std::function<void(uint16_t)> on_primary_closed,
               std::function<void()> on_coordinator_closed)
    : memory_(memory),
      size_(size),
      auth_(auth),
      on_degrade_(std::move(on_degrade)),
      on_primary_closed_(std::move(on_primary_closed)),
      on_coordinator_closed_(std::move(on_coordinator_closed)) {
  for (uint32_t k = 0; k < slots; ++k) slots_.push_back(Slot{-1, ChunkAllocator(size, chunk_size)});
  if (first && !slots_.empty()) slots_[0].primary = *first;
}

void Mirror::Closed(const transport::Peer& peer) {
  std::vector<uint16_t> closed;
  {
    std::lock_guard lock(mu_);
    for (Slot& s : slots_) {
      if (s.primary >= 0 && !s.promoted && s.forward_connection == peer.id) {
        closed.push_back(static_cast<uint16_t>(s.primary));
      }
      if (s.forward_connection == peer.id) s.forward_connection = 0;  // nobody feeds it now
    }
  }
  if (on_primary_closed_) {
    for (uint16_t primary : closed) on_primary_closed_(primary);
  }
  if (peer.tag == Coordinator::kConnectionTag && on_coordinator_closed_) on_coordinator_closed_();
}

Mirror::~Mirror() {
  Stop();
  if (slot_file_.fd >= 0) close(slot_file_.fd);  // its mapping stays until the region's owner's
}

Status Mirror::Start(const std::string& host, Fabric fabric, const std::string& name) {
  name_ = name + " mirror";
  // The slots' file, sparse: nothing is committed until a slot is to hold a copy (Commit).
  const uint64_t bytes = size_ * slots_.size();
  const int fd = static_cast<int>(memfd_create("farpool-mirror-slots", MFD_CLOEXEC));
  if (fd < 0) return Status::Internal(name_ + ": memfd_create: " + std::strerror(errno));
  slot_file_.fd = fd;
  struct stat st {};
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fstat(fd, &st) != 0) {
    return Status::Internal(name_ + ": sizing the slots' file to " + FormatSize(bytes) + ": " +
                            std::strerror(errno));
  }
  if (mmap(memory_, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    return Status::Internal(name_ + ": mapping the slots' file: " + std::strerror(errno));
  }
  FARPOOL_ASSIGN_OR_RETURN(slot_file_.start_time, ProcessStartTime(getpid()));
  slot_file_.pid = static_cast<uint64_t>(getpid());
  slot_file_.inode = st.st_ino;
  transport::AmServerOptions ao;
  ao.host = host;
  ao.am_id = transport::kControlAm;
  ao.progress = ProgressMode::kEvent;  // forwards come in bursts; an idle mirror sleeps
  // At once, no spin: the primary no longer waits with its loop for the acknowledgement, and
  // on a host with few cores a spinning mirror took the core its primary and clients needed
  // (docs/pool.md "Pipelined forwards": measured with a 50 µs spin before).
  ao.event_spin = std::chrono::microseconds(0);
  ao.fabric = fabric;
  ao.thread_name = "fp-mirror";
  FARPOOL_ASSIGN_OR_RETURN(am_, transport::AmServer::Listen(ao));
  am_->Start(*this);
  return Status::Ok();
}

uint16_t Mirror::first_primary() const {
  std::lock_guard lock(mu_);
  return slots_.empty() || slots_[0].primary < 0 ? wire::kNoMirror
                                                 : static_cast<uint16_t>(slots_[0].primary);
}

Mirror::Slot* Mirror::Holding(uint16_t primary_id) {
  for (Slot& s : slots_) {
    if (s.primary == primary_id) return &s;
  }
  return nullptr;
}

const Mirror::Slot* Mirror::Holding(uint16_t primary_id) const {
  return const_cast<Mirror*>(this)->Holding(primary_id);
}

Result<wire::PromoteReply> Mirror::Promote(uint16_t primary_id,
                                           const std::function<bool(uint64_t)>& connected) {
  std::lock_guard lock(mu_);
  Slot* slot = Holding(primary_id);
  if (slot == nullptr) {
    return Status::InvalidArgument(name_ + ": cannot take server " + std::to_string(primary_id) +
                                   "'s data over: it does not mirror it");
  }
  const auto since = std::chrono::steady_clock::now() - slot->last_contact;
  const bool primary_connected = slot->primary_tag != 0 && connected(slot->primary_tag);
  if (!slot->promoted && primary_connected && since < kServeLease + kLeaseMargin) {
    return Status::Aborted(
        name_ + ": not yet: server " + std::to_string(primary_id) + " renewed its lease " +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(since).count()) +
        " ms ago and may serve until it lapses; ask again");
  }
  if (!slot->promoted && slot->adopted != nullptr) {
    // Shared pages: the pages are served only once the old primary cannot change them any
    // more, dead or merely stalled (a stopped process dies of SIGKILL too).
    Status dead = slot->adopted->KillOwner(kKillWait);
    if (!dead.ok()) {
      return Status::Aborted(name_ + ": not yet: server " + std::to_string(primary_id) + ": " +
                             dead.message() + "; ask again");
    }
    ReleaseDeadInsert(*slot);
  }
  if (!slot->promoted) {
    // Served from now on, and so written: a slot that took no forward of bytes yet (its
    // primary died before its attach) gets its memory first, or is not served.
    Status room = Commit(static_cast<uint32_t>(slot - slots_.data()));
    if (!room.ok()) {
      return room.WithContext(name_ + ": cannot take server " + std::to_string(primary_id) +
                              "'s data over");
    }
  }
  if (!slot->promoted) {
    std::fprintf(stderr, "%s: taking server %d's data over (slot %zu%s)\n", name_.c_str(),
                 primary_id, static_cast<size_t>(slot - slots_.data()),
                 slot->adopted != nullptr ? ", its own pages: its process is dead" : "");
  }
  slot->promoted = true;
  return wire::PromoteReply{slot->book.leased()};
}

std::optional<uint32_t> Mirror::PromotedSlot(uint16_t primary_id) const {
  std::lock_guard lock(mu_);
  const Slot* slot = Holding(primary_id);
  if (slot == nullptr || !slot->promoted) return std::nullopt;
  return static_cast<uint32_t>(slot - slots_.data());
}

std::map<uint64_t, ChunkAllocator::Held> Mirror::Leases(uint16_t primary_id) const {
  std::lock_guard lock(mu_);
  const Slot* slot = Holding(primary_id);
  return slot == nullptr ? std::map<uint64_t, ChunkAllocator::Held>{} : slot->book.leases();
}

std::optional<SharedFile> Mirror::SharedFileOf(uint16_t primary_id) const {
  std::lock_guard lock(mu_);
  const Slot* slot = Holding(primary_id);
  if (slot == nullptr || slot->adopted == nullptr) return std::nullopt;
  return slot->adopted->Describe();
}

void Mirror::ReleaseDeadInsert(Slot& slot) {
  std::byte* base = memory_ + (&slot - slots_.data()) * size_;
  auto* intent = reinterpret_cast<uint64_t*>(base + wire::kInsertIntentOffset);
  const uint64_t at = __atomic_load_n(&intent[0], __ATOMIC_SEQ_CST);
  if (at == 0 || at - 1 > size_ - 8 || (at - 1) % 8 != 0) return;
  uint64_t expected = intent[1];
  const uint64_t word = expected;
  // Only if the dead server's requester still holds it: a lock taken since by someone else
  // stays theirs.
  const bool released =
      __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(base + at - 1), &expected, 0, false,
                                  __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  __atomic_store_n(&intent[0], uint64_t{0}, __ATOMIC_SEQ_CST);
  std::fprintf(stderr,
               "%s: server %d died in an insert-if-absent: bucket lock at offset %llu (word "
               "0x%llx) %s\n",
               name_.c_str(), slot.primary, static_cast<unsigned long long>(at - 1),
               static_cast<unsigned long long>(word),
               released ? "released" : "held by another since, left as it is");
}

Status Mirror::Commit(uint32_t index) {
  Slot& slot = slots_[index];
  if (slot.committed || slot.adopted != nullptr) return Status::Ok();
  const std::string named = name_ + " slot " + std::to_string(index);
  const std::string what = named + ": a copy of " + FormatSize(size_);
  if (Status fits = CheckFitsInAvailableMemory(size_, what); !fits.ok()) {
    return Status::OutOfMemory(fits.message());
  }
  // Allocated now, not at the first store into each page: a slot never takes memory it was not
  // given (a failed page fault would be a SIGBUS or the OOM killer, not a refused forward).
  if (fallocate(slot_file_.fd, 0, static_cast<off_t>(index * size_), static_cast<off_t>(size_)) !=
      0) {
    return Status::OutOfMemory(what + ": allocating it: " + std::strerror(errno));
  }
  slot.committed = true;
  std::fprintf(stderr, "%s: allocated %s for a copy\n", named.c_str(), FormatSize(size_).c_str());
  return Status::Ok();
}

Status Mirror::Decommit(uint32_t index, const std::string& why) {
  Slot& slot = slots_[index];
  if (!slot.committed) return Status::Ok();
  const std::string named = name_ + " slot " + std::to_string(index);
  // The hole gives the file's pages back to the host; the mapping reads zeros from then on.
  if (fallocate(slot_file_.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(index * size_), static_cast<off_t>(size_)) != 0) {
    // It stays committed (a later copy does not allocate it twice).
    return Status::Internal(named + ": giving its " + FormatSize(size_) + " back after " + why +
                            ": " + std::strerror(errno));
  }
  slot.committed = false;
  std::fprintf(stderr, "%s: gave its %s back (%s)\n", named.c_str(), FormatSize(size_).c_str(),
               why.c_str());
  return Status::Ok();
}

Status Mirror::Vacate(Slot& slot, const std::string& why) {
  const uint32_t index = static_cast<uint32_t>(&slot - slots_.data());
  const std::string named = name_ + " slot " + std::to_string(index);
  std::fprintf(stderr, "%s: no longer the copy of server %d: %s\n", named.c_str(), slot.primary,
               why.c_str());
  // Nobody's copy from here on, whatever else fails: no forward or promotion reaches it.
  slot.primary = -1;
  slot.book = ChunkAllocator(size_, slot.book.chunk_size());
  slot.primary_tag = 0;
  if (slot.adopted != nullptr) {
    // Its own range of the slots' file back over it (empty: Adopt punched it), so that the
    // primary's pages are no longer held here.
    slot.adopted.reset();
    if (mmap(memory_ + index * size_, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
             slot_file_.fd, static_cast<off_t>(index * size_)) == MAP_FAILED) {
      return Status::Internal(named + ": unmapping the pages it shared: " + std::strerror(errno));
    }
  }
  return Decommit(index, why);
}

Status Mirror::Reserve(uint32_t index) {
  std::lock_guard lock(mu_);
  if (index >= slots_.size()) {
    return Status::InvalidArgument(name_ + ": no slot " + std::to_string(index));
  }
  return Commit(index);
}

Status Mirror::Adopt(Slot& slot, const wire::ReplicateRequest& req) {
  const std::string named = name_ + " slot " + std::to_string(req.slot);
  const SharedFile file{req.share_pid, req.share_start_time, req.share_inode, req.share_fd};
  auto adopted =
      AdoptedPages::Adopt(file, memory_ + req.slot * size_, size_, slot_file_, req.slot * size_);
  if (!adopted.ok()) {
    slot.primary = -1;  // holds nobody's copy: later forwards are refused, not applied
    slot.adopted.reset();
    return adopted.status().WithContext(named + ": sharing server " +
                                        std::to_string(req.primary_id) + "'s pages");
  }
  slot.adopted = std::move(*adopted);
  slot.committed = false;  // what the slot had of its own was given back (Adopt)
  std::fprintf(stderr, "%s: shares server %u's pages (process %llu)\n", named.c_str(),
               req.primary_id, static_cast<unsigned long long>(req.share_pid));
  return Status::Ok();
}

ChunkAllocator::Access Mirror::Check(uint64_t offset, uint64_t size, uint32_t owner) const {
  const uint64_t k = offset / size_;
  const uint64_t within = offset % size_;
  std::lock_guard lock(mu_);
  if (k >= slots_.size() || size > size_ - within || !slots_[k].promoted) {
    return ChunkAllocator::Access::kOutside;
  }
  return slots_[k].book.Check(within, size, owner);
}

std::optional<uint64_t> Mirror::RootOf(uint16_t primary_id, uint32_t owner) const {
  std::lock_guard lock(mu_);
  const Slot* slot = Holding(primary_id);
  if (slot == nullptr) return std::nullopt;
  return slot->book.RootOf(owner);
}

Result<uint64_t> Mirror::Lease(uint16_t primary_id, uint64_t size, uint32_t owner) {
  std::lock_guard lock(mu_);
  Slot* slot = Holding(primary_id);
  if (slot == nullptr || !slot->promoted) return NotPromoted(primary_id);
  return slot->book.Lease(size, owner);
}

Status Mirror::Release(uint16_t primary_id, uint64_t offset, uint64_t size, uint32_t owner) {
  std::lock_guard lock(mu_);
  Slot* slot = Holding(primary_id);
  if (slot == nullptr || !slot->promoted) return NotPromoted(primary_id);
  return slot->book.Release(offset, size, owner);
}

Status Mirror::NotPromoted(uint16_t primary_id) const {
  return Status::InvalidArgument(name_ + ": server " + std::to_string(primary_id) +
                                 " has not been failed over to this server (PromoteRequest)");
}

Result<Mirror::Slot*> Mirror::AdmitForward(uint16_t primary_id, uint16_t slot, bool attach,
                                           uint64_t id, const transport::Peer* from) {
  const std::string named = name_ + " slot " + std::to_string(slot);
  if (slot >= slots_.size()) {
    return Status::NotFound(named + ": no such slot (" + std::to_string(slots_.size()) + " slots)");
  }
  Slot& s = slots_[slot];
  if (attach && !s.promoted) {
    // A new copy (re-replication, or the first forward of `cluster up`'s ring): whatever the
    // slot held belongs to a link that the coordinator has told to stop forwarding here.
    if (s.primary != primary_id) {
      std::fprintf(stderr, "%s: now the copy of server %u\n", named.c_str(), primary_id);
    }
    // At most one slot keeps a region's copy (Holding finds it by the primary alone): another
    // slot that still holds this primary's is a stale copy the map no longer names (a region
    // whose further backups gave their copies up at a failover, docs/pool.md "Replication with
    // f backups").
    for (Slot& other : slots_) {
      if (&other != &s && other.primary == primary_id && !other.promoted) {
        FARPOOL_RETURN_IF_ERROR(Vacate(other, "its copy is now in slot " + std::to_string(slot)));
      }
    }
    s.primary = primary_id;
    s.book = ChunkAllocator(size_, s.book.chunk_size());
    s.primary_tag = 0;
    s.forward_connection = 0;
    s.forward_id = 0;
  }
  if (s.primary != primary_id) {
    return Status::NotFound(named + ": a forward from server " + std::to_string(primary_id) +
                            ", not from its primary");
  }
  if (s.promoted) {
    return Status::PermissionDenied(
        named + ": fenced: this server has taken server " + std::to_string(primary_id) +
        "'s data over (a client found it gone) and takes no more of its forwards");
  }
  const uint64_t connection = from == nullptr ? 0 : from->id;
  if (connection == s.forward_connection && id <= s.forward_id) {
    return Status::Protocol(named + ": forward " + std::to_string(id) + " arrived after forward " +
                            std::to_string(s.forward_id) + ": out of order, not applied");
  }
  s.forward_connection = connection;
  s.forward_id = id;
  if (from != nullptr) s.primary_tag = from->tag;
  s.last_contact = std::chrono::steady_clock::now();
  return &s;
}

std::vector<std::byte> Mirror::Refuse(const Status& reason) {
  return wire::EncodeError(0, reason.WithContext(name_));
}

std::vector<std::byte> Mirror::Handle(std::span<const std::byte> bytes, transport::Peer* from) {
  auto reply = Answer(bytes, from);
  if (reply.ok()) return std::move(*reply);
  return wire::EncodeError(transport::RequestIdOf(bytes).value_or(0), reply.status());
}

Result<std::vector<std::byte>> Mirror::Apply(const wire::Message& m,
                                             const wire::ReplicateRequest& req, bool attach,
                                             uint64_t id, const transport::Peer* from) {
  FARPOOL_ASSIGN_OR_RETURN(Slot * slot, AdmitForward(req.primary_id, req.slot, attach, id, from));
  if (attach && (req.flags & wire::kReplicateShare) != 0) {
    FARPOOL_RETURN_IF_ERROR(Adopt(*slot, req));
  } else if (attach && slot->adopted != nullptr) {
    return Status::InvalidArgument(name_ + " slot " + std::to_string(req.slot) +
                                   " shares a region's pages: it takes no copy");
  }
  if (slot->adopted != nullptr && req.op_count > 0) {
    return Status::Protocol(name_ + " slot " + std::to_string(req.slot) + " shares server " +
                            std::to_string(req.primary_id) +
                            "'s pages: a forward of bytes would write older bytes over them");
  }
  std::vector<memory_ops::Range> written;
  memory_ops::Region region{memory_ + req.slot * size_,
                            size_,
                            [](uint64_t, uint64_t) { return true; },
                            req.primary_id,
                            &written,
                            /*writes_only=*/true};
  FARPOOL_RETURN_IF_ERROR(
      memory_ops::Execute(req.op_count, m.tail, region).status().WithContext(name_));
  uint64_t applied = 0;
  for (const memory_ops::Range& r : written) applied += r.size;
  return wire::Encode(id, wire::ReplicateReply{applied});
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
      r.mirror_of = first_primary();
      r.region_size = size_;
      return wire::Encode(id, r);
    }
    case wire::Opcode::kReplicateRequest: {
      const auto req = m.As<wire::ReplicateRequest>();
      std::lock_guard lock(mu_);
      const bool attach = (req.flags & wire::kReplicateAttach) != 0;
      if ((req.flags & wire::kReplicateDetach) != 0) {
        // From the connection that feeds the slot (its primary gives the copy up), or once that
        // has closed (a coordinator drops a dead primary's copy that its map no longer names).
        // Not from anyone else while a primary feeds it: that may be a deposed coordinator,
        // late, after a newer one named this very slot for the region again (docs/pool.md
        // "Re-replication's loose ends").
        if (from != nullptr && req.slot < slots_.size() &&
            slots_[req.slot].forward_connection != 0 &&
            slots_[req.slot].forward_connection != from->id) {
          return Status::Aborted(name_ + " slot " + std::to_string(req.slot) + ": server " +
                                 std::to_string(req.primary_id) +
                                 "'s copy is still fed by its primary: only that connection "
                                 "gives it up while open");
        }
        FARPOOL_ASSIGN_OR_RETURN(Slot * slot,
                                 AdmitForward(req.primary_id, req.slot, false, id, from));
        FARPOOL_RETURN_IF_ERROR(
            Vacate(*slot, "server " + std::to_string(req.primary_id) + " gave its copy up"));
        return wire::Encode(id, wire::ReplicateReply{0});
      }
      // Bytes go into a slot only once it has its memory (a copy's first forward, its attach);
      // refused before the slot becomes the primary's copy if the host cannot give it. A
      // forward refused after this request committed it gives the memory back: the slot holds
      // no copy it needs it for (and held none before, so nothing is lost but what this
      // forward wrote, which its primary sends again).
      const bool fresh = req.slot < slots_.size() && !slots_[req.slot].committed;
      if ((req.flags & wire::kReplicateShare) == 0 && req.slot < slots_.size()) {
        FARPOOL_RETURN_IF_ERROR(Commit(req.slot));
      }
      auto applied = Apply(m, req, attach, id, from);
      if (!applied.ok() && fresh) {
        if (Status back = Decommit(req.slot, "a refused forward"); !back.ok()) {
          return Status(applied.status().code(),
                        applied.status().message() + "; and " + back.message());
        }
      }
      return applied;
    }
    case wire::Opcode::kMirrorLeaseRequest: {
      const auto req = m.As<wire::MirrorLeaseRequest>();
      std::lock_guard lock(mu_);
      FARPOOL_ASSIGN_OR_RETURN(Slot * slot,
                               AdmitForward(req.primary_id, req.slot, false, id, from));
      FARPOOL_RETURN_IF_ERROR((req.leased != wire::kMirrorRelease
                                   ? slot->book.LeaseAt(req.offset, req.size, req.owner,
                                                        req.leased == wire::kMirrorLeaseRoot)
                                   : slot->book.Release(req.offset, req.size, req.owner))
                                  .WithContext(name_));
      return wire::Encode(id, wire::MirrorLeaseReply{0});
    }
    case wire::Opcode::kPromoteRequest: {
      const auto tags = am_->tags();
      FARPOOL_ASSIGN_OR_RETURN(wire::PromoteReply r,
                               Promote(m.As<wire::PromoteRequest>().id, [&](uint64_t tag) {
                                 return std::find(tags.begin(), tags.end(), tag) != tags.end();
                               }));
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
