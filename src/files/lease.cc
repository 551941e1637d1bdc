#include "files/lease.h"

#include <unistd.h>

#include <future>
#include <random>

namespace farpool::files {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Random high bits (a new token for every attach), the process tag low: never 0 (the tag is
// not), never kSweeping.
uint64_t NewToken(uint32_t process_tag) {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ (uint64_t(getpid()) << 40);
  return (r & ~kSweeping & ~uint64_t{0xffffffff}) | process_tag;
}

}  // namespace

LeaseTable::LeaseTable(FileStore& store, SweepFn sweep, uint64_t token)
    : store_(store),
      sweep_(std::move(sweep)),
      token_(token),
      lease_(std::chrono::milliseconds(store.lease_ms())) {}

GlobalAddress LeaseTable::Slot(int slot) const {
  return store_.image() + offsetof(StoreImage, leases) + slot * sizeof(LeaseSlot);
}

Result<std::unique_ptr<LeaseTable>> LeaseTable::Attach(FileStore& store, SweepFn sweep) {
  auto table = std::unique_ptr<LeaseTable>(
      new LeaseTable(store, std::move(sweep), NewToken(store.pool().process_tag())));
  LeaseTable& t = *table;
  Pool& pool = store.pool();
  // The renewal thread connects before a slot is claimed: a thread's first use of a Pool and of
  // each server sets up its connections (include/farpool/pool.h), which under load took seconds
  // (docs/database.md, "Leases and fencing": the same cause evicted live database workers).
  // Done lazily it was the first renewal, and observers judged the fresh slot dead meanwhile.
  // It connects to every server the Pool knows (Pool::ConnectThread): also the one of them a
  // failover moves the slots to.
  std::promise<Status> connected;
  std::future<Status> ready = connected.get_future();
  t.renewal_ = std::thread([&t, connected = std::move(connected)]() mutable {
    connected.set_value(t.store_.pool().ConnectThread());
    t.Renew();
  });
  FARPOOL_RETURN_IF_ERROR(ready.get().WithContext("connecting the lease renewal thread"));
  const auto deadline = std::chrono::steady_clock::now() + 2 * (t.lease_ + t.margin());
  for (;;) {
    LeaseSlot slots[kLeaseSlots];
    FARPOOL_RETURN_IF_ERROR(
        pool.Read(t.Slot(0), slots, sizeof(slots)).WithContext("file store lease slots"));
    for (int i = 0; i < kLeaseSlots && t.slot_ < 0; ++i) {
      if (slots[i].owner != 0) continue;
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, pool.CompareAndSwap(t.Slot(i), 0, t.token_.load()));
      if (prev == 0) t.slot_ = i;
    }
    for (int i = 0; i < kLeaseSlots && t.slot_ < 0; ++i) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, t.Dead(i));
      if (!dead) continue;
      Status s = t.Sweep(i, slots[i].owner, /*keep=*/true);
      if (s.ok()) {
        uint64_t owner = 0;
        FARPOOL_RETURN_IF_ERROR(pool.Read(t.Slot(i), &owner, 8));
        if (owner == t.token_.load()) t.slot_ = i;
      } else if (s.code() != StatusCode::kAborted) {
        return s;
      }
    }
    if (t.slot_ >= 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::ResourceExhausted("file store: all " + std::to_string(kLeaseSlots) +
                                       " lease slots are held by live processes");
    }
    std::this_thread::sleep_for(t.lease_ / 8);
  }
  {
    std::lock_guard<std::mutex> lock(t.stop_mu_);
    t.last_renewal_ns_ = NowNs();
    t.claimed_ = true;
  }
  t.stop_cv_.notify_all();
  return table;
}

LeaseTable::~LeaseTable() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (renewal_.joinable()) renewal_.join();
  if (slot_ >= 0 && !lost_) (void)Sweep(slot_, token_.load(), /*keep=*/false);
}

void LeaseTable::Renew() {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stop_cv_.wait(lock, [this] { return stop_ || claimed_; });
  while (!stop_cv_.wait_for(lock, lease_ / 8, [this] { return stop_; })) {
    std::lock_guard<std::mutex> renewing(renew_mu_);
    if (lost_) return;
    (void)RenewLocked();  // a failed one is tried again next time; Check() reports lateness
    if (lost_) return;
  }
}

void LeaseTable::Lose(std::string reason) {
  std::lock_guard<std::mutex> l(lost_mu_);
  if (!lost_) lost_reason_ = std::move(reason);
  lost_ = true;
}

Status LeaseTable::LostStatus() const {
  std::lock_guard<std::mutex> l(lost_mu_);
  return Status::IoError(lost_reason_);
}

Status LeaseTable::RenewLocked() {
  Pool& pool = store_.pool();
  const GlobalAddress slot = Slot(slot_);
  const int64_t now = NowNs();
  const int64_t gap_ms = (now - last_renewal_ns_) / 1000000;
  const bool late = gap_ms > lease_.count();
  const uint64_t token = token_;
  // Late: the owner is re-keyed (header comment). The fresh token is kept across failed
  // attempts, so a CAS that landed but whose reply was lost is recognised next time.
  if (late && retry_token_ == 0) retry_token_ = NewToken(pool.process_tag());
  uint64_t heartbeat = 0, owner = 0;
  Batch batch(pool);  // one round trip
  Status s = late ? batch.CompareAndSwap(slot, token, retry_token_, &owner)
                  : batch.FetchAdd(slot + offsetof(LeaseSlot, heartbeat), 1, &heartbeat);
  if (s.ok() && !late) s = batch.Read(slot, &owner, 8);  // to see we still own it
  if (s.ok()) s = batch.Wait();
  renewals_.fetch_add(1, std::memory_order_relaxed);
  if (!s.ok()) return s;
  const int64_t reply_ms = (NowNs() - last_renewal_ns_) / 1000000;
  if (!late && reply_ms > lease_.count()) {
    // The add may have landed after a sweeper judged the slot dead (lease + margin after the
    // previous one), so the owner read with it proves nothing: the next attempt is late and
    // re-keys.
    return Status::TimedOut("lease slot " + std::to_string(slot_) + ": renewal answered " +
                            std::to_string(reply_ms) + " ms after the previous one");
  }
  if (late && (owner == token || owner == retry_token_)) {
    token_ = retry_token_;
    retry_token_ = 0;
  } else if (owner != token) {
    Lose(late ? "lease slot " + std::to_string(slot_) + " was not renewed for " +
                    std::to_string(gap_ms) + " ms (lease " + std::to_string(lease_.count()) +
                    " ms) and another process swept it meanwhile: this process's locks were "
                    "broken"
              : "lease slot " + std::to_string(slot_) + " was reclaimed by another process");
    return LostStatus();
  }
  last_renewal_ns_ = now;
  return Status::Ok();
}

Status LeaseTable::Check() {
  if (lost_) return LostStatus();
  if ((NowNs() - last_renewal_ns_) / 1000000 <= lease_.count()) return Status::Ok();
  // Late (this process stalled, or its renewals did): take the lease up again if nobody swept.
  std::lock_guard<std::mutex> renewing(renew_mu_);
  const int64_t age_ms = (NowNs() - last_renewal_ns_) / 1000000;
  if (!lost_ && age_ms > lease_.count()) {
    Status s = RenewLocked();
    if (!s.ok() && !lost_) {
      return Status::IoError("lease slot " + std::to_string(slot_) + " was last renewed " +
                             std::to_string(age_ms) + " ms ago (lease " +
                             std::to_string(lease_.count()) +
                             " ms) and could not be taken up again: " + s.ToString());
    }
  }
  return lost_ ? LostStatus() : Status::Ok();
}

Result<bool> LeaseTable::Dead(int slot) {
  LeaseSlot now;
  FARPOOL_RETURN_IF_ERROR(store_.pool().Read(Slot(slot), &now, sizeof(now)));
  if (now.owner == 0) return true;
  if (now.owner == token_.load()) return false;
  const auto t = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(seen_mu_);
  Seen& seen = seen_[slot];
  if (seen.since == std::chrono::steady_clock::time_point() || seen.owner != now.owner ||
      seen.heartbeat != now.heartbeat) {
    seen = {now.owner, now.heartbeat, t};
    return false;
  }
  return t - seen.since > lease_ + margin();
}

Status LeaseTable::Reclaim(int slot) {
  if (slot == slot_) return Status::Internal("lease slot " + std::to_string(slot) + " is ours");
  uint64_t owner = 0;
  FARPOOL_RETURN_IF_ERROR(store_.pool().Read(Slot(slot), &owner, 8));
  Status s = Sweep(slot, owner, /*keep=*/false);
  return s.code() == StatusCode::kAborted ? Status::Ok() : s;
}

Status LeaseTable::Sweep(int slot, uint64_t owner, bool keep) {
  Pool& pool = store_.pool();
  const uint64_t sweeping = kSweeping | token_.load();
  // Another process's slot (or its unfinished sweep): that process is shut out of the pool
  // first, so that a write it was about to make when it stalled can never land after its locks
  // are gone. One of this process's own Pools that maps the memory cannot be evicted: wait.
  const uint32_t tag = static_cast<uint32_t>(owner);
  if (owner != 0 && tag != pool.process_tag()) {
    Status evicted = pool.Evict(tag);
    if (evicted.code() == StatusCode::kInvalidArgument) {
      return Status::Aborted("lease slot " + std::to_string(slot) + ": " + evicted.message());
    }
    FARPOOL_RETURN_IF_ERROR(evicted.WithContext("lease slot " + std::to_string(slot)));
  }
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, pool.CompareAndSwap(Slot(slot), owner, sweeping));
  if (prev != owner) {
    return Status::Aborted("lease slot " + std::to_string(slot) + " changed owner");
  }
  FARPOOL_RETURN_IF_ERROR(sweep_(slot).WithContext("sweeping lease slot " + std::to_string(slot)));
  FARPOOL_ASSIGN_OR_RETURN(prev,
                           pool.CompareAndSwap(Slot(slot), sweeping, keep ? token_.load() : 0));
  {
    std::lock_guard<std::mutex> lock(seen_mu_);
    seen_.erase(slot);
  }
  if (prev != sweeping) {
    return Status::Aborted("lease slot " + std::to_string(slot) +
                           " was taken over during the sweep");
  }
  return Status::Ok();
}

}  // namespace farpool::files
