// The transactional table against std::map models under random puts, deletes, gets and scans
// on every engine, and the local memory's address checks. (The index model tests, which need
// no engine, are in index/index_test.cc.)
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "db/db_test_util.h"
#include "db/memory.h"

namespace farpool::db {
namespace {

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
