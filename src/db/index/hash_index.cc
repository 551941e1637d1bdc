#include "db/index/hash_index.h"

#include <cstring>
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

Result<GlobalAddress> ZeroedObject(const Access& access, uint64_t size, Placement p) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress a, access.Alloc(size, p));
  std::vector<unsigned char> zeros(std::min<uint64_t>(size, 1 << 20), 0);
  for (uint64_t off = 0; off < size; off += zeros.size()) {
    FARPOOL_RETURN_IF_ERROR(
        access.Write(a + off, zeros.data(), std::min<uint64_t>(zeros.size(), size - off)));
  }
  return a;
}

}  // namespace

Result<GlobalAddress> HashIndex::Create(const Access& access, uint64_t buckets) {
  if (buckets == 0) return Status::InvalidArgument("hash index: zero buckets");
  return ZeroedObject(access, buckets * kBucketSize, Placement::Striped());
}

GlobalAddress HashIndex::Bucket(int64_t key) const {
  uint64_t h = Mix64(static_cast<uint64_t>(key) ^ seed_);
  return buckets_ + (h % count_) * kBucketSize;
}

Result<GlobalAddress> HashIndex::Lookup(const Access& access, int64_t key) const {
  GlobalAddress at = Bucket(key);
  for (int hops = 0; !at.is_null(); ++hops) {
    struct Bucket b;
    FARPOOL_RETURN_IF_ERROR(access.Read(at, &b, sizeof(b)));
    for (const auto& e : b.entries) {
      if (e.record != 0 && e.key == key) return GlobalAddress::FromRaw(e.record);
    }
    at = GlobalAddress::FromRaw(b.next);
  }
  return GlobalAddress();
}

Result<GlobalAddress> HashIndex::GetOrInsert(const Access& access, LockOwner& owner, int64_t key,
                                             GlobalAddress record) const {
  const GlobalAddress head = Bucket(key);
  const uint64_t mine = owner.lock_word();
  // Lock the head bucket (it guards its whole chain).
  for (int spins = 0;; ++spins) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(head, 0, mine));
    if (prev == 0) break;
    if (prev == mine)
      return Status::Internal("hash index: bucket lock already held by this session");
    if ((spins & 63) == 63) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, owner.HolderDead(prev));
      if (dead) {
        FARPOOL_ASSIGN_OR_RETURN(uint64_t p2, access.Cas(head, prev, mine));
        if (p2 == prev) break;
      }
    }
    std::this_thread::yield();
  }
  auto unlock = [&]() { return access.Write(head, "\0\0\0\0\0\0\0\0", 8); };

  GlobalAddress at = head;
  GlobalAddress free_slot;
  GlobalAddress last = head;
  while (!at.is_null()) {
    struct Bucket b;
    Status s = access.Read(at, &b, sizeof(b));
    if (!s.ok()) {
      (void)unlock();
      return s;
    }
    for (int i = 0; i < kEntries; ++i) {
      const auto& e = b.entries[i];
      if (e.record != 0 && e.key == key) {
        FARPOOL_RETURN_IF_ERROR(unlock());
        return GlobalAddress::FromRaw(e.record);
      }
      if (e.record == 0 && free_slot.is_null()) {
        free_slot = at + (16 + 16 * i);
      }
    }
    last = at;
    at = GlobalAddress::FromRaw(b.next);
  }
  Status s;
  if (free_slot.is_null()) {
    // Chain a new overflow bucket holding the entry; link it last so readers see it whole.
    auto nb = ZeroedObject(access, kBucketSize, Placement::Striped());
    if (!nb.ok()) {
      (void)unlock();
      return nb.status();
    }
    struct Bucket fresh {};
    fresh.entries[0] = {key, record.raw()};
    s = access.Write(*nb, &fresh, sizeof(fresh));
    if (s.ok()) {
      uint64_t raw = nb->raw();
      s = access.Write(last + 8, &raw, 8);
    }
  } else {
    // Key first, then the address that makes the entry live (a crash between leaves a free
    // entry, never an entry naming the wrong key).
    s = access.Write(free_slot, &key, 8);
    uint64_t raw = record.raw();
    if (s.ok()) s = access.Write(free_slot + 8, &raw, 8);
  }
  Status u = unlock();
  if (!s.ok()) return s;
  if (!u.ok()) return u;
  return record;
}

Status HashIndex::Remove(const Access& access, LockOwner& owner, int64_t key,
                         GlobalAddress record) const {
  const GlobalAddress head = Bucket(key);
  const uint64_t mine = owner.lock_word();
  for (int spins = 0;; ++spins) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(head, 0, mine));
    if (prev == 0) break;
    if ((spins & 63) == 63) {
      FARPOOL_ASSIGN_OR_RETURN(bool dead, owner.HolderDead(prev));
      if (dead) {
        FARPOOL_ASSIGN_OR_RETURN(uint64_t p2, access.Cas(head, prev, mine));
        if (p2 == prev) break;
      }
    }
    std::this_thread::yield();
  }
  Status s;
  for (GlobalAddress at = head; !at.is_null() && s.ok();) {
    struct Bucket b;
    s = access.Read(at, &b, sizeof(b));
    if (!s.ok()) break;
    for (int i = 0; i < kEntries; ++i) {
      if (b.entries[i].key == key && b.entries[i].record == record.raw()) {
        const uint64_t zero = 0;
        s = access.Write(at + (16 + 16 * i + 8), &zero, 8);
        at = GlobalAddress();
        break;
      }
    }
    if (!at.is_null()) at = GlobalAddress::FromRaw(b.next);
  }
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(head, mine, 0));
  if (prev != mine)
    FARPOOL_RETURN_IF_ERROR(Status::Unavailable("hash index: bucket lock taken over"));
  return s;
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
