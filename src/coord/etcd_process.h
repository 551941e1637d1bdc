// A one-member etcd for a local cluster (the embedded default of `farpool cluster up`), run as
// a child process of Debian's `etcd` binary: its data in a directory of the cluster, its
// client port on an address the cluster's servers reach (127.0.0.1, or the bridge's root-side
// address for servers in network namespaces), its peer port on 127.0.0.1 (no other member).
//
// StartEtcd returns once the member answers a read (it has elected itself leader), or fails
// with the tail of its log; it never leaves a process behind on failure. Restarting on the
// same data directory and ports (EtcdProcessOptions from the cluster file) brings back the
// same store: keys, revisions and leases (etcd then extends every lease by its TTL).
//
// Thread-safety: plain functions.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "farpool/status.h"

namespace farpool::coord {

struct EtcdProcessOptions {
  std::string binary = "etcd";
  std::string data_dir;
  std::string log;
  std::string host = "127.0.0.1";  // of the client URL
  uint16_t client_port = 0;        // 0: a free port
  uint16_t peer_port = 0;          // 0: a free port (on 127.0.0.1)
  bool die_with_parent = false;    // see SpawnDetached (common/process.h)
  std::chrono::seconds start_timeout{30};
};

struct EtcdProcess {
  pid_t pid = 0;
  std::string endpoint;  // http://HOST:PORT
  uint16_t client_port = 0;
  uint16_t peer_port = 0;
};

Result<EtcdProcess> StartEtcd(const EtcdProcessOptions& options);

// A TCP port that nothing is bound to at `host` now, below the kernel's ephemeral range
// (bound, closed: another process may bind it before the caller does; etcd then fails to start
// and says so in its log), so that no outgoing connection takes it as its local port and a
// restarted member finds it free (any free port on a host whose range starts below ~3000).
Result<uint16_t> FreePort(const std::string& host);

}  // namespace farpool::coord
