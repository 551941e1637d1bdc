// The `farpool` command line as a user runs it: bad input gets a message that says what and
// where and a non-zero exit; a local cluster comes up, answers, and goes down leaving no
// process behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pool/test_cluster.h"

namespace farpool {
namespace {

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

CommandResult Farpool(const std::string& args) {
  std::string cmd = std::string(FARPOOL_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// True if `pid` is a live process (a zombie has exited; only its parent's reaping is left).
bool Running(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  if (content.empty()) return false;
  const size_t close = content.rfind(')');
  return close != std::string::npos && close + 2 < content.size() && content[close + 2] != 'Z';
}

void ExpectFailure(const std::string& args, const std::string& needle) {
  CommandResult r = Farpool(args);
  EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

TEST(Cli, BadSizesTransportsAndAddressesAreExplained) {
  ExpectFailure("server --listen 127.0.0.1:0 --memory 12parsecs",
                "--memory: invalid size '12parsecs'");
  ExpectFailure("server --listen 127.0.0.1 --memory 1GiB", "--listen: invalid address '127.0.0.1'");
  ExpectFailure("server --listen 127.0.0.1:0 --memory 1MiB", "smaller than one chunk");
  ExpectFailure("server --listen 127.0.0.1:0 --memory 64MiB --progress lazy",
                "unknown progress mode 'lazy'");
  ExpectFailure("server --listen 203.0.113.1:7000 --memory 64MiB", "server 0 (203.0.113.1:7000)");
  ExpectFailure("cluster up --dir /tmp/x --servers 0", "--servers must be from 1 to 250");
  ExpectFailure("cluster up --dir /tmp/x --memory 1XB", "--memory: invalid size '1XB'");
  ExpectFailure("cluster up --dir /tmp/x --delay 20us", "--delay needs --netns");
  ExpectFailure("no-such-command", "subcommand");
}

TEST(Cli, BadClusterFilesNameTheFileAndField) {
  const std::string dir = MakeTempDir("farpool-cli");
  ExpectFailure("bench ops --cluster " + dir + "/missing.json", dir + "/missing.json");
  std::ofstream(dir + "/bad.json") << R"({"servers": [{"id": 0, "address": "localhost"}]})";
  ExpectFailure("bench ops --cluster " + dir + "/bad.json", "servers[0].address");
  std::ofstream(dir + "/dead.json")
      << R"({"transport": "tcp", "servers": [{"id": 4, "address": "127.0.0.1:1"}]})";
  ExpectFailure("bench ops --cluster " + dir + "/dead.json", "server 4 (127.0.0.1:1)");
  ExpectFailure("cluster status --dir " + dir + "/nothing", "cluster.json");
}

TEST(Cli, ClusterUpStatusBenchDownLeavesNoProcessBehind) {
  const std::string dir = MakeTempDir("farpool-cli");
  CommandResult up = Farpool("cluster up --dir " + dir +
                             " --servers 3 --memory 64MiB --transport shm --progress event");
  ASSERT_EQ(up.exit_code, 0) << up.output;
  CommandResult again = Farpool("cluster up --dir " + dir + " --servers 1");
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("already running"), std::string::npos) << again.output;

  CommandResult status = Farpool("cluster status --json --dir " + dir);
  ASSERT_EQ(status.exit_code, 0) << status.output;
  auto doc = nlohmann::json::parse(status.output);
  ASSERT_EQ(doc["servers"].size(), 3u);
  EXPECT_EQ(doc["capacity"].get<uint64_t>(), 3u * (64 << 20));
  EXPECT_TRUE(doc["all_up"].get<bool>());
  std::vector<int> pids;
  for (auto& s : doc["servers"]) pids.push_back(s["pid"].get<int>());

  CommandResult bench =
      Farpool("bench ops --cluster " + dir +
              "/cluster.json --op faa --seconds 0.3 --warmup 0.1 --verify --json");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  auto result = nlohmann::json::parse(bench.output);
  for (const char* key : {"op", "size", "threads", "batch", "transport", "ops_per_s", "p50_us",
                          "p99_us", "p999_us"}) {
    EXPECT_TRUE(result.contains(key)) << key;
  }
  EXPECT_EQ(result["transport"], "shm");
  EXPECT_GT(result["ops_per_s"].get<double>(), 0);

  CommandResult down = Farpool("cluster down --dir " + dir);
  ASSERT_EQ(down.exit_code, 0) << down.output;
  for (int pid : pids) EXPECT_FALSE(Running(pid)) << "server process " << pid << " survived";
  for (int i = 0; i < 3; ++i) {  // each shut down on SIGTERM, not by the SIGKILL fallback
    std::ifstream log(dir + "/server-" + std::to_string(i) + ".log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("signal 15, shutting down"), std::string::npos) << text;
    EXPECT_NE(text.find("stopped"), std::string::npos) << text;
  }
  CommandResult after = Farpool("cluster status --dir " + dir);
  EXPECT_NE(after.exit_code, 0);
}

TEST(Cli, StatusReportsADeadServerAndFails) {
  LocalClusterOptions o;
  o.servers = 2;
  o.memory = 32 << 20;
  o.progress = ProgressMode::kEvent;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = *cluster.config();
  ASSERT_EQ(kill(static_cast<pid_t>(config.servers[1].pid), SIGKILL), 0);
  CommandResult status = Farpool("cluster status --dir " + cluster.dir());
  EXPECT_NE(status.exit_code, 0);
  EXPECT_NE(status.output.find("DOWN"), std::string::npos) << status.output;
}

}  // namespace
}  // namespace farpool
