// TestCluster: a local cluster of real `farpool server` processes for integration tests,
// in a fresh temporary directory, brought down (no process left) when it goes out of scope,
// and killed with the thread that made it (die_with_parent) if the test process dies first.
#pragma once

#include <chrono>
#include <memory>
#include <string>

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
