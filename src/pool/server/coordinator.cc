#include "pool/server/coordinator.h"

#include <unistd.h>

#include <cstdio>
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
                             const coord::MapServer* predecessor) {
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
  if (predecessor != nullptr) {
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
  auto log_once = [&](const std::string& message) {
    if (message == last_error_) return;
    last_error_ = message;
    std::printf("farpool coordinator %u: %s\n", self_, message.c_str());
  };
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
    const coord::MapServer* predecessor = nullptr;
    for (const coord::MapServer& p : map->servers) {
      if (p.backup == s.id && p.id != s.id && p.served_by == p.id && alive.contains(p.id)) {
        predecessor = &p;
      }
    }
    Status done = FailOver(mirror_ports, s, backup, predecessor);
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
        m.backup = -1;
      } else if (predecessor != nullptr && m.id == predecessor->id) {
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
  return false;
}

}  // namespace farpool
