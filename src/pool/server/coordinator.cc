#include "pool/server/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "farpool/cluster.h"
#include "pool/control_client.h"

namespace farpool {
namespace {

// How long the coordinator waits for one server's answer: it works on its membership thread,
// whose keepalives (every ttl/4) must not starve.
constexpr std::chrono::milliseconds kAskTimeout{400};

}  // namespace

Result<std::unique_ptr<Coordinator>> Coordinator::Create(uint16_t self,
                                                         const std::string& secret_file) {
  std::unique_ptr<Coordinator> c(new Coordinator(self));
  if (!secret_file.empty()) {
    FARPOOL_ASSIGN_OR_RETURN(c->secret_, transport::ClusterSecret::Read(secret_file));
  }
  return c;
}

Status Coordinator::FailOver(const std::map<uint16_t, uint16_t>& mirror_ports,
                             const coord::MapServer& dead, const coord::MapServer& backup,
                             const std::vector<const coord::MapServer*>& predecessors) {
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = (static_cast<uint64_t>(getpid()) << 32) | 0xc00d;  // tag nonzero
  // Asks `to` on its mirror port: the loop that takes promotes and degrades even while the
  // main loop waits for a dead backup.
  auto ask_mirror = [&](const coord::MapServer& to, const control::Encoder& encode,
                        wire::Opcode expected) -> Status {
    FARPOOL_ASSIGN_OR_RETURN(auto hp, ParseHostPort(to.address));
    control::Connection::Options o;
    o.name = "server " + std::to_string(to.id) + " (" + to.address + ")";
    o.host = hp.first;
    auto port = mirror_ports.find(to.id);
    if (port == mirror_ports.end() || port->second == 0) {
      return Status::InvalidArgument(o.name + " registered no mirror port");
    }
    o.port = port->second;
    o.secret = secret_ ? &*secret_ : nullptr;
    o.fabric = Fabric::kTcp;
    o.timeout = kAskTimeout;
    FARPOOL_ASSIGN_OR_RETURN(auto mirror, control::Connection::Open(o, hello));
    return mirror->Call(encode, expected).status();
  };
  FARPOOL_RETURN_IF_ERROR(ask_mirror(
      backup,
      [&](uint64_t id) {
        return wire::Encode(id, wire::PromoteRequest{dead.id, {}});
      },
      wire::Opcode::kPromoteReply));
  for (const coord::MapServer* predecessor : predecessors) {
    Status degraded = ask_mirror(
        *predecessor,
        [&](uint64_t id) {
          return wire::Encode(id, wire::DegradeRequest{dead.id, {}});
        },
        wire::Opcode::kDegradeReply);
    if (!degraded.ok()) {
      // Its forwards to the dead backup fail until told; it is told again by the clients'
      // fallback, or is itself failed over if it is gone too.
      std::printf("farpool coordinator %u: telling server %u that its backup %u is gone: %s\n",
                  self_, predecessor->id, dead.id, degraded.message().c_str());
    }
  }
  return Status::Ok();
}

bool Coordinator::Tick(coord::EtcdClient& etcd, const coord::MapKeys& keys) {
  auto log_once = [&](const std::string& message) { LogOnce(message); };
  auto all = etcd.GetPrefix(keys.prefix);
  if (!all.ok()) return log_once(all.status().message()), false;
  std::optional<coord::KeyValue> map_kv;
  std::set<uint16_t> alive, suspected;
  std::map<uint16_t, uint16_t> mirror_ports;
  for (const coord::KeyValue& kv : all->kvs) {
    auto id_after = [&](const std::string& prefix) {
      return static_cast<uint16_t>(std::stoul(kv.key.substr(prefix.size())));
    };
    if (kv.key == keys.Map()) {
      map_kv = kv;
    } else if (kv.key.starts_with(keys.AlivePrefix())) {
      const uint16_t id = id_after(keys.AlivePrefix());
      alive.insert(id);
      auto value = nlohmann::json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
      if (value.is_object() && value.contains("mirror_port") &&
          value["mirror_port"].is_number_unsigned()) {
        mirror_ports[id] = value["mirror_port"].get<uint16_t>();
      }
    } else if (kv.key.starts_with(keys.SuspectPrefix())) {
      suspected.insert(id_after(keys.SuspectPrefix()));
    }
  }
  if (!map_kv) return log_once("no cluster map at " + keys.Map()), false;
  auto map = coord::ClusterMap::Parse(map_kv->value, keys.Map());
  if (!map.ok()) return log_once(map.status().message()), false;
  for (const coord::MapServer& s : map->servers) {
    const bool lost = !alive.contains(s.id) || suspected.contains(s.id);
    if (s.served_by != s.id || !lost) {
      if (suspected.contains(s.id) && s.served_by != s.id) {
        Status cleared = etcd.Delete(keys.Suspect(s.id));  // already failed over
        (void)cleared;
      }
      continue;
    }
    if (s.backup < 0 || !alive.contains(static_cast<uint16_t>(s.backup))) {
      log_once("server " + std::to_string(s.id) + " is gone and has no live backup");
      continue;
    }
    const coord::MapServer& backup = *map->Find(static_cast<uint16_t>(s.backup));
    // The servers whose backup it was: they go on alone.
    std::vector<const coord::MapServer*> predecessors;
    for (const coord::MapServer& p : map->servers) {
      if (p.backup == s.id && p.id != s.id && p.served_by == p.id && alive.contains(p.id)) {
        predecessors.push_back(&p);
      }
    }
    Status done = FailOver(mirror_ports, s, backup, predecessors);
    if (done.code() == StatusCode::kAborted) continue;  // "not yet": it may be alive; next tick
    if (!done.ok()) {
      log_once("failing server " + std::to_string(s.id) + " over to " + std::to_string(backup.id) +
               ": " + done.message());
      continue;
    }
    coord::ClusterMap next = *map;
    next.epoch = map->epoch + 1;
    for (coord::MapServer& m : next.servers) {
      if (m.id == s.id) {
        m.served_by = backup.id;
        m.served_slot = s.backup_slot;
        m.backup = -1;
      } else if (std::any_of(predecessors.begin(), predecessors.end(),
                             [&](const coord::MapServer* p) { return p->id == m.id; })) {
        m.backup = -1;
      }
    }
    auto written =
        etcd.PutIf({{keys.Map(), coord::Compare::Target::kModRevision, map_kv->mod_revision}},
                   keys.Map(), next.ToJson());
    if (!written.ok() || !written->succeeded) {
      log_once("writing the map of epoch " + std::to_string(next.epoch) + ": " +
               (written.ok() ? "the map changed meanwhile" : written.status().message()));
      return false;  // read again next tick (the promote is idempotent)
    }
    Status cleared = etcd.Delete(keys.Suspect(s.id));
    (void)cleared;  // a leftover suspicion of a failed-over server is ignored and deleted later
    last_error_.clear();
    std::printf(
        "farpool coordinator %u: server %u is gone; server %u serves its region (epoch "
        "%lld)\n",
        self_, s.id, backup.id, static_cast<long long>(next.epoch));
    return true;
  }
  return ReReplicate(etcd, keys, *map, map_kv->mod_revision, alive, suspected);
}

Result<uint64_t> Coordinator::AskBackup(const coord::MapServer& primary,
                                        const coord::MapServer& target, int slot) {
  FARPOOL_ASSIGN_OR_RETURN(auto at, ParseHostPort(primary.address));
  FARPOOL_ASSIGN_OR_RETURN(auto to, ParseHostPort(target.address));
  wire::BackupRequest request{};
  request.backup_id = target.id;
  request.port = to.second;
  request.slot = static_cast<uint16_t>(slot);
  if (to.first.size() >= sizeof(request.host)) {
    return Status::InvalidArgument("host name too long: " + to.first);
  }
  std::memcpy(request.host, to.first.data(), to.first.size());
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = (static_cast<uint64_t>(getpid()) << 32) | 0xc00e;  // tag nonzero
  control::Connection::Options o;
  o.name = "server " + std::to_string(primary.id) + " (" + primary.address + ")";
  o.host = at.first;
  o.port = at.second;
  o.secret = secret_ ? &*secret_ : nullptr;
  o.fabric = Fabric::kTcp;
  o.timeout = kAskTimeout;
  FARPOOL_ASSIGN_OR_RETURN(auto server, control::Connection::Open(o, hello));
  FARPOOL_ASSIGN_OR_RETURN(auto reply,
                           server->Call([&](uint64_t id) { return wire::Encode(id, request); },
                                        wire::Opcode::kBackupReply));
  return reply.message.As<wire::BackupReply>().remaining;
}

bool Coordinator::ReReplicate(coord::EtcdClient& etcd, const coord::MapKeys& keys,
                              const coord::ClusterMap& map, int64_t map_revision,
                              const std::set<uint16_t>& alive,
                              const std::set<uint16_t>& suspected) {
  if (map.replicas == 0) return false;
  auto healthy = [&](uint16_t id) { return alive.contains(id) && !suspected.contains(id); };
  for (const coord::MapServer& r : map.servers) {
    // A region its own server serves with one copy. (A region served from a promoted slot is
    // not re-replicated yet: docs/pool.md "Re-replication".)
    if (r.served_by != r.id || r.backup >= 0 || !healthy(r.id)) {
      copying_.erase(r.id);
      continue;
    }
    auto chosen = copying_.find(r.id);
    const coord::MapServer* target =
        chosen == copying_.end() ? nullptr : map.Find(chosen->second.first);
    int slot = chosen == copying_.end() ? 0 : chosen->second.second;
    if (target == nullptr || !healthy(target->id)) {
      // The server with the most free slots (then the lowest id); its slots hold the region.
      target = nullptr;
      int most = 0;
      for (const coord::MapServer& t : map.servers) {
        if (t.id == r.id || t.served_by != t.id || !healthy(t.id) || t.memory < r.memory) continue;
        const std::vector<int> used = map.SlotsInUse(t.id);
        const int free = static_cast<int>(t.slots) - static_cast<int>(used.size());
        if (free <= most) continue;
        most = free;
        target = &t;
        slot = 0;
        while (std::find(used.begin(), used.end(), slot) != used.end()) ++slot;
      }
      if (target == nullptr) {
        LogOnce("server " + std::to_string(r.id) +
                "'s region has one copy and no live server has a free mirror slot for another");
        copying_.erase(r.id);
        continue;
      }
      copying_[r.id] = {target->id, slot};
    }
    auto remaining = AskBackup(r, *target, slot);
    if (!remaining.ok()) {
      LogOnce("re-replicating server " + std::to_string(r.id) + "'s region to server " +
              std::to_string(target->id) + ": " + remaining.status().message());
      continue;
    }
    if (*remaining > 0) continue;  // copying; asked again next tick
    coord::ClusterMap next = map;
    next.epoch = map.epoch + 1;
    for (coord::MapServer& m : next.servers) {
      if (m.id == r.id) {
        m.backup = target->id;
        m.backup_slot = slot;
      }
    }
    auto written = etcd.PutIf({{keys.Map(), coord::Compare::Target::kModRevision, map_revision}},
                              keys.Map(), next.ToJson());
    if (!written.ok() || !written->succeeded) return false;  // read again next tick
    std::printf(
        "farpool coordinator %u: server %u's region has two copies again: its backup is server "
        "%u, slot %d (epoch %lld)\n",
        self_, r.id, target->id, slot, static_cast<long long>(next.epoch));
    std::fflush(stdout);
    copying_.erase(r.id);
    return true;
  }
  return false;
}

}  // namespace farpool
