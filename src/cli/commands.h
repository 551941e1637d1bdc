// The `farpool` command line: one binary, one subcommand per role. Each Register* adds its
// subcommand to the app and returns it with the function that runs it (the exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

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

// Prints "farpool: <message>" to stderr and returns 1.
int Fail(const std::string& message);

// Parses a size ("4GiB") for a CLI11 option, with the library's error on bad input.
std::string SizeValidator(const std::string& text);

// For server commands: BlockTerminationSignals() before any thread starts, then
// WaitForTerminationSignal() returns the signal (SIGTERM or SIGINT) that asked to stop.
void BlockTerminationSignals();
int WaitForTerminationSignal();

}  // namespace farpool::cli
