// MemoryServer: donates a region of this machine's RAM to the pool.
//
// How it works: Start() allocates the region through UCX (so same-host clients can map it and
// remote clients reach it with one-sided operations), listens on HOST:PORT, and runs one
// progress thread. That thread is the only one that touches UCX objects; it accepts
// connections, answers control messages (hello, lease, release, stats; see
// transport/wire.h) and, on TCP, executes the one-sided operations UCX emulates for remote
// clients. Malformed or incompatible messages are answered with an ErrorReply and counted;
// they never stop the server. Clients that die are noticed by UCX's error handling and
// dropped; their leases stay (see pool/chunk_allocator.h).
//
// Progress modes: kBusy polls without pause (lowest latency for TCP clients, one core per
// server); kEvent sleeps on the worker's event descriptor once it has been idle for 50 us
// (for clusters that should not burn CPU: a burst of requests is served at polling speed,
// an idle server sleeps; same-host clients that map the region need no server CPU at all).
//
// Thread-safety: Start/Stop/destructor from one owning thread; stats() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "farpool/status.h"
#include "transport/ucx.h"

namespace farpool {

enum class ProgressMode : uint8_t { kBusy, kEvent };
Result<ProgressMode> ParseProgressMode(std::string_view text);

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: pick a free port; see MemoryServer::port()
  uint64_t memory = 0;
  uint64_t chunk_size = 4ull << 20;
  uint16_t id = 0;
  ProgressMode progress = ProgressMode::kBusy;
  transport::Fabric fabric = transport::Fabric::kAuto;
};

// Private resident memory (RssAnon) of this process, in bytes; 0 if unknown.
uint64_t PrivateResidentBytes();

class MemoryServer {
 public:
  static Result<std::unique_ptr<MemoryServer>> Start(const ServerOptions& options);
  ~MemoryServer();
  MemoryServer(const MemoryServer&) = delete;
  MemoryServer& operator=(const MemoryServer&) = delete;

  // The port actually listened on.
  uint16_t port() const { return port_; }
  const ServerOptions& options() const { return options_; }
  // Stops serving: closes connections and joins the progress thread. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit MemoryServer(const ServerOptions& options);

  ServerOptions options_;
  uint16_t port_ = 0;
  std::unique_ptr<Impl> impl_;
  std::thread progress_thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace farpool
