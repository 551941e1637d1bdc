// The transport layer: a thin RAII layer over UCX's UCP API. Nothing above this folder
// includes <ucp/api/ucp.h> or knows which fabric carries the bytes.
//
// How it is used:
//   - A Context per process role (one per memory server, one per client Pool). Its Fabric
//     restricts which UCX transports may be used: kShm (posix/sysv/cma shared memory, same host
//     only), kTcp (TCP sockets; one-sided operations are emulated by the target's progress
//     thread), kAuto (whatever UCX finds best: RDMA verbs (rc/dc/ud) on a cluster that has
//     them, shared memory to same-host peers, TCP otherwise).
//   - A Worker per thread (UCX_THREAD_MODE_SINGLE: a Worker and every Endpoint, RemoteKey and
//     request created from it must only be touched by one thread at a time).
//   - Endpoints connect by socket address (the server's --listen HOST:PORT); UCX then wires up
//     the best lanes both sides share.
//   - No call here waits on a peer without a bound: connections, the socket address's and
//     every TCP lane's, are made without blocking (Context::Create sets UCX_TCP_CONN_NB=y), so
//     Progress() returns promptly even while a peer is unreachable; a request is waited for
//     until the caller's deadline (WaitRequest), a close at most 2 s, an abandoned request at
//     most 1 s. Any longer wait is a caller's loop over these, ended by the caller's deadline.
//   - Messages are UCX active messages whose payload is one frame (frame.h): the pool's control
//     messages (id kControlAm, wire.h) and the sharded engine's (db/shard_wire.h). They are
//     always sent eagerly, so that a receiver gets the whole message in its callback (servers,
//     am_server.h, refuse rendezvous messages).
//   - A MemoryRegion is allocated *by UCX* (ucp_mem_map with UCP_MEM_MAP_ALLOCATE), preferring
//     POSIX shared memory, so that a same-host client can map it (RemoteKey::DirectPointer) and
//     read, write and run atomics on it with plain loads, stores and CPU atomics: no server CPU
//     and no UCX call on the data path.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/fabric.h"
#include "farpool/status.h"

namespace farpool::transport {

using ::farpool::Fabric;

// Active-message id of control messages.
inline constexpr unsigned kControlAm = 7;

// "<what>: <UCX's reason>" as a Status (kUnavailable for connection errors, else kInternal).
Status UcxStatus(ucs_status_t status, std::string_view what);

class Context {
 public:
  struct Options {
    Fabric fabric = Fabric::kAuto;
    bool wakeup = false;  // allow event-driven waiting (Worker::Wait)
    // Interval of UCX's keepalive between endpoints: how quickly a peer that died without
    // closing its connection is noticed.
    std::chrono::milliseconds keepalive = std::chrono::milliseconds(500);
    // The hosts this context's endpoints will connect to. Unless RDMA may carry them (kAuto on
    // a host with RDMA devices), UCX's TCP lanes are then kept to the interfaces that route to
    // them (UCX_NET_DEVICES = InterfacesToward(reach)); empty: UCX offers every interface.
    std::vector<std::string> reach;
  };
  static Result<std::unique_ptr<Context>> Create(const Options& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h get() const { return context_; }
  Fabric fabric() const { return fabric_; }

 private:
  Context(ucp_context_h context, Fabric fabric) : context_(context), fabric_(fabric) {}
  ucp_context_h context_;
  Fabric fabric_;
};

// Called (from Worker::Progress) when an endpoint fails: the peer died, the link broke.
using EndpointErrorHandler = std::function<void(ucs_status_t)>;

class Endpoint;

class Worker {
 public:
  static Result<std::unique_ptr<Worker>> Create(Context& context, bool wakeup);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h get() const { return worker_; }
  // One ucp_worker_progress. Serialized against creating connections, workers and listeners in
  // any thread of the process (not against other workers' progress): see ucx.cc.
  unsigned Progress();

  // Registers the handler of active message `id`. `callback` runs inside Progress().
  Status SetAmHandler(unsigned id, ucp_am_recv_callback_t callback, void* arg);

  // Event-driven wait (REQUIRES: created with wakeup, every worker of `also` too): returns when
  // there is work for Progress() of this worker or of one of `also`, or after `timeout`.
  Status Wait(std::chrono::milliseconds timeout, std::span<Worker* const> also = {});
  // Ends a Wait of this worker now or the next one (ucp_worker_signal). Any thread.
  void Signal();

  // Progress until `request` (a UCX request pointer or status) completes, `deadline` passes
  // (-> kTimedOut), or `abandon()` returns true (-> kUnavailable). Frees the request on
  // completion. On timeout or abandonment the request is still pending (*still_pending is
  // set): the caller must force-close its endpoint, which completes it, and free it before
  // reusing its buffers.
  Status WaitRequest(ucs_status_ptr_t request, std::chrono::steady_clock::time_point deadline,
                     const std::function<bool()>& abandon, std::string_view what,
                     bool* still_pending = nullptr);
  // Finishes a request left pending by WaitRequest after its endpoint was force-closed
  // (which completes it with an error): progresses until it is done, at most a second, and
  // frees it. Then its buffers may be reused.
  void FinishAbandoned(ucs_status_ptr_t request);

 private:
  explicit Worker(ucp_worker_h worker) : worker_(worker) {}
  ucp_worker_h worker_;
  int event_fd_ = -1;
};

class Endpoint {
 public:
  // Connects to a listening server. The connection completes asynchronously; operations
  // posted before that are queued by UCX. `on_error` is called at most once.
  static Result<std::unique_ptr<Endpoint>> Connect(Worker& worker, const std::string& host,
                                                   uint16_t port, EndpointErrorHandler on_error);
  // Accepts an incoming connection request (server side).
  static Result<std::unique_ptr<Endpoint>> Accept(Worker& worker, ucp_conn_request_h request,
                                                  EndpointErrorHandler on_error);
  // Closes gracefully (flushing) unless the endpoint failed or `force`; never blocks for more
  // than a short bound.
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  ucp_ep_h get() const { return ep_; }
  bool failed() const { return failed_; }
  // Closes with UCP_EP_CLOSE_FLAG_FORCE now: every pending request on it completes with an
  // error. Later operations must not be posted.
  void ForceClose();

  // Sends an active message eagerly; `bytes` may be reused when this returns.
  Status SendAm(unsigned id, std::span<const std::byte> bytes, bool want_reply_ep,
                std::chrono::steady_clock::time_point deadline,
                const std::function<bool()>& abandon);

 private:
  Endpoint(Worker& worker, EndpointErrorHandler on_error)
      : worker_(worker), on_error_(std::move(on_error)) {}
  Status Create(ucp_ep_params_t& params);
  static void ErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status);
  void Close(bool force);

  Worker& worker_;
  EndpointErrorHandler on_error_;
  ucp_ep_h ep_ = nullptr;
  bool failed_ = false;
};

// Accepts HOST:PORT connections for a worker (port 0: any free port). UCX's callback only
// queues the requests; the owner's progress loop takes them (TakeRequests) and accepts each
// with Endpoint::Accept, outside UCX's callback.
class Listener {
 public:
  static Result<std::unique_ptr<Listener>> Create(Worker& worker, const std::string& host,
                                                  uint16_t port);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The port actually listened on.
  uint16_t port() const { return port_; }
  // The connection requests that arrived since the last call.
  std::vector<ucp_conn_request_h> TakeRequests();

 private:
  Listener() = default;
  ucp_listener_h listener_ = nullptr;
  uint16_t port_ = 0;
  std::vector<ucp_conn_request_h> pending_;
};

// Whether this host has RDMA devices (InfiniBand, RoCE, iWARP) that UCX could use: where it
// has none, the auto fabric reaches other hosts over TCP.
bool RdmaDevicesPresent();

// The names of this host's interfaces that its routing table sends traffic to `hosts` through
// (a connected UDP socket's local address, matched against the interfaces' addresses; no
// packet is sent), comma-separated, each once: what Context::Options::reach sets, so that
// UCX's TCP lanes leave through an interface that reaches the peers. UCX otherwise offers every
// interface, and a lane over one that cannot reach a peer (another cluster's bridge, a second
// NIC on another network) fails the connection. Empty if any host cannot be resolved or
// routed: then UCX chooses.
std::string InterfacesToward(const std::vector<std::string>& hosts);

// Posts an active message on `ep` eagerly without waiting for it; `bytes` are kept alive until
// UCX is done with them. For messages that must never block the caller's loop: a server's
// replies, requests posted before waiting for their replies together.
Status PostAm(ucp_ep_h ep, unsigned id, std::vector<std::byte> bytes, bool want_reply_ep);

// A region allocated and registered by UCX, owned by a memory server.
//
// Address space after it (`reserve_after`): UCX writes every page of a shared-memory region
// when it allocates it (its check that /dev/shm has room), so memory that may never be used
// (a memory server's mirror slots, pool/server/mirror.h) must not be part of it. Allocate then
// reserves `size + reserve_after` bytes of address space (PROT_NONE, nothing committed) and has
// UCX allocate the region at its start (UCP_MEM_MAP_FIXED); the rest, [tail(), tail() +
// reserve_after), is the owner's to map over with MAP_FIXED, contiguous with the region, and is
// unmapped with it. It is not registered: no remote key reaches it.
class MemoryRegion {
 public:
  static Result<std::unique_ptr<MemoryRegion>> Allocate(Context& context, uint64_t size,
                                                        uint64_t reserve_after = 0);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The reserved address space right after the region (see above); null if none.
  std::byte* tail() const { return reserved_ > 0 ? data_ + size_ : nullptr; }
  // The remote key a client unpacks to reach the region.
  std::span<const std::byte> packed_rkey() const { return {packed_rkey_.get(), rkey_size_}; }

 private:
  MemoryRegion(Context& context) : context_(context) {}
  Context& context_;
  ucp_mem_h memh_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t reserved_ = 0;  // bytes of address space reserved after the region
  // The reserved address space this region unmaps itself when destroyed: all of it until UCX
  // has mapped the region over its start (every error path of Allocate before that), then the
  // tail only (UCX unmaps its own mapping with memh_). Empty without a reservation.
  std::span<std::byte> unmap_;
  std::unique_ptr<std::byte[]> packed_rkey_;
  size_t rkey_size_ = 0;
};

// A remote region's key unpacked on one endpoint.
class RemoteKey {
 public:
  static Result<std::unique_ptr<RemoteKey>> Unpack(Endpoint& ep, std::span<const std::byte> packed);
  ~RemoteKey();
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;

  ucp_rkey_h get() const { return rkey_; }
  // A local pointer to remote address `remote_base` if the region can be mapped into this
  // process (same-host shared memory), else nullptr.
  std::byte* DirectPointer(uint64_t remote_base) const;

 private:
  explicit RemoteKey(ucp_rkey_h rkey) : rkey_(rkey) {}
  ucp_rkey_h rkey_;
};

}  // namespace farpool::transport
