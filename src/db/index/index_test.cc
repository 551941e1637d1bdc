// Index model tests: the hash index and the B+tree against std::map under concurrent random
// inserts (fuzz-style; FARPOOL_SEED replays). Holders never die here; index_fault_test.cc
// kills them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "db/index/btree.h"
#include "db/index/hash_index.h"
#include "db/index/index_test_util.h"
#include "db/layout.h"
#include "db/memory.h"

namespace farpool::db {
namespace {

// What most tests here run on: 2 local servers of `bytes` each, an Access of the test's own
// and a registry of lock owners on the same memory.
struct TestMemory {
  explicit TestMemory(std::unique_ptr<Memory> m)
      : memory(std::move(m)), access(*memory, count), owners(*memory) {}
  std::unique_ptr<Memory> memory;
  OpCount count;
  Access access;
  OwnerRegistry owners;
};

std::unique_ptr<TestMemory> NewTestMemory(uint64_t bytes) {
  auto m = NewLocalMemory(2, bytes);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::make_unique<TestMemory>(std::move(*m)) : nullptr;
}

// An empty B+tree whose root word is allocated through `access`.
Result<BTree> NewBTree(const Access& access, LockOwner& owner) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress root_word, access.Alloc(64));
  FARPOOL_RETURN_IF_ERROR(BTree::Create(access, owner, root_word));
  return BTree(root_word);
}

// BTree::BuildSorted: trees of every height (an empty input; one leaf; the boundaries where a
// level fills up) are well formed, hold exactly the input, scan it in order both ways, and
// take inserts afterwards (splits of the packed nodes) while staying well formed.
TEST(IndexTest, BuildSortedMakesAWellFormedTree) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto mem = NewTestMemory(256ull << 20);
  ASSERT_NE(mem, nullptr);
  const Access& access = mem->access;
  auto owner = mem->owners.NewOwner();
  ASSERT_TRUE(owner.ok());
  std::mt19937_64 rng(seed);
  const size_t fill = BTree::kBuildFill;
  for (size_t n :
       {size_t{0}, size_t{1}, fill, fill + 1, fill * fill, fill * fill + 1, size_t{20000}}) {
    SCOPED_TRACE("entries " + std::to_string(n));
    auto made = NewBTree(access, **owner);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    BTree& tree = *made;
    std::map<int64_t, uint64_t> model;
    while (model.size() < n) model.emplace(int64_t(rng() % 1000000) - 500000, rng() | 1);
    std::vector<std::pair<int64_t, uint64_t>> entries(model.begin(), model.end());
    Status built = tree.BuildSorted(access, **owner, entries);
    ASSERT_TRUE(built.ok()) << built.ToString();
    auto leaf_entries = tree.CheckStructure(access);
    ASSERT_TRUE(leaf_entries.ok()) << leaf_entries.status().ToString();
    EXPECT_EQ(*leaf_entries, n);
    for (const auto& [k, v] : model) {
      auto got = tree.Lookup(access, **owner, k);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(*got, v) << "key " << k;
    }
    for (bool reverse : {false, true}) {
      std::vector<std::pair<int64_t, uint64_t>> scanned;
      ASSERT_TRUE(tree.Scan(access, **owner, INT64_MIN, INT64_MAX - 1, reverse,
                            [&](int64_t k, uint64_t v) {
                              scanned.push_back({k, v});
                              return true;
                            })
                      .ok());
      if (reverse) std::reverse(scanned.begin(), scanned.end());
      EXPECT_EQ(scanned, entries);
    }
    // A built tree is no longer empty: a second build is refused.
    EXPECT_EQ(tree.BuildSorted(access, **owner, entries).code(),
              n == 0 ? StatusCode::kOk : StatusCode::kInvalidArgument);
    for (int i = 0; i < 2000; ++i) {
      const int64_t k = int64_t(rng() % 1000000) - 500000;
      auto got = tree.GetOrInsert(access, **owner, k, uint64_t(i) + 1);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      model.emplace(k, *got);
    }
    leaf_entries = tree.CheckStructure(access);
    ASSERT_TRUE(leaf_entries.ok()) << leaf_entries.status().ToString();
    EXPECT_EQ(*leaf_entries, model.size());
  }
}

TEST(IndexTest, BuildSortedRejectsBadInput) {
  auto mem = NewTestMemory(64ull << 20);
  ASSERT_NE(mem, nullptr);
  const Access& access = mem->access;
  auto owner = mem->owners.NewOwner();
  ASSERT_TRUE(owner.ok());
  auto made = NewBTree(access, **owner);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  BTree& tree = *made;
  using E = std::vector<std::pair<int64_t, uint64_t>>;
  EXPECT_EQ(tree.BuildSorted(access, **owner, E{{2, 1}, {1, 1}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tree.BuildSorted(access, **owner, E{{1, 1}, {1, 2}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tree.BuildSorted(access, **owner, E{{INT64_MAX, 1}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tree.BuildSorted(access, **owner, E{{1, 0}}).code(), StatusCode::kInvalidArgument);
  // Nothing was built: the tree is still empty and takes a valid build.
  auto empty = tree.CheckStructure(access);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, 0u);
  ASSERT_TRUE(tree.BuildSorted(access, **owner, E{{1, 1}, {2, 2}}).ok());
  auto two = tree.CheckStructure(access);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, 2u);
}

TEST(IndexTest, ConcurrentInsertsMatchModel) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto mem = NewTestMemory(256ull << 20);
  ASSERT_NE(mem, nullptr);
  const Access& access = mem->access;
  OwnerRegistry& owners = mem->owners;
  auto checker = owners.NewOwner();
  ASSERT_TRUE(checker.ok());
  auto buckets = HashIndex::Create(access, **checker, 64);  // small: forces overflow chains
  ASSERT_TRUE(buckets.ok());
  HashIndex hash(*buckets, 64, 12345);
  auto made = NewBTree(access, **checker);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  BTree& tree = *made;

  constexpr int kThreads = 4, kOps = 3000;
  std::mutex mu;
  std::map<int64_t, uint64_t> model;  // key -> value that won
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto o = owners.NewOwner();
      if (!o.ok()) {
        ++failures;
        return;
      }
      TestOwner& owner = **o;
      const Access& a = owner.access();
      std::mt19937_64 rng(seed + t);
      for (int i = 0; i < kOps; ++i) {
        // Overlapping key ranges: threads race to insert the same keys.
        const int64_t key = static_cast<int64_t>(rng() % 4000) - 2000;
        const uint64_t value = (uint64_t(t + 1) << 32) | (i + 1);
        const GlobalAddress fake = GlobalAddress(1, 4096 + 64 * ((value * 7) % 100000));
        auto h = hash.GetOrInsert(a, owner, key, fake);
        auto b = tree.GetOrInsert(a, owner, key, value);
        if (!h.ok() || !b.ok()) {
          ++failures;
          continue;
        }
        std::lock_guard<std::mutex> l(mu);
        auto [it, inserted] = model.emplace(key, b.value());
        if (!inserted && it->second != b.value()) ++failures;  // two winners for one key
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  // Every key is in both indexes exactly once; the tree is well formed and ordered.
  for (const auto& [k, v] : model) {
    auto h = hash.Lookup(access, k);
    ASSERT_TRUE(h.ok());
    EXPECT_FALSE(h->is_null()) << "key " << k;
    auto b = tree.Lookup(access, **checker, k);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, v) << "key " << k;
  }
  auto entries = tree.CheckStructure(access);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  EXPECT_EQ(*entries, model.size());
  std::vector<int64_t> scanned;
  ASSERT_TRUE(tree.Scan(access, **checker, -500, 500, false,
                        [&](int64_t k, uint64_t) {
                          scanned.push_back(k);
                          return true;
                        })
                  .ok());
  std::vector<int64_t> expect;
  for (auto it = model.lower_bound(-500); it != model.end() && it->first <= 500; ++it)
    expect.push_back(it->first);
  EXPECT_EQ(scanned, expect);
  scanned.clear();
  ASSERT_TRUE(tree.Scan(access, **checker, -500, 500, true,
                        [&](int64_t k, uint64_t) {
                          scanned.push_back(k);
                          return true;
                        })
                  .ok());
  std::reverse(expect.begin(), expect.end());
  EXPECT_EQ(scanned, expect);
  int64_t missing = 999999;
  auto h = hash.Lookup(access, missing);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->is_null());
}

// Removal (deleted rows whose records are freed): removed keys miss in both indexes, the
// others are untouched, removed slots are reused by later inserts, and a removal that names
// another value removes nothing.
TEST(IndexTest, RemovedKeysMissAndTheirSlotsAreReused) {
  auto mem = NewTestMemory(64ull << 20);
  ASSERT_NE(mem, nullptr);
  const Access& access = mem->access;
  auto o = mem->owners.NewOwner();
  ASSERT_TRUE(o.ok());
  TestOwner& owner = **o;
  auto buckets = HashIndex::Create(access, owner, 8);  // small: entries live in overflow chains
  ASSERT_TRUE(buckets.ok());
  HashIndex hash(*buckets, 8, 777);
  auto made = NewBTree(access, owner);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  BTree& tree = *made;
  constexpr int64_t kKeys = 500;
  auto value = [](int64_t k, int gen) { return GlobalAddress(1, 4096 + 64 * (k + 1000 * gen)); };
  for (int64_t k = 0; k < kKeys; ++k) {
    ASSERT_TRUE(hash.GetOrInsert(access, owner, k, value(k, 0)).ok());
    ASSERT_TRUE(tree.GetOrInsert(access, owner, k, value(k, 0).raw()).ok());
  }
  for (int64_t k = 0; k < kKeys; k += 2) {
    ASSERT_TRUE(hash.Remove(access, owner, k, value(k, 0)).ok());
    ASSERT_TRUE(tree.Remove(access, owner, k, value(k, 0).raw()).ok());
  }
  // A stale removal (another value) changes nothing.
  ASSERT_TRUE(hash.Remove(access, owner, 1, value(1, 7)).ok());
  ASSERT_TRUE(tree.Remove(access, owner, 1, value(1, 7).raw()).ok());
  for (int64_t k = 0; k < kKeys; ++k) {
    auto h = hash.Lookup(access, k);
    auto t = tree.Lookup(access, owner, k);
    ASSERT_TRUE(h.ok() && t.ok());
    EXPECT_EQ(h->is_null(), k % 2 == 0) << k;
    EXPECT_EQ(*t == 0, k % 2 == 0) << k;
  }
  auto entries = tree.CheckStructure(access);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  EXPECT_EQ(*entries, uint64_t(kKeys / 2));
  // Re-inserting works (into the freed slots) and every key has exactly one entry again.
  uint64_t hash_entries = 0;
  for (int64_t k = 0; k < kKeys; k += 2) {
    auto h = hash.GetOrInsert(access, owner, k, value(k, 1));
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(*h, value(k, 1));
    ASSERT_TRUE(tree.GetOrInsert(access, owner, k, value(k, 1).raw()).ok());
  }
  ASSERT_TRUE(hash.ForEach(access,
                           [&](int64_t, GlobalAddress) {
                             ++hash_entries;
                             return Status::Ok();
                           })
                  .ok());
  EXPECT_EQ(hash_entries, uint64_t(kKeys));
  entries = tree.CheckStructure(access);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, uint64_t(kKeys));
}

// The inner-node cache (btree.h, invariants 9-12). Two BTree objects on one tree have caches
// of their own, as two processes do: a writer splits leaves and inner nodes and grows the root
// while a reader looks keys up and scans through its cache, which goes stale under it. Every
// key inserted before a lookup or scan began is found by it, with its value, in order; once
// the tree is quiet and the reader's cache refreshed, a descent reads one node (the leaf) and a
// scan of a few leaves under one parent takes one round trip.
TEST(IndexTest, StaleInnerNodeCacheFindsEveryKeyWhileAnotherSplitsAndGrows) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto mem = NewLocalMemory(2, 256ull << 20);
  ASSERT_TRUE(mem.ok());
  OwnerRegistry owners(**mem);
  auto w = owners.NewOwner();
  auto r = owners.NewOwner();
  ASSERT_TRUE(w.ok() && r.ok());
  TestOwner& writer = **w;
  TestOwner& reader = **r;
  const Access& wa = writer.access();
  OpCount reader_count;
  Access ra(**mem, reader_count);
  auto root_word = wa.Alloc(64);
  ASSERT_TRUE(root_word.ok());
  ASSERT_TRUE(BTree::Create(wa, writer, *root_word).ok());
  BTree wtree(*root_word), rtree(*root_word);
  auto value = [](int64_t k) { return uint64_t(k) * 2 + 1; };
  std::mutex mu;
  std::vector<int64_t> inserted;  // confirmed inserts, in order
  auto insert = [&](int64_t k) -> Status {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t v, wtree.GetOrInsert(wa, writer, k, value(k)));
    if (v != value(k)) return Status::Internal("key " + std::to_string(k) + " has another value");
    std::lock_guard<std::mutex> l(mu);
    inserted.push_back(k);
    return Status::Ok();
  };
  // Two levels (a root over ~10 leaves); the reader's cache holds that root.
  for (int64_t k = 0; k < 300; ++k) ASSERT_TRUE(insert(k * 1000).ok());
  auto rts = [&] { return reader_count.round_trips.load(); };
  auto full_scan = [&](bool reverse, std::vector<int64_t>* keys) {
    return rtree.Scan(ra, reader, INT64_MIN, INT64_MAX - 1, reverse, [&](int64_t k, uint64_t v) {
      if (v != value(k)) keys->push_back(INT64_MIN);  // a wrong value fails the comparison
      keys->push_back(k);
      return true;
    });
  };
  std::vector<int64_t> keys;
  ASSERT_TRUE(full_scan(false, &keys).ok());
  ASSERT_EQ(keys.size(), 300u);
  EXPECT_GT(rtree.cached_nodes(), 0u);
  uint64_t before = rts();
  auto found = rtree.Lookup(ra, reader, 150'000);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, value(150'000));
  EXPECT_EQ(rts() - before, 1u) << "a warm descent reads the leaf only";
  BTree cold(*root_word, BTree::kDefaultWaitLimit, 0);
  before = rts();
  ASSERT_TRUE(cold.Lookup(ra, reader, 150'000).ok());
  EXPECT_EQ(rts() - before, 3u) << "without a cache: root word, root, leaf";

  // The writer: random keys all over the range (splits everywhere, the root grows); the reader
  // checks what was confirmed before each of its calls began.
  std::atomic<bool> done{false};
  Status wrote;
  std::thread wt([&] {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 8000 && wrote.ok(); ++i) wrote = insert(int64_t(rng() % 300'000) + 1);
    done = true;
  });
  std::mt19937_64 rng(seed + 1);
  int checks = 0;
  auto check = [&] {
    std::vector<int64_t> expect;
    {
      std::lock_guard<std::mutex> l(mu);
      expect = inserted;
    }
    std::sort(expect.begin(), expect.end());
    expect.erase(std::unique(expect.begin(), expect.end()), expect.end());
    for (int i = 0; i < 20; ++i) {
      const int64_t k = expect[rng() % expect.size()];
      auto v = rtree.Lookup(ra, reader, k);
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      ASSERT_EQ(*v, value(k)) << "key " << k;
    }
    const int64_t lo = int64_t(rng() % 300'000), hi = lo + int64_t(rng() % 30'000);
    for (bool reverse : {false, true}) {
      std::vector<int64_t> got, want;
      ASSERT_TRUE(rtree
                      .Scan(ra, reader, lo, hi, reverse,
                            [&](int64_t k, uint64_t v) {
                              got.push_back(v == value(k) ? k : INT64_MIN);
                              return true;
                            })
                      .ok());
      // Keys inserted during the scan may be visited too: every expected one must be, in
      // order, and nothing else but keys in the range.
      for (size_t i = 1; i < got.size(); ++i) {
        ASSERT_TRUE(reverse ? got[i - 1] > got[i] : got[i - 1] < got[i]) << "order, " << lo;
      }
      std::set<int64_t> seen(got.begin(), got.end());
      for (int64_t k : expect) {
        if (k >= lo && k <= hi) {
          ASSERT_TRUE(seen.count(k)) << "key " << k << " missed";
        }
      }
      for (int64_t k : got) ASSERT_TRUE(k >= lo && k <= hi) << "key " << k;
    }
  };
  while (!done || checks < 5) {
    check();
    if (::testing::Test::HasFatalFailure()) break;
    ++checks;
  }
  wt.join();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_TRUE(wrote.ok()) << wrote.ToString();
  // Quiet now: a full pass refreshes what the splits made stale; after another, every descent
  // reads one node.
  std::vector<int64_t> all;
  {
    std::lock_guard<std::mutex> l(mu);
    all = inserted;
  }
  for (int pass = 0; pass < 3; ++pass) {
    before = rts();
    for (int64_t k : all) {
      auto v = rtree.Lookup(ra, reader, k);
      ASSERT_TRUE(v.ok());
      ASSERT_EQ(*v, value(k));
    }
    if (pass == 2) {
      EXPECT_EQ(rts() - before, all.size());
    }
  }
  auto entries = wtree.CheckStructure(wa);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  keys.clear();
  ASSERT_TRUE(full_scan(true, &keys).ok());
  EXPECT_EQ(keys.size(), *entries);
  // A scan of a few leaves under one parent: one round trip, either way.
  before = rts();
  keys.clear();
  ASSERT_TRUE(rtree
                  .Scan(ra, reader, 0, 6000, false,
                        [&](int64_t k, uint64_t) {
                          keys.push_back(k);
                          return true;
                        })
                  .ok());
  const uint64_t forward = rts() - before;
  before = rts();
  ASSERT_TRUE(rtree.Scan(ra, reader, 0, 6000, true, [](int64_t, uint64_t) { return true; }).ok());
  const uint64_t reverse = rts() - before;
  EXPECT_GT(keys.size(), size_t(BTree::kMaxEntries)) << "the range spans several leaves";
  EXPECT_EQ(forward, 1u);
  EXPECT_EQ(reverse, 1u);
}

// Destroy (a dropped table's indexes) frees every object the indexes allocated: the bucket
// array, overflow buckets, and every B+tree node of every level after splits and root growth.
TEST(IndexTest, DestroyFreesEverythingTheIndexesAllocated) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto mem = NewLocalMemory(2, 64ull << 20);
  ASSERT_TRUE(mem.ok());
  KillableMemory counted(**mem);  // never killed: counts what is allocated through it
  OwnerRegistry owners(counted);
  auto o = owners.NewOwner();
  ASSERT_TRUE(o.ok());
  TestOwner& owner = **o;
  const Access& access = owner.access();
  auto root_word = (*mem)->Alloc(64, Placement::Striped());  // the table descriptor's word
  ASSERT_TRUE(root_word.ok());
  const int64_t before = counted.live_objects();
  auto buckets = HashIndex::Create(access, owner, 8);
  ASSERT_TRUE(buckets.ok());
  HashIndex hash(*buckets, 8, 99);
  ASSERT_TRUE(BTree::Create(access, owner, *root_word).ok());
  BTree tree(*root_word);
  std::mt19937_64 rng(seed);
  constexpr int kKeys = 5000;  // ~120 leaves: two levels of inner nodes
  for (int i = 0; i < kKeys; ++i) {
    const int64_t key = static_cast<int64_t>(rng() >> 4);
    const GlobalAddress value(1, 4096 + 64 * i);
    ASSERT_TRUE(hash.GetOrInsert(access, owner, key, value).ok());
    ASSERT_TRUE(tree.GetOrInsert(access, owner, key, value.raw()).ok());
  }
  // 8 head buckets hold 56 entries: the rest live in overflow buckets.
  EXPECT_GT(counted.live_objects() - before, (kKeys - 56) / HashIndex::kEntries);
  ASSERT_TRUE(tree.Destroy(access, owner).ok());
  ASSERT_TRUE(hash.Destroy(access, owner).ok());
  EXPECT_EQ(counted.live_objects(), before) << "objects of the indexes left allocated";
}

}  // namespace
}  // namespace farpool::db
