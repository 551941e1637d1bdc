// The bank transfer (src/workloads/bank.h) on the NAM engines: the round trips of one
// transfer, counted per transaction (TxnCounters::round_trips), not timed; the invariant after
// the run. The counts are the protocol's dependency depth, the same on every fabric.
//
// Both accounts are read for update with LockIntent::kUpdate (`bench txn --for-update`): one round
// finds, locks (the plain lock word) and reads them with the snapshot's counter, then the commit's
// decision and its install: 3, under snapshot isolation as under read committed. A plain MultiGet
// took 1-2 rounds and the commit 3 (its lock round included): 4-5.
#include "workloads/bank.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "db/db_test_util.h"

namespace farpool::workloads {
namespace {

class BankTest : public testing::TestWithParam<std::string> {
 protected:
  // Runs `count` transfers one after another on 10,000 accounts (as `bench txn` does) and
  // returns how many round trips each committed one cost, as a histogram.
  std::map<uint64_t, int> RoundTrips(Isolation isolation, int count) {
    auto t = db::TestDatabase::Start(GetParam());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    constexpr uint64_t kAccounts = 10000;
    auto accounts = LoadBank((*t)->db(), kAccounts);
    EXPECT_TRUE(accounts.ok()) << accounts.status().ToString();
    auto session = (*t)->db().NewSession();
    EXPECT_TRUE(session.ok()) << session.status().ToString();
    if (!accounts.ok() || !session.ok()) return {};
    std::map<uint64_t, int> histogram;
    for (int i = 0; i < count; ++i) {
      const int64_t from = (i * 7919) % kAccounts, to = (i * 104729 + 1) % kAccounts;
      const TxnCounters before = (*session)->counters();
      EXPECT_OK(RunTransaction(**session, TransactionOptions{isolation}, [&](Transaction& txn) {
        return BankTransfer(txn, **accounts, from, to, 1 + i % 100, /*for_update=*/true);
      }));
      const TxnCounters after = (*session)->counters();
      EXPECT_EQ(after.aborts, before.aborts) << "one client: nothing to conflict with";
      ++histogram[after.round_trips - before.round_trips];
    }
    EXPECT_OK(VerifyBank(**session, **accounts, kAccounts));
    return histogram;
  }
};

// As in tpcb_test, a few transfers pay a round trip or more besides (the session's set-up, a
// lease renewed in line under load): the count asserted is that of at least 90% of them, and
// none is below it.
TEST_P(BankTest, SnapshotIsolationTransferIsThreeRoundTrips) {
  constexpr int kTxns = 200;
  const std::map<uint64_t, int> h = RoundTrips(Isolation::kSnapshot, kTxns);
  EXPECT_GE(h.count(3) ? h.at(3) : 0, kTxns * 90 / 100)
      << "round trips per txn: " << db::ShowRoundTrips(h);
  EXPECT_TRUE(h.empty() || h.begin()->first == 3) << db::ShowRoundTrips(h);
}

TEST_P(BankTest, ReadCommittedTransferIsThreeRoundTrips) {
  constexpr int kTxns = 200;
  const std::map<uint64_t, int> h = RoundTrips(Isolation::kReadCommitted, kTxns);
  EXPECT_GE(h.count(3) ? h.at(3) : 0, kTxns * 90 / 100)
      << "round trips per txn: " << db::ShowRoundTrips(h);
  EXPECT_TRUE(h.empty() || h.begin()->first == 3) << db::ShowRoundTrips(h);
}

INSTANTIATE_TEST_SUITE_P(Engines, BankTest, testing::Values("local", "pool", "pool-tcp"),
                         db::EngineParamName);

}  // namespace
}  // namespace farpool::workloads
