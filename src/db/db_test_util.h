// Test fixtures of the database layer: a database of any engine inside the test process
// (the pool engine against memory servers started in-process over shared memory).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "farpool/db.h"
#include "pool/local_cluster.h"
#include "pool/server/memory_server.h"

// ASSERT_TRUE on a Status, printing the expression and the Status when it is not OK.
#define ASSERT_OK(expr)                                     \
  do {                                                      \
    ::farpool::Status s_ = (expr);                          \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)
// The same with EXPECT_TRUE (for lambdas and threads, where ASSERT cannot return).
#define EXPECT_OK(expr)                                     \
  do {                                                      \
    ::farpool::Status e_ = (expr);                          \
    EXPECT_TRUE(e_.ok()) << #expr << ": " << e_.ToString(); \
  } while (0)

namespace farpool::db {

// The gtest name of an engine parameter ("pool-tcp" -> "pool_tcp": names take letters, digits
// and _ only), for INSTANTIATE_TEST_SUITE_P over engine names.
std::string EngineParamName(const testing::TestParamInfo<std::string>& p);

// A histogram of round trips per transaction as "count x trips, ..." for failure messages.
std::string ShowRoundTrips(const std::map<uint64_t, int>& histogram);

// A seed for randomized tests: FARPOOL_SEED from the environment, else a fresh one. Tests print
// it (SCOPED_TRACE) so a failure can be replayed with FARPOOL_SEED=<seed>.
uint64_t TestSeed();

// The cluster of the real-process tests: 2 `farpool server` processes (`binary`) of 256 MiB
// over shared memory, event progress (the tests share 2 cores with their workers).
LocalClusterOptions ShmTestCluster(const std::string& binary);

// One-column int64 rows (column 0), as most invariant tests use them.
Status PutInt(Transaction& txn, const Table& t, int64_t key, int64_t v);
Result<int64_t> GetInt(Transaction& txn, const Table& t, int64_t key);
// One step of FoundationDB's Cycle workload on a ring of such rows (each holds the key of the
// next): a -> b -> c -> d becomes a -> c -> b -> d, so the ring stays one ring.
Status CycleStep(Transaction& txn, const Table& t, int64_t a);

// Runs maintenance passes until `done` holds (the maintenance thread also runs on its own);
// bounded, so a GC that never happens fails the test instead of hanging it.
template <typename Pred>
GcStats CollectUntil(Database& db, Pred done) {
  GcStats g;
  for (int i = 0; i < 500; ++i) {
    auto r = db.CollectGarbage();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) break;
    g = *r;
    if (done(g)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return g;
}

class TestDatabase {
 public:
  // engine: "local", "pool" (servers on shared memory), "pool-tcp" (servers reached over
  // loopback TCP: every memory operation a message) or "sharded".
  static Result<std::unique_ptr<TestDatabase>> Start(
      const std::string& engine, std::chrono::milliseconds lease = std::chrono::milliseconds(2000));
  ~TestDatabase();
  Database& db() { return *db_; }
  const DatabaseOptions& options() const { return options_; }
  // Opens another Database handle on the same data (another "compute process"); not for local.
  // `commit_hook`: its TestingHooks::commit_hook (fault injection), none by default.
  Result<std::unique_ptr<Database>> OpenAnother(
      std::function<void(std::string_view)> commit_hook = nullptr);

 private:
  std::string dir_;
  std::vector<std::unique_ptr<MemoryServer>> servers_;
  DatabaseOptions options_;
  std::unique_ptr<Database> db_;
};

}  // namespace farpool::db
