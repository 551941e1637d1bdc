#include "db/shard_server.h"

#include <cstring>
#include <set>

namespace farpool::db::shard {

// ================================================================ PartitionState

int64_t PartitionState::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<std::byte> PartitionState::Handle(std::span<const std::byte> request) {
  const uint64_t request_id = transport::RequestIdOf(request).value_or(0);
  auto m = Decode(request);
  Result<std::vector<std::byte>> reply =
      m.ok() ? Answer(*m) : Result<std::vector<std::byte>>(m.status());
  if (!reply.ok()) {
    if (reply.status().code() == StatusCode::kProtocol) ++rejected_;
    return EncodeError(request_id, reply.status().WithContext(Name()));
  }
  ++served_;
  return std::move(*reply);
}

void PartitionState::AppendRead(TailWriter& tail, int64_t key, const Record* rec,
                                uint64_t read_ts) const {
  ReadItem item{};
  item.key = key;
  item.state = uint8_t(ReadState::kNotFound);
  const Version* visible = nullptr;
  if (rec != nullptr) {
    if (rec->lock_txn != 0 && read_ts > rec->lock_read_ts) {
      item.state = uint8_t(ReadState::kBusy);
      item.holder = rec->lock_txn;
      item.expired = NowMs() > rec->lock_expiry_ms;
      tail.Put(item);
      return;
    }
    for (auto it = rec->versions.rbegin(); it != rec->versions.rend(); ++it) {
      if (it->ts <= read_ts) {
        visible = &*it;
        break;
      }
    }
  }
  if (visible != nullptr && !visible->deleted) {
    item.state = uint8_t(ReadState::kFound);
    item.value_size = static_cast<uint32_t>(visible->value.size());
    tail.Put(item);
    tail.PutBytes(visible->value);
    return;
  }
  tail.Put(item);
}

Result<std::vector<std::byte>> PartitionState::Read(const Message& m) {
  auto req = m.As<ReadRequest>();
  FARPOOL_ASSIGN_OR_RETURN(std::vector<int64_t> keys, ParseReadKeys(m));
  TailWriter tail;
  auto t = tables_.find(req.table);
  for (int64_t key : keys) {
    const Record* rec = nullptr;
    if (t != tables_.end()) {
      auto r = t->second.find(key);
      if (r != t->second.end()) rec = &r->second;
    }
    AppendRead(tail, key, rec, req.read_ts);
  }
  return Encode(m.header.request_id, Opcode::kReadReply,
                ReadReply{static_cast<uint32_t>(keys.size()), 0}, tail.bytes());
}

Result<std::vector<std::byte>> PartitionState::Scan(const Message& m) {
  auto req = m.As<ScanRequest>();
  if (req.reverse > 1) return Status::Protocol("ScanRequest: reverse must be 0 or 1");
  TailWriter tail;
  uint32_t count = 0;
  auto t = tables_.find(req.table);
  if (t != tables_.end() && req.lo <= req.hi) {
    Rows& rows = t->second;
    auto visit = [&](int64_t key, const Record& rec) -> bool {  // false: stop
      TailWriter one;
      AppendRead(one, key, &rec, req.read_ts);
      ReadItem item;
      std::memcpy(&item, one.bytes().data(), sizeof(item));
      if (item.state == uint8_t(ReadState::kBusy)) {
        // The whole scan must wait: answer with this one busy item.
        tail.bytes() = std::move(one.bytes());
        count = 1;
        return false;
      }
      if (item.state == uint8_t(ReadState::kFound)) {
        tail.bytes().insert(tail.bytes().end(), one.bytes().begin(), one.bytes().end());
        ++count;
      }
      return req.limit == 0 || count < req.limit;
    };
    if (req.reverse) {
      auto it = rows.upper_bound(req.hi);
      while (it != rows.begin()) {
        --it;
        if (it->first < req.lo) break;
        if (!visit(it->first, it->second)) break;
      }
    } else {
      for (auto it = rows.lower_bound(req.lo); it != rows.end() && it->first <= req.hi; ++it) {
        if (!visit(it->first, it->second)) break;
      }
    }
  }
  return Encode(m.header.request_id, Opcode::kScanReply, ReadReply{count, 0}, tail.bytes());
}

Result<std::vector<std::byte>> PartitionState::Prepare(const Message& m) {
  auto req = m.As<PrepareRequest>();
  if (req.txn == 0) return Status::Protocol("PrepareRequest: transaction id 0");
  if ((req.flags & ~kPrepareOnePhase) != 0)
    return Status::Protocol("PrepareRequest: unknown flags");
  if (prepared_.count(req.txn)) {
    return Status::Protocol("PrepareRequest: transaction " + std::to_string(req.txn) +
                            " is already prepared here");
  }
  FARPOOL_ASSIGN_OR_RETURN(std::vector<WriteValue> writes, ParseWriteItems(m));
  const int64_t now = NowMs();
  PrepareReply reply{};
  // Check everything first, then lock everything: one request is atomic on this partition.
  std::vector<Record*> records;
  std::set<std::pair<uint32_t, int64_t>> seen;
  for (const WriteValue& w : writes) {
    if (!seen.insert({w.item.table, w.item.key}).second) {
      return Status::Protocol("PrepareRequest: key " + std::to_string(w.item.key) + " of table " +
                              std::to_string(w.item.table) + " appears twice");
    }
    Record& rec = tables_[w.item.table][w.item.key];
    records.push_back(&rec);
    if (reply.conflict) continue;
    if (rec.lock_txn != 0) {
      reply.conflict = 1;
      reply.holder = rec.lock_txn;
      reply.expired = now > rec.lock_expiry_ms;
    } else if (!rec.versions.empty() && rec.versions.back().ts > req.read_ts) {
      reply.conflict = 1;  // first committer wins
    }
  }
  if (!reply.conflict && req.count > 0) {
    auto& keys = prepared_[req.txn];
    for (size_t i = 0; i < writes.size(); ++i) {
      Record& rec = *records[i];
      rec.lock_txn = req.txn;
      rec.lock_read_ts = req.read_ts;
      rec.lock_expiry_ms = now + req.lease_ms;
      rec.pending_delete = writes[i].item.op == uint8_t(WriteOp::kDelete);
      rec.pending.assign(writes[i].value);
      keys.push_back({writes[i].item.table, writes[i].item.key});
    }
    if (req.flags & kPrepareOnePhase) {
      auto ts = Decide(req.txn);
      if (!ts.ok()) {
        Finish(req.txn, 0);
        return ts.status();
      }
      Finish(req.txn, *ts);
      reply.commit_ts = *ts;
    }
  }
  return Encode(m.header.request_id, Opcode::kPrepareReply, reply);
}

uint64_t PartitionState::Finish(uint64_t txn, uint64_t ts) {
  auto it = prepared_.find(txn);
  if (it == prepared_.end()) return 0;
  uint64_t n = 0;
  for (const auto& [table, key] : it->second) {
    Record& rec = tables_[table][key];
    if (rec.lock_txn != txn) continue;
    if (ts != 0) rec.versions.push_back({ts, rec.pending_delete, std::move(rec.pending)});
    rec.lock_txn = 0;
    rec.pending.clear();
    ++n;
  }
  prepared_.erase(it);
  return n;
}

void PartitionState::PruneDecisions() {
  const int64_t horizon = NowMs() - std::chrono::milliseconds(kDecisionRetention).count();
  while (!decision_order_.empty() && decision_order_.front().first < horizon) {
    decisions_.erase(decision_order_.front().second);
    decision_order_.pop_front();
  }
}

Result<uint64_t> PartitionState::Decide(uint64_t txn) {
  auto it = decisions_.find(txn);
  if (it != decisions_.end()) {
    if (it->second.ts == 0) {
      return Status::Aborted("transaction " + std::to_string(txn) +
                             " was aborted by a resolver (its lease expired)");
    }
    return it->second.ts;
  }
  PruneDecisions();
  const uint64_t ts = ++clock_;
  decisions_[txn] = {ts, NowMs()};
  decision_order_.push_back({NowMs(), txn});
  return ts;
}

uint64_t PartitionState::Resolve(uint64_t txn) {
  auto it = decisions_.find(txn);
  if (it != decisions_.end()) return it->second.ts;
  decisions_[txn] = {0, NowMs()};
  decision_order_.push_back({NowMs(), txn});
  return 0;
}

Result<std::vector<std::byte>> PartitionState::Answer(const Message& m) {
  const uint64_t id = m.header.request_id;
  switch (m.opcode) {
    case Opcode::kBeginRequest:
      return Encode(id, Opcode::kBeginReply, BeginReply{clock_});
    case Opcode::kReadRequest:
      return Read(m);
    case Opcode::kScanRequest:
      return Scan(m);
    case Opcode::kPrepareRequest:
      return Prepare(m);
    case Opcode::kDecideRequest: {
      auto req = m.As<DecideRequest>();
      if (req.txn == 0) return Status::Protocol("DecideRequest: transaction id 0");
      FARPOOL_ASSIGN_OR_RETURN(uint64_t ts, Decide(req.txn));
      if (req.install_here) Finish(req.txn, ts);
      return Encode(id, Opcode::kDecideReply, DecideReply{ts});
    }
    case Opcode::kResolveRequest: {
      auto req = m.As<ResolveRequest>();
      return Encode(id, Opcode::kResolveReply, ResolveReply{Resolve(req.txn)});
    }
    case Opcode::kCommitRequest: {
      auto req = m.As<CommitRequest>();
      return Encode(id, Opcode::kCommitReply, CommitReply{Finish(req.txn, req.commit_ts)});
    }
    case Opcode::kCreateTableRequest: {
      auto desc = m.As<TableDesc>();
      FARPOOL_ASSIGN_OR_RETURN(std::string name, NameOf(desc.name));
      if (desc.ncols == 0 || desc.ncols > kMaxColumns) {
        return Status::Protocol("CreateTableRequest: " + std::to_string(desc.ncols) + " columns");
      }
      if (catalog_.count(name)) {
        return Status::AlreadyExists("table '" + name + "' already exists");
      }
      desc.id = next_table_id_++;
      catalog_[name] = desc;
      return Encode(id, Opcode::kTableReply, desc);
    }
    case Opcode::kOpenTableRequest: {
      FARPOOL_ASSIGN_OR_RETURN(std::string name, NameOf(m.As<NameRequest>().name));
      auto it = catalog_.find(name);
      if (it == catalog_.end()) return Status::NotFound("no table '" + name + "'");
      return Encode(id, Opcode::kTableReply, it->second);
    }
    case Opcode::kDropTableRequest: {
      FARPOOL_ASSIGN_OR_RETURN(std::string name, NameOf(m.As<NameRequest>().name));
      if (catalog_.erase(name) == 0) return Status::NotFound("no table '" + name + "'");
      return Encode(id, Opcode::kDropTableReply, DropTableReply{0});
    }
    case Opcode::kListTablesRequest: {
      TailWriter tail;
      for (const auto& [name, desc] : catalog_) {
        NameRequest n{};
        std::memcpy(n.name, desc.name, kNameSize);
        tail.Put(n);
      }
      return Encode(id, Opcode::kListTablesReply,
                    ListTablesReply{static_cast<uint32_t>(catalog_.size()), 0}, tail.bytes());
    }
    case Opcode::kLockedRequest: {
      auto req = m.As<LockedRequest>();
      const int64_t now = NowMs();
      LockedReply reply{};
      std::set<uint64_t> expired;
      for (const auto& [table, rows] : tables_) {
        if (req.table != UINT32_MAX && table != req.table) continue;
        for (const auto& [key, rec] : rows) {
          if (rec.lock_txn == 0) continue;
          ++reply.locked;
          if (now > rec.lock_expiry_ms) expired.insert(rec.lock_txn);
        }
      }
      TailWriter tail;
      for (uint64_t h : expired) tail.Put(h);
      reply.count = static_cast<uint32_t>(expired.size());
      return Encode(id, Opcode::kLockedReply, reply, tail.bytes());
    }
    default:
      break;
  }
  return Status::Protocol(std::string(OpcodeName(m.opcode)) + " is a reply, not a request");
}

// ================================================================ PartitionServer

// Serves the partition on its AmServer's progress thread.
class PartitionServer::Impl : public transport::AmHandler {
 public:
  explicit Impl(const PartitionServerOptions& o) : options_(o), state_(o.id) {}
  // Joins the progress thread while this handler is still whole.
  ~Impl() override { Stop(); }

  Status Init(uint16_t* port_out) {
    transport::AmServerOptions ao;
    ao.host = options_.host;
    ao.port = options_.port;
    ao.am_id = kShardAm;
    ao.progress = options_.progress;
    ao.event_spin = options_.event_spin;
    ao.fabric = options_.fabric;
    FARPOOL_ASSIGN_OR_RETURN(am_, transport::AmServer::Listen(ao));
    *port_out = am_->port();
    return Status::Ok();
  }
  void Serve() { am_->Start(*this); }
  void Stop() {
    if (am_) am_->Stop();
  }

  std::vector<std::byte> Handle(std::span<const std::byte> message, transport::Peer*) override {
    return state_.Handle(message);
  }
  std::vector<std::byte> Refuse(const Status& reason) override {
    return EncodeError(0, reason.WithContext("partition " + std::to_string(options_.id)));
  }

 private:
  PartitionServerOptions options_;
  PartitionState state_;
  std::unique_ptr<transport::AmServer> am_;
};

Result<std::unique_ptr<PartitionServer>> PartitionServer::Start(
    const PartitionServerOptions& options) {
  std::unique_ptr<PartitionServer> server(new PartitionServer());
  server->impl_ = std::make_unique<Impl>(options);
  Status s = server->impl_->Init(&server->port_);
  if (!s.ok()) {
    return s.WithContext("partition " + std::to_string(options.id) + " (" + options.host + ":" +
                         std::to_string(options.port) + ")");
  }
  server->impl_->Serve();
  return server;
}

void PartitionServer::Stop() { impl_->Stop(); }

PartitionServer::~PartitionServer() { Stop(); }

}  // namespace farpool::db::shard
