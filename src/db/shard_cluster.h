// ShardCluster: runs the sharded engine's partition servers as `farpool shard` processes on
// this machine, for benchmarks and tests: `farpool shard-cluster up|down --dir DIR`.
//
// Up starts N processes (detached: SpawnDetached, logs in DIR/shard-N.log), waits until
// each has written its ready file, and writes DIR/cluster.json (ClusterConfig: ids 0..N-1,
// addresses, pids) — the file DatabaseOptions::cluster_file of Engine::kSharded points to. Down
// sends SIGTERM (SIGKILL after 5 s) to the pids of DIR/cluster.json and waits for them. A failed
// Up stops whatever it started; errors name the partition and its log.
//
// Thread-safety: functions of one process; two clusters need two directories.
#pragma once

#include <chrono>
#include <string>

#include "farpool/fabric.h"
#include "farpool/status.h"
#include "transport/am_server.h"

namespace farpool::db {

struct ShardClusterOptions {
  std::string dir;
  int partitions = 2;
  Fabric transport = Fabric::kShm;
  ProgressMode progress = ProgressMode::kEvent;
  int spin_us = 0;     // event mode: `farpool shard --spin-us`
  std::string binary;  // path of the farpool executable
  std::chrono::seconds start_timeout{30};
  // As LocalClusterOptions::die_with_parent: partition servers die with the starting thread.
  bool die_with_parent = false;
};

Status ShardClusterUp(const ShardClusterOptions& options);
Status ShardClusterDown(const std::string& dir);
std::string ShardClusterFile(const std::string& dir);

}  // namespace farpool::db
