#include "coord/etcd_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "coord/cluster_map.h"

namespace farpool::coord {
namespace {

TEST(Base64, KnownVectors) {
  // RFC 4648, section 10.
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(*Base64Decode("Zm9vYg=="), "foob");
  EXPECT_EQ(*Base64Decode("Zm9vYmE="), "fooba");
}

TEST(Base64, RoundTripsRandomBytes) {
  const uint32_t seed = std::random_device()();
  std::mt19937 rng(seed);
  for (int i = 0; i < 1000; ++i) {
    std::string bytes(rng() % 40, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    auto back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.ok()) << "seed " << seed << ": " << back.status().message();
    ASSERT_EQ(*back, bytes) << "seed " << seed;
  }
}

TEST(Base64, RejectsWhatIsNotCanonical) {
  for (const char* bad : {"Zm9", "Zm9v=", "Zm=v", "Z===", "Zm9v!A==", "Zh==", "Zm9=", "=AAA"}) {
    auto r = Base64Decode(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("base64"), std::string::npos);
    }
  }
}

TEST(PrefixEnd, IncrementsTheLastByteBelow0xff) {
  EXPECT_EQ(PrefixEnd("/farpool/a/"), "/farpool/a0");
  EXPECT_EQ(PrefixEnd("ab\xff"), "ac");
  EXPECT_EQ(PrefixEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(PrefixEnd(""), std::string(1, '\0'));
}

TEST(Gateway, ParsesARangeWithStringIntegers) {
  auto r = ParseRange(
      R"({"header":{"revision":"7"},"kvs":[{"key":"Zm9v","create_revision":"2",)"
      R"("mod_revision":"5","version":"3","value":"YmFy","lease":"7587862"}],"count":"1"})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->revision, 7);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "foo");
  EXPECT_EQ(r->kvs[0].value, "bar");
  EXPECT_EQ(r->kvs[0].create_revision, 2);
  EXPECT_EQ(r->kvs[0].mod_revision, 5);
  EXPECT_EQ(r->kvs[0].version, 3);
  EXPECT_EQ(r->kvs[0].lease, 7587862);
}

TEST(Gateway, AnEmptyRangeHasNoKvs) {
  auto r = ParseRange(R"({"header":{"revision":"2","raft_term":"2"}})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->kvs.empty());
}

TEST(Gateway, RejectsMalformedAnswers) {
  EXPECT_FALSE(ParseRange("not json").ok());
  EXPECT_FALSE(ParseRange("[]").ok());
  EXPECT_FALSE(ParseRange(R"({"kvs":[]})").ok());  // no header
  EXPECT_FALSE(ParseRange(R"({"header":{"revision":"x"}})").ok());
  EXPECT_FALSE(ParseRange(R"({"header":{},"kvs":[{"key":"!!"}]})").ok());
  EXPECT_FALSE(ParseRange(R"({"header":{},"kvs":{}})").ok());
  EXPECT_FALSE(ParseLeaseGrant(R"({"header":{},"TTL":"2"})").ok());  // no ID
  EXPECT_FALSE(ParseLeaseKeepAlive(R"({"header":{}})").ok());
}

TEST(Gateway, TxnAnswersSayWhetherTheComparesHeld) {
  auto won = ParseTxn(R"({"header":{"revision":"9"},"succeeded":true,)"
                      R"("responses":[{"response_put":{"header":{"revision":"9"}}}]})");
  ASSERT_TRUE(won.ok());
  EXPECT_TRUE(won->succeeded);
  EXPECT_TRUE(won->kvs.empty());
  auto lost =
      ParseTxn(R"({"header":{"revision":"9"},"responses":[{"response_range":)"
               R"({"header":{},"kvs":[{"key":"Zm9v","value":"MQ==","mod_revision":"4"}]}}]})");
  ASSERT_TRUE(lost.ok());
  EXPECT_FALSE(lost->succeeded);
  ASSERT_EQ(lost->kvs.size(), 1u);
  EXPECT_EQ(lost->kvs[0].value, "1");
  EXPECT_EQ(lost->kvs[0].mod_revision, 4);
}

TEST(Gateway, KeepAliveWithoutTtlMeansTheLeaseIsGone) {
  auto alive = ParseLeaseKeepAlive(R"({"result":{"header":{},"ID":"12","TTL":"2"}})");
  ASSERT_TRUE(alive.ok());
  EXPECT_EQ(alive->id, 12);
  EXPECT_EQ(alive->ttl, 2);
  auto gone = ParseLeaseKeepAlive(R"({"result":{"header":{},"ID":"12"}})");
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->ttl, 0);
}

TEST(Gateway, ErrorsCarryEtcdsMessageAndCode) {
  auto e = ParseGatewayError(
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, 5);
  EXPECT_EQ(e->message, "etcdserver: requested lease not found");
  EXPECT_FALSE(ParseGatewayError(R"({"header":{}})").has_value());
  EXPECT_FALSE(ParseGatewayError("<html>").has_value());
}

// Responses as etcd 3.4's gateway streams them (captured from a real one).
constexpr std::string_view kCreated =
    R"({"result":{"header":{"cluster_id":"1","revision":"2","raft_term":"2"},"created":true}})";
constexpr std::string_view kPut =
    R"({"result":{"header":{"revision":"3"},"events":[{"kv":{"key":"YQ==","create_revision":"2",)"
    R"("mod_revision":"3","version":"2","value":"e30="}}]}})";
constexpr std::string_view kDelete =
    R"({"result":{"header":{"revision":"4"},"events":[{"type":"DELETE","kv":{"key":"YQ==",)"
    R"("mod_revision":"4"}}]}})";
constexpr std::string_view kCompacted =
    R"({"result":{"header":{"cluster_id":"1","raft_term":"2"},"canceled":true,)"
    R"("compact_revision":"3"}})";

TEST(Watch, ParsesCreatedPutDeleteCompactedAndProgress) {
  auto created = ParseWatchResponse(kCreated);
  ASSERT_TRUE(created.ok()) << created.status().message();
  EXPECT_TRUE(created->created);
  EXPECT_FALSE(created->canceled);
  EXPECT_EQ(created->revision, 2);
  EXPECT_TRUE(created->events.empty());

  auto put = ParseWatchResponse(kPut);
  ASSERT_TRUE(put.ok()) << put.status().message();
  ASSERT_EQ(put->events.size(), 1u);
  EXPECT_EQ(put->events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(put->events[0].kv.key, "a");
  EXPECT_EQ(put->events[0].kv.value, "{}");
  EXPECT_EQ(put->events[0].kv.mod_revision, 3);

  auto del = ParseWatchResponse(kDelete);
  ASSERT_TRUE(del.ok()) << del.status().message();
  ASSERT_EQ(del->events.size(), 1u);
  EXPECT_EQ(del->events[0].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(del->events[0].kv.key, "a");
  EXPECT_EQ(del->events[0].kv.mod_revision, 4);

  auto compacted = ParseWatchResponse(kCompacted);
  ASSERT_TRUE(compacted.ok()) << compacted.status().message();
  EXPECT_TRUE(compacted->canceled);
  EXPECT_EQ(compacted->compact_revision, 3);
  EXPECT_EQ(compacted->revision, 0);

  auto progress = ParseWatchResponse(R"({"result":{"header":{"revision":"9"}}})");
  ASSERT_TRUE(progress.ok());
  EXPECT_FALSE(progress->created || progress->canceled);
  EXPECT_TRUE(progress->events.empty());
  EXPECT_EQ(progress->revision, 9);

  auto canceled = ParseWatchResponse(
      R"({"result":{"header":{"revision":"5"},"canceled":true,"cancel_reason":"no leader"}})");
  ASSERT_TRUE(canceled.ok());
  EXPECT_TRUE(canceled->canceled);
  EXPECT_EQ(canceled->compact_revision, 0);
  EXPECT_EQ(canceled->cancel_reason, "no leader");
}

TEST(Watch, AStreamErrorIsUnavailableAndMalformedResponsesAreRejected) {
  auto error = ParseWatchResponse(
      R"({"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}})");
  ASSERT_FALSE(error.ok());
  EXPECT_EQ(error.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(error.status().message().find("no leader"), std::string::npos);
  for (const char* bad :
       {"{}", "[]", "nope", R"({"result":[]})", R"({"result":{"created":"yes"}})",
        R"({"result":{"events":{}}})", R"({"result":{"events":[{"type":"PUT"}]}})",
        R"({"result":{"events":[{"type":"MOVE","kv":{"key":"YQ=="}}]}})",
        R"({"result":{"events":[{"kv":{"key":"!!"}}]}})",
        R"({"result":{"header":{"revision":"x"}}})"}) {
    EXPECT_FALSE(ParseWatchResponse(bad).ok()) << bad;
  }
}

TEST(Watch, TheRequestNamesKeyRangeAndStartInTheGatewaysForm) {
  EXPECT_EQ(WatchCreateRequest("a", "", 0), R"({"create_request":{"key":"YQ=="}})");
  EXPECT_EQ(WatchCreateRequest("a/", PrefixEnd("a/"), 12),
            R"({"create_request":{"key":"YS8=","range_end":"YTA=","start_revision":"12"}})");
}

// Every way of cutting a stream of four responses into chunks yields the same four objects:
// partial chunks, several objects in one chunk, braces and quotes inside strings.
TEST(Watch, TheSplitterFindsWholeObjectsWhateverTheChunks) {
  const std::string tricky = R"({"result":{"cancel_reason":"a \"}{\" \\","canceled":true}})";
  const std::vector<std::string> objects = {std::string(kCreated), std::string(kPut), tricky,
                                            std::string(kDelete)};
  std::string stream;
  for (const std::string& o : objects) stream += o + "\n";
  const uint32_t seed = std::random_device()();
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    JsonStreamSplitter splitter;
    std::vector<std::string> out;
    for (size_t at = 0; at < stream.size();) {
      const size_t n =
          round == 0 ? stream.size() : std::min<size_t>(1 + rng() % 40, stream.size() - at);
      splitter.Append(std::string_view(stream).substr(at, n));
      at += n;
      while (true) {
        auto next = splitter.Next();
        ASSERT_TRUE(next.ok()) << "seed " << seed << ": " << next.status().message();
        if (!next->has_value()) break;
        out.push_back(**next);
      }
    }
    ASSERT_EQ(out, objects) << "seed " << seed << " round " << round;
    EXPECT_EQ(splitter.pending(), 0u);
    auto parsed = ParseWatchResponse(out[2]);
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_EQ(parsed->cancel_reason, "a \"}{\" \\");
  }
  // A partial object stays pending until its end arrives.
  JsonStreamSplitter partial;
  partial.Append(kPut.substr(0, 10));
  auto none = partial.Next();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(partial.pending(), 10u);
}

TEST(Watch, TheSplitterRejectsWhatIsNotAStreamOfObjects) {
  for (const char* bad : {"}", "x{}", "{}]", "[{}]"}) {
    JsonStreamSplitter splitter;
    splitter.Append(bad);
    Status failed;
    for (int i = 0; i < 3 && failed.ok(); ++i) failed = splitter.Next().status();
    EXPECT_EQ(failed.code(), StatusCode::kProtocol) << bad;
  }
}

TEST(ClusterMapJson, RoundTrips) {
  ClusterMap map;
  map.epoch = 3;
  map.replicas = 1;
  map.servers = {{0, "10.1.0.2:7000", 1 << 20, 1, -1}, {1, "10.1.0.3:7000", 1 << 20, 1, 0}};
  auto back = ClusterMap::Parse(map.ToJson(), "test");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), map.ToJson());
  EXPECT_EQ(back->Find(0)->served_by, 1);
  EXPECT_EQ(back->Find(1)->backup, 0);
  EXPECT_EQ(back->Find(2), nullptr);
}

// --replicas 2: the further backups round-trip, count in SlotsInUse, and DropBackup moves the
// next one up when the first goes.
TEST(ClusterMapJson, KeepsEveryBackupInRingOrder) {
  ClusterMap map;
  map.replicas = 2;
  for (uint16_t i = 0; i < 4; ++i) {
    MapServer s{i, "10.1.0.2:700" + std::to_string(i), 1 << 20, i, (i + 1) % 4, -1, 0, 3};
    s.more_backups = {{static_cast<uint16_t>((i + 2) % 4), 1}};
    map.servers.push_back(s);
  }
  auto back = ClusterMap::Parse(map.ToJson(), "test");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), map.ToJson());
  const std::vector<MapServer::Backup> want = {{2, 0}, {3, 1}};
  EXPECT_EQ(back->Find(1)->Backups(), want);
  std::vector<int> used = back->SlotsInUse(3);
  std::sort(used.begin(), used.end());
  EXPECT_EQ(used, (std::vector<int>{0, 1}));  // server 2's first backup, server 1's second
  MapServer region1 = *back->Find(1);
  EXPECT_TRUE(region1.DropBackup(2));
  EXPECT_EQ(region1.backup, 3);
  EXPECT_EQ(region1.backup_slot, 1);
  EXPECT_TRUE(region1.more_backups.empty());
  EXPECT_FALSE(region1.DropBackup(0));
  EXPECT_TRUE(region1.DropBackup(3));
  EXPECT_EQ(region1.backup, -1);
  EXPECT_FALSE(ClusterMap::Parse(
                   R"({"epoch":1,"replicas":2,"servers":[{"id":0,"address":"a:1","served_by":0,)"
                   R"("backup":-1,"more_backups":[{"id":0,"slot":1}]}]})",
                   "m")
                   .ok());  // further backups without a first
}

TEST(ClusterMapJson, RejectsBadMapsNamingTheField) {
  auto r = ClusterMap::Parse(R"({"epoch":0,"replicas":0,"servers":[]})", "etcd /p/map");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("etcd /p/map: epoch"), std::string::npos);
  EXPECT_FALSE(
      ClusterMap::Parse(
          R"({"epoch":1,"replicas":1,"servers":[{"id":0,"address":"a:1","served_by":4,"backup":-1}]})",
          "m")
          .ok());  // served by a server that is not in the map
  EXPECT_FALSE(
      ClusterMap::Parse(
          R"({"epoch":1,"replicas":0,"servers":[{"id":0,"address":"a:1","served_by":0,"backup":-1},)"
          R"({"id":0,"address":"a:2","served_by":0,"backup":-1}]})",
          "m")
          .ok());  // duplicate id
  EXPECT_FALSE(ClusterMap::Parse("{", "m").ok());
}

}  // namespace
}  // namespace farpool::coord
