#include "transport/am_server.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "transport/ucx.h"

namespace farpool {

Result<ProgressMode> ParseProgressMode(std::string_view text) {
  if (text == "busy") return ProgressMode::kBusy;
  if (text == "event") return ProgressMode::kEvent;
  return Status::InvalidArgument("unknown progress mode '" + std::string(text) +
                                 "' (expected busy or event)");
}

std::string_view ProgressModeName(ProgressMode mode) {
  return mode == ProgressMode::kBusy ? "busy" : "event";
}

}  // namespace farpool

namespace farpool::transport {

using Clock = std::chrono::steady_clock;

class AmServer::Impl {
 public:
  explicit Impl(const AmServerOptions& options) : options_(options) {}

  Status Init();
  // Serves until `stop` is set.
  void Run(AmHandler& handler, const std::atomic<bool>& stop);
  // Endpoints first (they reference the worker), then the listener, the region, the worker and
  // the context. Idempotent.
  void Close();

  uint16_t port() const { return port_; }
  MemoryRegion* region() { return region_.get(); }
  void Wake() {
    if (worker_) worker_->Signal();
  }
  std::vector<uint64_t> tags() const;
  size_t CloseConnections(uint64_t tag, const Peer* keep);

 private:
  struct Connection {
    std::unique_ptr<Endpoint> ep;
    Peer peer;
  };
  struct Incoming {
    std::vector<std::byte> bytes;
    ucp_ep_h reply_ep;  // null: the sender gave no reply path
  };

  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  // One iteration of the loop; returns whether anything happened.
  bool Poll();
  void Accept(ucp_conn_request_h request);
  void Reply(ucp_ep_h reply_ep, std::vector<std::byte> bytes);
  void ReapFailed();

  AmServerOptions options_;
  AmHandler* handler_ = nullptr;  // set by Run
  std::unique_ptr<Context> context_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<Listener> listener_;
  uint16_t port_ = 0;
  std::unordered_map<ucp_ep_h, Connection> connections_;
  std::unordered_map<uint64_t, ucp_ep_h> by_id_;  // Peer::id -> endpoint
  uint64_t next_id_ = 1;
  std::vector<LateReply> late_;
  // Messages received and not yet handled, in order; emptied by every Poll (a connection closed
  // while it is handled may progress the worker, which appends to it meanwhile).
  std::vector<Incoming> inbox_;
  // Buffers of handled messages, kept for the next ones (OnMessage copies each message out of
  // UCX's receive buffer, which the TCP transport does not let a callback keep): no allocation
  // per message. At most kSpareBuffers of at most kSpareBytes each.
  std::vector<std::vector<std::byte>> spare_;
  static constexpr size_t kSpareBuffers = 64;
  static constexpr size_t kSpareBytes = 64 << 10;
  // The replies of the messages handled in this Poll, held for AmHandler::Settle.
  std::vector<ucp_ep_h> reply_eps_;
  std::vector<uint64_t> reply_connections_;  // Peer::id, 0: none
  std::vector<std::vector<std::byte>> replies_;
  std::vector<LateReply> settled_;  // AmHandler::TakeSettled's
  std::vector<Worker*> side_;       // AmHandler::SideWorkers', for the next sleep
  bool reap_ = false;               // an endpoint failed since the last ReapFailed
  // Asked to close by the handler of the current message (CloseConnections).
  std::vector<ucp_ep_h> to_close_;
  // Closed during this Poll: their messages left in the inbox are dropped. Cleared when the
  // inbox is empty, before UCX can reuse a handle for a new connection.
  std::unordered_set<ucp_ep_h> closed_;
};

Status AmServer::Impl::Init() {
  Context::Options copts;
  copts.fabric = options_.fabric;
  copts.wakeup = options_.progress == ProgressMode::kEvent;
  // The worker opens the interfaces the context listed at its creation; one removed in between
  // (a veth of another cluster's network namespace being deleted: the kernel removes them
  // asynchronously) fails it with "No such device". A new context lists them again.
  for (int attempt = 1;; ++attempt) {
    FARPOOL_ASSIGN_OR_RETURN(context_, Context::Create(copts));
    auto worker = Worker::Create(*context_, copts.wakeup);
    if (worker.ok()) {
      worker_ = std::move(*worker);
      break;
    }
    constexpr int kAttempts = 5;
    if (worker.status().code() != StatusCode::kUnavailable || attempt == kAttempts) {
      return worker.status();
    }
    context_.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * attempt));
  }
  FARPOOL_RETURN_IF_ERROR(worker_->SetAmHandler(options_.am_id, &OnMessage, this));
  if (options_.region_size > 0) {
    FARPOOL_ASSIGN_OR_RETURN(region_, MemoryRegion::Allocate(*context_, options_.region_size,
                                                             options_.region_reserve_after));
  }
  FARPOOL_ASSIGN_OR_RETURN(listener_, Listener::Create(*worker_, options_.host, options_.port));
  port_ = listener_->port();
  return Status::Ok();
}

ucs_status_t AmServer::Impl::OnMessage(void* arg, const void* /*header*/, size_t /*header_length*/,
                                       void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  ucp_ep_h reply_ep =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    // Receiving it would take a rendezvous transfer the loop does not run: drop the payload.
    ucp_am_data_release(self->worker_->get(), data);
    std::vector<std::byte> refusal = self->handler_->Refuse(
        Status::Protocol("rendezvous message of " + std::to_string(length) +
                         " bytes refused (this server takes eager messages only)"));
    if (reply_ep != nullptr) self->Reply(reply_ep, std::move(refusal));
    return UCS_OK;
  }
  const auto* bytes = static_cast<const std::byte*>(data);
  std::vector<std::byte> copy;
  if (!self->spare_.empty()) {
    copy = std::move(self->spare_.back());
    self->spare_.pop_back();
  }
  copy.assign(bytes, bytes + length);
  self->inbox_.push_back({std::move(copy), reply_ep});
  return UCS_OK;
}

void AmServer::Impl::Accept(ucp_conn_request_h request) {
  auto ep = Endpoint::Accept(*worker_, request, [this](ucs_status_t) { reap_ = true; });
  if (!ep.ok()) {
    // The client went away before the connection was wired up (UCX has consumed the request
    // either way); there is nobody to answer.
    return;
  }
  ucp_ep_h handle = (*ep)->get();
  Connection& c = connections_[handle];
  c.ep = std::move(*ep);
  c.peer.id = next_id_++;
  by_id_[c.peer.id] = handle;
}

void AmServer::Impl::Reply(ucp_ep_h reply_ep, std::vector<std::byte> bytes) {
  Status s = PostAm(reply_ep, options_.am_id, std::move(bytes), false);
  (void)s;  // a peer that vanished gets no answer; its endpoint is reaped on error
}

void AmServer::Impl::ReapFailed() {
  if (!reap_) return;
  reap_ = false;
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->second.ep->failed()) {
      it->second.ep->ForceClose();
      handler_->Closed(it->second.peer);
      by_id_.erase(it->second.peer.id);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

bool AmServer::Impl::Poll() {
  bool busy = worker_->Progress() != 0;
  for (ucp_conn_request_h r : listener_->TakeRequests()) {
    Accept(r);
    busy = true;
  }
  // By index: a ForceClose below progresses the worker, which may append to the inbox.
  for (size_t i = 0; i < inbox_.size(); ++i) {
    Incoming in = std::move(inbox_[i]);
    busy = true;
    if (in.reply_ep == nullptr || closed_.count(in.reply_ep) == 0) {
      auto c = connections_.find(in.reply_ep);
      Peer* from = c == connections_.end() ? nullptr : &c->second.peer;
      replies_.push_back(handler_->Handle(in.bytes, from));
      reply_eps_.push_back(in.reply_ep);
      reply_connections_.push_back(from == nullptr ? 0 : from->id);
    }
    if (spare_.size() < kSpareBuffers && in.bytes.capacity() <= kSpareBytes) {
      spare_.push_back(std::move(in.bytes));
    }
    for (ucp_ep_h handle : to_close_) {
      auto closing = connections_.find(handle);
      closing->second.ep->ForceClose();
      handler_->Closed(closing->second.peer);
      by_id_.erase(closing->second.peer.id);
      connections_.erase(closing);
      closed_.insert(handle);
    }
    to_close_.clear();
  }
  inbox_.clear();
  handler_->TakeLate(&late_);
  for (LateReply& late : late_) {
    auto c = by_id_.find(late.connection);
    replies_.push_back(std::move(late.bytes));
    reply_eps_.push_back(c == by_id_.end() ? nullptr : c->second);
    reply_connections_.push_back(c == by_id_.end() ? 0 : late.connection);
    busy = true;
  }
  late_.clear();
  if (!replies_.empty()) {
    handler_->Settle(replies_, reply_connections_);
    for (size_t i = 0; i < replies_.size(); ++i) {
      // No reply on a connection the handler has closed (the sender's own, if it asked), and
      // none for a message answered later.
      if (reply_eps_[i] != nullptr && closed_.count(reply_eps_[i]) == 0 && !replies_[i].empty()) {
        Reply(reply_eps_[i], std::move(replies_[i]));
      }
    }
    replies_.clear();
    reply_eps_.clear();
    reply_connections_.clear();
  }
  handler_->TakeSettled(&settled_);
  for (LateReply& settled : settled_) {
    auto c = by_id_.find(settled.connection);
    if (c != by_id_.end() && !settled.bytes.empty()) Reply(c->second, std::move(settled.bytes));
    busy = true;
  }
  settled_.clear();
  closed_.clear();
  ReapFailed();
  return busy;
}

void AmServer::Impl::Run(AmHandler& handler, const std::atomic<bool>& stop) {
  handler_ = &handler;
  if (!options_.thread_name.empty()) {
    (void)pthread_setname_np(pthread_self(), options_.thread_name.substr(0, 15).c_str());
  }
  const bool event = options_.progress == ProgressMode::kEvent;
  auto last_work = Clock::now();
  auto next_tick = last_work + kTickPeriod;
  // One clock read per iteration (a message wakes the loop, one iteration handles it, the next
  // finds nothing and sleeps: two reads per message where there were six): on this VM's clock a
  // read was ~2% of a server's samples per round trip (docs/pool.md, "Measured: the cost of a
  // round trip over TCP"). The spin counts from the last work or wakeup, timed by the read
  // after it.
  bool woke = false;
  while (!stop.load(std::memory_order_relaxed)) {
    const bool worked = Poll();
    const auto now = Clock::now();
    if (worked || woke) last_work = now;
    woke = false;
    if (!worked && event && now - last_work >= options_.event_spin) {
      // Until the next tick, or earlier if the handler has a bound to keep (rounded up to the
      // poll's millisecond; 0 polls once without sleeping).
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now);
      if (auto wake = handler_->WakeAt()) {
        wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(*wake - now));
      }
      side_.clear();
      handler_->SideWorkers(&side_);
      Status s = worker_->Wait(std::max(wait, std::chrono::milliseconds(0)), side_);
      (void)s;  // a failed wait only means we poll again sooner
      woke = true;
    }
    if (now >= next_tick) {
      handler_->Tick();
      next_tick = Clock::now() + kTickPeriod;
    }
  }
}

std::vector<uint64_t> AmServer::Impl::tags() const {
  std::vector<uint64_t> out;
  for (const auto& [handle, c] : connections_) {
    if (!c.ep->failed()) out.push_back(c.peer.tag);
  }
  return out;
}

size_t AmServer::Impl::CloseConnections(uint64_t tag, const Peer* keep) {
  size_t n = 0;
  if (tag == 0) return 0;  // the tag of connections that have none
  for (auto& [handle, c] : connections_) {
    if (c.peer.tag != tag || &c.peer == keep) continue;
    if (std::find(to_close_.begin(), to_close_.end(), handle) == to_close_.end()) {
      to_close_.push_back(handle);
      ++n;
    }
  }
  return n;
}

void AmServer::Impl::Close() {
  for (auto& [handle, c] : connections_) c.ep->ForceClose();
  connections_.clear();
  by_id_.clear();
  listener_.reset();
  region_.reset();
  worker_.reset();
  context_.reset();
}

Result<std::unique_ptr<AmServer>> AmServer::Listen(const AmServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  FARPOOL_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<AmServer>(new AmServer(std::move(impl)));
}

AmServer::AmServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AmServer::~AmServer() { Stop(); }

uint16_t AmServer::port() const { return impl_->port(); }

MemoryRegion* AmServer::region() { return impl_->region(); }

void AmServer::Start(AmHandler& handler) {
  thread_ = std::thread([this, &handler] { impl_->Run(handler, stop_); });
}

void AmServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  impl_->Close();
}

void AmServer::Wake() { impl_->Wake(); }

std::vector<uint64_t> AmServer::tags() const { return impl_->tags(); }

size_t AmServer::CloseConnections(uint64_t tag, const Peer* keep) {
  return impl_->CloseConnections(tag, keep);
}

}  // namespace farpool::transport
