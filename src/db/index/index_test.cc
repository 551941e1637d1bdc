// Index model tests: the hash index and the B+tree against std::map under concurrent random
// inserts (fuzz-style; FARPOOL_SEED replays), and the transactional table against a std::map
// under random puts, deletes, gets and scans.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "db/db_test_util.h"
#include "db/index/btree.h"
#include "db/index/hash_index.h"
#include "db/layout.h"
#include "db/memory.h"

namespace farpool::db {
namespace {

// A lock owner for index tests: slot = thread number, holders never die.
class TestOwner : public LockOwner {
 public:
  explicit TestOwner(uint32_t slot) : slot_(slot) {}
  uint64_t lock_word() const override { return LockWord(slot_, 1); }
  Result<bool> HolderDead(uint64_t) override { return false; }
  Status CheckLease() override { return Status::Ok(); }
  GlobalAddress index_log() const override { return GlobalAddress(); }
  Result<GlobalAddress> IndexLogOf(uint64_t) override { return GlobalAddress(); }

 private:
  uint32_t slot_;
};

TEST(IndexTest, ConcurrentInsertsMatchModel) {
  const uint64_t seed = TestSeed();
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

  constexpr int kThreads = 4, kOps = 3000;
  std::mutex mu;
  std::map<int64_t, uint64_t> model;  // key -> value that won
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      OpCount c;
      Access a(**mem, c);
      TestOwner owner(t + 1);
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
    auto b = tree.Lookup(access, k);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, v) << "key " << k;
  }
  auto entries = tree.CheckStructure(access);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  EXPECT_EQ(*entries, model.size());
  std::vector<int64_t> scanned;
  ASSERT_TRUE(tree.Scan(access, -500, 500, false,
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
  ASSERT_TRUE(tree.Scan(access, -500, 500, true,
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

class TableModelTest : public testing::TestWithParam<std::string> {};

TEST_P(TableModelTest, RandomOperationsMatchModel) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto t = TestDatabase::Start(GetParam());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Database& db = (*t)->db();
  Schema schema{{"v", ColumnType::kInt64}, {"b", ColumnType::kBytes}};
  auto table = db.CreateTable("m", schema, TableOptions{true, 64});
  ASSERT_TRUE(table.ok());
  // Threads own disjoint key residues (so each has an exact model) but share the table, its
  // buckets and its B+tree leaves.
  constexpr int kThreads = 3;
  std::vector<std::map<int64_t, int64_t>> models(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      auto session = db.NewSession();
      if (!session.ok()) {
        ++failures;
        return;
      }
      std::mt19937_64 rng(seed * 7 + th);
      auto& model = models[th];
      for (int i = 0; i < 600; ++i) {
        const int64_t key = static_cast<int64_t>((rng() % 300) * kThreads + th);
        const int op = rng() % 4;
        Status s = RunTransaction(**session, [&](Transaction& txn) -> Status {
          Row r(schema);
          if (op == 0 || op == 1) {
            r.SetInt64(0, i);
            r.SetBytes(1, std::string(i % 50, 'a' + th));
            return txn.Put(**table, key, r);
          }
          if (op == 2) {
            Status d = txn.Delete(**table, key);
            return d.code() == StatusCode::kNotFound ? Status::Ok() : d;
          }
          Status g = txn.Get(**table, key, &r);
          auto it = model.find(key);
          if (g.code() == StatusCode::kNotFound) {
            return it == model.end() ? Status::Ok()
                                     : Status::Internal("lost key " + std::to_string(key));
          }
          FARPOOL_RETURN_IF_ERROR(g);
          if (it == model.end() || it->second != r.GetInt64(0) ||
              r.GetBytes(1) != std::string(it->second % 50, 'a' + th)) {
            return Status::Internal("wrong value for key " + std::to_string(key));
          }
          return Status::Ok();
        });
        if (!s.ok()) {
          ADD_FAILURE() << s.ToString();
          ++failures;
          return;
        }
        if (op <= 1) model[key] = i;
        if (op == 2) model.erase(key);
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  std::map<int64_t, int64_t> all;
  for (auto& m : models) all.insert(m.begin(), m.end());
  auto session = db.NewSession();
  ASSERT_TRUE(session.ok());
  std::map<int64_t, int64_t> scanned;
  ASSERT_TRUE(RunTransaction(**session, [&](Transaction& txn) {
                scanned.clear();
                return txn.Scan(**table, INT64_MIN, INT64_MAX - 1, 0, false,
                                [&](int64_t k, const Row& r) {
                                  scanned[k] = r.GetInt64(0);
                                  return true;
                                });
              }).ok());
  EXPECT_EQ(scanned, all);
}

INSTANTIATE_TEST_SUITE_P(Engines, TableModelTest, testing::Values("local", "pool", "sharded"));

TEST(MemoryTest, LocalMemoryRejectsBadAddresses) {
  auto mem = NewLocalMemory(2, 1 << 20);
  ASSERT_TRUE(mem.ok());
  OpCount c;
  Access a(**mem, c);
  uint64_t v = 0;
  EXPECT_EQ(a.Read(GlobalAddress(), &v, 8).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Read(GlobalAddress(7, 4096), &v, 8).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Read(GlobalAddress(1, (1 << 20) - 4), &v, 8).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Cas(GlobalAddress(1, 4100), 0, 1).status().code(), StatusCode::kInvalidArgument);
  auto obj = a.Alloc(100);
  ASSERT_TRUE(obj.ok());
  EXPECT_EQ(*a.Faa(*obj, 5), 0u);  // fresh local memory is zero
  EXPECT_EQ(*a.Cas(*obj, 5, 9), 5u);
  Access::Batch b(a);
  uint64_t prev = 0, out = 0;
  ASSERT_TRUE(b.Faa(*obj, 1, &prev).ok());
  ASSERT_TRUE(b.Read(*obj, &out, 8).ok());
  ASSERT_TRUE(b.Wait().ok());
  EXPECT_EQ(prev, 9u);
  EXPECT_EQ(c.faa, 2u);
  EXPECT_TRUE(a.Free(*obj).ok());
  EXPECT_EQ(a.Free(*obj).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace farpool::db
