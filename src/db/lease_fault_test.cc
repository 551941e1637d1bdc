// Live sessions that lose their lease in the middle of commits, with real processes:
// `farpool server` processes hold the data; kWorkers compute processes (this binary re-run
// with FARPOOL_WORKER=mixed) run bank transfers and Cycle steps on kThreads sessions each,
// plus an auditor session that checks, in every snapshot, the bank total and that the ring
// is one ring. The database's lease is short (kLease) and one worker is made to outlive it:
//
//   ControlWithoutFaults     the same run without a fault (the checks themselves are sound).
//   SigstopOutlivesLease     the parent SIGSTOPs a worker for several leases, then SIGCONTs it
//                            (twice, different workers): the others fence it and recover its
//                            commits while it is stopped. On shared memory fencing evicts it
//                            first: its memory servers kill it (a store it was about to make
//                            can never land late); a stopped worker that was not fenced
//                            resumes and goes on.
//   StoppedProcessIsEvictedAndReopens (TCP)
//                            one worker (FARPOOL_WORKER=ddl) is SIGSTOPped while the parent
//                            fences its slots, its system session's included, which evicts
//                            it: the servers close its connections. After SIGCONT its old
//                            session says Unavailable (fenced) or Evicted (its pool
//                            connection is refused), and a database it opens again runs
//                            CreateTable, DropTable and transactions.
//   SigstopBetweenLockAndTrim{Deep,Shallow}, SigstopBetweenTrimCheckAndCut (TCP)
//                            deterministic: a worker stops itself (SIGSTOP) in a commit after
//                            locking a record whose version chain it will trim; the
//                            parent fences (evicts) it, rewrites the record, cuts and frees
//                            the chain, then continues it. The commit must return
//                            Unavailable or Evicted and nothing it issues may reach the pool
//                            any more.
//   WallClockStepsInOneWorker
//                            one worker runs under libfaketime (FAKETIME_TIMESTAMP_FILE,
//                            FAKETIME_NO_CACHE=1, DONT_FAKE_MONOTONIC=1): its wall clock
//                            (CLOCK_REALTIME only: with DONT_FAKE_MONOTONIC libfaketime
//                            leaves CLOCK_MONOTONIC and CLOCK_BOOTTIME, the lease clock,
//                            alone, as an NTP step does) jumps an hour forward, then back,
//                            while the others run. Nothing may change: under the control's
//                            long lease no worker may be evicted. Skipped when libfaketime is
//                            not installed (Debian package `faketime`).
//
// The TCP tests are the ones whose stopped worker must go on after it was fenced: over TCP an
// evicted process is disconnected, on shared memory it is killed. A session that gets
// Unavailable from Begin/Commit (fenced) is dropped and the worker opens a new one (or a new
// database) and goes on; Evicted (the process was fenced off the pool) drops the database too.
// After the run: the bank total is conserved (auditors saw it in every snapshot), the ring is one
// ring, no record stays locked after RecoverExpired, every record takes a write, and every worker
// finished within kDeadline (stragglers are killed: failure).
//
// Seeds: FARPOOL_SEED (printed).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "db/db_test_util.h"
#include "db/testing/cluster_test.h"
#include "db/testing/worker_processes.h"
#include "db/testing_hooks.h"
#include "farpool/db.h"

using namespace std::chrono_literals;

namespace farpool::db {
namespace {

using testing::Env;

constexpr int kWorkers = 3;
constexpr int kThreads = 3;  // two writers and an auditor
constexpr int kAccounts = 32;
constexpr int64_t kInitial = 1000;
constexpr int kRing = 16;
constexpr std::chrono::milliseconds kLease{400};          // the fault tests' database
constexpr std::chrono::milliseconds kControlLease{5000};  // the control's: a loaded machine
                                                          // must not fence it
constexpr std::chrono::seconds kDeadline{180};
constexpr int kMaxTxnsPerThread = 200000;  // a bound in case the stop file never comes
constexpr int kMaxAttempts = 20000;        // of one transaction that keeps aborting
constexpr int kReconnects = 300;           // new sessions (or databases) for one transaction

// The lease counts only where the database is created (the parent); workers open it.
DatabaseOptions Options(std::chrono::milliseconds lease = kLease) {
  DatabaseOptions o;
  o.engine = Engine::kPool;
  o.cluster_file = Env("FARPOOL_CLUSTER");
  o.lease = lease;
  return o;
}

// In one snapshot: the bank total, and the ring's length from 0 back to 0 (0 if it does not
// close within kRing hops or visits a node twice).
Status Audit(Transaction& txn, const Table& accounts, const Table& ring) {
  int64_t sum = 0;
  for (int a = 0; a < kAccounts; ++a) {
    FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, accounts, a));
    sum += v;
  }
  if (sum != kAccounts * kInitial) {
    return Status::Internal("audit: a snapshot saw a bank total of " + std::to_string(sum) +
                            ", not " + std::to_string(kAccounts * kInitial));
  }
  std::set<int64_t> seen;
  int64_t at = 0;
  for (int i = 0; i < kRing; ++i) {
    if (!seen.insert(at).second) break;
    FARPOOL_ASSIGN_OR_RETURN(at, GetInt(txn, ring, at));
  }
  if (at != 0 || seen.size() != static_cast<size_t>(kRing)) {
    return Status::Internal("audit: the ring is broken (" + std::to_string(seen.size()) +
                            " distinct nodes before returning to " + std::to_string(at) + ")");
  }
  return Status::Ok();
}

// ------------------------------------------------------------------ worker

// A thread's connection: its own Database handle (its own pool connection), the tables, a
// session. Each piece is made again when it is found broken.
struct Connection {
  std::unique_ptr<Database> db;
  const Table* accounts = nullptr;
  const Table* ring = nullptr;
  std::unique_ptr<Session> session;

  Status Ensure() {
    if (!db) {
      FARPOOL_ASSIGN_OR_RETURN(db, Database::Open(Options()));
      FARPOOL_ASSIGN_OR_RETURN(accounts, db->OpenTable("accounts"));
      FARPOOL_ASSIGN_OR_RETURN(ring, db->OpenTable("ring"));
    }
    if (!session) {
      FARPOOL_ASSIGN_OR_RETURN(session, db->NewSession());
    }
    return Status::Ok();
  }
  void Drop(bool database) {
    session.reset();
    if (database) db.reset();
  }
};

Status MixedWorker(uint64_t seed, int id) {
  const std::string stop_file = Env("FARPOOL_STOP_FILE");
  std::vector<Status> results(kThreads);
  std::atomic<int> fenced{0}, reconnected{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      Status& result = results[th];
      Connection c;
      // Runs `body` to commit. A fenced session (Unavailable) is replaced by a new one; if no
      // new session can be had (the pool connection itself gave up on a server), or the
      // process was evicted (Evicted: its pool connection is refused for good), the database
      // is opened again. The transaction then runs again as a new one: a transfer or Cycle
      // step may run twice, and both invariants hold either way.
      auto run = [&](const std::function<Status(Transaction&)>& body) -> Status {
        Status last;
        for (int attempt = 0; attempt < kReconnects; ++attempt) {
          if (Status e = c.Ensure(); !e.ok()) {
            last = e.WithContext("reconnecting");
            ++reconnected;
            c.Drop(/*database=*/true);
            std::this_thread::sleep_for(20ms);
            continue;
          }
          Status s = RunTransaction(*c.session, body, kMaxAttempts);
          if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kEvicted) return s;
          last = s;
          ++fenced;
          c.Drop(/*database=*/s.code() == StatusCode::kEvicted);
        }
        return last.WithContext("still unavailable after " + std::to_string(kReconnects) +
                                " new sessions");
      };
      // The tables of the current connection (valid while it lasts; run() re-resolves them).
      auto accounts = [&]() -> const Table& { return *c.accounts; };
      auto ring = [&]() -> const Table& { return *c.ring; };
      std::mt19937_64 rng(seed * 7919 + id * 31 + th);
      for (int i = 0; i < kMaxTxnsPerThread && result.ok(); ++i) {
        if (i % 16 == 0 && std::filesystem::exists(stop_file)) break;
        if (th == kThreads - 1) {
          result = run([&](Transaction& txn) { return Audit(txn, accounts(), ring()); });
        } else if (rng() % 2 == 0) {
          const int64_t from = rng() % kAccounts, to = rng() % kAccounts, amount = rng() % 100;
          result = run([&](Transaction& txn) -> Status {
            FARPOOL_ASSIGN_OR_RETURN(int64_t a, GetInt(txn, accounts(), from));
            FARPOOL_RETURN_IF_ERROR(PutInt(txn, accounts(), from, a - amount));
            FARPOOL_ASSIGN_OR_RETURN(int64_t b, GetInt(txn, accounts(), to));
            return PutInt(txn, accounts(), to, b + amount);
          });
        } else {
          const int64_t a = rng() % kRing;
          result = run([&](Transaction& txn) { return CycleStep(txn, ring(), a); });
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::fprintf(stderr, "worker %d: %d sessions replaced after Unavailable, %d reconnects\n", id,
               fenced.load(), reconnected.load());
  for (auto& r : results) FARPOOL_RETURN_IF_ERROR(r);
  return Status::Ok();
}

// Runs a transfer, says it is ready (FARPOOL_READY_FILE), waits for FARPOOL_RESUMED_FILE (the
// parent stops it past the lease meanwhile and fences its slots, which evicts this process from
// the servers), then checks that its old session was fenced (else the stop proved nothing) and
// that this process, with a database opened again, runs DDL and transactions.
Status DdlWorker(uint64_t /*seed*/, int id) {
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(Options()));
  FARPOOL_ASSIGN_OR_RETURN(const Table* accounts, db->OpenTable("accounts"));
  FARPOOL_ASSIGN_OR_RETURN(auto session, db->NewSession());
  auto transfer = [&](Session& s) {
    return RunTransaction(s, [&](Transaction& txn) -> Status {
      FARPOOL_ASSIGN_OR_RETURN(int64_t a, GetInt(txn, *accounts, 0));
      FARPOOL_RETURN_IF_ERROR(PutInt(txn, *accounts, 0, a - 5));
      FARPOOL_ASSIGN_OR_RETURN(int64_t b, GetInt(txn, *accounts, 1));
      return PutInt(txn, *accounts, 1, b + 5);
    });
  };
  FARPOOL_RETURN_IF_ERROR(transfer(*session));
  std::ofstream(Env("FARPOOL_READY_FILE")) << "ready\n";
  FARPOOL_RETURN_IF_ERROR(testing::WaitForFile(Env("FARPOOL_RESUMED_FILE"), 60s));
  Status stale = transfer(*session);
  if (stale.code() != StatusCode::kUnavailable && stale.code() != StatusCode::kEvicted) {
    return Status::Internal("the session outlived a stop past its lease (" + stale.ToString() +
                            "): the parent did not fence this process, the test proves nothing");
  }
  session.reset();
  FARPOOL_ASSIGN_OR_RETURN(db, Database::Open(Options()));
  FARPOOL_ASSIGN_OR_RETURN(accounts, db->OpenTable("accounts"));
  const std::string name = "ddl" + std::to_string(id);
  auto created = db->CreateTable(name, Schema{{"v", ColumnType::kInt64}});
  if (!created.ok()) return created.status().WithContext("CreateTable after the stop");
  auto fresh = db->NewSession();
  if (!fresh.ok()) return fresh.status().WithContext("a new session after the stop");
  FARPOOL_RETURN_IF_ERROR(
      RunTransaction(**fresh, [&](Transaction& txn) { return PutInt(txn, **created, 1, 1); }));
  FARPOOL_RETURN_IF_ERROR(transfer(**fresh));
  Status dropped = db->DropTable(name);
  if (!dropped.ok()) return dropped.WithContext("DropTable after the stop");
  return Status::Ok();
}

constexpr int kOrphanRows = 200;

// Leaves work for the garbage collector and is killed with it still queued (the parent holds a
// snapshot older than all of it, so none of it can be collected first): "od" (ordered,
// kOrphanRows rows) is dropped, and every other key of "ot" (kOrphanRows rows) is deleted.
// Then says it is ready (FARPOOL_READY_FILE) and waits to be killed.
Status OrphansWorker(uint64_t /*seed*/, int /*id*/) {
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(Options()));
  const Schema schema{{"v", ColumnType::kInt64}};
  FARPOOL_ASSIGN_OR_RETURN(const Table* od,
                           db->CreateTable("od", schema, TableOptions{.ordered = true}));
  FARPOOL_ASSIGN_OR_RETURN(const Table* ot, db->CreateTable("ot", schema));
  FARPOOL_ASSIGN_OR_RETURN(auto session, db->NewSession());
  FARPOOL_RETURN_IF_ERROR(RunTransaction(*session, [&](Transaction& txn) -> Status {
    for (int k = 0; k < kOrphanRows; ++k) {
      FARPOOL_RETURN_IF_ERROR(PutInt(txn, *od, k, k));
      FARPOOL_RETURN_IF_ERROR(PutInt(txn, *ot, k, k));
    }
    return Status::Ok();
  }));
  FARPOOL_RETURN_IF_ERROR(RunTransaction(*session, [&](Transaction& txn) -> Status {
    for (int k = 0; k < kOrphanRows; k += 2) FARPOOL_RETURN_IF_ERROR(txn.Delete(*ot, k));
    return Status::Ok();
  }));
  FARPOOL_RETURN_IF_ERROR(db->DropTable("od"));
  std::ofstream(Env("FARPOOL_READY_FILE")) << "ready\n";
  for (;;) std::this_thread::sleep_for(1s);
}

// A commit that stops its own process (SIGSTOP) at fault point FARPOOL_STALL_AT ("locked" or
// "trimming"): one rewrite of account 0, whose chain the parent made long enough to be
// trimmed by this commit. The parent continues it after fencing (evicting) it and freeing that
// chain.
Status StalledTrimWorker(uint64_t, int) {
  DatabaseOptions o = Options();
  const std::string at = Env("FARPOOL_STALL_AT");
  o.testing = std::make_shared<db::TestingHooks>(
      db::TestingHooks{.commit_hook = [at](std::string_view point) {
        if (point == at) raise(SIGSTOP);
      }});
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(o));
  FARPOOL_ASSIGN_OR_RETURN(const Table* accounts, db->OpenTable("accounts"));
  FARPOOL_ASSIGN_OR_RETURN(auto session, db->NewSession());
  FARPOOL_ASSIGN_OR_RETURN(auto txn, session->Begin());
  FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(*txn, *accounts, 0));
  FARPOOL_RETURN_IF_ERROR(PutInt(*txn, *accounts, 0, v));
  Status s = txn->Commit();
  if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kEvicted) {
    return Status::Internal("the commit that outlived its lease returned " + s.ToString() +
                            ", not Unavailable (fenced) or Evicted");
  }
  // Evicted: nothing this process issues reaches the pool, so it can neither cut nor free the
  // chain that is no longer its own.
  auto r = db->CollectGarbage();
  if (r.ok() || (r.status().code() != StatusCode::kUnavailable &&
                 r.status().code() != StatusCode::kEvicted)) {
    return Status::Internal("the fenced process still works on the pool (collection: " +
                            r.status().ToString() + "): it was not evicted");
  }
  return Status::Ok();
}

// ------------------------------------------------------------------ parent

class LeaseFaultTest : public testing::ClusterTest {
 protected:
  LeaseFaultTest() : ClusterTest("farpool-lease-fault", FabricOfThisTest()) {}
  // TCP for the tests whose stopped worker must find itself fenced and go on.
  static Fabric FabricOfThisTest() {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    return test.rfind("SigstopBetween", 0) == 0 || test == "StoppedProcessIsEvictedAndReopens"
               ? Fabric::kTcp
               : Fabric::kShm;
  }
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(ClusterTest::SetUp());
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    // The control's long lease: no worker may be evicted (a loaded machine must not fence
    // anyone), so any eviction there is a failure.
    lease_ = test == "ControlWithoutFaults" || test == "WallClockStepsInOneWorker" ? kControlLease
                                                                                   : kLease;
    auto db = Database::Open(Options(lease_));  // creates the database with lease_
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    auto a = db_->CreateTable("accounts", Schema{{"balance", ColumnType::kInt64}});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto r = db_->CreateTable("ring", Schema{{"next", ColumnType::kInt64}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    accounts_ = *a;
    ring_ = *r;
    auto session = db_->NewSession();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    session_ = std::move(*session);
    Status s = RunTransaction(*session_, [&](Transaction& txn) -> Status {
      for (int i = 0; i < kAccounts; ++i)
        FARPOOL_RETURN_IF_ERROR(PutInt(txn, *accounts_, i, kInitial));
      for (int i = 0; i < kRing; ++i)
        FARPOOL_RETURN_IF_ERROR(PutInt(txn, *ring_, i, (i + 1) % kRing));
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    // The parent takes no part in the run (its own lease and server connections could suffer
    // from the faults); it opens the database again to check it afterwards.
    session_.reset();
    db_.reset();
  }
  void Reopen() {
    auto db = Database::Open(Options(lease_));
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    auto a = db_->OpenTable("accounts");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto r = db_->OpenTable("ring");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    accounts_ = *a;
    ring_ = *r;
    auto session = db_->NewSession();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    session_ = std::move(*session);
  }
  // The parent's own session may have been fenced too (a worker whose clock jumped forward
  // sees every lease expired): like the workers, it takes a new session.
  Status RunChecker(const std::function<Status(Transaction&)>& body) {
    for (int attempt = 0;; ++attempt) {
      if (!session_) {
        auto fresh = db_->NewSession();
        if (!fresh.ok()) return fresh.status().WithContext("a new session for the checker");
        session_ = std::move(*fresh);
      }
      Status s = RunTransaction(*session_, body, kMaxAttempts);
      if (s.code() != StatusCode::kUnavailable || attempt == 3) return s;
      std::fprintf(stderr, "checker: %s; taking a new session\n", s.ToString().c_str());
      session_.reset();
    }
  }

  // The interleaving behind a rare failure of SigstopOutlivesLease (a worker exiting with
  // "version node ... fails its checksum"), made deterministic. A commit reads the
  // announcement array when it locks, and then trims a hot record's chain (>= 8 nodes) below
  // the version the oldest snapshot sees. A worker stops itself between the lock and the trim
  // (SIGSTOP at "locked") while this process fences it, rewrites the record, cuts its whole
  // chain and frees it (some nodes become free-list bundles, others stay intact), then
  // continues it. The stalled commit must return Unavailable and cut nothing; walking on into
  // the freed chain it either meets a node that fails its checksum or cuts a chain that was
  // freed already, whose nodes are then freed twice (later handed to two writers at once,
  // under readers whose leases are valid). `seen`: the version of account 0 that the oldest
  // snapshot sees when the worker locks, i.e. where its trim would cut; `at`: where the worker
  // stops ("locked", or "trimming": after its last lease check, before the cut's CAS).
  void StallBeforeTrim(int seen, const std::string& at) {
    ASSERT_NO_FATAL_FAILURE(Reopen());
    auto write = [&] {
      return RunChecker([&](Transaction& txn) { return PutInt(txn, *accounts_, 0, kInitial); });
    };
    auto r0 = db_->NewSession();
    auto r = db_->NewSession();
    ASSERT_TRUE(r0.ok() && r.ok());
    // Account 0 holds version 1. r0's snapshot sees it and keeps every later version (no trim
    // cuts anything while it runs); r's sees version `seen`.
    // (A transaction takes its snapshot at its first read.)
    auto old = (*r0)->Begin();
    ASSERT_TRUE(old.ok()) << old.status().ToString();
    ASSERT_TRUE(GetInt(**old, *accounts_, 0).ok());
    for (int v = 2; v <= seen; ++v) ASSERT_OK(write());
    auto mid = (*r)->Begin();
    ASSERT_TRUE(mid.ok()) << mid.status().ToString();
    ASSERT_TRUE(GetInt(**mid, *accounts_, 0).ok());
    for (int v = seen + 1; v <= 20; ++v) ASSERT_OK(write());  // chain: versions 17 .. 1
    old->reset();
    r0->reset();  // its announcement goes: r's is the oldest when the worker locks

    auto spawned = testing::SpawnWorker("stalled_trim", 0,
                                        {{"FARPOOL_CLUSTER", cluster_->cluster_file()},
                                         {"FARPOOL_SEED", std::to_string(seed_)},
                                         {"FARPOOL_STALL_AT", at}});
    ASSERT_TRUE(spawned.ok()) << spawned.status().ToString();
    const pid_t worker = *spawned;
    // Wait (bounded) until it has locked account 0 and stopped itself.
    bool stopped = false;
    for (auto give_up = std::chrono::steady_clock::now() + kDeadline;
         !stopped && std::chrono::steady_clock::now() < give_up;) {
      int status = 0;
      const pid_t w = waitpid(worker, &status, WNOHANG | WUNTRACED);
      ASSERT_NE(w, -1) << "waitpid: " << strerror(errno);
      if (w == worker) {
        ASSERT_TRUE(WIFSTOPPED(status)) << "the worker ended before its commit locked (status "
                                        << status << "; its stderr says why)";
        stopped = true;
      } else {
        std::this_thread::sleep_for(10ms);
      }
    }
    if (!stopped) {
      testing::ReapWorkers({worker}, 0s);
      FAIL() << "the worker never reached its commit";
    }
    // While it is stopped: r ends, the worker's slots are fenced and its lock broken, and the
    // next write of account 0 (no snapshot older than it now) cuts the whole chain, which
    // this process frees.
    mid->reset();
    r->reset();
    ASSERT_OK(db_->RecoverExpired());
    auto before = db_->CollectGarbage();
    ASSERT_TRUE(before.ok()) << before.status().ToString();
    ASSERT_OK(write());
    uint64_t freed = 0;
    for (int i = 0; i < 500 && freed < 17; ++i) {
      auto g = db_->CollectGarbage();
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      freed = g->nodes_freed - before->nodes_freed;
      if (freed < 17) std::this_thread::sleep_for(10ms);
    }
    ASSERT_EQ(freed, 17u) << "the chain of account 0 (versions 17 .. 1) was not freed";
    kill(worker, SIGCONT);
    for (const auto& w : testing::ReapWorkers({worker}, kDeadline))
      EXPECT_TRUE(w.Succeeded()) << w.Describe() << " (its stderr says why)";
    Status audit = RunChecker([&](Transaction& txn) { return Audit(txn, *accounts_, *ring_); });
    EXPECT_TRUE(audit.ok()) << audit.ToString();
  }

  std::string StopFile() const { return dir_ + "/stop"; }

  std::vector<pid_t> Spawn(const std::vector<testing::EnvVars>& extra) {
    std::vector<pid_t> pids;
    for (int w = 0; w < kWorkers; ++w) {
      testing::EnvVars env = {{"FARPOOL_CLUSTER", cluster_->cluster_file()},
                              {"FARPOOL_SEED", std::to_string(seed_)},
                              {"FARPOOL_STOP_FILE", StopFile()}};
      if (w < static_cast<int>(extra.size()))
        env.insert(env.end(), extra[w].begin(), extra[w].end());
      auto pid = testing::SpawnWorker("mixed", w, env);
      EXPECT_TRUE(pid.ok()) << pid.status().ToString();
      if (pid.ok()) pids.push_back(*pid);
    }
    spawned_.insert(spawned_.end(), pids.begin(), pids.end());
    return pids;
  }

  // libfaketime gives each process it is preloaded into a shared-memory segment and a
  // semaphore named by its pid, removed only at a clean exit: a worker killed by its eviction
  // would leave them in /dev/shm for good.
  void TearDown() override {
    for (pid_t pid : spawned_) {
      const std::string id = std::to_string(pid);
      std::error_code ignored;
      std::filesystem::remove("/dev/shm/faketime_shm_" + id, ignored);
      std::filesystem::remove("/dev/shm/sem.faketime_sem_" + id, ignored);
    }
    ClusterTest::TearDown();
  }

  // Tells the workers to stop, waits for them (bounded), then checks every invariant.
  // A worker may have been evicted (killed) instead of finishing: one in evictable_ (stopped
  // past its lease by the test), or, under the short fault lease, any worker whose renewal
  // thread the loaded machine starved for a lease. The control (long lease) allows none.
  void StopAndCheck(const std::vector<pid_t>& pids) {
    std::ofstream(StopFile()) << "stop\n";
    for (const auto& w : testing::ReapWorkers(pids, kDeadline)) {
      if (w.Evicted() && (evictable_.count(w.pid) || lease_ == kLease)) {
        if (evictable_.count(w.pid)) ++evicted_;
        continue;
      }
      EXPECT_TRUE(w.Succeeded()) << w.Describe() << " (its stderr says why)";
    }
    // Sessions of the workers are gone; wait out their leases, then recover.
    std::this_thread::sleep_for(lease_ + lease_ / 2);
    ASSERT_NO_FATAL_FAILURE(Reopen());
    Status rs = db_->RecoverExpired();
    ASSERT_TRUE(rs.ok()) << rs.ToString();
    for (const Table* t : {accounts_, ring_}) {
      auto locked = db_->CountLocked(*t);
      ASSERT_TRUE(locked.ok()) << locked.status().ToString();
      EXPECT_EQ(*locked, 0u) << "records of '" << t->name() << "' still locked";
    }
    Status audit = RunChecker([&](Transaction& txn) { return Audit(txn, *accounts_, *ring_); });
    EXPECT_TRUE(audit.ok()) << audit.ToString();
    // Every record takes a write (none is frozen by a lock nobody will release).
    Status s = RunChecker([&](Transaction& txn) -> Status {
      for (const Table* t : {accounts_, ring_}) {
        const int n = t == accounts_ ? kAccounts : kRing;
        for (int i = 0; i < n; ++i) {
          FARPOOL_ASSIGN_OR_RETURN(int64_t v, GetInt(txn, *t, i));
          FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, i, v));
        }
      }
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  }

  std::chrono::milliseconds lease_{kLease};
  std::set<pid_t> evictable_;   // workers a fault may get evicted (stopped past their lease)
  std::vector<pid_t> spawned_;  // every worker started, for TearDown
  int evicted_ = 0;             // of those, killed by their memory servers
  const Table* accounts_ = nullptr;
  const Table* ring_ = nullptr;
};

// The same workload without a fault (and a lease long enough that a loaded machine does not
// fence anyone): the harness and its checks are sound, so a failure of the tests below comes
// from their fault.
TEST_F(LeaseFaultTest, ControlWithoutFaults) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  auto pids = Spawn({});
  ASSERT_EQ(pids.size(), size_t{kWorkers});
  std::this_thread::sleep_for(2s);
  StopAndCheck(pids);
}

TEST_F(LeaseFaultTest, SigstopOutlivesLease) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  std::mt19937_64 rng(seed_);
  auto pids = Spawn({});
  ASSERT_EQ(pids.size(), size_t{kWorkers});
  for (int round = 0; round < 2; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 500));
    const pid_t victim = pids[1 + round % (kWorkers - 1)];
    evictable_.insert(victim);
    kill(victim, SIGSTOP);
    std::this_thread::sleep_for(kLease * 4);  // the others meet its locks and fence it
    kill(victim, SIGCONT);
  }
  std::this_thread::sleep_for(1s);
  StopAndCheck(pids);
  EXPECT_GE(evicted_, 1) << "no stopped worker was evicted: were they fenced at all?";
}

TEST_F(LeaseFaultTest, StoppedProcessIsEvictedAndReopens) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  const std::string ready = dir_ + "/ready", resumed = dir_ + "/resumed";
  auto pid = testing::SpawnWorker("ddl", 0,
                                  {{"FARPOOL_CLUSTER", cluster_->cluster_file()},
                                   {"FARPOOL_SEED", std::to_string(seed_)},
                                   {"FARPOOL_READY_FILE", ready},
                                   {"FARPOOL_RESUMED_FILE", resumed}});
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  Status got_ready = testing::WaitForFile(ready, 60s);
  ASSERT_NO_FATAL_FAILURE(Reopen());
  kill(*pid, SIGSTOP);
  // Watches every other slot until it has stayed unchanged for lease + margin, then fences it:
  // both of the stopped worker's (its system session's and its session's).
  Status recovered = db_->RecoverExpired();
  std::this_thread::sleep_for(2 * kLease);  // and the maintenance thread, should it lag
  kill(*pid, SIGCONT);
  std::ofstream(resumed) << "resumed\n";
  EXPECT_TRUE(got_ready.ok()) << got_ready.ToString();
  EXPECT_TRUE(recovered.ok()) << recovered.ToString();
  session_.reset();
  db_.reset();
  StopAndCheck({*pid});
  auto names = db_->ListTables();
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(std::count(names->begin(), names->end(), "ddl0"), 0) << "the worker's drop is lost";
}

// A process killed with collection work queued (a dropped table not reclaimed yet, deleted
// records not removed yet) does not leak it: once its slots are fenced and every snapshot from
// before has ended, a sweep adopts the dropped table and queues the tombstones, and this
// process (which did neither) reclaims the table and removes exactly the deleted records.
TEST_F(LeaseFaultTest, CollectionQueuedByAKilledProcessIsFoundAgain) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  ASSERT_NO_FATAL_FAILURE(Reopen());
  auto old = session_->Begin();  // holds the LWM below everything the worker will do
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  const std::string ready = dir_ + "/ready";
  auto pid = testing::SpawnWorker(
      "orphans", 0, {{"FARPOOL_CLUSTER", cluster_->cluster_file()}, {"FARPOOL_READY_FILE", ready}});
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  Status got_ready = testing::WaitForFile(ready, 60s);
  kill(*pid, SIGKILL);
  for (const auto& w : testing::ReapWorkers({*pid}, kDeadline)) {
    EXPECT_TRUE(WIFSIGNALED(w.status) && WTERMSIG(w.status) == SIGKILL) << w.Describe();
  }
  ASSERT_TRUE(got_ready.ok()) << got_ready.ToString();
  (*old)->Rollback();
  old->reset();
  GcStats g;
  for (int i = 0; i < 3000 && (g.tables_reclaimed < 1 || g.records_removed < kOrphanRows / 2);
       ++i) {
    auto r = db_->CollectGarbage();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    g = *r;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(g.tables_reclaimed, 1u) << "the killed process's dropped table was not reclaimed";
  EXPECT_EQ(g.records_removed, uint64_t{kOrphanRows / 2})
      << "the killed process's deleted records were not removed";
  auto ot = db_->OpenTable("ot");
  ASSERT_TRUE(ot.ok()) << ot.status().ToString();
  Status s = RunChecker([&](Transaction& txn) -> Status {
    for (int k = 0; k < kOrphanRows; ++k) {
      auto v = GetInt(txn, **ot, k);
      if (k % 2 == 0 && v.status().code() != StatusCode::kNotFound) {
        return Status::Internal("deleted key " + std::to_string(k) + " reads " +
                                v.status().ToString());
      }
      if (k % 2 == 1 && (!v.ok() || *v != k)) {
        return Status::Internal("key " + std::to_string(k) + " lost: " + v.status().ToString());
      }
    }
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// A trim down to version 2: the stalled walk passes nodes that are free-list bundles now.
TEST_F(LeaseFaultTest, SigstopBetweenLockAndTrimDeep) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  StallBeforeTrim(2, "locked");
}

// A trim down to version 6: the stalled walk meets only freed nodes that still verify.
TEST_F(LeaseFaultTest, SigstopBetweenLockAndTrimShallow) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  StallBeforeTrim(6, "locked");
}

// The window after a check: stopped after the walk's last lease check, right before the cut's
// CAS, which would land on a freed node; evicted, the process reaches nothing any more.
TEST_F(LeaseFaultTest, SigstopBetweenTrimCheckAndCut) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  StallBeforeTrim(6, "trimming");
}

// The multi-threaded libfaketime, or "" if it is not installed.
std::string LibFaketime() {
  std::vector<std::string> candidates = {
      Env("FARPOOL_LIBFAKETIME"), "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
      "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
      "/usr/lib/faketime/libfaketimeMT.so.1", "/usr/local/lib/faketime/libfaketimeMT.so.1"};
  for (const auto& c : candidates)
    if (!c.empty() && std::filesystem::exists(c)) return c;
  return "";
}

TEST_F(LeaseFaultTest, WallClockStepsInOneWorker) {
  const std::string lib = LibFaketime();
  if (lib.empty()) {
    GTEST_SKIP() << "libfaketime is not installed (Debian: apt-get install faketime; or set "
                    "FARPOOL_LIBFAKETIME to libfaketimeMT.so.1): cannot step one process's "
                    "wall clock";
  }
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  const std::string offset_file = dir_ + "/faketime";
  auto set_offset = [&](const std::string& spec) {
    std::ofstream(offset_file, std::ios::trunc) << spec << "\n";
  };
  set_offset("+0");
  auto pids = Spawn({{},
                     {{"LD_PRELOAD", lib},
                      {"FAKETIME_TIMESTAMP_FILE", offset_file},
                      {"FAKETIME_NO_CACHE", "1"},
                      {"DONT_FAKE_MONOTONIC", "1"}}});
  ASSERT_EQ(pids.size(), size_t{kWorkers});
  // Leases are judged on CLOCK_BOOTTIME, which a wall-clock step leaves alone: were they
  // judged on the wall clock, the step forward would show the stepped worker every other
  // lease expired (it would fence the others, which evicts them), the step back would show
  // the others its renewals long expired. Either eviction fails StopAndCheck.
  std::mt19937_64 rng(seed_);
  std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 500));
  set_offset("+3600");  // an hour forward: hundreds of leases
  std::this_thread::sleep_for(1500ms);
  set_offset("-3600");  // an hour back, behind the true time
  std::this_thread::sleep_for(1500ms);
  set_offset("+0");
  std::this_thread::sleep_for(1s);
  StopAndCheck(pids);
}

}  // namespace
}  // namespace farpool::db

int main(int argc, char** argv) {
  return farpool::db::testing::WorkerMain(argc, argv,
                                          {{"mixed", farpool::db::MixedWorker},
                                           {"ddl", farpool::db::DdlWorker},
                                           {"orphans", farpool::db::OrphansWorker},
                                           {"stalled_trim", farpool::db::StalledTrimWorker}});
}
