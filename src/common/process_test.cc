#include "common/process.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace farpool {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A spawned server must share the caller's session: with autogroup scheduling each session is
// a scheduling group, and a memory server alone in one waited seconds for a CPU on a loaded
// host (the run-queue wait in its /proc/PID/task/TID/schedstat), long enough for its clients'
// failure detectors to declare it dead (docs/pool.md, "Failure detection"). Out of the
// terminal's job control all the same: a process group of its own.
TEST(SpawnDetached, TheChildSharesTheCallersSessionAndAutogroupInAGroupOfItsOwn) {
  char dir_template[] = "/tmp/farpool-process-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string log = dir + "/child.log";
  // The child reports itself: /proc/PID/stat (pid, comm, state, ppid, pgrp, session, ...) and,
  // where the kernel has autogroups, its autogroup ("/autogroup-N nice 0").
  const pid_t pid = SpawnDetached(
      {"/bin/sh", "-c", "cat /proc/$$/stat; cat /proc/$$/autogroup 2>/dev/null || echo none"}, log);
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadAll(log);

  std::istringstream report(ReadAll(log));
  std::string stat_line, autogroup_line;
  std::getline(report, stat_line);
  std::getline(report, autogroup_line);
  const size_t close = stat_line.rfind(')');
  ASSERT_NE(close, std::string::npos) << stat_line;
  std::istringstream fields(stat_line.substr(close + 1));
  std::string state;
  pid_t ppid = 0, pgrp = 0, session = 0;
  fields >> state >> ppid >> pgrp >> session;
  EXPECT_EQ(pgrp, pid) << "not the leader of a process group of its own: " << stat_line;
  EXPECT_EQ(session, getsid(0)) << "a session of its own: " << stat_line;
  if (autogroup_line != "none") {
    std::string ours;
    std::getline(std::ifstream("/proc/self/autogroup"), ours);
    EXPECT_EQ(autogroup_line, ours);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace farpool
