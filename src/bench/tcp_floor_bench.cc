// farpool-tcpfloor: the floor of any request/response over TCP loopback on this machine. A
// server process answers each 16-byte request with `--size` bytes; both sides busy-poll
// non-blocking sockets with TCP_NODELAY, as UCX's tcp transport does. farpool's and raw UCX's
// TCP reads are compared against it: no TCP design can answer faster than this.
//
//   farpool-tcpfloor [--size BYTES] [--seconds T]     prints one JSON object
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/histogram.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

void Serve(int listener, size_t size) {
  int fd = accept(listener, nullptr, nullptr);
  if (fd < 0) Die("accept");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> request(16), reply(size);
  size_t have = 0;
  for (;;) {
    ssize_t n = recv(fd, request.data() + have, request.size() - have, MSG_DONTWAIT);
    if (n == 0) std::exit(0);
    if (n < 0) continue;
    have += static_cast<size_t>(n);
    if (have < request.size()) continue;
    have = 0;
    for (size_t sent = 0; sent < size;) {
      ssize_t k = send(fd, reply.data() + sent, size - sent, 0);
      if (k > 0) sent += static_cast<size_t>(k);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t size = 64;
  double seconds = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--size")
      size = std::stoul(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::stod(argv[i + 1]);
    else {
      std::fprintf(stderr, "farpool-tcpfloor: unknown option %s\n", a.c_str());
      return 1;
    }
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0) Die("bind");
  if (listen(listener, 1) != 0) Die("listen");
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  pid_t server = fork();
  if (server == 0) Serve(listener, size);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) Die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> request(16), reply(size);
  farpool::Histogram h;
  const uint64_t timer = farpool::ClockOverheadNs();
  uint64_t ops = 0;
  const auto warm_end = Clock::now() + std::chrono::milliseconds(300);
  const auto end = warm_end + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(seconds));
  for (auto start = Clock::now(); start < end; start = Clock::now()) {
    if (send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
      Die("send");
    }
    for (size_t got = 0; got < size;) {
      ssize_t n = recv(fd, reply.data() + got, size - got, MSG_DONTWAIT);
      if (n > 0) got += static_cast<size_t>(n);
      if (n == 0) Die("server closed");
    }
    if (start >= warm_end) {
      const auto ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
      h.Record(ns > timer ? ns - timer : 0);
      ++ops;
    }
  }
  close(fd);
  waitpid(server, nullptr, 0);
  std::printf(
      "{\"system\": \"tcp-floor\", \"op\": \"read\", \"size\": %zu, \"batch\": 1, "
      "\"transport\": \"tcp\", \"ops_per_s\": %.1f, \"p50_us\": %.4f, \"p99_us\": %.4f, "
      "\"p999_us\": %.4f, \"mean_us\": %.4f}\n",
      size, ops / seconds, h.Percentile(0.5) / 1e3, h.Percentile(0.99) / 1e3,
      h.Percentile(0.999) / 1e3, h.mean() / 1e3);
  return 0;
}
