#include "db/db_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "db/testing_hooks.h"
#include "farpool/cluster.h"

namespace farpool::db {

std::string EngineParamName(const testing::TestParamInfo<std::string>& p) {
  std::string name = p.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::string ShowRoundTrips(const std::map<uint64_t, int>& histogram) {
  std::string s;
  for (const auto& [trips, n] : histogram)
    s += std::to_string(n) + " x " + std::to_string(trips) + ", ";
  return s;
}

uint64_t TestSeed() {
  if (const char* s = std::getenv("FARPOOL_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
}

LocalClusterOptions ShmTestCluster(const std::string& binary) {
  LocalClusterOptions o;
  o.servers = 2;
  o.memory = 256ull << 20;
  o.transport = Fabric::kShm;
  o.progress = ProgressMode::kEvent;
  o.binary = binary;
  return o;
}

Status PutInt(Transaction& txn, const Table& t, int64_t key, int64_t v) {
  Row r(t.schema());
  r.SetInt64(0, v);
  return txn.Put(t, key, r);
}
Result<int64_t> GetInt(Transaction& txn, const Table& t, int64_t key) {
  Row r;
  FARPOOL_RETURN_IF_ERROR(txn.Get(t, key, &r));
  return r.GetInt64(0);
}

Status CycleStep(Transaction& txn, const Table& t, int64_t a) {
  FARPOOL_ASSIGN_OR_RETURN(int64_t b, GetInt(txn, t, a));
  FARPOOL_ASSIGN_OR_RETURN(int64_t c, GetInt(txn, t, b));
  FARPOOL_ASSIGN_OR_RETURN(int64_t d, GetInt(txn, t, c));
  FARPOOL_RETURN_IF_ERROR(PutInt(txn, t, a, c));
  FARPOOL_RETURN_IF_ERROR(PutInt(txn, t, c, b));
  return PutInt(txn, t, b, d);
}

Result<std::unique_ptr<TestDatabase>> TestDatabase::Start(const std::string& engine,
                                                          std::chrono::milliseconds lease) {
  auto t = std::unique_ptr<TestDatabase>(new TestDatabase());
  const bool tcp = engine == "pool-tcp";
  FARPOOL_ASSIGN_OR_RETURN(t->options_.engine, ParseEngine(tcp ? "pool" : engine));
  t->options_.lease = lease;
  t->options_.max_sessions = 64;
  t->options_.local_memory = 512ull << 20;
  if (t->options_.engine == Engine::kPool) {
    char tmpl[] = "/tmp/farpool-dbtest-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Status::IoError("mkdtemp failed");
    t->dir_ = tmpl;
    ClusterConfig config;
    config.transport = tcp ? Fabric::kTcp : Fabric::kShm;
    for (uint16_t id = 0; id < 2; ++id) {
      ServerOptions so;
      so.memory = 256ull << 20;
      so.chunk_size = 4ull << 20;
      so.id = id;
      so.progress = ProgressMode::kEvent;
      so.fabric = config.transport;
      FARPOOL_ASSIGN_OR_RETURN(auto server, MemoryServer::Start(so));
      ServerAddress a;
      a.id = id;
      a.host = "127.0.0.1";
      a.port = server->port();
      a.memory = so.memory;
      config.servers.push_back(a);
      t->servers_.push_back(std::move(server));
    }
    t->options_.cluster_file = t->dir_ + "/cluster.json";
    FARPOOL_RETURN_IF_ERROR(config.Save(t->options_.cluster_file));
  }
  FARPOOL_ASSIGN_OR_RETURN(t->db_, Database::Open(t->options_));
  return t;
}

Result<std::unique_ptr<Database>> TestDatabase::OpenAnother(
    std::function<void(std::string_view)> commit_hook) {
  if (options_.engine == Engine::kLocal) {
    return Status::InvalidArgument("the local engine is one process's memory");
  }
  if (options_.engine == Engine::kSharded && options_.cluster_file.empty()) {
    return Status::InvalidArgument(
        "sharded without a cluster file: the partitions are threads of the first Database");
  }
  DatabaseOptions o = options_;
  if (commit_hook) {
    auto hooks = std::make_shared<TestingHooks>(o.testing ? *o.testing : TestingHooks{});
    hooks->commit_hook = std::move(commit_hook);
    o.testing = std::move(hooks);
  }
  return Database::Open(o);
}

TestDatabase::~TestDatabase() {
  db_.reset();
  for (auto& s : servers_) s->Stop();
  servers_.clear();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

}  // namespace farpool::db
