// The etcd client against a real one-member etcd that the test starts (and that dies with it).
#include "coord/etcd_client.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
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
