// Garbage collection of the NAM engines, checked by its effects: versions nobody can see are
// dropped instead of spilled, a long-running reader keeps exactly what it sees, cut chains and
// deleted records are freed and their memory reused, a dropped table is reclaimed, and data
// stays right throughout (every key reads back its last committed value).
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>

#include "db/db_test_util.h"
#include "db/testing_hooks.h"
#include "farpool/cluster.h"
#include "farpool/db.h"
#include "farpool/pool.h"

namespace farpool::db {
namespace {

const Schema& BlobSchema() {
  static const Schema s{{"v", ColumnType::kInt64}, {"note", ColumnType::kBytes}};
  return s;
}

Status PutRow(Session& s, const Table& t, int64_t key, int64_t v) {
  return RunTransaction(s, [&](Transaction& txn) {
    Row r(t.schema());
    r.SetInt64(0, v);
    r.SetBytes(1, std::string(100 + v % 50, char('a' + v % 26)));  // a blob per version
    return txn.Put(t, key, r);
  });
}

Result<int64_t> GetRow(Transaction& txn, const Table& t, int64_t key) {
  Row r;
  FARPOOL_RETURN_IF_ERROR(txn.Get(t, key, &r));
  if (r.GetBytes(1) != std::string(100 + r.GetInt64(0) % 50, char('a' + r.GetInt64(0) % 26))) {
    return Status::Internal("blob of key " + std::to_string(key) + " does not match its value");
  }
  return r.GetInt64(0);
}

class GcTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto t = TestDatabase::Start(GetParam());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    t_ = std::move(*t);
  }
  Database& db() { return t_->db(); }
  std::unique_ptr<TestDatabase> t_;
};

TEST_P(GcTest, VersionsNobodySeesAreDroppedNotSpilled) {
  auto table = db().CreateTable("t", BlobSchema());
  ASSERT_TRUE(table.ok());
  auto s = db().NewSession();
  ASSERT_TRUE(s.ok());
  for (int v = 0; v < 1000; ++v) ASSERT_OK(PutRow(**s, **table, 7, v));
  auto g = db().CollectGarbage();
  ASSERT_TRUE(g.ok());
  // 1000 versions: the first 3 evict nothing, the other 997 each evict one that no snapshot
  // can see (no other session is open).
  EXPECT_EQ(g->versions_spilled, 0u);
  EXPECT_EQ(g->versions_dropped, 997u);
  EXPECT_GE(g->blobs_freed, 997u);
  EXPECT_GT(g->objects_reused, 900u) << "freed blobs are reused by later versions";
  auto txn = (*s)->Begin();
  ASSERT_TRUE(txn.ok());
  auto v = GetRow(**txn, **table, 7);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 999);
}

TEST_P(GcTest, LongReaderKeepsWhatItSeesThenChainIsFreed) {
  auto table = db().CreateTable("t", BlobSchema());
  ASSERT_TRUE(table.ok());
  auto writer = db().NewSession();
  auto reader = db().NewSession();
  ASSERT_TRUE(writer.ok() && reader.ok());
  for (int64_t k = 0; k < 10; ++k) ASSERT_OK(PutRow(**writer, **table, k, 1000 + k));
  auto old = (*reader)->Begin();
  ASSERT_TRUE(old.ok());
  ASSERT_EQ(*GetRow(**old, **table, 0), 1000);  // the first read takes the snapshot: 1000 + k
  for (int round = 0; round < 20; ++round) {
    for (int64_t k = 0; k < 10; ++k) ASSERT_OK(PutRow(**writer, **table, k, round * 100 + k));
  }
  for (int64_t k = 0; k < 10; ++k) {
    auto v = GetRow(**old, **table, k);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, 1000 + k) << "the long reader lost the version it sees";
  }
  auto mid = db().CollectGarbage();
  ASSERT_TRUE(mid.ok());
  // Versions 1..21 per key, evictions from version 4 on: 18 per key, all kept while the
  // reader (whose announcement is older than all of them) runs, none freed.
  EXPECT_EQ(mid->versions_spilled, 180u);
  EXPECT_EQ(mid->nodes_freed, 0u);
  (*old)->Rollback();
  old->reset();
  // Once the reader's session is marked idle (after 50 ms without a transaction; until then
  // its announcement conservatively stands), the next write of each key cuts its chain.
  CollectUntil(db(), [](const GcStats& g) { return g.live_sessions == 0; });
  for (int64_t k = 0; k < 10; ++k) ASSERT_OK(PutRow(**writer, **table, k, 5000 + k));
  GcStats g = CollectUntil(db(), [](const GcStats& g) { return g.nodes_freed >= 180; });
  EXPECT_EQ(g.chains_cut, 10u);
  EXPECT_EQ(g.nodes_freed, 180u);
  EXPECT_EQ(g.versions_spilled, 180u);
  auto txn = (*writer)->Begin();
  ASSERT_TRUE(txn.ok());
  for (int64_t k = 0; k < 10; ++k) {
    auto v = GetRow(**txn, **table, k);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, 5000 + k);
  }
}

TEST_P(GcTest, DeletedRecordsAreRemovedAndTheirMemoryReused) {
  auto table = db().CreateTable("t", BlobSchema(), TableOptions{.ordered = true});
  ASSERT_TRUE(table.ok());
  auto s = db().NewSession();
  ASSERT_TRUE(s.ok());
  constexpr int kKeys = 200;
  for (int64_t k = 0; k < kKeys; ++k) ASSERT_OK(PutRow(**s, **table, k, k));
  for (int64_t k = 0; k < kKeys; k += 2) {
    ASSERT_OK(RunTransaction(**s, [&](Transaction& txn) { return txn.Delete(**table, k); }));
  }
  GcStats g = CollectUntil(db(), [](const GcStats& g) { return g.records_removed >= kKeys / 2; });
  ASSERT_EQ(g.records_removed, uint64_t(kKeys / 2));
  // Deleted keys are gone from the indexes; the others are intact; re-inserting works and
  // reuses freed memory.
  for (int64_t k = 0; k < kKeys; k += 2) ASSERT_OK(PutRow(**s, **table, k, 10000 + k));
  auto txn = (*s)->Begin();
  ASSERT_TRUE(txn.ok());
  for (int64_t k = 0; k < kKeys; ++k) {
    auto v = GetRow(**txn, **table, k);
    ASSERT_TRUE(v.ok()) << "key " << k << ": " << v.status().ToString();
    EXPECT_EQ(*v, k % 2 == 0 ? 10000 + k : k);
  }
  std::vector<int64_t> scanned;
  ASSERT_OK((*txn)->Scan(**table, 0, kKeys, 0, false, [&](int64_t key, const Row&) {
    scanned.push_back(key);
    return true;
  }));
  EXPECT_EQ(scanned.size(), size_t(kKeys));
  (*txn)->Rollback();
  auto after = db().CollectGarbage();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->chunks_opened, g.chunks_opened)
      << "the re-inserted records and blobs took the slots the removal freed";
}

TEST_P(GcTest, RandomWorkloadMatchesModelWhileCollecting) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto table = db().CreateTable("t", BlobSchema(), TableOptions{.ordered = true});
  ASSERT_TRUE(table.ok());
  auto s = db().NewSession();
  auto reader = db().NewSession();
  ASSERT_TRUE(s.ok() && reader.ok());
  std::map<int64_t, int64_t> model;
  std::unique_ptr<Transaction> held;  // a reader that comes and goes, with its model copy
  std::map<int64_t, int64_t> held_model;
  for (int op = 0; op < 4000; ++op) {
    const int64_t key = rng() % 64;
    const int what = rng() % 10;
    if (what < 6) {
      const int64_t v = rng() % 100000;
      ASSERT_OK(PutRow(**s, **table, key, v));
      model[key] = v;
    } else if (what < 8) {
      Status st = RunTransaction(**s, [&](Transaction& txn) { return txn.Delete(**table, key); });
      ASSERT_TRUE(st.ok() || st.code() == StatusCode::kNotFound) << st.ToString();
      model.erase(key);
    } else if (what < 9) {
      if (held) held->Rollback();
      auto t = (*reader)->Begin();
      ASSERT_TRUE(t.ok());
      held = std::move(*t);
      held_model = model;
      // The first read takes the snapshot (of the model just copied).
      const auto first = GetRow(*held, **table, 0);
      ASSERT_TRUE(first.ok() || first.status().code() == StatusCode::kNotFound);
    } else if (held) {
      for (int64_t k = 0; k < 64; ++k) {
        auto v = GetRow(*held, **table, k);
        auto it = held_model.find(k);
        if (it == held_model.end()) {
          ASSERT_EQ(v.status().code(), StatusCode::kNotFound) << "key " << k << " op " << op;
        } else {
          ASSERT_TRUE(v.ok()) << "key " << k << " op " << op << ": " << v.status().ToString();
          ASSERT_EQ(*v, it->second) << "key " << k << " op " << op;
        }
      }
    }
    if (op % 500 == 0) {
      ASSERT_TRUE(db().CollectGarbage().ok());
    }
  }
  if (held) held->Rollback();
  auto t = (*s)->Begin();
  ASSERT_TRUE(t.ok());
  for (int64_t k = 0; k < 64; ++k) {
    auto v = GetRow(**t, **table, k);
    auto it = model.find(k);
    if (it == model.end()) {
      EXPECT_EQ(v.status().code(), StatusCode::kNotFound) << "key " << k;
    } else {
      ASSERT_TRUE(v.ok()) << "key " << k << ": " << v.status().ToString();
      EXPECT_EQ(*v, it->second) << "key " << k;
    }
  }
}

TEST_P(GcTest, DroppedTableIsReclaimed) {
  auto table = db().CreateTable("gone", BlobSchema());
  ASSERT_TRUE(table.ok());
  auto s = db().NewSession();
  ASSERT_TRUE(s.ok());
  for (int64_t k = 0; k < 100; ++k) ASSERT_OK(PutRow(**s, **table, k, k));
  ASSERT_OK(db().DropTable("gone"));
  GcStats g = CollectUntil(db(), [](const GcStats& g) { return g.tables_reclaimed >= 1; });
  EXPECT_EQ(g.tables_reclaimed, 1u);
  // The name and the catalog slot are free again; the new table starts empty.
  auto again = db().CreateTable("gone", BlobSchema());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto txn = (*s)->Begin();
  ASSERT_TRUE(txn.ok());
  for (int64_t k = 0; k < 100; ++k) {
    EXPECT_EQ(GetRow(**txn, **again, k).status().code(), StatusCode::kNotFound) << k;
  }
}

// Bytes the memory servers have leased to clients, summed (pool engine).
Result<uint64_t> PoolLeased(const std::string& cluster_file) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(cluster_file));
  FARPOOL_ASSIGN_OR_RETURN(auto pool, Pool::Connect(config));
  uint64_t leased = 0;
  for (uint16_t id : pool->server_ids()) {
    FARPOOL_ASSIGN_OR_RETURN(ServerStats st, pool->Stats(id));
    leased += st.leased;
  }
  return leased;
}

// Slab chunks this process holds (opened and not released; one process in these tests).
uint64_t ChunksHeld(const GcStats& g) { return g.chunks_opened - g.chunks_released; }

// Two maintenance passes: the first finds every cache idle that the work before it stopped
// allocating from, the second returns them (and their emptied chunks to the servers).
GcStats ReturnIdle(Database& db) {
  auto g = db.CollectGarbage();
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  g = db.CollectGarbage();
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : GcStats{};
}

constexpr uint64_t kChunk = 4 << 20;  // TestDatabase's servers' chunk size

// Create, fill and drop tables again and again: once a drop is reclaimed, its records, blobs,
// hash bucket array (8 MiB for the big table, a run of chunks of its own), overflow buckets
// (the small table's 16 buckets chain hundreds) and B+tree nodes are freed, the slab chunks
// they emptied go back to the servers, and (pool engine) the bytes the servers have leased
// are back where they were before the first table was made (within one chunk).
TEST_P(GcTest, CreateFillDropCyclesGiveTheMemoryBackToTheServers) {
  auto s = db().NewSession();
  ASSERT_TRUE(s.ok());
  constexpr int kCycles = 4, kRows = 2000;
  const TableOptions big{.ordered = true, .expected_rows = 1 << 18};
  const TableOptions small{.ordered = false, .expected_rows = 16};
  uint64_t start_leased = 0;
  if (GetParam() == "pool") {
    auto l = PoolLeased(t_->options().cluster_file);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    start_leased = *l;
  }
  const uint64_t start_held = ChunksHeld(ReturnIdle(db()));
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    auto b = db().CreateTable("big", BlobSchema(), big);
    auto t = db().CreateTable("small", BlobSchema(), small);
    ASSERT_TRUE(b.ok() && t.ok());
    for (int64_t i = 0; i < kRows; ++i) {
      const int64_t key = (i * 7919) % kRows;  // not in key order: splits all over the tree
      ASSERT_OK(PutRow(**s, **b, key, i));
      ASSERT_OK(PutRow(**s, **t, key, i));
    }
    uint64_t filled = 0;
    if (GetParam() == "pool") {
      auto l = PoolLeased(t_->options().cluster_file);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      filled = *l;
    }
    ASSERT_OK(db().DropTable("big"));
    ASSERT_OK(db().DropTable("small"));
    const uint64_t reclaimed = 2 * (cycle + 1);
    GcStats g =
        CollectUntil(db(), [&](const GcStats& g) { return g.tables_reclaimed >= reclaimed; });
    ASSERT_EQ(g.tables_reclaimed, reclaimed);
    g = ReturnIdle(db());
    EXPECT_GT(g.chunks_released, 0u);
    EXPECT_EQ(ChunksHeld(g), start_held) << "slab chunks still held after the drops";
    if (GetParam() == "pool") {
      auto l = PoolLeased(t_->options().cluster_file);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      EXPECT_LE(*l, start_leased + kChunk)
          << "the servers did not get their memory back: " << start_leased << " -> " << *l
          << " bytes leased";
      std::printf("[ memory ] cycle %d: %.1f MiB leased at the start, %.1f filled, %.1f after\n",
                  cycle, start_leased / 1048576.0, filled / 1048576.0, *l / 1048576.0);
    }
  }
}

// A soak in miniature: every round updates every key (a new blob per version), deletes a
// fifth of the keys and re-inserts the fifth deleted the round before. After warm-up the slab
// chunks held (and, pool engine, the bytes the servers have leased) stay at the warm-up's
// level; every key reads back its last value after every round; dropping the table at the
// end gives everything back to the servers.
TEST_P(GcTest, ChurnKeepsServerMemoryFlatAndDropGivesItBack) {
  auto s = db().NewSession();
  ASSERT_TRUE(s.ok());
  auto leased = [&]() -> uint64_t {
    if (GetParam() != "pool") return 0;
    auto l = PoolLeased(t_->options().cluster_file);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? *l : 0;
  };
  const uint64_t start_leased = leased();
  const uint64_t start_held = ChunksHeld(ReturnIdle(db()));
  auto table = db().CreateTable("churn", BlobSchema(), TableOptions{.ordered = true});
  ASSERT_TRUE(table.ok());
  constexpr int kKeys = 500, kRounds = 16, kWarmup = 4;
  std::map<int64_t, int64_t> model;
  for (int64_t k = 0; k < kKeys; ++k) {
    ASSERT_OK(PutRow(**s, **table, k, k));
    model[k] = k;
  }
  uint64_t warm_held = 0, warm_leased = 0;
  for (int round = 1; round <= kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    for (int64_t k = 0; k < kKeys; ++k) {
      if (k % 5 == (round + 4) % 5) {  // deleted last round: re-insert
        ASSERT_OK(PutRow(**s, **table, k, round * kKeys + k));
        model[k] = round * kKeys + k;
      } else if (k % 5 == round % 5) {
        ASSERT_OK(RunTransaction(**s, [&](Transaction& txn) { return txn.Delete(**table, k); }));
        model.erase(k);
      } else {
        ASSERT_OK(PutRow(**s, **table, k, round * kKeys + k));
        model[k] = round * kKeys + k;
      }
    }
    auto txn = (*s)->Begin();
    ASSERT_TRUE(txn.ok());
    for (int64_t k = 0; k < kKeys; ++k) {
      auto v = GetRow(**txn, **table, k);
      if (model.count(k) == 0) {
        EXPECT_EQ(v.status().code(), StatusCode::kNotFound) << "key " << k;
      } else {
        ASSERT_TRUE(v.ok()) << "key " << k << ": " << v.status().ToString();
        EXPECT_EQ(*v, model[k]) << "key " << k;
      }
    }
    (*txn)->Rollback();
    const uint64_t held = ChunksHeld(ReturnIdle(db()));
    const uint64_t bytes = leased();
    if (round <= kWarmup) {
      warm_held = std::max(warm_held, held);
      warm_leased = std::max(warm_leased, bytes);
      continue;
    }
    // One chunk of slack: removals finish on the maintenance thread's schedule, so how many
    // tombstoned records are still waiting varies a little from round to round.
    EXPECT_LE(held, warm_held + 1) << "slab chunks held grew after warm-up";
    EXPECT_LE(bytes, warm_leased + kChunk) << "server memory grew after warm-up";
  }
  ASSERT_OK(db().DropTable("churn"));
  GcStats g = CollectUntil(db(), [](const GcStats& g) { return g.tables_reclaimed >= 1; });
  ASSERT_EQ(g.tables_reclaimed, 1u);
  EXPECT_EQ(ChunksHeld(ReturnIdle(db())), start_held);
  EXPECT_LE(leased(), start_leased + kChunk) << "the servers did not get their memory back";
}

// Holds every thread that calls Hold() until Open(). The test opens it before anything that
// waits for those threads (a Database's destructor joins its maintenance thread).
class Gate {
 public:
  void Hold() {
    std::unique_lock<std::mutex> l(mu_);
    held_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
  }
  bool WaitHeld(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, limit, [&] { return held_; });
  }
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false, open_ = false;
};

// A reclamation pass that takes long must not delay lease renewals. Process A (a second
// Database handle) drops a table, and its maintenance thread is held at the table's first
// record for 6 leases (the gate stands for a table so big that freeing it takes that long).
// Process B's maintenance thread fences every slot it sees unchanged for lease + margin; A's
// idle session and A's system session must still be A's afterwards: the session commits
// without Unavailable and A runs DDL. Then reclamation resumes and frees the table.
TEST(GcLeaseTest, SlowReclamationDoesNotDelayRenewals) {
  constexpr std::chrono::milliseconds kLease{500};
  auto t = TestDatabase::Start("pool", kLease);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Database& b = (*t)->db();
  Gate gate;
  DatabaseOptions o = (*t)->options();
  o.testing = std::make_shared<db::TestingHooks>(
      db::TestingHooks{.commit_hook = [&](std::string_view point) {
        if (point == "gc.table-record") gate.Hold();
      }});
  auto a = Database::Open(o);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  struct OpenAtExit {
    Gate& gate;
    ~OpenAtExit() { gate.Open(); }
  } open_at_exit{gate};
  auto keep = (*a)->CreateTable("keep", BlobSchema());
  auto big = (*a)->CreateTable("big", BlobSchema());
  ASSERT_TRUE(keep.ok() && big.ok());
  auto idle = (*a)->NewSession();
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  for (int64_t k = 0; k < 50; ++k) ASSERT_OK(PutRow(**idle, **big, k, k));
  ASSERT_OK((*a)->DropTable("big"));
  ASSERT_TRUE(gate.WaitHeld(std::chrono::seconds(30)))
      << "A's maintenance thread never started reclaiming the dropped table";
  std::this_thread::sleep_for(6 * kLease);  // B would have fenced A's slots by now
  Status s = PutRow(**idle, **keep, 1, 1);
  EXPECT_TRUE(s.ok()) << "A's idle session lost its lease while A reclaimed: " << s.ToString();
  auto ddl = (*a)->CreateTable("after", BlobSchema());
  EXPECT_TRUE(ddl.ok()) << "A's system session lost its lease while A reclaimed: "
                        << ddl.status().ToString();
  gate.Open();
  GcStats g = CollectUntil(**a, [](const GcStats& g) { return g.tables_reclaimed >= 1; });
  EXPECT_EQ(g.tables_reclaimed, 1u);
  auto bs = b.NewSession();
  auto keep_b = b.OpenTable("keep");
  ASSERT_TRUE(bs.ok() && keep_b.ok());
  auto txn = (*bs)->Begin();
  ASSERT_TRUE(txn.ok());
  auto v = GetRow(**txn, **keep_b, 1);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1);
}

INSTANTIATE_TEST_SUITE_P(Engines, GcTest, testing::Values("local", "pool"),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace farpool::db
