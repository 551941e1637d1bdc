// `farpool cluster up|add|drain|status|down|pool add`: a local cluster of memory-server processes.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/units.h"
#include "coord/etcd_client.h"
#include "pool/local_cluster.h"

namespace farpool::cli {
namespace {

struct ClusterArgs {
  std::string dir;
  int servers = 1;
  std::string memory = "256MiB";
  std::string chunk_size = "4MiB";
  std::string transport = "auto";
  std::string progress;  // empty: chosen from the cores (ChooseProgressMode)
  bool netns = false;
  int replicas = -1;  // unset: 1 with at least 2 servers, else 0
  bool forward_copies = false;
  int mirror_slots = -1;  // unset: DefaultMirrorSlots (up), server 0's (add)
  int drain_id = -1;
  std::string delay;
  std::string etcd;
  bool json = false;
  std::string pool;  // cluster pool add NAME
};

std::string SelfBinary() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "farpool";
  buf[n] = '\0';
  return buf;
}

int Up(const ClusterArgs& a) {
  LocalClusterOptions o;
  o.dir = a.dir;
  o.servers = a.servers;
  auto memory = ParseSize(a.memory);
  if (!memory.ok()) return Fail("--memory: " + memory.status().message());
  o.memory = *memory;
  auto chunk = ParseSize(a.chunk_size);
  if (!chunk.ok()) return Fail("--chunk-size: " + chunk.status().message());
  o.chunk_size = *chunk;
  auto fabric = ParseFabric(a.transport);
  if (!fabric.ok()) return Fail("--transport: " + fabric.status().message());
  o.transport = *fabric;
  std::string progress_name;
  auto progress = ChooseProgressMode(a.progress, a.servers, &progress_name);
  if (!progress.ok()) return Fail("--progress: " + progress.status().message());
  o.progress = *progress;
  o.netns = a.netns;
  // A second copy by default wherever there is a second server (docs/pool.md, "--replicas 1
  // by default"): shared pages on this host, forwarded copies over tcp or with --netns.
  o.replicas = a.replicas >= 0 ? a.replicas : a.servers >= 2 ? 1 : 0;
  o.forward_copies = a.forward_copies;
  o.mirror_slots = a.mirror_slots;
  if (!a.delay.empty()) {
    auto d = ParseDuration(a.delay);
    if (!d.ok()) return Fail("--delay: " + d.status().message());
    o.delay = *d;
  }
  if (!a.etcd.empty()) {
    auto endpoints = coord::ParseEndpoints(a.etcd);
    if (!endpoints.ok()) return Fail("--etcd: " + endpoints.status().message());
    o.etcd_endpoints = *endpoints;
  }
  o.binary = SelfBinary();
  Status s = ClusterUp(o);
  if (!s.ok()) return Fail("cluster up: " + s.message());
  std::printf("cluster up: %d servers x %s in %s (transport %s, progress %s%s%s)\n", a.servers,
              FormatSize(o.memory).c_str(), ClusterFile(a.dir).c_str(), a.transport.c_str(),
              progress_name.c_str(), a.netns ? ", network namespaces" : "",
              o.replicas == 0 ? ""
              : o.replicas == 1
                  ? ", 1 backup of every byte"
                  : (", " + std::to_string(o.replicas) + " backups of every byte").c_str());
  std::printf("cluster up: cluster secret in %s (mode 0600; clients find it through %s)\n",
              SecretFile(a.dir).c_str(), ClusterFile(a.dir).c_str());
  auto config = ClusterConfig::Load(ClusterFile(a.dir));
  if (config.ok()) {
    std::string endpoints;
    for (const auto& e : config->etcd.endpoints) endpoints += (endpoints.empty() ? "" : ",") + e;
    std::printf("cluster up: membership in etcd %s under %s (%s)\n", endpoints.c_str(),
                config->etcd.prefix.c_str(),
                config->etcd.pid > 0 ? "a one-member etcd of its own, data in DIR/etcd"
                                     : "an existing etcd");
  }
  return 0;
}

int AddPoolCommand(const ClusterArgs& a) {
  Status s = AddPool(a.dir, a.pool);
  if (!s.ok()) return Fail("cluster pool add: " + s.message());
  std::printf(
      "cluster pool add: pool '%s': credential in %s/pools/%s.secret (mode 0600); its clients "
      "use %s\n",
      a.pool.c_str(), a.dir.c_str(), a.pool.c_str(), PoolClusterFile(a.dir, a.pool).c_str());
  return 0;
}

int Add(const ClusterArgs& a, bool memory_given) {
  auto config = ClusterConfig::Load(ClusterFile(a.dir));
  if (!config.ok()) return Fail("cluster add: " + config.status().message());
  LocalClusterOptions o;
  o.dir = a.dir;
  if (memory_given) {
    auto memory = ParseSize(a.memory);
    if (!memory.ok()) return Fail("--memory: " + memory.status().message());
    o.memory = *memory;
  } else if (!config->servers.empty()) {
    o.memory = config->servers[0].memory;  // as the others: it can keep their copies
  }
  auto chunk = ParseSize(a.chunk_size);
  if (!chunk.ok()) return Fail("--chunk-size: " + chunk.status().message());
  o.chunk_size = *chunk;
  std::string progress_name;
  auto progress =
      ChooseProgressMode(a.progress, static_cast<int>(config->servers.size()) + 1, &progress_name);
  if (!progress.ok()) return Fail("--progress: " + progress.status().message());
  o.progress = *progress;
  o.mirror_slots = a.mirror_slots;
  o.binary = SelfBinary();
  auto id = ClusterAdd(o);
  if (!id.ok()) return Fail("cluster add: " + id.status().message());
  std::printf("cluster add: server %u (%s) joined the cluster in %s\n", *id,
              FormatSize(o.memory).c_str(), ClusterFile(a.dir).c_str());
  return 0;
}

int Drain(const ClusterArgs& a) {
  if (a.drain_id < 0 || a.drain_id > 65535)
    return Fail("cluster drain: ID must be from 0 to 65535");
  Status s = ClusterDrain(a.dir, static_cast<uint16_t>(a.drain_id), std::chrono::seconds(30));
  if (!s.ok()) return Fail("cluster drain: " + s.message());
  std::printf(
      "cluster drain: server %d stopped; its region is served by the server that kept its "
      "copy (cluster status shows where)\n",
      a.drain_id);
  return 0;
}

int RestartEtcd(const ClusterArgs& a) {
  Status s = RestartClusterEtcd(a.dir);
  if (!s.ok()) return Fail("cluster restart-etcd: " + s.message());
  std::printf("cluster restart-etcd: the cluster's etcd runs again on its data in %s\n",
              a.dir.c_str());
  return 0;
}

int ShowStatus(const ClusterArgs& a) {
  auto status = ClusterStatus(a.dir);
  if (!status.ok()) return Fail("cluster status: " + status.status().message());
  // etcd's view: who holds a live lease, the map's epoch and placement, the coordinator.
  auto etcd = ClusterEtcdStatus(a.dir);
  nlohmann::json etcd_json;
  if (etcd.ok()) {
    nlohmann::json placement = nlohmann::json::array();
    for (const coord::MapServer& m : etcd->map.servers) {
      nlohmann::json backups = nlohmann::json::array();
      for (const coord::MapServer::Backup& b : m.Backups()) backups.push_back(b.id);
      placement.push_back(
          {{"id", m.id}, {"served_by", m.served_by}, {"backup", m.backup}, {"backups", backups}});
    }
    etcd_json = {{"endpoints", etcd->endpoints},     {"prefix", etcd->prefix},
                 {"epoch", etcd->map.epoch},         {"alive", etcd->alive},
                 {"coordinator", etcd->coordinator}, {"placement", placement},
                 {"suspected", etcd->suspected}};
  } else if (etcd.status().code() != StatusCode::kNotFound) {
    etcd_json = {{"error", etcd.status().message()}};
  }
  bool all_up = true;
  uint64_t capacity = 0, leased = 0;
  nlohmann::json servers = nlohmann::json::array();
  for (const ServerStatus& s : *status) {
    all_up = all_up && s.up;
    capacity += s.stats.capacity;
    leased += s.stats.leased;
    servers.push_back({{"id", s.address.id},
                       {"address", s.address.Endpoint()},
                       {"up", s.up},
                       {"error", s.error},
                       {"pid", s.stats.pid},
                       {"capacity", s.stats.capacity},
                       {"leased", s.stats.leased},
                       {"largest_free", s.stats.largest_free},
                       {"clients", s.stats.clients},
                       {"requests_served", s.stats.requests_served},
                       {"rejected", s.stats.rejected},
                       {"auth_refused", s.stats.auth_refused},
                       {"pool_refused", s.stats.pool_refused},
                       {"rss_private", s.stats.rss_private},
                       {"uptime_s", s.stats.uptime_ns / 1e9}});
  }
  if (a.json) {
    nlohmann::json doc = {
        {"servers", servers}, {"capacity", capacity}, {"leased", leased}, {"all_up", all_up}};
    if (!etcd_json.is_null()) doc["etcd"] = etcd_json;
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("%-4s %-22s %-8s %10s %10s %8s %10s %10s %8s %8s\n", "id", "address", "state",
                "capacity", "leased", "clients", "requests", "overhead", "refused", "denied");
    for (const ServerStatus& s : *status) {
      if (!s.up) {
        std::printf("%-4u %-22s %-8s %s\n", s.address.id, s.address.Endpoint().c_str(), "DOWN",
                    s.error.c_str());
        continue;
      }
      std::printf("%-4u %-22s %-8s %10s %10s %8u %10llu %10s %8llu %8llu\n", s.address.id,
                  s.address.Endpoint().c_str(), "up", FormatSize(s.stats.capacity).c_str(),
                  FormatSize(s.stats.leased).c_str(), s.stats.clients,
                  static_cast<unsigned long long>(s.stats.requests_served),
                  FormatSize(s.stats.rss_private).c_str(),
                  static_cast<unsigned long long>(s.stats.auth_refused),
                  static_cast<unsigned long long>(s.stats.pool_refused));
    }
    std::printf("total: %s leased of %s\n", FormatSize(leased).c_str(),
                FormatSize(capacity).c_str());
    if (etcd.ok()) {
      std::string alive, placement;
      for (uint16_t id : etcd->alive) alive += " " + std::to_string(id);
      for (const coord::MapServer& m : etcd->map.servers) {
        placement += " " + std::to_string(m.id) + "->" + std::to_string(m.served_by);
        for (const coord::MapServer::Backup& b : m.Backups()) {
          placement += "+" + std::to_string(b.id);
        }
      }
      std::printf("etcd %s (%s): epoch %lld, coordinator %s, alive by lease:%s\n",
                  etcd->endpoints.c_str(), etcd->prefix.c_str(),
                  static_cast<long long>(etcd->map.epoch),
                  etcd->coordinator >= 0 ? std::to_string(etcd->coordinator).c_str() : "none",
                  alive.empty() ? " none" : alive.c_str());
      std::printf("placement (region->served by+backups):%s\n", placement.c_str());
      if (!etcd->suspected.empty()) {
        std::string suspected;
        for (uint16_t id : etcd->suspected) suspected += " " + std::to_string(id);
        std::printf("reported gone by clients, not failed over yet:%s\n", suspected.c_str());
      }
    } else if (etcd.status().code() != StatusCode::kNotFound) {
      std::printf("etcd: %s\n", etcd.status().message().c_str());
    }
  }
  return all_up && (etcd.ok() || etcd.status().code() == StatusCode::kNotFound) ? 0 : 1;
}

int Down(const ClusterArgs& a) {
  Status s = ClusterDown(a.dir);
  if (!s.ok()) return Fail("cluster down: " + s.message());
  std::printf("cluster down: %s\n", a.dir.c_str());
  return 0;
}

}  // namespace

Command RegisterCluster(CLI::App& app) {
  auto args = std::make_shared<ClusterArgs>();
  CLI::App* sub = app.add_subcommand("cluster", "Run a local cluster of memory servers");
  sub->require_subcommand(1);
  CLI::App* up = sub->add_subcommand(
      "up", "Start servers with a new cluster secret, wait until all answer, write cluster.json");
  up->add_option("--dir", args->dir, "Directory for cluster.json and server logs")->required();
  up->add_option("--servers", args->servers, "Number of memory servers");
  up->add_option("--memory", args->memory, "Memory per server, e.g. 1GiB");
  up->add_option("--chunk-size", args->chunk_size, "Lease granularity");
  up->add_option("--transport", args->transport, "Clients' default fabric: auto, shm or tcp");
  up->add_option("--progress", args->progress,
                 "Servers' progress: busy or event; default: busy if this process may use "
                 "more cores than there are servers, else event");
  up->add_flag("--netns", args->netns, "Each server in its own network namespace (root)");
  up->add_option("--replicas", args->replicas,
                 "Backups of every byte: 0 to --servers - 1 (each server's region mirrored on "
                 "the next f servers, the first live one of which takes it over when it dies); "
                 "default 1 with --servers 2 or more, else 0. With 1 Over shm or auto without "
                 "--netns the backup shares its primary's pages "
                 "(one copy's memory once started); else it keeps a copy (twice the memory)");
  up->add_option("--mirror-slots", args->mirror_slots,
                 "With --replicas f: copies each server can keep: the ring's f, and room for "
                 "re-replication to restore a backup after a failure "
                 "(docs/pool.md, Re-replication). Default f + 1 with --servers f + 2 or more, "
                 "else f. With --replicas 0: room for a drained server's region "
                 "(`cluster drain`); default 1 with --servers 2 or more, else 0. "
                 "Each takes --memory on its server only once it holds a copy (never with "
                 "shared pages)");
  up->add_flag("--forward-copies", args->forward_copies,
               "With --replicas 1 over --transport shm or auto without --netns: backups keep "
               "copies that every change is forwarded to, instead of sharing their primaries' "
               "pages (the default there; docs/pool.md, Shared-pages backups)");
  up->add_option("--delay", args->delay, "One-way link delay with --netns, e.g. 20us");
  up->add_option("--etcd", args->etcd,
                 "Join this etcd (http://HOST:PORT,...) for the cluster's map and membership; "
                 "default: start a one-member etcd of the cluster's own");
  CLI::App* add = sub->add_subcommand(
      "add", "Start one more server for a running cluster: it joins the map and takes new chunks");
  add->add_option("--dir", args->dir, "Cluster directory")->required();
  CLI::Option* add_memory =
      add->add_option("--memory", args->memory, "Memory of the new server (default: server 0's)");
  add->add_option("--chunk-size", args->chunk_size, "Lease granularity");
  add->add_option("--progress", args->progress, "The server's progress: busy or event");
  add->add_option("--mirror-slots", args->mirror_slots,
                  "Copies of other regions it can keep: re-replication's, or a drained "
                  "server's region (default: as many as server 0, at least 1)");
  CLI::App* drain = sub->add_subcommand(
      "drain",
      "Move server ID's data to its backup while clients run, then stop it; without replicas "
      "its region is first copied to a free mirror slot of another server (--transport tcp)");
  drain->add_option("--dir", args->dir, "Cluster directory")->required();
  drain->add_option("ID", args->drain_id, "The server to drain")->required();
  CLI::App* status = sub->add_subcommand("status", "Show every server's state");
  status->add_option("--dir", args->dir, "Cluster directory")->required();
  status->add_flag("--json", args->json, "Print JSON");
  CLI::App* down = sub->add_subcommand("down", "Stop every server of the cluster");
  down->add_option("--dir", args->dir, "Cluster directory")->required();
  CLI::App* pool = sub->add_subcommand("pool", "Pools (tenants) of the cluster");
  pool->require_subcommand(1);
  CLI::App* pool_add = pool->add_subcommand(
      "add",
      "Create a pool: its credential in DIR/pools/NAME.secret and its clients' cluster file "
      "DIR/cluster-NAME.json; its clients see only its own chunks and root area");
  pool_add->add_option("--dir", args->dir, "Cluster directory")->required();
  pool_add->add_option("name", args->pool, "The pool's name (letters, digits, '-', '_')")
      ->required();
  CLI::App* restart_etcd = sub->add_subcommand(
      "restart-etcd",
      "Start the cluster's own etcd again on its data directory and ports, after it died "
      "(the soak's etcd fault); the servers' keepalives resume");
  restart_etcd->add_option("--dir", args->dir, "Cluster directory")->required();
  return {sub, [args, up, add, add_memory, drain, restart_etcd, status, down, pool_add] {
            if (up->parsed()) return Up(*args);
            if (add->parsed()) return Add(*args, add_memory->count() > 0);
            if (drain->parsed()) return Drain(*args);
            if (restart_etcd->parsed()) return RestartEtcd(*args);
            if (status->parsed()) return ShowStatus(*args);
            if (down->parsed()) return Down(*args);
            if (pool_add->parsed()) return AddPoolCommand(*args);
            return Fail("cluster: expected up, add, drain, status, down, pool add or restart-etcd");
          }};
}

}  // namespace farpool::cli
