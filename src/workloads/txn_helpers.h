// Small transaction helpers shared by the workloads (bank, TPC-B): loading a table in batched
// transactions, reading rows that must exist, summing a column.
//
// Thread-safety: stateless; each call uses only the Session or Transaction it is given.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "farpool/db.h"
#include "farpool/status.h"

namespace farpool::workloads {

// Calls put(txn, i) for i in [0, n), 500 rows per transaction (each retried on Aborted).
Status LoadInBatches(Session& session, uint64_t n,
                     const std::function<Status(Transaction&, uint64_t)>& put);

// Reads the rows of `keys` in one MultiGet into *rows; every key must exist (NotFound if not).
Status GetAll(Transaction& txn, std::span<const TableKey> keys, std::vector<Row>* rows);

// Adds `delta` to the int64 column `column` of `row`.
void AddTo(Row& row, size_t column, int64_t delta);

// The sum of int64 column `column` over the rows with keys [0, n) of `table` (which must all
// exist), read in MultiGets of 1000 keys inside `txn`.
Status SumColumn(Transaction& txn, const Table& table, uint64_t n, size_t column, int64_t* out);

}  // namespace farpool::workloads
