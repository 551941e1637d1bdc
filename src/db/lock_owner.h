// LockOwner: who takes locks in the pool (a session: slot + lease epoch), how a lock left by a
// dead session is recognised, how a holder proves it may still write, and where the memory of
// index structures comes from. Implemented by the NAM engine's sessions; used by the indexes
// and the record code.
//
// Fencing rules every user follows (docs/database.md, "Leases and fencing"):
//   - Take a lock by CAS from its unlocked value to lock_word().
//   - Before writing anything under a lock, call CheckLease(): a non-OK result means the
//     owner may have been fenced; stop and write nothing more.
//   - Release by CAS from lock_word() to the unlocked value, never by a plain write. A failed
//     release CAS means the lock was broken (the owner was fenced): report Unavailable.
//   - A loop that waits for a lock calls HolderDead() on the word it sees (not on every
//     iteration: it costs a read) and gives up with a clear error after a bounded time.
#pragma once

#include <cstdint>
#include <string_view>

#include "db/memory.h"
#include "farpool/address.h"
#include "farpool/status.h"

namespace farpool::db {

class LockOwner {
 public:
  virtual ~LockOwner() = default;
  // The word this owner writes into a lock it holds (layout.h LockWord).
  virtual uint64_t lock_word() const = 0;
  // `word` is a held lock seen in the pool. Returns true if its holder is dead, was fenced and
  // every commit it had decided is finished (so the lock may be broken), false if it is alive
  // or being recovered by someone else (come back later). A holder is judged dead only after
  // its lease word was seen unchanged for lease + margin on this process's monotonic clock.
  virtual Result<bool> HolderDead(uint64_t word) = 0;
  // OK while this owner's lease is certainly valid (renewed less than lease - margin ago, or
  // renewed now by this call); Unavailable once it may have been fenced.
  virtual Status CheckLease() = 0;
  // The index redo area of this owner (kIndexLogBytes bytes in the pool), and of the holder
  // of `word` (for whoever breaks a dead holder's index lock). Null if the owner has none.
  virtual GlobalAddress index_log() const = 0;
  virtual Result<GlobalAddress> IndexLogOf(uint64_t word) = 0;
  // This owner holds a lock it could not release (a release failed on a transport error, not
  // by fencing): it stops renewing its lease, so that others judge it dead and break its locks
  // instead of waiting on a live holder forever. No-op by default.
  virtual void Abandon() {}
  // Testing only: a fault-injection site (TestingHooks::commit_hook, db/testing_hooks.h). No-op by
  // default.
  virtual void FaultPoint(std::string_view /*point*/) {}

  // Memory for index structures (hash bucket arrays and overflow buckets, B+tree nodes),
  // uninitialised. By default the memory's own allocator, whose objects only the allocating
  // process may free; the NAM sessions use the database's recycler instead, so that whichever
  // process reclaims a dropped table frees its index too.
  // `placement` as for Memory::Alloc (a hash index keeps a chain on its head's server).
  virtual Result<GlobalAddress> AllocObject(const Access& access, uint64_t size,
                                            Placement placement) {
    return access.Alloc(size, placement);
  }
  // REQUIRES: `address` came from AllocObject(size) of an owner of the same kind (the same
  // process, for the default), and nothing can reach it any more.
  virtual Status FreeObject(const Access& access, GlobalAddress address, uint64_t /*size*/) {
    return access.Free(address);
  }

  static constexpr uint64_t kIndexLogBytes = 4096;
};

}  // namespace farpool::db
