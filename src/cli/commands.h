// The `farpool` command line: one binary, one subcommand per role. Each Register* adds its
// subcommand to the app and returns it with the function that runs it (the exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "farpool/db.h"
#include "transport/am_server.h"

namespace farpool::cli {

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command RegisterServer(CLI::App& app);
Command RegisterCluster(CLI::App& app);
Command RegisterBench(CLI::App& app);
// `shard` and `shard-cluster` (src/cli/shard_command.cc): the sharded engine's partition servers.
Command RegisterShard(CLI::App& app);
Command RegisterShardCluster(CLI::App& app);
// `bench txn` (src/cli/txn_command.cc), added under the `bench` subcommand.
Command RegisterTxnBench(CLI::App& bench);
// `bench social` and `bench tpcw` (src/cli/social_command.cc).
Command RegisterSocialBench(CLI::App& bench);
Command RegisterTpcwBench(CLI::App& bench);
// `mount` and `umount` (src/cli/mount_command.cc): the pool as a FUSE filesystem.
Command RegisterMount(CLI::App& app);
Command RegisterUmount(CLI::App& app);

// Prints "farpool: <message>" to stderr and returns 1.
int Fail(const std::string& message);

// The servers' progress mode for --progress `text`; empty `text` chooses from the cores this
// process may use: busy polling only if each of `servers` servers and one client get a core
// of their own (busy servers on fewer cores starve each other and every client), else event.
// `*chosen` gets the mode's name and, when chosen here, why ("event: 2 cores for 2 servers +
// 1 client").
Result<ProgressMode> ChooseProgressMode(const std::string& text, int servers, std::string* chosen);

// Parses a size ("4GiB") for a CLI11 option, with the library's error on bad input.
std::string SizeValidator(const std::string& text);

// What every database benchmark (`bench txn`, `bench social`, `bench tpcw`) takes alike:
// --cluster, --engine, --seconds, --warmup, --seed and --json, added to `c` by
// AddDbBenchOptions and bound to the benchmark's own option fields; `engine` and `json` here.
struct DbBenchArgs {
  std::string engine = "pool";
  bool json = false;
};
void AddDbBenchOptions(CLI::App* c, DbBenchArgs* args, std::string* cluster_file, double* seconds,
                       double* warmup_seconds, uint64_t* seed);
// The engine of --engine; InvalidArgument naming the option if it is unknown, or if it is the
// pool engine and `cluster_file` is empty (the pool engine needs the memory servers).
Result<Engine> ParseDbBenchEngine(const DbBenchArgs& args, const std::string& cluster_file);

// For server commands: BlockTerminationSignals() before any thread starts, then
// WaitForTerminationSignal() returns the signal (SIGTERM, SIGINT, or SIGUSR1: a memory server's
// drain) that asked to stop.
void BlockTerminationSignals();
int WaitForTerminationSignal();

}  // namespace farpool::cli
