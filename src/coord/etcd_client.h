// EtcdClient: farpool's client of etcd (v3 API through its JSON gateway, over HTTP with
// libcurl), the coordination service that holds the cluster map and the servers' liveness
// (docs/pool.md "Membership on etcd"). No consensus of farpool's own: every decision that two
// processes could race on is one etcd transaction.
//
// Contract:
//   - Atomicity is etcd's: a Put, a Delete and a Txn each take effect entirely or not at all,
//     at one revision of the store; a Txn's compares and its branch are one atomic step
//     (compare-and-swap on create_revision, mod_revision or value). Reads are linearizable
//     (etcd's default), so a read after a write that succeeded sees it.
//   - A lease is etcd's: granted with a TTL in seconds, it lives while KeepAlive refreshes it
//     within the TTL; keys put with it are deleted when it expires or is revoked. etcd measures
//     the TTL on its own clock (the lessor), so a holder must refresh well before its own view
//     of the TTL runs out; a holder that cannot reach etcd must assume its lease is gone after
//     the TTL (etcd may extend leases across a leader change, never shorten them).
//   - Timeouts: every call gives up after Options::timeout per endpoint (connect included) and
//     tries the next endpoint on a transport failure; so a call returns within
//     timeout × endpoints. It never blocks forever.
//   - Errors name the endpoint and what etcd said: "etcd http://10.0.0.1:2379: /v3/kv/put:
//     etcdserver: requested lease not found". Unreachable: Unavailable naming every endpoint
//     tried and curl's reason. A lease that does not exist: NotFound. A Txn whose compare
//     failed is no error (TxnAnswer::succeeded is false).
//
// Thread-safety: safe for concurrent use (one mutex around the HTTP handle: calls from several
// threads are serialized; the client's traffic is a few calls per second).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "coord/etcd_codec.h"
#include "farpool/status.h"

namespace farpool::coord {

// A condition of a Txn on one key.
struct Compare {
  enum class Target { kCreateRevision, kModRevision };
  std::string key;
  Target target = Target::kCreateRevision;
  int64_t revision = 0;  // equal to this (create_revision 0: the key does not exist)
};

class EtcdClient {
 public:
  struct Options {
    // "http://HOST:PORT", at least one; tried in order, starting from the last that answered.
    std::vector<std::string> endpoints;
    std::chrono::milliseconds timeout{2000};
  };
  // Checks the endpoints' form only (InvalidArgument); does not connect.
  static Result<std::unique_ptr<EtcdClient>> Create(Options options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The endpoints, joined by commas (for messages and the cluster file).
  std::string EndpointList() const;

  Result<std::optional<KeyValue>> Get(std::string_view key);
  // The key (kvs: it, or nothing) and the revision it was read at.
  Result<RangeAnswer> GetAt(std::string_view key);
  // Every key that starts with `prefix`, in key order, and the revision they were read at.
  Result<RangeAnswer> GetPrefix(std::string_view prefix);
  // Returns the revision of the write. `lease` 0: none.
  Result<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0);
  Status Delete(std::string_view key);
  Status DeletePrefix(std::string_view prefix);
  // If every compare holds, puts key = value (with `lease`, 0: none); else reads `key`
  // (TxnAnswer::kvs: its current value, if any).
  Result<TxnAnswer> PutIf(const std::vector<Compare>& compares, std::string_view key,
                          std::string_view value, int64_t lease = 0);
  // If every compare holds, deletes `key`; whether they held (false: nothing was deleted).
  Result<bool> DeleteIf(const std::vector<Compare>& compares, std::string_view key);

  // Discards the store's history before `revision` (a watch from there on is then refused).
  Status Compact(int64_t revision);

  // A new lease of `ttl` (rounded up to whole seconds, at least 1).
  Result<LeaseAnswer> GrantLease(std::chrono::milliseconds ttl);
  // Refreshes lease `id`: its TTL starts again. NotFound if it expired or was revoked.
  Result<LeaseAnswer> KeepAlive(int64_t id);
  Status RevokeLease(int64_t id);

 private:
  explicit EtcdClient(Options options);
  // POSTs `body` to `path` at each endpoint until one answers; an answer that is an error
  // becomes a Status naming the endpoint and path.
  Result<std::string> Call(std::string_view path, const std::string& body);

  const Options options_;
  std::mutex mu_;
  void* curl_ = nullptr;  // CURL*, guarded by mu_
  size_t preferred_ = 0;  // guarded by mu_
};

// EtcdWatch: a watch on one key or on every key under a prefix, kept up on a thread of its own,
// that hands its owner every change exactly once and in revision order, across broken streams.
//
// How it works: the thread first reads the keys whole (a snapshot, at revision R), then opens
// a watch stream (POST /v3/watch, held open by etcd) from R + 1 and delivers each response that
// carries events; the last revision delivered is remembered. When the stream breaks (etcd
// restarted, the connection lost, the gateway's error), the thread opens another from that
// revision + 1, so a change made while the stream was down arrives when it is back. When etcd
// has compacted that revision away (the stream is canceled with compact_revision), the changes
// cannot be replayed: the thread reads the keys whole again (a new snapshot) and watches from
// there. While etcd does not answer, it tries again every Options::retry, endpoint after
// endpoint. A stream that stays up but silent on a dead connection (a host that vanished
// without closing it) is found by TCP keepalives (a few seconds), then treated as broken.
//
// Stopping: the destructor wakes the thread out of its wait on the stream (a curl multi
// handle's wakeup) or its retry pause, and joins it: it never waits for etcd.
//
// Thread-safety: on_update runs on the watch's thread, one call at a time; the owner must not
// destroy the EtcdWatch from inside it. The counters may be read from any thread.
class EtcdWatch {
 public:
  // What on_update is handed: either a snapshot (every key there is, at `revision`; the owner
  // replaces what it had) or the events of one response (in revision order; `revision` is
  // the last event's mod_revision).
  struct Update {
    bool snapshot = false;
    int64_t revision = 0;
    std::vector<KeyValue> kvs;       // snapshot only
    std::vector<WatchEvent> events;  // events only
  };
  struct Options {
    std::vector<std::string> endpoints;
    std::string key;
    bool prefix = false;  // every key that starts with `key`
    // 0: start with a snapshot; else no snapshot: events from this revision on (a snapshot
    // only if it has been compacted).
    int64_t start_revision = 0;
    std::function<void(const Update&)> on_update;
    std::chrono::milliseconds retry{250};
    // Of a snapshot's read and of a stream's connection (not of the stream, which lasts).
    std::chrono::milliseconds timeout{2000};
  };
  // Starts the thread; InvalidArgument for bad endpoints or no on_update. Does not wait for
  // etcd: a watch started while etcd is down begins once it answers.
  static Result<std::unique_ptr<EtcdWatch>> Start(Options options);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Whether a stream is set up now (etcd said "created" and it has not broken since).
  bool up() const { return up_.load(std::memory_order_acquire); }
  // Streams set up so far (a second one: the first broke and the watch resumed).
  uint64_t streams() const { return streams_.load(std::memory_order_relaxed); }
  // Snapshots read so far (the first one, and one after each compaction).
  uint64_t snapshots() const { return snapshots_.load(std::memory_order_relaxed); }
  // The last revision delivered (0: none yet).
  int64_t revision() const { return revision_.load(std::memory_order_relaxed); }

 private:
  explicit EtcdWatch(Options options);
  void Run();
  // Reads the keys whole and delivers them; the revision read at.
  Result<int64_t> Snapshot();
  // One stream at `endpoint` from `*next` until it breaks or Stop; advances *next past what
  // it delivered. OK when stopped; NotFound when the revision was compacted
  // away; Unavailable or Protocol when it broke.
  Status Stream(const std::string& endpoint, int64_t* next);
  // Sleeps up to `d`, or less if stopped; whether to go on.
  bool Pause(std::chrono::milliseconds d);

  const Options options_;
  std::unique_ptr<EtcdClient> client_;  // for snapshots
  std::vector<std::string> endpoints_;  // for streams
  void* multi_ = nullptr;               // CURLM*, for the stream; woken by the destructor
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> up_{false};
  std::atomic<uint64_t> streams_{0};
  std::atomic<uint64_t> snapshots_{0};
  std::atomic<int64_t> revision_{0};
  std::thread thread_;
};

// Splits "http://a:1,http://b:2" (the --etcd option) into endpoints; InvalidArgument for an
// empty list or an entry that is not http://HOST:PORT.
Result<std::vector<std::string>> ParseEndpoints(std::string_view list);

}  // namespace farpool::coord
