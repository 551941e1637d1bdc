// The sharded engine's partition servers: the wire decoder and the partition against malformed
// input (directly and over the transport: an error reply, and the server keeps serving), the
// timestamp service's single decision per transaction, and the locks of a coordinator that
// died (prepared and never decided: resolved as aborted; decided but not installed everywhere:
// resolved as committed). FARPOOL_SEED replays the randomized decoder test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "db/db_test_util.h"
#include "db/shard_server.h"
#include "db/shard_wire.h"
#include "db/sharded_engine.h"
#include "farpool/cluster.h"
#include "transport/ucx.h"

using namespace std::chrono_literals;

namespace farpool::db {
namespace {

using namespace shard;

std::span<const std::byte> AsBytes(const void* p, size_t n) {
  return {static_cast<const std::byte*>(p), n};
}

// The status a reply carries (Ok for any non-error reply).
Status ReplyStatus(const std::vector<std::byte>& reply) {
  auto m = Decode(reply);
  if (!m.ok()) return m.status();
  return m->opcode == Opcode::kErrorReply ? DecodeError(*m) : Status::Ok();
}

// The fixed body of a reply of opcode `expected`, copied out (the reply's bytes may go).
template <typename Body>
Body BodyOf(const std::vector<std::byte>& reply, Opcode expected) {
  auto m = Decode(reply);
  if (!m.ok() || m->opcode != expected) {
    ADD_FAILURE() << "expected " << OpcodeName(expected) << ", got "
                  << (m.ok() ? std::string(OpcodeName(m->opcode)) + ": " +
                                   ReplyStatus(reply).ToString()
                             : m.status().ToString());
    return Body{};
  }
  return m->As<Body>();
}

std::vector<std::byte> Prepare(uint64_t txn, uint64_t read_ts, uint32_t table,
                               std::vector<std::pair<int64_t, int64_t>> rows, uint32_t lease_ms,
                               uint32_t flags = 0) {
  TailWriter tail;
  for (auto [key, v] : rows) {
    WriteItem w{};
    w.table = table;
    w.op = uint8_t(WriteOp::kPut);
    w.key = key;
    w.value_size = 8;
    tail.Put(w);
    tail.PutBytes(std::string_view(reinterpret_cast<const char*>(&v), 8));
  }
  return Encode(1, Opcode::kPrepareRequest,
                PrepareRequest{txn, read_ts, uint32_t(rows.size()), lease_ms, flags, 0},
                tail.bytes());
}

TEST(ShardWireTest, PartitionRejectsMalformedMessagesAndKeepsServing) {
  PartitionState p(0);
  std::vector<std::vector<std::byte>> bad;
  bad.push_back({});                          // empty
  bad.push_back(std::vector<std::byte>(10));  // truncated header
  auto begin = Encode(7, Opcode::kBeginRequest, BeginRequest{0});
  auto m = begin;
  m[0] = std::byte{0};  // bad magic
  bad.push_back(m);
  m = begin;
  m[4] = std::byte{9};  // version 9
  bad.push_back(m);
  m = begin;
  m[6] = std::byte{200};  // unknown opcode
  bad.push_back(m);
  m = begin;
  m.push_back(std::byte{0});  // body_size disagrees with the length
  bad.push_back(m);
  // A read that declares more keys than it carries.
  int64_t key = 5;
  bad.push_back(Encode(1, Opcode::kReadRequest, ReadRequest{1, 3, 10}, AsBytes(&key, 8)));
  // A prepare with an unknown write op, and one whose value runs past the end.
  auto prep = Prepare(11, 1, 1, {{1, 1}}, 1000);
  m = prep;
  m[sizeof(transport::FrameHeader) + sizeof(PrepareRequest) + 4] = std::byte{9};
  bad.push_back(m);
  m = prep;
  // value_size 200
  m[sizeof(transport::FrameHeader) + sizeof(PrepareRequest) + 16] = std::byte{200};
  bad.push_back(m);
  bad.push_back(Encode(1, Opcode::kBeginReply, BeginReply{3}));  // a reply sent as a request
  for (size_t i = 0; i < bad.size(); ++i) {
    Status s = ReplyStatus(p.Handle(bad[i]));
    EXPECT_EQ(s.code(), StatusCode::kProtocol) << "case " << i << ": " << s.ToString();
    EXPECT_NE(s.message().find("partition 0"), std::string::npos) << s.message();
  }
  EXPECT_EQ(p.rejected(), bad.size());
  // Still serving: a valid request is answered, and nothing was locked by the bad prepares.
  auto reply = p.Handle(begin);
  ASSERT_OK(ReplyStatus(reply));
  auto ok = Decode(reply);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->opcode, Opcode::kBeginReply);
  EXPECT_EQ(ok->header.request_id, 7u);
  auto locked =
      BodyOf<LockedReply>(p.Handle(Encode(1, Opcode::kLockedRequest, LockedRequest{UINT32_MAX, 0})),
                          Opcode::kLockedReply);
  EXPECT_EQ(locked.locked, 0u);
}

TEST(ShardWireTest, RandomlyCorruptedMessagesNeverCrashThePartition) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  PartitionState p(0);
  int64_t keys[2] = {1, 2};
  std::vector<std::vector<std::byte>> valid = {
      Encode(1, Opcode::kBeginRequest, BeginRequest{0}),
      Encode(2, Opcode::kReadRequest, ReadRequest{1, 2, 5}, AsBytes(keys, 16)),
      Encode(3, Opcode::kScanRequest, ScanRequest{1, 0, 5, 0, 10, 0, {}}),
      Prepare(4, 1, 1, {{1, 1}, {2, 2}}, 1000),
      Encode(5, Opcode::kCommitRequest, CommitRequest{4, 0}),
      Encode(6, Opcode::kLockedRequest, LockedRequest{UINT32_MAX, 0}),
  };
  for (int i = 0; i < 5000; ++i) {
    auto m = valid[rng() % valid.size()];
    const int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) {
      switch (rng() % 3) {
        case 0:
          m[rng() % m.size()] = std::byte(rng());
          break;
        case 1:
          m.resize(rng() % (m.size() + 1));
          break;
        case 2:
          m.push_back(std::byte(rng()));
          break;
      }
      if (m.empty()) break;
    }
    auto reply = p.Handle(m);
    ASSERT_TRUE(Decode(reply).ok());  // always a well-formed reply
    // Release anything a corrupted-but-valid prepare locked, so the test stays deterministic.
    for (uint64_t txn = 0; txn < 16; ++txn) {
      (void)p.Handle(Encode(9, Opcode::kCommitRequest, CommitRequest{txn, 0}));
    }
  }
  ASSERT_OK(ReplyStatus(p.Handle(valid[0])));
}

TEST(ShardWireTest, OneDecisionPerTransaction) {
  PartitionState p(0);
  ASSERT_OK(ReplyStatus(p.Handle(Prepare(21, 1, 1, {{1, 10}}, 1000))));
  // A resolver gets there first: the transaction is aborted, and its own Decide fails.
  EXPECT_EQ(BodyOf<ResolveReply>(p.Handle(Encode(1, Opcode::kResolveRequest, ResolveRequest{21})),
                                 Opcode::kResolveReply)
                .commit_ts,
            0u);
  EXPECT_EQ(
      ReplyStatus(p.Handle(Encode(1, Opcode::kDecideRequest, DecideRequest{21, 1, 0}))).code(),
      StatusCode::kAborted);
  // A decided transaction resolves to its commit timestamp, however often it is asked.
  ASSERT_OK(ReplyStatus(p.Handle(Encode(1, Opcode::kCommitRequest, CommitRequest{21, 0}))));
  ASSERT_OK(ReplyStatus(p.Handle(Prepare(22, 1, 1, {{1, 11}}, 1000))));
  const uint64_t ts =
      BodyOf<DecideReply>(p.Handle(Encode(1, Opcode::kDecideRequest, DecideRequest{22, 1, 0})),
                          Opcode::kDecideReply)
          .commit_ts;
  EXPECT_GT(ts, 1u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(BodyOf<ResolveReply>(p.Handle(Encode(1, Opcode::kResolveRequest, ResolveRequest{22})),
                                   Opcode::kResolveReply)
                  .commit_ts,
              ts);
  }
}

// ------------------------------------------------------------------ over the transport

// Two partition servers in this process and their cluster file; a raw client for hand-made
// messages (a coordinator that sends garbage, or dies half-way through a commit).
class ShardClusterTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/farpool-shardtest-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ClusterConfig config;
    config.transport = Fabric::kShm;
    for (uint16_t id = 0; id < 2; ++id) {
      PartitionServerOptions o;
      o.id = id;
      o.progress = ProgressMode::kEvent;
      o.fabric = Fabric::kShm;
      auto s = PartitionServer::Start(o);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ServerAddress a;
      a.id = id;
      a.host = "127.0.0.1";
      a.port = (*s)->port();
      config.servers.push_back(a);
      servers_.push_back(std::move(*s));
    }
    options_.engine = Engine::kSharded;
    options_.cluster_file = dir_ + "/cluster.json";
    options_.lease = 300ms;
    ASSERT_OK(config.Save(options_.cluster_file));
    transport::Context::Options co;
    co.fabric = Fabric::kShm;
    auto ctx = transport::Context::Create(co);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    context_ = std::move(*ctx);
    auto w = transport::Worker::Create(*context_, false);
    ASSERT_TRUE(w.ok());
    worker_ = std::move(*w);
    ASSERT_OK(worker_->SetAmHandler(kShardAm, &OnReply, this));
    for (const auto& a : config.servers) {
      auto ep = transport::Endpoint::Connect(*worker_, a.host, a.port, nullptr);
      ASSERT_TRUE(ep.ok());
      eps_.push_back(std::move(*ep));
    }
  }
  void TearDown() override {
    eps_.clear();
    worker_.reset();
    context_.reset();
    for (auto& s : servers_) s->Stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static ucs_status_t OnReply(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t*) {
    auto* self = static_cast<ShardClusterTest*>(arg);
    const auto* b = static_cast<const std::byte*>(data);
    self->replies_.emplace_back(b, b + length);
    return UCS_OK;
  }
  // Sends raw bytes to partition p and returns the reply.
  std::vector<std::byte> Call(size_t p, std::vector<std::byte> bytes) {
    replies_.clear();
    Status s = transport::PostAm(eps_[p]->get(), kShardAm, std::move(bytes), true);
    EXPECT_TRUE(s.ok()) << s.ToString();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (replies_.empty() && std::chrono::steady_clock::now() < deadline) worker_->Progress();
    EXPECT_FALSE(replies_.empty()) << "no reply from partition " << p;
    return replies_.empty() ? std::vector<std::byte>{} : replies_.front();
  }

  std::string dir_;
  std::vector<std::unique_ptr<PartitionServer>> servers_;
  DatabaseOptions options_;
  std::unique_ptr<transport::Context> context_;
  std::unique_ptr<transport::Worker> worker_;
  std::vector<std::unique_ptr<transport::Endpoint>> eps_;
  std::vector<std::vector<std::byte>> replies_;
};

const Schema& IntSchema() {
  static const Schema s{{"v", ColumnType::kInt64}};
  return s;
}

Result<int64_t> ReadInt(Session& s, const Table& t, int64_t key) {
  int64_t out = 0;
  FARPOOL_RETURN_IF_ERROR(RunTransaction(s, [&](Transaction& txn) -> Status {
    Row r;
    FARPOOL_RETURN_IF_ERROR(txn.Get(t, key, &r));
    out = r.GetInt64(0);
    return Status::Ok();
  }));
  return out;
}

TEST_F(ShardClusterTest, MalformedMessagesOverTheTransportGetErrorReplies) {
  std::vector<std::byte> garbage(100, std::byte{0x5A});
  EXPECT_EQ(ReplyStatus(Call(1, garbage)).code(), StatusCode::kProtocol);
  auto begin = Encode(3, Opcode::kBeginRequest, BeginRequest{0});
  begin[4] = std::byte{2};  // version 2
  Status s = ReplyStatus(Call(0, begin));
  EXPECT_EQ(s.code(), StatusCode::kProtocol);
  EXPECT_NE(s.message().find("version 2"), std::string::npos) << s.ToString();
  // The servers keep serving a real database.
  auto db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  auto t = (*db)->CreateTable("t", IntSchema());
  ASSERT_TRUE(t.ok());
  auto session = (*db)->NewSession();
  ASSERT_TRUE(session.ok());
  ASSERT_OK(RunTransaction(**session, [&](Transaction& txn) {
    Row r(IntSchema());
    r.SetInt64(0, 42);
    return txn.Put(**t, 1, r);
  }));
  EXPECT_EQ(*ReadInt(**session, **t, 1), 42);
}

TEST_F(ShardClusterTest, LocksOfADeadCoordinatorAreResolvedAfterItsLease) {
  auto db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  auto t = (*db)->CreateTable("t", IntSchema());
  ASSERT_TRUE(t.ok());
  const uint32_t table = (*t)->id();
  auto session = (*db)->NewSession();
  ASSERT_TRUE(session.ok());
  // Keys a (partition 0) and b (partition 1), both 100.
  int64_t a = 0, b = 0;
  while (ShardedPartitionOf(a, 2) != 0) ++a;
  while (ShardedPartitionOf(b, 2) != 1) ++b;
  ASSERT_OK(RunTransaction(**session, [&](Transaction& txn) -> Status {
    Row r(IntSchema());
    r.SetInt64(0, 100);
    FARPOOL_RETURN_IF_ERROR(txn.Put(**t, a, r));
    return txn.Put(**t, b, r);
  }));
  const uint64_t read_ts =
      BodyOf<BeginReply>(Call(0, Encode(1, Opcode::kBeginRequest, BeginRequest{0})),
                         Opcode::kBeginReply)
          .read_ts;

  // Coordinator 1 prepares a -> 0, b -> 200 on both partitions and dies undecided.
  const uint64_t dead1 = 0xDEAD00000001ULL;
  ASSERT_OK(ReplyStatus(Call(0, Prepare(dead1, read_ts, table, {{a, 0}}, 300))));
  ASSERT_OK(ReplyStatus(Call(1, Prepare(dead1, read_ts, table, {{b, 200}}, 300))));
  EXPECT_EQ(*(*db)->CountLocked(**t), 2u);
  // A later commit, so that readers' snapshots include timestamps the dead transaction could
  // have committed at: they cannot ignore its locks.
  ASSERT_OK(RunTransaction(**session, [&](Transaction& txn) {
    Row r(IntSchema());
    r.SetInt64(0, 1);
    return txn.Put(**t, -1, r);
  }));
  // A reader waits for the lease, resolves the transaction as aborted, reads the old values.
  EXPECT_EQ(*ReadInt(**session, **t, a), 100);
  EXPECT_EQ(*ReadInt(**session, **t, b), 100);
  EXPECT_EQ(*(*db)->CountLocked(**t), 0u);  // the readers resolved both locks
  ASSERT_OK((*db)->RecoverExpired());

  // Coordinator 2 prepares both, is decided (partition 0 installs its part) and dies before
  // telling partition 1: the transaction committed, so partition 1 must install it too.
  const uint64_t read_ts2 =
      BodyOf<BeginReply>(Call(0, Encode(1, Opcode::kBeginRequest, BeginRequest{0})),
                         Opcode::kBeginReply)
          .read_ts;
  const uint64_t dead2 = 0xDEAD00000002ULL;
  for (auto [p, key, v] : {std::tuple<size_t, int64_t, int64_t>{0, a, 30}, {1, b, 170}}) {
    auto reply = BodyOf<PrepareReply>(Call(p, Prepare(dead2, read_ts2, table, {{key, v}}, 300)),
                                      Opcode::kPrepareReply);
    ASSERT_EQ(reply.conflict, 0u) << "partition " << p;
  }
  ASSERT_OK(ReplyStatus(Call(0, Encode(1, Opcode::kDecideRequest, DecideRequest{dead2, 1, 0}))));
  // A writer meets b's lock: it aborts, resolves it once the lease expired, and its retry wins.
  ASSERT_OK(RunTransaction(**session, [&](Transaction& txn) -> Status {
    Row r;
    FARPOOL_RETURN_IF_ERROR(txn.Get(**t, b, &r));
    r.SetInt64(0, r.GetInt64(0) + 1);
    return txn.Put(**t, b, r);
  }));
  EXPECT_EQ(*ReadInt(**session, **t, a), 30);
  EXPECT_EQ(*ReadInt(**session, **t, b), 171);
  EXPECT_EQ(*(*db)->CountLocked(**t), 0u);
}

}  // namespace
}  // namespace farpool::db
