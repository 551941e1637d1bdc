#include "pool/server/memory_server.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <unordered_set>
#include <vector>

#include "common/host.h"
#include "common/units.h"
#include "farpool/pool.h"
#include "pool/memory_ops.h"
#include "pool/server/chunk_allocator.h"
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

// The control-message handler of the server's AmServer; runs on its progress thread.
class MemoryServer::Impl : public transport::AmHandler {
 public:
  Impl(const ServerOptions& options)
      : options_(options), chunks_(options.memory, options.chunk_size) {}
  // Joins the progress thread while this handler is still whole.
  ~Impl() override { Stop(); }

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
  std::string Name() const {
    return "server " + std::to_string(options_.id) + " (" + options_.host + ":" +
           std::to_string(port_) + ")";
  }
  uint32_t DistinctClients() const;

  ServerOptions options_;
  uint16_t port_ = 0;
  ChunkAllocator chunks_;
  std::unique_ptr<transport::AmServer> am_;
  transport::MemoryRegion* region_ = nullptr;  // owned by am_
  Clock::time_point started_ = Clock::now();
  uint64_t requests_served_ = 0;
  uint64_t rejected_ = 0;
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
  FARPOOL_ASSIGN_OR_RETURN(am_, transport::AmServer::Listen(ao));
  port_ = am_->port();
  region_ = am_->region();
  return Status::Ok();
}

uint32_t MemoryServer::Impl::DistinctClients() const {
  std::unordered_set<uint64_t> nonces;
  for (uint64_t nonce : am_->tags()) {
    if (nonce != 0) nonces.insert(nonce);
  }
  return static_cast<uint32_t>(nonces.size());
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
  switch (m.opcode) {
    case wire::Opcode::kHelloRequest: {
      auto hello = m.As<wire::HelloRequest>();
      if (from != nullptr) from->tag = hello.client_nonce;
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
    case wire::Opcode::kBatchRequest: {
      auto req = m.As<wire::BatchRequest>();
      memory_ops::Region region{
          region_->data(), chunks_.region_size(),
          [this](uint64_t offset, uint64_t size) { return chunks_.Covers(offset, size); }};
      auto results = memory_ops::Execute(req.op_count, m.tail, region);
      if (!results.ok()) {
        ++rejected_;
        return results.status().WithContext(Name());
      }
      return wire::Encode(
          id, wire::BatchReply{req.op_count, static_cast<uint32_t>(results->size())}, *results);
    }
    case wire::Opcode::kHelloReply:
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
