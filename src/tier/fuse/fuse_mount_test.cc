// `farpool mount` for real: a `farpool cluster` of server processes, the mount daemon started by
// the CLI on a temporary directory, and the test process using the mount with plain system
// calls (and fio). Every mount is undone in teardown, also when a test fails.
//
// What is checked: POSIX behaviour (files, holes, truncate, rename over, directories, long
// names, many files, fsync, punch hole freeing space), everything still there after unmount +
// mount, the page cache and the daemon's extent maps agreeing with the pool through overwrites,
// appends, truncates and holes, data integrity under concurrent writers (fio --verify), unmount
// with open files, a SIGKILLed daemon (the next mount reclaims the lease, acknowledged changes are
// there), a second concurrent mount refused naming the holder, a full pool (ENOSPC, the file intact
// up to the last successful fsync), a lost server (EIO, no hang; one of two: EIO for its extents
// only), the errnos of long paths, rename flags and special files, `--foreground`, and a mount
// from another host (a client network namespace) seeing the same files.
#include "tier/fuse/fuse_mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "files/file_store.h"
#include "files/layout.h"
#include "pool/test_cluster.h"

namespace farpool {
namespace {

struct Outcome {
  int code;
  std::string output;
};

// Runs a shell command, capturing stdout and stderr.
Outcome Shell(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

std::vector<unsigned char> Pattern(size_t n, uint32_t seed) {
  std::vector<unsigned char> v(n);
  std::mt19937 rng(seed);
  for (auto& c : v) c = static_cast<unsigned char>(rng());
  return v;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  ASSERT_TRUE(out.good()) << path;
}

// The daemon pid of the farpool mount at `dir` (its source is farpool:<name>:<pid>); 0 if none.
pid_t DaemonOf(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, word, type, source;
    f >> id >> parent >> dev >> root >> point;
    if (point != dir) continue;
    while (f >> word && word != "-") {
    }
    f >> type >> source;
    if (type != "fuse.farpool") continue;
    return static_cast<pid_t>(std::atol(source.c_str() + source.rfind(':') + 1));
  }
  return 0;
}

// Waits up to `timeout_ms` (-1: forever) for process `pid` (not a child) to exit; whether it did.
bool AwaitExit(pid_t pid, int timeout_ms = -1) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return true;  // gone already
  pollfd p{fd, POLLIN, 0};
  int ready;
  while ((ready = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  close(fd);
  return ready > 0;
}

class FuseMountTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Servers, daemons and this process talk over loopback only: other work on a shared host
    // that adds and removes network namespaces' bridges otherwise breaks UCX connections made
    // to addresses on them ("connection lost").
    setenv("UCX_NET_DEVICES", "lo", 1);
    cluster_ = Start(2, 512ull << 20);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static TestCluster* Start(int servers, uint64_t memory, Fabric transport = Fabric::kAuto) {
    LocalClusterOptions o;
    o.servers = servers;
    o.memory = memory;
    o.chunk_size = 1ull << 20;
    o.transport = transport;
    o.progress = ProgressMode::kEvent;  // a shared 2-core machine
    auto* c = new TestCluster(o);
    EXPECT_TRUE(c->status().ok()) << c->status().ToString();
    return c;
  }
  // A cluster over TCP with each server in a network namespace of its own (replicas 0).
  // REQUIRES: root.
  static std::unique_ptr<TestCluster> StartNetns(int servers, uint64_t memory) {
    LocalClusterOptions o;
    o.servers = servers;
    o.memory = memory;
    o.chunk_size = 1ull << 20;
    o.transport = Fabric::kTcp;
    o.progress = ProgressMode::kEvent;
    o.netns = true;
    // This process reaches the suite's servers over loopback only (SetUpTestSuite); the new
    // cluster's readiness check must reach its namespaces.
    unsetenv("UCX_NET_DEVICES");
    auto c = std::make_unique<TestCluster>(o);
    setenv("UCX_NET_DEVICES", "lo", 1);
    return c;
  }

  void SetUp() override {
    ASSERT_TRUE(cluster_ != nullptr && cluster_->status().ok());
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    name_ = info->name();
    dir_ = MakeTempDir("fuse-" + name_);
  }
  // Unmounts whatever this test mounted, however it ended: a failed assertion may leave files
  // open, which would keep a lazily unmounted daemon serving, so the daemon is asked to stop
  // (SIGTERM ends its FUSE loop; it releases its lease and exits) and killed if it cannot.
  void TearDown() override {
    for (const std::string& m : mounts_) {
      const pid_t daemon = DaemonOf(m);
      if (daemon == 0) continue;
      Shell("umount -l " + m);
      kill(daemon, SIGTERM);
      if (!AwaitExit(daemon, 30000)) kill(daemon, SIGKILL);
    }
    for (const pid_t daemon : foreign_daemons_) {
      kill(daemon, SIGTERM);
      if (!AwaitExit(daemon, 30000)) kill(daemon, SIGKILL);
    }
    if (HasFailure()) {
      for (const std::string& m : mounts_) {
        std::fprintf(stderr, "--- daemon log of %s:\n%s\n", m.c_str(), ReadAll(m + ".log").c_str());
      }
    }
    Shell("rm -rf " + dir_);
  }

  // A new empty directory under this test's temporary directory.
  std::string NewDir(const std::string& leaf) {
    const std::string d = dir_ + "/" + leaf;
    mkdir(d.c_str(), 0755);
    return d;
  }
  // `farpool mount`, its command line after `prefix` (e.g. `env -u UCX_NET_DEVICES `).
  Outcome MountAt(const std::string& point, const std::string& fs, TestCluster& cluster,
                  const std::string& flags = "", const std::string& prefix = "") {
    mounts_.insert(point);
    return Shell(prefix + FARPOOL_BINARY + " mount --cluster " + cluster.cluster_file() +
                 " --name " + fs + " --log " + point + ".log " + flags + " " + point);
  }
  // Mounts this test's filesystem at `point` on the suite's cluster; asserts success.
  void Mount(const std::string& point, TestCluster* cluster = nullptr,
             const std::string& flags = "", const std::string& prefix = "") {
    Outcome r = MountAt(point, name_, cluster != nullptr ? *cluster : *cluster_, flags, prefix);
    ASSERT_EQ(r.code, 0) << r.output;
  }
  void Unmount(const std::string& point) {
    Outcome r = Shell(std::string(FARPOOL_BINARY) + " umount " + point);
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_EQ(DaemonOf(point), 0) << point << " is still mounted";
  }

  static TestCluster* cluster_;
  std::string name_, dir_;
  std::set<std::string> mounts_;
  // Daemons whose mounts are in other mount namespaces: ended in teardown.
  std::vector<pid_t> foreign_daemons_;
};
TestCluster* FuseMountTest::cluster_ = nullptr;

TEST_F(FuseMountTest, FilesHolesTruncateRenameAndTheyOutliveTheMount) {
  const std::string m = NewDir("m");
  Mount(m);
  // Write and read back, across extent boundaries (256 KiB).
  const auto data = Pattern(3 << 20, 1);
  const std::string a = m + "/a";
  WriteAll(a, std::string(data.begin(), data.end()));
  EXPECT_EQ(ReadAll(a), std::string(data.begin(), data.end()));

  // A hole: 1 byte at 10 MiB; everything before reads as zeros past the data.
  {
    const int fd = open((m + "/sparse").c_str(), O_CREAT | O_RDWR, 0644);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(pwrite(fd, "x", 1, 10 << 20), 1);
    ASSERT_EQ(fsync(fd), 0) << strerror(errno);
    close(fd);
    const std::string s = ReadAll(m + "/sparse");
    ASSERT_EQ(s.size(), (10u << 20) + 1);
    EXPECT_EQ(s.find_first_not_of('\0'), 10u << 20);
  }

  // Truncate down into an extent, then up: the cut bytes come back as zeros.
  ASSERT_EQ(truncate(a.c_str(), 300000), 0) << strerror(errno);
  ASSERT_EQ(truncate(a.c_str(), 1 << 20), 0) << strerror(errno);
  {
    const std::string s = ReadAll(a);
    ASSERT_EQ(s.size(), 1u << 20);
    EXPECT_EQ(s.substr(0, 300000), std::string(data.begin(), data.begin() + 300000));
    EXPECT_EQ(s.find_first_not_of('\0', 300000), std::string::npos);
  }

  // Rename over an existing file: the target has the source's bytes, the source is gone.
  WriteAll(m + "/old", "old contents");
  WriteAll(m + "/new", "new contents");
  ASSERT_EQ(rename((m + "/new").c_str(), (m + "/old").c_str()), 0) << strerror(errno);
  EXPECT_EQ(ReadAll(m + "/old"), "new contents");
  EXPECT_NE(access((m + "/new").c_str(), F_OK), 0);
  // RENAME_NOREPLACE onto an existing name: EEXIST.
  EXPECT_EQ(syscall(SYS_renameat2, AT_FDCWD, (m + "/sparse").c_str(), AT_FDCWD,
                    (m + "/old").c_str(), RENAME_NOREPLACE),
            -1);
  EXPECT_EQ(errno, EEXIST);

  // chmod and utimens are kept.
  ASSERT_EQ(chmod((m + "/old").c_str(), 0600), 0);
  const timespec times[2] = {{1000000000, 5}, {1200000000, 7}};
  ASSERT_EQ(utimensat(AT_FDCWD, (m + "/old").c_str(), times, 0), 0) << strerror(errno);

  // fsync and fdatasync of a file and fsync of a directory succeed.
  {
    const int fd = open(a.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(fsync(fd), 0) << strerror(errno);
    EXPECT_EQ(fdatasync(fd), 0) << strerror(errno);
    close(fd);
    const int dfd = open(m.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(dfd, 0);
    EXPECT_EQ(fsync(dfd), 0) << strerror(errno);
    close(dfd);
  }

  // Unmount and mount again: all of it is in the pool.
  Unmount(m);
  Mount(m);
  {
    const std::string s = ReadAll(a);
    ASSERT_EQ(s.size(), 1u << 20);
    EXPECT_EQ(s.substr(0, 300000), std::string(data.begin(), data.begin() + 300000));
    EXPECT_EQ(ReadAll(m + "/old"), "new contents");
    EXPECT_EQ(ReadAll(m + "/sparse").size(), (10u << 20) + 1);
    struct stat st;
    ASSERT_EQ(stat((m + "/old").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_EQ(st.st_mtim.tv_sec, 1200000000);
    EXPECT_EQ(st.st_mtim.tv_nsec, 7);
  }
}

// The daemon stays in the caller's session (so in its scheduling autogroup: a daemon alone in a
// session of its own is a scheduling group of its own, starved on a loaded host as the memory
// servers were, docs/pool.md "Failure detection") but leads a process group of its own, out of
// the terminal's job control, and ignores SIGHUP.
TEST_F(FuseMountTest, TheDaemonSharesTheCallersSessionInAGroupOfItsOwn) {
  const std::string m = NewDir("m");
  Mount(m);
  const pid_t daemon = DaemonOf(m);
  ASSERT_GT(daemon, 0);
  EXPECT_EQ(getpgid(daemon), daemon) << "not the leader of a process group of its own";
  EXPECT_EQ(getsid(daemon), getsid(0)) << "a session of its own";
  // SigIgn in /proc/PID/status: a hex mask, bit (SIGHUP - 1).
  std::istringstream status(ReadAll("/proc/" + std::to_string(daemon) + "/status"));
  uint64_t ignored = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigIgn:", 0) == 0) ignored = std::stoull(line.substr(7), nullptr, 16);
  }
  EXPECT_NE(ignored & (uint64_t{1} << (SIGHUP - 1)), 0u) << "SIGHUP is not ignored";
  Unmount(m);
}

TEST_F(FuseMountTest, DirectoriesNamesAndManyFiles) {
  const std::string m = NewDir("m");
  Mount(m);
  ASSERT_EQ(mkdir((m + "/d").c_str(), 0755), 0) << strerror(errno);
  ASSERT_EQ(mkdir((m + "/d/e").c_str(), 0755), 0) << strerror(errno);
  WriteAll(m + "/d/e/f", "deep");
  EXPECT_EQ(mkdir((m + "/d").c_str(), 0755), -1);
  EXPECT_EQ(errno, EEXIST);
  EXPECT_EQ(rmdir((m + "/d").c_str()), -1);
  EXPECT_EQ(errno, ENOTEMPTY);
  EXPECT_EQ(rmdir((m + "/d/e/f").c_str()), -1);
  EXPECT_EQ(errno, ENOTDIR);
  EXPECT_EQ(unlink((m + "/d").c_str()), -1);
  EXPECT_EQ(errno, EISDIR);
  // A directory cannot move into itself.
  EXPECT_EQ(rename((m + "/d").c_str(), (m + "/d/e/d").c_str()), -1);
  EXPECT_EQ(errno, EINVAL);
  // A directory moves with its contents.
  ASSERT_EQ(rename((m + "/d/e").c_str(), (m + "/e2").c_str()), 0) << strerror(errno);
  EXPECT_EQ(ReadAll(m + "/e2/f"), "deep");
  ASSERT_EQ(rmdir((m + "/d").c_str()), 0) << strerror(errno);

  // Names: 255 bytes work, 256 are ENAMETOOLONG.
  const std::string longest(255, 'n');
  WriteAll(m + "/" + longest, "long");
  EXPECT_EQ(ReadAll(m + "/" + longest), "long");
  const std::string too_long = m + "/" + std::string(256, 'n');
  EXPECT_EQ(open(too_long.c_str(), O_CREAT | O_WRONLY, 0644), -1);
  EXPECT_EQ(errno, ENAMETOOLONG);
  EXPECT_EQ(mkdir(too_long.c_str(), 0755), -1);
  EXPECT_EQ(errno, ENAMETOOLONG);

  // Many files in one directory, listed completely (readdir continues across batches).
  ASSERT_EQ(mkdir((m + "/many").c_str(), 0755), 0);
  constexpr int kFiles = 1000;  // each takes at least one 256 KiB extent
  for (int i = 0; i < kFiles; ++i) {
    WriteAll(m + "/many/file-" + std::to_string(i), std::to_string(i * 7));
  }
  for (int i = 0; i < kFiles; i += 2) {
    ASSERT_EQ(unlink((m + "/many/file-" + std::to_string(i)).c_str()), 0);
  }
  auto list = [&](const std::string& d) {
    std::set<std::string> names;
    DIR* dir = opendir(d.c_str());
    EXPECT_NE(dir, nullptr);
    if (dir == nullptr) return names;
    while (dirent* e = readdir(dir)) names.insert(e->d_name);
    closedir(dir);
    return names;
  };
  auto check = [&] {
    const std::set<std::string> names = list(m + "/many");
    EXPECT_EQ(names.size(), kFiles / 2 + 2u);  // with "." and ".."
    for (int i = 1; i < kFiles; i += 2) {
      ASSERT_EQ(names.count("file-" + std::to_string(i)), 1u) << i;
      ASSERT_EQ(ReadAll(m + "/many/file-" + std::to_string(i)), std::to_string(i * 7));
    }
  };
  check();
  const std::set<std::string> top = list(m);
  EXPECT_EQ(top, (std::set<std::string>{".", "..", "e2", "many", longest}));

  Unmount(m);
  Mount(m);
  check();
  EXPECT_EQ(ReadAll(m + "/e2/f"), "deep");
  EXPECT_NE(access((m + "/d").c_str(), F_OK), 0);
}

TEST_F(FuseMountTest, PunchHoleGivesSpaceBackAndStatfsShowsThePool) {
  const std::string m = NewDir("m");
  Mount(m);
  struct statvfs before, after;
  ASSERT_EQ(statvfs(m.c_str(), &before), 0) << strerror(errno);
  // Two servers of 512 MiB (less what the servers keep for themselves).
  EXPECT_LE(before.f_blocks * before.f_frsize, 1024ull << 20);
  EXPECT_GE(before.f_blocks * before.f_frsize, 1000ull << 20);
  EXPECT_LE(before.f_bfree, before.f_blocks);
  EXPECT_EQ(before.f_namemax, 255u);

  const std::string f = m + "/temp";
  const int fd = open(f.c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  const auto data = Pattern(16 << 20, 2);
  ASSERT_EQ(pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(fsync(fd), 0) << strerror(errno);
  ASSERT_EQ(statvfs(m.c_str(), &before), 0);
  // Punch 8 MiB out of the middle (32 whole extents), keeping the size.
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4 << 20, 8 << 20), 0)
      << strerror(errno);
  ASSERT_EQ(statvfs(m.c_str(), &after), 0);
  EXPECT_GE(after.f_bfree * after.f_frsize, before.f_bfree * before.f_frsize + (8 << 20))
      << "punching 8 MiB should free 8 MiB";
  // The hole reads as zeros, the rest is intact, the size is unchanged.
  std::vector<unsigned char> back(data.size());
  ASSERT_EQ(pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + (4 << 20), data.begin()));
  EXPECT_TRUE(std::all_of(back.begin() + (4 << 20), back.begin() + (12 << 20),
                          [](unsigned char c) { return c == 0; }));
  EXPECT_TRUE(std::equal(back.begin() + (12 << 20), back.end(), data.begin() + (12 << 20)));
  // A partial hole inside one extent zeroes just those bytes.
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 1000), 0);
  unsigned char some[1200];
  ASSERT_EQ(pread(fd, some, sizeof(some), 0), static_cast<ssize_t>(sizeof(some)));
  EXPECT_TRUE(std::equal(some, some + 100, data.begin()));
  EXPECT_TRUE(std::all_of(some + 100, some + 1100, [](unsigned char c) { return c == 0; }));
  EXPECT_TRUE(std::equal(some + 1100, some + 1200, data.begin() + 1100));
  // Plain fallocate grows the file with zeros; an unknown mode is EOPNOTSUPP.
  ASSERT_EQ(fallocate(fd, 0, 16 << 20, 1 << 20), 0) << strerror(errno);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 17 << 20);
  EXPECT_EQ(fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, 0, 1 << 20), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  close(fd);
  ASSERT_EQ(unlink(f.c_str()), 0);
}

// The kernel keeps a file's pages across opens and the daemon keeps its extent map: after
// writes, appends, truncates and holes made while both are warm, what a buffered read (the page
// cache) returns, what an O_DIRECT read (the daemon, from the pool) returns and what another
// mount point of the filesystem reads after a remount (cold caches) all agree.
TEST_F(FuseMountTest, PageCacheExtentCacheAndPoolAgree) {
  const std::string m = NewDir("m");
  Mount(m);
  const std::string f = m + "/cached";
  constexpr size_t kSize = 2 << 20;
  auto expected = Pattern(kSize, 4);
  const int fd = open(f.c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(pwrite(fd, expected.data(), kSize, 0), static_cast<ssize_t>(kSize));
  ASSERT_EQ(fsync(fd), 0) << strerror(errno);
  // Buffered reads fill the page cache; O_DIRECT reads of the same file go to the daemon.
  auto agree = [&](const char* after) {
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    ASSERT_EQ(static_cast<size_t>(st.st_size), expected.size()) << after;
    std::vector<unsigned char> cached(expected.size());
    ASSERT_EQ(pread(fd, cached.data(), cached.size(), 0), static_cast<ssize_t>(cached.size()));
    EXPECT_TRUE(cached == expected) << "page cache, after " << after;
    const int direct = open(f.c_str(), O_RDONLY | O_DIRECT);
    ASSERT_GE(direct, 0) << strerror(errno);
    const size_t aligned = (expected.size() + 4095) / 4096 * 4096;
    void* raw = nullptr;
    ASSERT_EQ(posix_memalign(&raw, 4096, aligned), 0);
    std::unique_ptr<unsigned char, decltype(&free)> pool(static_cast<unsigned char*>(raw), free);
    EXPECT_EQ(pread(direct, pool.get(), aligned, 0), static_cast<ssize_t>(expected.size()));
    close(direct);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), pool.get()))
        << "pool, after " << after;
  };
  agree("the first write");
  // Overwrite pages that are cached, at random places, then read again.
  std::mt19937 rng(5);
  for (int i = 0; i < 64; ++i) {
    const size_t at = rng() % (kSize - 5000);
    const auto patch = Pattern(5000, 100 + i);
    ASSERT_EQ(pwrite(fd, patch.data(), patch.size(), at), 5000);
    std::copy(patch.begin(), patch.end(), expected.begin() + at);
  }
  ASSERT_EQ(fsync(fd), 0);
  agree("overwrites");
  // Append past the end: the new size comes with the data.
  const auto tail = Pattern(300000, 9);
  ASSERT_EQ(pwrite(fd, tail.data(), tail.size(), kSize), static_cast<ssize_t>(tail.size()));
  expected.insert(expected.end(), tail.begin(), tail.end());
  ASSERT_EQ(fsync(fd), 0);
  agree("an append");
  // Shrink into an extent whose map the daemon holds, then grow: the cut bytes are zeros.
  ASSERT_EQ(ftruncate(fd, 700000), 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0) << strerror(errno);
  expected.resize(700000);
  expected.resize(1 << 20, 0);
  agree("truncate down and up");
  // A hole over cached pages: whole extents released, partial ones zeroed.
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100000, 500000), 0)
      << strerror(errno);
  std::fill(expected.begin() + 100000, expected.begin() + 600000, 0);
  agree("punch hole");
  // Writing into the punched range maps new extents.
  const auto refill = Pattern(300000, 11);
  ASSERT_EQ(pwrite(fd, refill.data(), refill.size(), 200000), 300000);
  std::copy(refill.begin(), refill.end(), expected.begin() + 200000);
  ASSERT_EQ(fsync(fd), 0);
  agree("a write into the hole");
  close(fd);
  // Another mount point of the same filesystem, cold caches: the same bytes.
  Unmount(m);
  const std::string m2 = NewDir("m2");
  Mount(m2);
  EXPECT_TRUE(ReadAll(m2 + "/cached") == std::string(expected.begin(), expected.end()));
}

// Buffered writes of far more than the kernel's 1% dirty share for FUSE mounts: the daemon raised
// the mount's share (MountOptions::dirty_share), the bytes come back after writeback, unmount and
// a mount elsewhere. Mounted with paths relative to the caller's directory, as a user types them
// (the daemon works in "/").
TEST_F(FuseMountTest, BufferedWritesBeyondTheFuseDirtyShareReadBack) {
  const std::string m = NewDir("m");
  mounts_.insert(m);
  const std::string cluster = std::filesystem::relative(cluster_->cluster_file(), dir_).string();
  Outcome r = Shell("cd " + dir_ + " && " + FARPOOL_BINARY + " mount --cluster " + cluster +
                    " --name " + name_ + " --log m.log m");
  ASSERT_EQ(r.code, 0) << r.output;
  struct stat st;
  ASSERT_EQ(stat(m.c_str(), &st), 0) << strerror(errno);
  const std::string bdi =
      "/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  EXPECT_EQ(ReadAll(bdi + "/max_ratio"),
            std::to_string(fuse::MountOptions::kDefaultDirtyShare) + "\n");
  EXPECT_EQ(ReadAll(bdi + "/strict_limit"), "1\n");

  constexpr size_t kFiles = 3, kSize = 32 << 20, kBlock = 64 << 10;
  for (size_t f = 0; f < kFiles; ++f) {
    const auto bytes = Pattern(kSize, 40 + f);
    const int fd = open((m + "/big" + std::to_string(f)).c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0) << strerror(errno);
    // Blocks in a shuffled order, so writeback sees scattered dirty pages.
    std::vector<size_t> order(kSize / kBlock);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i * kBlock;
    std::shuffle(order.begin(), order.end(), std::mt19937(f));
    for (size_t at : order) {
      ASSERT_EQ(pwrite(fd, bytes.data() + at, kBlock, at), static_cast<ssize_t>(kBlock));
    }
    ASSERT_EQ(close(fd), 0) << strerror(errno);
  }
  Unmount(m);
  const std::string m2 = NewDir("m2");
  Mount(m2);
  for (size_t f = 0; f < kFiles; ++f) {
    const auto bytes = Pattern(kSize, 40 + f);
    EXPECT_TRUE(ReadAll(m2 + "/big" + std::to_string(f)) == std::string(bytes.begin(), bytes.end()))
        << "file " << f;
  }
}

// A `--netns` cluster started while a mount exists: `ip netns exec` gives each of its servers a
// mount namespace that begins as a copy of ours, mount included. The server detaches its copy
// (DetachCopiedMounts), so `farpool umount` here ends the daemon, not only the server's exit.
TEST_F(FuseMountTest, ANetnsClusterStartedLaterHoldsNoCopyOfTheMount) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const std::string m = NewDir("m");
  Mount(m);
  const pid_t daemon = DaemonOf(m);
  ASSERT_GT(daemon, 0);
  const std::unique_ptr<TestCluster> other = StartNetns(1, 16ull << 20);
  ASSERT_TRUE(other->status().ok()) << other->status().ToString();
  const auto config = other->config();
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const std::string theirs =
      ReadAll("/proc/" + std::to_string(config->servers[0].pid) + "/mountinfo");
  ASSERT_FALSE(theirs.empty());
  EXPECT_EQ(theirs.find(" " + m + " "), std::string::npos) << theirs;
  Unmount(m);
  EXPECT_TRUE(AwaitExit(daemon, 60000)) << "the daemon still serves a copy of the mount";
}

TEST_F(FuseMountTest, ConcurrentWritersVerifiedByFio) {
  if (Shell("command -v fio").code != 0) GTEST_SKIP() << "fio is not installed";
  const std::string m = NewDir("m");
  Mount(m);
  const std::string job = "fio --name=verify --directory=" + m +
                          " --ioengine=psync --rw=randwrite --bs=4k --size=8m --numjobs=4"
                          " --verify=crc32c --verify_fatal=1 --fsync_on_close=1"
                          " --randrepeat=1 --group_reporting";
  Outcome r = Shell(job + " --do_verify=1");
  ASSERT_EQ(r.code, 0) << r.output;
  // The same data, verified again by another mount.
  Unmount(m);
  Mount(m);
  r = Shell(job + " --verify_only");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("verify: bad"), std::string::npos) << r.output;
}

TEST_F(FuseMountTest, UnmountWithOpenFiles) {
  const std::string m = NewDir("m");
  Mount(m);
  int fd = open((m + "/open").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "still open", 10), 10);
  // Busy: refused with the reason, the mount stays.
  Outcome r = Shell(std::string(FARPOOL_BINARY) + " umount " + m);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("busy"), std::string::npos) << r.output;
  ASSERT_NE(DaemonOf(m), 0);
  // Lazy: detached now; the open file still works; the daemon ends when it is closed.
  const pid_t daemon = DaemonOf(m);
  r = Shell(std::string(FARPOOL_BINARY) + " umount --lazy " + m);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(DaemonOf(m), 0);
  ASSERT_EQ(pwrite(fd, "!", 1, 10), 1);
  ASSERT_EQ(fsync(fd), 0) << strerror(errno);
  close(fd);
  AwaitExit(daemon);
  Mount(m);
  EXPECT_EQ(ReadAll(m + "/open"), "still open!");
}

TEST_F(FuseMountTest, KilledDaemonLosesNothingAcknowledgedAndItsLeaseIsReclaimed) {
  const std::string m = NewDir("m");
  Mount(m);
  const auto data = Pattern(1 << 20, 3);
  {
    const int fd = open((m + "/synced").c_str(), O_CREAT | O_RDWR, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    ASSERT_EQ(fsync(fd), 0) << strerror(errno);
    close(fd);
  }
  // Metadata is in the pool when the call returns, without any fsync.
  ASSERT_EQ(mkdir((m + "/dir").c_str(), 0700), 0);
  ASSERT_EQ(rename((m + "/synced").c_str(), (m + "/dir/renamed").c_str()), 0);
  const pid_t daemon = DaemonOf(m);
  ASSERT_GT(daemon, 0);
  ASSERT_EQ(kill(daemon, SIGKILL), 0);
  AwaitExit(daemon);
  Shell("umount -l " + m);
  // The next mount waits out the dead daemon's lease, then has everything.
  Mount(m);
  const std::string back = ReadAll(m + "/dir/renamed");
  EXPECT_TRUE(back == std::string(data.begin(), data.end())) << back.size() << " bytes";
  struct stat st;
  ASSERT_EQ(stat((m + "/dir").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_NE(access((m + "/synced").c_str(), F_OK), 0);
}

// `--direct-io` bypasses the page cache: mmap(MAP_SHARED) fails with ENODEV (which no cached
// mount does) while MAP_PRIVATE reads the file; writes of DuckDB's block size, a truncate and
// reads see the pool's bytes; and a write is in the pool when it returns, so the daemon
// SIGKILLed without any fsync loses none of it.
TEST_F(FuseMountTest, DirectIoWritesAreInThePoolWhenTheyReturn) {
  const std::string m = NewDir("m");
  Mount(m, nullptr, "--direct-io");
  const auto data = Pattern(3 << 20, 5);
  const int fd = open((m + "/spill").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  for (size_t at = 0; at < data.size(); at += 256 << 10) {  // DuckDB's block size
    ASSERT_EQ(pwrite(fd, data.data() + at, 256 << 10, static_cast<off_t>(at)), 256 << 10);
  }
  ASSERT_EQ(ftruncate(fd, 2 << 20), 0) << strerror(errno);
  std::vector<unsigned char> back(1 << 20);
  ASSERT_EQ(pread(fd, back.data(), back.size(), 1 << 20), static_cast<ssize_t>(back.size()));
  EXPECT_TRUE(std::equal(back.begin(), back.end(), data.begin() + (1 << 20)));
  errno = 0;
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_EQ(errno, ENODEV);
  void* priv = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
  ASSERT_NE(priv, MAP_FAILED) << strerror(errno);
  EXPECT_EQ(std::memcmp(priv, data.data(), 4096), 0);
  munmap(priv, 4096);
  const pid_t daemon = DaemonOf(m);
  ASSERT_GT(daemon, 0);
  ASSERT_EQ(kill(daemon, SIGKILL), 0);
  AwaitExit(daemon);
  close(fd);
  Shell("umount -l " + m);
  Mount(m);
  const std::string after = ReadAll(m + "/spill");
  EXPECT_TRUE(after == std::string(data.begin(), data.begin() + (2 << 20)))
      << after.size() << " bytes";
}

TEST_F(FuseMountTest, SecondConcurrentMountIsRefusedNamingTheHolder) {
  const std::string m1 = NewDir("m1"), m2 = NewDir("m2");
  Mount(m1);
  Outcome r = MountAt(m2, name_, *cluster_);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("is mounted by"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pid " + std::to_string(DaemonOf(m1))), std::string::npos) << r.output;
  EXPECT_EQ(DaemonOf(m2), 0);
  // Another filesystem of the same pool mounts beside it.
  r = MountAt(m2, name_ + "-other", *cluster_);
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(FuseMountTest, FullPoolIsEnospcWithTheFileIntact) {
  std::unique_ptr<TestCluster> tiny(Start(1, 24ull << 20));
  ASSERT_TRUE(tiny->status().ok());
  const std::string m = NewDir("m");
  Mount(m, tiny.get());
  const std::string f = m + "/big";
  const int fd = open(f.c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  const auto chunk = Pattern(1 << 20, 4);
  uint64_t synced = 0;
  int err = 0;
  for (int i = 0; i < 64 && err == 0; ++i) {
    if (pwrite(fd, chunk.data(), chunk.size(), synced) != static_cast<ssize_t>(chunk.size()) ||
        fsync(fd) != 0) {
      err = errno;
    } else {
      synced += chunk.size();
    }
  }
  close(fd);
  ASSERT_EQ(err, ENOSPC) << strerror(err);
  ASSERT_GT(synced, 0u);
  auto intact = [&] {
    const std::string s = ReadAll(f);
    ASSERT_GE(s.size(), synced);
    for (uint64_t off = 0; off < synced; off += chunk.size()) {
      ASSERT_EQ(std::memcmp(s.data() + off, chunk.data(), chunk.size()), 0) << "at " << off;
    }
  };
  intact();
  Unmount(m);
  Mount(m, tiny.get());
  intact();
  // The space comes back with the file.
  ASSERT_EQ(unlink(f.c_str()), 0);
  WriteAll(m + "/again", std::string(chunk.begin(), chunk.end()));
  EXPECT_EQ(ReadAll(m + "/again").size(), chunk.size());
  Unmount(m);
}

TEST_F(FuseMountTest, LostServerIsEioNotAHang) {
  std::unique_ptr<TestCluster> doomed(Start(2, 64ull << 20));
  ASSERT_TRUE(doomed->status().ok());
  const std::string m = NewDir("m");
  Mount(m, doomed.get());
  const auto data = Pattern(4 << 20, 5);
  WriteAll(m + "/f", std::string(data.begin(), data.end()));
  auto servers = ClusterStatus(doomed->dir());
  ASSERT_TRUE(servers.ok()) << servers.status().ToString();
  for (const ServerStatus& server : *servers) {
    ASSERT_GT(server.stats.pid, 0);
    ASSERT_EQ(kill(static_cast<pid_t>(server.stats.pid), SIGKILL), 0);
  }
  // Until the daemon's pool notices (its heartbeats go unanswered), a read over mapped shared
  // memory may still succeed; then every read is EIO. A hang fails the test by its timeout.
  const int fd = open((m + "/f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << strerror(errno);
  std::vector<unsigned char> back(data.size());
  int err = 0;
  while (err == 0) {
    ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);  // past the page cache
    if (pread(fd, back.data(), back.size(), 0) < 0) {
      err = errno;
    } else {
      usleep(100000);
    }
  }
  close(fd);
  EXPECT_EQ(err, EIO) << strerror(err);
}

// The errnos of names, paths, flags and node types the filesystem does not take: a path longer
// than PATH_MAX is the kernel's ENAMETOOLONG (it never reaches FUSE); a component of 256 bytes
// reaches the daemon (FUSE passes names up to 1024), which refuses it in a rename too, while
// 255 works; renameat2(RENAME_EXCHANGE) is EINVAL and changes nothing; mknod of a FIFO, a
// socket or a character device is EPERM (mknod of a regular file creates it); symlink is
// ENOSYS and link EPERM.
TEST_F(FuseMountTest, ErrnosOfLongPathsExchangeAndSpecialFiles) {
  const std::string m = NewDir("m");
  Mount(m);
  WriteAll(m + "/a", "aaa");
  WriteAll(m + "/b", "bbb");

  std::string deep = m;
  while (deep.size() <= PATH_MAX) deep += "/" + std::string(200, 'd');
  EXPECT_EQ(open(deep.c_str(), O_CREAT | O_WRONLY, 0644), -1);
  EXPECT_EQ(errno, ENAMETOOLONG);

  const std::string longest = m + "/" + std::string(255, 'r');
  const std::string too_long = m + "/" + std::string(256, 'r');
  EXPECT_EQ(rename((m + "/a").c_str(), too_long.c_str()), -1);
  EXPECT_EQ(errno, ENAMETOOLONG);
  ASSERT_EQ(rename((m + "/a").c_str(), longest.c_str()), 0) << strerror(errno);
  EXPECT_EQ(ReadAll(longest), "aaa");

  EXPECT_EQ(syscall(SYS_renameat2, AT_FDCWD, longest.c_str(), AT_FDCWD, (m + "/b").c_str(),
                    RENAME_EXCHANGE),
            -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ReadAll(longest), "aaa");
  EXPECT_EQ(ReadAll(m + "/b"), "bbb");

  EXPECT_EQ(mkfifo((m + "/fifo").c_str(), 0644), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(mknod((m + "/sock").c_str(), S_IFSOCK | 0644, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(mknod((m + "/null").c_str(), S_IFCHR | 0644, makedev(1, 3)), -1);
  EXPECT_EQ(errno, EPERM);
  for (const char* leaf : {"/fifo", "/sock", "/null"}) {
    EXPECT_NE(access((m + leaf).c_str(), F_OK), 0) << leaf << " exists";
  }
  // No links of either kind (docs/files.md, "Errors").
  EXPECT_EQ(symlink("b", (m + "/symlink").c_str()), -1);
  EXPECT_EQ(errno, ENOSYS);
  EXPECT_EQ(link((m + "/b").c_str(), (m + "/hardlink").c_str()), -1);
  EXPECT_EQ(errno, EPERM);
  ASSERT_EQ(mknod((m + "/plain").c_str(), S_IFREG | 0644, 0), 0) << strerror(errno);
  struct stat st;
  ASSERT_EQ(stat((m + "/plain").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  Unmount(m);
}

// One server of two lost with `--replicas 0`, over TCP: a read of a file's extent on the dead
// server is EIO (once the pool gives the server up: at most PoolOptions::op_timeout, 5 s, or
// its heartbeats' failure_timeout, 2 s, plus a 1 s hello; the time is printed, ctest's timeout
// guards against a hang), while the extents on the live server (and the store's image, where
// the mount's lease is renewed) still read. Where each extent lives is read from the pool: an
// inode's number is its header's address, the header maps the extents.
TEST_F(FuseMountTest, OneServerOfTwoLostIsEioForItsExtentsOnly) {
  std::unique_ptr<TestCluster> half(Start(2, 64ull << 20, Fabric::kTcp));
  ASSERT_TRUE(half->status().ok());
  const std::string m = NewDir("m");
  Mount(m, half.get());
  constexpr uint64_t kExtent = files::kExtentSize;
  constexpr int kExtents = 8;  // all mapped from the header; striped over the servers
  const auto data = Pattern(kExtents * kExtent, 6);
  WriteAll(m + "/f", std::string(data.begin(), data.end()));
  const int fd = open((m + "/f").c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0) << strerror(errno);
  void* raw = nullptr;
  ASSERT_EQ(posix_memalign(&raw, 4096, kExtent), 0);
  std::unique_ptr<unsigned char, decltype(&free)> buf(static_cast<unsigned char*>(raw), free);
  // The daemon loads every extent's address.
  for (int i = 0; i < kExtents; ++i) {
    ASSERT_EQ(pread(fd, buf.get(), kExtent, i * kExtent), static_cast<ssize_t>(kExtent));
  }

  auto client = ConnectTestClient(*half);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto store = files::FileStore::Open(*client->pool);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  files::FileHeader header;
  ASSERT_TRUE(client->pool->Read(GlobalAddress::FromRaw(st.st_ino), &header, sizeof(header)).ok());
  ASSERT_EQ(header.size, kExtents * kExtent);
  const uint16_t keeper = (*store)->image().server();
  std::vector<bool> lost(kExtents);
  std::set<uint16_t> servers;
  for (int i = 0; i < kExtents; ++i) {
    const uint16_t on = GlobalAddress::FromRaw(header.direct[i]).server();
    lost[i] = on != keeper;
    servers.insert(on);
  }
  ASSERT_EQ(servers.size(), 2u) << "the file's extents should span both servers";
  store->reset();
  client->pool.reset();

  auto all = ClusterStatus(half->dir());
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  pid_t victim = 0;
  for (const ServerStatus& server : *all) {
    if (server.address.id != keeper) victim = static_cast<pid_t>(server.stats.pid);
  }
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  AwaitExit(victim);
  for (int i = 0; i < kExtents; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const ssize_t n = pread(fd, buf.get(), kExtent, i * kExtent);
    const int err = n < 0 ? errno : 0;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("extent %d on the %s server: %s after %.0f ms\n", i, lost[i] ? "dead" : "live",
                n < 0 ? strerror(err) : "read", ms);
    if (lost[i]) {
      EXPECT_EQ(n, -1) << "extent " << i;
      EXPECT_EQ(err, EIO) << "extent " << i << ": " << strerror(err);
    } else {
      ASSERT_EQ(n, static_cast<ssize_t>(kExtent)) << "extent " << i << ": " << strerror(err);
      EXPECT_EQ(std::memcmp(buf.get(), data.data() + i * kExtent, kExtent), 0) << "extent " << i;
    }
  }
  close(fd);
}

// A mount from another host sees the same files: the cluster over TCP with its servers in
// network namespaces; a mount on this host (the test's namespaces) writes files and is
// unmounted; a mount from host B (a client namespace, TestClientHost: its daemon's mount is in
// the mount namespace `ip netns exec` made, entered with `nsenter -t DAEMON -m`) reads every
// byte back; while B's is live, a mount of the same filesystem here is refused naming B's
// daemon (docs/files.md, "One mount at a time").
TEST_F(FuseMountTest, AMountFromAnotherHostSeesTheSameFiles) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const std::unique_ptr<TestCluster> net = StartNetns(2, 64ull << 20);
  ASSERT_TRUE(net->status().ok()) << net->status().ToString();
  TestClientHost host_b(*net, 0);
  ASSERT_TRUE(host_b.status().ok()) << host_b.status().ToString();
  const std::string here = "env -u UCX_NET_DEVICES ";  // this process's is lo only
  const std::string m_a = NewDir("a"), m_b = NewDir("b"), refs = NewDir("refs");
  Mount(m_a, net.get(), "", here);
  const std::vector<size_t> sizes = {0, 1, 4096, 300000, 3 << 20};
  std::string compare = "cmp " + refs + "/inner " + m_b + "/d/inner";
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto bytes = Pattern(sizes[i], 50 + i);
    const std::string f = "/f" + std::to_string(i);
    WriteAll(m_a + f, std::string(bytes.begin(), bytes.end()));
    WriteAll(refs + f, std::string(bytes.begin(), bytes.end()));
    compare += " && cmp " + refs + f + " " + m_b + f;
  }
  ASSERT_EQ(mkdir((m_a + "/d").c_str(), 0750), 0) << strerror(errno);
  WriteAll(m_a + "/d/inner", "inside");
  WriteAll(refs + "/inner", "inside");
  Unmount(m_a);

  Outcome r = Shell(host_b.Prefix() + FARPOOL_BINARY + " mount --cluster " + net->cluster_file() +
                    " --name " + name_ + " --log " + m_b + ".log " + m_b);
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t at = r.output.find("daemon pid ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const pid_t daemon_b = static_cast<pid_t>(std::atol(r.output.c_str() + at + 11));
  ASSERT_GT(daemon_b, 0) << r.output;
  foreign_daemons_.push_back(daemon_b);
  const std::string in_b = "nsenter -t " + std::to_string(daemon_b) + " -m ";
  r = Shell(in_b + "sh -c '" + compare + "'");
  EXPECT_EQ(r.code, 0) << "host B reads other bytes: " << r.output;

  r = MountAt(m_a, name_, *net, "", here);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("is mounted by"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pid " + std::to_string(daemon_b)), std::string::npos) << r.output;
  EXPECT_EQ(DaemonOf(m_a), 0);

  r = Shell(in_b + FARPOOL_BINARY + " umount " + m_b);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(AwaitExit(daemon_b, 60000)) << "host B's daemon did not end after umount";
}

// `farpool mount --foreground` stays attached: the process it started is the daemon (no fork),
// serves until SIGTERM, then unmounts and exits 0, leaving the mount point free.
TEST_F(FuseMountTest, ForegroundMountIsTheDaemonAndSigtermUnmounts) {
  const std::string m = NewDir("m");
  mounts_.insert(m);
  const pid_t child =
      SpawnDetached({FARPOOL_BINARY, "mount", "--foreground", "--cluster", cluster_->cluster_file(),
                     "--name", name_, "--log", m + ".log", m},
                    m + ".out");
  ASSERT_GT(child, 0) << strerror(errno);
  int status = 0;
  pid_t ended = 0;
  while (DaemonOf(m) == 0 && (ended = waitpid(child, &status, WNOHANG)) == 0) usleep(20000);
  ASSERT_EQ(ended, 0) << "exited before mounting: " << ReadAll(m + ".out");
  EXPECT_EQ(DaemonOf(m), child) << "the mount is served by another process";
  WriteAll(m + "/f", "foreground");
  EXPECT_EQ(ReadAll(m + "/f"), "foreground");
  EXPECT_EQ(waitpid(child, &status, WNOHANG), 0) << "the foreground mount returned";
  ASSERT_EQ(kill(child, SIGTERM), 0);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadAll(m + ".out");
  EXPECT_EQ(DaemonOf(m), 0) << m << " is still mounted";
  EXPECT_EQ(rmdir(m.c_str()), 0) << "the mount point is not free: " << strerror(errno);
  mkdir(m.c_str(), 0755);
  Mount(m);
  EXPECT_EQ(ReadAll(m + "/f"), "foreground");
  Unmount(m);
}

}  // namespace
}  // namespace farpool
