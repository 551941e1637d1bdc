// The indexes under killed processes: `farpool server` processes hold the data; worker
// processes (this binary re-run with FARPOOL_WORKER=insert) insert new keys into a hash-only
// table and an ordered table (hash index + B+tree) — each key into both, in one transaction —
// and die by SIGKILL in the middle of index structure changes:
//
//   - a fault plan (FARPOOL_CRASH_SITE, FARPOOL_CRASH_HIT) makes a worker SIGKILL itself at
//     the n-th hit of one index fault site (LockOwner::FaultPoint, reached through
//     db::TestingHooks::commit_hook): inside a B+tree insert, a split (right node written,
//     left node logged / written, released before the separator is posted), root growth (new
//     root written / swapped in) or a hash insert (bucket locked, key written, overflow bucket
//     written, entry published);
//   - the parent SIGKILLs one worker of every round at a random moment.
//
// Each round has fresh tables, so that every round grows its tree's root. Rounds 0 and 1 give
// two of their three workers a root-growth site with hit 1: whichever of them grows the root
// first dies there, and the other meets the half-grown tree (and dies too if it grows it).
// The other rounds give every worker a different site and a random hit count.
//
// Workers log every key before its transaction ("a") and after its commit returned OK ("c")
// with one O_APPEND write each, which a SIGKILL cannot tear. After every round, once the
// leases of the dead ran out, a new Database handle opens the database (its maintenance
// thread fences the dead slots; RecoverExpired finishes their commits) and checks each table:
// nothing stays locked; every confirmed key is found by Get (both tables) and by a full
// forward and reverse Scan of the B+tree, with its value; the scan is strictly ordered (no
// duplicates); nothing is found that was never attempted; the two tables agree on every
// attempted key (one transaction wrote both); and new inserts (more splits, more growth) still
// work and are found afterwards. Seed: FARPOOL_SEED (printed).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
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
constexpr int kThreads = 2;
// Key streams: one per worker thread, and the last for the parent's own inserts. A key's
// stream is its residue modulo kStreams.
constexpr int kStreams = kWorkers * kThreads + 1;
constexpr int kKeysPerThread = 600;
constexpr int kKeysPerTxn = 4;
constexpr int kRounds = 6;
constexpr int kParentKeys = 1500;  // inserted into every round's tables at the end
constexpr std::chrono::milliseconds kLease{500};
constexpr std::chrono::seconds kRoundLimit{60};
// Few buckets for many keys: hash inserts add overflow buckets all the time.
constexpr uint64_t kExpectedRows = 256;

int64_t Value(int64_t key) { return key * 3 + 1; }

std::string HashTable(int round) { return "h" + std::to_string(round); }
std::string OrderedTable(int round) { return "o" + std::to_string(round); }

DatabaseOptions Options() {
  DatabaseOptions o;
  o.engine = Engine::kPool;
  o.cluster_file = Env("FARPOOL_CLUSTER");
  o.lease = kLease;
  o.max_sessions = 64;
  return o;
}

// Where a worker kills itself: the `hit`-th time any of its sessions reaches `site`.
struct CrashPlan {
  std::string site;  // empty: none
  int hit = 0;
};

// Rounds 0 and 1: root growth; later rounds: one of these per worker, with hits drawn from
// [1, max_hit] (about a third of what one worker reaches of that site in a round).
struct MixedSite {
  const char* site;
  int max_hit;
};
constexpr MixedSite kMixedSites[] = {
    {"btree.insert.logged", 300}, {"btree.insert.written", 300},   {"btree.split.right-written", 8},
    {"btree.split.logged", 8},    {"btree.split.left-written", 8}, {"btree.split.released", 8},
    {"hash.locked", 600},         {"hash.key-written", 600},       {"hash.bucket-written", 60},
    {"hash.published", 600},
};
constexpr const char* kGrowSites[] = {"btree.grow.root-written", "btree.grow.root-swapped"};

CrashPlan PlanFor(uint64_t seed, int round, int worker) {
  std::mt19937_64 rng(seed * 1000003 + round * 101 + worker);
  if (round < 2) {
    if (worker == kWorkers - 1) return {};
    return {kGrowSites[round], 1};
  }
  constexpr int n = sizeof(kMixedSites) / sizeof(kMixedSites[0]);
  const MixedSite& m = kMixedSites[(seed + (round - 2) * kWorkers + worker) % n];
  return {m.site, 1 + static_cast<int>(rng() % m.max_hit)};
}

// The keys of one worker thread: distinct across threads, workers and rounds' streams, spread
// over the key space (splits everywhere, not only at the right edge).
std::vector<int64_t> KeysOf(uint64_t seed, int round, int worker, int thread) {
  std::mt19937_64 rng(seed * 7919 + round * 131 + worker * 17 + thread);
  const int64_t stream = worker * kThreads + thread;
  std::vector<int64_t> keys(kKeysPerThread);
  for (auto& k : keys) k = static_cast<int64_t>(rng() >> 24) * kStreams + stream;
  return keys;
}

// ------------------------------------------------------------------ worker

// Appends `text` to the fd with one write (O_APPEND: whole lines, in order, even when killed).
Status Log(int fd, const std::string& text) {
  if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return Status::IoError(std::string("key log: ") + std::strerror(errno));
  }
  return Status::Ok();
}

Status InsertWorker(uint64_t seed, int id) {
  const int round = std::atoi(Env("FARPOOL_ROUND", "0").c_str());
  const CrashPlan plan{Env("FARPOOL_CRASH_SITE"), std::atoi(Env("FARPOOL_CRASH_HIT", "0").c_str())};
  const std::string log_path = Env("FARPOOL_KEY_LOG");
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return Status::IoError("cannot open " + log_path + ": " + std::strerror(errno));
  DatabaseOptions o = Options();
  std::atomic<int> hits{0};
  if (!plan.site.empty()) {
    o.testing = std::make_shared<db::TestingHooks>(
        db::TestingHooks{.commit_hook = [&](std::string_view point) {
          if (point != plan.site || hits.fetch_add(1) + 1 != plan.hit) return;
          const std::string why = "worker " + std::to_string(id) + ": killing myself at " +
                                  plan.site + " (hit " + std::to_string(plan.hit) + ")\n";
          (void)!write(STDERR_FILENO, why.data(), why.size());
          raise(SIGKILL);
        }});
  }
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(o));
  FARPOOL_ASSIGN_OR_RETURN(const Table* hash, db->OpenTable(HashTable(round)));
  FARPOOL_ASSIGN_OR_RETURN(const Table* ordered, db->OpenTable(OrderedTable(round)));
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      Status& result = results[th];
      const std::vector<int64_t> keys = KeysOf(seed, round, id, th);
      std::unique_ptr<Session> session;
      for (size_t i = 0; i < keys.size() && result.ok(); i += kKeysPerTxn) {
        const std::vector<int64_t> batch(keys.begin() + i,
                                         keys.begin() + std::min(keys.size(), i + kKeysPerTxn));
        std::string attempted, committed;
        for (int64_t k : batch) {
          attempted += "a " + std::to_string(k) + "\n";
          committed += "c " + std::to_string(k) + "\n";
        }
        result = Log(fd, attempted);
        // A session fenced because this machine stalled us past the lease is replaced.
        Status s = Status::Unavailable("no session yet");
        for (int tries = 0; tries < 20 && s.code() == StatusCode::kUnavailable; ++tries) {
          if (!session) {
            auto fresh = db->NewSession();
            if (!fresh.ok()) {
              s = fresh.status();
              continue;
            }
            session = std::move(*fresh);
          }
          s = RunTransaction(*session, [&](Transaction& txn) -> Status {
            for (int64_t k : batch) {
              FARPOOL_RETURN_IF_ERROR(PutInt(txn, *hash, k, Value(k)));
              FARPOOL_RETURN_IF_ERROR(PutInt(txn, *ordered, k, Value(k)));
            }
            return Status::Ok();
          });
          if (s.code() == StatusCode::kUnavailable) session.reset();
        }
        if (result.ok()) result = s.ok() ? Log(fd, committed) : s;
      }
    });
  }
  for (auto& t : threads) t.join();
  close(fd);
  for (auto& r : results) FARPOOL_RETURN_IF_ERROR(r);
  return Status::Ok();
}

// ------------------------------------------------------------------ parent

struct KeyLog {
  std::set<int64_t> attempted, committed;
};

Result<KeyLog> ReadKeyLogs(const std::vector<std::string>& paths) {
  KeyLog log;
  for (const auto& path : paths) {
    std::ifstream in(path);
    if (!in) continue;  // a worker killed before it opened its log
    std::string kind;
    int64_t key;
    while (in >> kind >> key) {
      if (kind == "a") {
        log.attempted.insert(key);
      } else if (kind == "c") {
        log.committed.insert(key);
      } else {
        return Status::Internal(path + ": unexpected line kind '" + kind + "'");
      }
    }
  }
  for (int64_t k : log.committed) {
    if (!log.attempted.count(k)) {
      return Status::Internal("key " + std::to_string(k) + " committed but never attempted");
    }
  }
  return log;
}

class IndexCrashTest : public testing::ClusterTest {
 protected:
  IndexCrashTest() : ClusterTest("farpool-index-crash") {}

  // A new handle on the database, as a process that starts now would open it.
  void Open() {
    session_.reset();
    db_.reset();
    auto db = Database::Open(Options());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    auto session = db_->NewSession();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    session_ = std::move(*session);
  }

  std::string KeyLogPath(int round, int worker) const {
    return dir_ + "/keys." + std::to_string(round) + "." + std::to_string(worker);
  }

  // Runs one round's workers, kills one of them at a random moment, and reaps them all.
  // Returns how many died by SIGKILL (their own plan or the parent).
  int RunRound(int round, std::mt19937_64& rng) {
    std::vector<pid_t> pids;
    for (int w = 0; w < kWorkers; ++w) {
      const CrashPlan plan = PlanFor(seed_, round, w);
      testing::EnvVars env = {{"FARPOOL_CLUSTER", cluster_->cluster_file()},
                              {"FARPOOL_SEED", std::to_string(seed_)},
                              {"FARPOOL_ROUND", std::to_string(round)},
                              {"FARPOOL_KEY_LOG", KeyLogPath(round, w)},
                              {"FARPOOL_CRASH_SITE", plan.site},
                              {"FARPOOL_CRASH_HIT", std::to_string(plan.hit)}};
      auto pid = testing::SpawnWorker("insert", w, env);
      EXPECT_TRUE(pid.ok()) << pid.status().ToString();
      if (pid.ok()) pids.push_back(*pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 600));
    if (!pids.empty()) kill(pids[rng() % pids.size()], SIGKILL);
    int killed = 0;
    for (const auto& w : testing::ReapWorkers(pids, kRoundLimit)) {
      if (!w.timed_out && WIFSIGNALED(w.status) && WTERMSIG(w.status) == SIGKILL) {
        ++killed;
        continue;
      }
      EXPECT_TRUE(w.Succeeded()) << "round " << round << ": " << w.Describe()
                                 << " (its stderr says why)";
    }
    return killed;
  }

  // Every check of the header on round `round`'s tables; `extra` keys were committed by the
  // parent itself.
  void CheckRound(int round, const std::set<int64_t>& extra) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::string> paths;
    for (int w = 0; w < kWorkers; ++w) paths.push_back(KeyLogPath(round, w));
    auto log = ReadKeyLogs(paths);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    log->attempted.insert(extra.begin(), extra.end());
    log->committed.insert(extra.begin(), extra.end());
    auto hash = db_->OpenTable(HashTable(round));
    auto ordered = db_->OpenTable(OrderedTable(round));
    ASSERT_TRUE(hash.ok() && ordered.ok()) << "tables of round " << round;
    for (const Table* t : {*hash, *ordered}) {
      auto locked = db_->CountLocked(*t);
      ASSERT_TRUE(locked.ok()) << locked.status().ToString();
      EXPECT_EQ(*locked, 0u) << "records of '" << t->name() << "' still locked";
    }
    std::vector<int64_t> forward, backward;
    std::set<int64_t> found_hash, found_ordered;
    Status s = RunTransaction(*session_, [&](Transaction& txn) -> Status {
      forward.clear();
      backward.clear();
      found_hash.clear();
      found_ordered.clear();
      for (int64_t k : log->attempted) {
        for (const Table* t : {*hash, *ordered}) {
          Row row;
          Status g = txn.Get(*t, k, &row);
          if (g.code() == StatusCode::kNotFound) continue;
          FARPOOL_RETURN_IF_ERROR(g);
          if (row.GetInt64(0) != Value(k)) {
            return Status::Internal("key " + std::to_string(k) + " of '" + t->name() + "' holds " +
                                    std::to_string(row.GetInt64(0)));
          }
          (t == *hash ? found_hash : found_ordered).insert(k);
        }
      }
      Status bad;
      auto collect = [&](std::vector<int64_t>* out) {
        return [&, out](int64_t k, const Row& row) {
          if (row.GetInt64(0) != Value(k) && bad.ok()) {
            bad = Status::Internal("scan: key " + std::to_string(k) + " holds " +
                                   std::to_string(row.GetInt64(0)));
          }
          out->push_back(k);
          return true;
        };
      };
      FARPOOL_RETURN_IF_ERROR(
          txn.Scan(**ordered, INT64_MIN, INT64_MAX - 1, 0, false, collect(&forward)));
      FARPOOL_RETURN_IF_ERROR(
          txn.Scan(**ordered, INT64_MIN, INT64_MAX - 1, 0, true, collect(&backward)));
      return bad;
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 1; i < forward.size(); ++i) {
      ASSERT_LT(forward[i - 1], forward[i]) << "forward scan out of order or duplicated at " << i;
    }
    std::vector<int64_t> reversed(backward.rbegin(), backward.rend());
    EXPECT_EQ(reversed, forward) << "reverse scan differs from the forward scan";
    const std::set<int64_t> scanned(forward.begin(), forward.end());
    size_t missing = 0, phantom = 0;
    for (int64_t k : log->committed) {
      if (!found_hash.count(k) || !found_ordered.count(k) || !scanned.count(k)) {
        if (++missing <= 5) {
          ADD_FAILURE() << "committed key " << k << ": Get(hash table) " << found_hash.count(k)
                        << ", Get(ordered) " << found_ordered.count(k) << ", scan "
                        << scanned.count(k);
        }
      }
    }
    for (int64_t k : forward) phantom += log->attempted.count(k) ? 0 : 1;
    EXPECT_EQ(missing, 0u) << "committed keys not found";
    EXPECT_EQ(phantom, 0u) << "scanned keys that nobody inserted";
    EXPECT_EQ(found_hash, found_ordered) << "one transaction wrote both tables";
    EXPECT_EQ(found_ordered, scanned) << "Get and Scan disagree on the ordered table";
    std::fprintf(stderr, "round %d: %zu keys attempted, %zu confirmed, %zu found\n", round,
                 log->attempted.size(), log->committed.size(), scanned.size());
  }
};

TEST_F(IndexCrashTest, KilledMidSplitRootGrowthAndHashInsert) {
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed_));
  std::mt19937_64 rng(seed_);
  ASSERT_NO_FATAL_FAILURE(Open());
  TableOptions topt;
  topt.expected_rows = kExpectedRows;
  Schema schema{{"v", ColumnType::kInt64}};
  for (int round = 0; round < kRounds; ++round) {
    auto h = db_->CreateTable(HashTable(round), schema, topt);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    TableOptions ordered = topt;
    ordered.ordered = true;
    auto o = db_->CreateTable(OrderedTable(round), schema, ordered);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
  }
  // The parent takes no part in the rounds; it opens the database anew to check.
  session_.reset();
  db_.reset();
  int killed = 0;
  for (int round = 0; round < kRounds; ++round) {
    const int k = RunRound(round, rng);
    EXPECT_GE(k, 1) << "round " << round << ": nobody was killed";
    killed += k;
    // The leases of the dead run out; a new handle's maintenance thread fences their slots.
    std::this_thread::sleep_for(kLease + kLease / 2);
    ASSERT_NO_FATAL_FAILURE(Open());
    ASSERT_OK(db_->RecoverExpired());
    ASSERT_NO_FATAL_FAILURE(CheckRound(round, {}));
    session_.reset();
    db_.reset();
  }
  std::fprintf(stderr, "%d workers killed over %d rounds\n", killed, kRounds);
  // Inserts still work on every damaged tree (more splits and root growth), and everything
  // found before is still found.
  ASSERT_NO_FATAL_FAILURE(Open());
  for (int round = 0; round < kRounds; ++round) {
    auto hash = db_->OpenTable(HashTable(round));
    auto ordered = db_->OpenTable(OrderedTable(round));
    ASSERT_TRUE(hash.ok() && ordered.ok());
    std::set<int64_t> extra;
    // Keys of the stream no worker uses, spread like theirs.
    while (extra.size() < static_cast<size_t>(kParentKeys)) {
      extra.insert(static_cast<int64_t>(rng() >> 24) * kStreams + (kStreams - 1));
    }
    std::vector<int64_t> keys(extra.begin(), extra.end());
    std::shuffle(keys.begin(), keys.end(), rng);
    for (size_t i = 0; i < keys.size(); i += 50) {
      Status s = RunTransaction(*session_, [&](Transaction& txn) -> Status {
        for (size_t j = i; j < std::min(keys.size(), i + 50); ++j) {
          FARPOOL_RETURN_IF_ERROR(PutInt(txn, **hash, keys[j], Value(keys[j])));
          FARPOOL_RETURN_IF_ERROR(PutInt(txn, **ordered, keys[j], Value(keys[j])));
        }
        return Status::Ok();
      });
      ASSERT_TRUE(s.ok()) << "round " << round << "'s tables: " << s.ToString();
    }
    ASSERT_NO_FATAL_FAILURE(CheckRound(round, extra));
  }
}

}  // namespace
}  // namespace farpool::db

int main(int argc, char** argv) {
  return farpool::db::testing::WorkerMain(argc, argv, {{"insert", farpool::db::InsertWorker}});
}
