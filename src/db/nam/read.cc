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

namespace farpool::db {

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

Status NamTxn::ReadRecord(const NamTable& t, GlobalAddress record, int64_t key, ReadEntry* re,
                          RecordImage* image, bool* key_ok) {
  const auto& layout = t.layout_;
  image->bytes.resize(layout.record_size());
  const int64_t start = MonoNs();
  int64_t next_check = start + 1'000'000;
  std::vector<unsigned char> previous;
  int same = 0;
  for (int tries = 0;; ++tries) {
    FARPOOL_RETURN_IF_ERROR(s_.access_.Read(record, image->bytes.data(), image->bytes.size()));
    image->Decode(layout);
    if (image->key != key || image->lock == kRemovedLock) {
      *key_ok = false;
      return Status::Ok();
    }
    *key_ok = true;
    if (ConsistentImage(*image)) break;
    const int64_t now = MonoNs();
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
    if (tries > 16) std::this_thread::yield();
  }
  re->record = record;
  re->newest_seq = image->newest_seq();
  re->newest_visible = image->newest < 0 || Visible(image->cells[image->newest].stamp);
  re->image = image->bytes;
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

Status NamTxn::LoadBlobs(const NamTable& t, const std::string& payload, Row* row) {
  *row = Row(t.schema_);
  row->payload() = payload;
  row->payload().resize(t.schema_.PayloadSize());
  for (uint32_t c : t.bytes_columns_) {
    uint64_t ref[2];
    std::memcpy(ref, payload.data() + t.schema_.Offset(c), 16);
    std::string v(ref[1], '\0');
    if (ref[1] > 0)
      FARPOOL_RETURN_IF_ERROR(s_.access_.Read(GlobalAddress::FromRaw(ref[0]), v.data(), ref[1]));
    row->bytes()[c] = std::move(v);
  }
  return Status::Ok();
}

Status NamTxn::ReadVisible(const NamTable& t, int64_t key, bool* found, bool* deleted,
                           std::string* payload) {
  *found = false;
  for (int attempt = 0; attempt < 3; ++attempt) {
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress rec, s_.FindRecord(t, key));
    if (rec.is_null()) return Status::Ok();
    ReadEntry re;
    RecordImage image;
    bool key_ok;
    FARPOOL_RETURN_IF_ERROR(ReadRecord(t, rec, key, &re, &image, &key_ok));
    if (!key_ok) {
      if (image.lock == kRemovedLock && image.key == key) {
        FARPOOL_RETURN_IF_ERROR(s_.HelpUnlink(t, key, rec));
      }
      s_.ForgetRecord(t, key);
      continue;
    }
    FARPOOL_RETURN_IF_ERROR(VisibleVersion(t, image, found, deleted, payload));
    reads_[{t.id_, key}] = std::move(re);
    return Status::Ok();
  }
  return Status::Internal("index entry of key " + std::to_string(key) + " in table '" + t.name_ +
                          "' names a record of another key");
}

Status NamTxn::Get(const Table& table, int64_t key, Row* row) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  auto w = writes_.find({t.id_, key});
  if (w != writes_.end()) {
    if (w->second.deleted)
      return Status::NotFound("key " + std::to_string(key) + " deleted by this transaction");
    *row = Row(t.schema_);
    row->payload() = w->second.payload;
    row->bytes() = w->second.bytes;
    return Status::Ok();
  }
  bool found, deleted;
  std::string payload;
  FARPOOL_RETURN_IF_ERROR(ReadVisible(t, key, &found, &deleted, &payload));
  if (found) FARPOOL_RETURN_IF_ERROR(LoadBlobs(t, payload, row));
  FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
  if (!found) return Status::NotFound("table '" + t.name_ + "' has no key " + std::to_string(key));
  return Status::Ok();
}

Status NamTxn::Put(const Table& table, int64_t key, const Row& row) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  if (row.payload().size() != t.schema_.PayloadSize()) {
    return Status::InvalidArgument("row does not match the schema of table '" + t.name_ + "'");
  }
  if (key == INT64_MAX) return Status::InvalidArgument("key INT64_MAX is reserved");
  WriteEntry& w = writes_[{t.id_, key}];
  w.table = &t;
  w.key = key;
  w.deleted = false;
  w.payload = row.payload();
  w.payload.resize(t.layout_.payload, '\0');
  w.bytes = row.bytes();
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
    bool deleted;
    std::string payload;
    FARPOOL_RETURN_IF_ERROR(ReadVisible(t, key, &exists, &deleted, &payload));
  }
  if (!exists) return Status::NotFound("table '" + t.name_ + "' has no key " + std::to_string(key));
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
  // Collect index entries a leaf's worth at a time, then read their records in one batch.
  // Rows are handed to `visit` only after the lease check that covers their reads.
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
    std::vector<std::pair<int64_t, Row>> rows;
    for (size_t i = 0; i < pending.size(); ++i) {
      RecordImage& img = images[i];
      img.Decode(t.layout_);
      if (img.key != pending[i].first || !ConsistentImage(img)) {
        // Raced with a writer: read this one on its own until consistent.
        ReadEntry re;
        bool key_ok;
        FARPOOL_RETURN_IF_ERROR(
            ReadRecord(t, pending[i].second, pending[i].first, &re, &img, &key_ok));
        if (!key_ok) continue;
      }
      bool found, deleted;
      std::string payload;
      FARPOOL_RETURN_IF_ERROR(VisibleVersion(t, img, &found, &deleted, &payload));
      if (!found) continue;
      Row row;
      FARPOOL_RETURN_IF_ERROR(LoadBlobs(t, payload, &row));
      rows.emplace_back(pending[i].first, std::move(row));
    }
    pending.clear();
    FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
    for (const auto& [key, row] : rows) {
      ++visited;
      if (!visit(key, row) || (limit != 0 && visited >= limit)) {
        stop = true;
        break;
      }
    }
    return Status::Ok();
  };
  FARPOOL_RETURN_IF_ERROR(
      t.btree_->Scan(s_.access_, s_, lo, hi, reverse, [&](int64_t k, uint64_t v) {
        pending.push_back({k, GlobalAddress::FromRaw(v)});
        if (pending.size() >= 64) {
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
