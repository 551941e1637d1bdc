// Histogram: latency distribution with bounded memory and <1% relative error.
//
// Log-linear buckets (as HdrHistogram): values below 128 ns are exact; above, each power of
// two is split into 128 buckets, so a percentile is within 1/128 of the true value. One
// histogram per thread, merged at the end; recording is an increment.
//
// Thread-safety: not thread-safe; merge per-thread histograms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace farpool {

class Histogram {
 public:
  Histogram();
  void Record(uint64_t value);
  void Merge(const Histogram& other);

  uint64_t count() const { return count_; }
  double mean() const { return count_ ? static_cast<double>(sum_) / count_ : 0.0; }
  uint64_t min() const { return count_ ? min_ : 0; }
  uint64_t max() const { return max_; }
  // The value at quantile q in [0, 1] (bucket midpoint); 0 if empty.
  uint64_t Percentile(double q) const;

 private:
  static constexpr int kSubBits = 7;
  static constexpr uint64_t kSub = uint64_t{1} << kSubBits;
  static size_t Index(uint64_t value);
  static uint64_t Midpoint(size_t index);

  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t min_ = UINT64_MAX;
  uint64_t max_ = 0;
};

// The median cost of reading the steady clock twice, in ns: benchmarks subtract it from every
// sample so that sub-microsecond operations are not charged for their own measurement.
uint64_t ClockOverheadNs();

}  // namespace farpool
