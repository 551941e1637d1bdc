#include "db/index/hash_index.h"

#include <algorithm>
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

Result<GlobalAddress> HashIndex::Create(const Access& access, LockOwner& owner, uint64_t buckets,
                                        Placement placement) {
  if (buckets == 0) return Status::InvalidArgument("hash index: zero buckets");
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress a,
                           owner.AllocObject(access, buckets * kBucketSize, placement));
  Status zeroed = WriteZeros(access, a, buckets * kBucketSize);
  if (!zeroed.ok()) {
    (void)owner.FreeObject(access, a, buckets * kBucketSize);
    return zeroed;
  }
  return a;
}

Result<std::vector<GlobalAddress>> HashIndex::CreateStriped(const Access& access, LockOwner& owner,
                                                            uint64_t buckets,
                                                            std::span<const uint16_t> servers) {
  if (servers.empty()) return Status::InvalidArgument("hash index: no servers");
  std::vector<GlobalAddress> arrays;
  for (uint16_t server : servers) {
    auto a = Create(access, owner, buckets, Placement::OnServer(server));
    if (!a.ok()) {
      for (GlobalAddress made : arrays) (void)owner.FreeObject(access, made, buckets * kBucketSize);
      return a.status();
    }
    arrays.push_back(*a);
  }
  return arrays;
}

GlobalAddress HashIndex::Bucket(int64_t key) const {
  const uint64_t h = Mix64(static_cast<uint64_t>(key) ^ seed_);
  const uint64_t n = arrays_.size();
  return arrays_[h % n] + ((h / n) % count_) * kBucketSize;
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

namespace {
constexpr LookupSpec kSpec{HashIndex::kBucketSize, 16, HashIndex::kEntries, 8};
}  // namespace

Status HashIndex::PostLookupRead(Access::Batch& batch, int64_t key, void* record,
                                 uint32_t record_size, LookupResult* result) const {
  return batch.LookupRead(Bucket(key), kSpec, static_cast<uint64_t>(key), record, record_size,
                          result);
}

Status HashIndex::PostLookupLockRead(Access::Batch& batch, int64_t key, uint32_t lock_offset,
                                     uint64_t held_mask, uint64_t lock_word, void* record,
                                     uint32_t record_size, LockReadResult* result) const {
  return batch.LookupLockRead(Bucket(key), kSpec, static_cast<uint64_t>(key), lock_offset,
                              held_mask, lock_word, record, record_size, result);
}

Result<GlobalAddress> HashIndex::FinishLookupRead(const Access& access, int64_t key,
                                                  const LookupResult& result,
                                                  bool* record_read) const {
  *record_read = false;
  switch (result.outcome) {
    case LookupResult::Outcome::kAbsent:
      return GlobalAddress();
    case LookupResult::Outcome::kFound:
      *record_read = true;
      return result.value;
    case LookupResult::Outcome::kFoundNotRead:
      return result.value;
    case LookupResult::Outcome::kContinue: {
      struct Bucket b;
      FARPOOL_RETURN_IF_ERROR(access.Read(result.value, &b, sizeof(b)));
      return FinishLookup(access, key, &b);
    }
  }
  return Status::Internal("hash index: unknown lookup outcome");
}

Status HashIndex::PostInsert(Access::Batch& batch, const LockOwner& owner, int64_t key,
                             GlobalAddress record, InsertResult* result) const {
  if (record.is_null()) return Status::InvalidArgument("hash index: null record address");
  return batch.InsertIfAbsent(Bucket(key), kSpec, /*lock_offset=*/0, owner.lock_word(),
                              static_cast<uint64_t>(key), record.raw(), result);
}

Result<GlobalAddress> HashIndex::FinishInsert(int64_t key, const InsertResult& result) const {
  switch (result.outcome) {
    case InsertResult::Outcome::kInserted:
    case InsertResult::Outcome::kFound:
      return GlobalAddress::FromRaw(result.value);
    case InsertResult::Outcome::kBusy:
    case InsertResult::Outcome::kNotDone:
      return GlobalAddress();
    case InsertResult::Outcome::kLockBroken:
      return Status::Unavailable("hash index: bucket " + Bucket(key).ToString() + " of key " +
                                 std::to_string(key) + ": our lock (" + HolderName(result.value) +
                                 " found) was broken: this owner was fenced");
  }
  return Status::Internal("hash index: unknown insert outcome");
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
  FARPOOL_RETURN_IF_ERROR(LockHead(access, owner, head));
  owner.FaultPoint("hash.locked");
  // Every error of InsertLocked leaves the chain whole (nothing live is ever overwritten), so
  // the lock can always be released.
  auto got = InsertLocked(access, owner, head, key, record);
  const Status released = ReleaseHead(access, owner, head);
  if (!got.ok()) return got.status();
  FARPOOL_RETURN_IF_ERROR(released);
  return got;
}

Result<GlobalAddress> HashIndex::InsertLocked(const Access& access, LockOwner& owner,
                                              GlobalAddress head, int64_t key,
                                              GlobalAddress record) const {
  const uint64_t mine = owner.lock_word();
  GlobalAddress at = head;
  GlobalAddress free_slot;
  GlobalAddress last = head;
  while (!at.is_null()) {
    struct Bucket b;
    FARPOOL_RETURN_IF_ERROR(access.Read(at, &b, sizeof(b)));
    for (int i = 0; i < kEntries; ++i) {
      const auto& e = b.entries[i];
      if (e.record != 0 && e.key == key) return GlobalAddress::FromRaw(e.record);
      if (e.record == 0 && free_slot.is_null()) {
        free_slot = at + (16 + 16 * i);
      }
    }
    last = at;
    at = GlobalAddress::FromRaw(b.next);
  }
  FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
  if (free_slot.is_null()) {
    // A new overflow bucket holding the entry, written whole, then linked by one CAS.
    // On the head's server: a near-memory lookup-read follows the chain while it stays there.
    FARPOOL_ASSIGN_OR_RETURN(
        GlobalAddress nb,
        owner.AllocObject(access, kBucketSize, Placement::OnServer(head.server())));
    struct Bucket fresh {};
    fresh.entries[0] = {key, record.raw()};
    FARPOOL_RETURN_IF_ERROR(access.Write(nb, &fresh, sizeof(fresh)));
    owner.FaultPoint("hash.bucket-written");
    FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(last + 8, 0, nb.raw()));
    if (prev != 0) {
      (void)owner.FreeObject(access, nb, kBucketSize);
      return Status::Unavailable("hash index: bucket " + last.ToString() +
                                 " was extended by someone else under our lock (" +
                                 HolderName(mine) + "): this owner was fenced");
    }
  } else {
    // Key first (the slot is free: readers skip it), then the record word by CAS, which makes
    // the entry live in one atomic step.
    FARPOOL_RETURN_IF_ERROR(access.Write(free_slot, &key, 8));
    owner.FaultPoint("hash.key-written");
    FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(free_slot + 8, 0, record.raw()));
    if (prev != 0) {
      return Status::Unavailable("hash index: entry " + free_slot.ToString() +
                                 " was filled by someone else under our lock (" + HolderName(mine) +
                                 "): this owner was fenced");
    }
  }
  owner.FaultPoint("hash.published");
  return record;
}

Status HashIndex::GetOrInsertMany(const Access& access, LockOwner& owner,
                                  std::span<Insert> inserts) {
  const uint64_t mine = owner.lock_word();
  struct Head {
    const HashIndex* index;
    GlobalAddress at;
    std::vector<size_t> keys;  // indexes into `inserts`
    uint64_t prev = 1;         // the lock word our CAS found (0: we hold it)
    struct Bucket image;
    bool one_by_one = false;  // a key needs a new overflow bucket: InsertLocked for each
  };
  std::vector<Head> heads;
  for (size_t i = 0; i < inserts.size(); ++i) {
    if (inserts[i].record.is_null()) {
      return Status::InvalidArgument("hash index: null record address");
    }
    const GlobalAddress at = inserts[i].index->Bucket(inserts[i].key);
    auto h = std::find_if(heads.begin(), heads.end(), [&](const Head& x) { return x.at == at; });
    if (h == heads.end()) {
      h = heads.emplace(heads.end());
      h->index = inserts[i].index;
      h->at = at;
    }
    h->keys.push_back(i);
  }
  // Releases every head we hold; Unavailable if a lock was broken (we were fenced).
  auto release = [&]() -> Status {
    std::vector<uint64_t> was(heads.size(), mine);
    Access::Batch b(access);
    for (size_t j = 0; j < heads.size(); ++j) {
      if (heads[j].prev == 0) FARPOOL_RETURN_IF_ERROR(b.Cas(heads[j].at, mine, 0, &was[j]));
    }
    FARPOOL_RETURN_IF_ERROR(b.Wait());
    for (size_t j = 0; j < heads.size(); ++j) {
      if (was[j] != mine) {
        return Status::Unavailable("hash index: bucket " + heads[j].at.ToString() + ": our lock (" +
                                   HolderName(mine) +
                                   ") was broken: this owner was fenced and stopped writing");
      }
    }
    return Status::Ok();
  };
  // Round 1: every head locked and read. The read may come before our CAS (a batch's
  // operations are unordered): a copy that does not show our lock is read again below.
  {
    Access::Batch b(access);
    Status posted;
    for (Head& h : heads) {
      if (posted.ok()) posted = b.Cas(h.at, 0, mine, &h.prev);
      if (posted.ok()) posted = b.Read(h.at, &h.image, sizeof(h.image));
    }
    const Status waited = b.Wait();
    if (!posted.ok() || !waited.ok()) {
      // Any CAS may have landed: give back whatever we may hold (a CAS from our own word).
      for (Head& h : heads) (void)access.Cas(h.at, mine, 0);
      return !posted.ok() ? posted : waited;
    }
  }
  for (const Head& h : heads) {
    if (h.prev == mine) {
      for (Head& x : heads) x.prev = x.prev == 0 ? 0 : 1;
      (void)release();
      return Status::Internal("hash index: bucket " + h.at.ToString() +
                              " lock already held by this owner (" + HolderName(mine) + ")");
    }
  }
  if (!std::all_of(heads.begin(), heads.end(), [](const Head& h) { return h.prev == 0; })) {
    FARPOOL_RETURN_IF_ERROR(release());
    for (Insert& in : inserts) {
      FARPOOL_ASSIGN_OR_RETURN(in.record, in.index->GetOrInsert(access, owner, in.key, in.record));
    }
    return Status::Ok();
  }
  owner.FaultPoint("hash.locked");
  // Under the locks. Every error leaves the chains whole, so the locks can always be released.
  auto locked = [&]() -> Status {
    struct Slot {
      size_t key;
      GlobalAddress at;
      uint64_t prev = 0;
    };
    std::vector<Slot> slots;
    for (Head& h : heads) {
      if (h.image.lock != mine) FARPOOL_RETURN_IF_ERROR(access.Read(h.at, &h.image, kBucketSize));
      std::vector<std::pair<GlobalAddress, struct Bucket>> chain{{h.at, h.image}};
      while (chain.back().second.next != 0) {
        const GlobalAddress next = GlobalAddress::FromRaw(chain.back().second.next);
        struct Bucket b;
        FARPOOL_RETURN_IF_ERROR(access.Read(next, &b, sizeof(b)));
        chain.push_back({next, b});
      }
      std::vector<GlobalAddress> free;
      for (const auto& [at, b] : chain) {
        for (int e = 0; e < kEntries; ++e) {
          if (b.entries[e].record == 0) free.push_back(at + (16 + 16 * e));
        }
      }
      std::vector<Slot> mine_here;
      for (size_t i : h.keys) {
        uint64_t found = 0;
        for (const auto& [at, b] : chain) {
          for (const auto& e : b.entries) {
            if (e.record != 0 && e.key == inserts[i].key) found = e.record;
          }
        }
        if (found != 0) {
          inserts[i].record = GlobalAddress::FromRaw(found);
        } else if (mine_here.size() < free.size()) {
          mine_here.push_back({i, free[mine_here.size()]});
        } else {
          h.one_by_one = true;
        }
      }
      if (!h.one_by_one) slots.insert(slots.end(), mine_here.begin(), mine_here.end());
    }
    FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
    if (!slots.empty()) {
      // Keys first (the slots are free: readers skip them), then the record words by CAS.
      Access::Batch keys_batch(access);
      for (const Slot& x : slots) {
        FARPOOL_RETURN_IF_ERROR(keys_batch.Write(x.at, &inserts[x.key].key, 8));
      }
      FARPOOL_RETURN_IF_ERROR(keys_batch.Wait());
      owner.FaultPoint("hash.key-written");
      FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
      Access::Batch live(access);
      for (Slot& x : slots) {
        FARPOOL_RETURN_IF_ERROR(live.Cas(x.at + 8, 0, inserts[x.key].record.raw(), &x.prev));
      }
      FARPOOL_RETURN_IF_ERROR(live.Wait());
      for (const Slot& x : slots) {
        if (x.prev != 0) {
          return Status::Unavailable("hash index: entry " + x.at.ToString() +
                                     " was filled by someone else under our lock (" +
                                     HolderName(mine) + "): this owner was fenced");
        }
      }
      owner.FaultPoint("hash.published");
    }
    for (const Head& h : heads) {
      if (!h.one_by_one) continue;
      for (size_t i : h.keys) {
        Insert& in = inserts[i];
        FARPOOL_ASSIGN_OR_RETURN(in.record,
                                 h.index->InsertLocked(access, owner, h.at, in.key, in.record));
      }
    }
    return Status::Ok();
  };
  const Status s = locked();
  const Status r = release();
  return s.ok() ? r : s;
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

// Calls `visit` for every bucket of every chain (each array's heads read in one go), with the
// overflow bucket's address (null for a head).
static Status WalkBuckets(
    const Access& access, std::span<const GlobalAddress> arrays, uint64_t count,
    const std::function<Status(GlobalAddress overflow, const struct Bucket& b)>& visit) {
  std::vector<struct Bucket> heads(count);
  for (GlobalAddress array : arrays) {
    FARPOOL_RETURN_IF_ERROR(access.Read(array, heads.data(), count * HashIndex::kBucketSize));
    for (const auto& head : heads) {
      FARPOOL_RETURN_IF_ERROR(visit(GlobalAddress(), head));
      for (uint64_t next = head.next; next != 0;) {
        struct Bucket b;
        FARPOOL_RETURN_IF_ERROR(access.Read(GlobalAddress::FromRaw(next), &b, sizeof(b)));
        FARPOOL_RETURN_IF_ERROR(visit(GlobalAddress::FromRaw(next), b));
        next = b.next;
      }
    }
  }
  return Status::Ok();
}

Status HashIndex::ForEach(
    const Access& access,
    const std::function<Status(int64_t key, GlobalAddress record)>& visit) const {
  return WalkBuckets(access, arrays_, count_, [&](GlobalAddress, const struct Bucket& b) {
    for (const auto& e : b.entries) {
      if (e.record != 0) FARPOOL_RETURN_IF_ERROR(visit(e.key, GlobalAddress::FromRaw(e.record)));
    }
    return Status::Ok();
  });
}

Status HashIndex::Destroy(const Access& access, LockOwner& owner) const {
  std::vector<GlobalAddress> overflow;
  FARPOOL_RETURN_IF_ERROR(
      WalkBuckets(access, arrays_, count_, [&](GlobalAddress at, const struct Bucket&) {
        if (!at.is_null()) overflow.push_back(at);
        return Status::Ok();
      }));
  for (GlobalAddress b : overflow)
    FARPOOL_RETURN_IF_ERROR(owner.FreeObject(access, b, kBucketSize));
  for (GlobalAddress array : arrays_)
    FARPOOL_RETURN_IF_ERROR(owner.FreeObject(access, array, count_ * kBucketSize));
  return Status::Ok();
}

}  // namespace farpool::db
