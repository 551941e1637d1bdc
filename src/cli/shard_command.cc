// `farpool shard`: run one partition server of the sharded database engine until SIGTERM or
// SIGINT. `farpool shard-cluster up|down --dir DIR`: a local set of them (DIR/cluster.json is
// what `--engine sharded --cluster` and DatabaseOptions::cluster_file take).
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "common/process.h"
#include "db/shard_cluster.h"
#include "db/shard_server.h"
#include "farpool/cluster.h"
#include "tier/fuse/fuse_mount.h"

namespace farpool::cli {
namespace {

struct ShardArgs {
  std::string listen;
  int id = 0;
  std::string progress = "busy";
  int spin_us = 0;
  std::string transport = "auto";
  std::string ready_file;
};

int RunShard(const ShardArgs& a) {
  // Started by `ip netns exec` (a --netns cluster), this process has a copy of its starter's
  // mounts: its farpool mounts must not outlive their `farpool umount` (fuse_mount.h).
  fuse::DetachCopiedMounts();
  auto hp = ParseHostPort(a.listen);
  if (!hp.ok()) return Fail("--listen: " + hp.status().message());
  auto progress = ParseProgressMode(a.progress);
  if (!progress.ok()) return Fail("--progress: " + progress.status().message());
  auto fabric = ParseFabric(a.transport);
  if (!fabric.ok()) return Fail("--transport: " + fabric.status().message());
  if (a.id < 0 || a.id > 65535) return Fail("--id must be from 0 to 65535");
  BlockTerminationSignals();  // before any thread starts: they are taken by the wait below

  db::shard::PartitionServerOptions o;
  o.host = hp->first;
  o.port = hp->second;
  o.id = static_cast<uint16_t>(a.id);
  o.progress = *progress;
  if (a.spin_us < 0 || a.spin_us > 1000000) return Fail("--spin-us must be from 0 to 1000000");
  o.event_spin = std::chrono::microseconds(a.spin_us);
  o.fabric = *fabric;
  auto server = db::shard::PartitionServer::Start(o);
  if (!server.ok()) return Fail(server.status().message());
  std::printf("farpool shard %d listening on %s:%u (progress %s, transport %s)\n", a.id,
              o.host.c_str(), (*server)->port(), a.progress.c_str(), a.transport.c_str());
  std::fflush(stdout);
  if (!a.ready_file.empty()) {
    Status s = WriteReadyFile(a.ready_file, (*server)->port());
    if (!s.ok()) return Fail(s.message());
  }
  const int sig = WaitForTerminationSignal();
  std::printf("farpool shard %d: signal %d, shutting down\n", a.id, sig);
  (*server)->Stop();
  return 0;
}

struct ShardClusterArgs {
  std::string dir;
  int partitions = 2;
  std::string transport = "shm";
  std::string progress = "event";
  int spin_us = 0;
};

std::string SelfBinary() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "farpool";
  buf[n] = '\0';
  return buf;
}

}  // namespace

Command RegisterShard(CLI::App& app) {
  auto args = std::make_shared<ShardArgs>();
  CLI::App* sub = app.add_subcommand(
      "shard", "Run a partition server of the sharded database engine (shared-nothing)");
  sub->add_option("--listen", args->listen, "HOST:PORT to listen on (port 0: any free port)")
      ->required();
  sub->add_option("--id", args->id,
                  "Partition id (0..N-1; partition 0 also keeps the catalog "
                  "and the timestamps)");
  sub->add_option("--progress", args->progress, "busy (lowest latency) or event (idle CPU)");
  sub->add_option("--spin-us", args->spin_us,
                  "event: poll this many microseconds after the last request before sleeping");
  sub->add_option("--transport", args->transport, "Fabrics to accept: auto, shm or tcp");
  sub->add_option("--ready-file", args->ready_file, "Write {\"port\": N} here once listening");
  return {sub, [args] { return RunShard(*args); }};
}

Command RegisterShardCluster(CLI::App& app) {
  auto args = std::make_shared<ShardClusterArgs>();
  CLI::App* sub =
      app.add_subcommand("shard-cluster", "Start or stop a local set of `farpool shard` processes");
  sub->require_subcommand(1);
  CLI::App* up = sub->add_subcommand("up", "Start N partition servers; writes DIR/cluster.json");
  up->add_option("--dir", args->dir, "State directory (cluster.json, logs)")->required();
  up->add_option("--partitions", args->partitions, "Number of partition servers (default 2)");
  up->add_option("--transport", args->transport, "shm (default), tcp or auto");
  up->add_option("--progress", args->progress, "event (default) or busy");
  up->add_option("--spin-us", args->spin_us, "event: poll this long before sleeping (default 0)");
  CLI::App* down = sub->add_subcommand("down", "Stop the partition servers of DIR/cluster.json");
  down->add_option("--dir", args->dir, "State directory")->required();
  return {sub, [args, up, down]() -> int {
            if (up->parsed()) {
              db::ShardClusterOptions o;
              o.dir = args->dir;
              o.partitions = args->partitions;
              auto fabric = ParseFabric(args->transport);
              if (!fabric.ok()) return Fail("--transport: " + fabric.status().message());
              o.transport = *fabric;
              auto progress = ParseProgressMode(args->progress);
              if (!progress.ok()) return Fail("--progress: " + progress.status().message());
              o.progress = *progress;
              o.spin_us = args->spin_us;
              o.binary = SelfBinary();
              Status s = db::ShardClusterUp(o);
              if (!s.ok()) return Fail("shard-cluster up: " + s.message());
              std::printf("%s\n", db::ShardClusterFile(o.dir).c_str());
              return 0;
            }
            Status s = db::ShardClusterDown(args->dir);
            if (!s.ok()) return Fail("shard-cluster down: " + s.message());
            return 0;
          }};
}

}  // namespace farpool::cli
