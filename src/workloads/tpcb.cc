#include "workloads/tpcb.h"

#include <string>
#include <vector>

#include "workloads/txn_helpers.h"

namespace farpool::workloads {
namespace {

// pgbench's tables (filler widths as in pgbench).
const Schema& BranchSchema() {
  static const Schema s{{"bbalance", ColumnType::kInt64}, {"filler", ColumnType::kChar, 88}};
  return s;
}
const Schema& TellerSchema() {
  static const Schema s{{"bid", ColumnType::kInt64},
                        {"tbalance", ColumnType::kInt64},
                        {"filler", ColumnType::kChar, 84}};
  return s;
}
const Schema& AccountSchema() {
  static const Schema s{{"bid", ColumnType::kInt64},
                        {"abalance", ColumnType::kInt64},
                        {"filler", ColumnType::kChar, 84}};
  return s;
}
const Schema& HistorySchema() {
  static const Schema s{{"tid", ColumnType::kInt64},   {"bid", ColumnType::kInt64},
                        {"aid", ColumnType::kInt64},   {"delta", ColumnType::kInt64},
                        {"mtime", ColumnType::kInt64}, {"filler", ColumnType::kChar, 22}};
  return s;
}

}  // namespace

Result<TpcbTables> LoadTpcb(Database& db, int scale) {
  const uint64_t nb = scale, nt = kTpcbTellersPerBranch * scale,
                 na = kTpcbAccountsPerBranch * scale;
  TpcbTables t;
  FARPOOL_ASSIGN_OR_RETURN(
      t.branches, LoadTable(db, "pgbench_branches", BranchSchema(), {false, nb}, nb, [&](uint64_t) {
        Row r(BranchSchema());
        r.SetInt64(0, 0);
        return r;
      }));
  FARPOOL_ASSIGN_OR_RETURN(
      t.tellers, LoadTable(db, "pgbench_tellers", TellerSchema(), {false, nt}, nt, [&](uint64_t i) {
        Row r(TellerSchema());
        r.SetInt64(0, i / kTpcbTellersPerBranch);
        r.SetInt64(1, 0);
        return r;
      }));
  FARPOOL_ASSIGN_OR_RETURN(t.accounts, LoadTable(db, "pgbench_accounts", AccountSchema(),
                                                 {false, na}, na, [&](uint64_t i) {
                                                   Row r(AccountSchema());
                                                   r.SetInt64(0, i / kTpcbAccountsPerBranch);
                                                   r.SetInt64(1, 0);
                                                   return r;
                                                 }));
  FARPOOL_ASSIGN_OR_RETURN(t.history,
                           db.CreateTable("pgbench_history", HistorySchema(), {false, 1 << 20}));
  return t;
}

Result<TpcbTables> OpenTpcb(Database& db) {
  TpcbTables t;
  FARPOOL_ASSIGN_OR_RETURN(t.accounts, db.OpenTable("pgbench_accounts"));
  FARPOOL_ASSIGN_OR_RETURN(t.branches, db.OpenTable("pgbench_branches"));
  FARPOOL_ASSIGN_OR_RETURN(t.tellers, db.OpenTable("pgbench_tellers"));
  FARPOOL_ASSIGN_OR_RETURN(t.history, db.OpenTable("pgbench_history"));
  return t;
}

Status TpcbTransaction(Transaction& txn, const TpcbTables& t, const TpcbTxn& p) {
  // The history row first: its values do not depend on the reads, and a new key buffered
  // before a locking read of LockIntent::kUpdate goes into the index in that read's round trip.
  Row h(t.history->schema());
  h.SetInt64(0, p.tid);
  h.SetInt64(1, p.bid);
  h.SetInt64(2, p.aid);
  h.SetInt64(3, p.delta);
  h.SetInt64(4, p.mtime_ms);
  FARPOOL_RETURN_IF_ERROR(txn.Put(*t.history, p.history_key, h));
  const TableKey keys[] = {{t.accounts, p.aid}, {t.tellers, p.tid}, {t.branches, p.bid}};
  std::vector<Row> rows;
  if (p.lock_at_read) {
    std::vector<Status> found;
    FARPOOL_RETURN_IF_ERROR(txn.MultiGetForUpdate(keys, &rows, &found, p.intent));
    for (Status& s : found) FARPOOL_RETURN_IF_ERROR(s);
  } else {
    FARPOOL_RETURN_IF_ERROR(GetAll(txn, keys, &rows));
  }
  AddTo(rows[0], 1, p.delta);
  (void)rows[0].GetInt64(1);  // pgbench's SELECT abalance: the value read back
  AddTo(rows[1], 1, p.delta);
  AddTo(rows[2], 0, p.delta);
  FARPOOL_RETURN_IF_ERROR(txn.Put(*t.accounts, p.aid, rows[0]));
  FARPOOL_RETURN_IF_ERROR(txn.Put(*t.tellers, p.tid, rows[1]));
  FARPOOL_RETURN_IF_ERROR(txn.Put(*t.branches, p.bid, rows[2]));
  if (p.drop_history_key < 0) return Status::Ok();
  Status dropped = txn.Delete(*t.history, p.drop_history_key);
  if (dropped.code() == StatusCode::kNotFound && p.drop_may_be_absent) return Status::Ok();
  return dropped;
}

Status VerifyTpcb(Session& session, const TpcbTables& t, int scale) {
  return RunTransaction(session, [&](Transaction& txn) -> Status {
    int64_t a, tl, b;
    FARPOOL_RETURN_IF_ERROR(SumColumn(txn, *t.accounts, kTpcbAccountsPerBranch * scale, 1, &a));
    FARPOOL_RETURN_IF_ERROR(SumColumn(txn, *t.tellers, kTpcbTellersPerBranch * scale, 1, &tl));
    FARPOOL_RETURN_IF_ERROR(SumColumn(txn, *t.branches, scale, 0, &b));
    if (a != tl || tl != b) {
      return Status::Internal("tpcb verify: sum(accounts) " + std::to_string(a) +
                              ", sum(tellers) " + std::to_string(tl) + ", sum(branches) " +
                              std::to_string(b));
    }
    return Status::Ok();
  });
}

}  // namespace farpool::workloads
