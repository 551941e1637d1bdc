// The B+tree's node layout in memory (btree.h describes the tree), shared by the tree's
// operations (btree.cc) and its bottom-up build (btree_build.cc). Internal to src/db/index.
#pragma once

#include <cstdint>

#include "db/index/btree.h"
#include "db/layout.h"

namespace farpool::db::btree_internal {

struct Entry {
  int64_t key;
  uint64_t value;
};

struct Node {
  uint64_t lock;
  uint64_t checksum;  // over everything after it
  uint32_t level;
  uint32_t count;
  int64_t low;
  int64_t high;  // exclusive; INT64_MAX on the rightmost node of a level
  uint64_t right;
  Entry e[BTree::kMaxEntries];
};
static_assert(sizeof(Node) == BTree::kNodeSize);

inline constexpr uint64_t kSummed = 16;

inline uint64_t NodeSum(const Node& n) {
  return Checksum(reinterpret_cast<const unsigned char*>(&n) + kSummed, sizeof(Node) - kSummed);
}
inline bool Verifies(const Node& n) { return n.checksum == NodeSum(n); }

}  // namespace farpool::db::btree_internal
