// MemoryServer: donates a region of this machine's RAM to the pool.
//
// How it works: Start() allocates the region through UCX (so same-host clients can map it and
// remote clients reach it with one-sided operations) and serves on HOST:PORT with an AmServer
// (transport/am_server.h: listener, one progress thread, inbox, reaping of dead clients). The
// progress thread is the only one that touches UCX objects and the lease book; it answers
// control messages (hello, lease, release, stats; see transport/wire.h) and, on TCP, executes
// the one-sided operations UCX emulates for remote clients. Malformed or incompatible messages
// are answered with an ErrorReply and counted; they never stop the server. Clients that die
// are noticed by UCX's error handling and dropped; their leases stay (see
// pool/server/chunk_allocator.h).
//
// Eviction (the fence the servers enforce; docs/pool.md): a client that asks to map the region
// is pinned at its hello (a pidfd, after checking boot id and start time; wire::HelloReply) and
// may map only then. An EvictRequest for a process tag refuses that tag from then on, closes its
// connections and, if the process is pinned, sends it SIGKILL once; the replies say when it has
// exited. The server never waits for it. Pins live until their process exits (checked at each
// hello and eviction) or its Pool says goodbye (GoodbyeRequest, its own tag only: the pin is
// dropped and the tag refused from then on, without a kill), at most one open pidfd per live
// pinned client process. From then on this server's own port answers a hello that carries a
// refused tag, and every request on a connection whose hello carried it, with an ErrorReply
// of StatusCode::kEvicted ("evicted by server N: ..."); a waiting compare-and-swap of the tag
// is dropped unanswered (its connection is closed), and the mirror's port (mirror.h: promote,
// degrade, ...) does not check refused tags. Evicted tags are remembered up to
// kMaxEvictedTags, the oldest forgotten first.
//
// Access control (transport/auth.h, docs/pool.md "Access control"): with a cluster secret
// (ServerOptions::secret_file) a connection executes nothing until it has authenticated: a
// challenge, then a hello whose proof checks; the server proves itself in its hello reply. Every
// other request before that, and every hello with a wrong or no proof, gets an ErrorReply
// ("authentication failed: ...", "not authenticated: ...") and counts in auth_refused. Without
// a secret the server authenticates nobody and serves every connection (in-process tests,
// single-user development); `farpool cluster up` always gives its servers one.
//
// Pools (docs/pool.md "Pools"): a connection that authenticated for a pool (transport::Peer::
// pool) is that pool's client: every lease it takes is the pool's, its hello reply carries no
// remote key and no pin (it may not map), the pool's root area (one chunk, leased at the pool's
// first hello) and kHelloPoolClient; every batch operation, release and eviction it sends must
// touch only the pool's leases (the default pool's: its leases and the region's root area),
// else it is refused with PermissionDenied naming the pool and the offset, executed not at all,
// and counted in StatsReply::pool_refused. Only the default pool names backups. The same holds
// in the mirror slots it serves once promoted: their books keep each lease's owner and the
// pools' root areas, and a copy of a book (re-replication) carries them.
//
// Replication (docs/pool.md "Replication"): with ServerOptions::mirror_slots S the region's
// addresses span 1 + S times the donation: after the server's own part, S mirror slots that
// hold copies of other servers' regions (pool/server/mirror.h; slot 0 that of
// ServerOptions::mirror_of) and take their forwards on a port of their own. The slots are
// address space only until they hold a copy (mirror.h, "Memory"): the ring's slot 0 is
// committed at start when this server keeps a forwarded copy there, never with shared pages. With
// ServerOptions::replicated, every request that changes the region or the leases is refused
// until a BackupRequest names the backup; from then on the changes of each round of requests
// go to the backup (pool/server/backup_link.h) before any reply that may show them does. A
// backup that refuses them (it took this server's data over: fenced) makes this server refuse
// every later request (and call ServerOptions::on_fenced); one that does not answer fails the
// changes of the rounds outstanding (applied here, not acknowledged) until a DegradeRequest says
// the backup is gone. A server that gives a backup's copy up (degraded, or a re-replication's
// copy abandoned) tells that backup first (BackupLink::Detach), whose slot then frees its
// memory; a drain's hand-over does not (the backups promote their copies).
//
// Further backups (replicas f >= 2, docs/pool.md "Replication with f backups"): BackupRequests
// that name another backup of the own region add one link each, kept with the slot links under
// this server's own id: each round's own-part changes and lease changes go to every one of
// them, waited for in Settle after the first backup's forward was posted, so a reply leaves
// only once every live backup has every change it may show. Named while nothing is leased
// (`cluster up`), a link starts with the root area; named later (re-replication to f copies),
// the region is copied to it in slices first, and until the copy is whole the link counts for
// nothing (serving lease, failed rounds) and a failure gives the copy up. A region served from
// a promoted slot takes several links the same way. A BackupRequest naming a server that keeps
// a copy of the region already, in another slot, reports on that copy (BackupReply::slot) unless
// that slot refused a forward as another primary's (then the copy is made anew), and every
// request gives up the region's copies on servers that neither it nor the map's backups it
// carries name (DropOtherCopies); one of an older coordinator term than a request before it is
// refused (docs/pool.md "The map's backups in the request"). The serving lease needs fresh contact
// with every whole backup; a DegradeRequest removes the one it names (the set of gone backups), the
// others stay.
//
// Shared pages (ServerOptions::shared_pages): the backups map this server's region itself, so
// a round's changed bytes are not forwarded (KeepChanges keeps none), only its lease changes,
// and nothing but those holds a reply; copies to a new backup send the lease book alone.
// Once it serves a dead server's region from a slot that adopted its pages, it tells a client
// on this host that it pinned where that file is (wire::MovedFileRequest), so that a client that
// connects after the failover maps the region too.
//
// Pipelined forwards (docs/pool.md "Pipelined forwards"): at the end of a round
// (AmHandler::Settle) the server posts the round's changes to the backup and goes on serving
// the next rounds without waiting. Every reply that may show memory or leases (a batch's, a
// lease's, a release's, errors included) is held back until the backup has acknowledged every
// forward posted up to the end of its round; the others (hello, stats, evict, goodbye) go at
// once, as does every reply of a round that changed nothing while no forward is outstanding.
// Why that is linearizable: a reply may have observed any change applied before it, and every
// such change was posted by the end of its round; forwards are applied at the backup in the
// order posted; so when the reply leaves, every change it may show is on the backup, and a
// failover (which serves the backup's copy) cannot take back anything a client saw, read or
// acknowledged. Held replies leave in order (tickets never decrease): on an acknowledgement
// (the loop also sleeps on the links' workers, AmHandler::SideWorkers, while a forward is in
// flight: a held reply waits for a forward posted and not settled, which is in flight or
// pending behind one that is), with one copy when the
// backup is declared gone (DegradeRequest: released as they are), or as errors when their
// forward fails (no acknowledgement by backup_timeout after it was sent, or refused: the
// failure fails every forward outstanding, and their byte ranges are posted again). Bounded
// by BackupLink::kMaxInFlight forwards in flight and kMaxPendingBytes coalesced behind them,
// beyond which a round waits for room. The serving lease counts from when the latest
// acknowledged forward was sent. Mapped reads (shm) bypass the server and so the hold: they
// may see a change not yet on the backup (docs/pool.md).
//
// Re-replication (docs/pool.md "Re-replication"): a BackupRequest that names a backup after
// leases exist (the server has run with one copy since its backup was declared gone) connects
// to the new backup on a thread of its own (answering "all of it remains" meanwhile: the loop
// never waits for a connection), then attaches the new backup's slot and copies the region and the
// lease book to it in slices of at most kCopySlice bytes (pieces of kCopyPiece, for kCopyBudget),
// one slice per AmHandler tick, on the progress thread, which meanwhile serves and posts every
// change to the new backup as well. A slice goes through the same link as the rounds' forwards
// (BackupLink::Forward: posted after every forward before it, then waited for), and the link keeps
// the order posted, so a slice (the bytes as they are when it is sent) never overtakes a later
// change. Until the copy is complete the server promises one copy (the map's): it holds no reply
// for the copying backup, and a forward to it that fails (a slice, or a round's) abandons the copy,
// the rounds standing as acknowledged. The last slice's Forward returns once the backup has
// acknowledged it and every forward before it, so when the copy completes nothing posted is
// unacknowledged, and from then on replies are held as above. Repeating the BackupRequest reports
// the bytes left (BackupReply::remaining); 0 once complete, from which on the backup is the full
// guarantee (the coordinator writes it into the map then). backup_ is replaced only when no reply
// is held (held replies are numbered by its tickets): after a DegradeRequest (which releases them)
// or while copying (none held).
//
// A BackupRequest for a region the server serves from a promoted mirror slot
// (BackupRequest::region) does the same for that slot through a slot link of its own: the
// slot's bytes and mirrored lease book copied, the slot's changes, leases and releases
// forwarded there, its acknowledgements counted in the serving lease. The own part's further
// backups (replicas f >= 2) are slot links too, under the server's own id. Slot links are
// pipelined like the own link (docs/pool.md "Pipelined forwards to further backups"): Settle
// posts a round's changes to each and a held reply carries, besides the own link's ticket, the
// ticket of every slot link that had not settled all it was posted by the end of its round; it
// leaves once every one of those links has acknowledged that ticket (or was given up: declared
// gone, the rounds standing with the copies left), and a failure of one of its forwards answers
// it with the error instead. So a reply that may show a change leaves only once every link
// that carries it has it, and the loop never waits for a backup that does not answer: a stopped
// further backup costs its primary the refusals of MayServe once its lease lapses, not its
// loop. Only a copy's slices (CopyStep) and Post's back-pressure still wait on the loop.
//
// Waiting compare-and-swaps (memory_ops kWaitCompareAndSwap; docs/pool.md "Waiting
// compare-and-swap"): a batch whose wait-compare-and-swap finds its word held stops there and
// is answered later (the rest of the batch, in order, after it). Invariants:
//   - Waiters are kept per word, first come first served: whenever the loop executes a change
//     to a word (a batch or another waiter), that word's waiters are attempted again in arrival
//     order, before the next message is handled; clients that map the region or use UCX's
//     one-sided atomics change words without the loop, so every waited word is also read again
//     every kRecheckPeriod (event progress: at the poll's 1 ms granularity) and its waiters
//     attempted if it changed.
//   - Every waiter is answered by its bound (wait_us after it began to wait: attempted once
//     more, then the batch runs on), or dropped with its connection (closed, failed, its
//     process evicted or said goodbye). At most kMaxWaiters per server and
//     kMaxWaitersPerConnection per connection: beyond, the operation is one attempt (the client
//     polls, as it would without this).
//   - The operations of a waiting batch are checked against the leases again before it runs on;
//     a replicated server forwards what a batch changed before it stopped with that round, and
//     a round whose forward failed fails the batches that stopped in it (error reply).
//
// Without replicas (ServerOptions::replicated false; docs/pool.md "Drain without replicas"): a
// BackupRequest for its own region is taken too, to drain it: the copy above (or, with nothing
// leased, the root area alone), one copy promised until it is whole, and from then on every
// round forwarded and its replies held as when replicated. Until then nothing is forwarded:
// ForwardsBytes is false while there is no backup, so replicas 0 pays nothing for it.
//
// Drain (docs/pool.md "cluster drain"): Drain() makes the server refuse every batch, lease
// and release with a MovingReply, executed not at all, then, on the progress thread's tick, once
// no reply is held for a backup, no forward is unacknowledged and no waiter is left, closes its
// links to the backups (HandOver). From then on the backups hold every change this server ever
// acknowledged and may promote at once; the clients resend what was refused to the new holders.
//
// Progress modes (ProgressMode, transport/am_server.h): kBusy polls without pause; kEvent
// sleeps on the worker's event descriptor as soon as a poll finds no work (no spin), or until
// the next waiter's recheck or bound.
//
// Thread-safety: Start/Stop/destructor from one owning thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "farpool/fabric.h"
#include "farpool/status.h"
#include "transport/am_server.h"

namespace farpool {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: pick a free port; see MemoryServer::port()
  uint64_t memory = 0;
  uint64_t chunk_size = 4ull << 20;
  uint16_t id = 0;
  ProgressMode progress = ProgressMode::kBusy;
  Fabric fabric = Fabric::kAuto;
  // The cluster secret's file (transport::ClusterSecret::Read); empty: no access control.
  std::string secret_file;
  // Replication: the server whose region this one mirrors (same size), if any; whether this
  // server's changes must reach a backup before they are acknowledged; how long it waits.
  std::optional<uint16_t> mirror_of;
  bool replicated = false;
  // Mirror slots, each as large as the server's own part (at least 1 with mirror_of).
  uint32_t mirror_slots = 0;
  // Shared-pages backups (docs/pool.md "Shared-pages backups", pool/server/shared_pages.h; all
  // servers on one host, the region in shared memory): a backup maps this server's region file
  // instead of keeping a copy, and the mirror slots adopt other servers' files; forwards carry
  // lease changes only, and clients that map the region change it with mapped stores
  // (wire::kHelloSharedPages). A backup kills its primary's process before it serves its pages.
  bool shared_pages = false;
  // How long a forward may wait for the backup's acknowledgement before it fails (and the
  // replies held for it get errors): at most the serving lease (pool/server/mirror.h), and well
  // below the clients' failure timeout, since a client waits that long for a held reply. The
  // forwards that block the loop (a re-replication's copy slices, slot links: see the header)
  // wait as long, and a primary that blocked longer for an unreachable backup would be declared
  // dead itself by its clients' heartbeats.
  std::chrono::milliseconds backup_timeout{1000};
  // Called once, on the progress thread, when the backup refuses this server's forwards (it
  // took the data over: this server is fenced and refuses everything from then on). `farpool
  // server` shuts down then, so that its clients see it gone and follow the data.
  std::function<void(const Status&)> on_fenced;
  // Called on the mirror's loop (must not block) when the connection of a primary whose copy
  // this server keeps closes (Mirror: evidence that it is gone, not proof). `farpool server`
  // has its membership check it (coord::Membership::Options::closed).
  std::function<void(uint16_t primary_id)> on_primary_closed;
  // Called on the mirror's loop (must not block) when a connection of the coordinator's to
  // this server's mirror closes (Mirror: evidence that it is gone, not proof). `farpool
  // server` has its membership probe the coordinator (coord::Membership::Options::closed).
  std::function<void()> on_coordinator_closed;
};

// How many evicted process tags a server remembers (the oldest is forgotten first): 8 bytes each
// and then some. A forgotten tag matters only if its process, not killed (it does not map the
// region), is still alive and opens a new connection after 65,536 later evictions.
inline constexpr size_t kMaxEvictedTags = 1 << 16;
// Waiting compare-and-swaps (see the header comment): how often every waited word is read
// again for changes made without the server's loop, and the caps on waiters.
inline constexpr std::chrono::microseconds kRecheckPeriod{250};
inline constexpr size_t kMaxWaiters = 4096;
inline constexpr uint32_t kMaxWaitersPerConnection = 16;
// Re-replication: the bytes of the region copied to a new backup per tick, at most: in pieces
// of kCopyPiece (one blocking forward each), and no piece begins once kCopyBudget of the tick
// has gone to the copy. A copy thus holds the loop for at most the budget plus one piece's round
// trip per tick, whatever the load, and the serving lease's renewals and the rounds' forwards go
// between (a whole 2 MiB slice blocked the loop for 5-20 ms at low load and for more than the
// 1 s serving lease under load: its lease lapsed and clients got errors during a drain).
inline constexpr uint64_t kCopySlice = 2ull << 20;
inline constexpr uint64_t kCopyPiece = 256ull << 10;
inline constexpr std::chrono::milliseconds kCopyBudget{10};

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
  // The port of its mirror's loop (HelloReply::mirror_port); 0 without mirror slots.
  uint16_t mirror_port() const { return mirror_port_; }
  const ServerOptions& options() const { return options_; }
  // Stops serving: joins the progress thread and closes connections. Idempotent.
  void Stop();
  // A planned move (`farpool cluster drain`, docs/pool.md "cluster drain"): from now on every
  // batch, lease and release request is answered with a wire::MovingReply and not executed;
  // once the replies held for the backup are released and the waiting compare-and-swaps
  // answered, the links to the backups are closed (nothing unacknowledged: each backup may then
  // take its region over at once). Returns Ok then; TimedOut if that did not happen within
  // `timeout`. The server goes on
  // answering (hellos, stats, MovingReplies) until Stop(). REQUIRES: replicated, or a backup
  // holds the whole region (a drain without replicas; InvalidArgument otherwise, changing
  // nothing); called from the owning thread, before Stop().
  Status Drain(std::chrono::milliseconds timeout);

 private:
  class Impl;
  explicit MemoryServer(const ServerOptions& options);

  ServerOptions options_;
  uint16_t port_ = 0;
  uint16_t mirror_port_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace farpool
