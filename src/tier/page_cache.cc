#include "tier/page_cache.h"

#include <algorithm>
#include <cstring>

namespace farpool::tier {

PageCache::Ranges::iterator PageCache::Holding(uint64_t offset) {
  auto it = ranges_.upper_bound(offset);
  if (it == ranges_.begin()) return ranges_.end();
  --it;
  return offset < it->first + it->second.bytes.size() ? it : ranges_.end();
}

PageCache::Ranges::iterator PageCache::Erase(Ranges::iterator it) {
  bytes_ -= it->second.bytes.size();
  uses_.erase(it->second.use);
  return ranges_.erase(it);
}

bool PageCache::Get(uint64_t offset, void* out, uint64_t n) {
  auto it = Holding(offset);
  if (it == ranges_.end() || offset + n > it->first + it->second.bytes.size()) return false;
  std::memcpy(out, it->second.bytes.data() + (offset - it->first), n);
  uses_.splice(uses_.begin(), uses_, it->second.use);
  return true;
}

void PageCache::Put(uint64_t offset, const void* data, uint64_t n) {
  if (n == 0) return;
  auto it = Holding(offset);
  if (it == ranges_.end()) it = ranges_.lower_bound(offset);
  while (it != ranges_.end() && it->first < offset + n) it = Erase(it);
  const auto* p = static_cast<const unsigned char*>(data);
  uses_.push_front(offset);
  ranges_.emplace(offset, Range{std::vector<unsigned char>(p, p + n), uses_.begin()});
  bytes_ += n;
  Shrink();
}

void PageCache::Write(uint64_t offset, const void* data, uint64_t n) {
  if (n == 0) return;
  const auto* p = static_cast<const unsigned char*>(data);
  auto it = Holding(offset);
  if (it == ranges_.end()) it = ranges_.lower_bound(offset);
  bool held = false;
  for (; it != ranges_.end() && it->first < offset + n; ++it) {
    std::vector<unsigned char>& b = it->second.bytes;
    const uint64_t from = std::max(offset, it->first);
    const uint64_t to = std::min(offset + n, it->first + b.size());
    std::memcpy(b.data() + (from - it->first), p + (from - offset), to - from);
    held = held || (from == offset && to == offset + n);
  }
  if (!held) Put(offset, data, n);
}

void PageCache::Truncate(uint64_t size) {
  auto it = Holding(size);
  if (it == ranges_.end()) it = ranges_.lower_bound(size);
  while (it != ranges_.end()) it = Erase(it);
}

void PageCache::Clear() {
  ranges_.clear();
  uses_.clear();
  bytes_ = 0;
}

void PageCache::set_capacity(uint64_t capacity) {
  capacity_ = capacity;
  Shrink();
}

void PageCache::Shrink() {
  while (bytes_ > capacity_ && uses_.size() > 1) Erase(ranges_.find(uses_.back()));
}

}  // namespace farpool::tier
