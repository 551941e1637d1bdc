// Transaction semantics on every engine: CRUD, snapshots, first-committer-wins, write skew,
// no lost update, the bank invariant, old versions through the chain, ordered scans.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "db/db_test_util.h"
#include "farpool/db.h"

namespace farpool::db {
namespace {

std::string ParamName(const testing::TestParamInfo<std::string>& p) { return p.param; }

class TxnTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto t = TestDatabase::Start(GetParam());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    t_ = std::move(*t);
  }
  Database& db() { return t_->db(); }
  std::unique_ptr<Session> NewSession() {
    auto s = db().NewSession();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  const Table* MakeTable(const std::string& name, const Schema& schema, bool ordered = false,
                         uint64_t rows = 1024) {
    auto t = db().CreateTable(name, schema, TableOptions{ordered, rows});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? *t : nullptr;
  }
  std::unique_ptr<TestDatabase> t_;
};

std::unique_ptr<Transaction> BeginTxn(Session& s) {
  auto t = s.Begin();
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

const Schema& IntSchema() {
  static const Schema s{{"v", ColumnType::kInt64}};
  return s;
}

TEST_P(TxnTest, CrudAndTypes) {
  Schema schema{{"id", ColumnType::kInt64},
                {"score", ColumnType::kDouble},
                {"name", ColumnType::kChar, 10},
                {"blob", ColumnType::kBytes}};
  const Table* t = MakeTable("people", schema);
  ASSERT_NE(t, nullptr);
  auto s = NewSession();
  ASSERT_OK(RunTransaction(*s, [&](Transaction& txn) {
    Row r(t->schema());
    r.SetInt64(0, 7);
    r.SetDouble(1, 2.5);
    r.SetChar(2, "alice-is-a-long-name");
    r.SetBytes(3, std::string(3000, 'x'));
    return txn.Put(*t, 7, r);
  }));
  auto txn = BeginTxn(*s);
  Row r;
  ASSERT_OK(txn->Get(*t, 7, &r));
  EXPECT_EQ(r.GetInt64(0), 7);
  EXPECT_EQ(r.GetDouble(1), 2.5);
  EXPECT_EQ(r.GetChar(2), "alice-is-a");
  EXPECT_EQ(r.GetBytes(3), std::string(3000, 'x'));
  EXPECT_EQ(txn->Get(*t, 8, &r).code(), StatusCode::kNotFound);
  ASSERT_OK(txn->Commit());

  ASSERT_OK(RunTransaction(*s, [&](Transaction& txn) { return txn.Delete(*t, 7); }));
  txn = BeginTxn(*s);
  EXPECT_EQ(txn->Get(*t, 7, &r).code(), StatusCode::kNotFound);
  EXPECT_EQ(txn->Delete(*t, 7).code(), StatusCode::kNotFound);
  ASSERT_OK(txn->Commit());
  // Re-insert after delete.
  ASSERT_OK(RunTransaction(*s, [&](Transaction& txn) {
    Row r2(t->schema());
    r2.SetInt64(0, 9);
    return txn.Put(*t, 7, r2);
  }));
  txn = BeginTxn(*s);
  ASSERT_OK(txn->Get(*t, 7, &r));
  EXPECT_EQ(r.GetInt64(0), 9);
  EXPECT_EQ(r.GetBytes(3), "");

  // Catalog: another lookup path, duplicate names, drop.
  auto names = db().ListTables();
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"people"});
  EXPECT_EQ(db().CreateTable("people", schema).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(db().OpenTable("nope").status().code(), StatusCode::kNotFound);
  ASSERT_OK(db().DropTable("people"));
  EXPECT_EQ(db().OpenTable("people").status().code(), StatusCode::kNotFound);
}

TEST_P(TxnTest, SnapshotDoesNotSeeLaterCommits) {
  const Table* t = MakeTable("t", IntSchema());
  auto s1 = NewSession(), s2 = NewSession();
  ASSERT_OK(RunTransaction(*s1, [&](Transaction& txn) { return PutInt(txn, *t, 1, 100); }));
  auto reader = BeginTxn(*s1);
  ASSERT_EQ(*GetInt(*reader, *t, 1), 100);
  ASSERT_OK(RunTransaction(*s2, [&](Transaction& txn) {
    FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, 1, 200));
    return PutInt(txn, *t, 2, 5);
  }));
  EXPECT_EQ(*GetInt(*reader, *t, 1), 100);
  EXPECT_EQ(GetInt(*reader, *t, 2).status().code(), StatusCode::kNotFound);
  ASSERT_OK(reader->Commit());
  auto later = BeginTxn(*s1);
  EXPECT_EQ(*GetInt(*later, *t, 1), 200);
  EXPECT_EQ(*GetInt(*later, *t, 2), 5);
}

TEST_P(TxnTest, OldSnapshotReadsThroughVersionChain) {
  const Table* t = MakeTable("t", IntSchema());
  auto s1 = NewSession(), s2 = NewSession();
  ASSERT_OK(RunTransaction(*s1, [&](Transaction& txn) { return PutInt(txn, *t, 1, 0); }));
  auto reader = BeginTxn(*s1);
  for (int i = 1; i <= 20; ++i) {
    ASSERT_OK(RunTransaction(*s2, [&](Transaction& txn) { return PutInt(txn, *t, 1, i); }));
  }
  EXPECT_EQ(*GetInt(*reader, *t, 1), 0);  // 20 versions later, from the chain
  auto now = BeginTxn(*s2);
  EXPECT_EQ(*GetInt(*now, *t, 1), 20);
}

TEST_P(TxnTest, FirstCommitterWins) {
  const Table* t = MakeTable("t", IntSchema());
  auto s1 = NewSession(), s2 = NewSession();
  ASSERT_OK(RunTransaction(*s1, [&](Transaction& txn) { return PutInt(txn, *t, 1, 10); }));
  auto a = BeginTxn(*s1);
  auto b = BeginTxn(*s2);
  ASSERT_EQ(*GetInt(*a, *t, 1), 10);
  ASSERT_EQ(*GetInt(*b, *t, 1), 10);
  ASSERT_OK(PutInt(*a, *t, 1, 11));
  ASSERT_OK(PutInt(*b, *t, 1, 12));
  ASSERT_OK(a->Commit());
  Status sb = b->Commit();
  EXPECT_EQ(sb.code(), StatusCode::kAborted) << sb.ToString();
  // A blind write that started before the first commit also loses.
  auto c = BeginTxn(*s2);
  auto d = BeginTxn(*s1);
  ASSERT_OK(PutInt(*d, *t, 1, 13));
  ASSERT_OK(d->Commit());
  ASSERT_OK(PutInt(*c, *t, 1, 14));
  EXPECT_EQ(c->Commit().code(), StatusCode::kAborted);
  auto e = BeginTxn(*s1);
  EXPECT_EQ(*GetInt(*e, *t, 1), 13);
  // Two concurrent inserts of a new key: one wins.
  auto f = BeginTxn(*s1);
  auto g = BeginTxn(*s2);
  ASSERT_OK(PutInt(*f, *t, 99, 1));
  ASSERT_OK(PutInt(*g, *t, 99, 2));
  ASSERT_OK(f->Commit());
  EXPECT_EQ(g->Commit().code(), StatusCode::kAborted);
}

// Snapshot isolation allows write skew: two transactions each check x + y >= 100 and each
// withdraw 100 from a different one; both commit and the constraint breaks. This documents it.
TEST_P(TxnTest, WriteSkewIsAllowedUnderSnapshotIsolation) {
  const Table* t = MakeTable("t", IntSchema());
  auto s1 = NewSession(), s2 = NewSession();
  ASSERT_OK(RunTransaction(*s1, [&](Transaction& txn) {
    FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, 1, 60));
    return PutInt(txn, *t, 2, 60);
  }));
  auto a = BeginTxn(*s1);
  auto b = BeginTxn(*s2);
  for (auto* txn : {a.get(), b.get()}) {
    ASSERT_GE(*GetInt(*txn, *t, 1) + *GetInt(*txn, *t, 2), 100);
  }
  ASSERT_OK(PutInt(*a, *t, 1, 60 - 100));
  ASSERT_OK(PutInt(*b, *t, 2, 60 - 100));
  ASSERT_OK(a->Commit());
  ASSERT_OK(b->Commit());  // no write-write conflict: SI commits both
  auto c = BeginTxn(*s1);
  EXPECT_EQ(*GetInt(*c, *t, 1) + *GetInt(*c, *t, 2), -80);
}

TEST_P(TxnTest, NoLostUpdate) {
  const Table* t = MakeTable("t", IntSchema());
  {
    auto s = NewSession();
    ASSERT_OK(RunTransaction(*s, [&](Transaction& txn) { return PutInt(txn, *t, 1, 0); }));
  }
  constexpr int kThreads = 4, kIncrements = 300;
  std::atomic<int64_t> committed{0};
  std::atomic<uint64_t> aborts{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      auto s = NewSession();
      for (int j = 0; j < kIncrements; ++j) {
        Status st = RunTransaction(*s, [&](Transaction& txn) -> Status {
          FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, *t, 1));
          return PutInt(txn, *t, 1, v + 1);
        });
        if (st.ok())
          ++committed;
        else
          ADD_FAILURE() << st.ToString();
      }
      aborts += s->counters().aborts;
    });
  }
  for (auto& th : threads) th.join();
  auto s = NewSession();
  auto txn = BeginTxn(*s);
  EXPECT_EQ(*GetInt(*txn, *t, 1), committed.load());
  EXPECT_EQ(committed.load(), kThreads * kIncrements);
  RecordProperty("aborts", static_cast<int>(aborts.load()));
}

TEST_P(TxnTest, BankInvariantWithConcurrentTransfersAndSnapshots) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  constexpr int kAccounts = 32, kThreads = 3, kTransfers = 400;
  constexpr int64_t kInitial = 1000;
  const Table* t = MakeTable("accounts", IntSchema());
  {
    auto s = NewSession();
    ASSERT_OK(RunTransaction(*s, [&](Transaction& txn) -> Status {
      for (int a = 0; a < kAccounts; ++a) FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, a, kInitial));
      return Status::Ok();
    }));
  }
  std::atomic<bool> done{false};
  std::atomic<int> bad_sums{0}, snapshots{0};
  std::thread auditor([&] {
    auto s = NewSession();
    while (!done) {
      Status st = RunTransaction(*s, [&](Transaction& txn) -> Status {
        int64_t sum = 0;
        for (int a = 0; a < kAccounts; ++a) {
          FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, *t, a));
          sum += v;
        }
        if (sum != kAccounts * kInitial) ++bad_sums;
        return Status::Ok();
      });
      if (!st.ok()) ADD_FAILURE() << st.ToString();
      ++snapshots;
    }
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(seed + i);
      auto s = NewSession();
      for (int j = 0; j < kTransfers; ++j) {
        const int from = rng() % kAccounts, to = rng() % kAccounts;
        const int64_t amount = rng() % 50;
        const bool voluntary_abort = rng() % 10 == 0;
        Status st = RunTransaction(*s, [&](Transaction& txn) -> Status {
          FARPOOL_ASSIGN_OR_RETURN(int64_t a, GetInt(txn, *t, from));
          FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, from, a - amount));
          FARPOOL_ASSIGN_OR_RETURN(int64_t b, GetInt(txn, *t, to));
          FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, to, b + amount));
          if (voluntary_abort) return Status::InvalidArgument("changed my mind");
          return Status::Ok();
        });
        if (!st.ok() && !(voluntary_abort && st.code() == StatusCode::kInvalidArgument)) {
          ADD_FAILURE() << st.ToString();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  auditor.join();
  EXPECT_EQ(bad_sums.load(), 0) << "of " << snapshots.load() << " snapshots";
  auto s = NewSession();
  auto txn = BeginTxn(*s);
  int64_t sum = 0;
  for (int a = 0; a < kAccounts; ++a) sum += *GetInt(*txn, *t, a);
  EXPECT_EQ(sum, kAccounts * kInitial);
  EXPECT_EQ(*db().CountLocked(*t), 0u);
}

TEST_P(TxnTest, OrderedScans) {
  const Table* t = MakeTable("msgs", IntSchema(), /*ordered=*/true);
  auto s = NewSession();
  // 500 keys in a few transactions: several B+tree levels of leaves.
  for (int base = 0; base < 500; base += 100) {
    ASSERT_OK(RunTransaction(*s, [&](Transaction& txn) -> Status {
      for (int k = base; k < base + 100; ++k) FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, k * 2, k));
      return Status::Ok();
    }));
  }
  ASSERT_OK(RunTransaction(*s, [&](Transaction& txn) { return txn.Delete(*t, 20); }));
  auto txn = BeginTxn(*s);
  std::vector<int64_t> keys;
  ASSERT_OK(txn->Scan(*t, 10, 30, 0, false, [&](int64_t k, const Row&) {
    keys.push_back(k);
    return true;
  }));
  EXPECT_EQ(keys, (std::vector<int64_t>{10, 12, 14, 16, 18, 22, 24, 26, 28, 30}));
  keys.clear();
  // "The last 5": reverse with a limit.
  ASSERT_OK(txn->Scan(*t, 0, INT64_MAX - 1, 5, true, [&](int64_t k, const Row& r) {
    EXPECT_EQ(r.GetInt64(0), k / 2);
    keys.push_back(k);
    return true;
  }));
  EXPECT_EQ(keys, (std::vector<int64_t>{998, 996, 994, 992, 990}));
  keys.clear();
  ASSERT_OK(txn->Scan(*t, INT64_MIN, INT64_MAX - 1, 0, false, [&](int64_t k, const Row&) {
    keys.push_back(k);
    return true;
  }));
  EXPECT_EQ(keys.size(), 499u);
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
}

INSTANTIATE_TEST_SUITE_P(Engines, TxnTest, testing::Values("local", "pool", "sharded"), ParamName);

}  // namespace
}  // namespace farpool::db
