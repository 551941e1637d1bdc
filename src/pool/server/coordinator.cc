#include "pool/server/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "farpool/cluster.h"
#include "pool/control_client.h"
#include "pool/server/mirror.h"

namespace farpool {
namespace {

// How long the coordinator waits for one server's answer: it works on its membership thread,
// whose keepalives (every ttl/4) must not starve.
constexpr std::chrono::milliseconds kAskTimeout{400};

}  // namespace

Coordinator::Coordinator(uint16_t self, std::chrono::milliseconds lease_ttl)
    : self_(self), false_suspicion_(2 * lease_ttl + kServeLease + kLeaseMargin) {}

Result<std::unique_ptr<Coordinator>> Coordinator::Create(uint16_t self,
                                                         const std::string& secret_file,
                                                         std::chrono::milliseconds lease_ttl) {
  std::unique_ptr<Coordinator> c(new Coordinator(self, lease_ttl));
  if (!secret_file.empty()) {
    FARPOOL_ASSIGN_OR_RETURN(c->secret_, transport::ClusterSecret::Read(secret_file));
  }
  return c;
}

Result<std::unique_ptr<control::Connection>> Coordinator::Open(const coord::MapServer& to,
                                                               uint16_t port) const {
  return control::Connection::OpenAsTool(to.id, to.address, port, secret_ ? &*secret_ : nullptr,
                                         kConnectionTag, kAskTimeout);
}

Result<control::Reply> Coordinator::Ask(const coord::MapServer& to, uint16_t port,
                                        const control::Encoder& encode, wire::Opcode expected) {
  const std::pair<uint16_t, uint16_t> key{to.id, port};
  auto kept = open_.find(key);
  if (kept != open_.end()) {
    auto reply = kept->second->Call(encode, expected);
    if (!kept->second->failed()) {
      // No answer in time: the connection is dropped, so that a late answer meets no later ask.
      if (reply.status().code() == StatusCode::kTimedOut) {
        kept->second->CloseNow();
        open_.erase(kept);
      }
      return reply;
    }
    open_.erase(kept);  // lost (the server restarted, or is gone): once more on a fresh one
  }
  FARPOOL_ASSIGN_OR_RETURN(auto connection, Open(to, port));
  auto reply = connection->Call(encode, expected);
  if (connection->failed() || reply.status().code() == StatusCode::kTimedOut) {
    connection->CloseNow();
  } else {
    open_[key] = std::move(connection);
  }
  return reply;
}

void Coordinator::OpenAhead(const coord::ClusterMap& map,
                            const std::map<uint16_t, uint16_t>& mirror_ports) {
  // Those of servers no longer alive (stopped or cut off, maybe: a graceful close would hold
  // this thread, and its keepalives, for up to 2 s).
  std::erase_if(open_, [&](auto& kept) {
    if (mirror_ports.contains(kept.first.first)) return false;
    kept.second->CloseNow();
    return true;
  });
  for (const auto& [id, port] : mirror_ports) {
    const coord::MapServer* to = map.Find(id);
    if (port == 0 || to == nullptr || open_.contains({id, port})) continue;
    auto connection = Open(*to, port);
    if (connection.ok()) open_[{id, port}] = std::move(*connection);
    return;  // one a tick: the membership thread's keepalives must not starve
  }
}

Status Coordinator::AskMirror(const std::map<uint16_t, uint16_t>& mirror_ports,
                              const coord::MapServer& to, const control::Encoder& encode,
                              wire::Opcode expected) {
  auto port = mirror_ports.find(to.id);
  if (port == mirror_ports.end() || port->second == 0) {
    return Status::InvalidArgument("server " + std::to_string(to.id) + " (" + to.address +
                                   ") registered no mirror port");
  }
  return Ask(to, port->second, encode, expected).status();
}

void Coordinator::Degrade(const std::map<uint16_t, uint16_t>& mirror_ports, uint16_t dead,
                          const std::vector<const coord::MapServer*>& predecessors) {
  for (const coord::MapServer* predecessor : predecessors) {
    Status degraded = AskMirror(
        mirror_ports, *predecessor,
        [&](uint64_t id) {
          return wire::Encode(id, wire::DegradeRequest{dead, {}});
        },
        wire::Opcode::kDegradeReply);
    if (!degraded.ok()) {
      // Its forwards to the dead backup fail until told; it is told again by the clients'
      // fallback, or is itself failed over if it is gone too.
      std::printf("farpool coordinator %u: telling server %u that its backup %u is gone: %s\n",
                  self_, predecessor->id, dead, degraded.message().c_str());
    }
  }
}

void Coordinator::DropCopies(const std::map<uint16_t, uint16_t>& mirror_ports,
                             const coord::ClusterMap& map, uint16_t region,
                             const std::vector<coord::MapServer::Backup>& dropped) {
  for (const coord::MapServer::Backup& b : dropped) {
    const coord::MapServer* keeper = map.Find(b.id);
    if (keeper == nullptr) continue;
    // As the region's primary would give it up (wire::kReplicateDetach): the slot frees itself
    // if it still holds that region's copy, unpromoted, and no connection feeds it any more
    // (its primary is the dead server); else it refuses, and nothing changes.
    const wire::ReplicateRequest detach{
        region, static_cast<uint16_t>(b.slot), 0, 0, wire::kReplicateDetach, 0, 0, 0, 0, 0};
    Status told = AskMirror(
        mirror_ports, *keeper, [&](uint64_t id) { return wire::Encode(id, detach); },
        wire::Opcode::kReplicateReply);
    std::printf(
        "farpool coordinator %u: server %u slot %d keeps no copy of server %u's region "
        "any more%s%s\n",
        self_, b.id, b.slot, region, told.ok() ? "" : ": ",
        told.ok() ? "" : told.message().c_str());
  }
  std::fflush(stdout);
}

Result<bool> Coordinator::WriteMap(coord::EtcdClient& etcd, const coord::MapKeys& keys,
                                   int64_t map_revision, const coord::ClusterMap& next) {
  FARPOOL_ASSIGN_OR_RETURN(
      coord::TxnAnswer written,
      etcd.PutIf({{keys.Map(), coord::Compare::Target::kModRevision, map_revision},
                  {keys.Coordinator(), coord::Compare::Target::kCreateRevision, term_}},
                 keys.Map(), next.ToJson()));
  return written.succeeded;
}

bool Coordinator::Tick(coord::EtcdClient& etcd, const coord::MapKeys& keys, int64_t term) {
  // Copies chosen in another term may name a slot that a coordinator in between gave to
  // another region: a new term chooses afresh from the map.
  if (term != term_) {
    copying_.clear();
    failing_.clear();
    told_.clear();
    suspicions_.clear();
  }
  term_ = term;
  auto log_once = [&](const std::string& message) { LogOnce(message); };
  auto all = etcd.GetPrefix(keys.prefix);
  if (!all.ok()) return log_once(all.status().message()), false;
  std::optional<coord::KeyValue> map_kv;
  std::set<uint16_t> alive, suspected;
  std::map<uint16_t, uint16_t> mirror_ports;
  std::map<uint16_t, int64_t> registrations;    // alive keys' create_revisions
  std::map<uint16_t, coord::KeyValue> reports;  // the suspicion keys
  for (const coord::KeyValue& kv : all->kvs) {
    auto id_after = [&](const std::string& prefix) {
      return static_cast<uint16_t>(std::stoul(kv.key.substr(prefix.size())));
    };
    if (kv.key == keys.Map()) {
      map_kv = kv;
    } else if (kv.key.starts_with(keys.AlivePrefix())) {
      const uint16_t id = id_after(keys.AlivePrefix());
      alive.insert(id);
      registrations[id] = kv.create_revision;
      auto value = nlohmann::json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
      if (value.is_object() && value.contains("mirror_port") &&
          value["mirror_port"].is_number_unsigned()) {
        mirror_ports[id] = value["mirror_port"].get<uint16_t>();
      }
    } else if (kv.key.starts_with(keys.SuspectPrefix())) {
      const uint16_t id = id_after(keys.SuspectPrefix());
      suspected.insert(id);
      reports[id] = kv;
    }
  }
  if (!map_kv) return log_once("no cluster map at " + keys.Map()), false;
  auto map = coord::ClusterMap::Parse(map_kv->value, keys.Map());
  if (!map.ok()) return log_once(map.status().message()), false;
  std::set<uint16_t> backed;  // servers that serve a region with a live backup
  for (const coord::MapServer& r : map->servers) {
    for (const coord::MapServer::Backup& b : r.Backups()) {
      if (alive.contains(b.id)) backed.insert(r.served_by);
    }
  }
  DropFalseSuspicions(etcd, keys, registrations, reports, backed, &suspected);
  std::erase_if(failing_, [&](const auto& f) {
    return alive.contains(f.first) && !suspected.contains(f.first);
  });
  auto serves = [&](uint16_t x) {
    return std::any_of(map->servers.begin(), map->servers.end(),
                       [&](const coord::MapServer& r) { return r.served_by == x; });
  };
  for (uint16_t x : suspected) {
    if (!serves(x)) {
      Status cleared = etcd.Delete(keys.Suspect(x));  // failed over already
      (void)cleared;
    }
  }
  // Each region whose server (its own, or the one that took it over) is lost.
  for (const coord::MapServer& s : map->servers) {
    const uint16_t x = s.served_by;
    if (alive.contains(x) && !suspected.contains(x)) continue;
    // The first live backup in ring order takes the region over (its copy has every
    // acknowledged byte: a reply waited for every backup in the map); the others give their
    // copies up (the map drops them, and re-replication restores a backup).
    const coord::MapServer* backup = nullptr;
    int backup_slot = 0;
    for (const coord::MapServer::Backup& b : s.Backups()) {
      if (!alive.contains(b.id)) continue;
      backup = map->Find(b.id);
      backup_slot = b.slot;
      break;
    }
    // The servers that served a region whose backup it was: they stop forwarding to it (the
    // other backups of their regions stay).
    std::vector<const coord::MapServer*> predecessors;
    for (const coord::MapServer& p : map->servers) {
      const coord::MapServer* by = map->Find(p.served_by);
      const std::vector<coord::MapServer::Backup> backups = p.Backups();
      const bool backed_up_by_x =
          std::any_of(backups.begin(), backups.end(),
                      [&](const coord::MapServer::Backup& b) { return b.id == x; });
      if (backed_up_by_x && p.served_by != x && alive.contains(p.served_by) &&
          std::find(predecessors.begin(), predecessors.end(), by) == predecessors.end()) {
        predecessors.push_back(by);
      }
    }
    if (backup == nullptr) {
      log_once("server " + std::to_string(x) + " is gone and server " + std::to_string(s.id) +
               "'s region, which it served, has no live backup");
      // Lost; those that forwarded to the dead server still go on alone, once its lease has
      // lapsed (no promote checks here that it is gone: a suspicion alone is not enough).
      if (predecessors.empty() || alive.contains(x)) continue;
    }
    Failing& failing =
        failing_.try_emplace(x, Failing{std::chrono::steady_clock::now()}).first->second;
    if (backup != nullptr) {
      Status promoted = AskMirror(
          mirror_ports, *backup,
          [&](uint64_t id) {
            return wire::Encode(id, wire::PromoteRequest{s.id, {}});
          },
          wire::Opcode::kPromoteReply);
      if (promoted.code() == StatusCode::kAborted) {  // "not yet": it may be alive; next tick
        ++failing.not_yet;
        failing.last_not_yet = std::chrono::steady_clock::now();
        continue;
      }
      if (!promoted.ok()) {
        log_once("failing server " + std::to_string(s.id) +
                 "'s region over: " + promoted.message());
        continue;
      }
      failing.promoted = true;  // until the map names the backup (the next tick asks again)
    }
    coord::ClusterMap next = *map;
    next.epoch = map->epoch + 1;
    // The region's other live backups, whose copies the new map no longer names.
    std::vector<coord::MapServer::Backup> dropped;
    for (coord::MapServer& m : next.servers) {
      if (m.id == s.id && backup != nullptr) {
        for (const coord::MapServer::Backup& b : m.Backups()) {
          if (b.id != backup->id && alive.contains(b.id)) dropped.push_back(b);
        }
        m.served_by = backup->id;
        m.served_slot = backup_slot;
        m.backup = -1;
        m.more_backups.clear();
      } else {
        m.DropBackup(x);
      }
    }
    auto written = WriteMap(etcd, keys, map_kv->mod_revision, next);
    if (!written.ok() || !*written) {
      log_once("writing the map of epoch " + std::to_string(next.epoch) + ": " +
               (written.ok() ? "the map changed meanwhile, or this server's term as the "
                               "coordinator ended"
                             : written.status().message()));
      return false;  // read again next tick (the promote is idempotent)
    }
    last_error_.clear();  // the suspicion of `x` goes once it serves nothing (above)
    const long long took = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - failing.first_tried)
                               .count();
    const int refusals = failing.not_yet;
    failing_.erase(x);
    // Only once the map no longer names `x` as their backup: a refused write (the term ended)
    // leaves the servers forwarding to every backup the map names.
    Degrade(mirror_ports, x, predecessors);
    DropCopies(mirror_ports, next, s.id, dropped);
    if (backup != nullptr) {
      std::printf(
          "farpool coordinator %u: server %u is gone; server %u serves its region (server %u's, "
          "epoch %lld; %lld ms after this coordinator first found it gone, %d \"not yet\")\n",
          self_, x, backup->id, s.id, static_cast<long long>(next.epoch), took, refusals);
    } else {
      std::printf(
          "farpool coordinator %u: server %u is gone with server %u's region; the servers it "
          "backed up go on alone (epoch %lld)\n",
          self_, x, s.id, static_cast<long long>(next.epoch));
    }
    std::fflush(stdout);
    return true;
  }
  const bool changed = ReReplicate(etcd, keys, *map, map_kv->mod_revision, alive, suspected);
  std::erase_if(mirror_ports, [&](const auto& m) { return suspected.contains(m.first); });
  OpenAhead(*map, mirror_ports);
  return changed;
}

void Coordinator::DropFalseSuspicions(coord::EtcdClient& etcd, const coord::MapKeys& keys,
                                      const std::map<uint16_t, int64_t>& registrations,
                                      const std::map<uint16_t, coord::KeyValue>& reports,
                                      const std::set<uint16_t>& backed,
                                      std::set<uint16_t>* suspected) {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(suspicions_, [&](const auto& s) { return !reports.contains(s.first); });
  for (const auto& [x, report] : reports) {
    auto registered = registrations.find(x);
    if (registered == registrations.end()) {
      suspicions_.erase(x);  // not registered: the failover's to judge, not this
      continue;
    }
    const Suspicion judged{report.mod_revision, registered->second, now};
    auto [seen, fresh] = suspicions_.try_emplace(x, judged);
    if (!fresh && (seen->second.report != judged.report ||
                   seen->second.registration != judged.registration)) {
      seen->second = judged;  // reported again, or registered anew: the wait starts again
    }
    const auto stood = now - seen->second.since;
    if (stood < false_suspicion_) continue;
    if (backed.contains(x)) {
      // Its backup decides: it must have refused for the whole wait, and taken nothing over.
      auto failing = failing_.find(x);
      if (failing == failing_.end() || failing->second.promoted || !failing->second.last_not_yet ||
          *failing->second.last_not_yet - seen->second.since < false_suspicion_) {
        continue;
      }
    }
    auto dropped = etcd.DeleteIf(
        {{keys.Suspect(x), coord::Compare::Target::kModRevision, report.mod_revision}},
        keys.Suspect(x));
    if (!dropped.ok()) {
      LogOnce("dropping the suspicion of server " + std::to_string(x) + ": " +
              dropped.status().message());
      continue;
    }
    suspicions_.erase(x);
    if (!*dropped) continue;  // reported again meanwhile: judged afresh next tick
    suspected->erase(x);
    std::printf(
        "farpool coordinator %u: server %u, reported gone by a client (pid %s), has kept its "
        "etcd registration for %lld ms since: the report was false and is dropped\n",
        self_, x, report.value.c_str(),
        static_cast<long long>(
            std::chrono::duration_cast<std::chrono::milliseconds>(stood).count()));
    std::fflush(stdout);
  }
}

Result<wire::BackupReply> Coordinator::AskBackup(const coord::MapServer& primary,
                                                 const coord::MapServer& region,
                                                 const coord::MapServer* target, int slot) {
  FARPOOL_ASSIGN_OR_RETURN(auto at, ParseHostPort(primary.address));
  std::pair<std::string, uint16_t> to{"", 0};
  if (target != nullptr) {
    FARPOOL_ASSIGN_OR_RETURN(to, ParseHostPort(target->address));
  }
  std::vector<wire::MapBackup> named;
  for (const coord::MapServer::Backup& b : region.Backups()) {
    named.push_back({b.id, static_cast<uint16_t>(b.slot)});
  }
  FARPOOL_ASSIGN_OR_RETURN(
      wire::BackupRequest request,
      wire::MakeBackupRequest(target != nullptr ? target->id : wire::kNoBackup, to.first, to.second,
                              region.id, static_cast<uint16_t>(slot), term_, named));
  FARPOOL_ASSIGN_OR_RETURN(
      auto reply, Ask(
                      primary, at.second,
                      [&](uint64_t id) { return wire::EncodeBackupRequest(id, request, named); },
                      wire::Opcode::kBackupReply));
  return reply.message.As<wire::BackupReply>();
}

bool Coordinator::ReReplicate(coord::EtcdClient& etcd, const coord::MapKeys& keys,
                              const coord::ClusterMap& map, int64_t map_revision,
                              const std::set<uint16_t>& alive,
                              const std::set<uint16_t>& suspected) {
  if (map.replicas == 0) return false;
  auto healthy = [&](uint16_t id) { return alive.contains(id) && !suspected.contains(id); };
  const size_t n = map.servers.size();
  for (size_t i = 0; i < n; ++i) {
    const coord::MapServer& r = map.servers[i];
    const std::vector<coord::MapServer::Backup> backups = r.Backups();
    // A region served with fewer than f backups (f = replicas), by its own server or from a
    // promoted slot: one more copy at a time (see the header).
    if (static_cast<int>(backups.size()) >= map.replicas || !healthy(r.served_by)) {
      copying_.erase(r.id);
      continue;
    }
    auto keeps_copy = [&](uint16_t id) {
      return id == r.served_by ||
             std::any_of(backups.begin(), backups.end(), [&](const auto& b) { return b.id == id; });
    };
    auto chosen = copying_.find(r.id);
    const coord::MapServer* target =
        chosen == copying_.end() ? nullptr : map.Find(chosen->second.first);
    int slot = chosen == copying_.end() ? 0 : chosen->second.second;
    if (target == nullptr || !healthy(target->id) || keeps_copy(target->id)) {
      // The first server in ring order after the region's own with a free slot; it keeps no
      // copy of the region yet and serves its own region (not drained, not failed over).
      target = nullptr;
      for (size_t k = 1; k < n && target == nullptr; ++k) {
        const coord::MapServer& t = map.servers[(i + k) % n];
        if (t.id == r.id || keeps_copy(t.id) || t.served_by != t.id || !healthy(t.id) ||
            t.memory < r.memory) {
          continue;
        }
        // The map's, and those that copies under way for other regions are filling.
        std::vector<int> used = map.SlotsInUse(t.id);
        for (const auto& [region, under_way] : copying_) {
          if (region != r.id && under_way.first == t.id) used.push_back(under_way.second);
        }
        if (static_cast<int>(t.slots) <= static_cast<int>(used.size())) continue;
        target = &t;
        slot = 0;
        while (std::find(used.begin(), used.end(), slot) != used.end()) ++slot;
      }
      if (target == nullptr) {
        LogOnce("server " + std::to_string(r.id) + "'s region has " +
                std::to_string(backups.size() + 1) + " of " + std::to_string(map.replicas + 1) +
                " copies and no live server has a free mirror slot for another (keeping none yet)");
        copying_.erase(r.id);
        // Once per map epoch its server hears the map's backups all the same: it gives up a
        // copy the map does not name (a reply lost, a map write that failed), whose server's
        // death would otherwise fail its every round, since nobody degrades it.
        auto& epoch = told_[r.id];
        if (epoch != map.epoch) {
          auto told = AskBackup(*map.Find(r.served_by), r, nullptr, 0);
          if (told.ok()) {
            epoch = map.epoch;
          } else {
            LogOnce("telling server " + std::to_string(r.served_by) + " the map's backups of " +
                    "server " + std::to_string(r.id) + "'s region: " + told.status().message());
          }
        }
        continue;
      }
      copying_[r.id] = {target->id, slot};
    }
    auto answer = AskBackup(*map.Find(r.served_by), r, target, slot);
    if (!answer.ok()) {
      LogOnce("re-replicating server " + std::to_string(r.id) + "'s region to server " +
              std::to_string(target->id) + ": " + answer.status().message());
      continue;
    }
    if (answer->slot != slot) {
      // The server copies to (or has copied to) another slot of that target already: a copy an
      // earlier coordinator chose. Named as it is, so that the map names the very copies the
      // server forwards to, unless the map or a copy under way gives that slot to another
      // region (then the server's forwards into it are refused, and it gives the copy up).
      std::vector<int> used = map.SlotsInUse(target->id);
      for (const auto& [region, under_way] : copying_) {
        if (region != r.id && under_way.first == target->id) used.push_back(under_way.second);
      }
      if (std::find(used.begin(), used.end(), answer->slot) != used.end()) {
        LogOnce("re-replicating server " + std::to_string(r.id) + "'s region: its copy on server " +
                std::to_string(target->id) + " is in slot " + std::to_string(answer->slot) +
                ", which holds another region's");
        continue;
      }
      slot = answer->slot;
      copying_[r.id] = {target->id, slot};
    }
    if (answer->remaining > 0) continue;  // copying; asked again next tick
    coord::ClusterMap next = map;
    next.epoch = map.epoch + 1;
    for (coord::MapServer& m : next.servers) {
      if (m.id != r.id) continue;
      if (m.backup < 0) {
        m.backup = target->id;
        m.backup_slot = slot;
      } else {
        m.more_backups.push_back({target->id, slot});
      }
    }
    auto written = WriteMap(etcd, keys, map_revision, next);
    if (!written.ok() || !*written) return false;  // read again next tick
    std::printf(
        "farpool coordinator %u: server %u's region has %zu of %d copies again: server %u, slot "
        "%d keeps one (epoch %lld)\n",
        self_, r.id, backups.size() + 2, map.replicas + 1, target->id, slot,
        static_cast<long long>(next.epoch));
    std::fflush(stdout);
    copying_.erase(r.id);
    return true;
  }
  return false;
}

}  // namespace farpool
