#include "coord/etcd_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/process.h"
#include "coord/etcd_client.h"

namespace farpool::coord {

Result<uint16_t> FreePort(const std::string& host) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument("etcd: '" + host + "' is not an IPv4 address");
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::IoError(std::string("socket: ") + strerror(errno));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    close(fd);
    return Status::IoError("etcd: no free port on " + host + ": " + strerror(e));
  }
  close(fd);
  return ntohs(addr.sin_port);
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
