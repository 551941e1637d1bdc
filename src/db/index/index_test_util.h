// Test doubles for the index tests: lock owners ("sessions") that can be fenced or die at a
// fault site, over memory that stops doing anything once its owner died (like a process that
// got SIGKILL), and the tests' seed. No engine is needed.
//
// Thread-safety: OwnerRegistry is safe for concurrent use; a TestOwner belongs to one thread
// (its hook may run other owners inline, on the same thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "db/lock_owner.h"
#include "db/memory.h"

namespace farpool::db {

// FARPOOL_SEED if set, else a random seed (tests print it with SCOPED_TRACE).
uint64_t IndexTestSeed();

// Forwards to another Memory until Kill(); afterwards every operation fails with Unavailable
// and touches nothing. Counts the objects allocated through it and not freed yet. Can lose the
// reply of one compare-and-swap (LoseCasReply).
class KillableMemory final : public Memory {
 public:
  explicit KillableMemory(Memory& inner) : inner_(inner) {}
  void Kill() { killed_ = true; }
  // The CompareAndSwap at `address` after the next `skip` ones there is applied and then
  // reported Unavailable, as a failover that cut its reply leaves it: its outcome unknown to
  // the caller. REQUIRES: no other call of it is pending.
  void LoseCasReply(GlobalAddress address, int skip = 0) {
    lose_skip_ = skip;
    lose_reply_at_ = address.raw();
  }
  int64_t live_objects() const { return live_; }

  Status Read(GlobalAddress source, void* destination, uint64_t size) override;
  Status Write(GlobalAddress destination, const void* source, uint64_t size) override;
  Result<uint64_t> CompareAndSwap(GlobalAddress address, uint64_t expected,
                                  uint64_t desired) override;
  Result<uint64_t> FetchAdd(GlobalAddress address, uint64_t delta) override;
  Result<GlobalAddress> Alloc(uint64_t size, Placement placement) override;
  Status Free(GlobalAddress address) override;
  Result<GlobalAddress> LeaseRun(uint16_t server, uint64_t size) override {
    if (killed_) return Dead();
    return inner_.LeaseRun(server, size);
  }
  Status ReleaseRun(GlobalAddress start, uint64_t size) override {
    if (killed_) return Dead();
    return inner_.ReleaseRun(start, size);
  }
  Result<RegionGeometry> Geometry(uint16_t server) const override {
    return inner_.Geometry(server);
  }
  Result<uint16_t> ServerFor(Placement placement) override { return inner_.ServerFor(placement); }
  std::unique_ptr<MemoryBatch> NewBatch() override;
  std::vector<uint16_t> servers() const override { return inner_.servers(); }
  GlobalAddress Root() const override { return inner_.Root(); }
  uint32_t process_tag() const override { return inner_.process_tag(); }
  Status Evict(uint32_t tag) override { return inner_.Evict(tag); }
  bool mapped() const override { return inner_.mapped(); }
  bool replicated() const override { return inner_.replicated(); }
  Status ConnectThread() override { return inner_.ConnectThread(); }

 private:
  Status Dead() const { return Status::Unavailable("test: this owner's process was killed"); }
  Memory& inner_;
  std::atomic<bool> killed_{false};
  std::atomic<uint64_t> lose_reply_at_{0};  // raw address; 0: none
  std::atomic<int> lose_skip_{0};
  std::atomic<int64_t> live_{0};
};

// Writes part of the image of the redo entry at `area` to that entry's node, as a writer
// stopped half-way through its node write would leave it (a write's bytes may land in any
// order): the first word (the node's checksum) and the second half, not the header between
// them, so the node never verifies (an insert or split always changes its count).
void TearFromRedo(Memory& memory, GlobalAddress area);

class OwnerRegistry;

// A lock owner whose slot, redo area and liveness live in an OwnerRegistry.
class TestOwner final : public LockOwner {
 public:
  // What a fault site does: nothing; die (the owner is fenced and its memory stops); or
  // TearFromRedo and then die (a process killed in the middle of a node write).
  enum class Fault { kNone, kDie, kTearAndDie };
  using Hook = std::function<Fault(std::string_view point)>;

  TestOwner(OwnerRegistry& registry, Memory& memory, uint32_t slot, uint64_t epoch,
            GlobalAddress area);

  uint64_t lock_word() const override;
  Result<bool> HolderDead(uint64_t word) override;
  Status CheckLease() override;
  GlobalAddress index_log() const override { return area_; }
  Result<GlobalAddress> IndexLogOf(uint64_t word) override;
  void FaultPoint(std::string_view point) override;

  void set_hook(Hook hook) { hook_ = std::move(hook); }
  // This owner's view of memory: it stops working when the owner dies.
  const Access& access() const { return access_; }
  // Fenced: others see it dead and its CheckLease fails, but it still runs (a stalled process
  // that wakes up). Kill: fenced, and its memory stops.
  void Fence();
  void Kill();
  bool dead() const;
  uint32_t slot() const { return slot_; }
  uint64_t epoch() const { return epoch_; }

 private:
  OwnerRegistry& registry_;
  Memory& raw_;
  KillableMemory memory_;
  OpCount count_;
  Access access_;
  uint32_t slot_;
  uint64_t epoch_;
  GlobalAddress area_;
  Hook hook_;
};

class OwnerRegistry {
 public:
  explicit OwnerRegistry(Memory& memory) : memory_(memory) {}
  // A new live owner with the next slot and a fresh (zeroed) redo area.
  Result<std::unique_ptr<TestOwner>> NewOwner();
  // The next epoch of `dead`'s slot: a new owner with the same redo area (as a session that
  // claims a slot after its previous session died). REQUIRES: dead.dead().
  Result<std::unique_ptr<TestOwner>> Inherit(const TestOwner& dead);

  bool Dead(uint64_t word);
  void MarkDead(uint64_t word);
  GlobalAddress AreaOf(uint64_t word);
  uint64_t deaths();

 private:
  struct Slot {
    GlobalAddress area;
    bool dead = false;
  };
  Memory& memory_;
  std::mutex mu_;
  uint32_t next_slot_ = 1;
  std::map<uint64_t, Slot> by_word_;
  uint64_t deaths_ = 0;
};

}  // namespace farpool::db
