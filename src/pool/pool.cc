// The client side of the pool. See include/farpool/pool.h for the contract.
//
// How it works:
//   - Connect() creates one UCX context, connects the calling thread to every server (hello:
//     region base, size, chunk size, packed remote key) and starts a monitor thread.
//   - Every thread that uses the Pool gets a ThreadContext on first use: its own worker (one
//     worker per thread, no shared queue), and an endpoint, a hello and the unpacked remote key
//     of a server on its first use of that server (PeerOf), so that a thread never waits for a
//     server it does not use. Pool::ConnectThread connects it to every server at once.
//   - If a region can be mapped into this process (shared memory, same host) its local address
//     is kept in ServerState::direct and reads, writes and atomics on it are loads, stores and
//     CPU atomics: no UCX call, no server CPU. Otherwise, over TCP (RemoteAccess::kMessages),
//     a Batch collects each server's operations into one BatchRequest (pool/memory_ops.h) sent
//     at Wait(), all servers' messages first, then every reply awaited: one round trip per
//     batch. Where UCX may use RDMA (kOneSided) they are ucp_get/put/atomic_op_nbx, posted at
//     once and completed at Wait(). Sync calls are batches of one.
//   - A thread awaiting a reply progresses its worker while that finds work and otherwise
//     sleeps on the worker's event descriptor until a message comes (AwaitReply): a spinning
//     client, on a host whose cores it shares with servers or other clients, took the CPU the
//     servers needed to answer it and was then preempted for whole scheduler slices
//     (docs/pool.md, "Measured: the cost of a round trip over TCP").
//   - The monitor thread has its own worker and endpoints, sends a stats request to every
//     server each failure_timeout/4 and declares a server failed when its connection errors,
//     or no answer came for failure_timeout and a hello on a fresh connection gets none either
//     (ProbeServer: silence alone may be a slow server or a stalled connection).
//     ServerState::failed is then set and every later call touching that server fails fast; pending
//     UCX requests to it are abandoned by force-closing the thread's endpoint, which completes them
//     with an error.
//   - Eviction: the hello carries this Pool's process tag (the low 32 bits of its nonce) and
//     what pins the process (pid, start time, boot id). A region is mapped only if the server
//     says it pinned us (kHelloMayMap): then an eviction can kill us. A connection that fails,
//     or a request that times out or fails unexplained, is explained by a fresh hello (AskWhy,
//     one per server at a time): a server that evicted us refuses it with StatusCode::kEvicted
//     ("evicted by server N: ..."), as it refuses every later hello and request of ours. An
//     eviction is of the process tag, by every server (Pool::Evict), so the first such
//     refusal, from any server on any path (an operation, a hello, the monitor, a reply), is
//     the whole Pool's verdict (Evicted): every server is marked failed with the eviction's
//     words and code (one the map watcher was entering meanwhile too; it enters none after),
//     and nothing is failed over, reported to etcd as suspected or waited for: those servers
//     are alive, it is we who are fenced off. A failover already under way stops at its next
//     step. The verdict is final: the tag never comes back (a new Pool::Connect gets a new one).
//   - Failover on etcd (docs/pool.md "Membership on etcd"): in a replicated cluster whose file
//     names an etcd, the client does not decide failovers. A server it finds gone is reported
//     to the coordinator (MapKeys::Suspect) and the client waits for the cluster map to name
//     the server that serves its region (AwaitMapDecision); a map watcher thread re-routes by
//     the map's epoch (FollowMap) a server that this client has not found gone itself (a
//     partitioned old primary it still reaches, say). It learns each new map from an etcd
//     watch on the map's key (coord::EtcdWatch, branch `etcdwatch`: as soon as etcd has it, a
//     stream per Pool, resumed from its revision when it breaks) and reads the map whole every
//     PoolOptions::map_poll as well (a safety net). If etcd does
//     not answer or no decision comes within kCoordinatorWait, the client falls back to
//     asking the backup itself (the race of the first stage, kept safe by the backup's fence).
//     In a shared-pages cluster a region that this client maps stays mapped after it moved: the
//     server that serves it maps the same file (KeepsMapping), so its operations stay loads,
//     stores and CPU atomics; only its leases go to the new server (ControlTarget).
//   - Servers added to the cluster (`farpool cluster add`, docs/pool.md "cluster add"): the map
//     watcher also learns servers the map names and this Pool does not know (LearnServers);
//     in a replicated cluster only once the map names a backup of the server's own region (it
//     refuses every change until then).
//     The server table has a fixed capacity (kMaxServers): a new server's state is built, its
//     hello answered (on the watcher's own context) and its allocator geometry added before
//     index_of_[id] and then count_ are published with release stores, so a thread that finds
//     the id (acquire) sees a whole ServerState, and a loop over count() never meets a half-made
//     one. A thread's endpoint to a server it has not talked to yet is made on its first use
//     (PeerOf, one hello); Batch state grows with it (Batch::Route). A server that does not
//     answer is not entered and is tried again kJoinRetry later: nothing is placed on it before
//     its hello. Entries, once published, are never removed (a server that leaves stays, failed).
//   - Planned moves (`farpool cluster drain`): a server being drained answers batches, leases
//     and releases with a MovingReply, executed not at all. The client marks it failed, follows
//     the map to the region's new server (as after a failure) and sends the refused operations
//     again there (Batch::Drain, LeaseOn, ReleaseOn). It also resends, in a replicated cluster,
//     reads whose server failed while they were in flight, and operations that never left
//     because their server had failed: a read changes nothing, so running it again is safe.
//     A write, CAS, fetch-and-add or insert whose request may have reached a server that then
//     failed is never resent: its outcome is unknown and it returns Unavailable ("may or may not
//     have taken effect"). Without replicas the same holds for a drain (docs/pool.md "Drain
//     without replicas"): every Pool whose cluster file names an etcd watches the map, a
//     MovingReply waits for the map's move, and a client connecting after a drain finds the
//     region where the map says; a crashed server's region, which has nowhere to go, fails
//     as before.
//   - Access control: with a cluster secret (ClusterConfig::secret_file) every connection,
//     the monitor's and ProbeServer's included, opens with the challenge-response of
//     transport/auth.h (Handshake): a ChallengeRequest, then the hello with our proof; the
//     server's hello reply must carry its proof, else we refuse the server. A refusal either
//     way fails Connect with PermissionDenied ("authentication failed: ...").
#include "farpool/pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/far_copy.h"
#include "common/host.h"
#include "common/units.h"
#include "coord/cluster_map.h"
#include "coord/etcd_client.h"
#include "pool/control_client.h"
#include "pool/memory_ops.h"
#include "pool/object_allocator.h"
#include "transport/auth.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool {

using Clock = std::chrono::steady_clock;
using transport::Endpoint;
using transport::RemoteKey;
using transport::Worker;

namespace {

std::atomic<uint64_t> g_next_generation{1};

uint64_t RandomNonce() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  return static_cast<uint32_t>(v) == 0 ? v | 1 : v;  // the low 32 bits, the tag, are nonzero
}

// The process tags of this process's live Pools that ask to map a region. A process never
// evicts one of them: they share its pid, so a server that pinned it would kill the caller
// itself. (Evicting a Pool of this process that maps nothing only disconnects it.)
std::mutex g_live_tags_mu;
std::multiset<uint32_t> g_live_tags;  // GUARDED_BY(g_live_tags_mu)

bool LiveInThisProcess(uint32_t tag) {
  std::lock_guard<std::mutex> l(g_live_tags_mu);
  return g_live_tags.count(tag) > 0;
}

// Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014).
int32_t JumpConsistentHash(uint64_t key, int32_t buckets) {
  int64_t b = -1, j = 0;
  while (j < buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>((b + 1) * (double(1LL << 31) / double((key >> 33) + 1)));
  }
  return static_cast<int32_t>(b);
}

std::string TagName(uint32_t tag) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", tag);
  return buf;
}

// How long a fresh hello that asks a server why a connection failed, or whether a server that
// left heartbeats unanswered is alive, may take (ProbeServer), and how many fresh connections
// that fail it tries before it concludes the server is gone.
constexpr auto kProbeTimeout = std::chrono::milliseconds(1000);
constexpr int kProbeRefusals = 3;

// The longest a thread awaiting a reply sleeps between checks that its server has not been
// declared failed (by the monitor, which a dead connection does not wake us for).
constexpr auto kReplySleep = std::chrono::milliseconds(10);

// How long a client waits for the coordinator to fail a lost server over before it asks the
// backup itself: a coordinator that died with the server is replaced after its lease (2 s) and
// a tick, and the backup promotes at most kServeLease + margin (~1.2 s) after the loss.
constexpr auto kCoordinatorWait = std::chrono::milliseconds(8000);
// While the map's watch is down, how often a failing-over client reads the map itself.
constexpr auto kMapReadWhileDown = std::chrono::milliseconds(20);
// The server table's capacity: servers a Pool can know, those learned from the map included.
constexpr size_t kMaxServers = 1024;
// How long the watcher waits for a hello of a server it learns from the map (it must not block
// the failovers it follows for long), and how long before it tries a server that did not answer
// again.
constexpr auto kJoinTimeout = std::chrono::milliseconds(1000);
constexpr auto kJoinRetry = std::chrono::milliseconds(1000);
constexpr auto kJoinRetryMax = std::chrono::milliseconds(16000);
// How many times a batch's refused or lost-but-safe operations are sent again (a region may
// move more than once meanwhile: a drain of the server that took it over).
constexpr int kMaxResends = 3;

}  // namespace

// Shared per-server state. Immutable once published (Init, or LearnServers) except the
// failure fields below.
struct ServerState {
  ServerAddress address;
  std::string name;  // "server 3 (127.0.0.1:7003)"
  uint64_t region_base = 0;
  uint64_t region_size = 0;
  uint64_t chunk_size = 0;
  std::vector<std::byte> rkey;
  uint16_t hello_flags = 0;     // of the first hello: kHelloMayMap (or why not), kHelloSharedPages
  std::byte* direct = nullptr;  // region mapped into this process, or null
  // > 0: `direct` is a mapping of this many bytes that this Pool made itself (MapMoved), not
  // UCX's through the remote key; unmapped at close.
  uint64_t mapped_moved = 0;
  bool messages = false;  // not mapped: operations go as batch messages, not one-sided
  bool keyless = false;   // a pool's client (kHelloPoolClient): no remote key, messages only
  // Of the first hello: whose region its slot 0 mirrors, and the port of the mirror's loop.
  uint16_t mirror_of = wire::kNoMirror;
  uint16_t mirror_port = 0;
  // Of the first hello: where this client's pool has its root area (0: the region's, the
  // default pool's), and in the mirror's slot 0 (of mirror_of's region; offsets of that server).
  uint64_t root_offset = 0;
  uint64_t mirror_root_offset = 0;
  std::atomic<bool> failed{false};
  // Replication: once failed, the index of the server that took its data over (a backup,
  // which serves it from its mirror slot `moved_slot`, at (1 + moved_slot) x its own region
  // size), or -1. Set after `failed`, moved_slot before moved_to; changed again only when the
  // map moves the region again (the server that took it over was lost too).
  std::atomic<int> moved_to{-1};
  std::atomic<int> moved_slot{0};
  std::atomic<bool> failing_over{false};  // FailOver is running (set before `failed`)
  // Failed because it refused a request unexecuted (MovingReply): it is being drained, still
  // alive, and answers every request it received (results or refusals), so replies awaited
  // from it are still awaited (AwaitReply), not abandoned as a dead server's are.
  std::atomic<bool> draining{false};
  // A thread asks it why it failed a request (Pool::Impl::AskWhy): the others wait for that
  // answer instead of asking too.
  std::atomic<bool> probing{false};
  mutable std::mutex mu;
  std::string failure;  // guarded by mu
  // kUnavailable: an outage (what fails over); a refusal keeps its code: kPermissionDenied
  // (the secret), kEvicted (this process is fenced off: Pool::Impl::Evicted).
  StatusCode failure_code = StatusCode::kUnavailable;  // guarded by mu

  Status Failure() const {
    std::lock_guard lock(mu);
    if (failure_code != StatusCode::kUnavailable)
      return Status(failure_code, name + ": " + failure);
    return Status::Unavailable(name + ": unavailable: " + failure +
                               (moved_to.load() >= 0
                                    ? " (failed over to its backup: operations in flight may or "
                                      "may not have taken effect; later ones go to the backup)"
                                    : ""));
  }
};

std::unique_ptr<ServerState> NewServerState(const ServerAddress& a) {
  auto s = std::make_unique<ServerState>();
  s->address = a;
  s->name = "server " + std::to_string(a.id) + " (" + a.Endpoint() + ")";
  return s;
}

struct ThreadContext {
  struct Peer {
    std::unique_ptr<Endpoint> ep;
    std::unique_ptr<RemoteKey> rkey;
  };
  std::unique_ptr<Worker> worker;
  control::ReplyBox box;
  std::vector<Peer> peers;  // by server index
  uint64_t next_request_id = 1;
  // The batch of one that sync calls on memory that is not mapped run in (RunAlone), made on
  // the first and reused after each Wait: a Batch's state is a dozen allocations, as many as
  // the rest of a round trip's client side (docs/pool.md, "Measured: the cost of a round trip
  // over TCP"). In use while `alone_busy` (a sync call made while one runs gets its own).
  std::unique_ptr<Batch> alone;
  bool alone_busy = false;
  // Written by the owning thread only; read by counters() from any thread.
  std::atomic<uint64_t> reads{0}, writes{0}, cas{0}, faa{0}, bytes_read{0}, bytes_written{0};
  std::atomic<uint64_t> round_trips{0}, messages{0}, resent{0}, connects{0};
};

// Where part of a batch message's reply goes: one per read or atomic, in request order.
struct BatchSink {
  void* read_into = nullptr;            // reads; lookup-reads: the record's bytes
  uint64_t size = 0;                    // bytes in the reply
  uint64_t* previous = nullptr;         // atomics; may be null
  LookupResult* lookup = nullptr;       // lookup-reads (a memory_ops::LookupReply, then the bytes)
  InsertResult* insert = nullptr;       // insert-if-absent (a memory_ops::InsertReply)
  LockReadResult* lock_read = nullptr;  // lookup-lock-reads (LookupReply, word, the bytes)
  uint64_t held_mask = 0;               // lookup-lock-reads: what a held word has set
};

// Where the reply of one batch message lands (control::ReplyBox::Expect): scattered straight
// from UCX's receive buffer into the sinks, without a copy of the message.
struct BatchLanding {
  const ServerState* server = nullptr;
  const memory_ops::RequestBuilder* request = nullptr;
  std::span<const BatchSink> sinks;  // in request order
  Status status;                     // of the reply, once landed
  bool moving = false;               // the server refused it unexecuted (wire::MovingReply)

  static void Land(void* context, std::span<const std::byte> reply);
};

namespace {
void Bump(std::atomic<uint64_t>& counter, uint64_t by = 1) {
  counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}
}  // namespace

class Pool::Impl {
 public:
  struct Target {
    size_t index;
    uint64_t remote;    // remote virtual address
    std::byte* direct;  // mapped address, or null
    bool messages;      // not mapped; goes in a batch message (ServerState::messages)
  };
  using Reply = control::Reply;
  using Encoder = control::Encoder;
  // One control request on one connection and its reply of opcode `expected` (an ErrorReply
  // becomes its Status): Call on a thread context, or AskOn on a connection of its own.
  using Ask = control::Ask;

  ~Impl();
  Status Init(const ClusterConfig& cluster, const PoolOptions& options);

  Result<ThreadContext*> Local();
  // Local(), or null if the calling thread cannot have a context (its error is then what a
  // Batch made on this thread reports).
  ThreadContext* LocalOrNull() {
    auto tc = Local();
    return tc.ok() ? *tc : nullptr;
  }
  // Where an operation on `address` goes. `changes`: it may change memory (in a replicated
  // cluster it then goes as a message, never mapped or one-sided).
  Result<Target> Resolve(GlobalAddress address, uint64_t size, const char* op, bool atomic,
                         bool changes);
  // Resolve, and then (memory not mapped) this thread's connection to the target's server,
  // made now if this is its first use of it (PeerOf: a hello). A server that fails on the way
  // (its hello unanswered or refused) and whose region moves is resolved again, to where it
  // went: nothing was sent, so any operation may go there.
  Result<Target> Aim(ThreadContext& tc, GlobalAddress address, uint64_t size, const char* op,
                     bool atomic, bool changes);
  // Sends a control request built by `encode(request_id)` to server `index` and waits for
  // the reply of opcode `expected` (an ErrorReply becomes its Status). A MovingReply (the
  // server is being drained and did not execute it) marks the server failed, sets `*moving`
  // if given, and returns Unavailable; so does a server that failed before the request left
  // (while this thread connected to it, say) and whose region moved, with its failure. No reply
  // within `timeout`: TimedOut, unless the server, asked why (AskWhy; not for a goodbye), refuses
  // us: then its Failure (Evicted, say).
  Result<Reply> Call(ThreadContext& tc, size_t index,
                     const std::function<std::vector<std::byte>(uint64_t)>& encode,
                     wire::Opcode expected, std::chrono::milliseconds timeout,
                     bool* moving = nullptr);
  // Server `index` refused a request unexecuted (wire::MovingReply): marks it failed, which
  // follows the map to where its regions go (FailOver), so that the request can be resent.
  void Moving(size_t index);
  // Waits until the reply to request `id`, sent to server `index` from this thread, has
  // arrived in tc.box (landed or kept: control::ReplyBox::Arrived), the server fails
  // (Unavailable; not a server being drained, which answers), its connection fails, or
  // `deadline` passes (TimedOut, naming `expected`; `timeout` is for the message).
  Status AwaitReply(ThreadContext& tc, size_t index, uint64_t id, wire::Opcode expected,
                    Clock::time_point deadline, std::chrono::milliseconds timeout);
  // Waits for a posted UCX request to server `index`; on timeout or server failure abandons
  // it (force-closing the endpoint, so the request completes before buffers are reused).
  Status Complete(ThreadContext& tc, size_t index, ucs_status_ptr_t request, const char* what);
  // Flushes the thread's endpoint to `index`: every write posted before is complete remotely.
  Status Flush(ThreadContext& tc, size_t index);
  // Sends one batch message to server `index`, whose reply lands in `landing` (the caller
  // registered it with tc.box.Expect); FinishBatch awaits it and returns the landing's status.
  // The caller calls tc.box.Forget(request_id) after either, success or not. `*left` says
  // whether any of it may have reached the server (false: refused before sending).
  Status SendBatch(ThreadContext& tc, size_t index, uint64_t request_id,
                   const memory_ops::RequestBuilder& request, Clock::time_point deadline,
                   bool* left);
  Status FinishBatch(ThreadContext& tc, size_t index, uint64_t request_id,
                     const BatchLanding& landing, Clock::time_point deadline);
  Result<size_t> IndexOf(uint16_t id) const;
  // The servers this Pool knows (published; see the file comment).
  size_t count() const { return count_.load(std::memory_order_acquire); }
  // The calling thread's endpoint to server `index`, connected (and hello said) now if this
  // thread has not talked to it yet (its first use of it; Batches go through Aim).
  Result<Endpoint*> PeerOf(ThreadContext& tc, size_t index);
  // Connects `tc` to server `index` and says hello; a failure marks the server failed.
  void ConnectPeer(ThreadContext& tc, size_t index);
  // Connects the calling thread to where leases and releases of server `index` go
  // (ControlTarget), if it has not yet: before the allocator's lock, under which LeaseOn and
  // ReleaseOn run, so that no other thread's Alloc or Free (nor the map watcher's AddServer)
  // waits for this thread's connection set-up. A failure is left to the lease to report.
  void ConnectFor(size_t index);
  // Connects `tc` to every server not failed that it has no endpoint to (their endpoints first,
  // then a hello each): Init's, whose first hellos learn the regions, and Pool::ConnectThread.
  // Other threads connect per server on first use, so that a thread never waits for a server
  // it does not use (a stopped one, say).
  void ConnectEvery(ThreadContext& tc);
  // Marks server `index` failed for a hello that failed (a refusal keeps its code).
  void HelloFailed(size_t index, const Status& hello);
  // After the first hello of server `index` on `tc` (Init, or LearnServers): its remote key,
  // its mapping if allowed, and how operations reach it.
  Status Adopt(ThreadContext& tc, size_t index);
  // Enters every server of `map` that serves a region and that this Pool does not know yet
  // (see the file comment); a server that does not answer is tried again kJoinRetry later.
  void LearnServers(const coord::ClusterMap& map);
  Status Join(const coord::MapServer& m);
  // Marks server `index` failed (once; later calls change nothing). In a replicated cluster an
  // outage (not a refusal) then fails it over to its backup (FailOver), unless this Pool is
  // evicted. A `code` of kEvicted is the eviction of the whole Pool (Evicted).
  void MarkFailed(size_t index, const std::string& reason,
                  StatusCode code = StatusCode::kUnavailable);
  // The same for a Status: its message, and its code if it is a refusal (RefusalCode).
  void MarkFailed(size_t index, const Status& why) {
    MarkFailed(index, why.message(), RefusalCode(why));
  }
  // The code a failure of server `index` keeps: a refusal's (kPermissionDenied: a secret that
  // does not match; kEvicted: we are fenced off), else kUnavailable (an outage).
  static StatusCode RefusalCode(const Status& why) {
    return why.code() == StatusCode::kPermissionDenied || why.code() == StatusCode::kEvicted
               ? why.code()
               : StatusCode::kUnavailable;
  }
  // A server refused this Pool's process tag as evicted (`refusal`, its words; `index`, that
  // server, or -1 for one not entered yet): the Pool is evicted (evicted_), and every server
  // it knows is marked failed with kEvicted, none failed over (see the file comment). Once.
  void Evicted(int index, const std::string& refusal);
  // Marks server `index` failed for good with kEvicted and `why` (Evicted; Join).
  void MarkEvicted(size_t index, const std::string& why);
  // Replication (docs/pool.md "Replication"): asks the backup of failed server `index` to take
  // its data over and the server whose backup it was to stop forwarding to it; on success its
  // addresses go to the backup from then on (ServerState::moved_to).
  void FailOver(size_t index);
  // Failover on etcd: reports failed server `index` to the coordinator and waits until the map
  // names the server that serves its region now; returns that server's index. Errors: etcd
  // unreachable, or no decision within kCoordinatorWait (the caller falls back).
  Result<std::pair<size_t, int>> AwaitMapDecision(size_t index);
  // Re-routes every server that `map` says another serves (see the file comment).
  void FollowMap(const coord::ClusterMap& map);
  // Server `index` failed a request of ours (no reply within its deadline, a lost connection):
  // asks it why with a fresh hello (ProbeServer). A refusal that is a verdict on this process
  // (RefusalCode: an eviction, a secret that does not match) marks it failed with it; any
  // other refusal is left in `*refusal` (if given) for the caller to judge. A process stopped
  // past its deadlines and evicted meanwhile wakes to requests timed out or cut off, which no
  // outage explains. One probe per server at a time: each creates and destroys a UCX worker,
  // and every thread whose request failed would ask at once; the others wait for its answer
  // (bounded) or the server failed, except with `wait` false (the monitor, which must keep
  // heartbeating the others). Returns whether the server is failed now, or another thread's
  // probe still under way will decide (`wait` false). Any thread.
  bool AskWhy(size_t index, bool wait = true, Status* refusal = nullptr);
  // The same, then marks the server failed (an outage: no later call may wait on it again)
  // if nobody did and no probe under way will, with the server's refusal if it gave one,
  // else `what`.
  void Lost(size_t index, const std::string& what, bool wait = true) {
    Status refusal;
    if (!AskWhy(index, wait, &refusal)) MarkFailed(index, refusal.ok() ? what : refusal.message());
  }
  // Where `map` says server `index`'s region is served now, if elsewhere: that server's index
  // and its mirror slot that holds the region; nullopt: still at `index` (or a server this
  // client does not know).
  std::optional<std::pair<size_t, int>> ServedBy(const coord::ClusterMap& map, size_t index) const;
  void WatchMap();
  // The map's watch hands over a new map (on its own thread).
  void MapWatched(const coord::EtcdWatch::Update& u);
  // The index of the server that serves failed server `s`'s data, or -1 (waits for a
  // FailOver in progress).
  int MovedTo(const ServerState& s) const;
  // Whether this client reaches failed server `s`'s region, now served by `b`, through its own
  // mapping of `s`'s region, as before the failure (docs/pool.md "The client keeps its
  // mapping"). Only in a shared-pages cluster: there `b` serves the region from a mapping of
  // the same file (it adopted `s`'s pages, or adopted them from the server that had), and `b`
  // killed `s` before it served them, so a mapped store or CPU atomic lands on the bytes `b`
  // executes messages on, as replicas 0's do. And only if `b` pinned this process (it let us map
  // its own region): the fence a mapping needs, an eviction by `b` kills us.
  bool KeepsMapping(const ServerState& s, const ServerState& b) const {
    return cluster_.shared_pages && s.direct != nullptr && b.direct != nullptr &&
           (s.hello_flags & wire::kHelloSharedPages) != 0 &&
           (b.hello_flags & wire::kHelloSharedPages) != 0;
  }
  // At Connect, for server `index` that failed over before this client connected (it never
  // mapped it): in a shared-pages cluster, asks the server that serves its region now for the
  // region's file (wire::MovedFileRequest) and maps it, so that KeepsMapping holds for this
  // client too (docs/pool.md "A client that connects after a failover maps the moved region").
  // The same conditions as KeepsMapping's: that server adopted the pages and killed the old
  // primary before it served them (it answers only then), and it pinned this process. Any
  // failure leaves the region reached by messages, as before, and says why on stderr.
  // REQUIRES: Init, before any other thread uses the Pool (it sets `direct`).
  void MapMoved(ThreadContext& tc, size_t index);
  // Whether failed server `s` failed by an outage (not by refusing us).
  static bool Outage(const ServerState& s) {
    std::lock_guard lock(s.mu);
    return s.failure_code == StatusCode::kUnavailable;
  }
  // The hello of a new connection to server `index` (control::Handshake with this Pool's
  // secret); asks to be pinned if `map`.
  Result<Reply> Handshake(size_t index, bool map, const Ask& ask) const {
    return control::Handshake(servers_[index]->name, secret_ ? &*secret_ : nullptr, HelloFor(map),
                              ask);
  }
  // An Ask on a connection that is no thread context's (the monitor's, ProbeServer's).
  Ask AskOn(size_t index, Worker& worker, control::ReplyBox& box, Endpoint& ep, uint64_t& next_id,
            Clock::time_point deadline) const {
    return control::AskOn(servers_[index]->name, worker, box, ep, next_id, deadline);
  }
  // A connection of `tc` to server `index` failed: marks the server failed (Lost: a refusal,
  // else "connection lost") and returns its Failure().
  Status ConnectionLost(ThreadContext& tc, size_t index);
  // What a hello on a fresh connection of its own (own worker) learns of server `index`
  // within kProbeTimeout: it takes us, it refuses us (`refusal`: its words, e.g. evicted), or
  // nothing answered. Any thread.
  struct Probe {
    enum Kind { kTakesUs, kRefuses, kNoAnswer } kind = kNoAnswer;
    Status refusal;  // kRefuses: the server's error reply (its code: kEvicted, say)
  };
  Probe ProbeServer(size_t index);
  // This Pool's hello; asks to be pinned (kHelloWantsMap) if `map`.
  wire::HelloRequest HelloFor(bool map) const;
  uint32_t tag() const { return static_cast<uint32_t>(nonce_); }
  Result<ServerStats> Stats(size_t index);
  // Lease and release runs of whole chunks on server `index` (the allocator's and the shared
  // leases' one round trip to the server).
  Result<uint64_t> LeaseOn(size_t index, uint64_t size);
  // At close, after the regions are unmapped: a GoodbyeRequest to every live server, each on
  // some thread's connection to it (nothing else uses the Pool any more).
  void SayGoodbye();
  static constexpr std::chrono::milliseconds kGoodbyeTimeout{1000};
  Status ReleaseOn(size_t index, uint64_t offset, uint64_t size);
  // Where leases of server `index` go: itself (mirror 0), or, failed over, the promoted
  // mirror slot of the server that serves it (mirror: 1 + its id).
  std::pair<size_t, uint32_t> ControlTarget(size_t index) const;
  // Whether a failed server's regions can move (replicated, or a drain the map shows): what a
  // batch resends after a failure (Batch::Drain).
  bool RegionsMove() const { return cluster_.replicas > 0 || etcd_ != nullptr; }

  PoolOptions options_;
  Fabric fabric_ = Fabric::kAuto;
  ClusterConfig cluster_;  // as connected to (replicas, the backup ring)
  // kMaxServers entries; the first count_ are published (see the file comment). Written only
  // by Init and by the map watcher (LearnServers), before publication.
  std::vector<std::unique_ptr<ServerState>> servers_ =
      std::vector<std::unique_ptr<ServerState>>(kMaxServers);
  std::atomic<size_t> count_{0};
  // Server id -> index + 1 (0: unknown), published before count_.
  std::unique_ptr<std::atomic<uint16_t>[]> index_of_ =
      std::make_unique<std::atomic<uint16_t>[]>(size_t{1} << 16);
  // LearnServers: when a server that did not answer may be tried again, and the delay after
  // the next failure (watcher thread only).
  struct JoinBackoff {
    Clock::time_point next{};
    std::chrono::milliseconds delay = kJoinRetry / 2;
  };
  std::map<uint16_t, JoinBackoff> join_after_;
  std::unique_ptr<transport::Context> context_;
  std::unique_ptr<ObjectAllocator> allocator_;
  std::atomic<uint64_t> stripe_{0};
  const uint64_t generation_ = g_next_generation.fetch_add(1);
  const uint64_t nonce_ = RandomNonce();
  uint64_t start_time_ = 0;                         // this process's, for the hello; 0 if unknown
  BootIdBytes boot_id_{};                           // zero if unknown
  std::optional<transport::ClusterSecret> secret_;  // the cluster file's; none: no proofs
  bool map_ = false;  // direct access wanted: the connecting thread's hellos ask to pin

  std::mutex contexts_mu_;
  std::map<std::thread::id, std::unique_ptr<ThreadContext>> contexts_;
  std::atomic<uint64_t> suspicions_cleared_{0};  // OpCounters::suspicions_cleared
  std::atomic<uint64_t> maps_watched_{0};        // OpCounters::maps_watched
  std::atomic<uint64_t> maps_polled_{0};         // OpCounters::maps_polled

 private:
  Result<std::unique_ptr<ThreadContext>> CreateThreadContext();
  Status Hello(ThreadContext& tc, size_t index, std::chrono::milliseconds timeout);
  // What a hello reply of server `index` on `tc` says: the region, on the first hello (before
  // the server is published); the remote key on every later one.
  Status Record(ThreadContext& tc, size_t index, const Reply& r);
  void Monitor();

  std::thread monitor_;
  std::atomic<bool> stop_monitor_{false};
  // The monitor's worker while it sleeps on it between rounds (failure_timeout / 4, seconds):
  // ~Impl signals it so that close does not wait out the sleep.
  std::mutex monitor_mu_;
  Worker* monitor_worker_ = nullptr;
  // Set once by Evicted (under eviction_mu_, after eviction_), before it marks the servers
  // failed; never cleared. Its store and count_'s in Join are sequentially consistent: of
  // Evicted's loop over count() and Join's check of evicted_ after it publishes a server, one
  // sees the other, so no server stays unmarked.
  std::atomic<bool> evicted_{false};
  std::mutex eviction_mu_;
  std::string eviction_;  // the first refusal's words; guarded by eviction_mu_
  // Replicated clusters with an etcd: the map's client and watcher.
  std::unique_ptr<coord::EtcdClient> etcd_;
  std::thread map_watcher_;
  std::atomic<int64_t> map_epoch_{0};  // the last epoch followed
  // The newest map the watch delivered (its mod revision; 0: none yet), for the watcher and
  // AwaitMapDecision, which wait on map_cv_ for it to change.
  std::mutex map_mu_;
  std::condition_variable map_cv_;
  int64_t watched_revision_ = 0;  // guarded by map_mu_
  std::string watched_map_;       // guarded by map_mu_
  // Declared after what its thread touches (destroyed first, after the destructor's body, whose
  // goodbyes may still fail a server over and ask it).
  std::unique_ptr<coord::EtcdWatch> map_watch_;
};

// ------------------------------------------------------------------ connection management

Status Pool::Impl::Init(const ClusterConfig& cluster, const PoolOptions& options) {
  options_ = options;
  cluster_ = cluster;
  fabric_ = options.transport.value_or(cluster.transport);
  map_ = options_.direct_access && fabric_ != Fabric::kTcp;
  if (map_) {
    std::lock_guard<std::mutex> l(g_live_tags_mu);
    g_live_tags.insert(tag());
  }
  // Unknown, they make servers refuse the mapping (with the reason), nothing else.
  if (auto start = ProcessStartTime(getpid()); start.ok()) start_time_ = *start;
  if (auto boot = BootId(); boot.ok()) boot_id_ = *boot;
  if (!cluster.secret_file.empty()) {
    FARPOOL_ASSIGN_OR_RETURN(secret_, transport::ClusterSecret::Read(cluster.secret_file));
  }
  if (!cluster.etcd.endpoints.empty()) {
    // Short calls: the watcher and a failover must not hang on a partitioned etcd. Without
    // replicas too: a drain moves a region there as well (docs/pool.md "Drain without
    // replicas").
    FARPOOL_ASSIGN_OR_RETURN(
        etcd_, coord::EtcdClient::Create({cluster.etcd.endpoints, std::chrono::milliseconds(500)}));
    // Before anything can fail a server over (AwaitMapDecision waits on its maps).
    coord::EtcdWatch::Options wo;
    wo.endpoints = cluster.etcd.endpoints;
    wo.key = coord::MapKeys{cluster.etcd.prefix}.Map();
    wo.timeout = std::chrono::milliseconds(500);
    wo.on_update = [this](const coord::EtcdWatch::Update& u) { MapWatched(u); };
    FARPOOL_ASSIGN_OR_RETURN(map_watch_, coord::EtcdWatch::Start(std::move(wo)));
  }
  if (cluster.servers.size() > kMaxServers) {
    return Status::InvalidArgument("the cluster has " + std::to_string(cluster.servers.size()) +
                                   " servers; a Pool knows at most " + std::to_string(kMaxServers));
  }
  for (const ServerAddress& a : cluster.servers) {
    if (index_of_[a.id].load() != 0) {
      return Status::InvalidArgument("server " + std::to_string(a.id) +
                                     " is named twice in the cluster file");
    }
    const size_t i = count_.load();
    servers_[i] = NewServerState(a);
    index_of_[a.id].store(static_cast<uint16_t>(i + 1));
    count_.store(i + 1);
  }
  transport::Context::Options copts;
  copts.fabric = fabric_;
  copts.wakeup = true;  // the monitor sleeps on its worker
  for (const ServerAddress& a : cluster.servers) copts.reach.push_back(a.host);
  FARPOOL_ASSIGN_OR_RETURN(context_, transport::Context::Create(copts));

  // The connecting thread's context learns every region (and, with direct access, maps it).
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, Local());
  ConnectEvery(*tc);
  for (size_t i = 0; i < count(); ++i) {
    ServerState& s = *servers_[i];
    if (s.failed && (cluster_.replicas > 0 || etcd_) && s.moved_to.load() < 0 && Outage(s)) {
      FailOver(i);  // down at connect: its backup's hello (its mirror) is known only now
    }
    if (s.failed && s.moved_to.load() >= 0) {
      // Its backup serves its region, of the backup's geometry (mirrors are as large).
      const ServerState& b = *servers_[static_cast<size_t>(s.moved_to.load())];
      s.region_size = b.region_size;
      s.chunk_size = b.chunk_size;
      // The pool's root there is known from the backup's hello only if its slot 0 holds the
      // region (the ring backup); in a slot re-replication chose, a pool other than the default
      // does not learn its root area at connect (its root operations are refused, not misrouted).
      if (b.mirror_of == s.address.id && s.moved_slot.load() == 0) {
        s.root_offset = b.mirror_root_offset;
      }
      continue;
    }
    if (s.failed) return s.Failure().WithContext("connecting");
    FARPOOL_RETURN_IF_ERROR(Adopt(*tc, i));
  }
  // Once every live server's mapping is known (a region may move to a server of a higher index).
  for (size_t i = 0; i < count(); ++i) {
    if (servers_[i]->failed && servers_[i]->moved_to.load() >= 0) MapMoved(*tc, i);
  }
  std::vector<ObjectAllocator::Geometry> geometry;
  for (size_t i = 0; i < count(); ++i) {
    geometry.push_back({servers_[i]->region_size, servers_[i]->chunk_size});
  }
  allocator_ = std::make_unique<ObjectAllocator>(
      geometry, kMaxServers, [this](size_t index, uint64_t size) { return LeaseOn(index, size); },
      [this](size_t index, uint64_t offset, uint64_t size) {
        return ReleaseOn(index, offset, size);
      });
  monitor_ = std::thread([this] { Monitor(); });
  if (etcd_) map_watcher_ = std::thread([this] { WatchMap(); });
  return Status::Ok();
}

Status Pool::Impl::Adopt(ThreadContext& tc, size_t i) {
  ServerState& s = *servers_[i];
  if (s.hello_flags & wire::kHelloPoolClient) {
    // A pool's client gets no key: messages only, which the server checks (docs/pool.md).
    if (fabric_ == Fabric::kShm || options_.remote_access == RemoteAccess::kOneSided) {
      return Status::InvalidArgument(
          s.name + ": pool '" + cluster_.pool +
          "': a pool's clients reach memory through messages only (the server checks them "
          "against the pool's chunks; a mapping or a remote key would reach every pool's "
          "bytes): use transport tcp or auto and remote access messages or auto");
    }
    s.messages = true;
    s.keyless = true;
    return Status::Ok();
  }
  auto rkey = RemoteKey::Unpack(*tc.peers[i].ep, s.rkey);
  if (!rkey.ok()) return rkey.status().WithContext(s.name);
  tc.peers[i].rkey = std::move(*rkey);
  // Only a client the server pinned may map: only it can be fenced by a kill (docs/pool.md).
  if (map_ && (s.hello_flags & wire::kHelloMayMap)) {
    s.direct = tc.peers[i].rkey->DirectPointer(s.region_base);
  }
  const bool messages =
      options_.remote_access == RemoteAccess::kMessages ||
      (options_.remote_access == RemoteAccess::kAuto &&
       (fabric_ == Fabric::kTcp || (fabric_ == Fabric::kAuto && !transport::RdmaDevicesPresent())));
  s.messages = s.direct == nullptr && messages;
  if (fabric_ == Fabric::kShm && s.direct == nullptr) {
    const std::string why =
        !options_.direct_access ? "direct access is off (--no-direct)"
        : !(s.hello_flags & wire::kHelloMayMap)
            ? "the server does not let this process map it: " + wire::HelloMapRefusal(s.hello_flags)
            : "UCX cannot map it (is the server on another host?)";
    return Status::Unavailable(s.name +
                               ": transport shm needs the server's region mapped "
                               "into this process, which failed (" +
                               why + "); use tcp or auto");
  }
  return Status::Ok();
}

void Pool::Impl::MapMoved(ThreadContext& tc, size_t index) {
  ServerState& s = *servers_[index];
  const auto b = static_cast<size_t>(s.moved_to.load());
  const ServerState& by = *servers_[b];
  if (!cluster_.shared_pages || s.direct != nullptr || by.direct == nullptr ||
      (by.hello_flags & wire::kHelloSharedPages) == 0) {
    return;
  }
  auto file = [&]() -> Result<std::byte*> {
    FARPOOL_ASSIGN_OR_RETURN(
        Reply reply, Call(
                         tc, b,
                         [&](uint64_t id) {
                           return wire::Encode(id, wire::MovedFileRequest{s.address.id, {}});
                         },
                         wire::Opcode::kMovedFileReply, options_.op_timeout));
    const auto r = reply.message.As<wire::MovedFileReply>();
    const std::string path = "/proc/" + std::to_string(r.pid) + "/fd/" + std::to_string(r.fd);
    if (r.size < s.region_size) {
      return Status::Protocol(path + ": " + std::to_string(r.size) +
                              " bytes offered, fewer than the region's " +
                              std::to_string(s.region_size));
    }
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return Status::PermissionDenied("opening " + path + ": " + std::strerror(errno));
    struct stat st {};
    const bool stat_ok = fstat(fd, &st) == 0;
    // Read after the open: if the process still has the start time named, the descriptor we
    // opened was that process's (a pid is not reused while its process lives).
    auto started = ProcessStartTime(static_cast<int64_t>(r.pid));
    if (!stat_ok || st.st_ino != r.inode || static_cast<uint64_t>(st.st_size) < r.size ||
        !started.ok() || *started != r.start_time) {
      close(fd);
      return Status::NotFound(path + " is not the file offered (inode " + std::to_string(r.inode) +
                              " of process " + std::to_string(r.pid) + "), or that process exited");
    }
    void* m = mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);  // the mapping keeps the file
    if (m == MAP_FAILED) return Status::Internal("mapping " + path + ": " + std::strerror(errno));
    s.mapped_moved = r.size;
    return static_cast<std::byte*>(m);
  }();
  if (!file.ok()) {
    std::fprintf(stderr, "farpool: %s: its region at %s is reached by messages: %s\n",
                 s.name.c_str(), by.name.c_str(), file.status().message().c_str());
    return;
  }
  s.direct = *file;
  s.hello_flags |= wire::kHelloSharedPages;  // the pages are shared, as its own hello would say
}

Pool::Impl::~Impl() {
  // The sync calls' batches first: they refer to this Pool (and have nothing in flight).
  for (auto& [id, tc] : contexts_) tc->alone.reset();
  if (map_) {
    std::lock_guard<std::mutex> l(g_live_tags_mu);
    auto it = g_live_tags.find(tag());
    if (it != g_live_tags.end()) g_live_tags.erase(it);
  }
  stop_monitor_.store(true);
  {
    std::lock_guard lock(monitor_mu_);  // a monitor past its check of the stop wakes at once
    if (monitor_worker_ != nullptr) monitor_worker_->Signal();
  }
  {
    std::lock_guard lock(map_mu_);  // the watcher between its check and its wait sees the stop
  }
  map_cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  if (map_watcher_.joinable()) map_watcher_.join();
  if (allocator_) {
    Status s = allocator_->Trim();
    (void)s;  // servers that are gone keep nothing for us to release
  }
  // Keys first: destroying them unmaps the regions. Then goodbye to every server (it unpins
  // this process and refuses the tag: an eviction of it can no longer kill us), then
  // endpoints before workers, workers before the context.
  for (auto& [id, tc] : contexts_) {
    for (auto& p : tc->peers) p.rkey.reset();
  }
  for (size_t i = 0; i < count(); ++i) {
    ServerState& s = *servers_[i];
    if (s.mapped_moved > 0) munmap(s.direct, s.mapped_moved);
    s.direct = nullptr;
  }
  SayGoodbye();
  for (auto& [id, tc] : contexts_) {
    for (auto& p : tc->peers) p.ep.reset();
  }
  contexts_.clear();
  context_.reset();
}

void Pool::Impl::SayGoodbye() {
  for (size_t i = 0; i < count(); ++i) {
    if (servers_[i]->failed) continue;
    // On any thread's connection to it (threads connect lazily; the hello that pinned us was
    // Init's or LearnServers', whose contexts stay): none, and we never said hello.
    for (auto& [thread, tc] : contexts_) {
      // Not on a connection UCX found broken: its Call would take the server for lost.
      if (i >= tc->peers.size() || !tc->peers[i].ep || tc->peers[i].ep->failed()) continue;
      // Best effort: a server that does not answer keeps a pin that it drops when we exit.
      (void)Call(
          *tc, i, [&](uint64_t id) { return wire::Encode(id, wire::GoodbyeRequest{tag()}); },
          wire::Opcode::kGoodbyeReply, kGoodbyeTimeout);
      break;
    }
  }
}

Result<std::unique_ptr<ThreadContext>> Pool::Impl::CreateThreadContext() {
  auto tc = std::make_unique<ThreadContext>();
  FARPOOL_ASSIGN_OR_RETURN(tc->worker, Worker::Create(*context_, true));  // AwaitReply sleeps
  FARPOOL_RETURN_IF_ERROR(
      tc->worker->SetAmHandler(transport::kControlAm, &control::ReplyBox::OnMessage, &tc->box));
  return tc;  // no endpoint yet: each is made on the thread's first use of its server (PeerOf)
}

void Pool::Impl::ConnectEvery(ThreadContext& tc) {
  const size_t n = count();
  if (tc.peers.size() < n) tc.peers.resize(n);
  // Every endpoint first, so that their wireups overlap; then a hello each.
  std::vector<size_t> fresh;
  for (size_t i = 0; i < n; ++i) {
    ServerState& s = *servers_[i];
    if (s.failed || tc.peers[i].ep) continue;
    auto ep = Endpoint::Connect(*tc.worker, s.address.host, s.address.port, nullptr);
    if (!ep.ok()) {
      MarkFailed(i, ep.status().message());
      continue;
    }
    tc.peers[i].ep = std::move(*ep);
    fresh.push_back(i);
  }
  for (size_t i : fresh) {
    if (servers_[i]->failed) continue;
    Status hello = Hello(tc, i, options_.connect_timeout);
    if (!hello.ok()) HelloFailed(i, hello);
  }
}

void Pool::Impl::HelloFailed(size_t index, const Status& hello) {
  std::string_view reason = hello.message();
  const std::string prefix = servers_[index]->name + ": ";
  if (reason.substr(0, prefix.size()) == prefix) reason.remove_prefix(prefix.size());
  // A refusal is no outage: it keeps its code (PermissionDenied, Evicted), so callers can tell.
  MarkFailed(index, "connect failed: " + std::string(reason), RefusalCode(hello));
}

void Pool::Impl::ConnectPeer(ThreadContext& tc, size_t index) {
  ServerState& s = *servers_[index];
  if (tc.peers.size() <= index) tc.peers.resize(index + 1);
  auto ep = Endpoint::Connect(*tc.worker, s.address.host, s.address.port, nullptr);
  if (!ep.ok()) return MarkFailed(index, ep.status().message());
  tc.peers[index].ep = std::move(*ep);
  Status hello = Hello(tc, index, options_.connect_timeout);
  if (!hello.ok()) HelloFailed(index, hello);
}

void Pool::Impl::ConnectFor(size_t index) {
  auto tc = Local();
  if (tc.ok()) (void)PeerOf(**tc, ControlTarget(index).first);  // nothing for a failed one
}

Result<Endpoint*> Pool::Impl::PeerOf(ThreadContext& tc, size_t index) {
  if (index < tc.peers.size() && tc.peers[index].ep) return tc.peers[index].ep.get();
  ServerState& s = *servers_[index];
  // No endpoint and not failed: this thread has not talked to the server yet (a failed
  // connection attempt marks it failed).
  if (!s.failed.load()) ConnectPeer(tc, index);
  if (s.failed.load()) return s.Failure();
  return tc.peers[index].ep.get();
}

Status Pool::Impl::Hello(ThreadContext& tc, size_t index, std::chrono::milliseconds timeout) {
  FARPOOL_ASSIGN_OR_RETURN(
      Reply r, Handshake(index, map_, [&](const Encoder& encode, wire::Opcode expected) {
        return Call(tc, index, encode, expected, timeout);
      }));
  Bump(tc.connects);
  return Record(tc, index, r);
}

Status Pool::Impl::Record(ThreadContext& tc, size_t index, const Reply& r) {
  ServerState& s = *servers_[index];
  auto hello = r.message.As<wire::HelloReply>();
  if (hello.server_id != s.address.id) {
    return Status::Protocol(s.name + ": server says it is server " +
                            std::to_string(hello.server_id) + "; the cluster file is stale");
  }
  if (s.region_size == 0) {  // first hello (Init, one thread): record the region
    s.region_base = hello.region_base;
    s.region_size = hello.region_size;
    s.chunk_size = hello.chunk_size;
    s.hello_flags = hello.flags;
    s.mirror_of = hello.mirror_of;
    s.mirror_port = hello.mirror_port;
    s.root_offset = hello.root_offset;
    s.mirror_root_offset = hello.mirror_root_offset;
    s.rkey.assign(r.message.tail.begin(), r.message.tail.end());
    return Status::Ok();
  }
  if (s.rkey.empty()) return Status::Ok();  // a pool's client: no key
  auto rkey = RemoteKey::Unpack(*tc.peers[index].ep, s.rkey);
  if (!rkey.ok()) return rkey.status().WithContext(s.name);
  tc.peers[index].rkey = std::move(*rkey);
  return Status::Ok();
}

Result<ThreadContext*> Pool::Impl::Local() {
  struct Cache {
    uint64_t generation = 0;
    ThreadContext* context = nullptr;
  };
  thread_local Cache cache;
  if (cache.generation == generation_) return cache.context;
  const auto me = std::this_thread::get_id();
  {
    std::lock_guard lock(contexts_mu_);
    auto it = contexts_.find(me);
    if (it != contexts_.end()) {
      cache = {generation_, it->second.get()};
      return cache.context;
    }
  }
  // Creating a UCX worker is not free on a loaded host: not under contexts_mu_, or every other
  // thread's first call (the database's lease renewals among them) would wait for it.
  FARPOOL_ASSIGN_OR_RETURN(std::unique_ptr<ThreadContext> created, CreateThreadContext());
  std::lock_guard lock(contexts_mu_);
  auto& slot = contexts_[me];
  slot = std::move(created);
  cache = {generation_, slot.get()};
  return slot.get();
}

void Pool::Impl::MarkFailed(size_t index, const std::string& reason, StatusCode code) {
  if (code == StatusCode::kEvicted) return Evicted(static_cast<int>(index), reason);
  ServerState& s = *servers_[index];
  {
    std::lock_guard lock(s.mu);
    if (s.failed.load()) return;
    s.failure = reason;
    s.failure_code = code;
    // Without replicas only a drain moves a region (FailOver follows the map to it). An
    // evicted Pool moves nothing: whatever failed, no server will take it any more.
    if ((cluster_.replicas > 0 || s.draining.load()) && code == StatusCode::kUnavailable &&
        !evicted_.load()) {
      s.failing_over.store(true);
    }
    s.failed.store(true);
  }
  if (s.failing_over.load()) {
    FailOver(index);
    s.failing_over.store(false);
  }
}

void Pool::Impl::Evicted(int index, const std::string& refusal) {
  {
    std::lock_guard lock(eviction_mu_);
    if (evicted_.load()) {
      // Another thread's verdict marks every server; this one's words too, now, so that its
      // caller never meets the server unmarked (and marks an outage).
      if (index >= 0) MarkEvicted(static_cast<size_t>(index), refusal);
      return;
    }
    eviction_ = refusal;
    evicted_.store(true);
  }
  std::fprintf(stderr, "farpool: this process (tag %s) is evicted from the pool: %s\n",
               TagName(tag()).c_str(), refusal.c_str());
  // Every server's verdict, the refusing server's in its own words. A server failed before
  // (an outage, a failover under way) gets them too: nothing of the pool answers us any more,
  // and the eviction is what a caller must act on.
  for (size_t i = 0; i < count_.load(); ++i) {
    MarkEvicted(i, static_cast<int>(i) == index ? refusal : "this process is evicted: " + refusal);
  }
  // AwaitMapDecision waits on the map: it gives up on the news.
  { std::lock_guard lock(map_mu_); }
  map_cv_.notify_all();
}

void Pool::Impl::MarkEvicted(size_t index, const std::string& why) {
  ServerState& s = *servers_[index];
  std::lock_guard lock(s.mu);
  s.failure = why;
  s.failure_code = StatusCode::kEvicted;
  s.failed.store(true);
}

int Pool::Impl::MovedTo(const ServerState& s) const {
  // Callers that meet the server failed while another thread fails it over wait for the
  // outcome (bounded: FailOver's requests time out), so they go to the backup, not fail.
  const auto deadline = Clock::now() + 2 * options_.connect_timeout;
  while (s.failing_over.load() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return s.moved_to.load(std::memory_order_acquire);
}

std::optional<std::pair<size_t, int>> Pool::Impl::ServedBy(const coord::ClusterMap& map,
                                                           size_t index) const {
  const coord::MapServer* m = map.Find(servers_[index]->address.id);
  if (m == nullptr || m->served_by == m->id || m->served_slot < 0) return std::nullopt;
  auto b = IndexOf(m->served_by);
  if (!b.ok()) return std::nullopt;
  return std::pair<size_t, int>{*b, m->served_slot};
}

Result<std::pair<size_t, int>> Pool::Impl::AwaitMapDecision(size_t index) {
  const ServerState& s = *servers_[index];
  const coord::MapKeys keys{cluster_.etcd.prefix};
  // An evicted Pool reports no server: it is refused by live ones.
  const auto evicted = [&] { return Status::Evicted("this process is evicted: no failover"); };
  if (evicted_.load()) return evicted();
  FARPOOL_RETURN_IF_ERROR(
      etcd_->Put(keys.Suspect(s.address.id), std::to_string(getpid())).status());
  const auto deadline = Clock::now() + kCoordinatorWait;
  int64_t seen = -1;  // the watched map's revision last looked at
  while (true) {
    // The map as the watch delivers it; read from etcd when the watch brings nothing new
    // within kMapPoll's share (it may be down).
    std::string value;
    {
      std::unique_lock lock(map_mu_);
      const bool watched = map_watch_ != nullptr && map_watch_->up();  // null: Init failed
      const auto wait = watched ? 10 * kMapReadWhileDown : kMapReadWhileDown;
      if (map_cv_.wait_for(lock, wait,
                           [&] { return watched_revision_ != seen || evicted_.load(); })) {
        seen = watched_revision_;
        value = watched_map_;
      }
    }
    if (evicted_.load()) return evicted();
    if (value.empty()) {
      FARPOOL_ASSIGN_OR_RETURN(auto kv, etcd_->Get(keys.Map()));
      if (!kv) return Status::NotFound("no cluster map at " + keys.Map());
      value = std::move(kv->value);
    }
    FARPOOL_ASSIGN_OR_RETURN(auto map, coord::ClusterMap::Parse(value, keys.Map()));
    if (auto b = ServedBy(map, index)) return *b;
    if (Clock::now() > deadline) {
      return Status::TimedOut("the coordinator did not fail it over within " +
                              std::to_string(kCoordinatorWait.count()) + " ms");
    }
  }
}

void Pool::Impl::FollowMap(const coord::ClusterMap& map) {
  if (map.epoch <= map_epoch_.load()) return;
  for (size_t i = 0; i < count(); ++i) {
    ServerState& s = *servers_[i];
    const auto served = ServedBy(map, i);
    if (!served) continue;
    const auto b = served->first;
    // A region moves again when the server that took it over is lost in turn (re-replication
    // gave it a backup there).
    if (s.moved_to.load() == static_cast<int>(b) && s.moved_slot.load() == served->second) continue;
    {
      std::lock_guard lock(s.mu);
      if (s.failing_over.load()) continue;  // its FailOver reads the map itself
      if (!s.failed.load()) {
        s.failure = "the cluster map (epoch " + std::to_string(map.epoch) +
                    ") has its region served by server " + std::to_string(servers_[b]->address.id);
        s.failure_code = StatusCode::kUnavailable;
        s.failed.store(true);
      }
    }
    s.moved_slot.store(served->second);
    s.moved_to.store(static_cast<int>(b), std::memory_order_release);
    std::fprintf(stderr, "farpool: the cluster map (epoch %lld) moved %s to %s\n",
                 static_cast<long long>(map.epoch), s.name.c_str(), servers_[b]->name.c_str());
  }
  map_epoch_.store(map.epoch);
}

void Pool::Impl::MapWatched(const coord::EtcdWatch::Update& u) {
  // The map's key only: a snapshot has it or nothing; of several events, the last put counts.
  const coord::KeyValue* latest = nullptr;
  for (const coord::KeyValue& kv : u.kvs) latest = &kv;
  for (const coord::WatchEvent& e : u.events) {
    if (e.type == coord::WatchEvent::Type::kPut) latest = &e.kv;
  }
  if (latest == nullptr) return;  // deleted (the cluster is going down), or not written yet
  {
    std::lock_guard lock(map_mu_);
    watched_revision_ = latest->mod_revision;
    watched_map_ = latest->value;
  }
  map_cv_.notify_all();
}

void Pool::Impl::WatchMap() {
  const coord::MapKeys keys{cluster_.etcd.prefix};
  int64_t followed = 0;  // the watched map's revision last followed
  // The watch's first snapshot brings the map; the safety net reads it from then on.
  auto next_poll = Clock::now() + options_.map_poll;
  std::optional<coord::ClusterMap> last;  // for servers whose join is to be tried again
  while (!stop_monitor_.load()) {
    // Woken by a new watched map, the next safety-net read, or a join to try again (those
    // due already were tried by the last LearnServers).
    auto wake = next_poll;
    const auto now = Clock::now();
    for (const auto& [id, b] : join_after_) {
      if (b.next > now) wake = std::min(wake, b.next);
    }
    std::string value;
    bool watched = false;
    {
      std::unique_lock lock(map_mu_);
      map_cv_.wait_until(lock, wake,
                         [&] { return stop_monitor_.load() || watched_revision_ != followed; });
      if (stop_monitor_.load()) break;
      if (watched_revision_ != followed) {
        followed = watched_revision_;
        value = watched_map_;
        watched = true;
      }
    }
    if (!watched && Clock::now() >= next_poll) {
      next_poll = Clock::now() + options_.map_poll;
      auto kv = etcd_->Get(keys.Map());
      // etcd unreachable: keep the map we have (failures found meanwhile fall back to the
      // client-driven failover).
      if (kv.ok() && kv->has_value()) value = std::move((*kv)->value);
    }
    if (!value.empty()) {
      auto map = coord::ClusterMap::Parse(value, keys.Map());
      if (!map.ok()) continue;
      if (map->epoch > map_epoch_.load()) (watched ? maps_watched_ : maps_polled_).fetch_add(1);
      last = std::move(*map);
    }
    if (!last) continue;
    LearnServers(*last);  // first: a region may have moved to a server new to us
    FollowMap(*last);
  }
}

void Pool::Impl::LearnServers(const coord::ClusterMap& map) {
  if (evicted_.load()) return;  // every server refuses us: nothing to enter
  for (const coord::MapServer& m : map.servers) {
    if (IndexOf(m.id).ok()) continue;
    // A server that serves no region (drained, or failed over before we saw it) has nothing
    // for us.
    if (std::none_of(map.servers.begin(), map.servers.end(),
                     [&](const coord::MapServer& r) { return r.served_by == m.id; })) {
      continue;
    }
    // In a replicated cluster a server whose own region has no backup yet (just added, and
    // re-replication has not named one, or has no free slot for one) refuses every lease and
    // batch: entered, it would be where striped chunks and every new session's stamp word go,
    // and those would fail. Learned once the map names its backup.
    if (map.replicas > 0 && m.served_by == m.id && m.Backups().empty()) continue;
    JoinBackoff& b = join_after_[m.id];
    if (Clock::now() < b.next) continue;
    Status joined = Join(m);
    if (joined.ok()) {
      join_after_.erase(m.id);
      std::fprintf(stderr, "farpool: the cluster map (epoch %lld) names server %u (%s): joined\n",
                   static_cast<long long>(map.epoch), m.id, m.address.c_str());
      continue;
    }
    // Not entered: nothing goes to it; tried again later, less often while it stays silent.
    b.delay = std::min(b.delay * 2, kJoinRetryMax);
    b.next = Clock::now() + b.delay;
    std::fprintf(stderr,
                 "farpool: the cluster map (epoch %lld) names server %u (%s), which does not "
                 "answer yet (%s): tried again in %lld ms\n",
                 static_cast<long long>(map.epoch), m.id, m.address.c_str(),
                 joined.message().c_str(), static_cast<long long>(b.delay.count()));
  }
}

Status Pool::Impl::Join(const coord::MapServer& m) {
  const size_t index = count();
  if (index == kMaxServers) {
    return Status::ResourceExhausted("this Pool knows " + std::to_string(kMaxServers) +
                                     " servers, its table's capacity");
  }
  FARPOOL_ASSIGN_OR_RETURN(auto host_port, ParseHostPort(m.address));
  ServerAddress a;
  a.id = m.id;
  a.host = host_port.first;
  a.port = host_port.second;
  a.memory = m.memory;
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, Local());
  // Not published yet: no other thread looks at servers_[index] before count_ says so.
  servers_[index] = NewServerState(a);
  if (tc->peers.size() <= index) tc->peers.resize(index + 1);
  ThreadContext::Peer& peer = tc->peers[index];
  auto fail = [&](const Status& why) {
    peer.rkey.reset();
    peer.ep.reset();
    servers_[index].reset();
    return why;
  };
  auto ep = Endpoint::Connect(*tc->worker, a.host, a.port, nullptr);
  if (!ep.ok()) return fail(ep.status());
  peer.ep = std::move(*ep);
  // On a connection of this thread's, but not through Call: a failure here is no failure of a
  // server of ours (MarkFailed would fail it over); the deadline keeps the watcher responsive.
  auto hello = Handshake(index, map_,
                         AskOn(index, *tc->worker, tc->box, *peer.ep, tc->next_request_id,
                               Clock::now() + kJoinTimeout));
  if (!hello.ok()) {
    // An eviction is every server's, a new one's too (Evicted: the Pool's verdict).
    if (hello.status().code() == StatusCode::kEvicted) Evicted(-1, hello.status().message());
    return fail(hello.status());
  }
  Status recorded = Record(*tc, index, *hello);
  if (recorded.ok()) recorded = Adopt(*tc, index);
  if (!recorded.ok()) return fail(recorded);
  ServerState& s = *servers_[index];
  auto at = allocator_->AddServer({s.region_size, s.chunk_size});
  if (!at.ok()) return fail(at.status());
  if (*at != index) return fail(Status::Internal("the allocator's server table is out of step"));
  index_of_[a.id].store(static_cast<uint16_t>(index + 1), std::memory_order_release);
  count_.store(index + 1);  // sequentially consistent: see evicted_
  // Evicted meanwhile (another thread's verdict, whose loop may have missed this server): it
  // refuses us too.
  if (evicted_.load()) {
    std::lock_guard lock(eviction_mu_);
    MarkEvicted(index, "this process is evicted: " + eviction_);
  }
  return Status::Ok();
}

void Pool::Impl::FailOver(size_t index) {
  ServerState& s = *servers_[index];
  if (evicted_.load()) return;  // see the file comment, "Eviction"
  if (etcd_ && cluster_.replicas == 0 && !s.draining.load()) {
    // Without replicas a region moves only by a drain (`cluster drain`), which this client did
    // not see: the map has the move already (a client connecting after it), or it never comes.
    auto kv = etcd_->Get(coord::MapKeys{cluster_.etcd.prefix}.Map());
    if (!kv.ok() || !kv->has_value()) return;
    auto map = coord::ClusterMap::Parse((*kv)->value, cluster_.etcd.prefix);
    if (map.ok()) FollowMap(*map);
    return;
  }
  if (etcd_) {
    // The map may have moved the backup since `cluster up` (re-replication): it decides.
    auto decided = AwaitMapDecision(index);
    if (decided.ok()) {
      s.moved_slot.store(decided->second);
      s.moved_to.store(static_cast<int>(decided->first), std::memory_order_release);
      std::fprintf(stderr, "farpool: %s is gone; the coordinator moved its data to %s\n",
                   s.name.c_str(), servers_[decided->first]->name.c_str());
      return;
    }
    if (evicted_.load()) return;
    std::fprintf(stderr,
                 "farpool: %s is gone and etcd's coordinator did not fail it over (%s): asking "
                 "its ring backup directly\n",
                 s.name.c_str(), decided.status().message().c_str());
  }
  if (cluster_.replicas == 0 || evicted_.load()) return;  // no ring backup to ask
  // The first stage's fallback: the first ring backup not known to have failed (backup k
  // mirrors it in its slot k, ClusterConfig::BackupOf).
  size_t k = 0;
  while (k + 1 < static_cast<size_t>(cluster_.replicas) &&
         servers_[cluster_.BackupOf(index, k)]->failed.load()) {
    ++k;
  }
  const size_t b = cluster_.BackupOf(index, k);
  ServerState& backup = *servers_[b];
  if (backup.failed.load() || (k == 0 && backup.mirror_of != s.address.id)) {
    if (backup.region_size == 0) return;  // not said hello yet (Connect): Init tries again
    std::fprintf(stderr, "farpool: %s is gone and cannot fail over: %s\n", s.name.c_str(),
                 backup.failed.load() ? "its backup is gone too" : "its backup does not mirror it");
    return;
  }
  // One connection per server asked, opened once: opening one creates a UCX context and
  // worker, which holds every other thread's progress back meanwhile (transport/ucx.h). Not
  // once this Pool is evicted, checked at every attempt: the verdict may come from another
  // thread meanwhile, or from the server asked (it is the Pool's, Evicted).
  auto ask = [&](ServerState& to, uint16_t port, wire::Opcode expected, int attempts,
                 const control::Encoder& encode) -> Status {
    const auto evicted = [&] {
      return Status::Evicted(to.name + ": this process is evicted: no failover");
    };
    if (evicted_.load()) return evicted();
    control::Connection::Options o{to.name, to.address.host,
                                   port,    secret_ ? &*secret_ : nullptr,
                                   fabric_, options_.connect_timeout};
    auto c = control::Connection::Open(o, HelloFor(false));
    Status st = c.status();
    for (int attempt = 0; c.ok() && attempt < attempts; ++attempt) {
      if (evicted_.load()) return evicted();
      st = (*c)->Call(encode, expected).status();
      if (st.code() != StatusCode::kAborted) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (st.code() == StatusCode::kEvicted) Evicted(-1, st.message());
    return st;
  };
  // On the backup's mirror port; "not yet" (Aborted) while the dead server's lease to serve
  // may still run (mirror.h): asked again until it lapses (100 tries: 2.5 s, twice lease and
  // margin).
  Status promoted =
      ask(backup, backup.mirror_port, wire::Opcode::kPromoteReply, 100, [&](uint64_t id) {
        return wire::Encode(id, wire::PromoteRequest{s.address.id, {}});
      });
  if (!promoted.ok()) {
    if (promoted.code() == StatusCode::kEvicted) return;  // no failure of the failover
    std::fprintf(stderr, "farpool: %s is gone; failing it over failed: %s\n", s.name.c_str(),
                 promoted.message().c_str());
    return;
  }
  s.moved_slot.store(static_cast<int>(k));
  s.moved_to.store(static_cast<int>(b));
  std::fprintf(stderr, "farpool: %s is gone; %s has taken its data over\n", s.name.c_str(),
               backup.name.c_str());
  // The server whose backup it was keeps one copy from now on (until re-replication exists).
  for (size_t a = 0; a < count(); ++a) {
    bool backed_up = false;
    for (size_t j = 0; j < static_cast<size_t>(cluster_.replicas); ++j) {
      backed_up = backed_up || cluster_.BackupOf(a, j) == index;
    }
    if (!backed_up || a == index || servers_[a]->failed.load()) continue;
    // On its mirror's port: its own loop may be waiting for the dead backup.
    Status degraded = ask(*servers_[a], servers_[a]->mirror_port, wire::Opcode::kDegradeReply, 1,
                          [&](uint64_t id) {
                            return wire::Encode(id, wire::DegradeRequest{s.address.id, {}});
                          });
    if (degraded.code() == StatusCode::kEvicted) return;
    if (!degraded.ok()) {
      std::fprintf(stderr, "farpool: telling %s that its backup is gone failed: %s\n",
                   servers_[a]->name.c_str(), degraded.message().c_str());
    }
  }
}

wire::HelloRequest Pool::Impl::HelloFor(bool map) const {
  wire::HelloRequest h{};
  h.client_pid = static_cast<uint64_t>(getpid());
  h.client_nonce = nonce_;
  h.start_time = start_time_;
  std::memcpy(h.boot_id, boot_id_.data(), sizeof(h.boot_id));
  h.flags = map ? wire::kHelloWantsMap : 0;
  std::memcpy(h.pool, cluster_.pool.data(), std::min(cluster_.pool.size(), sizeof(h.pool) - 1));
  return h;
}

Status Pool::Impl::ConnectionLost(ThreadContext& tc, size_t index) {
  Lost(index, "connection lost");
  return servers_[index]->Failure();
}

bool Pool::Impl::AskWhy(size_t index, bool wait, Status* refusal) {
  ServerState& s = *servers_[index];
  if (s.failed.load()) return true;
  if (s.probing.exchange(true)) {
    // Another thread asks already: its answer is ours, and so is the verdict if it has none
    // in time. A probe ends by its deadline (at most kProbeTimeout) and the close of its
    // endpoint (at most 2 s, transport/ucx.h); a refusal marks the server failed before
    // `probing` is cleared.
    const auto limit = Clock::now() + kProbeTimeout + std::chrono::seconds(3);
    while (wait && s.probing.load() && !s.failed.load() && Clock::now() < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return s.failed.load() || (!wait && s.probing.load());
  }
  struct Clear {
    std::atomic<bool>& flag;
    ~Clear() { flag.store(false); }
  } clear{s.probing};
  Probe p = ProbeServer(index);
  if (p.kind == Probe::kRefuses) {
    // A verdict on this process is marked here; any other is the caller's (a Call's timeout
    // stays one).
    if (RefusalCode(p.refusal) != StatusCode::kUnavailable) {
      MarkFailed(index, p.refusal);
    } else if (refusal != nullptr) {
      *refusal = p.refusal;
    }
  }
  return s.failed.load();
}

Pool::Impl::Probe Pool::Impl::ProbeServer(size_t index) {
  const ServerState& s = *servers_[index];
  const auto deadline =
      Clock::now() + std::min<Clock::duration>(options_.connect_timeout, kProbeTimeout);
  // A fresh connection can fail on its own (UCX may pick a lane over an interface that has just
  // gone): try again until the deadline. Each try has a worker of its own: new endpoints on a
  // worker whose connection to the same server has just failed leave UCX requests behind that
  // it asserts on when that worker is destroyed.
  // ... but not for long when every try fails: a server whose process is gone refuses each
  // connection at once, and in a replicated cluster its failover waits for this answer.
  for (int refused = 0; Clock::now() < deadline && refused < kProbeRefusals;) {
    auto worker = Worker::Create(*context_, false);
    if (!worker.ok()) break;
    control::ReplyBox box;
    if (!(*worker)->SetAmHandler(transport::kControlAm, &control::ReplyBox::OnMessage, &box).ok())
      break;
    auto ep = Endpoint::Connect(**worker, s.address.host, s.address.port, nullptr);
    if (!ep.ok()) break;  // the server's address does not resolve or accept: it is gone
    std::optional<Probe> why;
    // Not pinned again: the answer is all this hello is for.
    uint64_t next_id = 1;
    auto hello = Handshake(index, false, AskOn(index, **worker, box, **ep, next_id, deadline));
    if (hello.ok()) {
      why = Probe{Probe::kTakesUs, {}};
    } else if (hello.status().code() != StatusCode::kTimedOut && !(*ep)->failed()) {
      why = Probe{Probe::kRefuses, hello.status()};  // evicted us, or we refuse it
    }
    if (!why && (*ep)->failed()) ++refused;
    ep->reset();  // gracefully (forced if it failed), before its worker
    if (why) return *why;
  }
  return Probe{};
}

Result<size_t> Pool::Impl::IndexOf(uint16_t id) const {
  const uint16_t slot = index_of_[id].load(std::memory_order_acquire);
  if (slot == 0) {
    return Status::InvalidArgument("no server " + std::to_string(id) + " in the cluster (" +
                                   std::to_string(count()) + " servers)");
  }
  return size_t{slot} - 1;
}

// ------------------------------------------------------------------ control requests

Result<Pool::Impl::Reply> Pool::Impl::Call(
    ThreadContext& tc, size_t index, const std::function<std::vector<std::byte>(uint64_t)>& encode,
    wire::Opcode expected, std::chrono::milliseconds timeout, bool* moving) {
  ServerState& s = *servers_[index];
  // Failed before the request left (while this thread connected to it, its first use of it,
  // or meanwhile by another thread): where its region moved, it may go again.
  auto unsent = [&] {
    if (moving != nullptr && RegionsMove() && MovedTo(s) >= 0) *moving = true;
    return s.Failure();
  };
  if (s.failed) return unsent();
  auto peer = PeerOf(tc, index);
  if (!peer.ok()) return s.failed ? unsent() : peer.status();
  Endpoint* ep = *peer;
  if (ep->failed()) return ConnectionLost(tc, index);
  const uint64_t id = tc.next_request_id++;
  const auto deadline = Clock::now() + timeout;
  auto abandon = [&] { return s.failed.load(std::memory_order_relaxed); };
  std::vector<std::byte> request = encode(id);
  Status sent = ep->SendAm(transport::kControlAm, request, true, deadline, abandon);
  if (!sent.ok() && ep->failed()) return ConnectionLost(tc, index);
  if (!sent.ok()) return sent.WithContext(s.name);
  Status arrived = AwaitReply(tc, index, id, expected, deadline, timeout);
  if (arrived.code() == StatusCode::kTimedOut && expected != wire::Opcode::kGoodbyeReply) {
    // A server that evicted this process (stopped past the deadline meanwhile) says so to a
    // fresh hello: the timeout is that refusal. Else it stays a timeout, the caller's to judge.
    // (Not for a goodbye: best effort, at close.)
    AskWhy(index);
    if (s.failed.load() && !s.draining.load()) return s.Failure();
  }
  FARPOOL_RETURN_IF_ERROR(arrived);
  auto it = tc.box.replies.find(id);
  std::vector<std::byte> bytes = std::move(it->second);
  tc.box.replies.erase(it);
  if (control::IsMovingReply(bytes)) {
    Moving(index);
    if (moving != nullptr) *moving = true;
    return Status::Unavailable(s.name + ": " + std::string(wire::OpcodeName(expected)) +
                               " refused unexecuted: the server is being drained");
  }
  auto reply = control::TakeReply(s.name, std::move(bytes), expected);
  // A refusal of our tag (a request the server answered before it closed the connection).
  if (!reply.ok() && reply.status().code() == StatusCode::kEvicted) {
    MarkFailed(index, reply.status());
  }
  return reply;
}

void Pool::Impl::Moving(size_t index) {
  servers_[index]->draining.store(true);
  MarkFailed(index, "being drained: it refuses requests unexecuted and hands its regions over");
}

Status Pool::Impl::AwaitReply(ThreadContext& tc, size_t index, uint64_t id, wire::Opcode expected,
                              Clock::time_point deadline, std::chrono::milliseconds timeout) {
  ServerState& s = *servers_[index];
  Endpoint* ep = tc.peers[index].ep.get();
  for (;;) {
    if (tc.box.Arrived(id)) return Status::Ok();
    const bool progressed = tc.worker->Progress() != 0;
    if (ep->failed()) return ConnectionLost(tc, index);
    if (s.failed.load(std::memory_order_relaxed) && !s.draining.load(std::memory_order_relaxed)) {
      return s.Failure();
    }
    const auto now = Clock::now();
    if (now > deadline) {
      // The last progress may have delivered it: a reply that came is no timeout.
      if (tc.box.Arrived(id)) return Status::Ok();
      return Status::TimedOut(s.name + ": no " + std::string(wire::OpcodeName(expected)) +
                              " within " + std::to_string(timeout.count()) + " ms");
    }
    if (!progressed) {
      // Nothing to do until a message comes: sleep on the worker's event descriptor, waking
      // at least every kReplySleep to notice a server the monitor declared failed (a failed
      // wait only means we progress again sooner).
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      (void)tc.worker->Wait(std::min(left, kReplySleep));
    }
  }
}

Result<ServerStats> Pool::Impl::Stats(size_t index) {
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, Local());
  FARPOOL_ASSIGN_OR_RETURN(
      Reply r, Call(
                   *tc, index, [](uint64_t id) { return wire::Encode(id, wire::StatsRequest{0}); },
                   wire::Opcode::kStatsReply, options_.op_timeout));
  auto w = r.message.As<wire::StatsReply>();
  ServerStats st;
  st.id = w.server_id;
  st.endpoint = servers_[index]->address.Endpoint();
  st.clients = w.clients;
  st.capacity = w.capacity;
  st.leased = w.leased;
  st.largest_free = w.largest_free;
  st.chunk_size = w.chunk_size;
  st.requests_served = w.requests_served;
  st.rejected = w.rejected;
  st.auth_refused = w.auth_refused;
  st.pool_refused = w.pool_refused;
  st.uptime_ns = w.uptime_ns;
  st.pid = static_cast<int64_t>(w.server_pid);
  st.rss_private = w.rss_private;
  return st;
}

void Pool::Impl::Monitor() {
  auto worker = Worker::Create(*context_, true);
  if (!worker.ok()) return;  // without a monitor, failures are still seen by operations
  control::ReplyBox box;
  if (!(*worker)->SetAmHandler(transport::kControlAm, &control::ReplyBox::OnMessage, &box).ok())
    return;
  {
    std::lock_guard lock(monitor_mu_);
    monitor_worker_ = worker->get();
  }
  const auto timeout = options_.failure_timeout;
  const auto interval = std::max(std::chrono::milliseconds(20), timeout / 4);
  struct Watch {
    std::unique_ptr<Endpoint> ep;
    Clock::time_point last_answer;
  };
  // Every heartbeat in flight, by request id: any answer proves its server alive, even one
  // slower than the interval (a loaded host), not only the answer to the latest request.
  std::unordered_map<uint64_t, size_t> in_flight;
  std::vector<Watch> watch;
  uint64_t next_id = 1;
  // Watches the servers published since the last call: connects to them, then a hello
  // (with the challenge-response if we have a secret): the monitor's connections carry this
  // Pool's tag, so an eviction closes them too, and the monitor learns of it. Each hello waits
  // at most connect_timeout, as every thread's hello does.
  auto watch_new = [&] {
    const size_t from = watch.size();
    watch.resize(count());
    for (size_t i = from; i < watch.size(); ++i) {
      watch[i].last_answer = Clock::now();
      auto ep = Endpoint::Connect(**worker, servers_[i]->address.host, servers_[i]->address.port,
                                  nullptr);
      if (ep.ok()) watch[i].ep = std::move(*ep);
    }
    for (size_t i = from; i < watch.size() && !stop_monitor_.load(); ++i) {
      if (!watch[i].ep || servers_[i]->failed) continue;
      auto hello = Handshake(
          i, false,
          AskOn(i, **worker, box, *watch[i].ep, next_id, Clock::now() + options_.connect_timeout));
      watch[i].last_answer = Clock::now();
      if (hello.ok() || watch[i].ep->failed()) continue;  // a failed connection: noticed below
      std::string_view reason = hello.status().message();
      const std::string prefix = servers_[i]->name + ": ";
      if (reason.substr(0, prefix.size()) == prefix) reason.remove_prefix(prefix.size());
      if (hello.status().code() == StatusCode::kTimedOut) {
        Lost(i, std::string(reason), /*wait=*/false);  // unanswered: asked why first
      } else {
        MarkFailed(i, std::string(reason), RefusalCode(hello.status()));
      }
    }
  };
  watch_new();
  auto next_round = Clock::now();
  auto last_round = next_round;
  while (!stop_monitor_.load()) {
    if (watch.size() < count()) watch_new();  // servers learned from the map
    while ((*worker)->Progress() != 0) {
    }
    for (auto& [id, bytes] : box.replies) {
      auto it = in_flight.find(id);
      if (it != in_flight.end()) {
        watch[it->second].last_answer = Clock::now();
        // Heartbeats and the hello fail only if the server refuses us (evicted).
        auto m = wire::Decode(bytes);
        if (m.ok() && m->opcode == wire::Opcode::kErrorReply) {
          MarkFailed(it->second, wire::DecodeError(*m));
        }
        in_flight.erase(it);
      }
    }
    box.replies.clear();
    const auto now = Clock::now();
    // In a replicated cluster a connection that failed is acted on at once, not at the next
    // round: the failover waits for it. (Elsewhere not: each probe creates and destroys a UCX
    // worker, and churn of them raced UCX 1.13's async handlers at teardown.)
    for (size_t i = 0; i < watch.size() && cluster_.replicas > 0; ++i) {
      if (!servers_[i]->failed && watch[i].ep && watch[i].ep->failed()) {
        Lost(i, "connection lost", /*wait=*/false);
      }
    }
    if (now >= next_round) {
      if (now - last_round > timeout) {
        // This process itself did not run for longer than the timeout (stopped, or starved):
        // silence meanwhile says nothing about the servers; give each a fresh round.
        for (Watch& w : watch) w.last_answer = now;
      }
      last_round = now;
      next_round = now + interval;
      for (size_t i = 0; i < watch.size(); ++i) {
        if (servers_[i]->failed) continue;
        Watch& w = watch[i];
        if (!w.ep) {
          MarkFailed(i, "connection lost");
          continue;
        }
        if (w.ep->failed()) {
          Lost(i, "connection lost", /*wait=*/false);
          continue;
        }
        if (now - w.last_answer > timeout) {
          // Silence on one connection is a suspicion, not a verdict (it cannot be taken back):
          // a hello on a fresh connection decides. A live server that was only slow, or a
          // connection of ours that stalled, answers it and is watched on.
          Probe p = ProbeServer(i);
          if (p.kind == Probe::kTakesUs) {
            w.last_answer = Clock::now();
            ++suspicions_cleared_;
            continue;
          }
          if (p.kind == Probe::kRefuses) {
            MarkFailed(i, p.refusal);
            continue;
          }
          MarkFailed(i, "no answer to heartbeats for " + std::to_string(timeout.count()) +
                            " ms, nor to a hello on a fresh connection");
          continue;
        }
        const uint64_t id = next_id++;
        in_flight[id] = i;
        Status s = transport::PostAm(w.ep->get(), transport::kControlAm,
                                     wire::Encode(id, wire::StatsRequest{0}), true);
        if (!s.ok()) Lost(i, "posting a heartbeat: " + s.message(), /*wait=*/false);
      }
    }
    Status s = (*worker)->Wait(std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(Clock::duration::zero(), next_round - Clock::now())));
    (void)s;  // a failed wait only makes the next round come sooner
  }
  for (Watch& w : watch) {
    if (w.ep) w.ep->ForceClose();
  }
  std::lock_guard lock(monitor_mu_);
  monitor_worker_ = nullptr;
}

// ------------------------------------------------------------------ data path

Result<Pool::Impl::Target> Pool::Impl::Resolve(GlobalAddress address, uint64_t size, const char* op,
                                               bool atomic, bool changes) {
  if (address.is_null()) return Status::InvalidArgument(std::string(op) + " at the null address");
  const uint16_t id = address.server();
  const uint16_t slot = index_of_[id].load(std::memory_order_acquire);
  if (slot == 0) {
    return Status::InvalidArgument(std::string(op) + " at " + address.ToString() + ": no server " +
                                   std::to_string(id) + " in the cluster");
  }
  const size_t index = size_t{slot} - 1;
  ServerState& s = *servers_[index];
  const uint64_t offset = address.offset();
  if (size > s.region_size || offset > s.region_size - size) {
    return Status::InvalidArgument(s.name + ": " + op + " of " + std::to_string(size) +
                                   " bytes at " + address.ToString() + " is beyond the region (" +
                                   FormatSize(s.region_size) + ")");
  }
  if (atomic && offset % 8 != 0) {
    return Status::InvalidArgument(s.name + ": " + op + " at " + address.ToString() +
                                   " is not 8-byte aligned");
  }
  Status live = allocator_->CheckLive(index, offset, size);
  if (!live.ok()) return live.WithContext(s.name + ": " + op);
  if (s.failed.load(std::memory_order_relaxed)) {
    const int moved = MovedTo(s);
    if (moved < 0) return s.Failure();
    const ServerState& b = *servers_[static_cast<size_t>(moved)];
    if (b.failed.load(std::memory_order_relaxed)) return b.Failure();
    if (KeepsMapping(s, b)) return Target{index, s.region_base + offset, s.direct + offset, false};
    // Failed over: its backup serves it from the mirror, in messages (its checks apply).
    const uint64_t slot = static_cast<uint64_t>(s.moved_slot.load());
    return Target{static_cast<size_t>(moved), b.region_base + b.region_size * (1 + slot) + offset,
                  nullptr, true};
  }
  // Replicated: a change goes through the server, which forwards it to the backup before it
  // answers; a mapped store or a one-sided put would bypass both. Unless the backup shares the
  // server's pages (kHelloSharedPages): then a mapped store is on the backup as it lands.
  const bool shared = s.direct != nullptr && (s.hello_flags & wire::kHelloSharedPages) != 0;
  const bool bypass = changes && cluster_.replicas > 0 && !shared;
  return Target{index, s.region_base + offset, s.direct && !bypass ? s.direct + offset : nullptr,
                s.messages || bypass};
}

Result<Pool::Impl::Target> Pool::Impl::Aim(ThreadContext& tc, GlobalAddress address, uint64_t size,
                                           const char* op, bool atomic, bool changes) {
  for (int tries = 0;; ++tries) {
    FARPOOL_ASSIGN_OR_RETURN(Target t, Resolve(address, size, op, atomic, changes));
    if (t.direct != nullptr) return t;
    auto ep = PeerOf(tc, t.index);
    if (ep.ok()) return t;
    const ServerState& s = *servers_[t.index];
    if (tries == kMaxResends || !RegionsMove() || !s.failed.load() || MovedTo(s) < 0) {
      return ep.status();
    }
  }
}

Status Pool::Impl::Complete(ThreadContext& tc, size_t index, ucs_status_ptr_t request,
                            const char* what) {
  ServerState& s = *servers_[index];
  bool pending = false;
  Status st = tc.worker->WaitRequest(
      request, Clock::now() + options_.op_timeout,
      [&] { return s.failed.load(std::memory_order_relaxed); }, what, &pending);
  if (st.ok()) return st;
  if (st.code() == StatusCode::kTimedOut || st.code() == StatusCode::kUnavailable) {
    // The server is gone, stuck, or evicted us: no later call may wait on it again. (Abandoned
    // because another thread marked it failed: Lost does nothing.)
    Lost(index, st.code() == StatusCode::kTimedOut
                    ? std::string(what) + " timed out after " +
                          std::to_string(options_.op_timeout.count()) + " ms"
                    : st.message());
    // Completes every request still pending on the endpoint, with an error.
    if (tc.peers[index].ep) tc.peers[index].ep->ForceClose();
    if (pending) tc.worker->FinishAbandoned(request);
    return s.Failure().WithContext(what);
  }
  return st.WithContext(s.name);
}

Status Pool::Impl::Flush(ThreadContext& tc, size_t index) {
  ucp_request_param_t p{};
  Endpoint& ep = *tc.peers[index].ep;
  if (ep.failed()) return servers_[index]->Failure();
  return Complete(tc, index, ucp_ep_flush_nbx(ep.get(), &p), "flush");
}

namespace {

// Posts one UCX operation. `result`/`operand` must stay valid until it completes.
ucs_status_ptr_t PostRead(ThreadContext::Peer& peer, void* dst, uint64_t size, uint64_t remote) {
  ucp_request_param_t p{};
  return ucp_get_nbx(peer.ep->get(), dst, size, remote, peer.rkey->get(), &p);
}
ucs_status_ptr_t PostWrite(ThreadContext::Peer& peer, const void* src, uint64_t size,
                           uint64_t remote) {
  ucp_request_param_t p{};
  return ucp_put_nbx(peer.ep->get(), src, size, remote, peer.rkey->get(), &p);
}
ucs_status_ptr_t PostAtomic(ThreadContext::Peer& peer, ucp_atomic_op_t op, const uint64_t* operand,
                            uint64_t* result, uint64_t remote) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  p.datatype = ucp_dt_make_contig(sizeof(uint64_t));
  p.reply_buffer = result;
  return ucp_atomic_op_nbx(peer.ep->get(), op, operand, 1, remote, peer.rkey->get(), &p);
}

uint64_t DirectCas(std::byte* p, uint64_t expected, uint64_t desired) {
  __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(p), &expected, desired, false,
                              __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;  // the previous value either way
}
uint64_t DirectFetchAdd(std::byte* p, uint64_t delta) {
  return __atomic_fetch_add(reinterpret_cast<uint64_t*>(p), delta, __ATOMIC_SEQ_CST);
}
}  // namespace

// ------------------------------------------------------------------ Pool

Pool::Pool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pool::~Pool() = default;

Result<std::unique_ptr<Pool>> Pool::Connect(const ClusterConfig& cluster,
                                            const PoolOptions& options) {
  if (cluster.servers.empty()) return Status::InvalidArgument("the cluster has no servers");
  auto impl = std::make_unique<Impl>();
  FARPOOL_RETURN_IF_ERROR(impl->Init(cluster, options));
  return std::unique_ptr<Pool>(new Pool(std::move(impl)));
}

Result<RemoteAccess> ParseRemoteAccess(std::string_view text) {
  if (text == "auto") return RemoteAccess::kAuto;
  if (text == "one-sided") return RemoteAccess::kOneSided;
  if (text == "messages") return RemoteAccess::kMessages;
  return Status::InvalidArgument("unknown remote access '" + std::string(text) +
                                 "' (expected auto, one-sided or messages)");
}

Fabric Pool::transport() const { return impl_->fabric_; }

uint32_t Pool::process_tag() const { return impl_->tag(); }

bool Pool::replicated() const { return impl_->cluster_.replicas > 0; }

Status Pool::Evict(uint32_t tag, std::chrono::milliseconds timeout) {
  const std::string what = "evicting process tag " + TagName(tag);
  if (tag == 0) return Status::InvalidArgument(what + ": no process has tag 0");
  if (tag == process_tag()) {
    return Status::InvalidArgument(what + ": that is this Pool's own tag");
  }
  if (LiveInThisProcess(tag)) {
    return Status::InvalidArgument(what +
                                   ": that is another live Pool of this process, which may map "
                                   "the servers' memory (a server would kill this process)");
  }
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, impl_->Local());
  const auto deadline = Clock::now() + timeout;
  // The servers never wait for a killed process to exit: ask each again until it has. A server
  // whose region the cluster map moved to its backup is skipped: it is gone, or cut off and
  // serving nothing since before the move (docs/pool.md "How the epoch fences a partitioned
  // old primary"), and the server that serves the region now is asked like any other. Asked,
  // it failed every eviction after a failover: the fencer retried for ever and never fenced.
  std::vector<size_t> pending;
  for (size_t i = 0; i < impl_->count(); ++i) {
    const ServerState& s = *impl_->servers_[i];
    if (!(s.failed.load() && s.moved_to.load() >= 0)) pending.push_back(i);
  }
  for (;;) {
    std::vector<size_t> left;
    for (size_t index : pending) {
      const ServerState& s = *impl_->servers_[index];
      auto r = impl_->Call(
          *tc, index, [&](uint64_t id) { return wire::Encode(id, wire::EvictRequest{tag}); },
          wire::Opcode::kEvictReply, impl_->options_.op_timeout);
      if (!r.ok()) {
        if (r.status().code() == StatusCode::kInvalidArgument) return r.status().WithContext(what);
        return Status::Unavailable(what + ": " + r.status().message());
      }
      const auto reply = r->message.As<wire::EvictReply>();
      if ((reply.flags & wire::kEvictKilled) && !(reply.flags & wire::kEvictExited)) {
        if (Clock::now() > deadline) {
          return Status::Unavailable(what + ": " + s.name + ": the process was sent SIGKILL " +
                                     "but has not exited within " +
                                     std::to_string(timeout.count()) + " ms");
        }
        left.push_back(index);
      }
    }
    if (left.empty()) return Status::Ok();
    pending = std::move(left);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::vector<uint16_t> Pool::server_ids() const {
  std::vector<uint16_t> ids;
  for (size_t i = 0; i < impl_->count(); ++i) ids.push_back(impl_->servers_[i]->address.id);
  return ids;
}

GlobalAddress Pool::RootArea(uint16_t id) const {
  auto index = impl_->IndexOf(id);
  if (!index.ok()) return Root(id);
  return GlobalAddress(id, impl_->servers_[*index]->root_offset + Root(id).offset());
}

Result<uint64_t> Pool::Impl::LeaseOn(size_t index, uint64_t size) {
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * t, Local());
  // A lease the server refused unexecuted (drained) goes again to where the map moved it; one
  // whose outcome is unknown does not (it may have leased a chunk nobody would release).
  for (int resends = 0;; ++resends) {
    const auto [to, mirror] = ControlTarget(index);
    bool moving = false;
    auto r = Call(
        *t, to,
        [&, mirror = mirror](uint64_t id) {  // a structured binding: clang < 16 cannot capture it
          return wire::Encode(id, wire::LeaseRequest{size, mirror, 0});
        },
        wire::Opcode::kLeaseReply, options_.op_timeout, &moving);
    if (r.ok()) return r->message.As<wire::LeaseReply>().offset;
    if (!moving || resends == kMaxResends) return r.status();
    Bump(t->resent);
  }
}

Status Pool::Impl::ReleaseOn(size_t index, uint64_t offset, uint64_t size) {
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * t, Local());
  // As LeaseOn: never resent after an unknown outcome (a second release could free a lease
  // someone took in between).
  for (int resends = 0;; ++resends) {
    const auto [to, mirror] = ControlTarget(index);
    bool moving = false;
    auto r = Call(
        *t, to,
        [&, mirror = mirror](uint64_t id) {  // a structured binding: clang < 16 cannot capture it
          return wire::Encode(id, wire::ReleaseRequest{offset, size, mirror, 0});
        },
        wire::Opcode::kReleaseReply, options_.op_timeout, &moving);
    if (r.ok()) return Status::Ok();
    if (!moving || resends == kMaxResends) return r.status();
    Bump(t->resent);
  }
}

std::pair<size_t, uint32_t> Pool::Impl::ControlTarget(size_t index) const {
  const ServerState& s = *servers_[index];
  if (!s.failed.load()) return {index, 0};
  const int moved = MovedTo(s);
  return moved < 0
             ? std::pair<size_t, uint32_t>{index, 0}
             : std::pair<size_t, uint32_t>{static_cast<size_t>(moved), uint32_t{s.address.id} + 1};
}

std::string Pool::AccessPath(uint16_t id) const {
  auto index = impl_->IndexOf(id);
  if (!index.ok()) return "none";
  const ServerState& s = *impl_->servers_[*index];
  return s.direct != nullptr ? "direct" : s.messages ? "messages" : "one-sided";
}

Result<GlobalAddress> Pool::Alloc(uint64_t size, Placement placement) {
  if (size == 0) return Status::InvalidArgument("Alloc of 0 bytes");
  Impl& im = *impl_;
  auto on = [&](size_t index) -> Result<GlobalAddress> {
    const ServerState& s = *im.servers_[index];
    // A failed-over server's data lives on at its backup: objects still come from the chunks
    // this Pool leased there before; a new chunk cannot be leased (LeaseOn fails).
    if (s.failed && im.MovedTo(s) < 0) return s.Failure();
    im.ConnectFor(index);
    auto offset = im.allocator_->Allocate(index, size);
    if (!offset.ok()) {
      if (offset.status().message().rfind("server ", 0) == 0) return offset.status();
      return offset.status().WithContext(s.name);
    }
    return GlobalAddress(s.address.id, *offset);
  };
  switch (placement.kind()) {
    case Placement::Kind::kOnServer: {
      FARPOOL_ASSIGN_OR_RETURN(size_t index, im.IndexOf(static_cast<uint16_t>(placement.value())));
      return on(index);
    }
    case Placement::Kind::kByKey:
      return on(static_cast<size_t>(
          JumpConsistentHash(placement.value(), static_cast<int32_t>(im.count()))));
    case Placement::Kind::kStriped: {
      const size_t n = im.count();
      const size_t start = im.stripe_.fetch_add(1, std::memory_order_relaxed) % n;
      Status last;
      for (size_t k = 0; k < n; ++k) {
        auto r = on((start + k) % n);
        if (r.ok()) return r;
        last = r.status();
        if (r.status().code() != StatusCode::kOutOfMemory &&
            r.status().code() != StatusCode::kUnavailable) {
          return r;
        }
      }
      if (last.code() == StatusCode::kUnavailable) return last;
      uint64_t capacity = 0, free = 0;
      for (size_t i = 0; i < n; ++i) {
        auto st = im.Stats(i);
        if (!st.ok()) continue;
        capacity += st->capacity;
        free += st->capacity - st->leased;
      }
      return Status::OutOfMemory("pool full: cannot allocate " + FormatSize(size) + " on any of " +
                                 std::to_string(n) + " servers; " + FormatSize(free) + " free of " +
                                 FormatSize(capacity) + " (last: " + last.message() + ")");
    }
  }
  return Status::Internal("unknown placement");
}

Status Pool::Free(GlobalAddress address) {
  if (address.is_null()) return Status::InvalidArgument("Free of the null address");
  FARPOOL_ASSIGN_OR_RETURN(size_t index, impl_->IndexOf(address.server()));
  const ServerState& s = *impl_->servers_[index];
  impl_->ConnectFor(index);
  return impl_->allocator_->Free(index, address.offset())
      .WithContext(s.name + ": Free(" + address.ToString() + ")");
}

Status Pool::Trim() {
  // Its releases go to every server, under the allocator's lock: no connection set-up there.
  if (auto tc = impl_->Local(); tc.ok()) impl_->ConnectEvery(**tc);
  return impl_->allocator_->Trim();
}

static_assert(RegionGeometry::kRootAreaSize == wire::kRootAreaSize);

Result<GlobalAddress> Pool::LeaseRun(uint16_t id, uint64_t size) {
  FARPOOL_ASSIGN_OR_RETURN(size_t index, impl_->IndexOf(id));
  const ServerState& s = *impl_->servers_[index];
  if (s.failed && impl_->MovedTo(s) < 0) return s.Failure();  // failed over: at its backup
  if (size == 0 || size % s.chunk_size != 0) {
    return Status::InvalidArgument(s.name + ": LeaseRun of " + std::to_string(size) +
                                   " bytes, not a positive multiple of the chunk size " +
                                   std::to_string(s.chunk_size));
  }
  auto offset = impl_->LeaseOn(index, size);
  if (!offset.ok()) {
    if (offset.status().message().rfind("server ", 0) == 0) return offset.status();
    return offset.status().WithContext(s.name);
  }
  return GlobalAddress(id, *offset);
}

Status Pool::ReleaseRun(GlobalAddress start, uint64_t size) {
  FARPOOL_ASSIGN_OR_RETURN(size_t index, impl_->IndexOf(start.server()));
  return impl_->ReleaseOn(index, start.offset(), size)
      .WithContext(impl_->servers_[index]->name + ": ReleaseRun(" + start.ToString() + ")");
}

Result<RegionGeometry> Pool::Geometry(uint16_t id) const {
  FARPOOL_ASSIGN_OR_RETURN(size_t index, impl_->IndexOf(id));
  const ServerState& s = *impl_->servers_[index];
  return RegionGeometry{s.region_size, s.chunk_size};
}

Result<uint16_t> Pool::ServerFor(Placement placement) {
  Impl& im = *impl_;
  switch (placement.kind()) {
    case Placement::Kind::kOnServer: {
      FARPOOL_ASSIGN_OR_RETURN(size_t index, im.IndexOf(static_cast<uint16_t>(placement.value())));
      return im.servers_[index]->address.id;
    }
    case Placement::Kind::kByKey:
      return im
          .servers_[static_cast<size_t>(
              JumpConsistentHash(placement.value(), static_cast<int32_t>(im.count())))]
          ->address.id;
    case Placement::Kind::kStriped:
      return im.servers_[im.stripe_.fetch_add(1, std::memory_order_relaxed) % im.count()]
          ->address.id;
  }
  return Status::Internal("unknown placement");
}

namespace {
// A sync operation on a server whose region is not mapped: a batch of one, the calling
// thread's ThreadContext::alone unless that is in use (or the thread has no context: then the
// Batch reports why).
template <typename Post>
Status RunAlone(Pool& pool, ThreadContext* tc, const Post& post) {
  if (tc == nullptr || tc->alone_busy) {
    Batch batch(pool);
    FARPOOL_RETURN_IF_ERROR(post(batch));
    return batch.Wait();
  }
  if (!tc->alone) tc->alone = std::make_unique<Batch>(pool);
  tc->alone_busy = true;
  const Status posted = post(*tc->alone);
  const Status done = tc->alone->Wait();  // also after a failed post: the batch is reused
  tc->alone_busy = false;
  return posted.ok() ? done : posted;
}
}  // namespace

Status Pool::Read(GlobalAddress source, void* destination, uint64_t size) {
  FARPOOL_ASSIGN_OR_RETURN(Impl::Target t, impl_->Resolve(source, size, "read", false, false));
  if (t.direct == nullptr) {
    return RunAlone(*this, impl_->LocalOrNull(),
                    [&](Batch& b) { return b.Read(source, destination, size); });
  }
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, impl_->Local());
  Bump(tc->reads);
  Bump(tc->bytes_read, size);
  FarRead(destination, t.direct, size);
  return Status::Ok();
}

Status Pool::Write(GlobalAddress destination, const void* source, uint64_t size) {
  FARPOOL_ASSIGN_OR_RETURN(Impl::Target t, impl_->Resolve(destination, size, "write", false, true));
  if (t.direct == nullptr) {
    return RunAlone(*this, impl_->LocalOrNull(),
                    [&](Batch& b) { return b.Write(destination, source, size); });
  }
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, impl_->Local());
  Bump(tc->writes);
  Bump(tc->bytes_written, size);
  FarWrite(t.direct, source, size);
  return Status::Ok();
}

Result<uint64_t> Pool::CompareAndSwap(GlobalAddress address, uint64_t expected, uint64_t desired) {
  FARPOOL_ASSIGN_OR_RETURN(Impl::Target t,
                           impl_->Resolve(address, 8, "compare-and-swap", true, true));
  uint64_t previous = 0;
  if (t.direct == nullptr) {
    FARPOOL_RETURN_IF_ERROR(RunAlone(*this, impl_->LocalOrNull(), [&](Batch& b) {
      return b.CompareAndSwap(address, expected, desired, &previous);
    }));
    return previous;
  }
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, impl_->Local());
  Bump(tc->cas);
  return DirectCas(t.direct, expected, desired);
}

Result<uint64_t> Pool::FetchAdd(GlobalAddress address, uint64_t delta) {
  FARPOOL_ASSIGN_OR_RETURN(Impl::Target t, impl_->Resolve(address, 8, "fetch-and-add", true, true));
  uint64_t previous = 0;
  if (t.direct == nullptr) {
    FARPOOL_RETURN_IF_ERROR(RunAlone(*this, impl_->LocalOrNull(), [&](Batch& b) {
      return b.FetchAdd(address, delta, &previous);
    }));
    return previous;
  }
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, impl_->Local());
  Bump(tc->faa);
  return DirectFetchAdd(t.direct, delta);
}

Status Pool::ConnectThread() {
  FARPOOL_ASSIGN_OR_RETURN(ThreadContext * tc, impl_->Local());
  impl_->ConnectEvery(*tc);
  return Status::Ok();
}

Result<ServerStats> Pool::Stats(uint16_t id) {
  FARPOOL_ASSIGN_OR_RETURN(size_t index, impl_->IndexOf(id));
  return impl_->Stats(index);
}

OpCounters Pool::counters() const {
  OpCounters c;
  std::lock_guard lock(impl_->contexts_mu_);
  for (const auto& [id, tc] : impl_->contexts_) {
    c.reads += tc->reads.load(std::memory_order_relaxed);
    c.writes += tc->writes.load(std::memory_order_relaxed);
    c.cas += tc->cas.load(std::memory_order_relaxed);
    c.faa += tc->faa.load(std::memory_order_relaxed);
    c.bytes_read += tc->bytes_read.load(std::memory_order_relaxed);
    c.bytes_written += tc->bytes_written.load(std::memory_order_relaxed);
    c.round_trips += tc->round_trips.load(std::memory_order_relaxed);
    c.messages += tc->messages.load(std::memory_order_relaxed);
    c.resent += tc->resent.load(std::memory_order_relaxed);
    c.connects += tc->connects.load(std::memory_order_relaxed);
  }
  c.suspicions_cleared = impl_->suspicions_cleared_.load(std::memory_order_relaxed);
  c.maps_watched = impl_->maps_watched_.load(std::memory_order_relaxed);
  c.maps_polled = impl_->maps_polled_.load(std::memory_order_relaxed);
  return c;
}

// ------------------------------------------------------------------ Batch

// An operation as it was posted: what Drain needs to post it again at the region's new server
// after its server refused it unexecuted (MovingReply) or, for a read, lost it (see the file
// comment). The caller keeps the buffers valid until Wait returns, so they still are.
struct Batch::Replay {
  memory_ops::OpKind kind = memory_ops::OpKind::kRead;
  GlobalAddress address;
  void* into = nullptr;        // read: destination; lookup-read: the record
  const void* from = nullptr;  // write: source
  uint64_t size = 0;           // read, write: bytes; lookup-read: the record's bytes
  // compare-and-swap, wait-compare-and-swap: expected, desired; fetch-and-add: delta;
  // lookup-read: key; insert-if-absent: lock word, key, value; lookup-lock-read: key, held
  // mask, lock word.
  uint64_t a = 0, b = 0, c = 0;
  void* result = nullptr;    // uint64_t* previous, LookupResult*, InsertResult*, WaitCasResult*,
                             // LockReadResult*
  LookupSpec spec{};         // lookup-read, insert-if-absent, lookup-lock-read
  uint32_t lock_offset = 0;  // insert-if-absent, lookup-lock-read
  WaitSpec wait{};           // wait-compare-and-swap
  // Changes nothing: may run twice.
  bool reads() const {
    return kind == memory_ops::OpKind::kRead || kind == memory_ops::OpKind::kLookupRead;
  }
};

struct Batch::State {
  // A one-sided UCX operation in flight; plain reads keep how to post them again.
  struct Pending {
    ucs_status_ptr_t request = nullptr;
    size_t index = 0;
    const char* what = "";
    uint64_t operand = 0;
    uint64_t result = 0;
    uint64_t* out = nullptr;
    std::optional<Replay> read;
  };
  using Sink = BatchSink;
  // A lookup-read over one-sided access: its first bucket, read by a get and scanned at Wait.
  struct OneSidedLookup {
    std::vector<std::byte> bucket;
    memory_ops::LookupParams params;
    uint64_t key = 0;
    LookupResult* result = nullptr;
  };
  struct Message {
    size_t index = 0;
    memory_ops::RequestBuilder request;
    std::vector<Sink> sinks;
    std::vector<Replay> ops;  // as posted, in request order
    uint64_t request_id = 0;
    BatchLanding landing;  // registered while the message is in flight (Drain)
  };

  Message& Open(size_t index) { return messages[static_cast<size_t>(open[index])]; }
  // Forgets the messages (sent and completed, or posted) and their per-server bookkeeping.
  void ClearMessages() {
    messages.clear();
    std::fill(open.begin(), open.end(), -1);
    std::fill(message_count.begin(), message_count.end(), 0);
    std::fill(one_sided.begin(), one_sided.end(), 0);
    std::fill(fenced.begin(), fenced.end(), 0);
  }

  ThreadContext* tc = nullptr;
  Status context_error;
  std::deque<Pending> pending;         // deque: operand/result addresses stay put while posted
  std::deque<OneSidedLookup> lookups;  // deque: bucket buffers stay put while posted
  // Wait-compare-and-swaps whose `swapped` is decided at Drain from the previous value.
  struct WaitOutcome {
    WaitCasResult* result;
    uint64_t expected;
    memory_ops::WaitParams params;  // one-sided: flags 0 (a plain compare-and-swap)
  };
  std::vector<WaitOutcome> wait_outcomes;
  std::vector<uint8_t> wrote;     // per server index: a one-sided write was posted (flush)
  std::vector<Message> messages;  // sent at Wait()
  // Per server index: the message being filled (or -1), the batch's messages to it, whether
  // one-sided operations to it are pending, and whether its open message holds operations
  // from before a Fence (a second message could overtake them).
  std::vector<int> open;
  std::vector<uint32_t> message_count;
  std::vector<uint8_t> one_sided;
  std::vector<uint8_t> fenced;
  Status error;  // of a drain inside Fence or a post, returned again by Wait
  size_t posted = 0;
};

Batch::Batch(Pool& pool) : pool_(*pool.impl_), state_(std::make_unique<State>()) {
  auto tc = pool_.Local();
  if (tc.ok()) {
    state_->tc = *tc;
  } else {
    state_->context_error = tc.status();
  }
  const size_t n = pool_.count();
  state_->wrote.assign(n, 0);
  state_->open.assign(n, -1);
  state_->message_count.assign(n, 0);
  state_->one_sided.assign(n, 0);
  state_->fenced.assign(n, 0);
}

Batch::~Batch() {
  Status s = Wait();
  (void)s;  // the caller did not ask; completing the requests is what matters here
}

size_t Batch::posted() const { return state_->posted; }

Status Batch::Route(size_t index) {
  State& st = *state_;
  if (index >= st.open.size()) {  // a server the Pool learned after this batch began
    const size_t n = pool_.count();
    st.wrote.resize(n, 0);
    st.open.resize(n, -1);
    st.message_count.resize(n, 0);
    st.one_sided.resize(n, 0);
    st.fenced.resize(n, 0);
  }
  if (index < st.tc->peers.size() && st.tc->peers[index].ep) return Status::Ok();
  return pool_.PeerOf(*st.tc, index).status();
}

Status Batch::Repost(const Replay& r) {
  using K = memory_ops::OpKind;
  switch (r.kind) {
    case K::kRead:
      return Read(r.address, r.into, r.size);
    case K::kWrite:
      return Write(r.address, r.from, r.size);
    case K::kCompareAndSwap:
      return CompareAndSwap(r.address, r.a, r.b, static_cast<uint64_t*>(r.result));
    case K::kFetchAdd:
      return FetchAdd(r.address, r.a, static_cast<uint64_t*>(r.result));
    case K::kLookupRead:
      return LookupRead(r.address, r.spec, r.a, r.into, static_cast<uint32_t>(r.size),
                        static_cast<LookupResult*>(r.result));
    case K::kInsertIfAbsent:
      return InsertIfAbsent(r.address, r.spec, r.lock_offset, r.a, r.b, r.c,
                            static_cast<InsertResult*>(r.result));
    case K::kWaitCompareAndSwap:
      return WaitCompareAndSwap(r.address, r.a, r.b, r.wait, static_cast<WaitCasResult*>(r.result));
    case K::kLookupLockRead:
      return LookupLockRead(r.address, r.spec, r.a, r.lock_offset, r.b, r.c, r.into,
                            static_cast<uint32_t>(r.size), static_cast<LockReadResult*>(r.result));
  }
  return Status::Internal("an operation of unknown kind to post again");
}

namespace {
// Whether an operation of `size` bytes on a target whose server takes batch messages
// (Target::messages) travels inside the message. Larger writes are split into pieces that do
// (Batch::Write); larger reads are one-sided, except for a pool's client, which has no key
// (Batch::Read splits them).
bool InMessage(bool messages, uint64_t size) {
  return messages && size <= memory_ops::kMaxInlineBytes;
}

}  // namespace

Status Batch::Read(GlobalAddress source, void* destination, uint64_t size) {
  FARPOOL_RETURN_IF_ERROR(state_->context_error);
  FARPOOL_ASSIGN_OR_RETURN(Pool::Impl::Target t,
                           pool_.Aim(*state_->tc, source, size, "read", false, false));
  if (t.direct == nullptr) FARPOOL_RETURN_IF_ERROR(Route(t.index));
  if (t.direct == nullptr && t.messages && !InMessage(t.messages, size) &&
      pool_.servers_[t.index]->keyless) {
    // Without a key (a pool's client) a large read goes in pieces in messages too.
    for (uint64_t at = 0; at < size; at += memory_ops::kMaxInlineBytes) {
      FARPOOL_RETURN_IF_ERROR(Read(source + at, static_cast<std::byte*>(destination) + at,
                                   std::min(memory_ops::kMaxInlineBytes, size - at)));
    }
    return Status::Ok();
  }
  if (t.direct == nullptr && InMessage(t.messages, size)) {
    FARPOOL_RETURN_IF_ERROR(
        Reserve(t.index, static_cast<uint8_t>(memory_ops::OpKind::kRead), size));
  }
  ThreadContext& tc = *state_->tc;
  Bump(tc.reads);
  Bump(tc.bytes_read, size);
  ++state_->posted;
  if (t.direct != nullptr) {
    FarRead(destination, t.direct, size);
    return Status::Ok();
  }
  if (InMessage(t.messages, size)) {
    auto& m = state_->Open(t.index);
    m.request.Read(t.remote - pool_.servers_[t.index]->region_base, static_cast<uint32_t>(size));
    m.sinks.push_back({destination, size, nullptr});
    m.ops.push_back(
        {.kind = memory_ops::OpKind::kRead, .address = source, .into = destination, .size = size});
    return Status::Ok();
  }
  state_->one_sided[t.index] = 1;
  auto& p = state_->pending.emplace_back();
  p.index = t.index;
  p.what = "read";
  p.read = Replay{
      .kind = memory_ops::OpKind::kRead, .address = source, .into = destination, .size = size};
  p.request = PostRead(tc.peers[t.index], destination, size, t.remote);
  return Status::Ok();
}

Status Batch::Write(GlobalAddress destination, const void* source, uint64_t size) {
  FARPOOL_RETURN_IF_ERROR(state_->context_error);
  FARPOOL_ASSIGN_OR_RETURN(Pool::Impl::Target t,
                           pool_.Aim(*state_->tc, destination, size, "write", false, true));
  if (t.direct == nullptr) FARPOOL_RETURN_IF_ERROR(Route(t.index));
  if (t.direct == nullptr && t.messages && !InMessage(t.messages, size)) {
    // Pieces in messages, all sent at Wait: over TCP a one-sided put is emulated by the
    // server's progress and was 1.4-2.3x slower than messages (6x on a loaded host). Large
    // reads stay one-sided: in messages they were faster alone but 2.5x slower through the
    // FUSE mount (docs/pool.md).
    for (uint64_t at = 0; at < size; at += memory_ops::kMaxInlineBytes) {
      FARPOOL_RETURN_IF_ERROR(Write(destination + at, static_cast<const std::byte*>(source) + at,
                                    std::min(memory_ops::kMaxInlineBytes, size - at)));
    }
    return Status::Ok();
  }
  if (t.direct == nullptr && InMessage(t.messages, size)) {
    FARPOOL_RETURN_IF_ERROR(
        Reserve(t.index, static_cast<uint8_t>(memory_ops::OpKind::kWrite), size));
  }
  ThreadContext& tc = *state_->tc;
  Bump(tc.writes);
  Bump(tc.bytes_written, size);
  ++state_->posted;
  if (t.direct != nullptr) {
    FarWrite(t.direct, source, size);
    return Status::Ok();
  }
  if (InMessage(t.messages, size)) {
    auto& m = state_->Open(t.index);
    m.request.Write(t.remote - pool_.servers_[t.index]->region_base, source,
                    static_cast<uint32_t>(size));
    m.ops.push_back(
        {.kind = memory_ops::OpKind::kWrite, .address = destination, .from = source, .size = size});
    return Status::Ok();
  }
  state_->one_sided[t.index] = 1;
  auto& p = state_->pending.emplace_back();
  p.index = t.index;
  p.what = "write";
  p.request = PostWrite(tc.peers[t.index], source, size, t.remote);
  state_->wrote[t.index] = 1;
  return Status::Ok();
}

Status Batch::CompareAndSwap(GlobalAddress address, uint64_t expected, uint64_t desired,
                             uint64_t* previous) {
  return Atomic(address, /*cas=*/true, expected, desired, previous);
}

Status Batch::FetchAdd(GlobalAddress address, uint64_t delta, uint64_t* previous) {
  return Atomic(address, /*cas=*/false, delta, 0, previous);
}

Status Batch::Atomic(GlobalAddress address, bool cas, uint64_t operand, uint64_t desired,
                     uint64_t* previous) {
  FARPOOL_RETURN_IF_ERROR(state_->context_error);
  const char* what = cas ? "compare-and-swap" : "fetch-and-add";
  FARPOOL_ASSIGN_OR_RETURN(Pool::Impl::Target t,
                           pool_.Aim(*state_->tc, address, 8, what, true, true));
  if (t.direct == nullptr) FARPOOL_RETURN_IF_ERROR(Route(t.index));
  const auto kind = cas ? memory_ops::OpKind::kCompareAndSwap : memory_ops::OpKind::kFetchAdd;
  if (t.direct == nullptr && t.messages) {
    FARPOOL_RETURN_IF_ERROR(Reserve(t.index, static_cast<uint8_t>(kind), 8));
  }
  ThreadContext& tc = *state_->tc;
  Bump(cas ? tc.cas : tc.faa);
  ++state_->posted;
  if (t.direct != nullptr) {
    const uint64_t prev =
        cas ? DirectCas(t.direct, operand, desired) : DirectFetchAdd(t.direct, operand);
    if (previous != nullptr) *previous = prev;
    return Status::Ok();
  }
  if (t.messages) {
    auto& m = state_->Open(t.index);
    const uint64_t offset = t.remote - pool_.servers_[t.index]->region_base;
    if (cas) {
      m.request.CompareAndSwap(offset, operand, desired);
    } else {
      m.request.FetchAdd(offset, operand);
    }
    m.sinks.push_back({nullptr, 8, previous});
    m.ops.push_back(
        {.kind = kind, .address = address, .a = operand, .b = desired, .result = previous});
    return Status::Ok();
  }
  state_->one_sided[t.index] = 1;
  auto& p = state_->pending.emplace_back();
  p.index = t.index;
  p.what = what;
  // UCX's CSWAP compares with the operand; the reply buffer holds the swap value going out and
  // the previous value coming back. ADD adds the operand; the reply buffer takes the previous.
  p.operand = operand;
  p.result = desired;
  p.out = previous;
  p.request = PostAtomic(tc.peers[t.index], cas ? UCP_ATOMIC_OP_CSWAP : UCP_ATOMIC_OP_ADD,
                         &p.operand, &p.result, t.remote);
  return Status::Ok();
}

Status Batch::WaitCompareAndSwap(GlobalAddress address, uint64_t expected, uint64_t desired,
                                 const WaitSpec& spec, WaitCasResult* result) {
  FARPOOL_RETURN_IF_ERROR(state_->context_error);
  if (spec.wait < std::chrono::microseconds(0) || spec.wait > WaitSpec::kMaxWait) {
    return Status::InvalidArgument("wait-compare-and-swap at " + address.ToString() + ": wait of " +
                                   std::to_string(spec.wait.count()) + " us is not within 0.." +
                                   std::to_string(WaitSpec::kMaxWait.count()));
  }
  const memory_ops::WaitParams params = memory_ops::ParamsOf(spec);
  if (std::string why = memory_ops::CheckWaitParams(params, desired); !why.empty()) {
    return Status::InvalidArgument("wait-compare-and-swap at " + address.ToString() + ": " + why);
  }
  FARPOOL_ASSIGN_OR_RETURN(Pool::Impl::Target t,
                           pool_.Aim(*state_->tc, address, 8, "wait-compare-and-swap", true, true));
  if (t.direct == nullptr) FARPOOL_RETURN_IF_ERROR(Route(t.index));
  if (t.direct != nullptr) {
    const memory_ops::WaitAttempt a = memory_ops::AttemptWaitCompareAndSwap(
        reinterpret_cast<uint64_t*>(t.direct), expected, desired, params);
    Bump(state_->tc->cas);
    ++state_->posted;
    *result = {a.previous, memory_ops::WaitCompareAndSwapSwapped(a.previous, expected, params)};
    return Status::Ok();
  }
  if (!t.messages) {
    // One-sided: a plain compare-and-swap, whose outcome the same rule decides without
    // take-free; wait-only: a read of the word (8 aligned bytes: word-atomic), never swapped.
    memory_ops::WaitParams plain = params;
    plain.flags &= memory_ops::kWaitOnly;
    FARPOOL_RETURN_IF_ERROR(spec.wait_only
                                ? Read(address, &result->previous, sizeof(result->previous))
                                : CompareAndSwap(address, expected, desired, &result->previous));
    state_->wait_outcomes.push_back({result, expected, plain});
    return Status::Ok();
  }
  FARPOOL_RETURN_IF_ERROR(
      Reserve(t.index, static_cast<uint8_t>(memory_ops::OpKind::kWaitCompareAndSwap), 8));
  Bump(state_->tc->cas);
  ++state_->posted;
  auto& m = state_->Open(t.index);
  m.request.WaitCompareAndSwap(t.remote - pool_.servers_[t.index]->region_base, expected, desired,
                               params);
  m.sinks.push_back({nullptr, 8, &result->previous});
  m.ops.push_back({.kind = memory_ops::OpKind::kWaitCompareAndSwap,
                   .address = address,
                   .a = expected,
                   .b = desired,
                   .result = result,
                   .wait = spec});
  state_->wait_outcomes.push_back({result, expected, params});
  return Status::Ok();
}

Status Batch::LookupRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key, void* record,
                         uint32_t record_size, LookupResult* result) {
  FARPOOL_RETURN_IF_ERROR(state_->context_error);
  const memory_ops::LookupParams params = memory_ops::ParamsOf(spec);
  if (std::string why = memory_ops::CheckLookupParams(params); !why.empty()) {
    return Status::InvalidArgument("lookup-read at " + bucket.ToString() + ": " + why);
  }
  if (record_size > memory_ops::kMaxInlineBytes) {
    return Status::InvalidArgument("lookup-read at " + bucket.ToString() + ": record of " +
                                   std::to_string(record_size) + " bytes (at most " +
                                   std::to_string(memory_ops::kMaxInlineBytes) + ")");
  }
  FARPOOL_ASSIGN_OR_RETURN(Pool::Impl::Target t, pool_.Aim(*state_->tc, bucket, spec.bucket_size,
                                                           "lookup-read", true, false));
  if (t.direct == nullptr) FARPOOL_RETURN_IF_ERROR(Route(t.index));
  if (t.direct == nullptr && t.messages) {
    FARPOOL_RETURN_IF_ERROR(
        Reserve(t.index, static_cast<uint8_t>(memory_ops::OpKind::kLookupRead), record_size));
  }
  ThreadContext& tc = *state_->tc;
  Bump(tc.reads);
  Bump(tc.bytes_read, spec.bucket_size);
  ++state_->posted;
  ServerState& s = *pool_.servers_[t.index];
  const uint64_t offset = t.remote - s.region_base;  // past the mirror's start if failed over
  if (t.direct != nullptr) {
    // The server's own code on the mapped region: the same semantics. A mapping client may
    // touch the whole region, so only its bounds are checked.
    memory_ops::Region region{s.direct, s.region_size, [](uint64_t, uint64_t) { return true; },
                              s.address.id};
    std::vector<std::byte> out(sizeof(memory_ops::LookupReply) + record_size);
    memory_ops::ExecuteLookupRead(region, offset, params, key, record_size, out.data());
    Status st = memory_ops::DecodeLookupReply(out.data(), s.address.id, result).WithContext(s.name);
    if (st.ok() && result->outcome == LookupResult::Outcome::kFound) {
      std::memcpy(record, out.data() + sizeof(memory_ops::LookupReply), record_size);
    }
    // An address out of bounds fails the batch at Wait, as on the other paths.
    if (!st.ok() && state_->error.ok()) state_->error = st;
    return Status::Ok();
  }
  if (t.messages) {
    auto& m = state_->Open(t.index);
    m.request.LookupRead(offset, params, key, record_size);
    m.sinks.push_back({record, sizeof(memory_ops::LookupReply) + record_size, nullptr, result});
    m.ops.push_back({.kind = memory_ops::OpKind::kLookupRead,
                     .address = bucket,
                     .into = record,
                     .size = record_size,
                     .a = key,
                     .result = result,
                     .spec = spec});
    return Status::Ok();
  }
  state_->one_sided[t.index] = 1;
  auto& l = state_->lookups.emplace_back();
  l.bucket.resize(spec.bucket_size);
  l.params = params;
  l.key = key;
  l.result = result;
  auto& p = state_->pending.emplace_back();
  p.index = t.index;
  p.what = "lookup-read";
  p.request = PostRead(tc.peers[t.index], l.bucket.data(), spec.bucket_size, t.remote);
  return Status::Ok();
}

Status Batch::LookupLockRead(GlobalAddress bucket, const LookupSpec& spec, uint64_t key,
                             uint32_t lock_offset, uint64_t held_mask, uint64_t lock_word,
                             void* record, uint32_t record_size, LockReadResult* result) {
  FARPOOL_RETURN_IF_ERROR(state_->context_error);
  const memory_ops::LockReadParams params{memory_ops::ParamsOf(spec), held_mask, lock_offset, 0};
  std::string why = memory_ops::CheckLockReadParams(params, record_size, lock_word);
  if (why.empty() && record_size > memory_ops::kMaxInlineBytes) why = "record out of range";
  if (!why.empty()) {
    return Status::InvalidArgument("lookup-lock-read at " + bucket.ToString() + ": " + why);
  }
  FARPOOL_ASSIGN_OR_RETURN(Pool::Impl::Target t, pool_.Aim(*state_->tc, bucket, spec.bucket_size,
                                                           "lookup-lock-read", true, true));
  if (t.direct == nullptr) FARPOOL_RETURN_IF_ERROR(Route(t.index));
  *result = LockReadResult{};
  if (t.direct == nullptr && !t.messages) {
    // One-sided: the lookup-read's path (no record is read in this round trip, so none is
    // locked); the caller locks in a round trip of its own.
    return LookupRead(bucket, spec, key, record, record_size, &result->lookup);
  }
  if (t.direct == nullptr) {
    FARPOOL_RETURN_IF_ERROR(
        Reserve(t.index, static_cast<uint8_t>(memory_ops::OpKind::kLookupLockRead), record_size));
  }
  ThreadContext& tc = *state_->tc;
  Bump(tc.reads);
  Bump(tc.cas);
  Bump(tc.bytes_read, spec.bucket_size);
  ++state_->posted;
  ServerState& s = *pool_.servers_[t.index];
  const uint64_t offset = t.remote - s.region_base;  // past the mirror's start if failed over
  const uint64_t reply = sizeof(memory_ops::LookupReply) + sizeof(uint64_t) + record_size;
  if (t.direct != nullptr) {
    // The server's code on the mapped region (as LookupRead).
    memory_ops::Region region{s.direct, s.region_size, [](uint64_t, uint64_t) { return true; },
                              s.address.id};
    std::vector<std::byte> out(reply);
    memory_ops::ExecuteLookupLockRead(region, offset, params, key, lock_word, record_size,
                                      out.data());
    Status st = memory_ops::DecodeLockReadReply(out.data(), s.address.id, held_mask, record_size,
                                                record, result)
                    .WithContext(s.name);
    if (!st.ok() && state_->error.ok()) state_->error = st;
    return Status::Ok();
  }
  auto& m = state_->Open(t.index);
  m.request.LookupLockRead(offset, params, key, lock_word, record_size);
  m.sinks.push_back(
      {.read_into = record, .size = reply, .lock_read = result, .held_mask = held_mask});
  m.ops.push_back({.kind = memory_ops::OpKind::kLookupLockRead,
                   .address = bucket,
                   .into = record,
                   .size = record_size,
                   .a = key,
                   .b = held_mask,
                   .c = lock_word,
                   .result = result,
                   .spec = spec,
                   .lock_offset = lock_offset});
  return Status::Ok();
}

Status Batch::InsertIfAbsent(GlobalAddress bucket, const LookupSpec& spec, uint32_t lock_offset,
                             uint64_t lock_word, uint64_t key, uint64_t value,
                             InsertResult* result) {
  FARPOOL_RETURN_IF_ERROR(state_->context_error);
  memory_ops::InsertParams params{
      memory_ops::ParamsOf(spec), lock_word, static_cast<uint16_t>(lock_offset), {}};
  std::string why = memory_ops::CheckInsertParams(params);
  if (why.empty() && lock_offset != params.lock_offset) why = "lock offset out of range";
  if (why.empty() && value == 0) why = "value is zero";
  if (!why.empty())
    return Status::InvalidArgument("insert-if-absent at " + bucket.ToString() + ": " + why);
  FARPOOL_ASSIGN_OR_RETURN(Pool::Impl::Target t, pool_.Aim(*state_->tc, bucket, spec.bucket_size,
                                                           "insert-if-absent", true, true));
  if (t.direct == nullptr) FARPOOL_RETURN_IF_ERROR(Route(t.index));
  if (t.direct == nullptr && !t.messages) {
    // One-sided: no single step does it; the caller inserts with its own operations.
    *result = InsertResult{};
    return Status::Ok();
  }
  if (t.direct == nullptr) {
    FARPOOL_RETURN_IF_ERROR(
        Reserve(t.index, static_cast<uint8_t>(memory_ops::OpKind::kInsertIfAbsent), 0));
  }
  ThreadContext& tc = *state_->tc;
  Bump(tc.cas);
  ++state_->posted;
  ServerState& s = *pool_.servers_[t.index];
  const uint64_t offset = t.remote - s.region_base;  // past the mirror's start if failed over
  if (t.direct != nullptr) {
    // The server's code on the mapped region (as LookupRead).
    memory_ops::Region region{s.direct, s.region_size, [](uint64_t, uint64_t) { return true; },
                              s.address.id};
    std::byte out[sizeof(memory_ops::InsertReply)];
    memory_ops::ExecuteInsertIfAbsent(region, offset, params, key, value, out);
    Status st = memory_ops::DecodeInsertReply(out, s.address.id, result).WithContext(s.name);
    if (!st.ok() && state_->error.ok()) state_->error = st;
    return Status::Ok();
  }
  auto& m = state_->Open(t.index);
  m.request.InsertIfAbsent(offset, params, key, value);
  m.sinks.push_back({nullptr, sizeof(memory_ops::InsertReply), nullptr, nullptr, result});
  m.ops.push_back({.kind = memory_ops::OpKind::kInsertIfAbsent,
                   .address = bucket,
                   .a = lock_word,
                   .b = key,
                   .c = value,
                   .result = result,
                   .spec = spec,
                   .lock_offset = lock_offset});
  return Status::Ok();
}

Status Pool::Impl::SendBatch(ThreadContext& tc, size_t index, uint64_t request_id,
                             const memory_ops::RequestBuilder& request, Clock::time_point deadline,
                             bool* left) {
  ServerState& s = *servers_[index];
  *left = false;
  if (s.failed.load(std::memory_order_relaxed)) return s.Failure();
  FARPOOL_ASSIGN_OR_RETURN(Endpoint * ep, PeerOf(tc, index));
  if (ep->failed()) return ConnectionLost(tc, index);
  *left = true;
  std::vector<std::byte> bytes = wire::Encode(
      request_id,
      wire::BatchRequest{request.op_count(), static_cast<uint32_t>(request.bytes().size())},
      request.bytes());
  Status sent = ep->SendAm(transport::kControlAm, bytes, true, deadline,
                           [&] { return s.failed.load(std::memory_order_relaxed); });
  Bump(tc.messages);
  if (!sent.ok() && ep->failed()) return ConnectionLost(tc, index);
  if (sent.ok()) return sent;  // no context string to build: this runs for every message
  Lost(index, "sending a batch: " + sent.message());
  // Asked why: a refusal (it evicted us) is the answer, not the send's error.
  if (Status f = s.Failure(); f.code() == StatusCode::kEvicted) return f.WithContext("batch");
  return sent.WithContext(s.name + ": batch");
}

Status Pool::Impl::FinishBatch(ThreadContext& tc, size_t index, uint64_t request_id,
                               const BatchLanding& landing, Clock::time_point deadline) {
  ServerState& s = *servers_[index];
  Status arrived =
      AwaitReply(tc, index, request_id, wire::Opcode::kBatchReply, deadline, options_.op_timeout);
  // The server is gone or stuck: no later call may wait on it again.
  // (A lost connection is marked by AwaitReply.)
  if (arrived.code() == StatusCode::kTimedOut && !s.failed.load()) {
    Lost(index, "batch timed out after " + std::to_string(options_.op_timeout.count()) + " ms");
    // Asked why: a refusal (it evicted us) is the answer, not the timeout.
    if (Status f = s.Failure(); f.code() == StatusCode::kEvicted) return f;
  }
  // A refusal of our tag in the reply (sent before the server closed the connection).
  if (arrived.ok() && landing.status.code() == StatusCode::kEvicted) {
    MarkFailed(index, landing.status);
  }
  return arrived.ok() ? landing.status : arrived;
}

void BatchLanding::Land(void* context, std::span<const std::byte> reply) {
  auto& l = *static_cast<BatchLanding*>(context);
  const ServerState& s = *l.server;
  if (control::IsMovingReply(reply)) {
    // Refused before any of it ran: Batch::Drain follows the map and sends it again. (Not
    // here: following the map waits, and this runs inside a progress of the worker.)
    l.moving = true;
    l.status = Status::Unavailable(s.name +
                                   ": batch refused unexecuted: the server is being "
                                   "drained");
    return;
  }
  auto m = control::CheckReply(s.name, reply, wire::Opcode::kBatchReply);
  if (!m.ok()) {
    l.status = m.status();  // an error reply says the server lives
    return;
  }
  const auto body = m->As<wire::BatchReply>();
  if (body.op_count != l.request->op_count() || m->tail.size() != l.request->reply_size()) {
    l.status = Status::Protocol(s.name + ": batch reply of " + std::to_string(body.op_count) +
                                " operations and " + std::to_string(m->tail.size()) +
                                " bytes for a request of " + std::to_string(l.request->op_count()) +
                                " operations expecting " + std::to_string(l.request->reply_size()));
    return;
  }
  const std::byte* at = m->tail.data();
  Status lookups;
  for (const BatchSink& sink : l.sinks) {
    if (sink.lookup != nullptr) {
      Status st = memory_ops::DecodeLookupReply(at, s.address.id, sink.lookup).WithContext(s.name);
      if (lookups.ok()) lookups = st;
      if (st.ok() && sink.lookup->outcome == LookupResult::Outcome::kFound) {
        std::memcpy(sink.read_into, at + sizeof(memory_ops::LookupReply),
                    sink.size - sizeof(memory_ops::LookupReply));
      }
      at += sink.size;
      continue;
    }
    if (sink.lock_read != nullptr) {
      const uint64_t head = sizeof(memory_ops::LookupReply) + sizeof(uint64_t);
      Status st = memory_ops::DecodeLockReadReply(at, s.address.id, sink.held_mask,
                                                  static_cast<uint32_t>(sink.size - head),
                                                  sink.read_into, sink.lock_read)
                      .WithContext(s.name);
      if (lookups.ok()) lookups = st;
      at += sink.size;
      continue;
    }
    if (sink.insert != nullptr) {
      Status st = memory_ops::DecodeInsertReply(at, s.address.id, sink.insert).WithContext(s.name);
      if (lookups.ok()) lookups = st;
      at += sink.size;
      continue;
    }
    if (sink.read_into != nullptr) std::memcpy(sink.read_into, at, sink.size);
    if (sink.previous != nullptr) std::memcpy(sink.previous, at, sizeof(uint64_t));
    at += sink.size;
  }
  l.status = lookups;
}

Status Batch::Reserve(size_t index, uint8_t kind, uint64_t size) {
  State& st = *state_;
  const auto op = static_cast<memory_ops::OpKind>(kind);
  if (st.open[index] >= 0 && st.Open(index).request.Fits(op, size)) return Status::Ok();
  if (st.fenced[index]) {
    // A second message to this server could be executed before the first one's operations
    // from before the fence: complete those first.
    FARPOOL_RETURN_IF_ERROR(Drain());
  }
  st.open[index] = static_cast<int>(st.messages.size());
  st.messages.emplace_back().index = index;
  ++st.message_count[index];
  return Status::Ok();
}

Status Batch::Fence() {
  State& st = *state_;
  FARPOOL_RETURN_IF_ERROR(st.context_error);
  bool drain = false, ucx_fence = false;
  for (size_t i = 0; i < st.open.size(); ++i) {
    drain = drain || st.message_count[i] > 1 || (st.message_count[i] > 0 && st.one_sided[i]);
    ucx_fence = ucx_fence || st.one_sided[i];
  }
  if (drain) return Drain();
  if (ucx_fence) {
    ucs_status_t s = ucp_worker_fence(st.tc->worker->get());
    if (s != UCS_OK) return transport::UcxStatus(s, "fence");
  }
  // Later operations append to the open messages, which the servers execute in order.
  for (size_t i = 0; i < st.open.size(); ++i) st.fenced[i] = st.open[i] >= 0;
  return Status::Ok();
}

Status Batch::Drain() { return Drain(kMaxResends); }

Status Batch::Drain(int resends) {
  State& st = *state_;
  Status first;
  auto note = [&first](const Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  // What is posted again once this round is done (see the file comment): only in a cluster
  // where a failed server's regions move to another (replicated, or drained: the map says).
  std::vector<Replay> again;
  const bool resend = pool_.RegionsMove() && resends > 0;
  auto moved = [&](size_t index) {
    return pool_.servers_[index]->failed.load(std::memory_order_relaxed);
  };
  const bool waits = !st.messages.empty() || !st.pending.empty();
  const auto deadline = Clock::now() + pool_.options_.op_timeout;
  // Every server's messages go out before any reply is awaited: one round trip in all.
  std::vector<Status> sent(st.messages.size());
  std::vector<uint8_t> left(st.messages.size());
  for (size_t k = 0; k < st.messages.size(); ++k) {
    State::Message& m = st.messages[k];
    m.request_id = st.tc->next_request_id++;
    m.landing = {pool_.servers_[m.index].get(), &m.request, m.sinks, Status::Ok()};
    st.tc->box.Expect(m.request_id, &BatchLanding::Land, &m.landing);
    bool l = false;
    sent[k] = pool_.SendBatch(*st.tc, m.index, m.request_id, m.request, deadline, &l);
    left[k] = l;
  }
  for (auto& p : st.pending) {
    Status s = pool_.Complete(*st.tc, p.index, p.request, p.what);
    if (s.ok() && p.out != nullptr) *p.out = p.result;
    if (!s.ok() && resend && p.read && s.code() == StatusCode::kUnavailable && moved(p.index)) {
      again.push_back(*p.read);
      continue;
    }
    note(s);
  }
  st.pending.clear();
  if (first.ok()) {
    for (const State::OneSidedLookup& l : st.lookups) {
      const memory_ops::BucketScan scan = memory_ops::ScanBucket(l.bucket.data(), l.params, l.key);
      if (scan.value != 0) {
        *l.result = {LookupResult::Outcome::kFoundNotRead, GlobalAddress::FromRaw(scan.value)};
      } else if (scan.next != 0) {
        *l.result = {LookupResult::Outcome::kContinue, GlobalAddress::FromRaw(scan.next)};
      } else {
        *l.result = {LookupResult::Outcome::kAbsent, GlobalAddress()};
      }
    }
  }
  st.lookups.clear();
  for (size_t i = 0; i < st.wrote.size(); ++i) {
    if (!st.wrote[i]) continue;
    st.wrote[i] = 0;
    note(pool_.Flush(*st.tc, i));
  }
  for (size_t k = 0; k < st.messages.size(); ++k) {
    const State::Message& m = st.messages[k];
    Status done = sent[k].ok()
                      ? pool_.FinishBatch(*st.tc, m.index, m.request_id, m.landing, deadline)
                      : sent[k];
    // From here a late reply is dropped: the caller may reuse the sinks' memory.
    st.tc->box.Forget(m.request_id);
    if (!done.ok() && m.landing.moving) pool_.Moving(m.index);  // follows the map
    // Safe to run again elsewhere: refused unexecuted, never sent, or reads only. A change
    // that may have reached the server keeps its error: its outcome is unknown.
    const bool cut =
        done.code() == StatusCode::kUnavailable || done.code() == StatusCode::kTimedOut;
    if (resend && !done.ok() && moved(m.index) &&
        (m.landing.moving || (!left[k] && done.code() == StatusCode::kUnavailable) ||
         (cut &&
          std::all_of(m.ops.begin(), m.ops.end(), [](const Replay& r) { return r.reads(); })))) {
      again.insert(again.end(), m.ops.begin(), m.ops.end());
      continue;
    }
    note(done);
  }
  for (const State::WaitOutcome& w : st.wait_outcomes) {
    w.result->swapped = first.ok() && memory_ops::WaitCompareAndSwapSwapped(w.result->previous,
                                                                            w.expected, w.params);
  }
  st.wait_outcomes.clear();
  st.ClearMessages();
  if (waits) Bump(st.tc->round_trips);
  if (!again.empty()) {
    // Resolve follows the move (waiting for a failover in progress): the operations go to the
    // region's new server, or fail there with its reason.
    Bump(st.tc->resent, again.size());
    for (const Replay& r : again) note(Repost(r));
    note(Drain(resends - 1));
  }
  if (st.error.ok()) st.error = first;
  return first;
}

Status Batch::Post() {
  State& st = *state_;
  FARPOOL_RETURN_IF_ERROR(st.context_error);
  // One-sided operations complete only through their worker: waited for, as Wait() does.
  if (!st.pending.empty() || !st.lookups.empty()) return Wait();
  for (const State::Message& m : st.messages) {
    for (const BatchSink& sink : m.sinks) {
      if (sink.read_into != nullptr || sink.previous != nullptr || sink.lookup != nullptr ||
          sink.insert != nullptr || sink.lock_read != nullptr) {
        return Status::InvalidArgument(pool_.servers_[m.index]->name +
                                       ": Batch::Post of an operation whose result is wanted "
                                       "(a read, a previous value): nothing was sent");
      }
    }
  }
  Status first = st.error;
  const auto deadline = Clock::now() + pool_.options_.op_timeout;
  for (State::Message& m : st.messages) {
    m.request_id = st.tc->next_request_id++;
    // Abandoned before it is sent: its reply is dropped on arrival, never kept.
    st.tc->box.Expect(m.request_id, nullptr, nullptr);
    st.tc->box.Forget(m.request_id);
    bool left = false;  // a posted operation is never resent: the caller wants no outcome
    Status sent = pool_.SendBatch(*st.tc, m.index, m.request_id, m.request, deadline, &left);
    if (first.ok()) first = sent;
  }
  st.ClearMessages();
  st.error = Status::Ok();
  st.posted = 0;
  return first;
}

Status Batch::Wait() {
  if (!state_->context_error.ok()) return state_->context_error;
  (void)Drain();  // its first error is kept in state_->error
  Status result = state_->error;
  state_->error = Status::Ok();
  state_->posted = 0;
  return result;
}

}  // namespace farpool
