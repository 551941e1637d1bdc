#include "common/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

namespace farpool {

using Clock = std::chrono::steady_clock;

void DetachFromTerminal() {
  setpgid(0, 0);
  signal(SIGHUP, SIG_IGN);
}

pid_t SpawnDetached(const std::vector<std::string>& argv, const std::string& log,
                    bool die_with_parent) {
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (die_with_parent) {
    // Survives exec (farpool is not set-user-ID). The parent may have died before the prctl:
    // then our parent is already someone else and no signal will come.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(126);
  }
  DetachFromTerminal();
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
  _exit(127);
}

bool ProcessRunning(pid_t pid) {
  if (pid <= 0) return false;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) return false;  // our child, now reaped
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = content.rfind(')');
  return close == std::string::npos || close + 2 >= content.size() || content[close + 2] != 'Z';
}

bool AllThreadsStopped(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool all = true;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream stat(dir + "/" + e->d_name + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'T') {
      all = false;
    }
  }
  closedir(d);
  return all;
}

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

int PidfdSendSignal(int pidfd, int signal) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
}

bool PidfdExited(int pidfd, std::chrono::milliseconds timeout) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(timeout.count())) > 0;
}

void StopProcesses(const std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  for (pid_t p : pids) {
    if (ProcessRunning(p)) kill(p, SIGTERM);
  }
  const auto deadline = Clock::now() + grace;
  for (;;) {
    bool any = false;
    for (pid_t p : pids) any = any || ProcessRunning(p);
    if (!any) return;
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t p : pids) {
    if (ProcessRunning(p)) kill(p, SIGKILL);
  }
  for (pid_t p : pids) {
    while (ProcessRunning(p)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string FileTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() > max_bytes) s = "..." + s.substr(s.size() - max_bytes);
  return s;
}

Status WriteReadyFile(const std::string& path, uint16_t port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "{\"port\": " << port << ", \"pid\": " << getpid() << "}\n";
    if (!out.flush()) return Status::IoError("cannot write ready file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::IoError("cannot rename ready file into " + path + ": " + strerror(errno));
  }
  return Status::Ok();
}

Result<uint16_t> WaitReady(const std::string& ready_file, pid_t pid, const std::string& what,
                           const std::string& log, Clock::time_point deadline) {
  for (;;) {
    std::ifstream in(ready_file);
    if (in) {
      try {
        return nlohmann::json::parse(in).at("port").get<uint16_t>();
      } catch (const std::exception&) {
        // Never half-written (it is renamed into place); a stale or foreign file: keep waiting.
      }
    }
    int wait_status = 0;
    if (waitpid(pid, &wait_status, WNOHANG) == pid) {  // our child: say how it ended
      std::string how;
      if (WIFSIGNALED(wait_status)) {
        const int sig = WTERMSIG(wait_status);
        how = "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
        if (sig == SIGKILL) how += ", perhaps by the kernel's OOM killer (see dmesg)";
      } else {
        how = "exited with status " + std::to_string(WEXITSTATUS(wait_status));
      }
      return Status::Unavailable(what + " " + how + " during start-up; " + log + ":\n" +
                                 FileTail(log));
    }
    if (!ProcessRunning(pid)) {
      return Status::Unavailable(what + " exited during start-up; " + log + ":\n" + FileTail(log));
    }
    if (Clock::now() > deadline) {
      return Status::TimedOut(what + " not ready in time; " + log + ":\n" + FileTail(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace farpool
