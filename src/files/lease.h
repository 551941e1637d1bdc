// Leases: which processes holding file locks are alive. Every process that takes file locks
// owns one of the store's 56 lease slots (layout.h: LeaseSlot) while it is attached; its slot
// number is its identity in every lock word (file_lock.h).
//
// How it works:
//   - Attach claims a free slot (CAS owner 0 → a token: random high bits, the process's pool
//     process tag in the low 32). A renewal thread adds 1 to
//     the slot's heartbeat every lease/8 and checks the owner is still its token. It is
//     connected to the servers before the claim, so its first renewal is not a connection
//     set-up (seconds under load, longer than lease + margin).
//   - An observer judges another slot by its own monotonic clock: a slot whose (owner,
//     heartbeat) has not changed for lease + margin since the observer first saw that value
//     is dead. No clocks are compared across hosts.
//   - A dead slot's lock bits are removed only by a sweep (file_lock.h: Reclaim): the sweeper
//     first evicts the dead token's process from every memory server (Pool::Evict: killed if
//     it maps the memory, disconnected otherwise), so that nothing it was about to write when
//     it stalled can land later; then it CASes the owner from the dead token to
//     kSweeping|its own token, clears the slot's bits
//     from every lock word, then frees the slot (or keeps it, when it reclaims the slot to
//     attach). So a slot's bits are never removed while a live owner holds the slot, and a
//     free slot has no bits anywhere. A sweeper that dies mid-sweep leaves the slot at
//     kSweeping|token with a heartbeat that no longer moves: it looks dead in turn and the
//     next observer sweeps again.
//   - Self-fencing: a process whose last successful renewal is older than the lease on its own
//     clock (stopped, starved, or cut off from the pool) holds no lease: Check() fails and the
//     VFS refuses to lock or write. A process stalled between Check() and a write is evicted
//     before its locks are broken (above).
//   - A renewal counts only if its reply came within the lease of the previous counted one's
//     sending: an add that landed later may have come after a sweeper judged the slot dead,
//     so the owner read with it proves nothing, and the lease is late (below).
//   - Taking a late lease up again: a stall that ends finds the slot either still ours or
//     swept. The late renewal (the renewal thread's, or Check()'s when it comes first) CASes
//     the owner from our token to a fresh one (same process tag, new random bits) with the
//     heartbeat's add, in one batch. A sweeper CASes the owner from our token too, after it
//     evicted us and before it touches a bit, so exactly one of the two CASes wins: if ours
//     does, no sweep of the old token can follow (a sweeper that judged it dead fails its CAS
//     with Aborted and leaves every bit alone), so no other process broke our locks and we go
//     on holding them; a sweeper that judges the new token needs lease + margin of silence
//     afresh. If the sweeper's CAS won (owner swept, freed or taken), or its eviction refused
//     our batch, the lease is lost for good: Check() says why (the VFS: SQLITE_IOERR), the
//     database must be reopened. A sweeper that evicted us but lost the CAS leaves us evicted
//     without a sweep: our later operations fail (killed over shared memory, refused over
//     TCP), never a write under a broken lock.
//
// Thread-safety: safe for concurrent use. REQUIRES: the store (and its pool) outlive this.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "files/file_store.h"

namespace farpool::files {

class LeaseTable {
 public:
  // Called with a dead slot already held as kSweeping|token: must remove the slot's bits
  // from every lock word.
  using SweepFn = std::function<Status(int slot)>;

  // Claims a slot; when none is free, waits up to 2 × (lease + margin) for one to be dead
  // and reclaims it. ResourceExhausted if all stay alive.
  static Result<std::unique_ptr<LeaseTable>> Attach(FileStore& store, SweepFn sweep);
  // Sweeps this process's own bits, frees the slot and stops the renewal thread.
  ~LeaseTable();

  int slot() const { return slot_; }
  // OK while this process holds its lease; the reason it lost it otherwise. A lease whose
  // renewal is late is taken up again here (one round trip) if nobody swept it (above).
  Status Check();
  // Whether `slot`'s owner is dead by this process's observations (the first look at a value
  // says no). A free slot is dead.
  Result<bool> Dead(int slot);
  // Removes a dead slot's lock bits (sweep) and frees it. OK also if another process got
  // there first.
  Status Reclaim(int slot);

  // Renewals attempted so far: one round trip each (what the VFS's round-trip count leaves
  // out, as it is not SQLite's work).
  uint64_t renewals() const { return renewals_.load(std::memory_order_relaxed); }
  std::chrono::milliseconds lease() const { return lease_; }
  std::chrono::milliseconds margin() const { return lease_ / 3; }

 private:
  LeaseTable(FileStore& store, SweepFn sweep, uint64_t token);
  GlobalAddress Slot(int slot) const;
  // Takes `slot` from `owner` (a dead token, or 0) for a sweep; Aborted if the owner changed.
  Status Sweep(int slot, uint64_t owner, bool keep);
  void Renew();
  // One renewal: the heartbeat's add, with the owner read (on time) or re-keyed to a fresh
  // token (late, above). Sets lost_ when the slot is no longer ours. REQUIRES: renew_mu_ held.
  Status RenewLocked();
  void Lose(std::string reason);
  // The reason the lease was lost, as Check() reports it. REQUIRES: lost_.
  Status LostStatus() const;

  FileStore& store_;
  const SweepFn sweep_;
  std::atomic<uint64_t> token_;  // changes only when a late lease is taken up (under renew_mu_)
  uint64_t retry_token_ =
      0;  // the fresh token of a take-up not known to have landed; GUARDED_BY(renew_mu_)
  const std::chrono::milliseconds lease_;
  int slot_ = -1;

  std::mutex renew_mu_;  // one renewal at a time (the thread's, or a late Check()'s)
  std::atomic<int64_t> last_renewal_ns_{0};  // steady clock, when the last successful one was sent
  std::atomic<uint64_t> renewals_{0};
  std::atomic<bool> lost_{false};
  mutable std::mutex lost_mu_;
  std::string lost_reason_;  // GUARDED_BY(lost_mu_)

  struct Seen {
    uint64_t owner = 0, heartbeat = 0;
    std::chrono::steady_clock::time_point since;
  };
  std::mutex seen_mu_;
  std::map<int, Seen> seen_;  // GUARDED_BY(seen_mu_)

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;     // GUARDED_BY(stop_mu_)
  bool claimed_ = false;  // GUARDED_BY(stop_mu_): slot_ is set; the thread starts renewing
  std::thread renewal_;   // started (and connected) by Attach before it claims a slot
};

}  // namespace farpool::files
