// Snapshot isolation checked on real histories: `farpool server` processes hold the data;
// kWorkers compute processes (this binary re-run with FARPOOL_WORKER=si) × kThreads sessions
// run random list-append transactions over kKeys keys of the `pool` engine and write every
// attempt (reads observed, elements appended, outcome) to a history file; the SI checker
// (db/testing/si_checker.h) then builds the dependency graph and looks for anomalies.
//
//   ListAppendHistoryIsSnapshotIsolated   the engine as built: no anomaly may be found.
//   ListAppendHistoryUnderSigstopIsSnapshotIsolated
//                                          the same (longer, lease 400 ms) while a worker is
//                                          SIGSTOPped past its lease, twice: no anomaly, and
//                                          the stopped workers are evicted (killed by their
//                                          memory server) when the others fence them.
//   ListAppendHistoryWithLockingReadsIsSnapshotIsolated
//                                          the same with locking reads (FARPOOL_FOR_UPDATE=1):
//                                          every appended key read with GetForUpdate, every
//                                          other up-front MultiGet a MultiGetForUpdate.
//   CheckerFindsLostUpdatesWithoutValidation
//                                          workers open the database with
//                                          TestingHooks::skip_validation: the checker must report
//                                          lost updates (or read skew) — it can see them.
//
// Each key's row holds its list as a kBytes column (int64 elements); an append reads the list
// and writes it back one element longer. Every other transaction reads all its keys up front
// with one MultiGet, the others one Get at a time. Elements are unique across the run:
// (worker+1)·10⁶ + thread·10⁵ + counter (transaction ids likewise). Seeds: FARPOOL_SEED (printed).
#include <gtest/gtest.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "db/db_test_util.h"
#include "db/testing/si_checker.h"
#include "db/testing/worker_processes.h"
#include "db/testing_hooks.h"
#include "farpool/db.h"
#include "pool/test_cluster.h"

using namespace std::chrono_literals;

namespace farpool::db {
namespace {

using testing::CheckReport;
using testing::Env;
using testing::Outcome;
using testing::Txn;

constexpr int kWorkers = 3;
constexpr int kThreads = 3;
constexpr int kKeys = 10;
constexpr int kAttempts = 400;  // transactions tried per thread (FARPOOL_SI_ATTEMPTS in workers)
constexpr int kMaxAttempts = 20000;  // ids and elements of a thread stay below the next thread's
constexpr std::chrono::milliseconds kFaultLease{400};
constexpr char kTable[] = "lists";

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

std::vector<int64_t> Decode(const std::string& bytes) {
  std::vector<int64_t> list(bytes.size() / 8);
  std::memcpy(list.data(), bytes.data(), list.size() * 8);
  return list;
}
std::string Encode(const std::vector<int64_t>& list) {
  return std::string(reinterpret_cast<const char*>(list.data()), list.size() * 8);
}

DatabaseOptions Options() {
  DatabaseOptions o;  // default options: the engine's own timestamps, leases
  o.engine = Engine::kPool;
  o.cluster_file = Env("FARPOOL_CLUSTER");
  if (Env("FARPOOL_SKIP_VALIDATION") == "1") {
    o.testing = std::make_shared<db::TestingHooks>(db::TestingHooks{.skip_validation = true});
  }
  return o;
}

// ------------------------------------------------------------------ worker

bool Fenced(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kEvicted;
}

// One attempt: random reads and appends, recorded whatever its outcome.
// Unavailable (the session was fenced, or the pool connection gave up on a server) or Evicted
// (the process was fenced off the pool; on shared memory it is being killed) sets
// *unavailable (with the reason): the caller replaces the session. Before Commit the attempt counts
// as aborted (nothing was installed); from Commit its outcome is unknown. `committing` gets
// the attempt (outcome unknown) right before Commit: a process killed in Commit (evicted by a
// memory server) has recorded it, and recovery may well finish that commit.
Result<Txn> Attempt(Session& session, const Table& t, std::mt19937_64& rng, uint64_t txn_id,
                    uint64_t session_id, int64_t* next_element, Status* unavailable,
                    const std::function<void(const Txn&)>& committing) {
  const bool for_update = Env("FARPOOL_FOR_UPDATE") == "1";
  Txn rec;
  rec.id = txn_id;
  rec.session = session_id;
  rec.begin_ns = MonotonicNs();
  auto begun = session.Begin();
  if (!begun.ok()) {
    if (!Fenced(begun.status())) return begun.status();
    *unavailable = begun.status();
    rec.outcome = Outcome::kAborted;
    return rec;
  }
  auto txn = std::move(*begun);
  std::map<int64_t, std::vector<int64_t>> current;  // key → list as this transaction sees it
  struct Op {
    int64_t key;
    bool append;
  };
  std::vector<Op> plan(1 + rng() % 4);
  for (Op& op : plan) {
    op.key = static_cast<int64_t>(rng() % kKeys);
    op.append = rng() % 2 == 0;
  }
  Status s;
  if (txn_id % 2 == 0) {
    // Every other transaction reads all its keys first, with one MultiGet.
    std::vector<TableKey> keys;
    for (const Op& op : plan) {
      if (std::none_of(keys.begin(), keys.end(),
                       [&](const TableKey& k) { return k.key == op.key; }))
        keys.push_back({&t, op.key});
    }
    std::vector<Row> rows;
    std::vector<Status> found;
    s = for_update && txn_id % 4 == 0 ? txn->MultiGetForUpdate(keys, &rows, &found)
                                      : txn->MultiGet(keys, &rows, &found);
    for (size_t i = 0; i < keys.size() && s.ok(); ++i) {
      s = found[i];
      if (!s.ok()) break;
      auto it = current.emplace(keys[i].key, Decode(rows[i].GetBytes(0))).first;
      rec.reads.push_back({keys[i].key, it->second});
    }
  }
  for (size_t i = 0; i < plan.size() && s.ok(); ++i) {
    const int64_t key = plan[i].key;
    const bool append = plan[i].append;
    auto it = current.find(key);
    if (it == current.end()) {  // the external read of this key
      Row row;
      s = for_update && append ? txn->GetForUpdate(t, key, &row) : txn->Get(t, key, &row);
      if (!s.ok()) break;
      it = current.emplace(key, Decode(row.GetBytes(0))).first;
      rec.reads.push_back({key, it->second});
    }
    if (!append) continue;
    const int64_t e = (*next_element)++;
    it->second.push_back(e);
    auto a = std::find_if(rec.appends.begin(), rec.appends.end(),
                          [&](const testing::KeyAppend& x) { return x.key == key; });
    if (a == rec.appends.end()) {
      rec.appends.push_back({key, {}});
      a = rec.appends.end() - 1;
    }
    a->elements.push_back(e);
    Row row(t.schema());
    row.SetBytes(0, Encode(it->second));
    s = txn->Put(t, key, row);
  }
  if (s.ok()) {
    rec.outcome = Outcome::kUnknown;
    committing(rec);
    s = txn->Commit();
    rec.outcome = s.ok()                             ? Outcome::kCommitted
                  : s.code() == StatusCode::kAborted ? Outcome::kAborted
                                                     : Outcome::kUnknown;
    if (Fenced(s)) *unavailable = s;
  } else {
    txn->Rollback();
    if (Fenced(s)) *unavailable = s;
    if (s.code() != StatusCode::kAborted && !Fenced(s))
      return s.WithContext("transaction " + std::to_string(txn_id));
    rec.outcome = Outcome::kAborted;
  }
  rec.end_ns = MonotonicNs();
  return rec;
}

// A checker's process: fences every session whose lease expired (which evicts its process)
// and finishes what it left. A stopped worker that holds no lock anyone needs is fenced only
// by such a call (or another process's garbage collection, when it needs the low-water mark).
Status RecoverWorker(uint64_t, int) {
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(Options()));
  return db->RecoverExpired();
}

Status SiWorker(uint64_t seed, int id) {
  const std::string dir = Env("FARPOOL_HISTORY_DIR");
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      Status& result = results[th];
      const std::string path =
          dir + "/history-w" + std::to_string(id) + "-t" + std::to_string(th) + ".jsonl";
      std::ofstream out(path);
      if (!out) {
        result = Status::IoError("cannot write " + path);
        return;
      }
      // This thread's own database handle and session, made again when Unavailable.
      std::unique_ptr<Database> db;
      const Table* t = nullptr;
      std::unique_ptr<Session> session;
      auto connect = [&]() -> Status {
        if (!db) {
          FARPOOL_ASSIGN_OR_RETURN(db, Database::Open(Options()));
          FARPOOL_ASSIGN_OR_RETURN(t, db->OpenTable(kTable));
        }
        if (!session) {
          FARPOOL_ASSIGN_OR_RETURN(session, db->NewSession());
        }
        return Status::Ok();
      };
      std::mt19937_64 rng(seed * 1000003 + id * 101 + th);
      // Readable in reports: worker 2, thread 1 runs T3100000.. and appends 3100000...
      const uint64_t base = (uint64_t(id) + 1) * 1000000 + uint64_t(th) * 100000;
      const uint64_t session_id = (uint64_t(id) + 1) * 10 + th;
      int64_t next_element = static_cast<int64_t>(base);
      int reconnects = 0, replaced = 0;
      const int attempts =
          std::clamp(std::atoi(Env("FARPOOL_SI_ATTEMPTS", "400").c_str()), 1, kMaxAttempts);
      for (int i = 0; i < attempts; ++i) {
        if (Status c = connect(); !c.ok()) {
          session.reset();
          db.reset();
          if (++reconnects > 100) {
            result = c.WithContext("reconnecting");
            return;
          }
          std::this_thread::sleep_for(20ms);
          --i;
          continue;
        }
        Status unavailable;
        // Each line is flushed at once: a worker killed meanwhile leaves whole lines, but for the
        // last, which a long line (several writes) may leave torn; LoadHistory skips it.
        auto record = [&](const Txn& txn) { out << testing::FormatTxn(txn) << "\n" << std::flush; };
        auto rec =
            Attempt(*session, *t, rng, base + i, session_id, &next_element, &unavailable, record);
        if (!rec.ok()) {
          result = rec.status();
          return;
        }
        record(*rec);
        if (!unavailable.ok()) {
          // A few of them on stderr: why sessions were replaced.
          if (++replaced <= 2) {
            std::fprintf(stderr, "worker %d thread %d: T%llu %s: %s\n", id, th,
                         static_cast<unsigned long long>(rec->id),
                         rec->outcome == Outcome::kUnknown ? "unknown outcome" : "aborted",
                         unavailable.ToString().c_str());
          }
          session.reset();
        }
      }
      out.flush();
      if (!out) result = Status::IoError("writing " + path + " failed");
    });
  }
  for (auto& th : threads) th.join();
  for (auto& r : results) FARPOOL_RETURN_IF_ERROR(r);
  return Status::Ok();
}

// ------------------------------------------------------------------ parent

class SiHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<TestCluster>(ShmTestCluster(FARPOOL_BINARY));
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status().ToString();
    DatabaseOptions d;  // creates the database: default options, or a short lease for faults
    d.cluster_file = cluster_->cluster_file();
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (test.find("Sigstop") != std::string::npos) d.lease = kFaultLease;
    auto db = Database::Open(d);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    auto t = db_->CreateTable(kTable, Schema{{"elems", ColumnType::kBytes}});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    table_ = *t;
    auto session = db_->NewSession();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    session_ = std::move(*session);
    Status s = RunTransaction(*session_, [&](Transaction& txn) -> Status {
      for (int k = 0; k < kKeys; ++k) {
        Row row(table_->schema());
        row.SetBytes(0, "");
        FARPOOL_RETURN_IF_ERROR(txn.Put(*table_, k, row));
      }
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    // The parent takes no part in the run; it opens the database again for the final read.
    session_.reset();
    db_.reset();
    history_dir_ = MakeTempDir("farpool-si-history");
  }
  void TearDown() override {
    session_.reset();
    db_.reset();
    cluster_.reset();
    if (!HasFailure()) {
      std::error_code ec;
      std::filesystem::remove_all(history_dir_, ec);
    } else {
      std::printf("histories kept in %s\n", history_dir_.c_str());
    }
  }

  // Runs the workers (`attempts` transactions per thread; `fault` is called with their pids
  // while they run), adds a final read of every key, and checks the history.
  CheckReport RunAndCheck(uint64_t seed, bool skip_validation, int attempts = kAttempts,
                          const std::function<void(const std::vector<pid_t>&)>& fault = {},
                          bool for_update = false) {
    std::vector<pid_t> pids;
    for (int w = 0; w < kWorkers; ++w) {
      auto pid = testing::SpawnWorker("si", w,
                                      {{"FARPOOL_CLUSTER", cluster_->cluster_file()},
                                       {"FARPOOL_SEED", std::to_string(seed)},
                                       {"FARPOOL_HISTORY_DIR", history_dir_},
                                       {"FARPOOL_SKIP_VALIDATION", skip_validation ? "1" : "0"},
                                       {"FARPOOL_SI_ATTEMPTS", std::to_string(attempts)},
                                       {"FARPOOL_FOR_UPDATE", for_update ? "1" : "0"}});
      EXPECT_TRUE(pid.ok()) << pid.status().ToString();
      if (pid.ok()) pids.push_back(*pid);
    }
    if (fault && pids.size() == size_t{kWorkers}) fault(pids);
    // A stopped worker is usually evicted (killed by its memory server) once the others fence
    // it; whatever it recorded stays in the history. Under the short fault lease a worker
    // whose renewal thread a loaded machine starves for a lease may be evicted too; without
    // faults (default lease) every worker must finish.
    int finished = 0;
    for (const auto& w : testing::ReapWorkers(pids, 300s)) {
      if (fault && w.Evicted()) {
        if (stopped_.count(w.pid)) ++evicted_;
        continue;
      }
      EXPECT_TRUE(w.Succeeded()) << w.Describe();
      ++finished;
    }
    // The final state of every key, read by the parent: the last word on each version order.
    DatabaseOptions d;
    d.cluster_file = cluster_->cluster_file();
    auto db = Database::Open(d);
    EXPECT_TRUE(db.ok()) << db.status().ToString();
    if (!db.ok()) return {};
    db_ = std::move(*db);
    auto table = db_->OpenTable(kTable);
    auto session = db_->NewSession();
    EXPECT_TRUE(table.ok() && session.ok());
    if (!table.ok() || !session.ok()) return {};
    table_ = *table;
    session_ = std::move(*session);
    Txn last;
    last.id = 1;
    last.session = 0;
    last.outcome = Outcome::kCommitted;
    Status s = RunTransaction(*session_, [&](Transaction& txn) -> Status {
      last.reads.clear();
      for (int k = 0; k < kKeys; ++k) {
        Row row;
        FARPOOL_RETURN_IF_ERROR(txn.Get(*table_, k, &row));
        last.reads.push_back({k, Decode(row.GetBytes(0))});
      }
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::vector<std::string> paths;
    for (const auto& e : std::filesystem::directory_iterator(history_dir_))
      paths.push_back(e.path());
    auto history = testing::LoadHistory(paths);
    EXPECT_TRUE(history.ok()) << history.status().ToString();
    if (!history.ok()) return {};
    history->push_back(last);
    if (finished == kWorkers) {
      EXPECT_EQ(history->size(), size_t{kWorkers} * kThreads * attempts + 1);
    } else {
      EXPECT_GE(history->size(), size_t(finished) * kThreads * attempts + 1);
    }
    return testing::CheckSnapshotIsolation(*history);
  }

  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<Session> session_;
  const Table* table_ = nullptr;
  std::string history_dir_;
  std::set<pid_t> stopped_;  // workers the fault stopped past their lease
  int evicted_ = 0;          // of those, killed by a memory server
};

TEST_F(SiHistoryTest, ListAppendHistoryIsSnapshotIsolated) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  CheckReport r = RunAndCheck(seed, /*skip_validation=*/false);
  std::printf("%s", r.ToString().c_str());
  EXPECT_TRUE(r.ok()) << r.ToString();
  // The history is not trivial: transactions committed, read each other, and overwrote what
  // others read.
  EXPECT_GT(r.committed, uint64_t{kWorkers * kThreads * kAttempts / 4}) << r.ToString();
  EXPECT_GT(r.wr_edges, 0u) << r.ToString();
  EXPECT_GT(r.rw_edges, 0u) << r.ToString();
}

TEST_F(SiHistoryTest, ListAppendHistoryWithLockingReadsIsSnapshotIsolated) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  CheckReport r = RunAndCheck(seed, /*skip_validation=*/false, kAttempts, {}, /*for_update=*/true);
  std::printf("%s", r.ToString().c_str());
  EXPECT_TRUE(r.ok()) << r.ToString();
  EXPECT_GT(r.committed, uint64_t{kWorkers * kThreads * kAttempts / 4}) << r.ToString();
  EXPECT_GT(r.wr_edges, 0u) << r.ToString();
  EXPECT_GT(r.rw_edges, 0u) << r.ToString();
}

TEST_F(SiHistoryTest, CheckerFindsLostUpdatesWithoutValidation) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  CheckReport r = RunAndCheck(seed, /*skip_validation=*/true);
  std::printf("%s", r.ToString().c_str());
  EXPECT_TRUE(r.Has("lost-update") || r.Has("G-single"))
      << "the broken build's history shows no lost update:\n"
      << r.ToString();
}

TEST_F(SiHistoryTest, ListAppendHistoryUnderSigstopIsSnapshotIsolated) {
  // As above, longer, with a lease of 400 ms, while the parent SIGSTOPs a worker for 4 leases
  // (twice): a checker process (or the others) fences it, which evicts it first (it maps the
  // servers' memory: they kill it), so a store it was about to make when stopped never lands. Its
  // attempts in Commit are in the history as unknown (recovery may have finished them).
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  CheckReport r = RunAndCheck(seed, /*skip_validation=*/false, 1500, [&](const auto& pids) {
    std::mt19937_64 rng(seed);
    for (int round = 0; round < 2; ++round) {
      const int id = 1 + round % (kWorkers - 1);
      // Stopped while still opening its database (no slot claimed yet) a worker has nothing to
      // fence: each of its threads has begun a transaction first (its history file has a line).
      const auto begun = std::chrono::steady_clock::now();
      auto running = [&] {
        for (int th = 0; th < kThreads; ++th) {
          std::error_code ec;
          const auto size =
              std::filesystem::file_size(history_dir_ + "/history-w" + std::to_string(id) + "-t" +
                                             std::to_string(th) + ".jsonl",
                                         ec);
          if (ec || size == 0) return false;
        }
        return true;
      };
      while (!running() && std::chrono::steady_clock::now() - begun < 120s) {
        std::this_thread::sleep_for(10ms);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 700));
      const pid_t victim = pids[id];
      stopped_.insert(victim);
      kill(victim, SIGSTOP);
      // Past its lease and margin, a checker process fences it whether or not it holds a lock
      // another worker meets (the victim may be stopped between transactions).
      std::this_thread::sleep_for(kFaultLease * 2);
      auto checker = testing::SpawnWorker("recover", kWorkers + round,
                                          {{"FARPOOL_CLUSTER", cluster_->cluster_file()}});
      EXPECT_TRUE(checker.ok()) << checker.status().ToString();
      if (checker.ok()) {
        for (const auto& c : testing::ReapWorkers({*checker}, 60s)) {
          EXPECT_TRUE(c.Succeeded()) << c.Describe();
        }
      }
      std::this_thread::sleep_for(kFaultLease * 2);
      kill(victim, SIGCONT);
    }
  });
  std::printf("%s", r.ToString().c_str());
  EXPECT_TRUE(r.ok()) << r.ToString();
  // The stopped workers mapped the servers' memory: fenced, they are evicted (killed) before
  // anyone recovers their commits, so no store they were about to make can land late.
  EXPECT_GE(evicted_, 1) << "no stopped worker was evicted: were they fenced at all?";
}

}  // namespace
}  // namespace farpool::db

int main(int argc, char** argv) {
  return farpool::db::testing::WorkerMain(
      argc, argv, {{"si", farpool::db::SiWorker}, {"recover", farpool::db::RecoverWorker}});
}
