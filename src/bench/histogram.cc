#include "bench/histogram.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>

namespace farpool {

Histogram::Histogram() : counts_(kSub * (64 - kSubBits + 1), 0) {}

size_t Histogram::Index(uint64_t value) {
  if (value < kSub) return static_cast<size_t>(value);
  const int shift = std::bit_width(value) - (kSubBits + 1);  // keep the top 8 bits
  return static_cast<size_t>(kSub * (shift + 1) + ((value >> shift) - kSub));
}

uint64_t Histogram::Midpoint(size_t index) {
  if (index < kSub) return index;
  const int shift = static_cast<int>(index / kSub) - 1;
  const uint64_t top = index % kSub + kSub;
  return (top << shift) + ((uint64_t{1} << shift) >> 1);
}

void Histogram::Record(uint64_t value) {
  ++counts_[Index(value)];
  ++count_;
  sum_ += value;
  min_ = std::min(min_, value);
  max_ = std::max(max_, value);
}

void Histogram::Merge(const Histogram& other) {
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
}

uint64_t Histogram::Percentile(double q) const {
  if (count_ == 0) return 0;
  const uint64_t rank =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(std::clamp(q, 0.0, 1.0) * count_)));
  uint64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) return std::clamp(Midpoint(i), min_, max_);
  }
  return max_;
}

uint64_t ClockOverheadNs() {
  using Clock = std::chrono::steady_clock;
  std::vector<uint64_t> samples(2001);
  for (auto& s : samples) {
    const auto a = Clock::now();
    const auto b = Clock::now();
    s = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
  }
  std::nth_element(samples.begin(), samples.begin() + 1000, samples.end());
  return samples[1000];
}

}  // namespace farpool
