// Coordinator: the failover decisions of a replicated cluster, taken by the one server that
// etcd elected (coord/membership.h) instead of by clients racing (docs/pool.md "Membership on
// etcd").
//
// How it works: Tick (run every 100 ms on the coordinator's membership thread) reads the
// cluster's keys in one range: the map, the alive keys, and the suspicions clients reported
// (MapKeys::Suspect); the alive keys carry each server's mirror port, so that the coordinator
// never asks a server's main loop, which may be blocked waiting for a dead backup. A region
// whose server (its own, or the one that took it over) is either not alive (its lease lapsed)
// or suspected, and which has a live backup, is a candidate. For the first candidate it asks
// its first live backup in ring order (MapServer::Backups) to take the region over
// (PromoteRequest on the backup's mirror port), then writes the new map — the region served by
// that backup from its slot with no backups, the lost server dropped from every other region's
// backups, epoch + 1 — by a txn on the map's mod_revision, and only once that write succeeded
// tells every server that serves a region whose backup the lost server was to stop forwarding
// to it (DegradeRequest), and the region's other live backups to give their copies up
// (DropCopies: their slots' memory goes back). Several lost servers are failed over one per
// tick. A
// suspicion is deleted once its server serves nothing. Clients follow the epoch (pool.cc,
// Pool's monitor).
//
// False suspicions (decision, docs/pool.md "Suspicions of live servers"): a client that lost its
// connections (evicted, or a broken link of its own) reports a server that is alive. Such a
// suspicion would stand for ever: the server's region is never copied again (a suspected
// server serves no copy) and gets no copies of others. A dead or stopped server loses its etcd
// lease within the TTL, and its backup promotes once its serving lease lapses (kServeLease), so
// a suspicion of a server that has kept one registration (its alive key's create_revision)
// for 2 TTLs + kServeLease + kLeaseMargin since this coordinator first saw the report (its
// mod_revision: a client that reports again starts the wait afresh) was false, provided that
// the backup that decides agrees: where the server serves a region with a live backup, that
// backup must still have answered "not yet" to a promote at the end of the wait (a wait that
// the coordinator spent cut off from etcd, or asking nobody, proves nothing), and no promote may
// have been taken whose map write has not landed. Then the coordinator deletes it (a txn on
// that mod_revision) and logs it with the reporter's pid.
//
// Re-replication (docs/pool.md "Re-replication", "Replication with f backups"): in a round
// without a failover, every region served with fewer than f = replicas backups (a backup
// failed, or it is served from a promoted slot) gets one more where a live server that keeps
// no copy of it has a free mirror slot (MapServer::slots minus ClusterMap::SlotsInUse), the
// first such in ring order after the region's own server: the coordinator names that server
// and slot to the server that serves the region (BackupRequest on its main port), which copies
// the region in slices while it serves; each tick asks again, and once the answer says the
// copy is complete the map records the backup (`backup`, else appended to `more_backups`;
// epoch + 1) by a txn as above. Every BackupRequest carries the coordinator's term and the
// region's backups in the map it read: the server gives up the region's copies that neither the
// request nor the map names (a reply this coordinator lost, an earlier term's choice) and refuses
// a request of a term older than one it was sent before; a region below f copies that no server
// has room for gets such a request without a target once per map epoch (docs/pool.md "The map's
// backups in the request"). One copy per region at a time (several regions copy at once):
// a primary connects one link per region at a time (ConfigureSlotBackup), and a region's copy
// that finishes first is a backup sooner than two that share the primary's loop. A target
// that dies meanwhile is replaced by another at the next tick (the server gives the old copy
// up).
//
// Safety does not rest on the coordinator's judgement: the backup promotes only when its
// primary's connection has closed or the primary's serving lease from it has lapsed
// (pool/server/mirror.h), and answers "not yet" (Aborted) otherwise; the coordinator then
// tries again next tick, and a false suspicion of a live server never takes effect. A map
// write that loses its txn (the map changed meanwhile) is retried from the new map. A
// candidate none of whose backups is alive has lost its region (more failures than replicas).
// Every map write also compares the coordinator key's create_revision with the term Tick is
// handed (coord/membership.h): a coordinator whose key lapsed or was revoked while it went on
// (cut off from etcd, or deposed between two ticks) has its write refused once another server
// holds the key, or nobody does (docs/pool.md "The coordinator's term").
//
// Connections kept open (decision, branch `failfast`): each ask used to open a connection of its
// own (a UCX context and worker, the challenge, the hello): 350 ms per ask on the loaded 2-core
// VM, and a failover asks twice in a row (promote, then degrade) while the primary whose backup
// died fails its held replies after its forward's 1 s backup_timeout. The coordinator now keeps
// one connection per server and port, opens the mirror ports' ahead (one a tick, while nothing
// else is to do), and reuses them: an ask is one round trip. A kept connection that has failed
// is dropped and the ask made once more on a fresh one; one whose answer did not come in time is
// closed (at once: a graceful close waits up to 2 s for a stopped peer), as are those of servers
// whose alive key went.
//
// Thread-safety: Tick from one thread (the membership thread).
#pragma once

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coord/cluster_map.h"
#include "coord/etcd_client.h"
#include "farpool/status.h"
#include "pool/control_client.h"
#include "transport/auth.h"
#include "transport/wire.h"

namespace farpool {

class Coordinator {
 public:
  // The process tag of the coordinator's connections (the low 32 bits of their hellos'
  // client_nonce): a server whose connection with this tag closes has lost the coordinator's
  // connection, and has its membership probe the coordinator (Mirror's on_coordinator_closed,
  // coord/membership.h "Dead peers"). A client whose random tag is the same only causes probes.
  static constexpr uint32_t kConnectionTag = 0xc00d;

  // `secret_file` empty: the servers have no secret. `lease_ttl`: the servers' etcd lease
  // (coord::Membership::Options::ttl), on which the judgement of suspicions rests.
  static Result<std::unique_ptr<Coordinator>> Create(uint16_t self, const std::string& secret_file,
                                                     std::chrono::milliseconds lease_ttl);

  // One round; errors are logged and retried next round, not returned (the coordinator keeps
  // coordinating). Returns whether a failover completed this round. `term`: the
  // create_revision of the coordinator key this server holds (Membership's election).
  bool Tick(coord::EtcdClient& etcd, const coord::MapKeys& keys, int64_t term);

 private:
  Coordinator(uint16_t self, std::chrono::milliseconds lease_ttl);
  // Deletes the suspicions (`reports`, by server id) of servers that have kept their
  // registration (`registrations`: alive keys' create_revisions) for false_suspicion_ since this
  // coordinator first saw the report and (if they serve a region that has a live backup, the
  // set `backed`) whose backup still answered "not yet" to a promote that long after, with no
  // promote taken (see the header); takes them out of `suspected`.
  void DropFalseSuspicions(coord::EtcdClient& etcd, const coord::MapKeys& keys,
                           const std::map<uint16_t, int64_t>& registrations,
                           const std::map<uint16_t, coord::KeyValue>& reports,
                           const std::set<uint16_t>& backed, std::set<uint16_t>* suspected);
  // A connection to server `to` on `port`, the hello said.
  Result<std::unique_ptr<control::Connection>> Open(const coord::MapServer& to,
                                                    uint16_t port) const;
  // One request to server `to` on `port` (its mirror's or its main one) and its reply, on the
  // connection kept for them (opened if none; see the header).
  Result<control::Reply> Ask(const coord::MapServer& to, uint16_t port,
                             const control::Encoder& encode, wire::Opcode expected);
  // Opens the connection to one live server's mirror port that is not open yet, and closes
  // (at once, CloseNow) the connections to servers no longer alive.
  void OpenAhead(const coord::ClusterMap& map, const std::map<uint16_t, uint16_t>& mirror_ports);
  // One request to server `to` on its mirror port (`mirror_ports`: by server id, from the
  // alive keys): the loop that takes promotes, degrades and detaches even while the server's
  // main loop waits for a dead backup. OK, Aborted ("not yet", a promote) or the failure.
  Status AskMirror(const std::map<uint16_t, uint16_t>& mirror_ports, const coord::MapServer& to,
                   const control::Encoder& encode, wire::Opcode expected);
  // Tells `predecessors` that their backup, server `dead`, is gone (DegradeRequest); a failure
  // is logged (the clients' fallback tells them too).
  void Degrade(const std::map<uint16_t, uint16_t>& mirror_ports, uint16_t dead,
               const std::vector<const coord::MapServer*>& predecessors);
  // Tells the live servers of `dropped`, copies of server `region`'s region that `map` (just
  // written) no longer names, to give their slots up (a ReplicateRequest with
  // wire::kReplicateDetach, as the region's primary sends one): their memory goes back at once.
  // A slot that holds another copy by then, was promoted, or is still fed by a live connection
  // (a copy a newer coordinator named there again: this one may be deposed by then) refuses it
  // (logged, harmless; the memory stays until the slot is attached again).
  void DropCopies(const std::map<uint16_t, uint16_t>& mirror_ports, const coord::ClusterMap& map,
                  uint16_t region, const std::vector<coord::MapServer::Backup>& dropped);
  // Writes `next` as the map if the map is still at `map_revision` and the coordinator key
  // still has this coordinator's term_: whether it was written.
  Result<bool> WriteMap(coord::EtcdClient& etcd, const coord::MapKeys& keys, int64_t map_revision,
                        const coord::ClusterMap& next);
  // One round of re-replication (see the header); whether the map changed.
  bool ReReplicate(coord::EtcdClient& etcd, const coord::MapKeys& keys,
                   const coord::ClusterMap& map, int64_t map_revision,
                   const std::set<uint16_t>& alive, const std::set<uint16_t>& suspected);
  // A BackupRequest naming `target`'s `slot` for `region` (its map entry) to `primary`, the
  // server that serves it, in term_ and with the region's backups in the map: the bytes it has
  // left to copy, and the slot of `target` its copy is in (another than `slot` if it keeps one
  // there already). The primary gives up the region's copies that neither names, and refuses
  // the request if it has been sent a later term's. `target` nullptr: names none
  // (wire::kNoBackup), the primary only gives up.
  Result<wire::BackupReply> AskBackup(const coord::MapServer& primary,
                                      const coord::MapServer& region,
                                      const coord::MapServer* target, int slot);
  void LogOnce(const std::string& message) {
    if (message == last_error_) return;
    last_error_ = message;
    std::printf("farpool coordinator %u: %s\n", self_, message.c_str());
    std::fflush(stdout);
  }

  const uint16_t self_;
  // How long a suspicion of a server that keeps its registration stands (see the header).
  const std::chrono::milliseconds false_suspicion_;
  std::optional<transport::ClusterSecret> secret_;
  std::string last_error_;  // not repeated in the log every tick
  int64_t term_ = 0;        // Tick's `term`
  // The connections kept open, by (server id, port).
  std::map<std::pair<uint16_t, uint16_t>, std::unique_ptr<control::Connection>> open_;
  // Re-replications under way, one per region: region -> (target server, slot).
  std::map<uint16_t, std::pair<uint16_t, int>> copying_;
  // Regions below their copies with no target, by region: the map epoch at which their server
  // was last sent the map's backups alone (AskBackup without a target), in this term.
  std::map<uint16_t, int64_t> told_;
  // Lost servers whose failover has not landed yet: when this coordinator first tried it, how
  // many "not yet" its backups answered since (for the log line of the failover), when the
  // latest came, and whether a backup took a region over (a promote that was answered OK and
  // whose map write has not landed yet).
  struct Failing {
    std::chrono::steady_clock::time_point first_tried;
    int not_yet = 0;
    std::optional<std::chrono::steady_clock::time_point> last_not_yet;
    bool promoted = false;
  };
  std::map<uint16_t, Failing> failing_;
  // The suspicions of registered servers, by server id: the report's mod_revision and the
  // registration's create_revision this coordinator judges, and when it first saw them.
  struct Suspicion {
    int64_t report = 0;
    int64_t registration = 0;
    std::chrono::steady_clock::time_point since;
  };
  std::map<uint16_t, Suspicion> suspicions_;
};

}  // namespace farpool
