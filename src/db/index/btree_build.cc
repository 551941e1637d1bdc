// BTree::BuildSorted: the bottom-up build of a B+tree from sorted entries (btree.h).
#include <climits>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "db/index/btree.h"
#include "db/index/btree_node.h"

namespace farpool::db {
namespace {

using namespace btree_internal;

// Nodes written per batch (one round trip): 64 KiB.
constexpr size_t kNodesPerBatch = 64;

// One level under construction: each node's first key (its low) and address.
struct Child {
  int64_t low;
  GlobalAddress at;
};

}  // namespace

Status BTree::BuildSorted(const Access& access, LockOwner& owner,
                          std::span<const std::pair<int64_t, uint64_t>> entries) const {
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto [key, value] = entries[i];
    if (key == INT64_MAX) return Status::InvalidArgument("b+tree: key INT64_MAX is reserved");
    if (value == 0) {
      return Status::InvalidArgument("b+tree: key " + std::to_string(key) + " has value 0");
    }
    if (i > 0 && entries[i - 1].first >= key) {
      return Status::InvalidArgument(
          "b+tree build: keys not strictly ascending (" + std::to_string(entries[i - 1].first) +
          (entries[i - 1].first == key ? " twice)" : " before " + std::to_string(key) + ")"));
    }
  }
  uint64_t old_raw = 0;
  FARPOOL_RETURN_IF_ERROR(access.Read(root_word_, &old_raw, 8));
  const GlobalAddress old_root = GlobalAddress::FromRaw(old_raw);
  if (old_root.is_null())
    return Status::Internal("b+tree: root word " + root_word_.ToString() + " is 0");
  Node old{};
  FARPOOL_RETURN_IF_ERROR(access.Read(old_root, &old, sizeof(Node)));
  if (!Verifies(old) || old.level != 0 || old.count != 0 || old.right != 0) {
    return Status::InvalidArgument("b+tree build: the tree at " + root_word_.ToString() +
                                   " is not empty");
  }
  if (entries.empty()) return Status::Ok();

  std::vector<GlobalAddress> written;  // every node allocated, freed again on a failure
  auto build = [&]() -> Result<GlobalAddress> {
    // Writes one level: `n` nodes, node i filled by fill(i, &node) with low/count/entries;
    // returns the level's children for the level above.
    auto level = [&](uint32_t lvl, size_t n,
                     const std::function<void(size_t, Node*)>& fill) -> Result<std::vector<Child>> {
      std::vector<Child> out(n);
      for (size_t i = 0; i < n; ++i) {
        FARPOOL_ASSIGN_OR_RETURN(out[i].at,
                                 owner.AllocObject(access, sizeof(Node), Placement::Striped()));
        written.push_back(out[i].at);
      }
      std::vector<Node> nodes(std::min(n, kNodesPerBatch));
      for (size_t first = 0; first < n; first += kNodesPerBatch) {
        const size_t m = std::min(kNodesPerBatch, n - first);
        FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
        Access::Batch b(access);
        for (size_t j = 0; j < m; ++j) {
          const size_t i = first + j;
          Node& node = nodes[j];
          std::memset(&node, 0, sizeof(Node));
          node.level = lvl;
          fill(i, &node);
          out[i].low = node.low;
          node.high = INT64_MAX;
          node.right = 0;
          if (i + 1 < n) node.right = out[i + 1].at.raw();
        }
        // The high keys: the next node's low (known once the next node is filled; the last of
        // this batch looks ahead by computing it the same way).
        for (size_t j = 0; j < m; ++j) {
          const size_t i = first + j;
          if (i + 1 < n) {
            if (j + 1 < m) {
              nodes[j].high = nodes[j + 1].low;
            } else {
              Node next{};
              fill(i + 1, &next);
              nodes[j].high = next.low;
            }
          }
          nodes[j].checksum = NodeSum(nodes[j]);
          FARPOOL_RETURN_IF_ERROR(b.Write(out[i].at, &nodes[j], sizeof(Node)));
        }
        FARPOOL_RETURN_IF_ERROR(b.Wait());
      }
      return out;
    };
    const size_t fill = static_cast<size_t>(kBuildFill);
    const size_t leaves = (entries.size() + fill - 1) / fill;
    FARPOOL_ASSIGN_OR_RETURN(std::vector<Child> below, level(0, leaves, [&](size_t i, Node* node) {
                               const size_t from = i * fill,
                                            to = std::min(entries.size(), from + fill);
                               node->count = static_cast<uint32_t>(to - from);
                               for (size_t k = from; k < to; ++k)
                                 node->e[k - from] = {entries[k].first, entries[k].second};
                               node->low = i == 0 ? INT64_MIN : entries[from].first;
                             }));
    for (uint32_t lvl = 1; below.size() > 1; ++lvl) {
      const std::vector<Child> children = std::move(below);
      const size_t n = (children.size() + fill - 1) / fill;
      FARPOOL_ASSIGN_OR_RETURN(below, level(lvl, n, [&](size_t i, Node* node) {
                                 const size_t from = i * fill,
                                              to = std::min(children.size(), from + fill);
                                 node->count = static_cast<uint32_t>(to - from);
                                 for (size_t k = from; k < to; ++k)
                                   node->e[k - from] = {children[k].low, children[k].at.raw()};
                                 node->low = children[from].low;
                               }));
    }
    return below[0].at;
  };
  auto root = build();
  Status s = root.status();
  if (s.ok()) s = owner.CheckLease();
  if (s.ok()) {
    auto prev = access.Cas(root_word_, old_root.raw(), root->raw());
    s = prev.ok() && *prev != old_root.raw()
            ? Status::Internal("b+tree build: the root word " + root_word_.ToString() +
                               " changed during the build")
            : prev.status();
  }
  if (!s.ok()) {
    for (GlobalAddress at : written) (void)owner.FreeObject(access, at, sizeof(Node));
    return s;
  }
  return owner.FreeObject(access, old_root, sizeof(Node));
}

}  // namespace farpool::db
