// Replication with real processes (docs/pool.md "Replication"): `farpool cluster up
// --replicas 1` servers, one of them SIGKILLed or fenced while client threads change memory.
// The invariants: every change a client saw acknowledged reads back afterwards, from the
// backup that took the dead server's data over; a change whose outcome the client could not
// learn (in flight at the kill) is either wholly there or not; fetch-and-add totals lie between
// the acknowledged and the attempted count; a primary whose backup took over acknowledges
// nothing more.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/process.h"
#include "coord/cluster_map.h"
#include "farpool/pool.h"
#include "pool/control_client.h"
#include "pool/memory_ops.h"
#include "pool/test_cluster.h"
#include "transport/auth.h"
#include "transport/wire.h"

namespace farpool {
namespace {

using namespace std::chrono_literals;

constexpr int kServers = 3;
constexpr uint64_t kObjectSize = 256;
constexpr int kObjectsPerServer = 16;
constexpr int kThreads = 2;

LocalClusterOptions Replicated(Fabric fabric) {
  LocalClusterOptions o;
  o.servers = kServers;
  o.memory = 64 << 20;
  o.transport = fabric;
  o.progress = ProgressMode::kEvent;
  o.replicas = 1;
  return o;
}

// Writes `value` at `address` until it succeeds (the client follows a killed server's data to
// its backup) or 30 s pass; every failure on the way is Unavailable or TimedOut. Returns the
// last status.
Status WriteUntilFollowed(Pool& pool, GlobalAddress address, uint64_t value) {
  Status wrote = Status::Unavailable("not tried");
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!wrote.ok() && std::chrono::steady_clock::now() < deadline) {
    wrote = pool.Write(address, &value, 8);
    if (!wrote.ok()) {
      EXPECT_TRUE(wrote.code() == StatusCode::kUnavailable || wrote.code() == StatusCode::kTimedOut)
          << wrote.ToString();
      std::this_thread::sleep_for(50ms);
    }
  }
  return wrote;
}

std::vector<uint8_t> Pattern(uint64_t seed) {
  std::vector<uint8_t> bytes(kObjectSize);
  std::mt19937_64 rng(seed);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// One object's history as its (only) writer saw it.
struct ObjectLog {
  GlobalAddress address;
  uint64_t acknowledged = 0;      // seed of the last write that returned Ok (0: none)
  std::vector<uint64_t> unknown;  // seeds of later writes that failed (outcome unknown)
};

struct Param {
  Fabric fabric;
  int victim;
  // Servers in network namespaces of their own (a real network stack between them).
  bool netns = false;
  // The only server whose objects and counter the clients change; -1: every server. With the
  // victim its backup, the kill is a backup's under writes: the primary must go on alone.
  int target = -1;
  int servers = kServers;
  int replicas = 1;
  // A second victim (-1: none), SIGKILLed at the same moment as the first (`together`), or
  // once the first's failover and re-replication are done (every region served by a live
  // server with f = replicas backups again, in etcd's map).
  int second = -1;
  bool together = true;
  // A third victim (-1: none), SIGKILLed at the same moment as the second.
  int third = -1;
};

// What the test saw wrong in one of etcd's maps (empty: nothing): a region whose backups name
// its own server or one server twice, or a dead server named as a backup (or serving) in a map
// where it serves no region any more (every region it served failed over) or in any later one
// (`dead`: the servers killed so far; `failed_over`: those seen so, kept across calls).
std::string MapFault(const coord::ClusterMap& map, const std::set<uint16_t>& dead,
                     std::set<uint16_t>* failed_over) {
  for (uint16_t d : dead) {
    if (std::none_of(map.servers.begin(), map.servers.end(),
                     [&](const coord::MapServer& m) { return m.served_by == d; })) {
      failed_over->insert(d);
    }
  }
  for (const coord::MapServer& m : map.servers) {
    std::set<uint16_t> seen{m.served_by};
    for (const coord::MapServer::Backup& b : m.Backups()) {
      if (!seen.insert(b.id).second) {
        return "epoch " + std::to_string(map.epoch) + ": server " + std::to_string(m.id) +
               "'s region names server " + std::to_string(b.id) + " twice: " + map.ToJson();
      }
    }
    for (uint16_t id : seen) {
      if (failed_over->contains(id)) {
        return "epoch " + std::to_string(map.epoch) + ": server " + std::to_string(m.id) +
               "'s region names server " + std::to_string(id) +
               ", dead and failed over: " + map.ToJson();
      }
    }
  }
  return "";
}

class ReplicationTest : public ::testing::TestWithParam<Param> {};

// Client threads write patterns into their own objects on every server (or on the target
// only) and add to one counter per server; the victim is SIGKILLed half-way; the threads go on
// until each has had 200 acknowledged operations after the kill. Then every object holds its
// last acknowledged pattern or one of the patterns written after it whose outcome was unknown,
// every counter lies between the acknowledged and the attempted additions, and every failure
// was a clear Unavailable (or TimedOut). A target whose backup was the victim still serves its own
// data (degraded to one copy), not failed over.
TEST_P(ReplicationTest, EveryAcknowledgedChangeSurvivesTheKillOfItsServer) {
  const Param p = GetParam();
  LocalClusterOptions options = Replicated(p.fabric);
  options.netns = p.netns;
  options.servers = p.servers;
  options.replicas = p.replicas;
  TestCluster cluster(options);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_EQ(client->config.replicas, p.replicas);
  Pool& pl = *client->pool;

  std::vector<GlobalAddress> counters;
  std::vector<ObjectLog> objects;
  for (int s = 0; s < p.servers; ++s) {
    if (p.target >= 0 && s != p.target) continue;
    auto c = pl.Alloc(8, Placement::OnServer(static_cast<uint16_t>(s)));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const uint64_t zero = 0;
    ASSERT_TRUE(pl.Write(*c, &zero, 8).ok());
    counters.push_back(*c);
    for (int i = 0; i < kObjectsPerServer; ++i) {
      auto a = pl.Alloc(kObjectSize, Placement::OnServer(static_cast<uint16_t>(s)));
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      objects.push_back({*a, 0, {}});
    }
  }
  // Set once every victim is killed: the threads count their operations from then on.
  std::atomic<bool> killed{false};
  // Set when an assertion ends the test early: the threads stop (else their std::thread would
  // end the process, leaving the cluster's namespaces behind).
  std::atomic<bool> stop{false};
  std::vector<std::vector<uint64_t>> acked_adds(kThreads, std::vector<uint64_t>(counters.size()));
  std::vector<std::vector<uint64_t>> unknown_adds(kThreads, std::vector<uint64_t>(counters.size()));
  std::vector<uint64_t> failures(kThreads);
  std::vector<std::string> first_error(kThreads), unclear(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      int after_kill = 0;
      const auto give_up = std::chrono::steady_clock::now() + 90s;
      while (after_kill < 200 && !stop && std::chrono::steady_clock::now() < give_up) {
        // Thread t owns the objects i with i % kThreads == t.
        const size_t i = (rng() % (objects.size() / kThreads)) * kThreads + t;
        const int server = static_cast<int>(rng() % counters.size());
        Status st;
        if (rng() % 2 == 0) {
          const uint64_t seed = rng() | 1;
          st = pl.Write(objects[i].address, Pattern(seed).data(), kObjectSize);
          if (st.ok()) {
            objects[i].acknowledged = seed;
            objects[i].unknown.clear();
          } else {
            objects[i].unknown.push_back(seed);
          }
        } else {
          auto prev = pl.FetchAdd(counters[server], 1);
          st = prev.status();
          (st.ok() ? acked_adds : unknown_adds)[t][server]++;
        }
        if (!st.ok()) {
          ++failures[t];
          if (st.code() != StatusCode::kUnavailable && st.code() != StatusCode::kTimedOut)
            unclear[t] = st.ToString();
          if (first_error[t].empty()) first_error[t] = st.ToString();
          std::this_thread::sleep_for(10ms);
        } else if (killed) {
          ++after_kill;
        }
      }
    });
  }
  // Every map etcd holds while the test runs is checked (MapFault), the last one after the
  // threads are done.
  std::mutex dead_mu;
  std::set<uint16_t> dead;
  std::atomic<bool> done{false};
  std::set<uint16_t> failed_over;
  std::string map_fault;
  int64_t maps_seen = 0;
  auto check_map = [&] {
    auto view = ClusterEtcdStatus(cluster.dir());
    if (!view.ok()) return;
    ++maps_seen;
    std::lock_guard lock(dead_mu);
    if (map_fault.empty()) map_fault = MapFault(view->map, dead, &failed_over);
  };
  std::thread map_checker([&] {
    while (!done) {
      check_map();
      std::this_thread::sleep_for(50ms);
    }
    check_map();
  });
  struct JoinAll {
    std::atomic<bool>& stop;
    std::atomic<bool>& done;
    std::vector<std::thread>& threads;
    std::thread& checker;
    ~JoinAll() {
      stop = true;
      done = true;
      for (auto& th : threads) {
        if (th.joinable()) th.join();
      }
      if (checker.joinable()) checker.join();
    }
  } join_all{stop, done, threads, map_checker};
  std::this_thread::sleep_for(1s);
  auto kill_server = [&](int id) {
    {
      std::lock_guard lock(dead_mu);
      dead.insert(static_cast<uint16_t>(id));
    }
    return kill(static_cast<pid_t>(client->config.servers[id].pid), SIGKILL);
  };
  ASSERT_EQ(kill_server(p.victim), 0);
  if (p.second >= 0 && p.together) {
    ASSERT_EQ(kill_server(p.second), 0);
  }
  if (p.second >= 0 && !p.together) {
    // The failover, then re-replication: every region served by a live server, with f
    // backups, none of them the victim.
    const auto deadline = std::chrono::steady_clock::now() + 90s;
    bool recovered = false;
    std::string last;
    while (!recovered && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(50ms);
      auto view = ClusterEtcdStatus(cluster.dir());
      if (!view.ok()) continue;
      last = view->map.ToJson();
      recovered = std::all_of(
          view->map.servers.begin(), view->map.servers.end(), [&](const coord::MapServer& m) {
            const std::vector<coord::MapServer::Backup> backups = m.Backups();
            return m.served_by != p.victim && static_cast<int>(backups.size()) >= p.replicas &&
                   std::none_of(backups.begin(), backups.end(),
                                [&](const auto& b) { return b.id == p.victim; });
          });
    }
    ASSERT_TRUE(recovered) << "the first victim's failover and re-replication to " << p.replicas
                           << " backups did not finish; the map: " << last;
    ASSERT_EQ(kill_server(p.second), 0);
    if (p.third >= 0) {
      ASSERT_EQ(kill_server(p.third), 0);
    }
  }
  killed = true;
  for (auto& th : threads) th.join();
  done = true;
  map_checker.join();
  EXPECT_EQ(map_fault, "") << "after " << maps_seen << " maps";

  uint64_t all_failures = 0;
  for (int t = 0; t < kThreads; ++t) {
    all_failures += failures[t];
    EXPECT_EQ(unclear[t], "") << "a failure that is not a clear Unavailable or TimedOut";
  }
  // Only operations in flight at the kill may fail: a handful, not the run.
  EXPECT_LE(all_failures, p.second >= 0 ? 40u : 20u) << first_error[0] << " / " << first_error[1];
  for (const ObjectLog& o : objects) {
    std::vector<uint8_t> got(kObjectSize);
    ASSERT_TRUE(pl.Read(o.address, got.data(), kObjectSize).ok()) << o.address.ToString();
    bool match = o.acknowledged == 0 ? got == std::vector<uint8_t>(kObjectSize, 0)
                                     : got == Pattern(o.acknowledged);
    for (uint64_t seed : o.unknown) match = match || got == Pattern(seed);
    EXPECT_TRUE(match) << "object " << o.address.ToString()
                       << " holds neither its last acknowledged write nor a later one";
  }
  for (size_t s = 0; s < counters.size(); ++s) {
    uint64_t value = 0, acked = 0, unknown = 0;
    ASSERT_TRUE(pl.Read(counters[s], &value, 8).ok());
    for (int t = 0; t < kThreads; ++t) {
      acked += acked_adds[t][s];
      unknown += unknown_adds[t][s];
    }
    EXPECT_GE(value, acked) << "server " << s << "'s counter lost acknowledged additions";
    EXPECT_LE(value, acked + unknown) << "server " << s << "'s counter gained additions";
  }
  // The dead servers' addresses now go to their backups.
  EXPECT_FALSE(pl.Stats(static_cast<uint16_t>(p.victim)).ok());
  if (p.second >= 0) {
    EXPECT_FALSE(pl.Stats(static_cast<uint16_t>(p.second)).ok());
  }
  if (p.third >= 0) {
    EXPECT_FALSE(pl.Stats(static_cast<uint16_t>(p.third)).ok());
  }
  if (p.target >= 0 && p.target != p.victim) {
    EXPECT_TRUE(pl.Stats(static_cast<uint16_t>(p.target)).ok())
        << "server " << p.target << " lost its backup, not its data: it serves on";
  }
}

INSTANTIATE_TEST_SUITE_P(Victims, ReplicationTest,
                         ::testing::Values(Param{Fabric::kTcp, 0}, Param{Fabric::kTcp, 1},
                                           Param{Fabric::kTcp, 2}, Param{Fabric::kShm, 1},
                                           // server 2 is server 1's backup
                                           Param{Fabric::kTcp, 2, true, 1},
                                           // --replicas 2 over 4 servers: server 1 and its
                                           // first backup at once (the second backup, server
                                           // 3, takes region 1 over), and one after the other
                                           Param{Fabric::kTcp, 1, true, -1, 4, 2, 2, true},
                                           Param{Fabric::kTcp, 1, true, -1, 4, 2, 2, false},
                                           // --replicas 2 over 5 servers: server 1, then once
                                           // every region has 2 backups again, servers 2 and 3
                                           // at once: region 1, served by 2, lives on at its
                                           // second restored backup only (with one restored
                                           // backup, 3, it would be lost)
                                           Param{Fabric::kTcp, 1, true, -1, 5, 2, 2, false, 3}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const Param& p = info.param;
                           std::string name = std::string(FabricName(p.fabric)) +
                                              (p.netns ? "_netns" : "") + "_server" +
                                              std::to_string(p.victim);
                           if (p.second >= 0) {
                             name += (p.together ? "_and_" : "_then_") + std::to_string(p.second) +
                                     (p.third >= 0 ? "_and_" + std::to_string(p.third) : "") +
                                     "_replicas" + std::to_string(p.replicas);
                           }
                           return name +
                                  (p.target >= 0 ? "_backup_of_" + std::to_string(p.target) : "");
                         });

// A connection to `address`'s port `port` (0: its clients' port) with the cluster's secret, as
// a client would open it.
Result<std::unique_ptr<control::Connection>> Open(const ClusterConfig& config,
                                                  const ServerAddress& address, uint16_t port,
                                                  const transport::ClusterSecret& secret) {
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = 0x5eed0001;
  control::Connection::Options o{"server " + std::to_string(address.id),
                                 address.host,
                                 port != 0 ? port : address.port,
                                 &secret,
                                 Fabric::kTcp,
                                 3000ms};
  return control::Connection::Open(o, hello);
}

// Runs `command` (argv) and returns its standard output.
std::string Output(const std::string& command) {
  std::string out;
  if (FILE* f = popen(command.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    pclose(f);
  }
  return out;
}

// A client that still has the map of epoch 1 sends a write of `value` to `offset` (WriteAt) or
// a compare-and-swap there (CasAt: the previous value) straight to a server, as one batch on a
// connection of its own.
Status WriteAt(control::Connection& c, uint64_t offset, uint64_t value) {
  memory_ops::RequestBuilder b;
  b.Write(offset, &value, 8);
  return c
      .Call(
          [&](uint64_t id) {
            return wire::Encode(
                id, wire::BatchRequest{b.op_count(), static_cast<uint32_t>(b.bytes().size())},
                b.bytes());
          },
          wire::Opcode::kBatchReply)
      .status();
}
Result<uint64_t> CasAt(control::Connection& c, uint64_t offset, uint64_t expected,
                       uint64_t desired) {
  memory_ops::RequestBuilder b;
  b.CompareAndSwap(offset, expected, desired);
  FARPOOL_ASSIGN_OR_RETURN(
      control::Reply reply,
      c.Call(
          [&](uint64_t id) {
            return wire::Encode(
                id, wire::BatchRequest{b.op_count(), static_cast<uint32_t>(b.bytes().size())},
                b.bytes());
          },
          wire::Opcode::kBatchReply));
  if (reply.message.tail.size() != 8) {
    return Status::Protocol("a CAS's reply of " + std::to_string(reply.message.tail.size()) +
                            " bytes");
  }
  uint64_t previous = 0;
  std::memcpy(&previous, reply.message.tail.data(), 8);
  return previous;
}

// Sets every link but lo of network namespace `ns` up or down: cuts a server off.
void SetLinks(const std::string& ns, bool up) {
  std::istringstream links(Output("ip -n " + ns + " -o link show"));
  std::string line;
  while (std::getline(links, line)) {
    // "2: fp1234p1@if7: <...>": the name is the second field, up to '@' or ':'.
    const size_t start = line.find(": ") + 2;
    const std::string name = line.substr(start, line.find_first_of("@:", start) - start);
    if (name == "lo") continue;
    const std::string cmd =
        "ip -n " + ns + " link set dev " + name + (up ? " up" : " down") + " 2>&1";
    ASSERT_EQ(Output(cmd), "") << cmd;
  }
}

// A primary cut off from everyone (its link down, servers in their own network namespaces):
// its lease with the backup lapses so it stops serving; a client fails it over to the backup
// and goes on with the acknowledged bytes; when the link comes back, a client that was idle
// through the cut reads the new value (never the old primary's stale copy), the old primary
// learns it was fenced (its backup refuses its renewal) and ends, and a new client that
// connects then finds the data at the backup. Fencing is proven by a write: once the map's
// epoch has moved, a client that still has the old map sends a write and a compare-and-swap
// (expecting the old primary's stale value) straight to the old primary as soon as its link is
// back; both are refused (or the old primary is gone), and the new primary's bytes are
// unchanged. The same requests were served before the cut.
TEST(Replication, APartitionedPrimaryIsFencedAndTheClientsFollowTheData) {
  LocalClusterOptions o = Replicated(Fabric::kTcp);
  o.netns = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  PoolOptions po;
  po.failure_timeout = 2000ms;  // above the primaries' wait for a backup (1 s)
  po.op_timeout = 3000ms;
  auto pool = Pool::Connect(*config, po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto a = (*pool)->Alloc(64, Placement::OnServer(1));
  ASSERT_TRUE(a.ok());
  const uint64_t before = 0x1111, after = 0x2222;
  ASSERT_TRUE((*pool)->Write(*a, &before, 8).ok());
  // A second client that read the value before the cut and stays idle through it: the first
  // read it makes once the link is back (the old primary reachable again, maybe not yet told
  // it was fenced) must not return the old value.
  auto reader = Pool::Connect(*config, po);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  uint64_t seen = 0;
  ASSERT_TRUE((*reader)->Read(*a, &seen, 8).ok());
  ASSERT_EQ(seen, before);
  // The old map's client: its requests are served while server 1 is the primary.
  auto secret = transport::ClusterSecret::Read(config->secret_file);
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  {
    auto stale = Open(*config, config->servers[1], 0, *secret);
    ASSERT_TRUE(stale.ok()) << stale.status().ToString();
    Status w = WriteAt(**stale, a->offset(), before);
    ASSERT_TRUE(w.ok()) << w.ToString();
    auto cas = CasAt(**stale, a->offset(), before, before);
    ASSERT_TRUE(cas.ok()) << cas.status().ToString();
    ASSERT_EQ(*cas, before);
  }

  SetLinks(config->servers[1].netns, false);
  Status wrote = Status::Unavailable("not tried");
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  int failures = 0;
  while (!wrote.ok() && std::chrono::steady_clock::now() < deadline) {
    wrote = (*pool)->Write(*a, &after, 8);
    if (!wrote.ok()) {
      ++failures;
      EXPECT_TRUE(wrote.code() == StatusCode::kUnavailable || wrote.code() == StatusCode::kTimedOut)
          << wrote.ToString();
      if (failures < 5)
        std::fprintf(stderr, "write during the cut: %s\n", wrote.ToString().c_str());
    }
  }
  ASSERT_TRUE(wrote.ok()) << wrote.ToString();
  EXPECT_GE(failures, 1) << "the write in flight at the cut cannot have been acknowledged";
  uint64_t got = 0;
  ASSERT_TRUE((*pool)->Read(*a, &got, 8).ok());
  EXPECT_EQ(got, after);

  auto moved = ClusterEtcdStatus(cluster.dir());
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_GE(moved->map.epoch, 2) << "the failover moved the epoch";
  EXPECT_EQ(moved->map.Find(1)->served_by, 2) << "server 1's region is served by its backup";

  SetLinks(config->servers[1].netns, true);
  {
    // At once, before the old primary may have learnt it was fenced: refused, whether by its
    // lapsed serving lease, by the fence, or because it is gone.
    const uint64_t stale_write = 0x3333, stale_swap = 0x4444;
    auto stale = Open(*config, config->servers[1], 0, *secret);
    if (!stale.ok()) {
      std::fprintf(stderr, "the old primary after the cut: %s\n",
                   stale.status().ToString().c_str());
    } else {
      Status w = WriteAt(**stale, a->offset(), stale_write);
      EXPECT_FALSE(w.ok()) << "the fenced old primary acknowledged a write";
      std::fprintf(stderr, "a write to the old primary after the cut: %s\n", w.ToString().c_str());
      auto cas = CasAt(**stale, a->offset(), before, stale_swap);
      EXPECT_FALSE(cas.ok()) << "the fenced old primary served a CAS (previous "
                             << (cas.ok() ? *cas : 0) << ")";
      std::fprintf(stderr, "a CAS at the old primary after the cut: %s\n",
                   cas.status().ToString().c_str());
    }
    ASSERT_TRUE((*pool)->Read(*a, &got, 8).ok());
    EXPECT_EQ(got, after) << "the new primary's bytes changed";
  }
  // Until the old primary has learnt it was fenced it refuses (it has not heard from its
  // backup for longer than its lease); then its process ends and the reader follows the data.
  Status read = Status::Unavailable("not tried");
  const auto read_by = std::chrono::steady_clock::now() + 20s;
  while (!read.ok() && std::chrono::steady_clock::now() < read_by) {
    read = (*reader)->Read(*a, &seen, 8);
    if (read.ok()) {
      EXPECT_EQ(seen, after) << "a client read the partitioned old primary's stale copy";
    } else {
      EXPECT_TRUE(read.code() == StatusCode::kUnavailable || read.code() == StatusCode::kTimedOut)
          << read.ToString();
      std::this_thread::sleep_for(50ms);
    }
  }
  EXPECT_TRUE(read.ok()) << read.ToString();
  const pid_t old_primary = static_cast<pid_t>(config->servers[1].pid);
  const auto gone_by = std::chrono::steady_clock::now() + 10s;
  while (ProcessRunning(old_primary) && std::chrono::steady_clock::now() < gone_by) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_FALSE(ProcessRunning(old_primary)) << "the fenced primary still runs";
  auto fresh = Pool::Connect(*config, po);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_TRUE((*fresh)->Read(*a, &got, 8).ok());
  EXPECT_EQ(got, after) << "a new client reads what the failed-over client wrote";
}

// Pools (docs/pool.md "Pools") survive a failover: the primary forwards every lease with its
// owning pool and every pool's root, so once server 1 is SIGKILLed and its backup serves its
// data, pool A's client still reads and writes its own object there and is refused B's
// (PermissionDenied, counted by the backup), B's bytes and root area are intact, and a client
// of B that connects only after the failover finds its root area in the mirror. Before the
// kill, A's client cannot forge a forward on the backup's mirror port.
TEST(Replication, PoolsStayIsolatedAcrossAFailover) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  LocalClusterOptions o = Replicated(Fabric::kTcp);
  o.netns = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  ASSERT_TRUE(AddPool(cluster.dir(), "a").ok());
  ASSERT_TRUE(AddPool(cluster.dir(), "b").ok());
  PoolOptions po;
  po.transport = Fabric::kTcp;
  po.op_timeout = 5000ms;
  auto connect = [&](const char* name) {
    auto config = ClusterConfig::Load(PoolClusterFile(cluster.dir(), name));
    EXPECT_TRUE(config.ok()) << config.status().ToString();
    return Pool::Connect(*config, po);
  };
  auto a = connect("a");
  auto b = connect("b");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  auto mine = (*a)->Alloc(64, Placement::OnServer(1));
  auto theirs = (*b)->Alloc(64, Placement::OnServer(1));
  ASSERT_TRUE(mine.ok() && theirs.ok());
  const uint64_t kA = 0xaaaa, kB = 0xbbbb, kRoot = 0xb007;
  ASSERT_TRUE((*a)->Write(*mine, &kA, 8).ok());
  ASSERT_TRUE((*b)->Write(*theirs, &kB, 8).ok());
  ASSERT_TRUE((*b)->Write((*b)->RootArea(1), &kRoot, 8).ok());

  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  {
    // A pool's client on server 2's mirror port (where server 1's forwards arrive) may not
    // forge a forward: releasing B's chunk in the mirrored book is refused.
    auto secret = transport::ClusterSecret::Read(config->secret_file);
    ASSERT_TRUE(secret.ok());
    const transport::ClusterSecret key = secret->DerivePool("a");
    wire::HelloRequest hello{};
    hello.client_pid = static_cast<uint64_t>(getpid());
    hello.client_nonce = 0x5eed00a1;
    std::memcpy(hello.pool, "a", 1);
    const ServerAddress& s2 = config->servers[2];
    control::Connection::Options co{"server 2", s2.host, s2.port, &key, Fabric::kTcp, 3000ms};
    auto main_port = control::Connection::Open(co, hello);
    ASSERT_TRUE(main_port.ok()) << main_port.status().ToString();
    co.port = (*main_port)->hello().mirror_port;
    auto mirror_port = control::Connection::Open(co, hello);
    ASSERT_TRUE(mirror_port.ok()) << mirror_port.status().ToString();
    const uint64_t chunk = (*main_port)->hello().chunk_size;
    const uint64_t b_root = (*b)->RootArea(1).offset() - Pool::Root(1).offset();
    auto forged = (*mirror_port)
                      ->Call(
                          [&](uint64_t id) {
                            return wire::Encode(
                                id, wire::MirrorLeaseRequest{b_root, chunk, 1, wire::kMirrorRelease,
                                                             0, transport::PoolId("b")});
                          },
                          wire::Opcode::kMirrorLeaseReply);
    ASSERT_FALSE(forged.ok());
    EXPECT_EQ(forged.status().code(), StatusCode::kPermissionDenied) << forged.status().ToString();
    EXPECT_NE(forged.status().message().find("only the cluster's own servers"), std::string::npos)
        << forged.status().message();
  }
  ASSERT_EQ(kill(static_cast<pid_t>(config->servers[1].pid), SIGKILL), 0);
  // A's writes fail (Unavailable) until its client follows the data to the backup.
  const uint64_t kA2 = 0xaaa2;
  Status wrote = WriteUntilFollowed(**a, *mine, kA2);
  ASSERT_TRUE(wrote.ok()) << wrote.ToString();
  uint64_t got = 0;
  ASSERT_TRUE((*a)->Read(*mine, &got, 8).ok());
  EXPECT_EQ(got, kA2);

  Status denied = (*a)->Read(*theirs, &got, 8);
  EXPECT_EQ(denied.code(), StatusCode::kPermissionDenied) << denied.ToString();
  EXPECT_NE(denied.message().find("pool 'a' may not touch offset"), std::string::npos)
      << denied.message();
  denied = (*a)->Write(*theirs, &kA, 8);
  EXPECT_EQ(denied.code(), StatusCode::kPermissionDenied) << denied.ToString();

  auto late = connect("b");  // connects with server 1 gone: its root comes from the mirror
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_EQ((*late)->RootArea(1), (*b)->RootArea(1));
  ASSERT_TRUE((*late)->Read((*late)->RootArea(1), &got, 8).ok());
  EXPECT_EQ(got, kRoot);
  ASSERT_TRUE((*late)->Read(*theirs, &got, 8).ok());
  EXPECT_EQ(got, kB) << "B's bytes, as B left them";
  auto stats = (*late)->Stats(2);  // the backup of server 1
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->pool_refused, 2u);
}

// An eviction after a failover: the dead server is not asked (it serves nothing; the server
// that took its region over is asked like every other), so it succeeds. Asked, the dead server
// failed every eviction with Unavailable: a database fencing a stalled session's slot retried
// it every pass for ever and never fenced (the network soak with kills, 2026-11-29).
TEST(Replication, AnEvictionAfterAFailoverGoesThrough) {
  TestCluster cluster(Replicated(Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  PoolOptions po;
  po.op_timeout = 5000ms;
  auto pool = Pool::Connect(*config, po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto a = (*pool)->Alloc(64, Placement::OnServer(1));
  ASSERT_TRUE(a.ok());
  const uint64_t v = 0xe1c7;
  ASSERT_TRUE((*pool)->Write(*a, &v, 8).ok());
  constexpr uint32_t kStalled = 0x5eed0e1c;  // a process no server has seen: Ok at each
  ASSERT_TRUE((*pool)->Evict(kStalled).ok());

  ASSERT_EQ(kill(static_cast<pid_t>(config->servers[1].pid), SIGKILL), 0);
  Status wrote = WriteUntilFollowed(**pool, *a, v);
  ASSERT_TRUE(wrote.ok()) << wrote.ToString();
  Status evicted = (*pool)->Evict(kStalled);
  EXPECT_TRUE(evicted.ok()) << evicted.ToString();
}

// A thread's first use of a server is its hello to it (Pool::Impl::PeerOf). A thread that has
// used server 0 only reads a stopped primary's object: the hello goes unanswered, the server
// is failed (the coordinator fails it over once its etcd lease lapses), and the read, which
// never left, goes to the backup and returns the value written before the stop. Resolving the
// target once, before that hello, failed the read instead ("failed over ... may or may not
// have taken effect"); the monitor is out of the picture (its failure timeout is long). The
// thread makes its UCX worker before the stop, so that the read meets server 1 still named
// in the map (a slow start would find the region moved already and prove nothing).
TEST(Replication, ANewThreadsFirstReadOfAStoppedPrimaryGoesToItsBackup) {
  TestCluster cluster(Replicated(Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  PoolOptions po;
  po.connect_timeout = 3000ms;  // the hellos that must succeed get room on a loaded host
  po.failure_timeout = 120s;
  auto pool = Pool::Connect(*config, po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto on0 = (*pool)->Alloc(64, Placement::OnServer(0));
  auto on1 = (*pool)->Alloc(64, Placement::OnServer(1));
  ASSERT_TRUE(on0.ok() && on1.ok()) << on0.status().ToString() << on1.status().ToString();
  const uint64_t v = 0x5709ed;
  ASSERT_TRUE((*pool)->Write(*on1, &v, 8).ok());
  const auto server1 = static_cast<pid_t>(config->servers[1].pid);
  std::promise<void> stopped;
  std::promise<Status> warmed;
  Status read;
  uint64_t got = 0, connects_before = 0;
  std::thread fresh([&] {
    uint64_t word = 0;
    warmed.set_value((*pool)->Read(*on0, &word, 8));  // its worker, and server 0 only
    stopped.get_future().wait();
    connects_before = (*pool)->counters().connects;
    read = (*pool)->Read(*on1, &got, 8);
  });
  const Status warm = warmed.get_future().get();
  ASSERT_EQ(kill(server1, SIGSTOP), 0);
  stopped.set_value();
  fresh.join();
  kill(server1, SIGCONT);  // it finds its region served by its backup and exits
  ASSERT_TRUE(warm.ok()) << warm.ToString();
  EXPECT_TRUE(read.ok()) << read.ToString();
  EXPECT_EQ(got, v);
  EXPECT_EQ((*pool)->counters().connects - connects_before, 1u) << "the backup's hello";
}

// A pool's root area is leased at the pool's first hello on a server and forwarded like any
// lease; a later hello only shows it. Here the first hello's lease change is still waiting to
// be sent when its forwards fail: server 1's backup, server 2, is SIGSTOPped, two writes to
// server 1's root area (each a round, each a forward, the stats call after each a barrier that
// the round has run) fill BackupLink::kMaxInFlight, so the hello's round joins the pending
// forward; at the first forward's deadline every forward outstanding fails and the hello is
// answered "applied here but not acknowledged". After SIGCONT a client of the pool connects,
// is shown the root, writes its root area and reads it back. Server 1 is then SIGKILLed: the
// backup, which serves its data now, must have the root in its book, or the client's read of
// its own root area is refused ("not inside the root area or a leased chunk"). Holds because
// a failed forward's root leases go again with its bytes and a later hello's reply waits for
// them (backup_link.h).
TEST(Replication, APoolRootWhoseForwardFailedReachesTheBackupBeforeAHelloShowsIt) {
  constexpr int kPrimary = 1, kBackup = 2;
  TestCluster cluster(Replicated(Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  ASSERT_TRUE(AddPool(cluster.dir(), "p").ok());
  auto cluster_config = cluster.config();
  ASSERT_TRUE(cluster_config.ok()) << cluster_config.status().ToString();
  auto config = ClusterConfig::Load(PoolClusterFile(cluster.dir(), "p"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const auto backup = static_cast<pid_t>(config->servers[kBackup].pid);
  {
    auto secret = transport::ClusterSecret::Read(cluster_config->secret_file);
    ASSERT_TRUE(secret.ok()) << secret.status().ToString();
    const transport::ClusterSecret pool_key = secret->DerivePool("p");
    const ServerAddress& s1 = config->servers[kPrimary];
    wire::HelloRequest hello{};
    hello.client_pid = static_cast<uint64_t>(getpid());
    hello.client_nonce = 0x5eed00b1;
    control::Connection::Options co{"server 1", s1.host, s1.port, &*secret, Fabric::kTcp, 10000ms};
    auto writer = control::Connection::Open(co, hello);  // the default pool's client
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    co.secret = &pool_key;
    hello.client_nonce = 0x5eed00b3;
    std::memcpy(hello.pool, "p", 1);

    ASSERT_EQ(kill(backup, SIGSTOP), 0);
    for (int i = 0; i < 5000 && !AllThreadsStopped(backup); ++i) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(AllThreadsStopped(backup)) << "the backup did not stop";
    for (uint64_t v = 1; v <= 2; ++v) {
      memory_ops::RequestBuilder write;
      write.Write(wire::kRootReserved, &v, 8);
      const uint64_t id = (*writer)->NextId();
      ASSERT_TRUE(
          (*writer)
              ->Send(wire::Encode(
                  id,
                  wire::BatchRequest{write.op_count(), static_cast<uint32_t>(write.bytes().size())},
                  write.bytes()))
              .ok());
      auto stats = (*writer)->Call([](uint64_t i) { return wire::Encode(i, wire::StatsRequest{}); },
                                   wire::Opcode::kStatsReply);
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    }
    auto first = control::Connection::Open(co, hello);
    ASSERT_EQ(kill(backup, SIGCONT), 0);
    ASSERT_FALSE(first.ok()) << "the root's forward was not cut by the stopped backup";
    EXPECT_NE(first.status().message().find("applied here but not acknowledged"), std::string::npos)
        << first.status().ToString();
  }
  // Server 1 serves again once its backup has answered: connect until it does.
  PoolOptions po;
  po.transport = Fabric::kTcp;
  po.op_timeout = 10000ms;
  Result<std::unique_ptr<Pool>> pool = Status::Unavailable("not tried");
  for (int i = 0; i < 100 && !pool.ok(); ++i) {
    pool = Pool::Connect(*config, po);
    if (!pool.ok()) {
      ASSERT_EQ(pool.status().code(), StatusCode::kUnavailable) << pool.status().ToString();
      std::this_thread::sleep_for(50ms);
    }
  }
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const GlobalAddress root = (*pool)->RootArea(kPrimary);
  const uint64_t kValue = 0x2007;
  ASSERT_TRUE((*pool)->Write(root, &kValue, 8).ok());

  ASSERT_EQ(kill(static_cast<pid_t>(config->servers[kPrimary].pid), SIGKILL), 0);
  // Reads fail (Unavailable) until the client follows the data to the backup.
  uint64_t got = 0;
  Status read = Status::Unavailable("not tried");
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while ((read.code() == StatusCode::kUnavailable || read.code() == StatusCode::kTimedOut) &&
         std::chrono::steady_clock::now() < deadline) {
    read = (*pool)->Read(root, &got, 8);
    if (!read.ok()) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(read.ok()) << "the pool's root area after the failover: " << read.ToString();
  EXPECT_EQ(got, kValue);
}

TEST(Replication, AHealthyPrimaryIsNotTakenOverNorAreMisdirectedRequestsServed) {
  TestCluster cluster(Replicated(Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok());
  auto secret = transport::ClusterSecret::Read(config->secret_file);
  ASSERT_TRUE(secret.ok());
  auto promote = [](uint16_t id) {
    return [id](uint64_t rid) { return wire::Encode(rid, wire::PromoteRequest{id, {}}); };
  };
  // Server 2 mirrors server 1, which is alive and renews its lease: no promotion.
  auto s2 = Open(*config, config->servers[2], 0, *secret);
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  auto m2 = Open(*config, config->servers[2], (*s2)->hello().mirror_port, *secret);
  ASSERT_TRUE(m2.ok()) << m2.status().ToString();
  for (int i = 0; i < 5; ++i) {
    Status early = (*m2)->Call(promote(1), wire::Opcode::kPromoteReply).status();
    EXPECT_EQ(early.code(), StatusCode::kAborted) << early.ToString();
    std::this_thread::sleep_for(300ms);
  }
  auto pool = Pool::Connect(*config);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto x = (*pool)->Alloc(64, Placement::OnServer(1));
  ASSERT_TRUE(x.ok());
  const uint64_t v = 7;
  EXPECT_TRUE((*pool)->Write(*x, &v, 8).ok()) << "server 1 still serves";
  // Server 2 does not mirror server 0; promotes and forwards do not belong on a clients' port.
  Status wrong = (*m2)->Call(promote(0), wire::Opcode::kPromoteReply).status();
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument) << wrong.ToString();
  EXPECT_NE(wrong.message().find("does not mirror"), std::string::npos) << wrong.message();
  Status misplaced = (*s2)->Call(promote(1), wire::Opcode::kPromoteReply).status();
  EXPECT_EQ(misplaced.code(), StatusCode::kInvalidArgument) << misplaced.ToString();
  wire::ReplicateRequest forward{1, 0, 0, 0, 0};
  Status forged = (*m2)
                      ->Call([&](uint64_t id) { return wire::Encode(id, forward); },
                             wire::Opcode::kReplicateReply)
                      .status();
  EXPECT_TRUE(forged.ok()) << "an empty forward from an authenticated peer is a renewal: "
                           << forged.ToString();
  // Forwards are applied in the order sent (the primary pipelines them): one whose request id
  // does not increase on its connection is refused, not applied. Id 1 went to the challenge.
  ASSERT_TRUE((*m2)->Send(wire::Encode(1, forward)).ok());
  Status reordered =
      (*m2)
          ->Await(1, wire::Opcode::kReplicateReply, std::chrono::steady_clock::now() + 3s)
          .status();
  EXPECT_EQ(reordered.code(), StatusCode::kProtocol) << reordered.ToString();
  EXPECT_NE(reordered.message().find("out of order"), std::string::npos) << reordered.message();
  // A client without the secret gets nothing.
  ClusterConfig open = *config;
  open.secret_file.clear();
  PoolOptions po;
  po.connect_timeout = 2000ms;
  auto stranger = Pool::Connect(open, po);
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.status().code(), StatusCode::kPermissionDenied);
}

// Pipelined forwards (docs/pool.md "Replication", "Pipelined forwards"): a primary serves the
// next rounds while its backup has not acknowledged the last, so the replies it holds back are
// what keeps a client from seeing a change the backup lacks. Writers put increasing numbers
// into their own objects on server 1 (each object one writer, every word of it the number);
// readers read them. Server 1 is SIGKILLed; with `stall`, its backup (server 2) is stopped
// (SIGSTOP) for a while before, so that server 1 applies rounds whose forwards the backup has
// not acknowledged, or, past the forwards in flight, not even received; it is let go after the
// kill. After the failover every object holds at least the largest number any reader ever read
// and any writer saw acknowledged: no client read a value that the failover lost.
// 512-byte objects: all of them fit in one forward message (wire::kMaxBatchTail), so a
// forward cut by the kill cannot leave an object half written at the backup.
constexpr uint64_t kWordsPerObject = 64;

class NoReplyBeforeItsForward : public ::testing::TestWithParam<bool> {};

TEST_P(NoReplyBeforeItsForward, NoClientSeesAChangeTheFailoverLoses) {
  const bool stall = GetParam();
  constexpr int kVictim = 1, kBackup = 2, kObjects = 32, kWriters = 2, kReaders = 2;
  TestCluster cluster(Replicated(Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Pool& pl = *client->pool;
  std::vector<GlobalAddress> objects;
  for (int i = 0; i < kObjects; ++i) {
    auto a = pl.Alloc(kWordsPerObject * 8, Placement::OnServer(kVictim));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    objects.push_back(*a);
  }
  // Per object: the largest number acknowledged to its writer, attempted by it, read by anyone.
  std::vector<std::atomic<uint64_t>> acked(kObjects), attempted(kObjects), seen(kObjects);
  auto raise = [](std::atomic<uint64_t>& to, uint64_t v) {
    uint64_t cur = to.load();
    while (cur < v && !to.compare_exchange_weak(cur, v)) {
    }
  };
  std::atomic<bool> stop_writing{false}, killed{false};
  std::vector<std::string> unclear(kWriters + kReaders);
  std::vector<std::thread> threads;
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&, t] {
      uint64_t n = 0;
      std::vector<uint64_t> words(kWordsPerObject);
      while (!stop_writing) {
        const int i = static_cast<int>(n % (kObjects / kWriters)) * kWriters + t;
        ++n;
        std::fill(words.begin(), words.end(), n);
        attempted[i] = n;
        Status st = pl.Write(objects[i], words.data(), words.size() * 8);
        if (st.ok()) {
          raise(acked[i], n);
        } else if (st.code() != StatusCode::kUnavailable && st.code() != StatusCode::kTimedOut) {
          unclear[t] = st.ToString();
        }
      }
    });
  }
  for (int t = 0; t < kReaders; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(2000 + t);
      std::vector<uint64_t> words(kWordsPerObject);
      int after_kill = 0;
      const auto give_up = std::chrono::steady_clock::now() + 60s;
      while (after_kill < 100 && std::chrono::steady_clock::now() < give_up) {
        const size_t i = rng() % kObjects;
        Status st = pl.Read(objects[i], words.data(), words.size() * 8);
        if (st.ok()) {
          raise(seen[i], words[0]);
          if (killed) ++after_kill;
        } else if (st.code() != StatusCode::kUnavailable && st.code() != StatusCode::kTimedOut) {
          unclear[kWriters + t] = st.ToString();
        }
      }
    });
  }
  std::this_thread::sleep_for(1s);
  const auto victim = static_cast<pid_t>(client->config.servers[kVictim].pid);
  const auto backup = static_cast<pid_t>(client->config.servers[kBackup].pid);
  if (stall) {
    ASSERT_EQ(kill(backup, SIGSTOP), 0);
    std::this_thread::sleep_for(300ms);  // below the forwards' deadline and the etcd lease
  }
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  stop_writing = true;
  if (stall) {
    ASSERT_EQ(kill(backup, SIGCONT), 0);
  }
  killed = true;
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < unclear.size(); ++t) {
    EXPECT_EQ(unclear[t], "") << "thread " << t << ": a failure that is not Unavailable/TimedOut";
  }
  std::vector<uint64_t> words(kWordsPerObject);
  int read_before_kill = 0;
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_TRUE(pl.Read(objects[i], words.data(), words.size() * 8).ok());
    EXPECT_GE(words[0], acked[i].load()) << "object " << i << " lost an acknowledged write";
    EXPECT_GE(words[0], seen[i].load())
        << "object " << i << ": a client read " << seen[i].load()
        << ", which the failover lost (the backup has " << words[0] << ")";
    EXPECT_LE(words[0], attempted[i].load()) << "object " << i;
    EXPECT_EQ(std::count(words.begin(), words.end(), words[0]),
              static_cast<ptrdiff_t>(kWordsPerObject))
        << "object " << i << " holds parts of two writes";
    read_before_kill += seen[i].load() > 0;
  }
  EXPECT_GT(read_before_kill, 0) << "the readers read nothing: the test tested nothing";
}

INSTANTIATE_TEST_SUITE_P(Kill, NoReplyBeforeItsForward, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "BackupStalledFirst" : "UnderLoad");
                         });

// A backup that stops answering (SIGSTOP) while clients write and read its primary's data:
// the primary goes on serving (its loop does not wait for the backup), the replies it holds
// back for the backup's acknowledgement are answered with the primary's own error once the
// forward's deadline passes, and once the coordinator has declared the backup gone (its etcd
// lease lapses) the primary serves alone again. The clients' own timeouts are far longer than
// all that, so every error is the server's answer, never a client giving up on a reply that
// did not come; and no acknowledged write is lost.
TEST(Replication, AStalledBackupGetsEveryHeldReplyAnsweredNotHung) {
  constexpr int kPrimary = 1, kBackup = 2, kObjects = 16, kThreads = 4;
  TestCluster cluster(Replicated(Fabric::kTcp));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  PoolOptions po;
  po.op_timeout = 60000ms;
  po.failure_timeout = 60000ms;
  auto pool = Pool::Connect(*config, po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  Pool& pl = **pool;
  std::vector<GlobalAddress> objects;
  for (int i = 0; i < kObjects; ++i) {
    auto a = pl.Alloc(64, Placement::OnServer(kPrimary));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    objects.push_back(*a);
  }
  std::vector<uint64_t> acked(kObjects, 0);
  std::atomic<bool> stalled{false};
  std::vector<int> failures(kThreads), ok_after(kThreads);
  std::vector<std::string> unclear(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const bool writer = t % 2 == 0;
      uint64_t n = 0;
      const auto give_up = std::chrono::steady_clock::now() + 90s;
      while (ok_after[t] < 200 && std::chrono::steady_clock::now() < give_up) {
        // Writer t owns the objects i with i % kThreads == t.
        const int i = static_cast<int>(n % (kObjects / kThreads)) * kThreads + t;
        ++n;
        uint64_t v = n;
        Status st = writer ? pl.Write(objects[i], &v, 8) : pl.Read(objects[i], &v, 8);
        if (st.ok()) {
          if (writer) acked[i] = n;
          if (stalled && failures[t] > 0) ++ok_after[t];
        } else {
          ++failures[t];
          if (st.code() != StatusCode::kUnavailable ||
              st.message().find("server " + std::to_string(kPrimary)) == std::string::npos) {
            unclear[t] = st.ToString();
          }
          std::this_thread::sleep_for(5ms);
        }
      }
    });
  }
  std::this_thread::sleep_for(500ms);
  const auto backup = static_cast<pid_t>(config->servers[kBackup].pid);
  ASSERT_EQ(kill(backup, SIGSTOP), 0);
  stalled = true;
  for (auto& th : threads) th.join();
  ASSERT_EQ(kill(backup, SIGCONT), 0);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(unclear[t], "") << "thread " << t << ": not the primary's Unavailable";
    EXPECT_GT(failures[t], 0) << "thread " << t << " met no held reply answered with an error";
    EXPECT_GE(ok_after[t], 200) << "thread " << t << ": the primary did not serve alone again";
  }
  for (int i = 0; i < kObjects; ++i) {
    uint64_t v = 0;
    ASSERT_TRUE(pl.Read(objects[i], &v, 8).ok());
    EXPECT_GE(v, acked[i]) << "object " << i << " lost an acknowledged write";
  }
}

TEST(Replication, ClusterUpRefusesCopiesItCannotPlace) {
  for (auto [servers, replicas] :
       {std::pair{1, 1}, std::pair{3, 3}, std::pair{4, 5}, std::pair{2, -1}}) {
    LocalClusterOptions o = Replicated(Fabric::kTcp);
    o.servers = servers;
    o.replicas = replicas;
    TestCluster cluster(o);
    EXPECT_EQ(cluster.status().code(), StatusCode::kInvalidArgument)
        << servers << " servers, replicas " << replicas;
    EXPECT_NE(cluster.status().message().find("--replicas"), std::string::npos)
        << cluster.status().message();
    if (servers == 3 && replicas == 3) {
      EXPECT_NE(cluster.status().message().find("at most one fewer than the servers"),
                std::string::npos)
          << cluster.status().message();
    }
  }
}

}  // namespace
}  // namespace farpool
