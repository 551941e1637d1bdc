#include "farpool/cluster.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace farpool {
namespace {

TEST(ClusterConfig, RoundTrips) {
  ClusterConfig c;
  c.transport = Fabric::kTcp;
  c.servers.push_back({0, "127.0.0.1", 7000, 1 << 30, 42, ""});
  c.servers.push_back({5, "10.1.0.3", 7001, 2 << 20, 0, "fpns5"});
  auto back = ClusterConfig::Parse(c.ToJson(), "mem");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->transport, Fabric::kTcp);
  ASSERT_EQ(back->servers.size(), 2u);
  EXPECT_EQ(back->servers[1].id, 5);
  EXPECT_EQ(back->servers[1].Endpoint(), "10.1.0.3:7001");
  EXPECT_EQ(back->servers[1].netns, "fpns5");
  EXPECT_EQ(back->servers[0].pid, 42);
}

// The cluster file names the secret's file, relative to its own directory.
TEST(ClusterConfig, SecretFileIsRelativeToTheClusterFile) {
  ClusterConfig c;
  c.servers.push_back({0, "127.0.0.1", 7000, 1 << 30, 0, ""});
  c.secret_file = "cluster.secret";
  EXPECT_NE(c.ToJson().find("\"secret_file\": \"cluster.secret\""), std::string::npos);
  const auto dir =
      std::filesystem::temp_directory_path() / ("farpool-config-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "cluster.json").string();
  ASSERT_TRUE(c.Save(file).ok());
  auto back = ClusterConfig::Load(file);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->secret_file, (dir / "cluster.secret").string());
  c.secret_file.clear();
  EXPECT_EQ(c.ToJson().find("secret_file"), std::string::npos) << "no secret, no field";
}

void ExpectError(std::string_view json, std::string_view needle) {
  auto r = ClusterConfig::Parse(json, "c.json");
  ASSERT_FALSE(r.ok()) << json;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("cluster file c.json"), std::string::npos);
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << r.status().message() << " lacks " << needle;
}

TEST(ClusterConfig, ErrorsNameTheFileAndTheField) {
  ExpectError("{", "not valid JSON");
  ExpectError("[]", "expected an object");
  ExpectError("{}", "servers");
  ExpectError(R"({"servers": []})", "non-empty");
  ExpectError(R"({"secret_file": 7, "servers": [{"id": 1, "address": "h:1"}]})", "secret_file");
  ExpectError(R"({"secret_file": "", "servers": [{"id": 1, "address": "h:1"}]})", "secret_file");
  ExpectError(R"({"servers": [{"address": "h:1"}]})", "servers[0].id");
  ExpectError(R"({"servers": [{"id": 70000, "address": "h:1"}]})", "servers[0].id");
  ExpectError(R"({"servers": [{"id": 1, "address": "nohostport"}]})", "servers[0].address");
  ExpectError(R"({"servers": [{"id": 1, "address": "h:99999"}]})", "servers[0].address");
  ExpectError(R"({"servers": [{"id": 1, "address": "h:1"}, {"id": 1, "address": "h:2"}]})",
              "duplicate server id 1");
  ExpectError(R"({"transport": "rdma", "servers": [{"id": 1, "address": "h:1"}]})", "transport");
  ExpectError(R"({"version": 2, "servers": [{"id": 1, "address": "h:1"}]})", "version");
}

TEST(ClusterConfig, TheEtcdSectionRoundTripsAndIsChecked) {
  ClusterConfig c;
  c.servers = {ServerAddress{0, "h", 1}};
  c.etcd.endpoints = {"http://10.1.0.1:2379", "http://10.1.0.2:2379"};
  c.etcd.prefix = "/farpool/00ff/";
  c.etcd.pid = 42;
  c.etcd.peer_port = 2380;
  auto back = ClusterConfig::Parse(c.ToJson(), "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->etcd.endpoints, c.etcd.endpoints);
  EXPECT_EQ(back->etcd.prefix, c.etcd.prefix);
  EXPECT_EQ(back->etcd.pid, 42);
  EXPECT_EQ(back->etcd.peer_port, 2380);
  ExpectError(R"({"servers": [{"id": 1, "address": "h:1"}], "etcd": {"endpoints": []}})",
              "etcd.endpoints");
  ExpectError(
      R"({"servers": [{"id": 1, "address": "h:1"}], "etcd": {"endpoints": ["http://a:1"], "prefix": "/x"}})",
      "etcd.prefix");
}

TEST(ClusterConfig, MissingFileSaysWhichFile) {
  auto r = ClusterConfig::Load("/nonexistent/cluster.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/cluster.json"), std::string::npos);
}

TEST(ParseHostPort, AcceptsIpv6Brackets) {
  auto hp = ParseHostPort("[::1]:7000");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->first, "::1");
  EXPECT_EQ(hp->second, 7000);
  EXPECT_FALSE(ParseHostPort(":7000").ok());
  EXPECT_FALSE(ParseHostPort("host:").ok());
}

}  // namespace
}  // namespace farpool
