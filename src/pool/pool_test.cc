// The pool with its servers in this test process (one process, real UCX, real sockets): the
// client contract of include/farpool/pool.h on both fabrics. Tests with separate server
// processes are in pool_process_test.cc.
#include "farpool/pool.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "pool/server/memory_server.h"

namespace farpool {
namespace {

using namespace std::chrono_literals;

class InProcessCluster {
 public:
  InProcessCluster(int servers, uint64_t memory, uint64_t chunk = 1 << 20) {
    for (int i = 0; i < servers; ++i) {
      ServerOptions o;
      o.memory = memory;
      o.chunk_size = chunk;
      o.id = static_cast<uint16_t>(i);
      o.progress = ProgressMode::kEvent;
      auto s = MemoryServer::Start(o);
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      ServerAddress a;
      a.id = o.id;
      a.host = "127.0.0.1";
      a.port = (*s)->port();
      config_.servers.push_back(a);
      servers_.push_back(std::move(*s));
    }
  }
  std::unique_ptr<Pool> Connect(Fabric fabric, PoolOptions o = {}) {
    o.transport = fabric;
    auto p = Pool::Connect(config_, o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }
  void Stop(int i) { servers_[i]->Stop(); }
  const ClusterConfig& config() const { return config_; }

 private:
  ClusterConfig config_;
  std::vector<std::unique_ptr<MemoryServer>> servers_;
};

class PoolTest : public ::testing::TestWithParam<Fabric> {};

TEST_P(PoolTest, EveryByteWrittenReadsBack) {
  InProcessCluster cluster(2, 16 << 20);
  auto pool = cluster.Connect(GetParam());
  ASSERT_TRUE(pool);
  std::mt19937_64 rng(5);
  for (uint64_t size : {1ull, 8ull, 63ull, 64ull, 4096ull, 300000ull, 3ull << 20}) {
    auto a = pool->Alloc(size);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    std::vector<uint8_t> out(size), in(size);
    for (auto& b : out) b = static_cast<uint8_t>(rng());
    ASSERT_TRUE(pool->Write(*a, out.data(), size).ok());
    ASSERT_TRUE(pool->Read(*a, in.data(), size).ok());
    EXPECT_EQ(in, out) << "size " << size;
  }
}

TEST_P(PoolTest, AtomicsHaveTheirContract) {
  InProcessCluster cluster(1, 8 << 20);
  auto pool = cluster.Connect(GetParam());
  ASSERT_TRUE(pool);
  auto a = *pool->Alloc(8);
  uint64_t zero = 0;
  ASSERT_TRUE(pool->Write(a, &zero, 8).ok());
  EXPECT_EQ(*pool->FetchAdd(a, 5), 0u);
  EXPECT_EQ(*pool->FetchAdd(a, 2), 5u);
  EXPECT_EQ(*pool->CompareAndSwap(a, 6, 100), 7u) << "failed CAS returns the current value";
  EXPECT_EQ(*pool->CompareAndSwap(a, 7, 100), 7u) << "successful CAS returns the expected value";
  uint64_t v = 0;
  ASSERT_TRUE(pool->Read(a, &v, 8).ok());
  EXPECT_EQ(v, 100u);
}

TEST_P(PoolTest, BatchPostsManyAndWaitsOnce) {
  InProcessCluster cluster(2, 16 << 20);
  auto pool = cluster.Connect(GetParam());
  ASSERT_TRUE(pool);
  constexpr int kN = 64;
  std::vector<GlobalAddress> addrs;
  for (int i = 0; i < kN; ++i) addrs.push_back(*pool->Alloc(64));
  std::vector<std::array<uint8_t, 64>> out(kN), in(kN);
  for (int i = 0; i < kN; ++i) out[i].fill(static_cast<uint8_t>(i));
  Batch w(*pool);
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(w.Write(addrs[i], out[i].data(), 64).ok());
  EXPECT_EQ(w.posted(), size_t{kN});
  ASSERT_TRUE(w.Wait().ok());
  Batch r(*pool);
  std::vector<uint64_t> prev(kN);
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(r.Read(addrs[i], in[i].data(), 64).ok());
  ASSERT_TRUE(r.Wait().ok());
  EXPECT_EQ(in, out);
  // Fetch-and-add results arrive at Wait.
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(r.FetchAdd(addrs[i], 1, &prev[i]).ok());
  ASSERT_TRUE(r.Wait().ok());
  uint64_t first_word = 0;
  std::memcpy(&first_word, out[3].data(), 8);
  EXPECT_EQ(prev[3], first_word);
}

TEST_P(PoolTest, BadAddressesAreRejectedBeforeAnythingIsPosted) {
  InProcessCluster cluster(2, 8 << 20);
  auto pool = cluster.Connect(GetParam());
  ASSERT_TRUE(pool);
  uint64_t buf = 0;
  auto expect_invalid = [](const Status& s, std::string_view needle) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  expect_invalid(pool->Read(GlobalAddress(), &buf, 8), "null");
  expect_invalid(pool->Read(GlobalAddress(9, 4096), &buf, 8), "no server 9");
  expect_invalid(pool->Write(GlobalAddress(1, (8 << 20) + 4096), &buf, 8), "beyond the region");
  expect_invalid(pool->Read(GlobalAddress(1, (8 << 20) + 4096 - 4), &buf, 8), "beyond the region");
  auto a = *pool->Alloc(64);
  expect_invalid(pool->CompareAndSwap(a + 4, 0, 1).status(), "not 8-byte aligned");
  std::array<uint8_t, 128> wide{};
  expect_invalid(pool->Read(a, wide.data(), 65), "crosses the end");
  ASSERT_TRUE(pool->Free(a).ok());
  expect_invalid(pool->Read(a, &buf, 8), "freed");
  expect_invalid(pool->FetchAdd(a, 1).status(), "freed");
  expect_invalid(pool->Free(a), "already freed");
  Batch b(*pool);
  expect_invalid(b.Write(a, &buf, 8), "freed");
  EXPECT_EQ(b.posted(), 0u) << "nothing was posted";
  EXPECT_EQ(pool->Alloc(0).status().code(), StatusCode::kInvalidArgument);
  expect_invalid(pool->Alloc(64, Placement::OnServer(7)).status(), "no server 7");
  // The server names itself in errors.
  auto big = pool->Read(GlobalAddress(1, 1 << 30), &buf, 8);
  EXPECT_NE(big.message().find("server 1 (127.0.0.1:"), std::string::npos) << big.message();
}

TEST_P(PoolTest, FullPoolSaysHowFullAndAllocatesNothingHalfway) {
  InProcessCluster cluster(2, 4 << 20);
  auto pool = cluster.Connect(GetParam());
  ASSERT_TRUE(pool);
  std::vector<GlobalAddress> objs;
  for (;;) {
    auto a = pool->Alloc(1 << 20);
    if (!a.ok()) {
      EXPECT_EQ(a.status().code(), StatusCode::kOutOfMemory);
      EXPECT_NE(a.status().message().find("pool full"), std::string::npos) << a.status().message();
      EXPECT_NE(a.status().message().find("0 B free of 8 MiB"), std::string::npos)
          << a.status().message();
      break;
    }
    objs.push_back(*a);
    ASSERT_LE(objs.size(), 8u);
  }
  EXPECT_EQ(objs.size(), 8u) << "the whole capacity was usable";
  auto on = pool->Alloc(64, Placement::OnServer(1));
  EXPECT_EQ(on.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(on.status().message().find("server 1"), std::string::npos) << on.status().message();
  for (auto a : objs) ASSERT_TRUE(pool->Free(a).ok());
  ASSERT_TRUE(pool->Trim().ok());
  for (uint16_t id : pool->server_ids()) EXPECT_EQ(pool->Stats(id)->leased, 0u);
}

TEST_P(PoolTest, PlacementsPutObjectsWhereAsked) {
  InProcessCluster cluster(3, 8 << 20);
  auto pool = cluster.Connect(GetParam());
  ASSERT_TRUE(pool);
  std::map<uint16_t, int> striped;
  for (int i = 0; i < 30; ++i) ++striped[pool->Alloc(64)->server()];
  EXPECT_EQ(striped.size(), 3u);
  for (auto& [id, n] : striped) EXPECT_EQ(n, 10) << "round robin";
  for (int i = 0; i < 5; ++i) EXPECT_EQ(pool->Alloc(64, Placement::OnServer(2))->server(), 2);
  for (uint64_t key = 0; key < 20; ++key) {
    EXPECT_EQ(pool->Alloc(64, Placement::ByKey(key))->server(),
              pool->Alloc(64, Placement::ByKey(key))->server());
  }
}

TEST_P(PoolTest, FetchAddFromManyThreadsIsExact) {
  InProcessCluster cluster(1, 8 << 20);
  auto pool = cluster.Connect(GetParam());
  ASSERT_TRUE(pool);
  auto a = *pool->Alloc(8);
  uint64_t zero = 0;
  ASSERT_TRUE(pool->Write(a, &zero, 8).ok());
  constexpr int kThreads = 4, kAdds = 2000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(pool->FetchAdd(a, 1).ok());
    });
  }
  for (auto& t : ts) t.join();
  uint64_t v = 0;
  ASSERT_TRUE(pool->Read(a, &v, 8).ok());
  EXPECT_EQ(v, uint64_t{kThreads * kAdds});
  EXPECT_EQ(pool->counters().faa, uint64_t{kThreads * kAdds});
}

TEST_P(PoolTest, AStoppedServerFailsItsCallsAndNotTheOthers) {
  InProcessCluster cluster(2, 8 << 20);
  PoolOptions o;
  o.failure_timeout = 400ms;
  o.op_timeout = 2000ms;
  auto pool = cluster.Connect(GetParam(), o);
  ASSERT_TRUE(pool);
  auto on0 = *pool->Alloc(64, Placement::OnServer(0));
  auto on1 = *pool->Alloc(64, Placement::OnServer(1));
  cluster.Stop(1);
  uint64_t v = 1;
  // Within a bounded time every call to server 1 fails with Unavailable.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  Status s;
  do {
    s = pool->Write(on1, &v, 8);
    if (!s.ok()) break;
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("server 1"), std::string::npos) << s.message();
  EXPECT_EQ(pool->Read(on1, &v, 8).code(), StatusCode::kUnavailable);
  EXPECT_EQ(pool->Alloc(64, Placement::OnServer(1)).status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(pool->Write(on0, &v, 8).ok()) << "the other server keeps serving";
  EXPECT_TRUE(pool->Alloc(64).ok()) << "striping skips the failed server";
}

INSTANTIATE_TEST_SUITE_P(Fabrics, PoolTest, ::testing::Values(Fabric::kShm, Fabric::kTcp),
                         [](const auto& info) { return std::string(FabricName(info.param)); });

TEST(PoolConnect, UnreachableServerIsNamed) {
  ClusterConfig c;
  c.transport = Fabric::kTcp;
  c.servers.push_back({0, "127.0.0.1", 1, 0, 0, ""});  // nothing listens on port 1
  PoolOptions o;
  o.connect_timeout = 2000ms;
  auto p = Pool::Connect(c, o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(p.status().message().find("server 0 (127.0.0.1:1)"), std::string::npos)
      << p.status().message();
}

}  // namespace
}  // namespace farpool
