// FileLock: SQLite's five lock levels on a file's lock word in the pool (FileHeader::lock),
// changed only with CAS, so processes on any host share a database: many readers or one
// writer.
//
// The word (each process is named by its lease slot s, lease.h):
//   bits 0..55   SHARED: bit s set while slot s holds at least SHARED
//   bits 56..61  the writer: s + 1 while slot s holds RESERVED, PENDING or EXCLUSIVE; 0 if none
//   bit 62       PENDING: the writer waits for readers to leave; no new SHARED is granted
//   bit 63       EXCLUSIVE: the writer is alone (no other SHARED bit)
//
// How it works: every Lock/Unlock computes the new word from the last value this handle saw
// and CASes, retrying from the value the CAS returns on a lost race: one round trip when the
// word did not change since (one process, or readers that come and go rarely), two otherwise,
// as reading it first would always cost. SHARED whose CAS lost to a change takes its bit with a
// fetch-and-add instead (exact: the bit is ours and was clear in the word the CAS returned), so
// readers that keep changing the word cost each other at most one round trip, not a CAS per
// change; a writer's PENDING found by that add is answered by subtracting the bit again.
// A request that conflicts with a holder asks the lease
// table whether the holder is dead; if so it sweeps the holder's slot (its bits leave every lock
// word, lease.h) and retries, else it returns Aborted (SQLITE_BUSY: SQLite's busy handler sleeps
// and calls again, so a dead holder's lock is broken after lease + margin of retries).
// Lock(kExclusive) that finds other readers keeps PENDING (level() becomes kPending) and returns
// Aborted, as SQLite expects. One difference from the unix VFS: PENDING and RESERVED are one writer
// field, so a process going from SHARED to EXCLUSIVE (hot-journal recovery) is busy while another
// holds RESERVED; SQLite only recovers when no RESERVED is held anyway.
//
// Every Lock first checks this process's own lease (LeaseTable::Check): a process that lost
// it gets IoError and must reopen.
//
// The release of SHARED (Unlock(kNone) from kShared, the end of every read transaction) is not
// waited for: a fetch-and-add that subtracts this process's bit, posted (Batch::Post). It is
// exact whatever else changed in the word (only we set or clear the bit while our lease
// lives; a sweeper clears it only after the servers evicted us, so a release still in flight
// then never lands). Its effect is ordered before the posting thread's next operation on the
// word's server; another thread's next Lock or Unlock first waits until it landed (our bit
// clear); errors surface there (the connection or server failed) or are harmless (an error
// reply: we were evicted). A lost release (its server failed, or was being drained and refused
// it unexecuted) leaves our bit set: our next Lock(kShared) finds it set and keeps it, our next
// release clears it; a writer meanwhile sees a live reader (SQLITE_BUSY), and a crash or the
// end of our lease reclaims it as any reader's.
//
// Thread-safety: one FileLock per open file, used by one thread at a time (several threads in
// turn, e.g. under the VFS's mutex).
// REQUIRES: the lease table outlives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "files/file_store.h"
#include "files/lease.h"

namespace farpool::files {

enum class LockLevel : int { kNone = 0, kShared, kReserved, kPending, kExclusive };

class FileLock {
 public:
  FileLock(Pool& pool, GlobalAddress word, LeaseTable& leases)
      : pool_(pool), word_(word), leases_(leases) {}

  // Raises the lock to `level` (kShared, kReserved or kExclusive). Aborted when another live
  // process holds a conflicting lock (the message names its slot).
  // `with`, if given, posts reads into the batch of the CAS that takes the lock, after a
  // fence: those to the lock word's server happen after the CAS (its file's header, SQLite's
  // first look at a database: one round trip for the lock and the refresh). It is posted again
  // with every retry, so when Lock returns OK, what it read was read with the CAS that won.
  // REQUIRES: level > level(); kReserved only from kShared.
  Status Lock(LockLevel level, const std::function<Status(Batch&)>& with = {});
  // Lowers the lock to kShared or kNone; from kShared to kNone without waiting (posted, above).
  Status Unlock(LockLevel level);
  // Whether another live process holds RESERVED or more (a dead one is swept first).
  Result<bool> ReservedElsewhere();
  // Waits until a posted release of SHARED has landed (reads the word until our bit is clear;
  // nothing to do when none is in flight). REQUIRES: called before this process's lease slot
  // can be freed: a release landing after another process took the slot would clear that
  // process's bit. TimedOut after kDrainPatience.
  Status Drain();
  LockLevel level() const { return level_; }
  GlobalAddress word() const { return word_; }

  // Whether `word` (a value of this lock's word) shows another process holding RESERVED or
  // more: it will want EXCLUSIVE, so a reader that keeps its SHARED bit between transactions
  // gives it up (the VFS, docs/files.md "Read transactions without a round trip").
  bool WriterElsewhere(uint64_t word) const;
  // For a writer holding PENDING (level() == kPending): reads the word until no other process
  // holds SHARED, for up to `patience`. OK then (Lock(kExclusive) may succeed), Aborted if
  // readers remain. Readers that keep SHARED between transactions leave within their watch
  // interval, so a writer without a busy handler is not refused because of them.
  Status AwaitReaders(std::chrono::microseconds patience);

  static constexpr std::chrono::seconds kDrainPatience{5};

 private:
  // Before any change of the word: a release this thread posted is ordered ahead already;
  // another thread's is drained.
  Status Settle();
  // Resolves a conflict with `slot`: sweeps it and returns OK if it is dead, else Aborted.
  Status Conflict(int slot, const char* what);
  // Reads the word into *w and seen_.
  Status ReadWord(uint64_t* w);
  // CASes the word from `expected` to `desired` with `with` posted after it; returns the
  // word found (== expected: swapped) and sets seen_.
  Result<uint64_t> Swap(uint64_t expected, uint64_t desired,
                        const std::function<Status(Batch&)>& with);
  // Adds `delta` to the word with `with` posted after it; returns the word before and sets
  // seen_ to the word after.
  Result<uint64_t> Add(uint64_t delta, const std::function<Status(Batch&)>& with);

  Pool& pool_;
  const GlobalAddress word_;
  LeaseTable& leases_;
  LockLevel level_ = LockLevel::kNone;
  uint64_t seen_ = 0;  // the word as this handle last read or wrote it
  // The thread (its token, file_lock.cc) that posted a release of SHARED not known to have
  // landed; 0: no such release.
  uint64_t posted_by_ = 0;
};

// Removes lease slot `slot`'s bits from the lock word of every file in the store (the sweep of
// lease.h).
Status ClearSlot(FileStore& store, int slot);

}  // namespace farpool::files
