// The NAM engines. How it works (the full story is docs/database.md):
//
// Catalog: Memory::Root() holds a CatalogRoot: creation state, options fixed at creation
// (timestamp mode, session slots, lease), and the addresses of the slot table, the timestamp
// vector, the global counter and the table directory (kMaxTables descriptors of 1 KiB). A
// process that opens the database reads the root; the first one creates it (CAS on state).
//
// Sessions: a session claims a slot of the slot table by a CAS on its owner word, which holds
// state, epoch and lease expiry together (so claim, renewal and fencing are each one atomic
// CAS and no one acts on a stale expiry), and renews the lease from the database's heartbeat
// thread. Its lock word is LockWord(slot, epoch). A slot whose lease expired is fenced by a
// CAS that bumps its epoch, and its commit log is rolled forward by whoever does that.
//
// Commit (RSI): lock the write set with one CAS per record that expects the version read
// (unlocked word = newest seq << 1), so a successful lock also validates first-committer-wins;
// take the commit stamp; write the commit log (the decision) and the spilled old versions;
// write the new cells; unlock with the new seq, publish the slot's timestamp and clear the log
// in one batch. Each step is one batch: post everything, wait once.
#include "db/nam_engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "db/index/btree.h"
#include "db/index/hash_index.h"
#include "db/layout.h"
#include "db/lock_owner.h"

namespace farpool::db {
namespace {

constexpr uint64_t kMagic = 0x4650444200000001ULL;  // "FPDB" v1
constexpr uint64_t kMaxTables = 256;
constexpr uint64_t kDescSize = 1024;
constexpr uint64_t kSlotSize = 64;
constexpr uint64_t kLogBytes = 256 << 10;
constexpr uint64_t kSlotFree = 0, kSlotActive = 1, kSlotRecovering = 2;
constexpr uint64_t kStateCreating = 1, kStateReady = 2;
constexpr size_t kAddressCacheLimit = 1 << 20;

uint64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

struct RootImage {
  uint64_t state, magic, ts_mode, max_slots, lease_ms, slots, tsvec, counter, ddl, tables;
  uint64_t base_ms;  // CLOCK_REALTIME ms at creation: lease expiries count from it
};
constexpr uint64_t kRootState = 0, kRootCounter = 56, kRootDdl = 64;

struct TableDesc {
  uint64_t state;  // 0 empty, 1 live, 2 dropped
  char name[64];
  uint64_t flags;  // bit 0: ordered
  uint64_t payload;
  uint64_t hash_addr, hash_count, hash_seed;
  uint64_t btree_root;  // root word of the B+tree (this field's address is the root word)
  uint64_t ncols;
  struct {
    char name[24];
    uint32_t type;
    uint32_t length;
  } cols[Schema::kMaxColumns];
};
static_assert(sizeof(TableDesc) <= kDescSize);
constexpr uint64_t kDescBtreeRoot = offsetof(TableDesc, btree_root);

struct SlotImage {
  uint64_t owner;  // expiry (ms since base) << 26 | epoch (24 bits) << 2 | state
  uint64_t reserved;
  uint64_t log;
  uint64_t pid;
};
constexpr uint64_t kOwnerEpochMask = (1u << 24) - 1;
uint64_t OwnerWord(uint64_t epoch, uint64_t state, uint64_t expiry_rel) {
  return (expiry_rel << 26) | ((epoch & kOwnerEpochMask) << 2) | state;
}
uint64_t OwnerEpoch(uint64_t w) { return (w >> 2) & kOwnerEpochMask; }
uint64_t OwnerState(uint64_t w) { return w & 3; }
uint64_t OwnerExpiry(uint64_t w) { return w >> 26; }
uint64_t LogState(uint64_t epoch) { return (epoch << 2) | 1; }

struct LogHeader {
  uint64_t state;  // epoch << 2 | 1 while a decided commit may be unfinished, else 0
  uint64_t stamp;
  uint64_t count;
  uint64_t bytes;
  uint64_t checksum;  // of the entries
  uint64_t pad[3];
};
static_assert(sizeof(LogHeader) == 64);
struct LogEntry {
  uint64_t record;
  uint64_t spill;  // address of the spilled old version, 0 if none
  uint64_t new_seq;
  uint32_t cell_offset;
  uint32_t cell_size;
  // followed by the new cell image, then (if spill) the spill node image
};
static_assert(sizeof(LogEntry) == 32);

Result<GlobalAddress> AllocZeroed(const Access& access, uint64_t size, Placement p) {
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress a, access.Alloc(size, p));
  std::vector<unsigned char> zeros(std::min<uint64_t>(size, 1 << 20), 0);
  for (uint64_t off = 0; off < size; off += zeros.size()) {
    FARPOOL_RETURN_IF_ERROR(
        access.Write(a + off, zeros.data(), std::min<uint64_t>(zeros.size(), size - off)));
  }
  return a;
}

class NamDatabase;

class NamTable final : public Table {
 public:
  uint32_t id() const override { return id_; }
  const std::string& name() const override { return name_; }
  const Schema& schema() const override { return schema_; }
  bool ordered() const override { return btree_.has_value(); }

  uint32_t id_ = 0;
  std::string name_;
  Schema schema_;
  RecordLayout layout_;
  GlobalAddress desc_;
  std::optional<HashIndex> hash_;
  std::optional<BTree> btree_;
  std::vector<uint32_t> bytes_columns_;
};

class NamSession;

class NamDatabase final : public Database {
 public:
  NamDatabase(Engine engine, Memory& memory, const DatabaseOptions& options)
      : engine_(engine), memory_(memory), options_(options) {}
  ~NamDatabase() override;

  Status Init();

  Engine engine() const override { return engine_; }
  TimestampMode timestamp_mode() const override {
    return root_.ts_mode == uint64_t(TimestampMode::kCounter) ? TimestampMode::kCounter
                                                              : TimestampMode::kVector;
  }
  Result<const Table*> CreateTable(const std::string& name, const Schema& schema,
                                   const TableOptions& options) override;
  Result<const Table*> OpenTable(const std::string& name) override;
  Status DropTable(const std::string& name) override;
  Result<std::vector<std::string>> ListTables() override;
  Result<std::unique_ptr<Session>> NewSession() override;
  Status RecoverExpired() override;
  Result<uint64_t> CountLocked(const Table& table) override;

  // ---- internals used by sessions and transactions
  Memory& memory() { return memory_; }
  const DatabaseOptions& options() const { return options_; }
  const RootImage& root() const { return root_; }
  bool vector_mode() const { return root_.ts_mode != uint64_t(TimestampMode::kCounter); }
  GlobalAddress RootField(uint64_t off) const { return memory_.Root() + off; }
  // Lease times, in ms since the database's creation.
  uint64_t NowRel() const { return NowMs() - root_.base_ms; }
  uint64_t LeaseEnd() const { return NowRel() + root_.lease_ms; }
  GlobalAddress SlotAddr(uint32_t s) const {
    return GlobalAddress::FromRaw(root_.slots) + s * kSlotSize;
  }
  GlobalAddress TsAddr(uint32_t s) const { return GlobalAddress::FromRaw(root_.tsvec) + s * 8; }

  Result<bool> HolderDead(const Access& access, uint64_t word);
  // Restores a record lock held by a dead session to the unlocked word of its newest version.
  Status BreakRecordLock(const Access& access, GlobalAddress record, const RecordLayout& layout,
                         uint64_t word);
  void Register(NamSession* s);
  void Unregister(NamSession* s);

 private:
  // Rolls forward the commit decided in slot `slot`'s log, if any. REQUIRES: the caller put
  // the slot in the recovering state (it alone recovers it).
  Status RecoverLog(const Access& access, uint32_t slot);
  // Fences slot `slot` from owner word `owner` (which must be expired) and recovers it. Returns
  // false if someone else changed the slot first.
  Result<bool> FenceAndRecover(const Access& access, uint32_t slot, uint64_t owner,
                               uint64_t final_state);
  Status LoadTables(const Access& access);
  Result<std::unique_ptr<NamTable>> MakeTable(uint32_t id, const TableDesc& d) const;
  Status LockDdl(const Access& access);
  void Heartbeat();

  Engine engine_;
  Memory& memory_;
  DatabaseOptions options_;
  RootImage root_{};
  std::mutex mu_;  // guards tables_, by_id_, sessions_
  std::map<std::string, std::unique_ptr<NamTable>> tables_;
  std::unordered_map<uint32_t, NamTable*> by_id_;
  std::set<NamSession*> sessions_;
  std::vector<std::unique_ptr<NamTable>> dropped_;  // kept for handles still held
  std::thread heartbeat_;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool stop_ = false;

 public:
  std::unique_ptr<Pool> owned_pool_;      // pool engine: the connection
  std::unique_ptr<Memory> owned_memory_;  // the Memory above, when owned
};

// ---------------------------------------------------------------- session

class NamSession final : public Session, public LockOwner {
 public:
  NamSession(NamDatabase& db, uint32_t slot, uint64_t epoch, GlobalAddress log, uint64_t counter)
      : db_(db),
        slot_(slot),
        epoch_(epoch),
        log_(log),
        counter_(counter),
        access_(db.memory(), count_) {}
  ~NamSession() override;

  Result<std::unique_ptr<Transaction>> Begin() override;
  const TxnCounters& counters() const override {
    counters_.reads = count_.reads;
    counters_.writes = count_.writes;
    counters_.cas = count_.cas;
    counters_.faa = count_.faa;
    return counters_;
  }
  uint64_t lock_word() const override { return LockWord(slot_, epoch_); }
  Result<bool> HolderDead(uint64_t word) override { return db_.HolderDead(access_, word); }

  NamDatabase& db_;
  const uint32_t slot_;
  const uint64_t epoch_;
  const GlobalAddress log_;
  uint64_t counter_;  // vector mode: this slot's last published commit counter
  OpCount count_;
  Access access_;
  mutable TxnCounters counters_;
  std::atomic<bool> fenced_{false};
  std::unordered_map<uint64_t, GlobalAddress> cache_;  // (table, key) -> record

  static uint64_t CacheKey(uint32_t table, int64_t key) {
    return Mix64((uint64_t(table) << 48) ^ static_cast<uint64_t>(key)) ^ key;
  }
  // The record of (table, key) or null; consults the cache first.
  Result<GlobalAddress> FindRecord(const NamTable& t, int64_t key);
};

// ---------------------------------------------------------------- transaction

struct WriteEntry {
  const NamTable* table = nullptr;
  int64_t key = 0;
  bool deleted = false;
  std::string payload;
  std::vector<std::string> bytes;  // per column, for kBytes columns
};

struct ReadEntry {
  GlobalAddress record;
  uint64_t newest_seq = 0;
  bool newest_visible = true;
  std::vector<unsigned char> image;  // the record copy the read decided on
};

class NamTxn final : public Transaction {
 public:
  NamTxn(NamSession& s, Snapshot snap) : s_(s), snap_(std::move(snap)) {}
  ~NamTxn() override { Rollback(); }

  Status Get(const Table& table, int64_t key, Row* row) override;
  Status Put(const Table& table, int64_t key, const Row& row) override;
  Status Delete(const Table& table, int64_t key) override;
  Status Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
              const std::function<bool(int64_t, const Row&)>& visit) override;
  Status Commit() override;
  void Rollback() override;

 private:
  using Key = std::pair<uint32_t, int64_t>;
  // Reads the record at `record` until a consistent copy; fills `re`. `key_ok` false if the
  // record is not key's (a raced index entry).
  Status ReadRecord(const NamTable& t, GlobalAddress record, int64_t key, ReadEntry* re,
                    RecordImage* image, bool* key_ok);
  // The version of `image` visible in the snapshot: sets *found, *deleted and copies payload.
  Status Visible(const NamTable& t, const RecordImage& image, bool* found, bool* deleted,
                 std::string* payload);
  Status LoadBlobs(const NamTable& t, const std::string& payload, Row* row);
  // Get without the write-set lookup, for Delete and Scan.
  Status ReadVisible(const NamTable& t, int64_t key, bool* found, bool* deleted,
                     std::string* payload);
  Status Finish(Status s);
  // If `record` is locked by a dead session, finishes that session's commit and breaks the lock.
  Status RecoverIfDead(const NamTable& t, GlobalAddress record) {
    uint64_t lock;
    FARPOOL_RETURN_IF_ERROR(s_.access_.Read(record, &lock, 8));
    if (!IsLocked(lock)) return Status::Ok();
    FARPOOL_ASSIGN_OR_RETURN(bool dead, s_.HolderDead(lock));
    if (!dead) return Status::Ok();
    return s_.db_.BreakRecordLock(s_.access_, record, t.layout_, lock);
  }
  void Hook(std::string_view point) {
    if (s_.db_.options().commit_hook) s_.db_.options().commit_hook(point);
  }

  NamSession& s_;
  Snapshot snap_;
  std::map<Key, WriteEntry> writes_;
  std::map<Key, ReadEntry> reads_;
  std::vector<GlobalAddress> blobs_;  // allocated by this transaction, freed on abort
  bool finished_ = false;
};

// ================================================================ NamDatabase

Status NamDatabase::Init() {
  OpCount c;
  Access access(memory_, c);
  const GlobalAddress root = memory_.Root();
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(root + kRootState, 0, kStateCreating));
  if (prev == 0) {
    // We create the catalog.
    RootImage r{};
    r.magic = kMagic;
    r.ts_mode = uint64_t(options_.timestamps);
    r.max_slots = options_.max_sessions;
    r.lease_ms = std::max<uint64_t>(50, options_.lease.count());
    if (r.max_slots == 0 || r.max_slots > 65535) {
      return Status::InvalidArgument("max_sessions must be 1..65535");
    }
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress slots,
                             AllocZeroed(access, r.max_slots * kSlotSize, Placement::Striped()));
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress tsvec,
                             AllocZeroed(access, r.max_slots * 8, Placement::Striped()));
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress tables,
                             AllocZeroed(access, kMaxTables * kDescSize, Placement::Striped()));
    r.slots = slots.raw();
    r.tsvec = tsvec.raw();
    r.tables = tables.raw();
    r.base_ms = NowMs() - 1000;
    // Everything but the state word, then the state that makes it visible.
    FARPOOL_RETURN_IF_ERROR(
        access.Write(root + 8, reinterpret_cast<const unsigned char*>(&r) + 8, sizeof(r) - 8));
    uint64_t ready = kStateReady;
    FARPOOL_RETURN_IF_ERROR(access.Write(root + kRootState, &ready, 8));
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
                            " holds no farpool database (magic " + std::to_string(root_.magic) +
                            ")");
  }
  heartbeat_ = std::thread([this] { Heartbeat(); });
  return Status::Ok();
}

NamDatabase::~NamDatabase() {
  {
    std::lock_guard<std::mutex> l(hb_mu_);
    stop_ = true;
  }
  hb_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void NamDatabase::Register(NamSession* s) {
  std::lock_guard<std::mutex> l(mu_);
  sessions_.insert(s);
}
void NamDatabase::Unregister(NamSession* s) {
  std::lock_guard<std::mutex> l(mu_);
  sessions_.erase(s);
}

// Renews every session's lease each lease/4 and notices a session that was fenced.
void NamDatabase::Heartbeat() {
  OpCount c;
  Access access(memory_, c);
  const auto period = std::chrono::milliseconds(std::max<uint64_t>(10, root_.lease_ms / 4));
  std::unique_lock<std::mutex> hl(hb_mu_);
  while (!stop_) {
    hb_cv_.wait_for(hl, period);
    if (stop_) break;
    std::vector<std::pair<uint32_t, uint64_t>> live;
    std::vector<NamSession*> all;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (NamSession* s : sessions_) {
        live.push_back({s->slot_, s->epoch_});
        all.push_back(s);
      }
    }
    for (size_t i = 0; i < live.size(); ++i) {
      auto [slot, epoch] = live[i];
      uint64_t owner = 0;
      Status st = access.Read(SlotAddr(slot), &owner, 8);
      bool fenced = st.ok() && (OwnerEpoch(owner) != (epoch & kOwnerEpochMask) ||
                                OwnerState(owner) != kSlotActive);
      if (st.ok() && !fenced) {
        auto prev = access.Cas(SlotAddr(slot), owner, OwnerWord(epoch, kSlotActive, LeaseEnd()));
        // A failed CAS means someone fenced us (nobody else writes an active slot's word).
        fenced = prev.ok() && *prev != owner;
      }
      if (fenced) {
        std::lock_guard<std::mutex> l(mu_);
        if (sessions_.count(all[i])) all[i]->fenced_ = true;
      }
    }
  }
}

Status NamDatabase::RecoverLog(const Access& access, uint32_t slot) {
  SlotImage si;
  FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(slot), &si, sizeof(si)));
  if (si.log == 0) return Status::Ok();
  const GlobalAddress log = GlobalAddress::FromRaw(si.log);
  LogHeader h;
  FARPOOL_RETURN_IF_ERROR(access.Read(log, &h, sizeof(h)));
  if ((h.state & 3) != 1) return Status::Ok();
  const uint64_t epoch = h.state >> 2;
  const uint64_t dead_lock = LockWord(slot, epoch);
  std::vector<unsigned char> body;
  bool valid = h.bytes > 0 && h.bytes <= kLogBytes - sizeof(h);
  if (valid) {
    body.resize(h.bytes);
    FARPOOL_RETURN_IF_ERROR(access.Read(log + sizeof(h), body.data(), h.bytes));
    valid = Checksum(body.data(), body.size()) == h.checksum;
  }
  if (valid) {
    // The log was written whole: the commit was decided. Finish it.
    struct Unlock {
      GlobalAddress record;
      uint64_t seq;
    };
    std::vector<Unlock> unlocks;
    size_t off = 0;
    for (uint64_t i = 0; i < h.count && off + sizeof(LogEntry) <= body.size(); ++i) {
      LogEntry e;
      std::memcpy(&e, body.data() + off, sizeof(e));
      off += sizeof(e);
      const unsigned char* cell = body.data() + off;
      off += e.cell_size;
      const unsigned char* spill = e.spill ? body.data() + off : nullptr;
      if (e.spill) off += e.cell_size;
      if (off > body.size())
        return Status::Internal("commit log of slot " + std::to_string(slot) + " is inconsistent");
      const GlobalAddress rec = GlobalAddress::FromRaw(e.record);
      uint64_t lock;
      FARPOOL_RETURN_IF_ERROR(access.Read(rec, &lock, 8));
      if (lock != dead_lock) continue;  // installed and released before the crash
      if (spill)
        FARPOOL_RETURN_IF_ERROR(access.Write(GlobalAddress::FromRaw(e.spill), spill, e.cell_size));
      FARPOOL_RETURN_IF_ERROR(access.Write(rec + e.cell_offset, cell, e.cell_size));
      unlocks.push_back({rec, e.new_seq});
    }
    if (vector_mode()) {
      uint64_t cur;
      FARPOOL_RETURN_IF_ERROR(access.Read(TsAddr(slot), &cur, 8));
      const uint64_t c = h.stamp & kStampCounterMask;
      if (cur < c) FARPOOL_RETURN_IF_ERROR(access.Write(TsAddr(slot), &c, 8));
    }
    for (const auto& u : unlocks) {
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(u.record, dead_lock, UnlockedWord(u.seq)));
      (void)prev;
    }
  }
  uint64_t zero = 0;
  return access.Write(log, &zero, 8);
}

Result<bool> NamDatabase::FenceAndRecover(const Access& access, uint32_t slot, uint64_t owner,
                                          uint64_t final_state) {
  const uint64_t next = OwnerEpoch(owner) + 1;
  const uint64_t recovering = OwnerWord(next, kSlotRecovering, LeaseEnd());
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(SlotAddr(slot), owner, recovering));
  if (prev != owner) return false;
  FARPOOL_RETURN_IF_ERROR(RecoverLog(access, slot));
  const uint64_t done = OwnerWord(next, final_state, final_state == kSlotActive ? LeaseEnd() : 0);
  FARPOOL_ASSIGN_OR_RETURN(prev, access.Cas(SlotAddr(slot), recovering, done));
  return prev == recovering;
}

Result<bool> NamDatabase::HolderDead(const Access& access, uint64_t word) {
  const uint32_t slot = LockSlot(word);
  const uint64_t epoch = LockEpoch(word);
  if (slot >= root_.max_slots)
    return Status::Internal("lock word names slot " + std::to_string(slot));
  SlotImage si;
  FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(slot), &si.owner, 8));
  const uint64_t e = OwnerEpoch(si.owner), st = OwnerState(si.owner);
  const bool expired = NowRel() > OwnerExpiry(si.owner);
  if (e != (epoch & kOwnerEpochMask)) {
    if (st != kSlotRecovering) return true;  // the holder's epoch was fenced and recovered
    if (!expired) return false;              // someone is recovering it right now
    FARPOOL_ASSIGN_OR_RETURN(bool done, FenceAndRecover(access, slot, si.owner, kSlotFree));
    return done;
  }
  if (st != kSlotActive || !expired) return st == kSlotFree;
  FARPOOL_ASSIGN_OR_RETURN(bool done, FenceAndRecover(access, slot, si.owner, kSlotFree));
  return done;
}

Status NamDatabase::BreakRecordLock(const Access& access, GlobalAddress record,
                                    const RecordLayout& layout, uint64_t word) {
  RecordImage img;
  img.bytes.resize(layout.record_size());
  FARPOOL_RETURN_IF_ERROR(access.Read(record, img.bytes.data(), img.bytes.size()));
  img.Decode(layout);
  if (img.lock != word) return Status::Ok();  // someone else broke or recovered it
  if (img.torn) {
    return Status::Internal("record " + record.ToString() +
                            " has a torn version and no commit log to repair it");
  }
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(record, word, UnlockedWord(img.newest_seq())));
  (void)prev;
  return Status::Ok();
}

Result<std::unique_ptr<Session>> NamDatabase::NewSession() {
  OpCount c;
  Access access(memory_, c);
  for (uint32_t s = 0; s < root_.max_slots; ++s) {
    SlotImage si;
    FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(s), &si, sizeof(si)));
    const uint64_t st = OwnerState(si.owner);
    const uint64_t epoch = (OwnerEpoch(si.owner) + 1) & kOwnerEpochMask;
    bool claimed = false;
    if (st == kSlotFree) {
      FARPOOL_ASSIGN_OR_RETURN(
          uint64_t prev,
          access.Cas(SlotAddr(s), si.owner, OwnerWord(epoch, kSlotActive, LeaseEnd())));
      claimed = prev == si.owner;
      // A free slot's log is clear, unless its recoverer died: recover to be sure.
      if (claimed) FARPOOL_RETURN_IF_ERROR(RecoverLog(access, s));
    } else if (NowRel() > OwnerExpiry(si.owner)) {
      FARPOOL_ASSIGN_OR_RETURN(claimed, FenceAndRecover(access, s, si.owner, kSlotActive));
    }
    if (!claimed) continue;
    uint64_t pid = static_cast<uint64_t>(getpid());
    FARPOOL_RETURN_IF_ERROR(access.Write(SlotAddr(s) + 24, &pid, 8));
    GlobalAddress log = GlobalAddress::FromRaw(si.log);
    if (log.is_null()) {
      FARPOOL_ASSIGN_OR_RETURN(log, AllocZeroed(access, kLogBytes, Placement::Striped()));
      uint64_t raw = log.raw();
      FARPOOL_RETURN_IF_ERROR(access.Write(SlotAddr(s) + 16, &raw, 8));
    }
    uint64_t counter = 0;
    FARPOOL_RETURN_IF_ERROR(access.Read(TsAddr(s), &counter, 8));
    auto session = std::make_unique<NamSession>(*this, s, epoch & kEpochMask, log, counter);
    Register(session.get());
    return std::unique_ptr<Session>(std::move(session));
  }
  return Status::OutOfMemory("all " + std::to_string(root_.max_slots) +
                             " session slots of the database are taken");
}

Status NamDatabase::RecoverExpired() {
  OpCount c;
  Access access(memory_, c);
  for (uint32_t s = 0; s < root_.max_slots; ++s) {
    SlotImage si;
    FARPOOL_RETURN_IF_ERROR(access.Read(SlotAddr(s), &si, sizeof(si)));
    if (OwnerState(si.owner) != kSlotFree && NowRel() > OwnerExpiry(si.owner)) {
      FARPOOL_ASSIGN_OR_RETURN(bool done, FenceAndRecover(access, s, si.owner, kSlotFree));
      (void)done;
    }
  }
  // Break the record locks the dead left before their commits were decided.
  FARPOOL_ASSIGN_OR_RETURN(auto names, ListTables());
  for (const auto& name : names) {
    FARPOOL_ASSIGN_OR_RETURN(const Table* t, OpenTable(name));
    const auto& nt = static_cast<const NamTable&>(*t);
    FARPOOL_RETURN_IF_ERROR(nt.hash_->ForEach(access, [&](int64_t, GlobalAddress rec) -> Status {
      uint64_t lock;
      FARPOOL_RETURN_IF_ERROR(access.Read(rec, &lock, 8));
      if (!IsLocked(lock)) return Status::Ok();
      FARPOOL_ASSIGN_OR_RETURN(bool dead, HolderDead(access, lock));
      if (dead) return BreakRecordLock(access, rec, nt.layout_, lock);
      return Status::Ok();
    }));
  }
  return Status::Ok();
}

Result<uint64_t> NamDatabase::CountLocked(const Table& table) {
  OpCount c;
  Access access(memory_, c);
  const auto& nt = static_cast<const NamTable&>(table);
  uint64_t locked = 0;
  FARPOOL_RETURN_IF_ERROR(nt.hash_->ForEach(access, [&](int64_t, GlobalAddress rec) -> Status {
    uint64_t lock;
    FARPOOL_RETURN_IF_ERROR(access.Read(rec, &lock, 8));
    if (IsLocked(lock)) ++locked;
    return Status::Ok();
  }));
  return locked;
}

// ---------------------------------------------------------------- catalog

Status NamDatabase::LockDdl(const Access& access) {
  // The DDL lock word holds its holder's expiry time (ms); an expired one is taken over.
  for (int i = 0;; ++i) {
    uint64_t now = NowMs();
    uint64_t cur;
    FARPOOL_RETURN_IF_ERROR(access.Read(RootField(kRootDdl), &cur, 8));
    if (cur == 0 || cur < now) {
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(RootField(kRootDdl), cur, now + 10000));
      if (prev == cur) return Status::Ok();
    }
    if (i > 200000) return Status::TimedOut("the catalog's DDL lock stays taken");
    std::this_thread::yield();
  }
}

Result<std::unique_ptr<NamTable>> NamDatabase::MakeTable(uint32_t id, const TableDesc& d) const {
  auto t = std::make_unique<NamTable>();
  t->id_ = id;
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
  t->hash_.emplace(GlobalAddress::FromRaw(d.hash_addr), d.hash_count, d.hash_seed);
  if (d.flags & 1) t->btree_.emplace(t->desc_ + kDescBtreeRoot);
  return t;
}

Status NamDatabase::LoadTables(const Access& access) {
  std::vector<TableDesc> descs(kMaxTables);
  for (uint64_t i = 0; i < kMaxTables; ++i) {
    FARPOOL_RETURN_IF_ERROR(access.Read(GlobalAddress::FromRaw(root_.tables) + i * kDescSize,
                                        &descs[i], sizeof(TableDesc)));
  }
  std::lock_guard<std::mutex> l(mu_);
  for (uint32_t i = 0; i < kMaxTables; ++i) {
    if (descs[i].state != 1) {
      // Dropped since we cached it?
      for (auto it = tables_.begin(); it != tables_.end(); ++it) {
        if (it->second->id_ == i) {
          by_id_.erase(i);
          tables_.erase(it);
          break;
        }
      }
      continue;
    }
    if (by_id_.count(i)) continue;
    FARPOOL_ASSIGN_OR_RETURN(auto t, MakeTable(i, descs[i]));
    by_id_[i] = t.get();
    tables_[t->name_] = std::move(t);
  }
  return Status::Ok();
}

Result<const Table*> NamDatabase::CreateTable(const std::string& name, const Schema& schema,
                                              const TableOptions& options) {
  if (name.empty() || name.size() >= 64) {
    return Status::InvalidArgument("table name '" + name + "' must be 1..63 bytes");
  }
  FARPOOL_RETURN_IF_ERROR(schema.Validate());
  OpCount c;
  Access access(memory_, c);
  FARPOOL_RETURN_IF_ERROR(LockDdl(access));
  auto unlock = [&] {
    uint64_t zero = 0;
    return access.Write(RootField(kRootDdl), &zero, 8);
  };
  Status s = LoadTables(access);
  if (!s.ok()) {
    (void)unlock();
    return s;
  }
  int free_id = -1;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (tables_.count(name)) {
      (void)unlock();
      return Status::InvalidArgument("table '" + name + "' already exists");
    }
    for (uint32_t i = 0; i < kMaxTables; ++i) {
      if (!by_id_.count(i)) {
        TableDesc probe;
        s = access.Read(GlobalAddress::FromRaw(root_.tables) + i * kDescSize, &probe.state, 8);
        if (!s.ok()) break;
        if (probe.state == 0) {
          free_id = static_cast<int>(i);
          break;
        }
      }
    }
  }
  if (!s.ok() || free_id < 0) {
    (void)unlock();
    if (!s.ok()) return s;
    return Status::OutOfMemory("the catalog holds " + std::to_string(kMaxTables) +
                               " tables already");
  }
  TableDesc d{};
  std::memcpy(d.name, name.data(), name.size());
  d.flags = options.ordered ? 1 : 0;
  d.payload = (schema.PayloadSize() + 7) & ~7u;
  const uint64_t buckets = std::max<uint64_t>(16, options.expected_rows / 4 + 1);
  auto hash = HashIndex::Create(access, buckets);
  if (!hash.ok()) {
    (void)unlock();
    return hash.status();
  }
  d.hash_addr = hash->raw();
  d.hash_count = buckets;
  d.hash_seed = Mix64(free_id + 1);
  d.ncols = schema.size();
  for (size_t i = 0; i < schema.size(); ++i) {
    const auto& col = schema.columns()[i];
    std::memcpy(d.cols[i].name, col.name.data(), col.name.size());
    d.cols[i].type = uint32_t(col.type);
    d.cols[i].length = col.length;
  }
  const GlobalAddress desc = GlobalAddress::FromRaw(root_.tables) + free_id * kDescSize;
  // Body first, the state word that makes it live last.
  s = access.Write(desc + 8, reinterpret_cast<const unsigned char*>(&d) + 8, sizeof(d) - 8);
  if (s.ok() && options.ordered) s = BTree::Create(access, desc + kDescBtreeRoot);
  uint64_t live = 1;
  if (s.ok()) s = access.Write(desc, &live, 8);
  Status u = unlock();
  if (!s.ok()) return s;
  if (!u.ok()) return u;
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
  OpCount c;
  Access access(memory_, c);
  FARPOOL_RETURN_IF_ERROR(LockDdl(access));
  uint64_t dropped = 2;
  Status s = access.Write(static_cast<const NamTable*>(t)->desc_, &dropped, 8);
  uint64_t zero = 0;
  Status u = access.Write(RootField(kRootDdl), &zero, 8);
  FARPOOL_RETURN_IF_ERROR(s);
  FARPOOL_RETURN_IF_ERROR(u);
  // Keep the Table object alive (callers may still hold it); forget the name.
  std::lock_guard<std::mutex> l(mu_);
  auto it = tables_.find(name);
  if (it != tables_.end()) {
    dropped_.push_back(std::move(it->second));
    tables_.erase(it);
  }
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

// ================================================================ NamSession

NamSession::~NamSession() {
  db_.Unregister(this);
  // Hand the slot back (free, same epoch) unless it was fenced meanwhile.
  uint64_t owner = 0;
  if (access_.Read(db_.SlotAddr(slot_), &owner, 8).ok() && OwnerEpoch(owner) == epoch_ &&
      OwnerState(owner) == kSlotActive) {
    auto prev = access_.Cas(db_.SlotAddr(slot_), owner, OwnerWord(epoch_, kSlotFree, 0));
    (void)prev;
  }
}

Result<GlobalAddress> NamSession::FindRecord(const NamTable& t, int64_t key) {
  const uint64_t ck = CacheKey(t.id_, key);
  auto it = cache_.find(ck);
  if (it != cache_.end()) return it->second;
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress rec, t.hash_->Lookup(access_, key));
  if (!rec.is_null()) {
    if (cache_.size() >= kAddressCacheLimit) cache_.clear();
    cache_[ck] = rec;
  }
  return rec;
}

Result<std::unique_ptr<Transaction>> NamSession::Begin() {
  if (fenced_) {
    return Status::Unavailable("session slot " + std::to_string(slot_) +
                               " lost its lease (this process stalled longer than the lease)");
  }
  Snapshot snap;
  snap.vector = db_.vector_mode();
  if (snap.vector) {
    // Double collect: two equal copies of the (monotonic) vector are an atomic snapshot of
    // the moment between them, so a commit is never seen without those it depends on.
    const uint64_t n = db_.root().max_slots;
    std::vector<uint64_t> a(n), b(n);
    FARPOOL_RETURN_IF_ERROR(access_.Read(db_.TsAddr(0), a.data(), n * 8));
    for (int tries = 0;; ++tries) {
      FARPOOL_RETURN_IF_ERROR(access_.Read(db_.TsAddr(0), b.data(), n * 8));
      if (a == b) break;
      a.swap(b);
      if (tries > 100000) return Status::Aborted("timestamp vector never stable for a snapshot");
    }
    snap.slots = std::move(a);
  } else {
    FARPOOL_RETURN_IF_ERROR(access_.Read(db_.RootField(kRootCounter), &snap.counter, 8));
  }
  return std::unique_ptr<Transaction>(new NamTxn(*this, std::move(snap)));
}

// ================================================================ NamTxn

Status NamTxn::ReadRecord(const NamTable& t, GlobalAddress record, int64_t key, ReadEntry* re,
                          RecordImage* image, bool* key_ok) {
  const auto& layout = t.layout_;
  image->bytes.resize(layout.record_size());
  for (int tries = 0;; ++tries) {
    if (tries > 16) std::this_thread::yield();
    FARPOOL_RETURN_IF_ERROR(s_.access_.Read(record, image->bytes.data(), image->bytes.size()));
    image->Decode(layout);
    if (image->key != key) {
      *key_ok = false;
      return Status::Ok();
    }
    *key_ok = true;
    if (image->torn) {
      if ((tries & 1023) == 1023 && IsLocked(image->lock)) {
        FARPOOL_ASSIGN_OR_RETURN(bool dead, s_.HolderDead(image->lock));
        if (dead)
          FARPOOL_RETURN_IF_ERROR(s_.db_.BreakRecordLock(s_.access_, record, layout, image->lock));
      }
      continue;
    }
    if (!snap_.vector) {
      // Counter mode: a commit with a stamp inside our snapshot may still be installing; wait
      // for the lock, and accept only a copy whose cells match its unlocked word.
      if (IsLocked(image->lock)) {
        if ((tries & 1023) == 1023) {
          FARPOOL_ASSIGN_OR_RETURN(bool dead, s_.HolderDead(image->lock));
          if (dead)
            FARPOOL_RETURN_IF_ERROR(
                s_.db_.BreakRecordLock(s_.access_, record, layout, image->lock));
        }
        continue;
      }
      if (UnlockedSeq(image->lock) != image->newest_seq()) continue;
    }
    break;
  }
  re->record = record;
  re->newest_seq = image->newest_seq();
  re->newest_visible = image->newest < 0 || snap_.Visible(image->cells[image->newest].stamp);
  re->image = image->bytes;
  return Status::Ok();
}

Status NamTxn::Visible(const NamTable& t, const RecordImage& image, bool* found, bool* deleted,
                       std::string* payload) {
  *found = false;
  *deleted = false;
  if (image.newest < 0) return Status::Ok();
  // Cells newest first.
  int order[kCells];
  for (int i = 0; i < kCells; ++i) order[i] = i;
  std::sort(order, order + kCells,
            [&](int a, int b) { return image.cells[a].seq > image.cells[b].seq; });
  for (int i : order) {
    const CellView& c = image.cells[i];
    if (c.empty()) break;
    if (snap_.Visible(c.stamp)) {
      *found = !(c.flags & kFlagDeleted);
      *deleted = (c.flags & kFlagDeleted) != 0;
      payload->assign(reinterpret_cast<const char*>(c.payload), t.layout_.payload);
      return Status::Ok();
    }
  }
  // Older versions: the chain hanging off the newest cell.
  GlobalAddress at = GlobalAddress::FromRaw(image.cells[image.newest].chain);
  std::vector<unsigned char> node(t.layout_.cell_size());
  while (!at.is_null()) {
    FARPOOL_RETURN_IF_ERROR(s_.access_.Read(at, node.data(), node.size()));
    CellView c = DecodeCell(node.data(), t.layout_);
    if (!c.valid) return Status::Internal("version node " + at.ToString() + " fails its checksum");
    if (snap_.Visible(c.stamp)) {
      *found = !(c.flags & kFlagDeleted);
      *deleted = (c.flags & kFlagDeleted) != 0;
      payload->assign(reinterpret_cast<const char*>(c.payload), t.layout_.payload);
      return Status::Ok();
    }
    at = GlobalAddress::FromRaw(c.chain);
  }
  return Status::Ok();  // no version old enough: the key did not exist at our snapshot
}

Status NamTxn::LoadBlobs(const NamTable& t, const std::string& payload, Row* row) {
  *row = Row(t.schema_);
  row->payload() = payload;
  row->payload().resize(t.schema_.PayloadSize());
  for (uint32_t c : t.bytes_columns_) {
    uint64_t ref[2];
    std::memcpy(ref, payload.data() + t.schema_.Offset(c), 16);
    std::string v(ref[1], '\0');
    if (ref[1] > 0)
      FARPOOL_RETURN_IF_ERROR(s_.access_.Read(GlobalAddress::FromRaw(ref[0]), v.data(), ref[1]));
    row->bytes()[c] = std::move(v);
  }
  return Status::Ok();
}

Status NamTxn::ReadVisible(const NamTable& t, int64_t key, bool* found, bool* deleted,
                           std::string* payload) {
  *found = false;
  for (int attempt = 0; attempt < 3; ++attempt) {
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress rec, s_.FindRecord(t, key));
    if (rec.is_null()) return Status::Ok();
    ReadEntry re;
    RecordImage image;
    bool key_ok;
    FARPOOL_RETURN_IF_ERROR(ReadRecord(t, rec, key, &re, &image, &key_ok));
    if (!key_ok) {
      s_.cache_.erase(NamSession::CacheKey(t.id_, key));
      continue;
    }
    FARPOOL_RETURN_IF_ERROR(Visible(t, image, found, deleted, payload));
    reads_[{t.id_, key}] = std::move(re);
    return Status::Ok();
  }
  return Status::Internal("index entry of key " + std::to_string(key) + " names another record");
}

Status NamTxn::Get(const Table& table, int64_t key, Row* row) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  auto w = writes_.find({t.id_, key});
  if (w != writes_.end()) {
    if (w->second.deleted)
      return Status::NotFound("key " + std::to_string(key) + " deleted by this transaction");
    *row = Row(t.schema_);
    row->payload() = w->second.payload;
    row->bytes() = w->second.bytes;
    return Status::Ok();
  }
  bool found, deleted;
  std::string payload;
  FARPOOL_RETURN_IF_ERROR(ReadVisible(t, key, &found, &deleted, &payload));
  if (!found) return Status::NotFound("table '" + t.name_ + "' has no key " + std::to_string(key));
  return LoadBlobs(t, payload, row);
}

Status NamTxn::Put(const Table& table, int64_t key, const Row& row) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  if (row.payload().size() != t.schema_.PayloadSize()) {
    return Status::InvalidArgument("row does not match the schema of table '" + t.name_ + "'");
  }
  if (key == INT64_MAX) return Status::InvalidArgument("key INT64_MAX is reserved");
  WriteEntry& w = writes_[{t.id_, key}];
  w.table = &t;
  w.key = key;
  w.deleted = false;
  w.payload = row.payload();
  w.payload.resize(t.layout_.payload, '\0');
  w.bytes = row.bytes();
  w.bytes.resize(t.schema_.size());
  return Status::Ok();
}

Status NamTxn::Delete(const Table& table, int64_t key) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  auto w = writes_.find({t.id_, key});
  bool exists;
  if (w != writes_.end()) {
    exists = !w->second.deleted;
  } else {
    bool deleted;
    std::string payload;
    FARPOOL_RETURN_IF_ERROR(ReadVisible(t, key, &exists, &deleted, &payload));
  }
  if (!exists) return Status::NotFound("table '" + t.name_ + "' has no key " + std::to_string(key));
  WriteEntry& e = writes_[{t.id_, key}];
  e.table = &t;
  e.key = key;
  e.deleted = true;
  e.payload.assign(t.layout_.payload, '\0');
  e.bytes.assign(t.schema_.size(), std::string());
  return Status::Ok();
}

Status NamTxn::Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
                    const std::function<bool(int64_t, const Row&)>& visit) {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  const auto& t = static_cast<const NamTable&>(table);
  if (!t.btree_)
    return Status::InvalidArgument("table '" + t.name_ + "' is not ordered (no B+tree)");
  // Collect index entries a leaf's worth at a time, then read their records in one batch.
  std::vector<std::pair<int64_t, GlobalAddress>> pending;
  size_t visited = 0;
  bool stop = false;
  Status inner;
  auto flush = [&]() -> Status {
    if (pending.empty()) return Status::Ok();
    std::vector<RecordImage> images(pending.size());
    {
      Access::Batch b(s_.access_);
      for (size_t i = 0; i < pending.size(); ++i) {
        images[i].bytes.resize(t.layout_.record_size());
        FARPOOL_RETURN_IF_ERROR(
            b.Read(pending[i].second, images[i].bytes.data(), images[i].bytes.size()));
      }
      FARPOOL_RETURN_IF_ERROR(b.Wait());
    }
    for (size_t i = 0; i < pending.size() && !stop; ++i) {
      RecordImage& img = images[i];
      img.Decode(t.layout_);
      const bool consistent =
          img.key == pending[i].first && !img.torn &&
          (snap_.vector || (!IsLocked(img.lock) && UnlockedSeq(img.lock) == img.newest_seq()));
      if (!consistent) {
        // Raced with a writer: read this one on its own until consistent.
        ReadEntry re;
        bool key_ok;
        FARPOOL_RETURN_IF_ERROR(
            ReadRecord(t, pending[i].second, pending[i].first, &re, &img, &key_ok));
        if (!key_ok) continue;
      }
      bool found, deleted;
      std::string payload;
      FARPOOL_RETURN_IF_ERROR(Visible(t, img, &found, &deleted, &payload));
      if (!found) continue;
      Row row;
      FARPOOL_RETURN_IF_ERROR(LoadBlobs(t, payload, &row));
      ++visited;
      if (!visit(pending[i].first, row) || (limit != 0 && visited >= limit)) stop = true;
    }
    pending.clear();
    return Status::Ok();
  };
  FARPOOL_RETURN_IF_ERROR(t.btree_->Scan(s_.access_, lo, hi, reverse, [&](int64_t k, uint64_t v) {
    pending.push_back({k, GlobalAddress::FromRaw(v)});
    if (pending.size() >= 64) {
      inner = flush();
      if (!inner.ok()) return false;
    }
    return !stop;
  }));
  FARPOOL_RETURN_IF_ERROR(inner);
  if (!stop) FARPOOL_RETURN_IF_ERROR(flush());
  return Status::Ok();
}

void NamTxn::Rollback() {
  if (finished_) return;
  finished_ = true;
  for (GlobalAddress b : blobs_) (void)s_.access_.Free(b);
  blobs_.clear();
  writes_.clear();
  reads_.clear();
}

Status NamTxn::Finish(Status s) {
  if (s.ok()) {
    ++s_.counters_.commits;
    blobs_.clear();  // they belong to the committed versions now
  } else if (s.code() == StatusCode::kAborted) {
    ++s_.counters_.aborts;
  }
  Rollback();
  return s;
}

Status NamTxn::Commit() {
  if (finished_) return Status::InvalidArgument("transaction already finished");
  if (writes_.empty()) return Finish(Status::Ok());
  if (s_.fenced_) return Finish(Status::Unavailable("session lost its lease; commit refused"));
  const Access& access = s_.access_;

  struct Item {
    WriteEntry* w;
    const NamTable* t;
    GlobalAddress record;
    uint64_t expected = 0;  // unlocked word we expect (the version we validated)
    RecordImage image;      // the record as of that version
    bool locked = false;
    uint64_t prev = 0;
    GlobalAddress spill;
    std::vector<unsigned char> cell, spill_image;
    uint64_t new_seq = 0;
  };
  std::vector<Item> items;
  items.reserve(writes_.size());

  // 1. Resolve records (creating the record of a new key), decide what version we expect.
  std::vector<size_t> need_read;
  for (auto& [k, w] : writes_) {
    Item it;
    it.w = &w;
    it.t = w.table;
    // testing_skip_validation: every written record is re-read below and locked at whatever
    // version it has now, so a newer version than the one read is overwritten (lost update).
    const bool skip_validation = s_.db_.options().testing_skip_validation;
    auto r = skip_validation ? reads_.end() : reads_.find(k);
    if (r != reads_.end()) {
      if (!r->second.newest_visible) {
        // The newer version may be a dead session's unfinished commit (installed, not yet
        // published, record still locked): recover it so that retries can succeed.
        Status rs = RecoverIfDead(*it.t, r->second.record);
        if (!rs.ok()) return Finish(rs);
        return Finish(Status::Aborted("first committer wins: key " + std::to_string(w.key) +
                                      " of '" + it.t->name_ + "' has a newer version"));
      }
      it.record = r->second.record;
      it.expected = UnlockedWord(r->second.newest_seq);
      it.image.bytes = r->second.image;
      it.image.Decode(it.t->layout_);
    } else {
      auto rec = s_.FindRecord(*it.t, w.key);
      if (!rec.ok()) return Finish(rec.status());
      it.record = *rec;
      if (it.record.is_null()) {
        // A new key: make its record (no versions) and publish it in the index(es).
        const RecordLayout& layout = it.t->layout_;
        auto fresh = AllocZeroed(access, layout.record_size(), Placement::Striped());
        if (!fresh.ok()) return Finish(fresh.status());
        Status s = access.Write(*fresh + 8, &w.key, 8);
        if (!s.ok()) return Finish(s);
        auto got = it.t->hash_->GetOrInsert(access, s_, w.key, *fresh);
        if (!got.ok()) return Finish(got.status());
        if (*got != *fresh) (void)access.Free(*fresh);
        it.record = *got;
        s_.cache_[NamSession::CacheKey(it.t->id_, w.key)] = it.record;
      }
      need_read.push_back(items.size());
    }
    items.push_back(std::move(it));
  }
  if (!need_read.empty()) {
    Access::Batch b(access);
    for (size_t i : need_read) {
      items[i].image.bytes.resize(items[i].t->layout_.record_size());
      Status s = b.Read(items[i].record, items[i].image.bytes.data(), items[i].image.bytes.size());
      if (!s.ok()) return Finish(s);
    }
    Status s = b.Wait();
    if (!s.ok()) return Finish(s);
    for (size_t i : need_read) {
      Item& it = items[i];
      it.image.Decode(it.t->layout_);
      if (it.image.torn || IsLocked(it.image.lock) ||
          UnlockedSeq(it.image.lock) != it.image.newest_seq()) {
        // Being written right now: someone else commits it first.
        if (IsLocked(it.image.lock)) {
          auto dead = s_.HolderDead(it.image.lock);
          if (!dead.ok()) return Finish(dead.status());
          if (*dead) {
            Status bs = s_.db_.BreakRecordLock(access, it.record, it.t->layout_, it.image.lock);
            if (!bs.ok()) return Finish(bs);
          }
        }
        return Finish(Status::Aborted("key " + std::to_string(it.w->key) + " of '" + it.t->name_ +
                                      "' is being written by another transaction"));
      }
      if (it.image.newest >= 0 && !s_.db_.options().testing_skip_validation &&
          !snap_.Visible(it.image.cells[it.image.newest].stamp)) {
        return Finish(Status::Aborted("first committer wins: key " + std::to_string(it.w->key) +
                                      " of '" + it.t->name_ + "' has a newer version"));
      }
      it.expected = UnlockedWord(it.image.newest_seq());
    }
  }
  // Keys new to an ordered table go into its B+tree (idempotent).
  for (Item& it : items) {
    if (it.t->btree_ && it.image.newest < 0) {
      auto r = it.t->btree_->GetOrInsert(access, s_, it.w->key, it.record.raw());
      if (!r.ok()) return Finish(r.status());
    }
  }
  // Blobs of variable-length columns.
  for (Item& it : items) {
    for (uint32_t c : it.t->bytes_columns_) {
      const std::string& v = it.w->bytes[c];
      uint64_t ref[2] = {0, v.size()};
      if (!v.empty()) {
        auto blob = access.Alloc(v.size(), Placement::Striped());
        if (!blob.ok()) return Finish(blob.status());
        blobs_.push_back(*blob);
        Status s = access.Write(*blob, v.data(), v.size());
        if (!s.ok()) return Finish(s);
        ref[0] = blob->raw();
      }
      std::memcpy(it.w->payload.data() + it.t->schema_.Offset(c), ref, 16);
    }
  }

  // 2. Lock: one CAS per record expecting the validated version (lock + validation in one).
  const uint64_t mine = s_.lock_word();
  {
    Access::Batch b(access);
    for (Item& it : items) {
      Status s = b.Cas(it.record, it.expected, mine, &it.prev);
      if (!s.ok()) return Finish(s);
    }
    Status s = b.Wait();
    if (!s.ok()) return Finish(s);
  }
  auto release = [&]() {
    Access::Batch b(access);
    for (Item& it : items) {
      if (it.locked) (void)b.Write(it.record, &it.expected, 8);
    }
    (void)b.Wait();
  };
  std::string conflict;
  for (Item& it : items) {
    it.locked = it.prev == it.expected;
    if (!it.locked && conflict.empty()) {
      conflict = "key " + std::to_string(it.w->key) + " of '" + it.t->name_ + "'";
      conflict += IsLocked(it.prev) ? " is locked by another transaction"
                                    : " got a newer version (first committer wins)";
    }
  }
  if (!conflict.empty()) {
    release();
    for (Item& it : items) {
      if (!it.locked && IsLocked(it.prev)) {
        auto dead = s_.HolderDead(it.prev);
        if (dead.ok() && *dead)
          (void)s_.db_.BreakRecordLock(access, it.record, it.t->layout_, it.prev);
      }
    }
    return Finish(Status::Aborted(conflict));
  }

  Hook("locked");
  // 3. Commit stamp.
  uint64_t stamp;
  if (snap_.vector) {
    stamp = MakeStamp(s_.slot_, s_.counter_ + 1);
  } else {
    auto prev = access.Faa(s_.db_.RootField(kRootCounter), 1);
    if (!prev.ok()) {
      release();
      return Finish(prev.status());
    }
    stamp = *prev + 1;
  }

  // 4. New cells and spilled versions; the commit log (the decision) with them in one batch.
  std::vector<unsigned char> log(sizeof(LogHeader));
  for (Item& it : items) {
    const RecordLayout& layout = it.t->layout_;
    const uint64_t newest = it.image.newest_seq();
    it.new_seq = newest + 1;
    const int victim = static_cast<int>(it.new_seq % kCells);
    const CellView& old = it.image.cells[victim];
    const uint64_t newest_chain = it.image.newest >= 0 ? it.image.cells[it.image.newest].chain : 0;
    uint64_t chain = newest_chain;
    if (!old.empty()) {
      auto spill = access.Alloc(layout.cell_size(), Placement::OnServer(it.record.server()));
      if (!spill.ok()) {
        release();
        return Finish(spill.status());
      }
      it.spill = *spill;
      it.spill_image.resize(layout.cell_size());
      EncodeCell(it.spill_image.data(), layout, old.stamp, old.seq, old.flags, newest_chain,
                 old.payload);
      chain = it.spill.raw();
    }
    it.cell.resize(layout.cell_size());
    EncodeCell(it.cell.data(), layout, stamp, it.new_seq, it.w->deleted ? kFlagDeleted : 0, chain,
               it.w->payload.data());
    LogEntry e{it.record.raw(), it.spill.raw(), it.new_seq,
               static_cast<uint32_t>(layout.cell_offset(it.new_seq)),
               static_cast<uint32_t>(layout.cell_size())};
    const size_t at = log.size();
    log.resize(at + sizeof(e) + it.cell.size() + it.spill_image.size());
    std::memcpy(log.data() + at, &e, sizeof(e));
    std::memcpy(log.data() + at + sizeof(e), it.cell.data(), it.cell.size());
    if (!it.spill_image.empty()) {
      std::memcpy(log.data() + at + sizeof(e) + it.cell.size(), it.spill_image.data(),
                  it.spill_image.size());
    }
  }
  if (log.size() > kLogBytes) {
    release();
    return Finish(Status::InvalidArgument("write set of " + std::to_string(items.size()) +
                                          " records exceeds the commit log (" +
                                          std::to_string(kLogBytes) + " bytes)"));
  }
  LogHeader h{};
  h.state = LogState(s_.epoch_);
  h.stamp = stamp;
  h.count = items.size();
  h.bytes = log.size() - sizeof(LogHeader);
  h.checksum = Checksum(log.data() + sizeof(LogHeader), h.bytes);
  std::memcpy(log.data(), &h, sizeof(h));
  {
    Access::Batch b(access);
    Status s = b.Write(s_.log_, log.data(), log.size());
    for (Item& it : items) {
      if (s.ok() && !it.spill.is_null())
        s = b.Write(it.spill, it.spill_image.data(), it.spill_image.size());
    }
    Status w = b.Wait();
    if (s.ok()) s = w;
    // A failure here leaves the outcome to recovery (the log may or may not be whole).
    if (!s.ok()) return Finish(s.WithContext("writing the commit log"));
  }
  Hook("logged");
  // 5. Install.
  {
    Access::Batch b(access);
    Status s;
    for (Item& it : items) {
      if (s.ok())
        s = b.Write(it.record + it.t->layout_.cell_offset(it.new_seq), it.cell.data(),
                    it.cell.size());
      Hook("installing");
    }
    Status w = b.Wait();
    if (s.ok()) s = w;
    if (!s.ok()) return Finish(s.WithContext("installing versions"));
  }
  Hook("installed");
  // 6. Publish our timestamp (vector mode), then unlock with the new versions and clear the
  // log. Publishing first keeps the invariant recovery relies on: a version whose stamp is
  // not yet published sits in a record its writer still holds locked.
  const uint64_t published = stamp & kStampCounterMask;
  if (snap_.vector) {
    Status s = access.Write(s_.db_.TsAddr(s_.slot_), &published, 8);
    if (!s.ok()) return Finish(s.WithContext("publishing the commit timestamp"));
    s_.counter_ = published;
  }
  Hook("published");
  {
    Access::Batch b(access);
    std::vector<uint64_t> unlocked(items.size());
    Status s;
    for (size_t i = 0; i < items.size(); ++i) {
      unlocked[i] = UnlockedWord(items[i].new_seq);
      if (s.ok()) s = b.Write(items[i].record, &unlocked[i], 8);
    }
    uint64_t zero = 0;
    if (s.ok()) s = b.Write(s_.log_, &zero, 8);
    Status w = b.Wait();
    if (s.ok()) s = w;
    if (!s.ok()) return Finish(s.WithContext("releasing locks"));
  }
  return Finish(Status::Ok());
}

}  // namespace

Result<std::unique_ptr<Database>> OpenNamDatabaseOn(Memory& memory, Engine engine,
                                                    const DatabaseOptions& options) {
  auto db = std::make_unique<NamDatabase>(engine, memory, options);
  FARPOOL_RETURN_IF_ERROR(db->Init());
  return std::unique_ptr<Database>(std::move(db));
}

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
