// The etcd client against a real one-member etcd that the test starts (and that dies with it).
#include "coord/etcd_client.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "common/process.h"
#include "coord/etcd_process.h"

namespace farpool::coord {
namespace {

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "farpool-etcd-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = new std::string(tmpl);
    EtcdProcessOptions o;
    o.data_dir = *dir_ + "/data";
    o.log = *dir_ + "/etcd.log";
    o.die_with_parent = true;
    auto p = StartEtcd(o);
    ASSERT_TRUE(p.ok()) << p.status().message();
    etcd_ = new EtcdProcess(*p);
  }
  static void TearDownTestSuite() {
    if (etcd_ != nullptr) StopProcesses({etcd_->pid});
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_);
    delete etcd_;
    delete dir_;
  }
  void SetUp() override {
    ASSERT_NE(etcd_, nullptr);
    auto c = EtcdClient::Create({{etcd_->endpoint}});
    ASSERT_TRUE(c.ok()) << c.status().message();
    client_ = std::move(*c);
    prefix_ = std::string("/test/") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
  }

  static std::string* dir_;
  static EtcdProcess* etcd_;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};
std::string* EtcdClientTest::dir_ = nullptr;
EtcdProcess* EtcdClientTest::etcd_ = nullptr;

TEST_F(EtcdClientTest, PutGetPrefixDeleteWithBinaryKeysAndValues) {
  const std::string value("\0\xff binary \n", 11);
  ASSERT_TRUE(client_->Put(prefix_ + "a", value).ok());
  ASSERT_TRUE(client_->Put(prefix_ + "b\xff", "2").ok());
  ASSERT_TRUE(client_->Put(prefix_.substr(0, prefix_.size() - 1) + "0", "outside").ok());
  auto a = client_->Get(prefix_ + "a");
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, value);
  auto all = client_->GetPrefix(prefix_);
  ASSERT_TRUE(all.ok()) << all.status().message();
  ASSERT_EQ(all->kvs.size(), 2u);
  EXPECT_EQ(all->kvs[1].key, prefix_ + "b\xff");
  ASSERT_TRUE(client_->DeletePrefix(prefix_).ok());
  auto none = client_->GetPrefix(prefix_);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->kvs.empty());
  auto outside = client_->Get(prefix_.substr(0, prefix_.size() - 1) + "0");
  ASSERT_TRUE(outside.ok());
  EXPECT_TRUE(outside->has_value()) << "DeletePrefix deleted a key outside the prefix";
  auto missing = client_->Get(prefix_ + "missing");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
}

TEST_F(EtcdClientTest, OnlyOneCreatorWinsAndTheLoserLearnsTheValue) {
  const std::string key = prefix_ + "leader";
  auto first = client_->PutIf({{key, Compare::Target::kCreateRevision, 0}}, key, "one");
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_TRUE(first->succeeded);
  auto second = client_->PutIf({{key, Compare::Target::kCreateRevision, 0}}, key, "two");
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->succeeded);
  ASSERT_EQ(second->kvs.size(), 1u);
  EXPECT_EQ(second->kvs[0].value, "one");
}

// A conditional delete on the mod_revision: a key written again since is kept.
TEST_F(EtcdClientTest, ADeleteIfKeepsAKeyWrittenSince) {
  const std::string key = prefix_ + "report";
  ASSERT_TRUE(client_->Put(key, "first").ok());
  auto seen = client_->Get(key);
  ASSERT_TRUE(seen.ok() && seen->has_value());
  ASSERT_TRUE(client_->Put(key, "second").ok());
  auto stale =
      client_->DeleteIf({{key, Compare::Target::kModRevision, (*seen)->mod_revision}}, key);
  ASSERT_TRUE(stale.ok()) << stale.status().message();
  EXPECT_FALSE(*stale);
  auto kept = client_->Get(key);
  ASSERT_TRUE(kept.ok() && kept->has_value()) << "a key written since was deleted";
  EXPECT_EQ((*kept)->value, "second");
  auto current =
      client_->DeleteIf({{key, Compare::Target::kModRevision, (*kept)->mod_revision}}, key);
  ASSERT_TRUE(current.ok()) << current.status().message();
  EXPECT_TRUE(*current);
  auto gone = client_->Get(key);
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
}

// Threads add to one counter by compare-and-swap on its mod_revision: no increment is lost.
TEST_F(EtcdClientTest, CompareAndSwapOnModRevisionLosesNoIncrement) {
  const std::string key = prefix_ + "counter";
  ASSERT_TRUE(client_->Put(key, "0").ok());
  constexpr int kThreads = 4, kAdds = 25;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto c = EtcdClient::Create({{etcd_->endpoint}});
      if (!c.ok()) return void(++failures);
      for (int i = 0; i < kAdds;) {
        auto kv = (*c)->Get(key);
        if (!kv.ok() || !kv->has_value()) return void(++failures);
        const int next = std::stoi((*kv)->value) + 1;
        auto r = (*c)->PutIf({{key, Compare::Target::kModRevision, (*kv)->mod_revision}}, key,
                             std::to_string(next));
        if (!r.ok()) return void(++failures);
        if (r->succeeded) ++i;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  auto kv = client_->Get(key);
  ASSERT_TRUE(kv.ok() && kv->has_value());
  EXPECT_EQ((*kv)->value, std::to_string(kThreads * kAdds));
}

TEST_F(EtcdClientTest, AKeyUnderALeaseGoesWithIt) {
  auto lease = client_->GrantLease(std::chrono::seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  EXPECT_EQ(lease->ttl, 5);
  ASSERT_TRUE(client_->Put(prefix_ + "revoked", "x", lease->id).ok());
  auto kept = client_->KeepAlive(lease->id);
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_EQ(kept->ttl, 5);
  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  auto gone = client_->Get(prefix_ + "revoked");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  auto after = client_->KeepAlive(lease->id);
  EXPECT_EQ(after.status().code(), StatusCode::kNotFound) << after.status().message();

  // Not kept alive: etcd deletes the key by itself once the TTL has passed.
  auto short_lease = client_->GrantLease(std::chrono::seconds(1));
  ASSERT_TRUE(short_lease.ok());
  ASSERT_TRUE(client_->Put(prefix_ + "expires", "x", short_lease->id).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    auto kv = client_->Get(prefix_ + "expires");
    ASSERT_TRUE(kv.ok());
    if (!kv->has_value()) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the key outlived its lease";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TEST_F(EtcdClientTest, EtcdsErrorsNameTheEndpointAndTheCall) {
  auto put = client_->Put(prefix_ + "k", "v", /*lease=*/424242);
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(put.status().message(),
            "etcd " + etcd_->endpoint + ": /v3/kv/put: etcdserver: requested lease not found");
}

// FreePort's ports lie below the kernel's ephemeral range, from which outgoing connections take
// their local ports, so a member restarted on its ports finds them free (a restart on a port
// from that range failed with "address already in use" under load).
TEST(FreePortTest, PortsLieBelowTheEphemeralRange) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  ASSERT_TRUE(range >> low) << "no ip_local_port_range";
  if (low - std::max(1024, low / 2) < 1000) GTEST_SKIP() << "no room below port " << low;
  for (int i = 0; i < 50; ++i) {
    auto port = FreePort("127.0.0.1");
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    EXPECT_LT(*port, low);
    EXPECT_GE(*port, 1024);
  }
}

TEST_F(EtcdClientTest, AnUnreachableEndpointIsNamedAndTheNextOneIsTried) {
  auto port = FreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  const std::string dead = "http://127.0.0.1:" + std::to_string(*port);
  auto alone = EtcdClient::Create({{dead}, std::chrono::milliseconds(500)});
  ASSERT_TRUE(alone.ok());
  auto r = (*alone)->Get("x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find(dead), std::string::npos) << r.status().message();

  auto both = EtcdClient::Create({{dead, etcd_->endpoint}, std::chrono::milliseconds(500)});
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE((*both)->Put(prefix_ + "k", "v").ok());
}

// What a watch hands its owner, gathered for a test thread to wait on.
class Recorder {
 public:
  void Add(const EtcdWatch::Update& u) {
    std::lock_guard lock(mu_);
    if (u.snapshot) {
      log_.push_back("snapshot@" + std::to_string(u.revision) + ":" + std::to_string(u.kvs.size()));
    }
    for (const WatchEvent& e : u.events) {
      log_.push_back((e.type == WatchEvent::Type::kPut ? "put " : "delete ") + e.kv.key +
                     (e.type == WatchEvent::Type::kPut ? "=" + e.kv.value : ""));
    }
    cv_.notify_all();
  }
  // Waits until `line` was recorded; the 30 s only bound a broken run.
  bool WaitFor(const std::string& line) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return std::find(log_.begin(), log_.end(), line) != log_.end(); });
  }
  std::vector<std::string> log() {
    std::lock_guard lock(mu_);
    return log_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> log_;
};

bool Eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A watch on a prefix sees its keys whole first, then a put and a delete. Its etcd is then
// killed; restarted on another client port (so the watch cannot reach it) it takes a put made
// while the watch is down; restarted on the watch's port, the watch resumes from the last
// revision it delivered and hands over that put, then one made after; nothing twice.
TEST(EtcdWatchTest, SeesPutsAndDeletesAndResumesAfterEtcdRestarts) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "farpool-etcd-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  EtcdProcessOptions o;
  o.data_dir = dir + "/data";
  o.log = dir + "/etcd.log";
  o.die_with_parent = true;
  auto etcd = StartEtcd(o);
  ASSERT_TRUE(etcd.ok()) << etcd.status().message();
  std::vector<pid_t> pids = {etcd->pid};
  auto client = EtcdClient::Create({{etcd->endpoint}});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Put("/w/before", "0").ok());
  ASSERT_TRUE((*client)->Put("/x/outside", "0").ok());

  Recorder seen;
  EtcdWatch::Options wo;
  wo.endpoints = {etcd->endpoint};
  wo.key = "/w/";
  wo.prefix = true;
  wo.retry = std::chrono::milliseconds(50);
  wo.on_update = [&](const EtcdWatch::Update& u) { seen.Add(u); };
  auto watch = EtcdWatch::Start(wo);
  ASSERT_TRUE(watch.ok()) << watch.status().message();
  ASSERT_TRUE(Eventually([&] { return (*watch)->up(); }));
  ASSERT_TRUE((*client)->Put("/w/a", "1").ok());
  ASSERT_TRUE((*client)->Put("/x/outside", "1").ok());
  ASSERT_TRUE((*client)->Delete("/w/a").ok());
  ASSERT_TRUE(seen.WaitFor("delete /w/a"));

  ASSERT_EQ(kill(etcd->pid, SIGKILL), 0);
  StopProcesses({etcd->pid});  // reaps it
  ASSERT_TRUE(Eventually([&] { return !(*watch)->up(); }));
  EtcdProcessOptions elsewhere = o;
  elsewhere.peer_port = etcd->peer_port;
  auto other_port = StartEtcd(elsewhere);
  ASSERT_TRUE(other_port.ok()) << other_port.status().message();
  pids.push_back(other_port->pid);
  auto there = EtcdClient::Create({{other_port->endpoint}});
  ASSERT_TRUE(there.ok());
  ASSERT_TRUE((*there)->Put("/w/while-down", "2").ok());
  StopProcesses({other_port->pid});
  EXPECT_FALSE((*watch)->up());

  EtcdProcessOptions same = o;
  same.client_port = etcd->client_port;
  same.peer_port = etcd->peer_port;
  auto back = StartEtcd(same);
  ASSERT_TRUE(back.ok()) << back.status().message();
  pids.push_back(back->pid);
  ASSERT_TRUE(seen.WaitFor("put /w/while-down=2"));
  ASSERT_TRUE((*client)->Put("/w/after", "3").ok());
  ASSERT_TRUE(seen.WaitFor("put /w/after=3"));
  EXPECT_EQ(seen.log(), (std::vector<std::string>{"snapshot@3:1", "put /w/a=1", "delete /w/a",
                                                  "put /w/while-down=2", "put /w/after=3"}));
  EXPECT_GE((*watch)->streams(), 2u);
  EXPECT_EQ((*watch)->snapshots(), 1u) << "resumed by a snapshot, not from its revision";
  watch->reset();  // returns at once, with etcd up (a stream open)
  StopProcesses(pids);
  std::filesystem::remove_all(dir);
}

// A watch whose revision etcd has compacted away reads the keys whole again and goes on.
TEST_F(EtcdClientTest, AWatchFromACompactedRevisionReadsTheKeysWholeAgain) {
  ASSERT_TRUE(client_->Put(prefix_ + "a", "1").ok());
  auto first = client_->Put(prefix_ + "a", "2");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client_->Put(prefix_ + "a", "3").ok());
  ASSERT_TRUE(client_->Compact(*first + 1).ok());
  Recorder seen;
  EtcdWatch::Options wo;
  wo.endpoints = {etcd_->endpoint};
  wo.key = prefix_ + "a";
  wo.start_revision = *first;
  wo.on_update = [&](const EtcdWatch::Update& u) { seen.Add(u); };
  auto watch = EtcdWatch::Start(wo);
  ASSERT_TRUE(watch.ok()) << watch.status().message();
  ASSERT_TRUE(Eventually([&] { return (*watch)->snapshots() == 1; }));
  ASSERT_TRUE(client_->Put(prefix_ + "a", "4").ok());
  ASSERT_TRUE(seen.WaitFor("put " + prefix_ + "a=4"));
  const auto log = seen.log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].substr(0, 9), "snapshot@");
}

// A watch on an etcd that never answers is destroyed at once.
TEST(EtcdWatchTest, AWatchOnAnUnreachableEtcdStopsAtOnce) {
  auto port = FreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  EtcdWatch::Options wo;
  wo.endpoints = {"http://127.0.0.1:" + std::to_string(*port)};
  wo.key = "k";
  wo.retry = std::chrono::hours(1);
  wo.on_update = [](const EtcdWatch::Update&) {};
  auto watch = EtcdWatch::Start(wo);
  ASSERT_TRUE(watch.ok());
  EXPECT_FALSE((*watch)->up());
  EXPECT_FALSE(EtcdWatch::Start({}).ok());  // no endpoint, no on_update
}

TEST(EtcdEndpoints, ParsesAListAndRejectsWhatIsNotHttpHostPort) {
  auto two = ParseEndpoints("http://10.0.0.1:2379,http://[::1]:2380/");
  ASSERT_TRUE(two.ok()) << two.status().message();
  EXPECT_EQ(*two, (std::vector<std::string>{"http://10.0.0.1:2379", "http://[::1]:2380"}));
  for (const char* bad : {"", ",", "10.0.0.1:2379", "https://a:1", "http://a", "http://a:0",
                          "http://a:x", "http://:1"}) {
    auto r = ParseEndpoints(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

}  // namespace
}  // namespace farpool::coord
