// farpool-rawucx: the floor farpool's operations are compared against. A plain UCX program,
// deliberately independent of farpool's own transport layer: one server that allocates a
// region with ucp_mem_map(ALLOCATE) and progresses its worker, one client that connects by
// worker address (bootstrapped over a TCP socket) and runs get/put/fetch-and-add/CAS on
// random 64-byte-aligned offsets, timing each (or each batch of --batch posted operations)
// with the steady clock. The fabric is UCX's own choice from UCX_TLS (set by the caller).
//
//   farpool-rawucx server --port P --region BYTES [--listen HOST] [--progress busy|event]
//   farpool-rawucx client --host H --port P --op get|put|fadd|cswap --size S
//                         [--batch B] [--seconds T] [--working-set BYTES] [--mapped]
//                         [--progress busy|event]
//
// --progress says how each side waits, as farpool's processes do (transport/am_server.h,
// pool.cc AwaitReply): busy polls its worker without pause (the default); event progresses
// while that finds work and otherwise sleeps on the worker's event descriptor (ucp_worker_arm,
// then poll). Over TCP the target's progress executes the emulated one-sided operations, so
// an event-progress target wakes up once per request, as a memory server in event progress
// does: that is the like-for-like floor of `farpool bench ops` against such servers.
// --listen is the address the server's bootstrap socket binds to (default 127.0.0.1): a server
// started in a network namespace (`ip netns exec NS farpool-rawucx server --listen IP`) is
// reached across the namespace's veth pair, as `cluster up --netns`'s servers are.
//
// Offsets are drawn from the first min(working-set / max(size, 64), 65536) slots of
// max(size, 64) bytes, the same working set `farpool bench ops` uses.
//
// --mapped uses ucp_rkey_ptr (same-host shared memory) and memcpy/CPU atomics, which is what
// a UCX program does when it wants load/store access. Prints one JSON object.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/histogram.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "farpool-rawucx: %s\n", what.c_str());
  std::exit(1);
}
void Check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) Die(std::string(what) + ": " + ucs_status_string(st));
}

void SendAll(int fd, const void* p, size_t n) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd, b, n, 0);
    if (k <= 0) Die("bootstrap send failed");
    b += k;
    n -= static_cast<size_t>(k);
  }
}
void RecvAll(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = ::recv(fd, b, n, 0);
    if (k <= 0) Die("bootstrap recv failed");
    b += k;
    n -= static_cast<size_t>(k);
  }
}
void SendBlob(int fd, const void* p, uint64_t n) {
  SendAll(fd, &n, 8);
  SendAll(fd, p, n);
}
std::vector<char> RecvBlob(int fd) {
  uint64_t n = 0;
  RecvAll(fd, &n, 8);
  std::vector<char> b(n);
  RecvAll(fd, b.data(), n);
  return b;
}

struct Ucx {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  bool event = false;
  int efd = -1;  // event: the worker's event descriptor
  explicit Ucx(bool event_progress) : event(event_progress) {
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | (event ? UCP_FEATURE_WAKEUP : 0);
    Check(ucp_init(&p, nullptr, &context), "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    Check(ucp_worker_create(context, &wp, &worker), "ucp_worker_create");
    if (event) Check(ucp_worker_get_efd(worker, &efd), "ucp_worker_get_efd");
  }
  // Event progress, idle: sleeps until the worker has events, `also` (if >= 0) is readable, or
  // `timeout_ms` passes; returns at once if events are pending. Returns whether `also` woke it.
  bool Sleep(int also, int timeout_ms) {
    ucs_status_t st = ucp_worker_arm(worker);
    if (st == UCS_ERR_BUSY) return false;
    Check(st, "ucp_worker_arm");
    pollfd fds[2] = {{efd, POLLIN, 0}, {also, POLLIN, 0}};
    int n = ::poll(fds, also >= 0 ? 2 : 1, timeout_ms);
    return n > 0 && also >= 0 && (fds[1].revents & (POLLIN | POLLHUP)) != 0;
  }
  void Wait(ucs_status_ptr_t r) {
    if (r == nullptr) return;
    if (UCS_PTR_IS_ERR(r)) Check(UCS_PTR_STATUS(r), "operation");
    while (ucp_request_check_status(r) == UCS_INPROGRESS) {
      // As farpool's client (pool.cc AwaitReply): progress while that finds work, else sleep
      // (at most 10 ms, its kReplySleep).
      if (ucp_worker_progress(worker) == 0 && event) Sleep(-1, 10);
    }
    Check(ucp_request_check_status(r), "operation");
    ucp_request_free(r);
  }
};

bool ParseProgress(const std::string& text) {
  if (text == "event") return true;
  if (text != "busy") Die("unknown --progress " + text + " (expected busy or event)");
  return false;
}

int Server(const std::string& listen_host, int port, uint64_t region, bool event) {
  Ucx u(event);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS |
                  UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
  mp.address = nullptr;
  mp.length = region;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  Check(ucp_mem_map(u.context, &mp, &memh), "ucp_mem_map");
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  Check(ucp_mem_query(memh, &attr), "ucp_mem_query");
  std::memset(attr.address, 0, region);
  void* rkey = nullptr;
  size_t rkey_size = 0;
  Check(ucp_rkey_pack(u.context, memh, &rkey, &rkey_size), "ucp_rkey_pack");
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  Check(ucp_worker_get_address(u.worker, &addr, &addr_len), "ucp_worker_get_address");

  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, listen_host.c_str(), &sa.sin_addr) != 1) {
    Die("--listen " + listen_host + ": not an IPv4 address");
  }
  if (bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) Die("bind failed");
  listen(ls, 1);
  std::printf("ready\n");
  std::fflush(stdout);
  int fd = accept(ls, nullptr, nullptr);
  uint64_t base = reinterpret_cast<uint64_t>(attr.address);
  SendBlob(fd, addr, addr_len);
  SendBlob(fd, rkey, rkey_size);
  SendAll(fd, &base, 8);
  SendAll(fd, &region, 8);
  // Progress (the target's progress executes emulated one-sided operations) until the client
  // closes the bootstrap socket: busy, without pause; event, sleeping whenever a progress
  // finds nothing, woken by the worker's events or the bootstrap socket.
  auto closed = [fd] {
    char c = 0;
    return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
  };
  for (uint64_t spins = 0;; ++spins) {
    const unsigned work = ucp_worker_progress(u.worker);
    if (event) {
      if (work == 0 && u.Sleep(fd, -1) && closed()) break;
    } else if ((spins & 1023) == 0 && closed()) {
      break;
    }
  }
  close(fd);
  close(ls);
  ucp_rkey_buffer_release(rkey);
  ucp_worker_release_address(u.worker, addr);
  ucp_mem_unmap(u.context, memh);
  ucp_worker_destroy(u.worker);
  ucp_cleanup(u.context);
  return 0;
}

int Client(const std::string& host, int port, const std::string& op, uint64_t size, int batch,
           double seconds, uint64_t working_set, bool mapped, bool event) {
  Ucx u(event);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) Die("connect failed");
  auto addr = RecvBlob(fd);
  auto packed = RecvBlob(fd);
  uint64_t base = 0, region = 0;
  RecvAll(fd, &base, 8);
  RecvAll(fd, &region, 8);
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep_params.address = reinterpret_cast<ucp_address_t*>(addr.data());
  ucp_ep_h ep = nullptr;
  Check(ucp_ep_create(u.worker, &ep_params, &ep), "ucp_ep_create");
  ucp_rkey_h rkey = nullptr;
  Check(ucp_ep_rkey_unpack(ep, packed.data(), &rkey), "ucp_ep_rkey_unpack");
  char* local = nullptr;
  if (mapped) {
    void* p = nullptr;
    Check(ucp_rkey_ptr(rkey, base, &p), "ucp_rkey_ptr (no shared-memory mapping)");
    local = static_cast<char*>(p);
  }
  enum {
    kGet,
    kPut,
    kFadd,
    kCswap
  } const kind = op == "get"    ? kGet
                 : op == "put"  ? kPut
                 : op == "fadd" ? kFadd
                                : kCswap;
  const bool atomic = kind == kFadd || kind == kCswap;
  if (atomic) size = 8;
  const uint64_t slot = std::max<uint64_t>(size, 64);
  const uint64_t slots =
      std::max<uint64_t>(1, std::min<uint64_t>({working_set / slot, region / slot, 1 << 16}));
  std::vector<char> buf(size * batch);
  std::vector<uint64_t> operand(batch, 1), result(batch, 0);
  std::mt19937_64 rng(42);
  farpool::Histogram h;
  const uint64_t timer = farpool::ClockOverheadNs();
  uint64_t ops = 0;
  const auto warm_end = Clock::now() + std::chrono::milliseconds(300);
  const auto end = warm_end + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(seconds));
  std::vector<ucs_status_ptr_t> reqs(batch);
  if (batch < 1 || batch > 64) Die("--batch must be from 1 to 64");
  for (;;) {
    if (Clock::now() > end) break;
    uint64_t picks[64];
    for (int k = 0; k < batch; ++k) picks[k] = (rng() % slots) * slot;
    const auto start = Clock::now();
    for (int k = 0; k < batch; ++k) {
      const uint64_t off = picks[k];
      char* dst = buf.data() + k * size;
      if (mapped) {
        auto* word = reinterpret_cast<uint64_t*>(local + off);
        if (kind == kGet) std::memcpy(dst, local + off, size);
        if (kind == kPut) std::memcpy(local + off, dst, size);
        if (kind == kFadd) result[k] = __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
        if (kind == kCswap) {
          uint64_t expected = 0;
          __atomic_compare_exchange_n(word, &expected, 0, false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST);
          result[k] = expected;
        }
        reqs[k] = nullptr;
        continue;
      }
      ucp_request_param_t p{};
      if (kind == kGet) reqs[k] = ucp_get_nbx(ep, dst, size, base + off, rkey, &p);
      if (kind == kPut) reqs[k] = ucp_put_nbx(ep, dst, size, base + off, rkey, &p);
      if (atomic) {
        p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        p.datatype = ucp_dt_make_contig(8);
        p.reply_buffer = &result[k];
        reqs[k] = ucp_atomic_op_nbx(ep, kind == kFadd ? UCP_ATOMIC_OP_ADD : UCP_ATOMIC_OP_CSWAP,
                                    &operand[k], 1, base + off, rkey, &p);
      }
    }
    for (int k = 0; k < batch; ++k) u.Wait(reqs[k]);
    if (kind == kPut && !mapped) {
      ucp_request_param_t p{};
      u.Wait(ucp_ep_flush_nbx(ep, &p));  // remote completion, as farpool's Write
    }
    const auto stop = Clock::now();
    if (start >= warm_end) {
      const auto ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(stop - start).count());
      h.Record(ns > timer ? ns - timer : 0);
      ops += batch;
    }
  }
  const double elapsed = seconds;
  std::printf(
      "{\"system\": \"ucx\", \"op\": \"%s\", \"size\": %llu, \"batch\": %d, \"mapped\": %s, "
      "\"progress\": \"%s\", "
      "\"ops_per_s\": %.1f, \"mb_per_s\": %.1f, \"p50_us\": %.4f, \"p99_us\": %.4f, "
      "\"p999_us\": %.4f, \"mean_us\": %.4f}\n",
      op.c_str(), static_cast<unsigned long long>(size), batch, mapped ? "true" : "false",
      event ? "event" : "busy", ops / elapsed, ops * double(size) / elapsed / 1e6,
      h.Percentile(0.5) / 1e3, h.Percentile(0.99) / 1e3, h.Percentile(0.999) / 1e3, h.mean() / 1e3);
  ucp_rkey_destroy(rkey);
  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t closing = ucp_ep_close_nbx(ep, &cp);
  if (UCS_PTR_IS_PTR(closing)) {
    while (ucp_request_check_status(closing) == UCS_INPROGRESS) ucp_worker_progress(u.worker);
    ucp_request_free(closing);
  }
  close(fd);
  ucp_worker_destroy(u.worker);
  ucp_cleanup(u.context);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("usage: farpool-rawucx server|client [options]");
  std::string mode = argv[1], host = "127.0.0.1", listen_host = "127.0.0.1", op = "get";
  int port = 19500, batch = 1;
  uint64_t size = 64, region = 64 << 20, working_set = 16 << 20;
  double seconds = 2;
  bool mapped = false, event = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--host")
      host = next();
    else if (a == "--port")
      port = std::stoi(next());
    else if (a == "--op")
      op = next();
    else if (a == "--size")
      size = std::stoull(next());
    else if (a == "--batch")
      batch = std::stoi(next());
    else if (a == "--seconds")
      seconds = std::stod(next());
    else if (a == "--region")
      region = std::stoull(next());
    else if (a == "--working-set")
      working_set = std::stoull(next());
    else if (a == "--mapped")
      mapped = true;
    else if (a == "--listen")
      listen_host = next();
    else if (a == "--progress")
      event = ParseProgress(next());
    else
      Die("unknown option " + a);
  }
  if (op != "get" && op != "put" && op != "fadd" && op != "cswap") Die("unknown --op " + op);
  if (mode == "server") return Server(listen_host, port, region, event);
  if (mode == "client") {
    return Client(host, port, op, size, batch, seconds, working_set, mapped, event);
  }
  Die("unknown mode " + mode);
}
