// Reads of the NAM engines: consistent record images, the version a snapshot sees, and the
// transaction's Get/Put/Delete/Scan (nam_internal.h).
//
// A reader accepts a record image only if ConsistentImage (layout.h): unlocked, whole cells,
// cells consecutive, lock word naming the newest. A locked record may be installing a version
// whose stamp is inside the reader's snapshot, so the reader waits for it (checking now and
// then whether the holder died, and giving up with Unavailable after 2 leases: an alive holder
// finishes or loses its lease by then). An unlocked image that stays inconsistent over three
// identical copies is corruption and is reported as such, never retried forever.
// After reading, a transaction checks its own lease before it returns data: memory freed by
// the garbage collector is never read by a session whose lease was valid (a session whose
// lease lapsed is excluded from the low-water mark once fenced, and may read reused memory).
// A record held by a locking read (layout.h ReadLockWord) is not waited for: its holder has no
// stamp yet, so the cells are all a snapshot may see.
//
// Locking reads (LockKeys): round 1 finds the records and copies them (FindRecords, with the
// snapshot if none is taken: it validates the cached addresses and keeps records from being
// freed); round 2 CASes each lock word from the word the copy showed to our read-lock word and,
// behind a fence, reads the record: one message per server. Locks go into held_ as they are
// taken, so every way the transaction ends releases them (Finish, or the commit). Read
// committed: each other read call takes a snapshot of its own (FreshSnapshotForRead). A locking
// read that takes the snapshot announces records-only (NamSession::PostSnapshot), since it
// reads no version but the one it locks; under SI too, until a read of versions takes a
// snapshot of its own (NamTxn::records_only_).
#include <algorithm>
#include <climits>
#include <cstring>

#include "db/nam/nam_internal.h"
#include "db/row_access.h"

namespace farpool::db {
namespace {
// The largest record Batch::LookupRead reads with its lookup (pool.h).
constexpr uint64_t kMaxLookupReadBytes = 16 << 10;
}  // namespace

std::vector<std::pair<GlobalAddress, uint64_t>> BlobRefs(const NamTable& t,
                                                         const unsigned char* payload) {
  std::vector<std::pair<GlobalAddress, uint64_t>> refs;
  for (uint32_t c : t.bytes_columns_) {
    uint64_t ref[2];
    std::memcpy(ref, payload + t.schema_.Offset(c), 16);
    if (ref[1] > 0 && ref[0] != 0) refs.push_back({GlobalAddress::FromRaw(ref[0]), ref[1]});
  }
  return refs;
}

Status NamTxn::ReadRecord(const NamTable& t, GlobalAddress record, int64_t key, RecordImage* image,
                          bool* key_ok) {
  image->bytes.resize(t.layout_.record_size());
  FARPOOL_RETURN_IF_ERROR(s_.access_.Read(record, image->bytes.data(), image->bytes.size()));
  return SettleRecord(t, record, key, image, key_ok);
}

Status NamTxn::ReadAfterRelease(std::span<const Recopy> recopies, int64_t wait_us) {
  WaitSpec spec{.held_mask = 1,  // layout.h IsLocked
                .not_held = kRemovedLock,
                .wait = std::chrono::microseconds(wait_us),
                .wait_only = true};
  Access::Batch b(s_.access_);
  std::vector<WaitCasResult> found(recopies.size());
  for (size_t i = 0; i < recopies.size(); ++i) {
    FARPOOL_RETURN_IF_ERROR(b.WaitCas(recopies[i].record, recopies[i].holder, 0, spec, &found[i]));
  }
  FARPOOL_RETURN_IF_ERROR(b.Fence());
  for (const Recopy& r : recopies) {
    FARPOOL_RETURN_IF_ERROR(b.Read(r.record, r.image->bytes.data(), r.image->bytes.size()));
  }
  return b.Wait();
}

Status NamTxn::RecopyLocked(std::span<const LockedCopy> copies) {
  std::vector<Recopy> recopies;
  for (const LockedCopy& c : copies) {
    RecordImage& image = *c.image;
    image.Decode(c.t->layout_);
    if (image.key != c.key || !IsLocked(image.lock) || image.lock == kRemovedLock ||
        IsReadLock(image.lock)) {
      continue;  // not a commit's lock on this key's record: SettleRecord decides
    }
    recopies.push_back({c.record, image.lock, &image});
  }
  if (recopies.empty()) return Status::Ok();
  s_.counters_.read_lock_waits += recopies.size();
  RoundTripScope cause(RoundTripCause::kReadWait);
  return ReadAfterRelease(recopies, kServerWaitSliceUs);
}

Status NamTxn::SettleRecord(const NamTable& t, GlobalAddress record, int64_t key,
                            RecordImage* image, bool* key_ok) {
  // The caller read the first copy: every round trip here is a wait (or a check of a holder).
  RoundTripScope cause(RoundTripCause::kReadWait);
  const auto& layout = t.layout_;
  int64_t start = 0, next_check = 0;  // set at the first inconsistent copy
  std::vector<unsigned char> previous;
  int same = 0;
  // Where we poll (mapped memory), a locked record is re-read at once kLockedRereads times,
  // then after pauses doubling from 20 µs up to kMaxLockedPauseNs. Over messages the memory
  // server waits for the holder instead: each copy after one that a commit held is read
  // behind a wait-until-free of the holder's word (ReadAfterRelease), in slices of
  // kServerWaitSliceUs so that we check now and then whether the holder died.
  constexpr int kLockedRereads = 3;
  constexpr int64_t kMaxLockedPauseNs = 500'000;
  int64_t locked_pause_ns = 10'000;
  const bool server_waits = !s_.access_.memory().mapped();
  uint64_t holder = 0;  // the commit's lock word the next copy waits for (server_waits)
  for (int tries = 0;; ++tries) {
    if (holder != 0) {
      const int64_t left_us = (2 * s_.db_.lease_ns() - (MonoNs() - start)) / 1000;
      const Recopy recopy{record, holder, image};
      FARPOOL_RETURN_IF_ERROR(
          ReadAfterRelease(std::span<const Recopy>(&recopy, 1),
                           std::clamp<int64_t>(left_us, 0, kServerWaitSliceUs)));
    } else if (tries > 0) {
      FARPOOL_RETURN_IF_ERROR(s_.access_.Read(record, image->bytes.data(), image->bytes.size()));
    }
    const uint64_t waited_for = holder;
    holder = 0;
    image->Decode(layout);
    if (image->key != key || image->lock == kRemovedLock) {
      *key_ok = false;
      return Status::Ok();
    }
    *key_ok = true;
    if (ConsistentImage(*image)) break;
    // Held by a locking read (ours or another's) whose commit has not taken a stamp: the
    // versions in the cells are all there is for our snapshot (layout.h ReadLockWord).
    if (IsReadLock(image->lock) && !image->torn && CellsConsecutive(*image)) break;
    const int64_t now = MonoNs();
    if (start == 0) {
      start = now;
      next_check = now + 1'000'000;
      if (IsLocked(image->lock) && !IsReadLock(image->lock)) ++s_.counters_.read_lock_waits;
    }
    if (IsLocked(image->lock)) {
      same = 0;
      if (now > next_check) {
        next_check = now + 1'000'000;
        FARPOOL_ASSIGN_OR_RETURN(bool dead, s_.HolderDead(image->lock));
        if (dead)
          FARPOOL_RETURN_IF_ERROR(s_.db_.BreakRecordLock(s_.access_, record, t, image->lock));
      }
      if (now - start > 2 * s_.db_.lease_ns()) {
        return Status::Unavailable(
            "key " + std::to_string(key) + " of '" + t.name_ + "' stays locked by session slot " +
            std::to_string(LockSlot(image->lock)) + ", which keeps its lease but does not finish");
      }
    } else {
      same = image->bytes == previous ? same + 1 : 0;
      if (same >= 2) {
        return Status::Internal(
            "record of key " + std::to_string(key) + " in table '" + t.name_ + "' at " +
            record.ToString() + " is corrupt: its lock word names version " +
            std::to_string(UnlockedSeq(image->lock)) + " but its cells hold " +
            std::to_string(image->cells[0].seq) + "," + std::to_string(image->cells[1].seq) + "," +
            std::to_string(image->cells[2].seq) +
            (image->torn ? " (a cell fails its checksum)" : ""));
      }
      previous = image->bytes;
    }
    if (IsLocked(image->lock) && server_waits && !IsReadLock(image->lock)) {
      // The next copy is read once the server saw this holder let go. Held by the one we
      // waited for still: the slice passed, or the server was at its cap of waiters and
      // answered at once; then pause as a poller would, not to spin round trips.
      if (image->lock == waited_for) {
        locked_pause_ns = std::min<int64_t>(2 * locked_pause_ns, kMaxLockedPauseNs);
        std::this_thread::sleep_for(std::chrono::nanoseconds(locked_pause_ns));
      }
      holder = image->lock;
    } else if (IsLocked(image->lock) && tries >= kLockedRereads) {
      // A committer holds it for its remaining rounds: re-reading at once costs a round trip
      // each (and the holder's servers the work) without ending the wait sooner.
      locked_pause_ns = std::min<int64_t>(2 * locked_pause_ns, kMaxLockedPauseNs);
      std::this_thread::sleep_for(std::chrono::nanoseconds(locked_pause_ns));
    } else if (tries > 16) {
      std::this_thread::yield();
    }
  }
  return Status::Ok();
}

Status NamTxn::VisibleVersion(const NamTable& t, const RecordImage& image, bool* found,
                              bool* deleted, std::string* payload) {
  *found = false;
  *deleted = false;
  if (image.newest < 0) return Status::Ok();
  auto take = [&](const CellView& c) {
    *found = !(c.flags & kFlagDeleted);
    *deleted = (c.flags & kFlagDeleted) != 0;
    payload->assign(reinterpret_cast<const char*>(c.payload), t.layout_.payload);
  };
  // Cells newest first (they are consecutive: newest, newest-1, newest-2).
  const uint64_t n = image.newest_seq();
  for (uint64_t back = 0; back < kCells && back < n; ++back) {
    const CellView& c = image.cells[(n - back) % kCells];
    if (Visible(c.stamp)) {
      take(c);
      return Status::Ok();
    }
  }
  // Older versions: the chain hanging off the newest cell.
  GlobalAddress at = GlobalAddress::FromRaw(image.cells[image.newest].chain);
  std::vector<unsigned char> node(t.layout_.cell_size());
  while (!at.is_null()) {
    FARPOOL_RETURN_IF_ERROR(s_.access_.Read(at, node.data(), node.size()));
    CellView c = DecodeCell(node.data(), t.layout_);
    if (!c.valid) {
      // Only a session that lost its lease can meet a freed node; say which it is.
      FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
      return Status::Internal("version node " + at.ToString() + " of table '" + t.name_ +
                              "' fails its checksum");
    }
    if (Visible(c.stamp)) {
      take(c);
      return Status::Ok();
    }
    at = GlobalAddress::FromRaw(c.chain);
  }
  return Status::Ok();  // no version old enough: the key did not exist at our snapshot
}

Status NamTxn::LoadRows(std::span<const RowLoad> loads) {
  Access::Batch b(s_.access_);
  for (const RowLoad& l : loads) {
    const NamTable& t = *l.t;
    Row& row = *l.row;
    row = Row(t.schema_);
    RowAccess::payload(row) = *l.payload;
    RowAccess::payload(row).resize(t.schema_.PayloadSize());
    for (uint32_t c : t.bytes_columns_) {
      if (!l.columns.Has(c)) continue;  // not wanted: not read
      uint64_t ref[2];
      std::memcpy(ref, l.payload->data() + t.schema_.Offset(c), 16);
      std::string& v = RowAccess::bytes(row)[c];
      v.assign(ref[1], '\0');
      if (ref[1] > 0)
        FARPOOL_RETURN_IF_ERROR(b.Read(GlobalAddress::FromRaw(ref[0]), v.data(), ref[1]));
    }
    KeepColumns(l.columns, row);
  }
  return b.Wait();
}

Status NamTxn::FinishSnapshot(const NamSession::SnapshotRead& read, const Status& batch_status,
                              bool* cache_cleared) {
  FARPOOL_ASSIGN_OR_RETURN(snapshot_, s_.FinishSnapshot(read, batch_status, cache_cleared));
  has_snapshot_ = true;
  ++snapshot_gen_;
  return Status::Ok();
}

Status NamTxn::TakeSnapshot() {
  if (has_snapshot_) return Status::Ok();
  FARPOOL_ASSIGN_OR_RETURN(snapshot_, s_.TakeSnapshot());
  has_snapshot_ = true;
  ++snapshot_gen_;
  return Status::Ok();
}

Status NamTxn::ReadKeys(std::span<KeyRead> keys, GuessedRecords* guessed) {
  const bool first = !has_snapshot_;
  for (int retake = 0;; ++retake) {
    RoundTripScope cause(retake == 0 ? RoundTripScope::current() : RoundTripCause::kRetake);
    FARPOOL_RETURN_IF_ERROR(ReadKeysOnce(keys, guessed));
    // The first read returns nothing until here, so the snapshot it took may be taken again:
    // if a key it read got a newer version than the snapshot (a commit that took its stamp
    // after our counter read, met as a lock and waited for, or installed meanwhile), a write
    // of that key would abort at commit (first committer wins). A later snapshot sees it.
    if (!first || retake == kSnapshotRetakes) return Status::Ok();
    if (std::all_of(reads_.begin(), reads_.end(),
                    [](const auto& r) { return r.second.newest_visible; })) {
      return Status::Ok();
    }
    // All of them this call's (there was no snapshot before it; read committed: those of
    // earlier calls stay, each read as of its own call's snapshot).
    for (const KeyRead& k : keys) reads_.erase({k.t->id_, k.key});
    s_.EndTransaction();
    has_snapshot_ = false;
    for (KeyRead& k : keys) {
      KeyRead fresh;
      fresh.t = k.t;
      fresh.key = k.key;
      k = std::move(fresh);
    }
  }
}

Status NamTxn::FindRecords(std::span<KeyRead> keys, bool copies) {
  // The index lookups the cache does not answer, with the snapshot's counter read if this is
  // the transaction's first read. The records must be read after the counter (a commit locks
  // before it takes its stamp: a snapshot that includes the stamp then meets the lock), so
  // they wait for round 2 (but see below).
  std::vector<KeyRead*> lookups;
  bool any_cached = false;
  for (KeyRead& k : keys) {
    if (k.done || k.held_at_lookup) continue;
    k.prefetched = false;
    k.record = s_.CachedRecord(*k.t, k.key);
    k.cached = !k.record.is_null();
    if (!k.cached) lookups.push_back(&k);
    any_cached = any_cached || k.cached;
  }
  if (!has_snapshot_ || !lookups.empty() || (copies && any_cached)) {
    NamSession::SnapshotRead snap;
    const bool taking = !has_snapshot_;
    bool cache_cleared = false;
    std::vector<std::array<unsigned char, HashIndex::kBucketSize>> buckets(lookups.size());
    // Lookups that read the record too (HashIndex::PostLookupRead: one round trip for
    // both where the memory server holds the bucket and the record). A record must be read
    // after the snapshot's counter, so while the snapshot is being taken only the keys
    // whose head bucket is on the counter's server do so, behind a fence (a server
    // executes its message in order); the others read their records in round 2. By the
    // same fence, the cached records on the counter's server are read in this round too.
    std::vector<uint8_t> combined(lookups.size(), 0);
    {
      Access::Batch b(s_.access_);
      // Read committed's locking reads read no versions (only what they lock).
      Status posted = taking ? s_.PostSnapshot(b, &snap, /*versions=*/!copies) : Status::Ok();
      records_only_ = records_only_ || (taking && copies);
      if (taking && !posted.ok()) return posted;
      const uint16_t counter_server = s_.db_.RootField(kRootCounter).server();
      bool fenced = false;
      for (size_t j = 0; j < lookups.size() && posted.ok(); ++j) {
        KeyRead& k = *lookups[j];
        const uint64_t size = k.t->layout_.record_size();
        combined[j] = size <= kMaxLookupReadBytes &&
                      (!taking || copies || k.t->hash_->HeadServer(k.key) == counter_server);
        if (!combined[j]) {
          posted = k.t->hash_->PostLookup(b, k.key, buckets[j].data());
          continue;
        }
        if (taking && !copies && !fenced) {
          posted = b.Fence();
          fenced = true;
          if (!posted.ok()) break;
        }
        k.image.bytes.resize(size);
        posted = k.t->hash_->PostLookupRead(b, k.key, k.image.bytes.data(),
                                            static_cast<uint32_t>(size), &k.lookup);
      }
      for (KeyRead& k : keys) {
        if (!posted.ok()) break;
        if (k.done || !k.cached || k.held_at_lookup) continue;
        // Copies for LockKeys need no order (they are guesses of the word to expect).
        const bool ordered = taking && k.record.server() == counter_server;
        if (!ordered && !copies) continue;
        if (ordered && !fenced) {
          posted = b.Fence();
          fenced = true;
          if (!posted.ok()) break;
        }
        k.image.bytes.resize(k.t->layout_.record_size());
        posted = b.Read(k.record, k.image.bytes.data(), k.image.bytes.size());
        k.prefetched = posted.ok();
      }
      Status waited = b.Wait();
      if (!posted.ok()) waited = posted;
      if (taking) FARPOOL_RETURN_IF_ERROR(FinishSnapshot(snap, waited, &cache_cleared));
      FARPOOL_RETURN_IF_ERROR(waited);
    }
    for (size_t j = 0; j < lookups.size(); ++j) {
      KeyRead& k = *lookups[j];
      if (combined[j]) {
        FARPOOL_ASSIGN_OR_RETURN(
            k.record, k.t->hash_->FinishLookupRead(s_.access_, k.key, k.lookup, &k.prefetched));
      } else {
        FARPOOL_ASSIGN_OR_RETURN(k.record,
                                 k.t->hash_->FinishLookup(s_.access_, k.key, buckets[j].data()));
      }
      if (!k.record.is_null()) s_.RememberRecord(*k.t, k.key, k.record);
    }
    if (cache_cleared) {
      // Records were removed since the cache was filled: look the cached ones up again.
      for (KeyRead& k : keys) {
        if (!k.done && k.cached && !k.held_at_lookup) {
          k.prefetched = false;  // its address may have changed
          FARPOOL_ASSIGN_OR_RETURN(k.record, s_.FindRecord(*k.t, k.key));
        }
      }
    }
  }
  return Status::Ok();
}

Status NamTxn::ReadKeysOnce(std::span<KeyRead> keys, GuessedRecords* guessed) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    // Round 1 (FindRecords): the records, and the snapshot if none is taken yet.
    FARPOOL_RETURN_IF_ERROR(FindRecords(keys, /*copies=*/false));
    // Round 2: every record, in one batch.
    {
      Access::Batch b(s_.access_);
      for (KeyRead& k : keys) {
        if (k.done) continue;
        if (k.record.is_null()) {
          k.done = true;  // no record: the key does not exist
          continue;
        }
        if (k.prefetched) continue;  // read with its lookup
        if (guessed != nullptr && TakeGuess(*guessed, *k.t, k.record, k.key, &k.image)) continue;
        k.image.bytes.resize(k.t->layout_.record_size());
        FARPOOL_RETURN_IF_ERROR(b.Read(k.record, k.image.bytes.data(), k.image.bytes.size()));
      }
      FARPOOL_RETURN_IF_ERROR(b.Wait());
    }
    if (!s_.access_.memory().mapped()) {  // where SettleRecord polls, nothing to do here
      std::vector<LockedCopy> copies;
      for (KeyRead& k : keys) {
        if (!k.done) copies.push_back({k.t, k.key, k.record, &k.image});
      }
      FARPOOL_RETURN_IF_ERROR(RecopyLocked(copies));
    }
    for (KeyRead& k : keys) {
      if (k.done) continue;
      bool key_ok;
      FARPOOL_RETURN_IF_ERROR(SettleRecord(*k.t, k.record, k.key, &k.image, &key_ok));
      if (!key_ok) {
        // A stale cache entry or a raced index entry: the next attempt looks the key up.
        if (k.image.lock == kRemovedLock && k.image.key == k.key) {
          FARPOOL_RETURN_IF_ERROR(s_.HelpUnlink(*k.t, k.key, k.record));
        }
        s_.ForgetRecord(*k.t, k.key);
        continue;
      }
      FARPOOL_RETURN_IF_ERROR(VisibleVersion(*k.t, k.image, &k.found, &k.deleted, &k.payload));
      // The read, for the commit's validation (the image's bytes move there: done with them).
      ReadEntry& re = reads_[{k.t->id_, k.key}];
      re.record = k.record;
      re.newest_seq = k.image.newest_seq();
      re.newest_visible = k.image.newest < 0 || Visible(k.image.cells[k.image.newest].stamp);
      re.image = std::move(k.image.bytes);
      k.done = true;
    }
    if (std::all_of(keys.begin(), keys.end(), [](const KeyRead& k) { return k.done; })) {
      return Status::Ok();
    }
  }
  for (const KeyRead& k : keys) {
    if (!k.done) {
      return Status::Internal("index entry of key " + std::to_string(k.key) + " in table '" +
                              k.t->name_ + "' names a record of another key");
    }
  }
  return Status::Ok();
}

namespace {
Status NoKey(const NamTable& t, int64_t key) {
  return Status::NotFound("table '" + t.name_ + "' has no key " + std::to_string(key));
}
}  // namespace

bool NamTxn::ReadOwnWrite(const NamTable& t, int64_t key, Row* row, Status* status) const {
  auto w = writes_.find({t.id_, key});
  if (w == writes_.end()) return false;
  if (w->second.deleted) {
    *status = Status::NotFound("key " + std::to_string(key) + " deleted by this transaction");
  } else {
    *row = Row(t.schema_);
    RowAccess::payload(*row) = w->second.payload;
    RowAccess::bytes(*row) = w->second.bytes;
    *status = Status::Ok();
  }
  return true;
}

Status NamTxn::ReadHeld(const HeldLock& h, KeyRead* k) {
  RecordImage image;
  image.bytes = h.image;
  image.Decode(h.t->layout_);
  k->t = h.t;
  k->record = h.record;
  k->done = true;
  k->found = false;
  k->deleted = false;
  if (image.newest < 0) return Status::Ok();
  // The newest version: what the lock was taken on, and (SI) visible to the snapshot.
  const CellView& c = image.cells[image.newest];
  k->deleted = (c.flags & kFlagDeleted) != 0;
  k->found = !k->deleted;
  k->payload.assign(reinterpret_cast<const char*>(c.payload), h.t->layout_.payload);
  return Status::Ok();
}

// MultiGet of one key, without its vectors (the most common read).
Status NamTxn::GetOne(const Table& table, int64_t key, Row* row, ColumnSet columns) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  RoundTripScope cause(RoundTripCause::kRead);
  const auto& t = static_cast<const NamTable&>(table);
  Status own;
  if (ReadOwnWrite(t, key, row, &own)) {
    if (own.ok()) KeepColumns(columns, *row);
    return own;
  }
  KeyRead k;
  k.t = &t;
  k.key = key;
  auto h = held_.find({t.id_, key});
  if (h != held_.end()) {
    FARPOOL_RETURN_IF_ERROR(ReadHeld(h->second, &k));
  } else {
    FARPOOL_RETURN_IF_ERROR(FreshSnapshotForRead());
    FARPOOL_RETURN_IF_ERROR(ReadKeys(std::span<KeyRead>(&k, 1)));
  }
  if (k.found) {
    const RowLoad load{&t, &k.payload, row, columns};
    FARPOOL_RETURN_IF_ERROR(LoadRows(std::span<const RowLoad>(&load, 1)));
  }
  FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
  return k.found ? Status::Ok() : NoKey(t, key);
}

Status NamTxn::GetForUpdate(const Table& table, int64_t key, Row* row, LockIntent intent) {
  std::vector<Row> rows;
  std::vector<Status> statuses;
  const TableKey k{&table, key};
  FARPOOL_RETURN_IF_ERROR(
      Outcome(ReadMany(std::span<const TableKey>(&k, 1), intent, &rows, &statuses)));
  *row = std::move(rows[0]);
  return statuses[0];
}

// The other public calls: their bodies, with the outcome kept (Outcome).
Status NamTxn::Get(const Table& table, int64_t key, Row* row, ColumnSet columns) {
  return Outcome(GetOne(table, key, row, columns));
}

Status NamTxn::MultiGet(std::span<const TableKey> keys, std::vector<Row>* rows,
                        std::vector<Status>* statuses) {
  return Outcome(ReadMany(keys, std::nullopt, rows, statuses));
}

Status NamTxn::MultiGetForUpdate(std::span<const TableKey> keys, std::vector<Row>* rows,
                                 std::vector<Status>* statuses, LockIntent intent) {
  return Outcome(ReadMany(keys, intent, rows, statuses));
}

Status NamTxn::Delete(const Table& table, int64_t key) { return Outcome(DeleteOne(table, key)); }

Status NamTxn::Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
                    ColumnSet columns, const std::function<bool(int64_t, const Row&)>& visit) {
  return Outcome(ScanTable(table, lo, hi, limit, reverse, columns, visit));
}

Status NamTxn::ScanMany(std::span<const ScanRange> ranges,
                        const std::function<bool(size_t, int64_t, const Row&)>& visit) {
  return Outcome(ScanManyRanges(ranges, visit));
}

Status NamTxn::ScanThenGet(std::span<const ScanRange> ranges, const Table& target,
                           ColumnSet columns,
                           const std::function<int64_t(size_t range, int64_t key)>& target_key,
                           const std::function<bool(size_t range, int64_t key, const Status& status,
                                                    const Row& row)>& visit) {
  return Outcome(ScanThenGetRows(ranges, target, columns, target_key, visit));
}

Status NamTxn::Usable() const {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  if (aborted_) {
    return Status::Aborted(
        "an earlier call of this transaction returned Aborted: it can only be rolled back");
  }
  return Status::Ok();
}

Status NamTxn::ReadMany(std::span<const TableKey> keys, std::optional<LockIntent> lock,
                        std::vector<Row>* rows, std::vector<Status>* statuses,
                        GuessedRecords* guessed) {
  const bool for_update = lock.has_value();
  FARPOOL_RETURN_IF_ERROR(Usable());
  RoundTripScope cause(RoundTripCause::kRead);
  rows->assign(keys.size(), Row());
  statuses->assign(keys.size(), Status::Ok());
  // reads: keys to read (or lock); from_held: keys locked earlier, answered from their copy.
  // Both reserved: RowLoads point into them.
  std::vector<KeyRead> reads, from_held;
  std::vector<size_t> at, at_held;  // keys index of each
  reads.reserve(keys.size());
  from_held.reserve(keys.size());
  std::map<Key, size_t> seen;                      // key -> its first index in keys
  std::vector<std::pair<size_t, size_t>> repeats;  // (index, the first index of its key)
  // The columns to load of each key read: those of all its repeats.
  std::vector<ColumnSet> load_columns(keys.size(), ColumnSet::None());
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& t = static_cast<const NamTable&>(*keys[i].table);
    const Key key{t.id_, keys[i].key};
    if (auto [first, fresh] = seen.emplace(key, i); !fresh) {
      repeats.push_back({i, first->second});  // read (or locked) once
      load_columns[first->second] = load_columns[first->second] | keys[i].columns;
      continue;
    }
    load_columns[i] = keys[i].columns;
    const bool own = writes_.count(key) > 0;
    auto h = held_.find(key);
    // Our own write answers, unless the key is to be locked still.
    if (own && (!for_update || h != held_.end())) {
      ReadOwnWrite(t, keys[i].key, &(*rows)[i], &(*statuses)[i]);  // projected below
      continue;
    }
    KeyRead& k = h != held_.end() ? from_held.emplace_back() : reads.emplace_back();
    k.t = &t;
    k.key = keys[i].key;
    if (h != held_.end()) {
      FARPOOL_RETURN_IF_ERROR(ReadHeld(h->second, &k));
      at_held.push_back(i);
    } else {
      at.push_back(i);
    }
  }
  if (!reads.empty()) {
    if (for_update) {
      FARPOOL_RETURN_IF_ERROR(LockKeys(reads, *lock));
    } else {
      if (guessed == nullptr) FARPOOL_RETURN_IF_ERROR(FreshSnapshotForRead());
      FARPOOL_RETURN_IF_ERROR(ReadKeys(reads, guessed));
    }
  }
  std::vector<RowLoad> loads;
  auto answer = [&](KeyRead& k, size_t i) {
    if (ReadOwnWrite(*k.t, k.key, &(*rows)[i], &(*statuses)[i])) return;  // locked just now
    if (k.found) {
      loads.push_back({k.t, &k.payload, &(*rows)[i], load_columns[i]});
    } else {
      (*statuses)[i] = NoKey(*k.t, k.key);
    }
  };
  for (size_t j = 0; j < reads.size(); ++j) answer(reads[j], at[j]);
  for (size_t j = 0; j < from_held.size(); ++j) answer(from_held[j], at_held[j]);
  FARPOOL_RETURN_IF_ERROR(LoadRows(loads));
  for (const auto& [i, first] : repeats) {
    (*rows)[i] = (*rows)[first];
    (*statuses)[i] = (*statuses)[first];
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if ((*statuses)[i].ok()) KeepColumns(keys[i].columns, (*rows)[i]);
  }
  return s_.CheckLease();
}

Status NamTxn::LockAtLookup(std::span<KeyRead> keys, uint64_t mine, LockIntent intent) {
  // Records too large for one message are found and copied by FindRecords, which takes the
  // snapshot then: nothing to do here for them.
  if (std::none_of(keys.begin(), keys.end(), [](const KeyRead& k) {
        return !k.done && k.t->layout_.record_size() <= kMaxLookupReadBytes;
      })) {
    return Status::Ok();
  }
  // No lock of this session while its last commit's log is whole (NamSession::log_to_clear_),
  // but a lock may share the round that clears it: log recovery matches the plain word only,
  // never a read-lock word, and rolls a log into a record only while the record holds the
  // entry's key and has not moved past that log's version (recovery.cc), so the two need no
  // order.
  if (has_snapshot_ && s_.log_to_clear_ != 0) FARPOOL_RETURN_IF_ERROR(s_.ClearLog());
  if (intent == LockIntent::kUpdate) FARPOOL_RETURN_IF_ERROR(NewPending(keys, mine));
  // The CASes and the inserts' stores follow a passed check.
  if (Status s = s_.CheckLease(); !s.ok()) {
    (void)FinishPrepare(false, mine);  // frees the new records: nothing was posted
    return s;
  }
  const bool taking = !has_snapshot_;
  NamSession::SnapshotRead snap;
  std::vector<uint8_t> posted_at(keys.size(), 0);
  Status posted, waited;
  {
    Access::Batch b(s_.access_);
    // Locking reads read no versions (only what they lock: NamTxn::records_only_). No record
    // needs to follow the counter here: each is locked at its newest version and read behind the
    // lock, and LockKeys' checks (SI: a version newer than the snapshot) come after.
    if (taking) {
      records_only_ = true;
      if (Status s = s_.PostSnapshot(b, &snap, /*versions=*/false); !s.ok()) {
        (void)FinishPrepare(false, mine);
        return s;
      }
    }
    for (size_t j = 0; j < keys.size() && posted.ok(); ++j) {
      KeyRead& k = keys[j];
      const uint64_t size = k.t->layout_.record_size();
      if (k.done || size > kMaxLookupReadBytes) continue;
      k.image.bytes.resize(size);
      posted = k.t->hash_->PostLookupLockRead(b, k.key, /*lock_offset=*/0, /*held_mask=*/1, mine,
                                              k.image.bytes.data(), static_cast<uint32_t>(size),
                                              &k.lock_read);
      posted_at[j] = posted.ok();
    }
    if (posted.ok() && intent == LockIntent::kUpdate) posted = PostPrepare(b);
    waited = b.Wait();
    if (!posted.ok()) waited = posted;
  }
  for (size_t j = 0; j < keys.size(); ++j) {
    KeyRead& k = keys[j];
    if (posted_at[j] && k.lock_read.locked) {
      held_[{k.t->id_, k.key}] = {k.t, k.lock_read.lookup.value, k.lock_read.found, k.image.bytes,
                                  mine};
    }
  }
  // Pending inserts: into held_ if live (or maybe live), else their records are freed.
  const Status prepared = FinishPrepare(waited.ok(), mine);
  bool cache_cleared = false;
  if (!waited.ok() && std::find(posted_at.begin(), posted_at.end(), 1) != posted_at.end()) {
    // A lock may have been taken from a word we never learned: no release could restore it.
    // The session stops; its locks are broken once its slot is fenced (GaveUp; BreakRecordLock
    // restores the newest version's word), as after a failed waiting compare-and-swap in LockKeys.
    s_.Abandon();
  }
  if (taking) FARPOOL_RETURN_IF_ERROR(FinishSnapshot(snap, waited, &cache_cleared));
  FARPOOL_RETURN_IF_ERROR(waited);
  FARPOOL_RETURN_IF_ERROR(prepared);
  // What the batch read for the commit is proof under the snapshot open now.
  if (intent == LockIntent::kUpdate) prep_.snapshot = snapshot_gen_;
  // Locks taken on a record of another key (a raced index entry) are given back at once.
  std::vector<KeyRead*> wrong;
  for (size_t j = 0; j < keys.size(); ++j) {
    KeyRead& k = keys[j];
    if (!posted_at[j]) continue;
    bool read = false;
    FARPOOL_ASSIGN_OR_RETURN(
        k.record, k.t->hash_->FinishLookupRead(s_.access_, k.key, k.lock_read.lookup, &read));
    if (k.record.is_null()) {
      k.done = true;  // no record: the key does not exist (nothing to lock)
      continue;
    }
    k.prefetched = read;
    if (!read) continue;  // LockKeys' rounds copy and lock it
    k.image.Decode(k.t->layout_);
    if (k.image.key != k.key) {
      if (k.lock_read.locked) wrong.push_back(&k);
      k.prefetched = false;
      continue;
    }
    s_.RememberRecord(*k.t, k.key, k.record);
    if (!k.lock_read.locked) continue;
    if (k.image.torn || !CellsConsecutive(k.image) ||
        UnlockedWord(k.image.newest_seq()) != k.lock_read.found) {
      return Status::Internal("record of key " + std::to_string(k.key) + " in table '" +
                              k.t->name_ + "' at " + k.record.ToString() +
                              " does not hold the version its lock word named: corruption");
    }
    k.held_at_lookup = true;
  }
  if (!wrong.empty()) {
    RoundTripScope cause(RoundTripCause::kRelease);
    std::vector<uint64_t> prev(wrong.size());
    Access::Batch b(s_.access_);
    for (size_t i = 0; i < wrong.size(); ++i) {
      FARPOOL_RETURN_IF_ERROR(b.Cas(wrong[i]->record, mine, wrong[i]->lock_read.found, &prev[i]));
    }
    FARPOOL_RETURN_IF_ERROR(b.Wait());  // on an error they stay in held_: Finish releases them
    for (KeyRead* k : wrong) {
      held_.erase({k->t->id_, k->key});
      s_.ForgetRecord(*k->t, k->key);
    }
  }
  if (cache_cleared) {
    // Records were removed since the cache was filled: the lookups above did not use it, but
    // the addresses they found are the ones to remember.
    for (size_t j = 0; j < keys.size(); ++j) {
      if (posted_at[j] && !keys[j].record.is_null()) {
        s_.RememberRecord(*keys[j].t, keys[j].key, keys[j].record);
      }
    }
  }
  return Status::Ok();
}

Status NamTxn::NewPending(std::span<const KeyRead> keys, uint64_t mine) {
  prep_ = CommitPrep{};
  for (const KeyRead& k : keys) prep_.descs[k.t] = {0, 0};
  std::set<Key> locking;
  for (const KeyRead& k : keys) locking.insert({k.t->id_, k.key});
  // Pending new keys: written, neither read nor locked (nor being locked now), unknown to the
  // session's cache (so most likely new), in a table whose index is the hash index alone.
  for (const auto& [key, w] : writes_) {
    prep_.descs[w.table] = {0, 0};
    if (w.deleted || w.table->btree_ || held_.count(key) || reads_.count(key) ||
        locking.count(key) || !s_.CachedRecord(*w.table, w.key).is_null()) {
      continue;
    }
    CommitPrep::Insert ins{w.table, w.key, GlobalAddress(), {}, {}};
    Result<GlobalAddress> fresh = NewRecord(s_, *w.table, w.key, &ins.image);
    if (!fresh.ok()) {
      (void)FinishPrepare(false, mine);
      return fresh.status();
    }
    ins.record = *fresh;
    // A record the uncleared log names (freed and reused since) would be taken locked in the
    // round that clears the log, unordered with the clear: if the clear did not land, recovery
    // would roll that log into our new record if the log's entry names this key (deleted,
    // removed and inserted again), whose first version it is. Such a rare insert is left to
    // the commit.
    const bool logged =
        s_.log_to_clear_ != 0 && std::find(s_.logged_records_.begin(), s_.logged_records_.end(),
                                           ins.record.raw()) != s_.logged_records_.end();
    if (logged || ins.record.server() != w.table->hash_->HeadServer(w.key)) {
      // The insert can be done near memory only beside its head bucket: the commit inserts it.
      (void)s_.db_.recycler().Free(s_.access_, s_, ins.record, w.table->layout_.record_size());
      continue;
    }
    std::memcpy(ins.image.data(), &mine, 8);
    prep_.inserts.push_back(std::move(ins));
  }
  return Status::Ok();
}

Status NamTxn::PostPrepare(Access::Batch& b) {
  for (auto& [t, words] : prep_.descs) FARPOOL_RETURN_IF_ERROR(b.Read(t->desc_, words.data(), 16));
  // Every counter value this process has seen came from an operation that completed before the
  // array's read is sent.
  prep_.announced_upto = s_.db_.latest_counter();
  prep_.announced.resize(s_.db_.root().max_slots);
  FARPOOL_RETURN_IF_ERROR(
      b.Read(s_.db_.AnnounceAddr(0), prep_.announced.data(), prep_.announced.size() * 8));
  if (prep_.inserts.empty()) return Status::Ok();
  for (const CommitPrep::Insert& ins : prep_.inserts) {
    FARPOOL_RETURN_IF_ERROR(b.Write(ins.record, ins.image.data(), ins.image.size()));
  }
  FARPOOL_RETURN_IF_ERROR(b.Fence());  // a record is whole before its entry can go live
  for (CommitPrep::Insert& ins : prep_.inserts) {
    ins.posted = true;
    FARPOOL_RETURN_IF_ERROR(ins.t->hash_->PostInsert(b, s_, ins.key, ins.record, &ins.inserted));
  }
  return Status::Ok();
}

Status NamTxn::FinishPrepare(bool ok, uint64_t mine) {
  Status failed;
  for (CommitPrep::Insert& ins : prep_.inserts) {
    const uint64_t size = ins.t->layout_.record_size();
    const Key key{ins.t->id_, ins.key};
    if (!ins.posted) {
      (void)s_.db_.recycler().Free(s_.access_, s_, ins.record, size);
      continue;
    }
    Result<GlobalAddress> got = ok ? ins.t->hash_->FinishInsert(ins.key, ins.inserted)
                                   : Result<GlobalAddress>(GlobalAddress());
    if (!ok || !got.ok()) {
      // Its entry may be live, locked by us: released like any lock (to the empty record's
      // unlocked word), the record kept.
      held_[key] = {ins.t, ins.record, UnlockedWord(0), ins.image, mine};
      if (failed.ok() && !got.ok()) failed = got.status();
      continue;
    }
    if (*got != ins.record) {
      // Not done near memory (null), or the key has a record already: ours never went live.
      // The commit writes the key as one it did not read.
      (void)s_.db_.recycler().Free(s_.access_, s_, ins.record, size);
      if (!got->is_null()) s_.RememberRecord(*ins.t, ins.key, *got);
      continue;
    }
    held_[key] = {ins.t, ins.record, UnlockedWord(0), ins.image, mine};
    s_.RememberRecord(*ins.t, ins.key, ins.record);
  }
  prep_.inserts.clear();
  return failed;
}

Status NamTxn::LockKeys(std::span<KeyRead> keys, LockIntent intent) {
  const bool first = !has_snapshot_;
  const uint64_t mine =
      intent == LockIntent::kUpdate ? s_.lock_word() : ReadLockWord(s_.lock_word());
  // SI, first read: the newest stamp of the versions locked that are newer than the snapshot.
  uint64_t newest_locked = 0;
  // A record was locked in a round after the lookups of LockAtLookup (see the end).
  bool relocked = false;
  // Round 1: lookups, locks of the free records and copies, in one operation per key.
  FARPOOL_RETURN_IF_ERROR(LockAtLookup(keys, mine, intent));
  for (int attempt = 0;; ++attempt) {
    if (attempt == 3) {
      for (const KeyRead& k : keys) {
        if (!k.done) {
          return Status::Internal("index entry of key " + std::to_string(k.key) + " in table '" +
                                  k.t->name_ + "' names a record of another key");
        }
      }
      break;
    }
    // The records not locked or copied by LockAtLookup (and, after the first attempt, those
    // lost from under their index entries): lookups, or the cache validated by the snapshot,
    // and a copy of each, whose lock word is what we expect to find.
    const bool copied = attempt == 0 && std::all_of(keys.begin(), keys.end(), [](const KeyRead& k) {
                          return k.done || k.held_at_lookup || k.prefetched;
                        });
    if (!copied) FARPOOL_RETURN_IF_ERROR(FindRecords(keys, /*copies=*/true));
    // No lock of this session while its last commit's log is whole (NamSession::log_to_clear_):
    // the snapshot round clears it; if it was taken before, this clears it now.
    if (s_.log_to_clear_ != 0) FARPOOL_RETURN_IF_ERROR(s_.ClearLog());
    // Between a copy and the lock round (a key LockAtLookup did not lock).
    if (std::any_of(keys.begin(), keys.end(),
                    [](const KeyRead& k) { return !k.done && !k.held_at_lookup; })) {
      s_.db_.Hook("locking-read.copied");
    }
    // The keys to lock, in address order.
    struct Want {
      KeyRead* k;
      uint64_t expected = 0, prev = 0;
      bool locked = false, tried = false;
      bool copy_held = false;   // its copy showed another's lock
      bool given_back = false;  // released while a record below it was waited for
    };
    std::vector<Want> want;
    for (KeyRead& k : keys) {
      if (k.done) continue;
      if (k.record.is_null()) {
        k.done = true;  // no record: the key does not exist (nothing to lock)
        continue;
      }
      Want w{&k};
      if (k.held_at_lookup) {  // ours since LockAtLookup (in held_), from the word it had
        k.held_at_lookup = false;
        w.expected = w.prev = held_[{k.t->id_, k.key}].expected;
        w.locked = w.tried = true;
        want.push_back(w);
        continue;
      }
      // The word to expect: the copy's, or the read of it in this transaction; a copy locked by
      // another says its holder is likely to commit the next version. Wrong guesses cost a
      // retry (the CAS returns the word, the read behind it the record).
      if (k.prefetched) {
        k.image.Decode(k.t->layout_);
        if (k.image.key == k.key && !IsLocked(k.image.lock)) {
          w.expected = k.image.lock;
        } else if (k.image.key == k.key && k.image.lock != kRemovedLock && !k.image.torn &&
                   CellsConsecutive(k.image)) {
          w.expected = UnlockedWord(k.image.newest_seq() + 1);
          w.copy_held = true;
        }
      } else if (auto r = reads_.find({k.t->id_, k.key}); r != reads_.end()) {
        w.expected = UnlockedWord(r->second.newest_seq);
      }
      k.image.bytes.resize(k.t->layout_.record_size());
      want.push_back(w);
    }
    std::sort(want.begin(), want.end(),
              [](const Want& a, const Want& b) { return a.k->record.raw() < b.k->record.raw(); });
    auto lost = [&](const Want& w) {
      return w.prev == kRemovedLock || (w.tried && !w.locked && w.k->image.key != w.k->key);
    };
    // Retried often where we poll (the holder keeps the lock for its whole transaction, then
    // the record is free for about one round trip before the next locker takes it): pauses of
    // 10 µs up to 100 µs. Over messages the server waits instead (no pause).
    LockWait wait(kLockingReadWaitNs, 10'000, 100'000);
    const bool server_waits = !s_.access_.memory().mapped();
    // Locks `which` in one batch: per record the CAS and, behind a fence, its read (one message
    // per server). Every lock taken goes into held_ at once (any error releases it from there).
    // Over messages the memory server waits for a held record (a waiting compare-and-swap)
    // instead of us polling it: the highest of `which`, if no record above it is ours (so that
    // a waiter holds only records below the one it waits for: no cycle within a call). It takes
    // the record from whatever unlocked word it finds (the version a retry with the word seen
    // would take), first come first served.
    // `release`: locks of ours above `which` given back in the same batch, before it (same
    // server: in order; others: unordered, but given back either way).
    auto lock = [&](const std::vector<size_t>& which,
                    const std::vector<size_t>& release = {}) -> Status {
      FARPOOL_RETURN_IF_ERROR(s_.CheckLease());  // the CASes follow a passed check
      relocked = relocked || !which.empty();
      size_t waiter = want.size();
      if (server_waits && !which.empty()) {
        waiter = which.back();  // `which` ascends
        for (size_t i = waiter + 1; i < want.size(); ++i) {
          const bool released = std::find(release.begin(), release.end(), i) != release.end();
          if (want[i].locked && !released) waiter = want.size();
        }
      }
      // What the round is for (TxnCounters::round_trips_by_cause): a wait for a held record, a
      // record given back taken again, or else a plain attempt.
      RoundTripCause why = RoundTripCause::kLockCas;
      for (size_t i : which) {
        const Want& w = want[i];
        if (i == waiter || (w.tried && IsLocked(w.prev) && w.prev != kRemovedLock)) {
          why = RoundTripCause::kLockWait;
        } else if (w.given_back && why == RoundTripCause::kLockCas) {
          why = RoundTripCause::kRelock;
        }
      }
      RoundTripScope cause(why);
      WaitCasResult waited_cas;
      std::vector<uint64_t> released_prev(release.size());
      Status posted;
      Status waited;
      {
        Access::Batch b(s_.access_);
        for (size_t r = 0; r < release.size() && posted.ok(); ++r) {
          const Want& o = want[release[r]];
          posted = b.Cas(o.k->record, mine, o.expected, &released_prev[r]);
        }
        for (size_t i : which) {
          Want& w = want[i];
          if (!posted.ok()) break;
          posted = i == waiter ? b.WaitCas(w.k->record, w.expected, mine,
                                           wait.ServerWait(kServerWaitSliceUs, true), &waited_cas)
                               : b.Cas(w.k->record, w.expected, mine, &w.prev);
        }
        if (posted.ok()) posted = b.Fence();
        for (size_t i : which) {
          KeyRead& k = *want[i].k;
          if (posted.ok()) posted = b.Read(k.record, k.image.bytes.data(), k.image.bytes.size());
        }
        waited = b.Wait();
      }
      if (posted.ok() && waited.ok()) {
        for (size_t i : release) {  // on an error they stay in held_: Finish releases them
          want[i].locked = false;
          want[i].tried = false;
          want[i].given_back = true;
          held_.erase({want[i].k->t->id_, want[i].k->key});
        }
      }
      for (size_t i : which) {
        Want& w = want[i];
        const bool failed = !posted.ok() || !waited.ok();
        w.tried = true;
        if (i == waiter && !failed) {
          w.prev = waited_cas.previous;
          if (waited_cas.swapped) w.expected = w.prev;  // the word it was taken from
        }
        w.locked = failed || w.prev == w.expected;
        if (!w.locked) {
          w.k->image.Decode(w.k->t->layout_);
          continue;
        }
        if (failed && i == waiter) {
          // It may have been taken from a word we do not know, so no release could restore
          // it: the session stops, and its lock is broken once its slot is fenced (GaveUp;
          // BreakRecordLock restores the newest version's word).
          s_.Abandon();
          continue;
        }
        // Taken (or maybe, on an error): released by Finish unless a commit installs it.
        held_[{w.k->t->id_, w.k->key}] = {w.k->t, w.k->record, w.expected, w.k->image.bytes, mine};
        if (failed) continue;
        RecordImage& img = w.k->image;
        img.Decode(w.k->t->layout_);
        if (img.key != w.k->key || img.torn || !CellsConsecutive(img) ||
            UnlockedWord(img.newest_seq()) != w.expected) {
          return Status::Internal("record of key " + std::to_string(w.k->key) + " in table '" +
                                  w.k->t->name_ + "' at " + w.k->record.ToString() +
                                  " does not hold the version its lock word named: corruption");
        }
      }
      if (!posted.ok()) return posted;
      return waited;
    };
    // The first batch: every record, or where the server waits and a copy showed a record
    // held by another, the records up to the lowest such one (which waits at its server; those
    // above follow once it is ours).
    std::vector<size_t> first_batch;
    for (size_t i = 0; i < want.size(); ++i) {
      if (want[i].locked) continue;  // locked at lookup
      first_batch.push_back(i);
      if (server_waits && want[i].copy_held) break;
    }
    if (!first_batch.empty()) FARPOOL_RETURN_IF_ERROR(lock(first_batch));
    int moved_on = 0;  // retries at once of words that moved on: bounded by the wait too
    for (;;) {
      // The lowest record not locked (and not gone from under its index entry).
      size_t j = want.size();
      for (size_t i = 0; i < want.size(); ++i) {
        if (!want[i].locked && !lost(want[i])) {
          j = i;
          break;
        }
      }
      if (j == want.size()) break;
      Want& w = want[j];
      std::vector<size_t> retry;
      if (!w.tried || !IsLocked(w.prev)) {
        // Its word moved on (a commit since our copy), or it was released for ordering: again,
        // with every other not yet locked, expecting the words just seen.
        if (++moved_on > 8 && !wait.Pause()) {
          return Status::Aborted("key " + std::to_string(w.k->key) + " of '" + w.k->t->name_ +
                                 "' keeps getting new versions (locking read)");
        }
        for (size_t i = j; i < want.size(); ++i) {
          Want& o = want[i];
          if (o.locked || lost(o)) continue;
          if (o.tried && !IsLocked(o.prev)) o.expected = o.prev;
          retry.push_back(i);
        }
      } else {
        // Held by another transaction: wait for it without holding anything above it (two
        // calls that lock the same records never wait for each other in a cycle), then retry
        // it alone (the others follow it once it is ours).
        std::vector<size_t> above;
        for (size_t i = j + 1; i < want.size(); ++i) {
          if (want[i].locked) above.push_back(i);
        }
        RoundTripScope cause(RoundTripCause::kLockWait);
        if (wait.CheckDue()) {
          // A dead holder finishes nothing: break its lock (restored to its newest version).
          auto dead = s_.HolderDead(w.prev);
          if (dead.ok() && *dead) {
            FARPOOL_RETURN_IF_ERROR(
                s_.db_.BreakRecordLock(s_.access_, w.k->record, *w.k->t, w.prev));
          }
        }
        auto waited_out = [&] {
          return Status::Aborted("key " + std::to_string(w.k->key) + " of '" + w.k->t->name_ +
                                 "' is locked by another transaction (locking read: waited " +
                                 std::to_string(kLockingReadWaitNs / 1'000'000) + " ms)");
        };
        if (server_waits) {
          // The server waits; those above are given back in the batch that waits (one round
          // trip).
          if (wait.Expired()) return waited_out();
          FARPOOL_RETURN_IF_ERROR(lock({j}, above));
          continue;
        }
        if (!above.empty()) {
          RoundTripScope give_back(RoundTripCause::kRelock);
          Access::Batch b(s_.access_);
          std::vector<uint64_t> prev(above.size());
          for (size_t a = 0; a < above.size(); ++a) {
            Want& o = want[above[a]];
            (void)b.Cas(o.k->record, mine, o.expected, &prev[a]);
          }
          Status released = b.Wait();
          if (!released.ok()) return released;  // still in held_: Finish releases them
          for (size_t i : above) {
            want[i].locked = false;
            want[i].tried = false;
            want[i].given_back = true;
            held_.erase({want[i].k->t->id_, want[i].k->key});
          }
        }
        if (!wait.Pause()) return waited_out();
        // The holder's copy (read behind our CAS): a commit of it installs the next version.
        const RecordImage& img = w.k->image;
        if (img.key == w.k->key && !img.torn && CellsConsecutive(img)) {
          w.expected = UnlockedWord(img.newest_seq() + 1);
        }
        retry.push_back(j);
      }
      FARPOOL_RETURN_IF_ERROR(lock(retry));
    }
    // Locked, or gone from under their index entries (looked up again, next attempt).
    for (Want& w : want) {
      KeyRead& k = *w.k;
      if (!w.locked) {
        if (k.image.lock == kRemovedLock && k.image.key == k.key) {
          FARPOOL_RETURN_IF_ERROR(s_.HelpUnlink(*k.t, k.key, k.record));
        }
        s_.ForgetRecord(*k.t, k.key);
        continue;
      }
      const HeldLock& h = held_[{k.t->id_, k.key}];
      FARPOOL_RETURN_IF_ERROR(ReadHeld(h, &k));
      const RecordImage& img = k.image;
      ReadEntry& re = reads_[{k.t->id_, k.key}];
      re.record = k.record;
      re.newest_seq = img.newest_seq();
      re.newest_visible = true;
      re.image = h.image;
      if (!rc_ && img.newest >= 0 && !Visible(img.cells[img.newest].stamp)) {
        if (!first) {
          return Status::Aborted("key " + std::to_string(k.key) + " of '" + k.t->name_ +
                                 "' has a version newer than the snapshot (could not serialize "
                                 "its locking read)");
        }
        newest_locked = std::max(newest_locked, img.cells[img.newest].stamp);
      }
    }
    if (std::all_of(keys.begin(), keys.end(), [](const KeyRead& k) { return k.done; })) break;
  }
  std::vector<KeyRead> absent;
  if (!rc_ && records_only_) {
    for (const KeyRead& k : keys) {
      if (k.record.is_null()) absent.push_back(KeyRead{.t = k.t, .key = k.key});
    }
  }
  if (!absent.empty() && first && (relocked || newest_locked > snapshot_)) {
    // SI's first read found a key absent, and a record was locked after that lookup (a wait, a
    // word that moved on) or at a version newer than the counter read: a commit that inserted
    // the key after our lookup and wrote a record we locked would be seen in part (read skew;
    // found at the merge's review). So the snapshot is taken again now, announced with its
    // versions, and the absent keys are read in it (their lookups follow its counter read):
    // one that has appeared since aborts the transaction (a retry locks it), else its absence
    // holds in the snapshot, as do the records we hold (at their newest).
    RoundTripScope cause(RoundTripCause::kRetake);
    s_.EndTransaction();
    has_snapshot_ = false;
    records_only_ = false;
    FARPOOL_RETURN_IF_ERROR(TakeSnapshot());
    return CheckStillAbsent(absent);
  }
  // Otherwise the absence holds in the snapshot (docs/database.md, "Keys found absent"): the
  // first read's lookups shared the round of its counter read and of every lock it took, as a
  // plain first read's do, and a later read's lookups follow every commit the snapshot holds.
  // A read of versions takes a snapshot of its own, later (records_only_), and reads these
  // keys in it first (FreshSnapshotForRead).
  for (const KeyRead& k : absent) {
    const std::pair<const NamTable*, int64_t> key{k.t, k.key};
    if (std::find(absent_.begin(), absent_.end(), key) == absent_.end()) absent_.push_back(key);
  }
  if (newest_locked > snapshot_) {
    // The first read: nothing it read has reached the caller, and every record it read is
    // locked by us at its newest version, so the snapshot moves up to the newest stamp among
    // them, without a round trip (docs/database.md, "SI's snapshot moves up to the versions
    // it locked"): every commit with a stamp up to it took that stamp before the commit that
    // holds it did, so it had locked its records before, and each of our later reads meets its
    // lock or its version, as for a snapshot read from the counter; the records we locked hold
    // no version past it. The announcement stays (a lower bound of the snapshot, as before),
    // so the descriptors read with the locks stay proof (CommitPrep: snapshot_gen_ unchanged).
    snapshot_ = newest_locked;
  }
  return Status::Ok();
}

Status NamTxn::CheckStillAbsent(std::span<KeyRead> absent) {
  FARPOOL_RETURN_IF_ERROR(ReadKeys(absent, nullptr));
  for (const KeyRead& k : absent) {
    if (k.found) {
      return Status::Aborted("key " + std::to_string(k.key) + " of '" + k.t->name_ +
                             "' was inserted after a locking read found it absent (its absence "
                             "cannot be kept in the snapshot)");
    }
  }
  return Status::Ok();
}

Status NamTxn::FreshSnapshotForRead() {
  if ((rc_ || records_only_) && has_snapshot_) {
    s_.EndTransaction();
    has_snapshot_ = false;
  }
  records_only_ = false;
  // A check that failed stays failed: a read after it (the caller went on after Aborted)
  // would see the new snapshot with the absence reported before (read skew).
  FARPOOL_RETURN_IF_ERROR(absent_check_);
  if (absent_.empty()) return Status::Ok();
  // SI: keys that locking reads found absent in the records-only snapshot are read in this
  // one before anything else (its counter read first, so that their lookups follow it). Keys
  // this transaction has written or locked since are its own (a read would wait on its lock).
  std::vector<KeyRead> absent;
  for (const auto& [t, key] : absent_) {
    const Key k{t->id_, key};
    if (!writes_.count(k) && !held_.count(k)) absent.push_back(KeyRead{.t = t, .key = key});
  }
  absent_.clear();
  RoundTripScope cause(RoundTripCause::kRetake);
  Status taken = TakeSnapshot();
  absent_check_ = taken.ok() ? CheckStillAbsent(absent) : taken;
  return absent_check_;
}

void NamTxn::ReleaseHeld() {
  std::vector<uint64_t> prev(held_.size());
  Access::Batch b(s_.access_);
  size_t i = 0;
  for (const auto& [key, h] : held_) (void)b.Cas(h.record, h.word, h.expected, &prev[i++]);
  // Some may still be ours: stop the session, so that its slot is fenced (GaveUp) and they
  // are broken (as CommitRun::ReleaseLocks).
  if (!b.Wait().ok()) s_.Abandon();
  held_.clear();
}

Status NamTxn::Put(const Table& table, int64_t key, const Row& row) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  const auto& t = static_cast<const NamTable&>(table);
  if (RowAccess::payload(row).size() != t.schema_.PayloadSize()) {
    return Status::InvalidArgument("row does not match the schema of table '" + t.name_ + "'");
  }
  if (key == INT64_MAX) return Status::InvalidArgument("key INT64_MAX is reserved");
  WriteEntry& w = writes_[{t.id_, key}];
  w.table = &t;
  w.key = key;
  w.deleted = false;
  w.payload = RowAccess::payload(row);
  w.payload.resize(t.layout_.payload, '\0');
  w.bytes = RowAccess::bytes(row);
  w.bytes.resize(t.schema_.size());
  return Status::Ok();
}

Status NamTxn::DeleteOne(const Table& table, int64_t key) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  RoundTripScope cause(RoundTripCause::kRead);
  const auto& t = static_cast<const NamTable&>(table);
  auto w = writes_.find({t.id_, key});
  bool exists;
  auto h = held_.find({t.id_, key});
  if (w != writes_.end()) {
    exists = !w->second.deleted;
  } else if (h != held_.end()) {
    KeyRead read;
    FARPOOL_RETURN_IF_ERROR(ReadHeld(h->second, &read));
    exists = read.found;
  } else {
    KeyRead read;
    read.t = &t;
    read.key = key;
    FARPOOL_RETURN_IF_ERROR(FreshSnapshotForRead());
    FARPOOL_RETURN_IF_ERROR(ReadKeys(std::span<KeyRead>(&read, 1)));
    exists = read.found;
  }
  if (!exists) return NoKey(t, key);
  WriteEntry& e = writes_[{t.id_, key}];
  e.table = &t;
  e.key = key;
  e.deleted = true;
  e.payload.assign(t.layout_.payload, '\0');
  e.bytes.assign(t.schema_.size(), std::string());
  return Status::Ok();
}

bool NamTxn::TakeGuess(GuessedRecords& guessed, const NamTable& t, GlobalAddress record,
                       int64_t key, RecordImage* image) {
  // The first copy if it is the record of this key (a freed or reused record is read again,
  // as any other); SettleRecord then treats it as a copy just read.
  auto g = guessed.find(record.raw());
  if (g == guessed.end()) return false;
  image->bytes = std::move(g->second);
  guessed.erase(g);
  image->Decode(t.layout_);
  return image->key == key && image->lock != kRemovedLock;
}

Status NamTxn::ReadIndexed(std::span<const IndexEntry> entries, std::vector<Row>* rows,
                           std::vector<uint8_t>* found, GuessedRecords* guessed,
                           std::span<const std::pair<const NamTable*, GlobalAddress>> along) {
  rows->assign(entries.size(), Row());
  found->assign(entries.size(), 0);
  if (entries.empty()) return Status::Ok();
  std::vector<RecordImage> images(entries.size());
  // Records this transaction holds locked are answered from the lock's copy (ReadHeld), as
  // Get and MultiGet do: the lock word is our own, and an update intent's plain word would
  // otherwise be waited for as another commit's.
  std::vector<const HeldLock*> held(entries.size(), nullptr);
  for (size_t i = 0; i < entries.size(); ++i) {
    auto h = held_.find({entries[i].t->id_, entries[i].key});
    if (h != held_.end() && h->second.record == entries[i].record) held[i] = &h->second;
  }
  {
    Access::Batch b(s_.access_);
    for (size_t i = 0; i < entries.size(); ++i) {
      if (held[i] != nullptr) continue;
      // A copy read with the leaves, at a time a read of the snapshot may be.
      if (guessed != nullptr &&
          TakeGuess(*guessed, *entries[i].t, entries[i].record, entries[i].key, &images[i])) {
        continue;
      }
      images[i].bytes.resize(entries[i].t->layout_.record_size());
      FARPOOL_RETURN_IF_ERROR(
          b.Read(entries[i].record, images[i].bytes.data(), images[i].bytes.size()));
    }
    std::vector<std::vector<unsigned char>> copies;
    if (b.posted() > 0) {
      copies.reserve(along.size());
      for (const auto& [t, record] : along) {
        auto& copy = copies.emplace_back(t->layout_.record_size());
        FARPOOL_RETURN_IF_ERROR(b.Read(record, copy.data(), copy.size()));
      }
    }
    FARPOOL_RETURN_IF_ERROR(b.Wait());
    for (size_t i = 0; i < copies.size(); ++i)
      guessed->emplace(along[i].second.raw(), std::move(copies[i]));
  }
  if (!s_.access_.memory().mapped()) {  // where SettleRecord polls, nothing to do here
    std::vector<LockedCopy> copies;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (held[i] != nullptr) continue;
      copies.push_back({entries[i].t, entries[i].key, entries[i].record, &images[i]});
    }
    FARPOOL_RETURN_IF_ERROR(RecopyLocked(copies));
  }
  std::vector<std::string> payloads(entries.size());
  std::vector<RowLoad> loads;
  for (size_t i = 0; i < entries.size(); ++i) {
    const IndexEntry& e = entries[i];
    if (held[i] != nullptr) {
      KeyRead k;
      FARPOOL_RETURN_IF_ERROR(ReadHeld(*held[i], &k));
      if (!k.found) continue;
      payloads[i] = std::move(k.payload);
      (*found)[i] = 1;
      loads.push_back({e.t, &payloads[i], &(*rows)[i], e.columns});
      continue;
    }
    bool key_ok;
    FARPOOL_RETURN_IF_ERROR(SettleRecord(*e.t, e.record, e.key, &images[i], &key_ok));
    if (!key_ok) continue;
    bool visible, deleted;
    FARPOOL_RETURN_IF_ERROR(VisibleVersion(*e.t, images[i], &visible, &deleted, &payloads[i]));
    if (!visible) continue;
    (*found)[i] = 1;
    loads.push_back({e.t, &payloads[i], &(*rows)[i], e.columns});
  }
  FARPOOL_RETURN_IF_ERROR(LoadRows(loads));
  return s_.CheckLease();
}

BTree::FirstRound NamTxn::SnapshotRound(NamSession::SnapshotRead* snap) {
  return {[this, snap](Access::Batch& b) { return s_.PostSnapshot(b, snap); },
          [this, snap](const Status& waited) {
            bool cache_cleared;  // scans take no address from the session's record cache
            return FinishSnapshot(*snap, waited, &cache_cleared);
          }};
}

BTree::FirstRound NamTxn::GuessRound(NamSession::SnapshotRead* snap,
                                     std::span<const std::pair<const NamTable*, uint64_t>> guesses,
                                     std::span<const std::pair<const NamTable*, int64_t>> lookups,
                                     GuessedRecords* out) {
  // The copies' state between post and finish (the closures are called once each).
  struct Lookup {
    const NamTable* t;
    int64_t key;
    LookupResult result;
    std::vector<unsigned char> bytes;
  };
  struct State {
    bool taking = false;
    uint64_t before = 0;
    std::vector<std::pair<uint64_t, std::vector<unsigned char>>> copies;
    std::vector<Lookup> lookups;  // reserved: the batch writes into each element
  };
  auto st = std::make_shared<State>();
  auto post = [this, snap, guesses, lookups, st](Access::Batch& b) -> Status {
    st->taking = !has_snapshot_;
    if (st->taking) {
      // A counter value read before this round began (NamDatabase::NoteCounter notes only
      // values read or stamped before): see finish.
      st->before = s_.db_.latest_counter();
      FARPOOL_RETURN_IF_ERROR(s_.PostSnapshot(b, snap));
      // The counter's server reads the records after the counter. Once the snapshot is
      // posted, finish must run: a guess that cannot be posted is dropped, not an error.
      if (!b.Fence().ok()) return Status::Ok();
    }
    st->copies.reserve(guesses.size());
    for (const auto& [t, record] : guesses) {
      auto& copy = st->copies.emplace_back(record, t->layout_.record_size());
      if (!b.Read(GlobalAddress::FromRaw(record), copy.second.data(), copy.second.size()).ok()) {
        st->copies.pop_back();
        break;
      }
    }
    st->lookups.reserve(lookups.size());
    for (const auto& [t, key] : lookups) {
      const uint64_t size = t->layout_.record_size();
      if (size > kMaxLookupReadBytes) continue;
      Lookup& l = st->lookups.emplace_back(Lookup{t, key, {}, std::vector<unsigned char>(size)});
      if (!t->hash_->PostLookupRead(b, key, l.bytes.data(), static_cast<uint32_t>(size), &l.result)
               .ok()) {
        st->lookups.pop_back();
        break;
      }
    }
    return Status::Ok();
  };
  auto finish = [this, snap, st, out](const Status& waited) -> Status {
    if (st->taking) {
      bool cache_cleared;  // scans take no address from the session's record cache
      FARPOOL_RETURN_IF_ERROR(FinishSnapshot(*snap, waited, &cache_cleared));
    }
    FARPOOL_RETURN_IF_ERROR(waited);
    // A copy read in the round of the counter read serves the snapshot only if no commit
    // that the snapshot includes could lock the record after the copy was taken: a commit
    // locks its records before it takes its stamp, so those whose stamp the snapshot
    // includes hold their locks (or have installed) by the time the counter is read. The
    // copy is as good as a read after the counter if it was (the counter's server, behind
    // the fence), or if the counter has not moved since `before` (read before the round):
    // then every stamp the snapshot includes was taken, and its locks held, before the round.
    const uint16_t counter_server = s_.db_.RootField(kRootCounter).server();
    const bool quiet = !st->taking || snapshot_ == st->before;
    for (auto& [record, bytes] : st->copies) {
      if (quiet || GlobalAddress::FromRaw(record).server() == counter_server)
        out->emplace(record, std::move(bytes));
    }
    // The lookups' answers do not depend on the snapshot (as FindRecords' lookups); the records
    // read along serve under the copies' rule.
    for (Lookup& l : st->lookups) {
      bool read = false;
      FARPOOL_ASSIGN_OR_RETURN(GlobalAddress record,
                               l.t->hash_->FinishLookupRead(s_.access_, l.key, l.result, &read));
      if (record.is_null()) continue;
      s_.RememberRecord(*l.t, l.key, record);
      if (read && (quiet || record.server() == counter_server))
        out->emplace(record.raw(), std::move(l.bytes));
    }
    return Status::Ok();
  };
  return {post, finish};
}

namespace {
// Index entries a scan collects before it reads their records (when it has no smaller limit).
constexpr size_t kScanBatch = 256;
// Records a ScanMany reads with its leaves at most (guesses, BTree invariant 13).
constexpr size_t kMaxGuesses = 512;

Status NotOrdered(const NamTable& t) {
  return Status::InvalidArgument("table '" + t.name_ + "' is not ordered (no B+tree)");
}
}  // namespace

Status NamTxn::ScanTable(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
                         ColumnSet columns, const std::function<bool(int64_t, const Row&)>& visit) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  RoundTripScope cause(RoundTripCause::kRead);
  const auto& t = static_cast<const NamTable&>(table);
  if (!t.btree_) return NotOrdered(t);
  FARPOOL_RETURN_IF_ERROR(FreshSnapshotForRead());
  return ScanOne(t, lo, hi, limit, reverse, columns, visit);
}

Status NamTxn::ScanOne(const NamTable& t, int64_t lo, int64_t hi, size_t limit, bool reverse,
                       ColumnSet columns, const std::function<bool(int64_t, const Row&)>& visit) {
  // The snapshot, if this is the transaction's first read, rides in the B+tree walk's first
  // round trip (BTree::FirstRound): index nodes do not depend on the snapshot, as the index
  // lookups of FindRecords. Index entries are collected, up to the limit (or kScanBatch) at a
  // time, and their records read in one batch after it (they must follow the counter), their
  // blobs in another. Rows are handed to `visit` only after the lease check that covers their
  // reads.
  NamSession::SnapshotRead snap;
  const BTree::FirstRound first = SnapshotRound(&snap);
  const size_t batch = limit == 0 ? kScanBatch : std::min(limit, kScanBatch);
  std::vector<IndexEntry> pending;
  size_t visited = 0;
  bool stop = false;
  Status inner;
  auto flush = [&]() -> Status {
    std::vector<Row> rows;
    std::vector<uint8_t> found;
    FARPOOL_RETURN_IF_ERROR(ReadIndexed(pending, &rows, &found));
    for (size_t i = 0; i < pending.size() && !stop; ++i) {
      if (!found[i]) continue;
      ++visited;
      stop = !visit(pending[i].key, rows[i]) || (limit != 0 && visited >= limit);
    }
    pending.clear();
    return Status::Ok();
  };
  FARPOOL_RETURN_IF_ERROR(t.btree_->Scan(
      s_.access_, s_, lo, hi, reverse,
      [&](int64_t k, uint64_t v) {
        pending.push_back({&t, k, GlobalAddress::FromRaw(v), columns});
        if (pending.size() >= batch) {
          inner = flush();
          if (!inner.ok()) return false;
        }
        return !stop;
      },
      has_snapshot_ ? nullptr : &first));
  FARPOOL_RETURN_IF_ERROR(inner);
  // A scan that read nothing (lo > hi) still takes the snapshot: it was a read.
  FARPOOL_RETURN_IF_ERROR(TakeSnapshot());
  if (!stop) FARPOOL_RETURN_IF_ERROR(flush());
  return Status::Ok();
}

Status NamTxn::ScanManyRanges(std::span<const ScanRange> ranges,
                              const std::function<bool(size_t, int64_t, const Row&)>& visit) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  RoundTripScope cause(RoundTripCause::kRead);
  auto table = [&](size_t i) -> const NamTable& {
    return static_cast<const NamTable&>(*ranges[i].table);
  };
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (!table(i).btree_) return NotOrdered(table(i));
  }
  FARPOOL_RETURN_IF_ERROR(FreshSnapshotForRead());
  GuessedRecords guessed;
  return ScanRanges(ranges, nullptr, &guessed, visit);
}

Status NamTxn::ScanThenGetRows(
    std::span<const ScanRange> ranges, const Table& target, ColumnSet columns,
    const std::function<int64_t(size_t range, int64_t key)>& target_key,
    const std::function<bool(size_t range, int64_t key, const Status& status, const Row& row)>&
        visit) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  RoundTripScope cause(RoundTripCause::kRead);
  std::vector<ScanRange> keys_only(ranges.begin(), ranges.end());
  for (ScanRange& r : keys_only) {
    if (!static_cast<const NamTable&>(*r.table).btree_) {
      return NotOrdered(static_cast<const NamTable&>(*r.table));
    }
    r.columns = ColumnSet::None();
  }
  FARPOOL_RETURN_IF_ERROR(FreshSnapshotForRead());
  // The scan, with the target records its guessed entries name in its first round; then the
  // targets as MultiGet reads them, in the scan's snapshot, taking those copies instead of
  // reads where the scan's entries and the lookups agree with them.
  const JoinGuess join{&static_cast<const NamTable&>(target), &target_key};
  GuessedRecords guessed;
  std::vector<std::pair<size_t, int64_t>> entries;
  FARPOOL_RETURN_IF_ERROR(
      ScanRanges(keys_only, &join, &guessed, [&](size_t range, int64_t key, const Row&) {
        entries.push_back({range, key});
        return true;
      }));
  return VisitJoined(
      entries, target, columns, target_key,
      [&](std::span<const TableKey> keys, std::vector<Row>* rows, std::vector<Status>* statuses) {
        return ReadMany(keys, std::nullopt, rows, statuses, &guessed);
      },
      visit);
}

Status NamTxn::ScanRanges(std::span<const ScanRange> ranges, const JoinGuess* join,
                          GuessedRecords* guessed,
                          const std::function<bool(size_t, int64_t, const Row&)>& visit) {
  auto table = [&](size_t i) -> const NamTable& {
    return static_cast<const NamTable&>(*ranges[i].table);
  };
  // Round 1, per table: the leaves its cache routes the ranges to (BTree::ReadAhead), the first
  // table's with the snapshot if this is the transaction's first read and with the records
  // that the cached images of those leaves name (guesses, BTree invariant 13), and a join's
  // target records that those entries name.
  std::map<const NamTable*, BTree::LeafImages> ahead;
  {
    std::map<const NamTable*, std::vector<BTree::Range>> by_table;
    std::vector<std::pair<const NamTable*, uint64_t>> guesses;
    std::vector<std::pair<const NamTable*, int64_t>> lookups;
    std::vector<uint64_t> values;
    std::vector<int64_t> keys;
    size_t indexed = 0;  // guesses of index records (at most kMaxGuesses, and as many targets)
    for (size_t i = 0; i < ranges.size(); ++i) {
      const NamTable& t = table(i);
      const BTree::Range r{ranges[i].lo, ranges[i].hi, ranges[i].reverse};
      by_table[&t].push_back(r);
      values.clear();
      keys.clear();
      const size_t cap = ranges[i].limit == 0 ? kScanBatch : std::min(ranges[i].limit, kScanBatch);
      // Over mapped memory a guess saves no wait, and its copies cost time (docs/database.md).
      if (!s_.access_.memory().mapped()) {
        t.btree_->GuessValues(r, std::min(cap, kMaxGuesses - indexed), &values,
                              join != nullptr ? &keys : nullptr);
      }
      indexed += values.size();
      for (uint64_t v : values) guesses.push_back({&t, v});
      for (int64_t k : keys) {
        const int64_t target_key = (*join->target_key)(i, k);
        const GlobalAddress record = s_.CachedRecord(*join->target, target_key);
        if (!record.is_null()) {
          guesses.push_back({join->target, record.raw()});
        } else {
          lookups.push_back({join->target, target_key});
        }
      }
    }
    std::sort(guesses.begin(), guesses.end());
    guesses.erase(std::unique(guesses.begin(), guesses.end()), guesses.end());
    std::sort(lookups.begin(), lookups.end());
    lookups.erase(std::unique(lookups.begin(), lookups.end()), lookups.end());
    bool first_table = true;
    for (const auto& [t, rs] : by_table) {
      NamSession::SnapshotRead snap;
      const BTree::FirstRound first =
          first_table ? GuessRound(&snap, guesses, lookups, guessed) : SnapshotRound(&snap);
      const bool with_first =
          first_table ? !has_snapshot_ || !guesses.empty() || !lookups.empty() : !has_snapshot_;
      first_table = false;
      FARPOOL_RETURN_IF_ERROR(
          t->btree_->ReadAhead(s_.access_, rs, with_first ? &first : nullptr, &ahead[t]));
    }
    FARPOOL_RETURN_IF_ERROR(TakeSnapshot());  // no ranges: still a read
  }
  // Every range's entries (up to its limit, or kScanBatch) from those leaves (more reads only
  // where a range goes beyond them or the cache had no route), then the records of all of them
  // in one round trip, their blobs in the next.
  struct Part {
    size_t begin = 0, end = 0;
    bool more = false;  // entries left from `next` on (towards the scan's end)
    int64_t next = 0;
  };
  std::vector<IndexEntry> entries;
  std::vector<Part> parts(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ScanRange& r = ranges[i];
    const NamTable& t = table(i);
    const size_t cap = r.limit == 0 ? kScanBatch : std::min(r.limit, kScanBatch);
    Part& p = parts[i];
    p.begin = entries.size();
    FARPOOL_RETURN_IF_ERROR(t.btree_->Scan(
        s_.access_, s_, r.lo, r.hi, r.reverse,
        [&](int64_t k, uint64_t v) {
          if (entries.size() - p.begin == cap) {
            p.more = true;
            p.next = k;
            return false;
          }
          entries.push_back({&t, k, GlobalAddress::FromRaw(v), r.columns});
          return true;
        },
        nullptr, &ahead[&t]));
    p.end = entries.size();
  }
  // A join's target records not read in round 1 (the counter moved, a guess missed), at the
  // addresses the session knows: along with the index records if those take a round trip. Not
  // over mapped memory, where that "round trip" is memcpys and the copies' bookkeeping made q4
  // 1.5x slower (docs/experiments.md).
  std::vector<std::pair<const NamTable*, GlobalAddress>> along;
  const bool read_along = join != nullptr && !s_.access_.memory().mapped();
  for (size_t i = 0; i < ranges.size() && read_along; ++i) {
    for (size_t j = parts[i].begin; j < parts[i].end; ++j) {
      const GlobalAddress record =
          s_.CachedRecord(*join->target, (*join->target_key)(i, entries[j].key));
      if (!record.is_null() && guessed->count(record.raw()) == 0)
        along.push_back({join->target, record});
    }
  }
  std::sort(along.begin(), along.end());
  along.erase(std::unique(along.begin(), along.end()), along.end());
  std::vector<Row> rows;
  std::vector<uint8_t> found;
  FARPOOL_RETURN_IF_ERROR(ReadIndexed(entries, &rows, &found, guessed, along));
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ScanRange& r = ranges[i];
    const Part& p = parts[i];
    size_t visited = 0;
    for (size_t j = p.begin; j < p.end; ++j) {
      if (!found[j]) continue;
      ++visited;
      if (!visit(i, entries[j].key, rows[j])) return Status::Ok();
      if (r.limit != 0 && visited >= r.limit) break;
    }
    if (!p.more || (r.limit != 0 && visited >= r.limit)) continue;
    // The rest of the range, from the first key not collected, as a scan of its own (same
    // snapshot).
    bool stopped = false;
    FARPOOL_RETURN_IF_ERROR(ScanOne(table(i), r.reverse ? r.lo : p.next, r.reverse ? p.next : r.hi,
                                    r.limit == 0 ? 0 : r.limit - visited, r.reverse, r.columns,
                                    [&](int64_t k, const Row& row) {
                                      stopped = !visit(i, k, row);
                                      return !stopped;
                                    }));
    if (stopped) return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace farpool::db
