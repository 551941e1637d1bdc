#include "pool/test_cluster.h"

#include <stdlib.h>

#include <filesystem>
#include <utility>

namespace farpool {

std::string MakeTempDir(const std::string& prefix) {
  const char* base = getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  char* made = mkdtemp(tmpl.data());
  return made ? std::string(made) : std::string();
}

TestCluster::TestCluster(LocalClusterOptions options) {
  dir_ = MakeTempDir("farpool-test");
  options.dir = dir_;
  options.binary = FARPOOL_BINARY;
  options.die_with_parent = true;
  status_ = ClusterUp(options);
}

Result<TestClient> ConnectTestClient(const TestCluster& cluster,
                                     std::chrono::milliseconds op_timeout) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, cluster.config());
  PoolOptions po;
  po.op_timeout = op_timeout;
  FARPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Pool> pool, Pool::Connect(config, po));
  return TestClient{std::move(config), std::move(pool)};
}

TestClientHost::TestClientHost(const TestCluster& cluster, int k) : dir_(cluster.dir()), k_(k) {
  auto made = AddClientNamespace(dir_, k_);
  if (made.ok()) {
    netns_ = *made;
  } else {
    status_ = made.status();
  }
}

TestClientHost::~TestClientHost() {
  if (status_.ok()) RemoveClientNamespace(dir_, k_);
}

std::vector<std::string> TestClientHost::Argv() const {
  return {"ip", "netns", "exec", netns_, "env", "-u", "UCX_NET_DEVICES"};
}

std::string TestClientHost::Prefix() const {
  std::string prefix;
  for (const std::string& a : Argv()) prefix += a + " ";
  return prefix;
}

TestCluster::~TestCluster() {
  if (status_.ok()) {
    Status s = ClusterDown(dir_);
    (void)s;  // the test has already reported; nothing else to do
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace farpool
