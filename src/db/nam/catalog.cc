// The catalog of the NAM engines: the root, table descriptors, DDL under the catalog lock, and
// opening the database (nam_internal.h describes the whole engine).
#include <unistd.h>

#include <bit>
#include <cstring>

#include "db/nam/nam_engine.h"
#include "db/nam/nam_internal.h"

namespace farpool::db {

Status NamDatabase::Init() {
  OpCount c;
  Access access(memory_, c);
  const GlobalAddress root = memory_.Root();
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(root, 0, kStateCreating));
  if (prev == 0) {
    // We create the catalog: everything but the state word, then the state that publishes it.
    RootImage r{};
    r.magic = kMagic;
    r.max_slots = options_.max_sessions;
    r.lease_ms = std::max<uint64_t>(50, options_.lease.count());
    if (r.max_slots == 0 || r.max_slots > 65535) {
      return Status::InvalidArgument("max_sessions must be 1..65535");
    }
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress slots,
                             AllocZeroed(access, r.max_slots * kSlotSize, Placement::Striped()));
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress snapshots,
                             AllocZeroed(access, r.max_slots * 8, Placement::Striped()));
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress tables,
                             AllocZeroed(access, kMaxTables * kDescSize, Placement::Striped()));
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress dirs, Recycler::CreateDirectories(access));
    r.slots = slots.raw();
    r.snapshots = snapshots.raw();
    r.tables = tables.raw();
    r.chunk_dirs = dirs.raw();
    r.counter = 1;
    FARPOOL_RETURN_IF_ERROR(
        access.Write(root + 8, reinterpret_cast<const unsigned char*>(&r) + 8, sizeof(r) - 8));
    uint64_t ready = kStateReady;
    FARPOOL_RETURN_IF_ERROR(access.Write(root, &ready, 8));
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      FARPOOL_RETURN_IF_ERROR(access.Read(root, &root_, sizeof(root_)));
      if (root_.state == kStateReady) break;
      if (std::chrono::steady_clock::now() > deadline) {
        return Status::Unavailable("database catalog at " + root.ToString() +
                                   " is still being created by another process (state " +
                                   std::to_string(root_.state) + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  FARPOOL_RETURN_IF_ERROR(access.Read(root, &root_, sizeof(root_)));
  if (root_.magic != kMagic) {
    return Status::Protocol("the root area at " + root.ToString() +
                            " holds no farpool database of this version (magic " +
                            std::to_string(root_.magic) + ")");
  }
  observed_.resize(root_.max_slots);
  FARPOOL_ASSIGN_OR_RETURN(recycler_,
                           Recycler::Open(access, GlobalAddress::FromRaw(root_.chunk_dirs)));
  FARPOOL_RETURN_IF_ERROR(StartRenewals());
  FARPOOL_ASSIGN_OR_RETURN(system_, OpenSession(access));
  StartMaintenance();
  return Status::Ok();
}

NamDatabase::~NamDatabase() {
  // Reclamation first, while the renewal thread still keeps the system session's lease.
  StopThread(&stop_maintenance_, maintenance_);
  if (system_) {
    // What this process retired but did not free yet is freed now; its caches go back to
    // their chunks (and emptied chunks to their servers).
    (void)ReclaimRetired(access_);
    auto sys = System();
    if (sys.ok()) (void)recycler_->Flush(access_, **sys);
  }
  StopThread(&stop_renewals_, renewals_);
  system_.reset();
}

Result<std::shared_ptr<NamSession>> NamDatabase::System() {
  std::lock_guard<std::mutex> l(system_mu_);
  if (system_ != nullptr) {
    Status s = system_->CheckLease();
    if (s.ok()) return system_;
    // A renewal that failed on the transport may leave the lease ours: only a fenced
    // (or abandoned) session is replaced.
    if (!system_->lease_->fenced.load()) return s;
  }
  FARPOOL_ASSIGN_OR_RETURN(system_, OpenSession(access_));
  return system_;
}

// ---------------------------------------------------------------- DDL lock

// The DDL lock word holds its holder's lock word (a system session); a dead holder's lock is
// taken over after the holder is fenced.
Status NamDatabase::LockDdl(NamSession& me) {
  const int64_t give_up = MonoNs() + 4 * lease_ns();
  for (int i = 0;; ++i) {
    FARPOOL_RETURN_IF_ERROR(me.CheckLease());
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, me.access_.Cas(RootField(kRootDdl), 0, me.lock_word()));
    if (prev == 0) return Status::Ok();
    FARPOOL_ASSIGN_OR_RETURN(bool dead, me.HolderDead(prev));
    if (dead) {
      FARPOOL_ASSIGN_OR_RETURN(uint64_t p2,
                               me.access_.Cas(RootField(kRootDdl), prev, me.lock_word()));
      if (p2 == prev) return Status::Ok();
    }
    if (MonoNs() > give_up) {
      return Status::TimedOut("the catalog's DDL lock stays held by session slot " +
                              std::to_string(LockSlot(prev)) + " (alive)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 + i * 10)));
  }
}

Status NamDatabase::UnlockDdl(NamSession& me) {
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, me.access_.Cas(RootField(kRootDdl), me.lock_word(), 0));
  if (prev != me.lock_word()) {
    return Status::Unavailable(
        "the catalog's DDL lock was taken over (this process lost its lease)");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- tables

Result<std::unique_ptr<NamTable>> NamDatabase::MakeTable(uint32_t id, const TableDesc& d) const {
  auto t = std::make_unique<NamTable>();
  t->id_ = id;
  t->incarnation_ = d.incarnation;
  t->name_ = std::string(d.name, strnlen(d.name, sizeof(d.name)));
  std::vector<Column> cols;
  for (uint64_t i = 0; i < d.ncols && i < Schema::kMaxColumns; ++i) {
    Column c;
    c.name = std::string(d.cols[i].name, strnlen(d.cols[i].name, sizeof(d.cols[i].name)));
    c.type = static_cast<ColumnType>(d.cols[i].type);
    c.length = d.cols[i].length;
    if (c.type == ColumnType::kBytes) t->bytes_columns_.push_back(static_cast<uint32_t>(i));
    cols.push_back(c);
  }
  t->schema_ = Schema(std::move(cols));
  t->layout_.payload = d.payload;
  t->desc_ = GlobalAddress::FromRaw(root_.tables) + id * kDescSize;
  if (d.hash_arrays < 1 || d.hash_arrays > kMaxHashArrays) {
    return Status::Internal("table '" + t->name_ + "': its descriptor names " +
                            std::to_string(d.hash_arrays) + " hash arrays (1.." +
                            std::to_string(kMaxHashArrays) + " expected): corruption");
  }
  std::vector<GlobalAddress> arrays{GlobalAddress::FromRaw(d.hash_addr)};
  for (uint64_t i = 1; i < d.hash_arrays; ++i)
    arrays.push_back(GlobalAddress::FromRaw(d.hash_more[i - 1]));
  t->hash_.emplace(std::move(arrays), d.hash_count, d.hash_seed, IndexWaitLimit());
  if (d.flags & 1) t->btree_.emplace(t->desc_ + kDescBtreeRoot, IndexWaitLimit());
  return t;
}

Status NamDatabase::LoadTables(const Access& access) {
  // The whole descriptor area in one read (256 KiB: one round trip, not one per descriptor).
  std::vector<unsigned char> area(kMaxTables * kDescSize);
  FARPOOL_RETURN_IF_ERROR(
      access.Read(GlobalAddress::FromRaw(root_.tables), area.data(), area.size()));
  std::vector<TableDesc> descs(kMaxTables);
  for (uint64_t i = 0; i < kMaxTables; ++i)
    std::memcpy(&descs[i], area.data() + i * kDescSize, sizeof(TableDesc));
  std::lock_guard<std::mutex> l(mu_);
  for (uint32_t i = 0; i < kMaxTables; ++i) {
    auto known = by_id_.find(i);
    const bool current = descs[i].state == kDescLive && known != by_id_.end() &&
                         known->second->incarnation_ == descs[i].incarnation;
    if (known != by_id_.end() && !current) {
      // Dropped (and maybe re-created) since we cached it: keep the object for old handles.
      auto it = tables_.find(known->second->name_);
      if (it != tables_.end() && it->second.get() == known->second) {
        // Its B+tree's nodes are freed once reclaimed: no cached copy may outlive them.
        if (it->second->btree_) it->second->btree_->DropCache();
        dropped_.push_back(std::move(it->second));
        tables_.erase(it);
      }
      by_id_.erase(known);
    }
    if (descs[i].state != kDescLive || current) continue;
    FARPOOL_ASSIGN_OR_RETURN(auto t, MakeTable(i, descs[i]));
    by_id_[i] = t.get();
    tables_[t->name_] = std::move(t);
  }
  return Status::Ok();
}

Result<uint32_t> NamDatabase::NewDescriptor(const std::string& name, const Schema& schema,
                                            const TableOptions& options, uint64_t state,
                                            uint64_t reclaimer) {
  if (name.empty() || name.size() >= 64) {
    return Status::InvalidArgument("table name '" + name + "' must be 1..63 bytes");
  }
  FARPOOL_RETURN_IF_ERROR(schema.Validate());
  FARPOOL_ASSIGN_OR_RETURN(std::shared_ptr<NamSession> sys, System());
  const Access& access = sys->access_;
  FARPOOL_RETURN_IF_ERROR(LockDdl(*sys));
  int free_id = -1;
  auto body = [&]() -> Status {
    FARPOOL_RETURN_IF_ERROR(LoadTables(access));
    {
      std::lock_guard<std::mutex> l(mu_);
      if (tables_.count(name)) return Status::AlreadyExists("table '" + name + "' already exists");
    }
    std::vector<unsigned char> area(kMaxTables * kDescSize);
    FARPOOL_RETURN_IF_ERROR(
        access.Read(GlobalAddress::FromRaw(root_.tables), area.data(), area.size()));
    for (uint32_t i = 0; i < kMaxTables && free_id < 0; ++i) {
      uint64_t word;
      std::memcpy(&word, area.data() + i * kDescSize, 8);
      if (word == kDescEmpty) free_id = static_cast<int>(i);
    }
    if (free_id < 0) {
      return Status::ResourceExhausted("the catalog holds " + std::to_string(kMaxTables) +
                                       " tables already (dropped ones are freed once reclaimed)");
    }
    TableDesc d{};
    std::memcpy(d.name, name.data(), name.size());
    d.flags = options.ordered ? 1 : 0;
    d.payload = (schema.PayloadSize() + 7) & ~7u;
    d.reclaimer = reclaimer;
    // One bucket array per memory server (up to kMaxHashArrays), so that records can sit on
    // their bucket's server and a table is still spread over all of them. Each array a power
    // of two: a recycler object of exactly its size class, so a dropped table's arrays are
    // reused whole by the next table of that size.
    std::vector<uint16_t> servers = memory_.servers();
    if (servers.size() > kMaxHashArrays) servers.resize(kMaxHashArrays);
    const uint64_t total = std::max<uint64_t>(16, options.expected_rows / 4);
    const uint64_t buckets =
        std::bit_ceil(std::max<uint64_t>(16, (total + servers.size() - 1) / servers.size()));
    FARPOOL_ASSIGN_OR_RETURN(auto arrays, HashIndex::CreateStriped(access, *sys, buckets, servers));
    d.hash_addr = arrays[0].raw();
    d.hash_arrays = arrays.size();
    for (size_t i = 1; i < arrays.size(); ++i) d.hash_more[i - 1] = arrays[i].raw();
    d.hash_count = buckets;
    d.hash_seed = Mix64(free_id + 1);
    FARPOOL_ASSIGN_OR_RETURN(uint64_t inc, access.Faa(RootField(kRootIncarnations), 1));
    d.incarnation = inc + 1;
    d.ncols = schema.size();
    for (size_t i = 0; i < schema.size(); ++i) {
      const auto& col = schema.columns()[i];
      std::memcpy(d.cols[i].name, col.name.data(), col.name.size());
      d.cols[i].type = uint32_t(col.type);
      d.cols[i].length = col.length;
    }
    const GlobalAddress desc = GlobalAddress::FromRaw(root_.tables) + free_id * kDescSize;
    // Body first, the state word that makes it live (or a load's) last.
    FARPOOL_RETURN_IF_ERROR(sys->CheckLease());
    FARPOOL_RETURN_IF_ERROR(
        access.Write(desc + 8, reinterpret_cast<const unsigned char*>(&d) + 8, sizeof(d) - 8));
    if (options.ordered) {
      FARPOOL_RETURN_IF_ERROR(BTree::Create(access, *sys, desc + kDescBtreeRoot));
    }
    FARPOOL_RETURN_IF_ERROR(sys->CheckLease());
    return access.Write(desc, &state, 8);
  };
  Status s = body();
  Status u = UnlockDdl(*sys);
  FARPOOL_RETURN_IF_ERROR(s);
  FARPOOL_RETURN_IF_ERROR(u);
  return static_cast<uint32_t>(free_id);
}

Result<std::unique_ptr<NamTable>> NamDatabase::ReadTable(const Access& access, uint32_t id) {
  TableDesc d;
  FARPOOL_RETURN_IF_ERROR(
      access.Read(GlobalAddress::FromRaw(root_.tables) + id * kDescSize, &d, sizeof(d)));
  return MakeTable(id, d);
}

Result<const Table*> NamDatabase::CreateTable(const std::string& name, const Schema& schema,
                                              const TableOptions& options) {
  FARPOOL_RETURN_IF_ERROR(NewDescriptor(name, schema, options, kDescLive, 0).status());
  return OpenTable(name);
}

Result<const Table*> NamDatabase::OpenTable(const std::string& name) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = tables_.find(name);
    if (it != tables_.end()) return static_cast<const Table*>(it->second.get());
  }
  OpCount c;
  Access access(memory_, c);
  FARPOOL_RETURN_IF_ERROR(LoadTables(access));
  std::lock_guard<std::mutex> l(mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) return Status::NotFound("no table '" + name + "'");
  return static_cast<const Table*>(it->second.get());
}

Status NamDatabase::DropTable(const std::string& name) {
  FARPOOL_ASSIGN_OR_RETURN(const Table* t, OpenTable(name));
  const auto* nt = static_cast<const NamTable*>(t);
  FARPOOL_ASSIGN_OR_RETURN(std::shared_ptr<NamSession> sys, System());
  const Access& access = sys->access_;
  FARPOOL_RETURN_IF_ERROR(LockDdl(*sys));
  // Our handle may be stale (dropped, even re-created, by another process): drop only the
  // table it names, once.
  auto live = TableLive(access, *nt);
  Status s = live.ok() ? (*live ? Status::Ok()
                                : Status::NotFound("table '" + name +
                                                   "' was dropped already (by another process)"))
                       : live.status();
  // Who reclaims it, then the state that publishes the drop.
  const uint64_t dropped = kDescDropped, reclaimer = sys->lock_word();
  if (s.ok()) s = sys->CheckLease();
  if (s.ok()) s = access.Write(nt->desc_ + kDescReclaimer, &reclaimer, 8);
  if (s.ok()) s = access.Write(nt->desc_, &dropped, 8);
  Status u = UnlockDdl(*sys);
  if (s.code() == StatusCode::kNotFound) (void)LoadTables(access);  // forget the stale handle
  FARPOOL_RETURN_IF_ERROR(s);
  FARPOOL_RETURN_IF_ERROR(u);
  // A stamp after the drop: once the low-water mark reaches it, no snapshot from before the
  // drop is left, and the maintenance thread frees the table's memory.
  FARPOOL_ASSIGN_OR_RETURN(uint64_t word, access.Faa(RootField(kRootCounter), 1));
  const uint64_t prev = CounterOf(word);
  NoteCounter(prev + 1);
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = tables_.find(name);
    if (it != tables_.end()) {
      if (it->second->btree_) it->second->btree_->DropCache();  // as in LoadTables
      dropped_.push_back(std::move(it->second));
      tables_.erase(it);
    }
    by_id_.erase(nt->id_);
  }
  std::lock_guard<std::mutex> l(retire_mu_);
  drop_queue_.push_back({nt, prev + 1, reclaimer});
  return Status::Ok();
}

Result<std::vector<std::string>> NamDatabase::ListTables() {
  OpCount c;
  Access access(memory_, c);
  FARPOOL_RETURN_IF_ERROR(LoadTables(access));
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> names;
  for (const auto& [name, t] : tables_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------- open

Result<std::unique_ptr<Database>> OpenNamDatabase(const DatabaseOptions& options) {
  std::unique_ptr<Pool> pool;
  std::unique_ptr<Memory> memory;
  if (options.engine == Engine::kPool) {
    if (options.cluster_file.empty())
      return Status::InvalidArgument("pool engine: no cluster file");
    FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(options.cluster_file));
    FARPOOL_ASSIGN_OR_RETURN(pool, Pool::Connect(config));
    memory = NewPoolMemory(*pool);
  } else {
    FARPOOL_ASSIGN_OR_RETURN(memory, NewLocalMemory(options.local_servers, options.local_memory));
  }
  auto db = std::make_unique<NamDatabase>(options.engine, *memory, options);
  db->owned_pool_ = std::move(pool);
  db->owned_memory_ = std::move(memory);
  FARPOOL_RETURN_IF_ERROR(db->Init());
  return std::unique_ptr<Database>(std::move(db));
}

}  // namespace farpool::db
