// Session slots, leases and fencing, the renewal and maintenance threads, and Begin
// (nam_internal.h has the rules; docs/database.md "Leases and fencing" the reasoning).
#include <unistd.h>

#include <algorithm>
#include <future>

#include "db/nam/nam_internal.h"

namespace farpool::db {

// ================================================================ leases

bool NamDatabase::ObservedExpired(uint32_t slot, uint64_t owner, int64_t read_at) {
  if (OwnerState(owner) == kSlotRecovering && OwnerTag(owner) == 0) return true;
  // A first sighting counts from now, after its read completed: the later of the two bounds,
  // as a judgment must never come early.
  const int64_t now = MonoNs();
  std::lock_guard<std::mutex> l(observe_mu_);
  Observed& o = observed_[slot];
  if (o.since == 0 || o.owner != owner) {
    o = {owner, now};
    return false;
  }
  const int64_t expiry = lease_ns() + margin_ns();
  // Silence counts only while the slots' memory took this process's own renewals in time.
  int64_t from = o.since;
  {
    std::lock_guard<std::mutex> h(renewal_health_mu_);
    if (!renewals_in_flight_.empty() && now - *renewals_in_flight_.begin() > SlowRenewalNs()) {
      return false;
    }
    from = std::max(from, renewal_trouble_at_);
  }
  // However troubled the memory was, a word unchanged this long is judged (a dead process's
  // locks must not wait for ever on an observer whose renewals are often slow).
  const int64_t cap = std::max<int64_t>(kMaxSilenceDeferral * expiry, kMinSilenceCapNs);
  return read_at - from > expiry || read_at - o.since > cap;
}

void NamDatabase::RenewalSent(int64_t sent) {
  std::lock_guard<std::mutex> h(renewal_health_mu_);
  renewals_in_flight_.insert(sent);
}

void NamDatabase::RenewalDone(int64_t sent, bool failed) {
  const int64_t now = MonoNs();
  std::lock_guard<std::mutex> h(renewal_health_mu_);
  renewals_in_flight_.erase(renewals_in_flight_.find(sent));
  if (failed || now - sent > SlowRenewalNs()) {
    renewal_trouble_at_ = std::max(renewal_trouble_at_, now);
  }
}

Status NamDatabase::Renew(const Access& access, SlotLease& lease) {
  std::lock_guard<std::mutex> l(lease.renew_mu);
  if (lease.fenced) {
    return Status::Unavailable("session slot " + std::to_string(lease.slot) + " was fenced");
  }
  const int64_t sent = MonoNs();
  uint64_t next = OwnerRenewed(lease.owner);
  RenewalSent(sent);
  Hook("renewal.sent");
  Result<uint64_t> cas = access.Cas(SlotAddr(lease.slot), lease.owner, next);
  if (cas.ok() && *cas == next) {
    // The word this renewal writes is there already: an earlier renewal whose reply was lost
    // (a failover cut it) landed. Nobody else writes our epoch's words, so the slot is ours;
    // renewed again from that word, so that the trusted window counts from a send of now.
    lease.owner = next;
    next = OwnerRenewed(next);
    cas = access.Cas(SlotAddr(lease.slot), lease.owner, next);
  }
  RenewalDone(sent, !cas.ok());
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, std::move(cas));
  if (prev != lease.owner) {
    lease.fenced = true;
    lease.valid_until = 0;
    return Status::Unavailable("session slot " + std::to_string(lease.slot) +
                               " was fenced: this process stalled longer than the lease (" +
                               std::to_string(root_.lease_ms) + " ms) and others recovered it");
  }
  lease.owner = next;
  lease.valid_until = sent + lease_ns() - margin_ns();
  return Status::Ok();
}

Status NamDatabase::CheckLease(const Access& access, SlotLease& lease) {
  if (lease.fenced.load(std::memory_order_relaxed)) {
    return Status::Unavailable("session slot " + std::to_string(lease.slot) +
                               " lost its lease (fenced); open a new session");
  }
  if (MonoNs() < lease.valid_until.load(std::memory_order_relaxed)) return Status::Ok();
  RoundTripScope cause(RoundTripCause::kOther);  // renewed in line: none of the step's own
  return Renew(access, lease);
}

void NamDatabase::Register(const std::shared_ptr<SlotLease>& lease) {
  std::lock_guard<std::mutex> l(mu_);
  leases_.push_back(lease);
}

void NamDatabase::Unregister(const SlotLease* lease) {
  std::lock_guard<std::mutex> l(mu_);
  leases_.erase(std::remove_if(leases_.begin(), leases_.end(),
                               [&](const auto& p) { return p.get() == lease; }),
                leases_.end());
}

Result<bool> NamDatabase::HolderDead(const Access& access, uint64_t word) {
  const uint32_t slot = LockSlot(word);
  const uint64_t epoch = LockEpoch(word) & kOwnerEpochMask;
  if (slot >= root_.max_slots) {
    return Status::Internal("a lock word names session slot " + std::to_string(slot) +
                            " (the database has " + std::to_string(root_.max_slots) + ")");
  }
  uint64_t owner;
  const int64_t read_at = MonoNs();
  FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(slot), &owner, 8));
  const uint64_t st = OwnerState(owner);
  if (OwnerEpoch(owner) != epoch) {
    // The holder's epoch is over. Every state but "recovering" comes after its log was rolled
    // forward; a recovery that stalls is taken over like an expired session.
    if (st != kSlotRecovering) return true;
    if (!ObservedExpired(slot, owner, read_at)) return false;
    return FenceAndRecover(access, slot, owner, kSlotFree);
  }
  // Same epoch. A slot freed by its own session had its log finished first (see ~NamSession):
  // a lock still carrying its word is from a commit that was never decided.
  if (st == kSlotFree) return true;
  if (st == kSlotActive && ObservedExpired(slot, owner, read_at)) {
    return FenceAndRecover(access, slot, owner, kSlotFree);
  }
  return false;
}

Result<std::shared_ptr<SlotLease>> NamDatabase::ClaimSlot(const Access& access, SlotImage* image) {
  for (uint32_t s = 0; s < root_.max_slots; ++s) {
    const int64_t read_at = MonoNs();
    FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(s), image, sizeof(*image)));
    const uint64_t st = OwnerState(image->owner);
    if (st != kSlotFree && !ObservedExpired(s, image->owner, read_at)) continue;
    // A free slot is claimed through the recovering state too, so that nobody mistakes the
    // previous epoch's locks for broken before its log (if any) is finished.
    const int64_t sent = MonoNs();
    uint64_t owner = 0;
    FARPOOL_ASSIGN_OR_RETURN(bool claimed,
                             FenceAndRecover(access, s, image->owner, kSlotActive, &owner));
    if (!claimed) continue;
    auto lease = std::make_shared<SlotLease>();
    lease->slot = s;
    lease->epoch = OwnerEpoch(owner);
    lease->owner = owner;
    lease->valid_until = sent + lease_ns() - margin_ns();
    // Renewed from now on: what follows allocates (lease requests to the servers), and so does
    // the caller (stamp words; Open starts the renewal thread before its system session). Were
    // it registered only once set up, a slow start under load went unrenewed for lease +
    // margin and others evicted the starting process (db_process_test, 2026-11-28).
    Register(lease);
    Hook("session.claimed");
    auto set_up = [&]() -> Status {
      FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(s), image, sizeof(*image)));
      const uint64_t pid = static_cast<uint64_t>(getpid());
      FARPOOL_RETURN_IF_ERROR(access.Write(SlotAddr(s) + kSlotPid, &pid, 8));
      // The slot's log areas, allocated by its first owner and kept by the slot. Published by
      // CAS from 0, so a claimer that was fenced while allocating never replaces the areas of
      // the slot's next owner (whose decided commits recovery finds there).
      auto area = [&](uint64_t field, uint64_t bytes, uint64_t* raw) -> Status {
        if (*raw != 0) return Status::Ok();
        FARPOOL_ASSIGN_OR_RETURN(GlobalAddress a, AllocZeroed(access, bytes, Placement::Striped()));
        FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(SlotAddr(s) + field, 0, a.raw()));
        *raw = prev == 0 ? a.raw() : prev;
        return Status::Ok();
      };
      FARPOOL_RETURN_IF_ERROR(area(kSlotLog, kLogBytes, &image->log));
      FARPOOL_RETURN_IF_ERROR(area(kSlotIndexLog, LockOwner::kIndexLogBytes, &image->index_log));
      const uint64_t idle = 0;
      return access.Write(AnnounceAddr(s), &idle, 8);
    };
    Status ready = set_up();
    if (!ready.ok()) {
      // Given up: this process fences and recovers it itself (left to expire, others would
      // evict this live process first).
      Unregister(lease.get());
      {
        std::lock_guard<std::mutex> l(lease->renew_mu);
        lease->fenced = true;
      }
      GaveUp(s, lease->owner);
      return ready;
    }
    return lease;
  }
  return Status::ResourceExhausted("all " + std::to_string(root_.max_slots) +
                                   " session slots of the database are held by live sessions");
}

Result<std::unique_ptr<NamSession>> NamDatabase::OpenSession(const Access& access) {
  SlotImage image;
  FARPOOL_ASSIGN_OR_RETURN(auto lease, ClaimSlot(access, &image));
  auto session =
      std::make_unique<NamSession>(*this, std::move(lease), GlobalAddress::FromRaw(image.log),
                                   GlobalAddress::FromRaw(image.index_log));
  FARPOOL_RETURN_IF_ERROR(BTree::RecoverRedo(session->access_, *session, session->index_log()));
  // Its stamp words now, on every server: a session's footprint is whole from its start, and
  // no commit pays for an allocation.
  for (uint16_t server : access.memory().servers()) {
    FARPOOL_RETURN_IF_ERROR(session->StampWord(server).status());
  }
  return session;
}

Result<std::unique_ptr<Session>> NamDatabase::NewSession() {
  FARPOOL_ASSIGN_OR_RETURN(auto session, OpenSession(access_));
  return std::unique_ptr<Session>(std::move(session));
}

std::chrono::milliseconds NamDatabase::IndexWaitLimit() const {
  return std::max(std::chrono::milliseconds(10000), std::chrono::milliseconds(3 * root_.lease_ms));
}

void NamDatabase::NoteCounter(uint64_t c) {
  uint64_t cur = latest_counter_.load(std::memory_order_relaxed);
  while (c > cur && !latest_counter_.compare_exchange_weak(cur, c, std::memory_order_relaxed)) {
  }
}

// ================================================================ background threads

// Two threads per process. The renewal thread renews the leases that are due and marks
// long-idle sessions idle: a CAS per due lease and nothing that waits for more than a
// session's own short critical sections, so a renewal is late by at most the renewal period
// and a few round trips. The maintenance thread
// (every kGcPeriod) computes the LWM while fencing expired slots (recovering a dead session
// takes as long as its log) and frees retired chains, deleted records and dropped tables (a
// dropped table takes as long as it is big). When both shared one thread, a long reclamation
// delayed renewals past the lease and others fenced this process's live sessions.
namespace {
constexpr auto kGcPeriod = std::chrono::milliseconds(10);
constexpr int64_t kIdleAfterNs = 50'000'000;
}  // namespace

void NamDatabase::RunEvery(std::chrono::milliseconds period, const bool* stop,
                           const std::function<void()>& pass) {
  std::unique_lock<std::mutex> sl(stop_mu_);
  while (!*stop) {
    stop_cv_.wait_for(sl, period);
    if (*stop) break;
    sl.unlock();
    pass();
    sl.lock();
  }
}

void NamDatabase::StopThread(bool* stop, std::thread& thread) {
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    *stop = true;
  }
  stop_cv_.notify_all();
  if (thread.joinable()) thread.join();
}

// Errors of a pass are transient (a server being slow or gone): the next pass tries again,
// and a lease that cannot be renewed simply runs out, which every user of it checks.
//
// The thread connects first, and Open claims no slot before it has: a thread's first memory
// operation on a Pool, and its first on each server, set up its connections (a UCX worker, then
// an endpoint and a hello round trip per server; include/farpool/pool.h), even on mapped memory
// where the operation itself is a CPU instruction. So it connects to every server at once
// (Memory::ConnectThread): the slots' server, and whichever of the servers the pool knows takes
// the slots over in a failover.
// Done lazily, that set-up was the first renewal, lease/4 after the claim, and under load it took
// up to 5 s (2 cores, load 7-14, 2026-11-28: p50 0.6 s, p90 1.8 s) while others judged the slot
// expired after lease + margin (2.5 s at the default lease) and evicted the live process
// (SiHistoryTest.ListAppendHistoryWithLockingReads...; its sessions' own lease checks waited for
// the renewal under SlotLease::mu meanwhile). DbProcessTest.SlowRenewalConnectIsNotEvicted replays
// it (hook "renewals.connect").
Status NamDatabase::StartRenewals() {
  // Renewals are due every lease/4; looking 8 times per lease keeps them on time.
  const auto renew_period = std::clamp(std::chrono::milliseconds(root_.lease_ms / 8),
                                       std::chrono::milliseconds(1), kGcPeriod);
  std::promise<Status> connected;
  std::future<Status> ready = connected.get_future();
  renewals_ = std::thread([this, renew_period, connected = std::move(connected)]() mutable {
    Hook("renewals.connect");
    connected.set_value(memory_.ConnectThread());
    RunEvery(renew_period, &stop_renewals_, [this] { (void)RenewAll(access_); });
  });
  return ready.get().WithContext("connecting the lease renewal thread");
}

void NamDatabase::StartMaintenance() {
  maintenance_ = std::thread([this] {
    RunEvery(kGcPeriod, &stop_maintenance_, [this] {
      MarkIdle(access_);
      (void)ScanSlots(access_);
      (void)ReclaimRetired(access_);
      (void)SweepOrphans(access_);
      (void)ReturnIdleMemory(access_);
    });
  });
}

std::vector<std::shared_ptr<SlotLease>> NamDatabase::Leases() {
  std::lock_guard<std::mutex> l(mu_);
  return leases_;
}

Status NamDatabase::RenewAll(const Access& access) {
  const std::vector<std::shared_ptr<SlotLease>> leases = Leases();
  const int64_t now = MonoNs();
  Status first;
  for (auto& lease : leases) {
    if (lease->fenced) continue;
    // Renew every lease/4 (the trusted window is lease - margin from the last renewal).
    if (lease->valid_until.load() - now < lease_ns() - margin_ns() - lease_ns() / 4) {
      Status s = Renew(access, *lease);
      if (!s.ok() && first.ok()) first = s;
    }
  }
  return first;
}

void NamDatabase::MarkIdle(const Access& access) {
  const std::vector<std::shared_ptr<SlotLease>> leases = Leases();
  const int64_t now = MonoNs();
  for (auto& lease : leases) {
    // The announcement word is the slot owner's: written only while our lease is certainly
    // valid (a fenced or closed session's slot may belong to someone else by now).
    std::unique_lock<std::mutex> l(lease->mu, std::try_to_lock);
    if (l.owns_lock() && lease->open == 0 && lease->announced != 0 && !lease->fenced &&
        now - lease->idle_since > kIdleAfterNs && MonoNs() < lease->valid_until.load()) {
      // Forget the old value first: if the write's outcome is unknown, the next Begin takes
      // the synchronous path.
      lease->announced = 0;
      const uint64_t idle = 0;
      Hook("idle.marking");
      (void)access.Write(AnnounceAddr(lease->slot), &idle, 8);
    }
  }
}

void NamDatabase::GaveUp(uint32_t slot, uint64_t owner, bool replace) {
  // Over messages without replicas a failed operation may be one a live server has not
  // executed yet (a timeout), which could land after the take-over: only an eviction shuts it
  // out. There the slot is left to expire, and whoever fences it evicts this process first.
  // With replicas the failures that abandon sessions are failovers (the old server dead, or
  // serving nothing since before the move); on mapped memory an operation is a CPU access.
  if (!memory_.replicated() && !memory_.mapped()) return;
  std::lock_guard<std::mutex> l(mu_);
  const GivenUp entry{owner, MonoNs()};
  if (replace) {
    given_up_[slot] = entry;
  } else {
    given_up_.try_emplace(slot, entry);
  }
}

std::set<uint32_t> NamDatabase::TakeOverGivenUp(const Access& access,
                                                const std::vector<SlotImage>& slots,
                                                int64_t read_at) {
  std::map<uint32_t, GivenUp> given_up;
  {
    std::lock_guard<std::mutex> l(mu_);
    given_up = given_up_;
  }
  std::set<uint32_t> taken;
  for (const auto& [slot, entry] : given_up) {
    // Given up after the slots were read: `slots` may show a word from before (judged at the
    // next pass).
    if (entry.at >= read_at) continue;
    const uint64_t owner = entry.owner;
    const uint64_t word = slots[slot].owner;
    // Ours still, as last written (or renewed once more by a renewal whose reply was lost, or
    // fenced by a CAS of ours whose reply was lost: recovering under our tag).
    const bool ours =
        word == owner || word == OwnerRenewed(owner) ||
        (OwnerState(word) == kSlotRecovering && OwnerTag(word) == memory_.process_tag());
    if (ours) {
      auto fenced = FenceAndRecover(access, slot, word, kSlotFree);
      if (!fenced.ok()) continue;  // tried again at the next pass
      if (*fenced) taken.insert(slot);
    }
    std::lock_guard<std::mutex> l(mu_);
    // A thread of ours recovering it may still give it up again (its tag-0 CAS may fail).
    if (recovering_here_.count(slot)) continue;
    auto it = given_up_.find(slot);
    if (it != given_up_.end() && it->second.owner == owner) given_up_.erase(it);
  }
  return taken;
}

Status NamDatabase::ScanSlots(const Access& access) {
  const uint64_t n = root_.max_slots;
  std::set<uint32_t> mine;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& lease : leases_) {
      if (!lease->fenced) mine.insert(lease->slot);
    }
  }
  // The counter first, then the announcements (see nam_internal.h: a session announces before
  // it reads the counter, so one that we see idle gets a snapshot >= this counter).
  uint64_t word;
  FARPOOL_RETURN_IF_ERROR(access.Read(RootField(kRootCounter), &word, 8));
  const uint64_t counter = CounterOf(word);
  std::vector<SlotImage> slots(n);
  std::vector<uint64_t> announced(n);
  // Fencing a slot below takes a while (eviction, recovery): the slots after it are judged as
  // of this read, not as of when the loop reaches them.
  const int64_t read_at = MonoNs();
  {
    Access::Batch b(access);
    FARPOOL_RETURN_IF_ERROR(b.Read(SlotAddr(0), slots.data(), n * kSlotSize));
    FARPOOL_RETURN_IF_ERROR(b.Read(AnnounceAddr(0), announced.data(), n * 8));
    FARPOOL_RETURN_IF_ERROR(b.Wait());
  }
  Hook("slots.read");
  uint64_t lwm = counter;
  uint64_t live = 0;
  const std::set<uint32_t> given_up = TakeOverGivenUp(access, slots, read_at);
  for (uint32_t s = 0; s < n; ++s) {
    const uint64_t st = OwnerState(slots[s].owner);
    if (st == kSlotFree || given_up.count(s)) continue;
    if (!mine.count(s) && ObservedExpired(s, slots[s].owner, read_at)) {
      auto fenced = FenceAndRecover(access, s, slots[s].owner, kSlotFree);
      if (fenced.ok() && *fenced) continue;
    }
    if (st == kSlotActive && announced[s] != 0) {
      lwm = std::min(lwm, announced[s] & ~kAnnounceRecordsOnly);
      ++live;
    }
  }
  NoteCounter(counter);
  uint64_t cur = lwm_.load();
  while (lwm > cur && !lwm_.compare_exchange_weak(cur, lwm)) {
  }
  live_sessions_ = live;
  return Status::Ok();
}

Result<GcStats> NamDatabase::CollectGarbage() {
  FARPOOL_RETURN_IF_ERROR(ScanSlots(access_));
  FARPOOL_RETURN_IF_ERROR(ReclaimRetired(access_));
  FARPOOL_RETURN_IF_ERROR(SweepOrphans(access_));
  FARPOOL_RETURN_IF_ERROR(ReturnIdleMemory(access_));
  GcStats g;
  g.lwm = lwm();
  g.live_sessions = live_sessions_;
  g.versions_dropped = gc_.dropped;
  g.versions_spilled = gc_.spilled;
  g.chains_cut = gc_.chains_cut;
  g.nodes_freed = gc_.nodes_freed;
  g.blobs_freed = gc_.blobs_freed;
  g.tables_reclaimed = gc_.tables_reclaimed;
  g.records_removed = gc_.records_removed;
  const Recycler::Stats r = recycler_->stats();
  g.objects_reused = r.reused;
  g.objects_fresh = r.fresh;
  g.chunks_opened = r.chunks_opened;
  g.chunks_released = r.chunks_released;
  return g;
}

// ================================================================ NamSession

NamSession::NamSession(NamDatabase& db, std::shared_ptr<SlotLease> lease, GlobalAddress log,
                       GlobalAddress index_log)
    : db_(db),
      lease_(std::move(lease)),
      log_(log),
      index_log_(index_log),
      access_(db.memory(), count_) {}

NamSession::~NamSession() {
  db_.Unregister(lease_.get());
  // From here on nothing of ours writes to the slot but this destructor (the renewal thread
  // may hold a copy of the lease: it sees it fenced).
  const bool valid = CheckLease().ok();
  uint64_t owner;
  bool fenced_before;  // abandoned (given up then), or fenced by another
  {
    std::lock_guard<std::mutex> l(lease_->renew_mu);  // no renewal of it runs after this
    fenced_before = lease_->fenced.exchange(true);
    owner = lease_->owner;
  }
  if (fenced_before) return;
  // Not freed (an error, a lapsed lease): this process fences and recovers it itself.
  if (!valid || !FreeSlot()) db_.GaveUp(lease_->slot, owner);
}

bool NamSession::FreeSlot() {
  // The last commit's log, finished but whole (see log_to_clear_), is cleared; a decided
  // commit left unfinished (an error after the decision) is finished first.
  if (log_to_clear_ != 0) {
    if (MonoNs() >= lease_->valid_until.load()) return false;
    auto prev = access_.Cas(log_, log_to_clear_, 0);
    if (!prev.ok() || *prev != log_to_clear_) return false;
  }
  LogHeader h;
  if (!access_.Read(log_, &h, 8).ok()) return false;
  if (LogDecided(h.state) &&
      !db_.RecoverLog(access_, lease_->slot, lease_->valid_until.load()).ok()) {
    return false;
  }
  if (MonoNs() >= lease_->valid_until.load()) return false;
  // No log names the stamp words any more.
  for (const auto& [server, word] : stamp_words_) (void)access_.Free(word);
  const uint64_t idle = 0;
  (void)access_.Write(db_.AnnounceAddr(lease_->slot), &idle, 8);
  std::lock_guard<std::mutex> l(lease_->renew_mu);
  auto prev = access_.Cas(db_.SlotAddr(lease_->slot), lease_->owner,
                          OwnerWord(lease_->epoch, kSlotFree, 0));
  // Another word: fenced, the slot is someone else's now (GaveUp finds it so), or renewed by
  // a renewal whose reply was lost (still ours). An error: the outcome is unknown.
  return prev.ok() && *prev == lease_->owner;
}

const TxnCounters& NamSession::counters() const {
  counters_.reads = count_.reads.load(std::memory_order_relaxed);
  counters_.writes = count_.writes.load(std::memory_order_relaxed);
  counters_.cas = count_.cas.load(std::memory_order_relaxed);
  counters_.faa = count_.faa.load(std::memory_order_relaxed);
  counters_.round_trips = count_.round_trips.load(std::memory_order_relaxed);
  for (size_t i = 0; i < kRoundTripCauses; ++i)
    counters_.round_trips_by_cause[i] = count_.by_cause[i].load(std::memory_order_relaxed);
  return counters_;
}

Result<bool> NamSession::HolderDead(uint64_t word) { return db_.HolderDead(access_, word); }

Status NamSession::CheckLease() { return db_.CheckLease(access_, *lease_); }

Result<GlobalAddress> NamSession::IndexLogOf(uint64_t word) {
  const uint32_t slot = LockSlot(word);
  if (slot >= db_.root().max_slots) {
    return Status::Internal("a lock word names session slot " + std::to_string(slot));
  }
  uint64_t raw;
  FARPOOL_RETURN_IF_ERROR(access_.Read(db_.SlotAddr(slot) + kSlotIndexLog, &raw, 8));
  return GlobalAddress::FromRaw(raw);
}

void NamSession::FaultPoint(std::string_view point) { db_.Hook(point); }

Status NamSession::ClearLog() {
  RoundTripScope cause(RoundTripCause::kOther);  // a round trip of its own (none took it along)
  FARPOOL_RETURN_IF_ERROR(CheckLease());
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access_.Cas(log_, log_to_clear_, 0));
  const uint64_t expected = log_to_clear_;
  log_to_clear_ = 0;
  if (prev != expected) {
    return Status::Unavailable("session slot " + std::to_string(lease_->slot) +
                               ": its finished commit log was cleared by someone else (the "
                               "session was fenced); open a new session");
  }
  return Status::Ok();
}

Result<GlobalAddress> NamSession::StampWord(uint16_t server) {
  auto known = stamp_words_.find(server);
  if (known != stamp_words_.end()) return known->second;
  auto word = access_.Alloc(sizeof(StampWordImage), Placement::OnServer(server));
  if (!word.ok()) return word.status().WithContext("a commit's stamp word");
  stamp_words_.emplace(server, *word);
  return *word;
}

Result<GlobalAddress> NamSession::AllocObject(const Access& access, uint64_t size,
                                              Placement placement) {
  return db_.recycler().Alloc(access, *this, size, placement);
}

Status NamSession::FreeObject(const Access& access, GlobalAddress address, uint64_t size) {
  return db_.recycler().Free(access, *this, address, size);
}

void NamSession::Abandon() {
  uint64_t owner;
  {
    std::lock_guard<std::mutex> l(lease_->renew_mu);
    if (lease_->fenced) return;  // fenced by another, or given up already
    lease_->fenced = true;
    owner = lease_->owner;
  }
  lease_->valid_until = 0;
  db_.GaveUp(lease_->slot, owner);
}

uint64_t NamSession::CacheKey(const NamTable& t, int64_t key) {
  return Mix64((t.incarnation_ << 40) ^ (uint64_t(t.id_) << 32)) ^ static_cast<uint64_t>(key);
}

Result<GlobalAddress> NamSession::FindRecord(const NamTable& t, int64_t key) {
  const GlobalAddress cached = CachedRecord(t, key);
  if (!cached.is_null()) return cached;
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress rec, t.hash_->Lookup(access_, key));
  if (!rec.is_null()) RememberRecord(t, key, rec);
  return rec;
}

GlobalAddress NamSession::CachedRecord(const NamTable& t, int64_t key) const {
  auto it = cache_.find(CacheKey(t, key));
  return it == cache_.end() ? GlobalAddress() : it->second;
}

void NamSession::ForgetRecord(const NamTable& t, int64_t key) { cache_.erase(CacheKey(t, key)); }

void NamSession::RememberRecord(const NamTable& t, int64_t key, GlobalAddress record) {
  constexpr size_t kAddressCacheLimit = 1 << 20;
  if (cache_.size() >= kAddressCacheLimit) cache_.clear();
  cache_[CacheKey(t, key)] = record;
}

Status NamSession::PostSnapshot(Access::Batch& batch, SnapshotRead* read, bool versions) {
  // The announcement word is the slot owner's: a session fenced since Begin (its slot may have
  // a new owner by now) must not write it. A clock read, right before the write (Renew, if it
  // is due, takes l.renew_mu itself).
  FARPOOL_RETURN_IF_ERROR(CheckLease());
  SlotLease& l = *lease_;
  std::lock_guard<std::mutex> g(l.mu);
  read->floor = std::max<uint64_t>(1, db_.latest_counter());
  if (!versions) read->floor |= kAnnounceRecordsOnly;
  read->raised = false;
  // A records-only announcement does not protect versions: one that does replaces it before
  // the counter is read, as from idle (with a transaction open, at the bound it had).
  const bool upgrade = versions && (l.announced & kAnnounceRecordsOnly) != 0;
  if ((l.open == 0 && l.announced == 0) || upgrade) {
    // From idle: the bound must be visible before the counter is read.
    const uint64_t bound = l.open == 0 ? read->floor : l.announced & ~kAnnounceRecordsOnly;
    FaultPoint("snapshot.announcing");
    Status s = access_.Write(db_.AnnounceAddr(l.slot), &bound, 8);
    if (!s.ok()) {
      if (l.open == 0) l.idle_since = MonoNs();
      return s.WithContext("announcing a snapshot");
    }
    l.announced = bound;
  } else if (l.open == 0) {
    // Announced already: raise it in the same round (the smaller bound protects meanwhile).
    // With another transaction of this session open, the announcement protects its older
    // snapshot, and so ours: it is not raised.
    FARPOOL_RETURN_IF_ERROR(batch.Write(db_.AnnounceAddr(l.slot), &read->floor, 8));
    read->raised = true;
  }
  // From here the announcement is ours until FinishSnapshot: the maintenance thread leaves
  // the announcement of a session with open transactions alone.
  ++l.open;
  Status s = batch.Read(db_.RootField(kRootCounter), &read->word, 8);
  if (s.ok() && log_to_clear_ != 0) {
    // The last commit's log, finished: cleared in this round, before any later lock.
    read->clearing = log_to_clear_;
    s = batch.Cas(log_, log_to_clear_, 0, &read->clear_prev);
  }
  if (!s.ok()) {
    // The raise, if posted, writes a bound that is still below any later snapshot.
    if (--l.open == 0) l.idle_since = MonoNs();
    return s;
  }
  return Status::Ok();
}

Result<uint64_t> NamSession::FinishSnapshot(const SnapshotRead& read, const Status& batch_status,
                                            bool* cache_cleared) {
  constexpr int64_t kCacheIdleNs = 1'000'000'000;
  *cache_cleared = false;
  {
    SlotLease& l = *lease_;
    std::lock_guard<std::mutex> g(l.mu);
    if (!batch_status.ok()) {
      // A raise that may or may not have landed leaves a bound at most `floor`: still a lower
      // bound of every later snapshot, so `announced` (the smaller value) stays right; if that
      // raise was records-only, the word may be too: the next snapshot that reads versions
      // writes its bound first.
      if (read.raised && (read.floor & kAnnounceRecordsOnly)) l.announced |= kAnnounceRecordsOnly;
      if (--l.open == 0) l.idle_since = MonoNs();
      return batch_status.WithContext("taking a snapshot");
    }
    if (read.raised) l.announced = read.floor;
  }
  // Cleared (or, if the CAS found another word, cleared by whoever fenced us: our next lease
  // check fails).
  if (read.clearing != 0 && read.clearing == log_to_clear_) log_to_clear_ = 0;
  // Cached record addresses are stale once records were removed since they were cached; and
  // after a long idle time the 16-bit removal epoch may have wrapped around.
  const int64_t now = MonoNs();
  if (RemovalEpochOf(read.word) != cache_epoch_ || now - last_begin_ > kCacheIdleNs) {
    *cache_cleared = !cache_.empty();
    cache_.clear();
    cache_epoch_ = RemovalEpochOf(read.word);
  }
  last_begin_ = now;
  db_.NoteCounter(CounterOf(read.word));
  return CounterOf(read.word);
}

Result<uint64_t> NamSession::TakeSnapshot() {
  SnapshotRead read;
  Access::Batch b(access_);
  FARPOOL_RETURN_IF_ERROR(PostSnapshot(b, &read));
  const Status waited = b.Wait();
  bool cache_cleared;
  return FinishSnapshot(read, waited, &cache_cleared);
}

void NamSession::EndTransaction(bool withdraw) {
  std::lock_guard<std::mutex> g(lease_->mu);
  if (--lease_->open > 0) return;
  lease_->idle_since = MonoNs();
  if (withdraw && lease_->announced != 0 && MonoNs() < lease_->valid_until.load()) {
    lease_->announced = 0;
    const uint64_t idle = 0;
    (void)access_.Write(db_.AnnounceAddr(lease_->slot), &idle, 8);
  }
}

Status NamSession::HelpUnlink(const NamTable& t, int64_t key, GlobalAddress record) {
  ForgetRecord(t, key);
  if (t.btree_) FARPOOL_RETURN_IF_ERROR(t.btree_->Remove(access_, *this, key, record.raw()));
  return t.hash_->Remove(access_, *this, key, record);
}

// No round trip: the snapshot is taken by the transaction's first read (nam_internal.h).
Result<std::unique_ptr<Transaction>> NamSession::Begin() { return Begin(TransactionOptions{}); }

Result<std::unique_ptr<Transaction>> NamSession::Begin(const TransactionOptions& options) {
  FARPOOL_RETURN_IF_ERROR(CheckLease());
  return std::unique_ptr<Transaction>(new NamTxn(*this, options));
}

}  // namespace farpool::db
