#include "pool/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/host.h"
#include "common/process.h"
#include "common/units.h"
#include "coord/etcd_client.h"
#include "coord/etcd_process.h"
#include "pool/control_client.h"
#include "transport/auth.h"
#include "transport/shm_dir.h"
#include "transport/wire.h"

namespace farpool {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Names of one cluster's network objects, derived from its directory so that two clusters
// on one machine do not collide. Interface names stay within Linux's 15 characters.
struct NetNames {
  std::string tag;  // 4 hex digits
  int net;          // second octet of 10.<net>.0.0/16: preferred, then the one SetUpNetwork took
  std::string Bridge() const { return "fp" + tag + "br"; }
  std::string Namespace(int i) const { return "fp" + tag + "s" + std::to_string(i); }
  std::string HostVeth(int i) const { return "fp" + tag + "h" + std::to_string(i); }
  std::string PeerVeth(int i) const { return "fp" + tag + "p" + std::to_string(i); }
  std::string ServerIp(int i) const {
    return "10." + std::to_string(net) + "." + std::to_string((i + 2) / 256) + "." +
           std::to_string((i + 2) % 256);
  }
  std::string BridgeIp() const { return "10." + std::to_string(net) + ".0.1"; }
  // A namespace on the bridge: server i's, or client host k's (AddClientNamespace; addresses
  // 10.<net>.255.<k + 1>, far above the servers').
  struct Link {
    std::string ns, host_veth, peer_veth, ip;
  };
  Link Server(int i) const { return {Namespace(i), HostVeth(i), PeerVeth(i), ServerIp(i)}; }
  Link Client(int k) const {
    const std::string n = std::to_string(k);
    return {"fp" + tag + "c" + n, "fp" + tag + "ch" + n, "fp" + tag + "cp" + n,
            "10." + std::to_string(net) + ".255." + std::to_string(k + 1)};
  }
};

// The networks 10.N.0.0/16 that clusters take: N in [kFirstNet, kFirstNet + kNets). (The Python
// harness's own namespaces take 100..149.)
constexpr int kFirstNet = 150, kNets = 100;

NetNames NamesFor(const std::string& dir) {
  const size_t h = std::hash<std::string>()(fs::absolute(dir).lexically_normal().string());
  char tag[8];
  std::snprintf(tag, sizeof(tag), "%04x", static_cast<unsigned>(h & 0xffff));
  return {tag, kFirstNet + static_cast<int>((h >> 16) % kNets)};
}

// The second octets N of the networks 10.N.0.0/16 in which this namespace's interfaces have an
// address.
std::set<int> TenNetsInUse() {
  std::set<int> used;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return used;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
    if ((ip >> 24) == 10) used.insert(static_cast<int>((ip >> 16) & 0xff));
  }
  freeifaddrs(list);
  return used;
}

// Serialises the choice of a network among `cluster up`s on this host, until the chosen one
// has its address on the bridge (the lock goes with the process, also when it dies).
class NetChoiceLock {
 public:
  NetChoiceLock() : fd_(open("/run/lock/farpool-netns.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ < 0) fd_ = open("/tmp/farpool-netns.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ >= 0) {
      while (flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~NetChoiceLock() {
    if (fd_ >= 0) close(fd_);
  }
  NetChoiceLock(const NetChoiceLock&) = delete;
  NetChoiceLock& operator=(const NetChoiceLock&) = delete;

 private:
  int fd_;
};

// Runs a command (argv) and waits; returns its output on failure in the Status.
Status Run(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return Status::IoError("cannot run '" + cmd + "': " + strerror(errno));
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  int rc = pclose(p);
  if (rc != 0) return Status::IoError("'" + cmd + "' failed: " + out);
  return Status::Ok();
}

Status AddNamespace(const NetNames& n, const NetNames::Link& link, std::chrono::nanoseconds delay);

// Makes the bridge, the namespaces and their links, on the first network from `n.net` on that no
// interface here has an address in yet (two networks on two bridges would route one cluster's
// clients to the other's servers); sets `n.net` to it.
Status SetUpNetwork(NetNames& n, int servers, std::chrono::nanoseconds delay) {
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "link", "add", n.Bridge(), "type", "bridge"}));
  {
    NetChoiceLock lock;
    const std::set<int> used = TenNetsInUse();
    int tries = 0;
    while (used.count(n.net) != 0 && ++tries < kNets) {
      n.net = kFirstNet + (n.net - kFirstNet + 1) % kNets;
    }
    if (used.count(n.net) != 0) {
      return Status::Unavailable(
          "no free network 10.N.0.0/16 for the namespaces (N in " + std::to_string(kFirstNet) +
          ".." + std::to_string(kFirstNet + kNets - 1) + " all have addresses on this host)");
    }
    FARPOOL_RETURN_IF_ERROR(Run({"ip", "addr", "add", n.BridgeIp() + "/16", "dev", n.Bridge()}));
  }
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "link", "set", n.Bridge(), "up"}));
  for (int i = 0; i < servers; ++i) {
    FARPOOL_RETURN_IF_ERROR(AddNamespace(n, n.Server(i), delay));
  }
  return Status::Ok();
}

// A namespace, its link to the bridge and its address.
Status AddNamespace(const NetNames& n, const NetNames::Link& link, std::chrono::nanoseconds delay) {
  const std::string us = std::to_string(delay.count() / 1000.0) + "us";
  const std::string& ns = link.ns;
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "netns", "add", ns}));
  FARPOOL_RETURN_IF_ERROR(
      Run({"ip", "link", "add", link.host_veth, "type", "veth", "peer", "name", link.peer_veth}));
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "link", "set", link.peer_veth, "netns", ns}));
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "link", "set", link.host_veth, "master", n.Bridge()}));
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "link", "set", link.host_veth, "up"}));
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "-n", ns, "link", "set", "lo", "up"}));
  FARPOOL_RETURN_IF_ERROR(
      Run({"ip", "-n", ns, "addr", "add", link.ip + "/16", "dev", link.peer_veth}));
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "-n", ns, "link", "set", link.peer_veth, "up"}));
  FARPOOL_RETURN_IF_ERROR(Run({"ip", "-n", ns, "route", "add", "default", "via", n.BridgeIp()}));
  if (delay.count() > 0) {
    Status netem = Run({"tc", "qdisc", "add", "dev", link.host_veth, "root", "netem", "delay", us});
    if (!netem.ok() && netem.message().find("qdisc kind is unknown") != std::string::npos) {
      return Status::InvalidArgument(
          "--delay needs the kernel's netem queueing discipline, which this kernel lacks "
          "(CONFIG_NET_SCH_NETEM is off): " +
          netem.message());
    }
    FARPOOL_RETURN_IF_ERROR(netem);
    FARPOOL_RETURN_IF_ERROR(Run({"ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev",
                                 link.peer_veth, "root", "netem", "delay", us}));
  }
  return Status::Ok();
}

void TearDownNamespace(const NetNames::Link& link) {
  Status a = Run({"ip", "netns", "del", link.ns});
  Status b = Run({"ip", "link", "del", link.host_veth});
  (void)a;  // may not exist (a partial Up); removal is best effort by design
  (void)b;
}

// The network names of the running `--netns` cluster in `dir`: the network `cluster up` took
// is the second octet of its servers' addresses.
Result<NetNames> NamesOfRunning(const std::string& dir, const ClusterConfig& config) {
  NetNames names = NamesFor(dir);
  unsigned a = 0, net = 0;
  if (config.servers.empty() || config.servers[0].netns.empty() ||
      std::sscanf(config.servers[0].host.c_str(), "%u.%u.", &a, &net) != 2 || a != 10) {
    return Status::InvalidArgument(
        ClusterFile(dir) + " is not a cluster of `cluster up --netns` (server 0 at " +
        (config.servers.empty() ? "none" : config.servers[0].host) + ")");
  }
  names.net = static_cast<int>(net);
  return names;
}

void TearDownNetwork(const NetNames& n, int servers) {
  for (int i = 0; i < servers; ++i) TearDownNamespace(n.Server(i));
  Status c = Run({"ip", "link", "del", n.Bridge()});
  (void)c;
}

// Names backup number `k` of server `i` of `config` (its slot k keeps the copy).
Status NameBackup(const ClusterConfig& config, const transport::ClusterSecret& secret, size_t i,
                  int k) {
  const ServerAddress& s = config.servers[i];
  const ServerAddress& backup = config.servers[config.BackupOf(i, static_cast<size_t>(k))];
  FARPOOL_ASSIGN_OR_RETURN(
      auto c, control::Connection::OpenAsTool(s.id, s.Endpoint(), s.port, &secret, 0x7001,
                                              std::chrono::milliseconds(5000)));
  // Every ring backup, as the map that follows names them: a request for one never gives up
  // another (term 0: no coordinator has spoken to the servers yet).
  std::vector<wire::MapBackup> ring;
  for (int b = 0; b < config.replicas; ++b) {
    ring.push_back(
        {config.servers[config.BackupOf(i, static_cast<size_t>(b))].id, static_cast<uint16_t>(b)});
  }
  FARPOOL_ASSIGN_OR_RETURN(wire::BackupRequest request,
                           wire::MakeBackupRequest(backup.id, backup.host, backup.port, s.id,
                                                   static_cast<uint16_t>(k), 0, ring));
  // The server connects to its backup within its backup_timeout (1 s): on a loaded host (two
  // busy loops beside a test, load 20) that failed now and then ("backup server 2: sending a
  // message: no completion before the deadline"). Nothing is leased yet, so naming the backup
  // again is safe (the attach makes the slot a fresh copy): up to kNameAttempts times.
  constexpr int kNameAttempts = 5;
  Status named;
  int attempt = 0;
  do {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ++attempt;
    named = c->Call([&](uint64_t id) { return wire::EncodeBackupRequest(id, request, ring); },
                    wire::Opcode::kBackupReply)
                .status();
  } while (attempt < kNameAttempts &&
           (named.code() == StatusCode::kTimedOut || named.code() == StatusCode::kUnavailable));
  return named.WithContext("attempt " + std::to_string(attempt));
}

// Tells every server of `config` which servers are its backups (ClusterConfig::BackupOf, in
// ring order; backup k keeps the copy in its slot k): until the first is named a replicated
// server refuses every change, and it forwards each round to every one named.
Status NameBackups(const ClusterConfig& config, const transport::ClusterSecret& secret) {
  for (size_t i = 0; i < config.servers.size(); ++i) {
    for (int k = 0; k < config.replicas; ++k) {
      FARPOOL_RETURN_IF_ERROR(NameBackup(config, secret, i, k));
    }
  }
  return Status::Ok();
}

std::string EtcdDataDir(const std::string& dir) { return (fs::path(dir) / "etcd").string(); }
std::string EtcdLog(const std::string& dir) { return (fs::path(dir) / "etcd.log").string(); }

// The cluster's etcd: a one-member etcd started here (its data from an earlier cluster in DIR
// deleted first), or the existing one of `o.etcd_endpoints`, checked to answer.
Result<EtcdConfig> SetUpEtcd(const LocalClusterOptions& o, const std::string& host) {
  EtcdConfig etcd;
  etcd.prefix = coord::NewClusterPrefix();
  if (!o.etcd_endpoints.empty()) {
    FARPOOL_ASSIGN_OR_RETURN(auto client, coord::EtcdClient::Create({o.etcd_endpoints}));
    Status reached = client->Get(coord::MapKeys{etcd.prefix}.Map()).status();
    if (!reached.ok()) return reached.WithContext("joining etcd " + client->EndpointList());
    etcd.endpoints = o.etcd_endpoints;
    return etcd;
  }
  std::error_code ec;
  fs::remove_all(EtcdDataDir(o.dir), ec);
  coord::EtcdProcessOptions eo;
  eo.data_dir = EtcdDataDir(o.dir);
  eo.log = EtcdLog(o.dir);
  eo.host = host;
  eo.die_with_parent = o.die_with_parent;
  eo.start_timeout = o.start_timeout;
  auto started = coord::StartEtcd(eo);
  if (!started.ok()) return started.status().WithContext("starting the cluster's etcd");
  etcd.endpoints = {started->endpoint};
  etcd.pid = started->pid;
  etcd.peer_port = started->peer_port;
  return etcd;
}

// Stops the etcd member that Up started and deletes its data; for a joined etcd, deletes the
// cluster's keys (best effort: the cluster is going anyway, and its alive keys lapse with their
// leases).
void TearDownEtcd(const std::string& dir, const EtcdConfig& etcd) {
  if (etcd.endpoints.empty()) return;
  if (etcd.pid > 0) {
    StopProcesses({static_cast<pid_t>(etcd.pid)});
    std::error_code ec;
    fs::remove_all(EtcdDataDir(dir), ec);
    return;
  }
  auto client = coord::EtcdClient::Create({etcd.endpoints});
  if (client.ok()) {
    Status s = (*client)->DeletePrefix(etcd.prefix);
    (void)s;
  }
}

// `farpool server`'s command line for server `id` of a cluster (before the replication flags),
// run in namespace `netns` if not empty.
std::vector<std::string> ServerArgv(const LocalClusterOptions& o, const std::string& netns,
                                    const std::string& listen, int id, const std::string& ready,
                                    const std::string& secret_file, const EtcdConfig& etcd) {
  std::string endpoints;
  for (const std::string& e : etcd.endpoints) endpoints += (endpoints.empty() ? "" : ",") + e;
  std::vector<std::string> argv;
  if (!netns.empty()) argv = {"ip", "netns", "exec", netns};
  argv.insert(argv.end(), {o.binary,        "server",
                           "--listen",      listen,
                           "--memory",      std::to_string(o.memory),
                           "--chunk-size",  std::to_string(o.chunk_size),
                           "--id",          std::to_string(id),
                           "--progress",    std::string(ProgressModeName(o.progress)),
                           "--ready-file",  ready,
                           "--secret-file", secret_file,
                           "--etcd",        endpoints,
                           "--etcd-prefix", etcd.prefix});
  if (o.lease_ttl.count() > 0) {
    argv.insert(argv.end(), {"--lease-ttl-ms", std::to_string(o.lease_ttl.count())});
  }
  return argv;
}

// The map of a freshly started cluster: every server serves its own region, backed up by its
// ring successor when replicated.
coord::ClusterMap InitialMap(const ClusterConfig& config, int mirror_slots) {
  coord::ClusterMap map;
  map.epoch = 1;
  map.replicas = config.replicas;
  for (size_t i = 0; i < config.servers.size(); ++i) {
    const ServerAddress& s = config.servers[i];
    coord::MapServer m;
    m.id = s.id;
    m.address = s.Endpoint();
    m.memory = s.memory;
    m.served_by = s.id;
    m.backup = config.replicas > 0 ? config.servers[config.BackupOf(i)].id : -1;
    for (int k = 1; k < config.replicas; ++k) {
      m.more_backups.push_back({config.servers[config.BackupOf(i, static_cast<size_t>(k))].id, k});
    }
    m.slots = static_cast<uint32_t>(mirror_slots);
    map.servers.push_back(m);
  }
  return map;
}

// Shared pages wherever every server is on this host and has its region in a shared-memory
// file: without --netns the servers listen on 127.0.0.1, so every client is on this host too,
// and under shm and auto alike UCX allocates the region from /dev/shm (transport/ucx.cc,
// kAllocPriority). Over tcp the region may be no such file, and --netns stands for servers on
// hosts of their own: forwarded copies there (docs/pool.md "Shared-pages backups").
bool SharesPages(const LocalClusterOptions& o) {
  return o.replicas == 1 && o.transport != Fabric::kTcp && !o.netns && !o.forward_copies;
}

}  // namespace

int DefaultMirrorSlots(int servers, int replicas) {
  if (replicas == 0) return servers >= 2 ? 1 : 0;
  return servers >= replicas + 2 ? replicas + 1 : replicas;
}

std::string ClusterFile(const std::string& dir) {
  return (fs::path(dir) / "cluster.json").string();
}

std::string SecretFile(const std::string& dir) {
  return (fs::path(dir) / kSecretFileName).string();
}

Status ClusterUp(const LocalClusterOptions& o) {
  if (o.servers < 1 || o.servers > 250) {
    return Status::InvalidArgument("--servers must be from 1 to 250, got " +
                                   std::to_string(o.servers));
  }
  const int replicas = o.replicas;
  if (replicas < 0 || (replicas > 0 && replicas >= o.servers)) {
    return Status::InvalidArgument(
        "--replicas " + std::to_string(replicas) + " with --servers " + std::to_string(o.servers) +
        ": from 0 to " + std::to_string(o.servers - 1) +
        " (each backup of a region is on another server than the region's own, so there can be "
        "at most one fewer than the servers)");
  }
  const int slots = o.mirror_slots >= 0 ? o.mirror_slots : DefaultMirrorSlots(o.servers, replicas);
  if (slots < replicas || slots < 0 || slots > 64) {
    return Status::InvalidArgument("--mirror-slots " + std::to_string(slots) + ": from " +
                                   std::to_string(replicas) + " (one per backup a server keeps) " +
                                   "to 64 with --replicas " + std::to_string(replicas));
  }
  if (o.delay.count() > 0 && !o.netns) {
    return Status::InvalidArgument(
        "--delay needs --netns (the delay is put on each server's link)");
  }
  // Each server commits its own part at start (UCX writes every page of a shared-memory
  // segment before mapping it), and a mirror slot when it is to hold a copy (pool/server/
  // mirror.h): with forwarded copies the ring's slot at once, with shared pages none (the
  // backup maps its primary's pages). Refuse up front what the host cannot give, instead of
  // letting the servers eat the machine's memory until the OOM killer steps in. Further slots
  // are for re-replication after a failure and check for themselves when they take a copy; on
  // this host one failure's re-replication fills two of them while the dead server's own part
  // and ring copy are gone, so the count below covers that state too.
  const bool copies = replicas > 0 && !SharesPages(o);
  uint64_t total = 0;
  const uint64_t parts = copies ? 1 + static_cast<uint64_t>(replicas) : 1;
  if (__builtin_mul_overflow(o.memory, static_cast<uint64_t>(o.servers) * parts, &total)) {
    total = ~0ull;
  }
  FARPOOL_RETURN_IF_ERROR(CheckFitsInAvailableMemory(
      total,
      "--servers " + std::to_string(o.servers) + " x --memory " + FormatSize(o.memory) +
          (copies ? " x " + std::to_string(parts) + " (own part and the backups' copies)" : "") +
          " (" + FormatSize(total) + " in all)"));
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec) return Status::IoError("cannot create " + o.dir + ": " + ec.message());
  if (fs::exists(ClusterFile(o.dir))) {
    auto existing = ClusterConfig::Load(ClusterFile(o.dir));
    if (existing.ok()) {
      for (const auto& s : existing->servers) {
        if (ProcessRunning(static_cast<pid_t>(s.pid))) {
          return Status::InvalidArgument("a cluster is already running in " + o.dir + " (server " +
                                         std::to_string(s.id) + ", pid " + std::to_string(s.pid) +
                                         "); run `farpool cluster down --dir " + o.dir + "` first");
        }
      }
    }
    fs::remove(ClusterFile(o.dir), ec);
  }
  transport::RemoveStaleShmDirectories();  // of servers killed before, here or elsewhere
  // A new secret for every cluster: servers get its file's path (never the secret in argv or
  // the environment, which /proc shows), clients find it through the cluster file.
  fs::remove(SecretFile(o.dir), ec);
  FARPOOL_ASSIGN_OR_RETURN(transport::ClusterSecret secret, transport::ClusterSecret::Generate());
  FARPOOL_RETURN_IF_ERROR(secret.Write(SecretFile(o.dir)));
  const std::string secret_file = fs::absolute(SecretFile(o.dir)).string();
  NetNames names = NamesFor(o.dir);
  if (o.netns) {
    TearDownNetwork(names, o.servers);  // leftovers of a crashed earlier run
    Status net = SetUpNetwork(names, o.servers, o.delay);
    if (!net.ok()) {
      TearDownNetwork(names, o.servers);
      fs::remove(SecretFile(o.dir), ec);
      return net.WithContext("setting up network namespaces (needs root)");
    }
  }

  ClusterConfig config;
  config.transport = o.transport;
  config.secret_file = kSecretFileName;
  config.replicas = replicas;
  config.shared_pages = SharesPages(o);
  std::vector<pid_t> pids;
  auto fail = [&](const Status& s) {
    StopProcesses(pids);
    TearDownEtcd(o.dir, config.etcd);
    fs::remove(SecretFile(o.dir), ec);
    if (o.netns) TearDownNetwork(names, o.servers);
    return s;
  };
  auto etcd = SetUpEtcd(o, o.netns ? names.BridgeIp() : "127.0.0.1");
  if (!etcd.ok()) return fail(etcd.status());
  config.etcd = *etcd;
  for (int i = 0; i < o.servers; ++i) {
    const std::string ready =
        (fs::path(o.dir) / ("server-" + std::to_string(i) + ".ready")).string();
    const std::string log = (fs::path(o.dir) / ("server-" + std::to_string(i) + ".log")).string();
    fs::remove(ready, ec);
    const std::string host = o.netns ? names.ServerIp(i) : "127.0.0.1";
    const std::string port = o.netns ? "7000" : "0";
    std::vector<std::string> argv =
        ServerArgv(o, o.netns ? names.Namespace(i) : "", host + ":" + port, i, ready, secret_file,
                   config.etcd);
    if (replicas > 0) {
      const int primary = (i + o.servers - 1) % o.servers;  // the one whose backup i is
      argv.insert(argv.end(), {"--mirror-of", std::to_string(primary), "--replicated",
                               "--mirror-slots", std::to_string(slots)});
      if (config.shared_pages) argv.push_back("--shared-pages");
    } else if (slots > 0) {
      // Without replicas the slots are for drains (ClusterDrain): free, address space only.
      argv.insert(argv.end(), {"--mirror-slots", std::to_string(slots)});
    }
    pid_t pid = SpawnDetached(argv, log, o.die_with_parent);
    if (pid < 0) return fail(Status::IoError(std::string("fork: ") + strerror(errno)));
    pids.push_back(pid);
    ServerAddress a;
    a.id = static_cast<uint16_t>(i);
    a.host = host;
    a.memory = o.memory;
    a.pid = pid;
    a.netns = o.netns ? names.Namespace(i) : "";
    config.servers.push_back(a);
  }
  const auto deadline = Clock::now() + o.start_timeout;
  for (int i = 0; i < o.servers; ++i) {
    const std::string base = (fs::path(o.dir) / ("server-" + std::to_string(i))).string();
    auto port =
        WaitReady(base + ".ready", pids[i], "server " + std::to_string(i), base + ".log", deadline);
    if (!port.ok()) return fail(port.status());
    config.servers[i].port = *port;
  }
  if (replicas > 0) {
    Status named = NameBackups(config, secret);
    if (!named.ok()) return fail(named.WithContext("naming the backups"));
  }
  {
    auto client = coord::EtcdClient::Create({config.etcd.endpoints});
    if (!client.ok()) return fail(client.status());
    auto put = (*client)->Put(coord::MapKeys{config.etcd.prefix}.Map(),
                              InitialMap(config, slots).ToJson());
    if (!put.ok()) return fail(put.status().WithContext("writing the cluster map to etcd"));
  }
  {
    Status saved = config.Save(ClusterFile(o.dir));
    if (!saved.ok()) return fail(saved);
  }
  // Every server must answer, not just listen.
  auto status = ClusterStatus(o.dir);
  if (!status.ok()) return fail(status.status());
  for (const ServerStatus& s : *status) {
    if (!s.up) {
      return fail(Status::Unavailable("server " + std::to_string(s.address.id) +
                                      " does not answer: " + s.error));
    }
  }
  return Status::Ok();
}

Result<uint16_t> ClusterAdd(const LocalClusterOptions& o) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ClusterFile(o.dir)));
  if (config.etcd.endpoints.empty() || config.servers.empty()) {
    return Status::InvalidArgument(ClusterFile(o.dir) +
                                   " names no etcd: only a cluster of `cluster up` can grow");
  }
  FARPOOL_ASSIGN_OR_RETURN(auto etcd, coord::EtcdClient::Create({config.etcd.endpoints}));
  const coord::MapKeys keys{config.etcd.prefix};
  FARPOOL_ASSIGN_OR_RETURN(auto kv, etcd->Get(keys.Map()));
  if (!kv) return Status::NotFound("no cluster map at " + keys.Map());
  FARPOOL_ASSIGN_OR_RETURN(coord::ClusterMap map, coord::ClusterMap::Parse(kv->value, keys.Map()));
  uint16_t id = 0;
  for (const ServerAddress& a : config.servers) id = std::max<uint16_t>(id, a.id + 1);
  const int index = static_cast<int>(config.servers.size());
  const bool netns = !config.servers[0].netns.empty();
  NetNames names = NamesFor(o.dir);
  std::string host = "127.0.0.1";
  if (netns) {
    FARPOOL_ASSIGN_OR_RETURN(names, NamesOfRunning(o.dir, config));
    host = names.ServerIp(index);
    Status net_made = AddNamespace(names, names.Server(index), std::chrono::nanoseconds(0));
    if (!net_made.ok()) {
      TearDownNamespace(names.Server(index));
      return net_made.WithContext("adding a network namespace (needs root)");
    }
  }
  const std::string base = (fs::path(o.dir) / ("server-" + std::to_string(index))).string();
  std::error_code ec;
  fs::remove(base + ".ready", ec);
  std::vector<std::string> argv =
      ServerArgv(o, netns ? names.Namespace(index) : "", host + (netns ? ":7000" : ":0"), id,
                 base + ".ready", fs::absolute(SecretFile(o.dir)).string(), config.etcd);
  // Unless told, as many slots as server 0 (as --memory): the cluster's choice of room.
  // Without replicas at least one slot too: an added server is where a drained one's region
  // goes (`cluster add` + `cluster drain` replaces a machine).
  const uint32_t slots = o.mirror_slots >= 0   ? static_cast<uint32_t>(o.mirror_slots)
                         : map.servers.empty() ? 1
                                               : std::max(map.servers[0].slots, 1u);
  if (map.replicas > 0) {
    argv.insert(argv.end(), {"--replicated", "--mirror-slots", std::to_string(slots)});
    if (config.shared_pages) argv.push_back("--shared-pages");
  } else if (slots > 0) {
    argv.insert(argv.end(), {"--mirror-slots", std::to_string(slots)});
  }
  const pid_t pid = SpawnDetached(argv, base + ".log", o.die_with_parent);
  if (pid < 0) return Status::IoError(std::string("fork: ") + strerror(errno));
  auto fail = [&](const Status& s) {
    StopProcesses({pid});
    if (netns) TearDownNamespace(names.Server(index));
    return s;
  };
  auto port = WaitReady(base + ".ready", pid, "server " + std::to_string(id), base + ".log",
                        Clock::now() + o.start_timeout);
  if (!port.ok()) return fail(port.status());
  ServerAddress added;
  added.id = id;
  added.host = host;
  added.port = *port;
  added.memory = o.memory;
  added.pid = pid;
  added.netns = netns ? names.Namespace(index) : "";
  // Into the map (epoch + 1) by a txn on its revision: the coordinator may change it meanwhile.
  for (int attempt = 0;; ++attempt) {
    coord::ClusterMap next = map;
    next.epoch = map.epoch + 1;
    coord::MapServer m;
    m.id = id;
    m.address = added.Endpoint();
    m.memory = o.memory;
    m.served_by = id;
    m.slots = slots;
    next.servers.push_back(m);
    auto written =
        etcd->PutIf({{keys.Map(), coord::Compare::Target::kModRevision, kv->mod_revision}},
                    keys.Map(), next.ToJson());
    if (!written.ok()) return fail(written.status().WithContext("writing the cluster map"));
    if (written->succeeded) break;
    if (attempt == 20) return fail(Status::Aborted("the cluster map kept changing; try again"));
    auto again = etcd->Get(keys.Map());
    if (!again.ok() || !*again) return fail(Status::Unavailable("reading the cluster map again"));
    kv = *again;
    auto parsed = coord::ClusterMap::Parse(kv->value, keys.Map());
    if (!parsed.ok()) return fail(parsed.status());
    map = *parsed;
  }
  config.servers.push_back(added);
  FARPOOL_RETURN_IF_ERROR(config.Save(ClusterFile(o.dir)));
  // The pools' clients' cluster files (AddPool) list the servers too.
  for (const auto& entry : fs::directory_iterator(fs::path(o.dir) / "pools", ec)) {
    const std::string file = PoolClusterFile(o.dir, entry.path().stem().string());
    FARPOOL_ASSIGN_OR_RETURN(ClusterConfig pool_config, ClusterConfig::Load(file));
    pool_config.servers.push_back(added);
    FARPOOL_RETURN_IF_ERROR(pool_config.Save(file));
  }
  return id;
}

namespace {

// One control connection from the cluster tool to `to` on `port` (its main or its mirror's).
Result<std::unique_ptr<control::Connection>> ToolConnection(
    const coord::MapServer& to, uint16_t port, const transport::ClusterSecret& secret) {
  return control::Connection::OpenAsTool(to.id, to.address, port, &secret, 0xd7a1,
                                         std::chrono::milliseconds(2000));
}

// A drain without replicas, its first half (docs/pool.md "Drain without replicas"): picks a
// target (a live server serving its own region, as large, with a free mirror slot; the most
// free slots, then the lowest id), has server `id` copy its region there while it serves
// (BackupRequest: re-replication's attach and copy, every change forwarded meanwhile), and once
// the copy is whole records the target as the region's backup in the map (epoch + 1). On any
// failure the server is told to give the copy up (DegradeRequest on its mirror port) and the
// map is not changed: the region stays where it was, with one copy, as before.
Status CopyForDrain(const std::string& dir, const ClusterConfig& config, const EtcdView& view,
                    uint16_t id, std::chrono::milliseconds timeout) {
  const coord::ClusterMap& map = view.map;
  const coord::MapServer& entry = *map.Find(id);
  const std::string name = "server " + std::to_string(id);
  auto alive = [&](uint16_t s) {
    return std::find(view.alive.begin(), view.alive.end(), s) != view.alive.end();
  };
  if (config.transport != Fabric::kTcp) {
    return Status::InvalidArgument(
        "draining " + name +
        " without replicas needs a cluster over --transport tcp: over shm its clients store "
        "into its mapped region without the server, so a copy could miss their writes");
  }
  for (const coord::MapServer& r : map.servers) {
    if (r.id != id && r.served_by == id) {
      return Status::InvalidArgument(name + " serves server " + std::to_string(r.id) +
                                     "'s region from a mirror slot (an earlier drain): moving "
                                     "that one again is not built");
    }
  }
  const coord::MapServer* target = nullptr;
  int slot = 0;
  int most = 0;
  std::string seen;
  for (const coord::MapServer& t : map.servers) {
    if (t.id == id || t.served_by != t.id || !alive(t.id)) continue;
    const std::vector<int> used = map.SlotsInUse(t.id);
    const int free = static_cast<int>(t.slots) - static_cast<int>(used.size());
    seen += (seen.empty() ? "" : ", ") + std::to_string(t.id) + ": " + std::to_string(free) +
            " of " + std::to_string(t.slots) + " free" +
            (t.memory < entry.memory ? ", smaller" : "");
    if (t.memory < entry.memory || free <= most) continue;
    most = free;
    target = &t;
    slot = 0;
    while (std::find(used.begin(), used.end(), slot) != used.end()) ++slot;
  }
  if (target == nullptr) {
    return Status::ResourceExhausted(
        "draining " + name + ": no live server has a free mirror slot of " +
        FormatSize(entry.memory) + " for its region (live servers' slots: " +
        (seen.empty() ? "none" : seen) + "); `cluster add` one, then drain");
  }
  // The target's slot commits its memory when the copy attaches (mirror.h, "Memory"); on this
  // host that is this check's memory.
  Status fits = CheckFitsInAvailableMemory(
      entry.memory, "a copy of " + name + "'s region for server " + std::to_string(target->id));
  if (!fits.ok()) {
    return Status::ResourceExhausted("draining " + name + ": " + fits.message());
  }
  FARPOOL_ASSIGN_OR_RETURN(transport::ClusterSecret secret,
                           transport::ClusterSecret::Read(SecretFile(dir)));
  FARPOOL_ASSIGN_OR_RETURN(auto to, ParseHostPort(target->address));
  // The map's backups of the region (none without replicas), term 0: a tool's request, which a
  // server that a coordinator has spoken to refuses (without replicas none does).
  std::vector<wire::MapBackup> named;
  for (const coord::MapServer::Backup& b : entry.Backups()) {
    named.push_back({b.id, static_cast<uint16_t>(b.slot)});
  }
  FARPOOL_ASSIGN_OR_RETURN(wire::BackupRequest request,
                           wire::MakeBackupRequest(target->id, to.first, to.second, id,
                                                   static_cast<uint16_t>(slot), 0, named));
  const std::string copying = "draining " + name + ": copying its region (" +
                              FormatSize(entry.memory) + ") to server " +
                              std::to_string(target->id) + " slot " + std::to_string(slot);
  // Gives the copy up at the server (it forwards to the target no more and the target's slot
  // frees its memory); the region stays where it was.
  auto give_up = [&](const Status& why) {
    auto mirror = view.mirror_ports.find(id);
    if (mirror != view.mirror_ports.end() && mirror->second != 0) {
      auto c = ToolConnection(entry, mirror->second, secret);
      if (c.ok()) {
        Status told = (*c)->Call(
                              [&](uint64_t rid) {
                                return wire::Encode(rid, wire::DegradeRequest{target->id, {}});
                              },
                              wire::Opcode::kDegradeReply)
                          .status();
        (void)told;  // a server that is gone forwards nothing either
      }
    }
    return why.WithContext(copying + " failed; the region stays on " + name + ", one copy");
  };
  FARPOOL_ASSIGN_OR_RETURN(auto at, ParseHostPort(entry.address));
  FARPOOL_ASSIGN_OR_RETURN(auto c, ToolConnection(entry, at.second, secret));
  // The copy runs at up to 40 MiB/s (memory_server.h, kCopySlice per tick) and slower under
  // load: `timeout` plus a second per 8 MiB.
  const auto deadline = Clock::now() + timeout + std::chrono::seconds(entry.memory / (8ull << 20));
  for (;;) {
    auto reply =
        c->Call([&](uint64_t rid) { return wire::EncodeBackupRequest(rid, request, named); },
                wire::Opcode::kBackupReply);
    if (!reply.ok() && reply.status().code() != StatusCode::kAborted) {
      return give_up(reply.status());
    }
    if (reply.ok() && reply->message.As<wire::BackupReply>().remaining == 0) break;
    auto now = ClusterEtcdStatus(dir);
    if (now.ok() &&
        std::find(now->alive.begin(), now->alive.end(), target->id) == now->alive.end()) {
      return give_up(Status::Unavailable("server " + std::to_string(target->id) +
                                         " left etcd (its lease lapsed: it died)"));
    }
    if (now.ok() && std::find(now->alive.begin(), now->alive.end(), id) == now->alive.end()) {
      return give_up(Status::Unavailable(name + " left etcd"));
    }
    if (Clock::now() > deadline) return give_up(Status::TimedOut("the copy was not whole in time"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Whole: the map names the target as the region's backup, so that the coordinator promotes
  // it when the server hands over (epoch + 1, a txn on the map's revision).
  FARPOOL_ASSIGN_OR_RETURN(auto etcd, coord::EtcdClient::Create({config.etcd.endpoints}));
  const coord::MapKeys keys{config.etcd.prefix};
  for (int attempt = 0; attempt < 20; ++attempt) {
    FARPOOL_ASSIGN_OR_RETURN(auto kv, etcd->Get(keys.Map()));
    if (!kv) return give_up(Status::NotFound("no cluster map at " + keys.Map()));
    FARPOOL_ASSIGN_OR_RETURN(coord::ClusterMap next,
                             coord::ClusterMap::Parse(kv->value, keys.Map()));
    for (coord::MapServer& m : next.servers) {
      if (m.id == id) {
        m.backup = target->id;
        m.backup_slot = slot;
      }
    }
    ++next.epoch;
    auto written =
        etcd->PutIf({{keys.Map(), coord::Compare::Target::kModRevision, kv->mod_revision}},
                    keys.Map(), next.ToJson());
    if (!written.ok()) return give_up(written.status().WithContext("writing the cluster map"));
    if (written->succeeded) return Status::Ok();
  }
  return give_up(Status::Aborted("the cluster map kept changing"));
}

}  // namespace

Status ClusterDrain(const std::string& dir, uint16_t id, std::chrono::milliseconds timeout) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ClusterFile(dir)));
  FARPOOL_ASSIGN_OR_RETURN(EtcdView view, ClusterEtcdStatus(dir));
  const coord::ClusterMap& map = view.map;
  const ServerAddress* server = nullptr;
  std::string ids;
  for (const ServerAddress& a : config.servers) {
    if (a.id == id) server = &a;
    ids += (ids.empty() ? "" : " ") + std::to_string(a.id);
  }
  const coord::MapServer* entry = map.Find(id);
  const std::string name = "server " + std::to_string(id);
  if (server == nullptr || entry == nullptr) {
    return Status::InvalidArgument("no " + name + " in the cluster (servers: " + ids + ")");
  }
  auto alive = [&](int s) {
    return s >= 0 && std::find(view.alive.begin(), view.alive.end(), s) != view.alive.end();
  };
  if (entry->served_by != id || !alive(id)) {
    return Status::InvalidArgument(name +
                                   " serves no region of its own (drained or failed over "
                                   "already, or not alive): nothing to drain");
  }
  const bool others =
      std::any_of(view.alive.begin(), view.alive.end(), [&](uint16_t s) { return s != id; });
  if (!others)
    return Status::InvalidArgument(name + " is the last server: its data has nowhere to go");
  if (map.replicas == 0) {
    FARPOOL_RETURN_IF_ERROR(CopyForDrain(dir, config, view, id, timeout));
  } else if (!alive(entry->backup)) {
    return Status::InvalidArgument(name +
                                   "'s region has no live backup (it runs with one copy): "
                                   "draining it would lose the region; wait for "
                                   "re-replication or `cluster add` room for it");
  }
  for (const coord::MapServer& r : map.servers) {
    if (r.id != id && r.served_by == id && !alive(r.backup)) {
      return Status::InvalidArgument(name + " serves server " + std::to_string(r.id) +
                                     "'s region from a mirror slot, with one copy: draining it "
                                     "would lose that region");
    }
  }
  // A planned failover (SIGUSR1, `farpool server`): the server refuses requests unexecuted
  // (the clients resend them to the new holder), closes its links to its backups once they
  // have every change, leaves etcd (its lease revoked); the coordinator promotes its backup at
  // once and moves the epoch; the server stops once the map shows the move.
  const auto deadline = Clock::now() + timeout;
  if (kill(static_cast<pid_t>(server->pid), SIGUSR1) != 0) {
    return Status::IoError("cannot signal " + name + " (pid " + std::to_string(server->pid) +
                           "): " + strerror(errno));
  }
  while (Clock::now() < deadline) {
    auto now = ClusterEtcdStatus(dir);
    const bool moved =
        now.ok() && now->map.Find(id) != nullptr && now->map.Find(id)->served_by != id;
    if (moved && !ProcessRunning(static_cast<pid_t>(server->pid))) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::TimedOut(name + " was stopped, but within " + std::to_string(timeout.count()) +
                          " ms the map did not move its region to its backup, or its process did "
                          "not end (see " +
                          dir + "/server-*.log)");
}

Result<std::vector<ServerStatus>> ClusterStatus(const std::string& dir) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ClusterFile(dir)));
  std::vector<ServerStatus> out;
  PoolOptions options;
  options.transport = Fabric::kTcp;  // status works from anywhere the servers are reachable
  options.direct_access = false;
  options.connect_timeout = std::chrono::milliseconds(3000);
  options.op_timeout = std::chrono::milliseconds(3000);
  for (const ServerAddress& a : config.servers) {
    ServerStatus st;
    st.address = a;
    ClusterConfig one;
    one.transport = Fabric::kTcp;
    one.secret_file = config.secret_file;
    one.servers = {a};
    auto pool = Pool::Connect(one, options);
    if (!pool.ok()) {
      st.error = pool.status().message();
    } else {
      auto stats = (*pool)->Stats(a.id);
      if (stats.ok()) {
        st.up = true;
        st.stats = *stats;
      } else {
        st.error = stats.status().message();
      }
    }
    out.push_back(std::move(st));
  }
  return out;
}

Result<EtcdView> ClusterEtcdStatus(const std::string& dir) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ClusterFile(dir)));
  if (config.etcd.endpoints.empty()) {
    return Status::NotFound("cluster file " + ClusterFile(dir) + " names no etcd");
  }
  FARPOOL_ASSIGN_OR_RETURN(auto client, coord::EtcdClient::Create({config.etcd.endpoints}));
  const coord::MapKeys keys{config.etcd.prefix};
  EtcdView view;
  view.endpoints = client->EndpointList();
  view.prefix = keys.prefix;
  FARPOOL_ASSIGN_OR_RETURN(coord::RangeAnswer all, client->GetPrefix(keys.prefix));
  bool have_map = false;
  for (const coord::KeyValue& kv : all.kvs) {
    if (kv.key == keys.Map()) {
      FARPOOL_ASSIGN_OR_RETURN(
          view.map, coord::ClusterMap::Parse(kv.value, "etcd " + view.endpoints + " " + kv.key));
      have_map = true;
    } else if (kv.key.starts_with(keys.AlivePrefix())) {
      const auto alive_id =
          static_cast<uint16_t>(std::stoul(kv.key.substr(keys.AlivePrefix().size())));
      view.alive.push_back(alive_id);
      auto value = nlohmann::json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
      if (value.is_object() && value.contains("mirror_port") &&
          value["mirror_port"].is_number_unsigned()) {
        view.mirror_ports[alive_id] = value["mirror_port"].get<uint16_t>();
      }
    } else if (kv.key == keys.Coordinator()) {
      view.coordinator = std::stoi(kv.value);
    } else if (kv.key.starts_with(keys.SuspectPrefix())) {
      view.suspected.push_back(
          static_cast<uint16_t>(std::stoul(kv.key.substr(keys.SuspectPrefix().size()))));
    }
  }
  if (!have_map) {
    return Status::NotFound("etcd " + view.endpoints + ": no cluster map at " + keys.Map());
  }
  std::sort(view.alive.begin(), view.alive.end());
  return view;
}

Status RestartClusterEtcd(const std::string& dir, bool die_with_parent) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ClusterFile(dir)));
  if (config.etcd.pid <= 0 || config.etcd.endpoints.size() != 1) {
    return Status::InvalidArgument("the cluster in " + dir + " did not start an etcd of its own");
  }
  if (ProcessRunning(static_cast<pid_t>(config.etcd.pid))) {
    return Status::InvalidArgument("the cluster's etcd (pid " + std::to_string(config.etcd.pid) +
                                   ") is still running");
  }
  const std::string endpoint = config.etcd.endpoints.front();
  const size_t colon = endpoint.rfind(':');
  coord::EtcdProcessOptions eo;
  eo.data_dir = EtcdDataDir(dir);
  eo.log = EtcdLog(dir);
  eo.host = endpoint.substr(std::string("http://").size(), colon - std::string("http://").size());
  eo.client_port = static_cast<uint16_t>(std::stoul(endpoint.substr(colon + 1)));
  eo.peer_port = config.etcd.peer_port;
  eo.die_with_parent = die_with_parent;
  FARPOOL_ASSIGN_OR_RETURN(coord::EtcdProcess started, coord::StartEtcd(eo));
  config.etcd.pid = started.pid;
  return config.Save(ClusterFile(dir));
}

Status ClusterDown(const std::string& dir) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ClusterFile(dir)));
  std::vector<pid_t> pids;
  bool netns = false;
  for (const auto& s : config.servers) {
    pids.push_back(static_cast<pid_t>(s.pid));
    netns = netns || !s.netns.empty();
  }
  StopProcesses(pids);
  TearDownEtcd(dir, config.etcd);
  // Each server's janitor removes its shared-memory files; this catches those whose janitor
  // was killed too.
  transport::RemoveStaleShmDirectories();
  if (netns) TearDownNetwork(NamesFor(dir), static_cast<int>(config.servers.size()));
  std::error_code ec;
  fs::remove(ClusterFile(dir), ec);
  fs::remove(SecretFile(dir), ec);
  // The pools' credentials derive from the secret just removed; a new cluster has others.
  for (const auto& entry : fs::directory_iterator(fs::path(dir) / "pools", ec)) {
    fs::remove(PoolClusterFile(dir, entry.path().stem().string()), ec);
  }
  fs::remove_all(fs::path(dir) / "pools", ec);
  for (size_t i = 0; i < config.servers.size(); ++i) {
    fs::remove(fs::path(dir) / ("server-" + std::to_string(i) + ".ready"), ec);
  }
  return Status::Ok();
}

Result<std::string> AddClientNamespace(const std::string& dir, int k) {
  if (k < 0 || k > 250) return Status::InvalidArgument("client namespace " + std::to_string(k));
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ClusterFile(dir)));
  FARPOOL_ASSIGN_OR_RETURN(NetNames names, NamesOfRunning(dir, config));
  const NetNames::Link link = names.Client(k);
  Status made = AddNamespace(names, link, std::chrono::nanoseconds(0));
  if (!made.ok()) {
    TearDownNamespace(link);
    return made.WithContext("adding client namespace " + link.ns + " (needs root)");
  }
  return link.ns;
}

void RemoveClientNamespace(const std::string& dir, int k) {
  auto config = ClusterConfig::Load(ClusterFile(dir));
  if (!config.ok()) return;  // nothing was added to a cluster that is not there
  auto names = NamesOfRunning(dir, *config);
  if (names.ok()) TearDownNamespace(names->Client(k));
}

std::string PoolClusterFile(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / ("cluster-" + name + ".json")).string();
}

Status AddPool(const std::string& dir, const std::string& name) {
  FARPOOL_RETURN_IF_ERROR(transport::ValidPoolName(name));
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ClusterFile(dir)));
  if (config.secret_file.empty() || !config.pool.empty()) {
    return Status::InvalidArgument(ClusterFile(dir) +
                                   " names no cluster secret: a cluster without one has no pools");
  }
  FARPOOL_ASSIGN_OR_RETURN(transport::ClusterSecret secret,
                           transport::ClusterSecret::Read(config.secret_file));
  const fs::path pools = fs::path(dir) / "pools";
  std::error_code ec;
  fs::create_directory(pools, ec);
  if (!ec) fs::permissions(pools, fs::perms::owner_all, ec);  // the credentials' directory
  if (ec) return Status::IoError("cannot create " + pools.string() + ": " + ec.message());
  for (const auto& entry : fs::directory_iterator(pools, ec)) {
    const std::string other = entry.path().stem().string();
    if (other == name) {
      return Status::AlreadyExists("pool '" + name + "' exists (" + entry.path().string() + ")");
    }
    if (transport::PoolId(other) == transport::PoolId(name)) {
      return Status::AlreadyExists("pool '" + name + "' would have the id of pool '" + other +
                                   "' in the servers' lease books; choose another name");
    }
  }
  const std::string file = "pools/" + name + ".secret";
  FARPOOL_RETURN_IF_ERROR(secret.DerivePool(name).Write((fs::path(dir) / file).string()));
  config.secret_file = file;  // relative to the cluster file, as cluster.json's
  config.pool = name;
  return config.Save(PoolClusterFile(dir, name));
}

}  // namespace farpool
