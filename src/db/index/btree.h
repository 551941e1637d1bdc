// BTree: an ordered index key -> record address in the pool (a B-link tree, Lehman & Yao),
// for range and reverse scans ("the last 100 messages of a user").
//
// How it works: 1 KiB nodes, each | lock | checksum | level, count | low | high | right |
// 61 sorted (key, value) entries |. A node covers keys in [low, high); `right` links every
// level left to right. Leaves map keys to record addresses, inner nodes map the first key of
// each child to the child. A root word (in the table's catalog entry) names the root node.
//
// Invariants:
//   - Keys are only inserted (a deleted row is a tombstone in its record), so nodes only
//     split, never merge; the tree grows by splitting the root (CAS on the root word) while
//     everyone else keeps working: no stop-the-world.
//   - Writers lock one node at a time (CAS on its lock word), re-read it under the lock, and
//     write the whole node body with a new checksum in one write.
//   - A split writes the new right node first, then the left node (new high key and right
//     link), then inserts the separator into the parent. Between those steps the B-link
//     right pointers keep every key reachable: a reader or writer that finds key >= high moves
//     right.
//   - Readers take no lock: they re-read a node whose checksum does not match (a concurrent
//     write tore their copy).
//
// Keys must be < INT64_MAX (the high key of the rightmost nodes).
//
// Thread-safety: immutable object, state in memory; safe for concurrent use from any number of
// sessions and processes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "db/lock_owner.h"
#include "db/memory.h"

namespace farpool::db {

class BTree {
 public:
  static constexpr uint64_t kNodeSize = 1024;
  static constexpr int kMaxEntries = 61;

  // Creates an empty tree: one leaf, written to *root_word.
  static Status Create(const Access& access, GlobalAddress root_word);

  explicit BTree(GlobalAddress root_word) : root_word_(root_word) {}

  // The value of `key`, or 0.
  Result<uint64_t> Lookup(const Access& access, int64_t key) const;
  // Inserts key -> value unless the key is present; returns the value now stored.
  Result<uint64_t> GetOrInsert(const Access& access, LockOwner& owner, int64_t key,
                               uint64_t value) const;
  // Removes key -> value if present with that value (a deleted row whose record is being
  // freed). Leaves never merge: an emptied leaf keeps its key range.
  Status Remove(const Access& access, LockOwner& owner, int64_t key, uint64_t value) const;
  // Visits entries with lo <= key <= hi in order (descending if reverse) until `visit`
  // returns false. Entries inserted during the scan may or may not be visited.
  Status Scan(const Access& access, int64_t lo, int64_t hi, bool reverse,
              const std::function<bool(int64_t key, uint64_t value)>& visit) const;

  // Checks the structure (sorted keys, key ranges, levels) and returns the number of leaf
  // entries. For tests; not safe against concurrent writers.
  Result<uint64_t> CheckStructure(const Access& access) const;

 private:
  GlobalAddress root_word_;
};

}  // namespace farpool::db
