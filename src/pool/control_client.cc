#include "pool/control_client.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "farpool/cluster.h"

namespace farpool::control {

using Clock = std::chrono::steady_clock;

void ReplyBox::Expect(uint64_t id, Land land, void* context) {
  expected_.push_back({id, land, context, false});
}

bool ReplyBox::Arrived(uint64_t id) const {
  for (const Expected& e : expected_) {
    if (e.id == id) return e.landed;
  }
  return replies.contains(id);
}

void ReplyBox::Forget(uint64_t id) {
  auto it = std::find_if(expected_.begin(), expected_.end(),
                         [id](const Expected& e) { return e.id == id; });
  if (it == expected_.end()) return;
  if (!it->landed) {
    // Bounded: a request that never left (its server had failed) gets no reply; a late reply
    // whose id was pushed out is kept in `replies` instead (never landed: still safe).
    if (abandoned_.size() == kMaxAbandoned) abandoned_.erase(abandoned_.begin());
    abandoned_.push_back(id);
  }
  expected_.erase(it);
}

ucs_status_t ReplyBox::OnMessage(void* arg, const void*, size_t, void* data, size_t length,
                                 const ucp_am_recv_param_t* param) {
  auto* box = static_cast<ReplyBox*>(arg);
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(data), length);
  const auto id = transport::RequestIdOf(bytes);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || !id) {
    return UCS_OK;  // not a reply we could have asked for; dropped
  }
  for (Expected& e : box->expected_) {
    if (e.id == *id && !e.landed) {
      e.land(e.context, bytes);
      e.landed = true;
      return UCS_OK;
    }
  }
  if (auto late = std::find(box->abandoned_.begin(), box->abandoned_.end(), *id);
      late != box->abandoned_.end()) {
    box->abandoned_.erase(late);  // its waiter gave up: dropped
    return UCS_OK;
  }
  box->replies[*id] = std::vector<std::byte>(bytes.begin(), bytes.end());
  return UCS_OK;
}

Result<wire::Message> CheckReply(const std::string& name, std::span<const std::byte> bytes,
                                 wire::Opcode expected) {
  auto m = wire::Decode(bytes);
  if (!m.ok()) return m.status().WithContext(name + ": bad reply");
  if (m->opcode == wire::Opcode::kErrorReply) return wire::DecodeError(*m);
  if (m->opcode != expected) {
    return Status::Protocol(name + ": expected " + std::string(wire::OpcodeName(expected)) +
                            ", got " + std::string(wire::OpcodeName(m->opcode)));
  }
  return m;
}

bool IsMovingReply(std::span<const std::byte> bytes) {
  transport::FrameHeader h;
  if (bytes.size() < sizeof(h)) return false;
  std::memcpy(&h, bytes.data(), sizeof(h));
  return h.magic == wire::kMagic && h.opcode == static_cast<uint16_t>(wire::Opcode::kMovingReply);
}

Result<Reply> TakeReply(const std::string& name, std::vector<std::byte> bytes,
                        wire::Opcode expected) {
  Reply r{std::move(bytes), {}};
  FARPOOL_ASSIGN_OR_RETURN(r.message, CheckReply(name, r.bytes, expected));
  return r;
}

Ask AskOn(std::string name, transport::Worker& worker, ReplyBox& box, transport::Endpoint& ep,
          uint64_t& next_id, Clock::time_point deadline) {
  return [name = std::move(name), &worker, &box, &ep, &next_id, deadline](
             const Encoder& encode, wire::Opcode expected) -> Result<Reply> {
    const uint64_t id = next_id++;
    Status sent = ep.SendAm(transport::kControlAm, encode(id), true, deadline, nullptr);
    if (!sent.ok()) return sent.WithContext(name);
    for (;;) {
      auto it = box.replies.find(id);
      if (it != box.replies.end()) {
        std::vector<std::byte> bytes = std::move(it->second);
        box.replies.erase(it);
        return TakeReply(name, std::move(bytes), expected);
      }
      if (ep.failed()) return Status::Unavailable(name + ": connection lost");
      if (Clock::now() > deadline) {
        return Status::TimedOut(name + ": no " + std::string(wire::OpcodeName(expected)) +
                                " in time");
      }
      worker.Progress();
    }
  };
}

Result<Reply> Handshake(const std::string& name, const transport::ClusterSecret* secret,
                        wire::HelloRequest hello, const Ask& ask) {
  transport::Challenge c;
  if (secret != nullptr) {
    FARPOOL_ASSIGN_OR_RETURN(c.client, transport::RandomNonce());
    wire::ChallengeRequest request{};
    std::memcpy(request.client_nonce, c.client.data(), c.client.size());
    FARPOOL_ASSIGN_OR_RETURN(Reply r, ask([&](uint64_t id) { return wire::Encode(id, request); },
                                          wire::Opcode::kChallengeReply));
    const auto challenge = r.message.As<wire::ChallengeReply>();
    if (challenge.flags & wire::kChallengeOpen) {
      return Status::PermissionDenied(
          name +
          ": authentication failed: the server has no cluster secret (started without "
          "--secret-file), so it cannot prove that it belongs to this cluster, whose file names "
          "a secret");
    }
    std::memcpy(c.server.data(), challenge.server_nonce, c.server.size());
    const transport::Proof proof =
        secret->Prove(transport::ClusterSecret::Role::kClient, c.client, c.server);
    std::memcpy(hello.proof, proof.data(), proof.size());
    hello.flags |= wire::kHelloHasProof;
  }
  FARPOOL_ASSIGN_OR_RETURN(Reply r, ask([&](uint64_t id) { return wire::Encode(id, hello); },
                                        wire::Opcode::kHelloReply));
  if (secret != nullptr) {
    const auto reply = r.message.As<wire::HelloReply>();
    transport::Proof proof;
    std::memcpy(proof.data(), reply.proof, proof.size());
    if (!(reply.flags & wire::kHelloServerProof) ||
        !secret->Verify(proof, transport::ClusterSecret::Role::kServer, c.client, c.server)) {
      return Status::PermissionDenied(
          name +
          ": authentication failed: the server did not prove that it knows the cluster "
          "secret (an impostor, or a server of another cluster)");
    }
  }
  return r;
}

Result<std::unique_ptr<Connection>> Connection::Open(const Options& options,
                                                     const wire::HelloRequest& hello) {
  std::unique_ptr<Connection> c(new Connection());
  c->options_ = options;
  transport::Context::Options copts;
  copts.fabric = options.fabric == Fabric::kShm ? Fabric::kAuto : options.fabric;
  copts.reach = {options.host};
  copts.wakeup = true;  // Await sleeps on the worker once a reply is late (see there)
  FARPOOL_ASSIGN_OR_RETURN(c->context_, transport::Context::Create(copts));
  FARPOOL_ASSIGN_OR_RETURN(c->worker_, transport::Worker::Create(*c->context_, true));
  FARPOOL_RETURN_IF_ERROR(
      c->worker_->SetAmHandler(transport::kControlAm, &ReplyBox::OnMessage, &c->box_));
  FARPOOL_ASSIGN_OR_RETURN(
      c->ep_, transport::Endpoint::Connect(*c->worker_, options.host, options.port, nullptr));
  FARPOOL_ASSIGN_OR_RETURN(Reply r, Handshake(options.name, options.secret, hello,
                                              AskOn(options.name, *c->worker_, c->box_, *c->ep_,
                                                    c->next_id_, Clock::now() + options.timeout)));
  c->hello_ = r.message.As<wire::HelloReply>();
  return c;
}

Result<std::unique_ptr<Connection>> Connection::OpenAsTool(uint16_t id, const std::string& address,
                                                           uint16_t port,
                                                           const transport::ClusterSecret* secret,
                                                           uint32_t tag,
                                                           std::chrono::milliseconds timeout) {
  FARPOOL_ASSIGN_OR_RETURN(auto hp, ParseHostPort(address));
  wire::HelloRequest hello{};
  hello.client_pid = static_cast<uint64_t>(getpid());
  hello.client_nonce = (static_cast<uint64_t>(getpid()) << 32) | tag;
  Options o;
  o.name = "server " + std::to_string(id) + " (" + hp.first + ":" + std::to_string(port) + ")";
  o.host = hp.first;
  o.port = port;
  o.secret = secret;
  o.fabric = Fabric::kTcp;
  o.timeout = timeout;
  return Open(o, hello);
}

Connection::~Connection() {
  ep_.reset();  // before its worker, the worker before the context
  worker_.reset();
}

Result<Reply> Connection::Call(const Encoder& encode, wire::Opcode expected) {
  return AskOn(options_.name, *worker_, box_, *ep_, next_id_, Clock::now() + options_.timeout)(
      encode, expected);
}

Status Connection::Send(std::span<const std::byte> message) {
  if (ep_->failed()) return Status::Unavailable(options_.name + ": connection lost");
  return ep_->SendAm(transport::kControlAm, message, true, Clock::now() + options_.timeout, nullptr)
      .WithContext(options_.name);
}

std::optional<Result<Reply>> Connection::Take(uint64_t id, wire::Opcode expected) {
  auto it = box_.replies.find(id);
  if (it == box_.replies.end()) return std::nullopt;
  std::vector<std::byte> bytes = std::move(it->second);
  box_.replies.erase(it);
  return TakeReply(options_.name, std::move(bytes), expected);
}

void Connection::DropRepliesBelow(uint64_t id) {
  std::erase_if(box_.replies, [id](const auto& r) { return r.first < id; });
}

Result<Reply> Connection::Await(uint64_t id, wire::Opcode expected, Clock::time_point deadline,
                                const std::function<bool()>& give_up) {
  // Polls for a short while, then sleeps on the worker: on a host with fewer cores than busy
  // threads, a waiter that keeps polling takes the core the answering server needs (a
  // primary waiting for its backup measured a 4 ms p99 per write that way on 2 cores).
  constexpr auto kSpin = std::chrono::microseconds(20);
  const auto spin_until = Clock::now() + kSpin;
  for (;;) {
    if (auto reply = Take(id, expected)) return std::move(*reply);
    if (give_up && give_up()) return Status::Aborted(options_.name + ": given up");
    if (!ep_->failed() && Clock::now() > deadline) {
      return Status::TimedOut(options_.name + ": no " + std::string(wire::OpcodeName(expected)) +
                              " within " + std::to_string(options_.timeout.count()) + " ms");
    }
    // A lost connection is final only once nobody may still give up in time: a primary waits
    // for its clients to declare its dead backup gone until the deadline.
    if (ep_->failed()) {
      if (!give_up || Clock::now() > deadline) {
        return Status::Unavailable(options_.name + ": connection lost");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    if (worker_->Progress() == 0 && Clock::now() > spin_until) {
      Status waited = worker_->Wait(std::chrono::milliseconds(1));
      (void)waited;  // a failed wait only means we poll again sooner
    }
  }
}

}  // namespace farpool::control
