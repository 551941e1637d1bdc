// farpool: memory servers, local clusters and benchmarks of the pooled memory.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <vector>

#include "cli/commands.h"
#include "common/units.h"

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

std::string SizeValidator(const std::string& text) {
  auto size = ParseSize(text);
  return size.ok() ? std::string() : size.status().message();
}

}  // namespace farpool::cli

int main(int argc, char** argv) {
  CLI::App app{"farpool: databases on pooled, network-attached memory"};
  app.require_subcommand(1);
  std::vector<farpool::cli::Command> commands = {
      farpool::cli::RegisterServer(app),       farpool::cli::RegisterCluster(app),
      farpool::cli::RegisterBench(app),        farpool::cli::RegisterShard(app),
      farpool::cli::RegisterShardCluster(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return farpool::cli::Fail("no command given (try --help)");
}
