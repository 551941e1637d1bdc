// Shared-pages backups (docs/pool.md "Shared-pages backups", pool/server/shared_pages.h) with
// real processes: the mechanism itself (a process adopts another's shared-memory file, the
// pages outlive the owner's SIGKILL, a stopped owner is killed), then whole clusters of
// `farpool server` processes over shm with `--replicas 1`: every acknowledged mapped write,
// compare-and-swap and fetch-and-add survives the SIGKILL of its server; a client keeps
// reaching a failed-over region through its mapping, the bytes its backup serves; a drain
// under transfers loses nothing; a stopped primary is killed by the backup that takes over,
// never served beside; nothing is left in /dev/shm.
#include "pool/server/shared_pages.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/process.h"
#include "farpool/pool.h"
#include "pool/control_client.h"
#include "pool/test_cluster.h"
#include "transport/auth.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kRegion = 8 << 20;

// A pipe between the test and a forked owner process, one 8-byte word at a time.
struct Channel {
  int to_child[2];
  int to_parent[2];
  void Send(int fd, uint64_t word) { ASSERT_EQ(write(fd, &word, 8), 8); }
  uint64_t Receive(int fd) {
    uint64_t word = 0;
    return read(fd, &word, 8) == 8 ? word : ~uint64_t{0};
  }
};

// The owner: a UCX region like a memory server's (transport shm), described to the parent;
// then, on each word from the parent: 1 store the next pattern word, 2 report word 1 (what the
// parent stored), 0 pause forever.
[[noreturn]] void Owner(Channel& c) {
  auto context = transport::Context::Create({Fabric::kShm});
  if (!context.ok()) _exit(2);
  auto region = transport::MemoryRegion::Allocate(**context, kRegion);
  if (!region.ok()) _exit(3);
  auto* words = reinterpret_cast<volatile uint64_t*>((*region)->data());
  words[0] = 0xA;
  auto file = DescribeSharedFile((*region)->data(), (*region)->size());
  if (!file.ok()) _exit(4);
  for (uint64_t w : {file->pid, file->start_time, file->inode, static_cast<uint64_t>(file->fd)}) {
    if (write(c.to_parent[1], &w, 8) != 8) _exit(5);
  }
  for (;;) {
    uint64_t command = 0;
    if (read(c.to_child[0], &command, 8) != 8) _exit(6);
    uint64_t answer = 0;
    if (command == 1) words[0] = 0xB;
    if (command == 2) answer = words[1];
    if (write(c.to_parent[1], &answer, 8) != 8) _exit(7);
  }
}

// The mechanism, without any farpool server: process B adopts process A's UCX region file over
// a part of its own shared file; each sees the other's stores; after SIGKILL of A (here through
// KillOwner, also of a stopped A) the pages and B's mapping stay, readable and writable.
class Mechanism : public ::testing::TestWithParam<bool> {};

TEST_P(Mechanism, AdoptedPagesOutliveTheirOwnersDeath) {
  const bool stop_first = GetParam();
  Channel c{};
  ASSERT_EQ(pipe(c.to_child), 0);
  ASSERT_EQ(pipe(c.to_parent), 0);
  const pid_t owner = fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) Owner(c);
  SharedFile file;
  file.pid = c.Receive(c.to_parent[0]);
  file.start_time = c.Receive(c.to_parent[0]);
  file.inode = c.Receive(c.to_parent[0]);
  file.fd = static_cast<int32_t>(c.Receive(c.to_parent[0]));
  ASSERT_EQ(file.pid, static_cast<uint64_t>(owner)) << "the owner failed before describing";

  // This process's "own region": a shared file twice the size; the second half adopts.
  const int own_fd = memfd_create("adopter", 0);
  ASSERT_GE(own_fd, 0);
  ASSERT_EQ(ftruncate(own_fd, 2 * kRegion), 0);
  void* mine = mmap(nullptr, 2 * kRegion, PROT_READ | PROT_WRITE, MAP_SHARED, own_fd, 0);
  ASSERT_NE(mine, MAP_FAILED);
  auto* base = static_cast<std::byte*>(mine);
  std::memset(base + kRegion, 0x5a, 4096);  // the slot's own pages, to be given back
  auto own = DescribeSharedFile(base, 2 * kRegion);
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  auto pages = AdoptedPages::Adopt(file, base + kRegion, kRegion, *own, kRegion);
  ASSERT_TRUE(pages.ok()) << pages.status().ToString();
  auto* words = reinterpret_cast<volatile uint64_t*>(base + kRegion);

  EXPECT_EQ(words[0], 0xAu) << "the adopted slot does not show the owner's bytes";
  c.Send(c.to_child[1], 1);
  ASSERT_EQ(c.Receive(c.to_parent[0]), 0u);
  EXPECT_EQ(words[0], 0xBu) << "a store of the owner after the adoption is not seen";
  words[1] = 0xC;
  c.Send(c.to_child[1], 2);
  EXPECT_EQ(c.Receive(c.to_parent[0]), 0xCu) << "the owner does not see the adopter's store";

  if (stop_first) {
    ASSERT_EQ(kill(owner, SIGSTOP), 0);
  }
  Status killed = (*pages)->KillOwner(2000ms);
  ASSERT_TRUE(killed.ok()) << killed.ToString();
  int status = 0;
  ASSERT_EQ(waitpid(owner, &status, 0), owner);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

  EXPECT_EQ(words[0], 0xBu) << "the pages did not outlive their owner";
  EXPECT_EQ(words[1], 0xCu);
  words[2] = 0xD;
  EXPECT_EQ(words[2], 0xDu);
  // The adopted file is the one the owner named: reading it again through this process's
  // descriptor (Describe) shows the same bytes.
  const SharedFile again = (*pages)->Describe();
  EXPECT_EQ(again.pid, static_cast<uint64_t>(getpid()));
  EXPECT_EQ(again.inode, file.inode);
  munmap(mine, 2 * kRegion);
  close(own_fd);
}

INSTANTIATE_TEST_SUITE_P(Owner, Mechanism, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Stopped" : "Running");
                         });

TEST(AdoptionChecks, RefuseAnotherProcessOrFile) {
  const int fd = memfd_create("probe", 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 2 * kRegion), 0);
  void* m = mmap(nullptr, 2 * kRegion, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<std::byte*>(m);
  auto own = DescribeSharedFile(base, 2 * kRegion);
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  SharedFile wrong = *own;
  wrong.start_time += 1;  // a reused pid
  auto refused = AdoptedPages::Adopt(wrong, base + kRegion, kRegion, *own, kRegion);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not the primary"), std::string::npos)
      << refused.status().ToString();
  wrong = *own;
  wrong.inode += 1;  // another file
  refused = AdoptedPages::Adopt(wrong, base + kRegion, kRegion, *own, kRegion);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not the region's"), std::string::npos)
      << refused.status().ToString();
  std::vector<std::byte> anonymous(4096);
  EXPECT_FALSE(DescribeSharedFile(anonymous.data(), anonymous.size()).ok());
  munmap(m, 2 * kRegion);
  close(fd);
}

// Waits until `pool` sends server `id`'s leases to the server that took its region over: a
// lease run there succeeds (released again at once). A lease of the dead server itself fails,
// which makes the Pool find it gone and follow the map.
Status AwaitFailedOver(Pool& pool, uint16_t id) {
  auto geometry = pool.Geometry(id);
  if (!geometry.ok()) return geometry.status();
  Status last = Status::Unavailable("not tried");
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto run = pool.LeaseRun(id, geometry->chunk_size);
    if (run.ok()) return pool.ReleaseRun(*run, geometry->chunk_size);
    last = run.status();
    std::this_thread::sleep_for(50ms);
  }
  return last.WithContext("server " + std::to_string(id) + " was not failed over within 60 s");
}

LocalClusterOptions SharedPagesCluster(Fabric transport = Fabric::kShm) {
  LocalClusterOptions o;
  o.servers = 3;
  o.memory = 64 << 20;
  o.transport = transport;
  o.progress = ProgressMode::kEvent;
  o.replicas = 1;
  return o;
}

// Client threads change their own words on every server with mapped operations: a write of a
// whole 64-byte object (its sequence number in every word), a compare-and-swap that moves a word
// from n to n + 1, a fetch-and-add of 1 to a counter per server; the victim is SIGKILLed
// half-way. Afterwards every object holds its last acknowledged number or a later attempted one,
// untorn; every CAS word its last acknowledged value or one more; every counter lies between the
// acknowledged and the attempted additions. Before the kill the changes went mapped: no
// messages but the leases'.
class KillTest : public ::testing::TestWithParam<int> {};

TEST_P(KillTest, EveryAcknowledgedMappedChangeSurvivesTheKillOfItsServer) {
  const int victim = GetParam();
  constexpr int kThreads = 2;
  constexpr int kWords = 8;  // per thread and server
  TestCluster cluster(SharedPagesCluster());
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE(client->config.shared_pages) << "cluster up over shm did not choose shared pages";
  Pool& pl = *client->pool;

  struct Word {
    GlobalAddress object;                       // 64 bytes, written whole
    GlobalAddress cas;                          // 8 bytes, n -> n + 1
    uint64_t written = 0, written_unknown = 0;  // last acknowledged, and the highest attempted
    uint64_t swapped = 0;                       // the CAS word's acknowledged value
    bool swap_unknown = false;                  // a CAS after the last acknowledged one failed
  };
  std::vector<std::vector<Word>> words(kThreads);
  std::vector<GlobalAddress> counters;
  for (int s = 0; s < 3; ++s) {
    auto c = pl.Alloc(8, Placement::OnServer(static_cast<uint16_t>(s)));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    counters.push_back(*c);
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kWords; ++i) {
        auto o = pl.Alloc(64, Placement::OnServer(static_cast<uint16_t>(s)));
        auto w = pl.Alloc(8, Placement::OnServer(static_cast<uint16_t>(s)));
        ASSERT_TRUE(o.ok() && w.ok());
        words[t].push_back({*o, *w});
      }
    }
  }
  for (const GlobalAddress& c : counters) {
    const uint64_t zero = 0;
    ASSERT_TRUE(pl.Write(c, &zero, 8).ok());
  }
  const OpCounters before = pl.counters();
  std::atomic<bool> moved{false};  // the Pool has failed the victim over
  std::vector<uint64_t> acked_adds(kThreads * 3), unknown_adds(kThreads * 3);
  std::vector<std::string> unclear(kThreads);
  std::vector<uint64_t> failures(kThreads);
  std::vector<OpCounters> at_kill(1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(2000 + t);
      int after_kill = 0;
      const auto give_up = std::chrono::steady_clock::now() + 60s;
      while (after_kill < 300 && std::chrono::steady_clock::now() < give_up) {
        Word& w = words[t][rng() % words[t].size()];
        const int server = static_cast<int>(rng() % 3);
        Status st;
        switch (rng() % 3) {
          case 0: {
            const uint64_t n = std::max(w.written, w.written_unknown) + 1;
            std::vector<uint64_t> object(8, n);
            st = pl.Write(w.object, object.data(), 64);
            if (st.ok()) w.written = n;
            if (!st.ok()) w.written_unknown = n;
            break;
          }
          case 1: {
            if (w.swap_unknown) {  // learn where the word stands first
              uint64_t now = 0;
              st = pl.Read(w.cas, &now, 8);
              if (st.ok()) {
                w.swapped = now;
                w.swap_unknown = false;
              }
              break;
            }
            auto old = pl.CompareAndSwap(w.cas, w.swapped, w.swapped + 1);
            st = old.status();
            if (st.ok() && *old == w.swapped) ++w.swapped;
            if (st.ok() && *old != w.swapped - 1) unclear[t] = "a CAS found a value nobody wrote";
            if (!st.ok()) w.swap_unknown = true;
            break;
          }
          default: {
            auto prev = pl.FetchAdd(counters[server], 1);
            st = prev.status();
            (st.ok() ? acked_adds : unknown_adds)[t * 3 + server]++;
          }
        }
        if (!st.ok()) {
          ++failures[t];
          if (st.code() != StatusCode::kUnavailable && st.code() != StatusCode::kTimedOut)
            unclear[t] = st.ToString();
          std::this_thread::sleep_for(10ms);
        } else if (moved) {
          ++after_kill;
        }
      }
    });
  }
  std::this_thread::sleep_for(1s);
  at_kill[0] = pl.counters();
  ASSERT_EQ(kill(static_cast<pid_t>(client->config.servers[victim].pid), SIGKILL), 0);
  // Mapped operations do not notice the kill (the pages are still mapped): go on until the Pool
  // has failed the victim over, and 300 operations per thread after that, so that what is
  // checked below is what the backup serves.
  Status followed = AwaitFailedOver(pl, static_cast<uint16_t>(victim));
  const OpCounters at_move = pl.counters();
  moved = true;
  for (auto& th : threads) th.join();
  ASSERT_TRUE(followed.ok()) << followed.ToString();
  // After the failover too (the Pool keeps its mapping of the victim's pages, which its backup
  // serves): not one message for a change or a read.
  EXPECT_EQ(pl.counters().messages, at_move.messages)
      << "operations on the failed-over region went as messages to its backup";

  // Before the kill every change was a mapped store or atomic: no message was sent.
  EXPECT_GT(at_kill[0].writes + at_kill[0].cas + at_kill[0].faa,
            before.writes + before.cas + before.faa + 100);
  EXPECT_EQ(at_kill[0].messages, before.messages)
      << "changes went as messages although the backups share the pages";
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(unclear[t], "");
    EXPECT_LE(failures[t], 20u) << "only operations in flight at the kill may fail";
  }
  for (int t = 0; t < kThreads; ++t) {
    for (const Word& w : words[t]) {
      std::vector<uint64_t> object(8);
      ASSERT_TRUE(pl.Read(w.object, object.data(), 64).ok());
      for (uint64_t v : object)
        EXPECT_EQ(v, object[0]) << "a torn object at " << w.object.ToString();
      EXPECT_TRUE(object[0] == w.written ||
                  (object[0] > w.written && object[0] <= w.written_unknown))
          << w.object.ToString() << " holds " << object[0] << ", acknowledged " << w.written;
      uint64_t value = 0;
      ASSERT_TRUE(pl.Read(w.cas, &value, 8).ok());
      EXPECT_TRUE(value == w.swapped || (w.swap_unknown && value == w.swapped + 1))
          << "CAS word " << w.cas.ToString() << " holds " << value << ", acknowledged "
          << w.swapped;
    }
  }
  for (int s = 0; s < 3; ++s) {
    uint64_t value = 0, acked = 0, unknown = 0;
    ASSERT_TRUE(pl.Read(counters[s], &value, 8).ok());
    for (int t = 0; t < kThreads; ++t) {
      acked += acked_adds[t * 3 + s];
      unknown += unknown_adds[t * 3 + s];
    }
    EXPECT_GE(value, acked) << "server " << s << "'s counter lost acknowledged additions";
    EXPECT_LE(value, acked + unknown) << "server " << s << "'s counter gained additions";
  }
}

INSTANTIATE_TEST_SUITE_P(Victims, KillTest, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "server" + std::to_string(info.param);
                         });

// After the SIGKILL of a primary, a client that maps its region goes on reaching it through
// that mapping once it has followed the map (docs/pool.md "The client keeps its mapping"):
// its writes, compare-and-swaps and fetch-and-adds on the dead server's addresses are the bytes
// the backup serves to a client over TCP (which reaches them by messages), both ways, and
// concurrent additions of the two on one word are all counted; the mapping client sends no
// message for any of it. With transport shm, and auto (`cluster up` chooses shared pages there
// too, and a same-host client of auto maps).
class KeepMappingTest : public ::testing::TestWithParam<Fabric> {};

TEST_P(KeepMappingTest, AClientKeepsItsMappingOfAFailedOverRegion) {
  TestCluster cluster(SharedPagesCluster(GetParam()));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE(client->config.shared_pages) << "cluster up did not choose shared pages";
  Pool& mapped = *client->pool;
  PoolOptions tcp_options;
  tcp_options.transport = Fabric::kTcp;
  auto tcp_pool = Pool::Connect(client->config, tcp_options);
  ASSERT_TRUE(tcp_pool.ok()) << tcp_pool.status().ToString();
  Pool& tcp = **tcp_pool;
  ASSERT_EQ(mapped.AccessPath(1), "direct");
  ASSERT_EQ(tcp.AccessPath(1), "messages");
  auto object = mapped.Alloc(64, Placement::OnServer(1));
  auto word = mapped.Alloc(8, Placement::OnServer(1));
  auto counter = mapped.Alloc(8, Placement::OnServer(1));
  ASSERT_TRUE(object.ok() && word.ok() && counter.ok());
  const uint64_t zero = 0;
  ASSERT_TRUE(mapped.Write(*word, &zero, 8).ok());
  ASSERT_TRUE(mapped.Write(*counter, &zero, 8).ok());

  ASSERT_EQ(kill(static_cast<pid_t>(client->config.servers[1].pid), SIGKILL), 0);
  Status followed = AwaitFailedOver(mapped, 1);
  ASSERT_TRUE(followed.ok()) << "mapping client: " << followed.ToString();
  followed = AwaitFailedOver(tcp, 1);
  ASSERT_TRUE(followed.ok()) << "TCP client: " << followed.ToString();
  const OpCounters before = mapped.counters();
  const OpCounters tcp_before = tcp.counters();

  // Writes, each read back by the other client.
  std::vector<uint64_t> pattern(8, 0xA11CE), got(8);
  ASSERT_TRUE(mapped.Write(*object, pattern.data(), 64).ok());
  ASSERT_TRUE(tcp.Read(*object, got.data(), 64).ok());
  EXPECT_EQ(got, pattern) << "the backup does not serve what the mapping client wrote";
  std::fill(pattern.begin(), pattern.end(), 0xB0B);
  ASSERT_TRUE(tcp.Write(*object, pattern.data(), 64).ok());
  ASSERT_TRUE(mapped.Read(*object, got.data(), 64).ok());
  EXPECT_EQ(got, pattern) << "the mapping does not show what the backup wrote";
  // Compare-and-swaps taking turns: each finds the other's value.
  for (uint64_t n = 0; n < 6; ++n) {
    Pool& by = n % 2 == 0 ? mapped : tcp;
    auto previous = by.CompareAndSwap(*word, n, n + 1);
    ASSERT_TRUE(previous.ok()) << previous.status().ToString();
    EXPECT_EQ(*previous, n) << (n % 2 == 0 ? "mapping" : "TCP") << " client's CAS " << n;
  }
  // Fetch-and-adds of both at once on one word: CPU atomics and the backup's atomics on the
  // same bytes lose none.
  constexpr uint64_t kAdds = 2000;
  std::vector<Status> failed(2);
  std::vector<std::thread> adders;
  for (int c = 0; c < 2; ++c) {
    adders.emplace_back([&, c] {
      Pool& by = c == 0 ? mapped : tcp;
      for (uint64_t i = 0; i < kAdds && failed[c].ok(); ++i) {
        failed[c] = by.FetchAdd(*counter, 1).status();
      }
    });
  }
  for (auto& t : adders) t.join();
  ASSERT_TRUE(failed[0].ok()) << failed[0].ToString();
  ASSERT_TRUE(failed[1].ok()) << failed[1].ToString();
  uint64_t sum_mapped = 0, sum_tcp = 0;
  ASSERT_TRUE(mapped.Read(*counter, &sum_mapped, 8).ok());
  ASSERT_TRUE(tcp.Read(*counter, &sum_tcp, 8).ok());
  EXPECT_EQ(sum_mapped, 2 * kAdds);
  EXPECT_EQ(sum_tcp, 2 * kAdds);

  const OpCounters after = mapped.counters();
  EXPECT_GE(after.faa, before.faa + kAdds);
  EXPECT_EQ(after.messages, before.messages)
      << "the mapping client reached the failed-over region by messages";
  EXPECT_GT(tcp.counters().messages, tcp_before.messages + kAdds)
      << "the TCP client did not reach the region by messages";
}

INSTANTIATE_TEST_SUITE_P(Transports, KeepMappingTest,
                         ::testing::Values(Fabric::kShm, Fabric::kAuto),
                         [](const ::testing::TestParamInfo<Fabric>& info) {
                           return info.param == Fabric::kShm ? "shm" : "auto";
                         });

// A client that connects after a failover, and so never mapped the dead server, maps the moved
// region too (docs/pool.md "A client that connects after a failover maps the moved region"):
// the server that serves it offers the file of the pages it adopted (wire::MovedFileRequest).
// The new client reads what a client that mapped before the kill wrote and the other way round,
// they take turns at compare-and-swaps (each finds the other's value) and add 2,000 each at once
// to one word (the sum is 4,000): one set of bytes, the ones the server serves; and the new
// client sends no message for any of it.
TEST(SharedPages, AClientThatConnectsAfterAFailoverMapsTheMovedRegion) {
  TestCluster cluster(SharedPagesCluster());
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Pool& early = *client->pool;
  auto object = early.Alloc(64, Placement::OnServer(1));
  auto word = early.Alloc(8, Placement::OnServer(1));
  auto counter = early.Alloc(8, Placement::OnServer(1));
  ASSERT_TRUE(object.ok() && word.ok() && counter.ok());
  std::vector<uint64_t> pattern(8, 0xEA51), got(8);
  const uint64_t zero = 0;
  ASSERT_TRUE(early.Write(*object, pattern.data(), 64).ok());
  ASSERT_TRUE(early.Write(*word, &zero, 8).ok());
  ASSERT_TRUE(early.Write(*counter, &zero, 8).ok());

  ASSERT_EQ(kill(static_cast<pid_t>(client->config.servers[1].pid), SIGKILL), 0);
  Status followed = AwaitFailedOver(early, 1);
  ASSERT_TRUE(followed.ok()) << followed.ToString();
  auto late_pool = Pool::Connect(client->config, PoolOptions{});
  ASSERT_TRUE(late_pool.ok()) << late_pool.status().ToString();
  Pool& late = **late_pool;
  EXPECT_EQ(late.AccessPath(1), "direct") << "the new client did not map the moved region";
  const OpCounters before = late.counters();

  ASSERT_TRUE(late.Read(*object, got.data(), 64).ok());
  EXPECT_EQ(got, pattern) << "the new client does not see what was written before the kill";
  std::fill(pattern.begin(), pattern.end(), 0x1A7E);
  ASSERT_TRUE(late.Write(*object, pattern.data(), 64).ok());
  ASSERT_TRUE(early.Read(*object, got.data(), 64).ok());
  EXPECT_EQ(got, pattern) << "the served region does not show the new client's write";
  for (uint64_t n = 0; n < 6; ++n) {
    Pool& by = n % 2 == 0 ? late : early;
    auto previous = by.CompareAndSwap(*word, n, n + 1);
    ASSERT_TRUE(previous.ok()) << previous.status().ToString();
    EXPECT_EQ(*previous, n) << (n % 2 == 0 ? "new" : "early") << " client's CAS " << n;
  }
  constexpr uint64_t kAdds = 2000;
  std::vector<Status> failed(2);
  std::vector<std::thread> adders;
  for (int c = 0; c < 2; ++c) {
    adders.emplace_back([&, c] {
      Pool& by = c == 0 ? late : early;
      for (uint64_t i = 0; i < kAdds && failed[c].ok(); ++i) {
        failed[c] = by.FetchAdd(*counter, 1).status();
      }
    });
  }
  for (auto& t : adders) t.join();
  ASSERT_TRUE(failed[0].ok()) << failed[0].ToString();
  ASSERT_TRUE(failed[1].ok()) << failed[1].ToString();
  uint64_t sum = 0;
  ASSERT_TRUE(late.Read(*counter, &sum, 8).ok());
  EXPECT_EQ(sum, 2 * kAdds);
  // A TCP client reaches the region by messages, at the server that serves it: the same bytes.
  PoolOptions tcp_options;
  tcp_options.transport = Fabric::kTcp;
  auto tcp = Pool::Connect(client->config, tcp_options);
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  ASSERT_TRUE((*tcp)->Read(*counter, &sum, 8).ok());
  EXPECT_EQ(sum, 2 * kAdds) << "the server serves other bytes than the new client's mapping";

  const OpCounters after = late.counters();
  EXPECT_GE(after.faa, before.faa + kAdds);
  EXPECT_EQ(after.messages, before.messages)
      << "the new client reached the failed-over region by messages";
}

// `cluster drain` of a shared-pages server under transfers (docs/pool.md "Drain over shared
// pages"): 24 account words over the three servers; a mapping client and a TCP client (whose
// requests the drained server refuses and the Pool resends) each move amounts between random
// accounts with fetch-and-adds (-x on one, +x on another) while server `victim` is drained.
// No operation fails, the total is what it was (nothing lost or doubled, whichever path each
// addition took), the drained process has ended, and the map has no region served by or backed
// up on it; its accounts are served by its backup, from the same pages.
TEST(SharedPages, ADrainUnderTransfersLosesNothingAndNoClientSeesAnError) {
  LocalClusterOptions o = SharedPagesCluster();
  o.mirror_slots = 2;  // room for re-replication after the move
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE(client->config.shared_pages);
  Pool& mapped = *client->pool;
  PoolOptions tcp_options;
  tcp_options.transport = Fabric::kTcp;
  auto tcp_pool = Pool::Connect(client->config, tcp_options);
  ASSERT_TRUE(tcp_pool.ok()) << tcp_pool.status().ToString();
  constexpr int kAccounts = 24;
  constexpr uint64_t kStart = 1000000;
  std::vector<GlobalAddress> accounts;
  for (int a = 0; a < kAccounts; ++a) {
    auto at = mapped.Alloc(8, Placement::OnServer(static_cast<uint16_t>(a % 3)));
    ASSERT_TRUE(at.ok()) << at.status().ToString();
    ASSERT_TRUE(mapped.Write(*at, &kStart, 8).ok());
    accounts.push_back(*at);
  }
  EtcdView view = ClusterEtcdStatus(cluster.dir()).value();
  for (int i = 0; i < 100 && view.coordinator < 0; ++i) {
    std::this_thread::sleep_for(50ms);
    view = ClusterEtcdStatus(cluster.dir()).value();
  }
  ASSERT_GE(view.coordinator, 0) << "no coordinator elected";
  const int victim = (view.coordinator + 1) % 3;  // the coordinator's own drain is not this test's

  std::atomic<bool> stop{false};
  std::vector<Status> failed(2);
  std::vector<uint64_t> transfers(2);
  std::vector<std::thread> movers;
  for (int c = 0; c < 2; ++c) {
    movers.emplace_back([&, c] {
      Pool& by = c == 0 ? mapped : **tcp_pool;
      std::mt19937_64 rng(7000 + c);
      while (!stop && failed[c].ok()) {
        const size_t from = rng() % kAccounts, to = rng() % kAccounts;
        const uint64_t amount = 1 + rng() % 100;
        failed[c] = by.FetchAdd(accounts[from], -amount).status();
        if (failed[c].ok()) failed[c] = by.FetchAdd(accounts[to], amount).status();
        if (failed[c].ok()) ++transfers[c];
      }
    });
  }
  std::this_thread::sleep_for(500ms);
  Status drained = ClusterDrain(cluster.dir(), static_cast<uint16_t>(victim), 30000ms);
  const uint64_t at_drain = transfers[0] + transfers[1];
  std::this_thread::sleep_for(500ms);
  stop = true;
  for (auto& t : movers) t.join();
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  EXPECT_TRUE(failed[0].ok()) << "mapping client: " << failed[0].ToString();
  EXPECT_TRUE(failed[1].ok()) << "TCP client: " << failed[1].ToString();
  EXPECT_GT(transfers[0] + transfers[1], at_drain) << "no transfer after the drain";
  EXPECT_FALSE(ProcessRunning(static_cast<pid_t>(client->config.servers[victim].pid)));
  for (Pool* by : {&mapped, &**tcp_pool}) {
    uint64_t total = 0;
    for (const GlobalAddress& a : accounts) {
      uint64_t balance = 0;
      Status read = by->Read(a, &balance, 8);
      ASSERT_TRUE(read.ok()) << (by == &mapped ? "mapping" : "TCP")
                             << " client: " << read.ToString();
      total += balance;
    }
    EXPECT_EQ(total, kAccounts * kStart) << (by == &mapped ? "mapping" : "TCP") << " client";
  }
  // The coordinator degrades the server whose backup the victim was after the move: wait.
  auto on_victim = [&](const EtcdView& v) {
    return std::any_of(v.map.servers.begin(), v.map.servers.end(),
                       [&](const auto& m) { return m.served_by == victim || m.backup == victim; });
  };
  view = ClusterEtcdStatus(cluster.dir()).value();
  for (int i = 0; i < 300 && on_victim(view); ++i) {
    std::this_thread::sleep_for(100ms);
    view = ClusterEtcdStatus(cluster.dir()).value();
  }
  EXPECT_EQ(view.map.Find(static_cast<uint16_t>(victim))->served_by, (victim + 1) % 3);
  for (const coord::MapServer& m : view.map.servers) {
    EXPECT_NE(m.served_by, victim) << "server " << m.id;
    EXPECT_NE(m.backup, victim) << "server " << m.id;
  }
  std::printf("drain of server %d under transfers: %llu mapped, %llu over TCP (%llu resent)\n",
              victim, static_cast<unsigned long long>(transfers[0]),
              static_cast<unsigned long long>(transfers[1]),
              static_cast<unsigned long long>((*tcp_pool)->counters().resent));
}

// SIGSTOP of a primary: its etcd lease lapses, the coordinator fails it over, and its backup
// kills it before it serves its pages (a stopped process that resumed would otherwise run a
// half-done operation beside the backup). What was acknowledged before the stop reads back at
// the backup, and a write there afterwards too.
TEST(SharedPages, AStoppedPrimaryIsKilledByItsBackupNotServedBeside) {
  TestCluster cluster(SharedPagesCluster());
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Pool& pl = *client->pool;
  auto a = pl.Alloc(8, Placement::OnServer(1));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const uint64_t before = 0x5707;
  ASSERT_TRUE(pl.Write(*a, &before, 8).ok());
  const pid_t primary = static_cast<pid_t>(client->config.servers[1].pid);
  ASSERT_EQ(kill(primary, SIGSTOP), 0);
  // The cluster's servers are this process's children: their end is ours to see.
  int status = 0;
  pid_t ended = 0;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (ended == 0 && std::chrono::steady_clock::now() < deadline) {
    ended = waitpid(primary, &status, WNOHANG);
    if (ended == 0) std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(ended, primary) << "the stopped primary still exists: its backup did not kill it";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  uint64_t got = 0;
  Status read = Status::Unavailable("not tried");
  for (int i = 0; i < 100 && !read.ok(); ++i) {
    read = pl.Read(*a, &got, 8);
    if (!read.ok()) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(read.ok()) << read.ToString();
  EXPECT_EQ(got, before);
  const uint64_t after = 0xAF7E;
  ASSERT_TRUE(pl.Write(*a, &after, 8).ok());
  ASSERT_TRUE(pl.Read(*a, &got, 8).ok());
  EXPECT_EQ(got, after);
}

// A server killed inside an insert-if-absent, between taking the bucket's lock and releasing
// it, leaves its requester's lock word on the pages (a copy would have been rolled back to the
// round before). Its intent record (wire::kInsertIntentOffset, written by the server before it
// takes such a lock) is what the adopter goes by: at promotion it releases that lock if the
// requester's word still holds it. Here the record is written by the test, as the dead server
// would have left it; a lock without a record stays held.
TEST(SharedPages, ABucketLockADeadServerHeldIsReleasedByItsAdopter) {
  TestCluster cluster(SharedPagesCluster());
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Pool& pl = *client->pool;
  auto recorded = pl.Alloc(8, Placement::OnServer(1));
  auto other = pl.Alloc(8, Placement::OnServer(1));
  ASSERT_TRUE(recorded.ok() && other.ok());
  constexpr uint64_t kWord = 0xB0C7, kOtherWord = 0x07E5;
  for (auto [at, word] : {std::pair{*recorded, kWord}, std::pair{*other, kOtherWord}}) {
    auto prev = pl.CompareAndSwap(at, 0, word);
    ASSERT_TRUE(prev.ok() && *prev == 0) << prev.status().ToString();
  }
  const uint64_t intent[2] = {recorded->offset() + 1, kWord};
  ASSERT_TRUE(pl.Write(GlobalAddress(1, wire::kInsertIntentOffset), intent, 16).ok());
  ASSERT_EQ(kill(static_cast<pid_t>(client->config.servers[1].pid), SIGKILL), 0);
  uint64_t lock = kWord;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (lock == kWord && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
    if (!pl.Read(*recorded, &lock, 8).ok()) lock = kWord;
  }
  EXPECT_EQ(lock, 0u) << "the dead server's bucket lock was not released by its adopter";
  uint64_t held = 0;
  ASSERT_TRUE(pl.Read(*other, &held, 8).ok());
  EXPECT_EQ(held, kOtherWord) << "a lock the dead server did not record was released";
}

// `cluster down` of a shared-pages cluster after a failover leaves no directory of its
// servers in /dev/shm (the adopted files were unlinked from the start; the backups' mappings end
// with their processes).
TEST(SharedPages, NothingIsLeftInDevShmAfterClusterDown) {
  std::vector<pid_t> pids;
  {
    TestCluster cluster(SharedPagesCluster());
    ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
    auto config = cluster.config();
    ASSERT_TRUE(config.ok());
    for (const ServerAddress& s : config->servers) pids.push_back(static_cast<pid_t>(s.pid));
    auto pool = Pool::Connect(*config, PoolOptions{});
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    auto a = (*pool)->Alloc(4096, Placement::OnServer(2));
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(kill(pids[2], SIGKILL), 0);
    uint64_t v = 1;
    Status wrote = Status::Unavailable("not tried");
    for (int i = 0; i < 100 && !wrote.ok(); ++i) {
      wrote = (*pool)->Write(*a, &v, 8);
      if (!wrote.ok()) std::this_thread::sleep_for(100ms);
    }
    EXPECT_TRUE(wrote.ok()) << wrote.ToString();
  }
  for (pid_t p : pids) {
    EXPECT_FALSE(ProcessRunning(p)) << "server process " << p;
    const std::string dir = "/dev/shm/farpool-ucx-" + std::to_string(p);
    bool gone = false;
    for (int i = 0; i < 50 && !gone; ++i) {  // the janitor removes it once its server is gone
      gone = !std::filesystem::exists(dir);
      if (!gone) std::this_thread::sleep_for(100ms);
    }
    EXPECT_TRUE(gone) << dir << " is left behind";
  }
}

// The shared memory that server processes hold: st_blocks of every file in /dev/shm or memfd
// that one of `pids` holds open (its region, the regions it adopted, its mirror slots' file,
// UCX's queues), each file once; and of those, the mirror slots' files alone
// (pool/server/mirror.h).
struct HeldMemory {
  uint64_t all = 0;
  uint64_t slots = 0;
};
HeldMemory SharedMemoryHeld(const std::vector<pid_t>& pids) {
  HeldMemory held;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (pid_t pid : pids) {
    const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(fds, ec)) {
      const std::string link = std::filesystem::read_symlink(e.path(), ec).string();
      if (ec || (link.rfind("/dev/shm/", 0) != 0 && link.rfind("/memfd:", 0) != 0)) continue;
      struct stat st {};
      if (stat(e.path().c_str(), &st) != 0 || !seen.insert({st.st_dev, st.st_ino}).second) continue;
      const uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
      held.all += bytes;
      if (link.rfind("/memfd:farpool-mirror-slots", 0) == 0) held.slots += bytes;
    }
  }
  return held;
}

// Mirror slots cost nothing until they hold a copy (docs/pool.md "Mirror slots cost nothing
// until they hold a copy"): three servers with two slots each. With shared pages no slot ever
// commits memory, before or after a failover and the re-replication that adopts onward: the
// cluster holds each region once (plus UCX's queues), not (1 + 2) times at start and then
// twice for the slot no backup adopted. With forwarded copies (`--forward-copies`) each server
// commits the one slot that keeps its predecessor's copy, and not the other.
TEST(SharedPages, MirrorSlotsCommitNoMemoryUntilTheyHoldACopy) {
  for (bool copies : {false, true}) {
    SCOPED_TRACE(copies ? "forwarded copies" : "shared pages");
    LocalClusterOptions o = SharedPagesCluster();
    o.mirror_slots = 2;
    o.forward_copies = copies;
    TestCluster cluster(o);
    ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
    auto client = ConnectTestClient(cluster);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    ASSERT_EQ(client->config.shared_pages, !copies);
    std::vector<pid_t> pids;
    for (const ServerAddress& s : client->config.servers) pids.push_back(static_cast<pid_t>(s.pid));
    // Each server's own region is written through, so that it is all there to count.
    Pool& pl = *client->pool;
    for (uint16_t id = 0; id < 3; ++id) {
      auto a = pl.Alloc(4096, Placement::OnServer(id));
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      const uint64_t v = 7;
      ASSERT_TRUE(pl.Write(*a, &v, 8).ok());
    }
    const uint64_t region = o.memory;
    // UCX's queues and a mirror's own context: a few MiB per server (docs/pool.md measured 6).
    const uint64_t overhead = 3 * (16ull << 20);
    HeldMemory held = SharedMemoryHeld(pids);
    std::printf("%s: %llu MiB held in shared memory, %llu MiB of it in mirror slots\n",
                copies ? "forwarded copies" : "shared pages",
                static_cast<unsigned long long>(held.all >> 20),
                static_cast<unsigned long long>(held.slots >> 20));
    if (!copies) {
      EXPECT_EQ(held.slots, 0u) << "a shared-pages slot committed memory";
      EXPECT_LE(held.all, 3 * region + overhead) << "more than one copy of each region";
      ASSERT_EQ(kill(pids[1], SIGKILL), 0);
      Status moved = AwaitFailedOver(pl, 1);
      ASSERT_TRUE(moved.ok()) << moved.ToString();
      pids.erase(pids.begin() + 1);
      held = SharedMemoryHeld(pids);
      EXPECT_EQ(held.slots, 0u) << "a slot committed memory at the failover";
      EXPECT_LE(held.all, 3 * region + overhead);
    } else {
      // The attach of each ring primary commits its slot: cluster up has named the backups.
      EXPECT_GE(held.slots, 3 * region) << "a ring slot holds no memory for its copy";
      EXPECT_LT(held.slots, 3 * (region + (4ull << 20))) << "the second slots committed memory";
      EXPECT_LE(held.all, 6 * region + overhead);
    }
  }
}

// A control connection to server `address`'s mirror port with the cluster's secret, as a
// primary's link or the coordinator opens it.
Result<std::unique_ptr<control::Connection>> OpenMirror(const ServerAddress& address,
                                                        const transport::ClusterSecret& secret) {
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = 0x5eed0002;
  control::Connection::Options o{"server " + std::to_string(address.id),
                                 address.host,
                                 address.port,
                                 &secret,
                                 Fabric::kTcp,
                                 3000ms};
  FARPOOL_ASSIGN_OR_RETURN(auto main_port, control::Connection::Open(o, hello));
  o.port = main_port->hello().mirror_port;
  return control::Connection::Open(o, hello);
}

// The memory of server `pid`'s mirror slots (st_blocks of its slots' memfd) once it is
// `expected`, or what it was after 30 s (the server acts on its loop, after the reply).
uint64_t SlotMemoryOnce(pid_t pid, uint64_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  uint64_t held = SharedMemoryHeld({pid}).slots;
  while (held != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    held = SharedMemoryHeld({pid}).slots;
  }
  return held;
}

// A forward that a slot refuses leaves it as it found it (docs/pool.md "Mirror slots cost
// nothing until they hold a copy"): three servers x 64 MiB with forwarded copies and two slots;
// forwards from an authenticated peer that the slots refuse (server 0 is not slot 1's primary,
// which is free, nor slot 0's, which keeps server 1's copy): server 2 holds the ring slot's
// memory, no more (the free slot gave back what the refused forward committed), and no less
// (the ring's copy keeps its memory).
TEST(SharedPages, AForwardTheSlotRefusesLeavesItsMemoryAsItWas) {
  LocalClusterOptions o = SharedPagesCluster();
  o.mirror_slots = 2;
  o.forward_copies = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto config = cluster.config();
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto secret = transport::ClusterSecret::Read(config->secret_file);
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  const ServerAddress& s2 = config->servers[2];
  const pid_t pid = static_cast<pid_t>(s2.pid);
  const uint64_t ring = SharedMemoryHeld({pid}).slots;
  ASSERT_GE(ring, o.memory) << "the ring's slot 0 holds server 1's copy";
  auto mirror = OpenMirror(s2, *secret);
  ASSERT_TRUE(mirror.ok()) << mirror.status().ToString();
  for (uint16_t slot : {1, 0}) {
    SCOPED_TRACE("slot " + std::to_string(slot));
    const wire::ReplicateRequest forward{0, slot, 0, 0, 0};
    Status refused = (*mirror)
                         ->Call([&](uint64_t id) { return wire::Encode(id, forward); },
                                wire::Opcode::kReplicateReply)
                         .status();
    EXPECT_EQ(refused.code(), StatusCode::kNotFound) << refused.ToString();
    EXPECT_NE(refused.message().find("not from its primary"), std::string::npos)
        << refused.message();
    EXPECT_EQ(SharedMemoryHeld({pid}).slots, ring) << "server 2's slots after the refusal";
  }
}

// A slot whose copy its primary gives up frees its memory (docs/pool.md, same section): three
// servers x 64 MiB with forwarded copies; server 0 is told its backup, server 1, is gone (a
// DegradeRequest, as the coordinator sends when it fails server 1 over): it serves on with one
// copy and tells server 1 it gives the copy up, and server 1's slot memory goes back to the
// host (st_blocks of its slots' file: 64 MiB, then 0), while server 2 keeps server 1's copy.
TEST(SharedPages, ASlotWhoseCopyIsGivenUpGivesItsMemoryBack) {
  LocalClusterOptions o = SharedPagesCluster();
  o.mirror_slots = 2;
  o.forward_copies = true;
  TestCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status().ToString();
  auto client = ConnectTestClient(cluster);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const ClusterConfig& config = client->config;
  auto secret = transport::ClusterSecret::Read(config.secret_file);
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  const pid_t backup = static_cast<pid_t>(config.servers[1].pid);
  const pid_t other = static_cast<pid_t>(config.servers[2].pid);
  const uint64_t ring = SharedMemoryHeld({other}).slots;
  ASSERT_GE(ring, o.memory) << "server 2's slot 0: server 1's copy";
  ASSERT_EQ(SharedMemoryHeld({backup}).slots, ring) << "server 1's slot 0: server 0's copy";
  auto mirror = OpenMirror(config.servers[0], *secret);
  ASSERT_TRUE(mirror.ok()) << mirror.status().ToString();
  const wire::DegradeRequest gone{1, {}};
  Status told =
      (*mirror)
          ->Call([&](uint64_t id) { return wire::Encode(id, gone); }, wire::Opcode::kDegradeReply)
          .status();
  ASSERT_TRUE(told.ok()) << told.ToString();
  EXPECT_EQ(SlotMemoryOnce(backup, 0), 0u) << "server 1 keeps the memory of a copy given up";
  EXPECT_EQ(SharedMemoryHeld({other}).slots, ring) << "server 2's copy of server 1";
  // Server 0 serves on (one copy).
  auto a = client->pool->Alloc(4096, Placement::OnServer(0));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const uint64_t v = 11;
  EXPECT_TRUE(client->pool->Write(*a, &v, 8).ok());
}

}  // namespace
}  // namespace farpool
