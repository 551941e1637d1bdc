// Recovery of dead sessions: fencing a slot, rolling its decided commit forward, breaking the
// locks of its undecided one (nam_internal.h; docs/database.md "Recovery").
//
// Invariants:
//   - A commit is decided when its log is whole (checksum over the entries matches) and its
//     state names the writer's epoch. Before that, it has written nothing but its locks (and
//     spill nodes and blobs nobody links to): breaking its locks to the newest installed
//     version undoes it. After that, recovery installs every cell the log names whose record
//     still carries the dead writer's lock word, then unlocks them by CAS from that word.
//   - The log's cells carry no stamp (the writer took its stamp in the round trip that wrote
//     the log). The writer installs only after that round trip, in one batch with its
//     releases: on each server its stamp word (listed in the log) and its cells first, then,
//     behind a fence, its unlocks. Servers execute their parts independently, so a crash can
//     leave the records of one server released (and since overwritten by later commits) and
//     those of another untouched. So the stamp is found: in a new cell installed whole in a
//     record still locked by the dead writer (every installed cell has the same one); else in
//     a stamp word whose check names this log (a released record proves its server's word was
//     written); if neither, no record of the commit was released, nobody has seen the commit,
//     and recovery gives it a stamp of its own (a fetch-and-add: the records have been locked
//     since before it, as a stamp must be). A recoverer that dies half-way leaves cells with
//     the stamp it chose, which the next one finds.
//   - A record held by a locking read carries the holder's read-lock word (layout.h
//     ReadLockWord), never its plain word: its commit changes it to the plain word in its lock
//     round, before its log is written. So recovery of a log (matching the plain word only)
//     never touches a record locked at read, and BreakRecordLock restores it like the lock of
//     an undecided commit: its cells are as they were when it was locked.
//   - A finished commit's log stays whole until the session's next round trip clears it
//     (NamSession::log_to_clear_). The only locks of the session that may come before the
//     clear lands are taken in that very round (a locking read with LockIntent::kUpdate: the
//     plain word), unordered with the clear: so recovery of a whole log may find a record it
//     names locked by the writer's word for a later transaction. That record either moved past
//     the log's version (skipped: BreakRecordLock restores it) or is memory freed and reused
//     since: a log entry names the record's address, key and version, and is rolled only into
//     a record that holds that key at that version or the one before. (Records do not name
//     their table: a record of the same key, reused at the same version, is the one case
//     this cannot tell apart; docs/database.md "Update intent".)
//   - Before anyone fences a slot, the process that may write for it (the owner word's tag:
//     the session's, or a recoverer's) is evicted from every memory server (Pool::Evict:
//     killed if it maps the memory, disconnected otherwise): a process stopped between a lease
//     check and a store never lands that store afterwards. A process never evicts itself; its
//     own slots are taken over only once it gave them up.
//   - Only whoever fenced the slot (CAS to "recovering" with the next epoch and its own tag)
//     recovers it, and it writes only before its own deadline (lease - margin after the
//     fence). The one other caller of RecoverLog is the slot's own session, under its own
//     lease: one whose commit a failure of the memory cut after the decision (commit.cc,
//     Settle; it passes the stamp it took) or one that closes (~NamSession). Nobody fences a
//     slot whose lease holds, so the two never run on one log at once. A recoverer that gives up
//     says so (tag 0); one that stalls is fenced in turn (and evicted) after its recovering word
//     stays unchanged for lease + margin; the next one redoes the same idempotent work.
#include <cstdio>
#include <cstring>
#include <utility>

#include "db/nam/nam_internal.h"

namespace farpool::db {
namespace {

// The layout of a record whose cells are `cell_size` bytes (a log entry names only that).
RecordLayout CellLayout(uint64_t cell_size) {
  RecordLayout l;
  l.payload = cell_size - kCellHeader - 8;
  return l;
}

}  // namespace

Result<bool> NamDatabase::EvictWriterOf(uint32_t slot, uint64_t owner) {
  if (OwnerState(owner) == kSlotFree) return true;  // a free slot has nobody writing for it
  const uint32_t tag = OwnerTag(owner);
  if (tag == 0) return true;  // a recovery given up: its recoverer stopped writing first
  if (tag == memory_.process_tag()) {
    // Ours: a thread of this process may be between a check and a store for this slot, and a
    // process cannot evict itself. Only a slot this process gave up may be taken over.
    std::lock_guard<std::mutex> l(mu_);
    if (recovering_here_.count(slot)) return false;
    for (const auto& lease : leases_) {
      if (lease->slot == slot && !lease->fenced) return false;
    }
    return true;
  }
  {
    // Final for a process that still runs: worth a line (once per owner word: an eviction
    // that fails is tried again every pass) for whoever finds it cut off.
    std::lock_guard<std::mutex> l(observe_mu_);
    if (!std::exchange(observed_[slot].evicting_said, true)) {
      std::fprintf(stderr,
                   "farpool: session slot %u of process tag 0x%08x went unrenewed past its lease "
                   "(%llu ms + margin): evicting that process before fencing the slot\n",
                   slot, tag, static_cast<unsigned long long>(root_.lease_ms));
    }
  }
  Status s = memory_.Evict(tag);
  if (s.code() == StatusCode::kInvalidArgument) return false;  // another Pool of this process
  FARPOOL_RETURN_IF_ERROR(s.WithContext("fencing session slot " + std::to_string(slot) +
                                        ": evicting process " + std::to_string(tag)));
  return true;
}

Result<bool> NamDatabase::FenceAndRecover(const Access& access, uint32_t slot, uint64_t owner,
                                          uint64_t final_state, uint64_t* final_owner) {
  // Whoever may still write for the slot is shut out of the memory first: from here on nothing
  // it issues lands, however long it was stopped between a lease check and a store.
  FARPOOL_ASSIGN_OR_RETURN(bool evicted, EvictWriterOf(slot, owner));
  if (!evicted) return false;
  const uint32_t me = memory_.process_tag();
  const uint64_t next = OwnerEpoch(owner) + 1;
  const uint64_t recovering = OwnerWord(next, kSlotRecovering, me);
  const int64_t fenced_at = MonoNs();
  {
    // One thread of this process at a time: two would fence with the same word, and one whose
    // reply was lost would take the other's fence for its own.
    std::lock_guard<std::mutex> l(mu_);
    if (recovering_here_.count(slot)) return false;
    recovering_here_.insert(slot);
  }
  Status s;
  bool fenced = false;
  uint64_t done = 0;
  auto recover = [&]() -> Status {
    Result<uint64_t> fence = access.Cas(SlotAddr(slot), owner, recovering);
    if (!fence.ok()) {
      // Outcome unknown (a failover cut the reply): if it landed, the slot is given up below
      // (tag 0), or a later pass would find it recovering under this process's tag, unchanged,
      // and evict this live process.
      uint64_t word = 0;
      const bool read = access.Read(SlotAddr(slot), &word, 8).ok();
      fenced = read && word == recovering;
      if (!read) GaveUp(slot, recovering, /*replace=*/false);  // a later pass looks again
      return fence.status();
    }
    if (*fence != owner) return Status::Ok();
    fenced = true;
    const int64_t deadline = fenced_at + lease_ns() - margin_ns();
    FARPOOL_RETURN_IF_ERROR(RecoverLog(access, slot, deadline));
    if (OwnerState(owner) != kSlotFree) {
      // A session died (or stalled past its lease): what its process had queued for
      // collection is found again by a sweep once no snapshot from before now is left (gc.cc).
      uint64_t word;
      FARPOOL_RETURN_IF_ERROR(access.Read(RootField(kRootCounter), &word, 8));
      ScheduleSweep(CounterOf(word));
    }
    if (MonoNs() > deadline) {
      return Status::Unavailable("recovery of session slot " + std::to_string(slot) +
                                 " ran out of its lease; someone else will finish it");
    }
    if (final_state != kSlotActive) {
      const uint64_t idle = 0;
      FARPOOL_RETURN_IF_ERROR(access.Write(AnnounceAddr(slot), &idle, 8));
    }
    done = OwnerWord(next, final_state, final_state == kSlotActive ? me : 0);
    Result<uint64_t> finished = access.Cas(SlotAddr(slot), recovering, done);
    if (!finished.ok()) {
      // Outcome unknown (a failover cut the reply): the word says. Landed but taken for
      // failed, a claim left an active slot of this process that nobody renews, and lease +
      // margin later another process evicted this live one.
      uint64_t word = 0;
      const bool read = access.Read(SlotAddr(slot), &word, 8).ok();
      if (read && word == done) return Status::Ok();
      // A later pass looks again: at an active word of ours (the claim landed), or at our
      // fence (the give-up below may fail too).
      if (!read) GaveUp(slot, final_state == kSlotActive ? done : recovering, /*replace=*/false);
      done = 0;
      return finished.status();
    }
    if (*finished != recovering) done = 0;
    return Status::Ok();
  };
  s = recover();
  if (fenced && done == 0) {
    // Given up (an error, the deadline) or taken over: say so in the word, so that the next
    // recoverer need not evict this live process (a CAS: a no-op if someone took over).
    auto given = access.Cas(SlotAddr(slot), recovering, OwnerWord(next, kSlotRecovering, 0));
    if (!given.ok()) GaveUp(slot, recovering, /*replace=*/false);  // still ours, maybe
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    recovering_here_.erase(recovering_here_.find(slot));  // ours only: others may try it too
  }
  FARPOOL_RETURN_IF_ERROR(s);
  if (final_owner != nullptr) *final_owner = done;
  return done != 0;
}

Status NamDatabase::RecoverLog(const Access& access, uint32_t slot, int64_t deadline,
                               uint64_t known_stamp) {
  uint64_t raw;
  FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(slot) + kSlotLog, &raw, 8));
  if (raw == 0) return Status::Ok();
  const GlobalAddress log = GlobalAddress::FromRaw(raw);
  LogHeader h;
  FARPOOL_RETURN_IF_ERROR(access.Read(log, &h, sizeof(h)));
  if (!LogDecided(h.state)) return Status::Ok();
  const uint64_t dead_lock = LockWord(slot, LogEpoch(h.state));
  auto late = [&] {
    return Status::Unavailable("recovery of session slot " + std::to_string(slot) +
                               " ran out of its lease; someone else will finish it");
  };
  std::vector<unsigned char> body;
  bool whole = h.bytes > 0 && h.bytes <= kLogBytes - sizeof(h);
  if (whole) {
    body.resize(h.bytes);
    FARPOOL_RETURN_IF_ERROR(access.Read(log + sizeof(h), body.data(), h.bytes));
    whole = LogChecksum(h, body.data()) == h.checksum;
  }
  if (whole) {
    // Decided: finish it. First the entries whose records are still locked by the writer.
    struct Pending {
      LogEntry e;
      const unsigned char* cell;
      const unsigned char* spill;
    };
    std::vector<Pending> pending;
    uint64_t stamp = known_stamp;
    std::vector<unsigned char> installed;
    size_t off = 0;
    for (uint64_t i = 0; i < h.count; ++i) {
      Pending p;
      if (off + sizeof(p.e) > body.size()) break;
      std::memcpy(&p.e, body.data() + off, sizeof(p.e));
      off += sizeof(p.e);
      p.cell = body.data() + off;
      off += p.e.cell_size;
      p.spill = p.e.spill ? body.data() + off : nullptr;
      if (p.e.spill) off += p.e.cell_size;
      if (off > body.size() || p.e.cell_size < kCellHeader + 8) {
        return Status::Internal("commit log of session slot " + std::to_string(slot) +
                                " is inconsistent (entry " + std::to_string(i) + ")");
      }
      const GlobalAddress rec = GlobalAddress::FromRaw(p.e.record);
      const RecordLayout layout = CellLayout(p.e.cell_size);
      if (p.e.cell_offset != layout.cell_offset(p.e.new_seq)) {
        return Status::Internal("commit log of session slot " + std::to_string(slot) +
                                " is inconsistent (entry " + std::to_string(i) + ": cell offset)");
      }
      RecordImage img;
      img.bytes.resize(layout.record_size());
      FARPOOL_RETURN_IF_ERROR(access.Read(rec, img.bytes.data(), img.bytes.size()));
      img.Decode(layout);
      if (img.lock != dead_lock) continue;  // installed and released before the crash
      // Locked by the writer, but already past this log's version: the commit was installed
      // and released here, others committed since, and the writer locked it again, with this
      // log still whole (a lock in the round that clears it, read.cc LockAtLookup). That lock
      // is undecided: BreakRecordLock restores it, nothing of this log goes in.
      // Likewise a record of another key, or not at this log's version nor the one before it
      // (never the case for a record the commit locked: it holds the entry's key, and
      // new_seq - 1 until installed, new_seq after): memory freed and reused since, locked
      // again by the writer in that round, possibly by another key's record that happens to
      // hold that very version. (An empty record counts as seq 0, the one before a first
      // version's 1.)
      if (img.key != p.e.key) continue;
      if (img.newest_seq() > p.e.new_seq || img.newest_seq() + 1 < p.e.new_seq) continue;
      if (stamp == 0) {
        // Did the writer install this one? Then its stamp is the commit's.
        installed.resize(p.e.cell_size);
        FARPOOL_RETURN_IF_ERROR(
            access.Read(rec + p.e.cell_offset, installed.data(), installed.size()));
        const CellView c = DecodeCell(installed.data(), CellLayout(p.e.cell_size));
        if (c.valid && c.seq == p.e.new_seq) stamp = c.stamp;
      }
      pending.push_back(p);
    }
    for (; !pending.empty() && stamp == 0 && off + 8 <= body.size(); off += 8) {
      uint64_t raw;
      std::memcpy(&raw, body.data() + off, 8);
      StampWordImage w;
      FARPOOL_RETURN_IF_ERROR(access.Read(GlobalAddress::FromRaw(raw), &w, sizeof(w)));
      if (w.stamp != 0 && w.check == StampCheck(w.stamp, slot, h.state)) stamp = w.stamp;
    }
    if (!pending.empty() && stamp == 0) {
      if (MonoNs() > deadline) return late();
      FARPOOL_ASSIGN_OR_RETURN(uint64_t word, access.Faa(RootField(kRootCounter), 1));
      stamp = CounterOf(word) + 1;
      NoteCounter(stamp);
    }
    std::vector<unsigned char> cell;
    for (const Pending& p : pending) {
      cell.assign(p.cell, p.cell + p.e.cell_size);
      StampCell(cell.data(), CellLayout(p.e.cell_size), stamp);
      // Nothing but the writes between the deadline check and them (the residual window).
      if (MonoNs() > deadline) return late();
      if (p.spill) {
        FARPOOL_RETURN_IF_ERROR(
            access.Write(GlobalAddress::FromRaw(p.e.spill), p.spill, p.e.cell_size));
      }
      FARPOOL_RETURN_IF_ERROR(access.Write(GlobalAddress::FromRaw(p.e.record) + p.e.cell_offset,
                                           cell.data(), cell.size()));
    }
    for (const Pending& p : pending) {
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(GlobalAddress::FromRaw(p.e.record),
                                                         dead_lock, UnlockedWord(p.e.new_seq)));
      (void)prev;  // a different value: someone else's recovery unlocked it first
    }
  }
  if (MonoNs() > deadline) return late();
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(log, h.state, 0));
  (void)prev;  // changed: another recoverer finished it first
  return Status::Ok();
}

Status NamDatabase::BreakRecordLock(const Access& access, GlobalAddress record, const NamTable& t,
                                    uint64_t word) {
  RecordImage img;
  img.bytes.resize(t.layout_.record_size());
  FARPOOL_RETURN_IF_ERROR(access.Read(record, img.bytes.data(), img.bytes.size()));
  img.Decode(t.layout_);
  if (img.lock != word) return Status::Ok();  // someone else broke or recovered it
  // The holder never decided (or its decision was rolled forward already): its record still
  // holds exactly the versions it had when it was locked.
  if (img.torn || !CellsConsecutive(img)) {
    return Status::Internal("record of key " + std::to_string(img.key) + " in table '" + t.name_ +
                            "' at " + record.ToString() + " is locked by a dead session (slot " +
                            std::to_string(LockSlot(word)) +
                            ") and its versions are inconsistent: corruption");
  }
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(record, word, UnlockedWord(img.newest_seq())));
  (void)prev;
  return Status::Ok();
}

Status NamDatabase::RecoverExpired() {
  const Access& access = access_;
  std::set<uint32_t> mine;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& lease : leases_) {
      if (!lease->fenced) mine.insert(lease->slot);
    }
  }
  // Watch every other slot that is not free until it changes or has stayed unchanged for
  // lease + margin (then fence and recover it). Bounded: each slot at most ~lease + margin.
  const int64_t give_up = MonoNs() + 2 * (lease_ns() + margin_ns());
  for (uint32_t s = 0; s < root_.max_slots; ++s) {
    if (mine.count(s)) continue;
    for (;;) {
      uint64_t owner;
      const int64_t read_at = MonoNs();
      FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(s), &owner, 8));
      if (OwnerState(owner) == kSlotFree) break;
      if (ObservedExpired(s, owner, read_at)) {
        FARPOOL_ASSIGN_OR_RETURN(bool done, FenceAndRecover(access, s, owner, kSlotFree));
        if (done) break;  // else changed meanwhile, or a slot this process still uses
      }
      // Alive if it renews within lease/2.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      uint64_t again;
      FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(s), &again, 8));
      if (again != owner && OwnerState(again) != kSlotRecovering) break;
      if (MonoNs() > give_up) break;
    }
  }
  // Break the record locks the dead left before their commits were decided.
  FARPOOL_ASSIGN_OR_RETURN(auto names, ListTables());
  for (const auto& name : names) {
    FARPOOL_ASSIGN_OR_RETURN(const Table* t, OpenTable(name));
    const auto& nt = static_cast<const NamTable&>(*t);
    FARPOOL_RETURN_IF_ERROR(nt.hash_->ForEach(access, [&](int64_t, GlobalAddress rec) -> Status {
      uint64_t lock;
      FARPOOL_RETURN_IF_ERROR(access.Read(rec, &lock, 8));
      if (!IsLocked(lock)) return Status::Ok();
      FARPOOL_ASSIGN_OR_RETURN(bool dead, HolderDead(access, lock));
      if (dead) return BreakRecordLock(access, rec, nt, lock);
      return Status::Ok();
    }));
  }
  return Status::Ok();
}

Result<uint64_t> NamDatabase::CountLocked(const Table& table) {
  OpCount c;
  Access access(memory_, c);
  const auto& nt = static_cast<const NamTable&>(table);
  uint64_t locked = 0;
  FARPOOL_RETURN_IF_ERROR(nt.hash_->ForEach(access, [&](int64_t, GlobalAddress rec) -> Status {
    uint64_t lock;
    FARPOOL_RETURN_IF_ERROR(access.Read(rec, &lock, 8));
    if (IsLocked(lock)) ++locked;
    return Status::Ok();
  }));
  return locked;
}

}  // namespace farpool::db
