// Test-only switches of a Database (DatabaseOptions::testing, null in production): the
// fault-injection sites the crash and fencing tests stop or kill a process at (as
// FoundationDB's workloads do), and a switch that breaks the protocol on purpose so the SI
// checker can be shown to catch it.
//
// Thread-safety: immutable once passed to Database::Open; commit_hook is called from every
// thread that commits.
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include "farpool/db.h"

namespace farpool::db {

struct TestingHooks {
  // Called inside Commit at "locked" (write set locked), "trimming" (kPool/kLocal: a hot
  // record's version chain is about to be cut, the lease just checked), "logged" (decision
  // written), "installing" (after each new version is posted), "installed" and "published"
  // (timestamp published, locks not yet released). kSharded: "locked" (every participant
  // prepared) and "decided" (partition 0 committed and installed; the other participants not
  // told yet). kPool and kLocal also call it inside index writes ("btree.*" and "hash.*" sites,
  // named in src/db/index/) and before each record of a dropped table is reclaimed
  // ("gc.table-record"), and in a locking read between its copies and its lock round
  // ("locking-read.copied"), and in a bulk load (bulk_load.cc) after each flush of rows
  // ("bulk.flushed"), after the B+tree's build ("bulk.built") and inside the publication,
  // between the claim of the table and the state write that makes it live ("bulk.publish"),
  // and in the maintenance pass between its read of every session slot and its judgment of
  // them ("slots.read": the maintenance thread's passes and CollectGarbage's), and right after a
  // session slot is claimed, before the session is set up ("session.claimed"), and on the
  // lease renewal thread right before its first memory operation, which connects it to the
  // memory servers ("renewals.connect"), and in every lease renewal between the time it counts
  // as sent and its CAS ("renewal.sent": a stall there is a renewal the memory is slow to
  // take), and in a snapshot's announcement from idle right before its write, the session's
  // announcement mutex held ("snapshot.announcing": a stall there is a write a failover holds
  // up), and right before the write that marks an idle session idle ("idle.marking"), and in
  // the allocator's opening of a slab chunk right
  // before the CAS that opens its directory word ("recycler.opening") and when that CAS failed,
  // before the word is read again to learn whether it landed ("recycler.open-failed").
  // Tests kill or stop the process there, or commit from another
  // session to make a race happen.
  std::function<void(std::string_view point)> commit_hook;
  // Commit skips first-committer-wins validation (locks without checking the version read),
  // so the SI checker can show it finds lost updates. kPool and kLocal only.
  bool skip_validation = false;
};

// Calls options.testing->commit_hook(point) if there is one.
inline void TestingHook(const DatabaseOptions& options, std::string_view point) {
  if (options.testing && options.testing->commit_hook) options.testing->commit_hook(point);
}
// Whether options.testing asks Commit to skip validation.
inline bool TestingSkipValidation(const DatabaseOptions& options) {
  return options.testing && options.testing->skip_validation;
}

}  // namespace farpool::db
