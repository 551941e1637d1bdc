#include "bench/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace farpool {
namespace {

TEST(Histogram, PercentilesWithinOnePercentOfExact) {
  const uint64_t seed = 7;
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> dist(8.0, 1.5);  // ns, heavy tail
  Histogram h;
  std::vector<uint64_t> values;
  for (int i = 0; i < 200000; ++i) {
    uint64_t v = static_cast<uint64_t>(dist(rng));
    values.push_back(v);
    h.Record(v);
  }
  std::sort(values.begin(), values.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const uint64_t exact = values[static_cast<size_t>(std::ceil(q * values.size())) - 1];
    const double err = std::abs(double(h.Percentile(q)) - double(exact)) / double(exact);
    EXPECT_LT(err, 0.01) << "q=" << q << " exact=" << exact << " got=" << h.Percentile(q)
                         << " seed=" << seed;
  }
  EXPECT_EQ(h.count(), values.size());
  EXPECT_EQ(h.min(), values.front());
  EXPECT_EQ(h.max(), values.back());
}

TEST(Histogram, SmallValuesAreExactAndMergeAdds) {
  Histogram a, b;
  for (uint64_t v = 0; v < 100; ++v) a.Record(v);
  for (uint64_t v = 100; v < 128; ++v) b.Record(v);
  a.Merge(b);
  EXPECT_EQ(a.count(), 128u);
  EXPECT_EQ(a.Percentile(0.5), 63u);
  EXPECT_EQ(a.Percentile(1.0), 127u);
  EXPECT_EQ(Histogram().Percentile(0.5), 0u);
}

}  // namespace
}  // namespace farpool
