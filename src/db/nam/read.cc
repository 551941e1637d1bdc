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

Status NamTxn::SettleRecord(const NamTable& t, GlobalAddress record, int64_t key,
                            RecordImage* image, bool* key_ok) {
  const auto& layout = t.layout_;
  int64_t start = 0, next_check = 0;  // set at the first inconsistent copy
  std::vector<unsigned char> previous;
  int same = 0;
  // A locked record is re-read at once kLockedRereads times, then after pauses doubling from
  // 20 µs up to kMaxLockedPauseNs.
  constexpr int kLockedRereads = 3;
  constexpr int64_t kMaxLockedPauseNs = 500'000;
  int64_t locked_pause_ns = 10'000;
  for (int tries = 0;; ++tries) {
    if (tries > 0) {
      FARPOOL_RETURN_IF_ERROR(s_.access_.Read(record, image->bytes.data(), image->bytes.size()));
    }
    image->Decode(layout);
    if (image->key != key || image->lock == kRemovedLock) {
      *key_ok = false;
      return Status::Ok();
    }
    *key_ok = true;
    if (ConsistentImage(*image)) break;
    const int64_t now = MonoNs();
    if (start == 0) {
      start = now;
      next_check = now + 1'000'000;
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
    if (IsLocked(image->lock) && tries >= kLockedRereads) {
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
      uint64_t ref[2];
      std::memcpy(ref, l.payload->data() + t.schema_.Offset(c), 16);
      std::string& v = RowAccess::bytes(row)[c];
      v.assign(ref[1], '\0');
      if (ref[1] > 0)
        FARPOOL_RETURN_IF_ERROR(b.Read(GlobalAddress::FromRaw(ref[0]), v.data(), ref[1]));
    }
  }
  return b.Wait();
}

Status NamTxn::FinishSnapshot(const NamSession::SnapshotRead& read, const Status& batch_status,
                              bool* cache_cleared) {
  FARPOOL_ASSIGN_OR_RETURN(snapshot_, s_.FinishSnapshot(read, batch_status, cache_cleared));
  has_snapshot_ = true;
  return Status::Ok();
}

Status NamTxn::TakeSnapshot() {
  if (has_snapshot_) return Status::Ok();
  FARPOOL_ASSIGN_OR_RETURN(snapshot_, s_.TakeSnapshot());
  has_snapshot_ = true;
  return Status::Ok();
}

Status NamTxn::ReadKeys(std::span<KeyRead> keys) {
  const bool first = !has_snapshot_;
  for (int retake = 0;; ++retake) {
    FARPOOL_RETURN_IF_ERROR(ReadKeysOnce(keys));
    // The first read returns nothing until here, so the snapshot it took may be taken again:
    // if a key it read got a newer version than the snapshot (a commit that took its stamp
    // after our counter read, met as a lock and waited for, or installed meanwhile), a write
    // of that key would abort at commit (first committer wins). A later snapshot sees it.
    if (!first || retake == kSnapshotRetakes) return Status::Ok();
    if (std::all_of(reads_.begin(), reads_.end(),
                    [](const auto& r) { return r.second.newest_visible; })) {
      return Status::Ok();
    }
    reads_.clear();  // all of them this call's (there was no snapshot before it)
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

Status NamTxn::ReadKeysOnce(std::span<KeyRead> keys) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    // Round 1: the index lookups the cache does not answer, with the snapshot's counter read
    // if this is the transaction's first read. The records must be read after the counter
    // (a commit locks before it takes its stamp: a snapshot that includes the stamp then
    // meets the lock), so they wait for round 2.
    std::vector<KeyRead*> lookups;
    for (KeyRead& k : keys) {
      if (k.done) continue;
      k.prefetched = false;
      k.record = s_.CachedRecord(*k.t, k.key);
      k.cached = !k.record.is_null();
      if (!k.cached) lookups.push_back(&k);
    }
    if (!has_snapshot_ || !lookups.empty()) {
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
        Status posted = taking ? s_.PostSnapshot(b, &snap) : Status::Ok();
        if (taking && !posted.ok()) return posted;
        const uint16_t counter_server = s_.db_.RootField(kRootCounter).server();
        bool fenced = false;
        for (size_t j = 0; j < lookups.size() && posted.ok(); ++j) {
          KeyRead& k = *lookups[j];
          const uint64_t size = k.t->layout_.record_size();
          combined[j] = size <= kMaxLookupReadBytes &&
                        (!taking || k.t->hash_->HeadServer(k.key) == counter_server);
          if (!combined[j]) {
            posted = k.t->hash_->PostLookup(b, k.key, buckets[j].data());
            continue;
          }
          if (taking && !fenced) {
            posted = b.Fence();
            fenced = true;
            if (!posted.ok()) break;
          }
          k.image.bytes.resize(size);
          posted = k.t->hash_->PostLookupRead(b, k.key, k.image.bytes.data(),
                                              static_cast<uint32_t>(size), &k.lookup);
        }
        for (KeyRead& k : keys) {
          if (!taking || !posted.ok()) break;
          if (k.done || !k.cached || k.record.server() != counter_server) continue;
          if (!fenced) {
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
          if (!k.done && k.cached) {
            k.prefetched = false;  // its address may have changed
            FARPOOL_ASSIGN_OR_RETURN(k.record, s_.FindRecord(*k.t, k.key));
          }
        }
      }
    }
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
        k.image.bytes.resize(k.t->layout_.record_size());
        FARPOOL_RETURN_IF_ERROR(b.Read(k.record, k.image.bytes.data(), k.image.bytes.size()));
      }
      FARPOOL_RETURN_IF_ERROR(b.Wait());
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

// MultiGet of one key, without its vectors (the most common read).
Status NamTxn::Get(const Table& table, int64_t key, Row* row) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  Status own;
  if (ReadOwnWrite(t, key, row, &own)) return own;
  KeyRead k;
  k.t = &t;
  k.key = key;
  FARPOOL_RETURN_IF_ERROR(ReadKeys(std::span<KeyRead>(&k, 1)));
  if (k.found) {
    const RowLoad load{&t, &k.payload, row};
    FARPOOL_RETURN_IF_ERROR(LoadRows(std::span<const RowLoad>(&load, 1)));
  }
  FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
  return k.found ? Status::Ok() : NoKey(t, key);
}

Status NamTxn::MultiGet(std::span<const TableKey> keys, std::vector<Row>* rows,
                        std::vector<Status>* statuses) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  rows->assign(keys.size(), Row());
  statuses->assign(keys.size(), Status::Ok());
  std::vector<KeyRead> reads;
  std::vector<size_t> at;  // keys index of each read
  reads.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& t = static_cast<const NamTable&>(*keys[i].table);
    if (ReadOwnWrite(t, keys[i].key, &(*rows)[i], &(*statuses)[i])) continue;
    KeyRead& k = reads.emplace_back();
    k.t = &t;
    k.key = keys[i].key;
    at.push_back(i);
  }
  if (reads.empty()) return Status::Ok();
  FARPOOL_RETURN_IF_ERROR(ReadKeys(reads));
  std::vector<RowLoad> loads;
  for (size_t j = 0; j < reads.size(); ++j) {
    if (reads[j].found) {
      loads.push_back({reads[j].t, &reads[j].payload, &(*rows)[at[j]]});
    } else {
      (*statuses)[at[j]] = NoKey(*reads[j].t, reads[j].key);
    }
  }
  FARPOOL_RETURN_IF_ERROR(LoadRows(loads));
  return s_.CheckLease();
}

Status NamTxn::Put(const Table& table, int64_t key, const Row& row) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
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

Status NamTxn::Delete(const Table& table, int64_t key) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  auto w = writes_.find({t.id_, key});
  bool exists;
  if (w != writes_.end()) {
    exists = !w->second.deleted;
  } else {
    KeyRead read;
    read.t = &t;
    read.key = key;
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

Status NamTxn::Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
                    const std::function<bool(int64_t, const Row&)>& visit) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  if (!t.btree_)
    return Status::InvalidArgument("table '" + t.name_ + "' is not ordered (no B+tree)");
  // The snapshot first (its own round trip if this is the transaction's first read: the B+tree
  // walk does not take other work along). Then index entries are collected, up to the limit
  // (or kScanBatch) at a time, and their records read in one batch, their blobs in another.
  // Rows are handed to `visit` only after the lease check that covers their reads.
  FARPOOL_RETURN_IF_ERROR(TakeSnapshot());
  constexpr size_t kScanBatch = 256;
  const size_t batch = limit == 0 ? kScanBatch : std::min(limit, kScanBatch);
  std::vector<std::pair<int64_t, GlobalAddress>> pending;
  size_t visited = 0;
  bool stop = false;
  Status inner;
  auto flush = [&]() -> Status {
    if (pending.empty()) return Status::Ok();
    std::vector<RecordImage> images(pending.size());
    {
      Access::Batch b(s_.access_);
      for (size_t i = 0; i < pending.size(); ++i) {
        images[i].bytes.resize(t.layout_.record_size());
        FARPOOL_RETURN_IF_ERROR(
            b.Read(pending[i].second, images[i].bytes.data(), images[i].bytes.size()));
      }
      FARPOOL_RETURN_IF_ERROR(b.Wait());
    }
    std::vector<int64_t> keys;
    std::vector<std::string> payloads;
    for (size_t i = 0; i < pending.size(); ++i) {
      bool key_ok;
      FARPOOL_RETURN_IF_ERROR(
          SettleRecord(t, pending[i].second, pending[i].first, &images[i], &key_ok));
      if (!key_ok) continue;
      bool found, deleted;
      std::string payload;
      FARPOOL_RETURN_IF_ERROR(VisibleVersion(t, images[i], &found, &deleted, &payload));
      if (!found) continue;
      keys.push_back(pending[i].first);
      payloads.push_back(std::move(payload));
    }
    pending.clear();
    std::vector<Row> rows(keys.size());
    std::vector<RowLoad> loads;
    for (size_t i = 0; i < keys.size(); ++i) loads.push_back({&t, &payloads[i], &rows[i]});
    FARPOOL_RETURN_IF_ERROR(LoadRows(loads));
    FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
    for (size_t i = 0; i < keys.size(); ++i) {
      ++visited;
      if (!visit(keys[i], rows[i]) || (limit != 0 && visited >= limit)) {
        stop = true;
        break;
      }
    }
    return Status::Ok();
  };
  FARPOOL_RETURN_IF_ERROR(
      t.btree_->Scan(s_.access_, s_, lo, hi, reverse, [&](int64_t k, uint64_t v) {
        pending.push_back({k, GlobalAddress::FromRaw(v)});
        if (pending.size() >= batch) {
          inner = flush();
          if (!inner.ok()) return false;
        }
        return !stop;
      }));
  FARPOOL_RETURN_IF_ERROR(inner);
  if (!stop) FARPOOL_RETURN_IF_ERROR(flush());
  return Status::Ok();
}

}  // namespace farpool::db
