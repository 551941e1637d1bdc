// The bank workload (`farpool bench txn --workload bank`) on any engine of include/farpool/db.h.
//
// Schema: one hash table `accounts` keyed by account number 0..accounts-1, one int64 column
// `balance`, every account loaded with kBankInitialBalance.
// Transaction: read two accounts (one MultiGet; or, for update, one MultiGetForUpdate with
// LockIntent::kUpdate: on the pool engines the commit then needs no lock round, 3 round trips
// in all instead of 4-5) and move an amount from one to the other (2 reads, 2 writes; the same
// account twice is no change).
// Invariant (VerifyBank): the total of all balances is accounts · kBankInitialBalance.
//
// Thread-safety: stateless; use one Session per thread.
#pragma once

#include <cstdint>

#include "farpool/db.h"
#include "farpool/status.h"

namespace farpool::workloads {

inline constexpr int64_t kBankInitialBalance = 1000;

const Schema& BankSchema();

// Creates the `accounts` table with `accounts` rows (a bulk loader: AlreadyExists if the
// table exists).
Result<const Table*> LoadBank(Database& db, uint64_t accounts);
// The `accounts` table of a loaded database.
Result<const Table*> OpenBank(Database& db);

// Moves `amount` from account `from` to account `to` inside `txn`; `for_update`: the two
// accounts are read for update (LockIntent::kUpdate).
Status BankTransfer(Transaction& txn, const Table& accounts, int64_t from, int64_t to,
                    int64_t amount, bool for_update);

// Checks the invariant in one transaction of `session`; Internal with both totals if broken.
Status VerifyBank(Session& session, const Table& accounts, uint64_t n);

}  // namespace farpool::workloads
