// Leases: which processes holding file locks are alive. Every process that takes file locks
// owns one of the store's 56 lease slots (layout.h: LeaseSlot) while it is attached; its slot
// number is its identity in every lock word (file_lock.h).
//
// How it works:
//   - Attach claims a free slot (CAS owner 0 → a token: random high bits, the process's pool
//     process tag in the low 32). A renewal thread adds 1 to
//     the slot's heartbeat every lease/8 and checks the owner is still its token.
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
//     clock (stopped, starved, or cut off from the pool), or whose slot was taken, has lost
//     the lease for good: Check() fails from then on and the VFS refuses to write. A process
//     stalled between Check() and a write is evicted before its locks are broken (above).
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
  // OK while this process holds its lease; the reason it lost it otherwise.
  Status Check() const;
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

  FileStore& store_;
  const SweepFn sweep_;
  const uint64_t token_;
  const std::chrono::milliseconds lease_;
  int slot_ = -1;

  std::atomic<int64_t> last_renewal_ns_{0};  // steady clock
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
  bool stop_ = false;  // GUARDED_BY(stop_mu_)
  std::thread renewal_;
};

}  // namespace farpool::files
