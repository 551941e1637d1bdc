// HashIndex: key -> record address, in the pool, for point lookups with one read.
//
// How it works: fixed arrays of 128-byte buckets (lock word, overflow pointer, 7 entries of
// key + address) chosen by a hash of the key; a full bucket gets an overflow bucket linked
// from it, on the head bucket's server, so the index grows without a rebuild (lookups of a
// long chain take one read per bucket). An index may have several arrays of equal size, one
// per memory server (CreateStriped): the hash picks the array, then the bucket in it, so the
// buckets are spread over the servers and a caller can put a key's record on the server of
// its head bucket (HeadServer), where one near-memory lookup-read finds both. A delete writes a
// tombstone version in the key's record; only once every snapshot sees it does the garbage
// collector Remove the entry (its record word CASed to 0: the slot is free for a later insert) and
// free the record. The array and overflow buckets come from the lock owner's AllocObject, so that
// whoever reclaims a dropped table can Destroy the index.
//
// Invariants / How it works (concurrency and crashes):
//   - At most one entry per key: inserts hold the head bucket's lock (a CAS of its first word
//     from 0 to LockOwner::lock_word()) while they search the chain and add the entry, and
//     release it by a CAS back to 0. A failed release means the lock was broken (this owner
//     was fenced): Unavailable.
//   - No write under the lock ever overwrites anything live, and every change that makes
//     something live is one atomic CAS of one word: an entry is added by writing its key into
//     a free slot (record 0, so readers skip it) and then CASing its record word from 0; a
//     full chain gets a new overflow bucket written whole (unreachable) and then linked by a
//     CAS of the last bucket's `next` word from 0. So a bucket can never be torn, and a holder
//     that dies at any point leaves the chain whole: at worst a free slot with a stray key or
//     an unlinked bucket (a leak). Whoever breaks a dead holder's lock (HolderDead true) just
//     takes it over by CAS; there is nothing to repair, so the hash index needs no redo entry.
//   - Lookups take no lock: they read buckets and accept an entry only if the record it
//     points at carries the same key (a racing insert's half-written entry is skipped;
//     its record is not committed yet, so no snapshot can miss it).
//   - A lock wait asks HolderDead every 64 spins and gives up after `wait_limit` with
//     Unavailable naming the bucket and its holder. CheckLease() precedes every write; a
//     holder judged dead that still runs is evicted from the pool before its lock is broken,
//     so no write of its lands afterwards (docs/database.md, "Leases and fencing").
//
// Thread-safety: the object is immutable after construction; all state is in memory, safe for
// concurrent use by any number of sessions in any number of processes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "db/lock_owner.h"
#include "db/memory.h"

namespace farpool::db {

class HashIndex {
 public:
  static constexpr uint64_t kBucketSize = 128;
  static constexpr int kEntries = 7;
  // How long an insert waits for a bucket lock held by a live holder (see BTree).
  static constexpr std::chrono::milliseconds kDefaultWaitLimit{10000};

  // Allocates (owner.AllocObject, with `placement`) and zeroes `buckets` buckets; returns the
  // array's address.
  static Result<GlobalAddress> Create(const Access& access, LockOwner& owner, uint64_t buckets,
                                      Placement placement = Placement::Striped());
  // One array of `buckets` buckets for each of `servers`, placed there (AllocObject with
  // Placement::OnServer; the database's recycler puts it elsewhere if that server is full).
  // On an error the arrays made so far are freed.
  static Result<std::vector<GlobalAddress>> CreateStriped(const Access& access, LockOwner& owner,
                                                          uint64_t buckets,
                                                          std::span<const uint16_t> servers);

  // `arrays`: one or more arrays of `count` buckets each (Create, CreateStriped).
  HashIndex(std::vector<GlobalAddress> arrays, uint64_t count, uint64_t seed,
            std::chrono::milliseconds wait_limit = kDefaultWaitLimit)
      : arrays_(std::move(arrays)), count_(count), seed_(seed), wait_limit_(wait_limit) {}
  HashIndex(GlobalAddress buckets, uint64_t count, uint64_t seed,
            std::chrono::milliseconds wait_limit = kDefaultWaitLimit)
      : HashIndex(std::vector<GlobalAddress>{buckets}, count, seed, wait_limit) {}

  // The record of `key`, or null if none. While an insert races, a caller may rarely get the
  // record of another key: callers compare the key stored in the record they read.
  Result<GlobalAddress> Lookup(const Access& access, int64_t key) const;
  // Lookup split in two, so that the lookups of many keys share one round trip: PostLookup
  // posts the read of key's head bucket into `bucket` (kBucketSize bytes, kept alive until
  // the batch has completed); after the batch's Wait, FinishLookup answers as Lookup does,
  // reading overflow buckets (one round trip each) only when the head bucket is full and does
  // not hold the key.
  Status PostLookup(Access::Batch& batch, int64_t key, void* bucket) const;
  Result<GlobalAddress> FinishLookup(const Access& access, int64_t key, const void* bucket) const;
  // Lookup and the read of the record found, in one round trip where the memory allows it
  // (Access::Batch::LookupRead: the pool's memory server follows the chain and reads the
  // record when both are on the server of key's head bucket; mapped memory does it at once).
  // PostLookupRead posts it: `record` (record_size bytes) and `result` kept alive until the
  // batch has completed. After the batch's Wait, FinishLookupRead answers as FinishLookup
  // does (the first live entry of the key along the chain), and sets *record_read if `record`
  // now holds the record's bytes (read after everything this batch ordered before the post on
  // that server); otherwise the caller reads the record itself, as after FinishLookup. A chain
  // that continues elsewhere is walked here (one round trip per bucket).
  Status PostLookupRead(Access::Batch& batch, int64_t key, void* record, uint32_t record_size,
                        LookupResult* result) const;
  Result<GlobalAddress> FinishLookupRead(const Access& access, int64_t key,
                                         const LookupResult& result, bool* record_read) const;
  // PostLookupRead that also takes the record's lock word (at `lock_offset`) to `lock_word` if
  // it is free ((word & held_mask) == 0) before reading it (Access::Batch::LookupLockRead:
  // where the record is read in this round trip). result->lookup goes to FinishLookupRead as a
  // PostLookupRead's result; result->locked says whether the lock is the caller's now.
  Status PostLookupLockRead(Access::Batch& batch, int64_t key, uint32_t lock_offset,
                            uint64_t held_mask, uint64_t lock_word, void* record,
                            uint32_t record_size, LockReadResult* result) const;
  // The server of key's head bucket.
  uint16_t HeadServer(int64_t key) const { return Bucket(key).server(); }
  // GetOrInsert as one operation where the memory allows it (Access::Batch::InsertIfAbsent:
  // the memory server takes the head's lock with owner's lock word, inserts and releases, the
  // steps GetOrInsert takes; mapped memory does it at once). PostInsert posts it (`result`
  // kept alive until the batch has completed); the caller checks the owner's lease right
  // before (a store follows). After the batch's Wait, FinishInsert returns the key's record
  // (`record` if inserted, else the one found), or null if it was not done (the head was
  // locked, the chain leaves the server or is full, or the path cannot): the caller inserts
  // with GetOrInsert / GetOrInsertMany. Unavailable if our lock was broken (we were fenced).
  // REQUIRES: `record` is whole in memory before the entry can go live: written in an earlier
  // round trip, or on the head's server before a Fence in this batch.
  Status PostInsert(Access::Batch& batch, const LockOwner& owner, int64_t key, GlobalAddress record,
                    InsertResult* result) const;
  Result<GlobalAddress> FinishInsert(int64_t key, const InsertResult& result) const;
  // Returns the record of `key` if it exists, else inserts `record` and returns it.
  Result<GlobalAddress> GetOrInsert(const Access& access, LockOwner& owner, int64_t key,
                                    GlobalAddress record) const;
  // GetOrInsert of several keys, of one or several hash indexes, in round trips shared by all
  // of them: every head bucket locked and read in one batch, the new entries' keys written in
  // the next, made live in the next, the locks released in the last (plus a read per overflow
  // bucket of a chain longer than its head, and GetOrInsert's own steps for the keys of a
  // chain with no free slot left). The rules are GetOrInsert's: a chain is searched and
  // changed only under its head's lock, a key before its record word, which a CAS makes live.
  // If another holder has one of the heads, none is waited for while others are held: they
  // are released and the keys are inserted one at a time (GetOrInsert), so two such callers
  // never deadlock. Each insert's `record` is the record to insert; it becomes the key's
  // record (the one found if the key is there already).
  // REQUIRES: the keys of each index distinct, records non-null.
  struct Insert {
    const HashIndex* index;
    int64_t key;
    GlobalAddress record;
  };
  static Status GetOrInsertMany(const Access& access, LockOwner& owner, std::span<Insert> inserts);
  // Removes the entry key -> record if present (a deleted row whose record is being freed).
  // The entry's address word is cleared with one write, so lock-free lookups see it whole or
  // not at all; the slot is reused by later inserts.
  Status Remove(const Access& access, LockOwner& owner, int64_t key, GlobalAddress record) const;
  // Calls `visit` for every entry (not safe against concurrent inserts: a checker's tool).
  Status ForEach(const Access& access,
                 const std::function<Status(int64_t key, GlobalAddress record)>& visit) const;
  // Frees every overflow bucket and the arrays (owner.FreeObject). Overflow buckets that a dead
  // inserter wrote but never linked are not found (a leak).
  // REQUIRES: nobody uses the index any more, nor will (a dropped table past its last snapshot).
  Status Destroy(const Access& access, LockOwner& owner) const;

 private:
  GlobalAddress Bucket(int64_t key) const;
  // Locks the head bucket `head` (it guards its whole chain), taking a dead holder's lock over.
  Status LockHead(const Access& access, LockOwner& owner, GlobalAddress head) const;
  // Releases it by CAS from our word; Unavailable if it was broken (we were fenced).
  Status ReleaseHead(const Access& access, LockOwner& owner, GlobalAddress head) const;
  // GetOrInsert's work under the lock of `head` (key's head bucket): the key's record, found
  // or `record` inserted. Releases nothing; every error leaves the chain whole.
  Result<GlobalAddress> InsertLocked(const Access& access, LockOwner& owner, GlobalAddress head,
                                     int64_t key, GlobalAddress record) const;
  std::vector<GlobalAddress> arrays_;
  uint64_t count_;  // buckets per array
  uint64_t seed_;
  std::chrono::milliseconds wait_limit_;
};

}  // namespace farpool::db
