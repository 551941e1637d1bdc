// HashIndex: key -> record address, in the pool, for point lookups with one read.
//
// How it works: a fixed array of 128-byte buckets (lock word, overflow pointer, 7 entries of
// key + address) chosen by a hash of the key; a full bucket gets an overflow bucket linked
// from it, so the index grows without a rebuild (lookups of a long chain take one read per
// bucket). Entries are only ever added: a key's record is never removed (a deleted row is a
// tombstone version in its record), so an entry never changes once written.
//
// Invariants:
//   - At most one entry per key: inserts hold the head bucket's lock (a CAS on its first
//     word) while they search the chain and add the entry.
//   - Lookups take no lock: they read buckets and accept an entry only if the record it
//     points at carries the same key (a racing insert's half-written entry is skipped;
//     its record is not committed yet, so no snapshot can miss it).
//   - A lock held by a dead session is taken over (LockOwner::HolderDead).
//
// Thread-safety: the object is immutable after construction; all state is in memory, safe for
// concurrent use by any number of sessions in any number of processes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "db/lock_owner.h"
#include "db/memory.h"

namespace farpool::db {

class HashIndex {
 public:
  static constexpr uint64_t kBucketSize = 128;
  static constexpr int kEntries = 7;

  // Allocates and zeroes `buckets` buckets; returns the array's address.
  static Result<GlobalAddress> Create(const Access& access, uint64_t buckets);

  HashIndex(GlobalAddress buckets, uint64_t count, uint64_t seed)
      : buckets_(buckets), count_(count), seed_(seed) {}

  // The record of `key`, or null if none. While an insert races, a caller may rarely get the
  // record of another key: callers compare the key stored in the record they read.
  Result<GlobalAddress> Lookup(const Access& access, int64_t key) const;
  // Returns the record of `key` if it exists, else inserts `record` and returns it.
  Result<GlobalAddress> GetOrInsert(const Access& access, LockOwner& owner, int64_t key,
                                    GlobalAddress record) const;
  // Removes the entry key -> record if present (a deleted row whose record is being freed).
  // The entry's address word is cleared with one write, so lock-free lookups see it whole or
  // not at all; the slot is reused by later inserts.
  Status Remove(const Access& access, LockOwner& owner, int64_t key, GlobalAddress record) const;
  // Calls `visit` for every entry (not safe against concurrent inserts: a checker's tool).
  Status ForEach(const Access& access,
                 const std::function<Status(int64_t key, GlobalAddress record)>& visit) const;

 private:
  GlobalAddress Bucket(int64_t key) const;
  GlobalAddress buckets_;
  uint64_t count_;
  uint64_t seed_;
};

}  // namespace farpool::db
