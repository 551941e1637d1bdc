#include "pool/server/chunk_allocator.h"

#include <gtest/gtest.h>

namespace farpool {
namespace {

constexpr uint64_t kChunk = 1 << 20;

TEST(ChunkAllocator, LeasesContiguousRunsAfterTheRootArea) {
  ChunkAllocator a(8 * kChunk + 123, kChunk);  // the partial chunk is not leasable
  EXPECT_EQ(a.capacity(), 8 * kChunk);
  EXPECT_EQ(a.region_size(), wire::kRootAreaSize + 8 * kChunk);
  auto x = a.Lease(2 * kChunk);
  auto y = a.Lease(kChunk);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(*x, wire::kRootAreaSize);
  EXPECT_EQ(*y, wire::kRootAreaSize + 2 * kChunk);
  EXPECT_EQ(a.leased(), 3 * kChunk);
  EXPECT_EQ(a.largest_free(), 5 * kChunk);
}

TEST(ChunkAllocator, CoversTheRootAreaAndCurrentLeasesOnly) {
  ChunkAllocator a(4 * kChunk, kChunk);
  EXPECT_FALSE(a.Covers(0, 8)) << "the null word";
  EXPECT_TRUE(a.Covers(wire::kRootReserved, wire::kRootAreaSize - wire::kRootReserved));
  EXPECT_FALSE(a.Covers(wire::kRootAreaSize - 8, 16)) << "crosses into an unleased chunk";
  auto x = a.Lease(kChunk);
  auto y = a.Lease(kChunk);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_TRUE(a.Covers(*x, kChunk));
  EXPECT_TRUE(a.Covers(*y + kChunk - 8, 8));
  EXPECT_FALSE(a.Covers(*x + kChunk - 8, 16)) << "crosses from one lease into another";
  EXPECT_FALSE(a.Covers(*y + kChunk, 8)) << "past the last lease";
  ASSERT_TRUE(a.Release(*x, kChunk).ok());
  EXPECT_FALSE(a.Covers(*x, 8)) << "released";
}

TEST(ChunkAllocator, LeaseAtMirrorsAnotherBookExactly) {
  ChunkAllocator primary(8 * kChunk, kChunk), mirror(8 * kChunk, kChunk);
  auto x = primary.Lease(2 * kChunk);
  auto y = primary.Lease(kChunk);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(primary.Release(*x, 2 * kChunk).ok());
  // The mirror sees only y (x came and went): the run before it stays free and usable.
  ASSERT_TRUE(mirror.LeaseAt(*y, kChunk).ok());
  EXPECT_TRUE(mirror.Covers(*y, kChunk));
  EXPECT_FALSE(mirror.Covers(*x, 8));
  EXPECT_EQ(mirror.leased(), kChunk);
  EXPECT_FALSE(mirror.LeaseAt(*y, kChunk).ok()) << "taken already";
  EXPECT_FALSE(mirror.LeaseAt(*y + 8, kChunk).ok()) << "not at a chunk boundary";
  EXPECT_FALSE(mirror.LeaseAt(wire::kRootAreaSize + 8 * kChunk, kChunk).ok()) << "past the end";
  EXPECT_FALSE(mirror.LeaseAt(*y - kChunk, 2 * kChunk).ok()) << "overlaps a lease";
  auto z = mirror.Lease(2 * kChunk);  // first fit: the free run before y
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(*z, *x);
  ASSERT_TRUE(mirror.Release(*y, kChunk).ok());
  EXPECT_EQ(mirror.leased(), 2 * kChunk);
}

TEST(ChunkAllocator, FullPoolErrorNamesCapacityFreeAndLargestRun) {
  ChunkAllocator a(4 * kChunk, kChunk);
  auto x = a.Lease(kChunk);
  auto y = a.Lease(kChunk);
  auto z = a.Lease(kChunk);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  ASSERT_TRUE(a.Release(*y, kChunk).ok());  // 2 free, but not contiguous
  auto big = a.Lease(2 * kChunk);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kOutOfMemory);
  const std::string& m = big.status().message();
  EXPECT_NE(m.find("pool full"), std::string::npos) << m;
  EXPECT_NE(m.find("2 MiB free of 4 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("largest contiguous run 1 MiB"), std::string::npos) << m;
  EXPECT_EQ(a.leased(), 2 * kChunk);  // nothing half-leased
}

TEST(ChunkAllocator, ReleaseCoalescesAndRejectsWhatIsNotALease) {
  ChunkAllocator a(4 * kChunk, kChunk);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 4; ++i) offs.push_back(*a.Lease(kChunk));
  EXPECT_FALSE(a.Release(offs[0], 2 * kChunk).ok());   // wrong size
  EXPECT_FALSE(a.Release(offs[0] + 64, kChunk).ok());  // not a lease start
  for (int i : {1, 3, 2, 0}) ASSERT_TRUE(a.Release(offs[i], kChunk).ok());
  EXPECT_FALSE(a.Release(offs[2], kChunk).ok());  // double release
  EXPECT_EQ(a.leased(), 0u);
  EXPECT_EQ(a.largest_free(), 4 * kChunk);  // coalesced back into one run
  EXPECT_TRUE(a.Lease(4 * kChunk).ok());
}

TEST(ChunkAllocator, RejectsSizesThatAreNotChunkMultiples) {
  ChunkAllocator a(4 * kChunk, kChunk);
  EXPECT_EQ(a.Lease(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Lease(kChunk + 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace farpool
