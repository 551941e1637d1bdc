// The farpool VFS as a user runs it: the real `sqlite3` CLI loads the built extension and
// opens databases in the pool of a real server process; several CLI processes share one
// database; a process killed while holding RESERVED or EXCLUSIVE loses its locks after its
// lease and its hot journal (in the pool) is rolled back. Skipped if sqlite3 is not on PATH.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "pool/test_cluster.h"

namespace farpool {
namespace {

using namespace std::chrono_literals;

bool HaveSqlite3() { return std::system("command -v sqlite3 >/dev/null 2>&1") == 0; }

// The environment a sqlite3 CLI of this test runs with, as a shell prefix. In the
// ThreadSanitizer build an instrumented extension loads only into a process that has the
// runtime: the CLI (and only it: the shell does not run under a preloaded runtime) gets it.
#ifdef FARPOOL_TSAN_RUNTIME
constexpr const char* kCliEnv = "LD_PRELOAD=" FARPOOL_TSAN_RUNTIME " ";
#else
constexpr const char* kCliEnv = "";
#endif

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class SqliteVfsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartCluster(Fabric::kShm); }
  static void StartCluster(Fabric fabric, int servers = 1, bool netns = false) {
    if (!HaveSqlite3()) return;
    LocalClusterOptions o;
    o.servers = servers;
    o.netns = netns;
    o.memory = 128ull << 20;
    o.chunk_size = 1ull << 20;
    o.transport = fabric;
    o.progress = ProgressMode::kEvent;  // no busy-polling server beside the CLIs
    cluster_ = new TestCluster(o);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (!HaveSqlite3()) GTEST_SKIP() << "sqlite3 is not on PATH (Debian: apt-get install sqlite3)";
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status().ToString();
  }

  // The lines that load the extension and open `db` in the pool (`params`: more of the URI's,
  // each starting with '&').
  std::string Preamble(const std::string& db, const std::string& params = "") const {
    return std::string(".load ") + FARPOOL_VFS_EXTENSION + "\n" + OpenLine(db, params);
  }
  // The line that opens `db` in the pool once the extension is loaded.
  std::string OpenLine(const std::string& db, const std::string& params = "") const {
    return ".open file:" + db + "?vfs=farpool&cluster=" + cluster_->cluster_file() + params + "\n";
  }
  std::string Path(const std::string& name) const { return cluster_->dir() + "/" + name; }

  struct Run {
    int exit_code;
    std::string output;
  };
  // Runs `sqlite3 -batch` with `script` (after the preamble) on stdin, on `host` if given.
  Run Sql(const std::string& db, const std::string& script, const std::string& before = "",
          const TestClientHost* host = nullptr) const {
    static std::atomic<int> counter{0};
    const std::string file =
        Path("script-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".sql");
    std::ofstream(file) << before << Preamble(db) << script;
    // After the host's prefix (which ends in `env`), so that only the CLI gets kCliEnv.
    return Shell((host != nullptr ? host->Prefix() : "") + kCliEnv + "sqlite3 -batch < " + file);
  }
  // Runs `command` with sh, stderr into the output too.
  static Run Shell(const std::string& command) {
    FILE* p = popen((command + " 2>&1").c_str(), "r");
    std::string out;
    std::array<char, 4096> buf;
    while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
    const int status = pclose(p);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
  }

  // A sqlite3 CLI that reads commands as they are sent, output to a file; run under `prefix`
  // (TestClientHost::Argv, which execs the CLI in place) if given.
  class Interactive {
   public:
    explicit Interactive(const std::string& log, std::vector<std::string> prefix = {}) : log_(log) {
      int fds[2];
      EXPECT_EQ(pipe(fds), 0);
      pid_ = fork();
      if (pid_ == 0) {
        dup2(fds[0], 0);
        const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        dup2(out, 2);
        close(fds[1]);
#ifdef FARPOOL_TSAN_RUNTIME
        // For the CLI only: after a prefix (which ends in `env`) as an assignment of its own.
        if (prefix.empty()) {
          setenv("LD_PRELOAD", FARPOOL_TSAN_RUNTIME, 1);
        } else {
          prefix.push_back("LD_PRELOAD=" FARPOOL_TSAN_RUNTIME);
        }
#endif
        prefix.insert(prefix.end(), {"sqlite3", "-batch"});
        std::vector<char*> argv;
        for (std::string& a : prefix) argv.push_back(a.data());
        argv.push_back(nullptr);
        execvp(argv[0], argv.data());
        _exit(127);
      }
      close(fds[0]);
      in_ = fds[1];
    }
    ~Interactive() {
      if (in_ >= 0) close(in_);
      if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    void Send(const std::string& text) {
      ASSERT_EQ(write(in_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    }
    // The commands after which the CLI writes the file `path` itself (`.once`: no shell, which
    // `.system` would start and which cannot run under the ThreadSanitizer build's preload).
    static std::string Touch(const std::string& path) {
      return ".once " + path + "\nSELECT 'done';\n";
    }
    // Waits until `path` exists (the CLI ran Touch(path)).
    bool WaitFor(const std::string& path, std::chrono::seconds limit = 20s) {
      const auto deadline = std::chrono::steady_clock::now() + limit;
      while (!std::filesystem::exists(path)) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(10ms);
      }
      return true;
    }
    void Kill() {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    void Stop() { kill(pid_, SIGSTOP); }
    void Continue() { kill(pid_, SIGCONT); }
    // Waits (bounded) until the CLI has ended; the signal that ended it, 0 if it exited, -1 if
    // it is still running.
    int EndedBy(std::chrono::seconds limit) {
      const auto deadline = std::chrono::steady_clock::now() + limit;
      int status = 0;
      while (waitpid(pid_, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) return -1;
        std::this_thread::sleep_for(10ms);
      }
      pid_ = -1;
      return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    // Closes stdin and waits for the exit code.
    int Finish() {
      close(in_);
      in_ = -1;
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::string Output() const { return ReadFile(log_); }

   private:
    std::string log_;
    pid_t pid_ = -1;
    int in_ = -1;
  };

  // A table of 10,000 rows (id, v = 7 * id) in `db`, written in one transaction.
  void CreateRows(const std::string& db) {
    Run r = Sql(db,
                "CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER, pad TEXT);\n"
                "BEGIN;\n"
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000)\n"
                "  INSERT INTO t SELECT x, 7 * x, printf('%0100d', x) FROM c;\n"
                "COMMIT;\n");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(r.output, "") << r.output;
  }
  void ExpectRows(const std::string& db, const std::string& timeout = "") {
    Run r = Sql(db, timeout + "SELECT count(*), sum(v) FROM t;\nPRAGMA integrity_check;\n");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "10000|350035000\nok\n");
  }
  // CreateRows(db), then `a` opens `db` (with URI `params`) and runs `statements` (a
  // transaction it may leave open).
  void Hold(Interactive& a, const std::string& db, const std::string& statements,
            const std::string& params = "") {
    CreateRows(db);
    const std::string ready = Path(db + ".ready");
    a.Send(Preamble(db, params) + statements + Interactive::Touch(ready));
    ASSERT_TRUE(a.WaitFor(ready)) << a.Output();
  }
  // `a` takes RESERVED on `db` with an insert it leaves uncommitted.
  void HoldReserved(Interactive& a, const std::string& db) {
    Hold(a, db, "BEGIN IMMEDIATE;\nINSERT INTO t VALUES (20000, 0, '');\n");
  }
  // A writer that waits (busy timeout) gets in once the holder of HoldReserved is gone, and
  // the holder's insert is not there.
  void ExpectNextWriterGetsIn(const std::string& db) {
    Run w = Sql(db,
                ".timeout 20000\nBEGIN IMMEDIATE;\nINSERT INTO t VALUES (20001, 0, '');\n"
                "COMMIT;\nSELECT count(*) FROM t;\nPRAGMA integrity_check;\n");
    EXPECT_EQ(w.exit_code, 0) << w.output;
    EXPECT_EQ(w.output, "10001\nok\n");
  }

  static TestCluster* cluster_;
};
TestCluster* SqliteVfsTest::cluster_ = nullptr;

TEST_F(SqliteVfsTest, TheCliWritesAndAnotherProcessReads) {
  CreateRows("rows.db");
  ExpectRows("rows.db");
  // The command line of docs/files.md, with the cluster from the environment.
  Run r = Shell(std::string(kCliEnv) + "FARPOOL_CLUSTER=" + cluster_->cluster_file() +
                " sqlite3 -batch -cmd '.load " + FARPOOL_VFS_EXTENSION +
                "' -cmd '.open file:rows.db?vfs=farpool' :memory: 'SELECT count(*) FROM t;'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "10000\n");
}

TEST_F(SqliteVfsTest, NoClusterAndTooLongNamesAreExplained) {
  // The CLI goes on with its in-memory database: its exit code says nothing here.
  const std::string out = Shell(std::string("env -u FARPOOL_CLUSTER ") + kCliEnv +
                                "sqlite3 -batch -cmd '.load " + FARPOOL_VFS_EXTENSION +
                                "' -cmd '.log stderr' -cmd '.open file:x.db?vfs=farpool' "
                                ":memory: 'SELECT 1;'")
                              .output;
  EXPECT_NE(out.find("unable to open database"), std::string::npos) << out;
  EXPECT_NE(out.find("cluster=PATH/cluster.json"), std::string::npos) << out;

  Run r = Sql(std::string(300, 'n'), "SELECT 1;\n", ".log stderr\n");
  EXPECT_NE(r.output.find("unable to open database"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at most 255"), std::string::npos) << r.output;
}

TEST_F(SqliteVfsTest, ConcurrentIncrementsLoseNoUpdate) {
  Run setup = Sql("counter.db", "CREATE TABLE c(n INTEGER);\nINSERT INTO c VALUES (0);\n");
  ASSERT_EQ(setup.exit_code, 0) << setup.output;
  constexpr int kProcesses = 4, kIncrements = 50;
  std::string script = ".timeout 30000\n";
  for (int i = 0; i < kIncrements; ++i) {
    script += "BEGIN IMMEDIATE;\nUPDATE c SET n = n + 1;\nCOMMIT;\n";
  }
  std::vector<Run> runs(kProcesses);
  std::vector<std::thread> threads;
  for (int i = 0; i < kProcesses; ++i) {
    threads.emplace_back([&, i] { runs[i] = Sql("counter.db", script); });
  }
  for (auto& t : threads) t.join();
  for (const Run& r : runs) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "");
  }
  Run check = Sql("counter.db", "SELECT n FROM c;\nPRAGMA integrity_check;\n");
  EXPECT_EQ(check.output, std::to_string(kProcesses * kIncrements) + "\nok\n");
}

TEST_F(SqliteVfsTest, ASecondWriterThatCannotWaitGetsBusy) {
  Interactive a(Path("busy-a.log"));
  ASSERT_NO_FATAL_FAILURE(
      Hold(a, "busy.db", "BEGIN IMMEDIATE;\nUPDATE t SET v = v + 1 WHERE id = 1;\n"));
  Run b = Sql("busy.db", ".timeout 0\nBEGIN IMMEDIATE;\n");
  EXPECT_NE(b.output.find("database is locked"), std::string::npos) << b.output;
  // Readers are not blocked by RESERVED.
  Run reader = Sql("busy.db", "SELECT count(*) FROM t;\n");
  EXPECT_EQ(reader.output, "10000\n");
  a.Send("UPDATE t SET v = v - 1 WHERE id = 1;\nCOMMIT;\n");
  EXPECT_EQ(a.Finish(), 0) << a.Output();
  ExpectRows("busy.db");
}

// A writer SIGKILLed in the middle of a transaction: with a tiny page cache its changes have
// spilled into the database file under EXCLUSIVE, so the others must wait out its lease and
// roll its hot journal back.
TEST_F(SqliteVfsTest, AKilledExclusiveHolderIsRolledBackAfterItsLease) {
  Interactive a(Path("killed-a.log"));
  ASSERT_NO_FATAL_FAILURE(
      Hold(a, "killed.db", "PRAGMA cache_size = 2;\nBEGIN;\nUPDATE t SET v = v + 1;\n"));
  a.Kill();
  // Its EXCLUSIVE lock outlives it until the lease runs out.
  Run early = Sql("killed.db", "SELECT count(*) FROM t;\n");
  EXPECT_NE(early.output.find("database is locked"), std::string::npos) << early.output;
  ExpectRows("killed.db", ".timeout 20000\n");
  Run w = Sql("killed.db",
              ".timeout 20000\nUPDATE t SET v = v + 1 WHERE id = 1;\n"
              "SELECT v FROM t WHERE id = 1;\n");
  EXPECT_EQ(w.output, "8\n");
}

TEST_F(SqliteVfsTest, AKilledReservedHolderLetsTheNextWriterInAfterItsLease) {
  Interactive a(Path("reserved-a.log"));
  ASSERT_NO_FATAL_FAILURE(HoldReserved(a, "reserved.db"));
  a.Kill();
  Run early = Sql("reserved.db", "BEGIN IMMEDIATE;\n");
  EXPECT_NE(early.output.find("database is locked"), std::string::npos) << early.output;
  ExpectNextWriterGetsIn("reserved.db");
}

// A writer stopped (SIGSTOP) while it holds RESERVED, past its lease: the next writer sweeps
// its lease slot, which evicts it first — it maps the server's memory, so the server kills it,
// and nothing it was about to write can land after the next writer went ahead.
TEST_F(SqliteVfsTest, AStoppedWriterIsEvictedAndTheNextWriterGoesOn) {
  Interactive a(Path("stopped-a.log"));
  ASSERT_NO_FATAL_FAILURE(HoldReserved(a, "stopped.db"));
  a.Stop();
  ExpectNextWriterGetsIn("stopped.db");
  EXPECT_EQ(a.EndedBy(10s), SIGKILL) << "the stopped writer was not evicted: " << a.Output();
}

// A writer stopped (SIGSTOP) while it holds RESERVED, longer than its lease plus the margin
// others wait, while nobody wants its lock: its late renewal finds its lease slot still its own
// (nobody swept it) and takes the lease up again, so it commits (it used to fence itself for
// good: "disk I/O error" at COMMIT).
TEST_F(SqliteVfsTest, AStoppedWriterThatNobodySweptGoesOn) {
  Interactive a(Path("stalled-a.log"));
  ASSERT_NO_FATAL_FAILURE(HoldReserved(a, "stalled.db"));
  a.Stop();
  std::this_thread::sleep_for(3s);  // the lease is 1.5 s, the margin 0.5 s
  a.Continue();
  a.Send("COMMIT;\nSELECT count(*) FROM t;\nPRAGMA integrity_check;\n");
  EXPECT_EQ(a.Finish(), 0) << a.Output();
  EXPECT_EQ(a.Output(), "10001\nok\n");
}

// A reader that keeps its SHARED bit between transactions (header of sqlite_vfs.cc) and is
// killed while it is kept: its watch died with it, so only its lease gives the bit up. A
// writer is refused until then, gets in once it has run out, and the database is intact.
TEST_F(SqliteVfsTest, AKilledReaderThatKeptSharedLetsTheWriterInAfterItsLease) {
  Interactive a(Path("kept-killed.log"));
  ASSERT_NO_FATAL_FAILURE(
      Hold(a, "kept-killed.db", "SELECT v FROM t WHERE id = 1;\n", "&farpool_keep_idle_ms=60000"));
  a.Kill();
  Run early = Sql("kept-killed.db", ".timeout 0\nUPDATE t SET v = 100 WHERE id = 1;\n");
  EXPECT_NE(early.output.find("database is locked"), std::string::npos) << early.output;
  Run w = Sql("kept-killed.db",
              ".timeout 20000\nUPDATE t SET v = 100 WHERE id = 1;\n"
              "SELECT v FROM t WHERE id = 1;\nPRAGMA integrity_check;\n");
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_EQ(w.output, "100\nok\n");
}

// The same reader stopped (SIGSTOP) instead: its watch cannot give the bit up either, so the
// writer waits out its lease and sweeps it, which evicts the stopped reader first (it maps the
// server's memory: killed), so it can never read on under a lock that is gone.
TEST_F(SqliteVfsTest, AStoppedReaderThatKeptSharedIsEvictedAndTheWriterGoesOn) {
  Interactive a(Path("kept-stopped.log"));
  ASSERT_NO_FATAL_FAILURE(
      Hold(a, "kept-stopped.db", "SELECT v FROM t WHERE id = 1;\n", "&farpool_keep_idle_ms=60000"));
  a.Stop();
  Run w = Sql("kept-stopped.db",
              ".timeout 20000\nUPDATE t SET v = 100 WHERE id = 1;\n"
              "SELECT v FROM t WHERE id = 1;\nPRAGMA integrity_check;\n");
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_EQ(w.output, "100\nok\n");
  EXPECT_EQ(a.EndedBy(10s), SIGKILL) << "the stopped reader was not evicted: " << a.Output();
}

// The lock word has one set of bits per process, so two connections of one process must
// combine their levels: a connection that reads and ends must not take away the SHARED lock of
// another that is still reading, and neither may write under the other's read.
TEST_F(SqliteVfsTest, ConnectionsOfOneProcessShareItsLockLikeTwoProcesses) {
  Interactive a(Path("handles-a.log"));
  ASSERT_NO_FATAL_FAILURE(Hold(a, "handles.db", "BEGIN;\nSELECT count(*) FROM t;\n"));
  const std::string second = Path("handles.second");
  a.Send(".connection 1\n" + OpenLine("handles.db") +
         ".timeout 0\nSELECT count(*) FROM t;\nUPDATE t SET v = v + 1 WHERE id = 1;\n" +
         Interactive::Touch(second));
  ASSERT_TRUE(a.WaitFor(second)) << a.Output();
  // Connection 1's write needed EXCLUSIVE while connection 0 reads.
  EXPECT_NE(a.Output().find("database is locked"), std::string::npos) << a.Output();
  // Connection 0 still holds SHARED: another process cannot write either.
  Run b = Sql("handles.db", ".timeout 0\nUPDATE t SET v = v + 1 WHERE id = 1;\n");
  EXPECT_NE(b.output.find("database is locked"), std::string::npos) << b.output;
  a.Send(".connection 0\nCOMMIT;\n");
  a.Finish();  // exit code 1: the CLI reports connection 1's "database is locked"
  EXPECT_EQ(a.Output().find("locked", a.Output().find("locked") + 1), std::string::npos)
      << "connection 0's COMMIT failed too: " << a.Output();
  ExpectRows("handles.db");
  Run after =
      Sql("handles.db", "UPDATE t SET v = v + 1 WHERE id = 1;\nSELECT v FROM t WHERE id = 1;\n");
  EXPECT_EQ(after.output, "8\n");
}

TEST_F(SqliteVfsTest, WalWorksWithExclusiveLocking) {
  Run r = Sql("wal.db",
              "PRAGMA locking_mode = EXCLUSIVE;\nPRAGMA journal_mode = WAL;\n"
              "CREATE TABLE w(x);\nINSERT INTO w VALUES (1), (2), (3);\nSELECT sum(x) FROM w;\n");
  EXPECT_EQ(r.output, "exclusive\nwal\n6\n");
}

// Last of the suite (gtest runs tests in the order they are written): it leaves the shared
// cluster's pool full, and a file's header cannot come from the store's free list.
TEST_F(SqliteVfsTest, AFullPoolIsSqliteFullAndTheDatabaseStaysIntact) {
  CreateRows("full.db");
  Run r = Sql("full.db",
              "CREATE TABLE big(b BLOB);\n"
              "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 400)\n"
              "  INSERT INTO big SELECT randomblob(1000000) FROM c;\n",
              ".log stderr\n");
  EXPECT_NE(r.output.find("database or disk is full"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("OutOfMemory"), std::string::npos) << r.output;
  ExpectRows("full.db");
}

// The same VFS over TCP: every pool operation is a message to the server, so a statement's
// round trips can be counted (`PRAGMA farpool_round_trips`).
class SqliteVfsOverTcpTest : public SqliteVfsTest {
 protected:
  static void SetUpTestSuite() { StartCluster(Fabric::kTcp); }

  // Runs `script` on `db`: `skip` answer lines, then `repeats` times a query's answer (which
  // must be `value`) and `PRAGMA farpool_round_trips`. Returns the least growth of the count
  // from one repeat to the next (the smallest is judged: a lease renewal may land between two).
  uint64_t FewestRoundTripsPerRepeat(const std::string& db, const std::string& script, int skip,
                                     const std::string& value, size_t repeats) const {
    Run r = Sql(db, script);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::istringstream lines(r.output);
    std::string line, answer, count;
    for (int i = 0; i < skip; ++i) std::getline(lines, line);
    std::vector<uint64_t> counts;
    while (std::getline(lines, answer) && std::getline(lines, count)) {
      EXPECT_EQ(answer, value) << r.output;
      counts.push_back(std::stoull(count));
    }
    EXPECT_EQ(counts.size(), repeats) << r.output;
    uint64_t least = UINT64_MAX;
    for (size_t i = 1; i < counts.size(); ++i) least = std::min(least, counts[i] - counts[i - 1]);
    return least;
  }
};

// A reader that keeps SQLite's page cache between transactions sees another process's commit:
// the header refreshed in its lock's batch shows the new pages, SQLite's page-1 check the new
// change counter.
TEST_F(SqliteVfsOverTcpTest, AReaderSeesAnotherProcesssCommitAtItsNextTransaction) {
  Interactive a(Path("reader.log"));
  ASSERT_NO_FATAL_FAILURE(Hold(a, "seen.db", "SELECT v FROM t WHERE id = 1;\n"));
  Run w = Sql("seen.db", "UPDATE t SET v = 100 WHERE id = 1;\nDELETE FROM t WHERE id > 9000;\n");
  ASSERT_EQ(w.exit_code, 0) << w.output;
  a.Send("SELECT v FROM t WHERE id = 1;\nSELECT count(*) FROM t;\n");
  EXPECT_EQ(a.Finish(), 0) << a.Output();
  EXPECT_EQ(a.Output(), "7\n100\n9000\n");
}

// A read transaction whose pages SQLite has cached takes no round trip: the process kept its
// SHARED lock since the previous one (docs/files.md, "Read transactions without a round
// trip"). With the keeping turned off it takes one, the lock's (with the header, the
// hot-journal probe and page 1, whose change counter SQLite looks at; the unlock is posted):
// it was 3 before page 1 came with the lock and the unlock was posted. The smallest of several
// is judged (a lease renewal or a look of the watch may land between two counts).
TEST_F(SqliteVfsOverTcpTest, AReadTransactionOfCachedPagesCostsNoRoundTrip) {
  CreateRows("trips.db");
  std::string script;
  for (int i = 0; i < 9; ++i)
    script += "SELECT v FROM t WHERE id = 5;\nPRAGMA farpool_round_trips;\n";
  EXPECT_EQ(FewestRoundTripsPerRepeat("trips.db", script, 0, "35", 9), 0u)
      << "round trips of a read transaction that kept SHARED";
  EXPECT_EQ(FewestRoundTripsPerRepeat("trips.db", "PRAGMA farpool_keep_shared = 0;\n" + script, 1,
                                      "35", 9),
            1u)
      << "round trips of a read transaction that takes SHARED";
}

// The VFS's page cache keeps what a process read across its transactions: with SQLite's own
// cache at 10 pages, a scan of the table misses SQLite's cache on every page, yet a scan again
// costs only the lock's round trip (none under a kept SHARED lock); without the VFS's cache
// (farpool_cache_mib = 0) it costs a round trip per page again.
TEST_F(SqliteVfsOverTcpTest, AReReadFromTheVfsCacheCostsOnlyTheLockRoundTrip) {
  CreateRows("recache.db");
  const std::string scan = "SELECT sum(v) FROM t;\nPRAGMA farpool_round_trips;\n";
  auto fewest = [&](const std::string& setup) {
    std::string script = "PRAGMA cache_size = 10;\n" + setup;
    for (int i = 0; i < 5; ++i) script += scan;
    // The setup pragma's answer comes first.
    return FewestRoundTripsPerRepeat("recache.db", script, setup.empty() ? 0 : 1, "350035000", 5);
  };
  EXPECT_EQ(fewest("PRAGMA farpool_keep_shared = 0;\n"), 1u)
      << "a scan again should cost the lock's round trip only";
  EXPECT_EQ(fewest(""), 0u) << "a scan again under a kept SHARED lock should cost nothing";
  EXPECT_GT(fewest("PRAGMA farpool_cache_mib = 0;\n"), 100u)
      << "without the VFS's cache a scan reads its ~300 pages again";
}

// A writer in another process invalidates the reader's cache: the reader, whose pages are in
// the VFS's cache (SQLite's own holds 10), sees every commit at its next transaction, and the
// database checks out each time.
TEST_F(SqliteVfsOverTcpTest, AWriterInAnotherProcessInvalidatesTheReadersCache) {
  Interactive a(Path("cached-reader.log"));
  ASSERT_NO_FATAL_FAILURE(Hold(a, "cached.db", "PRAGMA cache_size = 10;\nSELECT sum(v) FROM t;\n"));
  std::string expected = "350035000\n";
  for (int round = 1; round <= 4; ++round) {
    // 1,428 rows (every 7th) on pages all over the table.
    Run w = Sql("cached.db", "UPDATE t SET v = v + 1 WHERE id % 7 = 0;\n");
    ASSERT_EQ(w.exit_code, 0) << w.output;
    const std::string done = Path("cached.read" + std::to_string(round));
    a.Send("SELECT sum(v) FROM t;\nPRAGMA integrity_check;\n" + Interactive::Touch(done));
    ASSERT_TRUE(a.WaitFor(done)) << a.Output();
    expected += std::to_string(350035000 + 1428 * round) + "\nok\n";
  }
  EXPECT_EQ(a.Finish(), 0) << a.Output();
  EXPECT_EQ(a.Output(), expected);
}

// SQLite's lock protocol with a reader that keeps SHARED between transactions (for a minute
// here, so that the watch's yield is what lets the writer in, not the reader's idleness): a
// writer gets in once the idle reader has seen it and given the bit up; a writer that cannot
// wait is refused while the reader is inside a transaction; the reader sees each commit at
// its next transaction; the database checks out. With the watch taken out, the writer waits
// in vain ("database is locked").
TEST_F(SqliteVfsOverTcpTest, AWriterGetsInPastAReaderThatKeepsItsSharedLock) {
  Interactive a(Path("keeper.log"));
  ASSERT_NO_FATAL_FAILURE(
      Hold(a, "kept.db", "SELECT v FROM t WHERE id = 1;\n", "&farpool_keep_idle_ms=60000"));
  Run w = Sql("kept.db", ".timeout 5000\nUPDATE t SET v = 100 WHERE id = 1;\n");
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_EQ(w.output, "");
  const std::string inside = Path("kept.inside");
  a.Send("SELECT v FROM t WHERE id = 1;\nBEGIN;\nSELECT count(*) FROM t;\n" +
         Interactive::Touch(inside));
  ASSERT_TRUE(a.WaitFor(inside)) << a.Output();
  Run busy = Sql("kept.db", ".timeout 0\nUPDATE t SET v = 200 WHERE id = 1;\n");
  EXPECT_NE(busy.output.find("database is locked"), std::string::npos) << busy.output;
  a.Send("COMMIT;\n");
  Run after = Sql("kept.db", ".timeout 5000\nUPDATE t SET v = 300 WHERE id = 1;\n");
  EXPECT_EQ(after.output, "");
  a.Send("SELECT v FROM t WHERE id = 1;\nPRAGMA integrity_check;\n");
  EXPECT_EQ(a.Finish(), 0) << a.Output();
  EXPECT_EQ(a.Output(), "7\n100\n10000\n300\nok\n");
}

// A writer stopped while it holds RESERVED, whose lock another writer breaks meanwhile (it
// sweeps the stopped one's lease slot after evicting it: over TCP its connections are cut):
// once continued, the stopped writer's late renewal finds its slot swept, and its COMMIT fails
// with an I/O error instead of writing; the database has the other writer's row only.
TEST_F(SqliteVfsOverTcpTest, AStoppedWriterWhoseLockWasBrokenGetsAnError) {
  Interactive a(Path("broken-a.log"));
  ASSERT_NO_FATAL_FAILURE(HoldReserved(a, "broken.db"));
  a.Stop();
  ExpectNextWriterGetsIn("broken.db");
  a.Continue();
  a.Send("COMMIT;\n");
  EXPECT_NE(a.Finish(), 0) << a.Output();
  EXPECT_NE(a.Output().find("disk I/O error"), std::string::npos) << a.Output();
  Run r = Sql("broken.db", "SELECT count(*), max(id) FROM t;\nPRAGMA integrity_check;\n");
  EXPECT_EQ(r.output, "10001|20001\nok\n");
}

// Two "hosts" sharing a database: the memory servers over TCP, each in a network namespace of
// its own, and each sqlite3 CLI in a further namespace of its own (TestClientHost), reaching them
// over the bridge as from another machine.
class SqliteVfsAcrossHostsTest : public SqliteVfsTest {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() == 0) StartCluster(Fabric::kTcp, /*servers=*/2, /*netns=*/true);
  }
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    SqliteVfsTest::SetUp();
  }
};

// Issue 10: two writers from two hosts through the VFS -> one gets SQLITE_BUSY, the database
// passes PRAGMA integrity_check. Host A holds RESERVED with an uncommitted update; a writer on
// host B that cannot wait is refused, a reader there goes on; A commits; B then writes; both
// hosts see both changes.
TEST_F(SqliteVfsAcrossHostsTest, ASecondWriterOnAnotherHostThatCannotWaitGetsBusy) {
  TestClientHost host_a(*cluster_, 0), host_b(*cluster_, 1);
  ASSERT_TRUE(host_a.status().ok()) << host_a.status().ToString();
  ASSERT_TRUE(host_b.status().ok()) << host_b.status().ToString();
  Interactive a(Path("hosts-a.log"), host_a.Argv());
  ASSERT_NO_FATAL_FAILURE(
      Hold(a, "hosts.db", "BEGIN IMMEDIATE;\nUPDATE t SET v = v + 1 WHERE id = 1;\n"));
  Run b = Sql("hosts.db", ".timeout 0\nBEGIN IMMEDIATE;\n", "", &host_b);
  EXPECT_NE(b.output.find("database is locked"), std::string::npos) << b.output;
  Run reader = Sql("hosts.db", "SELECT count(*) FROM t;\n", "", &host_b);
  EXPECT_EQ(reader.output, "10000\n");
  a.Send("UPDATE t SET v = v + 1 WHERE id = 1;\nCOMMIT;\n");
  EXPECT_EQ(a.Finish(), 0) << a.Output();
  Run w = Sql("hosts.db",
              ".timeout 20000\nUPDATE t SET v = v + 1 WHERE id = 2;\n"
              "SELECT v FROM t WHERE id IN (1, 2) ORDER BY id;\nPRAGMA integrity_check;\n",
              "", &host_b);
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_EQ(w.output, "9\n15\nok\n");
  Run check =
      Sql("hosts.db", "SELECT count(*), sum(v) FROM t;\nPRAGMA integrity_check;\n", "", &host_a);
  EXPECT_EQ(check.output, "10000|350035003\nok\n");
}

// Two servers over TCP: the names of a database's journal and WAL (their name-table buckets,
// their headers) live on either server, so whether they exist is not always readable in the
// lock's batch (which reaches the lock word's server only).
class SqliteVfsOverTwoServersTest : public SqliteVfsOverTcpTest {
 protected:
  static void SetUpTestSuite() { StartCluster(Fabric::kTcp, /*servers=*/2); }
};

// A read transaction that takes SHARED (keeping it turned off) is still one round trip: the
// database header's companions word, read with the lock, says that neither a journal nor a WAL
// exists, so SQLite's checks for them cost nothing wherever their names live (they cost a
// round trip to the other server before).
TEST_F(SqliteVfsOverTwoServersTest, AReadTransactionOfCachedPagesCostsOneRoundTrip) {
  for (const std::string db : {"two-a.db", "two-b.db", "two-c.db"}) {
    CreateRows(db);
    std::string script = "PRAGMA farpool_keep_shared = 0;\n";
    for (int i = 0; i < 9; ++i)
      script += "SELECT v FROM t WHERE id = 5;\nPRAGMA farpool_round_trips;\n";
    EXPECT_EQ(FewestRoundTripsPerRepeat(db, script, 1, "35", 9), 1u)
        << db << ": round trips of a read transaction";
  }
}

// The companions word keeps a hot journal found on two servers as on one: a writer killed with
// its changes spilled into the database leaves its journal (and the word's bit) behind; the next
// process rolls it back.
TEST_F(SqliteVfsOverTwoServersTest, AKilledWritersJournalIsFoundAndRolledBack) {
  Interactive a(Path("two-killed.log"));
  ASSERT_NO_FATAL_FAILURE(
      Hold(a, "two-killed.db", "PRAGMA cache_size = 2;\nBEGIN;\nUPDATE t SET v = v + 1;\n"));
  a.Kill();
  ExpectRows("two-killed.db", ".timeout 20000\n");
}

}  // namespace
}  // namespace farpool
