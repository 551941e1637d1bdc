// BTree: an ordered index key -> record address in the pool (a B-link tree, Lehman & Yao),
// for range and reverse scans ("the last 100 messages of a user").
//
// How it works: 1 KiB nodes, each | lock | checksum | level, count | low | high | right |
// 61 sorted (key, value) entries |. A node covers keys in [low, high); `right` links every
// level left to right. Leaves map keys to record addresses, inner nodes map the low key of
// each child to the child. A root word (in the table's catalog entry) names the root node.
// Readers take no lock and move right when a key is >= high. A writer locks one node at a
// time (CAS of its lock word from 0 to LockOwner::lock_word()), re-reads it under the lock,
// moves right under the lock if it split meanwhile, and writes the whole node body.
//
// Invariants / How it works (concurrency and crashes):
//   1. Nodes only split, never merge, and a node's `low` never changes: every inner entry's
//      key equals its child's low. The leftmost node of each level is fixed forever, so the
//      root word always names the leftmost node of the top level.
//   2. Every key stays reachable by "descend, then move right" at every moment: a split writes
//      the new right node whole (unreachable until linked) before the left node's one write
//      that shrinks its high key and links to it. Posting the separator to the parent is an
//      optimisation; a node whose separator is missing (its splitter died) is reached by
//      moving right from its left sibling.
//   3. Root growth: whoever must post a separator above the top level builds a new root
//      [INT64_MIN -> current root, sep -> right] and CASes the root word from the root it
//      read. This is correct even when the top level has more nodes than those two (they are
//      reached by moving right). A failed CAS means someone else grew the tree: the splitter
//      re-reads the root and posts its separator into the new level like any other. Nobody
//      ever waits for another process to grow the root, so a splitter that dies anywhere in
//      growth leaves nothing to wait for (its separator is just missing, see 2).
//   4. Torn nodes. A node write is not atomic. Before overwriting a node under its lock the
//      holder CheckLease()s and writes a redo entry (node address, its lock word, the whole new
//      image, checksum) to its index_log() (index_redo.h), then writes the node. A node can
//      fail its checksum only while a holder is writing it, so: a node that does not verify
//      and is locked by word W is being written by W right now, and W's redo area holds the
//      entry for exactly this write (W writes an entry before every node write under W and
//      holds one index lock at a time, so its newest entry naming this node under W is the
//      one in flight). Entries are never cleared; a stale entry is never applied because it
//      is used only for a node that is torn and still locked by the entry's lock word (a
//      breaker's copy whose CAS failed names a node W did not get; should W lock that node
//      later, it logs a new entry before touching it).
//   5. Breaking a dead holder's lock (HolderDead(W) true): read the node; if it verifies, CAS
//      the lock W -> ours and continue (any half-done split is fine by 2). If it is torn, copy
//      W's entry into our own redo area as an entry under our lock word *first*, then CAS the
//      lock W -> ours, then rewrite the node. A breaker that dies after the CAS thus leaves a
//      torn node locked by itself with its own redo entry naming it (4 holds again); one that
//      dies before the CAS leaves W's lock and W's entry in place. Readers that see a node
//      fail its checksum repeatedly do the same when its holder is dead (and release).
//      Areas are per session slot, so a new epoch of a slot inherits a dead epoch's area; it
//      calls RecoverRedo before its first write, and a repair of an entry in its own area
//      copies it to the area's other position (index_redo.h), cleared once the repair is done,
//      so a crash during that repair still leaves an entry for whichever lock the node has.
//   6. Crash points, for a split of node X into X + R under X's lock: R written, X not yet
//      logged: R is unreachable garbage (a leak), X intact. X logged but not written: X
//      intact (the entry is not applied: X verifies). X half-written: replayed from the entry
//      (R is already whole). X written, separator not posted: reachable by moving right (2).
//      Parent locked, logged or half-written: the same as any node. New root written but the
//      root word not CASed: a leaked node; the next splitter at that level grows the root
//      itself (3). Root word CASed: done.
//   7. Fencing: releases are CASes from our lock word; a failed release means our lock was
//      broken (we were judged dead): GetOrInsert stops and returns Unavailable. A holder
//      judged dead that is in fact still running (stopped between CheckLease and a node
//      write) is evicted from the pool before anyone breaks its lock (docs/database.md,
//      "Leases and fencing"), so that write never lands after the repair. An error after
//      a node write began (memory failure) keeps that node locked if it does not verify, so
//      that whoever judges us dead repairs it from our entry: an owner that got such an
//      error from GetOrInsert must be abandoned (its later inserts on that node would fail
//      with Internal "lock already held by this owner").
//   8. Waits are bounded: a lock wait or a reader's wait for a torn node asks HolderDead every
//      64 spins and gives up after `wait_limit` with Unavailable naming the node and holder.
//      Races (a root that grew, a lock broken by someone else first) are retried inside.
//
// Inner-node cache (per BTree object, so per process and tree; shared by the sessions that use
// the object). Over a network every node read is a round trip, and a descent reads the root
// word and one node per level. The cache keeps verified images of inner nodes (level >= 1) and
// the root address last seen, so that a descent routes through memory and reads only the
// leaf (Sherman's index cache; there a version validates a cached node, here the B-link
// invariants do):
//   9. A stale route is never wrong, only long. Take a cached image I of inner node X, read at
//      some time. Since then X may only have split (invariant 1): its entries with keys
//      >= its new high went to nodes on its right, and every child that I names still exists
//      with the same low (nodes are freed only with the whole tree, Destroy, and the empty leaf
//      that BuildSorted replaces before anyone can read the tree). Routing `key`
//      by I (key >= I.low) picks the child C whose low is the largest entry key <= key; now,
//      as then, C.low <= key, and a level's nodes cover the key space left to right in low
//      order, so the node that holds `key` at C's level is C or lies to its right: moving
//      right from C reaches it (invariant 2). Moving right by I's high and right link is
//      right for the same reason (I.right's low is I.high, which never changes). A cached
//      root is the leftmost node of its level forever (invariant 1), so it routes every key
//      even after the tree grew above it. Hence a cached descent ends at the right leaf after
//      zero or more move-rights, and any key present before the descent began is found.
//  10. Bounded staleness. A descent that had to move right below a cached node drops that
//      node from the cache (the next descent through it reads it again, and caches the fresh
//      image: Sherman's refresh); one that moves right more than kMaxCachedMoveRights times
//      gives the cached route up and descends from the root word, reading (and caching) the
//      whole path. So a cached descent costs at most kMaxCachedMoveRights + 1 reads more than
//      an uncached one, and one leaf read in the common case.
//  11. Writers use the cache too (GetOrInsert, Remove): they descend to a node they then lock
//      and re-read, moving right under the lock (as after any stale descent), so a stale route
//      only costs them move-rights. Posting a separator (level >= 1) and growing the root read
//      the root word itself: the root-growth CAS must see the real root. A writer puts the
//      inner nodes it writes (splits, new roots) into its cache.
//  12. Scans read, in the round trip of their first leaf, the leaves that the cached parent of
//      that leaf names next in the scan's direction within [lo, hi] (at most
//      kMaxPrefetchLeaves). The scan still follows right links (forward) or re-descends
//      (reverse) exactly as without them, only taking a leaf's image from that round instead of
//      reading it: each image holds every key of its range at its read time, and the images
//      chain by right links whose lows never change, so the scan visits every key present
//      before it began, as before. ReadAhead reads such leaves for several scans in one round
//      trip before they start (Transaction::ScanMany); they then visit every key present
//      before that round.
//  13. Guesses. The cache also keeps the image of each leaf a scan or ReadAhead last read (at
//      most `cache_nodes` of them), never to route or to answer a scan: GuessValues reads off
//      them the values (record addresses) that ReadAhead's leaves are likely to hold, so that
//      a caller can read what they name in ReadAhead's own round trip. They are guesses: the
//      caller uses such a read only for an entry that the fresh images (the scan) hold with
//      that very value, and reads the others as it would have anyway.
// Memory: at most `cache_nodes` inner nodes (1 KiB each) per tree, a random one evicted when
// full, and as many leaf images (invariant 13; an arbitrary one evicted when full). The cache lives
// and dies with the BTree object; DropCache (a dropped table) and Destroy empty it and turn it off,
// so no cached node outlives the tree's nodes.
//
// REQUIRES: an owner holds at most one index lock at a time and is used by one thread at a
// time (the tree never nests node locks: it releases a child before locking its parent).
// Keys must be < INT64_MAX (the high key of the rightmost nodes).
//
// Thread-safety: safe for concurrent use from any number of threads, sessions and processes
// (the tree's state is in memory; the cache has a lock of its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>

#include "db/lock_owner.h"
#include "db/memory.h"

namespace farpool::db {

class BTree {
 public:
  static constexpr uint64_t kNodeSize = 1024;
  static constexpr int kMaxEntries = 61;
  // How long a writer waits for a node lock held by a live holder, or a reader for a node that
  // does not verify, before giving up. Callers whose lease judge death later than this should
  // pass a longer limit (more than the time HolderDead needs to declare a holder dead).
  static constexpr std::chrono::milliseconds kDefaultWaitLimit{10000};

  // Creates an empty tree: one leaf, written to *root_word. Nodes come from
  // owner.AllocObject (here and in splits), so that Destroy can free them from any process.
  static Status Create(const Access& access, LockOwner& owner, GlobalAddress root_word);

  // Inner nodes a tree's cache holds at most (4 MiB): the inner levels of a tree of some
  // 10 million entries.
  static constexpr size_t kDefaultCacheNodes = 4096;
  // Invariant 10: move-rights a descent through cached nodes may take before it reads the path
  // from the root word instead.
  static constexpr int kMaxCachedMoveRights = 4;
  // Invariant 12: leaves a scan reads in its first round besides the first one.
  static constexpr int kMaxPrefetchLeaves = 7;

  // `cache_nodes` 0: no inner-node cache (every descent reads the root word and each level).
  explicit BTree(GlobalAddress root_word, std::chrono::milliseconds wait_limit = kDefaultWaitLimit,
                 size_t cache_nodes = kDefaultCacheNodes);
  ~BTree();
  BTree(BTree&&) noexcept;
  BTree& operator=(BTree&&) = delete;

  // The value of `key`, or 0. `owner` is used only to repair a node left torn by a dead
  // holder (readers otherwise take no lock and write nothing).
  Result<uint64_t> Lookup(const Access& access, LockOwner& owner, int64_t key) const;
  // Inserts key -> value unless the key is present; returns the value now stored.
  // REQUIRES: owner.index_log() is not null.
  Result<uint64_t> GetOrInsert(const Access& access, LockOwner& owner, int64_t key,
                               uint64_t value) const;
  // Removes key -> value if present with that value (a deleted row whose record is being
  // freed). Leaves never merge: an emptied leaf keeps its key range.
  Status Remove(const Access& access, LockOwner& owner, int64_t key, uint64_t value) const;
  // Work of the caller's that shares the scan's first round trip (a transaction's snapshot):
  // `post` adds its operations to that round's batch, `finish` gets the batch's outcome (Wait's
  // status, or the error of posting the scan's reads) and returns what the scan should; an
  // error from `post` ends the scan at once (finish is not called). Both are called once if the
  // scan reads anything (it does unless lo > hi), neither otherwise. The scan's reads in that round
  // do not depend on the caller's operations, nor are they ordered after them.
  struct FirstRound {
    std::function<Status(Access::Batch& batch)> post;
    std::function<Status(const Status& waited)> finish;
  };
  // Leaf images read ahead (ReadAhead) for Scans given them: each is used at most once, instead
  // of a read of its node. Belongs to one thread.
  class LeafImages {
   public:
    LeafImages();
    ~LeafImages();
    LeafImages(LeafImages&&) noexcept;

   private:
    friend class BTree;
    struct Map;
    std::unique_ptr<Map> map_;
  };
  struct Range {
    int64_t lo, hi;
    bool reverse;
  };
  // Reads, in one round trip, the leaf the cache routes each range's first key to and the
  // leaves its cached parent names next within the range (invariant 12), into *ahead; `first`
  // rides in that round (made for it alone if the cache has no route for any range).
  Status ReadAhead(const Access& access, std::span<const Range> ranges, const FirstRound* first,
                   LeafImages* ahead) const;
  // Invariant 13: appends to *values the values of the entries in `range` (scan order, at most
  // `limit`) of the cached images of the leaves ReadAhead would read for it, as long as they
  // are cached, and their keys to *keys if it is not null. Reads nothing.
  void GuessValues(const Range& range, size_t limit, std::vector<uint64_t>* values,
                   std::vector<int64_t>* keys = nullptr) const;
  // Visits entries with lo <= key <= hi in order (descending if reverse) until `visit`
  // returns false. Entries inserted during the scan may or may not be visited; every entry
  // present before the scan began and not removed is. `owner` as for Lookup. `first`, if
  // not null, rides in the first round trip; `ahead`, if not null, holds leaf images read
  // ahead, taken instead of reads (and images the scan reads ahead go there).
  Status Scan(const Access& access, LockOwner& owner, int64_t lo, int64_t hi, bool reverse,
              const std::function<bool(int64_t key, uint64_t value)>& visit,
              const FirstRound* first = nullptr, LeafImages* ahead = nullptr) const;

  // Empties the inner-node cache and turns it off (the tree is being dropped: its nodes will
  // be freed). Descents read the root word from then on.
  void DropCache() const;
  // Inner nodes in the cache now (for tests and reports).
  size_t cached_nodes() const;

  // Frees every node reachable from the root word, level by level (owner.FreeObject), after
  // repairing any a dead holder left torn (so the walk can read it). Nodes that dead
  // splitters wrote but never linked (crash points of invariant 6) are not found (a leak).
  // Empties the cache first (DropCache).
  // REQUIRES: nobody uses the tree any more, nor will (a dropped table past its last
  // snapshot).
  Status Destroy(const Access& access, LockOwner& owner) const;

  // Bulk loading (btree_build.cc): replaces the empty tree at the root word (one empty leaf,
  // as Create leaves it) by one holding `entries`, built bottom-up: the leaves packed with
  // kBuildFill entries each in key order, then each inner level over the one below, every node
  // written whole (lock 0, checksum) in batches, and the root word CASed from the empty leaf
  // to the new root last, after which the empty leaf is freed. The result keeps every
  // invariant above (it is a tree that splits could have made). A failure before the root
  // word's CAS frees the nodes written and leaves the empty tree; a crash leaks them.
  // InvalidArgument if the keys are not strictly ascending, one is INT64_MAX, a value is 0, or
  // the tree is not empty.
  // REQUIRES: nobody else reads or writes the tree until this returns (a table not yet
  // published: NamDatabase's loader).
  static constexpr int kBuildFill = kMaxEntries - 5;  // room for a few inserts before a split
  Status BuildSorted(const Access& access, LockOwner& owner,
                     std::span<const std::pair<int64_t, uint64_t>> entries) const;

  // Checks the structure (sorted keys, key ranges, levels, every inner entry's key equal to
  // its child's low key) and returns the number of leaf entries. For tests; not safe against
  // concurrent writers; does not repair (run a Scan with an owner first after crashes).
  Result<uint64_t> CheckStructure(const Access& access) const;

  // Finishes the node write that a dead writer left in flight in index redo area `area` (the
  // entry's lock word names the writer; HolderDead is asked): if that node is still locked
  // by the writer, repairs it if torn and releases the lock. Every tree shares an owner's one
  // area, so this is not per tree. Call it
  //   - when an owner starts using an index_log() area that an earlier owner used (a session
  //     slot reused by a new epoch), before its first index write: otherwise its own entries
  //     would overwrite the one a node torn by the earlier owner needs;
  //   - optionally when recovering a dead owner (area = IndexLogOf(its word)), to free its
  //     index lock at once instead of when someone meets it.
  static Status RecoverRedo(const Access& access, LockOwner& owner, GlobalAddress area);

  class NodeCache;  // btree.cc

 private:
  // The leaves ReadAhead reads for `range`: the one the cache routes its first key to, and
  // those its cached parent names next within it (none without a route).
  std::vector<uint64_t> AheadLeaves(const Range& range) const;

  GlobalAddress root_word_;
  std::chrono::milliseconds wait_limit_;
  std::unique_ptr<NodeCache> cache_;
};

}  // namespace farpool::db
