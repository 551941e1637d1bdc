#include "db/index/btree.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "db/index/btree_node.h"
#include "db/index/index_redo.h"
#include "db/layout.h"

namespace farpool::db {
namespace {

using namespace btree_internal;
using Clock = std::chrono::steady_clock;

// The body is everything but the lock word: what a node write replaces.
constexpr uint64_t kBodyOffset = kIndexRedoImageOffset;
constexpr uint64_t kBodySize = sizeof(Node) - kBodyOffset;
static_assert(kBodySize <= kIndexRedoMaxImage && kBodySize % 8 == 0);
// Spins of a wait between two HolderDead calls (each costs at least one read).
constexpr int kCheckEvery = 64;

const unsigned char* Body(const Node& n) {
  return reinterpret_cast<const unsigned char*>(&n) + kBodyOffset;
}

std::string NodeName(GlobalAddress at) { return "b+tree node " + at.ToString(); }
std::string HolderName(uint64_t word) {
  return "slot " + std::to_string(LockSlot(word)) + " epoch " + std::to_string(LockEpoch(word));
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

}  // namespace

// The inner-node cache (btree.h, invariants 9-12): verified images of inner nodes by address,
// and the root address last seen. Routing happens under a shared lock, changes under an
// exclusive one; nothing remote is done under either.
class BTree::NodeCache {
 public:
  explicit NodeCache(size_t capacity) : capacity_(capacity) {}

  // Where a descent for `key` to `level` reads first: the first node of the cached route that
  // is not cached or is at `level`, the level it has, the cached node whose entry named it
  // (0: none), and for a leaf up to `want` more leaves that this parent names next toward
  // `bound` (leftward if `reverse`; only those whose range meets the scan's). False: no route
  // (the root is not known, or is below `level`).
  struct Route {
    uint64_t at = 0;
    uint32_t level = 0;
    uint64_t parent = 0;
    std::vector<uint64_t> more;
  };
  bool Find(int64_t key, uint32_t level, int64_t bound, bool reverse, int want, Route* r) const {
    std::shared_lock l(mu_);
    uint64_t x = root_;
    if (x == 0) return false;
    for (;;) {
      auto it = nodes_.find(x);
      if (it == nodes_.end()) {
        r->at = x;  // not the root (never evicted): r->level is set
        return true;
      }
      const Node& n = it->second;
      if (n.level < level) return false;
      if (key >= n.high && n.right != 0) {
        x = n.right;
        r->level = n.level;
        continue;
      }
      if (n.level == level) {
        r->at = x;
        r->level = level;
        return true;
      }
      const int i = ChildIndex(n, key);
      r->parent = x;
      r->level = n.level - 1;
      x = n.e[i].value;
      if (r->level == 0) {
        const int count = static_cast<int>(n.count);
        if (!reverse) {
          for (int j = i + 1; j < count && n.e[j].key <= bound && int(r->more.size()) < want; ++j)
            r->more.push_back(n.e[j].value);
        } else {
          for (int j = i - 1; j >= 0 && n.e[j + 1].key > bound && int(r->more.size()) < want; --j)
            r->more.push_back(n.e[j].value);
        }
      }
    }
  }

  void Put(uint64_t at, const Node& n) {
    if (n.level == 0) return;
    std::unique_lock l(mu_);
    if (capacity_ == 0) return;
    if (nodes_.size() >= capacity_ && nodes_.find(at) == nodes_.end()) EvictOne();
    nodes_[at] = n;
  }
  // The node the root word names now (only an inner one: a leaf root is read anyway).
  void PutRoot(uint64_t at, const Node& n) {
    if (n.level == 0) return;
    std::unique_lock l(mu_);
    if (capacity_ == 0) return;
    root_ = at;
    if (nodes_.size() >= capacity_ && nodes_.find(at) == nodes_.end()) EvictOne();
    nodes_[at] = n;
  }
  // Invariant 13: the image of a leaf a scan read, for guesses only (never routed through).
  void PutLeaf(uint64_t at, const Node& n) {
    if (n.level != 0) return;
    {
      // The common case, a leaf that has not changed since: no exclusive lock, no copy.
      std::shared_lock l(mu_);
      auto it = leaves_.find(at);
      if (it != leaves_.end() && it->second.checksum == n.checksum) return;
    }
    std::unique_lock l(mu_);
    if (capacity_ == 0) return;
    if (leaves_.size() >= capacity_ && leaves_.find(at) == leaves_.end())
      leaves_.erase(leaves_.begin());
    leaves_[at] = n;
  }
  // Appends to *values those of the cached image of leaf `at` with lo <= key <= hi, in scan
  // order, while values->size() < cap. False if the leaf is not cached.
  bool LeafValues(uint64_t at, int64_t lo, int64_t hi, bool reverse, size_t cap,
                  std::vector<uint64_t>* values, std::vector<int64_t>* keys) const {
    std::shared_lock l(mu_);
    auto it = leaves_.find(at);
    if (it == leaves_.end()) return false;
    const Node& n = it->second;
    for (uint32_t j = 0; j < n.count && values->size() < cap; ++j) {
      const Entry& e = n.e[reverse ? n.count - 1 - j : j];
      if (e.key < lo || e.key > hi) continue;
      values->push_back(e.value);
      if (keys != nullptr) keys->push_back(e.key);
    }
    return true;
  }
  // The root too: the next descent reads the root word.
  void Forget(uint64_t at) {
    std::unique_lock l(mu_);
    if (at == root_) root_ = 0;
    nodes_.erase(at);
  }
  void Drop() {
    std::unique_lock l(mu_);
    capacity_ = 0;
    root_ = 0;
    nodes_.clear();
    leaves_.clear();
  }
  size_t size() const {
    std::shared_lock l(mu_);
    return nodes_.size();
  }

 private:
  // A random node other than the root. REQUIRES: mu_ held exclusively, capacity_ >= 2 nodes
  // held.
  void EvictOne() {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    const size_t buckets = nodes_.bucket_count();
    for (size_t b = rng_ % buckets;; b = (b + 1) % buckets) {
      for (auto it = nodes_.begin(b); it != nodes_.end(b); ++it) {
        if (it->first == root_) continue;
        nodes_.erase(it->first);
        return;
      }
    }
  }

  mutable std::shared_mutex mu_;
  size_t capacity_;
  uint64_t root_ = 0;  // 0: not known
  std::unordered_map<uint64_t, Node> nodes_;
  std::unordered_map<uint64_t, Node> leaves_;  // invariant 13; at most capacity_
  uint64_t rng_ = 0x9e3779b97f4a7c15;
};

namespace {

// What one index call works with. `owner` is null for CheckStructure (reads only, no repair).
// `cache` is null where the call does not use the cache. `first` is the caller's work for the
// call's first round trip (taken by that round); `prefetched`, leaf images a scan read ahead
// (each used at most once, instead of a read).
struct Ctx {
  const Access& access;
  LockOwner* owner;
  std::chrono::milliseconds wait_limit;
  BTree::NodeCache* cache = nullptr;
  mutable const BTree::FirstRound* first = nullptr;
  std::unordered_map<uint64_t, Node>* prefetched = nullptr;
};

// One round trip: the caller's first-round work (`first`, may be null), a read of `size` bytes
// at `at` (none if `size` is 0), and the nodes at `nodes`, of which those that verify go to
// `out` (none are read if `out` is null). Returns first->finish's verdict, or the batch's.
Status ReadRound(const Access& access, const BTree::FirstRound* first, GlobalAddress at, void* d,
                 uint64_t size, std::span<const uint64_t> nodes,
                 std::unordered_map<uint64_t, Node>* out) {
  std::vector<Node> images(out != nullptr ? nodes.size() : 0);
  Status waited;
  {
    Access::Batch b(access);
    if (first != nullptr) FARPOOL_RETURN_IF_ERROR(first->post(b));
    Status posted = size > 0 ? b.Read(at, d, size) : Status::Ok();
    for (size_t i = 0; i < images.size() && posted.ok(); ++i)
      posted = b.Read(GlobalAddress::FromRaw(nodes[i]), &images[i], sizeof(Node));
    waited = b.Wait();
    if (!posted.ok()) waited = posted;
  }
  if (first != nullptr) waited = first->finish(waited);
  FARPOOL_RETURN_IF_ERROR(waited);
  for (size_t i = 0; i < images.size(); ++i) {
    if (Verifies(images[i])) (*out)[nodes[i]] = images[i];
  }
  return Status::Ok();
}

// Reads `size` bytes at `at`, and the nodes at `more` into c.prefetched (those that verify),
// with the caller's first-round work if it has not been done yet: one round trip.
Status ReadRaw(const Ctx& c, GlobalAddress at, void* d, uint64_t size,
               std::span<const uint64_t> more = {}) {
  if (c.first == nullptr && more.empty()) return c.access.Read(at, d, size);
  return ReadRound(c.access, std::exchange(c.first, nullptr), at, d, size, more, c.prefetched);
}

Status ReadRaw(const Ctx& c, GlobalAddress at, Node* n) { return ReadRaw(c, at, n, sizeof(Node)); }

Status WriteRedo(const Access& access, GlobalAddress area, GlobalAddress at, uint64_t lock,
                 const unsigned char* body) {
  unsigned char buf[sizeof(IndexRedoHeader) + kBodySize];
  IndexRedoHeader h{kIndexRedoMagic, at.raw(), lock, kBodySize, 0};
  h.checksum = IndexRedoSum(h, body);
  std::memcpy(buf, &h, sizeof(h));
  std::memcpy(buf + sizeof(h), body, kBodySize);
  return access.Write(area, buf, sizeof(buf));
}

// Reads the redo entry at `entry` into *image. True if it is whole and is the write of node
// `at` under lock word `lock` (invariant 4 of btree.h).
Result<bool> ReadRedo(const Access& access, GlobalAddress entry, GlobalAddress at, uint64_t lock,
                      Node* image) {
  unsigned char buf[sizeof(IndexRedoHeader) + kBodySize];
  FARPOOL_RETURN_IF_ERROR(access.Read(entry, buf, sizeof(buf)));
  IndexRedoHeader h;
  std::memcpy(&h, buf, sizeof(h));
  if (h.magic != kIndexRedoMagic || h.target != at.raw() || h.lock != lock || h.size != kBodySize ||
      h.checksum != IndexRedoSum(h, buf + sizeof(h))) {
    return false;
  }
  image->lock = lock;
  std::memcpy(reinterpret_cast<unsigned char*>(image) + kBodyOffset, buf + sizeof(h), kBodySize);
  return Verifies(*image);
}

// The position in `area` of the entry for the write of `at` under `lock` (the alternate one
// first: it holds an entry only while its repair is in flight), or -1.
Result<int64_t> FindRedo(const Access& access, GlobalAddress area, GlobalAddress at, uint64_t lock,
                         Node* image) {
  if (area.is_null()) return int64_t{-1};
  for (uint64_t pos : {kIndexRedoAlternate, kIndexRedoPrimary}) {
    FARPOOL_ASSIGN_OR_RETURN(bool found, ReadRedo(access, area + pos, at, lock, image));
    if (found) return static_cast<int64_t>(pos);
  }
  return int64_t{-1};
}

Status ClearAlternate(const Access& access, GlobalAddress area) {
  uint64_t zero = 0;
  return access.Write(area + kIndexRedoAlternate, &zero, 8);
}

// Takes node `at`'s lock over from `dead` (HolderDead(dead) returned true), repairing the node
// from the dead holder's redo entry if it does not verify (invariant 5). False if the lock is
// no longer `dead` (someone else broke it first): the caller retries.
Result<bool> TakeOver(const Ctx& c, GlobalAddress at, uint64_t dead) {
  LockOwner& owner = *c.owner;
  const uint64_t mine = owner.lock_word();
  Node n;
  FARPOOL_RETURN_IF_ERROR(ReadRaw(c, at, &n));
  if (n.lock != dead) return false;
  if (Verifies(n)) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, c.access.Cas(at, dead, mine));
    return prev == dead;
  }
  Node image;
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress dead_area, owner.IndexLogOf(dead));
  FARPOOL_ASSIGN_OR_RETURN(int64_t pos, FindRedo(c.access, dead_area, at, dead, &image));
  if (pos < 0) {
    // Our copy may have raced with a breaker that got there first; look again before
    // calling it corruption.
    FARPOOL_RETURN_IF_ERROR(ReadRaw(c, at, &n));
    if (n.lock != dead || Verifies(n)) return false;
    return Status::Internal(NodeName(at) + " does not verify and its dead lock holder (" +
                            HolderName(dead) + ") left no redo entry for it");
  }
  const GlobalAddress area = owner.index_log();
  if (area.is_null()) {
    return Status::InvalidArgument("b+tree: the lock owner has no index redo area");
  }
  // Our own entry first: if we die after the CAS, the node is locked by us and our entry
  // names it. When the dead holder's area is ours (we inherited it), the copy goes to the
  // other position so that the entry we replay stays until the repair is done.
  const bool shared = area == dead_area;
  const uint64_t copy_at =
      shared && pos == int64_t(kIndexRedoPrimary) ? kIndexRedoAlternate : kIndexRedoPrimary;
  FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
  FARPOOL_RETURN_IF_ERROR(WriteRedo(c.access, area + copy_at, at, mine, Body(image)));
  owner.FaultPoint("btree.takeover.logged");
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, c.access.Cas(at, dead, mine));
  if (prev != dead) {
    // A stale alternate entry under our word would shadow our later primary ones.
    if (copy_at == kIndexRedoAlternate) FARPOOL_RETURN_IF_ERROR(ClearAlternate(c.access, area));
    return false;
  }
  owner.FaultPoint("btree.takeover.locked");
  FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
  FARPOOL_RETURN_IF_ERROR(c.access.Write(at + kBodyOffset, Body(image), kBodySize));
  owner.FaultPoint("btree.takeover.written");
  if (shared) FARPOOL_RETURN_IF_ERROR(ClearAlternate(c.access, area));
  return true;
}

// Releases our lock on `at` (a CAS from our word; a failure means we were fenced).
Status Release(const Ctx& c, GlobalAddress at) {
  const uint64_t mine = c.owner->lock_word();
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, c.access.Cas(at, mine, 0));
  if (prev != mine) {
    return Status::Unavailable(NodeName(at) + ": our lock (" + HolderName(mine) +
                               ") was broken, now " +
                               (IsLocked(prev) ? "held by " + HolderName(prev) : "free") +
                               ": this owner was fenced and stopped writing");
  }
  return Status::Ok();
}

Status LockNode(const Ctx& c, GlobalAddress at) {
  const uint64_t mine = c.owner->lock_word();
  const auto deadline = Clock::now() + c.wait_limit;
  for (int spins = 0;; ++spins) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, c.access.Cas(at, 0, mine));
    if (prev == 0) return Status::Ok();
    if (prev == mine) {
      return Status::Internal(NodeName(at) + ": lock already held by this owner (" +
                              HolderName(mine) + ")");
    }
    if (spins % kCheckEvery == kCheckEvery - 1) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, c.owner->HolderDead(prev));
      if (dead) {
        FARPOOL_ASSIGN_OR_RETURN(bool took, TakeOver(c, at, prev));
        if (took) return Status::Ok();
        continue;
      }
      if (Clock::now() > deadline) {
        return Status::Unavailable(NodeName(at) + " stayed locked for over " +
                                   std::to_string(c.wait_limit.count()) + " ms by " +
                                   HolderName(prev) + ", which is not dead");
      }
    }
    std::this_thread::yield();
  }
}

// Reads a node until it verifies (takes a scan's prefetched image of it instead, if there is
// one; `more`: leaves to prefetch with the first read). A node that keeps failing its checksum
// is being written by its lock holder; if that holder is dead, repairs it (invariant 5) when we
// have an owner.
Status ReadNode(const Ctx& c, GlobalAddress at, Node* n, std::span<const uint64_t> more = {}) {
  if (c.prefetched != nullptr) {
    if (auto it = c.prefetched->find(at.raw()); it != c.prefetched->end()) {
      *n = it->second;
      c.prefetched->erase(it);
      return Status::Ok();
    }
  }
  Clock::time_point deadline;
  for (int tries = 0;; ++tries) {
    FARPOOL_RETURN_IF_ERROR(ReadRaw(c, at, n, sizeof(Node), tries == 0 ? more : decltype(more){}));
    if (Verifies(*n)) return Status::Ok();
    if (tries < 16) continue;
    if (tries == 16) deadline = Clock::now() + c.wait_limit;
    std::this_thread::yield();
    if (tries % kCheckEvery != kCheckEvery - 1) continue;
    uint64_t lock;
    FARPOOL_RETURN_IF_ERROR(c.access.Read(at, &lock, 8));
    if (c.owner != nullptr && lock == c.owner->lock_word()) {
      // Nobody else writes a node we hold: only a fenced owner's late write can tear it.
      return Status::Internal(NodeName(at) + " does not verify under our own lock (" +
                              HolderName(lock) + ")");
    }
    if (IsLocked(lock) && c.owner != nullptr) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, c.owner->HolderDead(lock));
      if (dead) {
        FARPOOL_ASSIGN_OR_RETURN(bool took, TakeOver(c, at, lock));
        if (took) FARPOOL_RETURN_IF_ERROR(Release(c, at));
        continue;
      }
    }
    if (Clock::now() > deadline) {
      if (!IsLocked(lock)) {
        return Status::Internal(NodeName(at) +
                                " does not verify and is not locked: corrupt (or written late "
                                "by a fenced owner)");
      }
      return Status::Unavailable(
          NodeName(at) + " did not verify for over " + std::to_string(c.wait_limit.count()) +
          " ms while locked by " + HolderName(lock) +
          (c.owner != nullptr ? ", which is not dead" : " (no lock owner to repair it)"));
    }
  }
}

// Writes `n` (new checksum) to `at` under our lock, through our redo area (invariant 4).
Status LoggedWrite(const Ctx& c, GlobalAddress at, Node& n, std::string_view logged,
                   std::string_view written) {
  LockOwner& owner = *c.owner;
  n.lock = owner.lock_word();
  n.checksum = NodeSum(n);
  FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
  FARPOOL_RETURN_IF_ERROR(
      WriteRedo(c.access, owner.index_log() + kIndexRedoPrimary, at, n.lock, Body(n)));
  owner.FaultPoint(logged);
  FARPOOL_RETURN_IF_ERROR(c.access.Write(at + kBodyOffset, Body(n), kBodySize));
  owner.FaultPoint(written);
  return Status::Ok();
}

// An error under our lock on `at`: release it if the node is whole, else keep it locked so
// that whoever judges us dead repairs it from our redo entry. Returns `s`.
Status Unwind(const Ctx& c, GlobalAddress at, Status s) {
  Node n;
  if (ReadRaw(c, at, &n).ok() && Verifies(n)) (void)Release(c, at);
  return s;
}

// A fresh node, written whole and unlocked, not yet reachable.
Result<GlobalAddress> NewNode(const Access& access, LockOwner& owner, Node& n) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress at,
                           owner.AllocObject(access, sizeof(Node), Placement::Striped()));
  n.lock = 0;
  n.checksum = NodeSum(n);
  FARPOOL_RETURN_IF_ERROR(access.Write(at, &n, sizeof(Node)));
  return at;
}

void CacheNode(const Ctx& c, GlobalAddress at, const Node& n) {
  if (c.cache != nullptr) c.cache->Put(at.raw(), n);
}

Status ReadRoot(const Ctx& c, GlobalAddress root_word, GlobalAddress* at, Node* n) {
  uint64_t raw;
  FARPOOL_RETURN_IF_ERROR(ReadRaw(c, root_word, &raw, 8));
  *at = GlobalAddress::FromRaw(raw);
  if (at->is_null()) return Status::Internal("b+tree: root word " + root_word.ToString() + " is 0");
  FARPOOL_RETURN_IF_ERROR(ReadNode(c, *at, n));
  if (c.cache != nullptr) c.cache->PutRoot(at->raw(), *n);
  return Status::Ok();
}

// From node *n at *at (level >= `level`), moves right and down to the node at `level` whose
// range holds `key`, caching the inner nodes it reads. `first_moves`, if not null, counts the
// move-rights at *n's level; past `max_first_moves` of them it stops there (a cached route
// gone too stale, invariant 10).
Status Descend(const Ctx& c, int64_t key, uint32_t level, GlobalAddress* at, Node* n,
               int* first_moves = nullptr, int max_first_moves = 0) {
  const uint32_t first_level = n->level;
  for (;;) {
    while (key >= n->high && n->right != 0) {
      if (first_moves != nullptr && n->level == first_level && ++*first_moves > max_first_moves) {
        return Status::Ok();
      }
      *at = GlobalAddress::FromRaw(n->right);
      FARPOOL_RETURN_IF_ERROR(ReadNode(c, *at, n));
      CacheNode(c, *at, *n);
    }
    if (n->level == level) return Status::Ok();
    if (n->count == 0 || n->level < level) {
      return Status::Internal(NodeName(*at) + " (level " + std::to_string(n->level) +
                              ") is an empty or misplaced inner node");
    }
    const uint32_t child_level = n->level - 1;
    *at = GlobalAddress::FromRaw(n->e[ChildIndex(*n, key)].value);
    FARPOOL_RETURN_IF_ERROR(ReadNode(c, *at, n));
    if (n->level != child_level) {
      return Status::Internal(NodeName(*at) + " has level " + std::to_string(n->level) +
                              ", its parent expects " + std::to_string(child_level));
    }
    CacheNode(c, *at, *n);
  }
}

// What a scan asks of its first descent: the leaves the cached parent names next (invariant
// 12), toward `bound` (hi forward, lo reverse).
struct ScanAhead {
  int64_t bound;
  bool reverse;
};

// Descends from the root to the node at `level` whose range holds `key`: through the cache
// when it has a route (invariants 9 and 10), else (or if the route proved too stale) from the
// root word.
Status DescendFrom(const Ctx& c, GlobalAddress root_word, int64_t key, uint32_t level,
                   GlobalAddress* at, Node* n, const ScanAhead* ahead = nullptr) {
  BTree::NodeCache::Route r;
  if (c.cache != nullptr && c.cache->Find(key, level, ahead != nullptr ? ahead->bound : 0,
                                          ahead != nullptr && ahead->reverse,
                                          ahead != nullptr ? BTree::kMaxPrefetchLeaves : 0, &r)) {
    *at = GlobalAddress::FromRaw(r.at);
    FARPOOL_RETURN_IF_ERROR(ReadNode(c, *at, n, r.more));
    if (n->level != r.level || key < n->low) {
      return Status::Internal(NodeName(*at) + " (level " + std::to_string(n->level) + ", low " +
                              std::to_string(n->low) + ") was reached through the cache for key " +
                              std::to_string(key) + " at level " + std::to_string(r.level) +
                              ": the tree's nodes changed under its cache");
    }
    CacheNode(c, *at, *n);
    int moves = 0;
    FARPOOL_RETURN_IF_ERROR(Descend(c, key, level, at, n, &moves, BTree::kMaxCachedMoveRights));
    // The cached parent routed us left of the node: read it again next time (invariant 10).
    if (moves > 0 && r.parent != 0) c.cache->Forget(r.parent);
    if (moves <= BTree::kMaxCachedMoveRights) return Status::Ok();
  }
  FARPOOL_RETURN_IF_ERROR(ReadRoot(c, root_word, at, n));
  return Descend(c, key, level, at, n);
}

// Invariant 3: a new root above `old_root` (the root word's node at `old_level`) holding
// `sep` -> `right`. False if the root word moved meanwhile (someone else grew the tree).
Result<bool> GrowRoot(const Ctx& c, GlobalAddress root_word, GlobalAddress old_root,
                      uint32_t old_level, int64_t sep, uint64_t right) {
  Node r{};
  r.level = old_level + 1;
  r.count = 2;
  r.low = INT64_MIN;
  r.high = INT64_MAX;
  r.right = 0;
  r.e[0] = {INT64_MIN, old_root.raw()};
  r.e[1] = {sep, right};
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress fresh, NewNode(c.access, *c.owner, r));
  c.owner->FaultPoint("btree.grow.root-written");
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, c.access.Cas(root_word, old_root.raw(), fresh.raw()));
  if (prev == old_root.raw()) {
    c.owner->FaultPoint("btree.grow.root-swapped");
    if (c.cache != nullptr) c.cache->PutRoot(fresh.raw(), r);
    return true;
  }
  (void)c.owner->FreeObject(c.access, fresh, sizeof(Node));  // never reachable
  return false;
}

}  // namespace

struct BTree::LeafImages::Map {
  std::unordered_map<uint64_t, Node> nodes;
};
BTree::LeafImages::LeafImages() : map_(std::make_unique<Map>()) {}
BTree::LeafImages::~LeafImages() = default;
BTree::LeafImages::LeafImages(LeafImages&&) noexcept = default;

std::vector<uint64_t> BTree::AheadLeaves(const Range& r) const {
  NodeCache::Route route;
  std::vector<uint64_t> at;
  if (cache_ && r.lo <= r.hi &&
      cache_->Find(r.reverse ? r.hi : r.lo, 0, r.reverse ? r.lo : r.hi, r.reverse,
                   kMaxPrefetchLeaves, &route) &&
      route.level == 0) {
    at.push_back(route.at);
    at.insert(at.end(), route.more.begin(), route.more.end());
  }
  return at;
}

Status BTree::ReadAhead(const Access& access, std::span<const Range> ranges,
                        const FirstRound* first, LeafImages* ahead) const {
  std::vector<uint64_t> at;
  for (const Range& r : ranges) {
    const std::vector<uint64_t> leaves = AheadLeaves(r);
    at.insert(at.end(), leaves.begin(), leaves.end());
  }
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  // The leaves' images go to the leaf cache (invariant 13) as the scans take them.
  return ReadRound(access, first, GlobalAddress(), nullptr, 0, at, &ahead->map_->nodes);
}

void BTree::GuessValues(const Range& range, size_t limit, std::vector<uint64_t>* values,
                        std::vector<int64_t>* keys) const {
  const size_t cap = values->size() + limit;
  for (uint64_t leaf : AheadLeaves(range)) {
    // The leaves follow each other in scan order: a gap would make the guesses skip entries
    // (harmless, but then the rest are unlikely to be the scan's).
    if (values->size() >= cap ||
        !cache_->LeafValues(leaf, range.lo, range.hi, range.reverse, cap, values, keys))
      return;
  }
}

BTree::BTree(GlobalAddress root_word, std::chrono::milliseconds wait_limit, size_t cache_nodes)
    : root_word_(root_word),
      wait_limit_(wait_limit),
      cache_(std::make_unique<NodeCache>(cache_nodes)) {}
BTree::~BTree() = default;
BTree::BTree(BTree&&) noexcept = default;

void BTree::DropCache() const {
  if (cache_) cache_->Drop();
}

size_t BTree::cached_nodes() const { return cache_ ? cache_->size() : 0; }

Status BTree::Create(const Access& access, LockOwner& owner, GlobalAddress root_word) {
  Node n{};
  n.level = 0;
  n.count = 0;
  n.low = INT64_MIN;
  n.high = INT64_MAX;
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress leaf, NewNode(access, owner, n));
  uint64_t raw = leaf.raw();
  return access.Write(root_word, &raw, 8);
}

Result<uint64_t> BTree::Lookup(const Access& access, LockOwner& owner, int64_t key) const {
  const Ctx c{access, &owner, wait_limit_, cache_.get()};
  GlobalAddress at;
  Node n;
  FARPOOL_RETURN_IF_ERROR(DescendFrom(c, root_word_, key, 0, &at, &n));
  for (uint32_t i = 0; i < n.count; ++i) {
    if (n.e[i].key == key) return n.e[i].value;
  }
  return uint64_t{0};
}

Result<uint64_t> BTree::GetOrInsert(const Access& access, LockOwner& owner, int64_t key,
                                    uint64_t value) const {
  if (key == INT64_MAX) return Status::InvalidArgument("b+tree: key INT64_MAX is reserved");
  if (owner.index_log().is_null()) {
    return Status::InvalidArgument("b+tree: the lock owner has no index redo area");
  }
  const Ctx c{access, &owner, wait_limit_, cache_.get()};
  // Level 0 inserts key -> value; level L + 1 posts the separator of a split at level L.
  uint32_t level = 0;
  int64_t ins_key = key;
  uint64_t ins_value = value;
  uint64_t result = value;
  for (;;) {
    GlobalAddress at;
    Node n;
    if (level == 0) {
      // Through the cache (invariant 11): the leaf is locked and re-read below.
      FARPOOL_RETURN_IF_ERROR(DescendFrom(c, root_word_, ins_key, 0, &at, &n));
    } else {
      // A separator: from the root word, which growth must see as it is.
      FARPOOL_RETURN_IF_ERROR(ReadRoot(c, root_word_, &at, &n));
    }
    if (n.level < level) {
      if (n.level + 1 != level || n.low != INT64_MIN) {
        return Status::Internal(NodeName(at) + ": the root word names a node at level " +
                                std::to_string(n.level) + " with low " + std::to_string(n.low) +
                                " below a split at level " + std::to_string(level - 1));
      }
      FARPOOL_ASSIGN_OR_RETURN(bool grown,
                               GrowRoot(c, root_word_, at, n.level, ins_key, ins_value));
      if (grown) return result;
      continue;  // the tree grew meanwhile: post into the new level like anyone else
    }
    if (level > 0) FARPOOL_RETURN_IF_ERROR(Descend(c, ins_key, level, &at, &n));
    // Lock it, moving right under the lock if it split meanwhile.
    FARPOOL_RETURN_IF_ERROR(LockNode(c, at));
    for (;;) {
      Status s = ReadNode(c, at, &n);
      if (!s.ok()) return Unwind(c, at, s);
      if (ins_key < n.high) break;
      if (n.right == 0) {
        return Unwind(c, at,
                      Status::Internal(NodeName(at) + ": rightmost node has high key " +
                                       std::to_string(n.high)));
      }
      const GlobalAddress next = GlobalAddress::FromRaw(n.right);
      FARPOOL_RETURN_IF_ERROR(Release(c, at));
      at = next;
      FARPOOL_RETURN_IF_ERROR(LockNode(c, at));
    }
    if (n.level != level) {
      return Unwind(c, at, Status::Internal(NodeName(at) + ": level changed under its lock"));
    }
    uint32_t pos = 0;
    while (pos < n.count && n.e[pos].key < ins_key) ++pos;
    if (pos < n.count && n.e[pos].key == ins_key) {
      if (level == 0) result = n.e[pos].value;
      FARPOOL_RETURN_IF_ERROR(Release(c, at));
      return result;
    }
    if (n.count < static_cast<uint32_t>(kMaxEntries)) {
      std::memmove(&n.e[pos + 1], &n.e[pos], (n.count - pos) * sizeof(Entry));
      n.e[pos] = {ins_key, ins_value};
      ++n.count;
      Status s = LoggedWrite(c, at, n, "btree.insert.logged", "btree.insert.written");
      if (!s.ok()) return Unwind(c, at, s);
      CacheNode(c, at, n);
      FARPOOL_RETURN_IF_ERROR(Release(c, at));
      return result;
    }
    // Split: the right half goes to a new node, written whole before the left one links to it.
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
    auto right = NewNode(access, owner, r);
    if (!right.ok()) return Unwind(c, at, right.status());
    CacheNode(c, *right, r);
    owner.FaultPoint("btree.split.right-written");
    const int64_t sep = r.low;
    n.count = half;
    std::memcpy(n.e, all, half * sizeof(Entry));
    std::memset(n.e + half, 0, (kMaxEntries - half) * sizeof(Entry));
    n.high = sep;
    n.right = right->raw();
    Status s = LoggedWrite(c, at, n, "btree.split.logged", "btree.split.left-written");
    if (!s.ok()) return Unwind(c, at, s);
    CacheNode(c, at, n);
    FARPOOL_RETURN_IF_ERROR(Release(c, at));
    owner.FaultPoint("btree.split.released");
    level = n.level + 1;
    ins_key = sep;
    ins_value = right->raw();
  }
}

Status BTree::Remove(const Access& access, LockOwner& owner, int64_t key, uint64_t value) const {
  if (owner.index_log().is_null()) {
    return Status::InvalidArgument("b+tree: the lock owner has no index redo area");
  }
  const Ctx c{access, &owner, wait_limit_, cache_.get()};
  GlobalAddress at;
  Node n;
  FARPOOL_RETURN_IF_ERROR(DescendFrom(c, root_word_, key, 0, &at, &n));
  FARPOOL_RETURN_IF_ERROR(LockNode(c, at));
  for (;;) {
    Status s = ReadNode(c, at, &n);
    if (!s.ok()) return Unwind(c, at, s);
    if (key < n.high || n.right == 0) break;
    const GlobalAddress next = GlobalAddress::FromRaw(n.right);
    FARPOOL_RETURN_IF_ERROR(Release(c, at));
    at = next;
    FARPOOL_RETURN_IF_ERROR(LockNode(c, at));
  }
  for (uint32_t i = 0; i < n.count; ++i) {
    if (n.e[i].key != key || n.e[i].value != value) continue;
    // Leaves never merge: the leaf keeps its key range, so the B-link invariants hold.
    std::memmove(&n.e[i], &n.e[i + 1], (n.count - i - 1) * sizeof(Entry));
    --n.count;
    std::memset(&n.e[n.count], 0, sizeof(Entry));
    Status s = LoggedWrite(c, at, n, "btree.remove.logged", "btree.remove.written");
    if (!s.ok()) return Unwind(c, at, s);
    break;
  }
  return Release(c, at);
}

Status BTree::Scan(const Access& access, LockOwner& owner, int64_t lo, int64_t hi, bool reverse,
                   const std::function<bool(int64_t, uint64_t)>& visit, const FirstRound* first,
                   LeafImages* ahead) const {
  if (lo > hi) return Status::Ok();
  LeafImages own;
  const Ctx c{access,       &owner, wait_limit_,
              cache_.get(), first,  &(ahead != nullptr ? ahead : &own)->map_->nodes};
  const ScanAhead toward{reverse ? lo : hi, reverse};
  Node n;
  GlobalAddress at;
  if (!reverse) {
    FARPOOL_RETURN_IF_ERROR(DescendFrom(c, root_word_, lo, 0, &at, &n, &toward));
    bool any = false;
    int64_t last = 0;
    for (;;) {
      if (cache_) cache_->PutLeaf(at.raw(), n);
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
      FARPOOL_RETURN_IF_ERROR(ReadNode(c, at, &n));
    }
  }
  int64_t key = hi;
  for (;;) {
    FARPOOL_RETURN_IF_ERROR(
        DescendFrom(c, root_word_, key, 0, &at, &n, key == hi ? &toward : nullptr));
    if (cache_) cache_->PutLeaf(at.raw(), n);
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

// Visits every node reachable from the root word: level by level from the top, each level
// from its leftmost node (the first child of the level above's leftmost) to the right.
static Status WalkLevels(const Ctx& c, GlobalAddress root_word,
                         const std::function<Status(GlobalAddress at, const Node& n, int64_t level,
                                                    bool leftmost)>& visit) {
  GlobalAddress leftmost;
  Node n;
  FARPOOL_RETURN_IF_ERROR(ReadRoot(c, root_word, &leftmost, &n));
  for (int64_t level = n.level; level >= 0; --level) {
    GlobalAddress next_leftmost;
    for (GlobalAddress at = leftmost; !at.is_null(); at = GlobalAddress::FromRaw(n.right)) {
      FARPOOL_RETURN_IF_ERROR(ReadNode(c, at, &n));
      FARPOOL_RETURN_IF_ERROR(visit(at, n, level, at == leftmost));
      if (next_leftmost.is_null() && level > 0 && n.count > 0) {
        next_leftmost = GlobalAddress::FromRaw(n.e[0].value);
      }
    }
    leftmost = next_leftmost;
  }
  return Status::Ok();
}

Result<uint64_t> BTree::CheckStructure(const Access& access) const {
  const Ctx c{access, nullptr, wait_limit_};
  uint64_t leaf_entries = 0;
  int64_t expect_low = INT64_MIN;
  FARPOOL_RETURN_IF_ERROR(WalkLevels(
      c, root_word_, [&](GlobalAddress at, const Node& n, int64_t level, bool leftmost) -> Status {
        if (leftmost) expect_low = INT64_MIN;
        auto where = NodeName(at) + " (level " + std::to_string(level) + ")";
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
        if (level == 0) {
          leaf_entries += n.count;
        } else {
          if (n.count == 0 || n.e[0].key != n.low)
            return Status::Internal(where + ": inner node's first key is not its low key");
          for (uint32_t i = 0; i < n.count; ++i) {
            Node child;
            const GlobalAddress child_at = GlobalAddress::FromRaw(n.e[i].value);
            FARPOOL_RETURN_IF_ERROR(ReadNode(c, child_at, &child));
            if (child.level != level - 1 || child.low != n.e[i].key) {
              return Status::Internal(where + ": entry " + std::to_string(i) + " (key " +
                                      std::to_string(n.e[i].key) + ") names " + NodeName(child_at) +
                                      " at level " + std::to_string(child.level) + " with low " +
                                      std::to_string(child.low));
            }
          }
        }
        if (n.right == 0 && n.high != INT64_MAX)
          return Status::Internal(where + ": rightmost node has a high key");
        expect_low = n.high;
        return Status::Ok();
      }));
  return leaf_entries;
}

Status BTree::Destroy(const Access& access, LockOwner& owner) const {
  DropCache();
  const Ctx c{access, &owner, wait_limit_};
  std::vector<GlobalAddress> nodes;
  FARPOOL_RETURN_IF_ERROR(
      WalkLevels(c, root_word_, [&](GlobalAddress at, const Node&, int64_t, bool) {
        nodes.push_back(at);
        return Status::Ok();
      }));
  for (GlobalAddress at : nodes)
    FARPOOL_RETURN_IF_ERROR(owner.FreeObject(access, at, sizeof(Node)));
  return Status::Ok();
}

Status BTree::RecoverRedo(const Access& access, LockOwner& owner, GlobalAddress area) {
  if (area.is_null()) return Status::Ok();
  const Ctx c{access, &owner, kDefaultWaitLimit};
  for (uint64_t pos : {kIndexRedoAlternate, kIndexRedoPrimary}) {
    IndexRedoHeader h;
    FARPOOL_RETURN_IF_ERROR(access.Read(area + pos, &h, sizeof(h)));
    if (h.magic != kIndexRedoMagic || h.size != kBodySize || !IsLocked(h.lock) ||
        h.lock == owner.lock_word()) {
      continue;
    }
    const GlobalAddress at = GlobalAddress::FromRaw(h.target);
    Node image;
    FARPOOL_ASSIGN_OR_RETURN(bool whole, ReadRedo(access, area + pos, at, h.lock, &image));
    // An entry that is not whole was never followed by a write of its node.
    if (!whole) continue;
    for (;;) {
      uint64_t lock;
      FARPOOL_RETURN_IF_ERROR(access.Read(at, &lock, 8));
      if (lock != h.lock) break;  // released before the death, or broken since
      FARPOOL_ASSIGN_OR_RETURN(bool dead, owner.HolderDead(lock));
      if (!dead) break;  // a live writer: its own business
      FARPOOL_ASSIGN_OR_RETURN(bool took, TakeOver(c, at, lock));
      if (took) {
        FARPOOL_RETURN_IF_ERROR(Release(c, at));
        break;
      }
    }
  }
  return Status::Ok();
}

}  // namespace farpool::db
