// TestCluster: a local cluster of real `farpool server` processes for integration tests,
// in a fresh temporary directory, brought down (no process left) when it goes out of scope,
// and killed with the thread that made it (die_with_parent) if the test process dies first.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "farpool/pool.h"
#include "pool/local_cluster.h"

namespace farpool {

class TestCluster {
 public:
  // Starts the cluster; check status() before use. options.dir and .binary are filled in.
  explicit TestCluster(LocalClusterOptions options);
  ~TestCluster();
  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  const Status& status() const { return status_; }
  const std::string& dir() const { return dir_; }
  std::string cluster_file() const { return ClusterFile(dir_); }
  Result<ClusterConfig> config() const { return ClusterConfig::Load(cluster_file()); }

 private:
  std::string dir_;
  Status status_;
};

// A "client host" of a `netns` TestCluster (AddClientNamespace): a network namespace of its own
// on the cluster's bridge, removed when this goes out of scope (declare it after the cluster,
// and stop the processes started in it first). Needs root; check status() before use.
class TestClientHost {
 public:
  TestClientHost(const TestCluster& cluster, int k);
  ~TestClientHost();
  TestClientHost(const TestClientHost&) = delete;
  TestClientHost& operator=(const TestClientHost&) = delete;

  const Status& status() const { return status_; }
  const std::string& netns() const { return netns_; }
  // The shell prefix that runs a command on this host: `ip netns exec` (which execs it in
  // place, in a mount namespace of its own whose /sys shows the namespace's interfaces, as
  // UCX needs; so a FUSE mount made there is seen only by processes that enter that mount
  // namespace, `nsenter -t PID -m`), without this process's UCX_NET_DEVICES (the namespace
  // has only its own link and lo). The mount namespace begins as a copy of ours, other
  // mounts included: keep what runs there short-lived (docs/files.md, "Copies of the mount").
  std::string Prefix() const;
  // The same as an argv prefix, for exec. Both end in `env ...`, so NAME=VALUE assignments for
  // the command alone may follow.
  std::vector<std::string> Argv() const;

 private:
  std::string dir_;
  int k_;
  std::string netns_;
  Status status_;
};

// A client of a TestCluster: the config it connected with, and its Pool.
struct TestClient {
  ClusterConfig config;
  std::unique_ptr<Pool> pool;
};

// Connects a client to `cluster` whose operations fail after `op_timeout`.
Result<TestClient> ConnectTestClient(
    const TestCluster& cluster, std::chrono::milliseconds op_timeout = std::chrono::seconds(5));

// A directory under $TMPDIR (or /tmp) unique to this process, created.
std::string MakeTempDir(const std::string& prefix);

}  // namespace farpool
