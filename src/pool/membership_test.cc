// Membership on etcd with real processes (docs/pool.md "Membership on etcd"): `cluster up`
// starts a one-member etcd (or joins one), writes the cluster map there, and every server
// holds a lease on its alive key. The invariants: the map names every server and its backup;
// a key is present exactly while its server lives and reaches etcd (a SIGKILLed server's key
// goes, a server whose lease was lost registers again); etcd is not on the data path (the
// servers serve while it is down); an unreachable etcd is an error that names its URL.
#include "coord/membership.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "common/process.h"
#include "coord/etcd_client.h"
#include "coord/etcd_process.h"
#include "farpool/pool.h"
#include "pool/control_client.h"
#include "pool/local_cluster.h"
#include "pool/server/memory_server.h"
#include "pool/test_cluster.h"
#include "transport/auth.h"
#include "transport/wire.h"

namespace farpool {
namespace {

using namespace std::chrono_literals;

LocalClusterOptions Options(int servers, int replicas, bool netns = false) {
  LocalClusterOptions o;  // mirror slots: DefaultMirrorSlots unless a test sets them
  o.servers = servers;
  o.memory = 32 << 20;
  o.transport = Fabric::kTcp;
  o.progress = ProgressMode::kEvent;
  o.replicas = replicas;
  o.netns = netns;
  return o;
}

// `farpool cluster add` for `cluster`, with the options `o` (the new server's) and this
// build's binary: the new server's id.
Result<uint16_t> AddServer(LocalClusterOptions o, const TestCluster& cluster) {
  o.dir = cluster.dir();
  o.binary = FARPOOL_BINARY;
  o.die_with_parent = true;
  return ClusterAdd(o);
}

bool Contains(const std::vector<uint16_t>& ids, uint16_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Polls etcd's view until `done` holds (returns it) or 30 s pass (returns the last view; the
// caller's assertion then fails). The deadline only bounds a broken run.
EtcdView WaitForView(const std::string& dir, const std::function<bool(const EtcdView&)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  EtcdView last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto view = ClusterEtcdStatus(dir);
    if (view.ok()) {
      last = *view;
      if (done(last)) break;
    }
    std::this_thread::sleep_for(50ms);
  }
  return last;
}

// A client of `cluster`'s etcd and its keys.
struct ClusterEtcd {
  std::unique_ptr<coord::EtcdClient> client;
  coord::MapKeys keys;
};
ClusterEtcd EtcdOf(const TestCluster& cluster) {
  auto config = cluster.config();
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  if (!config.ok()) return {};
  auto etcd = coord::EtcdClient::Create({config->etcd.endpoints});
  EXPECT_TRUE(etcd.ok()) << etcd.status().ToString();
  return {etcd.ok() ? std::move(*etcd) : nullptr, coord::MapKeys{config->etcd.prefix}};
}

void CheckInitialMap(const TestCluster& cluster, int servers, int replicas) {
  auto config = cluster.config();
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->etcd.endpoints.size(), 1u);
  auto view = ClusterEtcdStatus(cluster.dir());
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->prefix, config->etcd.prefix);
  EXPECT_EQ(view->map.epoch, 1);
  EXPECT_EQ(view->map.replicas, replicas);
  ASSERT_EQ(view->map.servers.size(), static_cast<size_t>(servers));
  for (int i = 0; i < servers; ++i) {
    const coord::MapServer& m = view->map.servers[i];
    EXPECT_EQ(m.id, i);
    EXPECT_EQ(m.address, config->servers[i].Endpoint());
    EXPECT_EQ(m.served_by, i);
    EXPECT_EQ(m.backup, replicas > 0 ? (i + 1) % servers : -1);
    EXPECT_TRUE(Contains(view->alive, static_cast<uint16_t>(i))) << "server " << i;
  }
}

TEST(Membership, ClusterUpWritesTheMapAndEveryServerHoldsALease) {
  TestCluster cluster(Options(3, 1));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  CheckInitialMap(cluster, 3, 1);
}

TEST(Membership, ServersInNetworkNamespacesReachTheClustersEtcd) {
  TestCluster cluster(Options(2, 1, /*netns=*/true));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  CheckInitialMap(cluster, 2, 1);
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  // etcd listens on the bridge's address, the servers' gateway from their namespaces.
  EXPECT_EQ(config->etcd.endpoints[0].rfind("http://10.", 0), 0u) << config->etcd.endpoints[0];
}

TEST(Membership, ASigkilledServersKeyGoesWithItsLease) {
  TestCluster cluster(Options(3, 0));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(static_cast<pid_t>(config->servers[1].pid), SIGKILL), 0);
  EtcdView view =
      WaitForView(cluster.dir(), [](const EtcdView& v) { return !Contains(v.alive, 1); });
  const auto gone_after = std::chrono::steady_clock::now() - killed_at;
  EXPECT_FALSE(Contains(view.alive, 1)) << "the killed server's key outlived its lease";
  EXPECT_TRUE(Contains(view.alive, 0));
  EXPECT_TRUE(Contains(view.alive, 2));
  std::printf("server 1's alive key went %lld ms after its SIGKILL (lease TTL 2 s)\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(gone_after).count()));
}

TEST(Membership, AServerWhoseLeaseWasLostRegistersAgain) {
  TestCluster cluster(Options(2, 0));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto [etcd, keys] = EtcdOf(cluster);
  ASSERT_TRUE(etcd);
  auto key = etcd->Get(keys.Alive(0));
  ASSERT_TRUE(key.ok() && key->has_value());
  const int64_t old_lease = (*key)->lease;
  ASSERT_TRUE(etcd->RevokeLease(old_lease).ok());  // as if it had lapsed
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (true) {
    key = etcd->Get(keys.Alive(0));
    ASSERT_TRUE(key.ok()) << key.status().ToString();
    if (key->has_value() && (*key)->lease != old_lease) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "server 0 did not register again";
    std::this_thread::sleep_for(50ms);
  }
  auto kept = etcd->KeepAlive((*key)->lease);
  EXPECT_TRUE(kept.ok()) << kept.status().ToString();
}

// etcd is not on the data path: with etcd's member killed, clients read and write as before;
// once it is back, every server holds a live lease again (its keepalive resumes, or it
// registers anew if the lease lapsed meanwhile). On loopback, and with the servers in network
// namespaces of their own (etcd on the bridge's root-side address, reached through each
// namespace's default route, as a member on another host would be).
class EtcdDown : public ::testing::TestWithParam<bool> {};

TEST_P(EtcdDown, ServersServeWhileEtcdIsDownAndRegisterAgainAfterItReturns) {
  const bool netns = GetParam();
  if (netns && geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  TestCluster cluster(Options(2, 1, netns));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  // With namespaces etcd listens on the bridge's address, the servers' gateway.
  EXPECT_EQ(config->etcd.endpoints[0].rfind(netns ? "http://10." : "http://127.0.0.1:", 0), 0u)
      << config->etcd.endpoints[0];
  auto pool = Pool::Connect(*config, PoolOptions{});
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  std::vector<GlobalAddress> objects;
  for (uint16_t s = 0; s < 2; ++s) {
    auto a = (*pool)->Alloc(64, Placement::OnServer(s));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    objects.push_back(*a);
  }
  ASSERT_EQ(kill(static_cast<pid_t>(config->etcd.pid), SIGKILL), 0);
  while (ProcessRunning(static_cast<pid_t>(config->etcd.pid))) std::this_thread::sleep_for(10ms);
  auto gone = ClusterEtcdStatus(cluster.dir());
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(gone.status().message().find(config->etcd.endpoints[0]), std::string::npos)
      << gone.status().message();
  // Longer than the servers' lease TTL (2 s) of writes and reads while etcd is down.
  const auto until = std::chrono::steady_clock::now() + 3s;
  uint64_t round = 0;
  while (std::chrono::steady_clock::now() < until) {
    ++round;
    for (size_t i = 0; i < objects.size(); ++i) {
      const uint64_t value = round * 10 + i;
      ASSERT_TRUE((*pool)->Write(objects[i], &value, 8).ok()) << "round " << round;
      uint64_t back = 0;
      ASSERT_TRUE((*pool)->Read(objects[i], &back, 8).ok());
      ASSERT_EQ(back, value);
    }
    std::this_thread::sleep_for(20ms);
  }
  Status restarted = RestartClusterEtcd(cluster.dir(), /*die_with_parent=*/true);
  ASSERT_TRUE(restarted.ok()) << restarted.ToString();
  EtcdView view = WaitForView(cluster.dir(), [](const EtcdView& v) {
    return Contains(v.alive, 0) && Contains(v.alive, 1);
  });
  EXPECT_TRUE(Contains(view.alive, 0) && Contains(view.alive, 1));
  EXPECT_EQ(view.map.epoch, 1);
  // Their leases are kept alive, not leftovers that etcd restored and will expire: twice the
  // TTL later (long past the restored leases' expiry had nobody kept them alive) the keys are
  // there, kept alive or registered anew. A server that gave up on etcd fails here.
  std::this_thread::sleep_for(4s);
  view = WaitForView(cluster.dir(), [](const EtcdView& v) {
    return Contains(v.alive, 0) && Contains(v.alive, 1);
  });
  EXPECT_TRUE(Contains(view.alive, 0) && Contains(view.alive, 1)) << "a lease lapsed for good";
  auto [etcd, keys] = EtcdOf(cluster);
  ASSERT_TRUE(etcd);
  for (uint16_t s = 0; s < 2; ++s) {
    auto key = etcd->Get(keys.Alive(s));
    ASSERT_TRUE(key.ok() && key->has_value()) << "server " << s;
    auto kept = etcd->KeepAlive((*key)->lease);  // fails (NotFound) if the lease is gone
    EXPECT_TRUE(kept.ok()) << "server " << s << ": " << kept.status().ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Membership, EtcdDown, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "ServersInNetworkNamespaces"
                                                         : "Loopback");
                         });

TEST(Membership, AnUnreachableEtcdIsAnErrorThatNamesItsUrl) {
  auto port = coord::FreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(*port);
  LocalClusterOptions o = Options(1, 0);
  o.etcd_endpoints = {url};
  o.dir = MakeTempDir("farpool-test");
  o.binary = FARPOOL_BINARY;
  o.die_with_parent = true;
  Status up = ClusterUp(o);
  ASSERT_FALSE(up.ok());
  EXPECT_EQ(up.code(), StatusCode::kUnavailable) << up.ToString();
  EXPECT_NE(up.message().find(url), std::string::npos) << up.message();
  EXPECT_FALSE(std::filesystem::exists(ClusterFile(o.dir)));
  std::filesystem::remove_all(o.dir);

  // A server told to register there does not start, and says why.
  const std::string command = std::string(FARPOOL_BINARY) +
                              " server --listen 127.0.0.1:0 --memory 8MiB --etcd " + url +
                              " --etcd-prefix /farpool/test/ 2>&1";
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  EXPECT_NE(pclose(p), 0) << out;
  EXPECT_NE(out.find("registering in etcd (" + url + ")"), std::string::npos) << out;
}

// A server whose etcd does not answer at its start (found in the network soak: `cluster add`
// into a network namespace made just before, etcd's address unreachable for over 500 ms) tries
// its first registration again (Membership::Options::first_registration) and registers once
// etcd answers: here etcd starts on the server's etcd port a second after the server.
TEST(Membership, AServerWhoseEtcdAnswersOnlyAfterItsStartRegistersThen) {
  const std::string dir = MakeTempDir("farpool-etcd-late");
  auto port = coord::FreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(*port);
  const std::string prefix = "/farpool/late/";
  const pid_t server = SpawnDetached({FARPOOL_BINARY, "server", "--listen", "127.0.0.1:0",
                                      "--memory", "8MiB", "--etcd", url, "--etcd-prefix", prefix},
                                     dir + "/server.log", /*die_with_parent=*/true);
  ASSERT_GT(server, 0);
  std::this_thread::sleep_for(1s);  // the server's first registration fails meanwhile
  coord::EtcdProcessOptions eo;
  eo.data_dir = dir + "/data";
  eo.log = dir + "/etcd.log";
  eo.client_port = *port;
  eo.die_with_parent = true;
  auto etcd = coord::StartEtcd(eo);
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  auto client = coord::EtcdClient::Create({{etcd->endpoint}});
  ASSERT_TRUE(client.ok());
  const std::string alive = coord::MapKeys{prefix}.Alive(0);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  bool registered = false;
  while (!registered && std::chrono::steady_clock::now() < deadline) {
    auto kv = (*client)->Get(alive);
    registered = kv.ok() && kv->has_value();
    if (!registered) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(registered) << "server log: " << FileTail(dir + "/server.log", 2000);
  StopProcesses({server, etcd->pid});
  std::filesystem::remove_all(dir);
}

// Two clusters share one existing etcd under their own prefixes; `cluster down` removes only
// its own keys and leaves that etcd running.
TEST(Membership, ClustersJoinAnExistingEtcdUnderTheirOwnPrefixes) {
  const std::string dir = MakeTempDir("farpool-etcd");
  coord::EtcdProcessOptions eo;
  eo.data_dir = dir + "/data";
  eo.log = dir + "/etcd.log";
  eo.die_with_parent = true;
  auto etcd = coord::StartEtcd(eo);
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  {
    LocalClusterOptions o = Options(1, 0);
    o.etcd_endpoints = {etcd->endpoint};
    TestCluster a(o), b(o);
    ASSERT_TRUE(a.status().ok()) << a.status().ToString();
    ASSERT_TRUE(b.status().ok()) << b.status().ToString();
    auto ca = a.config(), cb = b.config();
    ASSERT_TRUE(ca.ok() && cb.ok());
    EXPECT_EQ(ca->etcd.pid, 0);
    EXPECT_NE(ca->etcd.prefix, cb->etcd.prefix);
    CheckInitialMap(a, 1, 0);
    CheckInitialMap(b, 1, 0);
  }
  auto client = coord::EtcdClient::Create({{etcd->endpoint}});
  ASSERT_TRUE(client.ok());
  auto left = (*client)->GetPrefix("/farpool/");
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_TRUE(left->kvs.empty()) << left->kvs.size() << " keys left, the first "
                                 << left->kvs[0].key;
  StopProcesses({etcd->pid});
  std::filesystem::remove_all(dir);
}

// Writes increasing values into one object per server, round robin, and remembers per object
// the last value acknowledged and the values written after it whose outcome is unknown.
class Writer {
 public:
  Writer(Pool& pool, std::vector<GlobalAddress> objects)
      : pool_(pool), objects_(std::move(objects)), log_(objects_.size()) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Writer() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Waits until every object has had `n` acknowledged writes after this call (false after
  // 60 s: the client does not follow).
  bool AcknowledgedEverywhere(int n) {
    std::vector<uint64_t> start;
    {
      std::lock_guard lock(mu_);
      for (const Log& l : log_) start.push_back(l.acks);
    }
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
      bool all = true;
      {
        std::lock_guard lock(mu_);
        for (size_t i = 0; i < log_.size(); ++i) all = all && log_[i].acks >= start[i] + n;
      }
      if (all) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  // Writes that failed (outcome unknown) so far, and the latest failure's error.
  uint64_t failures() const { return failures_.load(); }
  uint64_t failures(size_t object) {
    std::lock_guard lock(mu_);
    return log_[object].failures;
  }
  std::string last_error() {
    std::lock_guard lock(mu_);
    return last_error_;
  }
  // Every object holds its last acknowledged value or a later one whose outcome was unknown.
  void CheckIntact() {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < objects_.size(); ++i) {
      uint64_t value = 0;
      Status read = pool_.Read(objects_[i], &value, 8);
      ASSERT_TRUE(read.ok()) << "object " << i << ": " << read.ToString();
      const Log& l = log_[i];
      const bool later = std::find(l.unknown.begin(), l.unknown.end(), value) != l.unknown.end();
      EXPECT_TRUE(value == l.acked || later)
          << "object " << i << " holds " << value << ", last acknowledged " << l.acked;
    }
  }

 private:
  struct Log {
    uint64_t acked = 0;
    uint64_t acks = 0;
    std::vector<uint64_t> unknown;  // written after `acked`, outcome unknown
    uint64_t failures = 0;
  };
  void Run() {
    uint64_t next = 0;
    while (!stop_) {
      for (size_t i = 0; i < objects_.size() && !stop_; ++i) {
        const uint64_t value = ++next;
        Status st = pool_.Write(objects_[i], &value, 8);
        std::lock_guard lock(mu_);
        if (st.ok()) {
          log_[i].acked = value;
          log_[i].unknown.clear();
          ++log_[i].acks;
        } else {
          log_[i].unknown.push_back(value);
          ++log_[i].failures;
          ++failures_;
          last_error_ = st.ToString();
        }
      }
      std::this_thread::sleep_for(2ms);
    }
  }

  Pool& pool_;
  const std::vector<GlobalAddress> objects_;
  std::mutex mu_;
  std::vector<Log> log_;    // guarded by mu_
  std::string last_error_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> failures_{0};
  std::thread thread_;
};

// Reads every object in one batch, again and again, and counts the batches that failed (with
// the first error): a read is resent wherever its region moved, so none should.
class Reader {
 public:
  Reader(Pool& pool, std::vector<GlobalAddress> objects)
      : pool_(pool), objects_(std::move(objects)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Reader() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t batches() const { return batches_.load(); }
  uint64_t failures() const { return failures_.load(); }
  std::string first_error() {
    std::lock_guard lock(mu_);
    return first_error_;
  }

 private:
  void Run() {
    std::vector<uint64_t> values(objects_.size());
    while (!stop_) {
      Batch batch(pool_);
      Status st;
      for (size_t i = 0; i < objects_.size() && st.ok(); ++i) {
        st = batch.Read(objects_[i], &values[i], 8);
      }
      Status waited = batch.Wait();
      if (st.ok()) st = waited;
      ++batches_;
      if (!st.ok()) {
        ++failures_;
        std::lock_guard lock(mu_);
        if (first_error_.empty()) first_error_ = st.ToString();
      }
    }
  }

  Pool& pool_;
  const std::vector<GlobalAddress> objects_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> batches_{0}, failures_{0};
  std::mutex mu_;
  std::string first_error_;  // guarded by mu_
  std::thread thread_;
};

// Every server a client reported gone (P/suspect/<id>) while it runs: polls etcd's view every
// 100 ms (a report stands for seconds: the coordinator drops a false one after 5.2 s).
class ReportWatcher {
 public:
  explicit ReportWatcher(std::string dir) : dir_(std::move(dir)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ReportWatcher() { Stop(); }
  // Stops polling; the servers reported meanwhile.
  std::set<uint16_t> Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return reported_;
  }

 private:
  void Run() {
    while (!stop_) {
      if (auto view = ClusterEtcdStatus(dir_); view.ok()) {
        reported_.insert(view->suspected.begin(), view->suspected.end());
      }
      std::this_thread::sleep_for(100ms);
    }
  }

  const std::string dir_;
  std::set<uint16_t> reported_;  // written by thread_ until Stop joins it
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int Coordinator(const std::string& dir) {
  return WaitForView(dir, [](const EtcdView& v) { return v.coordinator >= 0; }).coordinator;
}

// Reports servers suspected in etcd's keys (as a Pool that lost them does) for as long as it is
// told to: again every 500 ms, as a client that keeps failing to reach them would, since the
// coordinator drops a report that stood for seconds on a server that kept its registration
// (pool/server/coordinator.h "False suspicions").
class SuspicionReporter {
 public:
  explicit SuspicionReporter(const TestCluster& cluster) {
    ClusterEtcd found = EtcdOf(cluster);
    etcd_ = std::move(found.client);
    keys_ = found.keys;
    if (etcd_) thread_ = std::thread([this] { Run(); });
  }
  ~SuspicionReporter() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // Reports `id` now and on, or withdraws its report.
  void Set(uint16_t id, bool suspected) {
    ASSERT_TRUE(etcd_) << "no etcd to report to";
    std::lock_guard lock(mu_);
    const std::string key = keys_.Suspect(id);
    const Status done = suspected ? etcd_->Put(key, "test").status() : etcd_->Delete(key);
    ASSERT_TRUE(done.ok()) << done.ToString();
    if (suspected) {
      ids_.insert(id);
    } else {
      ids_.erase(id);
    }
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, 500ms, [&] { return stop_; })) {
      for (uint16_t id : ids_) {
        const Status again = etcd_->Put(keys_.Suspect(id), "test").status();
        EXPECT_TRUE(again.ok()) << again.ToString();
      }
    }
  }

  std::unique_ptr<coord::EtcdClient> etcd_;
  coord::MapKeys keys_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;       // guarded by mu_
  std::set<uint16_t> ids_;  // guarded by mu_
  std::thread thread_;
};

// A running cluster as the failover, re-replication and drain tests start it (Start): its
// server processes, the coordinator they elected, and a client with one 64 B object on each
// server (Connect).
struct Running {
  std::unique_ptr<TestCluster> cluster;
  int coordinator = -1;
  std::unique_ptr<Pool> pool;
  std::vector<GlobalAddress> objects;           // one per server, in id order
  std::unique_ptr<SuspicionReporter> reporter;  // made by Suspect; stops before the cluster

  const std::string& dir() const { return cluster->dir(); }
  // The cluster's file as it is now (with the servers `cluster add` entered since).
  ClusterConfig Config() const {
    auto config = cluster->config();
    EXPECT_TRUE(config.ok()) << config.status().ToString();
    return config.ok() ? *config : ClusterConfig{};
  }
  // Connects the client (replacing any earlier one) and allocates an object on each of the
  // servers 0 .. servers - 1.
  void Connect(int servers) {
    auto client = ConnectTestClient(*cluster);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    pool = std::move(client->pool);
    objects.clear();
    for (int s = 0; s < servers; ++s) {
      auto a = pool->Alloc(64, Placement::OnServer(static_cast<uint16_t>(s)));
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      objects.push_back(*a);
    }
  }
  // SIGKILLs server `id`.
  void Kill(int id) const {
    const ClusterConfig config = Config();
    ASSERT_LT(static_cast<size_t>(id), config.servers.size()) << "no server " << id;
    const auto pid = static_cast<pid_t>(config.servers[id].pid);
    ASSERT_GT(pid, 0) << "server " << id << " has no process";
    ASSERT_EQ(kill(pid, SIGKILL), 0);
  }
  // Reports server `id` gone once, as a Pool that lost it does (the coordinator judges the
  // report: pool/server/coordinator.h "False suspicions").
  void ReportOnce(int id) const {
    auto [etcd, keys] = EtcdOf(*cluster);
    ASSERT_TRUE(etcd);
    const Status put = etcd->Put(keys.Suspect(static_cast<uint16_t>(id)), "test").status();
    ASSERT_TRUE(put.ok()) << put.ToString();
  }
  // Reports server `id` suspected (and keeps reporting it, SuspicionReporter), or withdraws
  // the report: the coordinator copies nothing to a suspected server.
  void Suspect(int id, bool suspected) {
    if (!reporter) reporter = std::make_unique<SuspicionReporter>(*cluster);
    ASSERT_NO_FATAL_FAILURE(reporter->Set(static_cast<uint16_t>(id), suspected));
  }
  // Once `writer` is acknowledged on every server, SIGKILLs server `victim`; the writer's
  // client must follow the failover.
  void KillUnderWriter(int victim, Writer* writer) const {
    ASSERT_TRUE(writer->AcknowledgedEverywhere(20));
    ASSERT_NO_FATAL_FAILURE(Kill(victim));
    EXPECT_TRUE(writer->AcknowledgedEverywhere(50)) << "the client did not follow the failover";
  }
};

// Starts the cluster of `o`, connects the client to its `o.servers` servers unless `connect`
// is false, and waits for the coordinator's election.
void Start(const LocalClusterOptions& o, Running* r, bool connect = true) {
  r->cluster = std::make_unique<TestCluster>(o);
  ASSERT_TRUE(r->cluster->status().ok()) << r->cluster->status().ToString();
  if (connect) {
    ASSERT_NO_FATAL_FAILURE(r->Connect(o.servers));
  }
  r->coordinator = Coordinator(r->dir());
  ASSERT_GE(r->coordinator, 0) << "no coordinator elected";
}

// SIGKILL of a primary (not the coordinator) under a writing client: the coordinator promotes
// its backup and moves the epoch; the client follows the map; no acknowledged write is lost.
void KillAPrimary(bool netns) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, netns);
  o.mirror_slots = 1;  // no re-replication: the map below is the failover's alone
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int victim = (r.coordinator + 1) % kServers;
  const int backup = (victim + 1) % kServers;
  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(victim, &writer));
  writer.Stop();
  writer.CheckIntact();
  EtcdView view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.epoch, 2);
  EXPECT_EQ(view.map.Find(victim)->served_by, backup);
  EXPECT_EQ(view.map.Find(victim)->backup, -1);
  EXPECT_EQ(view.map.Find((victim + kServers - 1) % kServers)->backup, -1);  // degraded
  // The failover came on the client's report, not after the lease: the key goes later.
  view = WaitForView(r.dir(), [&](const EtcdView& v) { return !Contains(v.alive, victim); });
  EXPECT_FALSE(Contains(view.alive, static_cast<uint16_t>(victim)));
  EXPECT_EQ(view.map.epoch, 2);
}

TEST(CoordinatorFailover, ASigkilledPrimaryIsFailedOverByTheCoordinatorAndTheClientFollows) {
  KillAPrimary(false);
}

TEST(CoordinatorFailover, ServersInNetworkNamespaces) { KillAPrimary(true); }

// A client's report of a live server (seen in the network soak: an evicted client took its
// closed connections for server 0's death) is dropped once the server has kept its etcd
// registration for 2 TTLs + kServeLease + margin (pool/server/coordinator.h "False
// suspicions"). Here the suspect's backup is SIGKILLed right after the report, so the
// suspect's region has no backup until re-replication copies it again, which it does only for
// a server nobody suspects. Before, the report stood for ever: the region kept one copy, and
// the soak's next fault waited for a backup that never came.
TEST(CoordinatorFailover, AFalseReportOfALiveServerIsDroppedAndItsRegionCopiedAgain) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int suspect = (r.coordinator + 1) % kServers;
  const int backup = (suspect + 1) % kServers;  // the suspect's backup, not the coordinator
  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.ReportOnce(suspect));
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(backup, &writer));
  const EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return v.suspected.empty() && !v.map.Find(suspect)->Backups().empty();
  });
  EXPECT_TRUE(view.suspected.empty()) << "the report of live server " << suspect << " stands";
  EXPECT_EQ(view.map.Find(suspect)->served_by, suspect) << view.map.ToJson();
  EXPECT_FALSE(view.map.Find(suspect)->Backups().empty())
      << "server " << suspect << "'s region was not copied again: " << view.map.ToJson();
  EXPECT_TRUE(writer.AcknowledgedEverywhere(20));
  writer.Stop();
  writer.CheckIntact();
}

// The same with the suspect's backup alive: the backup answers "not yet" to every promote, and
// once it still does at the end of the wait the report is dropped; nothing moves (the map's
// epoch stays 1) and the client's writes are acknowledged throughout.
TEST(CoordinatorFailover, AFalseReportOfAServerWhoseBackupRefusesIsDroppedAndNothingMoves) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int suspect = (r.coordinator + 1) % kServers;
  Writer writer(*r.pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20));
  ASSERT_NO_FATAL_FAILURE(r.ReportOnce(suspect));
  ASSERT_FALSE(ClusterEtcdStatus(r.dir()).value().suspected.empty());
  const EtcdView view =
      WaitForView(r.dir(), [&](const EtcdView& v) { return v.suspected.empty(); });
  EXPECT_TRUE(view.suspected.empty()) << "the report of live server " << suspect << " stands";
  EXPECT_EQ(view.map.epoch, 1) << view.map.ToJson();
  EXPECT_EQ(view.map.Find(suspect)->served_by, suspect) << view.map.ToJson();
  EXPECT_TRUE(writer.AcknowledgedEverywhere(20));
  writer.Stop();
  writer.CheckIntact();
}

// Every key put under a cluster's prefix from its start on (an etcd watch of the prefix), and
// a way to know that the watch has delivered everything put up to now (Settle: a marker key,
// which the watch delivers after every earlier put).
class PutRecorder {
 public:
  explicit PutRecorder(const TestCluster& cluster) : etcd_(EtcdOf(cluster)) {
    auto config = cluster.config();
    EXPECT_TRUE(config.ok() && etcd_.client);
    if (!config.ok() || !etcd_.client) return;
    coord::EtcdWatch::Options o;
    o.endpoints = config->etcd.endpoints;
    o.key = etcd_.keys.prefix;
    o.prefix = true;
    o.on_update = [this](const coord::EtcdWatch::Update& u) {
      std::lock_guard lock(mu_);
      for (const coord::KeyValue& kv : u.kvs) keys_.push_back(kv.key);
      for (const coord::WatchEvent& e : u.events) {
        if (e.type == coord::WatchEvent::Type::kPut) keys_.push_back(e.kv.key);
      }
      ++updates_;
      cv_.notify_all();
    };
    auto watch = coord::EtcdWatch::Start(std::move(o));
    EXPECT_TRUE(watch.ok()) << watch.status().ToString();
    if (watch.ok()) watch_ = std::move(*watch);
  }
  // Waits for the first delivery (the snapshot: the watch runs); false after 30 s.
  bool Started() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 30s, [&] { return updates_ > 0; });
  }
  // Puts a marker key and waits until the watch has delivered it; false after 30 s.
  bool Settle() {
    const std::string marker = etcd_.keys.prefix + "test/settled-" + std::to_string(++markers_);
    if (!etcd_.client || !etcd_.client->Put(marker, "1").ok()) return false;
    std::unique_lock lock(mu_);
    return cv_.wait_for(
        lock, 30s, [&] { return std::find(keys_.begin(), keys_.end(), marker) != keys_.end(); });
  }
  // The keys put so far that start with `prefix`.
  std::vector<std::string> With(const std::string& prefix) {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (const std::string& k : keys_) {
      if (k.starts_with(prefix)) out.push_back(k);
    }
    return out;
  }
  const coord::MapKeys& keys() const { return etcd_.keys; }

 private:
  ClusterEtcd etcd_;
  int markers_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> keys_;            // guarded by mu_
  int updates_ = 0;                          // guarded by mu_
  std::unique_ptr<coord::EtcdWatch> watch_;  // last: stopped before what it writes to
};

// A client process evicted in a replicated cluster on etcd (as a database fences a process
// stalled past its lease; the fault soak's client-stop) takes the refusal of its tag for its own
// fence, not for the servers' death: every later call of it fails with Evicted and the
// eviction's words, it reports no server gone (no P/suspect/<id> is ever put: every put under
// the prefix is watched, up to a marker after its calls) and nothing is failed over (the map's
// epoch stays 1, every region at its own server); the evicting client goes on. Before, the
// evicted Pool took each server for gone in turn: it put P/suspect/<id> for it, waited 8 s
// (kCoordinatorWait) for a failover that never came and asked its backup itself, and its calls
// failed with Unavailable (docs/pool.md "Soak with more kinds of fault", finding 2).
TEST(CoordinatorFailover, AnEvictedClientFailsFastAndReportsNoServerGone) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1);
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  PutRecorder puts(*r.cluster);
  ASSERT_TRUE(puts.Started()) << "the watch of etcd did not start";
  auto victim = ConnectTestClient(*r.cluster);
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  Pool& evicted = *victim->pool;
  std::vector<GlobalAddress> mine;
  for (int s = 0; s < kServers; ++s) {
    auto a = evicted.Alloc(64, Placement::OnServer(static_cast<uint16_t>(s)));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    const uint64_t v = 1;
    ASSERT_TRUE(evicted.Write(*a, &v, 8).ok());
    mine.push_back(*a);
  }

  const Status done = r.pool->Evict(evicted.process_tag());
  ASSERT_TRUE(done.ok()) << done.ToString();

  // Every server, then a new object: each fails with the eviction, and names it.
  auto expect_evicted = [](const Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), StatusCode::kEvicted) << what << ": " << s.ToString();
    EXPECT_NE(s.message().find("evicted by server "), std::string::npos)
        << what << ": " << s.ToString();
  };
  for (int s = 0; s < kServers; ++s) {
    uint64_t back = 0;
    expect_evicted(evicted.Read(mine[s], &back, 8), "a read on server " + std::to_string(s));
    const uint64_t v = 2;
    expect_evicted(evicted.Write(mine[s], &v, 8), "a write on server " + std::to_string(s));
    expect_evicted(evicted.Stats(static_cast<uint16_t>(s)).status(),
                   "stats of server " + std::to_string(s));
  }
  expect_evicted(evicted.Alloc(64).status(), "an allocation");

  // The evicting client goes on, on every server.
  for (int s = 0; s < kServers; ++s) {
    const uint64_t v = 100 + s;
    ASSERT_TRUE(r.pool->Write(r.objects[s], &v, 8).ok()) << "server " << s;
    uint64_t back = 0;
    ASSERT_TRUE(r.pool->Read(r.objects[s], &back, 8).ok()) << "server " << s;
    EXPECT_EQ(back, v) << "server " << s;
  }
  // The evicted Pool closed (its monitor and map watcher joined, which met the eviction too),
  // so nothing of it can put a key after the marker; every put up to the marker delivered:
  // none is a suspicion, and the map did not move.
  victim->pool.reset();
  ASSERT_TRUE(puts.Settle()) << "the watch of etcd delivered no marker";
  EXPECT_TRUE(puts.With(puts.keys().SuspectPrefix()).empty())
      << "the evicted client reported a live server gone: "
      << puts.With(puts.keys().SuspectPrefix()).front();
  const EtcdView view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.epoch, 1) << view.map.ToJson();
  for (int s = 0; s < kServers; ++s) {
    const coord::MapServer* m = view.map.Find(static_cast<uint16_t>(s));
    ASSERT_NE(m, nullptr) << "server " << s << " is not in the map: " << view.map.ToJson();
    EXPECT_EQ(m->served_by, s) << view.map.ToJson();
    EXPECT_TRUE(Contains(view.alive, static_cast<uint16_t>(s))) << "server " << s;
  }
}

// SIGKILL of the coordinator (a primary too): another server is elected and fails the dead
// one over; then a later failure of another server is handled by the new coordinator.
TEST(CoordinatorFailover, AnotherCoordinatorIsElectedAndHandlesLaterFailures) {
  constexpr int kServers = 4;
  LocalClusterOptions o = Options(kServers, 1);
  o.mirror_slots = 1;  // no re-replication: the epochs below count failovers
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int first = r.coordinator;
  Writer writer(*r.pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20));
  ASSERT_NO_FATAL_FAILURE(r.Kill(first));
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return v.coordinator >= 0 && v.coordinator != first && v.map.epoch == 2;
  });
  ASSERT_EQ(view.map.epoch, 2);
  const int second = view.coordinator;
  EXPECT_NE(second, first);
  EXPECT_EQ(view.map.Find(first)->served_by, (first + 1) % kServers);
  EXPECT_TRUE(writer.AcknowledgedEverywhere(50)) << "the client did not follow the failover";

  // A second failure, of a server whose backup is alive and which serves no other region.
  const int victim = (first + 2) % kServers;
  ASSERT_NO_FATAL_FAILURE(r.Kill(victim));
  EXPECT_TRUE(writer.AcknowledgedEverywhere(50)) << "the client did not follow the failover";
  writer.Stop();
  writer.CheckIntact();
  view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.epoch, 3);
  EXPECT_EQ(view.map.Find(victim)->served_by, (victim + 1) % kServers);
}

// The tails of the logs of `r`'s servers but `victim`.
std::string SurvivorLogs(const Running& r, int servers, int victim) {
  std::string logs;
  for (int s = 0; s < servers; ++s) {
    if (s == victim) continue;
    logs += FileTail(r.dir() + "/server-" + std::to_string(s) + ".log", 4000);
  }
  return logs;
}

// SIGKILL of the coordinator (the primary of a region whose backup is alive) with the servers'
// etcd leases 60 s long: within the test the dead coordinator's lease cannot lapse, so another
// coordinator elected and the dead one failed over can only come from the revocation
// (coord/membership.h "Dead peers"): its backup saw its connection close (and the other
// survivor the coordinator's connection to its mirror) and probed its port until it refused. A
// server as `cluster up` starts it (512 MiB, two mirror slots) closes its listening port tens of ms
// after its connections, so a single probe at the close mostly found the port still accepting and
// nothing was revoked: with the probe not repeated this test failed in 3 of 3 runs (the view still
// named the dead server the coordinator after 30 s). docs/pool.md "The coordinator's death, and its
// term".
TEST(CoordinatorFailover, AKilledCoordinatorsLeaseIsRevokedNotWaitedFor) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.memory = 512ull << 20;  // and two mirror slots each, as `cluster up` starts it
  o.lease_ttl = 60s;        // longer than WaitForView's 30 s
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r, /*connect=*/false));
  const int victim = r.coordinator;
  const int backup = (victim + 1) % kServers;
  ASSERT_NO_FATAL_FAILURE(r.Kill(victim));
  const EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return v.coordinator >= 0 && v.coordinator != victim && v.map.epoch >= 2;
  });
  EXPECT_NE(view.coordinator, victim) << "the dead coordinator's key is still there";
  EXPECT_FALSE(Contains(view.alive, static_cast<uint16_t>(victim)));
  ASSERT_GE(view.map.epoch, 2);  // re-replication may have moved it on since
  EXPECT_EQ(view.map.Find(victim)->served_by, backup);
  const std::string logs = SurvivorLogs(r, kServers, victim);
  EXPECT_NE(logs.find("its lease revoked"), std::string::npos) << logs;
}

// The same without replicas (every server campaigns: it has a mirror slot, for drains): nobody
// keeps a copy of the coordinator's region, so no forwards of its stop; the servers see the
// connections it kept to their mirrors (Coordinator::OpenAhead, one a tick) close, and probe
// the server the coordinator key names. Without that (Mirror's on_coordinator_closed not
// called) the dead coordinator's key stays for the 60 s lease and this test fails.
TEST(CoordinatorFailover, WithoutReplicasAKilledCoordinatorsLeaseIsRevokedToo) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 0, /*netns=*/true);
  o.lease_ttl = 60s;  // longer than WaitForView's 30 s
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r, /*connect=*/false));
  const int victim = r.coordinator;
  // Time for the coordinator to open its connections to the mirrors (a tick each, 100 ms): not
  // an assertion; too short a wait would fail the test, not pass it.
  std::this_thread::sleep_for(3s);
  ASSERT_NO_FATAL_FAILURE(r.Kill(victim));
  const EtcdView view = WaitForView(
      r.dir(), [&](const EtcdView& v) { return v.coordinator >= 0 && v.coordinator != victim; });
  EXPECT_NE(view.coordinator, victim) << "the dead coordinator's key is still there";
  EXPECT_FALSE(Contains(view.alive, static_cast<uint16_t>(victim)));
  const std::string logs = SurvivorLogs(r, kServers, victim);
  EXPECT_NE(logs.find("its lease revoked"), std::string::npos) << logs;
}

// Re-replication (docs/pool.md "Re-replication"), servers in network namespaces over TCP, with
// the default mirror slots (two each with three servers): SIGKILL of a primary under a writing
// client; the coordinator fails it over, then restores a backup for both regions left with one copy
// (the one whose backup died, and the dead server's own, now served from a promoted slot) while the
// client writes on; then SIGKILL of the server that took the first one over: every region moves to
// the last server (the first one a second time, from its new backup), and no acknowledged write is
// lost: not the bytes written before the first failure (copied), nor those written after the copies
// (forwarded).
// SIGKILL of the coordinator, which is also the backup of another server's region: a server
// that saw it go finds its port refusing connections and revokes its lease, so another
// coordinator is elected at once rather than after the 2 s TTL, and it degrades the primary
// whose backup died before that primary's forwards time out (backup_timeout, 1 s) and its
// serving lease (1 s) lapses. The writes to the surviving servers' objects never fail; without
// the revocation every one of them failed for a second ("the change was applied here but not
// acknowledged", then "its backup has not answered").
TEST(CoordinatorFailover, AKilledCoordinatorIsReplacedBeforeItsPrimaryStopsServing) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.mirror_slots = 1;  // no re-replication: the map below is the failover's alone
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int victim = r.coordinator;
  const int primary = (victim + kServers - 1) % kServers;  // its backup is the victim
  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(victim, &writer));
  writer.Stop();
  writer.CheckIntact();
  for (int s = 0; s < kServers; ++s) {
    if (s == victim) continue;  // a write in flight at the kill fails: its outcome is unknown
    EXPECT_EQ(writer.failures(s), 0u)
        << "writes to server " << s << (s == primary ? " (the victim's primary)" : "")
        << " failed, the latest: " << writer.last_error();
  }
  EtcdView view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.epoch, 2);
  EXPECT_EQ(view.map.Find(victim)->served_by, (victim + 1) % kServers);
  EXPECT_EQ(view.map.Find(primary)->backup, -1) << "degraded";
  // Its backup, or the primary, whose connection from the coordinator closed too: whichever
  // finds the port refusing first.
  const std::string logs = SurvivorLogs(r, kServers, victim);
  EXPECT_NE(logs.find("its lease revoked"), std::string::npos) << logs;
}

TEST(ReReplication, EveryRegionGetsABackupAgainAndSurvivesASecondFailure) {
  constexpr int kServers = 3;
  // The default mirror slots (`cluster up` without --mirror-slots): room enough for this.
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(Options(kServers, 1, /*netns=*/true), &r));
  {
    auto initial = ClusterEtcdStatus(r.dir());
    ASSERT_TRUE(initial.ok()) << initial.status().ToString();
    for (const coord::MapServer& m : initial->map.servers) {
      EXPECT_EQ(m.slots, 2u) << "server " << m.id << ": the default with 3 servers";
    }
  }
  // A pattern of several slices' worth on every server, written before any failure.
  constexpr uint64_t kBig = 3 * kCopySlice;
  std::vector<GlobalAddress> big;
  std::vector<std::vector<uint8_t>> pattern;
  for (int s = 0; s < kServers; ++s) {
    auto a = r.pool->Alloc(kBig, Placement::OnServer(static_cast<uint16_t>(s)));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    big.push_back(*a);
    std::vector<uint8_t> bytes(kBig);
    for (uint64_t i = 0; i < kBig; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + s * 13 + i / 4096);
    ASSERT_TRUE(r.pool->Write(*a, bytes.data(), kBig).ok());
    pattern.push_back(std::move(bytes));
  }
  // The ring: the backup of i is i + 1. `first` (not the coordinator) dies: `keeper` serves
  // its region from slot 0; `second` loses its backup (`first`).
  const int keeper = r.coordinator;
  const int first = (keeper + 2) % kServers;
  const int second = (keeper + 1) % kServers;
  Writer writer(*r.pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20));
  ASSERT_NO_FATAL_FAILURE(r.Kill(first));
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return v.map.Find(first)->served_by != first &&
           std::all_of(v.map.servers.begin(), v.map.servers.end(),
                       [](const coord::MapServer& m) { return m.backup >= 0; });
  });
  EXPECT_EQ(view.map.epoch, 4) << "failover, then two re-replications";
  EXPECT_EQ(view.map.Find(first)->served_by, keeper);
  EXPECT_EQ(view.map.Find(first)->served_slot, 0);
  EXPECT_EQ(view.map.Find(first)->backup, second) << "the only other live server";
  EXPECT_EQ(view.map.Find(first)->backup_slot, 1);
  EXPECT_EQ(view.map.Find(second)->backup, keeper);
  EXPECT_EQ(view.map.Find(second)->backup_slot, 1);
  EXPECT_EQ(view.map.Find(keeper)->backup, second) << "unchanged";
  EXPECT_TRUE(writer.AcknowledgedEverywhere(20)) << "writes stopped after re-replication";
  // New bytes after the copies: they reach the new backups only as forwards.
  for (int s = 0; s < kServers; ++s) {
    for (uint8_t& b : pattern[s]) b ^= 0x5a;
    ASSERT_TRUE(r.pool->Write(big[s], pattern[s].data(), kBig).ok()) << "server " << s;
  }

  // The coordinator dies too: another is elected and moves all three regions to `second`.
  ASSERT_NO_FATAL_FAILURE(r.Kill(keeper));
  EXPECT_TRUE(writer.AcknowledgedEverywhere(50)) << "the client did not follow the failover";
  view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return std::all_of(v.map.servers.begin(), v.map.servers.end(),
                       [&](const coord::MapServer& m) { return m.served_by == second; });
  });
  EXPECT_TRUE(writer.AcknowledgedEverywhere(20)) << "the client did not follow the second move";
  writer.Stop();
  writer.CheckIntact();
  for (int s = 0; s < kServers; ++s) {
    std::vector<uint8_t> got(kBig);
    Status read = r.pool->Read(big[s], got.data(), kBig);
    ASSERT_TRUE(read.ok()) << "server " << s << ": " << read.ToString();
    EXPECT_TRUE(got == pattern[s]) << "server " << s << "'s pattern changed";
  }
  EXPECT_EQ(view.map.Find(first)->served_by, second);
  EXPECT_EQ(view.map.Find(first)->served_slot, 1) << "from its new backup's slot";
  EXPECT_EQ(view.map.Find(keeper)->served_slot, 0);
  EXPECT_EQ(view.map.Find(second)->backup, -1);
}

// Runs `command` through the shell and returns its standard output and error.
std::string Output(const std::string& command) {
  std::string out;
  if (FILE* f = popen((command + " 2>&1").c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    pclose(f);
  }
  return out;
}

// Limits what network namespace `ns` sends to `rate` (tc's token bucket on each of its links
// but lo): a server whose copy to a new backup is slow, as on a loaded host.
void LimitEgress(const std::string& ns, const std::string& rate) {
  std::istringstream links(Output("ip -n " + ns + " -o link show"));
  std::string line;
  while (std::getline(links, line)) {
    // "2: fp1234p1@if7: <...>": the name is the second field, up to '@' or ':'.
    const size_t start = line.find(": ") + 2;
    const std::string name = line.substr(start, line.find_first_of("@:", start) - start);
    if (name == "lo") continue;
    const std::string cmd = "ip netns exec " + ns + " tc qdisc replace dev " + name +
                            " root tbf rate " + rate + " burst 32kbit latency 5s";
    ASSERT_EQ(Output(cmd), "") << cmd;
  }
}

// A copy to a new backup never starves the copying server's loop or its serving lease: the
// server that took a dead server's region over copies it to the other survivor's free slot
// while its link sends at 12 Mbit/s (1.5 MB/s; a 2 MiB slice then blocks for 1.4 s, longer than
// the serving lease) and a client writes to every server throughout. Once the failover has
// landed, no write fails until the copies are complete and the map has every region backed up.
// With a whole slice per blocking forward (before `failfast`) the copying server's own writes
// failed ("its backup has not answered for ... ms").
TEST(ReReplication, ASlowCopyNeverStarvesTheCopyingServersLease) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.memory = 16 << 20;  // 11 s to copy at 1.5 MB/s
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  // As in EveryRegionGetsABackupAgain...: `keeper` takes `first`'s region over and copies it.
  const int keeper = r.coordinator;
  const int first = (keeper + 2) % kServers;
  Writer writer(*r.pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20));
  ASSERT_NO_FATAL_FAILURE(r.Kill(first));
  // The failover (a write cut by the kill fails: its outcome is unknown), then the slow link.
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) { return v.map.epoch >= 2; });
  ASSERT_EQ(view.map.Find(first)->served_by, keeper);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20)) << "the client did not follow the failover";
  ASSERT_NO_FATAL_FAILURE(LimitEgress(r.Config().servers[keeper].netns, "12mbit"));
  const uint64_t failed_before = writer.failures();
  view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return std::all_of(v.map.servers.begin(), v.map.servers.end(),
                       [](const coord::MapServer& m) { return m.backup >= 0; });
  });
  EXPECT_EQ(view.map.epoch, 4) << "failover, then two re-replications";
  EXPECT_EQ(view.map.Find(first)->backup, (keeper + 1) % kServers);
  EXPECT_TRUE(writer.AcknowledgedEverywhere(20)) << "writes stopped after re-replication";
  writer.Stop();
  EXPECT_EQ(writer.failures() - failed_before, 0u)
      << "writes failed during the copy, the latest: " << writer.last_error();
  writer.CheckIntact();
}

// Without a free mirror slot (one slot each, `--mirror-slots 1`) nothing is re-replicated: the
// map keeps the region with one copy, and the coordinator says why.
TEST(ReReplication, WithoutAFreeSlotTheRegionKeepsOneCopy) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1);
  o.mirror_slots = 1;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int first = (r.coordinator + 2) % kServers;
  const int second = (r.coordinator + 1) % kServers;
  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(first, &writer));
  const std::string coordinator_log = r.dir() + "/server-" + std::to_string(r.coordinator) + ".log";
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (FileTail(coordinator_log, 4000).find("no live server has a free mirror slot") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(FileTail(coordinator_log, 4000).find("no live server has a free mirror slot"),
            std::string::npos);
  writer.Stop();
  writer.CheckIntact();
  EtcdView view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.epoch, 2) << "the failover only";
  EXPECT_EQ(view.map.Find(second)->backup, -1);
}

// `cluster add` (docs/pool.md "cluster add"), servers in network namespaces: the new server
// gets a namespace of its own, registers, enters the map (epoch 2) and gets a backup in a free
// slot (epoch 3); a client that connects then leases chunks on it, striped allocations land
// there too, and when it is SIGKILLed under that client's writes its backup takes over.
TEST(ClusterAdd, AnAddedServerJoinsGetsABackupAndTakesNewChunks) {
  LocalClusterOptions o = Options(2, 1, /*netns=*/true);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r, /*connect=*/false));
  auto id = AddServer(o, *r.cluster);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, 2);
  const ClusterConfig config = r.Config();
  ASSERT_EQ(config.servers.size(), 3u);
  EXPECT_FALSE(config.servers[2].netns.empty());
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return v.map.Find(2) != nullptr && v.map.Find(2)->backup >= 0;
  });
  EXPECT_EQ(view.map.epoch, 3) << "joined, then backed up";
  EXPECT_TRUE(Contains(view.alive, 2));
  ASSERT_NE(view.map.Find(2), nullptr);
  EXPECT_EQ(view.map.Find(2)->served_by, 2);
  EXPECT_EQ(view.map.Find(2)->backup_slot, 1) << "slot 0 of each holds the ring's copy";

  ASSERT_NO_FATAL_FAILURE(r.Connect(3));  // one object on each, server 2's too
  int on_new = 0;
  for (int i = 0; i < 12; ++i) {
    auto a = r.pool->Alloc(4 << 20, Placement::Striped());
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    on_new += a->server() == 2;
  }
  EXPECT_GT(on_new, 0) << "no striped chunk on the added server";
  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(2, &writer));
  writer.Stop();
  writer.CheckIntact();
}

// A Pool connected before `cluster add` (servers in network namespaces) learns the added server
// from the map while threads use it: once the server has joined (and has a backup), striped
// chunks land on it, a thread that began before the add writes and reads an object there (its
// endpoint made on first use), and the writes to the other servers that ran throughout lose
// nothing.
TEST(ClusterAdd, ARunningPoolLearnsTheAddedServerAndPlacesChunksThere) {
  LocalClusterOptions o = Options(2, 1, /*netns=*/true);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  Pool& pool = *r.pool;
  Writer writer(pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(10));
  // A thread that began before the add and later uses the added server.
  std::mutex mu;
  std::vector<GlobalAddress> later;  // guarded by mu: objects on the added server
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> round_trips{0}, failures{0};
  std::string first_failure;  // guarded by mu
  std::thread old_thread([&] {
    uint64_t value = 0;
    while (!stop) {
      std::vector<GlobalAddress> objects;
      {
        std::lock_guard lock(mu);
        objects = later;
      }
      for (GlobalAddress a : objects) {
        ++value;
        uint64_t back = 0;
        Status st = pool.Write(a, &value, 8);
        if (st.ok()) st = pool.Read(a, &back, 8);
        if (st.ok() && back != value) st = Status::Internal("read back " + std::to_string(back));
        ++round_trips;
        if (!st.ok()) {
          ++failures;
          std::lock_guard lock(mu);
          if (first_failure.empty()) first_failure = st.ToString();
        }
      }
      std::this_thread::sleep_for(1ms);
    }
  });
  auto id = AddServer(o, *r.cluster);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_EQ(*id, 2);
  // Changes are refused until the coordinator names its backup (re-replication).
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return v.map.Find(2) != nullptr && v.map.Find(2)->backup >= 0;
  });
  ASSERT_GE(view.map.Find(2)->backup, 0);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!Contains(pool.server_ids(), 2) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(Contains(pool.server_ids(), 2)) << "the running Pool did not learn server 2";
  auto geometry = pool.Geometry(2);
  ASSERT_TRUE(geometry.ok()) << geometry.status().ToString();
  EXPECT_EQ(geometry->chunk_size, o.chunk_size);
  // Striped: some chunks on the new server (it is one of three in turn).
  int on_new = 0;
  for (int i = 0; i < 6; ++i) {
    auto a = pool.Alloc(4 << 20, Placement::Striped());
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    on_new += a->server() == 2;
  }
  EXPECT_GT(on_new, 0) << "no striped chunk on the added server";
  // An object there, from this thread (its context predates the add too), bytes read back.
  auto object = pool.Alloc(4096, Placement::OnServer(2));
  ASSERT_TRUE(object.ok()) << object.status().ToString();
  std::vector<uint8_t> pattern(4096), back(4096);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(pool.Write(*object, pattern.data(), pattern.size()).ok());
  ASSERT_TRUE(pool.Read(*object, back.data(), back.size()).ok());
  EXPECT_EQ(back, pattern);
  auto counter = pool.Alloc(64, Placement::OnServer(2));
  ASSERT_TRUE(counter.ok()) << counter.status().ToString();
  {
    std::lock_guard lock(mu);
    later.push_back(*counter);
  }
  while (round_trips < 200 && std::chrono::steady_clock::now() < deadline + 30s) {
    std::this_thread::sleep_for(10ms);
  }
  stop = true;
  old_thread.join();
  EXPECT_GE(round_trips.load(), 200u);
  EXPECT_EQ(failures.load(), 0u) << first_failure;
  EXPECT_TRUE(writer.AcknowledgedEverywhere(10));
  writer.Stop();
  writer.CheckIntact();
  EXPECT_EQ(writer.failures(), 0u) << writer.last_error();
}

// A running Pool learns a change of the map from its etcd watch alone (branch `etcdwatch`):
// with the safety-net read made an hour apart, the server that `cluster add` enters reaches the
// Pool only if the watch delivers the new map; the counter says it came by the watch. Then
// etcd is restarted (RestartClusterEtcd) and a second add, after the watch resumed, arrives the
// same way.
TEST(MapWatch, ARunningPoolLearnsAddedServersFromTheWatchAloneAcrossAnEtcdRestart) {
  LocalClusterOptions o = Options(2, 1);
  o.mirror_slots = 2;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  PoolOptions po;
  po.map_poll = std::chrono::hours(1);
  auto connected = Pool::Connect(*config, po);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Pool& pool = **connected;
  auto learns = [&](uint16_t id) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!Contains(pool.server_ids(), id) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
    }
    return Contains(pool.server_ids(), id);
  };
  const OpCounters before = pool.counters();
  auto id = AddServer(o, cluster);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(learns(*id)) << "the running Pool did not learn server " << *id;
  const OpCounters after = pool.counters();
  EXPECT_GT(after.maps_watched, before.maps_watched);
  EXPECT_EQ(after.maps_polled, 0u);

  ASSERT_EQ(kill(static_cast<pid_t>(config->etcd.pid), SIGKILL), 0);
  while (ProcessRunning(static_cast<pid_t>(config->etcd.pid))) std::this_thread::sleep_for(10ms);
  Status restarted = RestartClusterEtcd(cluster.dir(), /*die_with_parent=*/true);
  ASSERT_TRUE(restarted.ok()) << restarted.ToString();
  auto second = AddServer(o, cluster);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(learns(*second)) << "the running Pool did not learn server " << *second
                               << " after etcd restarted";
  EXPECT_GT(pool.counters().maps_watched, after.maps_watched);
  EXPECT_EQ(pool.counters().maps_polled, 0u);
  // Changes are refused until the coordinator names its backup (re-replication).
  EtcdView view = WaitForView(cluster.dir(), [&](const EtcdView& v) {
    return v.map.Find(*second) != nullptr && v.map.Find(*second)->backup >= 0;
  });
  ASSERT_GE(view.map.Find(*second)->backup, 0);
  auto object = pool.Alloc(64, Placement::OnServer(*second));
  ASSERT_TRUE(object.ok()) << object.status().ToString();
  const uint64_t value = 42;
  uint64_t back = 0;
  ASSERT_TRUE(pool.Write(*object, &value, 8).ok());
  ASSERT_TRUE(pool.Read(*object, &back, 8).ok());
  EXPECT_EQ(back, value);
}

// A server the map names that does not answer yet (here: nothing listens on its port) neither
// fails nor stalls a running Pool: it is not entered, nothing is placed on it, the writes to
// the other servers go on; once a server listens there the Pool enters it and uses it. Without
// replicas: in a replicated cluster a server whose region has no backup in the map is not
// entered at all (ARunningPoolDoesNotEnterAnAddedServerWithoutABackup).
TEST(ClusterAdd, AServerThatDoesNotAnswerYetIsEnteredOnceItDoes) {
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(Options(2, 0), &r));
  Pool& pool = *r.pool;
  Writer writer(pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(10));
  // A free port, closed again: connections to it are refused until the server below listens.
  auto free_port = coord::FreePort("127.0.0.1");
  ASSERT_TRUE(free_port.ok()) << free_port.status().ToString();
  const uint16_t port = *free_port;
  constexpr uint16_t kId = 7;
  auto [etcd, keys] = EtcdOf(*r.cluster);
  ASSERT_TRUE(etcd);
  auto kv = etcd->Get(keys.Map());
  ASSERT_TRUE(kv.ok() && kv->has_value());
  auto map = coord::ClusterMap::Parse((*kv)->value, keys.Map());
  ASSERT_TRUE(map.ok());
  coord::MapServer added;
  added.id = kId;
  added.address = "127.0.0.1:" + std::to_string(port);
  added.memory = 32 << 20;
  added.served_by = kId;
  map->servers.push_back(added);
  map->epoch += 1;
  ASSERT_TRUE(etcd->Put(keys.Map(), map->ToJson()).ok());
  // Time for the watcher to meet the silent server (a few tries); not asserted on.
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(Contains(pool.server_ids(), kId)) << "entered before it said hello";
  ASSERT_TRUE(writer.AcknowledgedEverywhere(10)) << "the silent server held the Pool up";
  for (int i = 0; i < 4; ++i) {
    auto a = pool.Alloc(4 << 20, Placement::Striped());
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_NE(a->server(), kId);
  }
  ServerOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  so.memory = 32 << 20;
  so.id = kId;
  so.progress = ProgressMode::kEvent;
  so.fabric = Fabric::kTcp;
  so.secret_file = SecretFile(r.dir());
  auto server = MemoryServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!Contains(pool.server_ids(), kId) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(Contains(pool.server_ids(), kId)) << "not entered once it answered";
  auto object = pool.Alloc(4096, Placement::OnServer(kId));
  ASSERT_TRUE(object.ok()) << object.status().ToString();
  std::vector<uint8_t> pattern(4096, 0x5a), back(4096);
  ASSERT_TRUE(pool.Write(*object, pattern.data(), pattern.size()).ok());
  ASSERT_TRUE(pool.Read(*object, back.data(), back.size()).ok());
  EXPECT_EQ(back, pattern);
  writer.Stop();
  writer.CheckIntact();
  EXPECT_EQ(writer.failures(), 0u) << writer.last_error();
  r.pool.reset();  // says goodbye to the server before it stops
  (*server)->Stop();
}

// Re-replication onto an added server: with one slot each there is no room after a failure;
// `cluster add` brings a server with a free slot, the region that lost its backup is copied
// there, and when that region's server dies too the added server takes it over.
TEST(ClusterAdd, AnAddedServerIsWhereAStrandedRegionGetsItsBackup) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1);
  o.mirror_slots = 1;  // no room on the survivors: the region is stranded with one copy
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r, /*connect=*/false));
  const int first = (r.coordinator + 2) % kServers;
  const int second = (r.coordinator + 1) % kServers;  // loses its backup, `first`
  ASSERT_NO_FATAL_FAILURE(r.Kill(first));
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) { return v.map.epoch == 2; });
  ASSERT_EQ(view.map.Find(second)->backup, -1);
  LocalClusterOptions add = Options(kServers, 1);
  add.mirror_slots = 2;  // for both regions left with one copy (the dead server's own too)
  auto id = AddServer(add, *r.cluster);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  view = WaitForView(r.dir(), [&](const EtcdView& v) { return v.map.Find(second)->backup == *id; });
  EXPECT_EQ(view.map.Find(second)->backup, *id);
  EXPECT_EQ(view.map.Find(*id)->backup, -1) << "no room left for the added server's own copy";

  // A client of the grown cluster writes to `second` (and the others) and sees it die.
  PoolOptions po;
  po.op_timeout = 5000ms;
  auto pool = Pool::Connect(r.Config(), po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  std::vector<GlobalAddress> objects;
  for (int s : {r.coordinator, second}) {
    auto a = (*pool)->Alloc(64, Placement::OnServer(static_cast<uint16_t>(s)));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    objects.push_back(*a);
  }
  Writer writer(**pool, objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(second, &writer));
  writer.Stop();
  writer.CheckIntact();
  view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.Find(second)->served_by, *id);
}

// A running Pool does not enter an added server whose own region has no backup (found in the
// network soak: after a failover's re-replication took the survivors' free slots, the server
// `cluster add` started next stayed without one): it refuses every lease and batch, so striped
// chunks and a new session's stamp word placed there would fail. The Pool learns the map that
// names it (maps_watched/maps_polled) and, one join deadline (1 s) later, still has not
// entered it; striped allocations all succeed on the others.
TEST(ClusterAdd, ARunningPoolDoesNotEnterAnAddedServerWithoutABackup) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1);
  o.mirror_slots = 1;  // no room on the survivors: two regions are left with one copy
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int first = (r.coordinator + 2) % kServers;
  const int second = (r.coordinator + 1) % kServers;
  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(first, &writer));
  writer.Stop();
  writer.CheckIntact();
  LocalClusterOptions add = Options(kServers, 1);
  add.mirror_slots = 2;  // both stranded copies come here; its own region has no room
  const OpCounters before = r.pool->counters();
  auto id = AddServer(add, *r.cluster);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    const coord::MapServer* f = v.map.Find(static_cast<uint16_t>(first));
    return v.map.Find(second)->backup == *id && f != nullptr && f->backup == *id;
  });
  ASSERT_EQ(view.map.Find(second)->backup, *id);
  ASSERT_EQ(view.map.Find(*id)->backup, -1) << "no room left for the added server's own copy";
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  auto maps = [&] { return r.pool->counters().maps_watched + r.pool->counters().maps_polled; };
  const uint64_t maps_before = before.maps_watched + before.maps_polled;
  while (maps() < maps_before + 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(maps(), maps_before + 1) << "the Pool did not learn the map that names the server";
  std::this_thread::sleep_for(1500ms);  // past the join's deadline (kJoinTimeout, 1 s)
  EXPECT_FALSE(Contains(r.pool->server_ids(), *id)) << "entered without a backup";
  for (int i = 0; i < 12; ++i) {
    auto a = r.pool->Alloc(4 << 20, Placement::Striped());
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_NE(a->server(), *id);
  }
}

// Whether every region of `v`'s map is served by a server other than `gone`, with `f` backups,
// none of them `gone` or its own server.
bool EveryRegionHasBackups(const EtcdView& v, int f, int gone) {
  return std::all_of(v.map.servers.begin(), v.map.servers.end(), [&](const coord::MapServer& m) {
    const std::vector<coord::MapServer::Backup> backups = m.Backups();
    return m.served_by != gone && static_cast<int>(backups.size()) == f &&
           std::none_of(backups.begin(), backups.end(),
                        [&](const auto& b) { return b.id == gone || b.id == m.served_by; });
  });
}

// With --replicas 2 an added server gets two backups (docs/pool.md "Replication with f
// backups"): re-replication names them one after the other, in ring order after it, in the
// free slots. Then it and its first backup are SIGKILLed at once under a writing client: its
// second backup takes its region over and no acknowledged write is lost.
TEST(ClusterAdd, WithTwoReplicasTheAddedServerGetsTwoBackups) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 2, /*netns=*/true);
  o.mirror_slots = 3;  // two for the ring's copies, one free for the added server's
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r, /*connect=*/false));
  auto id = AddServer(o, *r.cluster);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_EQ(*id, kServers);
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    const coord::MapServer* m = v.map.Find(kServers);
    return m != nullptr && m->Backups().size() == 2;
  });
  const coord::MapServer* added = view.map.Find(kServers);
  ASSERT_NE(added, nullptr);
  const std::vector<coord::MapServer::Backup> backups = added->Backups();
  ASSERT_EQ(backups.size(), 2u) << view.map.ToJson();
  EXPECT_EQ(backups[0].id, 0) << "ring order after the added server";
  EXPECT_EQ(backups[1].id, 1) << view.map.ToJson();
  EXPECT_TRUE(EveryRegionHasBackups(view, 2, -1)) << view.map.ToJson();

  ASSERT_NO_FATAL_FAILURE(r.Connect(kServers + 1));
  Writer writer(*r.pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20));
  ASSERT_NO_FATAL_FAILURE(r.Kill(kServers));
  ASSERT_NO_FATAL_FAILURE(r.Kill(backups[0].id));
  EXPECT_TRUE(writer.AcknowledgedEverywhere(50)) << "the client did not follow the failovers";
  writer.Stop();
  writer.CheckIntact();
  view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.Find(kServers)->served_by, backups[1].id) << view.map.ToJson();
}

// `cluster drain` (docs/pool.md "cluster drain") under a writing client: the drained server's
// region moves to its backup (a planned failover), its process ends, no server keeps anything
// on it afterwards (the region it kept a copy of gets a new one in a free slot), and no
// acknowledged write is lost.
TEST(ClusterDrain, ADrainedServersRegionMovesToItsBackupUnderWritesAndItsProcessEnds) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int victim = (r.coordinator + 1) % kServers;
  Writer writer(*r.pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20));
  Status drained = ClusterDrain(r.dir(), static_cast<uint16_t>(victim), 30000ms);
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  EXPECT_FALSE(ProcessRunning(static_cast<pid_t>(r.Config().servers[victim].pid)));
  EXPECT_TRUE(writer.AcknowledgedEverywhere(50)) << "the client did not follow the drain";
  EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return std::none_of(v.map.servers.begin(), v.map.servers.end(), [&](const auto& m) {
      return m.served_by == victim || m.backup == victim || (m.served_by == m.id && m.backup < 0);
    });
  });
  EXPECT_EQ(view.map.Find(victim)->served_by, (victim + 1) % kServers);
  for (const coord::MapServer& m : view.map.servers) {
    EXPECT_NE(m.served_by, victim) << "server " << m.id;
    EXPECT_NE(m.backup, victim) << "server " << m.id;
  }
  EXPECT_FALSE(Contains(view.alive, static_cast<uint16_t>(victim)));
  writer.Stop();
  writer.CheckIntact();
  std::printf(
      "writes that failed during the drain (outcome unknown, retried by the writer): %llu\n",
      static_cast<unsigned long long>(writer.failures()));
}

// A drain with --replicas 2 (4 servers, the default slots: 3): the region moves to its first
// backup, and re-replication restores two backups to every region (the drained one's and
// those the drained server backed up) on the three survivors, none of them the drained server.
// Every region then has a copy on every survivor, so two of them SIGKILLed at once under the
// writer lose nothing: the third serves every region.
TEST(ClusterDrain, WithTwoReplicasEveryRegionHasTwoBackupsAgain) {
  constexpr int kServers = 4;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(Options(kServers, 2), &r));
  const int victim = (r.coordinator + 1) % kServers;
  Writer writer(*r.pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20));
  Status drained = ClusterDrain(r.dir(), static_cast<uint16_t>(victim), 30000ms);
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  EXPECT_TRUE(writer.AcknowledgedEverywhere(50)) << "the client did not follow the drain";
  EtcdView view =
      WaitForView(r.dir(), [&](const EtcdView& v) { return EveryRegionHasBackups(v, 2, victim); });
  ASSERT_TRUE(EveryRegionHasBackups(view, 2, victim)) << view.map.ToJson();
  const int spared = (victim + 3) % kServers;
  for (int k : {1, 2}) ASSERT_NO_FATAL_FAILURE(r.Kill((victim + k) % kServers));
  EXPECT_TRUE(writer.AcknowledgedEverywhere(50)) << "the client did not follow the failovers";
  writer.Stop();
  writer.CheckIntact();
  view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return std::all_of(v.map.servers.begin(), v.map.servers.end(),
                       [&](const coord::MapServer& m) { return m.served_by == spared; });
  });
  for (const coord::MapServer& m : view.map.servers) {
    EXPECT_EQ(m.served_by, spared) << view.map.ToJson();
  }
}

// The planned move seen by clients (docs/pool.md "cluster drain"): while two threads write
// their own objects on every server and two read every object, server 1 is drained. The
// server refuses what arrives during the drain without executing it and the clients resend
// it to the region's new server: no reader sees an error, and no write fails either (each is
// refused before it runs or done before the hand-over), every acknowledged write survives.
TEST(ClusterDrain, ReadersAndWritersSeeNoErrorWhileTheRegionMoves) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r, /*connect=*/false));
  const ClusterConfig config = r.Config();
  PoolOptions po;
  po.op_timeout = 5000ms;
  auto connected = Pool::Connect(config, po);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Pool& pool = **connected;
  std::vector<GlobalAddress> objects[2], all;
  for (int w = 0; w < 2; ++w) {
    for (int s = 0; s < kServers; ++s) {
      for (int k = 0; k < 2; ++k) {
        auto a = pool.Alloc(64, Placement::OnServer(static_cast<uint16_t>(s)));
        ASSERT_TRUE(a.ok()) << a.status().ToString();
        objects[w].push_back(*a);
        all.push_back(*a);
      }
    }
  }
  const int victim = (r.coordinator + 1) % kServers;
  Writer writer0(pool, objects[0]), writer1(pool, objects[1]);
  Reader reader0(pool, all), reader1(pool, all);
  ASSERT_TRUE(writer0.AcknowledgedEverywhere(20));
  ASSERT_TRUE(writer1.AcknowledgedEverywhere(20));
  const uint64_t resent_before = pool.counters().resent;
  Status drained = ClusterDrain(r.dir(), static_cast<uint16_t>(victim), 30000ms);
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  EXPECT_FALSE(ProcessRunning(static_cast<pid_t>(config.servers[victim].pid)));
  EXPECT_TRUE(writer0.AcknowledgedEverywhere(20)) << "the client did not follow the drain";
  EXPECT_TRUE(writer1.AcknowledgedEverywhere(20)) << "the client did not follow the drain";
  const uint64_t batches = reader0.batches() + reader1.batches();
  reader0.Stop();
  reader1.Stop();
  writer0.Stop();
  writer1.Stop();
  writer0.CheckIntact();
  writer1.CheckIntact();
  const uint64_t resent = pool.counters().resent - resent_before;
  std::printf(
      "drain of server %d: %llu read batches, %llu operations resent; failed: %llu "
      "reads, %llu writes\n",
      victim, static_cast<unsigned long long>(batches), static_cast<unsigned long long>(resent),
      static_cast<unsigned long long>(reader0.failures() + reader1.failures()),
      static_cast<unsigned long long>(writer0.failures() + writer1.failures()));
  EXPECT_EQ(reader0.failures() + reader1.failures(), 0u)
      << reader0.first_error() << " / " << reader1.first_error();
  EXPECT_EQ(writer0.failures() + writer1.failures(), 0u);
  EXPECT_GT(resent, 0u) << "nothing was refused and resent: the drain was not under load";
}

// Bad input: an unknown id, a server that serves nothing of its own any more, the last server:
// each a clear error, and nothing changes (the map's epoch, the server still running).
TEST(ClusterDrain, BadInputIsRefusedAndChangesNothing) {
  TestCluster cluster(Options(2, 1));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  Status unknown = ClusterDrain(cluster.dir(), 9, 30000ms);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument) << unknown.ToString();
  EXPECT_NE(unknown.message().find("no server 9 in the cluster (servers: 0 1)"), std::string::npos)
      << unknown.message();
  EXPECT_EQ(ClusterEtcdStatus(cluster.dir()).value().map.epoch, 1);
  Status drained = ClusterDrain(cluster.dir(), 1, 30000ms);
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  EtcdView view = ClusterEtcdStatus(cluster.dir()).value();
  const int64_t epoch = view.map.epoch;
  EXPECT_EQ(view.map.Find(1)->served_by, 0);
  Status again = ClusterDrain(cluster.dir(), 1, 30000ms);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.ToString();
  EXPECT_NE(again.message().find("serves no region of its own"), std::string::npos)
      << again.message();
  Status last = ClusterDrain(cluster.dir(), 0, 30000ms);
  EXPECT_EQ(last.code(), StatusCode::kInvalidArgument) << last.ToString();
  EXPECT_NE(last.message().find("server 0 is the last server"), std::string::npos)
      << last.message();
  EXPECT_TRUE(ProcessRunning(static_cast<pid_t>(config->servers[0].pid)));
  EXPECT_EQ(ClusterEtcdStatus(cluster.dir()).value().map.epoch, epoch);
}

// Drain without replicas (docs/pool.md "Drain without replicas"): servers in network
// namespaces over TCP, `--replicas 0` with the default slot each (one, free).

// A pattern of `size` bytes that depends on `seed`.
std::vector<uint8_t> Pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 131 + (i >> 12) + seed);
  return bytes;
}

// While two threads write their own objects on every server and two read every object, a
// server holding a 2 MiB pattern and those objects is drained: its region is copied to a
// survivor's free slot, handed over, and its process ends. No read or write fails, every
// acknowledged write and the pattern read back (through the running client and a new one),
// and the map has the region served by the survivor from that slot. With the copy's pieces
// emptied (CopyStep sending nothing) the pattern does not read back.
TEST(DrainWithoutReplicas, TheRegionMovesToASurvivorsSlotWhileClientsReadAndWrite) {
  constexpr int kServers = 3;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(Options(kServers, 0, /*netns=*/true), &r, /*connect=*/false));
  const ClusterConfig config = r.Config();
  EtcdView before = ClusterEtcdStatus(r.dir()).value();
  for (const coord::MapServer& m : before.map.servers) {
    EXPECT_EQ(m.slots, 1u) << "server " << m.id << ": DefaultMirrorSlots without replicas";
    EXPECT_EQ(m.backup, -1);
  }
  PoolOptions po;
  po.op_timeout = 5000ms;
  auto connected = Pool::Connect(config, po);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Pool& pool = **connected;
  const int victim = (r.coordinator + 1) % kServers;
  const std::vector<uint8_t> pattern = Pattern(2 << 20, 17);
  auto at = pool.Alloc(pattern.size(), Placement::OnServer(static_cast<uint16_t>(victim)));
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  ASSERT_TRUE(pool.Write(*at, pattern.data(), pattern.size()).ok());
  std::vector<GlobalAddress> objects[2], all;
  for (int w = 0; w < 2; ++w) {
    for (int s = 0; s < kServers; ++s) {
      auto a = pool.Alloc(64, Placement::OnServer(static_cast<uint16_t>(s)));
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      objects[w].push_back(*a);
      all.push_back(*a);
    }
  }
  Writer writer0(pool, objects[0]), writer1(pool, objects[1]);
  Reader reader0(pool, all), reader1(pool, all);
  ASSERT_TRUE(writer0.AcknowledgedEverywhere(20));
  ASSERT_TRUE(writer1.AcknowledgedEverywhere(20));
  Status drained = ClusterDrain(r.dir(), static_cast<uint16_t>(victim), 60000ms);
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  EXPECT_FALSE(ProcessRunning(static_cast<pid_t>(config.servers[victim].pid)));
  EXPECT_TRUE(writer0.AcknowledgedEverywhere(20)) << "the client did not follow the drain";
  EXPECT_TRUE(writer1.AcknowledgedEverywhere(20)) << "the client did not follow the drain";
  reader0.Stop();
  reader1.Stop();
  writer0.Stop();
  writer1.Stop();
  std::printf("drain of server %d without replicas: failed: %llu reads, %llu writes\n", victim,
              static_cast<unsigned long long>(reader0.failures() + reader1.failures()),
              static_cast<unsigned long long>(writer0.failures() + writer1.failures()));
  EXPECT_EQ(reader0.failures() + reader1.failures(), 0u)
      << reader0.first_error() << " / " << reader1.first_error();
  EXPECT_EQ(writer0.failures() + writer1.failures(), 0u)
      << writer0.last_error() << " / " << writer1.last_error();
  writer0.CheckIntact();
  writer1.CheckIntact();
  EtcdView view = ClusterEtcdStatus(r.dir()).value();
  const coord::MapServer* moved = view.map.Find(static_cast<uint16_t>(victim));
  ASSERT_NE(moved, nullptr);
  EXPECT_NE(moved->served_by, victim);
  EXPECT_EQ(moved->served_slot, 0) << "the survivor's free slot";
  EXPECT_EQ(moved->backup, -1) << "one copy, as before the drain";
  EXPECT_FALSE(Contains(view.alive, static_cast<uint16_t>(victim)));
  std::vector<uint8_t> back(pattern.size());
  ASSERT_TRUE(pool.Read(*at, back.data(), back.size()).ok());
  EXPECT_TRUE(back == pattern) << "the running client reads another pattern";
  // A client that connects after the drain finds the region where the map says.
  auto fresh = ConnectTestClient(*r.cluster);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  std::vector<uint8_t> again(pattern.size());
  Status read = fresh->pool->Read(*at, again.data(), again.size());
  ASSERT_TRUE(read.ok()) << read.ToString();
  EXPECT_TRUE(again == pattern) << "a new client reads another pattern";
  uint64_t value = 0;
  Status object = fresh->pool->Read(objects[0][victim], &value, 8);
  ASSERT_TRUE(object.ok()) << object.ToString();
  EXPECT_GT(value, 0u);
}

// Checks first, nothing changed: an unknown id; no survivor with a free slot (`--mirror-slots
// 0`); the last server. Each refused with its reason; the epoch and the servers stay.
TEST(DrainWithoutReplicas, RefusedWithoutAFreeSlotAndChangesNothing) {
  LocalClusterOptions o = Options(2, 0);
  o.mirror_slots = 0;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  Status unknown = ClusterDrain(cluster.dir(), 9, 30000ms);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument) << unknown.ToString();
  Status full = ClusterDrain(cluster.dir(), 1, 30000ms);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_NE(full.message().find("no live server has a free mirror slot"), std::string::npos)
      << full.message();
  EXPECT_NE(full.message().find("0: 0 of 0 free"), std::string::npos) << full.message();
  EtcdView view = ClusterEtcdStatus(cluster.dir()).value();
  EXPECT_EQ(view.map.epoch, 1);
  EXPECT_EQ(view.map.Find(1)->served_by, 1);
  EXPECT_TRUE(Contains(view.alive, 1));
  EXPECT_TRUE(ProcessRunning(static_cast<pid_t>(config->servers[1].pid)));
}

// The target dies mid-copy: server 1's link is slowed to 12 Mbit/s so that copying its 16 MiB
// takes ~11 s, and server 0, the target, is SIGKILLed 2 s into it. The drain fails saying why,
// the copy is given up, the map is unchanged, and a client writing to server 1 throughout sees
// no error and loses nothing.
TEST(DrainWithoutReplicas, ATargetKilledMidCopyFailsTheDrainAndLosesNothing) {
  LocalClusterOptions o = Options(2, 0, /*netns=*/true);
  o.memory = 16 << 20;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  PoolOptions po;
  po.op_timeout = 5000ms;
  auto connected = Pool::Connect(*config, po);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Pool& pool = **connected;
  std::vector<GlobalAddress> objects;
  for (int k = 0; k < 2; ++k) {
    auto a = pool.Alloc(64, Placement::OnServer(1));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    objects.push_back(*a);
  }
  Writer writer(pool, objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20));
  ASSERT_NO_FATAL_FAILURE(LimitEgress(config->servers[1].netns, "12mbit"));
  Status drained;
  std::thread drain([&] { drained = ClusterDrain(cluster.dir(), 1, 60000ms); });
  const std::string log = cluster.dir() + "/server-1.log";
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (Output("cat " + log).find("copying its region") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(2s);
  ASSERT_EQ(kill(static_cast<pid_t>(config->servers[0].pid), SIGKILL), 0);
  drain.join();
  std::printf("the drain: %s\n", drained.ToString().c_str());
  EXPECT_FALSE(drained.ok());
  EXPECT_NE(drained.message().find("the region stays on server 1"), std::string::npos)
      << drained.ToString();
  EXPECT_TRUE(writer.AcknowledgedEverywhere(50)) << "server 1 stopped serving after the drain";
  writer.Stop();
  EXPECT_EQ(writer.failures(), 0u) << writer.last_error();
  writer.CheckIntact();
  EtcdView view = ClusterEtcdStatus(cluster.dir()).value();
  EXPECT_EQ(view.map.Find(1)->served_by, 1);
  EXPECT_EQ(view.map.Find(1)->backup, -1);
  EXPECT_TRUE(ProcessRunning(static_cast<pid_t>(config->servers[1].pid)));
  EXPECT_NE(Output("cat " + log).find("copying its region to backup server 0"), std::string::npos)
      << "server 1 did not give the copy up";
}

// Fencing by epoch: a server that finds in the map that its region is served by another (as
// after a failover decided while it was cut off) stops serving and exits, on its own.
TEST(Membership, AServerThatTheMapMovedAwayShutsItselfDown) {
  TestCluster cluster(Options(2, 1));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  auto [etcd, keys] = EtcdOf(cluster);
  ASSERT_TRUE(etcd);
  auto kv = etcd->Get(keys.Map());
  ASSERT_TRUE(kv.ok() && kv->has_value());
  auto map = coord::ClusterMap::Parse((*kv)->value, keys.Map());
  ASSERT_TRUE(map.ok());
  coord::ClusterMap moved = *map;
  moved.epoch = map->epoch + 1;
  for (coord::MapServer& m : moved.servers) {
    if (m.id == 0) {
      m.served_by = 1;
      m.backup = -1;
    }
    if (m.id == 1) m.backup = -1;
  }
  ASSERT_TRUE(etcd->Put(keys.Map(), moved.ToJson()).ok());
  const pid_t server0 = static_cast<pid_t>(config->servers[0].pid);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (ProcessRunning(server0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_FALSE(ProcessRunning(server0)) << "server 0 still runs after the map moved its region";
  EXPECT_TRUE(ProcessRunning(static_cast<pid_t>(config->servers[1].pid)));
  const std::string log = FileTail(cluster.dir() + "/server-0.log", 2000);
  EXPECT_NE(log.find("fenced by the cluster map: epoch 2"), std::string::npos) << log;
}

// The memory the mirror slots of server process `pid` hold: the blocks of its slots' file (a
// memfd, pool/server/mirror.h "Memory"); -1 if it has none. A few pages more than the slots
// that hold copies (SlotsHeld).
int64_t SlotBytes(pid_t pid) {
  std::error_code ec;
  const std::filesystem::path fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& fd : std::filesystem::directory_iterator(fds, ec)) {
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (ec || target.find("memfd:farpool-mirror-slots") == std::string::npos) continue;
    struct stat st {};
    if (stat(fd.path().c_str(), &st) == 0) return static_cast<int64_t>(st.st_blocks) * 512;
  }
  return -1;
}

// How many slots of `size` bytes server process `pid` holds the memory of.
int64_t SlotsHeld(pid_t pid, uint64_t size) { return SlotBytes(pid) / static_cast<int64_t>(size); }

// A copy the map no longer names gives its memory back (docs/pool.md "Re-replication's loose
// ends"): with --replicas 2 on 3 servers (two slots each) the failover of `victim` promotes its
// first backup and drops its second, `stale`, whose slot kept that copy's memory until it was
// attached again. `stale` is suspected by a client (as Pool reports a server it lost) before
// the kill, so re-replication does not pick it and cannot reuse that slot: after the failover,
// every live server's slots hold exactly the memory of the slots the map names. Then the
// suspicion goes, and the region's new copy goes to `stale`'s freed slot.
TEST(ReReplication, ACopyTheMapNoLongerNamesGivesItsMemoryBack) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 2, /*netns=*/true);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int victim = (r.coordinator + 2) % kServers;
  const int keeper = (victim + 1) % kServers;  // the coordinator
  const int stale = (victim + 2) % kServers;
  const ClusterConfig config = r.Config();
  EtcdView view = ClusterEtcdStatus(r.dir()).value();
  const std::vector<coord::MapServer::Backup> backups = view.map.Find(victim)->Backups();
  ASSERT_EQ(backups.size(), 2u) << view.map.ToJson();
  ASSERT_EQ(backups[1].id, stale) << view.map.ToJson();
  const int stale_slot = backups[1].slot;
  const pid_t stale_pid = static_cast<pid_t>(config.servers[stale].pid);
  ASSERT_EQ(SlotsHeld(stale_pid, o.memory), 2) << "both slots hold copies";

  ASSERT_NO_FATAL_FAILURE(r.Suspect(stale, true));
  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(victim, &writer));
  view = WaitForView(r.dir(),
                     [&](const EtcdView& v) { return v.map.Find(victim)->served_by == keeper; });
  ASSERT_EQ(view.map.Find(victim)->served_by, keeper) << view.map.ToJson();
  ASSERT_TRUE(view.map.Find(victim)->Backups().empty()) << view.map.ToJson();
  // Each live server's slots: the memory of those the map names (promoted or backups), once
  // the coordinator has told the dropped copy's server (bounded wait, then the check).
  auto expected = [&](const EtcdView& v, int id) {
    return static_cast<int64_t>(v.map.SlotsInUse(static_cast<uint16_t>(id)).size());
  };
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (SlotsHeld(stale_pid, o.memory) != expected(view, stale) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  view = ClusterEtcdStatus(r.dir()).value();
  for (int id : {keeper, stale}) {
    EXPECT_EQ(SlotsHeld(static_cast<pid_t>(config.servers[id].pid), o.memory), expected(view, id))
        << "server " << id << "'s slots hold memory the map does not name: " << view.map.ToJson();
  }

  // The slot is free for the next copy: re-replication puts the region's there.
  ASSERT_NO_FATAL_FAILURE(r.Suspect(stale, false));
  view = WaitForView(r.dir(),
                     [&](const EtcdView& v) { return !v.map.Find(victim)->Backups().empty(); });
  const std::vector<coord::MapServer::Backup> now = view.map.Find(victim)->Backups();
  ASSERT_EQ(now.size(), 1u) << view.map.ToJson();
  EXPECT_EQ(now[0].id, stale) << view.map.ToJson();
  EXPECT_EQ(now[0].slot, stale_slot) << view.map.ToJson();
  EXPECT_EQ(SlotsHeld(stale_pid, o.memory), expected(view, stale)) << view.map.ToJson();
  ASSERT_TRUE(writer.AcknowledgedEverywhere(20)) << "writes stopped after re-replication";
  writer.Stop();
  writer.CheckIntact();
}

// The term of the coordinator now (its key's create_revision; 0 if none holds it).
int64_t CoordinatorTerm(const Running& r) {
  auto [etcd, keys] = EtcdOf(*r.cluster);
  if (!etcd) return 0;
  auto kv = etcd->Get(keys.Coordinator());
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  return kv.ok() && *kv ? (*kv)->create_revision : 0;
}

// One BackupRequest to server `primary` on a tool connection, as a coordinator of `term` would
// send it: copy server `region`'s region to server `target`'s `slot`, the map's backups of the
// region being `named`.
Result<wire::BackupReply> AskBackupAsTool(const Running& r, int primary, int region, int target,
                                          uint16_t slot, int64_t term,
                                          const std::vector<wire::MapBackup>& named) {
  const ClusterConfig config = r.Config();
  FARPOOL_ASSIGN_OR_RETURN(auto secret,
                           transport::ClusterSecret::Read(r.dir() + "/" + kSecretFileName));
  const ServerAddress& p = config.servers[primary];
  const ServerAddress& t = config.servers[target];
  FARPOOL_ASSIGN_OR_RETURN(
      auto tool, control::Connection::OpenAsTool(p.id, p.Endpoint(), p.port, &secret, 0x7002, 5s));
  FARPOOL_ASSIGN_OR_RETURN(
      auto request, wire::MakeBackupRequest(t.id, t.host, t.port, static_cast<uint16_t>(region),
                                            slot, term, named));
  FARPOOL_ASSIGN_OR_RETURN(
      auto reply,
      tool->Call([&](uint64_t id) { return wire::EncodeBackupRequest(id, request, named); },
                 wire::Opcode::kBackupReply));
  return reply.message.As<wire::BackupReply>();
}

// The region's backups in etcd's map, as a BackupRequest carries them.
std::vector<wire::MapBackup> MapBackupsNow(const Running& r, int region) {
  const EtcdView view = ClusterEtcdStatus(r.dir()).value();
  std::vector<wire::MapBackup> named;
  for (const coord::MapServer::Backup& b :
       view.map.Find(static_cast<uint16_t>(region))->Backups()) {
    named.push_back({b.id, static_cast<uint16_t>(b.slot)});
  }
  return named;
}

// Asks server `primary`, as the coordinator of the current term would before a map write that
// then fails, to copy server `region`'s region to server `target`'s `slot` (the request carrying
// the region's backups in etcd's map), and again until the copy is whole: whether it was within
// 30 s.
bool CopyAsACoordinator(const Running& r, int primary, int region, int target, uint16_t slot) {
  const std::vector<wire::MapBackup> named = MapBackupsNow(r, region);
  const int64_t term = CoordinatorTerm(r);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto reply = AskBackupAsTool(r, primary, region, target, slot, term, named);
    if (reply.ok() && reply->remaining == 0) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// A copy that an earlier coordinator chose in another slot of the target is named where it is
// (docs/pool.md "Re-replication's loose ends"), not refused every tick. 3 servers, --replicas 1,
// three slots each; `target` is reported suspected, so that after the SIGKILL of `victim` the
// coordinator leaves `victim`'s region (served by `keeper`) with no backup; the test then asks
// `keeper` itself, as a coordinator before would have, to copy it to `target`'s slot 2 and
// waits until that copy is whole. Once the suspicion goes, the coordinator picks `target`'s
// lowest free slot, 1: the reply names slot 2 and the map names that one. Then `keeper` is
// SIGKILLed under the writer: `target` serves the region from slot 2, nothing acknowledged lost.
TEST(ReReplication, ACopyInAnotherSlotOfTheTargetIsNamedWhereItIs) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.mirror_slots = 3;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int victim = (r.coordinator + 2) % kServers;
  const int keeper = (victim + 1) % kServers;  // the coordinator
  const int target = (victim + 2) % kServers;
  constexpr uint16_t kEarlierSlot = 2;
  ASSERT_NO_FATAL_FAILURE(r.Suspect(target, true));
  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(victim, &writer));
  EtcdView view = WaitForView(
      r.dir(), [&](const EtcdView& v) { return v.map.Find(victim)->served_by == keeper; });
  ASSERT_EQ(view.map.Find(victim)->served_by, keeper) << view.map.ToJson();
  ASSERT_TRUE(view.map.Find(victim)->Backups().empty()) << view.map.ToJson();

  ASSERT_TRUE(CopyAsACoordinator(r, keeper, victim, target, kEarlierSlot))
      << "the copy to server " << target << "'s slot 2 did not complete";

  ASSERT_NO_FATAL_FAILURE(r.Suspect(target, false));
  view = WaitForView(r.dir(),
                     [&](const EtcdView& v) { return !v.map.Find(victim)->Backups().empty(); });
  const std::vector<coord::MapServer::Backup> backups = view.map.Find(victim)->Backups();
  ASSERT_EQ(backups.size(), 1u) << "the coordinator never named the copy: " << view.map.ToJson();
  EXPECT_EQ(backups[0].id, target) << view.map.ToJson();
  EXPECT_EQ(backups[0].slot, kEarlierSlot) << view.map.ToJson();

  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(keeper, &writer));
  writer.Stop();
  writer.CheckIntact();
  view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.Find(victim)->served_by, target) << view.map.ToJson();
  EXPECT_EQ(view.map.Find(victim)->served_slot, kEarlierSlot) << view.map.ToJson();
}

// A connection of the cluster's tooling to server `s`'s mirror port, as a coordinator's.
struct MirrorTool {
  std::optional<transport::ClusterSecret> secret;  // the connection keeps a pointer to it
  std::unique_ptr<control::Connection> connection;
};
void OpenMirrorTool(const Running& r, const ServerAddress& s, MirrorTool* out) {
  auto secret = transport::ClusterSecret::Read(r.dir() + "/" + kSecretFileName);
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  out->secret = std::move(*secret);
  auto main_port =
      control::Connection::OpenAsTool(s.id, s.Endpoint(), s.port, &*out->secret, 0x7003, 5s);
  ASSERT_TRUE(main_port.ok()) << main_port.status().ToString();
  auto mirror = control::Connection::OpenAsTool(
      s.id, s.Endpoint(), (*main_port)->hello().mirror_port, &*out->secret, 0x7003, 5s);
  ASSERT_TRUE(mirror.ok()) << mirror.status().ToString();
  out->connection = std::move(*mirror);
}

// A read waits for every live backup, not only the first (docs/pool.md "Re-replication's loose
// ends"): --replicas 2 on 3 servers, a client's object on `primary`. Its further backup `second`
// is made to refuse the primary's forwards at once (the test attaches its slot for another
// server, as a copy of another region would take a slot: forwards from `primary` are then "not
// from its primary"), so a write fails ("not acknowledged") though applied at the primary and
// its first backup. A read of the object right after changes nothing, and must not show that
// write while `second`, which the map still names, lacks it: it fails instead (or, if the
// primary's lease from `second` has lapsed by then, is refused). Before, it waited for the first
// backup's forwards only and returned the new value.
TEST(ReReplication, AReadWaitsForEveryBackupNotOnlyTheFirst) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 2, /*netns=*/true);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const ClusterConfig config = r.Config();
  EtcdView view = ClusterEtcdStatus(r.dir()).value();
  const int primary = 0;
  const std::vector<coord::MapServer::Backup> backups = view.map.Find(primary)->Backups();
  ASSERT_EQ(backups.size(), 2u) << view.map.ToJson();
  const GlobalAddress object = r.objects[primary];
  uint64_t before = 0x1111;
  ASSERT_TRUE(r.pool->Write(object, &before, 8).ok());

  const ServerAddress& second = config.servers[backups[1].id];
  MirrorTool mirror;
  ASSERT_NO_FATAL_FAILURE(OpenMirrorTool(r, second, &mirror));
  constexpr uint16_t kAnotherServer = 9;
  const wire::ReplicateRequest attach{kAnotherServer,
                                      static_cast<uint16_t>(backups[1].slot),
                                      0,
                                      0,
                                      wire::kReplicateAttach,
                                      0,
                                      0,
                                      0,
                                      0,
                                      0};
  auto attached = mirror.connection->Call([&](uint64_t id) { return wire::Encode(id, attach); },
                                          wire::Opcode::kReplicateReply);
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  uint64_t after = 0x2222;
  Status written = r.pool->Write(object, &after, 8);
  ASSERT_FALSE(written.ok()) << "a write acknowledged though a backup refused it";
  uint64_t value = 0;
  Status read = r.pool->Read(object, &value, 8);
  EXPECT_FALSE(read.ok() && value == after)
      << "a read showed a change that server " << second.id << ", a backup in the map, lacks";
  std::printf("the write: %s\nthe read: %s (%#llx)\n", written.ToString().c_str(),
              read.ToString().c_str(), static_cast<unsigned long long>(value));
}

// A stopped further backup never stalls its primary (docs/pool.md "Pipelined forwards to
// further backups"): --replicas 2 on 4 servers, servers in network namespaces over TCP, three
// client threads writing to every server. `stopped` (not the coordinator) is SIGSTOPped for
// 3 s, longer than its etcd lease (2 s); it is the further backup of `primary`, whose first
// backup is another live server. The primary posts its forwards there without waiting, so its
// loop goes on serving: its writes fail or are refused ("has not answered") until the
// coordinator, having failed the stopped server over, degrades its copy, but every request is
// answered. The judge is a client's own failure detector, a second Pool with a failure timeout
// of 1 s that only watches (heartbeats every 250 ms; silence for 1 s and a fresh hello
// unanswered for 1 s more make it report the server gone, P/suspect/<id>): no server but the
// stopped one is ever reported (etcd polled throughout), the map still has the primary serve
// its own region afterwards, the writers' client writes to every server again (a Pool never
// takes a failure verdict back), and no acknowledged write is lost. Then the re-replication
// that follows (each region back to 3 copies) connects to the new backups off the loops
// (StartConnect): a connection whose UCX wireup met a failed lane took ~1 s on the loop.
// With blocking forwards to further backups the primary's loop stood still for the whole stop
// (3 s: each round and each renewal waited backup_timeout, 1 s, for the stopped backup).
TEST(ReReplication, AStoppedFurtherBackupNeverStallsItsPrimary) {
  constexpr int kServers = 4;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(Options(kServers, 2, /*netns=*/true), &r));
  const int stopped = (r.coordinator + 1) % kServers;
  const int primary = (stopped + kServers - 2) % kServers;
  {
    const EtcdView view = ClusterEtcdStatus(r.dir()).value();
    const std::vector<coord::MapServer::Backup> backups = view.map.Find(primary)->Backups();
    ASSERT_EQ(backups.size(), 2u) << view.map.ToJson();
    ASSERT_EQ(backups[1].id, stopped) << "not the primary's further backup: " << view.map.ToJson();
  }
  const auto pid = static_cast<pid_t>(r.Config().servers[stopped].pid);
  ASSERT_GT(pid, 0);
  PoolOptions watching_options;
  watching_options.failure_timeout = 1s;
  auto watching = Pool::Connect(r.Config(), watching_options);
  ASSERT_TRUE(watching.ok()) << watching.status().ToString();
  // Three writers, each with an object of its own on every server.
  std::vector<std::unique_ptr<Writer>> writers;
  for (int w = 0; w < 3; ++w) {
    std::vector<GlobalAddress> objects = r.objects;
    if (w > 0) {
      for (int s = 0; s < kServers; ++s) {
        auto a = r.pool->Alloc(64, Placement::OnServer(static_cast<uint16_t>(s)));
        ASSERT_TRUE(a.ok()) << a.status().ToString();
        objects[s] = *a;
      }
    }
    writers.push_back(std::make_unique<Writer>(*r.pool, objects));
  }
  for (auto& w : writers) ASSERT_TRUE(w->AcknowledgedEverywhere(20));
  // Every server a client reported gone, from the stop until the end.
  ReportWatcher watcher(r.dir());
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  std::this_thread::sleep_for(3s);
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  // The stopped server failed over and every region back to three copies.
  const EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    const coord::MapServer* m = v.map.Find(stopped);
    return m != nullptr && m->served_by != stopped &&
           std::all_of(v.map.servers.begin(), v.map.servers.end(),
                       [](const coord::MapServer& s) { return s.Backups().size() == 2; });
  });
  ASSERT_NE(view.map.Find(stopped), nullptr) << "no map: " << view.map.ToJson();
  ASSERT_NE(view.map.Find(primary), nullptr) << view.map.ToJson();
  EXPECT_NE(view.map.Find(stopped)->served_by, stopped) << view.map.ToJson();
  EXPECT_EQ(view.map.Find(primary)->served_by, primary)
      << "the primary was failed over: " << view.map.ToJson();
  // The stopped server's objects included: the client follows its failover.
  for (auto& w : writers) {
    EXPECT_TRUE(w->AcknowledgedEverywhere(20))
        << "the client does not write to every server again, the latest error: " << w->last_error();
  }
  for (uint16_t id : watcher.Stop()) {
    EXPECT_EQ(id, stopped) << "a client reported server " << id << " gone; only " << stopped
                           << " was stopped";
  }
  for (auto& w : writers) {
    w->Stop();
    w->CheckIntact();
  }
}

// A detach of a slot whose primary still feeds it is refused unless it comes on that primary's
// connection (docs/pool.md "Re-replication's loose ends"): a coordinator that drops a copy
// after its failover may have been deposed meanwhile, and a newer one may have named that very
// slot for the region again. Here a tool (as such a late coordinator) sends server 1's mirror
// the detach of server 0's copy while server 0 writes on: it is refused, and the writes go on
// acknowledged. With the detach accepted from any connection, the slot is emptied and every
// later forward of server 0 is refused ("not from its primary").
TEST(ReReplication, ALateDetachOfACopyItsPrimaryStillFeedsIsRefused) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.mirror_slots = 1;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const ClusterConfig config = r.Config();
  const EtcdView view = ClusterEtcdStatus(r.dir()).value();
  const std::vector<coord::MapServer::Backup> backups = view.map.Find(0)->Backups();
  ASSERT_EQ(backups.size(), 1u) << view.map.ToJson();
  Writer writer(*r.pool, r.objects);
  ASSERT_TRUE(writer.AcknowledgedEverywhere(10));
  MirrorTool mirror;
  ASSERT_NO_FATAL_FAILURE(OpenMirrorTool(r, config.servers[backups[0].id], &mirror));
  const wire::ReplicateRequest detach{
      0, static_cast<uint16_t>(backups[0].slot), 0, 0, wire::kReplicateDetach, 0, 0, 0, 0, 0};
  auto detached = mirror.connection->Call([&](uint64_t id) { return wire::Encode(id, detach); },
                                          wire::Opcode::kReplicateReply);
  EXPECT_FALSE(detached.ok()) << "a detach from another connection emptied a fed slot";
  if (!detached.ok()) {
    EXPECT_NE(detached.status().message().find("still fed by its primary"), std::string::npos)
        << detached.status().ToString();
  }
  EXPECT_TRUE(writer.AcknowledgedEverywhere(20)) << "writes stopped: " << writer.last_error();
  writer.Stop();
  EXPECT_EQ(writer.failures(), 0u) << writer.last_error();
  writer.CheckIntact();
}

// The shared first step of the tests below: SIGKILL of `victim` under `writer`; once the map has
// moved its region to `mover` and left `primary`'s region without a backup, a tool, as a
// coordinator whose map write then failed, has `primary` copy its region to a slot of `stray`
// that the map leaves free, until whole. Sets *slot to that slot.
void KillAndCopyUnnamed(Running& r, Writer* writer, int primary, int victim, int mover, int stray,
                        uint16_t* slot) {
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(victim, writer));
  const EtcdView view = WaitForView(r.dir(), [&](const EtcdView& v) {
    return v.map.Find(victim)->served_by == mover && v.map.Find(primary)->Backups().empty();
  });
  ASSERT_EQ(view.map.Find(victim)->served_by, mover) << view.map.ToJson();
  ASSERT_TRUE(view.map.Find(primary)->Backups().empty()) << view.map.ToJson();
  const std::vector<int> used = view.map.SlotsInUse(static_cast<uint16_t>(stray));
  *slot = 0;
  while (std::find(used.begin(), used.end(), *slot) != used.end()) ++*slot;
  ASSERT_TRUE(CopyAsACoordinator(r, primary, primary, stray, *slot))
      << "the copy to server " << stray << " did not complete";
}

// A whole copy that no map names is given up at the coordinator's next request (docs/pool.md
// "The map's backups in the request"), so that its server's death costs its primary nothing.
// 4 servers, --replicas 1; `stray` and `later` are reported suspected, so that after the
// SIGKILL of `victim` the coordinator finds no target for `primary`'s region (whose backup the
// victim was). A tool, as a coordinator whose map write then failed (or whose reply was lost),
// has `primary` copy its region to `stray` until whole. Once `later`'s suspicion goes, the
// coordinator copies the region there, and its request, which carries the map's backups (none),
// makes `primary` give the copy on `stray` up. Then `stray` is SIGKILLed under a writer:
// `primary`'s writes stay acknowledged. Before, the copy on `stray` was kept (reported whole)
// and forwarded to; nobody degraded `primary` when `stray` died (the map names no copy there),
// so its writes failed until its serving lease lapsed and it served nothing.
TEST(ReReplication, AWholeCopyNoMapNamesIsGivenUpAtTheNextRequest) {
  constexpr int kServers = 4;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int primary = r.coordinator;
  const int victim = (primary + 1) % kServers;
  const int later = (primary + 2) % kServers;  // takes the victim's region over
  const int stray = (primary + 3) % kServers;
  ASSERT_NO_FATAL_FAILURE(r.Suspect(later, true));
  ASSERT_NO_FATAL_FAILURE(r.Suspect(stray, true));
  Writer writer(*r.pool, r.objects);
  uint16_t slot = 0;
  ASSERT_NO_FATAL_FAILURE(KillAndCopyUnnamed(r, &writer, primary, victim, later, stray, &slot));

  ASSERT_NO_FATAL_FAILURE(r.Suspect(later, false));
  const EtcdView view = WaitForView(
      r.dir(), [&](const EtcdView& v) { return !v.map.Find(primary)->Backups().empty(); });
  const std::vector<coord::MapServer::Backup> backups = view.map.Find(primary)->Backups();
  ASSERT_EQ(backups.size(), 1u) << view.map.ToJson();
  EXPECT_EQ(backups[0].id, later) << view.map.ToJson();
  // A deposed coordinator (an older term) with the map it read before: refused, so it cannot
  // make `primary` give up the copy the map names now.
  auto deposed = AskBackupAsTool(r, primary, primary, stray, slot, CoordinatorTerm(r) - 1, {});
  ASSERT_FALSE(deposed.ok()) << "a request of an older term was admitted";
  EXPECT_EQ(deposed.status().code(), StatusCode::kPermissionDenied) << deposed.status().ToString();

  const uint64_t failed_before = writer.failures(static_cast<size_t>(primary));
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(stray, &writer));
  EXPECT_EQ(writer.failures(static_cast<size_t>(primary)), failed_before)
      << "server " << primary
      << "'s writes failed after the death of a copy no map names: " << writer.last_error();
  writer.Stop();
  writer.CheckIntact();
}

// A whole copy that no map names is given up even when no server has room for another copy
// (docs/pool.md "The map's backups in the request"): the coordinator sends the region's server
// the map's backups alone once per map epoch. 3 servers, --replicas 1; `stray` is suspected;
// after the SIGKILL of `victim` nobody has room for `primary`'s region (whose backup the victim
// was), and a tool, as a coordinator whose map write failed, has `primary` copy it to `stray`
// until whole. Then `stray` is SIGKILLed under a writer of `primary`'s object: the failover
// moves the epoch, the coordinator tells `primary` the map's backups (none), and `primary` gives
// the dead copy up: its writes are acknowledged again. Before, nobody told it, and every write
// failed ("applied here but not acknowledged", then its serving lease lapsed).
TEST(ReReplication, AWholeCopyNoMapNamesIsGivenUpWithNoRoomForAnother) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.mirror_slots = 2;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int primary = r.coordinator;
  const int victim = (primary + 1) % kServers;
  const int stray = (primary + 2) % kServers;  // takes the victim's region over
  ASSERT_NO_FATAL_FAILURE(r.Suspect(stray, true));
  Writer writer(*r.pool, {r.objects[primary]});
  uint16_t slot = 0;
  ASSERT_NO_FATAL_FAILURE(KillAndCopyUnnamed(r, &writer, primary, victim, stray, stray, &slot));

  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(stray, &writer));
  writer.Stop();
  writer.CheckIntact();
}

// A copy whose slot the backup has given to another primary since is copied anew, not named
// (docs/pool.md "The map's backups in the request"). As in ACopyInAnotherSlotOfTheTargetIs
// NamedWhereItIs, a tool has `keeper` copy `victim`'s region (which it serves since the victim's
// SIGKILL) to the suspected `target`'s slot 2; then the test attaches that slot for another
// server, as a copy of another region chosen by a coordinator of another term would, and writes
// to the region once (the forward is refused: "not from its primary"). Once the suspicion goes
// the coordinator asks for slot 1: `keeper` gives the refused link up and copies the region
// there, and the map names slot 1; the keeper is SIGKILLed under a writer and the target serves
// the region from slot 1, nothing acknowledged lost. Before, the reply named slot 2, whole, and
// the map named a slot that held another server's copy.
TEST(ReReplication, ACopyWhoseSlotWasTakenIsMadeAnewNotNamed) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 1, /*netns=*/true);
  o.mirror_slots = 3;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const int victim = (r.coordinator + 2) % kServers;
  const int keeper = (victim + 1) % kServers;  // the coordinator
  const int target = (victim + 2) % kServers;
  constexpr uint16_t kTakenSlot = 2;
  ASSERT_NO_FATAL_FAILURE(r.Suspect(target, true));
  {
    Writer writer(*r.pool, r.objects);
    ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(victim, &writer));
  }
  EtcdView view = WaitForView(
      r.dir(), [&](const EtcdView& v) { return v.map.Find(victim)->served_by == keeper; });
  ASSERT_EQ(view.map.Find(victim)->served_by, keeper) << view.map.ToJson();
  ASSERT_TRUE(CopyAsACoordinator(r, keeper, victim, target, kTakenSlot))
      << "the copy to server " << target << "'s slot 2 did not complete";

  MirrorTool mirror;
  ASSERT_NO_FATAL_FAILURE(OpenMirrorTool(r, r.Config().servers[target], &mirror));
  constexpr uint16_t kAnotherServer = 9;
  const wire::ReplicateRequest attach{
      kAnotherServer, kTakenSlot, 0, 0, wire::kReplicateAttach, 0, 0, 0, 0, 0};
  auto attached = mirror.connection->Call([&](uint64_t id) { return wire::Encode(id, attach); },
                                          wire::Opcode::kReplicateReply);
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  uint64_t value = 0x2222;
  Status written = r.pool->Write(r.objects[victim], &value, 8);
  EXPECT_FALSE(written.ok()) << "a write acknowledged though its backup's slot is another's";

  ASSERT_NO_FATAL_FAILURE(r.Suspect(target, false));
  view = WaitForView(r.dir(),
                     [&](const EtcdView& v) { return !v.map.Find(victim)->Backups().empty(); });
  const std::vector<coord::MapServer::Backup> backups = view.map.Find(victim)->Backups();
  ASSERT_EQ(backups.size(), 1u) << view.map.ToJson();
  EXPECT_EQ(backups[0].id, target) << view.map.ToJson();
  EXPECT_NE(backups[0].slot, kTakenSlot)
      << "the map names a slot that holds another server's copy: " << view.map.ToJson();

  Writer writer(*r.pool, r.objects);
  ASSERT_NO_FATAL_FAILURE(r.KillUnderWriter(keeper, &writer));
  writer.Stop();
  writer.CheckIntact();
  view = ClusterEtcdStatus(r.dir()).value();
  EXPECT_EQ(view.map.Find(victim)->served_by, target) << view.map.ToJson();
}

// Whether every thread of process `pid` is stopped (a SIGSTOP has taken effect), within 5 s.
bool WaitUntilStopped(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (const auto& task : std::filesystem::directory_iterator(tasks)) {
      std::ifstream in(task.path() / "stat");
      std::string stat;
      std::getline(in, stat);
      const size_t close = stat.rfind(')');  // the state follows the command's parenthesis
      all = all && close != std::string::npos && close + 2 < stat.size() &&
            (stat[close + 2] == 'T' || stat[close + 2] == 't');
    }
    if (all) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

// A read that the primary's serving lease refused stays that refusal when a further backup's
// forward fails in its round (docs/pool.md "The map's backups in the request", 3): --replicas 2
// on 3 servers whose etcd leases outlast the test (a stopped server stays in the map). The
// further backup of `primary` is stopped (SIGSTOP): a write fails after the forward's 1 s
// timeout, by when the primary's lease from that backup has lapsed; the read right after is
// refused by the lease ("has not answered"), unexecuted, and its round waits for the failed
// forward's ranges again, which fail again. Before, that failure overwrote the refusal with
// "applied here but not acknowledged", an unknown outcome for a read that never ran.
TEST(ReReplication, AReadTheLeaseRefusedStaysRefusedWhenAForwardFails) {
  constexpr int kServers = 3;
  LocalClusterOptions o = Options(kServers, 2, /*netns=*/true);
  o.mirror_slots = 2;
  o.lease_ttl = 60s;
  Running r;
  ASSERT_NO_FATAL_FAILURE(Start(o, &r));
  const EtcdView view = ClusterEtcdStatus(r.dir()).value();
  const int primary = 0;
  const std::vector<coord::MapServer::Backup> backups = view.map.Find(primary)->Backups();
  ASSERT_EQ(backups.size(), 2u) << view.map.ToJson();
  const GlobalAddress object = r.objects[primary];
  uint64_t before = 0x1111;
  ASSERT_TRUE(r.pool->Write(object, &before, 8).ok());
  const auto stopped = static_cast<pid_t>(r.Config().servers[backups[1].id].pid);
  ASSERT_EQ(kill(stopped, SIGSTOP), 0);
  // The signal takes effect as each thread next runs: the write must not meet one still going.
  ASSERT_TRUE(WaitUntilStopped(stopped)) << "server " << backups[1].id << " did not stop";
  uint64_t after = 0x2222;
  Status written = r.pool->Write(object, &after, 8);
  uint64_t value = 0;
  Status read = r.pool->Read(object, &value, 8);
  ASSERT_EQ(kill(stopped, SIGCONT), 0);
  std::printf("the write: %s\nthe read: %s\n", written.ToString().c_str(), read.ToString().c_str());
  EXPECT_FALSE(written.ok()) << "a write acknowledged though a backup was stopped";
  ASSERT_FALSE(read.ok()) << "a read served though the primary's lease had lapsed";
  // The primary's loop waits up to 1 s for the stopped backup's forward; a probe of it then
  // (the client reports it suspected after the failed write) may find it gone, and the region
  // move before the read, which then runs at its new server, whose forward to the stopped
  // backup fails too: there "not acknowledged" is the right answer (seen once in CI at load).
  if (read.message().rfind("server " + std::to_string(primary) + " (", 0) != 0) {
    GTEST_SKIP() << "the region moved before the read, which ran at another server: the case "
                    "(a refusal by the primary's lease) was not reached: "
                 << read.ToString();
  }
  EXPECT_EQ(read.message().find("applied here but not acknowledged"), std::string::npos)
      << read.ToString();
  EXPECT_NE(read.message().find("has not answered"), std::string::npos) << read.ToString();
}

// A server's probes of suspects (coord/membership.h "Dead peers") never hold back its own
// keepalives. Twelve peers whose link is cut (`ip link set down` in their network namespace:
// their address drops what it is sent, so each probe waits its full 300 ms for a refusal that
// never comes) are reported closed at once to a server whose lease is 2 s; its alive key must
// keep the lease it was registered with for three TTLs (a lapse shows as the key gone or
// registered again under another lease). With the probes on the membership thread (before
// `coordload`) one pass over the twelve took 3.6 s and the lease lapsed.
TEST(Membership, ProbesOfPeersWhoseLinkIsCutNeverCostTheServerItsLease) {
  const std::string tag = std::to_string(getpid() % 10000);
  const std::string dir = "/tmp/membership_test-probes-" + tag;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  coord::EtcdProcessOptions eo;
  eo.data_dir = dir + "/etcd";
  eo.log = dir + "/etcd.log";
  eo.die_with_parent = true;
  auto etcd = coord::StartEtcd(eo);
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  struct Cleanup {
    pid_t etcd;
    std::string ns, veth, dir;
    ~Cleanup() {
      kill(etcd, SIGKILL);
      Output("ip link del " + veth + "; ip netns del " + ns);
      std::filesystem::remove_all(dir);
    }
  } cleanup{etcd->pid, "fpprobe" + tag, "fpprobe" + tag + "h", dir};
  // The peers' namespace: its end of a veth pair has their address, and is cut.
  const std::string net = "10.254." + std::to_string(getpid() % 250) + ".";
  const std::string& ns = cleanup.ns;
  for (const std::string& cmd : {
           "ip netns add " + ns,
           "ip link add " + cleanup.veth + " type veth peer name fpprobe" + tag + "p",
           "ip link set fpprobe" + tag + "p netns " + ns,
           "ip addr add " + net + "1/30 dev " + cleanup.veth,
           "ip link set " + cleanup.veth + " up",
           "ip -n " + ns + " addr add " + net + "2/30 dev fpprobe" + tag + "p",
           "ip -n " + ns + " link set fpprobe" + tag + "p up",
           "ip -n " + ns + " link set fpprobe" + tag + "p down",
       }) {
    ASSERT_EQ(Output(cmd), "") << cmd;
  }
  auto client = coord::EtcdClient::Create({{etcd->endpoint}});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const coord::MapKeys keys{"/probes"};
  auto peers_lease = (*client)->GrantLease(60s);
  ASSERT_TRUE(peers_lease.ok()) << peers_lease.status().ToString();
  std::vector<uint16_t> peers;
  for (uint16_t id = 100; id < 112; ++id) {
    const std::string value = "{\"id\":" + std::to_string(id) + ",\"address\":\"" + net +
                              "2:" + std::to_string(7000 + id) + "\",\"mirror_port\":0}";
    ASSERT_TRUE((*client)->Put(keys.Alive(id), value, peers_lease->id).ok());
    peers.push_back(id);
  }
  coord::Membership::Options mo;
  mo.endpoints = {etcd->endpoint};
  mo.prefix = keys.prefix;
  mo.id = 1;
  mo.address = "127.0.0.1:1";
  mo.ttl = 2s;
  std::atomic<bool> reported{false};
  mo.closed = [&] { return reported.exchange(true) ? std::vector<uint16_t>{} : peers; };
  auto membership = coord::Membership::Start(mo);
  ASSERT_TRUE(membership.ok()) << membership.status().ToString();
  (*membership)->Wake();
  auto registered = (*client)->Get(keys.Alive(1));
  ASSERT_TRUE(registered.ok() && registered->has_value());
  const int64_t lease = (*registered)->lease;
  const auto until = std::chrono::steady_clock::now() + 3 * mo.ttl;
  while (std::chrono::steady_clock::now() < until) {
    auto kv = (*client)->Get(keys.Alive(1));
    ASSERT_TRUE(kv.ok()) << kv.status().ToString();
    ASSERT_TRUE(kv->has_value()) << "the server's alive key lapsed while it probed its peers";
    ASSERT_EQ((*kv)->lease, lease) << "the server's lease lapsed and it registered again";
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(reported.load());
  EXPECT_TRUE((*membership)->registered());
}

}  // namespace
}  // namespace farpool
