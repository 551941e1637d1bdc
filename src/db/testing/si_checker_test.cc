// The SI checker on hand-made histories: each anomalous one holds exactly one anomaly, which
// the checker must find (and nothing else); the clean one holds write skew, which SI allows.
#include "db/testing/si_checker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

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

// A model of snapshot isolation in memory: up to `concurrency` transactions interleave; each
// reads the versions committed before it began and, at commit, aborts if a key it appends to
// got a newer version since (first committer wins) — unless `validate` is false, when it
// installs its list over whatever is there (lost updates). Without `snapshot_reads` each read
// sees the newest committed version at the time of the read (read committed: read skew).
std::vector<Txn> SimulateSi(uint64_t seed, int txns, int keys, int concurrency, bool validate,
                            bool snapshot_reads = true) {
  std::mt19937_64 rng(seed);
  struct Version {
    uint64_t ts;
    std::vector<int64_t> list;
  };
  std::map<int64_t, std::vector<Version>> db;  // newest last
  for (int k = 0; k < keys; ++k) db[k].push_back({0, {}});
  struct Active {
    Txn rec;
    uint64_t start;
    int ops_left;
    std::map<int64_t, std::vector<int64_t>> current;
  };
  std::vector<Active> active;
  std::vector<Txn> history;
  uint64_t clock = 0, next_id = 1;
  int64_t next_element = 1;
  while (static_cast<int>(history.size()) < txns || !active.empty()) {
    if (static_cast<int>(active.size()) < concurrency &&
        static_cast<int>(history.size() + active.size()) < txns && rng() % 2 == 0) {
      Active a;
      a.rec.id = a.rec.session = next_id++;
      a.start = clock;
      a.ops_left = 1 + static_cast<int>(rng() % 4);
      active.push_back(std::move(a));
      continue;
    }
    if (active.empty()) continue;
    const size_t i = rng() % active.size();
    Active& a = active[i];
    if (a.ops_left-- > 0) {
      const int64_t key = static_cast<int64_t>(rng() % keys);
      auto it = a.current.find(key);
      if (it == a.current.end()) {
        const auto& versions = db[key];
        auto v = std::find_if(versions.rbegin(), versions.rend(),
                              [&](const Version& x) { return !snapshot_reads || x.ts <= a.start; });
        it = a.current.emplace(key, v->list).first;
        a.rec.reads.push_back({key, v->list});
      }
      if (rng() % 2 == 0) {
        it->second.push_back(next_element);
        auto ap = std::find_if(a.rec.appends.begin(), a.rec.appends.end(),
                               [&](const KeyAppend& x) { return x.key == key; });
        if (ap == a.rec.appends.end()) {
          a.rec.appends.push_back({key, {}});
          ap = a.rec.appends.end() - 1;
        }
        ap->elements.push_back(next_element++);
      }
      continue;
    }
    bool conflict = false;
    for (const auto& ap : a.rec.appends)
      conflict = conflict || (validate && db[ap.key].back().ts > a.start);
    a.rec.outcome = conflict ? Outcome::kAborted : Outcome::kCommitted;
    if (!conflict && !a.rec.appends.empty()) {
      ++clock;
      for (const auto& ap : a.rec.appends) db[ap.key].push_back({clock, a.current[ap.key]});
    }
    history.push_back(std::move(a.rec));
    active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
  }
  // A final reader of everything.
  Txn last = T(next_id, kOk, {}, {});
  for (const auto& [k, versions] : db) last.reads.push_back({k, versions.back().list});
  history.push_back(last);
  return history;
}

TEST(SiChecker, SimulatedSnapshotIsolationIsClean) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckReport r = CheckSnapshotIsolation(SimulateSi(seed, 2000, 6, 6, /*validate=*/true));
    EXPECT_TRUE(r.ok()) << r.ToString();
    EXPECT_GT(r.rw_edges, 0u);
  }
}

TEST(SiChecker, SimulatedSkippedValidationShowsLostUpdates) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckReport r = CheckSnapshotIsolation(SimulateSi(seed, 2000, 6, 6, /*validate=*/false));
    EXPECT_TRUE(r.Has("lost-update")) << r.ToString();
  }
}

TEST(SiChecker, SimulatedReadCommittedShowsReadSkew) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckReport r = CheckSnapshotIsolation(
        SimulateSi(seed, 2000, 6, 6, /*validate=*/true, /*snapshot_reads=*/false));
    EXPECT_TRUE(r.Has("G-single")) << r.ToString();
  }
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

// A worker killed while writing a long line leaves it torn at the end of its file: that record
// is skipped, the attempt stays as written before (unknown); a torn line elsewhere is an error.
TEST(SiChecker, LoadHistorySkipsATornLastLineOnly) {
  const std::string path = ::testing::TempDir() + "/si-history-torn.jsonl";
  const std::string unknown = FormatTxn(T(7, Outcome::kUnknown, {}, {{kX, {70}}}));
  const std::string committed = FormatTxn(T(7, Outcome::kCommitted, {}, {{kX, {70}}}));
  std::ofstream(path) << FormatTxn(T(6, Outcome::kCommitted, {}, {{kY, {60}}})) << "\n"
                      << unknown << "\n"
                      << committed.substr(0, committed.size() / 2);
  auto h = LoadHistory({path});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[1].outcome, Outcome::kUnknown);
  std::ofstream(path) << committed.substr(0, committed.size() / 2) << "\n" << unknown << "\n";
  EXPECT_FALSE(LoadHistory({path}).ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace farpool::db::testing
