#include "pool/object_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "pool/server/chunk_allocator.h"

namespace farpool {
namespace {

constexpr uint64_t kChunk = 64 << 10;

// Two "servers" whose leases come from real ChunkAllocators.
struct Fixture {
  std::vector<ChunkAllocator> servers;
  std::unique_ptr<ObjectAllocator> alloc;
  int leases = 0, releases = 0;

  explicit Fixture(uint64_t capacity) {
    servers.reserve(3);  // AddedServer... adds a third: the lambdas index into it
    servers.emplace_back(capacity, kChunk);
    servers.emplace_back(capacity, kChunk);
    std::vector<ObjectAllocator::Geometry> g;
    for (auto& s : servers) g.push_back({s.region_size(), kChunk});
    alloc = std::make_unique<ObjectAllocator>(
        g, /*capacity=*/3,
        [this](size_t i, uint64_t size) {
          ++leases;
          return servers[i].Lease(size, 0);
        },
        [this](size_t i, uint64_t off, uint64_t size) {
          ++releases;
          return servers[i].Release(off, size, 0);
        });
  }
};

TEST(ObjectAllocator, RandomAllocFreeMatchesAModelWithNoOverlap) {
  const uint64_t seed = 99;
  std::mt19937_64 rng(seed);
  Fixture f(1024 * kChunk);
  std::map<std::pair<size_t, uint64_t>, uint64_t> live;  // (server, offset) -> size
  for (int step = 0; step < 20000; ++step) {
    // Allocation-heavy until ~300 objects are live, then a steady mix.
    if (live.empty() || (live.size() < 300 ? rng() % 3 != 0 : rng() % 2 == 0)) {
      const size_t server = rng() % 2;
      const uint64_t size = 1 + (rng() % 5 == 0 ? rng() % (3 * kChunk) : rng() % 2000);
      auto off = f.alloc->Allocate(server, size);
      ASSERT_TRUE(off.ok()) << off.status().ToString() << " seed " << seed << " step " << step;
      ASSERT_EQ(*off % 64, 0u) << "objects are 64-byte aligned";
      ASSERT_TRUE(f.alloc->CheckLive(server, *off, size).ok());
      // No overlap with any live object on the same server.
      auto next = live.lower_bound({server, *off});
      if (next != live.end() && next->first.first == server) {
        ASSERT_GE(next->first.second, *off + size) << "seed " << seed << " step " << step;
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        if (prev->first.first == server) {
          ASSERT_LE(prev->first.second + prev->second, *off) << "seed " << seed;
        }
      }
      live[{server, *off}] = size;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(f.alloc->Free(it->first.first, it->first.second).ok());
      live.erase(it);
    }
  }
  for (auto& [key, size] : live) ASSERT_TRUE(f.alloc->Free(key.first, key.second).ok());
  ASSERT_TRUE(f.alloc->Trim().ok());
  EXPECT_EQ(f.servers[0].leased() + f.servers[1].leased(), 0u) << "everything given back";
}

TEST(ObjectAllocator, FreedMemoryIsRejectedUntilTrimmed) {
  Fixture f(16 * kChunk);
  auto a = *f.alloc->Allocate(0, 100);
  auto b = *f.alloc->Allocate(0, 100);
  auto big = *f.alloc->Allocate(0, 2 * kChunk);
  ASSERT_TRUE(f.alloc->Free(0, a).ok());
  EXPECT_NE(f.alloc->CheckLive(0, a, 8).message().find("freed"), std::string::npos);
  EXPECT_TRUE(f.alloc->CheckLive(0, b, 128).ok());
  EXPECT_FALSE(f.alloc->CheckLive(0, b, 129).ok()) << "crosses the 128-byte slot";
  EXPECT_NE(f.alloc->Free(0, a).message().find("already freed"), std::string::npos);
  EXPECT_FALSE(f.alloc->Free(0, b + 64).ok()) << "not the start of an object";
  ASSERT_TRUE(f.alloc->Free(0, big).ok());
  EXPECT_FALSE(f.alloc->CheckLive(0, big + kChunk, 8).ok());
  ASSERT_TRUE(f.alloc->Free(0, b).ok());
  EXPECT_GT(f.servers[0].leased(), 0u) << "freed memory is retained until Trim";
  ASSERT_TRUE(f.alloc->Trim().ok());
  EXPECT_EQ(f.servers[0].leased(), 0u);
  EXPECT_TRUE(f.alloc->CheckLive(0, a, 8).ok()) << "after Trim it may be another client's";
}

TEST(ObjectAllocator, RetainedMemoryIsReusedAndTrimmedWhenTheServerIsFull) {
  Fixture f(4 * kChunk);
  std::vector<uint64_t> objs;
  for (int i = 0; i < 4; ++i) objs.push_back(*f.alloc->Allocate(0, kChunk));
  EXPECT_EQ(f.alloc->Allocate(0, 64).status().code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(f.alloc->Free(0, objs[0]).ok());
  ASSERT_TRUE(f.alloc->Free(0, objs[1]).ok());
  const int leases = f.leases;
  EXPECT_EQ(*f.alloc->Allocate(0, kChunk), objs[0]) << "a retained run of the same size is reused";
  EXPECT_EQ(f.leases, leases);
  // A 64-byte object needs a slab chunk: the retained 1-chunk run is reused for it.
  EXPECT_TRUE(f.alloc->Allocate(0, 64).ok());
  ASSERT_TRUE(f.alloc->Free(0, objs[2]).ok());
  ASSERT_TRUE(f.alloc->Free(0, objs[3]).ok());
  // Two retained 1-chunk runs; a 2-chunk object only fits once they are given back.
  auto two = f.alloc->Allocate(0, 2 * kChunk);
  EXPECT_TRUE(two.ok()) << two.status().ToString();
}

// A server added later (the Pool learned it from the map) gets the next index, takes objects
// and checks like the first ones; beyond the capacity the table refuses with a reason.
TEST(ObjectAllocator, AnAddedServerGetsTheNextIndexAndTakesObjects) {
  Fixture f(16 * kChunk);
  f.servers.emplace_back(16 * kChunk, kChunk);
  auto index = f.alloc->AddServer({f.servers[2].region_size(), kChunk});
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(*index, 2u);
  auto a = f.alloc->Allocate(2, 100);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(f.alloc->CheckLive(2, *a, 100).ok());
  ASSERT_TRUE(f.alloc->Free(2, *a).ok());
  EXPECT_EQ(f.alloc->CheckLive(2, *a, 8).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(f.alloc->Trim().ok());
  EXPECT_EQ(f.releases, 1) << "the added server's freed chunk went back";
  auto full = f.alloc->AddServer({f.servers[2].region_size(), kChunk});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted) << full.status().ToString();
}

}  // namespace
}  // namespace farpool
