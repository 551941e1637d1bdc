#include "db/testing/worker_processes.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

namespace farpool::db::testing {

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

Result<pid_t> SpawnWorker(const std::string& role, int id, const EnvVars& env) {
  const pid_t pid = fork();
  if (pid < 0) return Status::IoError(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    setenv("FARPOOL_WORKER", role.c_str(), 1);
    setenv("FARPOOL_WORKER_ID", std::to_string(id).c_str(), 1);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execl("/proc/self/exe", "worker", nullptr);
    _exit(127);
  }
  return pid;
}

bool WorkerExit::Succeeded() const {
  return !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool WorkerExit::Evicted() const {
  return !timed_out && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

std::string WorkerExit::Describe() const {
  std::string s = "worker pid " + std::to_string(pid) + ": ";
  if (timed_out) return s + "did not finish in time (killed)";
  if (WIFEXITED(status)) return s + "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return s + "killed by signal " + std::to_string(WTERMSIG(status));
  return s + "status " + std::to_string(status);
}

Status WaitForFile(const std::string& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::TimedOut(path + " did not appear within " + std::to_string(limit.count()) +
                              " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::Ok();
}

std::vector<WorkerExit> ReapWorkers(const std::vector<pid_t>& pids, std::chrono::seconds limit) {
  std::vector<WorkerExit> out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (pid_t pid : pids) {
    WorkerExit w;
    w.pid = pid;
    for (;;) {
      if (waitpid(pid, &w.status, WNOHANG) == pid) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGCONT);
        kill(pid, SIGKILL);
        waitpid(pid, &w.status, 0);
        w.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    out.push_back(w);
  }
  return out;
}

int WorkerMain(int argc, char** argv, const std::map<std::string, WorkerRole>& roles) {
  const std::string role = Env("FARPOOL_WORKER");
  if (!role.empty()) {
    const uint64_t seed = std::strtoull(Env("FARPOOL_SEED", "1").c_str(), nullptr, 10);
    const int id = std::atoi(Env("FARPOOL_WORKER_ID", "0").c_str());
    auto it = roles.find(role);
    const Status s = it != roles.end() ? it->second(seed, id)
                                       : Status::InvalidArgument("unknown worker role " + role);
    if (!s.ok()) std::fprintf(stderr, "worker %s %d: %s\n", role.c_str(), id, s.ToString().c_str());
    return s.ok() ? 0 : 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace farpool::db::testing
