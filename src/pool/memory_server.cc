#include "pool/memory_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <random>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/host.h"
#include "common/units.h"
#include "pool/chunk_allocator.h"
#include "transport/wire.h"

namespace farpool {

using transport::Endpoint;
using Clock = std::chrono::steady_clock;

// How long an event-mode server keeps polling after its last piece of work before it sleeps:
// a client's next request usually follows within a few microseconds, and waking a sleeping
// thread costs more than that. Idle servers still sleep almost all the time.
constexpr auto kEventSpin = std::chrono::microseconds(50);

Result<ProgressMode> ParseProgressMode(std::string_view text) {
  if (text == "busy") return ProgressMode::kBusy;
  if (text == "event") return ProgressMode::kEvent;
  return Status::InvalidArgument("unknown progress mode '" + std::string(text) +
                                 "' (expected busy or event)");
}

uint64_t PrivateResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

class MemoryServer::Impl {
 public:
  Impl(const ServerOptions& options)
      : options_(options), chunks_(options.memory, options.chunk_size) {}

  Status Init(uint16_t* port_out);
  // One iteration of the progress loop; returns whether anything happened.
  bool Poll();
  void Idle() {
    Status s = worker_->Wait(std::chrono::milliseconds(100));
    (void)s;  // a failed wait only means we poll again sooner
  }
  void Shutdown();

 private:
  struct Connection {
    std::unique_ptr<Endpoint> ep;
    uint64_t client_nonce = 0;  // 0 until the client said hello
  };
  struct Incoming {
    std::vector<std::byte> bytes;
    ucp_ep_h reply_ep;
  };

  static ucs_status_t OnControlMessage(void* arg, const void* header, size_t header_length,
                                       void* data, size_t length, const ucp_am_recv_param_t* param);

  void Accept(ucp_conn_request_h request);
  void ReapFailed();
  void Handle(const Incoming& in);
  Result<std::vector<std::byte>> Answer(const wire::Message& m, ucp_ep_h reply_ep);
  std::string Name() const {
    return "server " + std::to_string(options_.id) + " (" + options_.host + ":" +
           std::to_string(port_) + ")";
  }
  uint32_t DistinctClients() const;

  ServerOptions options_;
  uint16_t port_ = 0;
  ChunkAllocator chunks_;
  std::unique_ptr<transport::Context> context_;
  std::unique_ptr<transport::Worker> worker_;
  std::unique_ptr<transport::MemoryRegion> region_;
  std::unique_ptr<transport::Listener> listener_;
  std::unordered_map<ucp_ep_h, Connection> connections_;
  std::deque<Incoming> inbox_;
  Clock::time_point started_ = Clock::now();
  bool reap_ = false;  // an endpoint failed since the last ReapFailed
  uint64_t requests_served_ = 0;
  uint64_t rejected_ = 0;
};

Status MemoryServer::Impl::Init(uint16_t* port_out) {
  if (options_.chunk_size == 0 || options_.chunk_size % 4096 != 0) {
    return Status::InvalidArgument("chunk size " + std::to_string(options_.chunk_size) +
                                   " is not a positive multiple of 4096");
  }
  if (chunks_.capacity() == 0) {
    return Status::InvalidArgument("--memory " + FormatSize(options_.memory) +
                                   " is smaller than one chunk (" +
                                   FormatSize(options_.chunk_size) + ")");
  }
  // The region is committed at start (UCX writes every page of a shared-memory segment before
  // mapping it): a size the host cannot give would take its memory until the OOM killer acts.
  FARPOOL_RETURN_IF_ERROR(
      CheckFitsInAvailableMemory(chunks_.region_size(), "--memory " + FormatSize(options_.memory)));
  transport::Context::Options copts;
  copts.fabric = options_.fabric;
  copts.wakeup = options_.progress == ProgressMode::kEvent;
  FARPOOL_ASSIGN_OR_RETURN(context_, transport::Context::Create(copts));
  FARPOOL_ASSIGN_OR_RETURN(worker_, transport::Worker::Create(*context_, copts.wakeup));
  FARPOOL_RETURN_IF_ERROR(worker_->SetAmHandler(transport::kControlAm, &OnControlMessage, this));
  FARPOOL_ASSIGN_OR_RETURN(region_,
                           transport::MemoryRegion::Allocate(*context_, chunks_.region_size()));

  FARPOOL_ASSIGN_OR_RETURN(listener_,
                           transport::Listener::Create(*worker_, options_.host, options_.port));
  port_ = listener_->port();
  *port_out = port_;
  return Status::Ok();
}

ucs_status_t MemoryServer::Impl::OnControlMessage(void* arg, const void* /*header*/,
                                                  size_t /*header_length*/, void* data,
                                                  size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  ucp_ep_h reply_ep =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    // Far larger than any control message: drop it without receiving the payload.
    ucp_am_data_release(self->worker_->get(), data);
    ++self->rejected_;
    if (reply_ep != nullptr) {
      Status s = transport::PostAm(
          reply_ep, transport::kControlAm,
          wire::EncodeError(
              0, Status::Protocol(self->Name() + ": message of " + std::to_string(length) +
                                  " bytes exceeds the control message limit")),
          false);
      (void)s;  // the peer may be gone; nothing to recover
    }
    return UCS_OK;
  }
  const auto* bytes = static_cast<const std::byte*>(data);
  self->inbox_.push_back({std::vector<std::byte>(bytes, bytes + length), reply_ep});
  return UCS_OK;
}

void MemoryServer::Impl::Accept(ucp_conn_request_h request) {
  auto ep = Endpoint::Accept(*worker_, request, [this](ucs_status_t) { reap_ = true; });
  if (!ep.ok()) {
    // The client went away before the connection was wired up (UCX has consumed the request
    // either way); there is nobody to answer.
    return;
  }
  ucp_ep_h handle = (*ep)->get();
  connections_[handle].ep = std::move(*ep);
}

void MemoryServer::Impl::ReapFailed() {
  if (!reap_) return;
  reap_ = false;
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->second.ep->failed()) {
      it->second.ep->ForceClose();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

uint32_t MemoryServer::Impl::DistinctClients() const {
  std::unordered_set<uint64_t> nonces;
  for (const auto& [handle, c] : connections_) {
    if (c.client_nonce != 0 && !c.ep->failed()) nonces.insert(c.client_nonce);
  }
  return static_cast<uint32_t>(nonces.size());
}

bool MemoryServer::Impl::Poll() {
  bool busy = worker_->Progress() != 0;
  for (ucp_conn_request_h r : listener_->TakeRequests()) {
    Accept(r);
    busy = true;
  }
  while (!inbox_.empty()) {
    Incoming in = std::move(inbox_.front());
    inbox_.pop_front();
    Handle(in);
    busy = true;
  }
  ReapFailed();
  return busy;
}

void MemoryServer::Impl::Handle(const Incoming& in) {
  uint64_t request_id = 0;
  Result<std::vector<std::byte>> reply = Status::Internal("unset");
  auto message = wire::Decode(in.bytes);
  if (!message.ok()) {
    ++rejected_;
    // Echo the request id if the header at least was readable, so the client can match it.
    request_id = transport::RequestIdOf(in.bytes).value_or(0);
    reply = message.status().WithContext(Name() + ": rejected message");
  } else {
    request_id = message->header.request_id;
    reply = Answer(*message, in.reply_ep);
    if (reply.ok()) ++requests_served_;
  }
  if (in.reply_ep == nullptr) return;  // the sender asked for no reply path
  std::vector<std::byte> bytes =
      reply.ok() ? std::move(*reply) : wire::EncodeError(request_id, reply.status());
  Status s = transport::PostAm(in.reply_ep, transport::kControlAm, std::move(bytes), false);
  (void)s;  // a client that vanished gets no answer; its endpoint is reaped on error
}

Result<std::vector<std::byte>> MemoryServer::Impl::Answer(const wire::Message& m,
                                                          ucp_ep_h reply_ep) {
  const uint64_t id = m.header.request_id;
  switch (m.opcode) {
    case wire::Opcode::kHelloRequest: {
      auto hello = m.As<wire::HelloRequest>();
      auto it = connections_.find(reply_ep);
      if (it != connections_.end()) it->second.client_nonce = hello.client_nonce;
      wire::HelloReply r{};
      r.server_id = options_.id;
      r.rkey_size = static_cast<uint32_t>(region_->packed_rkey().size());
      r.region_base = reinterpret_cast<uint64_t>(region_->data());
      r.region_size = chunks_.region_size();
      r.chunk_size = chunks_.chunk_size();
      r.server_pid = static_cast<uint64_t>(getpid());
      return wire::Encode(id, r, region_->packed_rkey());
    }
    case wire::Opcode::kLeaseRequest: {
      auto req = m.As<wire::LeaseRequest>();
      auto offset = chunks_.Lease(req.size);
      if (!offset.ok()) return offset.status().WithContext(Name() + ": lease refused");
      return wire::Encode(id, wire::LeaseReply{*offset, req.size});
    }
    case wire::Opcode::kReleaseRequest: {
      auto req = m.As<wire::ReleaseRequest>();
      FARPOOL_RETURN_IF_ERROR(chunks_.Release(req.offset, req.size).WithContext(Name()));
      return wire::Encode(id, wire::ReleaseReply{req.size});
    }
    case wire::Opcode::kStatsRequest: {
      wire::StatsReply r{};
      r.server_id = options_.id;
      r.clients = DistinctClients();
      r.capacity = chunks_.capacity();
      r.leased = chunks_.leased();
      r.largest_free = chunks_.largest_free();
      r.chunk_size = chunks_.chunk_size();
      r.requests_served = requests_served_;
      r.rejected = rejected_;
      r.uptime_ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started_).count());
      r.server_pid = static_cast<uint64_t>(getpid());
      r.rss_private = PrivateResidentBytes();
      return wire::Encode(id, r);
    }
    case wire::Opcode::kHelloReply:
    case wire::Opcode::kLeaseReply:
    case wire::Opcode::kReleaseReply:
    case wire::Opcode::kStatsReply:
    case wire::Opcode::kErrorReply:
      break;
  }
  ++rejected_;
  return Status::Protocol(Name() + ": " + std::string(wire::OpcodeName(m.opcode)) +
                          " is a reply, not a request");
}

void MemoryServer::Impl::Shutdown() {
  // Endpoints first (they reference the worker), then the listener, region, worker, context.
  for (auto& [handle, c] : connections_) c.ep->ForceClose();
  connections_.clear();
  listener_.reset();
  region_.reset();
  worker_.reset();
  context_.reset();
}

Result<std::unique_ptr<MemoryServer>> MemoryServer::Start(const ServerOptions& options) {
  std::unique_ptr<MemoryServer> server(new MemoryServer(options));
  server->impl_ = std::make_unique<Impl>(options);
  Status s = server->impl_->Init(&server->port_);
  if (!s.ok()) {
    server->impl_->Shutdown();
    return s.WithContext("server " + std::to_string(options.id) + " (" + options.host + ":" +
                         std::to_string(options.port) + ")");
  }
  server->options_.port = server->port_;
  MemoryServer* raw = server.get();
  server->progress_thread_ = std::thread([raw] {
    const bool event = raw->options_.progress == ProgressMode::kEvent;
    auto last_work = Clock::now();
    while (!raw->stop_.load(std::memory_order_relaxed)) {
      if (raw->impl_->Poll()) {
        last_work = Clock::now();
      } else if (event && Clock::now() - last_work > kEventSpin) {
        raw->impl_->Idle();
        last_work = Clock::now();
      }
    }
    raw->impl_->Shutdown();
  });
  return server;
}

void MemoryServer::Stop() {
  stop_.store(true);
  if (progress_thread_.joinable()) progress_thread_.join();
}

MemoryServer::MemoryServer(const ServerOptions& options) : options_(options) {}

MemoryServer::~MemoryServer() { Stop(); }

}  // namespace farpool
