// Schema, Row, option parsing, the retry helper and engine dispatch of include/farpool/db.h.
#include "farpool/db.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "db/nam/nam_engine.h"
#include "db/row_access.h"
#include "db/sharded_engine.h"

namespace farpool {

Result<Engine> ParseEngine(std::string_view text) {
  if (text == "pool") return Engine::kPool;
  if (text == "local") return Engine::kLocal;
  if (text == "sharded") return Engine::kSharded;
  return Status::InvalidArgument("unknown engine '" + std::string(text) +
                                 "' (expected pool, local or sharded)");
}

std::string_view EngineName(Engine engine) {
  switch (engine) {
    case Engine::kPool:
      return "pool";
    case Engine::kLocal:
      return "local";
    case Engine::kSharded:
      return "sharded";
  }
  return "?";
}

// ---------------------------------------------------------------- Schema

namespace {
uint32_t ColumnBytes(const Column& c) {
  switch (c.type) {
    case ColumnType::kInt64:
    case ColumnType::kDouble:
      return 8;
    case ColumnType::kChar:
      return (c.length + 7) & ~7u;
    case ColumnType::kBytes:
      return 16;  // blob address + length
  }
  return 0;
}
}  // namespace

int Schema::Find(std::string_view name) const {
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

Status Schema::Validate() const {
  if (columns_.empty()) return Status::InvalidArgument("schema: no columns");
  if (columns_.size() > kMaxColumns) {
    return Status::InvalidArgument("schema: " + std::to_string(columns_.size()) +
                                   " columns (at most " + std::to_string(kMaxColumns) + ")");
  }
  std::set<std::string> names;
  for (const auto& c : columns_) {
    if (c.name.empty() || c.name.size() > 23) {
      return Status::InvalidArgument("schema: column name '" + c.name + "' must be 1..23 bytes");
    }
    if (!names.insert(c.name).second) {
      return Status::InvalidArgument("schema: duplicate column '" + c.name + "'");
    }
    if (c.type == ColumnType::kChar && (c.length == 0 || c.length > 4096)) {
      return Status::InvalidArgument("schema: char column '" + c.name +
                                     "' needs a length of 1..4096");
    }
    if (c.type != ColumnType::kInt64 && c.type != ColumnType::kDouble &&
        c.type != ColumnType::kChar && c.type != ColumnType::kBytes) {
      return Status::InvalidArgument("schema: column '" + c.name + "' has an unknown type");
    }
  }
  return Status::Ok();
}

Schema::Schema(std::vector<Column> columns) : columns_(std::move(columns)) {
  // Rows ask for offsets per value read or written: computed once here.
  offsets_.reserve(columns_.size() + 1);
  uint32_t off = 0;
  for (const Column& c : columns_) {
    offsets_.push_back(off);
    off += ColumnBytes(c);
    has_bytes_ = has_bytes_ || c.type == ColumnType::kBytes;
  }
  offsets_.push_back(off);
}

// ---------------------------------------------------------------- ColumnSet, Row

ColumnSet::ColumnSet(std::initializer_list<size_t> columns) : bits_(0) {
  for (size_t c : columns) {
    assert(c < Schema::kMaxColumns);
    bits_ |= uint32_t{1} << c;
  }
}

Row::Row(const Schema& schema)
    : schema_(&schema),
      payload_(schema.PayloadSize(), '\0'),
      bytes_(schema.has_bytes() ? schema.size() : 0) {}

int64_t Row::GetInt64(size_t c) const {
  assert(schema_->columns()[c].type == ColumnType::kInt64);
  int64_t v;
  std::memcpy(&v, payload_.data() + schema_->Offset(c), 8);
  return v;
}
double Row::GetDouble(size_t c) const {
  assert(schema_->columns()[c].type == ColumnType::kDouble);
  double v;
  std::memcpy(&v, payload_.data() + schema_->Offset(c), 8);
  return v;
}
std::string_view Row::GetChar(size_t c) const {
  assert(schema_->columns()[c].type == ColumnType::kChar);
  const char* p = payload_.data() + schema_->Offset(c);
  size_t n = schema_->columns()[c].length;
  return std::string_view(p, strnlen(p, n));
}
const std::string& Row::GetBytes(size_t c) const {
  assert(schema_->columns()[c].type == ColumnType::kBytes);
  return bytes_[c];
}
void Row::SetInt64(size_t c, int64_t v) {
  assert(schema_->columns()[c].type == ColumnType::kInt64);
  std::memcpy(payload_.data() + schema_->Offset(c), &v, 8);
}
void Row::SetDouble(size_t c, double v) {
  assert(schema_->columns()[c].type == ColumnType::kDouble);
  std::memcpy(payload_.data() + schema_->Offset(c), &v, 8);
}
void Row::SetChar(size_t c, std::string_view v) {
  assert(schema_->columns()[c].type == ColumnType::kChar);
  const size_t n = (schema_->columns()[c].length + 7) & ~7u;
  char* p = payload_.data() + schema_->Offset(c);
  std::memset(p, 0, n);
  std::memcpy(p, v.data(), std::min<size_t>(v.size(), schema_->columns()[c].length));
}
void Row::SetBytes(size_t c, std::string v) {
  assert(schema_->columns()[c].type == ColumnType::kBytes);
  bytes_[c] = std::move(v);
}

// ---------------------------------------------------------------- Transaction

Status Transaction::MultiGet(std::span<const TableKey> keys, std::vector<Row>* rows,
                             std::vector<Status>* statuses) {
  rows->assign(keys.size(), Row());
  statuses->assign(keys.size(), Status::Ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    Status s = Get(*keys[i].table, keys[i].key, &(*rows)[i], keys[i].columns);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
    (*statuses)[i] = std::move(s);
  }
  return Status::Ok();
}

// Engines that lock at commit only read here; their commit validates the version read.
Status Transaction::GetForUpdate(const Table& table, int64_t key, Row* row, LockIntent) {
  return Get(table, key, row);
}

Status Transaction::MultiGetForUpdate(std::span<const TableKey> keys, std::vector<Row>* rows,
                                      std::vector<Status>* statuses, LockIntent) {
  return MultiGet(keys, rows, statuses);
}

Status Transaction::ScanMany(
    std::span<const ScanRange> ranges,
    const std::function<bool(size_t range, int64_t key, const Row& row)>& visit) {
  bool stopped = false;
  for (size_t i = 0; i < ranges.size() && !stopped; ++i) {
    const ScanRange& r = ranges[i];
    FARPOOL_RETURN_IF_ERROR(
        Scan(*r.table, r.lo, r.hi, r.limit, r.reverse, r.columns, [&](int64_t key, const Row& row) {
          stopped = !visit(i, key, row);
          return !stopped;
        }));
  }
  return Status::Ok();
}

Status Transaction::ScanThenGet(
    std::span<const ScanRange> ranges, const Table& target, ColumnSet columns,
    const std::function<int64_t(size_t range, int64_t key)>& target_key,
    const std::function<bool(size_t range, int64_t key, const Status& status, const Row& row)>&
        visit) {
  std::vector<ScanRange> keys_only(ranges.begin(), ranges.end());
  for (ScanRange& r : keys_only) r.columns = ColumnSet::None();
  std::vector<std::pair<size_t, int64_t>> entries;
  FARPOOL_RETURN_IF_ERROR(ScanMany(keys_only, [&](size_t range, int64_t key, const Row&) {
    entries.push_back({range, key});
    return true;
  }));
  return db::VisitJoined(
      entries, target, columns, target_key,
      [&](std::span<const TableKey> keys, std::vector<Row>* rows, std::vector<Status>* statuses) {
        return MultiGet(keys, rows, statuses);
      },
      visit);
}

Result<std::unique_ptr<Transaction>> Session::Begin(const TransactionOptions& options) {
  if (options.isolation != Isolation::kSnapshot) {
    return Status::InvalidArgument("this engine offers snapshot isolation only (isolation '" +
                                   std::string(IsolationName(options.isolation)) + "')");
  }
  return Begin();
}

Result<Isolation> ParseIsolation(std::string_view text) {
  if (text == "si") return Isolation::kSnapshot;
  if (text == "rc") return Isolation::kReadCommitted;
  return Status::InvalidArgument("unknown isolation level '" + std::string(text) +
                                 "' (expected si or rc)");
}

std::string_view IsolationName(Isolation isolation) {
  return isolation == Isolation::kReadCommitted ? "rc" : "si";
}

std::string_view RoundTripCauseName(RoundTripCause cause) {
  static constexpr std::array<std::string_view, kRoundTripCauses> kNames = {
      "other",       "read",        "read_wait", "retake", "lock_cas",   "lock_wait", "relock",
      "commit_lock", "commit_wait", "decide",    "finish", "version_gc", "release",   "allocator"};
  const auto i = static_cast<size_t>(cause);
  return i < kNames.size() ? kNames[i] : "unknown";
}

// ---------------------------------------------------------------- RunTransaction

Status RunTransaction(Session& session, const std::function<Status(Transaction&)>& body,
                      int max_attempts) {
  return RunTransaction(session, TransactionOptions{}, body, max_attempts);
}

Status RunTransaction(Session& session, const TransactionOptions& options,
                      const std::function<Status(Transaction&)>& body, int max_attempts) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  Status last;
  for (int attempt = 0; attempt < max_attempts; ++attempt) {
    if (attempt > 0) {
      // Randomized exponential backoff, capped at ~1 ms: colliding transactions spread out.
      const uint64_t cap = std::min<uint64_t>(1000, uint64_t{2} << std::min(attempt, 9));
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % cap));
    }
    auto txn = session.Begin(options);
    if (!txn.ok()) {
      if (txn.status().code() == StatusCode::kAborted) {
        last = txn.status();
        continue;
      }
      return txn.status();
    }
    Status s = body(**txn);
    if (s.ok()) s = (*txn)->Commit();
    if (!s.ok()) (*txn)->Rollback();
    if (s.code() != StatusCode::kAborted) return s;
    last = s;
  }
  return Status::Aborted("gave up after " + std::to_string(max_attempts) +
                         " attempts, every one aborted; the last: " + last.message());
}

// ---------------------------------------------------------------- bulk loading

namespace db {

void KeepColumns(ColumnSet columns, Row& row) {
  if (columns == ColumnSet::All()) return;
  const Schema& schema = *row.schema();
  std::string& payload = RowAccess::payload(row);
  for (size_t c = 0; c < schema.size(); ++c) {
    if (columns.Has(c)) continue;
    const uint32_t end = c + 1 < schema.size() ? schema.Offset(c + 1) : schema.PayloadSize();
    std::fill(payload.begin() + schema.Offset(c), payload.begin() + end, '\0');
    if (schema.columns()[c].type == ColumnType::kBytes) RowAccess::bytes(row)[c].clear();
  }
}

Status VisitJoined(
    std::span<const std::pair<size_t, int64_t>> entries, const Table& target, ColumnSet columns,
    const std::function<int64_t(size_t range, int64_t key)>& target_key,
    const std::function<Status(std::span<const TableKey> keys, std::vector<Row>* rows,
                               std::vector<Status>* statuses)>& get_many,
    const std::function<bool(size_t range, int64_t key, const Status& status, const Row& row)>&
        visit) {
  std::vector<TableKey> keys;
  keys.reserve(entries.size());
  for (const auto& [range, key] : entries)
    keys.push_back({&target, target_key(range, key), columns});
  std::vector<Row> rows;
  std::vector<Status> statuses;
  FARPOOL_RETURN_IF_ERROR(get_many(keys, &rows, &statuses));
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!visit(entries[i].first, entries[i].second, statuses[i], rows[i])) break;
  }
  return Status::Ok();
}

Status CheckLoadRow(const Schema& schema, const std::string& table, int64_t key, const Row& row) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("loading table '" + table + "': row of key " +
                                   std::to_string(key) + ": " + why);
  };
  if (key == INT64_MAX) return bad("key INT64_MAX is reserved");
  const Schema* got = row.schema();
  if (got == nullptr) return bad("the row has no schema (default-constructed)");
  if (got != &schema) {
    if (got->size() != schema.size()) {
      return bad(std::to_string(got->size()) + " columns, the table has " +
                 std::to_string(schema.size()));
    }
    for (size_t i = 0; i < schema.size(); ++i) {
      const Column &a = got->columns()[i], &b = schema.columns()[i];
      if (a.name != b.name || a.type != b.type || a.length != b.length) {
        return bad("column " + std::to_string(i) + " is '" + a.name + "', the table's is '" +
                   b.name + "' (or their types or lengths differ)");
      }
    }
  }
  if (RowAccess::payload(row).size() != schema.PayloadSize()) return bad("malformed payload");
  return Status::Ok();
}

namespace {

// The default Loader (see db.h): buffers the rows; Finish creates the table and commits them
// in transactions.
class TxnLoader final : public Loader {
 public:
  TxnLoader(Database& db, std::string name, Schema schema, TableOptions options)
      : db_(db), name_(std::move(name)), schema_(std::move(schema)), options_(options) {}

  Status Add(int64_t key, const Row& row) override {
    if (done_) return Status::InvalidArgument("loading table '" + name_ + "': loader finished");
    Status s = CheckLoadRow(schema_, name_, key, row);
    if (!s.ok()) {
      done_ = true;
      return s;
    }
    rows_.emplace_back(key, row);
    return Status::Ok();
  }

  Result<const Table*> Finish() override {
    if (done_) return Status::InvalidArgument("loading table '" + name_ + "': loader finished");
    done_ = true;
    std::sort(rows_.begin(), rows_.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 1; i < rows_.size(); ++i) {
      if (rows_[i - 1].first == rows_[i].first) {
        return Status::InvalidArgument("loading table '" + name_ + "': duplicate key " +
                                       std::to_string(rows_[i].first));
      }
    }
    FARPOOL_ASSIGN_OR_RETURN(const Table* table, db_.CreateTable(name_, schema_, options_));
    FARPOOL_ASSIGN_OR_RETURN(auto session, db_.NewSession());
    constexpr size_t kRowsPerTxn = 500;
    for (size_t base = 0; base < rows_.size(); base += kRowsPerTxn) {
      FARPOOL_RETURN_IF_ERROR(RunTransaction(*session, [&](Transaction& txn) -> Status {
        for (size_t i = base; i < std::min(rows_.size(), base + kRowsPerTxn); ++i)
          FARPOOL_RETURN_IF_ERROR(txn.Put(*table, rows_[i].first, rows_[i].second));
        return Status::Ok();
      }));
    }
    return table;
  }

  uint64_t rows() const override { return rows_.size(); }

 private:
  Database& db_;
  const std::string name_;
  const Schema schema_;
  const TableOptions options_;
  std::vector<std::pair<int64_t, Row>> rows_;
  bool done_ = false;
};

}  // namespace
}  // namespace db

Result<std::unique_ptr<Loader>> Database::NewLoader(const std::string& name, const Schema& schema,
                                                    const TableOptions& options) {
  FARPOOL_RETURN_IF_ERROR(schema.Validate());
  auto existing = OpenTable(name);
  if (existing.ok()) return Status::AlreadyExists("table '" + name + "' already exists");
  if (existing.status().code() != StatusCode::kNotFound) return existing.status();
  return std::unique_ptr<Loader>(std::make_unique<db::TxnLoader>(*this, name, schema, options));
}

// ---------------------------------------------------------------- Open

Result<std::unique_ptr<Database>> Database::Open(const DatabaseOptions& options) {
  switch (options.engine) {
    case Engine::kPool:
    case Engine::kLocal:
      return db::OpenNamDatabase(options);
    case Engine::kSharded:
      return db::OpenShardedDatabase(options);
  }
  return Status::InvalidArgument("unknown engine");
}

}  // namespace farpool
