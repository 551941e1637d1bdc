#include "workloads/bank.h"

#include <string>
#include <vector>

#include "workloads/txn_helpers.h"

namespace farpool::workloads {

const Schema& BankSchema() {
  static const Schema s{{"balance", ColumnType::kInt64}};
  return s;
}

Result<const Table*> LoadBank(Database& db, uint64_t accounts) {
  Row r(BankSchema());
  r.SetInt64(0, kBankInitialBalance);
  return LoadTable(db, "accounts", BankSchema(), {false, accounts}, accounts,
                   [&](uint64_t) { return r; });
}

Result<const Table*> OpenBank(Database& db) { return db.OpenTable("accounts"); }

Status BankTransfer(Transaction& txn, const Table& accounts, int64_t from, int64_t to,
                    int64_t amount, bool for_update) {
  const TableKey keys[] = {{&accounts, from}, {&accounts, to}};
  std::vector<Row> rows;
  if (for_update) {
    // Both rows read for update with the update intent (they are written right after): on the
    // pool engines one round trip finds, locks and reads them, and the commit needs no lock
    // round of its own: 3 round trips in all, where a plain MultiGet and the commit took 4-5.
    std::vector<Status> found;
    FARPOOL_RETURN_IF_ERROR(txn.MultiGetForUpdate(std::span(keys, from == to ? 1 : 2), &rows,
                                                  &found, LockIntent::kUpdate));
    for (Status& s : found) FARPOOL_RETURN_IF_ERROR(s);
  } else {
    FARPOOL_RETURN_IF_ERROR(GetAll(txn, keys, &rows));
  }
  Row& debit = rows[0];
  Row& credit = from == to ? rows[0] : rows[1];
  AddTo(debit, 0, -amount);
  AddTo(credit, 0, amount);
  FARPOOL_RETURN_IF_ERROR(txn.Put(accounts, from, debit));
  return txn.Put(accounts, to, credit);
}

Status VerifyBank(Session& session, const Table& accounts, uint64_t n) {
  return RunTransaction(session, [&](Transaction& txn) -> Status {
    int64_t total;
    FARPOOL_RETURN_IF_ERROR(SumColumn(txn, accounts, n, 0, &total));
    if (total != static_cast<int64_t>(n) * kBankInitialBalance) {
      return Status::Internal("bank verify: total " + std::to_string(total) + ", expected " +
                              std::to_string(n * kBankInitialBalance));
    }
    return Status::Ok();
  });
}

}  // namespace farpool::workloads
