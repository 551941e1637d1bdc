#include "db/shard_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "farpool/cluster.h"

namespace farpool::db {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool Alive(pid_t pid) {
  if (pid <= 0) return false;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) return false;  // our child (a failed Up)
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t close = content.rfind(')');
  return close == std::string::npos || close + 2 >= content.size() || content[close + 2] != 'Z';
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() > 600) s = "..." + s.substr(s.size() - 600);
  return s;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  setsid();
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
  _exit(127);
}

void StopPids(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (Alive(p)) kill(p, SIGTERM);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    bool any = false;
    for (pid_t p : pids) any = any || Alive(p);
    if (!any) return;
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t p : pids) {
    if (Alive(p)) kill(p, SIGKILL);
  }
  for (pid_t p : pids) {
    while (Alive(p)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::string ShardClusterFile(const std::string& dir) {
  return (fs::path(dir) / "cluster.json").string();
}

Status ShardClusterUp(const ShardClusterOptions& o) {
  if (o.partitions < 1 || o.partitions > 250) {
    return Status::InvalidArgument("--partitions must be from 1 to 250, got " +
                                   std::to_string(o.partitions));
  }
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec) return Status::IoError("cannot create " + o.dir + ": " + ec.message());
  if (fs::exists(ShardClusterFile(o.dir))) {
    auto old = ClusterConfig::Load(ShardClusterFile(o.dir));
    if (old.ok()) {
      for (const auto& s : old->servers) {
        if (Alive(static_cast<pid_t>(s.pid))) {
          return Status::InvalidArgument("a shard cluster is already running in " + o.dir +
                                         " (partition " + std::to_string(s.id) + ", pid " +
                                         std::to_string(s.pid) + "); run shard-cluster down");
        }
      }
    }
  }
  std::vector<pid_t> pids;
  auto fail = [&](Status s) {
    StopPids(pids);
    return s;
  };
  ClusterConfig config;
  config.transport = o.transport;
  const std::string progress = o.progress == ProgressMode::kBusy ? "busy" : "event";
  for (int i = 0; i < o.partitions; ++i) {
    const std::string base = (fs::path(o.dir) / ("shard-" + std::to_string(i))).string();
    fs::remove(base + ".ready", ec);
    pid_t pid = Spawn({o.binary, "shard", "--listen", "127.0.0.1:0", "--id", std::to_string(i),
                       "--progress", progress, "--spin-us", std::to_string(o.spin_us), "--transport", std::string(FabricName(o.transport)),
                       "--ready-file", base + ".ready"},
                      base + ".log");
    if (pid < 0) return fail(Status::IoError(std::string("fork: ") + strerror(errno)));
    pids.push_back(pid);
    ServerAddress a;
    a.id = static_cast<uint16_t>(i);
    a.host = "127.0.0.1";
    a.pid = pid;
    config.servers.push_back(a);
  }
  const auto deadline = Clock::now() + o.start_timeout;
  for (int i = 0; i < o.partitions; ++i) {
    const std::string base = (fs::path(o.dir) / ("shard-" + std::to_string(i))).string();
    for (;;) {
      std::ifstream in(base + ".ready");
      if (in) {
        try {
          config.servers[i].port = nlohmann::json::parse(in).at("port").get<uint16_t>();
          break;
        } catch (const std::exception&) {
          // not complete yet (the server renames it into place)
        }
      }
      if (!Alive(pids[i])) {
        return fail(Status::Unavailable("partition " + std::to_string(i) +
                                        " exited during start-up; " + base + ".log:\n" +
                                        Tail(base + ".log")));
      }
      if (Clock::now() > deadline) {
        return fail(Status::TimedOut("partition " + std::to_string(i) + " not ready after " +
                                     std::to_string(o.start_timeout.count()) + " s; " + base +
                                     ".log:\n" + Tail(base + ".log")));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  Status saved = config.Save(ShardClusterFile(o.dir));
  if (!saved.ok()) return fail(saved);
  return Status::Ok();
}

Status ShardClusterDown(const std::string& dir) {
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(ShardClusterFile(dir)));
  std::vector<pid_t> pids;
  for (const auto& s : config.servers) {
    if (s.pid > 0) pids.push_back(static_cast<pid_t>(s.pid));
  }
  StopPids(pids);
  std::error_code ec;
  for (const auto& s : config.servers) {
    fs::remove(fs::path(dir) / ("shard-" + std::to_string(s.id) + ".ready"), ec);
  }
  return Status::Ok();
}

}  // namespace farpool::db
