#include "workloads/txn_helpers.h"

#include <algorithm>

namespace farpool::workloads {

Result<const Table*> LoadTable(Database& db, const std::string& name, const Schema& schema,
                               const TableOptions& options, uint64_t n,
                               const std::function<Row(uint64_t)>& row) {
  FARPOOL_ASSIGN_OR_RETURN(auto loader, db.NewLoader(name, schema, options));
  for (uint64_t i = 0; i < n; ++i) FARPOOL_RETURN_IF_ERROR(loader->Add(int64_t(i), row(i)));
  return loader->Finish();
}

Status GetAll(Transaction& txn, std::span<const TableKey> keys, std::vector<Row>* rows) {
  std::vector<Status> found;
  FARPOOL_RETURN_IF_ERROR(txn.MultiGet(keys, rows, &found));
  for (Status& s : found) FARPOOL_RETURN_IF_ERROR(s);
  return Status::Ok();
}

void AddTo(Row& row, size_t column, int64_t delta) {
  row.SetInt64(column, row.GetInt64(column) + delta);
}

Status SumColumn(Transaction& txn, const Table& table, uint64_t n, size_t column, int64_t* out) {
  constexpr uint64_t kChunk = 1000;
  *out = 0;
  std::vector<TableKey> keys;
  std::vector<Row> rows;
  for (uint64_t base = 0; base < n; base += kChunk) {
    keys.clear();
    for (uint64_t i = base; i < std::min(n, base + kChunk); ++i)
      keys.push_back({&table, int64_t(i)});
    FARPOOL_RETURN_IF_ERROR(GetAll(txn, keys, &rows));
    for (const Row& r : rows) *out += r.GetInt64(column);
  }
  return Status::Ok();
}

}  // namespace farpool::workloads
