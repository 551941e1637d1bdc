// AmServer: the UCX server loop of farpool's servers (`farpool server`, the memory server, and
// `farpool shard`, the partition server). It listens on HOST:PORT, accepts connections, and
// hands every active message of its id to an AmHandler, whose reply it posts back.
//
// How it works: Listen() creates a UCX context and worker, registers the active-message
// handler, allocates the memory region if the options ask for one (the memory server's
// donation, registered on the server's context) and listens; nothing is served until Start(),
// so the owner can first learn port() and region(). Start() runs one progress thread, the only
// thread that touches the worker, the region's UCX state and the endpoints once it runs. Each
// iteration of its loop
//   1. progresses the worker: UCX's callbacks queue connection requests, copy each eager
//      message into the inbox, and mark endpoints whose peer died;
//   2. accepts the queued connection requests;
//   3. passes each inbox message to AmHandler::Handle and force-closes the connections the
//      handler asked to close (CloseConnections); messages still in the inbox from a connection
//      closed so are dropped unread (there is nobody left to answer, and a handler that closed a
//      connection wants nothing more from it executed);
//   4. once the inbox is empty, collects the replies the handler held back earlier and can
//      send now (AmHandler::TakeLate: a memory server's waiting compare-and-swaps), calls
//      AmHandler::Settle with the replies of the messages it handled and those (a primary
//      memory server sends their effects to its backup there, and holds back the replies that
//      must wait for the backup's acknowledgement), then posts each reply (eagerly, without
//      waiting) to its sender, if it asked for a reply path and its connection was not closed
//      meanwhile; an empty reply is the handler's "later" and is not sent; then posts the
//      replies the handler released after settling them (AmHandler::TakeSettled: those the
//      backup has acknowledged), as they are;
//   5. closes and forgets the endpoints that failed (reap), telling the handler (Closed);
//   6. every kTickPeriod, calls AmHandler::Tick (an event-mode loop wakes up for it), and an
//      event-mode loop also wakes up by AmHandler::WakeAt and for events on the handler's
//      AmHandler::SideWorkers (a primary's links to its backups: an acknowledgement).
// A message that arrives by rendezvous (larger than the eager limit) is refused unread: the
// sender gets AmHandler::Refuse's error reply. Every farpool sender posts eagerly (PostAm,
// Endpoint::SendAm), so only a foreign or broken sender meets this.
//
// Progress modes: kBusy polls without pause (lowest latency for TCP clients, one core per
// server); kEvent keeps polling for `event_spin` after the last piece of work, then sleeps on
// the worker's event descriptor (a burst of requests is served at polling speed, an idle server
// sleeps; same-host clients that map a memory server's region need no server CPU at all).
//
// Stop() tears down in the order UCX needs: connections, listener, region, worker, context
// (destroying the worker is what closes the peers' sockets, so they see the server go at once).
//
// Thread-safety: Listen/port/region/Start/Stop/destructor from one owning thread. The handler,
// tags() and CloseConnections() run on the progress thread only (before Start: not at all).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "farpool/fabric.h"
#include "farpool/status.h"
#include "transport/auth.h"

namespace farpool {

// A runtime option of every server, like Fabric.
enum class ProgressMode : uint8_t { kBusy, kEvent };
Result<ProgressMode> ParseProgressMode(std::string_view text);
std::string_view ProgressModeName(ProgressMode mode);  // "busy", "event"

}  // namespace farpool

namespace farpool::transport {

class MemoryRegion;
class Worker;

// One accepted connection as a handler sees it.
struct Peer {
  // The handler's label for this peer, 0 until it sets one (the memory server: the process tag
  // of its hello, to count distinct client processes and to evict them).
  uint64_t tag = 0;
  // The connection's number, nonzero, never reused by this server: what a handler that
  // answers later names the connection by (LateReply).
  uint64_t id = 0;
  // The handler's access control of this connection (the memory server: transport/auth.h):
  // the challenge it issued and not yet checked, and whether the peer has proved it knows the
  // cluster secret.
  std::optional<Challenge> challenge;
  bool authenticated = false;
  // The pool (tenant) the connection authenticated for (transport/auth.h: PoolId, its name);
  // 0 and "": the default pool.
  uint32_t pool = 0;
  std::string pool_name;
};

// A reply a handler held back (an empty reply from Handle) and sends now: to connection
// `connection` (Peer::id), dropped if that connection is gone.
struct LateReply {
  uint64_t connection;
  std::vector<std::byte> bytes;
};

// What a server does with its messages. Called on the progress thread only.
class AmHandler {
 public:
  virtual ~AmHandler() = default;
  // The reply to one message. `from` is the connection it arrived on, or null if the sender
  // gave no reply path (then the reply is dropped). Empty: no reply now (the handler may send
  // one later through TakeLate, only to a connection it was given here).
  virtual std::vector<std::byte> Handle(std::span<const std::byte> message, Peer* from) = 0;
  // Appends the replies held back that can go now; called on every iteration of the loop
  // (after the inbox is drained, before Settle, which gets them after Handle's replies, in
  // the order appended).
  virtual void TakeLate(std::vector<LateReply>* out) { (void)out; }
  // The latest time the loop should run again although no message comes (event progress
  // sleeps until then at most): a handler that holds replies back with a bound.
  virtual std::optional<std::chrono::steady_clock::time_point> WakeAt() const {
    return std::nullopt;
  }
  // Connection `peer` is gone (reaped after it failed, or closed by CloseConnections): late
  // replies to it would be dropped.
  virtual void Closed(const Peer& peer) { (void)peer; }
  // The error reply, in the handler's wire format, to a message refused unread for `reason`.
  virtual std::vector<std::byte> Refuse(const Status& reason) = 0;
  // Called once the inbox is empty, before the replies of the messages handled since the last
  // call are posted: `replies` are those replies, in the order Handle returned them (after
  // them, those of TakeLate), `connections[i]` the connection (Peer::id) of replies[i], 0 for
  // none. A handler whose replies promise more than its own memory holds (a primary memory
  // server: "your write is on the backup too") makes it so here: it replaces the replies whose
  // promise it could not keep, and takes out (leaving them empty) those that must wait, to
  // release them later through TakeSettled. It may block; the loop serves nothing meanwhile.
  virtual void Settle(std::span<std::vector<std::byte>> replies,
                      std::span<const uint64_t> connections) {
    (void)replies;
    (void)connections;
  }
  // Appends the replies that Settle took out and that may go now; called on every iteration of
  // the loop, after Settle. They are posted as they are (to connections still open).
  virtual void TakeSettled(std::vector<LateReply>* out) { (void)out; }
  // Appends the workers of the handler's own, created with wakeup, whose events must wake an
  // event-mode loop now (the handler progresses them itself, from TakeSettled); none: nothing.
  virtual void SideWorkers(std::vector<Worker*>* out) { (void)out; }
  // Called at least every kTickPeriod, busy or idle, between rounds (a primary memory server
  // renews its lease with its backup there). May block briefly.
  virtual void Tick() {}
};
inline constexpr std::chrono::milliseconds kTickPeriod{50};

struct AmServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port; see AmServer::port()
  unsigned am_id = 0;
  ProgressMode progress = ProgressMode::kBusy;
  std::chrono::microseconds event_spin{0};  // kEvent: poll this long after the last work
  Fabric fabric = Fabric::kAuto;
  uint64_t region_size = 0;  // > 0: allocate a memory region of this many bytes (see region())
  uint64_t region_reserve_after = 0;  // address space reserved after it (MemoryRegion::tail)
  // The progress thread's name (at most 15 characters; empty: inherited), so that per-thread
  // profiles (perf, /proc/PID/task/TID/comm) tell a process's loops apart.
  std::string thread_name;
};

class AmServer {
 public:
  // Creates the context, worker and region, and listens.
  static Result<std::unique_ptr<AmServer>> Listen(const AmServerOptions& options);
  ~AmServer();
  AmServer(const AmServer&) = delete;
  AmServer& operator=(const AmServer&) = delete;

  // The port actually listened on.
  uint16_t port() const;
  // The region of options.region_size bytes, or null; valid until Stop().
  MemoryRegion* region();
  // Starts the progress thread. REQUIRES: not started; `handler` outlives Stop().
  void Start(AmHandler& handler);
  // Joins the progress thread and tears everything down (see above). Idempotent.
  void Stop();
  // Wakes an event-mode loop that sleeps (something the handler watches changed on another
  // thread). Any thread, until Stop().
  void Wake();

  // The tags of the connections that have not failed, one per connection.
  // REQUIRES: on the progress thread (from the handler).
  std::vector<uint64_t> tags() const;

  // Closes every connection whose tag is `tag` (nonzero), except `keep`'s (the sender of the
  // current message, or null): they are force-closed when the current Handle returns, before
  // its reply is posted, and their messages still in the inbox are dropped unread. Returns how
  // many. REQUIRES: on the progress thread (from the handler).
  size_t CloseConnections(uint64_t tag, const Peer* keep);

 private:
  class Impl;
  explicit AmServer(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace farpool::transport
