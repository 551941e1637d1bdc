// Mirror: a backup memory server's copy of its primary's region (docs/pool.md "Replication").
//
// How it works: the copy lives in the backup's own region, past its own part (slot 0 at
// HelloReply::mirror_offset), so that once promoted the backup serves it to clients like its
// own memory. The primary's forwards arrive on a loop of their own (an AmServer on another
// port, HelloReply::mirror_port, event progress): a primary may wait for its backup's
// acknowledgement on its progress thread (back-pressure, a backup being named, a slot link or
// a re-replication's copy, memory_server.h; its own forwards are otherwise pipelined,
// backup_link.h), so two servers that back each other up would deadlock if forwards had to pass
// through the loop that is waiting. That loop applies
// ReplicateRequests (writes, offsets in the primary's region) and MirrorLeaseRequests (the
// primary's lease book) from authenticated connections, each into the slot (below) that holds
// that primary's copy.
//
// The mirror's loop also takes DegradeRequests meant for the server as a primary (its own
// backup is gone): the server's progress thread may be the one waiting for that backup.
//
// A PromoteRequest (a client found the primary gone; on the mirror's port) ends that, but not
// while the primary may still be serving: a primary serves only while its last acknowledged
// contact with the backup is younger than kServeLease (it renews every AmHandler tick), so the
// backup promotes once the primary's connection has closed (its process is gone) or
// kServeLease + kLeaseMargin after the last contact (a primary cut off has stopped serving by
// then); earlier requests are answered Aborted ("not yet"), and the client asks again. The
// promotion from then on forwards are refused
// ("fenced"), which is what stops a primary that is cut off from the clients but not from its
// backup from acknowledging another write, and the server's own loop serves the copy: its
// clients' operations at mirror offsets are checked against the mirrored lease book.
//
// Slots (docs/pool.md "Re-replication"): the mirror area holds `slots` copies, each as large as
// the server's own part, slot k at k * size past the mirror's start. Slot 0 starts as the copy
// of ServerOptions::mirror_of (the ring of `cluster up`); a primary that the coordinator later
// names this server as backup for attaches to a free slot with its first forward
// (wire::kReplicateAttach: the slot becomes its copy, with an empty lease book, unless the slot
// is promoted). Every forward, promote and mirrored lease names the primary (its region) and
// the slot; a forward naming a slot that holds another primary's copy is refused.
//
// Order: a primary pipelines the forwards of a link (backup_link.h) and counts on the mirror
// applying them in the order sent. A slot is fed by one link at a time (one connection; the
// forwards of different slots come on different links), so each slot keeps the connection and
// request id of its latest forward and refuses one from the same connection with a request id
// not above it (Protocol, "out of order"); a forward on another connection (a new link, an
// attach) starts the count again.
//
// Shared pages (pool/server/shared_pages.h, docs/pool.md "Shared-pages backups"): an attach
// with wire::kReplicateShare maps the primary's region file over the slot instead of keeping a
// copy; that slot then takes lease changes only (a forward of bytes into it is refused: it would
// write the pages' own older bytes back over newer stores). Before such a slot is promoted, the
// primary process is killed and its exit awaited (AdoptedPages::KillOwner): the pages are served
// only once nothing of the old primary can change them any more. An insert-if-absent the dead
// process was executing left its requester's lock word on the bucket (the pages are not rolled
// back as a copy would be): the promotion releases it (ReleaseDeadInsert); an entry it had made
// live stays (the requester was told "may or may not have taken effect").
//
// Memory (docs/pool.md "Mirror slots cost nothing until they hold a copy"): the slots live in a
// file of their own (a memfd, mapped over the address space the server's region reserved after
// itself, transport::MemoryRegion::tail), sparse at start: a slot commits its memory only when it
// is to hold a copy, at the first forward of bytes into it (the attach of a primary that
// forwards copies) or at a promotion, after checking that the host has it
// (CheckFitsInAvailableMemory, then fallocate): a slot that cannot get it refuses the forward
// or the promotion with the reason, and is never written past what it committed. A slot that
// shares its primary's pages never commits any; the ring's slot 0 of a server that keeps
// forwarded copies commits at start (Reserve: allocating a large slot can take longer than a
// forward may wait for its acknowledgement). Memory goes back to the host (a hole punched in
// the file, Decommit) when a forward that committed it is refused (the slot holds no copy it
// needs it for), and when the slot's primary gives its copy up (wire::kReplicateDetach: the
// primary degraded, or abandoned a copy under way): the slot is then free (Vacate).
//
// Thread-safety: the forwards run on the mirror's loop, everything else on the server's
// progress thread; the slots (lease books, owners, promoted flags) are guarded by one mutex,
// and a forward applies its writes under it, so no forward lands after Promote returns.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "farpool/fabric.h"
#include "farpool/status.h"
#include "pool/server/chunk_allocator.h"
#include "pool/server/server_auth.h"
#include "pool/server/shared_pages.h"
#include "transport/am_server.h"
#include "transport/wire.h"

namespace farpool {

// How long a primary may serve after its last acknowledged contact with its backup, and how
// much longer its backup waits before it takes over from a primary it cannot see gone.
inline constexpr std::chrono::milliseconds kServeLease{1000};
inline constexpr std::chrono::milliseconds kLeaseMargin{200};
// Shared pages: how long a promotion waits for the killed primary to exit before it answers
// "not yet" (the client asks again). An exit unmaps the whole region, which takes milliseconds.
inline constexpr std::chrono::milliseconds kKillWait{500};

class Mirror : public transport::AmHandler {
 public:
  // `slots` copies of `size` bytes each (chunks of `chunk_size`) at `memory`: address space
  // reserved for them (page-aligned, unmapped or PROT_NONE) that outlives the mirror, which
  // maps its slots' file over it in Start; slot 0 mirrors server `first` if set. `auth` is the
  // server's; `name` its name. `on_degrade(backup_id)`: a DegradeRequest for this server's own role
  // as a primary (served here because the server's loop may be blocked waiting for that backup);
  // any thread. `on_primary_closed(primary_id)`: the connection that brought the forwards of a
  // primary whose copy a slot keeps (not promoted) has closed, on the mirror's loop (must not
  // block): evidence that the primary is gone, not proof (it also closes its link when it drains,
  // gives a copy up, or is degraded). `on_coordinator_closed()`: a connection of the
  // coordinator's (Coordinator::kConnectionTag) has closed, on the mirror's loop (must not
  // block): evidence that the coordinator is gone, not proof (it closes a connection whose ask
  // timed out too).
  Mirror(std::optional<uint16_t> first, uint32_t slots, std::byte* memory, uint64_t size,
         uint64_t chunk_size, ServerAuth& auth, std::function<void(uint16_t)> on_degrade,
         std::function<void(uint16_t)> on_primary_closed,
         std::function<void()> on_coordinator_closed);
  ~Mirror() override;

  // Maps the slots' file over `memory` (nothing committed), listens on `host` (any free port)
  // and starts the forwards' loop.
  Status Start(const std::string& host, Fabric fabric, const std::string& name);
  void Stop() {
    if (am_) am_->Stop();
  }
  uint16_t port() const { return am_ ? am_->port() : 0; }
  // Slot 0's primary (wire::kNoMirror: none), for the hello.
  uint16_t first_primary() const;
  uint64_t size() const { return size_; }
  uint32_t slots() const { return static_cast<uint32_t>(slots_.size()); }

  // Whether a client of pool `owner` may touch [offset, offset + size) of the mirror area
  // (offsets from its start): kOutside unless inside one promoted slot, else as that slot's
  // mirrored book says (ChunkAllocator::Check; offsets within the slot are the primary's).
  ChunkAllocator::Access Check(uint64_t offset, uint64_t size, uint32_t owner) const;
  // Pool `owner`'s root area in the copy of server `primary_id`'s region, as that primary
  // leased it (its offset in the primary's region), if the copy has it.
  std::optional<uint64_t> RootOf(uint16_t primary_id, uint32_t owner) const;
  // Leases and releases for pool `owner` in the mirrored book of server `primary_id`'s region
  // once promoted (for clients that failed that primary over). Offsets are the primary's. The
  // server forwards them to the region's new backup, once it has one (re-replication).
  Result<uint64_t> Lease(uint16_t primary_id, uint64_t size, uint32_t owner);
  Status Release(uint16_t primary_id, uint64_t offset, uint64_t size, uint32_t owner);

  // The slot that serves server `primary_id`'s region (promoted), if any.
  std::optional<uint32_t> PromotedSlot(uint16_t primary_id) const;
  // The mirrored lease book of `primary_id`'s region (offset -> length, owner, root), for a
  // copy of it.
  std::map<uint64_t, ChunkAllocator::Held> Leases(uint16_t primary_id) const;
  // Commits slot `index`'s memory now (see Memory above): for a slot known to hold a forwarded
  // copy from the start (the ring's slot 0 without shared pages), so that its first forward,
  // the attach, does not wait for it. OutOfMemory with the reason if the host cannot give it.
  Status Reserve(uint32_t index);
  // The file of `primary_id`'s region if its slot shares its pages, as this process can
  // describe it to a backup of its own (re-replication of a region it serves).
  std::optional<SharedFile> SharedFileOf(uint16_t primary_id) const;

  std::vector<std::byte> Handle(std::span<const std::byte> bytes, transport::Peer* from) override;
  std::vector<std::byte> Refuse(const Status& reason) override;
  // Calls on_primary_closed for the slots whose primary's forwards came on `peer`, and
  // on_coordinator_closed if `peer` was the coordinator's.
  void Closed(const transport::Peer& peer) override;

 private:
  struct Slot {
    int primary = -1;  // whose copy it holds, -1: free
    ChunkAllocator book;
    bool promoted = false;
    // The mirror's loop only: the primary's process tag (from the connection of its forwards)
    // and when it last forwarded or renewed.
    uint64_t primary_tag = 0;
    std::chrono::steady_clock::time_point last_contact{};
    // The mirror's loop only: the connection of the latest forward (Peer::id; 0 once it has
    // closed) and its request id.
    uint64_t forward_connection = 0;
    uint64_t forward_id = 0;
    // Shared pages: the primary's region mapped over the slot, and its process (for the kill).
    std::unique_ptr<AdoptedPages> adopted;
    // Its memory in the slots' file is allocated (Commit).
    bool committed = false;
  };
  // Allocates the memory of slot `index` in the slots' file unless it has it or shares pages:
  // OutOfMemory with the reason if the host cannot give it. REQUIRES: mu_ held.
  Status Commit(uint32_t index);
  // Gives slot `index`'s memory back to the host (a hole punched in the slots' file) if it has
  // any; `why` for the log. REQUIRES: mu_ held.
  Status Decommit(uint32_t index, const std::string& why);
  // `slot` holds nobody's copy from now on (its primary gave the copy up, wire::
  // kReplicateDetach): its book emptied, pages it shared unmapped, its memory given back.
  // REQUIRES: mu_ held.
  Status Vacate(Slot& slot, const std::string& why);
  // A ReplicateRequest's admission and writes (the slot has its memory unless it shares
  // pages). REQUIRES: mu_ held.
  Result<std::vector<std::byte>> Apply(const wire::Message& m, const wire::ReplicateRequest& req,
                                       bool attach, uint64_t id, const transport::Peer* from);
  // Maps the file `req` names over `slot` (shared pages). REQUIRES: mu_ held.
  Status Adopt(Slot& slot, const wire::ReplicateRequest& req);
  // Shared pages, at promotion, once the primary is dead: releases the bucket lock of an
  // insert-if-absent it was executing (wire::kInsertIntentOffset), if its requester's word
  // still holds it. REQUIRES: mu_ held.
  void ReleaseDeadInsert(Slot& slot);
  Result<std::vector<std::byte>> Answer(std::span<const std::byte> bytes, transport::Peer* from);
  // A forward (writes or a lease change) from `primary_id` into `slot`, request `id`: attaches
  // the slot if `attach`; refused unless the slot holds that primary's copy, has not taken over,
  // and the forward comes in the order sent (Order, above); else it counts as the primary's
  // contact (its lease). A slot that does not exist or holds no copy of `primary_id` is refused
  // NotFound, which tells the primary that its link is misplaced (BackupLink::misplaced).
  // REQUIRES: mu_ held.
  Result<Slot*> AdmitForward(uint16_t primary_id, uint16_t slot, bool attach, uint64_t id,
                             const transport::Peer* from);
  // The slot that holds `primary_id`'s copy, or nullptr. REQUIRES: mu_ held.
  Slot* Holding(uint16_t primary_id);
  const Slot* Holding(uint16_t primary_id) const;
  // A PromoteRequest, on the mirror's loop: `connected(tag)` whether a connection of that
  // process tag is still open.
  Result<wire::PromoteReply> Promote(uint16_t primary_id,
                                     const std::function<bool(uint64_t)>& connected);
  Status NotPromoted(uint16_t primary_id) const;

  std::byte* const memory_;
  const uint64_t size_;
  mutable std::mutex mu_;
  std::vector<Slot> slots_;  // guarded by mu_
  ServerAuth& auth_;
  std::function<void(uint16_t)> on_degrade_;
  std::function<void(uint16_t)> on_primary_closed_;
  std::function<void()> on_coordinator_closed_;
  // The slots' file (a memfd mapped over memory_), as AdoptedPages::Adopt needs it.
  SharedFile slot_file_;
  std::string name_;
  std::unique_ptr<transport::AmServer> am_;
};

}  // namespace farpool
