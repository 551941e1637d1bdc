// The database with real processes: `farpool server` processes hold the data (a local cluster
// over shared memory), and compute processes (this test binary re-run as a worker,
// FARPOOL_WORKER=<role>) run transactions on it at once.
//
//   Bank:  workers × threads transfer money with random voluntary aborts while auditors take
//          read-only snapshots; every snapshot and the end state conserve the total.
//   Cycle: a ring of records whose links concurrent transactions swap (FoundationDB's Cycle);
//          workers die by SIGKILL in the middle of commits (at fault sites inside Commit, and
//          from the parent at random moments). Afterwards the ring is still one ring and no
//          record stays locked.
//   Locking reads (pool): counters incremented under read committed, each transaction locking
//          a counter and a total row at read (MultiGetForUpdate); one worker dies by SIGKILL at
//          fault sites inside commits, another kills itself while holding locks it took at read
//          (no commit log yet). Afterwards no record stays locked, the others were never stuck,
//          and the counters sum to the total (no lost or partial increment).
//   Bulk loads (pool): loader processes die by SIGKILL half-way through loading, after their
//          B+tree build, and inside the publication; none of their tables ever becomes visible,
//          all are reclaimed, and the database stays usable.
//
// Both engines: `pool` (memory servers) and `sharded` (`farpool shard` partition servers; its
// fault sites are "locked" = all participants prepared, and "decided" = partition 0 committed
// and installed, the others not yet told).
//
// Seeds: FARPOOL_SEED (printed) drives every worker's choices.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "db/db_test_util.h"
#include "db/shard_cluster.h"
#include "db/testing_hooks.h"
#include "farpool/db.h"
#include "pool/test_cluster.h"

using namespace std::chrono_literals;

namespace farpool::db {
namespace {

constexpr int kAccounts = 64;
constexpr int64_t kInitial = 1000;
constexpr int kRing = 24;

std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// FARPOOL_ENGINE: pool (memory servers) or sharded (`farpool shard` partition servers).
Engine TestEngine() {
  auto e = ParseEngine(Env("FARPOOL_ENGINE", "pool"));
  return e.ok() ? *e : Engine::kPool;
}

DatabaseOptions WorkerOptions() {
  DatabaseOptions o;
  o.engine = TestEngine();
  o.cluster_file = Env("FARPOOL_CLUSTER");
  o.lease = 1000ms;
  o.max_sessions = 64;
  return o;
}

// ------------------------------------------------------------------ workers

// Runs `threads` threads on `db`, each with a session of its own, each calling
// step(session, thread, i) for i = 0 .. steps-1 until a step fails; returns the first failure.
Status RunSessionThreads(Database& db, int threads, int steps,
                         const std::function<Status(Session&, int, int)>& step) {
  std::vector<Status> results(threads);
  std::vector<std::thread> running;
  for (int th = 0; th < threads; ++th) {
    running.emplace_back([&, th] {
      auto session = db.NewSession();
      if (!session.ok()) {
        results[th] = session.status();
        return;
      }
      for (int i = 0; i < steps && results[th].ok(); ++i) results[th] = step(**session, th, i);
    });
  }
  for (auto& th : running) th.join();
  for (auto& r : results) FARPOOL_RETURN_IF_ERROR(r);
  return Status::Ok();
}

// Hooks that SIGKILL this process at commit fault site `site` once `commits` reaches `after`.
std::shared_ptr<db::TestingHooks> KillAtCommitSite(const std::atomic<int>& commits, int after,
                                                   std::string site) {
  return std::make_shared<db::TestingHooks>(
      db::TestingHooks{.commit_hook = [&commits, after, site](std::string_view point) {
        if (commits.load() >= after && point == site) raise(SIGKILL);
      }});
}

Status BankWorker(uint64_t seed) {
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(WorkerOptions()));
  FARPOOL_ASSIGN_OR_RETURN(const Table* t, db->OpenTable("accounts"));
  std::vector<std::mt19937_64> rngs;
  for (int th = 0; th < 3; ++th) rngs.emplace_back(seed * 31 + th);
  return RunSessionThreads(*db, 3, 300, [&](Session& session, int th, int) -> Status {
    if (th == 2) {  // the auditor thread
      return RunTransaction(session, [&](Transaction& txn) -> Status {
        int64_t sum = 0;
        for (int a = 0; a < kAccounts; ++a) {
          FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, *t, a));
          sum += v;
        }
        if (sum != kAccounts * kInitial) {
          return Status::Internal("snapshot saw a total of " + std::to_string(sum));
        }
        return Status::Ok();
      });
    }
    std::mt19937_64& rng = rngs[th];
    const int from = rng() % kAccounts, to = rng() % kAccounts;
    const int64_t amount = rng() % 100;
    const bool give_up = rng() % 8 == 0;
    Status s = RunTransaction(
        session,
        [&](Transaction& txn) -> Status {
          FARPOOL_ASSIGN_OR_RETURN(int64_t a, GetInt(txn, *t, from));
          FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, from, a - amount));
          FARPOOL_ASSIGN_OR_RETURN(int64_t b, GetInt(txn, *t, to));
          FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, to, b + amount));
          return give_up ? Status::InvalidArgument("voluntary abort") : Status::Ok();
        },
        100000);
    return give_up && s.code() == StatusCode::kInvalidArgument ? Status::Ok() : s;
  });
}

// One Cycle step: a -> b -> c -> d becomes a -> c -> b -> d.
Status CycleStep(Transaction& txn, const Table& t, int64_t a) {
  FARPOOL_ASSIGN_OR_RETURN(int64_t b, GetInt(txn, t, a));
  FARPOOL_ASSIGN_OR_RETURN(int64_t c, GetInt(txn, t, b));
  FARPOOL_ASSIGN_OR_RETURN(int64_t d, GetInt(txn, t, c));
  FARPOOL_RETURN_IF_ERROR(PutInt(txn, t, a, c));
  FARPOOL_RETURN_IF_ERROR(PutInt(txn, t, c, b));
  return PutInt(txn, t, b, d);
}

Status CycleWorker(uint64_t seed, int id) {
  DatabaseOptions o = WorkerOptions();
  // Worker 0 kills itself at a random fault site inside a commit after a while.
  std::atomic<int> commits{0};
  std::mt19937_64 crash_rng(seed ^ 0xC0FFEE);
  const int crash_after = 50 + crash_rng() % 100;
  static const char* kPoolSites[] = {"locked", "logged", "installing", "installed"};
  static const char* kShardedSites[] = {"locked", "decided"};
  const std::string site = TestEngine() == Engine::kSharded ? kShardedSites[crash_rng() % 2]
                                                            : kPoolSites[crash_rng() % 4];
  if (id == 0) o.testing = KillAtCommitSite(commits, crash_after, site);
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(o));
  FARPOOL_ASSIGN_OR_RETURN(const Table* t, db->OpenTable("ring"));
  std::vector<std::mt19937_64> rngs;
  for (int th = 0; th < 2; ++th) rngs.emplace_back(seed * 131 + id * 7 + th);
  return RunSessionThreads(*db, 2, 400, [&](Session& session, int th, int) -> Status {
    const int64_t a = rngs[th]() % kRing;
    Status s = RunTransaction(
        session, [&](Transaction& txn) { return CycleStep(txn, *t, a); }, 100000);
    ++commits;
    return s;
  });
}

// Each transaction adds 1 to a random counter (1..kCounters) and to the total (key 0), both
// locked at read. Worker 0 kills itself at a fault site inside a commit after a while; worker 1
// kills itself right after a locking read (holding both locks, nothing logged).
constexpr int kCounters = 8;

Status CounterWorker(uint64_t seed, int id) {
  DatabaseOptions o = WorkerOptions();
  std::atomic<int> commits{0};
  std::mt19937_64 crash_rng(seed ^ 0xF0F0);
  const int crash_after = 30 + crash_rng() % 60;
  static const char* kSites[] = {"locked", "logged", "installing", "installed"};
  if (id == 0) o.testing = KillAtCommitSite(commits, crash_after, kSites[crash_rng() % 4]);
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(o));
  FARPOOL_ASSIGN_OR_RETURN(const Table* t, db->OpenTable("counters"));
  std::vector<std::mt19937_64> rngs;
  for (int th = 0; th < 2; ++th) rngs.emplace_back(seed * 17 + id * 5 + th);
  return RunSessionThreads(*db, 2, 200, [&](Session& session, int th, int i) -> Status {
    const int64_t c = 1 + rngs[th]() % kCounters;
    const bool die = id == 1 && th == 1 && i == crash_after;
    Status s = RunTransaction(
        session, TransactionOptions{Isolation::kReadCommitted},
        [&](Transaction& txn) -> Status {
          const TableKey keys[] = {{t, c}, {t, 0}};
          std::vector<Row> rows;
          std::vector<Status> found;
          FARPOOL_RETURN_IF_ERROR(txn.MultiGetForUpdate(keys, &rows, &found));
          for (const Status& f : found) FARPOOL_RETURN_IF_ERROR(f);
          if (die) raise(SIGKILL);  // holding both locks, nothing logged
          FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, c, rows[0].GetInt64(0) + 1));
          return PutInt(txn, *t, 0, rows[1].GetInt64(0) + 1);
        },
        100000);
    ++commits;
    return s;
  });
}

// Bulk loaders that die by SIGKILL: worker i loads table "bulk<i>" and kills itself at a fault
// site of the load: worker 0 after a random flush of rows, worker 1 once its B+tree is built,
// worker 2 inside the publication (the table claimed, not yet live).
constexpr int kBulkRows = 20000;

Status BulkWorker(uint64_t seed, int id) {
  DatabaseOptions o = WorkerOptions();
  std::mt19937_64 rng(seed ^ 0xB01C);
  // A load of kBulkRows flushes about 10 times (1024 rows per server each): die in one of the
  // first 8, so that it always happens.
  const int die_after = 1 + int(rng() % 8);
  int flushes = 0;
  static const char* kSites[] = {"bulk.flushed", "bulk.built", "bulk.publish"};
  const std::string site = kSites[id % 3];
  o.testing = std::make_shared<db::TestingHooks>(
      db::TestingHooks{.commit_hook = [&](std::string_view point) {
        if (point == site && (point != "bulk.flushed" || ++flushes == die_after)) raise(SIGKILL);
      }});
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(o));
  const Schema schema{{"v", ColumnType::kInt64}, {"note", ColumnType::kBytes}};
  FARPOOL_ASSIGN_OR_RETURN(auto loader, db->NewLoader("bulk" + std::to_string(id), schema,
                                                      TableOptions{true, kBulkRows}));
  for (int64_t k = 0; k < kBulkRows; ++k) {
    Row r(schema);
    r.SetInt64(0, k);
    r.SetBytes(1, std::string(40, 'x'));
    FARPOOL_RETURN_IF_ERROR(loader->Add(k, r));
  }
  return loader->Finish().status();
}

// ------------------------------------------------------------------ parent side

std::vector<pid_t> SpawnWorkers(int count, const std::string& role, const std::string& cluster,
                                uint64_t seed) {
  std::vector<pid_t> pids;
  for (int i = 0; i < count; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("FARPOOL_WORKER", role.c_str(), 1);
      setenv("FARPOOL_WORKER_ID", std::to_string(i).c_str(), 1);
      setenv("FARPOOL_CLUSTER", cluster.c_str(), 1);
      setenv("FARPOOL_SEED", std::to_string(seed).c_str(), 1);
      setenv("FARPOOL_ENGINE", std::string(EngineName(TestEngine())).c_str(), 1);
      execl("/proc/self/exe", "db_process_test", nullptr);
      _exit(127);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Waits for the workers; returns "pid: status" of those that did not exit 0 (killed ones too).
std::vector<std::pair<pid_t, int>> Reap(const std::vector<pid_t>& pids,
                                        std::chrono::seconds limit = 240s) {
  std::vector<std::pair<pid_t, int>> out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (pid_t pid : pids) {
    int status = 0;
    for (;;) {
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    out.push_back({pid, status});
  }
  return out;
}

// Reaps the workers: each must have exited 0 or been SIGKILLed (by a fault site of its own or
// by the test). Returns how many were killed.
int ReapKilledOrExited(const std::vector<pid_t>& pids) {
  int killed = 0;
  for (auto [pid, status] : Reap(pids)) {
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      ++killed;
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << pid << " status " << status;
  }
  return killed;
}

class DbProcessTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // pool-tcp: the pool engine on servers reached over TCP (the cluster file says so, and the
    // worker processes read it): locks waited for at the memory servers.
    setenv("FARPOOL_ENGINE", GetParam() == "pool-tcp" ? "pool" : GetParam().c_str(), 1);
    if (GetParam() == "sharded") {
      shard_dir_ = MakeTempDir("farpool-shards");
      ShardClusterOptions so;
      so.dir = shard_dir_;
      so.partitions = 2;
      so.transport = Fabric::kShm;
      so.progress = ProgressMode::kEvent;
      so.binary = FARPOOL_BINARY;
      so.die_with_parent = true;
      Status up = ShardClusterUp(so);
      ASSERT_TRUE(up.ok()) << up.ToString();
      cluster_file_ = ShardClusterFile(shard_dir_);
    } else {
      StartPoolCluster();
      cluster_file_ = cluster_->cluster_file();
    }
    DatabaseOptions d = WorkerOptions();
    d.cluster_file = cluster_file_;
    auto db = Database::Open(d);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
  }
  void StartPoolCluster() {
    LocalClusterOptions o = ShmTestCluster(FARPOOL_BINARY);
    if (GetParam() == "pool-tcp") o.transport = Fabric::kTcp;
    cluster_ = std::make_unique<TestCluster>(o);
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status().ToString();
  }
  void TearDown() override {
    db_.reset();
    cluster_.reset();
    if (!shard_dir_.empty()) {
      Status down = ShardClusterDown(shard_dir_);
      EXPECT_TRUE(down.ok()) << down.ToString();
      std::error_code ec;
      std::filesystem::remove_all(shard_dir_, ec);
    }
  }
  std::unique_ptr<TestCluster> cluster_;
  std::string shard_dir_;
  std::string cluster_file_;
  std::unique_ptr<Database> db_;
};

TEST_P(DbProcessTest, BankInvariantAcrossProcesses) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  Schema schema{{"balance", ColumnType::kInt64}};
  auto t = db_->CreateTable("accounts", schema);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto session = db_->NewSession();
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(RunTransaction(**session, [&](Transaction& txn) -> Status {
                for (int a = 0; a < kAccounts; ++a)
                  FARPOOL_RETURN_IF_ERROR(PutInt(txn, **t, a, kInitial));
                return Status::Ok();
              }).ok());
  auto pids = SpawnWorkers(3, "bank", cluster_file_, seed);
  EXPECT_EQ(ReapKilledOrExited(pids), 0);
  int64_t sum = 0;
  ASSERT_TRUE(RunTransaction(**session, [&](Transaction& txn) -> Status {
                sum = 0;
                for (int a = 0; a < kAccounts; ++a) {
                  FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, **t, a));
                  sum += v;
                }
                return Status::Ok();
              }).ok());
  EXPECT_EQ(sum, kAccounts * kInitial);
  EXPECT_EQ(*db_->CountLocked(**t), 0u);
}

TEST_P(DbProcessTest, CycleSurvivesSigkillMidCommit) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  Schema schema{{"next", ColumnType::kInt64}};
  auto t = db_->CreateTable("ring", schema);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto session = db_->NewSession();
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(RunTransaction(**session, [&](Transaction& txn) -> Status {
                for (int i = 0; i < kRing; ++i)
                  FARPOOL_RETURN_IF_ERROR(PutInt(txn, **t, i, (i + 1) % kRing));
                return Status::Ok();
              }).ok());
  auto pids = SpawnWorkers(3, "cycle", cluster_file_, seed);
  // Worker 0 dies at a fault site on its own; worker 1 is killed from outside at a random time.
  std::mt19937_64 rng(seed);
  std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 400));
  kill(pids[1], SIGKILL);
  EXPECT_GE(ReapKilledOrExited(pids), 1);
  // Leases of the dead expire; recovery finishes their decided commits and breaks the rest.
  std::this_thread::sleep_for(1100ms);
  ASSERT_TRUE(db_->RecoverExpired().ok());
  EXPECT_EQ(*db_->CountLocked(**t), 0u);
  // The ring is one ring of kRing records.
  std::set<int64_t> seen;
  ASSERT_TRUE(RunTransaction(**session, [&](Transaction& txn) -> Status {
                seen.clear();
                int64_t at = 0;
                for (int i = 0; i < kRing; ++i) {
                  seen.insert(at);
                  FARPOOL_ASSIGN_OR_RETURN(at, GetInt(txn, **t, at));
                }
                if (at != 0)
                  return Status::Internal("the ring does not close after " + std::to_string(kRing) +
                                          " hops");
                return Status::Ok();
              }).ok());
  EXPECT_EQ(seen.size(), static_cast<size_t>(kRing));
  // And every record takes a write again (none is frozen by a dead lock).
  Status s = RunTransaction(**session, [&](Transaction& txn) -> Status {
    for (int i = 0; i < kRing; ++i) {
      FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, **t, i));
      FARPOOL_RETURN_IF_ERROR(PutInt(txn, **t, i, v));
    }
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_P(DbProcessTest, LockingReadsSurviveSigkill) {
  if (GetParam() == "sharded")
    GTEST_SKIP() << "sharded neither locks at read nor runs read committed";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto t = db_->CreateTable("counters", Schema{{"v", ColumnType::kInt64}});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto session = db_->NewSession();
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(RunTransaction(**session, [&](Transaction& txn) -> Status {
                for (int i = 0; i <= kCounters; ++i)
                  FARPOOL_RETURN_IF_ERROR(PutInt(txn, **t, i, 0));
                return Status::Ok();
              }).ok());
  auto pids = SpawnWorkers(3, "counter", cluster_file_, seed);
  // Worker 2 never dies: it met the dead workers' locks and got past them.
  EXPECT_EQ(ReapKilledOrExited(pids), 2);
  std::this_thread::sleep_for(1100ms);
  ASSERT_TRUE(db_->RecoverExpired().ok());
  EXPECT_EQ(*db_->CountLocked(**t), 0u);
  int64_t sum = 0, total = -1;
  ASSERT_TRUE(RunTransaction(**session, [&](Transaction& txn) -> Status {
                sum = 0;
                for (int i = 1; i <= kCounters; ++i) {
                  FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, **t, i));
                  sum += v;
                }
                FARPOOL_ASSIGN_OR_RETURN(total, GetInt(txn, **t, 0));
                return Status::Ok();
              }).ok());
  EXPECT_EQ(sum, total);
  // The survivor's 400 increments at least, and every lock taken again.
  EXPECT_GE(total, 400);
  Status s = RunTransaction(**session, TransactionOptions{Isolation::kReadCommitted},
                            [&](Transaction& txn) -> Status {
                              for (int i = 0; i <= kCounters; ++i) {
                                Row row;
                                FARPOOL_RETURN_IF_ERROR(txn.GetForUpdate(**t, i, &row));
                              }
                              return Status::Ok();
                            });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(*db_->CountLocked(**t), 0u);
}

// Loader processes killed half-way (BulkWorker): no reader ever sees their tables, the
// garbage collector of this process adopts and reclaims all three once their leases expire,
// and the database stays usable: the names load again and an existing table is untouched.
TEST_P(DbProcessTest, KilledLoaderLeavesNothing) {
  if (GetParam() == "sharded") GTEST_SKIP() << "kSharded's loader is the transaction fallback";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto keep = db_->CreateTable("keep", Schema{{"v", ColumnType::kInt64}});
  ASSERT_TRUE(keep.ok()) << keep.status().ToString();
  auto session = db_->NewSession();
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(
      RunTransaction(**session, [&](Transaction& txn) { return PutInt(txn, **keep, 1, 7); }).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> seen{0};
  std::thread watcher([&] {
    while (!stop.load()) {
      auto names = db_->ListTables();
      if (names.ok() && names->size() != 1) ++seen;
      std::this_thread::sleep_for(5ms);
    }
  });
  auto pids = SpawnWorkers(3, "bulk", cluster_file_, seed);
  const int killed = ReapKilledOrExited(pids);
  stop = true;
  watcher.join();
  EXPECT_EQ(killed, 3);
  EXPECT_EQ(seen.load(), 0) << "a table of a dead loader became visible";
  // Their sessions expire; the sweep adopts the three loads and reclaims them.
  GcStats g;
  for (int i = 0; i < 600 && g.tables_reclaimed < 3; ++i) {
    ASSERT_TRUE(db_->RecoverExpired().ok());
    auto r = db_->CollectGarbage();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    g = *r;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(g.tables_reclaimed, 3u);
  auto names = db_->ListTables();
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"keep"});
  // Usable: a load of a dead loader's name, and the table from before.
  const Schema schema{{"v", ColumnType::kInt64}};
  auto loader = db_->NewLoader("bulk0", schema, TableOptions{true, 1000});
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  for (int64_t k = 0; k < 1000; ++k) {
    Row r(schema);
    r.SetInt64(0, k * 2);
    ASSERT_TRUE((*loader)->Add(k, r).ok());
  }
  auto bulk = (*loader)->Finish();
  ASSERT_TRUE(bulk.ok()) << bulk.status().ToString();
  int64_t sum = 0, rows = 0;
  ASSERT_TRUE(RunTransaction(**session, [&](Transaction& txn) -> Status {
                sum = rows = 0;
                FARPOOL_RETURN_IF_ERROR(
                    txn.Scan(**bulk, 0, 999, 0, false, [&](int64_t, const Row& r) {
                      sum += r.GetInt64(0);
                      ++rows;
                      return true;
                    }));
                FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, **keep, 1));
                return v == 7 ? Status::Ok() : Status::Internal("keep changed");
              }).ok());
  EXPECT_EQ(rows, 1000);
  EXPECT_EQ(sum, 999 * 1000);
}

INSTANTIATE_TEST_SUITE_P(Engines, DbProcessTest, testing::Values("pool", "pool-tcp", "sharded"),
                         [](const auto& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace farpool::db

int main(int argc, char** argv) {
  const std::string role = farpool::db::Env("FARPOOL_WORKER");
  if (!role.empty()) {
    const uint64_t seed = std::strtoull(farpool::db::Env("FARPOOL_SEED", "1").c_str(), nullptr, 10);
    const int id = std::atoi(farpool::db::Env("FARPOOL_WORKER_ID", "0").c_str());
    farpool::Status s = role == "bank"      ? farpool::db::BankWorker(seed + id)
                        : role == "cycle"   ? farpool::db::CycleWorker(seed, id)
                        : role == "counter" ? farpool::db::CounterWorker(seed, id)
                        : role == "bulk"    ? farpool::db::BulkWorker(seed, id)
                                         : farpool::Status::InvalidArgument("unknown role " + role);
    if (!s.ok()) std::fprintf(stderr, "worker %s %d: %s\n", role.c_str(), id, s.ToString().c_str());
    return s.ok() ? 0 : 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
