#include "db/shard_client.h"

namespace farpool::db::shard {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kRequestTimeout = std::chrono::seconds(30);
constexpr uint32_t kSpinsBeforeSleep = 64;

}  // namespace

Result<std::unique_ptr<Client>> Client::Connect(transport::Context& context,
                                                const std::vector<ServerAddress>& partitions,
                                                TxnCounters* counters) {
  std::unique_ptr<Client> c(new Client());
  c->counters_ = counters;
  FARPOOL_ASSIGN_OR_RETURN(c->worker_, transport::Worker::Create(context, /*wakeup=*/true));
  FARPOOL_RETURN_IF_ERROR(c->worker_->SetAmHandler(kShardAm, &OnMessage, c.get()));
  for (const ServerAddress& a : partitions) {
    c->names_.push_back("partition " + std::to_string(a.id) + " (" + a.Endpoint() + ")");
    auto ep = transport::Endpoint::Connect(*c->worker_, a.host, a.port, nullptr);
    if (!ep.ok()) return ep.status().WithContext(c->names_.back());
    c->eps_.push_back(std::move(*ep));
  }
  return c;
}

Client::~Client() {
  DrainLazy(Clock::now() + std::chrono::seconds(2));
  // Nothing of ours is in flight any more: close at once rather than wait for the peers'
  // acknowledgement (a graceful close that outlives its bound leaves a request UCX asserts on).
  for (auto& ep : eps_) ep->ForceClose();
  eps_.clear();
  worker_.reset();
}

Result<Reply> Client::Wait(uint64_t id, Opcode expected) {
  if (unwaited_ > 0) {
    ++counters_->round_trips;
    unwaited_ = 0;
  }
  const size_t p = pending_[id];
  const auto deadline = Clock::now() + kRequestTimeout;
  for (uint32_t spins = 0;; ++spins) {
    auto it = box_.find(id);
    if (it != box_.end()) {
      Reply r{std::move(it->second), {}};
      box_.erase(it);
      pending_.erase(id);
      auto m = Decode(r.bytes);
      if (!m.ok()) return m.status().WithContext(names_[p] + ": bad reply");
      r.message = *m;
      if (m->opcode == Opcode::kErrorReply) return DecodeError(*m);
      if (m->opcode != expected) {
        return Status::Protocol(names_[p] + ": expected " + std::string(OpcodeName(expected)) +
                                ", got " + std::string(OpcodeName(m->opcode)));
      }
      return r;
    }
    // Spin briefly (a reply over shm takes a few microseconds), then sleep on the worker's
    // event descriptor: partition servers and clients share the cores, and a spinning client
    // would take them from the servers it waits for.
    if (worker_->Progress() == 0 && spins >= kSpinsBeforeSleep) {
      Status w = worker_->Wait(std::chrono::milliseconds(1));
      (void)w;  // a failed wait only means we poll again sooner
    }
    if ((spins & 255) == 255) {
      if (eps_[p]->failed()) {
        pending_.erase(id);
        return Status::Unavailable(names_[p] + ": connection failed");
      }
      if (Clock::now() > deadline) {
        pending_.erase(id);
        return Status::TimedOut(names_[p] + ": no " + std::string(OpcodeName(expected)) +
                                " within " + std::to_string(kRequestTimeout.count()) + " s");
      }
    }
  }
}

Status Client::CollectLazy() {
  Status first;
  for (auto it = lazy_.begin(); it != lazy_.end();) {
    auto r = box_.find(*it);
    if (r == box_.end()) {
      ++it;
      continue;
    }
    auto m = Decode(r->second);
    if (first.ok()) {
      if (!m.ok())
        first = m.status();
      else if (m->opcode == Opcode::kErrorReply)
        first = DecodeError(*m);
    }
    box_.erase(r);
    pending_.erase(*it);
    it = lazy_.erase(it);
  }
  return first;
}

void Client::DrainLazy(Clock::time_point deadline) {
  while (!lazy_.empty() && Clock::now() < deadline) {
    worker_->Progress();
    Status s = CollectLazy();
    (void)s;  // shutting down: a failed install shows as a lock that a later reader resolves
  }
}

ucs_status_t Client::OnMessage(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Client*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    ucp_am_data_release(self->worker_->get(), data);
    return UCS_OK;  // not a reply we could have asked for
  }
  const auto* b = static_cast<const std::byte*>(data);
  const auto id = transport::RequestIdOf({b, length});
  if (!id || !self->pending_.count(*id)) return UCS_OK;
  self->box_[*id] = std::vector<std::byte>(b, b + length);
  return UCS_OK;
}

}  // namespace farpool::db::shard
