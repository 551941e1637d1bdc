// farpool's transactional database: tables of typed records and their indexes kept in the
// memory pool, snapshot-isolation transactions run by any number of compute processes at once.
//
//   auto db = Database::Open(DatabaseOptions{.engine = Engine::kPool, .cluster_file = "c.json"});
//   Schema s{{"balance", ColumnType::kInt64}, {"name", ColumnType::kChar, 16}};
//   auto accounts = (*db)->CreateTable("accounts", s, TableOptions{.ordered = true});
//   auto session = (*db)->NewSession();          // one per thread
//   Status st = RunTransaction(**session, [&](Transaction& txn) -> Status {
//     Row row(s);
//     FARPOOL_RETURN_IF_ERROR(txn.Get(**accounts, 42, &row));
//     row.SetInt64(0, row.GetInt64(0) + 10);
//     return txn.Put(**accounts, 42, row);
//   });
//
// Engines (Engine), chosen at run time, all behind this one interface:
//   kPool     the data lives in the memory pool; every compute process reaches it with
//             one-sided reads, writes and atomics (NAM-DB's design). See docs/database.md.
//   kLocal    the same code on this process's RAM (the upper bound; one process only).
//   kSharded  shared-nothing: partition servers own the data and execute reads, locks and
//             installs on request; the coordinator (this process) runs two-phase commit.
//
// Isolation (Isolation, per transaction; the default is snapshot isolation):
//   kSnapshot       A transaction reads the versions committed before its read timestamp,
//                   buffers its writes, and at commit the first committer wins: if a record it
//                   writes got a version it cannot see, Commit returns Aborted. Write skew is
//                   allowed (as in every SI system). The read timestamp is taken by the
//                   transaction's first read (Get, MultiGet, Delete, Scan; Commit for a
//                   transaction that only wrote), as PostgreSQL's repeatable read takes its
//                   snapshot at the first statement: so it includes every commit that finished
//                   before that read began, in particular before Begin returned, and Begin
//                   itself costs no round trip.
//   kReadCommitted  Each read call (Get, MultiGet, Delete, Scan) sees what was committed when
//                   it began (a snapshot per call, as PostgreSQL's read committed takes one per
//                   statement); a read of a key this transaction wrote sees its own write.
//                   Writes are still never lost: a written key is locked, either at its read
//                   (GetForUpdate: the transaction then writes on top of the newest version) or
//                   at Commit, which then checks that the version the transaction read of it is
//                   still the newest (else Aborted), as SI does. Allowed anomalies: non-
//                   repeatable reads (two reads of a key in one transaction may differ),
//                   phantoms (two scans may differ), read skew (two reads may see different
//                   commits, e.g. a transfer's source before and its destination after it) and
//                   write skew; not allowed: dirty reads, lost updates (of keys read and then
//                   written), and reading a commit partially within one call.
// Aborted is retryable and distinct from failures (RunTransaction retries).
//
// Locking reads (GetForUpdate, MultiGetForUpdate) lock the keys' records when they are read,
// as PostgreSQL's SELECT ... FOR UPDATE: a transaction that meets the lock waits (briefly and
// bounded, then Aborted) instead of both writing and one aborting at commit, so a hot row is
// updated by one transaction after another. See Transaction::GetForUpdate.
//
// Keys: every table has an int64 primary key (not a column). Rows are fixed-layout; kBytes
// columns hold variable-length values in blobs of their own.
//
// Thread-safety: a Database is safe for concurrent use; a Session and its Transactions belong
// to one thread at a time. REQUIRES: the Database outlives its Sessions and Tables.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/status.h"

namespace farpool {
namespace db {
class RowAccess;
struct TestingHooks;
}  // namespace db

enum class Engine : uint8_t { kPool, kLocal, kSharded };
Result<Engine> ParseEngine(std::string_view text);  // "pool" | "local" | "sharded"
std::string_view EngineName(Engine engine);

enum class ColumnType : uint8_t { kInt64 = 1, kDouble = 2, kChar = 3, kBytes = 4 };

struct Column {
  std::string name;
  ColumnType type = ColumnType::kInt64;
  uint32_t length = 0;  // kChar only: bytes (values are zero-padded)
};

// Column names are unique, at most 23 bytes; at most kMaxColumns columns.
class Schema {
 public:
  static constexpr size_t kMaxColumns = 16;
  Schema() : Schema(std::vector<Column>{}) {}
  Schema(std::initializer_list<Column> columns) : Schema(std::vector<Column>(columns)) {}
  explicit Schema(std::vector<Column> columns);

  const std::vector<Column>& columns() const { return columns_; }
  size_t size() const { return columns_.size(); }
  // -1 if absent.
  int Find(std::string_view name) const;
  Status Validate() const;
  // Byte offset of column i in the fixed payload, and the payload's size.
  uint32_t Offset(size_t i) const { return offsets_[i]; }
  uint32_t PayloadSize() const { return offsets_.back(); }
  // Whether a column is of type kBytes.
  bool has_bytes() const { return has_bytes_; }

 private:
  std::vector<Column> columns_;
  std::vector<uint32_t> offsets_;  // of each column, then the payload's size
  bool has_bytes_ = false;
};

// One row's values, in the table's fixed layout plus the bytes of kBytes columns.
// REQUIRES: column indexes < schema.size() and of the accessor's type (checked by assert).
class Row {
 public:
  Row() = default;
  explicit Row(const Schema& schema);

  int64_t GetInt64(size_t column) const;
  double GetDouble(size_t column) const;
  std::string_view GetChar(size_t column) const;  // without the zero padding
  const std::string& GetBytes(size_t column) const;

  void SetInt64(size_t column, int64_t value);
  void SetDouble(size_t column, double value);
  void SetChar(size_t column, std::string_view value);  // truncated to the column's length
  void SetBytes(size_t column, std::string value);

  const Schema* schema() const { return schema_; }

 private:
  friend class db::RowAccess;  // the engines' view of the layout (src/db/row_access.h)
  const Schema* schema_ = nullptr;
  std::string payload_;
  std::vector<std::string> bytes_;  // per column if the schema has_bytes(), else empty
};

struct TableOptions {
  // Keep a B+tree on the key as well as the hash index, for ordered and range scans.
  bool ordered = false;
  // Initial hash buckets (7 keys each); the index grows past it by chaining buckets.
  uint64_t expected_rows = 1024;
};

// A table's handle: its id, name, schema. Owned by the Database; valid until it is destroyed.
class Table {
 public:
  virtual ~Table() = default;
  virtual uint32_t id() const = 0;
  virtual const std::string& name() const = 0;
  virtual const Schema& schema() const = 0;
  virtual bool ordered() const = 0;
};

// What garbage collection has done in this process (Database::CollectGarbage).
struct GcStats {
  uint64_t lwm = 0;               // low-water mark: every active snapshot is at least this
  uint64_t live_sessions = 0;     // slots holding it back (this pass)
  uint64_t versions_dropped = 0;  // evicted versions that were garbage (not spilled)
  uint64_t versions_spilled = 0;  // evicted versions still needed (kept in a chain)
  uint64_t chains_cut = 0, nodes_freed = 0, blobs_freed = 0, tables_reclaimed = 0;
  uint64_t records_removed = 0;  // deleted keys whose records were unlinked and freed
  uint64_t objects_reused = 0, objects_fresh = 0;   // recycler: reused vs newly reserved
  uint64_t chunks_opened = 0, chunks_released = 0;  // recycler: slab chunks leased, given back
};

// What a round trip of the pool engines was for (TxnCounters::round_trips_by_cause): each
// round trip counts under the cause of the step that waited for it, so the causes add up to
// `round_trips`. The steps of one transaction, in the order they may happen:
enum class RoundTripCause : uint8_t {
  kOther,       // none of those below: session set-up, a lease renewed in line, a log clear
                // or lease check of its own, DDL
  kRead,        // a read's rounds (Get, MultiGet, Delete, scans): lookups, index walks, copies
                // of records, the snapshot's counter read, blobs; a locking read's first round
                // (lookup-lock-read)
  kReadWait,    // a plain read's copy taken again after it met a commit's lock (a wait at the
                // memory server per slice, or a poll on mapped memory)
  kRetake,      // the first read taking its snapshot again (a version newer than it was met)
  kLockCas,     // a locking read's compare-and-swap rounds after its first that wait for
                // nothing: records its first round did not lock, words that moved on
  kLockWait,    // a locking read's rounds that wait for a record held by another (one per
                // slice of the memory server's wait; one per poll on mapped memory)
  kRelock,      // a locking read's records above a held one, given back while it waited and
                // taken again after (the rounds that take them again; on mapped memory also
                // the give-back's own)
  kCommitLock,  // the commit's resolve and lock rounds (skipped after update-intent locks)
  kCommitWait,  // the commit's lock round retried while another holds a record
  kDecide,      // the commit's stamp and log
  kFinish,      // the commit's install and release
  kVersionGc,   // a hot record's version chain trimmed under the commit's lock, or the
                // snapshot announcements read again to decide what to keep
  kRelease,     // locks given back by an abort, a rollback or a failed round
  kAllocator,   // the memory recycler reserving or returning objects in line
  kCount
};
inline constexpr size_t kRoundTripCauses = static_cast<size_t>(RoundTripCause::kCount);
// "other", "read", "read_wait", "retake", ... (the names bench txn --json reports).
std::string_view RoundTripCauseName(RoundTripCause cause);

// Counts of memory operations (pool engines) or messages (sharded), for benchmarks and the
// simulator. Per session.
struct TxnCounters {
  uint64_t reads = 0, writes = 0, cas = 0, faa = 0;  // one-sided operations issued
  uint64_t messages = 0;                             // sharded: request messages sent
  // Sequential network round trips: pool engines, one per sync operation and one per batch
  // of operations posted together; sharded, one per round of requests awaited together.
  // Independent of the fabric: this times a fabric's latency is the waiting it implies.
  uint64_t round_trips = 0;
  // Pool engines: round_trips by what they were for (indexed by RoundTripCause; they add up to
  // round_trips), and those of transaction attempts that ended aborted (counted by cause too).
  std::array<uint64_t, kRoundTripCauses> round_trips_by_cause{};
  uint64_t round_trips_aborted = 0;
  uint64_t commits = 0, aborts = 0;
  // Pool engines: commits that a failure of the memory cut in a round (a server died or failed
  // over to its backup under it) and that the session settled itself at once: finished
  // (counted in commits too) or rolled back (Aborted, counted in aborts).
  uint64_t commits_cut = 0;
  // Pool engines: record reads that found the record locked by a commit (a lock that may be
  // installing a version the snapshot sees) and waited for it. Over messages each copy after
  // such a find waits at the memory server for the release (one round trip); on mapped memory
  // the reader polls.
  uint64_t read_lock_waits = 0;
};

// The columns a read wants (projection): a set of a table's columns by their index in its
// schema. A read given one fills in only those columns of the rows it returns; every other
// column reads as its zero value (0, 0.0, "" for kChar and kBytes). Nothing else changes:
// which rows exist, the versions read and what the transaction's commit validates are those
// of the same read of every column. Columns kept apart from the record (kBytes values, in
// blobs of their own) that are not wanted are not read at all: the pool engines skip the
// round trip that reads them; fixed-layout columns come with the record either way.
class ColumnSet {
 public:
  // Every column: what reads without a ColumnSet return.
  static constexpr ColumnSet All() { return ColumnSet(~uint32_t{0}); }
  // No column: whether each row exists (and, for scans, its key).
  static constexpr ColumnSet None() { return ColumnSet(0); }
  // REQUIRES: every index < Schema::kMaxColumns.
  ColumnSet(std::initializer_list<size_t> columns);

  bool Has(size_t column) const { return (bits_ >> column) & 1; }
  friend constexpr ColumnSet operator|(ColumnSet a, ColumnSet b) {
    return ColumnSet(a.bits_ | b.bits_);
  }
  friend constexpr bool operator==(ColumnSet a, ColumnSet b) { return a.bits_ == b.bits_; }

 private:
  explicit constexpr ColumnSet(uint32_t bits) : bits_(bits) {}
  uint32_t bits_;
};

// A key of a table (MultiGet), and the columns wanted of its row.
struct TableKey {
  const Table* table = nullptr;
  int64_t key = 0;
  ColumnSet columns = ColumnSet::All();
};

// A range of an ordered table (ScanMany): as Scan's arguments.
struct ScanRange {
  const Table* table = nullptr;
  int64_t lo = 0, hi = 0;
  size_t limit = 0;
  bool reverse = false;
  ColumnSet columns = ColumnSet::All();
};

// The isolation level of a transaction (see the top of this file).
enum class Isolation : uint8_t { kSnapshot, kReadCommitted };
Result<Isolation> ParseIsolation(std::string_view text);  // "si" | "rc"
std::string_view IsolationName(Isolation isolation);      // "si" | "rc"

struct TransactionOptions {
  Isolation isolation = Isolation::kSnapshot;
};

// What the caller of a locking read (Transaction::GetForUpdate) will do with the rows it locks.
enum class LockIntent : uint8_t {
  // It may write them or not. Plain reads of other transactions do not wait for the lock
  // (its holder has taken no commit stamp, and takes one only after its commit changed the
  // lock); the commit changes it in a round trip of its own (its lock round).
  kRead,
  // It will write them (or roll back). The lock is a committing writer's from the start:
  // plain reads of other transactions that meet it wait for the transaction to end, as they
  // wait for a commit (bounded as that wait; a key locked this way and not written is
  // released unchanged at commit), and in exchange the commit needs no lock round of its own.
  // Buffered Puts of keys new to tables without a B+tree, made before the call and not read,
  // go into the index in the call's round trip, locked the same way (as the commit's lock
  // round would put them; a key found to exist is left to the commit). So a transaction that
  // Puts its new rows, locks the rows it updates with one call and commits takes 3 round trips
  // on the pool engines (the lock, the decision, the install) where kRead takes 4. Other
  // engines treat it as kRead.
  kUpdate,
};

// A call that returns Aborted aborts the transaction, as an error does in PostgreSQL's
// transaction block: every later call returns Aborted too, and Commit commits nothing (it
// returns Aborted and finishes the transaction); only Rollback (or the destructor) ends it
// otherwise. A write buffered before the abort is never installed, so a caller that reads on
// or commits after an Aborted cannot write past a conflict the abort reported.
class Transaction {
 public:
  virtual ~Transaction() = default;

  // Reads the row of `key` as of this transaction's snapshot (its own writes included), its
  // `columns` only (ColumnSet). NotFound if the key has no visible row.
  virtual Status Get(const Table& table, int64_t key, Row* row, ColumnSet columns) = 0;
  // Get of every column.
  Status Get(const Table& table, int64_t key, Row* row) {
    return Get(table, key, row, ColumnSet::All());
  }
  // Get of several keys (of one or several tables) at once: (*statuses)[i] is what Get of
  // keys[i] (with its columns) would return (OK, or NotFound), with the row in (*rows)[i]. Any
  // other outcome (Aborted, a failure) is returned for the whole call. The pool engines look up
  // every key's index entry in one round trip and read every record in the next (plus one for the
  // rows' variable-length values that are wanted, and rare follow-ups); the default, for other
  // engines, calls Get for each key in turn. REQUIRES: every table pointer non-null.
  virtual Status MultiGet(std::span<const TableKey> keys, std::vector<Row>* rows,
                          std::vector<Status>* statuses);
  // Locking reads: Get / MultiGet that also lock each key's record until the transaction ends
  // (Commit installs the transaction's writes of those keys and unlocks them without locking
  // or validating them again; Rollback, an abort or an error unlocks them). What they return:
  //   kReadCommitted  the newest committed version (the one the lock holds still).
  //   kSnapshot       the newest version too, which the snapshot must see: if this is the
  //                   transaction's first read, its snapshot is taken once the locks are held
  //                   (so it sees them); otherwise a key whose newest version is newer than the
  //                   snapshot aborts the transaction (Aborted, as PostgreSQL's repeatable
  //                   read does for SELECT ... FOR UPDATE).
  // A key held by another transaction is waited for, 100 ms at most (a holder that commits or
  // aborts lets us in; a dead one's lock is broken after its lease), then Aborted: so two
  // transactions that lock the same keys in different orders do not deadlock, one of them
  // aborts. Within one call the records are locked in address order (and a waiter holds none
  // above the one it waits for). A key without a row is NotFound in *statuses, as MultiGet; it
  // is locked only if it has a record (a deleted row's). Under kSnapshot its absence is of the
  // snapshot, as every other read: where the pool engines cannot place it there at once they
  // read the key again (a first read that locked after its lookup, at once; else before a later
  // plain read leaves the records-only snapshot), Aborted if it was inserted meanwhile. Plain
  // reads of other transactions do not wait for these locks (unless taken with
  // LockIntent::kUpdate). A later Get/MultiGet/Scan/Delete of a locked key in the same
  // transaction reads the locked version (Get and MultiGet without a round trip). The pool
  // engines lock every key in one round trip (lock and read together, one message per server),
  // after the round trip that finds the records; the other engines read without locking (their
  // commit validates what was read). `intent` (LockIntent): whether the transaction will write
  // every key it locks; the two forms without it lock with kRead. REQUIRES: as Get / MultiGet.
  virtual Status GetForUpdate(const Table& table, int64_t key, Row* row, LockIntent intent);
  virtual Status MultiGetForUpdate(std::span<const TableKey> keys, std::vector<Row>* rows,
                                   std::vector<Status>* statuses, LockIntent intent);
  Status GetForUpdate(const Table& table, int64_t key, Row* row) {
    return GetForUpdate(table, key, row, LockIntent::kRead);
  }
  Status MultiGetForUpdate(std::span<const TableKey> keys, std::vector<Row>* rows,
                           std::vector<Status>* statuses) {
    return MultiGetForUpdate(keys, rows, statuses, LockIntent::kRead);
  }
  // Inserts or replaces the row of `key` (buffered until Commit).
  virtual Status Put(const Table& table, int64_t key, const Row& row) = 0;
  // Deletes `key` (buffered); NotFound if it has no visible row.
  virtual Status Delete(const Table& table, int64_t key) = 0;
  // Calls `visit` for the visible rows with lo <= key <= hi in key order (descending when
  // `reverse`), at most `limit` of them (0: no limit); stops early if visit returns false.
  // The rows hold `columns` only (ColumnSet).
  // REQUIRES: table.ordered(). Does not see this transaction's own buffered writes.
  virtual Status Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
                      ColumnSet columns,
                      const std::function<bool(int64_t key, const Row& row)>& visit) = 0;
  // Scan of every column.
  Status Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse,
              const std::function<bool(int64_t key, const Row& row)>& visit) {
    return Scan(table, lo, hi, limit, reverse, ColumnSet::All(), visit);
  }
  // Scan of each range in turn (with its columns; `visit` gets the range's index too; false
  // stops them all), with one snapshot. The pool engines read the ranges' first leaves of each
  // table in one round trip (with the snapshot if it is the first read) and the records of all
  // their entries in the next (their wanted blobs in a third), instead of two round trips per
  // range; the default, for other engines, calls Scan for each range. REQUIRES: as Scan, for every
  // range.
  virtual Status ScanMany(
      std::span<const ScanRange> ranges,
      const std::function<bool(size_t range, int64_t key, const Row& row)>& visit);
  // A join through an index: ScanMany of `ranges` (tables used as indexes; the ranges' columns
  // are not read), then MultiGet of the rows of `target` that the visible entries name, key
  // `target_key(range, key)`, `columns` of each. Calls `visit` for every visible entry in
  // ScanMany's order with Get's outcome for its target row (OK with the row, or NotFound with
  // an empty row); false stops. Any other outcome is returned for the whole call, as MultiGet.
  // What it returns is what those two calls would return one after the other in this
  // transaction: the same snapshot (snapshot isolation), own writes, locks held by this
  // transaction's locking reads, reads recorded for the commit. Read committed: one snapshot
  // for the whole call (the two calls would take two). The pool engines, where memory is not
  // mapped, read in the round trip of the ranges' first leaves the index records and the target
  // records that their cached images name (at the address this session knows, else with a
  // near-memory lookup-read), so a warm join costs one round trip where the two calls cost two;
  // every guess is checked against what the fresh leaves and lookups say, a wrong one read
  // again. Over mapped memory, and in the default for other engines, it is the two calls.
  // REQUIRES: as ScanMany; target_key has no side effects (it is also called on guessed keys).
  virtual Status ScanThenGet(
      std::span<const ScanRange> ranges, const Table& target, ColumnSet columns,
      const std::function<int64_t(size_t range, int64_t key)>& target_key,
      const std::function<bool(size_t range, int64_t key, const Status& status, const Row& row)>&
          visit);

  // Installs the writes atomically or returns Aborted (first committer wins; also a lock held
  // by another transaction). Any other error is a failure. The transaction is finished
  // afterwards either way. Unavailable "session fenced" means this session lost its lease
  // (the process stalled longer than it): the commit's outcome is decided by recovery (it
  // committed iff it had been decided), and the session can do nothing more: open a new one.
  virtual Status Commit() = 0;
  // Drops the buffered writes. Idempotent; the destructor of an unfinished transaction calls it.
  virtual void Rollback() = 0;
};

// A compute thread's context: NAM engines give it a session slot (lease, GC announcement) and
// a commit log in the pool. Once fenced (Begin or Commit returned Unavailable), a session stays
// unusable; the process opens a new one. A process fenced off the pool itself (others took it
// for stalled and evicted it: Pool::Evict) gets Evicted from any call that reaches the pool,
// for good: no session of that Database can go on, only a Database opened again (a new pool
// connection). Thread-safety: one thread at a time.
class Session {
 public:
  virtual ~Session() = default;
  virtual Result<std::unique_ptr<Transaction>> Begin() = 0;
  // Begin with options. InvalidArgument if the engine does not offer the isolation level
  // (kSharded: snapshot isolation only); Begin(TransactionOptions{}) is Begin().
  virtual Result<std::unique_ptr<Transaction>> Begin(const TransactionOptions& options);
  virtual const TxnCounters& counters() const = 0;
};

// Runs `body` in a transaction and commits, retrying on Aborted (from body or Commit) with
// randomized backoff up to `max_attempts` times; other errors are returned at once. If every
// attempt aborted, returns Aborted naming the attempts and the last conflict (its table and
// key), never spins forever.
Status RunTransaction(Session& session, const std::function<Status(Transaction&)>& body,
                      int max_attempts = 1000);
// The same with transaction options (isolation).
Status RunTransaction(Session& session, const TransactionOptions& options,
                      const std::function<Status(Transaction&)>& body, int max_attempts = 1000);

// Bulk loading (Database::NewLoader): a new table and its rows, made visible together.
//
//   auto loader = db->NewLoader("accounts", schema, TableOptions{.ordered = true});
//   for (...) FARPOOL_RETURN_IF_ERROR((*loader)->Add(key, row));   // any key order
//   auto accounts = (*loader)->Finish();                          // the table, all rows in it
//
// Contract (every engine):
//   - It creates the table: a loader never writes into an existing table. NewLoader returns
//     AlreadyExists if a table of that name exists; so does Finish if one was created (by any
//     process) meanwhile: the first to publish the name wins.
//   - kPool, kLocal: until Finish returns OK the table does not exist for anyone (OpenTable
//     and ListTables do not see it; CreateTable of the name succeeds). Finish publishes the
//     table with all its rows at once, every row a version with one commit stamp taken by
//     NewLoader: a transaction whose snapshot is older than NewLoader sees the table empty,
//     any other sees every row. A transaction never sees part of a load.
//     kSharded (the default implementation): Finish creates the table and commits the rows in
//     transactions of 500 rows, so a reader that opens the table during Finish may see part
//     of them (not atomic).
//   - Add checks each row (its schema is the table's, by column names, types and lengths; the
//     key is not INT64_MAX, reserved as for Put) and returns InvalidArgument naming the key;
//     a key added twice makes Add or Finish return InvalidArgument "duplicate key K". Any error
//     of Add or Finish abandons the load (the loader can do nothing more).
//   - Abandoned (an error, or the loader destroyed before Finish): nothing becomes visible and
//     the rows' memory is reclaimed by the garbage collector like a dropped table's. kPool,
//     kLocal: a process killed during a load leaves nothing visible; once its session's lease
//     has expired, the garbage collector of any other process reclaims the table's memory as
//     a dropped table's, except what was not yet in the hash index (the rows of the batch in
//     flight, the unused slots of the loader's last slab chunk per server and class, the
//     B+tree nodes of a build not yet published: a bounded leak, docs/database.md). kSharded:
//     a killed Finish leaves the table with the rows committed so far.
//   - kPool and kLocal write rows in batches as they come (1024 rows per memory server per
//     round trip, their hash index entries inserted near memory in the same batch) and build the
//     B+tree bottom-up at Finish; kSharded buffers the rows and commits them in transactions at
//     Finish.
// Thread-safety: a Loader belongs to one thread; loaders of different tables run at once.
// It holds a session slot (kPool, kLocal) until it is destroyed. REQUIRES: the Database
// outlives its Loaders.
class Loader {
 public:
  virtual ~Loader() = default;
  virtual Status Add(int64_t key, const Row& row) = 0;
  // Writes what is left, builds the indexes and publishes the table. After Finish (or an
  // error) Add and Finish return InvalidArgument.
  virtual Result<const Table*> Finish() = 0;
  // Rows added so far.
  virtual uint64_t rows() const = 0;
};

struct DatabaseOptions {
  Engine engine = Engine::kPool;
  // kPool: the cluster file. kSharded: the partition servers' cluster file (`farpool shard`),
  // or empty to run `partitions` partition servers as threads of this process.
  std::string cluster_file;
  int partitions = 2;  // kSharded in-process only
  // kLocal: bytes of local RAM per simulated server (reserved lazily) and server count.
  uint64_t local_memory = 1ull << 30;
  int local_servers = 2;

  // Used only when this Open creates the database; an existing one keeps its own.
  uint32_t max_sessions = 256;  // session slots (compute threads of all processes at once)
  // A session whose lease word stays unchanged for lease + lease/4 (on the observer's
  // monotonic clock) is presumed dead: it is fenced, its decided commit is finished and its
  // locks are broken by whoever meets them. A session trusts its own lease for lease - lease/4
  // after its last renewal and stops (Unavailable) past that. kSharded: a commit's locks
  // expire this long after its prepare.
  std::chrono::milliseconds lease{2000};

  // Testing only: fault-injection sites and switches for the test suite (src/db/testing_hooks.h);
  // null in production.
  std::shared_ptr<const db::TestingHooks> testing;
};

class Database {
 public:
  // Opens the database of the cluster, creating its catalog if there is none.
  static Result<std::unique_ptr<Database>> Open(const DatabaseOptions& options);
  virtual ~Database() = default;

  virtual Engine engine() const = 0;

  // AlreadyExists naming the table if the name is taken; ResourceExhausted when the catalog
  // holds its maximum of tables.
  virtual Result<const Table*> CreateTable(const std::string& name, const Schema& schema,
                                           const TableOptions& options = {}) = 0;
  virtual Result<const Table*> OpenTable(const std::string& name) = 0;
  // A loader that creates the table `name` with the rows added to it (see Loader). The
  // table's name, schema and options are checked as CreateTable checks them (by NewLoader;
  // the default implementation checks the schema and the name's existence, Finish the rest);
  // options.expected_rows should be the number of rows to come (it sizes the hash index).
  // The default (kSharded) buffers the rows and commits them in transactions at Finish.
  virtual Result<std::unique_ptr<Loader>> NewLoader(const std::string& name, const Schema& schema,
                                                    const TableOptions& options = {});

  // Makes the name free again. The table's memory (records, versions, blobs, index buckets)
  // is reclaimed by this process once every snapshot older than the drop has ended.
  // REQUIRES: no transaction of any process uses the table after the drop.
  virtual Status DropTable(const std::string& name) = 0;
  virtual Result<std::vector<std::string>> ListTables() = 0;

  // Claims a session slot (ResourceExhausted if all max_sessions are taken by live sessions).
  virtual Result<std::unique_ptr<Session>> NewSession() = 0;

  // Finishes the commits of sessions whose lease expired and breaks their locks. Transactions
  // do this on their own when they meet such a lock; this is for checkers and tools.
  virtual Status RecoverExpired() = 0;
  // Counts records of `table` still locked (a checker's question; not transactional).
  virtual Result<uint64_t> CountLocked(const Table& table) = 0;
  // Runs one pass of this process's garbage collection now (it also runs in the background)
  // and returns what it has done so far. kSharded keeps one version per key: zeros.
  virtual Result<GcStats> CollectGarbage() = 0;
};

}  // namespace farpool
