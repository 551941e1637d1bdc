// TestCluster: a local cluster of real `farpool server` processes for integration tests,
// in a fresh temporary directory, brought down (no process left) when it goes out of scope,
// and killed with the thread that made it (die_with_parent) if the test process dies first.
#pragma once

#include <string>

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

// A directory under $TMPDIR (or /tmp) unique to this process, created.
std::string MakeTempDir(const std::string& prefix);

}  // namespace farpool
