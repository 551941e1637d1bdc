// Pool: a compute process's view of the memory pool, one 64-bit address space spread over
// many memory servers.
//
//   auto pool = Pool::Connect(*ClusterConfig::Load("cluster.json"));
//   auto addr = (*pool)->Alloc(4096);                       // striped over the servers
//   Status s  = (*pool)->Write(*addr, buf, 4096);           // one-sided
//   auto old  = (*pool)->CompareAndSwap(*addr, 0, 1);       // 8-byte atomics
//   Batch b(**pool);                                        // post many, wait once
//   for (...) b.Read(a[i], out[i], 64);
//   s = b.Wait();
//
// Semantics:
//   - Reads, writes and atomics are one-sided where the fabric allows: on shared memory they
//     are loads, stores and CPU atomics on the server's region mapped into this process; on
//     RDMA they are UCX get/put/atomic operations. Over TCP a one-sided operation would be a
//     message anyway, so each Batch goes to each server it touches as ONE message that the
//     server executes (a batch costs one round trip however many operations it holds; see
//     PoolOptions::remote_access). The semantics are the same on every path, so processes on
//     different fabrics share one pool. A sync call returns when the operation is complete at
//     the server (a write is visible to every other client).
//   - Atomics are on 8-byte words at 8-byte-aligned addresses and are atomic with respect to
//     every other atomic on the same word from any client. Plain reads and writes are not
//     atomic beyond what the hardware gives; concurrent writers of the same bytes race.
//   - Operations in one Batch are unordered with respect to each other, except across a
//     Batch::Fence() (per server); Wait() returns once all are complete at their servers.
//   - Every address is checked before anything is posted: null, a server not in the cluster,
//     a range past the server's region, a range inside memory this client freed, or a
//     misaligned atomic give InvalidArgument and nothing is sent. A server that failed gives
//     Unavailable; an operation that does not complete within PoolOptions::op_timeout gives
//     TimedOut. Every message names the server ("server 3 (10.0.0.3:7000): ...").
//   - Memory: Alloc carves objects out of chunks leased from the servers. Objects of up to
//     chunk_size/4 bytes come from per-size-class slots; larger ones get a run of whole chunks
//     of their own. An object lives on one server (striping spreads objects, not bytes).
//     Leases belong to the pool, not to this process: data outlives the process that wrote it.
//     Free works on objects this Pool allocated (another process's objects are freed by the
//     database layer's own structures). Freed memory stays leased to this client, is reused
//     by later Allocs, and accesses to it are rejected, until Trim() (or the destructor)
//     gives it back to the servers; a lease refused for lack of room trims first.
//   - A server that dies is noticed by an error on its connection, or by heartbeats unanswered
//     for PoolOptions::failure_timeout and then a hello on a fresh connection unanswered for
//     1 s more (a server that answers that hello was only slow and stays in use); from then on
//     every call that touches it fails fast with Unavailable, calls to other servers go on. It
//     is not reconnected: connect a new Pool. (A server that refuses this process because it
//     was evicted is no failed server: see "Eviction" below, code Evicted.)
//   - Servers added to the cluster (`farpool cluster add`; a cluster with an etcd, with or
//     without replicas): the Pool learns them from the cluster map while it runs (the map follower,
//     fed by an etcd watch of the map), says hello (same secret and pool rules as at Connect) and
//     only then enters them: from then on server_ids(), Geometry(), striped and by-key placement
//     and addresses of theirs include them. A server the map names that does not answer is not
//     entered and is tried again later; nothing is placed on it meanwhile. In a replicated
//     cluster a server is entered only once the map names a backup of its own region (until
//     then it refuses every change; a new session would fail on it). Each thread connects to
//     a learned server on its first use of it (one hello). At most 1024 servers per Pool.
//   - Planned moves (`farpool cluster drain`): a server being drained refuses requests without
//     executing them; the Pool follows the map to the region's new server and sends them again
//     there, so callers see no error (without replicas too, once `cluster drain` has copied the
//     region to another server: docs/pool.md "Drain without replicas"). Also resent there, in
//     a replicated cluster or one with an etcd: reads (and
//     lookup-reads) cut by a server's failure, and operations that had not left when their
//     server failed. Never resent: a write, compare-and-swap, fetch-and-add or insert that may
//     have reached a server that then failed (its outcome is unknown: Unavailable, "may or may
//     not have taken effect"). OpCounters::resent counts what was sent again.
//
// Thread-safety: a Pool is safe for concurrent use by any number of threads. Each thread gets
// its own UCX worker on its first call, and its own endpoint to a server (one hello round trip)
// on its first use of that server (one worker per thread, no shared queue): a thread never
// waits on a server it does not use.
// A Batch belongs to the thread that created it. REQUIRES: the Pool outlives every thread's
// use of it and every Batch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "farpool/address.h"
#include "farpool/cluster.h"
#include "farpool/fabric.h"
#include "farpool/status.h"

namespace farpool {

// Where Alloc puts an object.
class Placement {
 public:
  enum class Kind : uint8_t { kStriped, kOnServer, kByKey };
  // Round-robin over the servers; a full server is skipped.
  static Placement Striped() { return Placement(Kind::kStriped, 0); }
  // On server `id` only.
  static Placement OnServer(uint16_t id) { return Placement(Kind::kOnServer, id); }
  // On the server that jump-consistent-hashes `key`: the same key always lands on the same
  // server of a given cluster, and growing the cluster moves few keys.
  static Placement ByKey(uint64_t key) { return Placement(Kind::kByKey, key); }

  Kind kind() const { return kind_; }
  uint64_t value() const { return value_; }

 private:
  Placement(Kind kind, uint64_t value) : kind_(kind), value_(value) {}
  Kind kind_;
  uint64_t value_;
};

// How operations reach a server whose region this process has not mapped.
enum class RemoteAccess : uint8_t {
  // kMessages over TCP (transport tcp, or auto on a host without RDMA devices), kOneSided
  // where UCX may use RDMA.
  kAuto,
  // UCX get/put/atomics. Over TCP UCX emulates each one with a message to the server: one
  // round trip per operation, a write two (put + flush). For measurements.
  kOneSided,
  // Each Batch as one message per server, executed by the server (reads and writes above
  // 16 KiB stay one-sided: UCX moves them without copies through the server's loop).
  kMessages,
};

// "auto", "one-sided", "messages".
Result<RemoteAccess> ParseRemoteAccess(std::string_view text);

struct PoolOptions {
  // Fabric to use; unset means the cluster file's "transport".
  std::optional<Fabric> transport;
  // Map same-host regions and access them with loads/stores/CPU atomics (shm and auto).
  // false forces UCX even where mapping is possible (for measurements).
  bool direct_access = true;
  RemoteAccess remote_access = RemoteAccess::kAuto;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds op_timeout{5000};
  // A server that answers no heartbeat for this long is suspected, and declared failed unless
  // it answers a hello on a fresh connection within 1 s more.
  std::chrono::milliseconds failure_timeout{2000};
  // A replicated cluster with an etcd: the Pool watches the cluster map (each change arrives
  // as soon as etcd has it) and also reads it whole this often, a safety net for a watch that
  // hangs unnoticed (docs/pool.md "Watching the map").
  std::chrono::milliseconds map_poll{5000};
};

// A server's region: [root area (wire::kRootAreaSize = 4 KiB) | chunk 0 | chunk 1 | ...].
struct RegionGeometry {
  uint64_t region_size = 0;  // the root area included
  uint64_t chunk_size = 0;   // lease granularity
  static constexpr uint64_t kRootAreaSize = 4096;
  uint64_t chunks() const { return (region_size - kRootAreaSize) / chunk_size; }
};

struct ServerStats {
  uint16_t id = 0;
  std::string endpoint;
  uint32_t clients = 0;  // distinct client processes connected
  uint64_t capacity = 0;
  uint64_t leased = 0;
  uint64_t largest_free = 0;
  uint64_t chunk_size = 0;
  uint64_t requests_served = 0;  // control requests and batches; one-sided operations bypass it
  uint64_t rejected = 0;         // malformed or incompatible messages
  uint64_t auth_refused = 0;     // requests refused for want of authentication (cluster secret)
  uint64_t pool_refused = 0;     // requests refused for touching another pool's memory
  uint64_t uptime_ns = 0;
  int64_t pid = 0;
  uint64_t rss_private = 0;  // private resident bytes beyond the region
};

// Operations this Pool has issued (all threads), for benchmarks and the simulator.
// round_trips: sync operations and Batch::Wait()s that had to wait for a server (the mapped
// shared-memory path waits for none); messages: batch messages sent (one per server per
// round trip, more for batches beyond one message's size). suspicions_cleared: times the
// monitor found a server silent for failure_timeout and a hello on a fresh connection then
// showed it alive (a slow server or a stalled connection, not declared failed). resent:
// operations (and leases, releases) sent again to a region's new server: refused unexecuted by
// a server being drained, or, in a replicated cluster, reads cut by a failure (see Pool).
// maps_watched, maps_polled: cluster maps of a new epoch the map follower learned from its
// etcd watch, and from its safety-net read (PoolOptions::map_poll). connects: connections the
// threads opened to servers and said hello on (a thread's first use of a server, Connect's and
// ConnectThread's hellos to every server; not the monitor's nor a probe's).
struct OpCounters {
  uint64_t reads = 0, writes = 0, cas = 0, faa = 0, bytes_read = 0, bytes_written = 0;
  uint64_t round_trips = 0, messages = 0;
  uint64_t suspicions_cleared = 0;
  uint64_t resent = 0;
  uint64_t maps_watched = 0, maps_polled = 0;
  uint64_t connects = 0;
};

class Batch;

// The bucket layout a Batch::LookupRead scans (see there): `bucket_size` bytes holding
// `entry_count` entries of (key, value) 8-byte words from `entries_offset`, and a next-bucket
// word (a GlobalAddress, 0 for none) at `next_offset`. Offsets are multiples of 8; bucket_size
// is at most 4096.
struct LookupSpec {
  uint32_t bucket_size = 0;
  uint16_t entries_offset = 0;
  uint16_t entry_count = 0;
  uint16_t next_offset = 0;
};

// What a Batch::LookupRead found.
struct LookupResult {
  enum class Outcome : uint8_t {
    kAbsent,        // the chain has no live entry (value != 0) for the key
    kFound,         // `value` is the entry's value; the record's bytes were read
    kFoundNotRead,  // `value` is the entry's value; its bytes were not read (another server,
                    // or a path that reads them in a round trip of their own): read them
    kContinue,      // the chain goes on at bucket `value` (another server, or past the walk's
                    // bound, or a path that walks no chain): walk on from there
  };
  Outcome outcome = Outcome::kAbsent;
  GlobalAddress value;
};

// What a Batch::LookupLockRead did.
struct LockReadResult {
  LookupResult lookup;  // as a LookupRead's; the record was read (and maybe locked) iff kFound
  uint64_t found = 0;   // kFound: the record's lock word before the operation
  bool locked = false;  // kFound and `found` was free: the word is now the caller's lock word
};

// What a Batch::InsertIfAbsent did.
struct InsertResult {
  enum class Outcome : uint8_t {
    kInserted,    // the key's entry now holds the value (`value`)
    kFound,       // the key had a live entry: `value` is its value; nothing was changed
    kBusy,        // the chain's lock word was held: `value` is the holder's word; nothing changed
    kNotDone,     // not done on this path or in one step (see InsertIfAbsent); nothing changed
    kLockBroken,  // our lock word was replaced while we held it (`value`: the word found): the
                  // caller was fenced; the entry may or may not be live
  };
  Outcome outcome = Outcome::kNotDone;
  uint64_t value = 0;
};

// What a Batch::WaitCompareAndSwap counts as a held word, and how long it may wait. The word
// is *free* when (word & held_mask) == 0, *held* when (word & held_mask) != 0 and word !=
// not_held (a word that looks held but will not be released: not waited for).
struct WaitSpec {
  uint64_t held_mask = 1;
  uint64_t not_held = 0;
  std::chrono::microseconds wait{0};  // at most 1 s (kMaxWait)
  // Swap a free word that is not `expected` too (from the word found: what a caller that
  // retries "with the word it saw" does); `previous` then says which version was taken.
  bool take_free = false;
  // Wait until free, change nothing: the word counts as held only while it is held and still
  // `expected` (the holder the caller saw), so the answer comes once that holder let go of it
  // (released, broken, or another word since); `previous` is the word found, `swapped` false.
  // For a reader that must not read past a holder: its read of what the holder writes goes
  // behind a Fence in the same batch. REQUIRES: not take_free; `desired` 0.
  bool wait_only = false;
  static constexpr std::chrono::microseconds kMaxWait{1'000'000};
};

// What a Batch::WaitCompareAndSwap did.
struct WaitCasResult {
  uint64_t previous = 0;  // the word before the (last) attempt
  bool swapped = false;   // the word is now `desired`, swapped from `previous`
};

class Pool {
 public:
  // Connects to every server of the cluster (hello, region key). Fails, naming the server,
  // if any server is unreachable within options.connect_timeout.
  static Result<std::unique_ptr<Pool>> Connect(const ClusterConfig& cluster,
                                               const PoolOptions& options = {});
  // Gives freed memory back (Trim), unmaps the regions, then says goodbye to every live server
  // (at most 1 s each): they unpin this process and refuse this Pool's tag from then on, so an
  // eviction of the tag can never kill the process afterwards. REQUIRES: no thread uses the
  // Pool any more.
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  Fabric transport() const;
  std::vector<uint16_t> server_ids() const;
  // How operations reach server `id`: "direct" (mapped shared memory), "one-sided" (UCX
  // get/put/atomics) or "messages" (a batch per message, executed by the server).
  std::string AccessPath(uint16_t id) const;

  // The root area of server `id`: kRootSize bytes at a fixed address that every client of
  // the cluster knows. Zero at start. Who owns which bytes of the lowest-id server's area:
  //   [0, kRootSize - 64)         the database catalog (src/db/nam, from byte 0)
  //   [kRootSize - 64, kRootSize) the file store (src/files/layout.h: its first word points
  //                               to the store, set once by CAS)
  static constexpr uint64_t kRootSize = 4096 - 64;
  // The default pool's root area of server `id` (a cluster file without a pool).
  static constexpr GlobalAddress Root(uint16_t id) { return GlobalAddress(id, 64); }
  // This client's pool's root area of server `id`, laid out as above: Root(id) for the
  // default pool; for a pool of its own (ClusterConfig::pool, docs/pool.md "Pools") kRootSize
  // bytes of the chunk the server leased to the pool as its root, which no other pool can
  // touch, so two pools' databases or file stores on one cluster never meet. Zero at start.
  // REQUIRES: `id` is one of server_ids().
  GlobalAddress RootArea(uint16_t id) const;

  Result<GlobalAddress> Alloc(uint64_t size, Placement placement = Placement::Striped());
  Status Free(GlobalAddress address);
  // Gives the memory this client freed back to its servers (the destructor does it too).
  // Until then freed memory is reused by later Allocs and accesses to it are rejected.
  Status Trim();

  // Shared leases: runs of whole chunks that no Pool's allocator tracks, for structures that
  // several processes manage together (the database's recycler, src/db/nam/gc.cc). Leases
  // belong to the pool, so any client may release one: the server checks only that
  // [start, start + size) is exactly one current lease; which process releases it is the
  // caller's protocol (exactly one must). Accesses to them are not checked for
  // use-after-free (the run is "leased by another client" to this Pool's allocator).
  // REQUIRES: size is a positive multiple of the server's chunk size (InvalidArgument else).
  Result<GlobalAddress> LeaseRun(uint16_t id, uint64_t size);
  Status ReleaseRun(GlobalAddress start, uint64_t size);
  // Server `id`'s region as its hello described it.
  Result<RegionGeometry> Geometry(uint16_t id) const;
  // The server that Alloc(size, placement) tries first (striped: the next in turn).
  Result<uint16_t> ServerFor(Placement placement);

  Status Read(GlobalAddress source, void* destination, uint64_t size);
  Status Write(GlobalAddress destination, const void* source, uint64_t size);
  // Atomically: previous = *address; if previous == expected, *address = desired.
  // Returns previous (the swap happened iff previous == expected).
  Result<uint64_t> CompareAndSwap(GlobalAddress address, uint64_t expected, uint64_t desired);
  // Atomically: previous = *address; *address += delta. Returns previous.
  Result<uint64_t> FetchAdd(GlobalAddress address, uint64_t delta);

  // Connects the calling thread to every server this Pool knows and the thread has not used
  // yet (endpoints made together, then a hello each, one after another), as its first use of
  // each would. For a thread whose later calls have deadlines (a lease's renewals): none of
  // them then waits for a connection set-up, also once a failover moves a region to another
  // of these servers. Servers the Pool learns later (`cluster add`) are connected on first use.
  // A server that does not answer its hello within PoolOptions::connect_timeout is marked
  // failed, as on a first use (so a stopped server delays the call by that much); the error
  // is that of the thread's context only (a UCX worker it could not make).
  Status ConnectThread();

  Result<ServerStats> Stats(uint16_t id);
  OpCounters counters() const;

  // Eviction: the fence the memory servers enforce (docs/pool.md). A process evicted from every
  // server can no longer reach pool memory: one that maps a server's region has been killed
  // (SIGKILL) and has exited; any other has had every connection closed and is refused from
  // then on. A server lets a process map its region only if it could pin it for such a kill
  // (same boot, a pidfd, a matching start time, permission to signal it); otherwise the Pool
  // falls back to messages or one-sided access as if direct access were off, and transport shm
  // fails to connect, saying why.
  // The evicted Pool: the first refusal of its tag by any server (StatusCode::kEvicted on the
  // wire, on its next operation, hello or heartbeat; a request cut off by the eviction or timed
  // out meanwhile asks the server why with a fresh hello) is the whole Pool's verdict, since an
  // eviction is of the process tag, by every server. From then on every call that touches a
  // server fails fast with Evicted and the eviction's words ("server 1 (...): this process is
  // evicted: evicted by server 0 (...): process tag 0x... is fenced off this server ..."), and
  // the Pool takes none of the servers for failed: it fails nothing over, reports no server to
  // the coordinator (etcd's suspect keys) and waits for no failover. Final: open a new Pool
  // (a new tag) if the application may go on, e.g. after its database sessions were fenced.

  // This process's identity on every server of the pool: nonzero, the same on every server and
  // for every thread, different for every Pool::Connect (32 bits of the client nonce sent in
  // the hello; random, so two Pools share one with probability 2^-32).
  uint32_t process_tag() const;
  // Whether the cluster keeps a backup of every server (ClusterConfig::replicas > 0): a server
  // that fails is then failed over to its backup, and operations that met its failure succeed
  // again once that is done; otherwise its failure is for good.
  bool replicated() const;
  // Evicts the client process whose Pool has process_tag() == `tag` from every server: returns
  // Ok once every server has (a) closed all of that client's connections and will refuse it
  // from now on (hellos and requests carrying that tag get an error reply), and (b) if that
  // client maps the server's region, killed it (SIGKILL) and seen it exit. Idempotent; a tag no
  // server knows is Ok. Never evicts this process: InvalidArgument for this Pool's own tag, for
  // the tag of another live Pool of this process that may map a region (they share its pid: it
  // would be killed with it), and for 0, which is no process's tag.
  // Fails (Unavailable, naming the server) if a server cannot be reached or the process does not
  // exit within `timeout`; the caller retries later. Servers evicted by an earlier call stay so.
  // Each server remembers the last 65,536 evicted tags (kMaxEvictedTags in
  // pool/server/memory_server.h).
  Status Evict(uint32_t tag, std::chrono::milliseconds timeout = std::chrono::seconds(5));

 private:
  class Impl;  // src/pool/pool.cc
  explicit Pool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class Batch;
};

// Operations posted together and completed by one Wait(). Post methods validate the address
// and return an error without posting; read data and results (`previous`) are written, and
// writes are complete, when Wait() returns OK (on the mapped path they happen at once).
// REQUIRES: a write's source and a read's destination stay valid until Wait() returns.
// Destroying a Batch with posted operations waits for them.
//
// Thread-safety: used only by the thread that created it.
class Batch {
 public:
  explicit Batch(Pool& pool);
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  Status Read(GlobalAddress source, void* destination, uint64_t size);
  Status Write(GlobalAddress destination, const void* source, uint64_t size);
  Status CompareAndSwap(GlobalAddress address, uint64_t expected, uint64_t desired,
                        uint64_t* previous);
  Status FetchAdd(GlobalAddress address, uint64_t delta, uint64_t* previous);

  // A compound read: finds `key` in the bucket chain that starts at `bucket` (layout `spec`)
  // and reads `record_size` bytes at the value found, in the round trip of this batch where
  // the path allows it. It only reads: the first bucket is a read of spec.bucket_size bytes
  // (the same checks), each further bucket and the record are read when reached. The entry
  // taken is the first with that key and a nonzero value; like plain reads, copies are
  // word-atomic only (the caller validates what it reads). `result` is set by Wait():
  //   messages (TCP):  one operation of the server's message (memory_ops kLookupRead): the
  //                    chain is followed while it stays on that server (at most 64 buckets),
  //                    the record read if it is there too; else kFoundNotRead / kContinue.
  //   direct (mapped): done at once, the same way, on the mapped region.
  //   one-sided (UCX): the first bucket only is read in this round trip (one get) and scanned
  //                    at Wait: kFound never happens, kFoundNotRead / kContinue / kAbsent do,
  //                    so the caller's follow-up costs what its two-step path costs.
  // A bucket or record address outside the server's region or leases fails the batch
  // (InvalidArgument from Wait naming it) and reads nothing else for this lookup.
  // REQUIRES: `record` (record_size bytes, at most 16 KiB) and `result` stay valid until
  // Wait() returns; `spec` is well-formed (else InvalidArgument, nothing posted).
  Status LookupRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key, void* record,
                    uint32_t record_size, LookupResult* result);

  // A locking read's lookup, lock and copy in one step: finds `key` in the bucket chain that
  // starts at `bucket` (layout `spec`) as LookupRead does; where the record found is read in
  // this round trip, its 8-byte lock word at `lock_offset` is first taken if free ((word &
  // held_mask) == 0: swapped to `lock_word` from whatever free word it holds, as a take-free
  // WaitCompareAndSwap), a held word left alone (it never waits), then its `record_size` bytes
  // are read. `result` is set by Wait(): `lookup` as a LookupRead's; with kFound, `found` is the
  // word before and `locked` whether it is now `lock_word`.
  //   messages (TCP):  one operation of the server's message (memory_ops kLookupLockRead).
  //   direct (mapped): done at once, the same way, on the mapped region.
  //   one-sided (UCX): LookupRead's one-sided path: kFound never happens, nothing is locked.
  // A bucket or record address outside the server's region or leases fails the batch
  // (InvalidArgument from Wait naming it); nothing was locked for this lookup then.
  // REQUIRES: `record` and `result` stay valid until Wait() returns; `spec` well-formed,
  // `held_mask` and `lock_word` nonzero, `lock_offset` a multiple of 8 with lock_offset + 8 <=
  // record_size <= 16 KiB (else InvalidArgument, nothing posted).
  Status LookupLockRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key,
                        uint32_t lock_offset, uint64_t held_mask, uint64_t lock_word, void* record,
                        uint32_t record_size, LockReadResult* result);

  // A compound insert-if-absent into the bucket chain that starts at `bucket` (layout `spec`),
  // with exactly the steps a one-sided inserter takes, done by whoever executes it: the head's
  // lock word (at `lock_offset` in it) CASed from 0 to `lock_word` (else kBusy); the chain
  // searched for a live entry of `key` (kFound); else `key` stored into the first free entry
  // (value 0) and its value word CASed from 0 to `value`; the lock CASed back to 0 (a failed
  // entry or release CAS: kLockBroken). A chain that leaves the server, is longer than 64
  // buckets or has no free entry is not changed (kNotDone, lock released): the caller inserts
  // one-sided. `result` is set by Wait():
  //   messages (TCP):  one operation of the server's message (memory_ops kInsertIfAbsent).
  //   direct (mapped): done at once, the same way, on the mapped region.
  //   one-sided (UCX): not done (kNotDone), nothing posted.
  // A bucket address outside the server's region or leases fails the batch (InvalidArgument
  // from Wait naming it); nothing was changed then.
  // REQUIRES: `result` stays valid until Wait() returns; `spec` is well-formed, `lock_offset`
  // a multiple of 8 inside the bucket, `lock_word` and `value` nonzero (else InvalidArgument,
  // nothing posted).
  Status InsertIfAbsent(GlobalAddress bucket, const LookupSpec& spec, uint32_t lock_offset,
                        uint64_t lock_word, uint64_t key, uint64_t value, InsertResult* result);

  // A compare-and-swap that may wait at the server while the word is held by someone else
  // (`spec`), so that a waiter costs one round trip instead of one per poll:
  //   messages (TCP):  one operation of the server's message (memory_ops kWaitCompareAndSwap):
  //                    if the word is held, the server waits up to spec.wait, attempting again
  //                    whenever the word changes (first come, first served), and the
  //                    operations posted after it to that server wait with it (their order
  //                    is kept). A server at its cap of waiters makes it one attempt.
  //   direct (mapped): one attempt, at once: polling costs no round trip here (the caller
  //                    polls).
  //   one-sided (UCX): one plain compare-and-swap from `expected` (no take_free); with
  //                    wait_only, one read of the word.
  // Every outcome is one a caller retrying compare-and-swaps (or reading the word) could have
  // seen. `result` is set by Wait(). REQUIRES: `result` stays valid until Wait() returns;
  // spec.held_mask nonzero, spec.wait at most kMaxWait, wait_only without take_free and with
  // `desired` 0 (else InvalidArgument, nothing posted); the op_timeout of the Pool longer than
  // spec.wait.
  Status WaitCompareAndSwap(GlobalAddress address, uint64_t expected, uint64_t desired,
                            const WaitSpec& spec, WaitCasResult* result);

  // Operations posted after the fence take effect at a server after every operation posted
  // before it to that server (there is no order across servers: a protocol that needs one
  // waits). Usually free: a batch message is executed in order (TCP), mapped memory at once;
  // one-sided operations get a UCX fence. It waits (one round trip) only when a server's
  // operations before it fill more than one message or mix messages with one-sided
  // operations; an error then is returned here and again by Wait().
  Status Fence();

  // Waits for every posted operation; returns the first error. The batch is empty afterwards
  // and can be reused.
  Status Wait();
  // Completes the batch without waiting for the servers where the path allows it: for writes
  // and atomics whose outcome the caller does not need (the SQLite VFS's release of its own
  // lock bit with a fetch-and-add, docs/files.md). The batch is empty afterwards.
  //   messages (TCP):  each server's message is sent and its reply dropped on arrival. Order:
  //                    a server executes it before any later message of this thread (one
  //                    connection per thread and server, handled in order), so this thread's
  //                    next operation on that server sees its effect; another thread's
  //                    operations are not ordered behind it.
  //   direct (mapped): done at once, as always.
  //   one-sided (UCX): waited for, as Wait() does.
  // Errors: returned are those known before anything leaves (the batch's own, a server already
  // failed, a lost connection, a send that fails). Later ones are not: a connection lost or a
  // server failed after the send fails this thread's next operation on that server, and an
  // error reply is dropped (a process the servers evicted is refused its later operations as
  // well). Not resent after a planned move (nothing waits for the MovingReply): a server being
  // drained drops it unexecuted. Not counted in OpCounters::round_trips (nothing is waited for).
  // REQUIRES: over messages, no posted operation wants a result (a read, a `previous`, a
  // lookup, an insert, a waiting compare-and-swap): InvalidArgument, nothing sent.
  Status Post();
  size_t posted() const;

 private:
  struct State;
  struct Replay;  // an operation as posted, to post it again (pool.cc)
  // Sends and completes everything posted so far (results written); the first error is also
  // kept for Wait(). Operations a server refused unexecuted (it is being drained) and, in a
  // replicated cluster, reads cut by a server's failure are posted again, to where the map has
  // moved their region, at most `resends` times (see Pool).
  Status Drain();
  Status Drain(int resends);
  // Makes the batch's per-server state cover server `index` (one the Pool learned after the
  // batch began) and connects this thread to it if it has not yet.
  Status Route(size_t index);
  Status Repost(const Replay& op);
  // Makes room for an operation of `kind`/`size` (memory_ops::OpKind) in server `index`'s
  // open message: starts a new one when it is full, draining first if the new one could
  // overtake a fence.
  Status Reserve(size_t index, uint8_t kind, uint64_t size);
  // CompareAndSwap (cas: operand = expected) and FetchAdd (operand = delta; desired unused).
  Status Atomic(GlobalAddress address, bool cas, uint64_t operand, uint64_t desired,
                uint64_t* previous);
  Pool::Impl& pool_;
  std::unique_ptr<State> state_;
};

}  // namespace farpool
