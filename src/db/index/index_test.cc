// Index model tests: the hash index and the B+tree against std::map under concurrent random
// inserts (fuzz-style; FARPOOL_SEED replays). Holders never die here; index_fault_test.cc
// kills them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "db/index/btree.h"
#include "db/index/hash_index.h"
#include "db/index/index_test_util.h"
#include "db/layout.h"
#include "db/memory.h"

namespace farpool::db {
namespace {

TEST(IndexTest, ConcurrentInsertsMatchModel) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto mem = NewLocalMemory(2, 256ull << 20);
  ASSERT_TRUE(mem.ok());
  OpCount count;
  Access access(**mem, count);
  auto buckets = HashIndex::Create(access, 64);  // small: forces overflow chains
  ASSERT_TRUE(buckets.ok());
  HashIndex hash(*buckets, 64, 12345);
  auto root_word = access.Alloc(64);
  ASSERT_TRUE(root_word.ok());
  ASSERT_TRUE(BTree::Create(access, *root_word).ok());
  BTree tree(*root_word);
  OwnerRegistry owners(**mem);
  auto checker = owners.NewOwner();
  ASSERT_TRUE(checker.ok());

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

}  // namespace
}  // namespace farpool::db
