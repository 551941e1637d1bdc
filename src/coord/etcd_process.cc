#include "coord/etcd_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/process.h"
#include "coord/etcd_client.h"

namespace farpool::coord {

namespace {

// The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range), from which
// outgoing connections take their local ports; 32768 (Linux's default) if it cannot be read.
uint16_t EphemeralLow() {
  std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  unsigned low = 32768, high = 60999;
  if (f != nullptr) {
    if (std::fscanf(f, "%u %u", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return static_cast<uint16_t>(std::clamp(low, 1025u, 65535u));
}

}  // namespace

Result<uint16_t> FreePort(const std::string& host) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument("etcd: '" + host + "' is not an IPv4 address");
  }
  // Binds `port` (0: any) and lets it go: the port bound, or 0 with errno set.
  auto try_port = [&](uint16_t port) -> Result<uint16_t> {
    addr.sin_port = htons(port);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return Status::IoError(std::string("socket: ") + strerror(errno));
    socklen_t len = sizeof(addr);
    const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                       getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    const int e = errno;
    close(fd);
    errno = e;
    return bound ? ntohs(addr.sin_port) : uint16_t{0};
  };
  // Below the ephemeral range: a port there is taken only by a bind, never as the local port of
  // some process's outgoing connection, so the member restarts on it (RestartClusterEtcd; a
  // restart failed with "address already in use" while clients connected elsewhere). A host
  // whose range starts near 1024 leaves no room below it: any free port there.
  const uint16_t high = EphemeralLow();
  const uint16_t low = static_cast<uint16_t>(std::max(1024, high / 2));
  const uint16_t span = static_cast<uint16_t>(high - low);
  const bool below = span >= 1000;
  const uint16_t start = static_cast<uint16_t>(
      (static_cast<uint32_t>(getpid()) * 2654435761u +
       static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count())) %
      std::max<uint16_t>(span, 1));
  int last_error = EADDRINUSE;
  for (uint16_t i = 0; i < (below ? span : 1); ++i) {
    FARPOOL_ASSIGN_OR_RETURN(uint16_t port,
                             try_port(below ? static_cast<uint16_t>(low + (start + i) % span) : 0));
    if (port != 0) return port;
    last_error = errno;
    if (last_error != EADDRINUSE) break;
  }
  return Status::IoError(
      "etcd: no free port on " + host +
      (below ? " in " + std::to_string(low) + "-" + std::to_string(high - 1) : std::string()) +
      ": " + strerror(last_error));
}

Result<EtcdProcess> StartEtcd(const EtcdProcessOptions& o) {
  EtcdProcess p;
  p.client_port = o.client_port;
  if (p.client_port == 0) {
    FARPOOL_ASSIGN_OR_RETURN(p.client_port, FreePort(o.host));
  }
  p.peer_port = o.peer_port;
  // Both ports were free when chosen, so they may be the same one: chosen again then.
  for (int i = 0; p.peer_port == 0 || (o.peer_port == 0 && p.peer_port == p.client_port); ++i) {
    if (i == 8) return Status::IoError("etcd: no second free port for its peer URL");
    FARPOOL_ASSIGN_OR_RETURN(p.peer_port, FreePort("127.0.0.1"));
  }
  p.endpoint = "http://" + o.host + ":" + std::to_string(p.client_port);
  const std::string peer = "http://127.0.0.1:" + std::to_string(p.peer_port);
  p.pid = SpawnDetached({o.binary, "--name", "farpool", "--data-dir", o.data_dir,
                         "--listen-client-urls", p.endpoint, "--advertise-client-urls", p.endpoint,
                         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                         "--initial-cluster", "farpool=" + peer, "--initial-cluster-state", "new"},
                        o.log, o.die_with_parent);
  if (p.pid < 0) return Status::IoError(std::string("etcd: fork: ") + strerror(errno));
  auto client = EtcdClient::Create({{p.endpoint}, std::chrono::milliseconds(500)});
  if (!client.ok()) {
    StopProcesses({p.pid});
    return client.status();
  }
  const auto deadline = std::chrono::steady_clock::now() + o.start_timeout;
  Status last;
  while (true) {
    if (!ProcessRunning(p.pid)) {
      return Status::Unavailable("etcd (" + p.endpoint + ") exited at start; the end of its log " +
                                 o.log + ": " + FileTail(o.log));
    }
    auto read = (*client)->Get("/farpool/");
    if (read.ok()) return p;
    last = read.status();
    if (std::chrono::steady_clock::now() > deadline) {
      StopProcesses({p.pid});
      return Status::TimedOut("etcd (" + p.endpoint + ") did not answer within " +
                              std::to_string(o.start_timeout.count()) + " s: " + last.message() +
                              "; the end of its log " + o.log + ": " + FileTail(o.log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace farpool::coord
