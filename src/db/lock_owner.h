// LockOwner: who takes locks in the pool (a session: slot + lease epoch) and how a lock left
// by a dead session is recognised. Implemented by the NAM engine's sessions; used by the
// indexes and the record code so they can break locks of dead compute processes.
#pragma once

#include <cstdint>

#include "farpool/status.h"

namespace farpool::db {

class LockOwner {
 public:
  virtual ~LockOwner() = default;
  // The word this owner writes into a lock it holds (layout.h LockWord).
  virtual uint64_t lock_word() const = 0;
  // `word` is a held lock seen in the pool. Returns true if its holder is dead and every
  // commit it had decided is finished (so the lock may be broken), false if it is alive (or
  // being recovered by someone else: come back later).
  virtual Result<bool> HolderDead(uint64_t word) = 0;
};

}  // namespace farpool::db
