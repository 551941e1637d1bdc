#include "transport/shm_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

namespace farpool::transport {
namespace {

namespace fs = std::filesystem;

constexpr const char* kShmRoot = "/dev/shm";
constexpr const char* kPrefix = "farpool-ucx-";

std::string DirectoryOf(pid_t pid) {
  return std::string(kShmRoot) + "/" + kPrefix + std::to_string(pid);
}

// Set once by ShmDirectory; read by the exit handler and the janitor.
std::string g_directory;
pid_t g_owner = 0;

void RemoveOwnDirectory() {
  // Forked children (a janitor, a child before exec) inherit this handler: only the owner
  // removes the directory.
  if (g_directory.empty() || getpid() != g_owner) return;
  std::error_code ec;
  fs::remove_all(g_directory, ec);
}

}  // namespace

void RemoveStaleShmDirectories() {
  std::error_code ec;
  for (fs::directory_iterator it(kShmRoot, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const std::string digits = name.substr(std::strlen(kPrefix));
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::strtol(digits.c_str(), nullptr, 10));
    if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code rm;
    fs::remove_all(it->path(), rm);  // best effort: another process may be removing it too
  }
}

std::string ShmDirectory() {
  static std::once_flag once;
  std::call_once(once, [] {
    // A value of ours was inherited from the farpool process that started this one.
    const char* user = std::getenv("UCX_POSIX_DIR");
    const std::string ours = std::string(kShmRoot) + "/" + kPrefix;
    if (user != nullptr && std::string(user).rfind(ours, 0) != 0) return;
    RemoveStaleShmDirectories();
    const std::string dir = DirectoryOf(getpid());
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;
    // UCX 1.13 reads its memory domains' settings from the environment only
    // (ucp_config_modify("POSIX_DIR") is not applied to them). Set once, before this process's
    // first UCX context.
    if (setenv("UCX_POSIX_DIR", dir.c_str(), 1) != 0) return;
    g_directory = dir;
    g_owner = getpid();
    std::atexit(RemoveOwnDirectory);
  });
  return g_directory;
}

Status StartShmJanitor() {
  const std::string dir = ShmDirectory();
  if (dir.empty()) return Status::Ok();  // the user's UCX_POSIX_DIR: not ours to clean
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return Status::IoError(std::string("shared-memory janitor: pipe: ") + strerror(errno));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Status::IoError(std::string("shared-memory janitor: fork: ") + strerror(errno));
  }
  if (pid == 0) {
    // The janitor: outlives the server by as long as it takes to remove the directory. It
    // ignores the signals that stop servers (a Ctrl-C reaches the whole process group) and
    // leaves when the server's end of the pipe closes, which the kernel does however the
    // server dies.
    close(fds[1]);
    // Keep no reader of the server's output waiting for end-of-file.
    const int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, STDIN_FILENO);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      if (null > STDERR_FILENO) close(null);
    }
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    prctl(PR_SET_NAME, "farpool-shmgc");
    char c;
    while (read(fds[0], &c, 1) < 0 && errno == EINTR) {
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    _exit(0);
  }
  close(fds[0]);  // fds[1] stays open, unused, until this process dies
  return Status::Ok();
}

}  // namespace farpool::transport
