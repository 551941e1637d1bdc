// LocalCluster: runs a pool's memory servers as processes on this machine (the embedded
// default for development, demos, tests and benchmarks): `farpool cluster up|status|down`.
//
// Up starts N `farpool server` processes (detached: SpawnDetached, logs in
// DIR/server-N.log) with a new cluster secret (DIR/cluster.secret, mode 0600, passed to each
// server as --secret-file and named by the cluster file), waits until every one has written its
// ready file and answers a stats request, and writes DIR/cluster.json. With `netns`, each server
// gets its own network namespace with its own address on a bridge (fp<tag>br, 10.<net>.0.1/16 on
// the host side), and `delay` adds that one-way delay with tc netem on both directions of every
// server's link, so traffic crosses a real network stack. Down sends SIGTERM (SIGKILL after a grace
// period), waits until no server process is left, deletes the namespaces and the bridge, the
// cluster file and the secret.
//
// Membership on etcd (docs/pool.md "Membership on etcd"): unless `etcd_endpoints` names an
// existing etcd, Up first starts a one-member etcd (data in DIR/etcd, log DIR/etcd.log, client
// port free on 127.0.0.1, or on the bridge's address with `netns` so that servers in their
// namespaces reach it). Every server registers under the cluster's prefix with its own lease
// (coord/membership.h); Up writes the cluster map (epoch 1) once all are ready, and the
// endpoints and prefix into cluster.json. Down stops the etcd it started (and deletes its data)
// or, for a joined etcd, deletes the cluster's keys.
//
// A failed Up stops whatever it started. Every error names the server and its log file.
//
// Thread-safety: functions of one process; two clusters need two directories.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coord/cluster_map.h"
#include "farpool/cluster.h"
#include "farpool/pool.h"
#include "farpool/status.h"
#include "transport/am_server.h"

namespace farpool {

struct LocalClusterOptions {
  std::string dir;
  int servers = 1;
  uint64_t memory = 256ull << 20;
  uint64_t chunk_size = 4ull << 20;
  Fabric transport = Fabric::kAuto;  // written to cluster.json for clients
  ProgressMode progress = ProgressMode::kBusy;
  bool netns = false;
  // Backups of every byte: 0 to servers - 1 (ClusterConfig::replicas). 0 here, for the tests that
  // build clusters with this struct; `farpool cluster up` passes 1 by default with >= 2 servers.
  int replicas = 0;
  // With replicas: each server's mirror slots (ServerOptions::mirror_slots), each as large as
  // --memory. Slot k < replicas keeps the copy of the server k + 1 places before it on the
  // ring; more give re-replication room to
  // restore a backup after a failure (docs/pool.md "Re-replication"). -1: DefaultMirrorSlots
  // for ClusterUp; for ClusterAdd, as many as the cluster's server 0 has.
  int mirror_slots = -1;
  // With replicas 1 (exactly), transport shm or auto, and no network namespaces (every server and
  // client on this host), the backups share their primaries' pages (ClusterConfig::shared_pages,
  // docs/pool.md "Shared-pages backups") unless this asks for forwarded copies instead.
  bool forward_copies = false;
  std::chrono::nanoseconds delay{0};  // requires netns
  std::string binary;                 // path of the farpool executable
  std::chrono::seconds start_timeout{30};
  // An existing etcd to join (http://HOST:PORT each); empty: start a one-member etcd.
  std::vector<std::string> etcd_endpoints;
  // The servers are killed when the thread that ran ClusterUp ends (SpawnDetached's
  // die_with_parent): for tests, so that a killed test leaves no server behind. Off for
  // `farpool cluster up`, whose servers outlive the command.
  bool die_with_parent = false;
  // The servers' etcd lease TTL (`farpool server --lease-ttl-ms`); 0: the server's default
  // (2 s). Tests set a long one to show that a failover came from a revocation
  // (coord/membership.h "Dead peers"), not from a lapsed lease.
  std::chrono::milliseconds lease_ttl{0};
};

// The mirror slots each server of a cluster of `servers` with `replicas` gets unless told
// (docs/pool.md "Re-replication by default"): without replicas, 1 from two servers on (room for
// a drained server's region: ClusterDrain, docs/pool.md "Drain without replicas"), else 0; with
// f replicas, the f the ring's copies need and a spare when there are at least f + 2 servers, so
// that after one failure re-replication finds a free slot for the regions left with fewer copies
// on the survivors; else f (with f + 1 servers no survivor may keep a copy of a region it
// serves). A slot commits memory only once it holds a copy (pool/server/mirror.h), so the spare
// costs address space until then.
int DefaultMirrorSlots(int servers, int replicas);

Status ClusterUp(const LocalClusterOptions& options);
// `farpool cluster add`: starts one more server for the running cluster in options.dir (same
// transport; in a network namespace of its own if the cluster's servers have one), with
// options.memory, .chunk_size, .progress, .mirror_slots (replicated clusters), .binary; waits
// until it is registered in etcd and listening, enters it into the map (epoch + 1, its own
// region, no backup yet), into cluster.json and into every pool's cluster-NAME.json, and
// returns its id. In a replicated cluster it refuses changes until the coordinator has named
// its backup (re-replication, where a free mirror slot exists); its own slots are free for
// other regions. Clients use it, those connected before too: a Pool learns it from the map
// (docs/pool.md "cluster add"). Errors: no etcd in cluster.json, the server's start (its log
// named); nothing is left behind.
Result<uint16_t> ClusterAdd(const LocalClusterOptions& options);
// `farpool cluster drain ID` (docs/pool.md "cluster drain"), replicated clusters: a planned
// failover. Checks first, changing nothing if any fails (InvalidArgument naming why): ID is a
// live server of the cluster serving its own region, not the last one, whose backup is alive,
// and every region it serves from a slot has a live backup too. Without replicas (docs/pool.md
// "Drain without replicas") the backup is made first: a transport tcp cluster (InvalidArgument
// else), ID serving no other region, a live server with a free mirror slot as large
// (ResourceExhausted naming the slots seen else) and the host's memory for the copy
// (ResourceExhausted); ID copies its region there while it serves, the map names the target as
// its backup, and the hand-over below follows (the copy may take `timeout` plus a second per
// 8 MiB of the region, the hand-over `timeout` again). A copy that fails (the target or ID
// dies, its time is up) is given up, the map unchanged, and the drain fails with the reason: the
// region stays on ID, whose acknowledged changes are all there. Then drains it (SIGUSR1: it refuses
// requests unexecuted, which the clients resend to the new holder, hands its regions over to their
// backups, leaves etcd, and stops once the map shows the move: MemoryServer::Drain), and returns
// once the map has its region served by its backup and its process has ended (TimedOut after
// `timeout`). The regions it kept copies of are degraded, and get new copies where slots are free
// (re-replication).
Status ClusterDrain(const std::string& dir, uint16_t id, std::chrono::milliseconds timeout);
Status ClusterDown(const std::string& dir);

struct ServerStatus {
  ServerAddress address;
  bool up = false;
  std::string error;  // why not up
  ServerStats stats;
};
// Asks every server of DIR/cluster.json for its stats (each on its own, so one dead server
// does not hide the others).
Result<std::vector<ServerStatus>> ClusterStatus(const std::string& dir);

// etcd's view of the cluster: the map, who holds a live lease, who coordinates.
struct EtcdView {
  std::string endpoints;  // comma-separated
  std::string prefix;
  coord::ClusterMap map;
  std::vector<uint16_t> alive;  // ids whose alive key exists (their lease is kept alive)
  std::map<uint16_t, uint16_t> mirror_ports;  // by id, from the alive keys (0: none)
  int coordinator = -1;                       // id of the elected coordinator, -1: none
  std::vector<uint16_t> suspected;  // ids that clients reported gone (P/suspect/<id>), standing
};
// Reads it; NotFound if the cluster has no etcd; Unavailable naming the endpoints if etcd does
// not answer.
Result<EtcdView> ClusterEtcdStatus(const std::string& dir);

// Starts the cluster's own etcd member again (after it died or was killed) on its data
// directory and ports, and records its new pid in cluster.json. REQUIRES: the cluster was
// started with its own etcd (not --etcd) and that member is not running.
Status RestartClusterEtcd(const std::string& dir, bool die_with_parent = false);

// A "client host" of the running `--netns` cluster in `dir`: network namespace fp<tag>c<k>
// (k in 0..250) with its own address on the cluster's bridge (10.<net>.255.<k + 1>), from which
// a process reaches the servers and etcd over the bridge as from another machine. Returns the
// namespace's name (`ip netns exec NAME` runs a process there). Needs root. RemoveClientNamespace
// deletes it (best effort; the caller stops its processes first); ClusterDown does not know about
// it.
Result<std::string> AddClientNamespace(const std::string& dir, int k);
void RemoveClientNamespace(const std::string& dir, int k);

std::string ClusterFile(const std::string& dir);
// DIR/cluster.secret: the cluster secret of the cluster in DIR (transport/auth.h).
inline constexpr const char* kSecretFileName = "cluster.secret";
std::string SecretFile(const std::string& dir);

// Pools (tenants; docs/pool.md "Pools"): creates pool `name` of the cluster in `dir`: its
// credential (transport::ClusterSecret::DerivePool of the cluster secret) in
// DIR/pools/NAME.secret, mode 0600, and its clients' cluster file DIR/cluster-NAME.json (the
// cluster file's servers, that secret file, `"pool": NAME`). The servers are not told: they
// derive the pool's key when its clients say hello. Errors: an invalid name, an existing pool
// of that name, or another pool of the cluster with the same id (transport::PoolId).
Status AddPool(const std::string& dir, const std::string& name);
std::string PoolClusterFile(const std::string& dir, const std::string& name);

}  // namespace farpool
