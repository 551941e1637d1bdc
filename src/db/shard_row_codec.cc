#include "db/shard_row_codec.h"

#include <cstring>

#include "db/row_access.h"

namespace farpool::db::shard {

std::string EncodeRow(const Row& row) {
  std::string out = RowAccess::payload(row);
  const auto& cols = row.schema()->columns();
  for (size_t c = 0; c < cols.size(); ++c) {
    if (cols[c].type != ColumnType::kBytes) continue;
    const std::string& b = RowAccess::bytes(row)[c];
    const uint32_t n = static_cast<uint32_t>(b.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out.append(b);
  }
  return out;
}

Status DecodeRow(const Table& t, std::string_view value, Row* row) {
  *row = Row(t.schema());
  const uint32_t payload = t.schema().PayloadSize();
  auto bad = [&] {
    return Status::Protocol("row of table '" + t.name() + "' does not match its schema (" +
                            std::to_string(value.size()) + " bytes)");
  };
  if (value.size() < payload) return bad();
  RowAccess::payload(*row).assign(value.substr(0, payload));
  value.remove_prefix(payload);
  const auto& cols = t.schema().columns();
  for (size_t c = 0; c < cols.size(); ++c) {
    if (cols[c].type != ColumnType::kBytes) continue;
    uint32_t n;
    if (value.size() < 4) return bad();
    std::memcpy(&n, value.data(), 4);
    value.remove_prefix(4);
    if (value.size() < n) return bad();
    RowAccess::bytes(*row)[c].assign(value.substr(0, n));
    value.remove_prefix(n);
  }
  return value.empty() ? Status::Ok() : bad();
}

}  // namespace farpool::db::shard
