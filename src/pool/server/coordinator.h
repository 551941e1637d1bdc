// Coordinator: the failover decisions of a replicated cluster, taken by the one server that
// etcd elected (coord/membership.h) instead of by clients racing (docs/pool.md "Membership on
// etcd").
//
// How it works: Tick (run every 100 ms on the coordinator's membership thread) reads the
// cluster's keys in one range: the map, the alive keys, and the suspicions clients reported
// (MapKeys::Suspect); the alive keys carry each server's mirror port, so that the coordinator
// never asks a server's main loop, which may be blocked waiting for a dead backup. A server that
// still serves its own region, has a backup, and is either not alive (its lease lapsed) or
// suspected is a candidate. For the first candidate it asks the backup to take the region over
// (PromoteRequest on the backup's mirror port) and the server whose backup the candidate was to
// stop forwarding to it (DegradeRequest), then writes the new map — the region served by the
// backup, no backup left for either region, epoch + 1 — by a txn on the map's mod_revision, and
// deletes the suspicion. Clients follow the epoch (pool.cc, Pool's monitor).
//
// Safety does not rest on the coordinator's judgement: the backup promotes only when its
// primary's connection has closed or the primary's serving lease from it has lapsed
// (pool/server/mirror.h), and answers "not yet" (Aborted) otherwise; the coordinator then
// tries again next tick, and a false suspicion of a live server never takes effect. A map
// write that loses its txn (the map changed meanwhile) is retried from the new map. One
// failure at a time (replicas 1): a candidate whose backup is not alive is left alone.
//
// Thread-safety: Tick from one thread (the membership thread).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "coord/cluster_map.h"
#include "coord/etcd_client.h"
#include "farpool/status.h"
#include "transport/auth.h"

namespace farpool {

class Coordinator {
 public:
  // `secret_file` empty: the servers have no secret.
  static Result<std::unique_ptr<Coordinator>> Create(uint16_t self, const std::string& secret_file);

  // One round; errors are logged and retried next round, not returned (the coordinator keeps
  // coordinating). Returns whether a failover completed this round.
  bool Tick(coord::EtcdClient& etcd, const coord::MapKeys& keys);

 private:
  explicit Coordinator(uint16_t self) : self_(self) {}
  // Promote + Degrade; OK, Aborted ("not yet") or the failure.
  // `mirror_ports`: by server id, from the alive keys.
  Status FailOver(const std::map<uint16_t, uint16_t>& mirror_ports, const coord::MapServer& dead,
                  const coord::MapServer& backup, const coord::MapServer* predecessor);

  const uint16_t self_;
  std::optional<transport::ClusterSecret> secret_;
  std::string last_error_;  // not repeated in the log every tick
};

}  // namespace farpool
