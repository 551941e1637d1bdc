#include "db/index/index_test_util.h"

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "db/index/index_redo.h"
#include "db/layout.h"

namespace farpool::db {

uint64_t IndexTestSeed() {
  if (const char* s = std::getenv("FARPOOL_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
}

void TearFromRedo(Memory& memory, GlobalAddress area) {
  std::vector<unsigned char> buf(LockOwner::kIndexLogBytes);
  IndexRedoHeader h;
  if (memory.Read(area, &h, sizeof(h)).ok() && h.magic == kIndexRedoMagic &&
      h.size <= kIndexRedoMaxImage && memory.Read(area + sizeof(h), buf.data(), h.size).ok()) {
    const GlobalAddress body = GlobalAddress::FromRaw(h.target) + kIndexRedoImageOffset;
    const uint64_t half = (h.size / 2) & ~uint64_t{7};
    (void)memory.Write(body, buf.data(), 8);
    (void)memory.Write(body + half, buf.data() + half, h.size - half);
  }
}

Status KillableMemory::Read(GlobalAddress source, void* destination, uint64_t size) {
  if (killed_) return Dead();
  return inner_.Read(source, destination, size);
}
Status KillableMemory::Write(GlobalAddress destination, const void* source, uint64_t size) {
  if (killed_) return Dead();
  return inner_.Write(destination, source, size);
}
Result<uint64_t> KillableMemory::CompareAndSwap(GlobalAddress address, uint64_t expected,
                                                uint64_t desired) {
  if (killed_) return Dead();
  Result<uint64_t> r = inner_.CompareAndSwap(address, expected, desired);
  if (r.ok() && lose_reply_at_.load() == address.raw() && lose_skip_.fetch_sub(1) == 0) {
    lose_reply_at_ = 0;
    return Status::Unavailable("test: the reply of this compare-and-swap was lost");
  }
  return r;
}
Result<uint64_t> KillableMemory::FetchAdd(GlobalAddress address, uint64_t delta) {
  if (killed_) return Dead();
  return inner_.FetchAdd(address, delta);
}
Result<GlobalAddress> KillableMemory::Alloc(uint64_t size, Placement placement) {
  if (killed_) return Dead();
  auto a = inner_.Alloc(size, placement);
  if (a.ok()) ++live_;
  return a;
}
Status KillableMemory::Free(GlobalAddress address) {
  if (killed_) return Dead();
  Status s = inner_.Free(address);
  if (s.ok()) --live_;
  return s;
}
std::unique_ptr<MemoryBatch> KillableMemory::NewBatch() {
  // The indexes use no batches; a test that needs one would have to kill it too.
  return inner_.NewBatch();
}

TestOwner::TestOwner(OwnerRegistry& registry, Memory& memory, uint32_t slot, uint64_t epoch,
                     GlobalAddress area)
    : registry_(registry),
      raw_(memory),
      memory_(memory),
      access_(memory_, count_),
      slot_(slot),
      epoch_(epoch),
      area_(area) {}

uint64_t TestOwner::lock_word() const { return LockWord(slot_, epoch_); }

Result<bool> TestOwner::HolderDead(uint64_t word) {
  if (!IsLocked(word)) return Status::Internal("test: HolderDead of an unlocked word");
  return registry_.Dead(word);
}

Status TestOwner::CheckLease() {
  if (dead()) return Status::Unavailable("test: slot " + std::to_string(slot_) + " was fenced");
  return Status::Ok();
}

Result<GlobalAddress> TestOwner::IndexLogOf(uint64_t word) { return registry_.AreaOf(word); }

void TestOwner::FaultPoint(std::string_view point) {
  if (!hook_ || dead()) return;
  const Fault f = hook_(point);
  if (f == Fault::kNone) return;
  // The half write goes through the raw memory, past the kill switch: it was on its way.
  if (f == Fault::kTearAndDie) TearFromRedo(raw_, area_);
  Kill();
}

void TestOwner::Fence() { registry_.MarkDead(lock_word()); }

void TestOwner::Kill() {
  memory_.Kill();
  Fence();
}

bool TestOwner::dead() const { return registry_.Dead(lock_word()); }

Result<std::unique_ptr<TestOwner>> OwnerRegistry::NewOwner() {
  OpCount c;
  Access access(memory_, c);
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress area, access.Alloc(LockOwner::kIndexLogBytes));
  std::vector<unsigned char> zeros(LockOwner::kIndexLogBytes, 0);
  FARPOOL_RETURN_IF_ERROR(access.Write(area, zeros.data(), zeros.size()));
  std::lock_guard<std::mutex> l(mu_);
  const uint32_t slot = next_slot_++;
  by_word_[LockWord(slot, 1)] = Slot{area, false};
  return std::make_unique<TestOwner>(*this, memory_, slot, 1, area);
}

Result<std::unique_ptr<TestOwner>> OwnerRegistry::Inherit(const TestOwner& dead) {
  if (!dead.dead()) return Status::InvalidArgument("test: Inherit of a live owner");
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t epoch = dead.epoch() + 1;
  by_word_[LockWord(dead.slot(), epoch)] = Slot{dead.index_log(), false};
  return std::make_unique<TestOwner>(*this, memory_, dead.slot(), epoch, dead.index_log());
}

bool OwnerRegistry::Dead(uint64_t word) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_word_.find(word);
  return it != by_word_.end() && it->second.dead;
}

void OwnerRegistry::MarkDead(uint64_t word) {
  std::lock_guard<std::mutex> l(mu_);
  auto& s = by_word_[word];
  if (!s.dead) ++deaths_;
  s.dead = true;
}

GlobalAddress OwnerRegistry::AreaOf(uint64_t word) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_word_.find(word);
  return it == by_word_.end() ? GlobalAddress() : it->second.area;
}

uint64_t OwnerRegistry::deaths() {
  std::lock_guard<std::mutex> l(mu_);
  return deaths_;
}

}  // namespace farpool::db
