#include "db/shard_cluster.h"

#include <cstring>
#include <filesystem>
#include <vector>

#include "common/process.h"
#include "farpool/cluster.h"

namespace farpool::db {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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
        if (ProcessRunning(static_cast<pid_t>(s.pid))) {
          return Status::InvalidArgument("a shard cluster is already running in " + o.dir +
                                         " (partition " + std::to_string(s.id) + ", pid " +
                                         std::to_string(s.pid) + "); run shard-cluster down");
        }
      }
    }
  }
  std::vector<pid_t> pids;
  auto fail = [&](Status s) {
    StopProcesses(pids);
    return s;
  };
  ClusterConfig config;
  config.transport = o.transport;
  const std::string progress(ProgressModeName(o.progress));
  for (int i = 0; i < o.partitions; ++i) {
    const std::string base = (fs::path(o.dir) / ("shard-" + std::to_string(i))).string();
    fs::remove(base + ".ready", ec);
    pid_t pid = SpawnDetached(
        {o.binary, "shard", "--listen", "127.0.0.1:0", "--id", std::to_string(i), "--progress",
         progress, "--spin-us", std::to_string(o.spin_us), "--transport",
         std::string(FabricName(o.transport)), "--ready-file", base + ".ready"},
        base + ".log", o.die_with_parent);
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
    auto port = WaitReady(base + ".ready", pids[i], "partition " + std::to_string(i), base + ".log",
                          deadline);
    if (!port.ok()) return fail(port.status());
    config.servers[i].port = *port;
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
  StopProcesses(pids);
  std::error_code ec;
  for (const auto& s : config.servers) {
    fs::remove(fs::path(dir) / ("shard-" + std::to_string(s.id) + ".ready"), ec);
  }
  return Status::Ok();
}

}  // namespace farpool::db
