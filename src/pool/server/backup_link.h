// BackupLink: a primary memory server's connection to its backup's mirror (pool/server/mirror.h,
// docs/pool.md "Replication"), used on the primary's progress thread only.
//
// Connect() says hello on the backup's port to learn the mirror's port, then connects there,
// says hello again (both with the cluster secret's challenge-response) and attaches the
// backup's mirror slot Target::slot (an empty forward with wire::kReplicateAttach: the slot
// becomes this server's copy, its lease book empty; the slot must be as large as the region).
// Every forward and lease change names that slot.
//
// How forwarding works: a forward is the current bytes of the ranges some rounds of requests
// changed (as writes, in messages of at most wire::kMaxBatchTail) and their lease changes;
// Post() numbers it (a ticket, 1, 2, ...) and sends it without waiting. Forwards go on one
// connection and the mirror applies them in the order sent (it refuses one that arrives out
// of order), so forwards settle in ticket order: settled() is the highest ticket whose forward,
// and every one before it, the backup has acknowledged or TakeFailures reports failed. At most
// kMaxInFlight forwards are in flight; a round posted beyond that is coalesced with the others
// waiting into one pending forward (one message for consecutive rounds), sent when an
// acknowledgement makes room; a pending forward beyond kMaxPendingBytes of changes makes Post wait
// for room first (back-pressure: the primary's loop then serves nothing until the backup catches
// up, as every round did before forwards were pipelined). The bytes are read when the forward is
// sent, so a forward may carry later values than its rounds wrote: the backup's copy is never older
// than what was acknowledged.
//
// Invariants: posted() >= settled(); a ticket is settled once, acknowledged or failed
// (TakeFailures), and tickets settle in order. A failure of the oldest forward in flight (an error
// reply, fenced, or no acknowledgement by its deadline, `timeout` after it was sent, also when the
// connection is lost: the caller has until then to learn that the backup was declared gone) fails
// every forward outstanding then; the byte ranges they carried are posted again at once as a new
// forward (unless fenced), so a backup that was only slow converges and no reply released
// after it can have observed a byte the backup lacks. Of their lease changes only the pools'
// root leases (wire::kMirrorLeaseRoot) go again with them: a root is leased once and never
// released, so a later hello shows it without changing anything (MemoryServer), and the
// mirror takes a root it has already as a no-op (ChunkAllocator::LeaseAt). Leases and releases
// are not resent: a lease whose forward failed was answered with an error, so no client
// holds its offset; a lost release leaves the chunk leased on the backup (docs/pool.md
// "Pipelined forwards", Failures).
//
// Thread-safety: one thread (the primary's progress thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "farpool/fabric.h"
#include "farpool/status.h"
#include "pool/control_client.h"
#include "pool/memory_ops.h"
#include "pool/server/shared_pages.h"
#include "transport/auth.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool {

// A lease or release of [offset, offset + size) in the primary's book, by pool `owner`
// (wire::MirrorLeaseRequest::leased: kMirrorLease, kMirrorLeaseRoot or kMirrorRelease).
struct LeaseChange {
  uint64_t offset;
  uint64_t size;
  uint8_t kind;  // wire::kMirrorLease, kMirrorRelease or kMirrorLeaseRoot
  uint32_t owner;
};

class BackupLink {
 public:
  struct Target {
    uint16_t id;
    std::string host;
    uint16_t port;  // the backup's clients' port
    uint16_t slot;  // the mirror slot that holds the copy
  };
  // `primary_id`, `region_size`: this server's. Every wait is bounded by `timeout`. `share`:
  // the backup adopts the region's file instead of keeping a copy (shared_pages.h; the attach
  // fails with the backup's reason if it cannot), and the caller forwards no bytes from then on.
  static Result<std::unique_ptr<BackupLink>> Connect(const Target& backup, uint16_t primary_id,
                                                     uint64_t region_size,
                                                     const transport::ClusterSecret* secret,
                                                     Fabric fabric,
                                                     std::chrono::milliseconds timeout,
                                                     const SharedFile* share = nullptr);
  ~BackupLink() = default;

  // A forward posted and failed: tickets [from, through] (every forward outstanding at the
  // failure) failed for `why`.
  struct Failure {
    uint64_t from;
    uint64_t through;
    Status why;
  };
  static constexpr size_t kMaxInFlight = 2;
  static constexpr uint64_t kMaxPendingBytes = 4ull << 20;

  // Posts the bytes of `changed` (offsets into `region`, which outlives the link) and `leases`
  // as the next forward (nothing: an empty forward, which renews the primary's lease at the
  // backup, mirror.h) and returns its ticket. Waits only for room (back-pressure, above), and
  // stops waiting as soon as `give_up()` says so (the backup was declared gone). A failure
  // shows in TakeFailures.
  uint64_t Post(const std::byte* region, std::span<const memory_ops::Range> changed,
                std::span<const LeaseChange> leases, const std::function<bool()>& give_up);
  // Takes what has arrived without waiting: acknowledgements, failures; sends the pending
  // forward if there is room. With no forward in flight there is nothing to take, and the
  // link's worker is not progressed (a system call or more each time, on every round of the
  // primary's loop: docs/pool.md "What a forward costs").
  void Poll();
  uint64_t posted() const { return posted_; }
  uint64_t settled() const { return settled_; }
  // Whether a forward is in flight: only then can the link's worker have an event the primary's
  // loop waits for (an acknowledgement, or the connection's loss, which matters to a forward
  // only: a failure is a forward's).
  bool in_flight() const { return !in_flight_.empty(); }
  // When the latest acknowledged forward was sent (a primary's serving lease counts from there:
  // the backup counts it from when the forward arrived, later).
  std::chrono::steady_clock::time_point acknowledged_sent() const { return acknowledged_sent_; }
  // The failures since the last call, oldest first.
  std::vector<Failure> TakeFailures() { return std::exchange(failures_, {}); }
  // Whether failures wait to be taken: a failed forward counts as settled (settled()), so
  // until TakeFailures a caller cannot tell it from an acknowledged one by the tickets alone.
  bool failing() const { return !failures_.empty(); }
  // Its events (an acknowledgement) are what the primary's loop waits for.
  transport::Worker& worker() { return mirror_->worker(); }

  // Post, then wait until that forward is acknowledged: Ok once the backup has applied it and
  // every forward before it. PermissionDenied ("fenced: ...") if the backup has taken this
  // server's data over; Unavailable or TimedOut if it cannot be reached; another error if it
  // refused a forward; Aborted as soon as `give_up()` says so while waiting (the backup was
  // declared gone). A failure shows in TakeFailures too.
  Status Forward(const std::byte* region, std::span<const memory_ops::Range> changed,
                 std::span<const LeaseChange> leases, const std::function<bool()>& give_up);

  // Tells the backup that this server gives the slot's copy up (wire::kReplicateDetach: the
  // slot frees itself and gives its memory back), after every forward sent before; pending ones
  // are never sent. Not waited for: the caller closes the link next, and the close delivers what
  // was sent (a backup that is gone frees nothing, nor needs to). No forward may follow.
  Status Detach();

  // Whether the backup refused a forward as not into this primary's copy (NotFound, from
  // Mirror::AdmitForward: the slot holds another primary's copy since, was emptied, or does not
  // exist; the lease book's refusals are InvalidArgument and do not count): no later forward
  // on this link can succeed, and the copy it was is gone (docs/pool.md "The map's backups in
  // the request").
  bool misplaced() const { return misplaced_; }

  const std::string& name() const { return name_; }
  int id() const { return id_; }
  uint16_t slot() const { return slot_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Flight {
    uint64_t ticket;
    std::vector<uint64_t> ids;  // its messages' request ids, with the reply each expects
    std::vector<wire::Opcode> expected;
    size_t replied = 0;  // how many of them the backup has answered
    std::vector<memory_ops::Range> ranges;
    std::vector<LeaseChange> roots;  // its pools' root leases (resent if it fails)
    Clock::time_point sent;
    Clock::time_point deadline;
  };
  // Rounds posted and not sent yet, to go as one forward.
  struct Pending {
    bool any = false;
    uint64_t ticket = 0;  // the latest round's
    std::vector<memory_ops::Range> ranges;
    std::vector<LeaseChange> leases;
    uint64_t bytes = 0;
  };

  BackupLink() = default;
  // Sends the pending forward. REQUIRES: pending_.any, fewer than kMaxInFlight in flight.
  void SendPending();
  // Fails every forward outstanding (in flight and pending) for `why`, and posts their ranges
  // again unless fenced, and their pools' root leases unless the mirror `refused` a forward
  // (answered with an error) rather than lost or not answered it.
  void Fail(const Status& why, bool refused);
  // Sleeps until the link has an event or a millisecond passes (after a short spin).
  void Wait(Clock::time_point spin_until);

  std::string name_;
  int id_ = 0;  // the backup's server id
  uint16_t primary_id_ = 0;
  uint16_t slot_ = 0;
  std::unique_ptr<control::Connection> mirror_;  // to the backup's mirror port
  const std::byte* region_ = nullptr;            // the primary's, from the first Post
  uint64_t posted_ = 0;
  uint64_t settled_ = 0;
  Clock::time_point acknowledged_sent_{};
  std::deque<Flight> in_flight_;  // oldest first
  Pending pending_;
  std::vector<Failure> failures_;
  uint64_t first_live_id_ = 0;  // replies to requests below it are dropped (their forward failed)
  bool misplaced_ = false;
};

}  // namespace farpool
