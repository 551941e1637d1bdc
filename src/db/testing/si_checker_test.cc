// The SI checker on hand-made histories: each anomalous one holds exactly one anomaly, which
// the checker must find (and nothing else); the clean one holds write skew, which SI allows.
#include "db/testing/si_checker.h"

#include <gtest/gtest.h>

namespace farpool::db::testing {
namespace {

constexpr int64_t kX = 1, kY = 2;

Txn T(uint64_t id, Outcome outcome, std::vector<KeyRead> reads, std::vector<KeyAppend> appends) {
  Txn t;
  t.id = id;
  t.session = id;
  t.outcome = outcome;
  t.reads = std::move(reads);
  t.appends = std::move(appends);
  return t;
}
constexpr Outcome kOk = Outcome::kCommitted;

// Exactly one anomaly type is reported, and it is `type`.
void ExpectOnly(const std::vector<Txn>& h, const std::string& type) {
  CheckReport r = CheckSnapshotIsolation(h);
  EXPECT_TRUE(r.Has(type)) << r.ToString();
  EXPECT_EQ(r.counts.size(), 1u) << r.ToString();
}

TEST(SiChecker, CleanHistoryWithWriteSkewReportsNothing) {
  std::vector<Txn> h = {
      T(1, kOk, {{kX, {}}}, {{kX, {1}}}),
      T(2, kOk, {{kX, {1}}}, {{kX, {2}}}),
      T(3, kOk, {{kX, {1, 2}}, {kY, {}}}, {}),
      T(4, kOk, {{kY, {}}}, {{kY, {3}}}),
      // Write skew: both read x and y, each appends to a different one.
      T(5, kOk, {{kX, {1, 2}}, {kY, {3}}}, {{kX, {5}}}),
      T(6, kOk, {{kX, {1, 2}}, {kY, {3}}}, {{kY, {6}}}),
      T(7, Outcome::kAborted, {{kX, {1, 2, 5}}}, {{kX, {7}}}),
      T(8, kOk, {{kX, {1, 2, 5}}, {kY, {3, 6}}}, {}),
  };
  CheckReport r = CheckSnapshotIsolation(h);
  EXPECT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(r.allowed_g2_edges, 2u) << r.ToString();
  EXPECT_EQ(r.committed, 7u);
  EXPECT_EQ(r.aborted, 1u);
}

TEST(SiChecker, FindsG0WriteCycle) {
  // Blind appends: x's order says T1 before T2, y's says T2 before T1.
  ExpectOnly({T(1, kOk, {}, {{kX, {1}}, {kY, {12}}}), T(2, kOk, {}, {{kX, {2}}, {kY, {11}}}),
              T(3, kOk, {{kX, {1, 2}}, {kY, {11, 12}}}, {})},
             "G0");
}

TEST(SiChecker, FindsG1aAbortedRead) {
  ExpectOnly({T(1, Outcome::kAborted, {{kX, {}}}, {{kX, {1}}}), T(2, kOk, {{kX, {1}}}, {})}, "G1a");
}

TEST(SiChecker, FindsG1bIntermediateRead) {
  ExpectOnly({T(1, kOk, {{kX, {}}}, {{kX, {1, 2}}}), T(2, kOk, {{kX, {1}}}, {})}, "G1b");
}

TEST(SiChecker, FindsG1cCircularInformationFlow) {
  ExpectOnly({T(1, kOk, {{kX, {}}, {kY, {2}}}, {{kX, {1}}}),
              T(2, kOk, {{kY, {}}, {kX, {1}}}, {{kY, {2}}})},
             "G1c");
}

TEST(SiChecker, FindsLostUpdate) {
  // T2 and T3 both read x = [1] and both append: one of the two appends is lost.
  ExpectOnly({T(1, kOk, {{kX, {}}}, {{kX, {1}}}), T(2, kOk, {{kX, {1}}}, {{kX, {2}}}),
              T(3, kOk, {{kX, {1}}}, {{kX, {3}}}), T(4, kOk, {{kX, {1, 2}}}, {})},
             "lost-update");
}

TEST(SiChecker, FindsGSingleReadSkew) {
  // T2 sees T1's x but not T1's y.
  ExpectOnly({T(1, kOk, {{kX, {}}, {kY, {}}}, {{kX, {1}}, {kY, {2}}}),
              T(2, kOk, {{kX, {1}}, {kY, {}}}, {})},
             "G-single");
}

TEST(SiChecker, FindsIncompatibleOrder) {
  ExpectOnly({T(1, kOk, {}, {{kX, {1}}}), T(2, kOk, {}, {{kX, {2}}}), T(3, kOk, {{kX, {1, 2}}}, {}),
              T(4, kOk, {{kX, {2, 1}}}, {})},
             "incompatible-order");
}

TEST(SiChecker, FindsGarbageRead) {
  ExpectOnly({T(1, kOk, {{kX, {}}}, {{kX, {1}}}), T(2, kOk, {{kX, {1, 99}}}, {})}, "garbage-read");
}

TEST(SiChecker, UnknownOutcomeCountsAsCommittedOnceObserved) {
  // T1's commit failed with an error; T2 read its element, so it did commit. T3 read skew.
  std::vector<Txn> h = {T(1, Outcome::kUnknown, {{kX, {}}, {kY, {}}}, {{kX, {1}}, {kY, {2}}}),
                        T(2, kOk, {{kX, {1}}, {kY, {2}}}, {}),
                        T(3, kOk, {{kX, {1}}, {kY, {}}}, {})};
  CheckReport r = CheckSnapshotIsolation(h);
  EXPECT_TRUE(r.Has("G-single")) << r.ToString();
  EXPECT_FALSE(r.Has("G1a")) << r.ToString();
  // Unobserved, it is left out: no anomaly.
  r = CheckSnapshotIsolation(
      {T(1, Outcome::kUnknown, {{kX, {}}}, {{kX, {1}}}), T(2, kOk, {{kX, {}}}, {})});
  EXPECT_TRUE(r.ok()) << r.ToString();
}

TEST(SiChecker, FormatAndParseRoundTrip) {
  Txn t = T(42, Outcome::kUnknown, {{kX, {1, 2}}, {kY, {}}}, {{kX, {3, 4}}});
  t.begin_ns = 5;
  t.end_ns = 9;
  auto back = ParseTxn(FormatTxn(t));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->id, 42u);
  EXPECT_EQ(back->outcome, Outcome::kUnknown);
  EXPECT_EQ(back->end_ns, 9);
  ASSERT_EQ(back->reads.size(), 2u);
  EXPECT_EQ(back->reads[0].list, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(back->reads[1].list.empty());
  EXPECT_EQ(back->appends[0].elements, (std::vector<int64_t>{3, 4}));
  EXPECT_FALSE(ParseTxn("{\"id\":1}").ok());
  EXPECT_FALSE(ParseTxn("not json").ok());
}

}  // namespace
}  // namespace farpool::db::testing
