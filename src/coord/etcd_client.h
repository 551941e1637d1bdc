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

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
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

// Splits "http://a:1,http://b:2" (the --etcd option) into endpoints; InvalidArgument for an
// empty list or an entry that is not http://HOST:PORT.
Result<std::vector<std::string>> ParseEndpoints(std::string_view list);

}  // namespace farpool::coord
