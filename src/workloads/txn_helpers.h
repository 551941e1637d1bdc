// Small helpers shared by the workloads (bank, TPC-B): loading a table with a bulk loader,
// reading rows that must exist, summing a column.
//
// Thread-safety: stateless; each call uses only the Session or Transaction it is given.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "farpool/db.h"
#include "farpool/status.h"

namespace farpool::workloads {

// Creates table `name` with rows row(i) at keys i in [0, n), with a bulk loader
// (Database::NewLoader: the table appears with all its rows at once).
Result<const Table*> LoadTable(Database& db, const std::string& name, const Schema& schema,
                               const TableOptions& options, uint64_t n,
                               const std::function<Row(uint64_t)>& row);

// Reads the rows of `keys` in one MultiGet into *rows; every key must exist (NotFound if not).
Status GetAll(Transaction& txn, std::span<const TableKey> keys, std::vector<Row>* rows);

// Adds `delta` to the int64 column `column` of `row`.
void AddTo(Row& row, size_t column, int64_t delta);

// The sum of int64 column `column` over the rows with keys [0, n) of `table` (which must all
// exist), read in MultiGets of 1000 keys inside `txn`.
Status SumColumn(Transaction& txn, const Table& table, uint64_t n, size_t column, int64_t* out);

}  // namespace farpool::workloads
