// Child server processes of the local-cluster tools (`farpool cluster`, `farpool
// shard-cluster`): start detached, tell when they are ready, stop without leaving any behind.
//
// Protocol: a server started with --ready-file PATH writes {"port": N, "pid": P} there
// (atomically: temporary file + rename) once it is listening; WaitReady polls for it.
//
// Thread-safety: plain functions; no shared state.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "farpool/status.h"

namespace farpool {

// Forks and execs `argv` in a process group of its own (in the caller's session, so in its
// scheduling autogroup; SIGHUP ignored), stdout and stderr to `log`, stdin from /dev/null.
// Returns the pid, or -1 if fork failed.
// `die_with_parent`: the child gets SIGKILL when the calling *thread* ends
// (PR_SET_PDEATHSIG; the kernel ties it to the thread that forked), so a killed test leaves no
// server behind. A child whose parent died before it could ask exits at once. REQUIRES (then):
// the calling thread outlives the child's intended life (tests start clusters on the test's
// thread).
pid_t SpawnDetached(const std::vector<std::string>& argv, const std::string& log,
                    bool die_with_parent = false);

// Takes the calling process out of its terminal's job control without leaving its session: a
// process group of its own (the terminal's Ctrl-C and hangup go to the foreground group) and
// SIGHUP ignored (a hangup of the session; kept across exec). Not setsid(2): with autogroup
// scheduling (Linux's default, kernel.sched_autogroup_enabled=1) each session is a scheduling
// group, and a server alone in one waited seconds for a CPU on a loaded host, which its clients
// took for a dead server (docs/pool.md, "Failure detection"). For daemons and servers.
void DetachFromTerminal();

// Whether `pid` is a running process (reaps it if it is our exited child; a zombie is not
// running).
bool ProcessRunning(pid_t pid);

// Whether every thread of process `pid` is stopped (state T in /proc/PID/task/*/stat): a
// SIGSTOP has taken effect, and the process answers nothing until SIGCONT.
bool AllThreadsStopped(pid_t pid);

// SIGTERM to each, SIGKILL to those still running after `grace`; returns when none runs.
void StopProcesses(const std::vector<pid_t>& pids,
                   std::chrono::milliseconds grace = std::chrono::seconds(5));

// pidfd(2) through syscall(2): not every C library has the wrappers. A pidfd names one process
// for good (it never follows a reused pid). PidfdOpen: -1 with errno on failure.
int PidfdOpen(pid_t pid);
int PidfdSendSignal(int pidfd, int signal);
// Whether the process of `pidfd` has exited (the pidfd is readable then; the kernel signals it
// after exit_mm, so the process maps nothing any more), waiting at most `timeout`.
bool PidfdExited(int pidfd, std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// The last `max_bytes` of a file (a server's log, for error messages).
std::string FileTail(const std::string& path, size_t max_bytes = 600);

// Written by a server once it listens.
Status WriteReadyFile(const std::string& path, uint16_t port);

// Waits until `pid` has written its ready file and returns the port. Errors name `what` (e.g.
// "server 3") and quote the tail of `log` if the process exited or `deadline` passed.
Result<uint16_t> WaitReady(const std::string& ready_file, pid_t pid, const std::string& what,
                           const std::string& log, std::chrono::steady_clock::time_point deadline);

}  // namespace farpool
