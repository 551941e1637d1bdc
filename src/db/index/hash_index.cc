#include "db/index/hash_index.h"

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "db/layout.h"

namespace farpool::db {
namespace {

struct Bucket {
  uint64_t lock;
  uint64_t next;
  struct Entry {
    int64_t key;
    uint64_t record;
  } entries[HashIndex::kEntries];
};
static_assert(sizeof(Bucket) == HashIndex::kBucketSize);

std::string HolderName(uint64_t word) {
  return "slot " + std::to_string(LockSlot(word)) + " epoch " + std::to_string(LockEpoch(word));
}

}  // namespace

Result<GlobalAddress> HashIndex::Create(const Access& access, uint64_t buckets) {
  if (buckets == 0) return Status::InvalidArgument("hash index: zero buckets");
  return AllocZeroed(access, buckets * kBucketSize, Placement::Striped());
}

GlobalAddress HashIndex::Bucket(int64_t key) const {
  uint64_t h = Mix64(static_cast<uint64_t>(key) ^ seed_);
  return buckets_ + (h % count_) * kBucketSize;
}

Result<GlobalAddress> HashIndex::Lookup(const Access& access, int64_t key) const {
  struct Bucket b;
  FARPOOL_RETURN_IF_ERROR(access.Read(Bucket(key), &b, sizeof(b)));
  return FinishLookup(access, key, &b);
}

Status HashIndex::PostLookup(Access::Batch& batch, int64_t key, void* bucket) const {
  return batch.Read(Bucket(key), bucket, kBucketSize);
}

Result<GlobalAddress> HashIndex::FinishLookup(const Access& access, int64_t key,
                                              const void* bucket) const {
  struct Bucket b;
  std::memcpy(&b, bucket, sizeof(b));
  for (;;) {
    for (const auto& e : b.entries) {
      if (e.record != 0 && e.key == key) return GlobalAddress::FromRaw(e.record);
    }
    if (b.next == 0) return GlobalAddress();
    FARPOOL_RETURN_IF_ERROR(access.Read(GlobalAddress::FromRaw(b.next), &b, sizeof(b)));
  }
}

Status HashIndex::LockHead(const Access& access, LockOwner& owner, GlobalAddress head) const {
  const uint64_t mine = owner.lock_word();
  // A dead holder's lock is simply taken over: nothing it can have left needs repair (header,
  // "Invariants").
  const auto deadline = std::chrono::steady_clock::now() + wait_limit_;
  for (int spins = 0;; ++spins) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(head, 0, mine));
    if (prev == 0) return Status::Ok();
    if (prev == mine) {
      return Status::Internal("hash index: bucket " + head.ToString() +
                              " lock already held by this owner (" + HolderName(mine) + ")");
    }
    if (spins % 64 == 63) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, owner.HolderDead(prev));
      if (dead) {
        FARPOOL_ASSIGN_OR_RETURN(uint64_t p2, access.Cas(head, prev, mine));
        if (p2 == prev) return Status::Ok();
        continue;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return Status::Unavailable("hash index: bucket " + head.ToString() +
                                   " stayed locked for over " +
                                   std::to_string(wait_limit_.count()) + " ms by " +
                                   HolderName(prev) + ", which is not dead");
      }
    }
    std::this_thread::yield();
  }
}

Status HashIndex::ReleaseHead(const Access& access, LockOwner& owner, GlobalAddress head) const {
  const uint64_t mine = owner.lock_word();
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(head, mine, 0));
  if (prev != mine) {
    return Status::Unavailable("hash index: bucket " + head.ToString() + ": our lock (" +
                               HolderName(mine) +
                               ") was broken: this owner was fenced and stopped writing");
  }
  return Status::Ok();
}

Result<GlobalAddress> HashIndex::GetOrInsert(const Access& access, LockOwner& owner, int64_t key,
                                             GlobalAddress record) const {
  if (record.is_null()) return Status::InvalidArgument("hash index: null record address");
  const GlobalAddress head = Bucket(key);
  const uint64_t mine = owner.lock_word();
  FARPOOL_RETURN_IF_ERROR(LockHead(access, owner, head));
  owner.FaultPoint("hash.locked");
  auto release = [&]() { return ReleaseHead(access, owner, head); };
  // Every error below leaves the chain whole (nothing live is ever overwritten), so the lock
  // can always be released.
  auto fail = [&](Status s) -> Status {
    (void)release();
    return s;
  };

  GlobalAddress at = head;
  GlobalAddress free_slot;
  GlobalAddress last = head;
  while (!at.is_null()) {
    struct Bucket b;
    Status s = access.Read(at, &b, sizeof(b));
    if (!s.ok()) return fail(s);
    for (int i = 0; i < kEntries; ++i) {
      const auto& e = b.entries[i];
      if (e.record != 0 && e.key == key) {
        FARPOOL_RETURN_IF_ERROR(release());
        return GlobalAddress::FromRaw(e.record);
      }
      if (e.record == 0 && free_slot.is_null()) {
        free_slot = at + (16 + 16 * i);
      }
    }
    last = at;
    at = GlobalAddress::FromRaw(b.next);
  }
  Status s = owner.CheckLease();
  if (!s.ok()) return fail(s);
  if (free_slot.is_null()) {
    // A new overflow bucket holding the entry, written whole, then linked by one CAS.
    auto nb = AllocZeroed(access, kBucketSize, Placement::Striped());
    if (!nb.ok()) return fail(nb.status());
    struct Bucket fresh {};
    fresh.entries[0] = {key, record.raw()};
    s = access.Write(*nb, &fresh, sizeof(fresh));
    if (!s.ok()) return fail(s);
    owner.FaultPoint("hash.bucket-written");
    s = owner.CheckLease();
    if (!s.ok()) return fail(s);
    auto prev = access.Cas(last + 8, 0, nb->raw());
    if (!prev.ok()) return fail(prev.status());
    if (*prev != 0) {
      (void)access.Free(*nb);
      return fail(Status::Unavailable("hash index: bucket " + last.ToString() +
                                      " was extended by someone else under our lock (" +
                                      HolderName(mine) + "): this owner was fenced"));
    }
  } else {
    // Key first (the slot is free: readers skip it), then the record word by CAS, which makes
    // the entry live in one atomic step.
    s = access.Write(free_slot, &key, 8);
    if (!s.ok()) return fail(s);
    owner.FaultPoint("hash.key-written");
    s = owner.CheckLease();
    if (!s.ok()) return fail(s);
    auto prev = access.Cas(free_slot + 8, 0, record.raw());
    if (!prev.ok()) return fail(prev.status());
    if (*prev != 0) {
      return fail(Status::Unavailable("hash index: entry " + free_slot.ToString() +
                                      " was filled by someone else under our lock (" +
                                      HolderName(mine) + "): this owner was fenced"));
    }
  }
  owner.FaultPoint("hash.published");
  FARPOOL_RETURN_IF_ERROR(release());
  return record;
}

Status HashIndex::Remove(const Access& access, LockOwner& owner, int64_t key,
                         GlobalAddress record) const {
  const GlobalAddress head = Bucket(key);
  FARPOOL_RETURN_IF_ERROR(LockHead(access, owner, head));
  Status s = owner.CheckLease();
  for (GlobalAddress at = head; s.ok() && !at.is_null();) {
    struct Bucket b;
    s = access.Read(at, &b, sizeof(b));
    GlobalAddress next = s.ok() ? GlobalAddress::FromRaw(b.next) : GlobalAddress();
    for (int i = 0; s.ok() && i < kEntries; ++i) {
      if (b.entries[i].key == key && b.entries[i].record == record.raw()) {
        // The record word goes to 0 in one step: lookups see the entry whole or not at all,
        // and the slot is free for a later insert (key first, then the record word by CAS).
        auto prev = access.Cas(at + (16 + 16 * i + 8), record.raw(), 0);
        s = prev.status();
        next = GlobalAddress();
        break;
      }
    }
    at = next;
  }
  Status u = ReleaseHead(access, owner, head);
  return s.ok() ? u : s;
}

Status HashIndex::ForEach(
    const Access& access,
    const std::function<Status(int64_t key, GlobalAddress record)>& visit) const {
  std::vector<struct Bucket> all(count_);
  FARPOOL_RETURN_IF_ERROR(access.Read(buckets_, all.data(), count_ * kBucketSize));
  for (const auto& head : all) {
    struct Bucket b = head;
    for (;;) {
      for (const auto& e : b.entries) {
        if (e.record != 0) FARPOOL_RETURN_IF_ERROR(visit(e.key, GlobalAddress::FromRaw(e.record)));
      }
      if (b.next == 0) break;
      FARPOOL_RETURN_IF_ERROR(access.Read(GlobalAddress::FromRaw(b.next), &b, sizeof(b)));
    }
  }
  return Status::Ok();
}

}  // namespace farpool::db
