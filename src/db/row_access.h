// The engines' view of a Row (include/farpool/db.h): its fixed payload and the bytes of its
// kBytes columns, which the public API reaches only through the typed Get/Set accessors.
//
// Thread-safety: as the Row (no synchronization).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "farpool/db.h"

namespace farpool::db {

class RowAccess {
 public:
  // The fixed payload (Schema::PayloadSize() bytes; kBytes columns hold a blob reference there
  // once written).
  static std::string& payload(Row& row) { return row.payload_; }
  static const std::string& payload(const Row& row) { return row.payload_; }
  // Per column; used by kBytes columns.
  static std::vector<std::string>& bytes(Row& row) { return row.bytes_; }
  static const std::vector<std::string>& bytes(const Row& row) { return row.bytes_; }
};

// Gives every column of `row` not in `columns` its zero value (ColumnSet's contract).
// REQUIRES: the row has a schema.
void KeepColumns(ColumnSet columns, Row& row);

// A row for table `table` of schema `schema` (Loader::Add): InvalidArgument naming the table
// and the key unless the row was made for an equal schema (column names, types and lengths,
// in order) and the key is not INT64_MAX (reserved, as for Transaction::Put).
Status CheckLoadRow(const Schema& schema, const std::string& table, int64_t key, const Row& row);

// ScanThenGet's second half, the same in every engine: gets the rows of `target` that the
// scanned index entries (range, key) name (target_key), through `get_many` (the engine's
// MultiGet), and visits them in the scan's order until `visit` returns false.
Status VisitJoined(
    std::span<const std::pair<size_t, int64_t>> entries, const Table& target, ColumnSet columns,
    const std::function<int64_t(size_t range, int64_t key)>& target_key,
    const std::function<Status(std::span<const TableKey> keys, std::vector<Row>* rows,
                               std::vector<Status>* statuses)>& get_many,
    const std::function<bool(size_t range, int64_t key, const Status& status, const Row& row)>&
        visit);

}  // namespace farpool::db
