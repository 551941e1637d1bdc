#include "db/index/btree.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include "db/layout.h"

namespace farpool::db {
namespace {

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

constexpr uint64_t kBodyOffset = 8;
constexpr uint64_t kSummed = 16;

uint64_t NodeSum(const Node& n) {
  return Checksum(reinterpret_cast<const unsigned char*>(&n) + kSummed, sizeof(Node) - kSummed);
}

Status ReadNode(const Access& access, GlobalAddress at, Node* n) {
  for (int tries = 0; tries < 1000000; ++tries) {
    FARPOOL_RETURN_IF_ERROR(access.Read(at, n, sizeof(Node)));
    if (n->checksum == NodeSum(*n)) return Status::Ok();
    if (tries > 16) std::this_thread::yield();
  }
  return Status::Internal("b+tree: node " + at.ToString() + " never read consistently");
}

// Writes everything but the lock word.
Status WriteBody(const Access& access, GlobalAddress at, Node& n) {
  n.checksum = NodeSum(n);
  return access.Write(at + kBodyOffset, reinterpret_cast<const unsigned char*>(&n) + kBodyOffset,
                      sizeof(Node) - kBodyOffset);
}

Result<GlobalAddress> NewNode(const Access& access, Node& n) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress at, access.Alloc(sizeof(Node), Placement::Striped()));
  n.lock = 0;
  n.checksum = NodeSum(n);
  FARPOOL_RETURN_IF_ERROR(access.Write(at, &n, sizeof(Node)));
  return at;
}

// Index of the child of inner node `n` that covers `key`: the last entry with key <= key.
int ChildIndex(const Node& n, int64_t key) {
  int lo = 0, hi = static_cast<int>(n.count) - 1, ans = 0;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (n.e[mid].key <= key) {
      ans = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return ans;
}

Status LockNode(const Access& access, LockOwner& owner, GlobalAddress at) {
  const uint64_t mine = owner.lock_word();
  for (int spins = 0;; ++spins) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(at, 0, mine));
    if (prev == 0) return Status::Ok();
    if (prev == mine) return Status::Internal("b+tree: node lock already held by this session");
    if ((spins & 63) == 63) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, owner.HolderDead(prev));
      if (dead) {
        FARPOOL_ASSIGN_OR_RETURN(uint64_t p2, access.Cas(at, prev, mine));
        if (p2 == prev) return Status::Ok();
      }
    }
    std::this_thread::yield();
  }
}

Status UnlockNode(const Access& access, GlobalAddress at) {
  uint64_t zero = 0;
  return access.Write(at, &zero, 8);
}

}  // namespace

Status BTree::Create(const Access& access, GlobalAddress root_word) {
  Node n{};
  n.level = 0;
  n.count = 0;
  n.low = INT64_MIN;
  n.high = INT64_MAX;
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress leaf, NewNode(access, n));
  uint64_t raw = leaf.raw();
  return access.Write(root_word, &raw, 8);
}

Result<uint64_t> BTree::Lookup(const Access& access, int64_t key) const {
  uint64_t raw;
  FARPOOL_RETURN_IF_ERROR(access.Read(root_word_, &raw, 8));
  GlobalAddress at = GlobalAddress::FromRaw(raw);
  Node n;
  FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
  for (;;) {
    while (key >= n.high && n.right != 0) {
      at = GlobalAddress::FromRaw(n.right);
      FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
    }
    if (n.level == 0) break;
    at = GlobalAddress::FromRaw(n.e[ChildIndex(n, key)].value);
    FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
  }
  for (uint32_t i = 0; i < n.count; ++i) {
    if (n.e[i].key == key) return n.e[i].value;
  }
  return uint64_t{0};
}

Result<uint64_t> BTree::GetOrInsert(const Access& access, LockOwner& owner, int64_t key,
                                    uint64_t value) const {
  if (key == INT64_MAX) return Status::InvalidArgument("b+tree: key INT64_MAX is reserved");
  uint32_t level = 0;
  int64_t ins_key = key;
  uint64_t ins_value = value;
  uint64_t result = value;
  for (;;) {
    // Find the node at `level` covering ins_key.
    uint64_t raw;
    FARPOOL_RETURN_IF_ERROR(access.Read(root_word_, &raw, 8));
    GlobalAddress at = GlobalAddress::FromRaw(raw);
    Node n;
    FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
    if (n.level < level) {
      // The root is being split by the session that split the old root: let it finish.
      std::this_thread::yield();
      continue;
    }
    for (;;) {
      while (ins_key >= n.high && n.right != 0) {
        at = GlobalAddress::FromRaw(n.right);
        FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
      }
      if (n.level == level) break;
      at = GlobalAddress::FromRaw(n.e[ChildIndex(n, ins_key)].value);
      FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
    }
    // Lock it, moving right under the lock if it split meanwhile.
    for (;;) {
      FARPOOL_RETURN_IF_ERROR(LockNode(access, owner, at));
      Status s = ReadNode(access, at, &n);
      if (!s.ok()) {
        (void)UnlockNode(access, at);
        return s;
      }
      if (ins_key < n.high || n.right == 0) break;
      FARPOOL_RETURN_IF_ERROR(UnlockNode(access, at));
      at = GlobalAddress::FromRaw(n.right);
    }
    // Present already?
    uint32_t pos = 0;
    while (pos < n.count && n.e[pos].key < ins_key) ++pos;
    if (pos < n.count && n.e[pos].key == ins_key) {
      if (level == 0) result = n.e[pos].value;
      FARPOOL_RETURN_IF_ERROR(UnlockNode(access, at));
      return result;
    }
    if (n.count < static_cast<uint32_t>(kMaxEntries)) {
      std::memmove(&n.e[pos + 1], &n.e[pos], (n.count - pos) * sizeof(Entry));
      n.e[pos] = {ins_key, ins_value};
      ++n.count;
      Status s = WriteBody(access, at, n);
      Status u = UnlockNode(access, at);
      if (!s.ok()) return s;
      if (!u.ok()) return u;
      return result;
    }
    // Split: the right half goes to a new node, written before the left one links to it.
    Entry all[kMaxEntries + 1];
    std::memcpy(all, n.e, pos * sizeof(Entry));
    all[pos] = {ins_key, ins_value};
    std::memcpy(all + pos + 1, n.e + pos, (n.count - pos) * sizeof(Entry));
    const uint32_t total = n.count + 1, half = total / 2;
    Node r{};
    r.level = n.level;
    r.count = total - half;
    std::memcpy(r.e, all + half, r.count * sizeof(Entry));
    r.low = r.e[0].key;
    r.high = n.high;
    r.right = n.right;
    auto right = NewNode(access, r);
    if (!right.ok()) {
      (void)UnlockNode(access, at);
      return right.status();
    }
    const int64_t sep = r.low;
    n.count = half;
    std::memcpy(n.e, all, half * sizeof(Entry));
    std::memset(n.e + half, 0, (kMaxEntries - half) * sizeof(Entry));
    n.high = sep;
    n.right = right->raw();
    Status s = WriteBody(access, at, n);
    uint64_t root_raw = 0;
    if (s.ok()) s = access.Read(root_word_, &root_raw, 8);
    Status u = UnlockNode(access, at);
    if (!s.ok()) return s;
    if (!u.ok()) return u;
    if (root_raw == at.raw()) {
      // Grow: a new root above the old one and its new sibling. Only the splitter of the
      // root can get here, so the CAS succeeds unless memory fails.
      Node root{};
      root.level = n.level + 1;
      root.count = 2;
      root.low = INT64_MIN;
      root.high = INT64_MAX;
      root.e[0] = {INT64_MIN, at.raw()};
      root.e[1] = {sep, right->raw()};
      FARPOOL_ASSIGN_OR_RETURN(GlobalAddress nr, NewNode(access, root));
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(root_word_, at.raw(), nr.raw()));
      if (prev != at.raw()) {
        return Status::Internal("b+tree: root changed during the root's own split");
      }
      return result;
    }
    level = n.level + 1;
    ins_key = sep;
    ins_value = right->raw();
  }
}

Status BTree::Remove(const Access& access, LockOwner& owner, int64_t key, uint64_t value) const {
  uint64_t raw;
  FARPOOL_RETURN_IF_ERROR(access.Read(root_word_, &raw, 8));
  GlobalAddress at = GlobalAddress::FromRaw(raw);
  Node n;
  FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
  for (;;) {
    while (key >= n.high && n.right != 0) {
      at = GlobalAddress::FromRaw(n.right);
      FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
    }
    if (n.level == 0) break;
    at = GlobalAddress::FromRaw(n.e[ChildIndex(n, key)].value);
    FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
  }
  for (;;) {
    FARPOOL_RETURN_IF_ERROR(LockNode(access, owner, at));
    Status s = ReadNode(access, at, &n);
    if (!s.ok()) {
      (void)UnlockNode(access, at);
      return s;
    }
    if (key < n.high || n.right == 0) break;
    FARPOOL_RETURN_IF_ERROR(UnlockNode(access, at));
    at = GlobalAddress::FromRaw(n.right);
  }
  Status s;
  for (uint32_t i = 0; i < n.count; ++i) {
    if (n.e[i].key == key && n.e[i].value == value) {
      std::memmove(&n.e[i], &n.e[i + 1], (n.count - i - 1) * sizeof(Entry));
      --n.count;
      std::memset(&n.e[n.count], 0, sizeof(Entry));
      s = WriteBody(access, at, n);
      break;
    }
  }
  Status u = UnlockNode(access, at);
  return s.ok() ? u : s;
}

Status BTree::Scan(const Access& access, int64_t lo, int64_t hi, bool reverse,
                   const std::function<bool(int64_t, uint64_t)>& visit) const {
  if (lo > hi) return Status::Ok();
  auto descend = [&](int64_t key, Node* n, GlobalAddress* at) -> Status {
    uint64_t raw;
    FARPOOL_RETURN_IF_ERROR(access.Read(root_word_, &raw, 8));
    *at = GlobalAddress::FromRaw(raw);
    FARPOOL_RETURN_IF_ERROR(ReadNode(access, *at, n));
    for (;;) {
      while (key >= n->high && n->right != 0) {
        *at = GlobalAddress::FromRaw(n->right);
        FARPOOL_RETURN_IF_ERROR(ReadNode(access, *at, n));
      }
      if (n->level == 0) return Status::Ok();
      *at = GlobalAddress::FromRaw(n->e[ChildIndex(*n, key)].value);
      FARPOOL_RETURN_IF_ERROR(ReadNode(access, *at, n));
    }
  };
  Node n;
  GlobalAddress at;
  if (!reverse) {
    FARPOOL_RETURN_IF_ERROR(descend(lo, &n, &at));
    bool any = false;
    int64_t last = 0;
    for (;;) {
      for (uint32_t i = 0; i < n.count; ++i) {
        const int64_t k = n.e[i].key;
        if (k < lo || (any && k <= last)) continue;
        if (k > hi) return Status::Ok();
        any = true;
        last = k;
        if (!visit(k, n.e[i].value)) return Status::Ok();
      }
      if (n.right == 0 || n.high > hi) return Status::Ok();
      at = GlobalAddress::FromRaw(n.right);
      FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
    }
  }
  int64_t key = hi;
  for (;;) {
    FARPOOL_RETURN_IF_ERROR(descend(key, &n, &at));
    for (int i = static_cast<int>(n.count) - 1; i >= 0; --i) {
      const int64_t k = n.e[i].key;
      if (k > key) continue;
      if (k < lo) return Status::Ok();
      if (!visit(k, n.e[i].value)) return Status::Ok();
    }
    if (n.low <= lo || n.low == INT64_MIN) return Status::Ok();
    key = n.low - 1;
  }
}

Result<uint64_t> BTree::CheckStructure(const Access& access) const {
  uint64_t raw;
  FARPOOL_RETURN_IF_ERROR(access.Read(root_word_, &raw, 8));
  GlobalAddress leftmost = GlobalAddress::FromRaw(raw);
  Node n;
  FARPOOL_RETURN_IF_ERROR(ReadNode(access, leftmost, &n));
  const uint32_t top = n.level;
  uint64_t leaf_entries = 0;
  for (int64_t level = top; level >= 0; --level) {
    GlobalAddress at = leftmost;
    int64_t expect_low = INT64_MIN;
    GlobalAddress next_leftmost;
    for (;;) {
      FARPOOL_RETURN_IF_ERROR(ReadNode(access, at, &n));
      auto where = "b+tree node " + at.ToString() + " (level " + std::to_string(level) + ")";
      if (n.level != level)
        return Status::Internal(where + ": wrong level " + std::to_string(n.level));
      if (n.low != expect_low)
        return Status::Internal(where + ": low key does not follow its left sibling's high key");
      if (n.count > static_cast<uint32_t>(kMaxEntries))
        return Status::Internal(where + ": bad count");
      for (uint32_t i = 0; i < n.count; ++i) {
        if (n.e[i].key < n.low || n.e[i].key >= n.high)
          return Status::Internal(where + ": key outside [low, high)");
        if (i > 0 && n.e[i - 1].key >= n.e[i].key)
          return Status::Internal(where + ": keys not sorted");
      }
      if (level == 0) leaf_entries += n.count;
      if (next_leftmost.is_null() && level > 0)
        next_leftmost = GlobalAddress::FromRaw(n.e[0].value);
      if (n.right == 0) {
        if (n.high != INT64_MAX) return Status::Internal(where + ": rightmost node has a high key");
        break;
      }
      expect_low = n.high;
      at = GlobalAddress::FromRaw(n.right);
    }
    leftmost = next_leftmost;
  }
  return leaf_entries;
}

}  // namespace farpool::db
