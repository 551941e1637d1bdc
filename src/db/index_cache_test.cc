// The B+tree's inner-node cache across processes (btree.h, invariants 9-12): `farpool server`
// processes hold the data; a worker process (this binary re-run with FARPOOL_WORKER=insert)
// inserts keys all over an ordered table's key range, in random order, splitting leaves and
// inner nodes and growing the root, and logs each key once its commit returned OK (one
// O_APPEND write per commit). Meanwhile the parent, whose cache holds the tree as it was before
// the worker started (a root over a few leaves), scans through that cache as it goes stale:
// every key logged before a scan began must be visited by it with its value — forward and
// reverse, random ranges, single keys and the whole table — and scans are strictly ordered.
// Seed: FARPOOL_SEED (printed).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "db/db_test_util.h"
#include "db/testing/cluster_test.h"
#include "db/testing/worker_processes.h"
#include "farpool/db.h"

using namespace std::chrono_literals;

namespace farpool::db {
namespace {

using testing::Env;

constexpr int64_t kSpread = 1'000'000;  // keys are in [0, kSpread)
constexpr int kInitialKeys = 400;       // k * 2500: a root over ~10 leaves
constexpr int kWorkerKeys = 6000;       // ~150 more leaves: inner splits, the root grows
constexpr int kKeysPerTxn = 4;

int64_t Value(int64_t key) { return key * 3 + 1; }

DatabaseOptions Options() {
  DatabaseOptions o;
  o.engine = Engine::kPool;
  o.cluster_file = Env("FARPOOL_CLUSTER");
  return o;
}

Status InsertWorker(uint64_t seed, int id) {
  const std::string log_path = Env("FARPOOL_KEY_LOG");
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return Status::IoError("cannot open " + log_path + ": " + std::strerror(errno));
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(Options()));
  FARPOOL_ASSIGN_OR_RETURN(const Table* t, db->OpenTable("t"));
  FARPOOL_ASSIGN_OR_RETURN(auto session, db->NewSession());
  std::mt19937_64 rng(seed * 31 + id);
  Status result;
  for (int i = 0; i < kWorkerKeys && result.ok(); i += kKeysPerTxn) {
    std::vector<int64_t> keys(kKeysPerTxn);
    for (auto& k : keys) k = static_cast<int64_t>(rng() % kSpread);
    result = RunTransaction(*session, [&](Transaction& txn) -> Status {
      for (int64_t k : keys) FARPOOL_RETURN_IF_ERROR(PutInt(txn, *t, k, Value(k)));
      return Status::Ok();
    });
    std::string committed;
    for (int64_t k : keys) committed += std::to_string(k) + "\n";
    if (result.ok() &&
        write(fd, committed.data(), committed.size()) != static_cast<ssize_t>(committed.size())) {
      result = Status::IoError(std::string("key log: ") + std::strerror(errno));
    }
  }
  close(fd);
  FARPOOL_RETURN_IF_ERROR(result);
  std::ofstream done(log_path + ".done");
  return done ? Status::Ok() : Status::IoError("cannot create " + log_path + ".done");
}

class IndexCacheTest : public testing::ClusterTest {
 protected:
  IndexCacheTest() : ClusterTest("farpool-index-cache") {}

  // The keys logged so far, sorted.
  std::vector<int64_t> Logged(const std::string& path) {
    std::vector<int64_t> keys(initial_.begin(), initial_.end());
    std::ifstream in(path);
    int64_t k;
    while (in >> k) keys.push_back(k);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
  }

  // Scans [lo, hi] both ways in one transaction: every key of `expect` in the range must be
  // visited, each with its value, in strict order (keys committed meanwhile may be too).
  void CheckRange(const Table& t, const std::vector<int64_t>& expect, int64_t lo, int64_t hi) {
    std::vector<int64_t> forward, backward;
    std::string bad;
    Status s = RunTransaction(*session_, [&](Transaction& txn) -> Status {
      forward.clear();
      backward.clear();
      for (bool reverse : {false, true}) {
        FARPOOL_RETURN_IF_ERROR(txn.Scan(t, lo, hi, 0, reverse, [&](int64_t k, const Row& row) {
          if (row.GetInt64(0) != Value(k)) bad = "key " + std::to_string(k) + " has another value";
          (reverse ? backward : forward).push_back(k);
          return true;
        }));
      }
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(bad, "");
    for (size_t i = 1; i < forward.size(); ++i) ASSERT_LT(forward[i - 1], forward[i]);
    for (size_t i = 1; i < backward.size(); ++i) ASSERT_GT(backward[i - 1], backward[i]);
    const std::set<int64_t> f(forward.begin(), forward.end()), b(backward.begin(), backward.end());
    for (auto it = std::lower_bound(expect.begin(), expect.end(), lo);
         it != expect.end() && *it <= hi; ++it) {
      ASSERT_TRUE(f.count(*it)) << "forward scan of [" << lo << ", " << hi << "] missed " << *it;
      ASSERT_TRUE(b.count(*it)) << "reverse scan of [" << lo << ", " << hi << "] missed " << *it;
    }
    for (int64_t k : forward) ASSERT_TRUE(k >= lo && k <= hi);
  }

  std::set<int64_t> initial_;
};

TEST_F(IndexCacheTest, ScansThroughAStaleCacheFindEveryKeyWhileAnotherProcessSplits) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  auto db = Database::Open(Options());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  db_ = std::move(*db);
  auto session = db_->NewSession();
  ASSERT_TRUE(session.ok());
  session_ = std::move(*session);
  TableOptions topt;
  topt.ordered = true;
  topt.expected_rows = kInitialKeys + kWorkerKeys;
  auto t = db_->CreateTable("t", Schema{{"v", ColumnType::kInt64}}, topt);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  for (int i = 0; i < kInitialKeys; i += 50) {
    ASSERT_OK(RunTransaction(*session_, [&](Transaction& txn) -> Status {
      for (int j = i; j < i + 50; ++j) {
        const int64_t k = int64_t(j) * (kSpread / kInitialKeys);
        initial_.insert(k);
        FARPOOL_RETURN_IF_ERROR(PutInt(txn, **t, k, Value(k)));
      }
      return Status::Ok();
    }));
  }
  // Fills this process's cache with the tree as it is now.
  std::vector<int64_t> all(initial_.begin(), initial_.end());
  ASSERT_NO_FATAL_FAILURE(CheckRange(**t, all, 0, kSpread));

  const std::string log_path = dir_ + "/keys";
  auto pid = testing::SpawnWorker(
      "insert", 0, {{"FARPOOL_KEY_LOG", log_path}, {"FARPOOL_SEED", std::to_string(seed_)}});
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  std::mt19937_64 rng(seed_);
  int checks = 0;
  // Until the worker has logged all its keys (bounded: a worker that fails stops logging).
  const auto deadline = std::chrono::steady_clock::now() + 240s;
  auto check = [&](bool& done) {
    const std::vector<int64_t> expect = Logged(log_path);
    const bool finished = std::filesystem::exists(log_path + ".done");
    const int64_t lo = static_cast<int64_t>(rng() % kSpread);
    ASSERT_NO_FATAL_FAILURE(CheckRange(**t, expect, lo, lo + int64_t(rng() % (kSpread / 20))));
    const int64_t one = expect[rng() % expect.size()];
    ASSERT_NO_FATAL_FAILURE(CheckRange(**t, expect, one, one));
    if (checks % 20 == 0) {
      ASSERT_NO_FATAL_FAILURE(CheckRange(**t, expect, 0, kSpread));
    }
    ++checks;
    if (finished || std::chrono::steady_clock::now() > deadline) done = true;
  };
  for (bool done = false; !done && !HasFatalFailure();) check(done);
  auto exits = testing::ReapWorkers({*pid}, 60s);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(exits[0].Succeeded()) << exits[0].Describe();
  const std::vector<int64_t> expect = Logged(log_path);
  ASSERT_NO_FATAL_FAILURE(CheckRange(**t, expect, 0, kSpread));
  // Every check after the first ran through a cache filled before the worker's splits; how
  // many overlapped them depends on the machine.
  std::fprintf(stderr, "%d checks while %zu keys were inserted\n", checks,
               expect.size() - initial_.size());
}

}  // namespace
}  // namespace farpool::db

int main(int argc, char** argv) {
  return farpool::db::testing::WorkerMain(argc, argv, {{"insert", farpool::db::InsertWorker}});
}
