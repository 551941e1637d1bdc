// PageCache against a shadow file: whatever it returns is the file's bytes, whatever mix of
// reads kept, writes, truncates and evictions came before; it stays within its capacity.
#include "tier/page_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace farpool::tier {
namespace {

TEST(PageCache, KeepsPagesAndDropsTheLeastRecentlyUsed) {
  PageCache cache(2 * 4096);
  std::vector<unsigned char> a(4096, 'a'), b(4096, 'b'), c(4096, 'c'), out(4096);
  cache.Put(0, a.data(), 4096);
  cache.Put(4096, b.data(), 4096);
  ASSERT_TRUE(cache.Get(0, out.data(), 4096));  // page 0 is now the most recently used
  cache.Put(8192, c.data(), 4096);
  EXPECT_FALSE(cache.Get(4096, out.data(), 4096)) << "page 1 was the least recently used";
  EXPECT_TRUE(cache.Get(0, out.data(), 4096));
  EXPECT_EQ(out, a);
  // Part of a page: the change counter SQLite reads at 24.
  unsigned char counter[16];
  ASSERT_TRUE(cache.Get(24, counter, 16));
  EXPECT_EQ(counter[0], 'a');
  EXPECT_FALSE(cache.Get(4090, counter, 16)) << "no range holds all of it";
  EXPECT_EQ(cache.bytes(), 2u * 4096);
  // A capacity of 0 keeps the last range put.
  cache.set_capacity(0);
  EXPECT_EQ(cache.ranges(), 1u);
  EXPECT_TRUE(cache.Get(24, counter, 16)) << "page 0 was used last";
}

TEST(PageCache, RandomOperationsAgreeWithTheFile) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr uint64_t kPage = 512, kPages = 64;
  std::vector<unsigned char> file(kPage * kPages);
  for (auto& byte : file) byte = static_cast<unsigned char>(rng());
  PageCache cache(16 * kPage);
  std::vector<unsigned char> out(4 * kPage);
  auto span = [&](uint64_t* offset, uint64_t* n) {
    // Mostly whole pages, sometimes a few bytes or several pages, anywhere.
    switch (rng() % 3) {
      case 0:
        *offset = (rng() % kPages) * kPage, *n = kPage;
        break;
      case 1:
        *offset = rng() % (file.size() - 16), *n = 1 + rng() % 16;
        break;
      default:
        *offset = (rng() % (kPages - 4)) * kPage + rng() % kPage, *n = 1 + rng() % (3 * kPage);
    }
  };
  for (int op = 0; op < 20000; ++op) {
    uint64_t offset, n;
    span(&offset, &n);
    const int what = rng() % 10;
    if (what < 5) {
      if (offset + n > file.size()) continue;
      if (cache.Get(offset, out.data(), n)) {
        ASSERT_EQ(std::memcmp(out.data(), file.data() + offset, n), 0)
            << "op " << op << ": stale bytes at " << offset << " +" << n;
      } else {
        cache.Put(offset, file.data() + offset, n);  // a miss read from the file
      }
    } else if (what < 9) {
      if (offset + n > file.size()) file.resize(offset + n);
      for (uint64_t i = 0; i < n; ++i) file[offset + i] = static_cast<unsigned char>(rng());
      cache.Write(offset, file.data() + offset, n);
    } else {
      const uint64_t size = rng() % (kPage * kPages);
      file.resize(size);
      cache.Truncate(size);
      file.resize(kPage * kPages);  // grows again with zeros, as a file does
    }
    ASSERT_TRUE(cache.bytes() <= cache.capacity() || cache.ranges() == 1) << "op " << op;
  }
}

}  // namespace
}  // namespace farpool::tier
