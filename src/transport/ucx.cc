#include "transport/ucx.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>

#include "transport/shm_dir.h"

namespace farpool::transport {
namespace {

using Clock = std::chrono::steady_clock;

// UCX names the async event handlers of its connections by their file descriptors, and a worker
// that was busy when an event came keeps it, by that name, in a queue of missed events until
// the end of its next progress (ucs_async_check_miss), even if the handler is removed
// meanwhile. Were the descriptor closed with the event still queued and reused by another
// worker's new connection, the first worker's progress would hand its stale event to the
// second's handler, which UCX 1.13 asserts against (async.c "handler->async == async") and
// aborts. Handlers go while a worker progresses (a failed connection's cleanup) or closes an
// endpoint, and each of those ends by draining the queue; so every progress and every close
// holds this lock shared, through its drain, and whatever creates descriptors (workers,
// endpoints, listeners) holds it exclusively: no descriptor can be reused between a handler's
// removal and the drain of its worker's queue. Writers are preferred, so that a connection is
// never starved by threads that progress without pause.
class DescriptorLock {
 public:
  DescriptorLock() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};
DescriptorLock g_descriptors;

// What creates descriptors, and what may remove handlers (then drains).
using Creating = std::unique_lock<DescriptorLock>;
using Removing = std::shared_lock<DescriptorLock>;

// UCX transports allowed per fabric. UCX 1.13's client-server connection (HOST:PORT) cannot
// be wired up over shared-memory transports alone, so kShm keeps tcp for the connection and
// control messages; its data path is the mapped region (the Pool refuses kShm to a server
// whose region it cannot map).
const char* TransportList(Fabric fabric) {
  switch (fabric) {
    case Fabric::kAuto:
      return "all";
    case Fabric::kShm:
      return "sm,self,tcp";
    case Fabric::kTcp:
      return "tcp,self";
  }
  return "all";
}

// UCX prints its log to stdout unless UCX_LOG_FILE names another place, and a library must not
// write into its caller's standard output (a `--json` line, the result a script prints: a
// connection refused while a cluster stopped under a still-open client once landed in the
// README example's output). So, unless the user chose with UCX_LOG_FILE, the messages UCX would
// print go to stderr. Runs before UCX's own handler (pushed later); messages UCX would not print
// go on to it (which drops them).
ucs_log_func_rc_t LogToStderr(const char* file, unsigned line, const char* /*function*/,
                              ucs_log_level_t level, const ucs_log_component_config_t* component,
                              const char* message, va_list ap) {
  if (level > component->log_level && level != UCS_LOG_LEVEL_PRINT) {
    return UCS_LOG_FUNC_RC_CONTINUE;
  }
  char text[1024];
  std::vsnprintf(text, sizeof(text), message, ap);
  const char* base = std::strrchr(file, '/');
  std::fprintf(stderr, "[pid %d] UCX %s %s:%u %s\n", static_cast<int>(getpid()),
               ucs_log_level_names[level], base != nullptr ? base + 1 : file, line, text);
  return UCS_LOG_FUNC_RC_STOP;
}

void SendUcxLogToStderr() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* chosen = std::getenv("UCX_LOG_FILE");
    if (chosen == nullptr || *chosen == '\0') ucs_log_push_handler(LogToStderr);
  });
}

// Memory allocation order for ucp_mem_map(ALLOCATE): POSIX shared memory first. It is the
// path on which a same-host client maps the region and reads it with plain loads (UCX's default
// tries System V first, whose remote-key path measured 5x slower here).
constexpr const char* kAllocPriority = "md:posix,md:sysv,huge,thp,md:*,mmap,heap";

}  // namespace

Status UcxStatus(ucs_status_t status, std::string_view what) {
  std::string m(what);
  m += ": ";
  m += ucs_status_string(status);
  switch (status) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_REJECTED:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CANCELED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_DEVICE:  // e.g. an interface removed since the context listed it
      return Status::Unavailable(std::move(m));
    case UCS_ERR_TIMED_OUT:
      return Status::TimedOut(std::move(m));
    case UCS_ERR_NO_MEMORY:
      return Status::OutOfMemory(std::move(m));
    default:
      return Status::Internal(std::move(m));
  }
}

// ---------------------------------------------------------------- Context

Result<std::unique_ptr<Context>> Context::Create(const Options& options) {
  // Shared-memory files in a directory of this process's own (see transport/shm_dir.h); sets
  // UCX_POSIX_DIR, which ucp_init reads.
  ShmDirectory();
  SendUcxLogToStderr();
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxStatus(st, "reading UCX configuration");
  auto modify = [&](const char* name, const std::string& value) -> Status {
    ucs_status_t s = ucp_config_modify(config, name, value.c_str());
    if (s != UCS_OK) return UcxStatus(s, std::string("setting UCX_") + name + "=" + value);
    return Status::Ok();
  };
  Status s = modify("TLS", TransportList(options.fabric));
  if (s.ok()) s = modify("ALLOC_PRIO", kAllocPriority);
  if (s.ok()) s = modify("KEEPALIVE_INTERVAL", std::to_string(options.keepalive.count()) + "ms");
  // UCX 1.13's TCP transport connects its lanes with a *blocking* connect() unless
  // UCX_TCP_CONN_NB=y (default n), and it does so inside ucp_worker_progress when a wireup
  // reply arrives. Towards a peer whose link is down that call sleeps through the kernel's SYN
  // retries (~127 s with tcp_syn_retries = 6), and since every progress holds g_descriptors
  // shared, a thread waiting to create a worker or endpoint (exclusive, writer-preferred)
  // then stops every other thread's progress in the process: a partitioned server froze the
  // whole client (docs/pool.md "Known UCX behaviour"). Non-blocking, the lane stays connecting
  // until the kernel gives up, and our deadlines decide meanwhile. The tcp transport's own
  // name for the option (UCX passes names it does not know on to the transports): applied to
  // it whatever UCX_TCP_CONN_NB says, since the contract in ucx.h depends on it.
  if (s.ok()) s = modify("CONN_NB", "y");
  if (s.ok() && !options.reach.empty() &&
      (options.fabric != Fabric::kAuto || !RdmaDevicesPresent())) {
    // RDMA devices are no interfaces of the routing table: where they may be used, UCX chooses.
    const std::string devices = InterfacesToward(options.reach);
    if (!devices.empty()) s = modify("NET_DEVICES", devices);
  }
  if (!s.ok()) {
    ucp_config_release(config);
    return s;
  }

  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
  if (options.wakeup) params.features |= UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // each thread creates its own worker on this context
  params.name = "farpool";
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    return UcxStatus(st, std::string("initialising UCX for transport ") +
                             std::string(FabricName(options.fabric)));
  }
  return std::unique_ptr<Context>(new Context(context, options.fabric));
}

Context::~Context() { ucp_cleanup(context_); }

// ---------------------------------------------------------------- Worker

Result<std::unique_ptr<Worker>> Worker::Create(Context& context, bool wakeup) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h handle = nullptr;
  Creating creating(g_descriptors);
  ucs_status_t st = ucp_worker_create(context.get(), &params, &handle);
  creating.unlock();
  if (st != UCS_OK) return UcxStatus(st, "creating UCX worker");
  std::unique_ptr<Worker> worker(new Worker(handle));
  if (wakeup) {
    st = ucp_worker_get_efd(handle, &worker->event_fd_);
    if (st != UCS_OK) return UcxStatus(st, "getting the UCX worker's event descriptor");
  }
  return worker;
}

Worker::~Worker() { ucp_worker_destroy(worker_); }

unsigned Worker::Progress() {
  Removing removing(g_descriptors);
  return ucp_worker_progress(worker_);
}

Status Worker::SetAmHandler(unsigned id, ucp_am_recv_callback_t callback, void* arg) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  p.cb = callback;
  p.arg = arg;
  p.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t st = ucp_worker_set_am_recv_handler(worker_, &p);
  if (st != UCS_OK) return UcxStatus(st, "registering active-message handler");
  return Status::Ok();
}

Status Worker::Wait(std::chrono::milliseconds timeout, std::span<Worker* const> also) {
  // On the stack for the usual few (a server's loop sleeps on its links too: every sleep).
  constexpr size_t kOnStack = 8;
  std::array<pollfd, kOnStack> stack;
  std::vector<pollfd> heap(also.size() + 1 > kOnStack ? also.size() + 1 : 0);
  pollfd* pfd = heap.empty() ? stack.data() : heap.data();
  for (size_t i = 0; i <= also.size(); ++i) {
    Worker* w = i == 0 ? this : also[i - 1];
    if (w->event_fd_ < 0)
      return Status::Internal("Worker::Wait on a worker created without wakeup");
    ucs_status_t st = ucp_worker_arm(w->worker_);
    if (st == UCS_ERR_BUSY) return Status::Ok();  // events pending: go progress them
    if (st != UCS_OK) return UcxStatus(st, "arming UCX worker");
    pfd[i] = {w->event_fd_, POLLIN, 0};
  }
  int rc = ::poll(pfd, also.size() + 1, static_cast<int>(timeout.count()));
  if (rc < 0 && errno != EINTR) return Status::IoError(std::string("poll: ") + strerror(errno));
  return Status::Ok();
}

void Worker::Signal() {
  ucs_status_t st = ucp_worker_signal(worker_);
  (void)st;  // a lost signal only means the waiter wakes at its timeout
}

Status Worker::WaitRequest(ucs_status_ptr_t request, Clock::time_point deadline,
                           const std::function<bool()>& abandon, std::string_view what,
                           bool* still_pending) {
  if (still_pending != nullptr) *still_pending = false;
  if (request == nullptr) return Status::Ok();
  if (UCS_PTR_IS_ERR(request)) return UcxStatus(UCS_PTR_STATUS(request), what);
  for (uint32_t spins = 0;; ++spins) {
    ucs_status_t st = ucp_request_check_status(request);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(request);
      if (st == UCS_OK) return Status::Ok();
      return UcxStatus(st, what);
    }
    Progress();
    if ((spins & 63) == 63) {
      const bool abandoned = abandon && abandon();
      if (abandoned || Clock::now() > deadline) {
        if (still_pending != nullptr) *still_pending = true;
        if (abandoned) return Status::Unavailable(std::string(what) + ": peer failed");
        return Status::TimedOut(std::string(what) + ": no completion before the deadline");
      }
    }
  }
}

void Worker::FinishAbandoned(ucs_status_ptr_t request) {
  const auto limit = Clock::now() + std::chrono::seconds(1);
  while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < limit) Progress();
  ucp_request_free(request);
}

// ---------------------------------------------------------------- Endpoint

Result<std::unique_ptr<Endpoint>> Endpoint::Connect(Worker& worker, const std::string& host,
                                                    uint16_t port, EndpointErrorHandler on_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::InvalidArgument("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
  socklen_t addrlen = res->ai_addrlen;
  freeaddrinfo(res);

  std::unique_ptr<Endpoint> ep(new Endpoint(worker, std::move(on_error)));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  params.sockaddr.addrlen = addrlen;
  FARPOOL_RETURN_IF_ERROR(ep->Create(params));
  return ep;
}

Result<std::unique_ptr<Endpoint>> Endpoint::Accept(Worker& worker, ucp_conn_request_h request,
                                                   EndpointErrorHandler on_error) {
  std::unique_ptr<Endpoint> ep(new Endpoint(worker, std::move(on_error)));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  params.conn_request = request;
  FARPOOL_RETURN_IF_ERROR(ep->Create(params));
  return ep;
}

Status Endpoint::Create(ucp_ep_params_t& params) {
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Endpoint::ErrorCallback;
  params.err_handler.arg = this;
  Creating creating(g_descriptors);
  ucs_status_t st = ucp_ep_create(worker_.get(), &params, &ep_);
  if (st != UCS_OK) {
    ep_ = nullptr;
    return UcxStatus(st, "creating endpoint");
  }
  return Status::Ok();
}

void Endpoint::ErrorCallback(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* self = static_cast<Endpoint*>(arg);
  if (self->failed_) return;
  self->failed_ = true;
  if (self->on_error_) self->on_error_(status);
}

void Endpoint::Close(bool force) {
  if (ep_ == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = (force || failed_) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req;
  {
    Removing removing(g_descriptors);
    req = ucp_ep_close_nbx(ep_, &p);
    ucp_worker_progress(worker_.get());  // the drain (see g_descriptors)
  }
  ep_ = nullptr;
  // A graceful close waits for the peer; bound it so a dead peer cannot hang the caller.
  bool pending = false;
  Status s = worker_.WaitRequest(req, Clock::now() + std::chrono::seconds(2), nullptr,
                                 "closing endpoint", &pending);
  (void)s;  // the endpoint is gone either way; nothing more to do about a failed close
  // Still in progress: released now (it holds no buffer of ours), so that UCX frees it when it
  // completes; a request never released trips UCX's assertion when the worker is destroyed.
  if (pending) ucp_request_free(req);
}

void Endpoint::ForceClose() {
  failed_ = true;
  Close(true);
}

Endpoint::~Endpoint() { Close(false); }

namespace {
// Messages always go eagerly: receivers take them whole in the callback (UCP_AM_FLAG_WHOLE_MSG)
// and drop rendezvous ones, and farpool's messages are bounded (wire::kMaxBatchTail).
uint32_t AmSendFlags(bool want_reply_ep) {
  return UCP_AM_SEND_FLAG_EAGER | (want_reply_ep ? UCP_AM_SEND_FLAG_REPLY : 0);
}
}  // namespace

Status Endpoint::SendAm(unsigned id, std::span<const std::byte> bytes, bool want_reply_ep,
                        Clock::time_point deadline, const std::function<bool()>& abandon) {
  if (ep_ == nullptr || failed_) return Status::Unavailable("endpoint is closed");
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = AmSendFlags(want_reply_ep);
  ucs_status_ptr_t req = ucp_am_send_nbx(ep_, id, nullptr, 0, bytes.data(), bytes.size(), &p);
  bool pending = false;
  Status s = worker_.WaitRequest(req, deadline, abandon, "sending a message", &pending);
  if (pending) {
    // `bytes` are the caller's: the send must be over before they are reused or freed.
    ForceClose();
    worker_.FinishAbandoned(req);
  }
  return s;
}

Status PostAm(ucp_ep_h ep, unsigned id, std::vector<std::byte> bytes, bool want_reply_ep) {
  auto* owned = new std::vector<std::byte>(std::move(bytes));
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = AmSendFlags(want_reply_ep);
  p.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<std::vector<std::byte>*>(user_data);
    ucp_request_free(request);
  };
  p.user_data = owned;
  ucs_status_ptr_t req = ucp_am_send_nbx(ep, id, nullptr, 0, owned->data(), owned->size(), &p);
  if (UCS_PTR_IS_PTR(req)) return Status::Ok();  // the callback frees the buffer
  delete owned;
  if (UCS_PTR_IS_ERR(req)) return UcxStatus(UCS_PTR_STATUS(req), "posting an active message");
  return Status::Ok();
}

// ---------------------------------------------------------------- Listener

Result<std::unique_ptr<Listener>> Listener::Create(Worker& worker, const std::string& host,
                                                   uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::InvalidArgument("cannot resolve listen address '" + host +
                                   "': " + gai_strerror(rc));
  }
  std::unique_ptr<Listener> l(new Listener());
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = res->ai_addr;
  lp.sockaddr.addrlen = res->ai_addrlen;
  lp.conn_handler.cb = [](ucp_conn_request_h request, void* arg) {
    static_cast<Listener*>(arg)->pending_.push_back(request);
  };
  lp.conn_handler.arg = l.get();
  Creating creating(g_descriptors);
  ucs_status_t st = ucp_listener_create(worker.get(), &lp, &l->listener_);
  creating.unlock();
  freeaddrinfo(res);
  if (st != UCS_OK) {
    l->listener_ = nullptr;
    if (st == UCS_ERR_BUSY) {  // bind(): EADDRINUSE, which UCX reports as "Device is busy"
      return Status::Unavailable("cannot listen on " + host + ":" + port_text + ": port " +
                                 port_text +
                                 " is in use by another process (choose another port, or 0 "
                                 "for any free one)");
    }
    return UcxStatus(st, "listening on " + host + ":" + port_text);
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(l->listener_, &attr);
  if (st != UCS_OK) return UcxStatus(st, "querying the listener's address");
  l->port_ = attr.sockaddr.ss_family == AF_INET
                 ? ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port)
                 : ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
  return l;
}

Listener::~Listener() {
  if (listener_ == nullptr) return;
  // Requests that came after the owner's last TakeRequests: rejected, else each would keep its
  // connection's handler on the worker's async context after the worker is gone.
  for (ucp_conn_request_h r : pending_) ucp_listener_reject(listener_, r);
  ucp_listener_destroy(listener_);
}

std::vector<ucp_conn_request_h> Listener::TakeRequests() {
  std::vector<ucp_conn_request_h> taken;
  taken.swap(pending_);
  return taken;
}

// ---------------------------------------------------------------- MemoryRegion

Result<std::unique_ptr<MemoryRegion>> MemoryRegion::Allocate(Context& context, uint64_t size,
                                                             uint64_t reserve_after) {
  std::unique_ptr<MemoryRegion> region(new MemoryRegion(context));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = size;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  if (reserve_after > 0) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (size % page != 0 || reserve_after % page != 0) {
      return Status::InvalidArgument("a region of " + std::to_string(size) + " bytes with " +
                                     std::to_string(reserve_after) +
                                     " reserved after it: both must be whole pages");
    }
    void* at = mmap(nullptr, size + reserve_after, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED) {
      return Status::OutOfMemory("reserving " + std::to_string(size + reserve_after) +
                                 " bytes of address space: " + std::strerror(errno));
    }
    // Owned from here: every return below leaves it to the destructor (the whole reservation
    // until UCX has mapped the region over its start, then the tail).
    region->unmap_ = {static_cast<std::byte*>(at), size + reserve_after};
    region->size_ = size;
    region->reserved_ = reserve_after;
    params.address = at;
    params.flags |= UCP_MEM_MAP_FIXED;
  }
  ucs_status_t st = ucp_mem_map(context.get(), &params, &region->memh_);
  if (st != UCS_OK) {
    region->memh_ = nullptr;
    return UcxStatus(st, "allocating a " + std::to_string(size) + "-byte region");
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(region->memh_, &attr);
  if (st != UCS_OK) {
    // UCP_MEM_MAP_FIXED succeeded: the region's part is UCX's mapping, unmapped with memh_.
    if (reserve_after > 0) region->unmap_ = {region->unmap_.data() + size, reserve_after};
    return UcxStatus(st, "querying the allocated region");
  }
  if (reserve_after > 0 && attr.address != params.address) {
    // UCX's mapping is elsewhere (unmapped with memh_): the whole reservation is still ours.
    return Status::Internal("UCX allocated the region at " +
                            std::to_string(reinterpret_cast<uintptr_t>(attr.address)) +
                            ", not at the reserved address");
  }
  if (reserve_after > 0) region->unmap_ = {region->unmap_.data() + size, reserve_after};
  region->data_ = static_cast<std::byte*>(attr.address);
  region->size_ = size;

  void* rkey = nullptr;
  size_t rkey_size = 0;
  st = ucp_rkey_pack(context.get(), region->memh_, &rkey, &rkey_size);
  if (st != UCS_OK) return UcxStatus(st, "packing the region's remote key");
  region->packed_rkey_ = std::make_unique<std::byte[]>(rkey_size);
  std::memcpy(region->packed_rkey_.get(), rkey, rkey_size);
  region->rkey_size_ = rkey_size;
  ucp_rkey_buffer_release(rkey);
  return region;
}

MemoryRegion::~MemoryRegion() {
  if (memh_ != nullptr) {
    ucs_status_t st = ucp_mem_unmap(context_.get(), memh_);
    (void)st;  // process teardown; the mapping is released with the process anyway
  }
  // What of the reservation UCX does not own (see unmap_), whatever the owner mapped over it.
  if (!unmap_.empty()) munmap(unmap_.data(), unmap_.size());
}

// ---------------------------------------------------------------- RemoteKey

Result<std::unique_ptr<RemoteKey>> RemoteKey::Unpack(Endpoint& ep,
                                                     std::span<const std::byte> packed) {
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(ep.get(), packed.data(), &rkey);
  if (st != UCS_OK) return UcxStatus(st, "unpacking the server's remote key");
  return std::unique_ptr<RemoteKey>(new RemoteKey(rkey));
}

RemoteKey::~RemoteKey() { ucp_rkey_destroy(rkey_); }

std::byte* RemoteKey::DirectPointer(uint64_t remote_base) const {
  void* p = nullptr;
  if (ucp_rkey_ptr(rkey_, remote_base, &p) != UCS_OK) return nullptr;
  return static_cast<std::byte*>(p);
}

namespace {
// The local address this host's routing table would send traffic to `host` from.
std::optional<sockaddr_storage> SourceAddressToward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return std::nullopt;
  std::optional<sockaddr_storage> out;
  const int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) out = local;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

bool SameAddress(const sockaddr* a, const sockaddr_storage& b) {
  if (a == nullptr || a->sa_family != b.ss_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&b)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  }
  return false;
}
}  // namespace

std::string InterfacesToward(const std::vector<std::string>& hosts) {
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return "";
  std::vector<std::string> names;
  bool all = true;
  for (const std::string& host : hosts) {
    const auto source = SourceAddressToward(host);
    std::string name;
    for (ifaddrs* i = interfaces; source && i != nullptr && name.empty(); i = i->ifa_next) {
      if (SameAddress(i->ifa_addr, *source)) name = i->ifa_name;
    }
    if (name.empty()) {
      all = false;
      break;
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  freeifaddrs(interfaces);
  if (!all) return "";
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

bool RdmaDevicesPresent() {
  std::error_code ec;
  std::filesystem::directory_iterator devices("/sys/class/infiniband", ec);
  return !ec && devices != std::filesystem::directory_iterator();
}

}  // namespace farpool::transport
