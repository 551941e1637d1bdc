// The sharded engine: shared-nothing partitions (db/shard_server.h) and a coordinator per
// session that runs message-based two-phase commit under snapshot isolation.
//
// How it works (see docs/database.md, "The sharded engine"):
//   Partitioning: row (table, key) lives on partition Mix(key) % N. Partition 0 also holds the
//   catalog and is the timestamp service.
//   Begin: one BeginRequest to partition 0 -> read timestamp R (the last commit timestamp).
//   Get: a ReadRequest to the key's partition at R (writes of this transaction first). A
//   record locked by a transaction that may commit inside the snapshot answers kBusy; the
//   coordinator retries (and resolves the holder if its lease expired).
//   Put/Delete: buffered.
//   Commit: group the write set per partition, one PrepareRequest per participant, all posted
//   before waiting once (lock + first-committer-wins: any newer version or foreign lock is a
//   conflict, nothing stays locked there); any conflict -> CommitRequest(ts 0) to the prepared
//   ones, Aborted. Else DecideRequest to partition 0 (commit ts; it installs its own share in
//   the same message when it is a participant), then CommitRequest(ts) to the others, whose
//   acknowledgements are collected lazily (before the next request round of the session) —
//   the outcome is already decided, and a later reader that finds the lock still there waits.
//   A write set on partition 0 only commits in one message (Prepare with kPrepareOnePhase).
#include "db/sharded_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "db/row_access.h"
#include "db/shard_client.h"
#include "db/shard_row_codec.h"
#include "db/shard_server.h"
#include "db/testing_hooks.h"
#include "farpool/cluster.h"
#include "transport/ucx.h"

namespace farpool::db {
namespace {

using namespace shard;
using Clock = std::chrono::steady_clock;

uint64_t MixKey(int64_t key) {
  uint64_t x = static_cast<uint64_t>(key) + 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

class ShardTable final : public Table {
 public:
  uint32_t id() const override { return id_; }
  const std::string& name() const override { return name_; }
  const Schema& schema() const override { return schema_; }
  bool ordered() const override { return ordered_; }
  uint32_t id_ = 0;
  std::string name_;
  Schema schema_;
  bool ordered_ = false;
};

class ShardedDatabase;

class ShardedSession final : public Session {
 public:
  ShardedSession(ShardedDatabase& db, std::unique_ptr<Client> client, uint64_t nonce)
      : db_(db), client_(std::move(client)), nonce_(nonce) {}
  using Session::Begin;  // with options: snapshot isolation only
  Result<std::unique_ptr<Transaction>> Begin() override;
  const TxnCounters& counters() const override { return counters_; }

  uint64_t NextTxnId() { return (nonce_ << 32) | (++seq_ & 0xFFFFFFFFULL); }

  ShardedDatabase& db_;
  TxnCounters counters_;  // first: the client counts messages and round trips into it
  std::unique_ptr<Client> client_;
  const uint64_t nonce_;
  uint64_t seq_ = 0;
};

class ShardedDatabase final : public Database {
 public:
  explicit ShardedDatabase(const DatabaseOptions& options) : options_(options) {}
  ~ShardedDatabase() override {
    admin_.reset();
    context_.reset();
    for (auto& s : servers_) s->Stop();
  }

  Status Init();
  Engine engine() const override { return Engine::kSharded; }
  Result<const Table*> CreateTable(const std::string& name, const Schema& schema,
                                   const TableOptions& options) override;
  Result<const Table*> OpenTable(const std::string& name) override;
  Status DropTable(const std::string& name) override;
  Result<std::vector<std::string>> ListTables() override;
  Result<std::unique_ptr<Session>> NewSession() override;
  Status RecoverExpired() override;
  // Partitions keep one version per key: nothing to collect.
  Result<GcStats> CollectGarbage() override { return GcStats{}; }
  Result<uint64_t> CountLocked(const Table& table) override;

  size_t PartitionOf(int64_t key) const { return ShardedPartitionOf(key, partitions_.size()); }
  const DatabaseOptions& options() const { return options_; }
  // Finishes the transaction `holder` (lease expired) on partition p: asks the timestamp
  // service for its outcome (aborting it if undecided) and sends that to p.
  Status ResolveHolder(Client& client, size_t p, uint64_t holder);

 private:
  const Table* Adopt(const TableDesc& desc);

  DatabaseOptions options_;
  std::vector<std::unique_ptr<PartitionServer>> servers_;  // in-process partitions
  std::vector<ServerAddress> partitions_;
  std::unique_ptr<transport::Context> context_;
  std::mutex mu_;  // guards admin_ and tables_
  TxnCounters admin_counters_;
  std::unique_ptr<Client> admin_;
  std::map<uint32_t, std::unique_ptr<ShardTable>> tables_;  // by id; never removed
};

class ShardedTxn final : public Transaction {
 public:
  explicit ShardedTxn(ShardedSession& s) : s_(s) {}
  ~ShardedTxn() override { Rollback(); }

  using Transaction::Get;
  using Transaction::Scan;
  // Rows travel whole (the partition servers keep no columns apart): projection is applied
  // to what arrives.
  Status Get(const Table& table, int64_t key, Row* row, ColumnSet columns) override;
  Status Put(const Table& table, int64_t key, const Row& row) override;
  Status Delete(const Table& table, int64_t key) override;
  Status Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
              ColumnSet columns, const std::function<bool(int64_t, const Row&)>& visit) override;
  Status Commit() override;
  void Rollback() override { finished_ = true; }

 private:
  struct WriteEntry {
    const Table* table;
    bool deleted;
    std::string value;
  };
  using Key = std::pair<uint32_t, int64_t>;
  // The read timestamp, asked of the timestamp service by the transaction's first read (as
  // the pool engines take their snapshot: include/farpool/db.h).
  Result<uint64_t> ReadTs();
  // The visible value of key (nullopt: no visible row).
  Result<std::optional<std::string>> ReadCommitted(const Table& t, int64_t key);
  // After a kBusy answer: resolves an expired holder or backs off. Aborted after waiting long.
  Status WaitForLock(size_t p, const ReadItem& busy, int attempt, Clock::time_point since);
  // Aborted: the transaction is aborted (Usable refuses every later call, Commit commits
  // nothing), counted once.
  Status Conflict(const std::string& what) {
    if (!aborted_) ++s_.counters_.aborts;
    aborted_ = true;
    return Status::Aborted(what);
  }
  // Ok, or why no call may be made (include/farpool/db.h, Transaction).
  Status Usable() const {
    if (finished_) return Status::InvalidArgument("transaction already finished");
    if (aborted_) {
      return Status::Aborted(
          "an earlier call of this transaction returned Aborted: it can only be rolled back");
    }
    return Status::Ok();
  }
  void Hook(std::string_view point) { TestingHook(s_.db_.options(), point); }

  ShardedSession& s_;
  std::optional<uint64_t> read_ts_;
  std::map<Key, WriteEntry> writes_;
  bool finished_ = false;
  bool aborted_ = false;  // a call returned Aborted (Conflict)
};

// ================================================================ database

Status ShardedDatabase::Init() {
  Fabric fabric = Fabric::kShm;
  if (options_.cluster_file.empty()) {
    if (options_.partitions < 1 || options_.partitions > 1024) {
      return Status::InvalidArgument("sharded: partitions must be 1..1024, not " +
                                     std::to_string(options_.partitions));
    }
    for (int i = 0; i < options_.partitions; ++i) {
      PartitionServerOptions so;
      so.id = static_cast<uint16_t>(i);
      so.progress = ProgressMode::kEvent;
      so.fabric = fabric;
      FARPOOL_ASSIGN_OR_RETURN(auto server, PartitionServer::Start(so));
      ServerAddress a;
      a.id = so.id;
      a.host = so.host;
      a.port = server->port();
      partitions_.push_back(a);
      servers_.push_back(std::move(server));
    }
  } else {
    FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(options_.cluster_file));
    fabric = config.transport;
    partitions_ = config.servers;
    std::sort(partitions_.begin(), partitions_.end(),
              [](const ServerAddress& a, const ServerAddress& b) { return a.id < b.id; });
    for (size_t i = 0; i < partitions_.size(); ++i) {
      if (partitions_[i].id != i) {
        return Status::InvalidArgument(options_.cluster_file + ": partition ids must be 0.." +
                                       std::to_string(partitions_.size() - 1) + " (found id " +
                                       std::to_string(partitions_[i].id) + ")");
      }
    }
    if (partitions_.empty()) {
      return Status::InvalidArgument(options_.cluster_file + ": no partition servers");
    }
  }
  transport::Context::Options copts;
  copts.fabric = fabric;
  copts.wakeup = true;
  for (const ServerAddress& a : partitions_) copts.reach.push_back(a.host);
  FARPOOL_ASSIGN_OR_RETURN(context_, transport::Context::Create(copts));
  FARPOOL_ASSIGN_OR_RETURN(admin_, Client::Connect(*context_, partitions_, &admin_counters_));
  // Fail early if the cluster does not answer.
  FARPOOL_ASSIGN_OR_RETURN(
      Reply r, admin_->Call(0, Opcode::kBeginRequest, BeginRequest{0}, Opcode::kBeginReply));
  (void)r;
  return Status::Ok();
}

const Table* ShardedDatabase::Adopt(const TableDesc& d) {
  auto& slot = tables_[d.id];
  if (!slot) {
    auto t = std::make_unique<ShardTable>();
    t->id_ = d.id;
    t->name_ = std::string(d.name, strnlen(d.name, kNameSize));
    t->ordered_ = d.flags & 1;
    std::vector<Column> cols;
    for (uint32_t i = 0; i < d.ncols && i < kMaxColumns; ++i) {
      cols.push_back({std::string(d.cols[i].name, strnlen(d.cols[i].name, 24)),
                      static_cast<ColumnType>(d.cols[i].type), d.cols[i].length});
    }
    t->schema_ = Schema(std::move(cols));
    slot = std::move(t);
  }
  return slot.get();
}

Result<const Table*> ShardedDatabase::CreateTable(const std::string& name, const Schema& schema,
                                                  const TableOptions& options) {
  FARPOOL_RETURN_IF_ERROR(schema.Validate());
  if (name.empty() || name.size() >= kNameSize) {
    return Status::InvalidArgument("table name '" + name + "' must be 1..63 bytes");
  }
  TableDesc d{};
  d.flags = options.ordered ? 1 : 0;
  d.ncols = static_cast<uint32_t>(schema.size());
  std::memcpy(d.name, name.data(), name.size());
  for (size_t i = 0; i < schema.size(); ++i) {
    const Column& c = schema.columns()[i];
    std::memcpy(d.cols[i].name, c.name.data(), c.name.size());
    d.cols[i].type = uint32_t(c.type);
    d.cols[i].length = c.length;
  }
  std::lock_guard l(mu_);
  FARPOOL_ASSIGN_OR_RETURN(Reply r,
                           admin_->Call(0, Opcode::kCreateTableRequest, d, Opcode::kTableReply));
  return Adopt(r.message.As<TableDesc>());
}

Result<const Table*> ShardedDatabase::OpenTable(const std::string& name) {
  if (name.empty() || name.size() >= kNameSize) return Status::NotFound("no table '" + name + "'");
  NameRequest n{};
  std::memcpy(n.name, name.data(), name.size());
  std::lock_guard l(mu_);
  FARPOOL_ASSIGN_OR_RETURN(Reply r,
                           admin_->Call(0, Opcode::kOpenTableRequest, n, Opcode::kTableReply));
  return Adopt(r.message.As<TableDesc>());
}

Status ShardedDatabase::DropTable(const std::string& name) {
  if (name.empty() || name.size() >= kNameSize) return Status::NotFound("no table '" + name + "'");
  NameRequest n{};
  std::memcpy(n.name, name.data(), name.size());
  std::lock_guard l(mu_);
  auto r = admin_->Call(0, Opcode::kDropTableRequest, n, Opcode::kDropTableReply);
  return r.ok() ? Status::Ok() : r.status();
}

Result<std::vector<std::string>> ShardedDatabase::ListTables() {
  std::lock_guard l(mu_);
  FARPOOL_ASSIGN_OR_RETURN(Reply r, admin_->Call(0, Opcode::kListTablesRequest,
                                                 ListTablesRequest{0}, Opcode::kListTablesReply));
  return ParseNames(r.message);
}

Result<std::unique_ptr<Session>> ShardedDatabase::NewSession() {
  static std::atomic<uint64_t> counter{0};
  // A transaction id is nonce << 32 | sequence; the nonce is random per session (and never 0).
  std::random_device rd;
  const uint64_t nonce =
      ((uint64_t(rd()) ^ (uint64_t(getpid()) << 8) ^ counter.fetch_add(1)) & 0xFFFFFFFFULL) | 1;
  auto session = std::make_unique<ShardedSession>(*this, nullptr, nonce);
  FARPOOL_ASSIGN_OR_RETURN(session->client_,
                           Client::Connect(*context_, partitions_, &session->counters_));
  return std::unique_ptr<Session>(std::move(session));
}

Status ShardedDatabase::ResolveHolder(Client& client, size_t p, uint64_t holder) {
  FARPOOL_ASSIGN_OR_RETURN(Reply r, client.Call(0, Opcode::kResolveRequest, ResolveRequest{holder},
                                                Opcode::kResolveReply));
  const uint64_t ts = r.message.As<ResolveReply>().commit_ts;
  FARPOOL_ASSIGN_OR_RETURN(Reply c, client.Call(p, Opcode::kCommitRequest,
                                                CommitRequest{holder, ts}, Opcode::kCommitReply));
  (void)c;
  return Status::Ok();
}

Status ShardedDatabase::RecoverExpired() {
  std::lock_guard l(mu_);
  for (size_t p = 0; p < partitions_.size(); ++p) {
    FARPOOL_ASSIGN_OR_RETURN(Reply r,
                             admin_->Call(p, Opcode::kLockedRequest, LockedRequest{UINT32_MAX, 0},
                                          Opcode::kLockedReply));
    FARPOOL_ASSIGN_OR_RETURN(std::vector<uint64_t> holders, ParseHolders(r.message));
    for (uint64_t h : holders) FARPOOL_RETURN_IF_ERROR(ResolveHolder(*admin_, p, h));
  }
  return Status::Ok();
}

Result<uint64_t> ShardedDatabase::CountLocked(const Table& table) {
  std::lock_guard l(mu_);
  uint64_t locked = 0;
  for (size_t p = 0; p < partitions_.size(); ++p) {
    FARPOOL_ASSIGN_OR_RETURN(Reply r,
                             admin_->Call(p, Opcode::kLockedRequest, LockedRequest{table.id(), 0},
                                          Opcode::kLockedReply));
    locked += r.message.As<LockedReply>().locked;
  }
  return locked;
}

// ================================================================ session / transaction

Result<std::unique_ptr<Transaction>> ShardedSession::Begin() {
  // Installs of earlier commits: their failures surface here.
  FARPOOL_RETURN_IF_ERROR(client_->CollectLazy().WithContext("installing an earlier commit"));
  return std::unique_ptr<Transaction>(std::make_unique<ShardedTxn>(*this));
}

Result<uint64_t> ShardedTxn::ReadTs() {
  if (!read_ts_) {
    FARPOOL_ASSIGN_OR_RETURN(
        Reply r, s_.client_->Call(0, Opcode::kBeginRequest, BeginRequest{0}, Opcode::kBeginReply));
    read_ts_ = r.message.As<BeginReply>().read_ts;
  }
  return *read_ts_;
}

Status ShardedTxn::WaitForLock(size_t p, const ReadItem& busy, int attempt,
                               Clock::time_point since) {
  if (busy.expired) return s_.db_.ResolveHolder(*s_.client_, p, busy.holder);
  if (Clock::now() - since > 2 * s_.db_.options().lease) {
    return Conflict("key " + std::to_string(busy.key) + " stays locked by transaction " +
                    std::to_string(busy.holder));
  }
  if (attempt < 16) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(attempt, 200)));
  }
  return Status::Ok();
}

Result<std::optional<std::string>> ShardedTxn::ReadCommitted(const Table& t, int64_t key) {
  const size_t p = s_.db_.PartitionOf(key);
  FARPOOL_ASSIGN_OR_RETURN(const uint64_t read_ts, ReadTs());
  const auto since = Clock::now();
  for (int attempt = 0;; ++attempt) {
    FARPOOL_ASSIGN_OR_RETURN(
        Reply r, s_.client_->Call(p, Opcode::kReadRequest, ReadRequest{t.id(), 1, read_ts},
                                  Opcode::kReadReply,
                                  std::span(reinterpret_cast<const std::byte*>(&key), 8)));
    FARPOOL_ASSIGN_OR_RETURN(std::vector<ReadValue> items, ParseReadItems(r.message));
    if (items.size() != 1 || items[0].item.key != key) {
      return Status::Protocol(s_.client_->name(p) + ": read reply does not answer key " +
                              std::to_string(key));
    }
    switch (static_cast<ReadState>(items[0].item.state)) {
      case ReadState::kFound:
        return std::optional<std::string>(std::string(items[0].value));
      case ReadState::kNotFound:
        return std::optional<std::string>();
      case ReadState::kBusy:
        break;
    }
    FARPOOL_RETURN_IF_ERROR(WaitForLock(p, items[0].item, attempt, since));
  }
}

Status ShardedTxn::Get(const Table& table, int64_t key, Row* row, ColumnSet columns) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  const std::string* value;
  std::optional<std::string> committed;
  auto w = writes_.find({table.id(), key});
  if (w != writes_.end()) {
    if (w->second.deleted) return Status::NotFound("key " + std::to_string(key) + " deleted");
    value = &w->second.value;
  } else {
    FARPOOL_ASSIGN_OR_RETURN(committed, ReadCommitted(table, key));
    if (!committed)
      return Status::NotFound("no row with key " + std::to_string(key) + " in '" + table.name() +
                              "'");
    value = &*committed;
  }
  FARPOOL_RETURN_IF_ERROR(DecodeRow(table, *value, row));
  KeepColumns(columns, *row);
  return Status::Ok();
}

Status ShardedTxn::Put(const Table& table, int64_t key, const Row& row) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  if (row.schema() == nullptr || RowAccess::payload(row).size() != table.schema().PayloadSize()) {
    return Status::InvalidArgument("row does not match the schema of '" + table.name() + "'");
  }
  std::string value = EncodeRow(row);
  if (value.size() > kMaxValue) {
    return Status::InvalidArgument("row of " + std::to_string(value.size()) +
                                   " bytes exceeds the limit of " + std::to_string(kMaxValue));
  }
  writes_[{table.id(), key}] = WriteEntry{&table, false, std::move(value)};
  return Status::Ok();
}

Status ShardedTxn::Delete(const Table& table, int64_t key) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  auto w = writes_.find({table.id(), key});
  if (w != writes_.end()) {
    if (w->second.deleted) return Status::NotFound("key " + std::to_string(key) + " deleted");
  } else {
    FARPOOL_ASSIGN_OR_RETURN(std::optional<std::string> v, ReadCommitted(table, key));
    if (!v) return Status::NotFound("no row with key " + std::to_string(key));
  }
  writes_[{table.id(), key}] = WriteEntry{&table, true, {}};
  return Status::Ok();
}

Status ShardedTxn::Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
                        ColumnSet columns, const std::function<bool(int64_t, const Row&)>& visit) {
  FARPOOL_RETURN_IF_ERROR(Usable());
  if (!table.ordered()) {
    return Status::InvalidArgument("table '" + table.name() + "' is not ordered (no scans)");
  }
  Client& c = *s_.client_;
  const auto since = Clock::now();
  ScanRequest req{};
  req.table = table.id();
  req.limit = static_cast<uint32_t>(std::min<size_t>(limit, UINT32_MAX));
  FARPOOL_ASSIGN_OR_RETURN(req.read_ts, ReadTs());
  req.lo = lo;
  req.hi = hi;
  req.reverse = reverse;
  for (int attempt = 0;; ++attempt) {
    std::vector<uint64_t> ids;
    for (size_t p = 0; p < c.size(); ++p) {
      FARPOOL_ASSIGN_OR_RETURN(uint64_t id, c.Post(p, Opcode::kScanRequest, req));
      ids.push_back(id);
    }
    std::vector<Reply> replies;
    Status failed;
    for (uint64_t id : ids) {
      auto r = c.Wait(id, Opcode::kScanReply);
      if (!r.ok()) {
        if (failed.ok()) failed = r.status();
        continue;
      }
      replies.push_back(std::move(*r));
    }
    FARPOOL_RETURN_IF_ERROR(failed);
    std::vector<std::pair<int64_t, std::string_view>> rows;
    std::optional<std::pair<size_t, ReadItem>> busy;
    for (size_t p = 0; p < replies.size(); ++p) {
      FARPOOL_ASSIGN_OR_RETURN(std::vector<ReadValue> items, ParseReadItems(replies[p].message));
      for (const ReadValue& v : items) {
        if (v.item.state == uint8_t(ReadState::kBusy))
          busy = {p, v.item};
        else if (v.item.state == uint8_t(ReadState::kFound))
          rows.push_back({v.item.key, v.value});
      }
    }
    if (busy) {
      FARPOOL_RETURN_IF_ERROR(WaitForLock(busy->first, busy->second, attempt, since));
      continue;
    }
    std::sort(rows.begin(), rows.end(), [&](const auto& a, const auto& b) {
      return reverse ? a.first > b.first : a.first < b.first;
    });
    if (limit != 0 && rows.size() > limit) rows.resize(limit);
    Row row;
    for (const auto& [key, value] : rows) {
      FARPOOL_RETURN_IF_ERROR(DecodeRow(table, value, &row));
      KeepColumns(columns, row);
      if (!visit(key, row)) break;
    }
    return Status::Ok();
  }
}

Status ShardedTxn::Commit() {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  finished_ = true;
  if (aborted_) {
    return Status::Aborted(
        "an earlier call of this transaction returned Aborted: nothing is "
        "committed");
  }
  Client& c = *s_.client_;
  if (writes_.empty()) {
    ++s_.counters_.commits;
    return Status::Ok();
  }
  FARPOOL_ASSIGN_OR_RETURN(const uint64_t read_ts, ReadTs());
  const uint64_t txn = s_.NextTxnId();
  const size_t n = c.size();
  std::vector<TailWriter> tails(n);
  std::vector<uint32_t> counts(n, 0);
  for (const auto& [key, w] : writes_) {
    const size_t p = s_.db_.PartitionOf(key.second);
    WriteItem item{};
    item.table = key.first;
    item.op = uint8_t(w.deleted ? WriteOp::kDelete : WriteOp::kPut);
    item.key = key.second;
    item.value_size = static_cast<uint32_t>(w.value.size());
    tails[p].Put(item);
    tails[p].PutBytes(w.value);
    ++counts[p];
  }
  std::vector<size_t> participants;
  for (size_t p = 0; p < n; ++p) {
    if (counts[p] > 0) participants.push_back(p);
  }
  const uint32_t lease_ms = static_cast<uint32_t>(s_.db_.options().lease.count());
  const bool one_phase = participants.size() == 1 && participants[0] == 0;

  // Phase 1: prepare on every participant, all posted before waiting.
  std::vector<std::pair<size_t, uint64_t>> ids;
  for (size_t p : participants) {
    PrepareRequest req{txn, read_ts, counts[p], lease_ms, one_phase ? kPrepareOnePhase : 0, 0};
    FARPOOL_ASSIGN_OR_RETURN(uint64_t id,
                             c.Post(p, Opcode::kPrepareRequest, req, tails[p].bytes()));
    ids.push_back({p, id});
  }
  Status failed;
  std::vector<size_t> prepared;
  std::optional<std::pair<size_t, PrepareReply>> conflict;
  for (const auto& [p, id] : ids) {
    auto r = c.Wait(id, Opcode::kPrepareReply);
    if (!r.ok()) {
      if (failed.ok()) failed = r.status();
      continue;
    }
    auto reply = r->message.As<PrepareReply>();
    if (reply.conflict) {
      if (!conflict || reply.expired) conflict = {p, reply};
    } else {
      prepared.push_back(p);
    }
  }
  if (one_phase && failed.ok() && !conflict) {
    ++s_.counters_.commits;
    return Status::Ok();
  }
  auto release = [&](const std::vector<size_t>& parts) {
    for (size_t p : parts) {
      auto id = c.Post(p, Opcode::kCommitRequest, CommitRequest{txn, 0});
      if (id.ok()) c.MarkLazy(*id);
    }
  };
  if (!failed.ok() || conflict) {
    release(prepared);
    if (!failed.ok()) {
      if (failed.code() == StatusCode::kAborted) ++s_.counters_.aborts;
      return failed;
    }
    if (conflict->second.expired) {
      FARPOOL_RETURN_IF_ERROR(s_.db_.ResolveHolder(c, conflict->first, conflict->second.holder));
    }
    return Conflict(conflict->second.holder != 0
                        ? "write conflict: a key is locked by transaction " +
                              std::to_string(conflict->second.holder)
                        : std::string("write conflict: a key has a version newer than the snapshot "
                                      "(first committer wins)"));
  }
  Hook("locked");

  // Decision (and partition 0's install) at the timestamp service.
  const bool zero_participates = participants[0] == 0;
  auto decided = c.Call(0, Opcode::kDecideRequest,
                        DecideRequest{txn, zero_participates ? 1u : 0u, 0}, Opcode::kDecideReply);
  if (!decided.ok()) {
    // Aborted: a resolver found our locks expired and aborted us first. Any other failure
    // leaves the outcome to the resolvers (I3): report it without touching the locks.
    if (decided.status().code() == StatusCode::kAborted) {
      release(participants);
      ++s_.counters_.aborts;
    }
    return decided.status();
  }
  const uint64_t ts = decided->message.As<DecideReply>().commit_ts;
  Hook("decided");
  for (size_t p : participants) {
    if (p == 0) continue;
    FARPOOL_ASSIGN_OR_RETURN(uint64_t id,
                             c.Post(p, Opcode::kCommitRequest, CommitRequest{txn, ts}));
    c.MarkLazy(id);
  }
  ++s_.counters_.commits;
  return Status::Ok();
}

}  // namespace

size_t ShardedPartitionOf(int64_t key, size_t partitions) { return MixKey(key) % partitions; }

Result<std::unique_ptr<Database>> OpenShardedDatabase(const DatabaseOptions& options) {
  auto db = std::make_unique<ShardedDatabase>(options);
  FARPOOL_RETURN_IF_ERROR(db->Init().WithContext("sharded engine"));
  return std::unique_ptr<Database>(std::move(db));
}

}  // namespace farpool::db
