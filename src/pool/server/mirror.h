// Mirror: a backup memory server's copy of its primary's region (docs/pool.md "Replication").
//
// How it works: the copy lives in the backup's own region, past its own part (at
// HelloReply::mirror_offset), so that once promoted the backup serves it to clients like its
// own memory. The primary's forwards arrive on a loop of their own (an AmServer on another
// port, HelloReply::mirror_port, event progress): a primary may wait for its backup's
// acknowledgement on its progress thread (back-pressure, a backup being named; forwards are
// otherwise pipelined, backup_link.h), so two servers that back each other up would deadlock
// if forwards had to pass through the loop that is waiting. That loop applies
// ReplicateRequests (writes, offsets in the primary's region) and MirrorLeaseRequests (the
// primary's lease book) from authenticated connections, for the primary it mirrors only.
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
// Thread-safety: the forwards run on the mirror's loop, everything else on the server's
// progress thread; the lease book and the promoted flag are guarded by one mutex, and a
// forward applies its writes under it, so no forward lands after Promote returns.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "farpool/fabric.h"
#include "farpool/status.h"
#include "pool/server/chunk_allocator.h"
#include "pool/server/server_auth.h"
#include "transport/am_server.h"
#include "transport/wire.h"

namespace farpool {

// How long a primary may serve after its last acknowledged contact with its backup, and how
// much longer its backup waits before it takes over from a primary it cannot see gone.
inline constexpr std::chrono::milliseconds kServeLease{1000};
inline constexpr std::chrono::milliseconds kLeaseMargin{200};

class Mirror : public transport::AmHandler {
 public:
  // The copy of server `primary_id`'s region of `size` bytes (chunks of `chunk_size`) at
  // `memory`, which outlives the mirror. `auth` is the server's; `name` its name.
  // `on_degrade(backup_id)`: a DegradeRequest for this server's own role as a primary (served
  // here because the server's loop may be blocked waiting for that backup); any thread.
  Mirror(uint16_t primary_id, std::byte* memory, uint64_t size, uint64_t chunk_size,
         ServerAuth& auth, std::function<void(uint16_t)> on_degrade)
      : primary_id_(primary_id),
        memory_(memory),
        size_(size),
        book_(size, chunk_size),
        auth_(auth),
        on_degrade_(std::move(on_degrade)) {}
  ~Mirror() override { Stop(); }

  // Listens on `host` (any free port) and starts the forwards' loop.
  Status Start(const std::string& host, Fabric fabric, const std::string& name);
  void Stop() {
    if (am_) am_->Stop();
  }
  uint16_t port() const { return am_ ? am_->port() : 0; }
  uint16_t primary_id() const { return primary_id_; }
  uint64_t size() const { return size_; }

  bool promoted() const;
  // Whether a client of pool `owner` may touch [offset, offset + size) of the copy (offsets in
  // the primary's region): kOutside unless promoted, else as the mirrored book says
  // (ChunkAllocator::Check).
  ChunkAllocator::Access Check(uint64_t offset, uint64_t size, uint32_t owner) const;
  // Pool `owner`'s root area in the copy, as the primary leased it.
  std::optional<uint64_t> RootOf(uint32_t owner) const;
  // Leases and releases in the mirrored book once promoted (for clients that failed the
  // primary over): the copy has no backup of its own, so nothing is forwarded.
  Result<uint64_t> Lease(uint64_t size, uint32_t owner);
  Status Release(uint64_t offset, uint64_t size, uint32_t owner);

  std::vector<std::byte> Handle(std::span<const std::byte> bytes, transport::Peer* from) override;
  std::vector<std::byte> Refuse(const Status& reason) override;

 private:
  Result<std::vector<std::byte>> Answer(std::span<const std::byte> bytes, transport::Peer* from);
  // A forward (writes or a lease change) naming `primary_id`, request `id`: refused unless it
  // names our primary, we have not taken over, and it comes in the order sent (request ids
  // increase on a connection; the primary pipelines its forwards and counts on their order);
  // else it counts as the primary's contact (its lease). REQUIRES: mu_ held.
  Status AdmitForward(uint16_t primary_id, uint64_t id, const transport::Peer* from);
  Status Fenced() const;
  // A PromoteRequest, on the mirror's loop: `primary_connected` whether the primary's
  // connection is still open.
  Result<wire::PromoteReply> Promote(bool primary_connected);
  Status NotPromoted() const;

  const uint16_t primary_id_;
  std::byte* const memory_;
  const uint64_t size_;
  mutable std::mutex mu_;
  ChunkAllocator book_;    // guarded by mu_
  bool promoted_ = false;  // guarded by mu_
  // The mirror's loop only: the primary's process tag (from the connection of its forwards)
  // and when it last forwarded or renewed.
  uint64_t primary_tag_ = 0;
  // The connection of the latest forward (Peer::id) and its request id.
  uint64_t forward_connection_ = 0;
  uint64_t forward_id_ = 0;
  std::chrono::steady_clock::time_point last_contact_{};
  ServerAuth& auth_;
  std::function<void(uint16_t)> on_degrade_;
  std::string name_;
  std::unique_ptr<transport::AmServer> am_;
};

}  // namespace farpool
