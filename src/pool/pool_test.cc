// The pool with its servers in this test process (one process, real UCX, real sockets): the
// client contract of include/farpool/pool.h on both fabrics. Tests with separate server
// processes are in pool_process_test.cc.
#include "farpool/pool.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "pool/control_client.h"
#include "pool/server/memory_server.h"

namespace farpool {
namespace {

using namespace std::chrono_literals;

// ReplyBox (pool/control_client.h): an expected reply lands in the waiter's memory, an
// unexpected one is kept, and a reply to a request its waiter abandoned (Forget before the
// reply) is dropped: it never lands in memory the caller may have reused.
TEST(ReplyBox, LateRepliesToAbandonedRequestsAreDroppedNotLanded) {
  control::ReplyBox box;
  struct Landed {
    int count = 0;
    uint64_t last_id = 0;
  };
  const control::ReplyBox::Land land = [](void* context, std::span<const std::byte> reply) {
    auto& l = *static_cast<Landed*>(context);
    ++l.count;
    l.last_id = *transport::RequestIdOf(reply);
  };
  auto deliver = [&box](uint64_t id) {
    std::vector<std::byte> reply = wire::Encode(id, wire::StatsRequest{0});
    ucp_am_recv_param_t param{};
    return control::ReplyBox::OnMessage(&box, nullptr, 0, reply.data(), reply.size(), &param);
  };
  Landed waiter, abandoned;
  box.Expect(1, land, &waiter);
  box.Expect(2, land, &abandoned);
  EXPECT_FALSE(box.Arrived(1));
  EXPECT_EQ(deliver(1), UCS_OK);
  EXPECT_TRUE(box.Arrived(1));
  EXPECT_EQ(waiter.count, 1);
  EXPECT_EQ(waiter.last_id, 1u);
  EXPECT_TRUE(box.replies.empty()) << "a landed reply is not kept as well";
  box.Forget(1);
  box.Forget(2);  // its waiter gave up (timed out, server failed) before the reply
  EXPECT_EQ(deliver(2), UCS_OK);
  EXPECT_EQ(abandoned.count, 0) << "a late reply landed in memory its waiter gave up";
  EXPECT_FALSE(box.Arrived(2));
  EXPECT_TRUE(box.replies.empty()) << "a late reply is dropped, not kept forever";
  EXPECT_EQ(deliver(3), UCS_OK);  // nobody expects it: kept for Call to take
  EXPECT_TRUE(box.Arrived(3));
  ASSERT_EQ(box.replies.count(3), 1u);
  EXPECT_EQ(transport::RequestIdOf(box.replies[3]), 3u);
}

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

// A new 8-byte word of `pool` that holds 0: what the atomics tests start from.
Result<GlobalAddress> NewZeroWord(Pool& pool) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress a, pool.Alloc(8));
  const uint64_t zero = 0;
  FARPOOL_RETURN_IF_ERROR(pool.Write(a, &zero, 8));
  return a;
}

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
  auto word = NewZeroWord(*pool);
  ASSERT_TRUE(word.ok()) << word.status().ToString();
  const GlobalAddress a = *word;
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

// A shared lease belongs to the pool: one Pool leases a run, another releases it, and the
// server has it back; a second release of the same run, a size that is not a chunk multiple,
// and a release of what was never leased are refused with a reason.
TEST_P(PoolTest, ASharedLeaseIsReleasedByAnotherPool) {
  InProcessCluster cluster(2, 8 << 20);
  auto leaser = cluster.Connect(GetParam());
  auto releaser = cluster.Connect(GetParam());
  ASSERT_TRUE(leaser && releaser);
  auto g = leaser->Geometry(1);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->chunk_size, 1u << 20);
  EXPECT_EQ(g->chunks(), 8u);
  auto run = leaser->LeaseRun(1, 2 * g->chunk_size);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->server(), 1);
  EXPECT_EQ((run->offset() - RegionGeometry::kRootAreaSize) % g->chunk_size, 0u);
  EXPECT_EQ(leaser->Stats(1)->leased, 2 * g->chunk_size);
  uint64_t v = 42, back = 0;  // both Pools reach it
  ASSERT_TRUE(leaser->Write(*run + 8, &v, 8).ok());
  ASSERT_TRUE(releaser->Read(*run + 8, &back, 8).ok());
  EXPECT_EQ(back, 42u);
  ASSERT_TRUE(releaser->ReleaseRun(*run, 2 * g->chunk_size).ok());
  EXPECT_EQ(leaser->Stats(1)->leased, 0u);
  Status twice = leaser->ReleaseRun(*run, 2 * g->chunk_size);
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument) << twice.ToString();
  EXPECT_NE(twice.message().find("server 1"), std::string::npos) << twice.message();
  EXPECT_EQ(leaser->LeaseRun(1, 1000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(leaser->LeaseRun(7, g->chunk_size).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(leaser->ServerFor(Placement::OnServer(1)).value(), 1);
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
  auto word = NewZeroWord(*pool);
  ASSERT_TRUE(word.ok()) << word.status().ToString();
  const GlobalAddress a = *word;
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

// Three clients of one region, one per access path: mapped shared memory, TCP batch messages
// executed by the server, and TCP one-sided UCX operations. The same operations must give the
// same answers on each (a shadow copy decides), and atomics from all three must be atomic
// with respect to each other, so processes on different fabrics can share one database.
class AccessPaths : public ::testing::Test {
 protected:
  AccessPaths() : cluster_(2, 16 << 20) {
    PoolOptions one_sided;
    one_sided.remote_access = RemoteAccess::kOneSided;
    pools_.push_back(cluster_.Connect(Fabric::kShm));
    pools_.push_back(cluster_.Connect(Fabric::kTcp));
    pools_.push_back(cluster_.Connect(Fabric::kTcp, one_sided));
  }
  InProcessCluster cluster_;
  std::vector<std::unique_ptr<Pool>> pools_;
};

TEST_F(AccessPaths, EveryPathGivesTheSameAnswers) {
  for (const auto& p : pools_) ASSERT_TRUE(p);
  EXPECT_EQ(pools_[0]->AccessPath(0), "direct");
  EXPECT_EQ(pools_[1]->AccessPath(0), "messages");
  EXPECT_EQ(pools_[2]->AccessPath(1), "one-sided");
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Objects on both servers, some larger than a message's inline limit (16 KiB).
  constexpr int kObjects = 24;
  std::vector<GlobalAddress> objects;
  std::vector<std::vector<uint8_t>> shadow;
  for (int i = 0; i < kObjects; ++i) {
    const uint64_t size = i % 6 == 0 ? 40 << 10 : 256;
    objects.push_back(*pools_[0]->Alloc(size));
    shadow.emplace_back(size, 0);
    std::vector<uint8_t> zero(size, 0);
    ASSERT_TRUE(pools_[0]->Write(objects.back(), zero.data(), size).ok());
  }
  for (int step = 0; step < 400; ++step) {
    Pool& pool = *pools_[rng() % pools_.size()];
    // A batch of writes to distinct objects (a batch is unordered), then a batch reading
    // everything back, each on a randomly chosen path.
    Batch w(pool);
    std::vector<std::vector<uint8_t>> sources;
    std::vector<int> picked(kObjects);
    std::iota(picked.begin(), picked.end(), 0);
    std::shuffle(picked.begin(), picked.end(), rng);
    picked.resize(1 + rng() % 8);
    for (int o : picked) {
      const uint64_t len = 1 + rng() % shadow[o].size();
      const uint64_t at = rng() % (shadow[o].size() - len + 1);
      auto& src = sources.emplace_back(len);
      for (auto& b : src) b = static_cast<uint8_t>(rng());
      std::copy(src.begin(), src.end(), shadow[o].begin() + static_cast<long>(at));
      ASSERT_TRUE(w.Write(objects[o] + at, src.data(), len).ok());
    }
    ASSERT_TRUE(w.Wait().ok());
    Pool& reader = *pools_[rng() % pools_.size()];
    Batch r(reader);
    std::vector<std::vector<uint8_t>> got(kObjects);
    for (int o = 0; o < kObjects; ++o) {
      got[o].resize(shadow[o].size());
      ASSERT_TRUE(r.Read(objects[o], got[o].data(), got[o].size()).ok());
    }
    ASSERT_TRUE(r.Wait().ok());
    for (int o = 0; o < kObjects; ++o) ASSERT_EQ(got[o], shadow[o]) << "object " << o;
  }
}

// The critical section of a CAS lock held by `me`: a plain read-modify-write of `guarded` (a lost
// update would show in its total), then the release, which must find the lock still `me`'s.
void IncrementUnderLockAndRelease(Pool& pool, GlobalAddress lock, GlobalAddress guarded,
                                  uint64_t me) {
  uint64_t v = 0;
  ASSERT_TRUE(pool.Read(guarded, &v, 8).ok());
  ++v;
  ASSERT_TRUE(pool.Write(guarded, &v, 8).ok());
  auto held = pool.CompareAndSwap(lock, me, 0);
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(*held, me) << "the lock was taken while held";
}

TEST_F(AccessPaths, AtomicsFromEveryPathAreAtomicTogether) {
  for (const auto& p : pools_) ASSERT_TRUE(p);
  auto counter = *pools_[0]->Alloc(8, Placement::OnServer(1));
  auto lock = *pools_[0]->Alloc(8, Placement::OnServer(0));
  auto guarded = *pools_[0]->Alloc(8, Placement::OnServer(1));
  uint64_t zero = 0;
  for (auto a : {counter, lock, guarded}) ASSERT_TRUE(pools_[0]->Write(a, &zero, 8).ok());
  constexpr int kRounds = 300;
  std::vector<std::thread> threads;
  for (size_t t = 0; t < pools_.size(); ++t) {
    threads.emplace_back([&, t] {
      Pool& pool = *pools_[t];
      const uint64_t me = t + 1;
      for (int i = 0; i < kRounds; ++i) {
        ASSERT_TRUE(pool.FetchAdd(counter, 1).ok());
        // A CAS lock around a plain read-modify-write: lost updates would show in the total.
        for (;;) {
          auto prev = pool.CompareAndSwap(lock, 0, me);
          ASSERT_TRUE(prev.ok()) << prev.status().ToString();
          if (*prev == 0) break;
          std::this_thread::yield();
        }
        IncrementUnderLockAndRelease(pool, lock, guarded, me);
      }
    });
  }
  for (auto& t : threads) t.join();
  uint64_t total = 0, guarded_total = 0;
  ASSERT_TRUE(pools_[1]->Read(counter, &total, 8).ok());
  ASSERT_TRUE(pools_[2]->Read(guarded, &guarded_total, 8).ok());
  EXPECT_EQ(total, kRounds * pools_.size());
  EXPECT_EQ(guarded_total, kRounds * pools_.size());
}

// Waiting compare-and-swaps (Batch::WaitCompareAndSwap): a CAS lock taken with them from
// every path, and released by plain CASes from every path (the mapped one and UCX's one-sided
// atomics change the word without the server's loop: its recheck timer finds those), excludes
// and loses no update; the messages client's waits cost one round trip each, not one per poll.
TEST_F(AccessPaths, AWaitingCasLockFromEveryPathExcludesAndLosesNothing) {
  for (const auto& p : pools_) ASSERT_TRUE(p);
  auto lock = *pools_[0]->Alloc(8, Placement::OnServer(0));
  auto guarded = *pools_[0]->Alloc(8, Placement::OnServer(0));
  uint64_t zero = 0;
  for (auto a : {lock, guarded}) ASSERT_TRUE(pools_[0]->Write(a, &zero, 8).ok());
  constexpr int kRounds = 200;
  WaitSpec spec;
  spec.held_mask = ~uint64_t{0};  // any owner's word is held; 0 is free
  spec.wait = WaitSpec::kMaxWait;
  std::vector<uint64_t> waits_of(pools_.size(), 0), round_trips(pools_.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < pools_.size(); ++t) {
    threads.emplace_back([&, t] {
      Pool& pool = *pools_[t];
      const uint64_t me = t + 1;
      const uint64_t before = pool.counters().round_trips;
      for (int i = 0; i < kRounds; ++i) {
        for (;;) {
          Batch b(pool);
          WaitCasResult r;
          ASSERT_TRUE(b.WaitCompareAndSwap(lock, 0, me, spec, &r).ok());
          ASSERT_TRUE(b.Wait().ok());
          ++waits_of[t];
          if (r.swapped) {
            ASSERT_EQ(r.previous, 0u);
            break;
          }
          ASSERT_NE(r.previous, 0u) << "not swapped, so held";
          std::this_thread::yield();
        }
        IncrementUnderLockAndRelease(pool, lock, guarded, me);
      }
      round_trips[t] = pool.counters().round_trips - before;
    });
  }
  for (auto& t : threads) t.join();
  uint64_t total = 0;
  ASSERT_TRUE(pools_[1]->Read(guarded, &total, 8).ok());
  EXPECT_EQ(total, kRounds * pools_.size());
  // The messages client: every attempt it made was answered swapped, not after its bound (1 s:
  // far more than a holder keeps the lock here), so one attempt per round.
  EXPECT_EQ(waits_of[1], uint64_t{kRounds}) << "the server answered a held word early";
  EXPECT_EQ(round_trips[1], uint64_t{kRounds} * 4);  // wait, read, write, release
}

// A waiter is answered when the word is released by another client of the loop, and the
// operations behind it in its message wait with it (they see what the holder wrote before it
// released); one that is never released is answered, not swapped, by its bound.
TEST_F(AccessPaths, AWaiterTakesTheWordWhenReleasedOrGivesUpAtItsBound) {
  Pool& holder = *pools_[1];
  auto waiter = cluster_.Connect(Fabric::kTcp);
  ASSERT_TRUE(waiter);
  auto lock = *holder.Alloc(8, Placement::OnServer(1));
  auto data = *holder.Alloc(8, Placement::OnServer(1));
  const uint64_t held = 7, mine = 9, payload = 42;
  ASSERT_TRUE(holder.Write(lock, &held, 8).ok());
  WaitSpec spec;
  spec.held_mask = ~uint64_t{0};
  spec.wait = 1s;
  WaitCasResult r;
  uint64_t seen = 0;
  std::thread t([&] {
    Batch b(*waiter);
    ASSERT_TRUE(b.WaitCompareAndSwap(lock, 0, mine, spec, &r).ok());
    ASSERT_TRUE(b.Fence().ok());
    ASSERT_TRUE(b.Read(data, &seen, 8).ok());
    ASSERT_TRUE(b.Wait().ok());
  });
  std::this_thread::sleep_for(50ms);  // likely parked by now (either order must pass)
  ASSERT_TRUE(holder.Write(data, &payload, 8).ok());
  ASSERT_EQ(*holder.CompareAndSwap(lock, held, 0), held);
  t.join();
  EXPECT_TRUE(r.swapped);
  EXPECT_EQ(r.previous, 0u);
  EXPECT_EQ(seen, payload) << "the read behind the waiting CAS ran before it";
  EXPECT_EQ(*holder.CompareAndSwap(lock, 0, 0), mine);

  // Held for good: answered after the bound with the holder's word, nothing swapped.
  spec.wait = 20ms;
  Batch b(*waiter);
  ASSERT_TRUE(b.WaitCompareAndSwap(lock, 0, 1, spec, &r).ok());
  ASSERT_TRUE(b.Wait().ok());
  EXPECT_FALSE(r.swapped);
  EXPECT_EQ(r.previous, mine);
  // A word that looks held but is `not_held` is answered at once (one attempt).
  spec.wait = WaitSpec::kMaxWait;
  spec.not_held = mine;
  ASSERT_TRUE(b.WaitCompareAndSwap(lock, 0, 1, spec, &r).ok());
  ASSERT_TRUE(b.Wait().ok());
  EXPECT_FALSE(r.swapped);
  // take_free: a free word that is not the one expected is taken too.
  ASSERT_EQ(*holder.CompareAndSwap(lock, mine, 4), mine);
  spec.held_mask = 1;  // 4 is free now
  spec.take_free = true;
  ASSERT_TRUE(b.WaitCompareAndSwap(lock, 2, 5, spec, &r).ok());
  ASSERT_TRUE(b.Wait().ok());
  EXPECT_TRUE(r.swapped);
  EXPECT_EQ(r.previous, 4u);
  // A bound past the limit is refused before anything is posted.
  spec.wait = WaitSpec::kMaxWait + 1us;
  EXPECT_EQ(b.WaitCompareAndSwap(lock, 0, 1, spec, &r).code(), StatusCode::kInvalidArgument);
}

// A wait-only (WaitSpec::wait_only: wait until free, change nothing) over messages is answered
// once the holder it names lets go of the word, here by handing it straight to another holder,
// and the read behind it sees what the first holder wrote; the word stays the second holder's.
// On the mapped and one-sided paths it is one look at the word, answered at once. Malformed
// ones (with take_free, or a nonzero desired word) are refused before anything is posted.
TEST_F(AccessPaths, AWaitOnlyIsAnsweredWhenItsHolderLetsGoAndSwapsNothing) {
  for (const auto& p : pools_) ASSERT_TRUE(p);
  Pool& holder = *pools_[1];
  auto lock = *holder.Alloc(8, Placement::OnServer(1));
  auto data = *holder.Alloc(8, Placement::OnServer(1));
  const uint64_t first = 7, second = 9, payload = 42;
  ASSERT_TRUE(holder.Write(lock, &first, 8).ok());
  WaitSpec spec;
  spec.held_mask = 1;
  spec.wait = 1s;
  spec.wait_only = true;
  WaitCasResult r{0, true};
  uint64_t seen = 0;
  std::thread t([&] {
    Batch b(*pools_[1]);
    ASSERT_TRUE(b.WaitCompareAndSwap(lock, first, 0, spec, &r).ok());
    ASSERT_TRUE(b.Fence().ok());
    ASSERT_TRUE(b.Read(data, &seen, 8).ok());
    ASSERT_TRUE(b.Wait().ok());
  });
  std::this_thread::sleep_for(50ms);  // likely parked by now (either order must pass)
  ASSERT_TRUE(holder.Write(data, &payload, 8).ok());
  ASSERT_EQ(*holder.CompareAndSwap(lock, first, second), first);
  t.join();
  EXPECT_FALSE(r.swapped);
  EXPECT_EQ(r.previous, second);
  EXPECT_EQ(seen, payload) << "the read behind the wait-only ran before the holder let go";
  // Mapped and one-sided: one look, answered at once with the word held by `second` (it is not
  // the holder named, and the server would not have waited either); nothing swapped anywhere.
  for (size_t path : {size_t{0}, size_t{2}}) {
    for (uint64_t named : {first, second}) {
      Batch b(*pools_[path]);
      r = {0, true};
      ASSERT_TRUE(b.WaitCompareAndSwap(lock, named, 0, spec, &r).ok());
      ASSERT_TRUE(b.Wait().ok());
      EXPECT_FALSE(r.swapped) << path;
      EXPECT_EQ(r.previous, second) << path;
    }
  }
  EXPECT_EQ(*holder.CompareAndSwap(lock, 0, 0), second) << "a wait-only changed the word";
  for (size_t path = 0; path < pools_.size(); ++path) {
    Batch b(*pools_[path]);
    EXPECT_EQ(b.WaitCompareAndSwap(lock, second, 1, spec, &r).code(), StatusCode::kInvalidArgument);
    WaitSpec both = spec;
    both.take_free = true;
    EXPECT_EQ(b.WaitCompareAndSwap(lock, second, 0, both, &r).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(b.posted(), 0u);
  }
}

// At most kMaxWaitersPerConnection batches of one connection wait at a server; the next one's
// waiting CAS is one attempt, answered at once. A batch of 17 messages to one server (three
// 16 KiB reads each fill a message; a waiting CAS on one held word ends each): the first 16
// wait in arrival order, the 17th is answered with the holder's word before the release; then
// the first waiter takes the word and the other 15 see it taken (their bound is 1 s).
TEST_F(AccessPaths, WaitersBeyondAConnectionsCapAreOneAttempt) {
  Pool& holder = *pools_[1];
  auto waiter = cluster_.Connect(Fabric::kTcp);
  ASSERT_TRUE(waiter);
  auto lock = *holder.Alloc(8, Placement::OnServer(0));
  auto block = *holder.Alloc(48 << 10, Placement::OnServer(0));
  const uint64_t held = 7;
  ASSERT_TRUE(holder.Write(lock, &held, 8).ok());
  constexpr size_t kMessages = kMaxWaitersPerConnection + 1;
  WaitSpec spec;
  spec.held_mask = ~uint64_t{0};
  spec.wait = WaitSpec::kMaxWait;
  std::vector<WaitCasResult> results(kMessages);
  std::vector<std::byte> sink(48 << 10);
  Status waited;
  std::thread t([&] {
    Batch b(*waiter);
    for (size_t m = 0; m < kMessages && waited.ok(); ++m) {
      for (int r = 0; r < 3 && waited.ok(); ++r) {
        waited = b.Read(block + r * (16 << 10), sink.data() + r * (16 << 10), 16 << 10);
      }
      if (waited.ok()) waited = b.WaitCompareAndSwap(lock, 0, 100 + m, spec, &results[m]);
    }
    if (waited.ok()) waited = b.Wait();
  });
  std::this_thread::sleep_for(200ms);  // the batch is very likely parked by now
  ASSERT_EQ(*holder.CompareAndSwap(lock, held, 0), held);
  t.join();
  ASSERT_TRUE(waited.ok()) << waited.ToString();
  EXPECT_TRUE(results[0].swapped);
  for (size_t m = 1; m < kMaxWaitersPerConnection; ++m) {
    EXPECT_FALSE(results[m].swapped) << m;
    EXPECT_EQ(results[m].previous, 100u) << "waiter " << m << " saw the first waiter's word";
  }
  EXPECT_FALSE(results[kMessages - 1].swapped);
  EXPECT_EQ(results[kMessages - 1].previous, held) << "the one beyond the cap did not wait";
}

// The waiters of a client that is evicted are dropped with its connections: the word it waited
// for goes to the next waiter when released, never to it.
TEST_F(AccessPaths, AnEvictedClientsWaitersAreDropped) {
  Pool& holder = *pools_[1];
  auto doomed = cluster_.Connect(Fabric::kTcp);
  auto next = cluster_.Connect(Fabric::kTcp);
  ASSERT_TRUE(doomed && next);
  auto lock = *holder.Alloc(8, Placement::OnServer(0));
  const uint64_t held = 7;
  ASSERT_TRUE(holder.Write(lock, &held, 8).ok());
  WaitSpec spec;
  spec.held_mask = ~uint64_t{0};
  spec.wait = 1s;
  Status doomed_status;
  std::thread t([&] {
    Batch b(*doomed);
    WaitCasResult r;
    doomed_status = b.WaitCompareAndSwap(lock, 0, 11, spec, &r);
    if (doomed_status.ok()) doomed_status = b.Wait();
  });
  std::this_thread::sleep_for(50ms);  // likely parked by now
  ASSERT_TRUE(holder.Evict(doomed->process_tag()).ok());
  t.join();
  EXPECT_FALSE(doomed_status.ok()) << "an evicted client's wait must not succeed";
  ASSERT_EQ(*holder.CompareAndSwap(lock, held, 0), held);
  Batch b(*next);
  WaitCasResult r;
  ASSERT_TRUE(b.WaitCompareAndSwap(lock, 0, 12, spec, &r).ok());
  ASSERT_TRUE(b.Wait().ok());
  EXPECT_TRUE(r.swapped) << "previous " << r.previous;
}

TEST_F(AccessPaths, ABatchIsOneRoundTripWithOneMessagePerServer) {
  Pool& pool = *pools_[1];
  ASSERT_TRUE(pools_[1]);
  std::vector<GlobalAddress> on0, on1;
  for (int i = 0; i < 32; ++i) {
    on0.push_back(*pool.Alloc(64, Placement::OnServer(0)));
    on1.push_back(*pool.Alloc(1024, Placement::OnServer(1)));
  }
  std::vector<uint8_t> sink(64 * 1024 * 2);
  const OpCounters before = pool.counters();
  Batch b(pool);
  for (int i = 0; i < 32; ++i) ASSERT_TRUE(b.Read(on0[i], sink.data() + i * 64, 64).ok());
  ASSERT_TRUE(b.Wait().ok());
  OpCounters after = pool.counters();
  EXPECT_EQ(after.round_trips - before.round_trips, 1u);
  EXPECT_EQ(after.messages - before.messages, 1u) << "32 reads of one server: one message";
  // Two servers, and more reply bytes than one message holds (100 KiB > 64 KiB): still one
  // round trip, with server 1's reads split over two messages.
  for (int i = 0; i < 32; ++i) ASSERT_TRUE(b.Read(on0[i], sink.data() + i * 64, 64).ok());
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < 32; ++i) {
      ASSERT_TRUE(b.Read(on1[i], sink.data() + 4096 + i * 1024, 1024).ok());
    }
  }
  ASSERT_TRUE(b.Wait().ok());
  const OpCounters last = pool.counters();
  EXPECT_EQ(last.round_trips - after.round_trips, 1u);
  EXPECT_EQ(last.messages - after.messages, 3u);
  // Sync calls are one round trip each; a write too (no separate flush).
  uint64_t v = 7;
  ASSERT_TRUE(pool.Write(on0[0], &v, 8).ok());
  EXPECT_EQ(pool.counters().round_trips - last.round_trips, 1u);
}

// A bucket of the lookup tests' hash chains: a lock word, the next bucket, 7 entries of
// {key, record address}, as `kLookupSpec` describes it.
struct Bucket {
  uint64_t lock, next;
  uint64_t entries[7][2];
};
static_assert(sizeof(Bucket) == 128);
constexpr LookupSpec kLookupSpec{128, 16, 7, 8};

// A lookup-lock-read takes the record's lock word where the record is read in the round trip
// (mapped: at once; messages: at the server) and only if it is free; the one-sided path locks
// nothing (its lookup reads the head bucket only). What it took is what the caller's
// compare-and-swap would have taken, and the copy is read behind it.
TEST_F(AccessPaths, ALookupLockReadLocksOnlyAFreeRecordItReads) {
  for (const auto& p : pools_) ASSERT_TRUE(p);
  Pool& setup = *pools_[0];
  const LookupSpec spec = kLookupSpec;
  const GlobalAddress bucket = *setup.Alloc(128, Placement::OnServer(0));
  constexpr uint32_t kRecord = 64;
  const GlobalAddress record = *setup.Alloc(kRecord, Placement::OnServer(0));
  Bucket x{};
  x.entries[2][0] = 7;
  x.entries[2][1] = record.raw();
  ASSERT_TRUE(setup.Write(bucket, &x, sizeof(x)).ok());
  constexpr uint64_t kMine = 0x0002'0000'0000'0009;
  for (size_t path = 0; path < pools_.size(); ++path) {
    Pool& pool = *pools_[path];
    SCOPED_TRACE("path " + pool.AccessPath(0));
    const bool near = path != 2;  // mapped or messages
    for (const uint64_t word : {uint64_t{6}, uint64_t{0x0001'0000'0000'0003}}) {
      SCOPED_TRACE("word " + std::to_string(word));
      std::vector<uint64_t> bytes(kRecord / 8, 0x1111);
      bytes[0] = word;
      ASSERT_TRUE(setup.Write(record, bytes.data(), kRecord).ok());
      std::vector<uint64_t> got(kRecord / 8, 0);
      LockReadResult r;
      const OpCounters before = pool.counters();
      Batch b(pool);
      ASSERT_TRUE(b.LookupLockRead(bucket, spec, 7, 0, 1, kMine, got.data(), kRecord, &r).ok());
      ASSERT_TRUE(b.Wait().ok());
      EXPECT_LE(pool.counters().round_trips - before.round_trips, 1u);
      uint64_t now = 0;
      ASSERT_TRUE(setup.Read(record, &now, 8).ok());
      const bool free = (word & 1) == 0;
      EXPECT_EQ(r.lookup.outcome,
                near ? LookupResult::Outcome::kFound : LookupResult::Outcome::kFoundNotRead);
      EXPECT_EQ(r.lookup.value, record);
      EXPECT_EQ(r.locked, near && free);
      EXPECT_EQ(now, near && free ? kMine : word);
      if (near) {
        EXPECT_EQ(r.found, word);
        EXPECT_EQ(got[0], now);  // read behind the lock
        EXPECT_EQ(got[1], 0x1111u);
      }
    }
  }
  // Malformed: refused before anything is posted.
  Batch b(*pools_[1]);
  LockReadResult r;
  std::vector<uint8_t> got(kRecord);
  EXPECT_EQ(b.LookupLockRead(bucket, spec, 7, 60, 1, kMine, got.data(), kRecord, &r).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b.LookupLockRead(bucket, spec, 7, 0, 1, 0, got.data(), kRecord, &r).code(),
            StatusCode::kInvalidArgument);
}

// Batch::LookupRead against the two steps it replaces (read the chain, then the record), on
// every path, over a chain that starts on server 0 and ends on server 1: the answer is the
// same; over messages and mapped memory the record on the bucket's server comes with the
// lookup in one round trip.
TEST_F(AccessPaths, ALookupReadGivesTheTwoStepAnswerOnEveryPath) {
  for (const auto& p : pools_) ASSERT_TRUE(p);
  Pool& setup = *pools_[0];
  const LookupSpec spec = kLookupSpec;
  const GlobalAddress b0 = *setup.Alloc(128, Placement::OnServer(0));
  const GlobalAddress b1 = *setup.Alloc(128, Placement::OnServer(0));
  const GlobalAddress b2 = *setup.Alloc(128, Placement::OnServer(1));
  constexpr uint32_t kRecord = 200;
  std::vector<GlobalAddress> records;
  for (int k = 1; k <= 4; ++k) {
    records.push_back(*setup.Alloc(kRecord, Placement::OnServer(k == 3 || k == 4 ? 1 : 0)));
    std::vector<uint8_t> bytes(kRecord, static_cast<uint8_t>(k * 17));
    ASSERT_TRUE(setup.Write(records.back(), bytes.data(), kRecord).ok());
  }
  Bucket x{}, y{}, z{};
  x.next = b1.raw();
  x.entries[0][0] = 1;  // key 1: record on server 0, in the head bucket
  x.entries[0][1] = records[0].raw();
  x.entries[1][0] = 2;  // a dead entry of key 2 (value 0): skipped
  x.entries[3][0] = 3;  // key 3: record on server 1
  x.entries[3][1] = records[2].raw();
  y.next = b2.raw();
  y.entries[6][0] = 2;  // key 2: second bucket, record on server 0
  y.entries[6][1] = records[1].raw();
  z.entries[0][0] = 4;  // key 4: third bucket, on server 1
  z.entries[0][1] = records[3].raw();
  ASSERT_TRUE(setup.Write(b0, &x, 128).ok());
  ASSERT_TRUE(setup.Write(b1, &y, 128).ok());
  ASSERT_TRUE(setup.Write(b2, &z, 128).ok());
  // The two-step answer: walk the chain, then read the record.
  auto two_step = [&](Pool& pool, GlobalAddress from, uint64_t key, GlobalAddress* record,
                      std::vector<uint8_t>* bytes) -> Status {
    *record = GlobalAddress();
    for (GlobalAddress at = from; !at.is_null();) {
      Bucket b;
      FARPOOL_RETURN_IF_ERROR(pool.Read(at, &b, sizeof(b)));
      for (const auto& e : b.entries) {
        if (e[0] == key && e[1] != 0) {
          *record = GlobalAddress::FromRaw(e[1]);
          break;
        }
      }
      if (!record->is_null()) break;
      at = GlobalAddress::FromRaw(b.next);
    }
    if (record->is_null()) return Status::Ok();
    bytes->resize(kRecord);
    return pool.Read(*record, bytes->data(), kRecord);
  };
  for (size_t path = 0; path < pools_.size(); ++path) {
    Pool& pool = *pools_[path];
    SCOPED_TRACE("path " + pool.AccessPath(0));
    for (uint64_t key = 1; key <= 5; ++key) {
      SCOPED_TRACE("key " + std::to_string(key));
      GlobalAddress want;
      std::vector<uint8_t> want_bytes;
      ASSERT_TRUE(two_step(pool, b0, key, &want, &want_bytes).ok());
      std::vector<uint8_t> got_bytes(kRecord, 0xee);
      LookupResult r;
      const OpCounters before = pool.counters();
      Batch b(pool);
      ASSERT_TRUE(b.LookupRead(b0, spec, key, got_bytes.data(), kRecord, &r).ok());
      ASSERT_TRUE(b.Wait().ok());
      EXPECT_LE(pool.counters().round_trips - before.round_trips, 1u);
      GlobalAddress got;
      switch (r.outcome) {
        case LookupResult::Outcome::kAbsent:
          break;
        case LookupResult::Outcome::kFound:
          got = r.value;
          break;
        case LookupResult::Outcome::kFoundNotRead:
          got = r.value;
          ASSERT_TRUE(pool.Read(got, got_bytes.data(), kRecord).ok());
          break;
        case LookupResult::Outcome::kContinue:
          ASSERT_TRUE(two_step(pool, r.value, key, &got, &got_bytes).ok());
          break;
      }
      EXPECT_EQ(got, want);
      if (!want.is_null()) {
        EXPECT_EQ(got_bytes, want_bytes);
      }
      // What each path can do in the one round trip.
      const bool near = path != 2;  // mapped or messages: the server's walk
      using O = LookupResult::Outcome;
      const O expected[] = {near ? O::kFound : O::kFoundNotRead, near ? O::kFound : O::kContinue,
                            O::kFoundNotRead, O::kContinue, near ? O::kContinue : O::kContinue};
      EXPECT_EQ(static_cast<int>(r.outcome), static_cast<int>(expected[key - 1]));
    }
  }
  // Several lookups and reads in one batch to one server: one message, one round trip.
  Pool& tcp = *pools_[1];
  std::vector<uint8_t> r1(kRecord), r2(kRecord), plain(8);
  LookupResult l1, l2;
  const OpCounters before = tcp.counters();
  Batch b(tcp);
  ASSERT_TRUE(b.LookupRead(b0, spec, 1, r1.data(), kRecord, &l1).ok());
  ASSERT_TRUE(b.Read(records[1], plain.data(), 8).ok());
  ASSERT_TRUE(b.LookupRead(b0, spec, 2, r2.data(), kRecord, &l2).ok());
  ASSERT_TRUE(b.Wait().ok());
  EXPECT_EQ(tcp.counters().messages - before.messages, 1u);
  EXPECT_EQ(l1.outcome, LookupResult::Outcome::kFound);
  EXPECT_EQ(l2.outcome, LookupResult::Outcome::kFound);
  EXPECT_EQ(r1, std::vector<uint8_t>(kRecord, 17));
  EXPECT_EQ(r2, std::vector<uint8_t>(kRecord, 34));
  // A record address beyond the region: the server (and the mapped path) reads nothing and
  // the batch fails naming it; the one-sided path does not follow it (the caller's read would
  // be refused).
  x.entries[5][0] = 9;
  x.entries[5][1] = GlobalAddress(0, uint64_t{1} << 40).raw();
  ASSERT_TRUE(setup.Write(b0, &x, 128).ok());
  for (size_t path = 0; path < pools_.size(); ++path) {
    SCOPED_TRACE("path " + pools_[path]->AccessPath(0));
    Batch bb(*pools_[path]);
    LookupResult out;
    ASSERT_TRUE(bb.LookupRead(b0, spec, 9, r1.data(), kRecord, &out).ok());
    const Status waited = bb.Wait();
    if (path == 2) {
      ASSERT_TRUE(waited.ok()) << waited.ToString();
      EXPECT_EQ(out.outcome, LookupResult::Outcome::kFoundNotRead);
    } else {
      EXPECT_EQ(waited.code(), StatusCode::kInvalidArgument) << waited.ToString();
      EXPECT_NE(waited.message().find("outside the region"), std::string::npos);
    }
  }
  // A malformed spec is refused before anything is posted.
  LookupResult bad;
  EXPECT_EQ(b.LookupRead(b0, {128, 16, 8, 8}, 1, r1.data(), kRecord, &bad).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b.LookupRead(b0 + 4, spec, 1, r1.data(), kRecord, &bad).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b.posted(), 0u);
}

TEST_F(AccessPaths, AFenceOrdersEachServersOperationsOnEveryPath) {
  for (const auto& p : pools_) ASSERT_TRUE(p);
  for (size_t k = 0; k < pools_.size(); ++k) {
    SCOPED_TRACE("path " + pools_[k]->AccessPath(0));
    Pool& pool = *pools_[k];
    auto word = *pool.Alloc(8, Placement::OnServer(0));
    auto big = *pool.Alloc(20 << 10, Placement::OnServer(1));  // one-sided even over TCP
    std::vector<GlobalAddress> small;
    for (int i = 0; i < 80; ++i) small.push_back(*pool.Alloc(1024, Placement::OnServer(1)));
    for (int round = 1; round <= 20; ++round) {
      const uint64_t base = uint64_t(round) * 1000;
      std::vector<uint8_t> big_data(20 << 10, static_cast<uint8_t>(round));
      std::vector<std::vector<uint8_t>> small_data(small.size(),
                                                   std::vector<uint8_t>(1024, uint8_t(round + 1)));
      const OpCounters before = pool.counters();
      Batch b(pool);
      // Server 0: a write, then (fenced) a CAS that only succeeds if the write landed first.
      ASSERT_TRUE(b.Write(word, &base, 8).ok());
      // Server 1: a one-sided write and 80 KiB of writes in more than one message.
      ASSERT_TRUE(b.Write(big, big_data.data(), big_data.size()).ok());
      for (size_t i = 0; i < small.size(); ++i) {
        ASSERT_TRUE(b.Write(small[i], small_data[i].data(), 1024).ok());
      }
      ASSERT_TRUE(b.Fence().ok());
      uint64_t previous = 0;
      ASSERT_TRUE(b.CompareAndSwap(word, base, base + 1, &previous).ok());
      std::vector<uint8_t> big_back(20 << 10);
      std::vector<uint8_t> small_back(1024);
      ASSERT_TRUE(b.Read(big, big_back.data(), big_back.size()).ok());
      ASSERT_TRUE(b.Read(small.back(), small_back.data(), 1024).ok());
      ASSERT_TRUE(b.Wait().ok());
      ASSERT_EQ(previous, base) << "the CAS overtook the write before the fence";
      ASSERT_EQ(big_back, big_data);
      ASSERT_EQ(small_back, small_data.back());
      if (k == 1) {
        // Messages: server 1's operations before the fence filled two messages, so the fence
        // waited once; the rest is the batch's own round trip.
        EXPECT_EQ(pool.counters().round_trips - before.round_trips, 2u);
      }
    }
    // One message per server: the fence is free.
    const OpCounters before = pool.counters();
    Batch b(pool);
    const uint64_t one = 1;
    ASSERT_TRUE(b.Write(word, &one, 8).ok());
    ASSERT_TRUE(b.Fence().ok());
    uint64_t previous = 0;
    ASSERT_TRUE(b.CompareAndSwap(word, 1, 2, &previous).ok());
    ASSERT_TRUE(b.Wait().ok());
    EXPECT_EQ(previous, 1u);
    if (k == 1) {
      EXPECT_EQ(pool.counters().round_trips - before.round_trips, 1u);
    }
  }
}

// Batch::Post: a posted fetch-and-add is not waited for, yet the same thread's next operation
// on that server sees it, on every path; over messages it costs a message and no round trip,
// and a batch that wants a result cannot be posted there.
TEST_F(AccessPaths, APostedUpdateIsSeenByTheThreadsNextOperation) {
  for (const auto& p : pools_) ASSERT_TRUE(p);
  for (size_t k = 0; k < pools_.size(); ++k) {
    SCOPED_TRACE("path " + pools_[k]->AccessPath(0));
    Pool& pool = *pools_[k];
    const GlobalAddress word = *pool.Alloc(8, Placement::OnServer(0));
    const uint64_t zero = 0;
    ASSERT_TRUE(pool.Write(word, &zero, 8).ok());
    for (uint64_t i = 1; i <= 200; ++i) {
      const OpCounters before = pool.counters();
      Batch b(pool);
      ASSERT_TRUE(b.FetchAdd(word, 1, nullptr).ok());
      ASSERT_TRUE(b.Post().ok());
      EXPECT_EQ(b.posted(), 0u);
      if (k == 1) {
        EXPECT_EQ(pool.counters().round_trips, before.round_trips);
        EXPECT_EQ(pool.counters().messages - before.messages, 1u);
      }
      uint64_t v = 0;
      ASSERT_TRUE(pool.Read(word, &v, 8).ok());
      ASSERT_EQ(v, i) << "the read overtook the posted fetch-and-add";
    }
    uint64_t v = 0;
    Batch wants(pool);
    ASSERT_TRUE(wants.Read(word, &v, 8).ok());
    const OpCounters before = pool.counters();
    const Status s = wants.Post();
    if (k == 1) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_EQ(pool.counters().messages, before.messages) << "nothing is sent";
    } else {
      EXPECT_TRUE(s.ok()) << s.ToString();  // done at once, or waited for
      EXPECT_EQ(v, 200u);
    }
  }
}

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
