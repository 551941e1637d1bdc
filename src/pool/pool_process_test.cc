// Integration tests with real processes: `farpool server` processes started by ClusterUp, and
// client processes that are this test binary re-run as a worker (FARPOOL_WORKER=<role>).
// Each test checks an invariant that only holds if one-sided operations from several
// processes are atomic and visible: exact fetch-and-add totals, mutual exclusion by a CAS
// lock, every byte written reading back, and faults that fail fast without hanging.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "common/host.h"
#include "common/process.h"
#include "farpool/pool.h"
#include "pool/memory_ops.h"
#include "pool/server/memory_server.h"
#include "pool/test_cluster.h"
#include "transport/auth.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool {
namespace {

using namespace std::chrono_literals;

std::string Env(const char* name, const char* fallback = "") {
  const char* v = getenv(name);
  return v ? v : fallback;
}

// ------------------------------------------------------------------ worker side

// Bytes of object `i` of worker `w` after its `step`-th write: deterministic, so the parent
// can recompute every object's final content.
void Fill(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

// The shadow workload's schedule: which object each step writes and with which seed.
struct ShadowStep {
  size_t object;
  uint64_t seed;
  bool write;
};
ShadowStep Step(std::mt19937_64& rng, size_t objects) {
  return {static_cast<size_t>(rng() % objects), rng(), rng() % 2 == 0};
}

LocalClusterOptions Options(int servers, uint64_t memory, Fabric fabric) {
  LocalClusterOptions o;
  o.servers = servers;
  o.memory = memory;
  o.transport = fabric;
  o.progress = ProgressMode::kEvent;
  return o;
}

Status RunWorker(const std::string& role) {
  if (role == "cluster") {  // start a test cluster, say its servers' pids, wait to be killed
    TestCluster cluster(Options(2, 64 << 20, Fabric::kShm));
    FARPOOL_RETURN_IF_ERROR(cluster.status());
    FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, cluster.config());
    std::string line = cluster.dir();
    for (const ServerAddress& a : config.servers) line += " " + std::to_string(a.pid);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    for (;;) pause();
  }
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig cluster, ClusterConfig::Load(Env("FARPOOL_CLUSTER")));
  PoolOptions po;
  FARPOOL_ASSIGN_OR_RETURN(po.transport, ParseFabric(Env("FARPOOL_TRANSPORT", "auto")));
  FARPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Pool> pool, Pool::Connect(cluster, po));
  const int threads = std::stoi(Env("FARPOOL_THREADS", "1"));
  const int n = std::stoi(Env("FARPOOL_N", "1000"));
  const GlobalAddress a = GlobalAddress::FromRaw(std::stoull(Env("FARPOOL_ADDR", "0")));
  const GlobalAddress b = GlobalAddress::FromRaw(std::stoull(Env("FARPOOL_ADDR2", "0")));
  std::vector<Status> results(threads);
  auto body = [&](int t) -> Status {
    if (role == "faa") {
      for (int i = 0; i < n; ++i) FARPOOL_RETURN_IF_ERROR(pool->FetchAdd(a, 1).status());
      return Status::Ok();
    }
    if (role == "lock") {  // a: lock word, b: counter updated non-atomically under the lock
      const uint64_t me = (uint64_t(getpid()) << 8) | uint64_t(t + 1);
      for (int i = 0; i < n; ++i) {
        for (;;) {
          FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, pool->CompareAndSwap(a, 0, me));
          if (prev == 0) break;
          std::this_thread::yield();
        }
        uint64_t v = 0;
        FARPOOL_RETURN_IF_ERROR(pool->Read(b, &v, 8));
        ++v;
        FARPOOL_RETURN_IF_ERROR(pool->Write(b, &v, 8));
        FARPOOL_ASSIGN_OR_RETURN(uint64_t held, pool->CompareAndSwap(a, me, 0));
        if (held != me) return Status::Internal("lock stolen: held by " + std::to_string(held));
      }
      return Status::Ok();
    }
    if (role == "shadow") {  // a: table of object addresses; objects of this worker
      const int w = std::stoi(Env("FARPOOL_WORKER_ID")) * threads + t;
      const size_t objects = std::stoul(Env("FARPOOL_OBJECTS"));
      const size_t size = std::stoul(Env("FARPOOL_SIZE"));
      std::vector<uint64_t> table(objects);
      FARPOOL_RETURN_IF_ERROR(pool->Read(a + uint64_t(w) * objects * 8, table.data(), objects * 8));
      std::vector<std::vector<uint8_t>> shadow(objects, std::vector<uint8_t>(size, 0));
      std::mt19937_64 rng(1000 + w);
      std::vector<uint8_t> buf(size);
      for (int i = 0; i < n; ++i) {
        ShadowStep s = Step(rng, objects);
        const GlobalAddress obj = GlobalAddress::FromRaw(table[s.object]);
        if (s.write) {
          Fill(shadow[s.object].data(), size, s.seed);
          FARPOOL_RETURN_IF_ERROR(pool->Write(obj, shadow[s.object].data(), size));
        } else {
          FARPOOL_RETURN_IF_ERROR(pool->Read(obj, buf.data(), size));
          if (buf != shadow[s.object]) {
            return Status::Internal("object " + std::to_string(s.object) + " of worker " +
                                    std::to_string(w) + " differs from its shadow at step " +
                                    std::to_string(i));
          }
        }
      }
      return Status::Ok();
    }
    if (role == "evictee") {  // say our tag, then stop ourselves until evicted (killed)
      if (t != 0) return Status::Ok();
      if (pool->AccessPath(cluster.servers[0].id) != "direct") {
        return Status::Internal("the evictee is not mapping server 0: " +
                                pool->AccessPath(cluster.servers[0].id));
      }
      std::printf("%u\n", pool->process_tag());
      std::fflush(stdout);
      raise(SIGSTOP);
      for (;;) pause();  // resumed by someone else: still wait to be killed
    }
    if (role == "goodbye") {  // close a mapping Pool, then evict its tag from a new one
      if (t != 0) return Status::Ok();
      PoolOptions mapping;
      mapping.transport = Fabric::kShm;
      FARPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Pool> closing, Pool::Connect(cluster, mapping));
      if (closing->AccessPath(cluster.servers[0].id) != "direct") {
        return Status::Internal("the closing Pool does not map server 0: " +
                                closing->AccessPath(cluster.servers[0].id));
      }
      const uint32_t closed_tag = closing->process_tag();
      FARPOOL_RETURN_IF_ERROR(closing->Alloc(64).status());
      closing.reset();  // says goodbye
      // Were the closed Pool still pinned, the servers would now kill this process, which
      // runs on under another Pool.
      FARPOOL_RETURN_IF_ERROR(pool->Evict(closed_tag));
      std::vector<std::byte> probe(64);
      auto a = pool->Alloc(64);
      FARPOOL_RETURN_IF_ERROR(a.status());
      return pool->Write(*a, probe.data(), probe.size());
    }
    if (role == "beside-unreachable") {  // see AServerWhoseLanesCannotConnectHoldsNoOther...
      if (t != 0) return Status::Ok();
      FARPOOL_ASSIGN_OR_RETURN(ClusterConfig all, ClusterConfig::Load(Env("FARPOOL_CLUSTER_ALL")));
      FARPOOL_ASSIGN_OR_RETURN(GlobalAddress object, pool->Alloc(64));
      PoolOptions late_options = po;
      late_options.connect_timeout = 2000ms;
      late_options.op_timeout = 3000ms;
      std::atomic<bool> connected{false};
      Status late = Status::Unavailable("not tried");
      std::thread connecting([&] {
        late = Pool::Connect(all, late_options).status();
        connected = true;
      });
      std::mutex mu;
      std::string failures;
      auto write = [&] {
        const uint64_t v = 0x5eed;
        Status s = pool->Write(object, &v, 8);
        std::lock_guard lock(mu);
        if (!s.ok()) failures += s.ToString() + "; ";
      };
      while (!connected.load()) {
        std::thread fresh(write);  // a new thread: a new UCX worker and endpoints
        for (int i = 0; i < 20; ++i) write();
        fresh.join();
      }
      connecting.join();
      if (!failures.empty()) {
        return Status::Internal(
            "writes to the healthy server failed while another Pool "
            "connected to the unreachable one: " +
            failures);
      }
      // Connect refuses a cluster with a server it cannot reach, and names it.
      if ((late.code() != StatusCode::kUnavailable && late.code() != StatusCode::kTimedOut) ||
          late.message().find("server 1") == std::string::npos) {
        return Status::Internal("connecting to the whole cluster: " + late.ToString());
      }
      return Status::Ok();
    }
    if (role == "hold") {  // allocate and write, say so, then wait to be killed
      if (t != 0) return Status::Ok();
      for (int i = 0; i < n; ++i) {
        FARPOOL_ASSIGN_OR_RETURN(GlobalAddress obj, pool->Alloc(1 << 20));
        std::vector<uint8_t> bytes(1 << 20, 0xab);
        FARPOOL_RETURN_IF_ERROR(pool->Write(obj, bytes.data(), bytes.size()));
      }
      std::printf("ready\n");
      std::fflush(stdout);
      for (;;) pause();
    }
    return Status::InvalidArgument("unknown worker role " + role);
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { results[t] = body(t); });
  for (auto& t : ts) t.join();
  for (auto& r : results) FARPOOL_RETURN_IF_ERROR(r);
  return Status::Ok();
}

// ------------------------------------------------------------------ parent side

struct WorkerSpec {
  std::string role;
  std::vector<std::pair<std::string, std::string>> env;
};

// Runs `count` worker processes and waits for all (at most `limit`). Returns their failures.
std::string RunWorkers(int count, const WorkerSpec& spec, std::chrono::seconds limit = 180s) {
  std::vector<pid_t> pids;
  for (int i = 0; i < count; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("FARPOOL_WORKER", spec.role.c_str(), 1);
      setenv("FARPOOL_WORKER_ID", std::to_string(i).c_str(), 1);
      for (auto& [k, v] : spec.env) setenv(k.c_str(), v.c_str(), 1);
      execl("/proc/self/exe", "pool_process_test", nullptr);
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::string failures;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (pid_t pid : pids) {
    int status = 0;
    for (;;) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        failures += "worker " + std::to_string(pid) + " hung; ";
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failures +=
          "worker " + std::to_string(pid) + " failed (status " + std::to_string(status) + "); ";
    }
  }
  return failures;
}

// Starts this binary as worker `role` on `cluster` over `transport` (more environment in
// `env`) and returns its pid and the first line it prints (it prints once it is ready);
// pid -1 if it did not start.
std::pair<pid_t, std::string> StartChild(
    const char* role, const TestCluster& cluster, const std::string& transport,
    const std::vector<std::pair<std::string, std::string>>& env = {}) {
  int out[2];
  if (pipe(out) != 0) return {-1, ""};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    setenv("FARPOOL_WORKER", role, 1);
    setenv("FARPOOL_CLUSTER", cluster.cluster_file().c_str(), 1);
    setenv("FARPOOL_TRANSPORT", transport.c_str(), 1);
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    execl("/proc/self/exe", "pool_process_test", nullptr);
    _exit(127);
  }
  close(out[1]);
  char line[32] = {};
  const bool started = read(out[0], line, sizeof(line) - 1) > 0;
  close(out[0]);
  return {started ? pid : -1, line};
}

// An active-message handler that appends each message to the
// std::vector<std::vector<std::byte>> at `arg` (raw clients of the tests below).
ucs_status_t CollectReply(void* arg, const void*, size_t, void* data, size_t len,
                          const ucp_am_recv_param_t*) {
  auto* out = static_cast<std::vector<std::vector<std::byte>>*>(arg);
  auto* b = static_cast<std::byte*>(data);
  out->emplace_back(b, b + len);
  return UCS_OK;
}

// `pool` still allocates and writes.
void ExpectServes(Pool& pool) {
  auto a = pool.Alloc(64);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  uint64_t v = 42;
  EXPECT_TRUE(pool.Write(*a, &v, 8).ok());
}

std::unique_ptr<Pool> Connect(const TestCluster& c, Fabric fabric, PoolOptions o = {}) {
  auto config = c.config();
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  o.transport = fabric;
  auto pool = Pool::Connect(*config, o);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// Batches of 8 reads of `size` bytes at `at`, one after another, until one fails (its error)
// or `running` turns false (Ok): a client with requests in flight when its server fails.
Status ReadBatchesUntilFailure(Pool& pool, GlobalAddress at, uint64_t size,
                               const std::atomic<bool>& running) {
  std::vector<uint8_t> buf(size * 8);
  while (running) {
    Batch b(pool);
    Status s;
    for (int i = 0; i < 8 && s.ok(); ++i) s = b.Read(at, buf.data() + i * size, size);
    Status w = b.Wait();
    if (!s.ok()) return s;
    if (!w.ok()) return w;
  }
  return Status::Ok();
}

class ProcessTest : public ::testing::TestWithParam<Fabric> {};

TEST_P(ProcessTest, FetchAddFromSeveralProcessesAndThreadsIsExact) {
  TestCluster cluster(Options(2, 64 << 20, GetParam()));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto pool = Connect(cluster, GetParam());
  ASSERT_TRUE(pool);
  auto counter = *pool->Alloc(8, Placement::OnServer(1));
  uint64_t zero = 0;
  ASSERT_TRUE(pool->Write(counter, &zero, 8).ok());
  const int kProcs = 3, kThreads = 2, kN = GetParam() == Fabric::kTcp ? 2000 : 50000;
  std::string failures =
      RunWorkers(kProcs, {"faa",
                          {{"FARPOOL_CLUSTER", cluster.cluster_file()},
                           {"FARPOOL_TRANSPORT", std::string(FabricName(GetParam()))},
                           {"FARPOOL_THREADS", std::to_string(kThreads)},
                           {"FARPOOL_N", std::to_string(kN)},
                           {"FARPOOL_ADDR", std::to_string(counter.raw())}}});
  EXPECT_EQ(failures, "");
  uint64_t total = 0;
  ASSERT_TRUE(pool->Read(counter, &total, 8).ok());
  EXPECT_EQ(total, uint64_t{kProcs} * kThreads * kN);
}

TEST_P(ProcessTest, CompareAndSwapLockGivesMutualExclusion) {
  TestCluster cluster(Options(2, 64 << 20, GetParam()));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto pool = Connect(cluster, GetParam());
  ASSERT_TRUE(pool);
  auto lock = *pool->Alloc(8, Placement::OnServer(0));
  auto counter = *pool->Alloc(8, Placement::OnServer(1));
  uint64_t zero = 0;
  ASSERT_TRUE(pool->Write(lock, &zero, 8).ok());
  ASSERT_TRUE(pool->Write(counter, &zero, 8).ok());
  const int kProcs = 3, kThreads = 2, kN = GetParam() == Fabric::kTcp ? 300 : 20000;
  std::string failures =
      RunWorkers(kProcs, {"lock",
                          {{"FARPOOL_CLUSTER", cluster.cluster_file()},
                           {"FARPOOL_TRANSPORT", std::string(FabricName(GetParam()))},
                           {"FARPOOL_THREADS", std::to_string(kThreads)},
                           {"FARPOOL_N", std::to_string(kN)},
                           {"FARPOOL_ADDR", std::to_string(lock.raw())},
                           {"FARPOOL_ADDR2", std::to_string(counter.raw())}}});
  EXPECT_EQ(failures, "");
  uint64_t total = 0, held = 1;
  ASSERT_TRUE(pool->Read(counter, &total, 8).ok());
  ASSERT_TRUE(pool->Read(lock, &held, 8).ok());
  EXPECT_EQ(total, uint64_t{kProcs} * kThreads * kN) << "an update under the lock was lost";
  EXPECT_EQ(held, 0u);
}

TEST_P(ProcessTest, RandomReadsAndWritesFromSeveralProcessesMatchAShadow) {
  TestCluster cluster(Options(3, 64 << 20, GetParam()));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto pool = Connect(cluster, GetParam());
  ASSERT_TRUE(pool);
  const int kProcs = 3, kThreads = 2, kWorkers = kProcs * kThreads;
  const size_t kObjects = 64, kSize = 200;
  const int kSteps = GetParam() == Fabric::kTcp ? 2000 : 20000;
  // Objects of varied placement, zeroed; their addresses in a table in the pool.
  std::vector<uint64_t> table(kWorkers * kObjects);
  std::vector<uint8_t> zeros(kSize, 0);
  for (auto& t : table) {
    auto a = *pool->Alloc(kSize);
    ASSERT_TRUE(pool->Write(a, zeros.data(), kSize).ok());
    t = a.raw();
  }
  auto table_addr = *pool->Alloc(table.size() * 8);
  ASSERT_TRUE(pool->Write(table_addr, table.data(), table.size() * 8).ok());
  std::string failures =
      RunWorkers(kProcs, {"shadow",
                          {{"FARPOOL_CLUSTER", cluster.cluster_file()},
                           {"FARPOOL_TRANSPORT", std::string(FabricName(GetParam()))},
                           {"FARPOOL_THREADS", std::to_string(kThreads)},
                           {"FARPOOL_N", std::to_string(kSteps)},
                           {"FARPOOL_OBJECTS", std::to_string(kObjects)},
                           {"FARPOOL_SIZE", std::to_string(kSize)},
                           {"FARPOOL_ADDR", std::to_string(table_addr.raw())}}});
  EXPECT_EQ(failures, "");
  // Every object now holds what its worker wrote last: replay each worker's schedule.
  for (int w = 0; w < kWorkers; ++w) {
    std::vector<std::vector<uint8_t>> expect(kObjects, std::vector<uint8_t>(kSize, 0));
    std::mt19937_64 rng(1000 + w);
    for (int i = 0; i < kSteps; ++i) {
      ShadowStep s = Step(rng, kObjects);
      if (s.write) Fill(expect[s.object].data(), kSize, s.seed);
    }
    std::vector<uint8_t> got(kSize);
    for (size_t o = 0; o < kObjects; ++o) {
      ASSERT_TRUE(
          pool->Read(GlobalAddress::FromRaw(table[w * kObjects + o]), got.data(), kSize).ok());
      ASSERT_EQ(got, expect[o]) << "worker " << w << " object " << o;
    }
  }
}

TEST_P(ProcessTest, KilledServerFailsPendingAndLaterCallsWithinABound) {
  TestCluster cluster(Options(2, 64 << 20, GetParam()));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  PoolOptions po;
  po.failure_timeout = 500ms;
  po.op_timeout = 2000ms;
  auto pool = Connect(cluster, GetParam(), po);
  ASSERT_TRUE(pool);
  auto on0 = *pool->Alloc(4096, Placement::OnServer(0));
  auto on1 = *pool->Alloc(4096, Placement::OnServer(1));
  // A thread keeps batches of operations in flight on server 1 while it is killed.
  std::atomic<bool> running{true};
  Status batch_error;
  std::thread hammer([&] { batch_error = ReadBatchesUntilFailure(*pool, on1, 4096, running); });
  std::this_thread::sleep_for(200ms);
  auto config = *cluster.config();
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(static_cast<pid_t>(config.servers[1].pid), SIGKILL), 0);
  // Pending and later calls fail with Unavailable; bound generously (no hang).
  for (;;) {
    uint64_t v = 0;
    Status s = pool->Read(on1, &v, 8);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
      EXPECT_NE(s.message().find("server 1"), std::string::npos) << s.message();
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now() - killed_at, 20s) << "no failure noticed";
    std::this_thread::sleep_for(10ms);
  }
  hammer.join();
  EXPECT_EQ(batch_error.code(), StatusCode::kUnavailable) << batch_error.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 20s);
  uint64_t v = 7;
  EXPECT_TRUE(pool->Write(on0, &v, 8).ok()) << "server 0 keeps serving";
  EXPECT_TRUE(pool->Read(on0, &v, 8).ok());
  EXPECT_EQ(v, 7u);
  EXPECT_EQ(pool->FetchAdd(on1, 1).status().code(), StatusCode::kUnavailable);
}

// Silence is a suspicion, not a verdict: a server stopped (SIGSTOP) for longer than the failure
// timeout but resumed before a hello on a fresh connection gives up (1 s) is suspected, answers
// that hello, and stays in use with its data. One stopped for good is still declared failed.
TEST_P(ProcessTest, AServerSilentPastTheFailureTimeoutButAliveStaysInUse) {
  TestCluster cluster(Options(2, 64 << 20, GetParam()));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  PoolOptions po;
  po.failure_timeout = 300ms;
  auto pool = Connect(cluster, GetParam(), po);
  ASSERT_TRUE(pool);
  auto on1 = *pool->Alloc(64, Placement::OnServer(1));
  uint64_t v = 1234;
  ASSERT_TRUE(pool->Write(on1, &v, 8).ok());
  const pid_t server1 = static_cast<pid_t>(cluster.config()->servers[1].pid);
  // Stopped 900 ms: the monitor suspects it 300–400 ms in, its probe waits until ~1.4 s. A
  // starved monitor may miss a stop (it then resets its clocks): up to 5 stops, one suffices.
  for (int stop = 0; stop < 5 && pool->counters().suspicions_cleared == 0; ++stop) {
    ASSERT_EQ(kill(server1, SIGSTOP), 0);
    std::this_thread::sleep_for(900ms);
    ASSERT_EQ(kill(server1, SIGCONT), 0);
    std::this_thread::sleep_for(1500ms);  // the probe's answer, or the next heartbeat's
  }
  EXPECT_GE(pool->counters().suspicions_cleared, 1u) << "the monitor never suspected it";
  uint64_t got = 0;
  Status read = pool->Read(on1, &got, 8);
  ASSERT_TRUE(read.ok()) << read.ToString();
  EXPECT_EQ(got, 1234u);
  EXPECT_TRUE(pool->FetchAdd(on1, 1).ok());
  // Stopped for good: declared failed (after the failure timeout and the probe), no hang.
  ASSERT_EQ(kill(server1, SIGSTOP), 0);
  const auto stopped_at = std::chrono::steady_clock::now();
  Status s;
  while (std::chrono::steady_clock::now() - stopped_at < 20s) {
    s = pool->Alloc(64, Placement::OnServer(1)).status();
    if (!s.ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  kill(server1, SIGCONT);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("nor to a hello on a fresh connection"), std::string::npos)
      << s.message();
}

// A server that stops answering without closing its connections (SIGSTOP: the kernel still
// acknowledges its TCP traffic, so no connection error ever wakes a client sleeping on its
// worker's event fd for a reply): batches waiting on it fail as Unavailable once the monitor
// declares it failed, not at the end of their own op_timeout.
TEST(StoppedServer, WaitingBatchesFailOnceTheMonitorDeclaresItFailed) {
  TestCluster cluster(Options(2, 64 << 20, Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  PoolOptions po;
  po.failure_timeout = 500ms;
  // A wait that missed the monitor's verdict would sleep this long: the test would hang until
  // ctest's timeout (600 s) fails it.
  po.op_timeout = 3600s;
  auto pool = Connect(cluster, Fabric::kTcp, po);
  ASSERT_TRUE(pool);
  auto on0 = *pool->Alloc(64, Placement::OnServer(0));
  auto on1 = *pool->Alloc(64, Placement::OnServer(1));
  Status batch_error;
  const std::atomic<bool> forever{true};  // batches on server 1 until one fails
  std::thread hammer([&] { batch_error = ReadBatchesUntilFailure(*pool, on1, 64, forever); });
  std::this_thread::sleep_for(200ms);
  const auto server1 = static_cast<pid_t>(cluster.config()->servers[1].pid);
  ASSERT_EQ(kill(server1, SIGSTOP), 0);
  hammer.join();
  EXPECT_EQ(batch_error.code(), StatusCode::kUnavailable) << batch_error.ToString();
  EXPECT_NE(batch_error.message().find("server 1"), std::string::npos) << batch_error.message();
  uint64_t v = 7;
  EXPECT_TRUE(pool->Write(on0, &v, 8).ok()) << "server 0 keeps serving";
  EXPECT_TRUE(pool->Read(on0, &v, 8).ok());
  EXPECT_EQ(v, 7u);
  kill(server1, SIGCONT);
}

// A thread's first call connects it only to the servers that call uses: a stopped server it
// never touched neither holds it up nor gets marked failed by it. Before, a thread's first
// call connected to every server; its hello to the stopped one timed out after
// connect_timeout, which marked that server failed for the whole Pool (it stayed failed once
// resumed). The monitor's verdict is out of the picture: its failure timeout is long.
TEST(StoppedServer, ANewThreadNeitherWaitsForNorFailsAServerItDoesNotUse) {
  TestCluster cluster(Options(2, 64 << 20, Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  PoolOptions po;
  po.connect_timeout = 3s;  // the hellos that must succeed get room on a loaded host
  po.failure_timeout = 120s;
  auto pool = Connect(cluster, Fabric::kTcp, po);
  ASSERT_TRUE(pool);
  auto on0 = pool->Alloc(64, Placement::OnServer(0));
  auto on1 = pool->Alloc(64, Placement::OnServer(1));
  ASSERT_TRUE(on0.ok() && on1.ok()) << on0.status().ToString() << on1.status().ToString();
  uint64_t v = 11;
  ASSERT_TRUE(pool->Write(*on1, &v, 8).ok());
  const auto server1 = static_cast<pid_t>(cluster.config()->servers[1].pid);
  ASSERT_EQ(kill(server1, SIGSTOP), 0);
  Status write0, read0;
  uint64_t got0 = 0;
  std::thread fresh([&] {  // a thread that has not used the Pool yet: server 0 only
    const uint64_t w = 22;
    write0 = pool->Write(*on0, &w, 8);
    read0 = pool->Read(*on0, &got0, 8);
  });
  fresh.join();
  ASSERT_EQ(kill(server1, SIGCONT), 0);
  EXPECT_TRUE(write0.ok()) << write0.ToString();
  EXPECT_TRUE(read0.ok()) << read0.ToString();
  EXPECT_EQ(got0, 22u);
  // Server 1 is in use again, for this thread and for a new one (which connects to it now).
  uint64_t got1 = 0;
  Status read1 = pool->Read(*on1, &got1, 8);
  EXPECT_TRUE(read1.ok()) << "server 1 was taken for failed: " << read1.ToString();
  EXPECT_EQ(got1, 11u);
  std::thread later([&] { read1 = pool->Read(*on1, &got1, 8); });
  later.join();
  EXPECT_TRUE(read1.ok()) << read1.ToString();
}

// A client killed with SIGKILL: the server notices its connections drop, keeps the leases
// (data outlives its writer: see pool/server/chunk_allocator.h) and keeps serving everyone else.
TEST_P(ProcessTest, KilledClientIsDroppedAndTheServerKeepsServing) {
  TestCluster cluster(Options(1, 64 << 20, GetParam()));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  const auto [pid, line] =
      StartChild("hold", cluster, std::string(FabricName(GetParam())), {{"FARPOOL_N", "3"}});
  ASSERT_GT(pid, 0) << "the holding client did not start";
  auto pool = Connect(cluster, GetParam());
  ASSERT_TRUE(pool);
  auto before = pool->Stats(0);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->clients, 2u) << "the holder and us";
  EXPECT_EQ(before->leased, 4u << 20) << "three 1 MiB objects share one 4 MiB slab chunk";
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  // The server drops the dead client's connections within a bounded time.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  uint32_t clients = 0;
  do {
    std::this_thread::sleep_for(50ms);
    auto st = pool->Stats(0);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    clients = st->clients;
    EXPECT_EQ(st->leased, 4u << 20) << "leases outlive the client";
  } while (clients != 1 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(clients, 1u);
  ExpectServes(*pool);
}

// A test process killed with its cluster up leaves no server behind: the servers die with it
// (PR_SET_PDEATHSIG) and their janitors remove their shared-memory directories.
TEST(ClusterProcess, ServersDieWithTheTestProcessThatStartedThem) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  if (child == 0) {
    dup2(out[1], STDOUT_FILENO);
    setenv("FARPOOL_WORKER", "cluster", 1);
    execl("/proc/self/exe", "pool_process_test", nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string line;
  char c = 0;
  while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
  close(out[0]);
  std::istringstream words(line);
  std::string dir;
  std::vector<pid_t> servers;
  words >> dir;
  for (pid_t p = 0; words >> p;) servers.push_back(p);
  ASSERT_EQ(servers.size(), 2u) << "the child did not start its cluster: '" << line << "'";
  for (pid_t p : servers) ASSERT_TRUE(ProcessRunning(p)) << "server " << p;
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  waitpid(child, &status, 0);
  // Liveness bound only (generous on a loaded machine): the kernel signals at once.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto gone = [&] {
    for (pid_t p : servers) {
      if (ProcessRunning(p)) return false;
      if (std::filesystem::exists("/dev/shm/farpool-ucx-" + std::to_string(p))) return false;
    }
    return true;
  };
  while (!gone() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  for (pid_t p : servers) {
    EXPECT_FALSE(ProcessRunning(p)) << "server " << p << " outlived the test process";
    EXPECT_FALSE(std::filesystem::exists("/dev/shm/farpool-ucx-" + std::to_string(p)))
        << "server " << p << " left its shared-memory directory";
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A Pool that closes says goodbye: its servers unpin the process, so evicting the closed
// Pool's tag later (a database slot may still name it) never kills the process, which goes on
// working under a new Pool.
TEST(Eviction, AClosedPoolsTagNeverKillsItsStillRunningProcess) {
  TestCluster cluster(Options(2, 64 << 20, Fabric::kShm));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  const std::string failures = RunWorkers(
      1, {"goodbye", {{"FARPOOL_CLUSTER", cluster.cluster_file()}, {"FARPOOL_TRANSPORT", "shm"}}});
  EXPECT_EQ(failures, "") << "the worker was killed (status 9) or failed";
}

// Eviction of a process that maps the region: it is stopped (as a stalled session would be);
// Evict kills it through the server's pidfd and returns once it has exited; the server goes on.
TEST(Eviction, MappedClientIsKilledAndTheServerKeepsServing) {
  TestCluster cluster(Options(2, 32 << 20, Fabric::kShm));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  const auto [pid, line] = StartChild("evictee", cluster, "shm");
  ASSERT_GT(pid, 0) << "the evictee did not start";
  const uint32_t tag = static_cast<uint32_t>(std::stoul(line));
  ASSERT_NE(tag, 0u);
  auto pool = Connect(cluster, Fabric::kShm);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->AccessPath(0), "direct") << "this process is pinned too";
  ASSERT_EQ(pool->Stats(0)->clients, 2u) << "the evictee and us";
  Status s = pool->Evict(tag);
  EXPECT_TRUE(s.ok()) << s.ToString();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, WNOHANG), pid) << "Evict returned before the process exited";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  EXPECT_TRUE(pool->Evict(tag).ok()) << "idempotent";
  // The servers keep serving this Pool and new ones.
  auto st = pool->Stats(0);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->clients, 1u);
  auto fresh = Connect(cluster, Fabric::kShm);
  ASSERT_TRUE(fresh);
  auto a = fresh->Alloc(64, Placement::OnServer(1));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  uint64_t v = 99, back = 0;
  ASSERT_TRUE(fresh->Write(*a, &v, 8).ok());
  ASSERT_TRUE(pool->Read(*a, &back, 8).ok());
  EXPECT_EQ(back, 99u);
}

// A raw connection to server 0 that collects every reply (for hand-made control messages).
struct RawClient {
  std::unique_ptr<transport::Context> ctx;
  std::unique_ptr<transport::Worker> worker;
  std::unique_ptr<transport::Endpoint> ep;
  std::vector<std::vector<std::byte>> replies;

  Status Open(const ServerAddress& server) {
    transport::Context::Options co;
    co.fabric = Fabric::kTcp;
    co.reach = {server.host};  // as a Pool does
    FARPOOL_ASSIGN_OR_RETURN(ctx, transport::Context::Create(co));
    FARPOOL_ASSIGN_OR_RETURN(worker, transport::Worker::Create(*ctx, false));
    FARPOOL_RETURN_IF_ERROR(worker->SetAmHandler(transport::kControlAm, CollectReply, &replies));
    FARPOOL_ASSIGN_OR_RETURN(
        ep, transport::Endpoint::Connect(*worker, server.host, server.port, nullptr));
    return Status::Ok();
  }
  // A hello after this connection's challenge-response with `secret` (the first hello on a
  // connection to a server with a secret must prove it); `proof_mask` is XORed into the proof
  // (nonzero: a garbled proof).
  Result<wire::Message> ProvedHello(const transport::ClusterSecret& secret,
                                    wire::HelloRequest hello, uint8_t proof_mask = 0) {
    FARPOOL_ASSIGN_OR_RETURN(transport::Nonce nonce, transport::RandomNonce());
    wire::ChallengeRequest c{};
    std::memcpy(c.client_nonce, nonce.data(), nonce.size());
    FARPOOL_ASSIGN_OR_RETURN(wire::Message reply, Ask(wire::Encode(1000, c)));
    if (reply.opcode != wire::Opcode::kChallengeReply) {
      return Status::Protocol("expected a ChallengeReply, got " +
                              std::string(wire::OpcodeName(reply.opcode)));
    }
    transport::Nonce server;
    std::memcpy(server.data(), reply.As<wire::ChallengeReply>().server_nonce, server.size());
    transport::Proof proof = secret.Prove(transport::ClusterSecret::Role::kClient, nonce, server);
    for (auto& b : proof) b ^= proof_mask;
    std::memcpy(hello.proof, proof.data(), proof.size());
    hello.flags |= wire::kHelloHasProof;
    return Ask(wire::Encode(1001, hello));
  }
  // Sends `m` and waits for one more reply (at most 10 s).
  Result<wire::Message> Ask(const std::vector<std::byte>& m) {
    const size_t before = replies.size();
    FARPOOL_RETURN_IF_ERROR(
        ep->SendAm(transport::kControlAm, m, true, std::chrono::steady_clock::now() + 5s, nullptr));
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (replies.size() == before && std::chrono::steady_clock::now() < deadline) {
      worker->Progress();
    }
    if (replies.size() == before) return Status::TimedOut("no reply");
    return wire::Decode(replies.back());
  }
  ~RawClient() {
    ep.reset();
    worker.reset();
    ctx.reset();
  }
};

transport::ClusterSecret SecretOf(const TestCluster& cluster) {
  auto config = cluster.config();
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  auto secret = transport::ClusterSecret::Read(config->secret_file);
  EXPECT_TRUE(secret.ok()) << secret.status().ToString();
  return *secret;
}

// Eviction of a client that does not map (messages over TCP): its connections are closed, its
// next operation fails with the server's reason, a hello with its tag is refused; the evicting
// Pool keeps working. Evicting an unknown tag is Ok, evicting oneself is refused.
TEST(Eviction, MessagesClientIsCutOffAndRefused) {
  TestCluster cluster(Options(1, 32 << 20, Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  PoolOptions po;
  po.remote_access = RemoteAccess::kMessages;
  auto evictor = Connect(cluster, Fabric::kTcp, po);
  auto victim = Connect(cluster, Fabric::kTcp, po);
  ASSERT_TRUE(evictor && victim);
  ASSERT_NE(evictor->process_tag(), victim->process_tag());
  EXPECT_EQ(victim->AccessPath(0), "messages");
  auto a = evictor->Alloc(64);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  uint64_t v = 5;
  ASSERT_TRUE(victim->Write(*a, &v, 8).ok());
  ASSERT_EQ(evictor->Stats(0)->clients, 2u);

  Status s = evictor->Evict(victim->process_tag());
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto st = evictor->Stats(0);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->clients, 1u) << "the victim's connections are closed";

  // The victim's next operations fail with the reason and its code, never hang.
  const auto started = std::chrono::steady_clock::now();
  Status r = victim->Read(*a, &v, 8);
  EXPECT_EQ(r.code(), StatusCode::kEvicted) << r.ToString();
  EXPECT_NE(r.message().find("evicted by server 0"), std::string::npos) << r.message();
  EXPECT_EQ(victim->Write(*a, &v, 8).code(), StatusCode::kEvicted);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 30s);

  // A hello carrying the evicted tag is refused.
  auto config = *cluster.config();
  RawClient raw;
  ASSERT_TRUE(raw.Open(config.servers[0]).ok());
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = (uint64_t{0xfeed} << 32) | victim->process_tag();
  auto refused = raw.ProvedHello(SecretOf(cluster), hello);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  ASSERT_EQ(refused->opcode, wire::Opcode::kErrorReply);
  Status why = wire::DecodeError(*refused);
  EXPECT_EQ(why.code(), StatusCode::kEvicted);
  EXPECT_NE(why.message().find("evicted by server 0"), std::string::npos) << why.message();
  // ... and so is everything else on that connection.
  auto stats = raw.Ask(wire::Encode(2, wire::StatsRequest{0}));
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->opcode, wire::Opcode::kErrorReply);

  // The evictor keeps working; unknown tags are Ok, its own tag and 0 are not.
  uint64_t back = 0;
  ASSERT_TRUE(evictor->Read(*a, &back, 8).ok());
  EXPECT_EQ(back, 5u);
  uint32_t unknown = victim->process_tag() ^ 0x5a5a5a5a;
  if (unknown == evictor->process_tag() || unknown == 0) unknown ^= 1;
  EXPECT_TRUE(evictor->Evict(unknown).ok());
  EXPECT_TRUE(evictor->Evict(victim->process_tag()).ok()) << "idempotent";
  EXPECT_EQ(evictor->Evict(evictor->process_tag()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(evictor->Evict(0).code(), StatusCode::kInvalidArgument);
}

// Two Pools of one process that map the same server share its pid: evicting one would kill
// both, so Evict refuses; the sibling keeps working.
TEST(Eviction, NeverEvictsAMappingPoolOfThisProcess) {
  TestCluster cluster(Options(1, 16 << 20, Fabric::kShm));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto first = Connect(cluster, Fabric::kShm, {});
  auto second = Connect(cluster, Fabric::kShm, {});
  ASSERT_TRUE(first && second);
  ASSERT_EQ(second->AccessPath(0), "direct");
  Status s = first->Evict(second->process_tag());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("another live Pool of this process"), std::string::npos)
      << s.message();
  ExpectServes(*second);
}

// A hello asking to map, from a pid whose start time is not the hello's (a reused pid), or from
// another boot, is not allowed to map, and says why.
TEST(Eviction, MappingIsRefusedToAProcessTheServerCannotPin) {
  TestCluster cluster(Options(1, 16 << 20, Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = *cluster.config();
  RawClient raw;
  ASSERT_TRUE(raw.Open(config.servers[0]).ok());
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = 0x1111;
  hello.flags = wire::kHelloWantsMap;
  auto boot = BootId();
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  std::memcpy(hello.boot_id, boot->data(), 16);
  auto start = ProcessStartTime(getpid());
  ASSERT_TRUE(start.ok()) << start.status().ToString();

  hello.start_time = *start + 1;
  auto r = raw.ProvedHello(SecretOf(cluster), hello);
  ASSERT_TRUE(r.ok() && r->opcode == wire::Opcode::kHelloReply);
  EXPECT_EQ(r->As<wire::HelloReply>().flags, wire::kHelloStartMismatch | wire::kHelloServerProof)
      << "the first hello authenticates the connection: the server proves itself";

  hello.start_time = *start;
  hello.boot_id[0] ^= 0xff;
  hello.client_nonce = 0x2222;
  r = raw.Ask(wire::Encode(2, hello));
  ASSERT_TRUE(r.ok() && r->opcode == wire::Opcode::kHelloReply);
  EXPECT_EQ(r->As<wire::HelloReply>().flags, wire::kHelloOtherBoot);

  hello.boot_id[0] ^= 0xff;
  hello.client_nonce = 0x3333;
  r = raw.Ask(wire::Encode(3, hello));
  ASSERT_TRUE(r.ok() && r->opcode == wire::Opcode::kHelloReply);
  EXPECT_EQ(r->As<wire::HelloReply>().flags, wire::kHelloMayMap) << "this process it can pin";

  hello.flags = 0;
  hello.client_nonce = 0x4444;
  r = raw.Ask(wire::Encode(4, hello));
  ASSERT_TRUE(r.ok() && r->opcode == wire::Opcode::kHelloReply);
  EXPECT_EQ(r->As<wire::HelloReply>().flags, 0) << "not asked to pin, it does not";
}

INSTANTIATE_TEST_SUITE_P(Fabrics, ProcessTest, ::testing::Values(Fabric::kShm, Fabric::kTcp),
                         [](const auto& info) { return std::string(FabricName(info.param)); });

// Malformed, truncated and wrong-version control messages sent to a real server: each gets an
// ErrorReply naming the problem, and the server keeps serving normal clients.
TEST(ServerProcess, RejectsMalformedControlMessagesAndKeepsRunning) {
  TestCluster cluster(Options(1, 16 << 20, Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = *cluster.config();
  // From a connection that authenticated: these are malformed, not unauthenticated (that is
  // Access.OnlyClientsThatKnowTheSecretAreServed).
  RawClient raw;
  ASSERT_TRUE(raw.Open(config.servers[0]).ok());
  wire::HelloRequest hello{};
  hello.client_nonce = 0x5151;
  auto authenticated = raw.ProvedHello(SecretOf(cluster), hello);
  ASSERT_TRUE(authenticated.ok() && authenticated->opcode == wire::Opcode::kHelloReply);
  raw.replies.clear();
  auto& replies = raw.replies;
  auto& ep = raw.ep;
  auto& worker = raw.worker;
  auto good = wire::Encode(1, wire::StatsRequest{0});
  std::vector<std::vector<std::byte>> bad;
  bad.push_back({std::byte{1}, std::byte{2}, std::byte{3}});  // truncated
  // A version no build speaks: the current one + 100 (bytes 4-5 of the frame, little-endian).
  const uint16_t unknown_version = wire::kVersion + 100;
  auto wrong_version = good;
  wrong_version[4] = static_cast<std::byte>(unknown_version & 0xff);
  wrong_version[5] = static_cast<std::byte>(unknown_version >> 8);
  bad.push_back(wrong_version);
  auto wrong_size = good;
  wrong_size[8] = std::byte{200};
  bad.push_back(wrong_size);
  bad.push_back(wire::Encode(5, wire::LeaseReply{0, 0}));           // a reply sent as a request
  bad.push_back(wire::Encode(6, wire::LeaseRequest{12345, 0, 0}));  // not a chunk multiple
  bad.push_back(wire::Encode(7, wire::ReleaseRequest{4096, 4 << 20, 0, 0}));  // never leased
  bad.push_back(std::vector<std::byte>(64 << 10, std::byte{0x5a}));           // oversized garbage
  // Batches: a read of memory nobody leased, a count that disagrees with the operations, and
  // a tail beyond the limit.
  memory_ops::RequestBuilder unleased;
  unleased.Read(4096, 64);
  bad.push_back(wire::Encode(
      8, wire::BatchRequest{1, static_cast<uint32_t>(unleased.bytes().size())}, unleased.bytes()));
  bad.push_back(wire::Encode(
      9, wire::BatchRequest{3, static_cast<uint32_t>(unleased.bytes().size())}, unleased.bytes()));
  std::vector<std::byte> huge(wire::kMaxBatchTail + 32);
  bad.push_back(wire::Encode(10, wire::BatchRequest{1, static_cast<uint32_t>(huge.size())}, huge));
  // Evictions: of tag 0, of a tag beyond 32 bits, and a request whose body is cut short.
  bad.push_back(wire::Encode(11, wire::EvictRequest{0}));
  bad.push_back(wire::Encode(12, wire::EvictRequest{uint64_t{1} << 40}));
  auto short_evict = wire::Encode(13, wire::EvictRequest{7});
  short_evict.resize(short_evict.size() - 4);
  bad.push_back(short_evict);
  // Goodbyes: from a connection that said no hello (for any tag: only one's own is allowed),
  // and one cut short.
  bad.push_back(wire::Encode(14, wire::GoodbyeRequest{7}));
  auto short_goodbye = wire::Encode(15, wire::GoodbyeRequest{7});
  short_goodbye.resize(short_goodbye.size() - 1);
  bad.push_back(short_goodbye);
  for (auto& m : bad) {
    ASSERT_TRUE(
        ep->SendAm(transport::kControlAm, m, true, std::chrono::steady_clock::now() + 5s, nullptr)
            .ok());
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (replies.size() < bad.size() && std::chrono::steady_clock::now() < deadline) {
    worker->Progress();
  }
  ASSERT_EQ(replies.size(), bad.size()) << "every bad message is answered";
  for (auto& r : replies) {
    auto m = wire::Decode(r);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->opcode, wire::Opcode::kErrorReply);
    Status s = wire::DecodeError(*m);
    EXPECT_NE(s.message().find("server 0"), std::string::npos) << s.message();
  }
  // Replies may arrive in any order; the wrong-version one names both versions.
  bool version_named = false;
  for (auto& r : replies) {
    version_named = version_named || wire::DecodeError(*wire::Decode(r))
                                             .message()
                                             .find("version " + std::to_string(unknown_version)) !=
                                         std::string::npos;
  }
  EXPECT_TRUE(version_named);
  // The server still serves a normal client, and counted what it rejected.
  auto pool = Connect(cluster, Fabric::kTcp);
  ASSERT_TRUE(pool);
  auto a = pool->Alloc(64);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto stats = pool->Stats(0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->rejected, 10u) << "truncated, version, size, reply-as-request, oversized, 3 "
                                     "batches, short evict, short goodbye";
  EXPECT_EQ(stats->auth_refused, 0u) << "all from a connection that authenticated";
}

// The scale target: 16 servers of 1 GiB; one client fills 90% striped across all of
// them, reads every byte back, frees it; then nothing is leased, and each server's private
// memory beyond its region stays under 2%.
TEST(ClusterScale, SixteenServersFilledToNinetyPercentReadBackAndFreed) {
#if defined(__SANITIZE_THREAD__)
  // TSan shadows every byte the client maps and touches (several times its size): 16 GiB of
  // regions would take the machine's memory. Same shape, smaller servers.
  constexpr uint64_t kMemory = 64ull << 20;
#else
  constexpr uint64_t kMemory = 1ull << 30;
#endif
  TestCluster cluster(Options(16, kMemory, Fabric::kShm));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto pool = Connect(cluster, Fabric::kShm);
  ASSERT_TRUE(pool);
  constexpr uint64_t kObject = 4 << 20;
  const uint64_t count = 16 * kMemory * 9 / 10 / kObject;
  std::vector<GlobalAddress> objs;
  std::vector<uint64_t> buf(kObject / 8), in(kObject / 8);
  std::map<uint16_t, int> per_server;
  for (uint64_t i = 0; i < count; ++i) {
    auto a = pool->Alloc(kObject);
    ASSERT_TRUE(a.ok()) << "object " << i << ": " << a.status().ToString();
    for (size_t k = 0; k < buf.size(); ++k) buf[k] = (i << 32) ^ k;
    ASSERT_TRUE(pool->Write(*a, buf.data(), kObject).ok());
    objs.push_back(*a);
    ++per_server[a->server()];
  }
  EXPECT_EQ(per_server.size(), 16u) << "striped across all 16";
  for (uint64_t i = 0; i < count; ++i) {
    ASSERT_TRUE(pool->Read(objs[i], in.data(), kObject).ok());
    for (size_t k = 0; k < in.size(); ++k) {
      ASSERT_EQ(in[k], (i << 32) ^ k) << "object " << i << " word " << k;
    }
  }
  for (uint16_t id : pool->server_ids()) {
    auto st = pool->Stats(id);
    ASSERT_TRUE(st.ok());
// Sanitizers' shadow memory is not the server's overhead.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    EXPECT_LT(st->rss_private, kMemory / 50) << "server " << id << " overhead";
#endif
  }
  for (auto a : objs) ASSERT_TRUE(pool->Free(a).ok());
  ASSERT_TRUE(pool->Trim().ok());
  auto status = ClusterStatus(cluster.dir());
  ASSERT_TRUE(status.ok());
  for (const auto& s : *status) {
    EXPECT_TRUE(s.up);
    EXPECT_EQ(s.stats.leased, 0u) << "server " << s.address.id;
  }
}

// Allocates 64 bytes, writes `value` into them and reads it back.
void ExpectServed(Pool& pool, uint64_t value) {
  auto a = pool.Alloc(64);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(pool.Write(*a, &value, 8).ok());
  uint64_t back = 0;
  ASSERT_TRUE(pool.Read(*a, &back, 8).ok());
  EXPECT_EQ(back, value);
}

// Two namespaced clusters on one host, each with its own bridge: a client of either reaches it
// on every connection. (UCX offers all of a host's interfaces for its TCP lanes; before the
// client kept them to the interfaces that route to its servers, a lane over the other
// cluster's bridge failed about one connection in two with "connection lost".)
TEST(NetworkNamespaces, TwoClustersOnOneHostAreBothReachedEveryTime) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  LocalClusterOptions o = Options(1, 16 << 20, Fabric::kTcp);
  o.netns = true;
  TestCluster first(o), second(o);
  ASSERT_TRUE(first.status().ok()) << first.status().ToString();
  ASSERT_TRUE(second.status().ok()) << second.status().ToString();
  ASSERT_NE(first.config()->servers[0].host, second.config()->servers[0].host);
  for (int round = 0; round < 4; ++round) {
    for (TestCluster* c : {&first, &second}) {
      auto pool = Connect(*c, Fabric::kTcp);
      ASSERT_TRUE(pool) << "round " << round;
      ExpectServed(*pool, 0x5eed0000u + static_cast<uint64_t>(round));
    }
  }
}

// A namespaced cluster takes a network 10.N.0.0/16 that no interface of the host has yet: with
// all of them but one held by a bridge of the test, `cluster up` lands on that one and is served.
// (Two clusters once took the same network when their directories hashed alike, and a client
// of one reached the other's server: "wrong cluster secret".)
TEST(NetworkNamespaces, AClusterTakesANetworkNoInterfaceHasYet) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const std::string holder = "fptestnets";
  auto ip = [](const std::string& args) {
    return std::system(("ip " + args + " 2>/dev/null").c_str());
  };
  ip("link del " + holder);
  ASSERT_EQ(ip("link add " + holder + " type bridge"), 0);
  struct Remove {
    std::function<void()> f;
    ~Remove() { f(); }
  } remove{[&] { ip("link del " + holder); }};
  // Every network of the clusters' range (150..249) that is free now, but the last, gets an
  // address on the test's bridge.
  std::vector<int> free_nets;
  for (int n = 150; n < 250; ++n) {
    const std::string probe = "ip -o -4 addr show | grep -q ' 10\\." + std::to_string(n) + "\\.'";
    if (std::system(probe.c_str()) != 0) free_nets.push_back(n);
  }
  ASSERT_FALSE(free_nets.empty());
  const int left = free_nets.back();
  free_nets.pop_back();
  for (int n : free_nets) {
    ASSERT_EQ(ip("addr add 10." + std::to_string(n) + ".0.1/16 dev " + holder), 0) << n;
  }
  LocalClusterOptions o = Options(1, 16 << 20, Fabric::kTcp);
  o.netns = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  EXPECT_EQ(cluster.config()->servers[0].host.rfind("10." + std::to_string(left) + ".", 0), 0u)
      << cluster.config()->servers[0].host << ", free network: " << left;
  auto pool = Connect(cluster, Fabric::kTcp);
  ASSERT_TRUE(pool);
  ExpectServed(*pool, 0xfeed);
}

// Servers in their own network namespaces: traffic crosses veth pairs and a bridge; totals
// stay exact.
TEST(NetworkNamespaces, FetchAddAcrossNamespacesIsExact) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  LocalClusterOptions o = Options(2, 32 << 20, Fabric::kTcp);
  o.netns = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = *cluster.config();
  EXPECT_NE(config.servers[0].host, "127.0.0.1");
  EXPECT_FALSE(config.servers[0].netns.empty());
  auto pool = Connect(cluster, Fabric::kTcp);
  ASSERT_TRUE(pool);
  auto counter = *pool->Alloc(8, Placement::OnServer(1));
  uint64_t zero = 0;
  ASSERT_TRUE(pool->Write(counter, &zero, 8).ok());
  std::string failures = RunWorkers(2, {"faa",
                                        {{"FARPOOL_CLUSTER", cluster.cluster_file()},
                                         {"FARPOOL_TRANSPORT", "tcp"},
                                         {"FARPOOL_THREADS", "2"},
                                         {"FARPOOL_N", "500"},
                                         {"FARPOOL_ADDR", std::to_string(counter.raw())}}});
  EXPECT_EQ(failures, "");
  uint64_t total = 0;
  ASSERT_TRUE(pool->Read(counter, &total, 8).ok());
  EXPECT_EQ(total, 2u * 2 * 500);
}

// Makes `server`'s namespace drop every answer to a TCP handshake (SYN-ACK) that does not
// come from its listening port: clients still reach that port, but every other new connection
// to the server, the lanes UCX wires up to its TCP interface's own port after the handshake,
// hangs in the kernel's SYN retries as towards a host whose link failed at that moment. (An htb
// class whose queue holds nothing: this kernel has neither netem nor tc actions.)
void DropHandshakesButFromItsPort(const ServerAddress& server) {
  const std::string& ns = server.netns;  // fp<tag>s<i>; its end of the veth pair: fp<tag>p<i>
  const std::string dev = ns.substr(0, ns.rfind('s')) + "p" + ns.substr(ns.rfind('s') + 1);
  const std::string tc = "ip netns exec " + ns + " tc ";
  for (const std::string& args :
       {"qdisc add dev " + dev + " root handle 1: htb default 1",
        "class add dev " + dev + " parent 1: classid 1:1 htb rate 10gbit",
        "class add dev " + dev + " parent 1: classid 1:2 htb rate 10gbit",
        "qdisc add dev " + dev + " parent 1:2 handle 20: pfifo limit 0",
        "filter add dev " + dev + " parent 1: prio 1 protocol ip u32 match ip protocol 6 0xff " +
            "match ip sport " + std::to_string(server.port) + " 0xffff flowid 1:1",
        // SYN and ACK set: the flags byte, 13 bytes into a TCP header after 20 of IP.
        "filter add dev " + dev + " parent 1: prio 2 protocol ip u32 match ip protocol 6 0xff " +
            "match u8 0x12 0x12 at 33 flowid 1:2"}) {
    ASSERT_EQ(std::system((tc + args + " >/dev/null 2>&1").c_str()), 0) << tc << args;
  }
}

// A server that answers on its listening port but takes no other new connection (its TCP
// lanes' port unreachable, as when its link fails between UCX's handshake and the lanes): a
// client process that connects to the whole cluster meanwhile fails that server within its own
// deadline, and no other thread of the process is held back: its other Pool's writes to the
// healthy server, from its thread and from threads that start (create UCX workers) meanwhile,
// all succeed (worker role "beside-unreachable"). Before the lanes connected without blocking
// (transport/ucx.h), the connecting thread slept in connect() inside UCX's progress through the
// kernel's SYN retries (~127 s, then again for each probe) holding the descriptor lock, the next
// worker creation waited for it and every other progress behind that: the worker hung.
TEST(NetworkNamespaces, AServerWhoseLanesCannotConnectHoldsNoOtherClientBack) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  LocalClusterOptions o = Options(2, 32 << 20, Fabric::kTcp);
  o.netns = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  const ClusterConfig config = *cluster.config();
  ClusterConfig healthy = config;  // server 0 only: the worker's Pool that must not wait
  healthy.servers.resize(1);
  const std::string healthy_file = cluster.dir() + "/server-0-only.json";
  ASSERT_TRUE(healthy.Save(healthy_file).ok());
  ASSERT_NO_FATAL_FAILURE(DropHandshakesButFromItsPort(config.servers[1]));
  // 60 s: far above the worker's deadlines (2 s to connect, 3 s per operation), far below the
  // kernel's SYN retries.
  EXPECT_EQ(RunWorkers(1,
                       {"beside-unreachable",
                        {{"FARPOOL_CLUSTER", healthy_file},
                         {"FARPOOL_CLUSTER_ALL", cluster.cluster_file()},
                         {"FARPOOL_TRANSPORT", "tcp"}}},
                       60s),
            "");
}

// ------------------------------------------------------------------ access control

// Writes a fresh secret (another cluster's) and returns a copy of `config` naming it.
ClusterConfig WithAnotherSecret(const ClusterConfig& config, const std::string& dir) {
  const std::string path = dir + "/another.secret";
  std::filesystem::remove(path);
  auto other = transport::ClusterSecret::Generate();
  EXPECT_TRUE(other.ok() && other->Write(path).ok());
  ClusterConfig c = config;
  c.secret_file = path;
  return c;
}

Result<std::unique_ptr<Pool>> ConnectTcp(const ClusterConfig& config) {
  PoolOptions o;
  o.transport = Fabric::kTcp;
  return Pool::Connect(config, o);
}

// A server in its own network namespace over TCP, with the secret `cluster up` made: a client
// with it is served; one with another cluster's secret, one without, a garbled, replayed or
// unchallenged proof and every request of a connection that did not authenticate are refused
// with the reason, executed not at all and counted; the good client is served throughout.
TEST(Access, OnlyClientsThatKnowTheSecretAreServed) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  LocalClusterOptions o = Options(1, 16 << 20, Fabric::kTcp);
  o.netns = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  const ClusterConfig config = *cluster.config();
  ASSERT_FALSE(config.secret_file.empty()) << "cluster up names a secret in the cluster file";
  struct stat st {};
  ASSERT_EQ(stat(config.secret_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the secret is its owner's only";

  auto good = Connect(cluster, Fabric::kTcp);
  ASSERT_TRUE(good);
  auto a = good->Alloc(64);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const uint64_t marker = 0x600df00d;
  ASSERT_TRUE(good->Write(*a, &marker, 8).ok());

  uint64_t refusals = 0;
  auto expect_refused = [&](const Status& s, const std::string& needle) {
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    ++refusals;
  };
  // Another cluster's secret, and none.
  auto wrong = ConnectTcp(WithAnotherSecret(config, cluster.dir()));
  ASSERT_FALSE(wrong.ok());
  expect_refused(wrong.status(), "authentication failed: wrong cluster secret");
  ClusterConfig none = config;
  none.secret_file.clear();
  auto anonymous = ConnectTcp(none);
  ASSERT_FALSE(anonymous.ok());
  expect_refused(anonymous.status(), "authentication failed: no cluster secret");

  // Raw connections: a garbled proof, the same challenge again, a proof with no challenge.
  const transport::ClusterSecret secret = SecretOf(cluster);
  RawClient raw;
  ASSERT_TRUE(raw.Open(config.servers[0]).ok());
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = 0x7777;
  auto garbled = raw.ProvedHello(secret, hello, 0x01);
  ASSERT_TRUE(garbled.ok() && garbled->opcode == wire::Opcode::kErrorReply);
  expect_refused(wire::DecodeError(*garbled), "authentication failed: wrong cluster secret");
  hello.flags |= wire::kHelloHasProof;  // the proof field still holds a proof for no challenge
  auto unchallenged = raw.Ask(wire::Encode(2, hello));
  ASSERT_TRUE(unchallenged.ok() && unchallenged->opcode == wire::Opcode::kErrorReply);
  expect_refused(wire::DecodeError(*unchallenged), "no challenge on this connection");
  // A truncated hello and garbage: malformed (rejected), and the connection stays refused.
  auto truncated = wire::Encode(3, hello);
  truncated.resize(truncated.size() - 20);
  auto t = raw.Ask(truncated);
  ASSERT_TRUE(t.ok() && t->opcode == wire::Opcode::kErrorReply);
  EXPECT_NE(wire::DecodeError(*t).message().find("HelloRequest"), std::string::npos)
      << wire::DecodeError(*t).message();
  std::vector<std::byte> garbage(48, std::byte{0x5a});
  auto g = raw.Ask(garbage);
  ASSERT_TRUE(g.ok() && g->opcode == wire::Opcode::kErrorReply);

  // Nothing of an unauthenticated connection is executed: a write into the good client's
  // object, a lease, stats, an eviction of the good client, a goodbye.
  memory_ops::RequestBuilder write;
  const uint64_t evil = 0xbad;
  write.Write(a->offset(), &evil, 8);
  std::vector<std::vector<std::byte>> requests = {
      wire::Encode(10, wire::BatchRequest{1, static_cast<uint32_t>(write.bytes().size())},
                   write.bytes()),
      wire::Encode(11, wire::LeaseRequest{4 << 20, 0, 0}), wire::Encode(12, wire::StatsRequest{0}),
      wire::Encode(13, wire::EvictRequest{good->process_tag()}),
      wire::Encode(14, wire::GoodbyeRequest{0x7777})};
  for (const auto& request : requests) {
    auto r = raw.Ask(request);
    ASSERT_TRUE(r.ok() && r->opcode == wire::Opcode::kErrorReply);
    expect_refused(wire::DecodeError(*r), "not authenticated");
  }

  // The good client is served throughout; its bytes are its own; all of it was counted.
  uint64_t back = 0;
  ASSERT_TRUE(good->Read(*a, &back, 8).ok());
  EXPECT_EQ(back, marker) << "the unauthenticated batch wrote nothing";
  ExpectServes(*good);
  auto stats = good->Stats(0);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->auth_refused, refusals);
  EXPECT_EQ(stats->rejected, 2u) << "the truncated hello and the garbage";
  EXPECT_EQ(stats->clients, 1u) << "no refused client counts as one";
}

// The client checks the server too: a server without a secret (or another cluster's) cannot
// prove it belongs to the cluster, and a client with a secret refuses it. A server without a
// secret serves clients without one (the open mode of in-process tests), and a secret file
// that others may read stops a server from starting.
TEST(Access, ClientsRefuseAServerThatCannotProveItKnowsTheSecret) {
  const std::string dir = MakeTempDir("farpool-access");
  ServerOptions so;
  so.memory = 16 << 20;
  so.chunk_size = 1 << 20;
  so.progress = ProgressMode::kEvent;
  so.fabric = Fabric::kTcp;
  auto open = MemoryServer::Start(so);
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  ClusterConfig config;
  config.transport = Fabric::kTcp;
  config.servers.push_back({0, "127.0.0.1", (*open)->port(), so.memory, 0, ""});
  auto anonymous = ConnectTcp(config);
  ASSERT_TRUE(anonymous.ok()) << anonymous.status().ToString();
  EXPECT_TRUE((*anonymous)->Alloc(64).ok());
  auto refused = ConnectTcp(WithAnotherSecret(config, dir));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("the server has no cluster secret"), std::string::npos)
      << refused.status().message();
  anonymous->reset();
  open->reset();

  const std::string readable = dir + "/readable.secret";
  ASSERT_TRUE(transport::ClusterSecret::Generate()->Write(readable).ok());
  ASSERT_EQ(chmod(readable.c_str(), 0644), 0);
  so.secret_file = readable;
  auto unsafe = MemoryServer::Start(so);
  ASSERT_FALSE(unsafe.ok());
  EXPECT_NE(unsafe.status().message().find("chmod 600"), std::string::npos)
      << unsafe.status().message();
  std::filesystem::remove_all(dir);
}

// ------------------------------------------------------------------ pools (tenants)

Result<std::unique_ptr<Pool>> ConnectPool(const std::string& dir, const std::string& name) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(PoolClusterFile(dir, name)));
  return ConnectTcp(config);
}

uint64_t PoolRefusals(Pool& pool) {
  uint64_t total = 0;
  for (uint16_t id : pool.server_ids()) {
    auto stats = pool.Stats(id);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    if (stats.ok()) total += stats->pool_refused;
  }
  return total;
}

// Two pools on two servers in network namespaces over TCP. Pool B's chunks (objects, its root
// area) and the default pool's root area are out of reach of pool A's client through every
// operation kind the servers execute: each is refused with PermissionDenied naming pool A and
// the address, executes nothing (B's bytes and words are as B left them), and is counted. A
// wrong pool credential, or a pool the cluster does not know, is refused at the hello. A pool's
// client gets no remote key, and its root area is its own.
TEST(Pools, AClientOfOnePoolCannotReachAnotherPoolsBytes) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  LocalClusterOptions o = Options(2, 32 << 20, Fabric::kTcp);
  o.netns = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  ASSERT_TRUE(AddPool(cluster.dir(), "a").ok());
  ASSERT_TRUE(AddPool(cluster.dir(), "b").ok());
  EXPECT_EQ(AddPool(cluster.dir(), "a").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(AddPool(cluster.dir(), "no/such").code(), StatusCode::kInvalidArgument);
  struct stat st {};
  ASSERT_EQ(stat((cluster.dir() + "/pools/a.secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "a pool's credential is its owner's only";

  auto a = ConnectPool(cluster.dir(), "a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = ConnectPool(cluster.dir(), "b");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Pool& pa = **a;
  Pool& pb = **b;
  auto dflt = Connect(cluster, Fabric::kTcp);
  ASSERT_TRUE(dflt);

  // Wrong credentials: B's key for pool A, A's key for a pool nobody added.
  uint64_t auth_refusals = 0;
  {
    auto config = ClusterConfig::Load(PoolClusterFile(cluster.dir(), "a"));
    ASSERT_TRUE(config.ok());
    ClusterConfig wrong = *config;
    wrong.secret_file = cluster.dir() + "/pools/b.secret";
    auto refused = ConnectTcp(wrong);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
    EXPECT_NE(refused.status().message().find("wrong credential for pool 'a'"), std::string::npos)
        << refused.status().message();
    ClusterConfig unknown = *config;
    unknown.pool = "c";
    auto nobody = ConnectTcp(unknown);
    ASSERT_FALSE(nobody.ok());
    EXPECT_NE(nobody.status().message().find("wrong credential for pool 'c'"), std::string::npos)
        << nobody.status().message();
    auth_refusals += 2 * config->servers.size();  // each refused by every server's hello
  }

  // Keys only for the default pool; roots of their own.
  for (uint16_t id : pa.server_ids()) {
    EXPECT_EQ(pa.AccessPath(id), "messages");
    EXPECT_NE(pa.RootArea(id), Pool::Root(id));
    EXPECT_NE(pa.RootArea(id), pb.RootArea(id));
    EXPECT_EQ(dflt->RootArea(id), Pool::Root(id));
  }
  uint64_t zero = 1;
  ASSERT_TRUE(pa.Read(pa.RootArea(0), &zero, 8).ok());
  EXPECT_EQ(zero, 0u) << "a new pool's root area starts zeroed";

  // B's objects on both servers and its root; A's own object (for mixed batches).
  const uint64_t kMarker = 0xb0b0b0b0b0b0b0b0ull;
  std::vector<GlobalAddress> theirs;
  for (uint16_t id : pb.server_ids()) {
    auto x = pb.Alloc(4096, Placement::OnServer(id));
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    std::vector<uint64_t> words(512, kMarker);
    ASSERT_TRUE(pb.Write(*x, words.data(), 4096).ok());
    theirs.push_back(*x);
  }
  ASSERT_TRUE(pb.Write(pb.RootArea(0), &kMarker, 8).ok());
  theirs.push_back(pb.RootArea(0));
  auto mine = pa.Alloc(4096, Placement::OnServer(0));
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();

  uint64_t refusals = 0;
  auto expect_denied = [&](const Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << what << ": " << s.ToString();
    EXPECT_NE(s.message().find("pool 'a' may not touch offset"), std::string::npos)
        << what << ": " << s.message();
    ++refusals;
  };
  const LookupSpec spec{64, 8, 3, 56};
  for (GlobalAddress t : theirs) {
    const std::string at = t.ToString();
    uint64_t word = 0;
    expect_denied(pa.Read(t, &word, 8), "read " + at);
    expect_denied(pa.Write(t, &word, 8), "write " + at);
    expect_denied(pa.CompareAndSwap(t, kMarker, 1).status(), "cas " + at);
    expect_denied(pa.FetchAdd(t, 1).status(), "fetch-add " + at);
    {
      Batch batch(pa);
      std::vector<uint8_t> record(64);
      LookupResult found;
      ASSERT_TRUE(batch.LookupRead(t, spec, kMarker, record.data(), 64, &found).ok());
      expect_denied(batch.Wait(), "lookup-read " + at);
    }
    {
      Batch batch(pa);
      InsertResult inserted;
      ASSERT_TRUE(batch.InsertIfAbsent(t, spec, 0, 0x11, 5, 6, &inserted).ok());
      expect_denied(batch.Wait(), "insert-if-absent " + at);
    }
    {
      Batch batch(pa);
      WaitSpec ws;
      ws.wait = std::chrono::microseconds(1000);
      WaitCasResult waited;
      ASSERT_TRUE(batch.WaitCompareAndSwap(t, kMarker, 1, ws, &waited).ok());
      expect_denied(batch.Wait(), "wait-cas " + at);
    }
    if (t.server() == 0) {
      // A batch of A's own write and one read of B's: refused whole, its own write not done.
      Batch batch(pa);
      const uint64_t seven = 7;
      ASSERT_TRUE(batch.Write(*mine, &seven, 8).ok());
      ASSERT_TRUE(batch.Read(t, &word, 8).ok());
      expect_denied(batch.Wait(), "batch " + at);
      uint64_t back = 1;
      ASSERT_TRUE(pa.Read(*mine, &back, 8).ok());
      EXPECT_EQ(back, 0u) << "nothing of a refused batch is executed";
    }
  }
  // The default pool's root area, and the default pool's client at B's bytes.
  uint64_t word = 0;
  expect_denied(pa.Read(Pool::Root(0), &word, 8), "read of the default root");
  {
    Status s = dflt->Read(theirs[0], &word, 8);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
    EXPECT_NE(s.message().find("the default pool may not touch offset"), std::string::npos)
        << s.message();
    ++refusals;
  }
  // A lookup in A's own bucket whose entry points into B's object: the chain is not followed
  // there (nothing of B's is read), and it counts.
  {
    std::vector<uint64_t> bucket(8, 0);
    bucket[1] = 5;                // key
    bucket[2] = theirs[0].raw();  // value: B's object on server 0
    ASSERT_TRUE(pa.Write(*mine, bucket.data(), 64).ok());
    Batch batch(pa);
    std::vector<uint64_t> record(8, 0);
    LookupResult found;
    ASSERT_TRUE(batch.LookupRead(*mine, spec, 5, record.data(), 64, &found).ok());
    (void)batch.Wait();  // whatever the client makes of "out of bounds"
    EXPECT_NE(found.outcome, LookupResult::Outcome::kFound);
    EXPECT_EQ(record, std::vector<uint64_t>(8, 0)) << "none of B's bytes";
    ++refusals;
  }

  // Leases: A releasing B's root chunk (raw, with A's credential, as any program could).
  {
    const transport::ClusterSecret key = SecretOf(cluster).DerivePool("a");
    RawClient raw;
    auto config = cluster.config();
    ASSERT_TRUE(config.ok());
    ASSERT_TRUE(raw.Open(config->servers[0]).ok());
    wire::HelloRequest hello{};
    hello.client_pid = static_cast<uint64_t>(getpid());
    hello.client_nonce = 0x5151;
    std::memcpy(hello.pool, "a", 1);
    auto proved = raw.ProvedHello(key, hello);
    ASSERT_TRUE(proved.ok() && proved->opcode == wire::Opcode::kHelloReply);
    const auto reply = proved->As<wire::HelloReply>();
    EXPECT_TRUE(reply.flags & wire::kHelloPoolClient);
    EXPECT_EQ(reply.rkey_size, 0u) << "no remote key for a pool's client";
    EXPECT_EQ(reply.root_offset + Pool::Root(0).offset(), pa.RootArea(0).offset());
    const uint64_t root_b = pb.RootArea(0).offset() - Pool::Root(0).offset();
    auto released = raw.Ask(wire::Encode(20, wire::ReleaseRequest{root_b, reply.chunk_size, 0, 0}));
    ASSERT_TRUE(released.ok() && released->opcode == wire::Opcode::kErrorReply);
    expect_denied(wire::DecodeError(*released), "release of B's root");
    // Its own lease and release work.
    auto leased = raw.Ask(wire::Encode(21, wire::LeaseRequest{reply.chunk_size, 0, 0}));
    ASSERT_TRUE(leased.ok() && leased->opcode == wire::Opcode::kLeaseReply);
    const uint64_t got = leased->As<wire::LeaseReply>().offset;
    auto freed = raw.Ask(wire::Encode(22, wire::ReleaseRequest{got, reply.chunk_size, 0, 0}));
    ASSERT_TRUE(freed.ok() && freed->opcode == wire::Opcode::kReleaseReply);
    auto backup = raw.Ask(wire::Encode(23, wire::BackupRequest{1, 0, 0, {}}));
    ASSERT_TRUE(backup.ok() && backup->opcode == wire::Opcode::kErrorReply);
    EXPECT_EQ(wire::DecodeError(*backup).code(), StatusCode::kPermissionDenied);
    ++refusals;
  }

  // B's bytes are as B left them; every refusal was counted, the hellos' with authentication.
  for (size_t i = 0; i < theirs.size(); ++i) {
    uint64_t back = 0;
    ASSERT_TRUE(pb.Read(theirs[i], &back, 8).ok());
    EXPECT_EQ(back, kMarker) << theirs[i].ToString();
  }
  std::vector<uint64_t> words(512);
  ASSERT_TRUE(pb.Read(theirs[0], words.data(), 4096).ok());
  EXPECT_EQ(words, std::vector<uint64_t>(512, kMarker));
  EXPECT_EQ(PoolRefusals(pb), refusals);
  uint64_t auth = 0;
  for (uint16_t id : pb.server_ids()) auth += pb.Stats(id)->auth_refused;
  EXPECT_EQ(auth, auth_refusals);
  ExpectServes(pa);
  ExpectServes(pb);
}

// Captures every frame that crosses an interface (AF_PACKET) until stopped.
class Capture {
 public:
  explicit Capture(const std::string& interface) {
    fd_ = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd_ < 0) return;
    sockaddr_ll addr{};
    addr.sll_family = AF_PACKET;
    addr.sll_protocol = htons(ETH_P_ALL);
    addr.sll_ifindex = static_cast<int>(if_nametoindex(interface.c_str()));
    timeval tv{0, 100 * 1000};
    if (addr.sll_ifindex == 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
      close(fd_);
      fd_ = -1;
      return;
    }
    thread_ = std::thread([this] {
      std::vector<char> frame(1 << 16);
      while (!stop_.load()) {
        const ssize_t n = recv(fd_, frame.data(), frame.size(), 0);
        if (n > 0) bytes_.append(frame.data(), static_cast<size_t>(n));
      }
    });
  }
  bool ok() const { return fd_ >= 0; }
  // Stops capturing; returns every frame captured, concatenated.
  std::string Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return bytes_;
  }
  ~Capture() { Stop(); }

 private:
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::string bytes_;
};

std::string ReadProcFile(pid_t pid, const char* name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + name, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The secret never travels: every frame between a client and a server in its network
// namespace, from the first hello to the goodbye, is captured on the bridge, and neither the
// secret's bytes nor its hex text are in them; nor in the servers' command lines or
// environments, which /proc shows to every user.
TEST(Access, TheSecretIsNeverOnTheWireNorInProc) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces and packet capture need root";
  LocalClusterOptions o = Options(2, 16 << 20, Fabric::kTcp);
  o.netns = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  const ClusterConfig config = *cluster.config();
  std::ifstream in(config.secret_file);
  std::string hex;
  ASSERT_TRUE(std::getline(in, hex));
  ASSERT_EQ(hex.size(), 64u);
  std::string raw;
  for (size_t i = 0; i < 32; ++i)
    raw.push_back(static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16)));

  // The bridge of the cluster's namespaces: fp<tag>s<i> -> fp<tag>br.
  const std::string& ns = config.servers[0].netns;
  const std::string bridge = ns.substr(0, ns.rfind('s')) + "br";
  Capture capture(bridge);
  ASSERT_TRUE(capture.ok()) << "cannot capture on " << bridge << ": " << std::strerror(errno);
  {
    auto pool = Connect(cluster, Fabric::kTcp);
    ASSERT_TRUE(pool);
    std::thread second([&] { ExpectServes(*pool); });  // a second thread: its own hellos
    second.join();
    ExpectServes(*pool);
    EXPECT_TRUE(pool->Stats(1).ok());
  }
  const std::string wire = capture.Stop();
  // Control messages are far smaller than a TCP segment: each frame holds whole messages.
  EXPECT_NE(wire.find("FPW1"), std::string::npos)
      << "the capture saw the control messages (" << wire.size() << " bytes)";
  EXPECT_EQ(wire.find(raw), std::string::npos) << "the secret's bytes are on the wire";
  EXPECT_EQ(wire.find(hex), std::string::npos) << "the secret's text is on the wire";

  for (const ServerAddress& s : config.servers) {
    const std::string cmdline = ReadProcFile(static_cast<pid_t>(s.pid), "cmdline");
    ASSERT_FALSE(cmdline.empty()) << "server " << s.id;
    EXPECT_NE(cmdline.find("--secret-file"), std::string::npos) << "a path, not the secret";
    EXPECT_EQ(cmdline.find(hex), std::string::npos) << "server " << s.id;
    const std::string environ = ReadProcFile(static_cast<pid_t>(s.pid), "environ");
    EXPECT_EQ(environ.find(hex), std::string::npos) << "server " << s.id;
    EXPECT_EQ(environ.find(raw), std::string::npos) << "server " << s.id;
  }
}

// --delay puts netem on both ends of every server's link. Kernels built without netem get a
// clear error and no half-made cluster.
TEST(NetworkNamespaces, LinkDelayIsAppliedOrRefusedClearly) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  LocalClusterOptions o = Options(1, 16 << 20, Fabric::kTcp);
  o.netns = true;
  o.delay = 20us;
  TestCluster cluster(o);
  if (!cluster.status().ok()) {
    EXPECT_NE(cluster.status().message().find("netem"), std::string::npos)
        << cluster.status().ToString();
    return;
  }
  auto config = *cluster.config();
  FILE* p = popen(("ip netns exec " + config.servers[0].netns + " tc qdisc show").c_str(), "r");
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  pclose(p);
  EXPECT_NE(out.find("netem"), std::string::npos) << out;
  auto pool = Connect(cluster, Fabric::kTcp);
  ASSERT_TRUE(pool);
  EXPECT_TRUE(pool->Alloc(64).ok());
}

}  // namespace
}  // namespace farpool

int main(int argc, char** argv) {
  const char* role = getenv("FARPOOL_WORKER");
  if (role != nullptr) {
    farpool::Status s = farpool::RunWorker(role);
    if (!s.ok()) std::fprintf(stderr, "worker %s: %s\n", role, s.ToString().c_str());
    return s.ok() ? 0 : 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
