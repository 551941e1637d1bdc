// `farpool server`: run one memory server until SIGTERM or SIGINT, or until SIGUSR1 (`farpool
// cluster drain`), which hands its regions over to their backups before it stops.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "common/process.h"
#include "common/units.h"
#include "coord/cluster_map.h"
#include "coord/etcd_client.h"
#include "coord/membership.h"
#include "farpool/cluster.h"
#include "pool/server/coordinator.h"
#include "pool/server/memory_server.h"
#include "tier/fuse/fuse_mount.h"
#include "transport/shm_dir.h"

namespace farpool::cli {
namespace {

struct ServerArgs {
  std::string listen;
  std::string memory;
  std::string chunk_size = "4MiB";
  int id = 0;
  std::string progress;  // empty: chosen from the cores (ChooseProgressMode)
  std::string transport = "auto";
  std::string ready_file;
  std::string secret_file;
  int mirror_of = -1;
  int mirror_slots = -1;  // -1: 1 with --mirror-of or --replicated, else 0
  bool replicated = false;
  bool shared_pages = false;
  std::string etcd;
  std::string etcd_prefix;
  int lease_ttl_ms = 2000;
};

// A drain (SIGUSR1): how long the server may take to release the replies it holds for its
// backups, how long it then waits for the coordinator to move its region in the map, and how
// long it keeps refusing requests (MovingReply) after that, so that clients which have not sent
// it anything meanwhile have followed the map (their watcher reads it every 250 ms, kMapPoll in
// pool/pool.cc) instead of finding the connection closed, which would leave a write's outcome
// unknown to them.
constexpr auto kHandOverTimeout = std::chrono::milliseconds(3000);
constexpr auto kMapMoveTimeout = std::chrono::milliseconds(10000);
constexpr auto kFollowGrace = std::chrono::milliseconds(600);

// Waits until the map under `prefix` has server `id`'s region served by another server.
Status AwaitMovedAway(const std::vector<std::string>& endpoints, const std::string& prefix,
                      uint16_t id) {
  FARPOOL_ASSIGN_OR_RETURN(auto etcd, coord::EtcdClient::Create({endpoints}));
  const coord::MapKeys keys{prefix};
  const auto deadline = std::chrono::steady_clock::now() + kMapMoveTimeout;
  for (;;) {
    auto kv = etcd->Get(keys.Map());
    if (kv.ok() && kv->has_value()) {
      auto map = coord::ClusterMap::Parse((*kv)->value, keys.Map());
      const coord::MapServer* me = map.ok() ? map->Find(id) : nullptr;
      if (me != nullptr && me->served_by != id) return Status::Ok();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::TimedOut("the map did not move its region within " +
                              std::to_string(kMapMoveTimeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int RunServer(const ServerArgs& a) {
  // Started by `ip netns exec` (a --netns cluster), this process has a copy of its starter's
  // mounts: its farpool mounts must not outlive their `farpool umount` (fuse_mount.h).
  fuse::DetachCopiedMounts();
  auto hp = ParseHostPort(a.listen);
  if (!hp.ok()) return Fail("--listen: " + hp.status().message());
  auto memory = ParseSize(a.memory);
  if (!memory.ok()) return Fail("--memory: " + memory.status().message());
  auto chunk = ParseSize(a.chunk_size);
  if (!chunk.ok()) return Fail("--chunk-size: " + chunk.status().message());
  std::string progress_name;
  auto progress = ChooseProgressMode(a.progress, 1, &progress_name);
  if (!progress.ok()) return Fail("--progress: " + progress.status().message());
  auto fabric = ParseFabric(a.transport);
  if (!fabric.ok()) return Fail("--transport: " + fabric.status().message());
  if (a.id < 0 || a.id > 65535) return Fail("--id must be from 0 to 65535");
  if (a.mirror_of > 65535) return Fail("--mirror-of must be from 0 to 65535");
  if (a.mirror_slots > 64) return Fail("--mirror-slots must be from 0 to 64");
  std::vector<std::string> etcd_endpoints;
  if (!a.etcd.empty()) {
    auto endpoints = coord::ParseEndpoints(a.etcd);
    if (!endpoints.ok()) return Fail("--etcd: " + endpoints.status().message());
    etcd_endpoints = *endpoints;
    if (a.etcd_prefix.empty() || !a.etcd_prefix.ends_with("/")) {
      return Fail("--etcd needs --etcd-prefix, a key prefix ending with '/'");
    }
  }
  if (a.lease_ttl_ms < 1000) return Fail("--lease-ttl-ms must be at least 1000");

  BlockTerminationSignals();  // before any thread starts: they are taken by the wait below
  // Also before any thread: it forks. Whatever kills this server, the janitor then removes its
  // shared-memory files (see transport/shm_dir.h).
  Status janitor = transport::StartShmJanitor();
  if (!janitor.ok()) return Fail(janitor.message());

  ServerOptions o;
  o.host = hp->first;
  o.port = hp->second;
  o.memory = *memory;
  o.chunk_size = *chunk;
  o.id = static_cast<uint16_t>(a.id);
  o.progress = *progress;
  o.fabric = *fabric;
  o.secret_file = a.secret_file;
  if (a.mirror_of >= 0) o.mirror_of = static_cast<uint16_t>(a.mirror_of);
  o.replicated = a.replicated;
  o.shared_pages = a.shared_pages;
  o.mirror_slots = a.mirror_slots >= 0 ? static_cast<uint32_t>(a.mirror_slots)
                                       : (a.mirror_of >= 0 || a.replicated ? 1 : 0);
  static std::atomic<bool> fenced{false};
  o.on_fenced = [](const Status&) {
    fenced = true;
    kill(getpid(), SIGTERM);  // taken by the wait below: an orderly shutdown
  };
  // Primaries whose connection to this server's mirror closed (the mirror's loop reports them),
  // for the membership to check whether they are gone (coord::Membership::Options::closed).
  // Each report wakes the membership's thread (it checks them at once, not at its next tick).
  static std::mutex closed_mu;
  static std::vector<uint16_t> closed;          // guarded by closed_mu
  static coord::Membership* to_wake = nullptr;  // guarded by closed_mu: while it runs
  o.on_primary_closed = [](uint16_t id) {
    std::lock_guard lock(closed_mu);
    closed.push_back(id);
    if (to_wake != nullptr) to_wake->Wake();
  };
  // And whether a connection of the coordinator's closed (Membership::Options::
  // coordinator_closed).
  static std::atomic<bool> coordinator_closed{false};
  o.on_coordinator_closed = [] {
    coordinator_closed = true;
    std::lock_guard lock(closed_mu);
    if (to_wake != nullptr) to_wake->Wake();
  };
  auto server = MemoryServer::Start(o);
  if (!server.ok()) return Fail(server.status().message());
  std::printf("farpool server %d listening on %s:%u, donating %s (progress %s, transport %s)\n",
              a.id, o.host.c_str(), (*server)->port(), FormatSize(*memory).c_str(),
              progress_name.c_str(), a.transport.c_str());
  if (a.secret_file.empty()) {
    std::printf(
        "farpool server %d: no --secret-file: every client that reaches this port may use the "
        "pool\n",
        a.id);
  }
  // Registered before it says it is ready: a server that `cluster up` counts in has its key.
  // In a replicated cluster every server campaigns to be the coordinator, which decides
  // failovers (pool/server/coordinator.h); without replicas every server with mirror slots
  // does, for the hand-over of a drain (docs/pool.md "Drain without replicas").
  const bool coordinates = a.replicated || o.mirror_slots > 0;
  std::unique_ptr<Coordinator> coordinator;  // outlives the membership thread that runs it
  std::unique_ptr<coord::Membership> membership;
  // Before the membership goes, however this function returns: the reports above stop waking it.
  struct StopWaking {
    ~StopWaking() {
      std::lock_guard lock(closed_mu);
      to_wake = nullptr;
    }
  } stop_waking;
  if (!etcd_endpoints.empty()) {
    coord::Membership::Options mo{etcd_endpoints, a.etcd_prefix, static_cast<uint16_t>(a.id),
                                  o.host + ":" + std::to_string((*server)->port()),
                                  (*server)->mirror_port()};
    mo.ttl = std::chrono::milliseconds(a.lease_ttl_ms);
    if (coordinates) {
      auto c = Coordinator::Create(static_cast<uint16_t>(a.id), a.secret_file, mo.ttl);
      if (!c.ok()) return Fail(c.status().message());
      coordinator = std::move(*c);
      mo.coordinate = [c = coordinator.get()](coord::EtcdClient& etcd, const coord::MapKeys& keys,
                                              int64_t term) { c->Tick(etcd, keys, term); };
    }
    // Fencing by epoch: a server whose region the map has moved to another (the coordinator
    // failed it over while it was cut off) serves nothing more and shuts down.
    mo.on_map = [id = static_cast<uint16_t>(a.id)](const coord::ClusterMap& map) {
      const coord::MapServer* me = map.Find(id);
      if (me == nullptr || me->served_by == id || fenced.exchange(true)) return;
      std::printf(
          "farpool server %u: fenced by the cluster map: epoch %lld has its region served "
          "by server %u\n",
          id, static_cast<long long>(map.epoch), me->served_by);
      std::fflush(stdout);
      kill(getpid(), SIGTERM);  // taken by the wait below: an orderly shutdown
    };
    mo.closed = [] {
      std::lock_guard lock(closed_mu);
      return std::exchange(closed, {});
    };
    mo.coordinator_closed = [] { return coordinator_closed.exchange(false); };
    auto m = coord::Membership::Start(mo);
    if (!m.ok()) return Fail(m.status().message());
    membership = std::move(*m);
    {
      std::lock_guard lock(closed_mu);
      to_wake = membership.get();
    }
    std::printf("farpool server %d: registered in etcd %s under %s\n", a.id, a.etcd.c_str(),
                a.etcd_prefix.c_str());
  }
  std::fflush(stdout);
  if (!a.ready_file.empty()) {
    Status s = WriteReadyFile(a.ready_file, (*server)->port());
    if (!s.ok()) return Fail(s.message());
  }
  const int sig = WaitForTerminationSignal();
  std::printf("farpool server %d: signal %d, %s\n", a.id, sig,
              sig == SIGUSR1 ? "draining" : "shutting down");
  std::fflush(stdout);
  // A drain hands the regions over before the server leaves (docs/pool.md "cluster drain"):
  // refusals the clients resend elsewhere instead of requests cut off in flight.
  // Without replicas MemoryServer::Drain refuses unless `cluster drain` copied the region to a
  // backup first; the server then stops as on SIGTERM.
  const bool drain = sig == SIGUSR1 && coordinates && membership != nullptr;
  Status handed = drain ? (*server)->Drain(kHandOverTimeout) : Status::Ok();
  if (!handed.ok()) std::printf("farpool server %d: %s\n", a.id, handed.message().c_str());
  {
    std::lock_guard lock(closed_mu);
    to_wake = nullptr;
  }
  membership.reset();  // leaves etcd first: the cluster sees it gone at once
  if (drain && handed.ok()) {
    Status moved = AwaitMovedAway(etcd_endpoints, a.etcd_prefix, static_cast<uint16_t>(a.id));
    std::printf("farpool server %d: %s\n", a.id,
                moved.ok() ? "the map has moved its region" : moved.message().c_str());
    if (moved.ok()) std::this_thread::sleep_for(kFollowGrace);
  }
  (*server)->Stop();
  server->reset();
  std::printf("farpool server %d: stopped\n", a.id);
  if (fenced) {
    return Fail("server " + std::to_string(a.id) +
                " was fenced: its backup has taken its data over (a client found it gone)");
  }
  return 0;
}

}  // namespace

Command RegisterServer(CLI::App& app) {
  auto args = std::make_shared<ServerArgs>();
  CLI::App* sub = app.add_subcommand("server", "Run a memory server that donates RAM to the pool");
  sub->add_option("--listen", args->listen, "HOST:PORT to listen on (port 0: any free port)")
      ->required();
  sub->add_option("--memory", args->memory, "Bytes to donate, e.g. 512MiB, 4GiB")->required();
  sub->add_option("--chunk-size", args->chunk_size, "Lease granularity (default 4MiB)");
  sub->add_option("--id", args->id, "Server id in the cluster (0-65535)");
  sub->add_option("--progress", args->progress,
                  "busy (lowest latency, one core) or event (idle CPU); default: busy if this "
                  "process may use 2 cores or more, else event");
  sub->add_option("--transport", args->transport, "Fabrics to accept: auto, shm or tcp");
  sub->add_option("--ready-file", args->ready_file, "Write {\"port\": N} here once listening");
  sub->add_option("--secret-file", args->secret_file,
                  "The cluster secret (64 hex digits, mode 0600; `cluster up` writes one): "
                  "clients must prove they know it before anything is served. Without it the "
                  "server serves every client that reaches it");
  sub->add_option("--mirror-of", args->mirror_of,
                  "Keep a copy of server ID's region (of the same --memory), which takes it over "
                  "if it dies: the region doubles (docs/pool.md, Replication)");
  sub->add_option("--mirror-slots", args->mirror_slots,
                  "Copies of other servers' regions this server can keep, each as large as "
                  "its own (the region grows by as much); slot 0 is --mirror-of's, the others "
                  "take re-replicated copies (docs/pool.md, Re-replication). Default 1 with "
                  "--mirror-of or --replicated, else 0");
  sub->add_flag("--replicated", args->replicated,
                "Acknowledge no change before a backup has it: leases and batches are refused "
                "until `cluster up` names the backup");
  sub->add_flag("--shared-pages", args->shared_pages,
                "Same-host backups map this server's region itself instead of keeping a copy, "
                "and its mirror slots map other servers' regions; forwards carry lease changes "
                "only (docs/pool.md, Shared-pages backups). Needs --transport shm or auto");
  sub->add_option("--etcd", args->etcd,
                  "etcd endpoints (http://HOST:PORT,...): register there under a lease, as the "
                  "cluster's membership (docs/pool.md, Membership on etcd)");
  sub->add_option("--etcd-prefix", args->etcd_prefix, "The cluster's key prefix in etcd");
  sub->add_option("--lease-ttl-ms", args->lease_ttl_ms,
                  "The TTL of its etcd lease (default 2000): how long after its death etcd "
                  "deletes its keys unless a peer found it gone first. Longer ones are for tests "
                  "(docs/pool.md, The coordinator's death)");
  return {sub, [args] { return RunServer(*args); }};
}

}  // namespace farpool::cli
