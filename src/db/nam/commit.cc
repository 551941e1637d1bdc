// Commit of the NAM engines, as phases that each return a Status (nam_internal.h; the
// protocol with its reasoning is in docs/database.md):
//
//   Resolve   find or create each written key's record, the version it expects (the one read,
//             or the newest if it was not read), blobs of variable-length columns. Written keys
//             that were not read or cached (mostly new keys) get a new record each, on the
//             server of the key's head bucket; once the snapshot is taken, those of tables
//             without a B+tree go into the index in the Lock batch (below). The others cost
//             one round trip together (their index lookups or near-memory inserts, the
//             snapshot if none was taken), plus one read of the records that already existed.
//   Lock      one batch: a CAS per record from the expected unlocked word to our lock word
//             (locks and validates first-committer-wins at once), the tables' descriptors, a
//             read of the snapshot announcements (for the GC decision) when needed, the
//             blobs' contents, and each new key's record written locked by us, then (behind
//             a fence) inserted near memory: its entry goes live already locked, exactly as a
//             record created in an earlier round and locked here. A new key found to have a
//             record already (a concurrent inserter's, an aborted insert's empty one) is
//             locked after, like a key written without being read (read, validated, CAS):
//             two more round trips, only then. Any failure releases what was taken; an
//             inserted record of a commit that does not happen stays in the index empty and
//             unlocked (no version: the key reads as absent, and the next insert uses it).
//   Decide    one batch: the commit stamp (fetch-and-add), the commit log (the new cells, with
//             stamp 0: the stamp comes back in this same round trip; and the addresses of our
//             stamp words on the records' servers) and the spills of evicted versions that an
//             announced snapshot still needs. Once the log is whole the commit is decided;
//             recovery stamps its cells (recovery.cc).
//   Finish    one batch, per server in this order: the stamp into our stamp word there and
//             the new cells, stamped; a fence (Batch::Fence); a CAS per record from our lock
//             word to the new unlocked word. The log stays whole: the session's next round
//             trip clears it (NamSession::log_to_clear_).
//   Reclaim   blobs of dropped versions freed, cut chains handed to the maintenance thread.
// A commit of keys that were all read takes 3 round trips: each phase needs the one before it
// to have landed (the stamp after the locks, so that a snapshot that includes it meets them;
// the cells after the log, so that a crash leaves either a decision to finish or nothing to
// undo). Within Finish the fence orders each server's unlocks after its cells (an unlocked
// record naming a version whose cell is not there would look corrupt) and after its stamp
// word: servers execute their messages independently, so a crash can leave one server's
// records unlocked (and then overwritten by later commits) and another's untouched; the
// stamp word on the first tells recovery the stamp the second must get (recovery.cc).
//
// Keys locked at read (NamTxn::held_, locking reads): Resolve takes the version locked as the
// one to write on (no validation: nothing can commit over a lock); Lock changes their read-lock
// word to our plain lock word in its batch, before the stamp is taken (layout.h ReadLockWord),
// and from then on they are the commit's like any lock it took; Finish releases in its batch
// the keys locked at read and not written, unchanged.
// Keys locked at read with the update intent (LockIntent::kUpdate) hold our plain lock word
// already, new keys Put before that read were inserted locked in its round, and that round read
// the descriptors and the announcement array (NamTxn::CommitPrep): when that covers the whole
// write set, LockedAtRead takes the locks over and Lock's round is skipped (3 round trips).
//
// Fencing: the lease is checked before Lock and before Decide and Finish; releases are CAS
// from our own word. An error before the decision releases the locks and leaves the session
// usable (a round cut by a failure of the memory, such as a server failing over to its
// backup, then returns Aborted: rolled back, retry). An error after it (the outcome is
// decided) is settled by the session itself, still under its lease: it rolls its own log
// forward with recovery's code (RecoverLog) and returns Ok. Only if that fails too is the
// session abandoned: it stops renewing, and recovery rolls its log forward (NamDatabase::
// GaveUp: its own process's at once, or others' after its lease).
#include <algorithm>
#include <array>
#include <cstring>
#include <map>

#include "db/nam/nam_internal.h"

namespace farpool::db {

namespace {
// A failure of the memory under a round (a server gone, failing over, or timed out), not of
// the protocol: the round's operations may or may not have landed.
bool MemoryFailure(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kTimedOut;
}
}  // namespace

class CommitRun {
 public:
  explicit CommitRun(NamTxn& txn) : txn_(txn), s_(txn.s_), access_(txn.s_.access_) {}
  // Frees the new records of inserts deferred to the lock round that never got posted.
  ~CommitRun();

  Status Run();

 private:
  struct Item {
    WriteEntry* w;
    const NamTable* t;
    GlobalAddress record;
    bool cached = false;  // `record` came from the session's cache (the key was not read)
    bool fresh = false;   // we created `record` (the key is new): it holds no version
    // A new key inserted in the lock round (see Lock): `record` is our new record, not yet in
    // the index; Lock writes it locked by us and inserts it in the same batch.
    bool insert_at_lock = false;
    bool insert_posted = false;  // the insert was posted: the record may be live
    InsertResult inserted;       // of that insert (HashIndex::PostInsert)
    bool late = false;           // such a key found to have a record: Lock locks it after
    bool held = false;           // locked by a locking read (NamTxn::held_): Lock takes it over
    uint64_t held_word = 0;      // the word it holds then (HeldLock::word)
    uint64_t expected = 0;       // unlocked word we expect (the version we validated)
    RecordImage image;           // the record as of that version
    bool locked = false;
    uint64_t prev = 0;
    GlobalAddress spill;
    std::vector<unsigned char> cell, spill_image;
    uint64_t new_seq = 0;
    std::string dropped_payload;  // evicted version that was garbage: its blobs are freed
    GlobalAddress cut;            // chain cut off the record: freed by the maintenance thread
    GlobalAddress trimmed;        // chain cut off a chain node by Trim: retired once the
                                  // release proves our lock was never broken
  };

  Status Resolve();
  // The records of written keys that were not read (see the top of this file).
  Status FindUnread(const std::vector<size_t>& unread);
  // A new key's record: an empty record of the key (written) that Publish puts in the index.
  struct NewKey {
    size_t item;
    GlobalAddress fresh;
  };
  // Makes each new key's `fresh` record the key's record, unless the index has one already
  // (then `fresh` is freed and that one is taken): all keys go in together, whatever their
  // tables (HashIndex::GetOrInsertMany).
  Status Publish(const std::vector<NewKey>& news);
  // A new empty record of it.w->key, written (not published).
  Result<GlobalAddress> NewRecord(const Item& it, std::vector<unsigned char>* image);
  Status ResolveUnread(const std::vector<size_t>& need_read);
  // The lock round's work, done by the locking reads already (LockIntent::kUpdate): if every
  // written key is held with our plain lock word (read, or inserted, that way), no blob is to
  // be written, and the reads' round read the tables' descriptors and the announcement array
  // under the snapshot still open (NamTxn::CommitPrep), takes the locks over and sets *locked;
  // otherwise leaves everything to Lock. NotFound (locks released) if a table was dropped.
  Status LockedAtRead(bool* locked);
  Status Lock();
  // A new key's insert (insert_at_lock) found `record` in the index: ours if it went live
  // (then locked), else ours is freed and the key's record is locked late.
  void TakeInserted(Item& it, GlobalAddress record);
  // Records whose lock CAS met another session's lock (and none that met a newer version):
  // the CAS is retried, with backoff (LockWait), while we hold our other locks; a holder that
  // commits makes our CAS meet its newer version (we then abort, first committer wins), one
  // that aborts hands the record back unchanged (we lock it). No deadlock: every wait is
  // bounded, so of two commits waiting for each other's records each gives up and aborts
  // (AbortOnConflict).
  Status WaitForHolders();
  // Checks the lease, then CASes the lock words of items `which` from their expected words to
  // ours in one batch, marking those taken (on an error all of them: any may have been). On an
  // error every lock taken so far is released and the error is returned. With `wait`, each
  // CAS is a waiting one (over messages the server holds it while the record is locked by
  // someone else: the lock wait's retries cost no round trips; still an exact CAS).
  Status LockItems(const std::vector<size_t>& which, const WaitSpec* wait = nullptr);
  // If a lock was not taken (held by another, or a newer version): releases every lock and
  // returns Aborted naming the first such key (breaking the locks of dead holders on the way).
  Status AbortOnConflict();
  // Undoes Lock: CAS our word back to the expected one on every record we may hold.
  void ReleaseLocks();
  Status Decide();
  // Install and release in one round trip (see the top of this file).
  Status Finish();
  void Reclaim();
  Status Abort(std::string conflict) { return Status::Aborted(std::move(conflict)); }
  // The session cannot finish a decided commit: stop it, recovery finishes the commit.
  // Unavailable, or Evicted if `why` is (this process is fenced off the pool).
  Status Abandon(const Status& why);
  // A round of the commit failed before its decision with `why` and the locks were released
  // (ReleaseLocks; or nothing was locked). If `why` is the memory's failure (a server died or
  // failed over to its backup under the round: its operations may or may not have landed)
  // and the session was not stopped (the release reached every server of the write set),
  // nothing of the commit took effect and nothing of it is left: Aborted, retryable, saying
  // so. Otherwise `why`.
  Status RolledBack(const Status& why);
  // Finish failed with `why` (a server died or failed over under it: some installs and
  // releases may have landed, others not). The commit is decided: the session finishes it
  // itself at once, with recovery's roll-forward (RecoverLog) under its own lease and with
  // its own stamp, so that no record stays locked until its lease lapses, and reports it
  // committed. If it cannot (its lease is gone, the memory fails again), Abandon: recovery
  // finishes it after the lease.
  Status Settle(const Status& why);
  // Runs `round` (repeatable) again while it fails by a failure of the memory, with pauses
  // doubling from 1 ms, for at most kRetryNs: a failover under way ends within that (the
  // backup promotes once its primary is gone; a primary whose backup died waits until a
  // client tells it so, and until then fails its rounds "applied here but not acknowledged").
  // Not once the session is fenced or its lease is not certain: recovery finishes for it. Not
  // at all over memory without backups (Memory::replicated), where a failed server stays failed.
  static constexpr int64_t kRetryNs = 5'000'000'000;
  Status Retrying(const std::function<Status()>& round);
  // An index write failed: the index may keep a node locked by us for recovery to repair
  // (index/btree.h), so the session stops; its lease runs out and others take over.
  Status IndexFailed(const Status& why);
  // Whether a snapshot older than `stamp` may be running: an announcement (a lower bound of
  // its session's snapshot; ours excluded: our snapshot sees the newest version) below it.
  bool AnyOlderThan(uint64_t stamp) const;
  // A hot record's chain (versions kept because snapshots overlap them) is trimmed under its
  // lock once it holds kTrimAt nodes: below the first node that the oldest announced snapshot
  // can see, nothing is needed; that node's chain word is set to 0 and what hung below it goes
  // to *trimmed (retired by Reclaim or ReleaseLocks, see there). Returns how many nodes stay.
  // REQUIRES: the announcement array was read; we hold the record's lock.
  static constexpr uint64_t kTrimAt = 8;
  Result<uint64_t> Trim(const NamTable& t, GlobalAddress head, uint64_t length,
                        GlobalAddress* trimmed);

  NamTxn& txn_;
  NamSession& s_;
  const Access& access_;
  std::vector<Item> items_;
  struct BlobWrite {
    GlobalAddress at;
    const std::string* value;
  };
  std::vector<BlobWrite> blob_writes_;  // written in the Lock batch
  std::vector<uint64_t> announced_;     // read only if the process's LWM does not decide
  // Counter value below which announced_ is exact: every session missing from it announced
  // later and has a snapshot of at least this (UINT64_MAX: read after the records' copies, in
  // the lock round; NamTxn::CommitPrep otherwise).
  uint64_t announced_upto_ = UINT64_MAX;
  uint64_t lwm_ = 0;  // the process's low-water mark when we locked
  uint64_t stamp_ = 0;
  uint64_t log_state_ = 0;  // the state word of our commit log
  struct StampWord {
    GlobalAddress at;
    StampWordImage image;
  };
  std::vector<StampWord> stamp_words_;  // one per server of the records
};

// ---------------------------------------------------------------- phases

CommitRun::~CommitRun() {
  for (const Item& it : items_) {
    if (it.insert_at_lock && !it.insert_posted && !it.record.is_null())
      (void)s_.db_.recycler().Free(access_, s_, it.record, it.t->layout_.record_size());
  }
}

Status CommitRun::Resolve() {
  std::vector<size_t> unread;
  items_.reserve(txn_.writes_.size());
  for (auto& [k, w] : txn_.writes_) {
    Item it;
    it.w = &w;
    it.t = w.table;
    auto h = txn_.held_.find(k);
    auto r = txn_.reads_.find(k);
    if (h != txn_.held_.end()) {
      // Locked at its read: the version locked is the one to write on (no validation: nobody
      // could commit a version since). Lock takes the lock over.
      it.held = true;
      it.held_word = h->second.word;
      it.record = h->second.record;
      it.expected = h->second.expected;
      it.image.bytes = h->second.image;
      it.image.Decode(it.t->layout_);
    } else if (r != txn_.reads_.end()) {
      if (!r->second.newest_visible && !TestingSkipValidation(s_.db_.options())) {
        return Abort("first committer wins: key " + std::to_string(w.key) + " of '" + it.t->name_ +
                     "' has a newer version");
      }
      it.record = r->second.record;
      it.expected = UnlockedWord(r->second.newest_seq);
      it.image.bytes = r->second.image;
      it.image.Decode(it.t->layout_);
    } else {
      it.record = s_.CachedRecord(*it.t, w.key);
      it.cached = !it.record.is_null();
      unread.push_back(items_.size());
    }
    items_.push_back(std::move(it));
  }
  FARPOOL_RETURN_IF_ERROR(FindUnread(unread));
  std::vector<size_t> need_read;
  for (size_t i : unread) {
    Item& it = items_[i];
    if (!it.fresh) {
      need_read.push_back(i);
      continue;
    }
    // Our own new record: nothing is in it but its key. Anyone who commits a version into it
    // meanwhile changes its lock word, and our lock (expecting 0) fails.
    it.image.bytes.assign(it.t->layout_.record_size(), 0);
    std::memcpy(it.image.bytes.data() + 8, &it.w->key, 8);
    it.image.Decode(it.t->layout_);
    it.expected = UnlockedWord(0);
  }
  FARPOOL_RETURN_IF_ERROR(ResolveUnread(need_read));
  // Keys new to an ordered table go into its B+tree (idempotent).
  for (Item& it : items_) {
    if (it.t->btree_ && it.image.newest < 0) {
      auto inserted = it.t->btree_->GetOrInsert(access_, s_, it.w->key, it.record.raw());
      if (!inserted.ok()) return IndexFailed(inserted.status());
      if (*inserted != it.record.raw()) {
        // The tree still names an earlier record of this key: one whose removal stopped
        // between the two indexes. Finish it and retry.
        uint64_t lock;
        FARPOOL_RETURN_IF_ERROR(access_.Read(GlobalAddress::FromRaw(*inserted), &lock, 8));
        if (lock != kRemovedLock) {
          return Status::Internal("key " + std::to_string(it.w->key) + " of '" + it.t->name_ +
                                  "' has two records (" + it.record.ToString() +
                                  " in the hash "
                                  "index, " +
                                  GlobalAddress::FromRaw(*inserted).ToString() + " in the B+tree)");
        }
        FARPOOL_RETURN_IF_ERROR(s_.HelpUnlink(*it.t, it.w->key, GlobalAddress::FromRaw(*inserted)));
        return Abort("key " + std::to_string(it.w->key) + " of '" + it.t->name_ +
                     "' had a stale index entry (repaired); retry");
      }
    }
  }
  // Blobs of variable-length columns (freed again unless the commit is decided); their
  // contents go out with the locks.
  for (Item& it : items_) {
    for (uint32_t c : it.t->bytes_columns_) {
      const std::string& v = it.w->bytes[c];
      uint64_t ref[2] = {0, v.size()};
      if (!v.empty()) {
        FARPOOL_ASSIGN_OR_RETURN(GlobalAddress blob, s_.db_.recycler().Alloc(access_, s_, v.size(),
                                                                             Placement::Striped()));
        txn_.blobs_.push_back({blob, v.size()});
        blob_writes_.push_back({blob, &v});
        ref[0] = blob.raw();
      }
      std::memcpy(it.w->payload.data() + it.t->schema_.Offset(c), ref, 16);
    }
  }
  return Status::Ok();
}

Result<GlobalAddress> NewRecord(NamSession& s, const NamTable& t, int64_t key,
                                std::vector<unsigned char>* image) {
  const RecordLayout& layout = t.layout_;
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress fresh,
                           s.db_.recycler().Alloc(s.access_, s, layout.record_size(),
                                                  Placement::OnServer(t.hash_->HeadServer(key))));
  image->assign(layout.record_size(), 0);
  std::memcpy(image->data() + 8, &key, 8);
  return fresh;
}

Result<GlobalAddress> CommitRun::NewRecord(const Item& it, std::vector<unsigned char>* image) {
  return db::NewRecord(s_, *it.t, it.w->key, image);
}

Status CommitRun::Publish(const std::vector<NewKey>& news) {
  std::vector<HashIndex::Insert> inserts;
  for (const NewKey& n : news) {
    const Item& it = items_[n.item];
    inserts.push_back({&*it.t->hash_, it.w->key, n.fresh});
  }
  // On a failure some entries may be live: their records are not freed (a leak at worst).
  Status s = HashIndex::GetOrInsertMany(access_, s_, inserts);
  if (!s.ok()) return IndexFailed(s);
  for (size_t j = 0; j < news.size(); ++j) {
    Item& it = items_[news[j].item];
    it.record = inserts[j].record;
    it.fresh = it.record == news[j].fresh;
    if (!it.fresh) {
      FARPOOL_RETURN_IF_ERROR(
          s_.db_.recycler().Free(access_, s_, news[j].fresh, it.t->layout_.record_size()));
    }
    s_.RememberRecord(*it.t, it.w->key, it.record);
  }
  return Status::Ok();
}

Status CommitRun::FindUnread(const std::vector<size_t>& unread) {
  std::vector<size_t> lookups;
  for (size_t i : unread) {
    if (items_[i].record.is_null()) lookups.push_back(i);
  }
  if (txn_.has_snapshot_ && lookups.empty()) return Status::Ok();
  // One round trip: a new record for each looked-up key (written keys that were neither read
  // nor cached are mostly new ones: inserts), the snapshot's counter read, and per key either
  // its insert (HashIndex::PostInsert: one near-memory operation, behind a fence after the
  // record's write, when the record is on its head bucket's server, as NewRecord places it)
  // or its index lookup.
  struct Probe {
    std::array<unsigned char, HashIndex::kBucketSize> bucket;
    GlobalAddress fresh;
    std::vector<unsigned char> image;
    bool insert = false;
    InsertResult inserted;
  };
  std::vector<Probe> probes(lookups.size());
  // Frees the new records (deferred inserts' are freed by ~CommitRun).
  auto free_fresh = [&] {
    for (size_t j = 0; j < lookups.size(); ++j) {
      if (!probes[j].fresh.is_null() && !items_[lookups[j]].insert_at_lock) {
        (void)s_.db_.recycler().Free(access_, s_, probes[j].fresh,
                                     items_[lookups[j]].t->layout_.record_size());
      }
    }
  };
  // A key that can be inserted near memory goes into the index in the lock round instead
  // (Lock: written locked by us, then inserted; no round trip of its own), once the snapshot
  // is taken and if no B+tree needs its record before then.
  const bool defer = txn_.has_snapshot_ && !TestingSkipValidation(s_.db_.options());
  bool any_insert = false, any_posted = false;
  for (size_t j = 0; j < lookups.size(); ++j) {
    Item& it = items_[lookups[j]];
    auto fresh = NewRecord(it, &probes[j].image);
    if (!fresh.ok()) {
      free_fresh();
      return fresh.status();
    }
    probes[j].fresh = *fresh;
    probes[j].insert = fresh->server() == it.t->hash_->HeadServer(it.w->key);
    if (defer && probes[j].insert && !it.t->btree_) {
      it.insert_at_lock = true;
      it.record = *fresh;
      it.fresh = true;
      continue;
    }
    any_insert = any_insert || probes[j].insert;
    any_posted = true;
  }
  if (txn_.has_snapshot_ && !any_posted) return Status::Ok();
  NamSession::SnapshotRead snap;
  const bool taking = !txn_.has_snapshot_;
  bool cache_cleared = false;
  {
    // The inserts store into the index: our lease is checked right before.
    Status posted = any_insert ? s_.CheckLease() : Status::Ok();
    if (!posted.ok()) {
      free_fresh();
      return posted;
    }
    Access::Batch b(access_);
    posted = taking ? s_.PostSnapshot(b, &snap) : Status::Ok();
    if (taking && !posted.ok()) {
      free_fresh();
      return posted;
    }
    for (size_t j = 0; j < lookups.size() && posted.ok(); ++j) {
      const Item& it = items_[lookups[j]];
      if (it.insert_at_lock) continue;
      if (!probes[j].insert)
        posted = it.t->hash_->PostLookup(b, it.w->key, probes[j].bucket.data());
      if (posted.ok())
        posted = b.Write(probes[j].fresh, probes[j].image.data(), probes[j].image.size());
    }
    // A record is whole before its entry can go live.
    if (posted.ok() && any_insert) posted = b.Fence();
    for (size_t j = 0; j < lookups.size() && posted.ok(); ++j) {
      const Item& it = items_[lookups[j]];
      if (it.insert_at_lock) continue;
      if (probes[j].insert)
        posted = it.t->hash_->PostInsert(b, s_, it.w->key, probes[j].fresh, &probes[j].inserted);
    }
    Status waited = b.Wait();
    if (!posted.ok()) waited = posted;
    if (taking) waited = txn_.FinishSnapshot(snap, waited, &cache_cleared);
    if (!waited.ok()) {
      // An insert may have made a record live: those are kept (a leak at worst). The
      // operation holds no lock after it: nothing is left locked.
      if (!any_insert) free_fresh();
      return waited;
    }
  }
  Status failed;
  std::vector<NewKey> news;
  for (size_t j = 0; j < lookups.size(); ++j) {
    Item& it = items_[lookups[j]];
    const GlobalAddress fresh = probes[j].fresh;
    if (it.insert_at_lock) continue;
    if (probes[j].insert) {
      auto got = it.t->hash_->FinishInsert(it.w->key, probes[j].inserted);
      if (!got.ok()) {
        if (failed.ok()) failed = IndexFailed(got.status());
        continue;  // the entry may be live: the record is kept
      }
      if (got->is_null()) {
        news.push_back({lookups[j], fresh});  // not done here: inserted below
        continue;
      }
      it.record = *got;
      it.fresh = it.record == fresh;
      if (!it.fresh) {
        (void)s_.db_.recycler().Free(access_, s_, fresh, it.t->layout_.record_size());
      }
      s_.RememberRecord(*it.t, it.w->key, it.record);
      continue;
    }
    auto found = failed.ok()
                     ? it.t->hash_->FinishLookup(access_, it.w->key, probes[j].bucket.data())
                     : Result<GlobalAddress>(failed);
    if (found.ok() && found->is_null()) {
      news.push_back({lookups[j], fresh});
      continue;
    }
    (void)s_.db_.recycler().Free(access_, s_, fresh, it.t->layout_.record_size());
    if (!found.ok()) {
      failed = found.status();
      continue;
    }
    it.record = *found;
    s_.RememberRecord(*it.t, it.w->key, it.record);
  }
  if (!failed.ok()) {
    for (const NewKey& n : news) {
      (void)s_.db_.recycler().Free(access_, s_, n.fresh, items_[n.item].t->layout_.record_size());
    }
    return failed;
  }
  FARPOOL_RETURN_IF_ERROR(Publish(news));
  if (cache_cleared) {
    // Records were removed since the cache was filled: find the cached ones again.
    for (size_t i : unread) {
      Item& it = items_[i];
      if (!it.cached) continue;
      FARPOOL_ASSIGN_OR_RETURN(it.record, s_.FindRecord(*it.t, it.w->key));
      if (!it.record.is_null()) continue;
      std::vector<unsigned char> image;
      FARPOOL_ASSIGN_OR_RETURN(GlobalAddress fresh, NewRecord(it, &image));
      Status w = access_.Write(fresh, image.data(), image.size());
      if (!w.ok()) {
        (void)s_.db_.recycler().Free(access_, s_, fresh, it.t->layout_.record_size());
        return w;
      }
      FARPOOL_RETURN_IF_ERROR(Publish({{i, fresh}}));
    }
  }
  return Status::Ok();
}

// Records written without being read: their current version, read now in one batch.
Status CommitRun::ResolveUnread(const std::vector<size_t>& need_read) {
  if (need_read.empty()) return Status::Ok();
  {
    Access::Batch b(access_);
    for (size_t i : need_read) {
      items_[i].image.bytes.resize(items_[i].t->layout_.record_size());
      FARPOOL_RETURN_IF_ERROR(
          b.Read(items_[i].record, items_[i].image.bytes.data(), items_[i].image.bytes.size()));
    }
    FARPOOL_RETURN_IF_ERROR(b.Wait());
  }
  for (size_t i : need_read) {
    Item& it = items_[i];
    it.image.Decode(it.t->layout_);
    if (it.image.lock == kRemovedLock || it.image.key != it.w->key) {
      if (it.image.lock == kRemovedLock && it.image.key == it.w->key) {
        FARPOOL_RETURN_IF_ERROR(s_.HelpUnlink(*it.t, it.w->key, it.record));
      }
      s_.ForgetRecord(*it.t, it.w->key);
      return Abort("the record of key " + std::to_string(it.w->key) + " of '" + it.t->name_ +
                   "' was removed under the commit");
    }
    if (IsLocked(it.image.lock)) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, s_.HolderDead(it.image.lock));
      if (dead)
        FARPOOL_RETURN_IF_ERROR(s_.db_.BreakRecordLock(access_, it.record, *it.t, it.image.lock));
      return Abort("key " + std::to_string(it.w->key) + " of '" + it.t->name_ +
                   "' is being written by another transaction");
    }
    if (!ConsistentImage(it.image)) {
      // A torn copy (a commit raced our read): read it properly (or learn it is corrupt).
      bool key_ok;
      FARPOOL_RETURN_IF_ERROR(txn_.ReadRecord(*it.t, it.record, it.w->key, &it.image, &key_ok));
      if (!key_ok) {
        s_.ForgetRecord(*it.t, it.w->key);
        return Abort("index entry of key " + std::to_string(it.w->key) + " of '" + it.t->name_ +
                     "' changed under the commit");
      }
    }
    // Read committed: a key written without being read may be written on top of any version.
    if (!txn_.rc_ && it.image.newest >= 0 && !txn_.Visible(it.image.cells[it.image.newest].stamp) &&
        !TestingSkipValidation(s_.db_.options())) {
      return Abort("first committer wins: key " + std::to_string(it.w->key) + " of '" +
                   it.t->name_ + "' has a newer version");
    }
    it.expected = UnlockedWord(it.image.newest_seq());
  }
  return Status::Ok();
}

Status CommitRun::Lock() {
  const uint64_t mine = s_.lock_word();
  const bool skip = TestingSkipValidation(s_.db_.options());
  if (skip) {
    // Broken on purpose (tests of the SI checker): expect whatever version is there now.
    for (Item& it : items_) {
      if (it.held) continue;
      FARPOOL_RETURN_IF_ERROR(access_.Read(it.record, &it.expected, 8));
      if (IsLocked(it.expected)) return Abort("key is locked (TestingHooks::skip_validation)");
    }
  }
  // The locks taken at read are the commit's from here: every error path below releases them
  // with the others (ReleaseLocks), success installs and releases them (Finish).
  for (Item& it : items_) {
    if (!it.held) continue;
    it.locked = true;
    txn_.held_.erase({it.t->id_, it.w->key});
  }
  // The announcement array is needed only for a version this commit evicts whose successor is
  // newer than the process's LWM (a hot record): below the LWM, every snapshot that could
  // read it is already accounted for (see AnyOlderThan).
  lwm_ = s_.db_.lwm();
  bool recent = skip;  // the base versions are re-read below
  for (Item& it : items_) {
    const uint64_t new_seq = it.image.newest_seq() + 1;
    if (new_seq > uint64_t(kCells)) {
      recent = recent || it.image.cells[(new_seq + 1) % kCells].stamp > lwm_;
    }
  }
  const uint64_t slots = s_.db_.root().max_slots;
  if (recent) announced_.resize(slots);
  // The tables' descriptors, in the same batch: a handle of a dropped table (another
  // process dropped it) must not write into memory that its reclamation frees.
  std::map<const NamTable*, std::array<uint64_t, 2>> descs;
  for (Item& it : items_) descs[it.t] = {0, 0};
  Status posted;
  Status waited;
  // New keys (insert_at_lock): our new record, written whole and locked by us, and behind a
  // fence its near-memory insert; the entry goes live already locked, as if created and
  // locked in two rounds.
  std::vector<std::vector<unsigned char>> locked_images(items_.size());
  {
    Access::Batch b(access_);
    for (size_t i = 0; i < items_.size() && posted.ok(); ++i) {
      Item& it = items_[i];
      if (it.held) {
        // Locked at its read: from the read lock to our plain lock word, before the stamp is
        // taken (layout.h ReadLockWord: readers stop passing it by). Unless it is ours already.
        if (it.held_word != mine) posted = b.Cas(it.record, ReadLockWord(mine), mine, &it.prev);
        continue;
      }
      if (!it.insert_at_lock) {
        posted = b.Cas(it.record, it.expected, mine, &it.prev);
        continue;
      }
      locked_images[i] = it.image.bytes;
      std::memcpy(locked_images[i].data(), &mine, 8);
      posted = b.Write(it.record, locked_images[i].data(), locked_images[i].size());
    }
    for (auto& [t, words] : descs) {
      if (posted.ok()) posted = b.Read(t->desc_, words.data(), 16);
    }
    if (posted.ok() && recent)
      posted = b.Read(s_.db_.AnnounceAddr(0), announced_.data(), slots * 8);
    // The blobs are nobody else's until the commit installs versions naming them.
    for (const BlobWrite& bw : blob_writes_) {
      if (posted.ok()) posted = b.Write(bw.at, bw.value->data(), bw.value->size());
    }
    bool fenced = false;
    for (Item& it : items_) {
      if (!it.insert_at_lock || !posted.ok()) continue;
      if (!fenced) {
        posted = b.Fence();  // a record is whole before its entry can go live
        fenced = true;
        if (!posted.ok()) break;
      }
      it.insert_posted = true;
      posted = it.t->hash_->PostInsert(b, s_, it.w->key, it.record, &it.inserted);
    }
    waited = b.Wait();
  }
  if (!posted.ok() || !waited.ok()) {
    // Some CASes and inserts may have taken effect: undo every lock that could have.
    for (Item& it : items_) it.locked = true;
    ReleaseLocks();
    return !posted.ok() ? posted : waited;
  }
  Status index_failed;
  std::vector<HashIndex::Insert> publish;
  std::vector<size_t> publish_items;
  for (size_t i = 0; i < items_.size(); ++i) {
    Item& it = items_[i];
    if (it.held) {
      // Not ours any more only if it was broken (we were fenced): a conflict like any other.
      it.locked = it.held_word == mine || it.prev == ReadLockWord(mine);
      continue;
    }
    if (!it.insert_at_lock) {
      it.locked = it.prev == it.expected;
      continue;
    }
    auto got = it.t->hash_->FinishInsert(it.w->key, it.inserted);
    if (!got.ok()) {
      it.locked = true;  // the entry may be live
      if (index_failed.ok()) index_failed = got.status();
    } else if (got->is_null()) {
      publish.push_back({&*it.t->hash_, it.w->key, it.record});  // not live: nobody sees it
      publish_items.push_back(i);
    } else {
      TakeInserted(it, *got);
    }
  }
  if (index_failed.ok() && !publish.empty()) {
    // Where the near-memory insert could not be done: GetOrInsertMany (our record is locked
    // and whole already).
    index_failed = HashIndex::GetOrInsertMany(access_, s_, publish);
    for (size_t j = 0; j < publish.size(); ++j) {
      Item& it = items_[publish_items[j]];
      if (index_failed.ok()) {
        TakeInserted(it, publish[j].record);
      } else {
        it.locked = true;  // the entry may be live
      }
    }
  }
  if (!index_failed.ok()) {
    ReleaseLocks();
    return IndexFailed(index_failed);
  }
  for (const auto& [t, words] : descs) {
    if (words[0] != kDescLive || words[1] != t->incarnation_) {
      ReleaseLocks();
      return Status::NotFound("table '" + t->name_ + "' was dropped");
    }
  }
  FARPOOL_RETURN_IF_ERROR(WaitForHolders());
  FARPOOL_RETURN_IF_ERROR(AbortOnConflict());
  // New keys that turned out to have a record: locked in a round of their own, as keys
  // written without being read (their version read, validated, then locked).
  std::vector<size_t> late;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].late) late.push_back(i);
  }
  if (!late.empty()) {
    Status resolved = ResolveUnread(late);
    if (!resolved.ok()) {
      ReleaseLocks();
      return resolved;
    }
    for (size_t i : late) items_[i].late = false;
    FARPOOL_RETURN_IF_ERROR(LockItems(late));
    FARPOOL_RETURN_IF_ERROR(AbortOnConflict());
  }
  if (skip) {
    // We validated nothing: take the versions that are there now as the base.
    Access::Batch b(access_);
    for (Item& it : items_) {
      it.image.bytes.resize(it.t->layout_.record_size());
      FARPOOL_RETURN_IF_ERROR(b.Read(it.record, it.image.bytes.data(), it.image.bytes.size()));
    }
    Status w = b.Wait();
    if (!w.ok()) {
      ReleaseLocks();
      return w;
    }
    for (Item& it : items_) it.image.Decode(it.t->layout_);
  }
  return Status::Ok();
}

Status CommitRun::LockedAtRead(bool* locked) {
  *locked = false;
  const uint64_t mine = s_.lock_word();
  NamTxn::CommitPrep& prep = txn_.prep_;
  if (TestingSkipValidation(s_.db_.options()) || !blob_writes_.empty() || !txn_.has_snapshot_ ||
      prep.snapshot == 0 || prep.snapshot != txn_.snapshot_gen_) {
    return Status::Ok();
  }
  for (const Item& it : items_) {
    if (!it.held || it.held_word != mine || !prep.descs.count(it.t)) return Status::Ok();
  }
  for (Item& it : items_) {
    it.locked = true;
    txn_.held_.erase({it.t->id_, it.w->key});
  }
  for (const Item& it : items_) {
    const std::array<uint64_t, 2>& words = prep.descs.at(it.t);
    if (words[0] != kDescLive || words[1] != it.t->incarnation_) {
      ReleaseLocks();
      return Status::NotFound("table '" + it.t->name_ + "' was dropped");
    }
  }
  lwm_ = s_.db_.lwm();
  announced_ = std::move(prep.announced);
  announced_upto_ = prep.announced_upto;
  prep = NamTxn::CommitPrep{};
  *locked = true;
  // The copy decides an eviction only for versions up to announced_upto_ (AnyOlderThan keeps
  // any newer one). A record whose locking read waited holds versions newer than that, and a
  // hot record's chain kept that way is walked by Trim under our lock, one round trip per node
  // (at 8 clients on one branch row, 1.2 per transaction over TCP, 114 on local memory). So
  // where a version to evict is newer and its chain is long enough to be trimmed, the array
  // is read again first (one round trip, as the lock round read it): every stamp we locked
  // came from a fetch-and-add that completed before we read it, so a session missing from the
  // new copy has a snapshot at least as new as the newest of them.
  uint64_t newest = 0;
  bool stale = false;
  for (const Item& it : items_) {
    if (it.image.newest < 0) continue;
    const CellView& top = it.image.cells[it.image.newest];
    newest = std::max(newest, top.stamp);
    const CellView& old = it.image.cells[(it.image.newest_seq() + 1) % kCells];
    stale = stale || (!old.empty() && old.stamp > std::max(lwm_, announced_upto_) &&
                      ChainLength(top.flags) >= kTrimAt);
  }
  if (!stale) return Status::Ok();
  RoundTripScope cause(RoundTripCause::kVersionGc);
  s_.db_.NoteCounter(newest);
  const uint64_t upto = s_.db_.latest_counter();
  if (Status read = access_.Read(s_.db_.AnnounceAddr(0), announced_.data(), announced_.size() * 8);
      !read.ok()) {
    ReleaseLocks();
    return RolledBack(read);
  }
  announced_upto_ = upto;
  return Status::Ok();
}

void CommitRun::TakeInserted(Item& it, GlobalAddress record) {
  if (record == it.record) {
    it.locked = true;
  } else {
    // The key has a record already (a concurrent inserter's, or an aborted insert's): ours
    // was never live and goes back.
    (void)s_.db_.recycler().Free(access_, s_, it.record, it.t->layout_.record_size());
    it.insert_at_lock = false;
    it.fresh = false;
    it.record = record;
    it.late = true;
  }
  s_.RememberRecord(*it.t, it.w->key, it.record);
}

Status CommitRun::WaitForHolders() {
  RoundTripScope cause(RoundTripCause::kCommitWait);
  std::vector<size_t> held;
  for (size_t i = 0; i < items_.size(); ++i) {
    const Item& it = items_[i];
    if (it.locked || it.late) continue;
    // A newer version aborts whatever happens to the others: nothing to wait for.
    if (!IsLocked(it.prev) || it.prev == kRemovedLock) return Status::Ok();
    held.push_back(i);
  }
  LockWait wait;
  // Over messages the server waits for the holders (one round trip per wait, not per poll).
  const bool server_waits = !access_.memory().mapped();
  while (!held.empty() && (server_waits ? !wait.Expired() : wait.Pause())) {
    if (wait.CheckDue()) {
      // A dead holder finishes nothing: break its lock (it is restored to its newest version,
      // which our CAS then validates like any other).
      for (size_t i : held) {
        Item& it = items_[i];
        auto dead = s_.HolderDead(it.prev);
        if (dead.ok() && *dead) (void)s_.db_.BreakRecordLock(access_, it.record, *it.t, it.prev);
      }
    }
    const WaitSpec spec = wait.ServerWait(LockWait::kLimitNs / 1000, false);
    FARPOOL_RETURN_IF_ERROR(LockItems(held, server_waits ? &spec : nullptr));
    std::vector<size_t> still;
    for (size_t i : held) {
      const Item& it = items_[i];
      if (it.locked) continue;
      if (!IsLocked(it.prev) || it.prev == kRemovedLock) return Status::Ok();  // a newer version
      still.push_back(i);
    }
    held = std::move(still);
  }
  return Status::Ok();
}

Status CommitRun::LockItems(const std::vector<size_t>& which, const WaitSpec* wait) {
  Status posted = s_.CheckLease();  // the CASes may lock: they follow a passed check
  if (!posted.ok()) {
    ReleaseLocks();
    return posted;
  }
  const uint64_t mine = s_.lock_word();
  Status waited;
  {
    Access::Batch b(access_);
    std::vector<WaitCasResult> waits(wait != nullptr ? which.size() : 0);
    for (size_t k = 0; k < which.size() && posted.ok(); ++k) {
      Item& it = items_[which[k]];
      posted = wait != nullptr ? b.WaitCas(it.record, it.expected, mine, *wait, &waits[k])
                               : b.Cas(it.record, it.expected, mine, &it.prev);
    }
    waited = b.Wait();
    for (size_t k = 0; k < waits.size(); ++k) items_[which[k]].prev = waits[k].previous;
  }
  // Every lock taken is marked before anything returns (ReleaseLocks releases only those).
  const bool failed = !posted.ok() || !waited.ok();
  for (size_t i : which) items_[i].locked = failed || items_[i].prev == items_[i].expected;
  if (failed) {
    ReleaseLocks();
    return !posted.ok() ? posted : waited;
  }
  return Status::Ok();
}

Status CommitRun::AbortOnConflict() {
  std::string conflict;
  for (Item& it : items_) {
    if (!it.locked && !it.late && conflict.empty()) {
      conflict = "key " + std::to_string(it.w->key) + " of '" + it.t->name_ + "'";
      conflict += IsLocked(it.prev) ? " is locked by another transaction"
                                    : " got a newer version (first committer wins)";
    }
  }
  if (conflict.empty()) return Status::Ok();
  ReleaseLocks();
  for (Item& it : items_) {
    if (it.late) continue;
    if (!it.locked && it.prev == kRemovedLock) s_.ForgetRecord(*it.t, it.w->key);
    if (!it.locked && IsLocked(it.prev) && it.prev != kRemovedLock) {
      auto dead = s_.HolderDead(it.prev);
      if (dead.ok() && *dead) (void)s_.db_.BreakRecordLock(access_, it.record, *it.t, it.prev);
    }
  }
  return Abort(conflict);
}

void CommitRun::ReleaseLocks() {
  RoundTripScope cause(RoundTripCause::kRelease);
  const uint64_t mine = s_.lock_word();
  std::vector<uint64_t> prev(items_.size()), held_prev(items_.size());
  // Repeatable: a CAS from our own word changes nothing that is not ours. Every CAS is posted
  // even if one cannot be (its server is gone): as many locks as can be are released.
  auto release = [&]() -> Status {
    Access::Batch b(access_);
    Status posted;
    auto post = [&](Status s) {
      if (posted.ok()) posted = s;
    };
    for (size_t i = 0; i < items_.size(); ++i) {
      if (!items_[i].locked) continue;
      post(b.Cas(items_[i].record, mine, items_[i].expected, &prev[i]));
      // Locked at read and maybe not yet changed to our plain word (an error in Lock's batch):
      // one of the two CASes finds its word.
      if (items_[i].held) {
        post(b.Cas(items_[i].record, ReadLockWord(mine), items_[i].expected, &held_prev[i]));
      }
    }
    Status waited = b.Wait();
    return posted.ok() ? waited : posted;
  };
  // Some locks may still be ours: stop the session, so that others judge it dead after its
  // lease and break them (a live session's locks are never broken).
  const bool released = Retrying(release).ok();
  if (!released) s_.Abandon();
  for (size_t i = 0; i < items_.size(); ++i) {
    Item& it = items_[i];
    // A trim of a commit that did not get decided stands (the horizon only moves on); what it
    // cut is ours to free only if the lock was still ours when released (see Trim).
    if (!it.trimmed.is_null() && released && it.locked && prev[i] == mine) {
      s_.db_.RetireChain(it.t, it.trimmed);
    }
    it.trimmed = GlobalAddress();
    it.locked = false;
    if (!it.spill.is_null()) {
      (void)s_.db_.recycler().Free(access_, s_, it.spill, it.t->layout_.cell_size());
      it.spill = GlobalAddress();
    }
  }
}

// Below the LWM the answer is no without the array: the LWM is the minimum of the
// announcements the maintenance thread saw, and a session it did not see announced its bound
// after that scan read the counter, so its snapshot is at least that counter, itself at least
// the LWM (an announcement below the LWM can only be such a late session's, which cannot read
// anything older).

// Trim walks and cuts what the record's lock protects, so it may act only while the lock is
// ours. A commit that stalls past its lease after Lock is fenced and its lock broken; others
// rewrite the record and cut, free and recycle its chain meanwhile. So: the lease is checked
// after each node is read and before it is judged (a node that fails its checksum is then
// never reported by a live session, and the cut's CAS follows a passed check directly; a
// trimmer stalled between the two is evicted before anyone breaks its lock), and the cut-off
// nodes are retired only after the CAS that releases the lock from our own word has
// succeeded, which proves nobody broke the lock meanwhile: a trimmer never frees nodes that
// someone else freed or will free too.
Result<uint64_t> CommitRun::Trim(const NamTable& t, GlobalAddress head, uint64_t length,
                                 GlobalAddress* trimmed) {
  RoundTripScope cause(RoundTripCause::kVersionGc);
  const uint32_t me = s_.lease_->open > 1 ? UINT32_MAX : s_.lease_->slot;
  uint64_t oldest = UINT64_MAX;
  for (uint32_t i = 0; i < announced_.size(); ++i) {
    const uint64_t a = announced_[i];
    if (i != me && a != 0 && (a & kAnnounceRecordsOnly) == 0) oldest = std::min(oldest, a);
  }
  if (announced_.empty() || oldest == UINT64_MAX) return length;  // nothing to decide with
  // Sessions the copy missed have snapshots of at least announced_upto_ (CommitPrep).
  oldest = std::min(oldest, announced_upto_);
  std::vector<unsigned char> node(t.layout_.cell_size());
  uint64_t kept = 0;
  for (GlobalAddress at = head; !at.is_null();) {
    FARPOOL_RETURN_IF_ERROR(access_.Read(at, node.data(), node.size()));
    FARPOOL_RETURN_IF_ERROR(s_.CheckLease());  // the node is ours to judge (see above)
    const CellView c = DecodeCell(node.data(), t.layout_);
    if (!c.valid) {
      return Status::Internal("version node " + at.ToString() + " of table '" + t.name_ +
                              "' fails its checksum");
    }
    ++kept;
    if (c.stamp <= oldest) {
      // Every snapshot sees this version or a newer one: the rest is garbage.
      if (c.chain != 0) {
        s_.db_.Hook("trimming");
        FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access_.Cas(at + kCellChain, c.chain, 0));
        if (prev == c.chain) *trimmed = GlobalAddress::FromRaw(c.chain);
      }
      return kept;
    }
    at = GlobalAddress::FromRaw(c.chain);
  }
  return kept;
}

bool CommitRun::AnyOlderThan(uint64_t stamp) const {
  if (stamp <= lwm_) return false;
  if (announced_.empty()) return true;       // not read: keep (Lock reads it whenever this matters)
  if (stamp > announced_upto_) return true;  // a session the copy missed may be older
  // Our own announcement counts only if another transaction of this session is open.
  const uint32_t me = s_.lease_->open > 1 ? UINT32_MAX : s_.lease_->slot;
  for (uint32_t i = 0; i < announced_.size(); ++i) {
    const uint64_t a = announced_[i];  // records-only ones have bit 62: never below a stamp
    if (i != me && a != 0 && a < stamp) return true;
  }
  return false;
}

Status CommitRun::Decide() {
  std::vector<unsigned char> log(sizeof(LogHeader));
  for (Item& it : items_) {
    const RecordLayout& layout = it.t->layout_;
    const uint64_t newest = it.image.newest_seq();
    it.new_seq = newest + 1;
    const CellView& old = it.image.cells[it.new_seq % kCells];
    const CellView* top = it.image.newest >= 0 ? &it.image.cells[it.image.newest] : nullptr;
    const uint64_t newest_chain = top != nullptr ? top->chain : 0;
    uint64_t chain = newest_chain;
    uint64_t length = top != nullptr ? ChainLength(top->flags) : 0;  // nodes below `chain`
    if (!old.empty()) {
      // The evicted version S-3 can be read only by a snapshot older than its successor S-2;
      // the chain below it only by one older than S-3 itself.
      const uint64_t successor = it.image.cells[(it.new_seq + 1) % kCells].stamp;
      const bool keep_chain = newest_chain != 0 && AnyOlderThan(old.stamp);
      if (newest_chain != 0 && !keep_chain) it.cut = GlobalAddress::FromRaw(newest_chain);
      chain = keep_chain ? newest_chain : 0;
      length = keep_chain ? length : 0;
      if (keep_chain && length >= kTrimAt) {
        FARPOOL_ASSIGN_OR_RETURN(
            length, Trim(*it.t, GlobalAddress::FromRaw(newest_chain), length, &it.trimmed));
      }
      if (AnyOlderThan(successor)) {
        FARPOOL_ASSIGN_OR_RETURN(it.spill,
                                 s_.db_.recycler().Alloc(access_, s_, layout.cell_size(),
                                                         Placement::OnServer(it.record.server())));
        it.spill_image.resize(layout.cell_size());
        EncodeCell(it.spill_image.data(), layout, old.stamp, old.seq,
                   WithChainLength(old.flags, length), chain, old.payload);
        chain = it.spill.raw();
        ++length;
        ++s_.db_.gc_.spilled;
      } else {
        it.dropped_payload.assign(reinterpret_cast<const char*>(old.payload), layout.payload);
        ++s_.db_.gc_.dropped;
      }
    }
    it.cell.resize(layout.cell_size());
    EncodeCell(it.cell.data(), layout, /*stamp=*/0, it.new_seq,
               WithChainLength(it.w->deleted ? kFlagDeleted : 0, length), chain,
               it.w->payload.data());
    LogEntry e{.record = it.record.raw(),
               .spill = it.spill.raw(),
               .new_seq = it.new_seq,
               .key = it.w->key,
               .cell_offset = static_cast<uint32_t>(layout.cell_offset(it.new_seq)),
               .cell_size = static_cast<uint32_t>(layout.cell_size())};
    const size_t at = log.size();
    log.resize(at + sizeof(e) + it.cell.size() + it.spill_image.size());
    std::memcpy(log.data() + at, &e, sizeof(e));
    std::memcpy(log.data() + at + sizeof(e), it.cell.data(), it.cell.size());
    if (!it.spill_image.empty()) {
      std::memcpy(log.data() + at + sizeof(e) + it.cell.size(), it.spill_image.data(),
                  it.spill_image.size());
    }
  }
  // Our stamp word on each server of the records (Finish writes the stamp there first).
  for (const Item& it : items_) {
    const uint16_t server = it.record.server();
    if (std::none_of(stamp_words_.begin(), stamp_words_.end(),
                     [&](const StampWord& w) { return w.at.server() == server; })) {
      FARPOOL_ASSIGN_OR_RETURN(GlobalAddress at, s_.StampWord(server));
      stamp_words_.push_back({at, {}});
      const uint64_t raw = at.raw();
      const size_t end = log.size();
      log.resize(end + 8);
      std::memcpy(log.data() + end, &raw, 8);
    }
  }
  if (log.size() > kLogBytes) {
    return Status::InvalidArgument("write set of " + std::to_string(items_.size()) +
                                   " records exceeds the commit log (" + std::to_string(kLogBytes) +
                                   " bytes)");
  }
  LogHeader h{};
  h.number = s_.NextLogNumber();
  h.state = LogState(s_.lease_->epoch, h.number);
  h.count = items_.size();
  h.bytes = log.size() - sizeof(LogHeader);
  h.checksum = LogChecksum(h, log.data() + sizeof(LogHeader));
  log_state_ = h.state;
  std::memcpy(log.data(), &h, sizeof(h));
  FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
  // The stamp, the log and the spills in one round trip: the locks are held, so the stamp may
  // be taken now; and the log needs no stamp (its cells are stamped by whoever installs them).
  uint64_t word = 0;
  Access::Batch b(access_);
  Status s = b.Faa(s_.db_.RootField(kRootCounter), 1, &word);
  if (s.ok()) s = b.Write(s_.log_, log.data(), log.size());
  for (Item& it : items_) {
    if (s.ok() && !it.spill.is_null())
      s = b.Write(it.spill, it.spill_image.data(), it.spill_image.size());
  }
  Status w = b.Wait();
  if (s.ok()) s = w;
  if (!s.ok()) {
    // The log may be partly written: undo it before releasing, or leave it to recovery. (A
    // stamp taken and not used is a gap in the counter, which nothing minds.)
    Status undone = Retrying([&]() -> Status {
      FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
      return access_.Cas(s_.log_, log_state_, 0).status();
    });
    if (!undone.ok()) {
      txn_.decided_ = true;  // unknown: recovery decides by the log's checksum
      // The cause an eviction if either step met one (Abandon keeps Evicted).
      const Status& cause = undone.code() == StatusCode::kEvicted ? undone : s;
      return Abandon(cause.WithContext("writing the commit log"));
    }
    return s;
  }
  stamp_ = CounterOf(word) + 1;
  s_.db_.NoteCounter(stamp_);
  for (Item& it : items_) StampCell(it.cell.data(), it.t->layout_, stamp_);
  for (StampWord& w : stamp_words_) {
    w.image = {stamp_, StampCheck(stamp_, s_.lease_->slot, log_state_)};
  }
  return Status::Ok();
}

Status CommitRun::Finish() {
  const uint64_t mine = s_.lock_word();
  std::vector<uint64_t> prev(items_.size());
  FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
  Access::Batch b(access_);
  Status s;
  for (const StampWord& w : stamp_words_) {
    if (s.ok()) s = b.Write(w.at, &w.image, sizeof(w.image));
  }
  for (Item& it : items_) {
    if (s.ok())
      s = b.Write(it.record + it.t->layout_.cell_offset(it.new_seq), it.cell.data(),
                  it.cell.size());
    s_.db_.Hook("installing");
  }
  // Mapped memory: every cell is in place and nothing is unlocked.
  s_.db_.Hook("installed");
  if (s.ok()) s = b.Fence();
  for (size_t i = 0; i < items_.size() && s.ok(); ++i) {
    s = b.Cas(items_[i].record, mine, UnlockedWord(items_[i].new_seq), &prev[i]);
  }
  // Keys locked at read and not written: unlocked unchanged, in the same round.
  std::vector<uint64_t> held_prev(txn_.held_.size());
  size_t h = 0;
  for (const auto& [key, held] : txn_.held_) {
    if (s.ok()) s = b.Cas(held.record, held.word, held.expected, &held_prev[h++]);
  }
  Status w = b.Wait();
  if (s.ok()) s = w;
  if (!s.ok()) return s;
  txn_.held_.clear();  // released (a CAS that found another word: broken after a fence)
  for (size_t i = 0; i < items_.size(); ++i) {
    if (prev[i] != mine) {
      // Someone fenced us and finished this commit from our log: it is committed, but the
      // session may do nothing more.
      s_.lease_->fenced = true;
      return Status::Unavailable("session slot " + std::to_string(s_.lease_->slot) +
                                 " was fenced while releasing its commit (it was finished by "
                                 "recovery); open a new session");
    }
  }
  return Status::Ok();
}

void CommitRun::Reclaim() {
  for (Item& it : items_) {
    if (!it.dropped_payload.empty()) {
      (void)s_.db_.FreeBlobs(access_, s_, *it.t,
                             reinterpret_cast<const unsigned char*>(it.dropped_payload.data()));
    }
    if (!it.cut.is_null()) s_.db_.RetireChain(it.t, it.cut);
    if (!it.trimmed.is_null()) s_.db_.RetireChain(it.t, it.trimmed);
    if (it.w->deleted) s_.db_.QueueRemoval(it.t, it.record, it.w->key, it.new_seq, stamp_);
  }
}

Status CommitRun::Abandon(const Status& why) {
  s_.Abandon();
  // Evicted stays Evicted: the caller must open the Database again, not only a new session.
  return Status(
      why.code() == StatusCode::kEvicted ? StatusCode::kEvicted : StatusCode::kUnavailable,
      "commit decided but not finished (" + why.message() +
          "); the session stops and recovery finishes the commit (" +
          (why.code() == StatusCode::kEvicted
               ? std::string("another process's: this one is evicted")
               : std::string("this process's own, at its next maintenance pass, on replicated "
                             "or mapped memory; else after the lease")) +
          ")");
}

Status CommitRun::RolledBack(const Status& why) {
  if (why.ok() || !MemoryFailure(why) || s_.lease_->fenced) return why;
  ++s_.counters_.commits_cut;
  return Status::Aborted(
      "commit cut by a memory failure before its decision and rolled back: "
      "nothing of it took effect, its locks are released; retry (" +
      why.message() + ")");
}

Status CommitRun::Retrying(const std::function<Status()>& round) {
  Status s = round();
  if (!access_.memory().replicated()) return s;  // no failover to wait for: the failure stays
  LockWait wait(kRetryNs, 1'000'000, 100'000'000);
  // A session whose lease is not certain any more (its process stalled, or it cannot renew)
  // may have been fenced and its process evicted, which also fails with Unavailable: no retry.
  while (MemoryFailure(s) && !s_.lease_->fenced && MonoNs() < s_.lease_->valid_until.load() &&
         wait.Pause()) {
    s = round();
  }
  return s;
}

Status CommitRun::Settle(const Status& why) {
  // Nobody else finishes the commit while our lease holds (others fence only an expired slot),
  // and RecoverLog writes only before the lease's end (it is repeatable: what it finds done
  // it leaves); a check after it proves the lease held throughout, so every lock of ours was
  // released by us (what Reclaim's retired chains need).
  Status s = Retrying([&]() -> Status {
    FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
    return s_.db_.RecoverLog(access_, s_.lease_->slot, s_.lease_->valid_until.load(), stamp_);
  });
  if (s.ok()) s = s_.CheckLease();
  if (!s.ok()) {
    if (s_.lease_->fenced) return s;  // fenced: recovery finishes (or finished) the commit
    Status cause = why.WithContext("settling the commit failed too (" + s.message() + ")");
    if (s.code() == StatusCode::kEvicted) cause = Status::Evicted(cause.message());
    return Abandon(cause);
  }
  ++s_.counters_.commits_cut;
  Reclaim();
  return Status::Ok();
}

Status CommitRun::IndexFailed(const Status& why) {
  if (why.code() == StatusCode::kAborted || why.code() == StatusCode::kInvalidArgument) return why;
  s_.Abandon();
  return why.WithContext("index insert failed; the session stops (open a new one)");
}

Status CommitRun::Run() {
  RoundTripScope cause(RoundTripCause::kCommitLock);
  FARPOOL_RETURN_IF_ERROR(Resolve());
  // The last commit's log, if no round trip since took its clear along: before any lock.
  if (s_.log_to_clear_ != 0) FARPOOL_RETURN_IF_ERROR(s_.ClearLog());
  FARPOOL_RETURN_IF_ERROR(s_.CheckLease());
  // Every error of LockedAtRead and Lock has released what it took (or stopped the session).
  bool locked = false;
  FARPOOL_RETURN_IF_ERROR(LockedAtRead(&locked));
  if (!locked) FARPOOL_RETURN_IF_ERROR(RolledBack(Lock()));
  s_.db_.Hook("locked");
  RoundTripScope::Set(RoundTripCause::kDecide);
  Status s = Decide();
  if (!s.ok()) {
    if (txn_.decided_) return s;  // the log's state is unknown: Decide stopped the session
    ReleaseLocks();               // the log is cleared (or was never whole): undecided
    return RolledBack(s);
  }
  txn_.decided_ = true;
  s_.db_.Hook("logged");
  RoundTripScope::Set(RoundTripCause::kFinish);
  s = Finish();
  if (s_.lease_->fenced) return s;  // fenced: recovery finished the commit
  if (!s.ok()) return Settle(s.WithContext("installing versions and releasing locks"));
  s_.log_to_clear_ = log_state_;
  s_.logged_records_.clear();
  for (const Item& it : items_) s_.logged_records_.push_back(it.record.raw());
  RoundTripScope::Set(RoundTripCause::kOther);
  Reclaim();
  return Status::Ok();
}

// ---------------------------------------------------------------- NamTxn

Status NamTxn::Commit() {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  if (aborted_) return Finish(Usable());  // Aborted: nothing is committed
  if (writes_.empty()) return Finish(s_.CheckLease());
  CommitRun run(*this);
  return Finish(run.Run());
}

void NamTxn::Rollback() {
  if (finished_) return;
  writes_.clear();  // nothing to count
  (void)Finish(Status::Ok());
}

Status NamTxn::Finish(Status s) {
  finished_ = true;
  const bool aborted =
      !(s.ok() && !writes_.empty()) && (s.code() == StatusCode::kAborted || aborted_);
  if (s.ok() && !writes_.empty()) {
    ++s_.counters_.commits;
  } else if (aborted) {
    ++s_.counters_.aborts;
  }
  // Blobs belong to the new versions once the commit is decided; otherwise they go back.
  if (!decided_) {
    for (const auto& [blob, size] : blobs_)
      (void)s_.db_.recycler().Free(s_.access_, s_, blob, size);
  }
  blobs_.clear();
  writes_.clear();
  reads_.clear();
  if (!held_.empty()) {
    RoundTripScope cause(RoundTripCause::kRelease);
    ReleaseHeld();
  }
  if (has_snapshot_) s_.EndTransaction();
  has_snapshot_ = false;
  if (aborted) {
    s_.counters_.round_trips_aborted +=
        s_.count_.round_trips.load(std::memory_order_relaxed) - round_trips_at_begin_;
  }
  return s;
}

}  // namespace farpool::db
