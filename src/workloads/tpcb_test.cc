// TPC-B (src/workloads/tpcb.h) on the NAM engines: the round trips of one transaction, counted
// per transaction (TxnCounters::round_trips), not timed; the invariant after the run. The
// counts are the protocol's dependency depth, the same on every fabric (local memory, the pool
// on shared memory, the pool over TCP messages), so every engine must show them.
//
// Read committed with the three rows read for update (what pgbench runs), LockIntent::kUpdate:
// one round for the lookups, locks (the plain lock word) and copies of account, teller and
// branch with the snapshot's counter (HashIndex::PostLookupLockRead), the history row's insert
// (locked), the tables' descriptors and the announcement array; then the commit's decision and
// its install: 3. With LockIntent::kRead the commit needs its lock round too (history insert,
// read-lock words changed to the plain word): 4. It was 5 before the lookup-lock-read (copies,
// then the lock round). Snapshot isolation reads the records after the counter: 2 rounds (1
// when all three sit on the counter's server), then the commit's 3; with the rows read for
// update (SELECT ... FOR UPDATE under SI), 3 like read committed.
#include "workloads/tpcb.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "db/db_test_util.h"

namespace farpool::workloads {
namespace {

class TpcbTest : public testing::TestWithParam<std::string> {
 protected:
  // Runs `count` TPC-B transactions one after another at scale 1 (10 tellers, 100,000
  // accounts: the account is nearly never in the session's address cache) and returns how many
  // round trips each committed one cost, as a histogram.
  std::map<uint64_t, int> RoundTrips(bool read_committed, int count, bool for_update = false,
                                     LockIntent intent = LockIntent::kUpdate) {
    auto t = db::TestDatabase::Start(GetParam());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    constexpr int kScale = 1;
    auto tables = LoadTpcb((*t)->db(), kScale);
    EXPECT_TRUE(tables.ok()) << tables.status().ToString();
    auto session = (*t)->db().NewSession();
    EXPECT_TRUE(session.ok()) << session.status().ToString();
    if (!tables.ok() || !session.ok()) return {};
    const TransactionOptions options{read_committed ? Isolation::kReadCommitted
                                                    : Isolation::kSnapshot};
    std::map<uint64_t, int> histogram;
    for (int i = 0; i < count; ++i) {
      TpcbTxn p;
      p.aid = (i * 7919) % (kTpcbAccountsPerBranch * kScale);
      p.tid = (i * 13) % (kTpcbTellersPerBranch * kScale);
      p.bid = p.tid / kTpcbTellersPerBranch;
      p.delta = i % 11 - 5;
      p.history_key = i;
      p.lock_at_read = read_committed || for_update;
      p.intent = intent;
      const TxnCounters before = (*session)->counters();
      EXPECT_OK(RunTransaction(**session, options,
                               [&](Transaction& txn) { return TpcbTransaction(txn, *tables, p); }));
      const TxnCounters after = (*session)->counters();
      EXPECT_EQ(after.aborts, before.aborts) << "one client: nothing to conflict with";
      ++histogram[after.round_trips - before.round_trips];
      EXPECT_EQ(CausesOf(after, before), after.round_trips - before.round_trips)
          << "the causes add up to the round trips";
    }
    EXPECT_OK(VerifyTpcb(**session, *tables, kScale));
    return histogram;
  }
  // The round trips between two counts of a session, summed over their causes.
  static uint64_t CausesOf(const TxnCounters& after, const TxnCounters& before) {
    uint64_t sum = 0;
    for (size_t i = 0; i < kRoundTripCauses; ++i)
      sum += after.round_trips_by_cause[i] - before.round_trips_by_cause[i];
    return sum;
  }
  static int Above(const std::map<uint64_t, int>& h, uint64_t bound) {
    int n = 0;
    for (const auto& [rt, count] : h) n += rt > bound ? count : 0;
    return n;
  }
};

// A few transactions (2-4%, the same ones under both levels, so not in their reads; up to 5.5%
// seen at a load average of 21) pay 3-5 round trips more: the session's first two (set-up),
// then now and then one (the allocator reserving records for the history rows, a lease renewed
// in line under load). The counts asserted are those of at least 90% of the transactions (without
// the update intent, none is at 3), and none is below.
TEST_P(TpcbTest, ReadCommittedIsThreeRoundTrips) {
  constexpr int kTxns = 200;
  const std::map<uint64_t, int> h = RoundTrips(/*read_committed=*/true, kTxns);
  EXPECT_GE(h.count(3) ? h.at(3) : 0, kTxns * 90 / 100)
      << "round trips per txn: " << db::ShowRoundTrips(h);
  EXPECT_TRUE(h.empty() || h.begin()->first == 3) << db::ShowRoundTrips(h);
}

// The rows locked with LockIntent::kRead: the commit changes their read-lock words in a lock
// round of its own, which carries the history insert too.
TEST_P(TpcbTest, ReadCommittedWithReadIntentIsFourRoundTrips) {
  constexpr int kTxns = 200;
  const std::map<uint64_t, int> h =
      RoundTrips(/*read_committed=*/true, kTxns, /*for_update=*/true, LockIntent::kRead);
  EXPECT_GE(h.count(4) ? h.at(4) : 0, kTxns * 90 / 100)
      << "round trips per txn: " << db::ShowRoundTrips(h);
  EXPECT_TRUE(h.empty() || h.begin()->first == 4) << db::ShowRoundTrips(h);
}

TEST_P(TpcbTest, SnapshotIsolationIsAtMostFiveRoundTrips) {
  constexpr int kTxns = 200;
  const std::map<uint64_t, int> h = RoundTrips(/*read_committed=*/false, kTxns);
  // As above, at least 90%: a lease renewed in line counts in time, not in transactions, so a
  // slow run has more of them (11 of 200 above 5 seen in a full ctest run at load 1-2).
  EXPECT_LE(Above(h, 5), kTxns * 10 / 100) << "round trips per txn: " << db::ShowRoundTrips(h);
  EXPECT_TRUE(h.empty() || h.begin()->first >= 4) << db::ShowRoundTrips(h);
}

// SI with the rows read for update (`bench txn --for-update`): the first round locks them and
// takes the snapshot; alone, no version is newer than it, so the commit follows at once: 3.
TEST_P(TpcbTest, SnapshotIsolationWithRowsReadForUpdateIsThreeRoundTrips) {
  constexpr int kTxns = 200;
  const std::map<uint64_t, int> h =
      RoundTrips(/*read_committed=*/false, kTxns, /*for_update=*/true);
  EXPECT_GE(h.count(3) ? h.at(3) : 0, kTxns * 90 / 100)
      << "round trips per txn: " << db::ShowRoundTrips(h);
  EXPECT_TRUE(h.empty() || h.begin()->first == 3) << db::ShowRoundTrips(h);
}

// The same under contention: 8 threads on one branch row, SI with the rows read for update.
// A locking read that waited for the branch row locks a version newer than its snapshot; the
// snapshot moves up to the newest version locked without a round trip (no retake), and the
// tables' descriptors read with the locks stay proof of them under it (the snapshot's
// announcement stays as it was), so the commit skips its lock round: no round trip of any
// committed or aborted transaction is a retake or a commit's lock round. Without the move (a
// retake by a counter read, then the commit's lock round) both are counted (about 0.4 and 0.4
// per transaction over TCP). Round trips are counted, not timed.
TEST_P(TpcbTest, ContendedRowsReadForUpdateNeitherRetakeNorLockAtCommit) {
  auto t = db::TestDatabase::Start(GetParam());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  constexpr int kScale = 1, kThreads = 8, kPerThread = 100;
  auto tables = LoadTpcb((*t)->db(), kScale);
  ASSERT_TRUE(tables.ok()) << tables.status().ToString();
  std::vector<TxnCounters> counts(kThreads);
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      auto session = (*t)->db().NewSession();
      if (!session.ok()) {
        results[th] = session.status();
        return;
      }
      for (int i = 0; i < kPerThread && results[th].ok(); ++i) {
        TpcbTxn p;
        p.aid = (th * 7919 + i * 104729) % (kTpcbAccountsPerBranch * kScale);
        p.tid = (th + i) % (kTpcbTellersPerBranch * kScale);
        p.bid = p.tid / kTpcbTellersPerBranch;
        p.delta = i % 11 - 5;
        p.history_key = int64_t{th} * kPerThread + i;
        p.lock_at_read = true;
        results[th] =
            RunTransaction(**session, TransactionOptions{Isolation::kSnapshot},
                           [&](Transaction& txn) { return TpcbTransaction(txn, *tables, p); });
      }
      counts[th] = (*session)->counters();
    });
  }
  for (auto& th : threads) th.join();
  for (const Status& r : results) ASSERT_OK(r);
  std::array<uint64_t, kRoundTripCauses> by{};
  uint64_t total = 0;
  for (const TxnCounters& c : counts) {
    total += c.round_trips;
    for (size_t i = 0; i < kRoundTripCauses; ++i) by[i] += c.round_trips_by_cause[i];
  }
  std::string shown;
  for (size_t i = 0; i < kRoundTripCauses; ++i) {
    shown += std::string(RoundTripCauseName(static_cast<RoundTripCause>(i))) + "=" +
             std::to_string(by[i]) + " ";
  }
  const auto at = [&](RoundTripCause c) { return by[static_cast<size_t>(c)]; };
  EXPECT_EQ(std::accumulate(by.begin(), by.end(), uint64_t{0}), total) << shown;
  // The threads may run one after another on a loaded machine (failed once so on shared
  // memory at load 6): with no wait there is nothing to check.
  if (at(RoundTripCause::kLockWait) == 0) {
    GTEST_SKIP() << "no locking read waited (no contention in this run): " << shown;
  }
  EXPECT_EQ(at(RoundTripCause::kRetake), 0u) << shown;
  // A new history key goes into the index in the lock round, except where its fresh record
  // lies on another server than its head bucket or in the log still to clear (read.cc, "left
  // to the commit"): which record the allocator hands out depends on the other threads, so a
  // few such commits lock in a round of their own (2-6 of 800 in some runs). The rule is that
  // none do otherwise: at most 2% (every transaction, if the intent's inserts were lost).
  EXPECT_LE(at(RoundTripCause::kCommitLock), uint64_t{kThreads} * kPerThread / 50) << shown;
  EXPECT_OK(VerifyTpcb(**(*t)->db().NewSession(), *tables, kScale));
}

// The history row a transaction drops (--history-keep) is absent when the transaction that
// was to insert it did not commit: `bench txn` marks the keys of transactions that ended
// Unavailable (a failover cut them; found by the network soak with kills: "table
// 'pgbench_history' has no key 7247" failed a client). Marked, the absence is no error and the
// transaction commits; unmarked, it is NotFound as before.
TEST_P(TpcbTest, ADropOfAHistoryRowMarkedMayBeAbsentCommitsWithoutIt) {
  auto t = db::TestDatabase::Start(GetParam());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto tables = LoadTpcb((*t)->db(), 1);
  ASSERT_TRUE(tables.ok()) << tables.status().ToString();
  auto session = (*t)->db().NewSession();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  TpcbTxn p;
  p.aid = 17;
  p.tid = 3;
  p.bid = 0;
  p.delta = 5;
  p.history_key = 2;
  p.drop_history_key = 1;  // never inserted
  auto run = [&] {
    return RunTransaction(**session, TransactionOptions{Isolation::kReadCommitted},
                          [&](Transaction& txn) { return TpcbTransaction(txn, *tables, p); });
  };
  EXPECT_EQ(run().code(), StatusCode::kNotFound);
  p.drop_may_be_absent = true;
  EXPECT_OK(run());
  EXPECT_OK(VerifyTpcb(**session, *tables, 1));
}

INSTANTIATE_TEST_SUITE_P(Engines, TpcbTest, testing::Values("local", "pool", "pool-tcp"),
                         db::EngineParamName);

}  // namespace
}  // namespace farpool::workloads
