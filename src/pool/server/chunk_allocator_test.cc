#include "pool/server/chunk_allocator.h"

#include <gtest/gtest.h>

namespace farpool {
namespace {

constexpr uint64_t kChunk = 1 << 20;

TEST(ChunkAllocator, LeasesContiguousRunsAfterTheRootArea) {
  ChunkAllocator a(8 * kChunk + 123, kChunk);  // the partial chunk is not leasable
  EXPECT_EQ(a.capacity(), 8 * kChunk);
  EXPECT_EQ(a.region_size(), wire::kRootAreaSize + 8 * kChunk);
  auto x = a.Lease(2 * kChunk, 0);
  auto y = a.Lease(kChunk, 0);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(*x, wire::kRootAreaSize);
  EXPECT_EQ(*y, wire::kRootAreaSize + 2 * kChunk);
  EXPECT_EQ(a.leased(), 3 * kChunk);
  EXPECT_EQ(a.largest_free(), 5 * kChunk);
}

TEST(ChunkAllocator, CoversTheRootAreaAndCurrentLeasesOnly) {
  ChunkAllocator a(4 * kChunk, kChunk);
  EXPECT_NE(a.Check(0, 8, 0), ChunkAllocator::Access::kOk) << "the null word";
  EXPECT_EQ(a.Check(wire::kRootReserved, wire::kRootAreaSize - wire::kRootReserved, 0),
            ChunkAllocator::Access::kOk);
  EXPECT_NE(a.Check(wire::kRootAreaSize - 8, 16, 0), ChunkAllocator::Access::kOk)
      << "crosses into an unleased chunk";
  auto x = a.Lease(kChunk, 0);
  auto y = a.Lease(kChunk, 0);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(a.Check(*x, kChunk, 0), ChunkAllocator::Access::kOk);
  EXPECT_EQ(a.Check(*y + kChunk - 8, 8, 0), ChunkAllocator::Access::kOk);
  EXPECT_NE(a.Check(*x + kChunk - 8, 16, 0), ChunkAllocator::Access::kOk)
      << "crosses from one lease into another";
  EXPECT_NE(a.Check(*y + kChunk, 8, 0), ChunkAllocator::Access::kOk) << "past the last lease";
  ASSERT_TRUE(a.Release(*x, kChunk, 0).ok());
  EXPECT_NE(a.Check(*x, 8, 0), ChunkAllocator::Access::kOk) << "released";
}

TEST(ChunkAllocator, LeaseAtMirrorsAnotherBookExactly) {
  ChunkAllocator primary(8 * kChunk, kChunk), mirror(8 * kChunk, kChunk);
  auto x = primary.Lease(2 * kChunk, 0);
  auto y = primary.Lease(kChunk, 0);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(primary.Release(*x, 2 * kChunk, 0).ok());
  // The mirror sees only y (x came and went): the run before it stays free and usable.
  ASSERT_TRUE(mirror.LeaseAt(*y, kChunk, 0, false).ok());
  EXPECT_EQ(mirror.Check(*y, kChunk, 0), ChunkAllocator::Access::kOk);
  EXPECT_NE(mirror.Check(*x, 8, 0), ChunkAllocator::Access::kOk);
  EXPECT_EQ(mirror.leased(), kChunk);
  EXPECT_FALSE(mirror.LeaseAt(*y, kChunk, 0, false).ok()) << "taken already";
  EXPECT_FALSE(mirror.LeaseAt(*y + 8, kChunk, 0, false).ok()) << "not at a chunk boundary";
  EXPECT_FALSE(mirror.LeaseAt(wire::kRootAreaSize + 8 * kChunk, kChunk, 0, false).ok())
      << "past the end";
  EXPECT_FALSE(mirror.LeaseAt(*y - kChunk, 2 * kChunk, 0, false).ok()) << "overlaps a lease";
  auto z = mirror.Lease(2 * kChunk, 0);  // first fit: the free run before y
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(*z, *x);
  ASSERT_TRUE(mirror.Release(*y, kChunk, 0).ok());
  EXPECT_EQ(mirror.leased(), 2 * kChunk);
}

TEST(ChunkAllocator, FullPoolErrorNamesCapacityFreeAndLargestRun) {
  ChunkAllocator a(4 * kChunk, kChunk);
  auto x = a.Lease(kChunk, 0);
  auto y = a.Lease(kChunk, 0);
  auto z = a.Lease(kChunk, 0);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  ASSERT_TRUE(a.Release(*y, kChunk, 0).ok());  // 2 free, but not contiguous
  auto big = a.Lease(2 * kChunk, 0);
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
  for (int i = 0; i < 4; ++i) offs.push_back(*a.Lease(kChunk, 0));
  EXPECT_FALSE(a.Release(offs[0], 2 * kChunk, 0).ok());   // wrong size
  EXPECT_FALSE(a.Release(offs[0] + 64, kChunk, 0).ok());  // not a lease start
  for (int i : {1, 3, 2, 0}) ASSERT_TRUE(a.Release(offs[i], kChunk, 0).ok());
  EXPECT_FALSE(a.Release(offs[2], kChunk, 0).ok());  // double release
  EXPECT_EQ(a.leased(), 0u);
  EXPECT_EQ(a.largest_free(), 4 * kChunk);  // coalesced back into one run
  EXPECT_TRUE(a.Lease(4 * kChunk, 0).ok());
}

TEST(ChunkAllocator, RejectsSizesThatAreNotChunkMultiples) {
  ChunkAllocator a(4 * kChunk, kChunk);
  EXPECT_EQ(a.Lease(0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Lease(kChunk + 1, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChunkAllocator, EveryLeaseIsItsPoolsOnly) {
  constexpr uint32_t kA = 7, kB = 9;
  using Access = ChunkAllocator::Access;
  ChunkAllocator a(8 * kChunk, kChunk);
  auto mine = a.Lease(kChunk, kA);
  auto theirs = a.Lease(2 * kChunk, kB);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  EXPECT_EQ(a.Check(*mine, kChunk, kA), Access::kOk);
  EXPECT_EQ(a.Check(*theirs + 8, 8, kA), Access::kOtherPool);
  EXPECT_EQ(a.Check(*theirs + 8, 8, kB), Access::kOk);
  EXPECT_EQ(a.Check(*theirs, 8, 0), Access::kOtherPool) << "the default pool is a pool too";
  EXPECT_EQ(a.Check(*mine + kChunk - 8, 16, kA), Access::kOutside) << "runs into B's lease";
  EXPECT_EQ(a.Check(wire::kRootReserved, 8, kA), Access::kOtherPool) << "the default's root";
  EXPECT_EQ(a.Check(wire::kRootReserved, 8, 0), Access::kOk);
  EXPECT_EQ(a.Release(*theirs, 2 * kChunk, kA).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(a.Check(*theirs, 8, kB), Access::kOk) << "a refused release frees nothing";

  bool created = false;
  auto root = a.LeaseRoot(kA, &created);
  ASSERT_TRUE(root.ok() && created);
  auto again = a.LeaseRoot(kA, &created);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(*again, *root) << "one root area per pool";
  EXPECT_EQ(a.RootOf(kA), *root);
  EXPECT_FALSE(a.RootOf(kB).has_value());
  EXPECT_EQ(a.Check(*root, kChunk, kA), Access::kOk);
  EXPECT_EQ(a.Check(*root, 8, kB), Access::kOtherPool);
  EXPECT_EQ(a.Release(*root, kChunk, kA).code(), StatusCode::kInvalidArgument) << "never released";

  ChunkAllocator mirror(8 * kChunk, kChunk);  // the book a backup mirrors, owners and root
  ASSERT_TRUE(mirror.LeaseAt(*theirs, 2 * kChunk, kB, false).ok());
  ASSERT_TRUE(mirror.LeaseAt(*root, kChunk, kA, true).ok());
  EXPECT_EQ(mirror.Check(*theirs, 8, kA), Access::kOtherPool);
  EXPECT_EQ(mirror.RootOf(kA), *root);
  EXPECT_FALSE(mirror.LeaseAt(*mine, kChunk, kA, true).ok()) << "a second root";
  const uint64_t leased = mirror.leased();
  EXPECT_TRUE(mirror.LeaseAt(*root, kChunk, kA, true).ok()) << "the same root again: resent";
  EXPECT_EQ(mirror.leased(), leased) << "a root resent changes nothing";
  EXPECT_FALSE(mirror.LeaseAt(*root, kChunk, kB, true).ok()) << "another pool's root";
  EXPECT_FALSE(mirror.LeaseAt(*root, kChunk, kA, false).ok()) << "an ordinary lease of it";
}

}  // namespace
}  // namespace farpool
