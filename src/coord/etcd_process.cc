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
  // Below the ephemeral range: a port there is taken only by a bind, never as the local port of
  // some process's outgoing connection, so the member restarts on it (RestartClusterEtcd; a
  // restart failed with "address already in use" while clients connected elsewhere).
  const uint16_t high = EphemeralLow();
  const uint16_t low = static_cast<uint16_t>(std::max(1024, high / 2));
  const uint16_t span = static_cast<uint16_t>(high - low);
  const uint16_t start = static_cast<uint16_t>(
      (static_cast<uint32_t>(getpid()) * 2654435761u +
       static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count())) %
      span);
  int last_error = EADDRINUSE;
  for (uint16_t i = 0; i < span; ++i) {
    addr.sin_port = htons(static_cast<uint16_t>(low + (start + i) % span));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return Status::IoError(std::string("socket: ") + strerror(errno));
    const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    last_error = errno;
    close(fd);
    if (bound) return ntohs(addr.sin_port);
    if (last_error != EADDRINUSE) break;
  }
  return Status::IoError("etcd: no free port on " + host + " in " + std::to_string(low) + "-" +
                         std::to_string(high - 1) + ": " + strerror(last_error));
}

Result<EtcdProcess> StartEtcd(const EtcdProcessOptions& o) {
  EtcdProcess p;
  p.client_port = o.client_port;
  if (p.client_port == 0) {
    FARPOOL_ASSIGN_OR_RETURN(p.client_port, FreePort(o.host));
  }
  p.peer_port = o.peer_port;
  if (p.peer_port == 0) {
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
