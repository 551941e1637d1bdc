// ClusterConfig: how a client finds the memory servers of a pool (the cluster file).
//
//   {
//     "version": 1,
//     "transport": "shm",                      // default fabric for clients: auto|shm|tcp
//     "secret_file": "cluster.secret",         // the cluster secret (optional, see below)
//     "servers": [
//       {"id": 0, "address": "127.0.0.1:41000", "memory": 1073741824,
//        "pid": 4242, "netns": ""}             // pid/netns: set by `farpool cluster up`
//     ],
//     "etcd": {                                // optional: the cluster's map in etcd
//       "endpoints": ["http://127.0.0.1:40123"],
//       "prefix": "/farpool/3f2a9c01d4e5b6a7/",  // its keys (coord/cluster_map.h)
//       "pid": 4243, "peer_port": 40124        // the member `cluster up` started, if any
//     }
//   }
//
// Server ids are unique and at most 65535; addresses are HOST:PORT. Every parse error names
// the file and the offending field.
//
// secret_file names the file of the cluster's secret (transport/auth.h: 64 hex digits, mode
// 0600), never the secret itself: the cluster file may be readable by anyone, the secret file
// is its owner's only. A relative name is relative to the cluster file's directory. Clients
// (Pool::Connect, hence the database, the file store, the VFS, the Python client) prove to
// every server that they know it; without it they can use only servers that have no secret.
//
// Thread-safety: a value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/fabric.h"
#include "farpool/status.h"

namespace farpool {

struct ServerAddress {
  uint16_t id = 0;
  std::string host;
  uint16_t port = 0;
  uint64_t memory = 0;  // bytes donated (informational; the server is authoritative)
  int64_t pid = 0;      // process id when started by `farpool cluster up`, else 0
  std::string netns;    // network namespace when started with --netns, else empty

  std::string Endpoint() const { return host + ":" + std::to_string(port); }
};

// Where the cluster's map and membership live in etcd (docs/pool.md "Membership on etcd").
struct EtcdConfig {
  std::vector<std::string> endpoints;  // http://HOST:PORT; empty: the cluster has no etcd
  std::string prefix;                  // ends with '/'
  // The one-member etcd that `farpool cluster up` started (pid 0: it joined an existing etcd
  // and started none); its data is in DIR/etcd, its peer port is needed to restart it.
  int64_t pid = 0;
  uint16_t peer_port = 0;
};

struct ClusterConfig {
  Fabric transport = Fabric::kAuto;
  std::vector<ServerAddress> servers;
  // As written in the file; Load resolves a relative name against the file's directory.
  // Empty: no secret.
  std::string secret_file;
  // The pool (tenant) this file's clients act for (docs/pool.md "Pools"); empty: the
  // cluster's default pool. With a pool, secret_file holds the pool's credential
  // (`farpool cluster pool add` writes both), not the cluster secret.
  std::string pool;
  // Backups of every byte (docs/pool.md "Replication", "Replication with f backups"): 0 to
  // servers - 1; the backups of servers[i] are servers[(i + 1) % n] .. servers[(i + f) % n]
  // (the ring), the first live one of which takes its data over when it is gone.
  int replicas = 0;
  // With replicas 1, how a backup holds its primary's data (docs/pool.md "Shared-pages
  // backups"): false: a copy that the primary forwards every change to; true: the primary's own
  // pages (every server on one host, shared memory), only lease changes forwarded.
  bool shared_pages = false;
  // The index in `servers` of the backup number `k` (0: the first) of servers[index]; it keeps
  // the copy in its mirror slot k. REQUIRES: k < replicas.
  size_t BackupOf(size_t index, size_t k = 0) const { return (index + 1 + k) % servers.size(); }
  EtcdConfig etcd;

  // The secret_file of a loaded config is an absolute path (or relative to the working
  // directory if `path` was).
  static Result<ClusterConfig> Load(const std::string& path);
  // `origin` names the source in error messages (a file name).
  static Result<ClusterConfig> Parse(std::string_view json, std::string_view origin);
  std::string ToJson() const;
  // Writes atomically (temporary file + rename).
  Status Save(const std::string& path) const;
};

// Splits "HOST:PORT" ("[::1]:7000" for IPv6). Errors name the text.
Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view text);

}  // namespace farpool
