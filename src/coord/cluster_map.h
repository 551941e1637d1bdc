// The cluster map as etcd holds it (docs/pool.md "Membership on etcd"): which servers there
// are, where they listen, which server serves each server's region now and which keeps its
// backup, and an epoch that every change of that placement raises.
//
// Keys under a cluster's prefix P ("/farpool/<16 hex digits>/", one per `cluster up`):
//   P + "map"          the ClusterMap as JSON. Written once by `cluster up`; from then on
//                      changed only by a txn on its mod_revision (so two writers cannot both
//                      apply a change to the same map), and every change raises `epoch`.
//   P + "alive/<id>"   put by server <id> with its etcd lease (TTL ~2 s, kept alive by the
//                      server): present exactly while the server lives and reaches etcd.
//   P + "coordinator"  the id of the coordinator, put under its lease by a txn that requires
//                      the key not to exist (create_revision == 0): at most one at a time.
//   P + "suspect/<id>" put by a client that lost server <id>: the coordinator checks it
//                      (pool/server/coordinator.h) without waiting for the lease to lapse.
//
// Thread-safety: value types and plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/status.h"

namespace farpool::coord {

struct MapServer {
  uint16_t id = 0;
  std::string address;  // HOST:PORT of its control port
  uint64_t memory = 0;
  // Which server serves this server's region now: its own id until it fails over to its
  // backup, then the backup's id.
  uint16_t served_by = 0;
  // The server that keeps a copy of this region (its first backup), or -1: none (replicas 0,
  // or every backup took a region over or was lost, and it has one copy left).
  int backup = -1;
  // Where the region lives at served_by: -1 its own part, else mirror slot k (at
  // (1 + k) x served_by's own region size in served_by's region); and the mirror slot of
  // `backup` that keeps the copy (docs/pool.md "Re-replication").
  int served_slot = -1;
  int backup_slot = 0;
  // How many mirror slots this server has (ServerOptions::mirror_slots).
  uint32_t slots = 0;
  // The further backups of this region (replicas f >= 2), in ring order after `backup`: the
  // server and its mirror slot that keep a copy too (docs/pool.md "Replication with f
  // backups"). The region's server forwards every round to `backup` and to each of these. Empty
  // unless `backup` >= 0.
  struct Backup {
    uint16_t id = 0;
    int slot = 0;
    bool operator==(const Backup&) const = default;
  };
  std::vector<Backup> more_backups;
  // `backup` and then `more_backups`, in the order a failover tries them.
  std::vector<Backup> Backups() const;
  // Takes server `id` out of the backups (the first further one becomes `backup` if it was
  // that one). Returns whether it was one.
  bool DropBackup(uint16_t id);
};

struct ClusterMap {
  int64_t epoch = 1;
  int replicas = 0;
  std::vector<MapServer> servers;

  // nullptr if `id` is not in the map.
  const MapServer* Find(uint16_t id) const;
  // The mirror slots of server `id` that hold a region (served from there or kept as a backup).
  std::vector<int> SlotsInUse(uint16_t id) const;
  std::string ToJson() const;
  // InvalidArgument naming `origin` and the field for anything that is not a map.
  static Result<ClusterMap> Parse(std::string_view json, std::string_view origin);
};

// The keys of one cluster. REQUIRES: prefix ends with '/'.
struct MapKeys {
  std::string prefix;
  std::string Map() const { return prefix + "map"; }
  std::string AlivePrefix() const { return prefix + "alive/"; }
  std::string Alive(uint16_t id) const { return AlivePrefix() + std::to_string(id); }
  std::string Coordinator() const { return prefix + "coordinator"; }
  std::string SuspectPrefix() const { return prefix + "suspect/"; }
  std::string Suspect(uint16_t id) const { return SuspectPrefix() + std::to_string(id); }
};

// A fresh prefix "/farpool/<16 random hex digits>/" for a new cluster.
std::string NewClusterPrefix();

}  // namespace farpool::coord
