// Garbage collection of the NAM engines: the recycler (free lists in the pool), freeing cut
// version chains and blobs, and reclaiming dropped tables (nam_internal.h has the rules).
#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <utility>

#include "db/nam/nam_internal.h"

namespace farpool::db {

// ================================================================ Recycler

int Recycler::ClassOf(uint64_t size) {
  const int c = size <= 1 ? 0 : 64 - std::countl_zero(size - 1);
  return std::max(c, kMinClass);
}

Recycler::Stats Recycler::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

Status Recycler::LockClass(const Access& access, LockOwner& owner, int c) {
  const GlobalAddress word = heads_ + uint64_t(c) * 16;
  const uint64_t mine = owner.lock_word();
  // A holder that neither finishes nor dies within two leases (plus margins) is not waited
  // for longer: the caller keeps its objects in its cache meanwhile.
  const int64_t give_up = MonoNs() + wait_ns_;
  for (int i = 0;; ++i) {
    FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(word, 0, mine));
    if (prev == 0) return Status::Ok();
    if (i % 64 == 63) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, owner.HolderDead(prev));
      if (dead) {
        // The holder's pushes and pops change the head with one write: the list is whole.
        FARPOOL_ASSIGN_OR_RETURN(uint64_t p2, access.Cas(word, prev, mine));
        if (p2 == prev) return Status::Ok();
      }
    }
    if (MonoNs() > give_up) {
      return Status::TimedOut("free list of size class " + std::to_string(ClassBytes(c)) +
                              " B stays locked by session slot " + std::to_string(LockSlot(prev)));
    }
    std::this_thread::yield();
  }
}

Status Recycler::UnlockClass(const Access& access, LockOwner& owner, int c) {
  auto released = access.Cas(heads_ + uint64_t(c) * 16, owner.lock_word(), 0);
  if (!released.ok()) {
    owner.Abandon();  // the lock may still be ours: let others take it over after our lease
    return released.status();
  }
  const uint64_t prev = *released;
  if (prev != owner.lock_word()) {
    return Status::Unavailable("a free list lock was taken over: this session was fenced");
  }
  return Status::Ok();
}

Status Recycler::PushBundle(const Access& access, LockOwner& owner, int c, uint64_t n) {
  auto& cache = cache_[c];
  // The bundle: the last cached object holds the addresses of the `n` before it.
  const GlobalAddress container = GlobalAddress::FromRaw(cache.back());
  std::vector<uint64_t> image(2 + n);
  image[1] = n;
  std::memcpy(image.data() + 2, cache.data() + cache.size() - 1 - n, n * 8);
  FARPOOL_RETURN_IF_ERROR(LockClass(access, owner, c));
  const GlobalAddress head = heads_ + uint64_t(c) * 16 + 8;
  Status s = access.Read(head, &image[0], 8);
  if (s.ok()) s = owner.CheckLease();
  if (s.ok()) s = access.Write(container, image.data(), image.size() * 8);
  const uint64_t raw = container.raw();
  if (s.ok()) s = access.Write(head, &raw, 8);
  Status u = UnlockClass(access, owner, c);
  FARPOOL_RETURN_IF_ERROR(s);
  cache.resize(cache.size() - 1 - n);
  return u;
}

Result<bool> Recycler::PopBundle(const Access& access, LockOwner& owner, int c) {
  const uint64_t cap = BundleCapacity(c);
  FARPOOL_RETURN_IF_ERROR(LockClass(access, owner, c));
  const GlobalAddress head = heads_ + uint64_t(c) * 16 + 8;
  uint64_t top = 0;
  std::vector<uint64_t> image(2 + cap);
  Status s = access.Read(head, &top, 8);
  if (s.ok() && top != 0)
    s = access.Read(GlobalAddress::FromRaw(top), image.data(), image.size() * 8);
  if (s.ok() && top != 0 && image[1] > cap) {
    s = Status::Internal("free list of size class " + std::to_string(ClassBytes(c)) +
                         " B has a bundle at " + GlobalAddress::FromRaw(top).ToString() +
                         " claiming " + std::to_string(image[1]) + " objects");
  }
  if (s.ok() && top != 0) s = owner.CheckLease();
  if (s.ok() && top != 0) s = access.Write(head, &image[0], 8);
  Status u = UnlockClass(access, owner, c);
  FARPOOL_RETURN_IF_ERROR(s);
  FARPOOL_RETURN_IF_ERROR(u);
  if (top == 0) return false;
  auto& cache = cache_[c];
  cache.insert(cache.end(), image.begin() + 2, image.begin() + 2 + image[1]);
  cache.push_back(top);
  return true;
}

Result<GlobalAddress> Recycler::Alloc(const Access& access, LockOwner& owner, uint64_t size,
                                      Placement placement) {
  const int c = ClassOf(size);
  {
    std::lock_guard<std::mutex> l(mu_);
    auto& cache = cache_[c];
    if (cache.empty() && MonoNs() >= empty_until_[c]) {
      auto popped = PopBundle(access, owner, c);
      if (!popped.ok() && popped.status().code() != StatusCode::kUnavailable)
        return popped.status();
      if (popped.ok() && !*popped) empty_until_[c] = MonoNs() + kEmptyRetryNs;
    }
    // The newest cached object; for a placement on one server the newest one there if any.
    // Placement is a preference: a cached object elsewhere still beats a new one (memory the
    // database freed is reused before any is leased).
    auto at = cache.rbegin();
    if (placement.kind() == Placement::Kind::kOnServer) {
      auto there = std::find_if(cache.rbegin(), cache.rend(), [&](uint64_t raw) {
        return GlobalAddress::FromRaw(raw).server() == placement.value();
      });
      if (there != cache.rend()) at = there;
    }
    if (at != cache.rend()) {
      const GlobalAddress a = GlobalAddress::FromRaw(*at);
      cache.erase(std::next(at).base());
      ++stats_.reused;
      return a;
    }
    ++stats_.fresh;
  }
  auto fresh = memory_.Alloc(ClassBytes(c), placement);
  if (fresh.status().code() == StatusCode::kOutOfMemory &&
      placement.kind() == Placement::Kind::kOnServer) {
    return memory_.Alloc(ClassBytes(c), Placement::Striped());  // a preference, not a must
  }
  return fresh;
}

Status Recycler::Free(const Access& access, LockOwner& owner, GlobalAddress address,
                      uint64_t size) {
  if (address.is_null()) return Status::InvalidArgument("Free of the null address");
  const int c = ClassOf(size);
  std::lock_guard<std::mutex> l(mu_);
  auto& cache = cache_[c];
  cache.push_back(address.raw());
  ++stats_.freed;
  // Small objects stay here up to two bundles' worth; big ones go to the pool's list at once
  // (a bundle of one), so that other processes reuse them and a process that dies never takes
  // them along.
  const uint64_t keep = ClassBytes(c) < kCachedClassBytes ? 2 * (BundleCapacity(c) + 1) : 0;
  if (cache.size() > keep) {
    // A failed push keeps the objects cached here (reused by this process).
    return PushBundle(access, owner, c, std::min<uint64_t>(BundleCapacity(c), cache.size() - 1));
  }
  return Status::Ok();
}

Status Recycler::Flush(const Access& access, LockOwner& owner) {
  std::lock_guard<std::mutex> l(mu_);
  for (int c = kMinClass; c < kClasses; ++c) {
    // Whole bundles, then the remainder as one smaller bundle (a lone object is a bundle of
    // itself and nothing else).
    auto& cache = cache_[c];
    while (!cache.empty()) {
      const uint64_t n = std::min<uint64_t>(BundleCapacity(c), cache.size() - 1);
      FARPOOL_RETURN_IF_ERROR(PushBundle(access, owner, c, n));
    }
  }
  return Status::Ok();
}

// ================================================================ versions and blobs

Status NamDatabase::FreeBlobs(const Access& access, LockOwner& owner, const NamTable& t,
                              const unsigned char* payload) {
  for (const auto& [blob, size] : BlobRefs(t, payload)) {
    FARPOOL_RETURN_IF_ERROR(recycler_->Free(access, owner, blob, size));
    ++gc_.blobs_freed;
  }
  return Status::Ok();
}

void NamDatabase::RetireChain(const NamTable* t, GlobalAddress chain) {
  ++gc_.chains_cut;
  std::lock_guard<std::mutex> l(retire_mu_);
  retired_.push_back({t, chain});
}

// Frees the nodes of a chain nobody can reach any more, with their versions' blobs.
static Status FreeChain(NamDatabase& db, const Access& access, LockOwner& owner, const NamTable& t,
                        GlobalAddress at) {
  std::vector<unsigned char> node(t.layout_.cell_size());
  while (!at.is_null()) {
    FARPOOL_RETURN_IF_ERROR(access.Read(at, node.data(), node.size()));
    const CellView c = DecodeCell(node.data(), t.layout_);
    if (!c.valid) {
      return Status::Internal("version node " + at.ToString() + " of table '" + t.name_ +
                              "' fails its checksum while being freed");
    }
    FARPOOL_RETURN_IF_ERROR(db.FreeBlobs(access, owner, t, c.payload));
    FARPOOL_RETURN_IF_ERROR(db.recycler().Free(access, owner, at, t.layout_.cell_size()));
    ++db.gc_.nodes_freed;
    at = GlobalAddress::FromRaw(c.chain);
  }
  return Status::Ok();
}

void NamDatabase::QueueRemoval(const NamTable* t, GlobalAddress record, int64_t key, uint64_t seq,
                               uint64_t stamp) {
  std::lock_guard<std::mutex> l(retire_mu_);
  removals_.push_back({t, record, key, seq, stamp});
}

// Removing a deleted record, once every snapshot sees the deletion (LWM >= its stamp):
//   1. lock it (CAS from the tombstone's unlocked word; a failure means it was written again:
//      nothing to do — a later deletion queues it anew) and check it holds that tombstone;
//   2. mark it removed (CAS to kRemovedLock): the one atomic step that decides. Readers and
//      writers that reach it (from an index or a session's cache) see it is gone;
//   3. free its versions' blobs and chain (nobody can read them any more);
//   4. unlink it from the B+tree and the hash index. A remover that dies before this leaves
//      entries naming a removed record; whoever meets one finishes the unlinking
//      (NamSession::HelpUnlink) and such a record is never freed (a bounded leak);
//   5. after the batch, bump the removal epoch in the counter word (sessions drop cached
//      addresses at their next Begin) and free the record's memory once the LWM passes that
//      stamp, when no transaction that could hold the address is left.
Result<bool> NamDatabase::RemoveRecord(const Access& access, NamSession& me, const NamTable& t,
                                       GlobalAddress record, int64_t key, uint64_t seq,
                                       uint64_t stamp, bool* unlinked) {
  *unlinked = false;
  FARPOOL_RETURN_IF_ERROR(me.CheckLease());
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(record, UnlockedWord(seq), me.lock_word()));
  if (prev != UnlockedWord(seq)) return false;
  RecordImage img;
  img.bytes.resize(t.layout_.record_size());
  Status s = access.Read(record, img.bytes.data(), img.bytes.size());
  if (s.ok()) {
    img.Decode(t.layout_);
    // The stamp too: the memory of a record removed by someone else may hold this key's
    // record again by now, at the same version.
    if (img.torn || !CellsConsecutive(img) || img.newest_seq() != seq || img.key != key ||
        !(img.cells[img.newest].flags & kFlagDeleted) || img.cells[img.newest].stamp != stamp) {
      (void)access.Cas(record, me.lock_word(), UnlockedWord(seq));
      return false;
    }
  }
  if (s.ok()) s = me.CheckLease();
  if (!s.ok()) {
    (void)access.Cas(record, me.lock_word(), UnlockedWord(seq));
    return s;
  }
  FARPOOL_ASSIGN_OR_RETURN(prev, access.Cas(record, me.lock_word(), kRemovedLock));
  if (prev != me.lock_word()) {
    return Status::Unavailable("removing key " + std::to_string(key) + " of '" + t.name_ +
                               "': this process's lease was lost");
  }
  ++gc_.records_removed;
  for (const CellView& c : img.cells) {
    if (!c.empty()) FARPOOL_RETURN_IF_ERROR(FreeBlobs(access, me, t, c.payload));
  }
  FARPOOL_RETURN_IF_ERROR(
      FreeChain(*this, access, me, t, GlobalAddress::FromRaw(img.cells[img.newest].chain)));
  if (t.btree_) FARPOOL_RETURN_IF_ERROR(t.btree_->Remove(access, me, key, record.raw()));
  FARPOOL_RETURN_IF_ERROR(t.hash_->Remove(access, me, key, record));
  *unlinked = true;
  return true;
}

Result<bool> NamDatabase::TableLive(const Access& access, const NamTable& t) {
  uint64_t words[2];
  FARPOOL_RETURN_IF_ERROR(access.Read(t.desc_, words, 16));
  return words[0] == kDescLive && words[1] == t.incarnation_;
}

Status NamDatabase::ReclaimRetired(const Access& access) {
  std::lock_guard<std::mutex> reclaiming(reclaim_mu_);
  {
    std::lock_guard<std::mutex> l(retire_mu_);
    if (retired_.empty() && drop_queue_.empty() && removals_.empty() && unlinked_.empty()) {
      return Status::Ok();
    }
  }
  // The lock owner of this pass (taken before the work, which stays queued if there is none).
  FARPOOL_ASSIGN_OR_RETURN(std::shared_ptr<NamSession> sys, System());
  NamSession& me = *sys;
  std::deque<Retired> chains;
  std::vector<DropWait> tables;
  std::vector<Removal> removals;
  std::vector<Unlinked> unreachable;
  const uint64_t lwm_now = lwm();
  {
    std::lock_guard<std::mutex> l(retire_mu_);
    chains.swap(retired_);
    while (!drop_queue_.empty() && drop_queue_.front().stamp <= lwm_now) {
      tables.push_back(drop_queue_.front());
      drop_queue_.pop_front();
    }
    // Deletions commit roughly in stamp order per process; take those every snapshot sees.
    for (auto it = removals_.begin(); it != removals_.end();) {
      if (it->stamp <= lwm_now) {
        removals.push_back(*it);
        it = removals_.erase(it);
      } else {
        ++it;
      }
    }
    while (!unlinked_.empty() && unlinked_.front().stamp <= lwm_now) {
      unreachable.push_back(unlinked_.front());
      unlinked_.pop_front();
    }
  }
  Status first;
  auto note = [&](const Status& s) {
    if (!s.ok() && first.ok()) first = s;
  };
  for (const Retired& r : chains) note(FreeChain(*this, access, me, *r.table, r.chain));
  for (const Unlinked& u : unreachable) note(recycler_->Free(access, me, u.record, u.size));
  std::vector<Unlinked> unlinked;
  // This pass reads records and frees what hangs off them: it holds a snapshot announcement
  // meanwhile, so that no table it works on is reclaimed under it (a drop after the
  // announcement waits for it; a drop before it is seen by TableLive).
  const bool announced = !removals.empty() && me.TakeSnapshot().ok();
  if (!announced && !removals.empty()) {
    // Not now: the deletions wait for the next pass.
    std::lock_guard<std::mutex> l(retire_mu_);
    removals_.insert(removals_.end(), removals.begin(), removals.end());
    removals.clear();
  }
  std::map<const NamTable*, bool> live;
  for (const Removal& r : removals) {
    auto it = live.find(r.table);
    if (it == live.end()) {
      auto l = TableLive(access, *r.table);
      if (!l.ok()) {
        note(l.status());
        continue;
      }
      it = live.emplace(r.table, *l).first;
    }
    if (!it->second) continue;  // dropped: the table's reclamation frees the record
    bool done = false;
    auto removed = RemoveRecord(access, me, *r.table, r.record, r.key, r.seq, r.stamp, &done);
    if (!removed.ok()) note(removed.status());
    if (done) unlinked.push_back({r.record, r.table->layout_.record_size(), 0});
  }
  if (announced) me.EndTransaction(/*withdraw=*/true);
  if (!unlinked.empty()) {
    auto word = access.Faa(RootField(kRootCounter), kRemovalStep);
    if (word.ok()) {
      const uint64_t stamp = CounterOf(*word) + 1;
      NoteCounter(stamp);
      std::lock_guard<std::mutex> l(retire_mu_);
      for (Unlinked& u : unlinked) {
        u.stamp = stamp;
        unlinked_.push_back(u);
      }
    } else {
      note(word.status());  // the records stay marked removed; their memory leaks
    }
  }
  for (const DropWait& d : tables) {
    // The job is ours unless another process adopted it (it found the reclaimer word dead:
    // ours, after our system session was fenced and replaced).
    auto prev = access.Cas(d.table->desc_ + kDescReclaimer, d.word, kReclaimStarted);
    if (!prev.ok()) {
      note(prev.status());
      std::lock_guard<std::mutex> l(retire_mu_);
      drop_queue_.push_back(d);  // nothing started: try again next pass
      continue;
    }
    if (*prev == d.word) note(ReclaimTable(access, me, *d.table));
  }
  return first;
}

void NamDatabase::ScheduleSweep(uint64_t counter) {
  std::lock_guard<std::mutex> l(retire_mu_);
  sweep_at_ = std::max(sweep_at_, counter);
}

// The sweep after a death (nam_internal.h). It runs once the LWM has passed the counter at
// the death, so every tombstone the dead process committed is visible to every snapshot and
// every drop it made is older than every snapshot. Its cost is a read of the catalog and of
// every record of every table (only after a session died). What it cannot find: chains the
// dead process had cut and records it had unlinked but not freed yet (nothing points at them
// any more), its recycler cache, and a table whose reclamation it had begun.
Status NamDatabase::SweepOrphans(const Access& access) {
  std::lock_guard<std::mutex> reclaiming(reclaim_mu_);
  uint64_t at;
  {
    std::lock_guard<std::mutex> l(retire_mu_);
    if (sweep_at_ == 0 || lwm() < sweep_at_) return Status::Ok();
    at = std::exchange(sweep_at_, 0);
  }
  auto sys = System();
  Status s = sys.ok() ? AdoptDroppedTables(access, **sys) : sys.status();
  if (s.ok()) s = QueueTombstones(access);
  if (!s.ok()) ScheduleSweep(at);  // again next pass
  return s;
}

// A dropped table whose reclaimer word names a dead session: CAS it to our word (exactly one
// process wins) and reclaim it once the LWM passes the counter now (it was dropped before, so
// this only waits for snapshots that began since).
Status NamDatabase::AdoptDroppedTables(const Access& access, NamSession& me) {
  std::vector<unsigned char> area(kMaxTables * kDescSize);
  FARPOOL_RETURN_IF_ERROR(
      access.Read(GlobalAddress::FromRaw(root_.tables), area.data(), area.size()));
  uint64_t word;
  FARPOOL_RETURN_IF_ERROR(access.Read(RootField(kRootCounter), &word, 8));
  const uint64_t stamp = CounterOf(word);
  for (uint32_t i = 0; i < kMaxTables; ++i) {
    TableDesc d;
    std::memcpy(&d, area.data() + i * kDescSize, sizeof(d));
    if (d.state != kDescDropped || !IsLocked(d.reclaimer)) continue;
    FARPOOL_ASSIGN_OR_RETURN(bool dead, me.HolderDead(d.reclaimer));
    if (!dead) continue;
    FARPOOL_ASSIGN_OR_RETURN(auto t, MakeTable(i, d));
    FARPOOL_RETURN_IF_ERROR(me.CheckLease());
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev,
                             access.Cas(t->desc_ + kDescReclaimer, d.reclaimer, me.lock_word()));
    if (prev != d.reclaimer) continue;  // someone else adopted it first
    const NamTable* adopted = t.get();
    {
      std::lock_guard<std::mutex> l(mu_);
      dropped_.push_back(std::move(t));
    }
    std::lock_guard<std::mutex> l(retire_mu_);
    drop_queue_.push_back({adopted, stamp, me.lock_word()});
  }
  return Status::Ok();
}

// Every unlocked record whose newest version is a tombstone that all snapshots see goes to the
// removal queue (RemoveRecord checks it again under its lock, so a record that a live process
// removes at the same time is removed once).
Status NamDatabase::QueueTombstones(const Access& access) {
  FARPOOL_RETURN_IF_ERROR(LoadTables(access));
  std::vector<const NamTable*> tables;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [name, t] : tables_) tables.push_back(t.get());
  }
  const uint64_t lwm_now = lwm();
  constexpr size_t kBatch = 256;
  for (const NamTable* t : tables) {
    std::vector<std::pair<int64_t, GlobalAddress>> entries;
    FARPOOL_RETURN_IF_ERROR(t->hash_->ForEach(access, [&](int64_t key, GlobalAddress rec) {
      entries.push_back({key, rec});
      return Status::Ok();
    }));
    std::vector<RecordImage> images(kBatch);
    for (size_t first = 0; first < entries.size(); first += kBatch) {
      const size_t n = std::min(kBatch, entries.size() - first);
      Access::Batch b(access);
      for (size_t i = 0; i < n; ++i) {
        images[i].bytes.resize(t->layout_.record_size());
        FARPOOL_RETURN_IF_ERROR(
            b.Read(entries[first + i].second, images[i].bytes.data(), images[i].bytes.size()));
      }
      FARPOOL_RETURN_IF_ERROR(b.Wait());
      for (size_t i = 0; i < n; ++i) {
        RecordImage& img = images[i];
        img.Decode(t->layout_);
        const auto [key, rec] = entries[first + i];
        if (img.key != key || !ConsistentImage(img) || img.newest < 0) continue;
        const CellView& c = img.cells[img.newest];
        if ((c.flags & kFlagDeleted) && c.stamp <= lwm_now) {
          QueueRemoval(t, rec, key, img.newest_seq(), c.stamp);
        }
      }
    }
  }
  return Status::Ok();
}

// Every record of a dropped table, its versions and their blobs go back to the recycler, then
// the descriptor becomes free for a new table. Each record is claimed by one CAS from its
// unlocked word to kRemovedLock first, so that a concurrent removal (RemoveRecord) and this
// never both free it; a record left locked by a transaction that will abort is waited for
// (bounded; else it leaks). Then the B+tree's nodes and the hash index's buckets go back too
// (they came from the recycler: NamSession::AllocObject). Nothing reaches them any more: every
// snapshot from before the drop has ended (the LWM passed the drop's stamp), and no
// transaction uses a dropped table (Database::DropTable's contract).
Status NamDatabase::ReclaimTable(const Access& access, NamSession& me, const NamTable& t) {
  std::vector<GlobalAddress> records;
  FARPOOL_RETURN_IF_ERROR(t.hash_->ForEach(access, [&](int64_t, GlobalAddress rec) -> Status {
    records.push_back(rec);
    return Status::Ok();
  }));
  RecordImage img;
  img.bytes.resize(t.layout_.record_size());
  for (GlobalAddress rec : records) {
    Hook("gc.table-record");
    bool claimed = false;
    for (int tries = 0; tries < 1000 && !claimed; ++tries) {
      FARPOOL_RETURN_IF_ERROR(access.Read(rec, img.bytes.data(), img.bytes.size()));
      img.Decode(t.layout_);
      if (img.lock == kRemovedLock) break;  // a removal owns it
      if (IsLocked(img.lock)) {
        FARPOOL_ASSIGN_OR_RETURN(bool dead, me.HolderDead(img.lock));
        if (dead) FARPOOL_RETURN_IF_ERROR(BreakRecordLock(access, rec, t, img.lock));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (!ConsistentImage(img)) continue;
      FARPOOL_RETURN_IF_ERROR(me.CheckLease());
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(rec, img.lock, kRemovedLock));
      claimed = prev == img.lock;
    }
    if (!claimed) continue;
    for (const CellView& c : img.cells) {
      if (!c.empty()) FARPOOL_RETURN_IF_ERROR(FreeBlobs(access, me, t, c.payload));
    }
    if (img.newest >= 0) {
      FARPOOL_RETURN_IF_ERROR(
          FreeChain(*this, access, me, t, GlobalAddress::FromRaw(img.cells[img.newest].chain)));
    }
    FARPOOL_RETURN_IF_ERROR(recycler_->Free(access, me, rec, t.layout_.record_size()));
  }
  if (t.btree_) FARPOOL_RETURN_IF_ERROR(t.btree_->Destroy(access, me));
  FARPOOL_RETURN_IF_ERROR(t.hash_->Destroy(access, me));
  uint64_t empty = kDescEmpty;
  FARPOOL_RETURN_IF_ERROR(me.CheckLease());
  FARPOOL_RETURN_IF_ERROR(access.Write(t.desc_, &empty, 8));
  ++gc_.tables_reclaimed;
  return Status::Ok();
}

}  // namespace farpool::db
