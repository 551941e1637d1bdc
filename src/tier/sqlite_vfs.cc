// The "farpool" SQLite VFS, a loadable extension (farpool_vfs.so): database files and their
// journals live in the pool's file store (src/files), SQLite's locks on the file's lock word
// with leases, so processes on different hosts share one database (docs/files.md).
//
//   sqlite3 -cmd ".load build/src/tier/farpool_vfs" -cmd ".open
//   file:social.db?vfs=farpool&cluster=/tmp/c/cluster.json" :memory: (the CLI opens a database
//   named as an argument before it runs -cmd, hence .open)
//
// How it works: a process has one Connection (pool, store, lease slot) per cluster file,
// opened with the first file and closed with the last. The main database, rollback journal,
// WAL and super-journal files are store files named as SQLite names them (the URI's path, plus
// "-journal" and so on); temporary files go to the default VFS. The main database's
// xLock/xUnlock/xCheckReservedLock are FileLock on its lock word, which has one set of bits per
// process (its lease slot); the handles of one process that have the same database open (the
// SQLite connections of several threads) share one ProcessLock, which combines their levels as
// the unix VFS combines the handles of one inode. Whenever a lock is raised, every store file
// this connection has open is refreshed, since another process (or another handle of this one)
// may have changed it. A read transaction that takes SHARED costs one round trip: the CAS
// carries the database header's refresh, the probes for a hot journal and a WAL (answered to
// the xAccess calls that follow) and, where page 1 is on the lock word's server, page 1
// (SQLite's look at its change counter); xFileSize under a lock needs no refresh (nobody else
// can change the file then); and the unlock is posted, not waited for (file_lock.h). A read
// transaction under a kept SHARED lock (below) costs none. `PRAGMA farpool_round_trips` counts
// them.
//
// Keeping SHARED between read transactions (on by default; URI parameter and PRAGMA
// farpool_keep_shared). When the last handle of a process leaves SHARED, the bit stays in the
// word ("kept"); the next read transaction of the process uses it without a round trip. The
// protocol:
//   1. A process's SHARED bit is set from the CAS (or add) that takes it until the release
//      that clears it; while it is set no other process can take EXCLUSIVE (file_lock.h), so
//      nobody else writes the database. A kept bit is therefore a SHARED lock held
//      throughout, as a long read transaction's would be: SQLite's rule "no writer while a
//      reader holds SHARED" holds across hosts because it is the word's rule.
//   2. Hence a transaction under a kept bit needs no version check (the page cache and the
//      header are what the last lock saw, plus this process's own writes), no refresh, and no
//      journal probe: a journal that exists now either existed at the last lock (SQLite
//      checked it then; the "present" bits of that lock answer again, a set bit by asking the
//      store anew) or was created since by a RESERVED writer, which cannot have written the
//      database (that needs EXCLUSIVE), so it holds nothing to roll back: not hot. A WAL is
//      only created under EXCLUSIVE here (no xShmMap).
//   3. A thread of the process, the watch (shared_watch.h), reads the words on which it holds
//      SHARED without writing every kWatchInterval (one batch). When one shows another
//      process holding RESERVED or more (a writer, which will want EXCLUSIVE), a kept bit is
//      released at once (posted, under g_mu, only while no handle reads), and a bit under a
//      running transaction when that transaction ends (`yield`). The next transaction then
//      takes SHARED again as above, and SQLite's PENDING rule (no new SHARED) applies to it.
//      The watch only ever releases, never reads on a reader's behalf, so a late or failed
//      look delays the writer, never endangers it.
//   4. A writer whose EXCLUSIVE finds readers keeps PENDING and, before SQLITE_BUSY, reads the
//      word for up to kWriterPatience for them to leave (FileLock::AwaitReaders): kept bits go
//      within about an interval, so a writer without a busy handler is not refused for them.
//      Readers inside transactions hold writers up as before (SQLITE_BUSY, busy handler).
//   5. A kept bit is the lease's like any SHARED bit: a transaction starting under it checks
//      the lease first (LeaseTable::Check; a process that stalled past its lease and was swept
//      gets SQLITE_IOERR, one that nobody swept takes the lease up again, lease.h), and a
//      crashed process's kept bit is swept after its lease like any other. So that an idle
//      process neither costs the watch's looks nor keeps a writer waiting for its lease should
//      it stall, a bit kept for keep_idle (100 ms; URI farpool_keep_idle_ms) without a
//      transaction is released by the watch.
//
// The journal probe without a round trip: SQLite asks whether "-journal" and "-wal" exist at
// the start of every read transaction, and their names may live on another server than the
// lock word (or not at all: a database that never had a WAL). The database header's companions
// word (layout.h), read with the lock's CAS, answers "no" when its bit is clear. Invariant: while
// companion file i exists, bit i is set. It holds because (1) the VFS sets the bit before it
// creates the file (xOpen with SQLITE_OPEN_CREATE) and (2) clears it only after the file is
// deleted, and only while holding the database's RESERVED lock or more, when no other process
// can create it: SQLite creates journals and WALs only under RESERVED (the hot-journal check
// opens an existing journal without CREATE). A process that dies between (1) and the create, or
// deletes without the lock, leaves the bit set: a reader then probes the name as before, never
// a wrong answer. A clear bit read with the CAS says the file did not exist at that instant,
// the same instant the probe read of its `exists` word would have seen.
// xSync returns OK: a write is complete in the servers' memory when xWrite returns
// (docs/files.md says what that means). There is no xShmMap, so WAL needs
// `PRAGMA locking_mode=EXCLUSIVE`.
//
// Errors: a store error is logged with sqlite3_log (its full message) and returned as the
// matching SQLITE_IOERR_*; a full pool is SQLITE_FULL; a lost lease fails every write and
// lock with SQLITE_IOERR.
//
// Page cache: each process keeps the pages it read of a database (tier::PageCache, 64 MiB by
// default: URI parameter or PRAGMA farpool_cache_mib) across transactions. Every writer adds 1
// to the file's data_version (layout.h) with the CAS that takes EXCLUSIVE; the first SHARED lock
// of a process's transaction reads it with the CAS, and the cache is dropped if it moved. A
// reader whose pages are cached pays the lock's round trip only.
//
// Thread-safety: SQLite serialises calls on one file; g_mu guards the connection table and
// the ProcessLocks (levels, probes, cache) that handles of several threads share.
#include <sqlite3ext.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "files/file_lock.h"
#include "files/file_store.h"
#include "files/lease.h"
#include "tier/page_cache.h"
#include "tier/shared_watch.h"

SQLITE_EXTENSION_INIT1

namespace farpool::files {
namespace {

struct PoolFile;

// One main database's lock as this process holds it, for all of its handles of the file: the
// lock word holds SHARED while any handle holds SHARED or more, and RESERVED or more for the
// one handle that writes. A handle asking for a level another handle of this process prevents
// gets SQLITE_BUSY at once, as from another process.
struct ProcessLock {
  std::unique_ptr<FileLock> word;
  int handles = 0;             // open handles of the file
  int shared = 0;              // handles at SHARED or more
  PoolFile* writer = nullptr;  // the handle at RESERVED or more
  // Whether the rollback journal and the WAL exist, as of the CAS that took SHARED: the
  // answers to SQLite's checks for a hot journal and a WAL (xAccess) in the same transaction.
  // `present` is the header's companions word (bit i: kCompanions[i] may exist) read with the
  // CAS; a clear bit answers "no" at once, a set one by the probe of the file's name posted in
  // the same batch (FileStore::PostExists). Each answer is used once, and dropped on unlock.
  static constexpr const char* kCompanions[] = {"-journal", "-wal"};
  uint64_t present = 0;
  FileStore::ExistsProbe probes[std::size(kCompanions)];
  bool probed[std::size(kCompanions)] = {};
  // Page 1, read with the same CAS where it lives on the lock word's server, into the cache:
  // SQLite's look at its change counter (bytes 24..39) and its read of page 1 that follow are
  // served without a round trip.
  std::vector<unsigned char> head = std::vector<unsigned char>(kHeadDefault);
  File::PostedRead head_read;
  static constexpr size_t kHeadDefault = 4096;  // the page size until page 1 says otherwise
  // The pages this process read or wrote, across transactions (docs/files.md, "The VFS page
  // cache"). `cached_version` is the file's (data_version, generation) the cache is current
  // for; at the first SHARED lock of a transaction (when `shared` goes from 0 to 1) the pair read
  // with the CAS is compared with it, and the cache dropped if either moved. While any handle of
  // this process holds SHARED nobody else can write, and this process's own writes go through
  // the cache, so it stays current until the lock is dropped.
  tier::PageCache cache{kDefaultCacheMib << 20};
  bool cache_current = false;  // cache and cached_version describe the file
  uint64_t cached_version = 0, cached_generation = 0;
  // Whether this EXCLUSIVE lock has bumped the file's data_version (before any write).
  bool bumped = false;
  static constexpr uint64_t kDefaultCacheMib = 64;
  // SHARED kept between read transactions (header comment, "Keeping SHARED"). `kept`: the
  // word holds our SHARED bit while no handle of this process reads; `yield`: the watch saw a
  // writer during a transaction, so the bit goes when it ends.
  const uint64_t id;  // names this lock to the watch (a pointer may be reused)
  bool keep = true;   // URI parameter or PRAGMA farpool_keep_shared
  std::chrono::milliseconds keep_idle{kDefaultKeepIdleMs};  // URI parameter farpool_keep_idle_ms
  static constexpr int64_t kDefaultKeepIdleMs = 100;
  bool kept = false;
  bool yield = false;
  // The handle whose File (size, extent map) is known current: the one refreshed by the last
  // lock, or the last to write. A kept SHARED skips the refresh of that handle only.
  PoolFile* fresh = nullptr;
  std::chrono::steady_clock::time_point kept_since;
  explicit ProcessLock(uint64_t id) : id(id) {}
};

// One cluster's pool, store and lease slot in this process.
struct Connection {
  std::string cluster_file;
  std::unique_ptr<Pool> pool;
  std::unique_ptr<FileStore> store;
  std::unique_ptr<LeaseTable> leases;
  std::set<PoolFile*> files;                                  // open store files
  std::map<std::string, std::unique_ptr<ProcessLock>> locks;  // by main database name
  uint64_t next_lock_id = 1;
  // Last, so that it stops before anything it looks at goes; its thread takes g_mu, so a
  // Connection is destroyed without g_mu held (Release).
  std::unique_ptr<tier::SharedWatch> watch;
};  // every field after leases GUARDED_BY(g_mu)

struct PoolFile {
  sqlite3_file base;  // first: SQLite sees a PoolFile as a sqlite3_file
  Connection* connection;
  std::unique_ptr<File> file;
  ProcessLock* lock;  // the main database only, else null
  LockLevel level;    // this handle's level (main database only)
  bool delete_on_close;
};

std::mutex g_mu;
std::map<std::string, std::unique_ptr<Connection>> g_connections;  // GUARDED_BY(g_mu)
sqlite3_vfs* g_default = nullptr;

// ------------------------------------------------------------------- keeping SHARED

// How often the watch looks at the words of kept locks, and how long a writer holding PENDING
// waits for readers to give their bits up before SQLITE_BUSY. (How long a lock is kept without
// a transaction, so that an idle process neither costs the watch's looks nor holds a writer up
// should it stall: ProcessLock::keep_idle.)
constexpr std::chrono::microseconds kWatchInterval{1000};
constexpr std::chrono::milliseconds kWriterPatience{10};

// Gives up a kept SHARED bit (a posted release, file_lock.h). REQUIRES: g_mu held; l.kept.
Status ReleaseKept(ProcessLock& l) {
  l.kept = false;
  return l.word->Unlock(LockLevel::kNone);
}

// The watch's collect: the words on which this process holds SHARED without writing (kept, or
// in a read transaction); kept locks idle for their keep_idle are given up instead.
std::vector<tier::SharedWatch::Word> Watched(Connection& c) {
  std::vector<tier::SharedWatch::Word> words;
  std::lock_guard<std::mutex> lock(g_mu);
  const auto now = std::chrono::steady_clock::now();
  for (auto& [_, l] : c.locks) {
    if (!l->keep || l->word->level() != LockLevel::kShared || l->yield) continue;
    if (l->kept && now - l->kept_since > l->keep_idle) {
      (void)ReleaseKept(*l);  // a failed post leaves the bit set: the lease reclaims it
      continue;
    }
    words.push_back({l->id, l->word->word()});
  }
  return words;
}

// The watch's report: where another process holds RESERVED or more, a kept bit is given up
// now, a transaction's when it ends. A look older than a change of the lock's state at worst
// gives a bit up early.
void Seen(Connection& c, const std::vector<tier::SharedWatch::Word>& words,
          const std::vector<uint64_t>& values) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (size_t i = 0; i < words.size(); ++i) {
    for (auto& [_, l] : c.locks) {
      if (l->id != words[i].id || l->word->level() != LockLevel::kShared) continue;
      if (!l->word->WriterElsewhere(values[i])) continue;
      if (l->kept) {
        (void)ReleaseKept(*l);
      } else {
        l->yield = true;
      }
    }
  }
}

int Fail(const Status& s, int code) {
  if (s.code() == StatusCode::kOutOfMemory) code = SQLITE_FULL;
  sqlite3_log(code, "farpool: %s", s.ToString().c_str());
  return code;
}

// The connection for `cluster_file`, connecting on first use. REQUIRES: g_mu held.
Result<Connection*> Connect(const std::string& cluster_file) {
  auto it = g_connections.find(cluster_file);
  if (it != g_connections.end()) return it->second.get();
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(cluster_file));
  auto c = std::make_unique<Connection>();
  c->cluster_file = cluster_file;
  FARPOOL_ASSIGN_OR_RETURN(c->pool, Pool::Connect(config));
  FARPOOL_ASSIGN_OR_RETURN(c->store, FileStore::Open(*c->pool));
  FileStore& store = *c->store;
  FARPOOL_ASSIGN_OR_RETURN(
      c->leases, LeaseTable::Attach(store, [&store](int slot) { return ClearSlot(store, slot); }));
  Connection* raw = c.get();
  c->watch = std::make_unique<tier::SharedWatch>(
      *c->pool, kWatchInterval, [raw] { return Watched(*raw); },
      [raw](const auto& words, const auto& values) { Seen(*raw, words, values); });
  g_connections.emplace(cluster_file, std::move(c));
  return raw;
}

// Takes the connection out when its last file is gone; the caller destroys it once g_mu is
// released (its watch thread takes g_mu). REQUIRES: g_mu held.
[[nodiscard]] std::unique_ptr<Connection> Release(Connection* c) {
  if (!c->files.empty()) return nullptr;
  return std::move(g_connections.extract(c->cluster_file).mapped());
}

// The cluster file for a database name: its URI's cluster= parameter, else $FARPOOL_CLUSTER.
Result<std::string> ClusterFileOf(const char* name) {
  const char* p = name != nullptr ? sqlite3_uri_parameter(name, "cluster") : nullptr;
  if (p == nullptr || *p == '\0') p = std::getenv("FARPOOL_CLUSTER");
  if (p == nullptr || *p == '\0') {
    return Status::InvalidArgument(
        "no cluster file: add cluster=PATH/cluster.json to the URI or set FARPOOL_CLUSTER");
  }
  return std::string(p);
}

// The connection that owns `name` (a journal of an open database: its name extends the
// database's), else the one of $FARPOOL_CLUSTER. REQUIRES: g_mu held.
Result<Connection*> ConnectionFor(const char* name) {
  const std::string_view n(name);
  for (auto& [_, c] : g_connections) {
    for (PoolFile* f : c->files) {
      if (n.substr(0, f->file->name().size()) == f->file->name()) return c.get();
    }
  }
  FARPOOL_ASSIGN_OR_RETURN(std::string cluster_file, ClusterFileOf(nullptr));
  return Connect(cluster_file);
}

PoolFile& Of(sqlite3_file* f) { return *reinterpret_cast<PoolFile*>(f); }

// ------------------------------------------------------------------- companion files

uint64_t CompanionBit(size_t i) { return uint64_t{1} << i; }

// A companion file's database: its name without the suffix kCompanions[index], and a handle of
// this process that has it open (null if none): the writer's if it has one, whose view of the
// companions word follows this process's own changes.
struct Companion {
  std::string database;
  size_t index;
  PoolFile* main;
};
// REQUIRES: g_mu held.
std::optional<Companion> CompanionOf(Connection& c, std::string_view name) {
  for (size_t i = 0; i < std::size(ProcessLock::kCompanions); ++i) {
    const std::string_view suffix = ProcessLock::kCompanions[i];
    if (name.size() <= suffix.size() || !name.ends_with(suffix)) continue;
    Companion companion{std::string(name.substr(0, name.size() - suffix.size())), i, nullptr};
    for (PoolFile* f : c.files) {
      if (f->lock == nullptr || f->file->name() != companion.database) continue;
      if (companion.main == nullptr || f->lock->writer == f) companion.main = f;
    }
    return companion;
  }
  return std::nullopt;
}

// Before companion file `name` may be created: its bit in the database's companions word is
// set (the first half of the invariant in the header comment). The handle's view of the word is
// current under this process's write lock (Lock refreshed it, and only the lock's holder clears
// a bit); without it, the header is read again first. REQUIRES: g_mu held.
Status MarkCompanion(Connection& c, std::string_view name) {
  std::optional<Companion> companion = CompanionOf(c, name);
  if (!companion) return Status::Ok();
  std::unique_ptr<File> opened;
  File* main = companion->main != nullptr ? companion->main->file.get() : nullptr;
  if (main == nullptr) {
    auto f = c.store->OpenFile(companion->database, OpenMode::kExisting);
    if (f.status().code() == StatusCode::kNotFound) return Status::Ok();  // no database to mark
    if (!f.ok()) return f.status();
    opened = std::move(*f);
    main = opened.get();
  } else if (companion->main->lock->writer == nullptr) {
    FARPOOL_RETURN_IF_ERROR(main->Refresh());
  }
  return main->SetCompanions(CompanionBit(companion->index), /*set=*/true);
}

// After companion file `name` was deleted (or found absent): its bit is cleared if this process
// holds the database's write lock, the only time nobody else can create the file (SQLite
// creates journals under RESERVED or more). Otherwise the bit stays set: a set bit costs a
// reader a probe, never a wrong answer. REQUIRES: g_mu held.
Status UnmarkCompanion(Connection& c, std::string_view name) {
  std::optional<Companion> companion = CompanionOf(c, name);
  if (!companion || companion->main == nullptr || companion->main->lock->writer == nullptr) {
    return Status::Ok();
  }
  return companion->main->file->SetCompanions(CompanionBit(companion->index), /*set=*/false);
}

// ------------------------------------------------------------------- sqlite3_io_methods

// Lowers handle p's lock to `level` (kShared or kNone). REQUIRES: g_mu held.
Status LowerLock(PoolFile& p, LockLevel level) {
  ProcessLock& l = *p.lock;
  if (level >= p.level) return Status::Ok();
  Status s;
  if (l.writer == &p) {
    l.writer = nullptr;
    l.bumped = false;
    s = l.word->Unlock(LockLevel::kShared);
  }
  if (level == LockLevel::kNone && --l.shared == 0 && s.ok()) {
    std::fill(std::begin(l.probed), std::end(l.probed), false);
    if (l.keep && !l.yield && l.word->level() == LockLevel::kShared) {
      l.kept = true;  // the watch looks at it (it did during the transaction)
      l.kept_since = std::chrono::steady_clock::now();
    } else {
      l.yield = false;
      s = l.word->Unlock(LockLevel::kNone);
    }
  }
  p.level = level;
  return s;
}

// A cache size in MiB as bytes; a negative one is 0 (the cache then keeps the last page only).
uint64_t CacheBytes(sqlite3_int64 mib) { return mib <= 0 ? 0 : static_cast<uint64_t>(mib) << 20; }

int Close(sqlite3_file* f) {
  PoolFile& p = Of(f);
  int rc = SQLITE_OK;
  std::unique_ptr<Connection> closed;  // destroyed after g_mu is released (Release)
  std::lock_guard<std::mutex> lock(g_mu);
  const std::string name = p.file->name();
  if (p.lock != nullptr) {
    Status s = LowerLock(p, LockLevel::kNone);
    if (!s.ok()) rc = Fail(s, SQLITE_IOERR_UNLOCK);
    if (p.lock->fresh == &p) p.lock->fresh = nullptr;
    if (--p.lock->handles == 0) {
      if (p.lock->kept) {
        s = ReleaseKept(*p.lock);
        if (!s.ok() && rc == SQLITE_OK) rc = Fail(s, SQLITE_IOERR_UNLOCK);
      }
      // The last handle may take the lease slot with it (Release): no release of ours may
      // land after that.
      s = p.lock->word->Drain();
      if (!s.ok() && rc == SQLITE_OK) rc = Fail(s, SQLITE_IOERR_UNLOCK);
      p.connection->locks.erase(name);
    }
    p.lock = nullptr;
  }
  p.file.reset();
  p.connection->files.erase(&p);
  if (p.delete_on_close) {
    Status s = p.connection->store->Delete(name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) rc = Fail(s, SQLITE_IOERR_DELETE);
  }
  closed = Release(p.connection);
  return rc;
}

// The handle's process cache, when it describes the file: a main database this handle holds
// SHARED or more on. REQUIRES: g_mu held.
tier::PageCache* CacheOf(PoolFile& p) {
  if (p.lock == nullptr || p.level < LockLevel::kShared || !p.lock->cache_current) return nullptr;
  return &p.lock->cache;
}

int Read(sqlite3_file* f, void* out, int n, sqlite3_int64 offset) {
  PoolFile& p = Of(f);
  tier::PageCache* cache = nullptr;
  if (p.lock != nullptr) {
    std::lock_guard<std::mutex> lock(g_mu);  // the cache is shared by the process's handles
    cache = CacheOf(p);
    if (cache != nullptr && cache->Get(offset, out, n)) return SQLITE_OK;
  }
  // Without the mutex: while this handle holds SHARED, no handle of this process writes or
  // drops the cache (both need the others to hold no SHARED).
  auto got = p.file->Read(offset, out, n);
  if (!got.ok()) return Fail(got.status(), SQLITE_IOERR_READ);
  if (*got < static_cast<uint64_t>(n)) return SQLITE_IOERR_SHORT_READ;
  if (cache != nullptr) {
    std::lock_guard<std::mutex> lock(g_mu);
    cache->Put(offset, out, n);
  }
  return SQLITE_OK;
}

// Adds 1 to the file's data_version before this lock's first write, with the CAS that takes
// EXCLUSIVE (Lock) or, should a write come without it, here. The cache stays current: this
// process has held SHARED since it was checked, so nobody else wrote, and the version bumped to
// is the one a reader will compare with. REQUIRES: g_mu held; this handle holds EXCLUSIVE.
void NoteBump(ProcessLock& l, uint64_t previous) {
  l.bumped = true;
  l.cached_version = previous + 1;
}
Status Bump(PoolFile& p) {
  ProcessLock& l = *p.lock;
  if (l.bumped) return Status::Ok();
  FARPOOL_ASSIGN_OR_RETURN(uint64_t previous,
                           p.connection->pool->FetchAdd(p.file->data_version_word(), 1));
  NoteBump(l, previous);
  return Status::Ok();
}

int Write(sqlite3_file* f, const void* data, int n, sqlite3_int64 offset) {
  PoolFile& p = Of(f);
  std::unique_lock<std::mutex> lock(g_mu, std::defer_lock);
  if (p.lock != nullptr) lock.lock();  // the main database: its ProcessLock and cache
  Status s = p.connection->leases->Check();
  if (s.ok() && p.lock != nullptr) s = Bump(p);
  if (s.ok()) s = p.file->Write(offset, data, n);
  if (p.lock != nullptr) {
    p.lock->fresh = &p;  // other handles' Files may now be stale
    if (s.ok()) {
      p.lock->cache.Write(offset, data, n);
    } else {
      p.lock->cache_current = false;  // the bytes may have landed in part
    }
  }
  return s.ok() ? SQLITE_OK : Fail(s, SQLITE_IOERR_WRITE);
}

int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  PoolFile& p = Of(f);
  std::unique_lock<std::mutex> lock(g_mu, std::defer_lock);
  if (p.lock != nullptr) lock.lock();  // the main database: its ProcessLock and cache
  Status s = p.connection->leases->Check();
  if (s.ok() && p.lock != nullptr) s = Bump(p);
  if (s.ok()) s = p.file->Truncate(size);
  if (p.lock != nullptr) {
    ProcessLock& l = *p.lock;
    l.fresh = &p;  // other handles' Files may now be stale
    l.cache.Truncate(size);
    // A truncate that released extents bumped the generation: ours, under EXCLUSIVE.
    l.cached_generation = p.file->generation();
    if (!s.ok()) l.cache_current = false;
  }
  return s.ok() ? SQLITE_OK : Fail(s, SQLITE_IOERR_TRUNCATE);
}

int Sync(sqlite3_file*, int) { return SQLITE_OK; }  // complete in pool memory already

int FileSize(sqlite3_file* f, sqlite3_int64* size) {
  PoolFile& p = Of(f);
  // A main database this handle holds SHARED or more on was refreshed when the lock was taken,
  // and only this process can change it until the lock is dropped (writers need EXCLUSIVE).
  Status s = p.lock != nullptr && p.level >= LockLevel::kShared ? Status::Ok() : p.file->Refresh();
  if (!s.ok()) return Fail(s, SQLITE_IOERR_FSTAT);
  *size = static_cast<sqlite3_int64>(p.file->size());
  return SQLITE_OK;
}

// After the batch that took SHARED for the process: the cache is kept if the file's version
// is the one it is current for, else dropped; page 1, if it came with the batch, goes in, and
// its page size (bytes 16..17, big endian; 1 means 65536) is what the next lock reads.
// REQUIRES: g_mu held; the batch's refresh finished.
void CheckCache(ProcessLock& l, const File& file) {
  if (!l.cache_current || l.cached_version != file.data_version() ||
      l.cached_generation != file.generation()) {
    l.cache.Clear();
    l.cached_version = file.data_version();
    l.cached_generation = file.generation();
    l.cache_current = true;
  }
  if (!file.ReadCurrent(l.head_read)) return;
  l.cache.Put(0, l.head.data(), l.head_read.n);
  const unsigned field = (unsigned{l.head[16]} << 8) | l.head[17];
  const size_t page = field == 1 ? 65536 : field;
  if (page >= 512 && page <= 65536 && (page & (page - 1)) == 0) l.head.resize(page);
}

int Lock(sqlite3_file* f, int level) {
  PoolFile& p = Of(f);
  if (p.lock == nullptr) return SQLITE_OK;
  const auto want = static_cast<LockLevel>(level);
  if (want <= p.level) return SQLITE_OK;
  std::lock_guard<std::mutex> lock(g_mu);
  ProcessLock& l = *p.lock;
  Status s;
  PoolFile* refreshed = nullptr;  // refreshed in the lock's own batch
  if (want == LockLevel::kShared) {
    if (l.writer != nullptr && l.writer->level >= LockLevel::kPending) return SQLITE_BUSY;
    if (l.shared == 0 && l.kept) {
      // Our SHARED bit was never given up since the last lock: nobody else wrote (the cache
      // and the header are current), and no journal can have become hot (header comment).
      // The lease is checked as Lock would (a stalled process's bit may have been swept).
      s = p.connection->leases->Check();
      if (!s.ok()) return Fail(s, SQLITE_IOERR_LOCK);
      l.kept = false;
      for (size_t i = 0; i < std::size(l.kCompanions); ++i) {
        l.probed[i] = (l.present & CompanionBit(i)) == 0;  // "no", else asked anew
      }
      if (l.fresh == &p) refreshed = &p;
    } else if (l.shared == 0) {
      l.yield = false;
      // SQLite's first look at the database in one round trip: the CAS, then (same server,
      // after it) the header, and whether a journal or a WAL exists where their names are on
      // that server too.
      FileStore& store = *p.connection->store;
      const uint16_t server = p.file->header().server();
      s = l.word->Lock(LockLevel::kShared, [&](Batch& batch) {
        FARPOOL_RETURN_IF_ERROR(p.file->PostRefresh(batch));
        for (size_t i = 0; i < std::size(l.kCompanions); ++i) {
          FARPOOL_RETURN_IF_ERROR(
              store.PostExists(batch, p.file->name() + l.kCompanions[i], server, &l.probes[i]));
        }
        FARPOOL_ASSIGN_OR_RETURN(l.head_read,
                                 p.file->PostRead(batch, 0, l.head.data(), l.head.size(), server));
        return Status::Ok();
      });
      if (s.ok()) {
        p.file->FinishRefresh();
        refreshed = &p;
        l.present = p.file->companions();
        std::fill(std::begin(l.probed), std::end(l.probed), true);
        CheckCache(l, *p.file);
        if (l.keep) p.connection->watch->Wake();
      }
    }
    if (s.ok()) ++l.shared;
  } else if (l.writer != nullptr && l.writer != &p) {
    return SQLITE_BUSY;  // another handle of this process writes
  } else if (want == LockLevel::kExclusive && l.shared > 1) {
    return SQLITE_BUSY;  // other handles of this process read
  } else {
    // The data_version bump rides with the CAS that takes EXCLUSIVE (same server, after it). A
    // CAS that fails bumps it too, harmlessly: a reader that sees it moved only drops its cache.
    uint64_t previous = 0;
    const bool bump = want == LockLevel::kExclusive && !l.bumped;
    const auto with =
        bump ? [&](Batch&
                       batch) { return batch.FetchAdd(p.file->data_version_word(), 1, &previous); }
             : std::function<Status(Batch&)>();
    s = l.word->Lock(want, with);
    if (s.code() == StatusCode::kAborted && l.word->level() == LockLevel::kPending &&
        l.word->AwaitReaders(kWriterPatience).ok()) {
      // Readers that kept SHARED gave it up (their watch saw our PENDING): without this wait a
      // writer with no busy handler would be refused where no reader is at work.
      s = l.word->Lock(want, with);
    }
    if (s.ok() && bump) NoteBump(l, previous);
    if (s.ok() || l.word->level() >= LockLevel::kReserved) l.writer = &p;
    if (l.writer == &p) p.level = l.word->level();
  }
  if (s.code() == StatusCode::kAborted) return SQLITE_BUSY;
  if (!s.ok()) return Fail(s, SQLITE_IOERR_LOCK);
  p.level = want;
  // Others may have changed any of this connection's files while this handle held less.
  for (PoolFile* other : p.connection->files) {
    if (other == refreshed) continue;
    s = other->file->Refresh();
    if (!s.ok()) return Fail(s, SQLITE_IOERR_LOCK);
  }
  l.fresh = &p;
  return SQLITE_OK;
}

int Unlock(sqlite3_file* f, int level) {
  PoolFile& p = Of(f);
  if (p.lock == nullptr) return SQLITE_OK;
  std::lock_guard<std::mutex> lock(g_mu);
  Status s = LowerLock(p, static_cast<LockLevel>(level));
  return s.ok() ? SQLITE_OK : Fail(s, SQLITE_IOERR_UNLOCK);
}

int CheckReservedLock(sqlite3_file* f, int* out) {
  PoolFile& p = Of(f);
  *out = 0;
  if (p.lock == nullptr) return SQLITE_OK;
  std::lock_guard<std::mutex> lock(g_mu);
  if (p.lock->writer != nullptr) {
    *out = 1;
    return SQLITE_OK;
  }
  auto r = p.lock->word->ReservedElsewhere();
  if (!r.ok()) return Fail(r.status(), SQLITE_IOERR_CHECKRESERVEDLOCK);
  *out = *r ? 1 : 0;
  return SQLITE_OK;
}

// `PRAGMA farpool_round_trips`: the round trips this process's connection to the cluster has
// made for SQLite (over TCP; lease renewals and the watch's looks left out), for measuring
// what a statement costs. `PRAGMA farpool_watch_round_trips`: the watch's looks (off every
// transaction's path).
// `PRAGMA farpool_cache_mib [= N]`: the database's page cache in this process (MiB; the URI
// parameter farpool_cache_mib sets it at open, 64 by default).
// `PRAGMA farpool_keep_shared [= 0|1]`: whether this process keeps the database's SHARED lock
// between read transactions (the URI parameter farpool_keep_shared sets it at open, on by
// default).
int FileControl(sqlite3_file* f, int op, void* arg) {
  if (op != SQLITE_FCNTL_PRAGMA) return SQLITE_NOTFOUND;
  auto** a = static_cast<char**>(arg);  // [0]: result, [1]: pragma name, [2]: its argument
  PoolFile& p = Of(f);
  if (sqlite3_stricmp(a[1], "farpool_round_trips") == 0) {
    const Connection& c = *p.connection;
    const uint64_t off_path = c.leases->renewals() + c.watch->looks();
    const uint64_t all = c.pool->counters().round_trips;
    a[0] = sqlite3_mprintf("%llu", static_cast<unsigned long long>(all - std::min(all, off_path)));
    return SQLITE_OK;
  }
  if (sqlite3_stricmp(a[1], "farpool_watch_round_trips") == 0) {
    a[0] = sqlite3_mprintf("%llu", static_cast<unsigned long long>(p.connection->watch->looks()));
    return SQLITE_OK;
  }
  if (sqlite3_stricmp(a[1], "farpool_keep_shared") == 0 && p.lock != nullptr) {
    std::lock_guard<std::mutex> lock(g_mu);
    ProcessLock& l = *p.lock;
    if (a[2] != nullptr) {
      l.keep = !(sqlite3_stricmp(a[2], "0") == 0 || sqlite3_stricmp(a[2], "off") == 0 ||
                 sqlite3_stricmp(a[2], "false") == 0 || sqlite3_stricmp(a[2], "no") == 0);
      if (!l.keep && l.kept) {
        Status s = ReleaseKept(l);
        if (!s.ok()) return Fail(s, SQLITE_IOERR_UNLOCK);
      }
    }
    a[0] = sqlite3_mprintf("%d", l.keep ? 1 : 0);
    return SQLITE_OK;
  }
  if (sqlite3_stricmp(a[1], "farpool_cache_mib") == 0 && p.lock != nullptr) {
    std::lock_guard<std::mutex> lock(g_mu);
    tier::PageCache& cache = p.lock->cache;
    if (a[2] != nullptr) cache.set_capacity(CacheBytes(std::atoll(a[2])));
    a[0] = sqlite3_mprintf("%llu", static_cast<unsigned long long>(cache.capacity() >> 20));
    return SQLITE_OK;
  }
  return SQLITE_NOTFOUND;
}

int SectorSize(sqlite3_file*) { return 4096; }

int DeviceCharacteristics(sqlite3_file*) {
  // Writes complete in order as issued (SEQUENTIAL), data before the size that covers it
  // (SAFE_APPEND), and a write never disturbs bytes it does not cover (POWERSAFE_OVERWRITE).
  return SQLITE_IOCAP_SEQUENTIAL | SQLITE_IOCAP_SAFE_APPEND | SQLITE_IOCAP_POWERSAFE_OVERWRITE;
}

const sqlite3_io_methods kMethods = {
    1,  // iVersion: no xShm*, so WAL needs PRAGMA locking_mode=EXCLUSIVE
    Close,       Read,       Write,
    Truncate,    Sync,       FileSize,
    Lock,        Unlock,     CheckReservedLock,
    FileControl, SectorSize, DeviceCharacteristics,
    nullptr,     nullptr,    nullptr,
    nullptr,     nullptr,    nullptr};

// ------------------------------------------------------------------- sqlite3_vfs

constexpr int kStoreFiles =
    SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_WAL | SQLITE_OPEN_SUPER_JOURNAL;

int Open(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out_flags) {
  if (name == nullptr || (flags & kStoreFiles) == 0) {
    return g_default->xOpen(g_default, name, f, flags, out_flags);  // temporary files
  }
  auto* p = new (f) PoolFile{};
  std::unique_ptr<Connection> closed;  // destroyed after g_mu is released (Release)
  std::lock_guard<std::mutex> lock(g_mu);
  Result<Connection*> c = Status::Internal("unset");
  if ((flags & SQLITE_OPEN_MAIN_DB) != 0) {
    auto cluster_file = ClusterFileOf(name);
    c = cluster_file.ok() ? Connect(*cluster_file) : Result<Connection*>(cluster_file.status());
  } else {
    c = ConnectionFor(name);
  }
  if (!c.ok()) return Fail(c.status().WithContext(name), SQLITE_CANTOPEN);
  if ((flags & SQLITE_OPEN_CREATE) != 0) {
    Status s = MarkCompanion(**c, name);
    if (!s.ok()) {
      closed = Release(*c);
      return Fail(s.WithContext(name), SQLITE_CANTOPEN);
    }
  }
  const OpenMode mode = (flags & SQLITE_OPEN_EXCLUSIVE) != 0 ? OpenMode::kCreateExclusive
                        : (flags & SQLITE_OPEN_CREATE) != 0  ? OpenMode::kCreate
                                                             : OpenMode::kExisting;
  auto file = (*c)->store->OpenFile(name, mode);
  if (!file.ok()) {
    closed = Release(*c);
    return Fail(file.status(), SQLITE_CANTOPEN);
  }
  p->connection = *c;
  p->file = std::move(*file);
  p->lock = nullptr;
  p->level = LockLevel::kNone;
  if ((flags & SQLITE_OPEN_MAIN_DB) != 0) {
    auto& l = (*c)->locks[p->file->name()];
    if (!l) {
      l = std::make_unique<ProcessLock>((*c)->next_lock_id++);
      l->keep = sqlite3_uri_boolean(name, "farpool_keep_shared", 1) != 0;
      l->keep_idle = std::chrono::milliseconds(
          sqlite3_uri_int64(name, "farpool_keep_idle_ms", ProcessLock::kDefaultKeepIdleMs));
      l->word = std::make_unique<FileLock>(*(*c)->pool, p->file->lock_word(), *(*c)->leases);
      l->cache.set_capacity(
          CacheBytes(sqlite3_uri_int64(name, "farpool_cache_mib", ProcessLock::kDefaultCacheMib)));
    }
    ++l->handles;
    p->lock = l.get();
  }
  p->delete_on_close = (flags & SQLITE_OPEN_DELETEONCLOSE) != 0;
  (*c)->files.insert(p);
  p->base.pMethods = &kMethods;
  if (out_flags != nullptr) *out_flags = flags;
  return SQLITE_OK;
}

int Delete(sqlite3_vfs*, const char* name, int) {
  std::unique_ptr<Connection> closed;  // destroyed after g_mu is released (Release)
  std::lock_guard<std::mutex> lock(g_mu);
  auto c = ConnectionFor(name);
  if (!c.ok()) return Fail(c.status().WithContext(name), SQLITE_IOERR_DELETE);
  Status s = (*c)->store->Delete(name);
  const bool gone = s.ok() || s.code() == StatusCode::kNotFound;
  if (gone) {
    Status u = UnmarkCompanion(**c, name);
    if (!u.ok()) {
      closed = Release(*c);
      return Fail(u.WithContext(name), SQLITE_IOERR_DELETE);
    }
  }
  closed = Release(*c);
  if (s.code() == StatusCode::kNotFound) return SQLITE_IOERR_DELETE_NOENT;
  return s.ok() ? SQLITE_OK : Fail(s, SQLITE_IOERR_DELETE);
}

int Access(sqlite3_vfs*, const char* name, int, int* out) {
  std::unique_ptr<Connection> closed;  // destroyed after g_mu is released (Release)
  std::lock_guard<std::mutex> lock(g_mu);
  auto c = ConnectionFor(name);
  if (!c.ok()) return Fail(c.status().WithContext(name), SQLITE_IOERR_ACCESS);
  // SQLite's checks for a hot journal and a WAL after SHARED was taken: answered by the
  // lock's probes.
  FileStore::ExistsProbe* probe = nullptr;
  bool absent = false;  // the database's companions word says so
  for (auto& [_, l] : (*c)->locks) {
    for (size_t i = 0; i < std::size(l->kCompanions); ++i) {
      if (l->probed[i] && l->probes[i].name == name) {
        l->probed[i] = false;
        probe = &l->probes[i];
        absent = (l->present & CompanionBit(i)) == 0;
      }
    }
  }
  Result<bool> exists = absent             ? Result<bool>(false)
                        : probe != nullptr ? (*c)->store->FinishExists(*probe)
                                           : (*c)->store->Exists(name);
  closed = Release(*c);
  if (!exists.ok()) return Fail(exists.status(), SQLITE_IOERR_ACCESS);
  *out = *exists ? 1 : 0;
  return SQLITE_OK;
}

int FullPathname(sqlite3_vfs*, const char* name, int size, char* out) {
  // Store names are not paths: the name is the file's name in the pool.
  if (std::strlen(name) + 1 > static_cast<size_t>(size)) return SQLITE_CANTOPEN;
  std::strcpy(out, name);
  return SQLITE_OK;
}

void* DlOpen(sqlite3_vfs*, const char* path) { return g_default->xDlOpen(g_default, path); }
void DlError(sqlite3_vfs*, int n, char* out) { g_default->xDlError(g_default, n, out); }
void (*DlSym(sqlite3_vfs*, void* h, const char* sym))(void) {
  return g_default->xDlSym(g_default, h, sym);
}
void DlClose(sqlite3_vfs*, void* h) { g_default->xDlClose(g_default, h); }
int Randomness(sqlite3_vfs*, int n, char* out) { return g_default->xRandomness(g_default, n, out); }
int Sleep(sqlite3_vfs*, int us) { return g_default->xSleep(g_default, us); }
int CurrentTime(sqlite3_vfs*, double* t) { return g_default->xCurrentTime(g_default, t); }
int GetLastError(sqlite3_vfs*, int n, char* out) {
  return g_default->xGetLastError(g_default, n, out);
}
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* t) {
  return g_default->xCurrentTimeInt64(g_default, t);
}

sqlite3_vfs g_vfs = {2,  // iVersion
                     0,  // szOsFile: set at registration
                     1024,
                     nullptr,
                     "farpool",
                     nullptr,
                     Open,
                     Delete,
                     Access,
                     FullPathname,
                     DlOpen,
                     DlError,
                     DlSym,
                     DlClose,
                     Randomness,
                     Sleep,
                     CurrentTime,
                     GetLastError,
                     CurrentTimeInt64,
                     nullptr,
                     nullptr,
                     nullptr};

}  // namespace
}  // namespace farpool::files

extern "C" __attribute__((visibility("default"))) int sqlite3_extension_init(
    sqlite3* db, char** error, const sqlite3_api_routines* api) {
  SQLITE_EXTENSION_INIT2(api);
  using farpool::files::g_default;
  using farpool::files::g_vfs;
  if (sqlite3_vfs_find("farpool") == nullptr) {
    g_default = sqlite3_vfs_find(nullptr);
    if (g_default == nullptr) {
      *error = sqlite3_mprintf("farpool: SQLite has no default VFS to delegate to");
      return SQLITE_ERROR;
    }
    // Temporary files are the default VFS's, opened in the same sqlite3_file space.
    g_vfs.szOsFile = std::max<int>(sizeof(farpool::files::PoolFile), g_default->szOsFile);
    const int rc = sqlite3_vfs_register(&g_vfs, /*makeDflt=*/0);
    if (rc != SQLITE_OK) return rc;
  }
  return SQLITE_OK_LOAD_PERMANENTLY;
}
