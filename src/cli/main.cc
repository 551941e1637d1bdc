// farpool: memory servers, local clusters and benchmarks of the pooled memory.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "cli/commands.h"
#include "common/host.h"
#include "common/units.h"
#include "farpool_version.h"  // generated at build time: cmake/version.cmake

namespace farpool::cli {

int Fail(const std::string& message) {
  std::fprintf(stderr, "farpool: %s\n", message.c_str());
  return 1;
}

namespace {
sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // farpool server: drain, then stop (`farpool cluster drain`)
  return signals;
}
}  // namespace

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForTerminationSignal() {
  const sigset_t signals = TerminationSignals();
  int sig = 0;
  sigwait(&signals, &sig);
  return sig;
}

Result<ProgressMode> ChooseProgressMode(const std::string& text, int servers, std::string* chosen) {
  if (!text.empty()) {
    auto mode = ParseProgressMode(text);
    if (mode.ok()) *chosen = text;
    return mode;
  }
  const int cores = UsableCores();
  const bool busy = cores >= servers + 1;
  *chosen = std::string(busy ? "busy" : "event") + ": " + std::to_string(cores) + " core" +
            (cores == 1 ? "" : "s") + " for " + std::to_string(servers) + " server" +
            (servers == 1 ? "" : "s") + " + 1 client";
  return busy ? ProgressMode::kBusy : ProgressMode::kEvent;
}

std::string SizeValidator(const std::string& text) {
  auto size = ParseSize(text);
  return size.ok() ? std::string() : size.status().message();
}

void AddDbBenchOptions(CLI::App* c, DbBenchArgs* args, std::string* cluster_file, double* seconds,
                       double* warmup_seconds, uint64_t* seed) {
  c->add_option("--cluster", *cluster_file,
                "cluster.json (pool: the memory servers; sharded: the partition servers, else "
                "partitions run in this process)");
  c->add_option("--engine", args->engine, "pool, local or sharded");
  c->add_option("--seconds", *seconds, "Measured seconds");
  c->add_option("--warmup", *warmup_seconds, "Warm-up seconds (not measured)");
  c->add_option("--seed", *seed, "Random seed");
  c->add_flag("--json", args->json, "Print one JSON object");
}

Result<Engine> ParseDbBenchEngine(const DbBenchArgs& args, const std::string& cluster_file) {
  auto engine = ParseEngine(args.engine);
  if (!engine.ok()) return Status::InvalidArgument("--engine: " + engine.status().message());
  if (*engine == Engine::kPool && cluster_file.empty()) {
    return Status::InvalidArgument("--cluster is required for the pool engine");
  }
  return *engine;
}

// For `farpool frobnicate` or `farpool cluster upp` (CLI11 only says "The following argument
// was not expected"): names the word at the deepest command the user reached and lists the
// commands valid there. nullopt if the words name commands all the way down.
std::optional<std::string> UnknownCommand(CLI::App& app, int argc, char** argv) {
  CLI::App* current = &app;
  std::string path = "farpool";
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;  // above the last command level, options take no values
    std::vector<CLI::App*> subs = current->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return std::nullopt;  // a leaf command: the rest are its options
    CLI::App* next = nullptr;
    for (CLI::App* s : subs) {
      if (s->check_name(argv[i])) next = s;
    }
    if (next != nullptr) {
      current = next;
      path += " " + current->get_name();
      continue;
    }
    std::string valid;
    for (CLI::App* s : subs) valid += (valid.empty() ? "" : ", ") + s->get_name();
    return "unknown command '" + std::string(argv[i]) + "' for `" + path + "`; valid: " + valid +
           " (see `" + path + " --help`)";
  }
  return std::nullopt;
}

}  // namespace farpool::cli

int main(int argc, char** argv) {
  CLI::App app{"farpool: databases on pooled, network-attached memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", FARPOOL_VERSION_STRING, "Print the version and exit");
  std::vector<farpool::cli::Command> commands = {
      farpool::cli::RegisterServer(app),       farpool::cli::RegisterCluster(app),
      farpool::cli::RegisterBench(app),        farpool::cli::RegisterShard(app),
      farpool::cli::RegisterShardCluster(app), farpool::cli::RegisterMount(app),
      farpool::cli::RegisterUmount(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) {  // not --help or --version
      if (auto unknown = farpool::cli::UnknownCommand(app, argc, argv)) {
        return farpool::cli::Fail(*unknown);
      }
    }
    return app.exit(e);
  }
  for (auto& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return farpool::cli::Fail("no command given (try --help)");
}
