// The social workload's answers on every engine (the pool over shm and TCP) match the generator's.
#include "workloads/social/social.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "db/db_test_util.h"
#include "workloads/social_bench.h"

namespace farpool::workloads {
namespace {

TEST(SocialDataTest, FriendshipIsSymmetricAndDeterministic) {
  SocialData a(0.2, 7), b(0.2, 7);
  uint64_t total = 0;
  for (uint64_t u = 0; u < a.users(); ++u) {
    const auto f = a.Friends(u);
    EXPECT_EQ(f, b.Friends(u));
    total += f.size();
    for (uint64_t v : f) {
      const auto back = a.Friends(v);
      EXPECT_TRUE(std::binary_search(back.begin(), back.end(), u)) << u << " " << v;
    }
    const auto g = a.Groups(u);
    EXPECT_GE(g.size(), 1u);
    EXPECT_LE(g.size(), 6u);
  }
  // About 11 friends each (64 candidates at 17%).
  EXPECT_GT(total, a.users() * 6);
  EXPECT_LT(total, a.users() * 16);
  EXPECT_EQ(a.GetMessage(5).text, b.GetMessage(5).text);
}

TEST(SocialDataTest, ParsesQueries) {
  EXPECT_EQ(*ParseSocialQuery("q3"), SocialQuery::kNewGroupMessages);
  EXPECT_EQ(*ParseSocialQuery("6"), SocialQuery::kGroupNames);
  EXPECT_FALSE(ParseSocialQuery("q7").ok());
}

class SocialEngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SocialEngineTest, QueriesMatchTheGenerator) {
  auto tdb = db::TestDatabase::Start(GetParam());
  ASSERT_TRUE(tdb.ok()) << tdb.status().ToString();
  Database& db = (*tdb)->db();
  const SocialData data(0.2, 11);
  auto tables = LoadSocial(db, data, 2);
  ASSERT_TRUE(tables.ok()) << tables.status().ToString();
  Status v = VerifySocial(db, data, 40);
  EXPECT_TRUE(v.ok()) << v.ToString();

  // The write mix changes the answers the way it should.
  auto session = db.NewSession();
  ASSERT_TRUE(session.ok());
  const int64_t user = 10;
  Answer before, after;
  ASSERT_TRUE(RunSocialQuery(**session, *tables, SocialQuery::kNewMessages, user, &before).ok());
  Message m = data.GetMessage(0);
  m.mid = int64_t(data.messages()) + 1;
  m.to_user = user;
  m.to_group = -1;
  m.sender = 3;
  m.time = 1600000000 + m.mid;
  m.is_read = 0;
  ASSERT_TRUE(PostMessage(**session, *tables, m).ok());
  ASSERT_TRUE(RunSocialQuery(**session, *tables, SocialQuery::kNewMessages, user, &after).ok());
  EXPECT_EQ(after.rows, before.rows + 1);
  Answer last;
  ASSERT_TRUE(RunSocialQuery(**session, *tables, SocialQuery::kLast100, 3, &last).ok());
  EXPECT_GE(last.rows, 1u);
  ASSERT_TRUE(MarkRead(**session, *tables, m.mid).ok());
  ASSERT_TRUE(RunSocialQuery(**session, *tables, SocialQuery::kNewMessages, user, &after).ok());
  EXPECT_EQ(after.rows, before.rows);
}

// pool-tcp: the queries' projections and batches as messages the memory servers execute.
INSTANTIATE_TEST_SUITE_P(Engines, SocialEngineTest,
                         ::testing::Values("local", "pool", "pool-tcp", "sharded"),
                         db::EngineParamName);

// Several compute processes on one pool: one loads (--load-only), the others --attach.
TEST(SocialBenchTest, AttachRunsOnTheLoadedNetwork) {
  auto tdb = db::TestDatabase::Start("pool");
  ASSERT_TRUE(tdb.ok()) << tdb.status().ToString();
  SocialBenchOptions o;
  o.engine = Engine::kPool;
  o.cluster_file = (*tdb)->options().cluster_file;
  o.scale = 0.1;
  o.seed = 5;
  o.progress = false;
  o.seconds = 0.05;
  o.warmup_seconds = 0;

  SocialBenchOptions attach = o;
  attach.attach = true;
  auto none = RunSocialBench(attach);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().ToString();

  SocialBenchOptions load = o;
  load.load_only = true;
  load.verify = true;
  auto loaded = RunSocialBench(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)["mode"], "load");
  EXPECT_EQ((*loaded)["verify"], "ok");

  attach.mix = true;
  attach.flows = 2;
  attach.client_id = 1;
  attach.verify = true;
  auto ran = RunSocialBench(attach);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_EQ((*ran)["mode"], "mix");
  EXPECT_EQ((*ran)["load_seconds"], 0.0);

  SocialBenchOptions wrong = attach;
  wrong.scale = 0.2;
  EXPECT_EQ(RunSocialBench(wrong).status().code(), StatusCode::kInvalidArgument);
  SocialBenchOptions local = attach;
  local.engine = Engine::kLocal;
  EXPECT_EQ(RunSocialBench(local).status().code(), StatusCode::kInvalidArgument);
  // A second load on the same cluster is refused.
  EXPECT_EQ(RunSocialBench(load).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace farpool::workloads
