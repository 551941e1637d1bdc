// The `farpool` command line as a user runs it: bad input gets a message that says what and
// where and a non-zero exit; a local cluster comes up, answers, and goes down leaving no
// process behind.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/host.h"
#include "common/process.h"
#include "pool/test_cluster.h"

namespace farpool {
namespace {

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

// Runs `prefix farpool args` (prefix: e.g. "taskset -c 0 ").
CommandResult Farpool(const std::string& args, const std::string& prefix = "") {
  std::string cmd = prefix + std::string(FARPOOL_BINARY) + " " + args + " 2>&1";
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
  ExpectFailure("no-such-command", "unknown command 'no-such-command'");
}

TEST(Cli, VersionNamesTheProjectVersion) {
  CommandResult r = Farpool("--version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("farpool 0.1.0", 0), 0u) << r.output;  // then "(git <sha>)" if known
}

TEST(Cli, UnknownCommandIsNamedWithTheValidOnes) {
  ExpectFailure("frobnicate",
                "unknown command 'frobnicate' for `farpool`; valid: server, cluster, bench, shard, "
                "shard-cluster, mount, umount");
  ExpectFailure("cluster upp --dir /tmp/x",
                "unknown command 'upp' for `farpool cluster`; valid: up, add, drain, status, down");
  ExpectFailure("bench opz", "unknown command 'opz' for `farpool bench`; valid: ops, txn");
}

// The first CPU this process may run on, for `taskset -c`.
int FirstUsableCpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) return c;
  }
  return 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A test's cluster directory, removed with everything in it (the servers' logs that `cluster
// down` keeps) when the test ends, however it ends: runs of this suite left one per test in /tmp.
class ScopedDir {
 public:
  explicit ScopedDir(const std::string& prefix) : path_(MakeTempDir(prefix)) {}
  ~ScopedDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedDir(const ScopedDir&) = delete;
  ScopedDir& operator=(const ScopedDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Cli, ProgressModeDefaultsToEventWithFewerCoresThanServersPlusOne) {
  const std::string one_core = "taskset -c " + std::to_string(FirstUsableCpu()) + " ";
  const ScopedDir scoped("farpool-cli");
  const std::string& dir = scoped.path();
  CommandResult up = Farpool("cluster up --dir " + dir + " --servers 2 --memory 32MiB", one_core);
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("progress event: 1 core for 2 servers + 1 client"), std::string::npos)
      << up.output;
  EXPECT_NE(up.output.find("cluster secret in " + dir + "/cluster.secret (mode 0600"),
            std::string::npos)
      << up.output;
  for (int i = 0; i < 2; ++i) {
    const std::string log = ReadFile(dir + "/server-" + std::to_string(i) + ".log");
    EXPECT_NE(log.find("(progress event,"), std::string::npos) << log;
  }
  ASSERT_EQ(Farpool("cluster down --dir " + dir).exit_code, 0);

  // An explicit --progress wins.
  up = Farpool("cluster up --dir " + dir + " --servers 2 --memory 32MiB --progress busy", one_core);
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("progress busy"), std::string::npos) << up.output;
  EXPECT_NE(ReadFile(dir + "/server-0.log").find("(progress busy,"), std::string::npos);
  ASSERT_EQ(Farpool("cluster down --dir " + dir).exit_code, 0);

  // One server by hand on one core: event too.
  CommandResult server =
      Farpool("server --listen 127.0.0.1:0 --memory 32MiB --ready-file " + dir + "/ready",
              "timeout -s TERM 2 " + one_core);
  EXPECT_NE(server.output.find("progress event: 1 core for 1 server + 1 client"), std::string::npos)
      << server.output;
}

TEST(Cli, MemoryBeyondWhatTheHostCanGiveIsRefusedUpFront) {
  ExpectFailure("server --listen 127.0.0.1:0 --memory 100TiB",
                "--memory 100 TiB is more memory than this host can give: ");
  ExpectFailure("server --listen 127.0.0.1:0 --memory 100TiB", "available (MemAvailable");
  const ScopedDir scoped("farpool-cli");
  const std::string& dir = scoped.path();
  // One copy's memory (--replicas 0): the sums below are --servers x --memory.
  ExpectFailure("cluster up --dir " + dir + " --servers 2 --memory 100TiB --replicas 0",
                "--servers 2 x --memory 100 TiB (200 TiB in all) is more memory than this host "
                "can give");
  // Each server would fit; all of them do not.
  auto available = AvailableMemory();
  ASSERT_TRUE(available.ok()) << available.status().ToString();
  const uint64_t each_mib = *available / 10 * 6 / (1 << 20);
  ExpectFailure("cluster up --dir " + dir + " --servers 2 --memory " + std::to_string(each_mib) +
                    "MiB --replicas 0",
                "in all) is more memory than this host can give");
  EXPECT_FALSE(std::filesystem::exists(dir + "/server-0.log")) << "a server was started";
}

TEST(Cli, FailedStartUpsSayWhy) {
  // A port in use.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(s, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  ExpectFailure("server --listen 127.0.0.1:" + port + " --memory 32MiB",
                "port " + port + " is in use by another process");
  close(s);

  // A server that dies at start in `cluster up`: which one, how it ended, and its log's reason.
  const ScopedDir scoped("farpool-cli");
  const std::string& dir = scoped.path();
  ExpectFailure("cluster up --dir " + dir + " --servers 2 --memory 32MiB --chunk-size 3000",
                "server 0 exited with status 1 during start-up; " + dir + "/server-0.log:");
  ExpectFailure("cluster up --dir " + dir + " --servers 2 --memory 32MiB --chunk-size 3000",
                "chunk size 3000 is not a positive multiple of 4096");
}

// /dev/shm/farpool-ucx-PID: where a farpool process's UCX shared-memory files live (see
// transport/shm_dir.h).
std::string ShmDirOf(pid_t pid) { return "/dev/shm/farpool-ucx-" + std::to_string(pid); }

bool WaitGone(const std::string& path) {
  for (int i = 0; i < 1000 && std::filesystem::exists(path); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !std::filesystem::exists(path);
}

TEST(Cli, ServerKilledBySigkillLeavesNothingInDevShm) {
  const ScopedDir scoped("farpool-cli");
  const std::string& dir = scoped.path();
  // Large enough that UCX spends a while writing the region's file before it unlinks it: the
  // kill lands in that window when it can (the worst case: the whole region stays in /dev/shm).
  auto available = AvailableMemory();
  ASSERT_TRUE(available.ok());
  const uint64_t mib = std::min<uint64_t>(2048, *available / 4 / (1 << 20));
  const pid_t pid = SpawnDetached(
      {FARPOOL_BINARY, "server", "--listen", "127.0.0.1:0", "--memory", std::to_string(mib) + "MiB",
       "--transport", "shm", "--progress", "event", "--ready-file", dir + "/ready"},
      dir + "/server.log");
  ASSERT_GT(pid, 0);
  const std::string shm = ShmDirOf(pid);
  bool saw_file = false;
  for (int i = 0; i < 3000 && !saw_file && ProcessRunning(pid); ++i) {
    std::error_code ec;
    saw_file = std::filesystem::exists(shm, ec) && !std::filesystem::is_empty(shm, ec);
    if (!saw_file) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(ProcessRunning(pid)) << ReadFile(dir + "/server.log");
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WaitGone(shm)) << shm << " outlived its server (saw a file in it: " << saw_file
                             << ")";

  // A cluster's server, killed once up and serving.
  LocalClusterOptions o;
  o.servers = 2;
  o.memory = 64 << 20;
  o.progress = ProgressMode::kEvent;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  const pid_t server = static_cast<pid_t>(cluster.config()->servers[1].pid);
  EXPECT_TRUE(std::filesystem::exists(ShmDirOf(server)));
  ASSERT_EQ(kill(server, SIGKILL), 0);
  EXPECT_TRUE(WaitGone(ShmDirOf(server)));
}

TEST(Cli, ShmDirectoriesOfDeadProcessesAreRemovedByClusterUpAndDown) {
  // A process that died with its janitor: a directory with a file, and no one to remove it.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string stale = ShmDirOf(dead);
  std::filesystem::create_directories(stale);
  std::ofstream(stale + "/ucx_shm_posix_1234") << "leftover";
  LocalClusterOptions o;
  o.servers = 1;
  o.memory = 32 << 20;
  o.progress = ProgressMode::kEvent;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(stale));

  std::filesystem::create_directories(stale);
  ASSERT_EQ(Farpool("cluster down --dir " + cluster.dir()).exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(stale));
}

TEST(Cli, ProgressLinesAreRedrawnOnlyOnATerminal) {
  const std::string bench =
      "bench social --engine local --scale 0.1 --seconds 0.1 --warmup 0 "
      "--query q1";
  CommandResult piped = Farpool(bench);
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_NE(piped.output.find("  loading local: 100.0%"), std::string::npos) << piped.output;
  EXPECT_EQ(piped.output.find('\r'), std::string::npos) << piped.output;
  // On a terminal (a pseudo-terminal from script(1)): the line is redrawn in place.
  const std::string cmd =
      "script -qec '" + std::string(FARPOOL_BINARY) + " " + bench + "' /dev/null 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  ASSERT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("\r  loading local:"), std::string::npos) << out;
}

TEST(Cli, BadClusterFilesNameTheFileAndField) {
  const ScopedDir scoped("farpool-cli");
  const std::string& dir = scoped.path();
  ExpectFailure("bench ops --cluster " + dir + "/missing.json", dir + "/missing.json");
  std::ofstream(dir + "/bad.json") << R"({"servers": [{"id": 0, "address": "localhost"}]})";
  ExpectFailure("bench ops --cluster " + dir + "/bad.json", "servers[0].address");
  std::ofstream(dir + "/dead.json")
      << R"({"transport": "tcp", "servers": [{"id": 4, "address": "127.0.0.1:1"}]})";
  ExpectFailure("bench ops --cluster " + dir + "/dead.json", "server 4 (127.0.0.1:1)");
  ExpectFailure("cluster status --dir " + dir + "/nothing", "cluster.json");
}

TEST(Cli, ClusterUpStatusBenchDownLeavesNoProcessBehind) {
  const ScopedDir scoped("farpool-cli");
  const std::string& dir = scoped.path();
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
  // The defaults with three servers: a backup of every region, and two mirror slots each, so
  // that re-replication has room after a failure (docs/pool.md "Re-replication by default").
  auto view = ClusterEtcdStatus(dir);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->map.replicas, 1);
  for (const coord::MapServer& m : view->map.servers) EXPECT_EQ(m.slots, 2u) << "server " << m.id;

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

// Two pools (tenants) of one cluster, servers in network namespaces over TCP, each run a bank
// database at once, with different account counts: each finds its own catalog at its own root
// (a shared one would mix the tables and break the other's total), and both verify. Nothing
// either did touched the other's memory (no refusal counted); `cluster down` removes the
// pools' credentials with the cluster secret.
TEST(Cli, TwoPoolsRunTwoBankDatabasesOnOneCluster) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const ScopedDir scoped("farpool-pools");
  const std::string& dir = scoped.path();
  CommandResult up =
      Farpool("cluster up --dir " + dir +
              " --servers 2 --memory 128MiB --transport tcp --netns --progress event");
  ASSERT_EQ(up.exit_code, 0) << up.output;
  for (const char* name : {"alpha", "beta"}) {
    CommandResult add = Farpool("cluster pool add --dir " + dir + " " + name);
    EXPECT_EQ(add.exit_code, 0) << add.output;
  }
  ExpectFailure("cluster pool add --dir " + dir + " alpha", "pool 'alpha' exists");
  std::array<CommandResult, 2> runs;
  std::array<std::thread, 2> threads;
  const std::array<std::string, 2> names = {"alpha", "beta"};
  const std::array<int, 2> accounts = {1000, 1500};
  for (size_t i = 0; i < 2; ++i) {
    threads[i] = std::thread([&, i] {
      runs[i] = Farpool("bench txn --engine pool --workload bank --cluster " + dir + "/cluster-" +
                        names[i] + ".json --accounts " + std::to_string(accounts[i]) +
                        " --threads 2 --seconds 2 --warmup 0.3 --verify --json");
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(runs[i].exit_code, 0) << names[i] << "\n" << runs[i].output;
    const auto json = runs[i].output.substr(runs[i].output.find('{'));
    auto result = nlohmann::json::parse(json);
    EXPECT_EQ(result["verify"], "ok") << names[i];
    EXPECT_EQ(result["accounts"].get<int>(), accounts[i]);
    EXPECT_GT(result["commits"].get<uint64_t>(), 0u);
  }
  CommandResult status = Farpool("cluster status --json --dir " + dir);
  ASSERT_EQ(status.exit_code, 0) << status.output;
  for (auto& server : nlohmann::json::parse(status.output)["servers"]) {
    EXPECT_EQ(server["pool_refused"].get<uint64_t>(), 0u);
    EXPECT_EQ(server["auth_refused"].get<uint64_t>(), 0u);
  }
  CommandResult down = Farpool("cluster down --dir " + dir);
  ASSERT_EQ(down.exit_code, 0) << down.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/pools"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/cluster-alpha.json"));
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

// `cluster restart-etcd` (the soak's etcd fault): refused while the cluster's etcd runs, naming
// it; after its SIGKILL it starts it again on the same data and port, records the new pid, and
// `cluster status` answers from etcd again (the map and every server's lease: status exits 0
// only then), the servers having served on meanwhile.
TEST(Cli, RestartEtcdStartsTheClustersEtcdAgainOnItsData) {
  LocalClusterOptions o;
  o.servers = 2;
  o.memory = 32 << 20;
  o.progress = ProgressMode::kEvent;
  o.replicas = 1;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  const auto etcd = static_cast<pid_t>(cluster.config()->etcd.pid);
  ASSERT_GT(etcd, 0) << "the cluster started no etcd of its own";
  ExpectFailure("cluster restart-etcd --dir " + cluster.dir(),
                "the cluster's etcd (pid " + std::to_string(etcd) + ") is still running");
  ASSERT_EQ(kill(etcd, SIGKILL), 0);
  while (ProcessRunning(etcd)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CommandResult restarted = Farpool("cluster restart-etcd --dir " + cluster.dir());
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  const auto again = static_cast<pid_t>(cluster.config()->etcd.pid);
  EXPECT_NE(again, etcd);
  EXPECT_TRUE(ProcessRunning(again));
  // The servers' keepalives resume within their retry interval; the deadline only bounds a
  // broken run.
  CommandResult status;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    status = Farpool("cluster status --dir " + cluster.dir());
  } while (status.exit_code != 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_NE(status.output.find("alive by lease: 0 1"), std::string::npos) << status.output;
}  // ~TestCluster: `cluster down` stops the etcd that cluster.json names now

}  // namespace
}  // namespace farpool
