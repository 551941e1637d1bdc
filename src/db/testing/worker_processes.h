// Worker processes for real-process tests: the test binary re-runs itself (/proc/self/exe)
// with FARPOOL_WORKER=<role> and FARPOOL_WORKER_ID=<id> in its environment, and its main()
// dispatches on them. The parent waits for all of them within one bounded time and kills the
// stragglers, so a hung worker fails the test instead of hanging it.
//
// Thread-safety: call from the test's main thread (fork).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "farpool/status.h"

namespace farpool::db::testing {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

// The value of environment variable `name`, or `fallback`.
std::string Env(const char* name, const char* fallback = "");

// Starts a worker with `env` added to (or replacing in) this process's environment.
Result<pid_t> SpawnWorker(const std::string& role, int id, const EnvVars& env);

struct WorkerExit {
  pid_t pid = 0;
  int status = 0;          // as waitpid reports it
  bool timed_out = false;  // still running at the deadline: killed
  bool Succeeded() const;  // exited with 0, in time
  // Ended by SIGKILL before the deadline: how a memory server evicts a process that maps its
  // memory once others fence it (Pool::Evict), e.g. after it was stopped past its lease.
  bool Evicted() const;
  std::string Describe() const;
};

// Waits until `path` exists (a worker or the parent says it is ready); TimedOut after `limit`.
Status WaitForFile(const std::string& path, std::chrono::seconds limit);

// Waits for every worker until `limit` has passed since the call; workers still running then
// are continued (in case they are stopped) and killed with SIGKILL.
std::vector<WorkerExit> ReapWorkers(const std::vector<pid_t>& pids, std::chrono::seconds limit);

// main() of a test binary with workers: if FARPOOL_WORKER names a role, runs it with
// FARPOOL_SEED and FARPOOL_WORKER_ID and exits 0 on success (the error on stderr otherwise);
// else runs the tests.
using WorkerRole = std::function<Status(uint64_t seed, int id)>;
int WorkerMain(int argc, char** argv, const std::map<std::string, WorkerRole>& roles);

}  // namespace farpool::db::testing
