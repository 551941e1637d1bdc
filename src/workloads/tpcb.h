// The TPC-B-like workload (`farpool bench txn --workload tpcb`): pgbench's schema and
// transaction on any engine of include/farpool/db.h.
//
// Schema at scale factor S (hash tables keyed by int64, filler widths as in pgbench):
//   pgbench_branches  bid 0..S-1           bbalance, filler char(88)
//   pgbench_tellers   tid 0..10·S-1        bid (= tid / 10), tbalance, filler char(84)
//   pgbench_accounts  aid 0..100000·S-1    bid (= aid / 100000), abalance, filler char(84)
//   pgbench_history   caller's keys        tid, bid, aid, delta, mtime, filler char(22)
// every balance loaded as 0.
// Transaction (TpcbTransaction): read one account, a teller and its branch (one MultiGet, or
// with `lock_at_read` one MultiGetForUpdate: the three rows locked as they are read, as
// pgbench's UPDATEs lock them), add `delta` to the three balances (the account's new balance
// is what pgbench's SELECT reads back), insert a history row (Put before the reads: its values
// do not depend on them) and optionally delete an older one (for soaks in a fixed pool).
// Invariant (VerifyTpcb): sum(accounts) == sum(tellers) == sum(branches).
//
// Thread-safety: stateless; use one Session per thread.
#pragma once

#include <cstdint>

#include "farpool/db.h"
#include "farpool/status.h"

namespace farpool::workloads {

struct TpcbTables {
  const Table* accounts = nullptr;
  const Table* branches = nullptr;
  const Table* tellers = nullptr;
  const Table* history = nullptr;
};

// Rows per scale factor.
inline constexpr uint64_t kTpcbTellersPerBranch = 10;
inline constexpr uint64_t kTpcbAccountsPerBranch = 100000;

// Creates the four tables with scale factor `scale`'s rows (bulk loaders: AlreadyExists if one
// exists; the history table is created empty).
Result<TpcbTables> LoadTpcb(Database& db, int scale);
// The tables of a loaded database.
Result<TpcbTables> OpenTpcb(Database& db);

struct TpcbTxn {
  int64_t aid = 0, tid = 0, bid = 0;  // bid: the teller's branch (tid / 10)
  int64_t delta = 0;
  int64_t history_key = 0;        // unique per transaction
  int64_t drop_history_key = -1;  // a history row to delete, or -1
  // The row to delete may be absent: the transaction that was to insert it ended Unavailable
  // (cut by a failover: not committed, or settled later by recovery either way). Its absence
  // is then no error.
  bool drop_may_be_absent = false;
  int64_t mtime_ms = 0;  // stored in the history row
  // Read the account, teller and branch for update (Transaction::MultiGetForUpdate): under
  // read committed (what pgbench runs) a hot branch row is then updated by one transaction
  // after another instead of aborting all but one of those that overlap.
  bool lock_at_read = false;
  // With lock_at_read: the intent of the locks (LockIntent::kUpdate: the three rows are
  // written, so their locks are a committing writer's from the start and the commit needs no
  // lock round; the history row is inserted in the locking read's round trip).
  LockIntent intent = LockIntent::kUpdate;
};

// pgbench's transaction inside `txn`.
Status TpcbTransaction(Transaction& txn, const TpcbTables& t, const TpcbTxn& p);

// Checks the invariant for scale factor `scale` in one transaction of `session`; Internal with
// the three sums if broken.
Status VerifyTpcb(Session& session, const TpcbTables& t, int scale);

}  // namespace farpool::workloads
