#include "pool/server/memory_server.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/host.h"
#include "common/units.h"
#include "farpool/pool.h"
#include "pool/memory_ops.h"
#include "pool/server/chunk_allocator.h"
#include "transport/auth.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool {

static_assert(Pool::kRootSize == wire::kRootAreaSize - wire::kRootReserved &&
                  Pool::Root(0).offset() == wire::kRootReserved,
              "the clients' root area is the servers' root area past the reserved bytes");

using Clock = std::chrono::steady_clock;

// How long an event-mode server keeps polling after its last piece of work before it sleeps:
// a client's next request usually follows within a few microseconds, and waking a sleeping
// thread costs more than that. Idle servers still sleep almost all the time.
constexpr auto kEventSpin = std::chrono::microseconds(50);

uint64_t PrivateResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

namespace {

// The pidfd calls through syscall(2): not every C library has the wrappers.
int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
int PidfdSendSignal(int pidfd, int signal) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
}
// Whether the process of `pidfd` has exited (the pidfd is readable then).
bool Exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

std::string TagName(uint64_t tag) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%08llx", static_cast<unsigned long long>(tag));
  return buf;
}

}  // namespace

// The control-message handler of the server's AmServer; runs on its progress thread.
class MemoryServer::Impl : public transport::AmHandler {
 public:
  Impl(const ServerOptions& options)
      : options_(options), chunks_(options.memory, options.chunk_size) {}
  // Joins the progress thread while this handler is still whole.
  ~Impl() override {
    Stop();
    for (auto& [tag, pin] : pins_) close(pin.pidfd);
  }

  // Listens and allocates the region; serving begins with Serve().
  Status Init();
  void Serve() { am_->Start(*this); }
  void Stop() {
    if (am_) am_->Stop();
  }
  uint16_t port() const { return port_; }

  std::vector<std::byte> Handle(std::span<const std::byte> bytes, transport::Peer* from) override;
  std::vector<std::byte> Refuse(const Status& reason) override;

 private:
  Result<std::vector<std::byte>> Answer(const wire::Message& m, transport::Peer* from);
  // A ChallengeRequest: a fresh challenge for the connection (replacing any earlier one).
  Result<wire::ChallengeReply> Challenge(const wire::ChallengeRequest& request,
                                         transport::Peer* from);
  // Checks the proof of a hello from a connection that has not authenticated; Ok marks it
  // authenticated and fills `reply`'s proof. REQUIRES: secret_.
  Status Authenticate(const wire::HelloRequest& hello, transport::Peer* from,
                      wire::HelloReply& reply);
  Status Refused(std::string why) {
    ++auth_refused_;
    return Status::PermissionDenied(Name() + ": " + std::move(why));
  }
  std::string Name() const {
    return "server " + std::to_string(options_.id) + " (" + options_.host + ":" +
           std::to_string(port_) + ")";
  }
  uint32_t DistinctClients() const;
  // Pins the client of `hello` if it asks to map the region: HelloReply::flags.
  uint16_t Pin(const wire::HelloRequest& hello, uint32_t tag);
  // Forgets the pins of processes that have exited.
  void SweepPins();
  Result<wire::EvictReply> Evict(uint64_t tag, const transport::Peer* from);
  // A client closing its Pool: drops its pin and refuses its tag from now on (no kill, ever).
  Result<wire::GoodbyeReply> Goodbye(uint64_t tag, const transport::Peer* from);
  // Remembers `tag` as refused (bounded: the oldest is forgotten first).
  void RefuseTag(uint64_t tag);
  bool IsEvicted(uint64_t tag) const { return evicted_.count(tag) != 0; }
  Status Evicted(uint64_t tag) const {
    return Status::Unavailable("evicted by " + Name() + ": process tag " + TagName(tag) +
                               " is fenced off this server (Pool::Evict, or its Pool closed and "
                               "said goodbye); its connections are closed and refused");
  }

  // A client process that may map the region: what an eviction kills.
  struct ProcessPin {
    pid_t pid = 0;
    int pidfd = -1;  // owned
    bool killed = false;
  };

  ServerOptions options_;
  uint16_t port_ = 0;
  ChunkAllocator chunks_;
  std::unique_ptr<transport::AmServer> am_;
  transport::MemoryRegion* region_ = nullptr;  // owned by am_
  Clock::time_point started_ = Clock::now();
  uint64_t requests_served_ = 0;
  uint64_t rejected_ = 0;
  uint64_t auth_refused_ = 0;
  std::optional<transport::ClusterSecret> secret_;  // none: no access control
  std::optional<BootIdBytes> boot_id_;              // unknown: no client may map
  std::unordered_map<uint64_t, ProcessPin> pins_;   // by process tag
  // Evicted process tags, at most kMaxEvictedTags; `evicted_order_` oldest first.
  std::unordered_set<uint64_t> evicted_;
  std::deque<uint64_t> evicted_order_;
};

Status MemoryServer::Impl::Init() {
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
  transport::AmServerOptions ao;
  ao.host = options_.host;
  ao.port = options_.port;
  ao.am_id = transport::kControlAm;
  ao.progress = options_.progress;
  ao.event_spin = kEventSpin;
  ao.fabric = options_.fabric;
  ao.region_size = chunks_.region_size();
  if (!options_.secret_file.empty()) {  // before listening: a bad file fails the start at once
    FARPOOL_ASSIGN_OR_RETURN(secret_, transport::ClusterSecret::Read(options_.secret_file));
  }
  FARPOOL_ASSIGN_OR_RETURN(am_, transport::AmServer::Listen(ao));
  port_ = am_->port();
  region_ = am_->region();
  auto boot = BootId();
  if (boot.ok()) boot_id_ = *boot;
  return Status::Ok();
}

uint16_t MemoryServer::Impl::Pin(const wire::HelloRequest& hello, uint32_t tag) {
  if (!(hello.flags & wire::kHelloWantsMap)) return 0;
  SweepPins();
  auto it = pins_.find(tag);
  if (it != pins_.end()) {
    return it->second.pid == static_cast<pid_t>(hello.client_pid) ? wire::kHelloMayMap
                                                                  : wire::kHelloPinRefused;
  }
  if (!boot_id_ || std::memcmp(boot_id_->data(), hello.boot_id, boot_id_->size()) != 0) {
    return wire::kHelloOtherBoot;
  }
  if (hello.client_pid == 0 || hello.client_pid > INT_MAX) return wire::kHelloNoPidfd;
  const auto pid = static_cast<pid_t>(hello.client_pid);
  const int pidfd = PidfdOpen(pid);
  if (pidfd < 0) return wire::kHelloNoPidfd;
  // Read after the pidfd is open: if the start time matches now, the pidfd is that process
  // (a pid is not reused while the process lives, and a pidfd never follows a reuse).
  auto start = ProcessStartTime(pid);
  if (!start.ok() || *start != hello.start_time) {
    close(pidfd);
    return wire::kHelloStartMismatch;
  }
  if (PidfdSendSignal(pidfd, 0) != 0) {
    close(pidfd);
    return wire::kHelloNoSignal;
  }
  pins_[tag] = ProcessPin{pid, pidfd, false};
  return wire::kHelloMayMap;
}

void MemoryServer::Impl::SweepPins() {
  for (auto it = pins_.begin(); it != pins_.end();) {
    if (Exited(it->second.pidfd)) {
      close(it->second.pidfd);
      it = pins_.erase(it);
    } else {
      ++it;
    }
  }
}

Result<wire::EvictReply> MemoryServer::Impl::Evict(uint64_t tag, const transport::Peer* from) {
  if (tag == 0 || tag > UINT32_MAX) {
    return Status::InvalidArgument(Name() + ": cannot evict " + TagName(tag) +
                                   ": a process tag is nonzero and 32 bits");
  }
  if (from != nullptr && from->tag == tag) {
    return Status::InvalidArgument(Name() + ": process tag " + TagName(tag) +
                                   " asked to evict itself");
  }
  RefuseTag(tag);
  wire::EvictReply reply{};
  reply.connections_closed = static_cast<uint32_t>(am_->CloseConnections(tag, from));
  auto it = pins_.find(tag);
  if (it == pins_.end()) return reply;  // not mapped here (or gone): closing was all
  ProcessPin& pin = it->second;
  if (!pin.killed) {
    // A stopped process dies of SIGKILL too. ESRCH: it has exited already.
    if (PidfdSendSignal(pin.pidfd, SIGKILL) != 0 && errno != ESRCH) {
      return Status::Unavailable(Name() + ": cannot kill pid " + std::to_string(pin.pid) +
                                 " (process tag " + TagName(tag) + "): " + std::strerror(errno));
    }
    pin.killed = true;
  }
  reply.flags = wire::kEvictKilled;
  if (Exited(pin.pidfd)) {
    reply.flags |= wire::kEvictExited;
    close(pin.pidfd);
    pins_.erase(it);
  }
  return reply;
}

void MemoryServer::Impl::RefuseTag(uint64_t tag) {
  if (IsEvicted(tag)) return;
  if (evicted_order_.size() >= kMaxEvictedTags) {
    evicted_.erase(evicted_order_.front());
    evicted_order_.pop_front();
  }
  evicted_.insert(tag);
  evicted_order_.push_back(tag);
}

Result<wire::GoodbyeReply> MemoryServer::Impl::Goodbye(uint64_t tag, const transport::Peer* from) {
  if (from == nullptr || from->tag == 0 || from->tag != tag) {
    return Status::InvalidArgument(Name() + ": goodbye for process tag " + TagName(tag) +
                                   " from a connection whose hello carried " +
                                   TagName(from == nullptr ? 0 : from->tag) +
                                   ": a process says goodbye only for itself");
  }
  wire::GoodbyeReply reply{};
  auto it = pins_.find(tag);
  if (it != pins_.end()) {
    close(it->second.pidfd);
    pins_.erase(it);
    reply.unpinned = 1;
  }
  RefuseTag(tag);
  return reply;
}

Result<wire::ChallengeReply> MemoryServer::Impl::Challenge(const wire::ChallengeRequest& request,
                                                           transport::Peer* from) {
  wire::ChallengeReply reply{};
  if (!secret_) {
    reply.flags = wire::kChallengeOpen;
    return reply;
  }
  if (from == nullptr) {
    return Refused("authentication failed: a challenge needs a reply path (the sender gave none)");
  }
  FARPOOL_ASSIGN_OR_RETURN(transport::Nonce nonce, transport::RandomNonce());
  transport::Challenge c;
  std::memcpy(c.client.data(), request.client_nonce, c.client.size());
  c.server = nonce;
  from->challenge = c;
  std::memcpy(reply.server_nonce, nonce.data(), nonce.size());
  return reply;
}

Status MemoryServer::Impl::Authenticate(const wire::HelloRequest& hello, transport::Peer* from,
                                        wire::HelloReply& reply) {
  if (!(hello.flags & wire::kHelloHasProof)) {
    return Refused(
        "authentication failed: no cluster secret: this server requires one (the client's "
        "cluster file names no secret_file)");
  }
  if (from == nullptr || !from->challenge) {
    return Refused(
        "authentication failed: a hello with a proof but no challenge on this "
        "connection (send a ChallengeRequest first)");
  }
  const transport::Challenge c = *from->challenge;
  from->challenge.reset();  // one proof per challenge, right or wrong
  transport::Proof proof;
  std::memcpy(proof.data(), hello.proof, proof.size());
  if (!secret_->Verify(proof, transport::ClusterSecret::Role::kClient, c.client, c.server)) {
    return Refused("authentication failed: wrong cluster secret");
  }
  from->authenticated = true;
  const transport::Proof mine =
      secret_->Prove(transport::ClusterSecret::Role::kServer, c.client, c.server);
  std::memcpy(reply.proof, mine.data(), mine.size());
  reply.flags = wire::kHelloServerProof;
  return Status::Ok();
}

uint32_t MemoryServer::Impl::DistinctClients() const {
  std::unordered_set<uint64_t> tags;
  for (uint64_t tag : am_->tags()) {
    if (tag != 0) tags.insert(tag);
  }
  return static_cast<uint32_t>(tags.size());
}

std::vector<std::byte> MemoryServer::Impl::Refuse(const Status& reason) {
  ++rejected_;
  return wire::EncodeError(0, reason.WithContext(Name()));
}

std::vector<std::byte> MemoryServer::Impl::Handle(std::span<const std::byte> bytes,
                                                  transport::Peer* from) {
  auto message = wire::Decode(bytes);
  if (!message.ok()) {
    ++rejected_;
    // Echo the request id if the header at least was readable, so the client can match it.
    return wire::EncodeError(transport::RequestIdOf(bytes).value_or(0),
                             message.status().WithContext(Name() + ": rejected message"));
  }
  auto reply = Answer(*message, from);
  if (!reply.ok()) return wire::EncodeError(message->header.request_id, reply.status());
  ++requests_served_;
  return std::move(*reply);
}

Result<std::vector<std::byte>> MemoryServer::Impl::Answer(const wire::Message& m,
                                                          transport::Peer* from) {
  const uint64_t id = m.header.request_id;
  // Nothing but the challenge and the hello (which authenticates) from a connection that has
  // not authenticated.
  if (secret_ && m.opcode != wire::Opcode::kChallengeRequest &&
      m.opcode != wire::Opcode::kHelloRequest && (from == nullptr || !from->authenticated)) {
    return Refused("not authenticated: " + std::string(wire::OpcodeName(m.opcode)) +
                   " refused (a connection proves it knows the cluster secret in its hello "
                   "before anything else)");
  }
  if (from != nullptr && from->tag != 0 && IsEvicted(from->tag)) return Evicted(from->tag);
  switch (m.opcode) {
    case wire::Opcode::kChallengeRequest: {
      FARPOOL_ASSIGN_OR_RETURN(wire::ChallengeReply r,
                               Challenge(m.As<wire::ChallengeRequest>(), from));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kHelloRequest: {
      auto hello = m.As<wire::HelloRequest>();
      wire::HelloReply r{};
      if (secret_ && (from == nullptr || !from->authenticated)) {
        FARPOOL_RETURN_IF_ERROR(Authenticate(hello, from, r));
      }
      const uint32_t tag = static_cast<uint32_t>(hello.client_nonce);
      if (tag == 0) {
        return Status::InvalidArgument(Name() +
                                       ": hello without a process tag (the low 32 "
                                       "bits of the client nonce are 0)");
      }
      if (from != nullptr) from->tag = tag;
      if (IsEvicted(tag)) return Evicted(tag);
      r.server_id = options_.id;
      r.flags |= Pin(hello, tag);
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
      r.auth_refused = auth_refused_;
      return wire::Encode(id, r);
    }
    case wire::Opcode::kBatchRequest: {
      auto req = m.As<wire::BatchRequest>();
      memory_ops::Region region{
          region_->data(), chunks_.region_size(),
          [this](uint64_t offset, uint64_t size) { return chunks_.Covers(offset, size); },
          options_.id};
      auto results = memory_ops::Execute(req.op_count, m.tail, region);
      if (!results.ok()) {
        ++rejected_;
        return results.status().WithContext(Name());
      }
      return wire::Encode(
          id, wire::BatchReply{req.op_count, static_cast<uint32_t>(results->size())}, *results);
    }
    case wire::Opcode::kEvictRequest: {
      FARPOOL_ASSIGN_OR_RETURN(wire::EvictReply r, Evict(m.As<wire::EvictRequest>().tag, from));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kGoodbyeRequest: {
      FARPOOL_ASSIGN_OR_RETURN(wire::GoodbyeReply r,
                               Goodbye(m.As<wire::GoodbyeRequest>().tag, from));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kHelloReply:
    case wire::Opcode::kChallengeReply:
    case wire::Opcode::kGoodbyeReply:
    case wire::Opcode::kEvictReply:
    case wire::Opcode::kBatchReply:
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

Result<std::unique_ptr<MemoryServer>> MemoryServer::Start(const ServerOptions& options) {
  std::unique_ptr<MemoryServer> server(new MemoryServer(options));
  server->impl_ = std::make_unique<Impl>(options);
  Status s = server->impl_->Init();
  if (!s.ok()) {
    return s.WithContext("server " + std::to_string(options.id) + " (" + options.host + ":" +
                         std::to_string(options.port) + ")");
  }
  server->port_ = server->impl_->port();
  server->options_.port = server->port_;
  server->impl_->Serve();
  return server;
}

void MemoryServer::Stop() { impl_->Stop(); }

MemoryServer::MemoryServer(const ServerOptions& options) : options_(options) {}

MemoryServer::~MemoryServer() { Stop(); }

}  // namespace farpool
