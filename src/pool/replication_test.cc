// Replication with real processes (docs/pool.md "Replication"): `farpool cluster up
// --replicas 1` servers, one of them SIGKILLed or fenced while client threads change memory.
// The invariants: every change a client saw acknowledged reads back afterwards, from the
// backup that took the dead server's data over; a change whose outcome the client could not
// learn (in flight at the kill) is either wholly there or not; fetch-and-add totals lie between
// the acknowledged and the attempted count; a primary whose backup took over acknowledges
// nothing more.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "common/process.h"
#include "farpool/pool.h"
#include "pool/control_client.h"
#include "pool/test_cluster.h"
#include "transport/auth.h"
#include "transport/wire.h"

namespace farpool {
namespace {

using namespace std::chrono_literals;

constexpr int kServers = 3;
constexpr uint64_t kObjectSize = 256;
constexpr int kObjectsPerServer = 16;
constexpr int kThreads = 2;

LocalClusterOptions Replicated(Fabric fabric) {
  LocalClusterOptions o;
  o.servers = kServers;
  o.memory = 64 << 20;
  o.transport = fabric;
  o.progress = ProgressMode::kEvent;
  o.replicas = 1;
  return o;
}

std::vector<uint8_t> Pattern(uint64_t seed) {
  std::vector<uint8_t> bytes(kObjectSize);
  std::mt19937_64 rng(seed);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// One object's history as its (only) writer saw it.
struct ObjectLog {
  GlobalAddress address;
  uint64_t acknowledged = 0;      // seed of the last write that returned Ok (0: none)
  std::vector<uint64_t> unknown;  // seeds of later writes that failed (outcome unknown)
};

struct Param {
  Fabric fabric;
  int victim;
};

class ReplicationTest : public ::testing::TestWithParam<Param> {};

// Client threads write patterns into their own objects on every server and add to one counter
// per server; the victim is SIGKILLed half-way; the threads go on until each has had 200
// acknowledged operations after the kill. Then every object holds its last acknowledged
// pattern or one of the patterns written after it whose outcome was unknown, and every counter
// lies between the acknowledged and the attempted additions.
TEST_P(ReplicationTest, EveryAcknowledgedChangeSurvivesTheKillOfItsServer) {
  const Param p = GetParam();
  TestCluster cluster(Replicated(p.fabric));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->replicas, 1);
  PoolOptions po;
  po.op_timeout = 5000ms;
  auto pool = Pool::Connect(*config, po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  Pool& pl = **pool;

  std::vector<GlobalAddress> counters;
  std::vector<ObjectLog> objects;
  for (int s = 0; s < kServers; ++s) {
    auto c = pl.Alloc(8, Placement::OnServer(static_cast<uint16_t>(s)));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const uint64_t zero = 0;
    ASSERT_TRUE(pl.Write(*c, &zero, 8).ok());
    counters.push_back(*c);
    for (int i = 0; i < kObjectsPerServer; ++i) {
      auto a = pl.Alloc(kObjectSize, Placement::OnServer(static_cast<uint16_t>(s)));
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      objects.push_back({*a, 0, {}});
    }
  }
  std::atomic<bool> killed{false};
  std::vector<std::vector<uint64_t>> acked_adds(kThreads, std::vector<uint64_t>(kServers));
  std::vector<std::vector<uint64_t>> unknown_adds(kThreads, std::vector<uint64_t>(kServers));
  std::vector<uint64_t> failures(kThreads);
  std::vector<std::string> first_error(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      int after_kill = 0;
      const auto give_up = std::chrono::steady_clock::now() + 60s;
      while (after_kill < 200 && std::chrono::steady_clock::now() < give_up) {
        // Thread t owns the objects i with i % kThreads == t.
        const size_t i = (rng() % (objects.size() / kThreads)) * kThreads + t;
        const int server = static_cast<int>(rng() % kServers);
        Status st;
        if (rng() % 2 == 0) {
          const uint64_t seed = rng() | 1;
          st = pl.Write(objects[i].address, Pattern(seed).data(), kObjectSize);
          if (st.ok()) {
            objects[i].acknowledged = seed;
            objects[i].unknown.clear();
          } else {
            objects[i].unknown.push_back(seed);
          }
        } else {
          auto prev = pl.FetchAdd(counters[server], 1);
          st = prev.status();
          (st.ok() ? acked_adds : unknown_adds)[t][server]++;
        }
        if (!st.ok()) {
          ++failures[t];
          if (first_error[t].empty()) first_error[t] = st.ToString();
          std::this_thread::sleep_for(10ms);
        } else if (killed) {
          ++after_kill;
        }
      }
    });
  }
  std::this_thread::sleep_for(1s);
  ASSERT_EQ(kill(static_cast<pid_t>(config->servers[p.victim].pid), SIGKILL), 0);
  killed = true;
  for (auto& th : threads) th.join();

  uint64_t all_failures = 0;
  for (int t = 0; t < kThreads; ++t) all_failures += failures[t];
  // Only operations in flight at the kill may fail: a handful, not the run.
  EXPECT_LE(all_failures, 20u) << first_error[0] << " / " << first_error[1];
  for (const ObjectLog& o : objects) {
    std::vector<uint8_t> got(kObjectSize);
    ASSERT_TRUE(pl.Read(o.address, got.data(), kObjectSize).ok()) << o.address.ToString();
    bool match = o.acknowledged == 0 ? got == std::vector<uint8_t>(kObjectSize, 0)
                                     : got == Pattern(o.acknowledged);
    for (uint64_t seed : o.unknown) match = match || got == Pattern(seed);
    EXPECT_TRUE(match) << "object " << o.address.ToString()
                       << " holds neither its last acknowledged write nor a later one";
  }
  for (int s = 0; s < kServers; ++s) {
    uint64_t value = 0, acked = 0, unknown = 0;
    ASSERT_TRUE(pl.Read(counters[s], &value, 8).ok());
    for (int t = 0; t < kThreads; ++t) {
      acked += acked_adds[t][s];
      unknown += unknown_adds[t][s];
    }
    EXPECT_GE(value, acked) << "server " << s << "'s counter lost acknowledged additions";
    EXPECT_LE(value, acked + unknown) << "server " << s << "'s counter gained additions";
  }
  // The dead server's addresses now go to its backup.
  EXPECT_FALSE(pl.Stats(static_cast<uint16_t>(p.victim)).ok());
}

INSTANTIATE_TEST_SUITE_P(Victims, ReplicationTest,
                         ::testing::Values(Param{Fabric::kTcp, 0}, Param{Fabric::kTcp, 1},
                                           Param{Fabric::kTcp, 2}, Param{Fabric::kShm, 1}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(FabricName(info.param.fabric)) + "_server" +
                                  std::to_string(info.param.victim);
                         });

// Sends one control request to the server of `address` (port `port`) with the cluster's
// secret, as a client would.
Status Ask(const ClusterConfig& config, const ServerAddress& address, uint16_t port,
           const control::Encoder& encode, wire::Opcode expected) {
  FARPOOL_ASSIGN_OR_RETURN(auto secret, transport::ClusterSecret::Read(config.secret_file));
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = 0x5eed0001;
  control::Connection::Options o{
      "server " + std::to_string(address.id), address.host, port, &secret, Fabric::kTcp, 3000ms};
  FARPOOL_ASSIGN_OR_RETURN(auto c, control::Connection::Open(o, hello));
  return c->Call(encode, expected).status();
}

// A primary that its clients still reach but whose backup has taken its data over (the case of
// a primary cut off from part of the cluster): its next change is not acknowledged, it serves
// nothing more and its process ends, and the client follows the data to the backup, where the
// acknowledged bytes are.
TEST(Replication, APromotedBackupFencesItsPrimaryAndTheClientFollowsTheData) {
  TestCluster cluster(Replicated(Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  auto pool = Pool::Connect(*config);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto a = (*pool)->Alloc(64, Placement::OnServer(1));
  ASSERT_TRUE(a.ok());
  const uint64_t before = 0x1111;
  ASSERT_TRUE((*pool)->Write(*a, &before, 8).ok());

  // Another client declares server 1 gone at its backup, server 2.
  ASSERT_TRUE(Ask(
                  *config, config->servers[2], config->servers[2].port,
                  [](uint64_t id) {
                    return wire::Encode(id, wire::PromoteRequest{1, {}});
                  },
                  wire::Opcode::kPromoteReply)
                  .ok());
  const uint64_t after = 0x2222;
  Status refused = (*pool)->Write(*a, &after, 8);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  EXPECT_NE(refused.message().find("not acknowledged"), std::string::npos) << refused.message();
  // The fenced server ends itself; the client fails it over and reads what was acknowledged.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (ProcessRunning(static_cast<pid_t>(config->servers[1].pid)) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_FALSE(ProcessRunning(static_cast<pid_t>(config->servers[1].pid)));
  uint64_t got = 0;
  Status read = (*pool)->Read(*a, &got, 8);
  for (int i = 0; i < 3 && !read.ok(); ++i) read = (*pool)->Read(*a, &got, 8);
  ASSERT_TRUE(read.ok()) << read.ToString();
  EXPECT_EQ(got, before) << "the backup holds the last acknowledged value";
  ASSERT_TRUE((*pool)->Write(*a, &after, 8).ok());
  ASSERT_TRUE((*pool)->Read(*a, &got, 8).ok());
  EXPECT_EQ(got, after);
}

TEST(Replication, MisdirectedAndUnauthenticatedReplicationRequestsAreRefused) {
  TestCluster cluster(Replicated(Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  const ServerAddress& s0 = config->servers[0];
  // Server 0 mirrors server 2, not server 1.
  Status wrong = Ask(
      *config, s0, s0.port,
      [](uint64_t id) {
        return wire::Encode(id, wire::PromoteRequest{1, {}});
      },
      wire::Opcode::kPromoteReply);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument) << wrong.ToString();
  EXPECT_NE(wrong.message().find("does not mirror"), std::string::npos) << wrong.message();
  // Forwards belong on the mirror's port.
  wire::ReplicateRequest forward{2, 0, 0, 0, 0};
  Status misplaced = Ask(
      *config, s0, s0.port, [&](uint64_t id) { return wire::Encode(id, forward); },
      wire::Opcode::kReplicateReply);
  EXPECT_EQ(misplaced.code(), StatusCode::kInvalidArgument) << misplaced.ToString();
  // A client without the secret gets nothing from a mirror.
  ClusterConfig open = *config;
  open.secret_file.clear();
  PoolOptions po;
  po.connect_timeout = 2000ms;
  auto stranger = Pool::Connect(open, po);
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.status().code(), StatusCode::kPermissionDenied);
}

TEST(Replication, ClusterUpRefusesCopiesItCannotPlace) {
  for (auto [servers, replicas] : {std::pair{1, 1}, std::pair{3, 2}, std::pair{2, -1}}) {
    LocalClusterOptions o = Replicated(Fabric::kTcp);
    o.servers = servers;
    o.replicas = replicas;
    TestCluster cluster(o);
    EXPECT_EQ(cluster.status().code(), StatusCode::kInvalidArgument)
        << servers << " servers, replicas " << replicas;
    EXPECT_NE(cluster.status().message().find("--replicas"), std::string::npos)
        << cluster.status().message();
  }
}

}  // namespace
}  // namespace farpool
