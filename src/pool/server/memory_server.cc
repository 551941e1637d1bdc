#include "pool/server/memory_server.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/host.h"
#include "common/process.h"
#include "common/units.h"
#include "farpool/pool.h"
#include "pool/memory_ops.h"
#include "pool/server/backup_link.h"
#include "pool/server/chunk_allocator.h"
#include "pool/server/mirror.h"
#include "pool/server/server_auth.h"
#include "transport/auth.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool {

static_assert(Pool::kRootSize == wire::kRootAreaSize - wire::kRootReserved &&
                  Pool::Root(0).offset() == wire::kRootReserved,
              "the clients' root area is the servers' root area past the reserved bytes");

using Clock = std::chrono::steady_clock;

uint64_t PrivateResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

namespace {

std::string TagName(uint64_t tag) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%08llx", static_cast<unsigned long long>(tag));
  return buf;
}

// Whether `reply` refused its request: an ErrorReply (refused, or failed before it could read
// anything) or a MovingReply (refused unexecuted while this server hands its region over). Such a
// reply shows no memory.
bool IsRefusal(std::span<const std::byte> reply) {
  transport::FrameHeader header;
  if (reply.size() < sizeof(header)) return false;
  std::memcpy(&header, reply.data(), sizeof(header));
  return header.opcode == static_cast<uint16_t>(wire::Opcode::kErrorReply) ||
         header.opcode == static_cast<uint16_t>(wire::Opcode::kMovingReply);
}

// A held reply's or a waiter's promise about a slot link (MemoryServer::Impl::SlotLink::serial):
// that link has acknowledged forward `ticket` and every one before it.
struct SlotPromise {
  uint64_t serial;
  uint64_t ticket;
};
// What names backup_, the own part's first link, where a link's serial is asked for (slot links
// count from kOwnLink + 1).
constexpr uint64_t kOwnLink = 0;

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
  // The mirror's loop first: it writes into the region, which the server's teardown frees.
  void Stop() {
    if (mirror_) mirror_->Stop();
    if (am_) am_->Stop();
  }
  uint16_t port() const { return port_; }
  uint16_t mirror_port() const { return mirror_ ? mirror_->port() : 0; }
  // MemoryServer::Drain, on the owning thread: the progress thread does the work (HandOver).
  Status Drain(std::chrono::milliseconds timeout);

  std::vector<std::byte> Handle(std::span<const std::byte> bytes, transport::Peer* from) override;
  std::vector<std::byte> Refuse(const Status& reason) override;
  // Posts this round's changes to the backup and holds back the replies that must wait for
  // acknowledgements (see the header).
  void Settle(std::span<std::vector<std::byte>> replies,
              std::span<const uint64_t> connections) override;
  // Takes the backup's acknowledgements and failures: the held replies they release.
  void TakeSettled(std::vector<transport::LateReply>* out) override;
  // The links' workers with a forward in flight (BackupLink::in_flight): arming an idle one
  // would cost a system call per sleep for nothing.
  void SideWorkers(std::vector<transport::Worker*>* out) override {
    if (backup_ != nullptr && backup_->in_flight()) out->push_back(&backup_->worker());
    for (auto& [region, l] : slot_links_) {
      if (l.link->in_flight()) out->push_back(&l.link->worker());
    }
  }
  // Waiting compare-and-swaps (see the header).
  void TakeLate(std::vector<transport::LateReply>* out) override;
  std::optional<Clock::time_point> WakeAt() const override;
  void Closed(const transport::Peer& peer) override;

 private:
  // Re-replication: while the region is copied to a new backup, the next offset to copy and
  // whether the lease book went.
  struct Copy {
    uint64_t next = 0;
    bool book_sent = false;
    Clock::time_point started = Clock::now();
  };
  // A link to a backup being connected (connecting_): a promoted slot's (kSlot), or the own
  // part's first backup (kFirst, becomes backup_) or a further one (kFurther).
  struct PendingLink {
    enum Role { kSlot, kFirst, kFurther };
    uint16_t backup_id = 0;
    uint16_t slot = 0;
    Role role = kSlot;
    uint64_t marks = 0;  // GoneMarks() when it began (Unmark)
    Clock::time_point began;
    std::future<Result<std::unique_ptr<BackupLink>>> link;
  };
  Result<std::vector<std::byte>> Answer(const wire::Message& m, transport::Peer* from);
  // Keeps this batch's changes (from `before` in changed_) for the backup if replicated, else
  // drops them (they served only to wake waiters).
  void KeepChanges(size_t before);
  // Whether the bytes a round changed go to the backups: replicated (or, without replicas,
  // while a drain copies the region: backup_), unless they share this server's pages (then only
  // lease changes do).
  bool ForwardsBytes() const {
    return (options_.replicated || backup_ != nullptr) && !options_.shared_pages;
  }
  // Ok if a request that changes the region or the leases may run now (replication).
  Status MayChange() const;
  // Ok while the lease from the backup holds (replicated, not degraded): see mirror.h.
  Status MayServe() const;
  // Renews the lease with the backup when due (AmHandler tick).
  void Tick() override;
  // The backup refused us (it took our data over): refuse everything from now on.
  void Fence(const Status& why);
  // Draining (moving_): once nothing is held, waiting or in flight, closes the links to the
  // backups, so that they may take the regions over at once (mirror.h), and says so
  // (handed_over_).
  void HandOver();
  // Stops forwarding: the backup was declared gone (DegradeRequest). The rounds it had not
  // acknowledged stand with one copy: their held replies go.
  void Degrade();
  bool DeclaredGone() const { return backup_ != nullptr && DeclaredGone(*backup_); }
  bool DeclaredGone(const BackupLink& link) const {
    std::lock_guard lock(gone_mu_);
    return gone_.contains(link.id());
  }
  void MarkGone(int id) {
    std::lock_guard lock(gone_mu_);
    gone_[id] = ++gone_marks_;
  }
  // How many verdicts were given so far: what a connection begun now compares with.
  uint64_t GoneMarks() const {
    std::lock_guard lock(gone_mu_);
    return gone_marks_;
  }
  // A server named as a backup (again), connected: a verdict about it from before the
  // connection began (`marks`, GoneMarks then) is stale and taken out. False, and the verdict
  // kept, if one came while connecting: the link is not to be used.
  bool Unmark(int id, uint64_t marks = std::numeric_limits<uint64_t>::max()) {
    std::lock_guard lock(gone_mu_);
    auto it = gone_.find(id);
    if (it == gone_.end()) return true;
    if (it->second > marks) return false;
    gone_.erase(it);
    return true;
  }
  // Takes every link's acknowledgements and failures, and releases the held replies they
  // settle. A failure while copying abandons the copy instead.
  void Pump();
  void PumpOwnLink();
  // The slot links' part of Pump: gives up those declared gone, and a copying one that failed.
  void PumpSlotLinks();
  // Releases the held replies at the front whose promises are all kept (see Held).
  void ReleaseSettled();
  // Forwards [from, through] of link `serial` (kOwnLink: backup_) failed for `why`: the held
  // replies that wait for one of them and the waiters that changed the region in their rounds
  // are answered with an error.
  void FailForwards(uint64_t serial, const BackupLink::Failure& failure);
  // backup_ is dropped: what replies and waiters waited for on it stands with the copies left.
  void ForgetOwnPromises();
  // Re-replication: the next slice of the copy to a new backup (see the header).
  void CopySlice();
  // The next slice of `copy` of [base, base + size) to `link` (pieces of kCopyPiece while the
  // tick's kCopyBudget lasts), the lease book `book` with the first: Ok, or why it failed. Logs
  // when the copy is complete (copy.next == size).
  Status CopyStep(BackupLink& link, Copy& copy, const std::byte* base, uint64_t size,
                  const std::map<uint64_t, ChunkAllocator::Held>& book, const std::string& what);
  // A backup for region `request.region`, which this server serves from a promoted slot;
  // `named`: the map's backups of the region (the request's tail).
  Result<wire::BackupReply> ConfigureSlotBackup(const wire::BackupRequest& request,
                                                std::span<const wire::MapBackup> named);
  // Tick for the slot links: a slice of each copy (blocking, as the own part's), a renewal
  // posted where due.
  void TickSlotLinks();
  // Connects to `request`'s backup for its region (`size` bytes; `share`: its pages, shared
  // pages) on a thread of its own, into connecting_ as `role`. Ok, or why it could not begin.
  Status StartConnect(const wire::BackupRequest& request, uint64_t size,
                      std::optional<SharedFile> share, PendingLink::Role role);
  // Installs the links whose connection is done: a slot link in slot_links_, the own part's as
  // InstallOwnLink says; drops one that failed, saying why.
  void InstallLinks();
  // The own part's link to a backup named after leases exist (re-replication, a drain's copy),
  // connected: becomes backup_ (kFirst) or a further backup's slot link (kFurther), its copy
  // begun, if what held when its connection began holds still; else given up.
  void InstallOwnLink(const PendingLink& pending, Result<std::unique_ptr<BackupLink>> link,
                      std::chrono::milliseconds took);
  // Settle for the slot links: posts this round's changes in each link's part of `changed`
  // (offsets in region_) and its lease changes, without waiting (pipelined, see the header).
  void PostSlotLinks(const std::vector<memory_ops::Range>& changed);
  // The slot link numbered `serial`, or null once it is given up.
  const BackupLink* SlotLinkOf(uint64_t serial) const;
  // Gives the copy up (the new backup failed): one copy, as before it began.
  void AbandonCopy(const Status& why);
  // Closes `link` to a backup whose copy this server gives up (degraded, or a copy abandoned),
  // telling the backup first, so that its slot gives the memory back (BackupLink::Detach). Not
  // for a drain's hand-over: there the backups keep the copies and promote them.
  void GiveUp(std::unique_ptr<BackupLink> link);
  // A BackupRequest (see wire.h): refused if of an older term than one seen before; gives up
  // the region's copies the map does not name (DropOtherCopies), then names the request's or
  // reports on the copy there.
  Result<wire::BackupReply> ConfigureBackup(const wire::BackupRequest& request,
                                            std::span<const wire::MapBackup> named);
  // A further backup of the own part (replicas f >= 2): a link in slot_links_ under this
  // server's id. Named by `cluster up` before anything is leased, it is connected here and the
  // root area is forwarded at once; named by re-replication (`copy`), it is connected off the
  // loop (StartConnect, InstallOwnLink) and the region copied to it in slices first, as to a
  // first backup. REQUIRES: backup_ != nullptr, not degraded, `request`'s server not a backup.
  Result<wire::BackupReply> AddBackup(const wire::BackupRequest& request, bool copy);
  // Gives up the copies of `request.region` on servers that neither `named` (the map's
  // backups of the region, as the request's sender read the map) nor the request names: copies
  // under way to a target the coordinator switched away from, and whole ones no map names (a
  // reply the coordinator lost, a map write that failed). A whole one not in the map promises
  // nothing the map does: its held replies go, as after a degrade. A copy the map names is never
  // given up here, and a copy on `request`'s server, in any slot, is the one the reply is about.
  // Also gives up the copy on `request`'s server if that backup refused a forward as another
  // primary's slot (BackupLink::misplaced): it is copied anew into the request's slot.
  void DropOtherCopies(const wire::BackupRequest& request, std::span<const wire::MapBackup> named);
  // The own part's first link given up (the map does not name it, or its slot is another's):
  // one copy, as the map says, until a backup is named again.
  void DropFirstLink();
  // The BackupReply about a copy on `link`, `remaining` bytes left.
  static wire::BackupReply Report(const BackupLink& link, uint64_t remaining) {
    return wire::BackupReply{remaining, link.slot(), {}};
  }
  // The reply, or empty if the batch waits (answered later through TakeLate).
  Result<std::vector<std::byte>> ExecuteBatch(uint64_t id, const wire::BatchRequest& request,
                                              std::span<const std::byte> ops,
                                              const transport::Peer* from);
  // The region as batches of pool `pool` see it: the server's own part and, once promoted, the
  // mirror slots', of which only the pool's chunks (or, for the default pool, the root area)
  // are accessible. `own_part`: whether batches may touch the server's own part (MayChange: a
  // replicated server without a backup yet serves only the slots it has taken over). A range
  // refused because another pool owns it sets denied_.
  memory_ops::Region BatchRegion(uint32_t pool, bool own_part);
  // The refusal of a request of `pool` (named `pool_name`; 0: the default pool), counted:
  // `what` it asked for, and the offset it touched in another pool's memory if denied_ (which
  // it clears).
  Status PoolRefused(uint32_t pool, const std::string& pool_name, const std::string& what);
  Status PoolRefused(const transport::Peer* from, const std::string& what) {
    return from == nullptr ? PoolRefused(0, "", what)
                           : PoolRefused(from->pool, from->pool_name, what);
  }

  // A batch stopped at a wait-compare-and-swap whose word was held.
  struct Waiter {
    memory_ops::Execution execution;
    uint64_t request_id = 0;
    uint32_t op_count = 0;
    uint64_t connection = 0;  // Peer::id
    uint64_t tag = 0;         // the connection's process tag
    uint32_t pool = 0;        // the connection's pool (Peer::pool)
    std::string pool_name;
    uint64_t word = 0;  // the offset waited for
    Clock::time_point deadline;
    bool stopped_dirty = false;            // changed the region in the round it stopped in
    uint64_t dirty_ticket = 0;             // the own link's forward of such a round (0: none)
    std::vector<SlotPromise> dirty_slots;  // the slot links' (the latest per link)
  };
  // Parks a stopped batch at the back of its word's queue.
  void Park(Waiter w);
  // Attempts waiter `number` again (its word changed, or its bound passed: `expire`): answers
  // it if it finishes (or its leases or the server refuse it), else keeps it waiting (at its
  // place if it stopped on the same word). Appends the offsets it changed to `woken`.
  void Attempt(uint64_t number, bool expire, std::vector<memory_ops::Range>* woken);
  // Attempts the waiters of every word in `changed` (a worklist: attempts change words too).
  void WakeChanged(std::vector<memory_ops::Range> changed);
  // Answers a waiter later (through TakeLate) and forgets it.
  void Answer(uint64_t number, std::vector<std::byte> reply, bool promises);
  void Forget(uint64_t number);
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
  // The file of server `primary_id`'s region, which this server serves from a promoted slot
  // whose pages it adopted, for a client on this host that `from` says this server pinned
  // (wire::MovedFileRequest); refused with the reason otherwise.
  Result<wire::MovedFileReply> MovedFile(uint16_t primary_id, const transport::Peer* from);
  // Remembers `tag` as refused (bounded: the oldest is forgotten first).
  void RefuseTag(uint64_t tag);
  bool IsEvicted(uint64_t tag) const { return evicted_.count(tag) != 0; }
  // Evicted, not Unavailable: the client must not take it for this server's outage (and
  // report it, fail it over) but for its own fence, final on every server (pool.cc, "Eviction").
  Status Evicted(uint64_t tag) const {
    return Status::Evicted("evicted by " + Name() + ": process tag " + TagName(tag) +
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
  std::unique_ptr<ServerAuth> auth_;
  std::unique_ptr<Mirror> mirror_;      // this server's mirror slots (ServerOptions::mirror_slots)
  std::optional<SharedFile> own_file_;  // shared pages: the region's file, for its backups
  // Replication, as a primary: the link to the backup (none before a BackupRequest, or after
  // a DegradeRequest: `degraded_`), why this server refuses everything (its backup fenced it),
  // and this round's changes and which of its replies wait for them (request ids by position;
  // 0: the reply promises nothing).
  std::unique_ptr<BackupLink> backup_;
  bool degraded_ = false;
  // The highest BackupRequest::term this server has been sent: a request of a lower one comes
  // from a deposed coordinator, which read an older map (ConfigureBackup refuses it).
  int64_t highest_term_ = 0;
  std::optional<Copy> copy_;
  // Regions this server serves from promoted mirror slots that have a backup again (or are
  // being copied to one), by region id: the same as backup_/copy_/last_ack_ for the own part,
  // with the slot's place in the region and the round's lease changes in its book. Under this
  // server's own id, base 0: the own part's further backups (replicas f >= 2, docs/pool.md
  // "Replication with f backups"), forwarded to like the slots' (waited for in Settle), their
  // lease changes lease_changes_.
  struct SlotLink {
    std::unique_ptr<BackupLink> link;
    uint64_t serial = 0;  // names it in held replies' promises, never reused (next_serial_)
    uint64_t base = 0;    // where the slot starts in region_
    std::optional<Copy> copy;
    Clock::time_point last_ack{};
    std::vector<LeaseChange> leases;
  };
  std::multimap<uint16_t, SlotLink> slot_links_;
  uint64_t next_serial_ = kOwnLink + 1;
  // Links being connected off the progress thread (StartConnect), by region: installed by
  // TickSlotLinks (InstallLinks) once connected. At most one per region at a time.
  std::map<uint16_t, PendingLink> connecting_;
  // The backup ids of DegradeRequests, set on the mirror's loop: the links to them are given
  // up. A server named as a backup again is taken out (Unmark).
  mutable std::mutex gone_mu_;
  std::map<int, uint64_t> gone_;  // by server id: the verdict's number (gone_marks_ then)
  uint64_t gone_marks_ = 0;
  // When the latest forward or renewal the backup acknowledged was sent (the primary's
  // serving lease).
  Clock::time_point last_ack_{};
  std::optional<Status> fenced_;
  // Drain (MemoryServer::Drain): set by the owning thread, from then on batches, leases and
  // releases get a MovingReply, unexecuted; handed_over_ is set by the progress thread once the
  // links to the backups are closed with nothing unacknowledged.
  std::atomic<bool> moving_{false};
  std::atomic<bool> handed_over_{false};
  // Whether a backup holds the whole region (set by the progress thread), for Drain's check
  // on a server started without replicas: without one, a drain would lose the region.
  std::atomic<bool> whole_backup_{false};
  std::vector<memory_ops::Range> changed_;
  std::vector<LeaseChange> lease_changes_;
  std::vector<uint64_t> round_;
  // By position, as round_: whether the reply may show memory or leases (a batch's, a lease's,
  // a release's), and so must wait for the forwards before it.
  std::vector<bool> observes_;
  // Replies held back until every link has acknowledged what was posted to it by the end of
  // their round (header: "Pipelined forwards"): backup_ forward `ticket` (0: nothing) and every
  // one before it, each slot link of `slots` its ticket. In the order of their rounds, so each
  // link's tickets never decrease along held_ and the front is the first to go; a link given up
  // keeps no promise. Released ones wait in released_ for TakeSettled.
  struct Held {
    uint64_t ticket;
    std::vector<SlotPromise> slots;  // empty (no allocation) unless slot links are behind
    transport::LateReply reply;
  };
  std::deque<Held> held_;
  std::vector<transport::LateReply> released_;
  std::unique_ptr<transport::AmServer> am_;
  transport::MemoryRegion* region_ = nullptr;  // owned by am_
  // Waiting compare-and-swaps: waiters by number, each word's queue (arrival order) and the
  // word's value when its waiters were last attempted, waiters per connection, the replies
  // ready for TakeLate with their round entries (round_), and whether a batch that stopped in
  // this round changed the region (its changes go to the backup with the round).
  std::unordered_map<uint64_t, Waiter> waiters_;
  struct Queue {
    std::deque<uint64_t> numbers;
    uint64_t seen = 0;
  };
  std::map<uint64_t, Queue> queues_;
  std::unordered_map<uint64_t, uint32_t> waiters_of_;  // by Peer::id
  uint64_t next_waiter_ = 1;
  std::vector<transport::LateReply> late_;
  std::vector<uint64_t> late_round_;
  bool stopped_dirty_ = false;
  Clock::time_point next_recheck_{};
  Clock::time_point started_ = Clock::now();
  uint64_t requests_served_ = 0;
  uint64_t rejected_ = 0;
  // Pools: requests refused for touching another pool's memory (StatsReply::pool_refused), the
  // offset the last refused access began at (set by BatchRegion's check, read right after),
  // and the pool of every process tag that said hello (for evictions by pool clients; kept
  // after its connections close, since a dead process is what gets evicted, until it is
  // evicted or says goodbye: 12 bytes per client process that died without either).
  uint64_t pool_refused_ = 0;
  std::optional<uint64_t> denied_;
  std::unordered_map<uint64_t, uint32_t> tag_pool_;
  std::optional<BootIdBytes> boot_id_;             // unknown: no client may map
  std::unordered_map<uint64_t, ProcessPin> pins_;  // by process tag
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
  // The mirror slots are not part of it: address space reserved after it, each slot committed
  // only when it is to hold a copy (Mirror::Commit, which checks again then).
  const uint32_t slots = std::max(options_.mirror_slots, options_.mirror_of ? 1u : 0u);
  FARPOOL_RETURN_IF_ERROR(
      CheckFitsInAvailableMemory(chunks_.region_size(), "--memory " + FormatSize(options_.memory)));
  transport::AmServerOptions ao;
  ao.host = options_.host;
  ao.port = options_.port;
  ao.am_id = transport::kControlAm;
  ao.progress = options_.progress;
  // Event progress sleeps as soon as the loop finds no work (AmServerOptions::event_spin 0):
  // event progress is chosen where cores are scarce, and there a 50 µs spin after each reply
  // took the core the client needed to use it (docs/pool.md, "Measured: the cost of a round
  // trip over TCP"), as partition servers had measured before (docs/database.md).
  ao.fabric = options_.fabric;
  ao.region_size = chunks_.region_size();
  ao.region_reserve_after = chunks_.region_size() * slots;
  ao.thread_name = "fp-serve";
  std::optional<transport::ClusterSecret> secret;
  if (!options_.secret_file.empty()) {  // before listening: a bad file fails the start at once
    FARPOOL_ASSIGN_OR_RETURN(secret, transport::ClusterSecret::Read(options_.secret_file));
  }
  auth_ = std::make_unique<ServerAuth>(std::move(secret));
  FARPOOL_ASSIGN_OR_RETURN(am_, transport::AmServer::Listen(ao));
  port_ = am_->port();
  region_ = am_->region();
  auth_->set_name(Name());
  if (slots > 0) {
    if (options_.mirror_of == options_.id) {
      return Status::InvalidArgument("a server cannot mirror itself (--mirror-of " +
                                     std::to_string(options_.id) + ")");
    }
    mirror_ = std::make_unique<Mirror>(
        options_.mirror_of, slots, region_->tail(), chunks_.region_size(), chunks_.chunk_size(),
        *auth_,
        [this](uint16_t backup) {
          MarkGone(backup);
          am_->Wake();  // held replies wait for this
        },
        options_.on_primary_closed, options_.on_coordinator_closed);
  }
  if (options_.shared_pages) {
    // The region must be one shared file that a backup on this host can open, and so must
    // the mirror slots that adopt other servers' files (shared_pages.h).
    auto own = DescribeSharedFile(region_->data(), region_->size());
    if (!own.ok()) {
      return own.status().WithContext(Name() +
                                      ": --shared-pages needs the region in a shared "
                                      "memory file (--transport shm or auto)");
    }
    own_file_ = *own;
  }
  if (mirror_) FARPOOL_RETURN_IF_ERROR(mirror_->Start(options_.host, options_.fabric, Name()));
  // The ring predecessor's forwarded copy will fill slot 0: its memory now, as the region's own.
  if (mirror_ && options_.mirror_of && !options_.shared_pages) {
    FARPOOL_RETURN_IF_ERROR(mirror_->Reserve(0));
  }
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
    if (PidfdExited(it->second.pidfd)) {
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
  // A pool's client evicts only processes of its own pool (the default pool's, the cluster's
  // tools, any).
  if (from != nullptr && from->pool != 0) {
    auto of = tag_pool_.find(tag);
    if (of == tag_pool_.end() || of->second != from->pool) {
      return PoolRefused(
          from, "EvictRequest for " + TagName(tag) + " refused: not a process of this pool here");
    }
  }
  const bool first = !IsEvicted(tag);
  RefuseTag(tag);
  wire::EvictReply reply{};
  reply.connections_closed = static_cast<uint32_t>(am_->CloseConnections(tag, from));
  if (first) {
    // Rare and final for the process evicted: worth a line for whoever finds it cut off.
    std::fprintf(
        stderr, "%s: evicted process tag %s at the request of %s (%u connections closed)\n",
        Name().c_str(), TagName(tag).c_str(),
        from == nullptr ? "this server" : TagName(from->tag).c_str(), reply.connections_closed);
  }
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
  if (PidfdExited(pin.pidfd)) {
    reply.flags |= wire::kEvictExited;
    close(pin.pidfd);
    pins_.erase(it);
  }
  return reply;
}

void MemoryServer::Impl::RefuseTag(uint64_t tag) {
  tag_pool_.erase(tag);
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

uint32_t MemoryServer::Impl::DistinctClients() const {
  std::unordered_set<uint64_t> tags;
  for (uint64_t tag : am_->tags()) {
    if (tag != 0 && !IsEvicted(tag)) tags.insert(tag);  // an evicted process is no client
  }
  return static_cast<uint32_t>(tags.size());
}

std::vector<std::byte> MemoryServer::Impl::Refuse(const Status& reason) {
  ++rejected_;
  return wire::EncodeError(0, reason.WithContext(Name()));
}

std::vector<std::byte> MemoryServer::Impl::Handle(std::span<const std::byte> bytes,
                                                  transport::Peer* from) {
  round_.push_back(0);  // set to the request id by a request that must reach the backup
  auto message = wire::Decode(bytes);
  observes_.push_back(message.ok() && (message->opcode == wire::Opcode::kBatchRequest ||
                                       message->opcode == wire::Opcode::kLeaseRequest ||
                                       message->opcode == wire::Opcode::kReleaseRequest));
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
  FARPOOL_RETURN_IF_ERROR(auth_->Admit(m.opcode, from));
  if (from != nullptr && from->tag != 0 && IsEvicted(from->tag)) return Evicted(from->tag);
  // A primary its backup has fenced serves nothing: its data lives on at the backup.
  if (fenced_ && m.opcode != wire::Opcode::kChallengeRequest &&
      m.opcode != wire::Opcode::kHelloRequest && m.opcode != wire::Opcode::kStatsRequest) {
    return *fenced_;
  }
  // Being drained: whatever could change or show the regions is refused before any of it runs,
  // so the client may send it again to the region's new server (wire::MovingReply).
  if (moving_.load(std::memory_order_relaxed) &&
      (m.opcode == wire::Opcode::kBatchRequest || m.opcode == wire::Opcode::kLeaseRequest ||
       m.opcode == wire::Opcode::kReleaseRequest)) {
    return wire::Encode(id, wire::MovingReply{options_.id, {}});
  }
  switch (m.opcode) {
    case wire::Opcode::kChallengeRequest: {
      FARPOOL_ASSIGN_OR_RETURN(wire::ChallengeReply r,
                               auth_->Challenge(m.As<wire::ChallengeRequest>(), from));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kHelloRequest: {
      auto hello = m.As<wire::HelloRequest>();
      wire::HelloReply r{};
      FARPOOL_RETURN_IF_ERROR(auth_->Hello(hello, from, r));
      const uint32_t tag = static_cast<uint32_t>(hello.client_nonce);
      if (tag == 0) {
        return Status::InvalidArgument(Name() +
                                       ": hello without a process tag (the low 32 "
                                       "bits of the client nonce are 0)");
      }
      if (from != nullptr) from->tag = tag;  // an evicted tag: everything on it is refused
      if (IsEvicted(tag)) return Evicted(tag);
      const uint32_t pool = from != nullptr ? from->pool : 0;
      tag_pool_[tag] = pool;
      r.server_id = options_.id;
      r.region_size = chunks_.region_size();
      r.chunk_size = chunks_.chunk_size();
      r.server_pid = static_cast<uint64_t>(getpid());
      if (options_.shared_pages) r.flags |= wire::kHelloSharedPages;
      r.mirror_of = mirror_ ? mirror_->first_primary() : wire::kNoMirror;
      r.mirror_port = mirror_ ? mirror_->port() : 0;
      r.mirror_offset = mirror_ ? chunks_.region_size() : 0;
      if (pool != 0) {
        // A pool's client: no key, no mapping (either reaches every pool's bytes), and its
        // root area, leased at the pool's first hello here (and forwarded like any lease).
        r.flags |= wire::kHelloPoolClient;
        FARPOOL_RETURN_IF_ERROR(MayChange());
        bool created = false;
        auto root = chunks_.LeaseRoot(pool, &created);
        if (!root.ok()) {
          return root.status().WithContext(Name() + ": pool '" + from->pool_name +
                                           "': no root area");
        }
        if (created) {
          lease_changes_.push_back({*root, chunks_.chunk_size(), wire::kMirrorLeaseRoot, pool});
          round_.back() = id;
        }
        observes_.back() = true;  // it shows a lease: after the backup has it
        r.root_offset = *root;
        // Slot 0's (the hello's mirror_of): a client that finds its server gone at connect and
        // has no hello of it learns the pool's root there from its ring backup.
        if (mirror_) {
          r.mirror_root_offset = mirror_->RootOf(mirror_->first_primary(), pool).value_or(0);
        }
        return wire::Encode(id, r);
      }
      r.flags |= Pin(hello, tag);
      r.rkey_size = static_cast<uint32_t>(region_->packed_rkey().size());
      r.region_base = reinterpret_cast<uint64_t>(region_->data());
      return wire::Encode(id, r, region_->packed_rkey());
    }
    case wire::Opcode::kLeaseRequest: {
      auto req = m.As<wire::LeaseRequest>();
      const uint32_t pool = from != nullptr ? from->pool : 0;
      if (req.mirror != 0) {
        if (!mirror_) return Status::InvalidArgument(Name() + ": it mirrors no server");
        if (req.mirror > 0xffff) return Status::InvalidArgument(Name() + ": no such server");
        const auto region = static_cast<uint16_t>(req.mirror - 1);
        auto offset = mirror_->Lease(region, req.size, pool);
        if (!offset.ok()) return offset.status().WithContext(Name() + ": lease refused");
        if (auto l = slot_links_.find(region); l != slot_links_.end()) {
          l->second.leases.push_back({*offset, req.size, wire::kMirrorLease, pool});
          round_.back() = id;
        }
        return wire::Encode(id, wire::LeaseReply{*offset, req.size});
      }
      FARPOOL_RETURN_IF_ERROR(MayChange());  // the own part (a promoted slot has one copy)
      auto offset = chunks_.Lease(req.size, pool);
      if (!offset.ok()) return offset.status().WithContext(Name() + ": lease refused");
      lease_changes_.push_back({*offset, req.size, wire::kMirrorLease, pool});
      round_.back() = id;
      return wire::Encode(id, wire::LeaseReply{*offset, req.size});
    }
    case wire::Opcode::kReleaseRequest: {
      auto req = m.As<wire::ReleaseRequest>();
      const uint32_t pool = from != nullptr ? from->pool : 0;
      if (req.mirror != 0) {
        if (!mirror_) return Status::InvalidArgument(Name() + ": it mirrors no server");
        if (req.mirror > 0xffff) return Status::InvalidArgument(Name() + ": no such server");
        const auto region = static_cast<uint16_t>(req.mirror - 1);
        Status released = mirror_->Release(region, req.offset, req.size, pool);
        if (released.code() == StatusCode::kPermissionDenied) {
          denied_ = req.offset;
          return PoolRefused(from, "release refused: " + released.message());
        }
        FARPOOL_RETURN_IF_ERROR(released.WithContext(Name()));
        if (auto l = slot_links_.find(region); l != slot_links_.end()) {
          l->second.leases.push_back({req.offset, req.size, wire::kMirrorRelease, pool});
          round_.back() = id;
        }
        return wire::Encode(id, wire::ReleaseReply{req.size});
      }
      FARPOOL_RETURN_IF_ERROR(MayChange());
      Status released = chunks_.Release(req.offset, req.size, pool);
      if (released.code() == StatusCode::kPermissionDenied) {
        denied_ = req.offset;
        return PoolRefused(from, "release refused: " + released.message());
      }
      FARPOOL_RETURN_IF_ERROR(released.WithContext(Name()));
      lease_changes_.push_back({req.offset, req.size, wire::kMirrorRelease, pool});
      round_.back() = id;
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
      r.auth_refused = auth_->refused();
      r.pool_refused = pool_refused_;
      return wire::Encode(id, r);
    }
    case wire::Opcode::kBatchRequest:
      return ExecuteBatch(id, m.As<wire::BatchRequest>(), m.tail, from);
    case wire::Opcode::kEvictRequest: {
      FARPOOL_ASSIGN_OR_RETURN(wire::EvictReply r, Evict(m.As<wire::EvictRequest>().tag, from));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kGoodbyeRequest: {
      FARPOOL_ASSIGN_OR_RETURN(wire::GoodbyeReply r,
                               Goodbye(m.As<wire::GoodbyeRequest>().tag, from));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kMovedFileRequest: {
      FARPOOL_ASSIGN_OR_RETURN(wire::MovedFileReply r,
                               MovedFile(m.As<wire::MovedFileRequest>().primary_id, from));
      return wire::Encode(id, r);
    }
    case wire::Opcode::kBackupRequest: {
      if (from != nullptr && from->pool != 0) {
        return PoolRefused(from, "BackupRequest refused: the cluster's tools name backups");
      }
      FARPOOL_ASSIGN_OR_RETURN(std::vector<wire::MapBackup> named, wire::MapBackupsOf(m));
      FARPOOL_ASSIGN_OR_RETURN(wire::BackupReply r,
                               ConfigureBackup(m.As<wire::BackupRequest>(), named));
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
    case wire::Opcode::kBackupReply:
    case wire::Opcode::kReplicateReply:
    case wire::Opcode::kMirrorLeaseReply:
    case wire::Opcode::kPromoteReply:
    case wire::Opcode::kDegradeReply:
    case wire::Opcode::kMovingReply:
    case wire::Opcode::kMovedFileReply:
      break;
    case wire::Opcode::kReplicateRequest:
    case wire::Opcode::kMirrorLeaseRequest:
    case wire::Opcode::kDegradeRequest:
    case wire::Opcode::kPromoteRequest:
      ++rejected_;
      return Status::InvalidArgument(Name() + ": " + std::string(wire::OpcodeName(m.opcode)) +
                                     " belongs on a mirror's port (HelloReply::mirror_port)");
  }
  ++rejected_;
  return Status::Protocol(Name() + ": " + std::string(wire::OpcodeName(m.opcode)) +
                          " is a reply, not a request");
}

Result<wire::MovedFileReply> MemoryServer::Impl::MovedFile(uint16_t primary_id,
                                                           const transport::Peer* from) {
  const std::string what =
      Name() + ": the file of server " + std::to_string(primary_id) + "'s region";
  if (from == nullptr || from->pool != 0) {
    return Status::PermissionDenied(what + ": only the default pool's clients map regions");
  }
  SweepPins();
  if (pins_.find(from->tag) == pins_.end()) {
    return Status::PermissionDenied(what +
                                    ": this process is not pinned here (its hello did not ask "
                                    "to map, or was refused), so it may not map");
  }
  if (!mirror_ || !mirror_->PromotedSlot(primary_id)) {
    return Status::NotFound(what + ": not served here (not failed over to this server)");
  }
  auto file = mirror_->SharedFileOf(primary_id);
  if (!file) {
    return Status::NotFound(what + ": its slot keeps a copy, not the region's pages");
  }
  return wire::MovedFileReply{file->pid, file->start_time,     file->inode, file->fd,
                              0,         chunks_.region_size()};
}

void MemoryServer::Impl::GiveUp(std::unique_ptr<BackupLink> link) {
  if (Status told = link->Detach(); !told.ok()) {
    // Its slot keeps the stale copy's memory until another primary attaches it.
    std::fprintf(stderr, "%s: %s\n", Name().c_str(), told.message().c_str());
  }
}

void MemoryServer::Impl::Degrade() {
  std::fprintf(stderr,
               "%s: %s is gone (a client says so): its own region is forwarded to its other "
               "backups only, if any\n",
               Name().c_str(), backup_->name().c_str());
  GiveUp(std::move(backup_));
  copy_.reset();
  degraded_ = true;
  whole_backup_.store(false);
  ForgetOwnPromises();
}

void MemoryServer::Impl::ForgetOwnPromises() {
  for (Held& h : held_) h.ticket = 0;
  for (auto& [number, w] : waiters_) w.dirty_ticket = 0;
  ReleaseSettled();
}

void MemoryServer::Impl::AbandonCopy(const Status& why) {
  std::fprintf(stderr, "%s: copying its region to %s failed, one copy as before: %s\n",
               Name().c_str(), backup_->name().c_str(), why.message().c_str());
  GiveUp(std::move(backup_));
  copy_.reset();
  whole_backup_.store(false);
  ForgetOwnPromises();  // none while copying; the rounds stand with one copy, as the map says
}

Status MemoryServer::Impl::CopyStep(BackupLink& link, Copy& copy, const std::byte* base,
                                    uint64_t size,
                                    const std::map<uint64_t, ChunkAllocator::Held>& book,
                                    const std::string& what) {
  std::vector<LeaseChange> leases;
  if (!copy.book_sent) {
    for (const auto& [offset, held] : book) {
      leases.push_back({offset, held.length,
                        held.root ? wire::kMirrorLeaseRoot : wire::kMirrorLease, held.owner});
    }
  }
  if (options_.shared_pages) {
    // Shared pages: the backup maps the bytes themselves; only the lease book is copied.
    FARPOOL_RETURN_IF_ERROR(
        link.Forward(base, {}, leases, [this, &link] { return DeclaredGone(link); }));
    copy.book_sent = true;
    copy.next = size;
  }
  // Pieces until the slice or the tick's budget is spent (kCopyBudget: the loop serves between).
  const auto until = Clock::now() + kCopyBudget;
  for (uint64_t sent = 0; copy.next < size && sent < kCopySlice && Clock::now() < until;) {
    const memory_ops::Range piece{copy.next, std::min(kCopyPiece, size - copy.next)};
    FARPOOL_RETURN_IF_ERROR(
        link.Forward(base, {&piece, 1}, leases, [this, &link] { return DeclaredGone(link); }));
    leases.clear();
    copy.book_sent = true;
    copy.next += piece.size;
    sent += piece.size;
  }
  if (copy.next < size) return Status::Ok();
  // With the wall clock (ms since the epoch), to line the copy up with a client's timeline.
  std::fprintf(stderr, "%s: %s (%s) is copied to %s in %lld ms (done at %lld): a copy more\n",
               Name().c_str(), what.c_str(), FormatSize(size).c_str(), link.name().c_str(),
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          Clock::now() - copy.started)
                                          .count()),
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()));
  return Status::Ok();
}

void MemoryServer::Impl::CopySlice() {
  const uint64_t size = chunks_.region_size();
  Status sent = CopyStep(*backup_, *copy_, region_->data(), size, chunks_.leases(), "its region");
  if (!sent.ok()) return AbandonCopy(sent);
  last_ack_ = std::max(last_ack_, backup_->acknowledged_sent());
  if (copy_->next < size) return;
  copy_.reset();
  degraded_ = false;
  whole_backup_.store(true);
}

Result<wire::BackupReply> MemoryServer::Impl::ConfigureSlotBackup(
    const wire::BackupRequest& request, std::span<const wire::MapBackup> named) {
  const auto slot = mirror_ ? mirror_->PromotedSlot(request.region) : std::nullopt;
  if (!slot) {
    return Status::InvalidArgument(Name() + ": it does not serve server " +
                                   std::to_string(request.region) + "'s region");
  }
  const uint64_t size = mirror_->size();
  DropOtherCopies(request, named);
  // A region served from a slot may have several backups (replicas f >= 2), one link each.
  // Progress of the copy on that server, in the request's slot or in the one it is in already.
  for (auto [it, end] = slot_links_.equal_range(request.region); it != end; ++it) {
    SlotLink& l = it->second;
    if (l.link->id() == request.backup_id) {
      return Report(*l.link, l.copy ? size - l.copy->next : 0);
    }
  }
  if (auto p = connecting_.find(request.region); p != connecting_.end()) {
    if (p->second.backup_id == request.backup_id) {
      return wire::BackupReply{size, p->second.slot, {}};  // connecting: nothing copied yet
    }
    return Status::Aborted(Name() + ": still connecting to server " +
                           std::to_string(p->second.backup_id) + " for server " +
                           std::to_string(request.region) + "'s region; ask again");
  }
  const std::optional<SharedFile> share =
      options_.shared_pages ? mirror_->SharedFileOf(request.region) : std::nullopt;
  if (options_.shared_pages && !share) {
    return Status::InvalidArgument(Name() + ": server " + std::to_string(request.region) +
                                   "'s region is a copy here, not its shared pages");
  }
  FARPOOL_RETURN_IF_ERROR(StartConnect(request, size, share, PendingLink::kSlot));
  return wire::BackupReply{size, request.slot, {}};
}

Status MemoryServer::Impl::StartConnect(const wire::BackupRequest& request, uint64_t size,
                                        std::optional<SharedFile> share, PendingLink::Role role) {
  // Connected on a thread of its own, not this loop: two connections (each a UCX context and
  // worker, a challenge and a hello) and the attach took more than the serving lease at load
  // above 10, and meanwhile the loop renewed nothing: its own backup's lease lapsed and clients
  // got "its backup has not answered" (docs/pool.md "Drain over shared pages"); a connection
  // whose UCX wireup met a lane that failed took ~1 s even unloaded ("Pipelined forwards to
  // further backups").
  BackupLink::Target target{request.backup_id, std::string(wire::HostOf(request)), request.port,
                            request.slot};
  const uint64_t marks = GoneMarks();
  auto connect = [target, region = request.region, size, secret = auth_->secret(),
                  fabric = options_.fabric, timeout = options_.backup_timeout,
                  share]() -> Result<std::unique_ptr<BackupLink>> {
    // Whatever the connection throws (an allocation, a thread of UCX's) is its failure, not
    // the server's end: InstallLinks says why and the coordinator asks again.
    try {
      return BackupLink::Connect(target, region, size, secret, fabric, timeout,
                                 share ? &*share : nullptr);
    } catch (const std::exception& e) {
      return Status::Internal("connecting to backup server " + std::to_string(target.id) + ": " +
                              e.what());
    }
  };
  std::future<Result<std::unique_ptr<BackupLink>>> link;
  try {
    link = std::async(std::launch::async, std::move(connect));
  } catch (const std::system_error& e) {
    // No thread to connect on (the process or the host is at its limit): refused, not ended;
    // the coordinator asks again next tick.
    return Status::Unavailable(Name() + ": cannot start a thread to connect to server " +
                               std::to_string(request.backup_id) + " for server " +
                               std::to_string(request.region) + "'s region: " + e.what() +
                               "; ask again");
  }
  connecting_[request.region] =
      PendingLink{request.backup_id, request.slot, role, marks, Clock::now(), std::move(link)};
  return Status::Ok();
}

void MemoryServer::Impl::InstallLinks() {
  for (auto p = connecting_.begin(); p != connecting_.end();) {
    if (p->second.link.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      ++p;
      continue;
    }
    const uint16_t region = p->first;
    auto link = p->second.link.get();
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - p->second.began);
    if (p->second.role != PendingLink::kSlot) {
      InstallOwnLink(p->second, std::move(link), took);
      p = connecting_.erase(p);
      continue;
    }
    const auto slot = mirror_->PromotedSlot(region);
    // A verdict about this very server from before is stale now (Unmark); one that came while
    // this link connected stands, and so does one about another (our own backup).
    if (link.ok() && slot && !Unmark((*link)->id(), p->second.marks)) {
      link = Status::Aborted("declared gone while connecting");
      // (the link's destructor closes it; its backup's slot is attached and stays so)
    }
    if (!link.ok() || !slot) {
      // The coordinator asks again (a BackupRequest finds neither a link nor a connection).
      std::fprintf(stderr, "%s: no backup for server %u's region after %lld ms: %s\n",
                   Name().c_str(), region, static_cast<long long>(took.count()),
                   link.ok() ? "it is no longer served here" : link.status().message().c_str());
    } else {
      const uint64_t size = mirror_->size();
      std::fprintf(stderr,
                   "%s: copying server %u's region (%s) to %s slot %u (connected in %lld ms)\n",
                   Name().c_str(), region, FormatSize(size).c_str(), (*link)->name().c_str(),
                   p->second.slot, static_cast<long long>(took.count()));
      slot_links_.emplace(region, SlotLink{std::move(*link),
                                           next_serial_++,
                                           chunks_.region_size() + *slot * size,
                                           Copy{},
                                           Clock::now(),
                                           {}});
    }
    p = connecting_.erase(p);
  }
}

void MemoryServer::Impl::InstallOwnLink(const PendingLink& pending,
                                        Result<std::unique_ptr<BackupLink>> link,
                                        std::chrono::milliseconds took) {
  const bool first = pending.role == PendingLink::kFirst;
  // What ConfigureBackup found when it began the connection must still hold: one copy and no
  // reply held for the own link (first), or a first backup that is whole (further); a backup
  // declared gone since (a drain's tool gave the copy up) is not copied to, and a verdict about
  // it from before is stale (Unmark).
  Status stale = Status::Ok();
  if (!link.ok()) {
    stale = link.status();
  } else if (!Unmark((*link)->id(), pending.marks)) {
    stale = Status::Aborted("declared gone while connecting");
  } else if (first && ((backup_ != nullptr && !degraded_) ||
                       std::any_of(held_.begin(), held_.end(),
                                   [](const Held& h) { return h.ticket != 0; }))) {
    stale = Status::Aborted("a first backup was named meanwhile");
  } else if (!first && (backup_ == nullptr || degraded_)) {
    stale = Status::Aborted("its first backup was lost meanwhile");
  }
  if (!stale.ok()) {
    // The coordinator asks again (a BackupRequest finds neither a link nor a connection).
    std::fprintf(stderr, "%s: no backup server %u for its region after %lld ms: %s\n",
                 Name().c_str(), pending.backup_id, static_cast<long long>(took.count()),
                 stale.message().c_str());
    if (link.ok()) GiveUp(std::move(*link));
    return;
  }
  const uint64_t size = chunks_.region_size();
  std::fprintf(stderr, "%s: copying its region (%s) to %s slot %u%s (connected in %lld ms)\n",
               Name().c_str(), FormatSize(size).c_str(), (*link)->name().c_str(), pending.slot,
               first ? "" : ", a further backup", static_cast<long long>(took.count()));
  if (!first) {
    // Counts for nothing (MayServe, held replies) until whole: the copy goes in slices
    // (TickSlotLinks), every round's changes after them on the same link.
    slot_links_.emplace(options_.id,
                        SlotLink{std::move(*link), next_serial_++, 0, Copy{}, Clock::now(), {}});
    return;
  }
  // A copy under way to another backup (which the map never named) is given up for this one.
  if (backup_ != nullptr) AbandonCopy(Status::Aborted("a new backup was named"));
  backup_ = std::move(*link);
  copy_ = Copy{};
  last_ack_ = Clock::now();
  // Without replicas the server promises one copy until the copy is whole, as a replicated
  // one after a degrade: nothing held, no serving lease (MayServe), a failure abandons it.
  if (!options_.replicated) degraded_ = true;
}

void MemoryServer::Impl::TickSlotLinks() {
  InstallLinks();
  const uint64_t size = mirror_ ? mirror_->size() : 0;
  for (auto it = slot_links_.begin(); it != slot_links_.end();) {
    SlotLink& l = it->second;
    // The own part's further backups (its changes and its lease book) beside promoted slots'.
    const bool own = it->first == options_.id;
    if (l.copy) {
      const std::string what =
          own ? "its region" : "server " + std::to_string(it->first) + "'s region";
      const uint64_t whole = own ? chunks_.region_size() : size;
      Status done = DeclaredGone(*l.link)
                        ? Status::Unavailable(l.link->name() + " is gone (a client says so)")
                        : CopyStep(*l.link, *l.copy, region_->data() + l.base, whole,
                                   own ? chunks_.leases() : mirror_->Leases(it->first), what);
      // Forward returned them; nothing is held for a copying link.
      l.link->TakeFailures();
      if (!done.ok()) {
        std::fprintf(stderr, "%s: %s is no longer forwarded to %s: %s\n", Name().c_str(),
                     what.c_str(), l.link->name().c_str(), done.message().c_str());
        GiveUp(std::move(l.link));
        it = slot_links_.erase(it);
        continue;
      }
      if (l.copy->next == whole) l.copy.reset();
      l.last_ack = std::max(l.last_ack, l.link->acknowledged_sent());
    } else if (Clock::now() - l.last_ack >= kServeLease / 4 &&
               l.link->posted() == l.link->settled()) {
      // Renew: an empty forward, acknowledged (or refused: fenced) in a later Pump; a forward
      // in flight renews the lease when acknowledged.
      l.link->Post(region_->data() + l.base, {}, {}, [this, &l] { return DeclaredGone(*l.link); });
    }
    ++it;
  }
}

void MemoryServer::Impl::PostSlotLinks(const std::vector<memory_ops::Range>& changed) {
  for (auto& [region, l] : slot_links_) {
    // The own part's further backups take its changes and its lease changes.
    const bool own = region == options_.id;
    const uint64_t size = own ? chunks_.region_size() : mirror_ ? mirror_->size() : 0;
    if (own) l.leases = lease_changes_;
    std::vector<memory_ops::Range> local;
    for (const memory_ops::Range& r : changed) {
      if (r.offset >= l.base && r.offset < l.base + size)
        local.push_back({r.offset - l.base, r.size});
    }
    if (l.copy && !l.copy->book_sent) l.leases.clear();  // the book goes whole with a slice
    if (local.empty() && l.leases.empty()) continue;
    const uint64_t ticket = l.link->Post(region_->data() + l.base, local, l.leases,
                                         [this, &l] { return DeclaredGone(*l.link); });
    l.leases.clear();
    if (l.copy || !stopped_dirty_) continue;  // a copy promises nothing until whole
    for (auto& [number, w] : waiters_) {
      if (!w.stopped_dirty) continue;
      auto p = std::find_if(w.dirty_slots.begin(), w.dirty_slots.end(),
                            [&](const SlotPromise& d) { return d.serial == l.serial; });
      if (p == w.dirty_slots.end()) {
        w.dirty_slots.push_back({l.serial, ticket});
      } else {
        p->ticket = ticket;
      }
    }
  }
}

const BackupLink* MemoryServer::Impl::SlotLinkOf(uint64_t serial) const {
  for (const auto& [region, l] : slot_links_) {
    if (l.serial == serial) return l.link.get();
  }
  return nullptr;
}

Status MemoryServer::Impl::MayServe() const {
  for (const auto& [region, l] : slot_links_) {
    const auto since = Clock::now() - l.last_ack;
    if (!l.copy && since >= kServeLease) {
      return Status::Unavailable(
          Name() + ": the backup of server " + std::to_string(region) +
          "'s region has not answered for " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(since).count()) +
          " ms: it serves nothing until it does");
    }
  }
  if (backup_ == nullptr || degraded_) return Status::Ok();  // degraded_ also while copying
  const auto since = Clock::now() - last_ack_;
  if (since < kServeLease) return Status::Ok();
  return Status::Unavailable(
      Name() + ": its backup has not answered for " +
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(since).count()) +
      " ms: it serves nothing until it does (the backup may be taking its data over)");
}

void MemoryServer::Impl::Tick() {
  if (DeclaredGone()) Degrade();  // releases the replies held for a backup declared gone
  if (moving_.load(std::memory_order_relaxed)) return HandOver();
  TickSlotLinks();
  if (copy_ && backup_ != nullptr) {
    CopySlice();  // renews too
    return Pump();
  }
  if (backup_ == nullptr || Clock::now() - last_ack_ < kServeLease / 4 ||
      backup_->posted() > backup_->settled()) {
    return;  // a forward in flight renews the lease when acknowledged
  }
  // Renew: an empty forward, acknowledged (or refused: fenced) in a later Pump.
  backup_->Post(region_->data(), {}, {}, [this] { return DeclaredGone(); });
}

void MemoryServer::Impl::HandOver() {
  if (handed_over_.load()) return;
  Pump();  // acknowledgements release held replies
  // Held replies wait for the backup, waiters may still change words: both finish first (each
  // is bounded: backup_timeout, the waiter's wait).
  if (!held_.empty() || !waiters_.empty() || !late_.empty() ||
      (backup_ != nullptr && backup_->posted() > backup_->settled()) ||
      std::any_of(slot_links_.begin(), slot_links_.end(), [](const auto& l) {
        return l.second.link->posted() > l.second.link->settled();
      })) {
    return;
  }
  // Nothing unacknowledged: the backups have every change. Closing the links lets each backup
  // promote as soon as the coordinator asks (a closed primary connection, mirror.h), and this
  // server executes nothing from here on (moving_), so no change can be lost or doubled.
  std::fprintf(stderr, "%s: drained: every change is on its backups; handing its regions over\n",
               Name().c_str());
  backup_.reset();
  copy_.reset();
  whole_backup_.store(false);
  // A slot link still connecting is waited for and closed (else its backup, seeing a primary
  // connected, would refuse to promote until that lease ran out).
  connecting_.clear();
  slot_links_.clear();
  handed_over_.store(true);
}

Status MemoryServer::Impl::Drain(std::chrono::milliseconds timeout) {
  if (!options_.replicated && !whole_backup_.load()) {
    return Status::InvalidArgument(
        Name() +
        ": not replicated and no backup holds its whole region (`cluster "
        "drain` copies it to one first): nothing can take it over");
  }
  moving_.store(true);
  am_->Wake();
  const auto deadline = Clock::now() + timeout;
  while (!handed_over_.load()) {
    if (Clock::now() > deadline) {
      return Status::TimedOut(Name() + ": draining: replies still waited for the backup after " +
                              std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status::Ok();
}

void MemoryServer::Impl::Fence(const Status& why) {
  if (fenced_) return;
  Status refusal = Status::Unavailable(Name() +
                                       ": fenced: its backup has taken its data over; retry at "
                                       "the backup (" +
                                       why.message() + ")");
  std::fprintf(stderr, "%s\n", refusal.message().c_str());
  fenced_ = refusal;
  if (options_.on_fenced) options_.on_fenced(refusal);
}

Status MemoryServer::Impl::MayChange() const {
  if (!options_.replicated || backup_ != nullptr || degraded_) return Status::Ok();
  return Status::Unavailable(Name() +
                             ": no backup yet: leases and batches are refused until the cluster "
                             "tool names one (BackupRequest), so no change is acknowledged with "
                             "one copy");
}

Result<wire::BackupReply> MemoryServer::Impl::ConfigureBackup(
    const wire::BackupRequest& request, std::span<const wire::MapBackup> named) {
  // A deposed coordinator's request was built from a map older than one a later term's request
  // carried: its backups may lack a copy the map names now (docs/pool.md "The map's backups in
  // the request").
  if (request.term < highest_term_) {
    return Status::PermissionDenied(Name() + ": a BackupRequest of term " +
                                    std::to_string(request.term) + ", after one of term " +
                                    std::to_string(highest_term_) +
                                    ": from a coordinator deposed since (or a tool), refused");
  }
  highest_term_ = request.term;
  if (request.backup_id == wire::kNoBackup) {
    if (request.region != options_.id && !(mirror_ && mirror_->PromotedSlot(request.region))) {
      return Status::InvalidArgument(Name() + ": it does not serve server " +
                                     std::to_string(request.region) + "'s region");
    }
    DropOtherCopies(request, named);
    return wire::BackupReply{0, 0, {}};
  }
  // Without replicas a backup is named only to drain this server (docs/pool.md "Drain without
  // replicas"): its own region is copied, the regions it serves from slots are not.
  if (!options_.replicated && request.region != options_.id) {
    return Status::InvalidArgument(Name() +
                                   ": started without replication (--replicas): only its own "
                                   "region gets a backup, to drain it");
  }
  if (request.backup_id == options_.id) {
    return Status::InvalidArgument(Name() + ": cannot be its own backup");
  }
  if (request.region != options_.id) return ConfigureSlotBackup(request, named);
  const uint64_t size = chunks_.region_size();
  DropOtherCopies(request, named);
  // Progress of the copy on that server (the first backup or a further one), in the request's
  // slot or in the one it is in already.
  if (backup_ != nullptr && backup_->id() == request.backup_id) {
    return Report(*backup_, copy_ ? size - copy_->next : 0);
  }
  for (auto [it, end] = slot_links_.equal_range(options_.id); it != end; ++it) {
    SlotLink& l = it->second;
    if (l.link->id() == request.backup_id) return Report(*l.link, l.copy ? size - l.copy->next : 0);
  }
  if (auto p = connecting_.find(options_.id); p != connecting_.end()) {
    if (p->second.backup_id == request.backup_id) {
      return wire::BackupReply{size, p->second.slot, {}};  // connecting: nothing copied yet
    }
    return Status::Aborted(Name() + ": still connecting to server " +
                           std::to_string(p->second.backup_id) + " for its region; ask again");
  }
  // The copy starts equal when nothing is leased yet and nothing was acknowledged with one copy:
  // the root area, all a client may have touched, is sent once. Otherwise the region is copied,
  // after a connection made off this loop (StartConnect, installed by InstallOwnLink).
  const bool fresh = chunks_.leased() == 0 && !degraded_;
  if (backup_ != nullptr && !degraded_) return AddBackup(request, /*copy=*/!fresh);
  // backup_ is replaced only when no reply is held for it: its tickets number them (see the
  // header). None are held after a DegradeRequest (which released them) or while copying.
  if (std::any_of(held_.begin(), held_.end(), [](const Held& h) { return h.ticket != 0; })) {
    return Status::Aborted(Name() + ": replies still wait for " + backup_->name() + "; ask again");
  }
  if (!fresh) {
    FARPOOL_RETURN_IF_ERROR(StartConnect(request, size, own_file_, PendingLink::kFirst));
    return wire::BackupReply{size, request.slot, {}};
  }
  // Fresh (`cluster up` names it before any client is served: MayChange): connected here.
  const std::string host(wire::HostOf(request));
  FARPOOL_ASSIGN_OR_RETURN(
      std::unique_ptr<BackupLink> link,
      BackupLink::Connect({request.backup_id, host, request.port, request.slot}, options_.id, size,
                          auth_->secret(), options_.fabric, options_.backup_timeout,
                          own_file_ ? &*own_file_ : nullptr));
  Unmark(request.backup_id);  // named and connected: a verdict from before is stale
  // Shared pages: the attach was all (the backup maps these very bytes).
  if (!own_file_) {
    FARPOOL_RETURN_IF_ERROR(
        link->Forward(region_->data(), {{memory_ops::Range{0, wire::kRootAreaSize}}}, {}, nullptr));
  }
  backup_ = std::move(link);
  last_ack_ = backup_->acknowledged_sent();
  degraded_ = false;
  whole_backup_.store(true);
  return wire::BackupReply{0, request.slot, {}};
}

Result<wire::BackupReply> MemoryServer::Impl::AddBackup(const wire::BackupRequest& request,
                                                        bool copy) {
  const uint64_t size = chunks_.region_size();
  if (copy) {
    FARPOOL_RETURN_IF_ERROR(StartConnect(request, size, own_file_, PendingLink::kFurther));
    return wire::BackupReply{size, request.slot, {}};
  }
  // Fresh (`cluster up`, before anything is leased): connected here, the root area sent.
  const std::string host(wire::HostOf(request));
  FARPOOL_ASSIGN_OR_RETURN(
      std::unique_ptr<BackupLink> link,
      BackupLink::Connect({request.backup_id, host, request.port, request.slot}, options_.id, size,
                          auth_->secret(), options_.fabric, options_.backup_timeout,
                          own_file_ ? &*own_file_ : nullptr));
  Unmark(request.backup_id);  // named and connected: a verdict from before is stale
  if (!own_file_) {
    FARPOOL_RETURN_IF_ERROR(
        link->Forward(region_->data(), {{memory_ops::Range{0, wire::kRootAreaSize}}}, {}, nullptr));
  }
  const Clock::time_point acknowledged = link->acknowledged_sent();
  std::fprintf(stderr, "%s: %s slot %u is a further backup of its region\n", Name().c_str(),
               link->name().c_str(), request.slot);
  slot_links_.emplace(options_.id,
                      SlotLink{std::move(link), next_serial_++, 0, std::nullopt, acknowledged, {}});
  return wire::BackupReply{0, request.slot, {}};
}

void MemoryServer::Impl::DropOtherCopies(const wire::BackupRequest& request,
                                         std::span<const wire::MapBackup> named) {
  const std::string asked = request.backup_id == wire::kNoBackup
                                ? "the map's backups only were named"
                                : "server " + std::to_string(request.backup_id) + " slot " +
                                      std::to_string(request.slot) + " was named";
  auto in_map = [&](int id) {
    return std::any_of(named.begin(), named.end(),
                       [&](const wire::MapBackup& b) { return b.id == id; });
  };
  // Why a link goes: nullptr if it stays.
  auto verdict = [&](const BackupLink& link, bool copying) -> const char* {
    if (in_map(link.id())) return nullptr;
    if (link.id() == request.backup_id) {
      return link.misplaced() ? "its slot refused a forward as another primary's" : nullptr;
    }
    return copying ? "an unfinished copy the map does not name" : "a copy the map does not name";
  };
  for (auto [it, end] = slot_links_.equal_range(request.region); it != end;) {
    SlotLink& l = it->second;
    const char* why = verdict(*l.link, l.copy.has_value());
    if (why == nullptr) {
      ++it;
      continue;
    }
    std::fprintf(stderr, "%s: server %u's copy to %s is given up (%s): %s\n", Name().c_str(),
                 request.region, l.link->name().c_str(), why, asked.c_str());
    GiveUp(std::move(l.link));
    it = slot_links_.erase(it);
  }
  if (request.region != options_.id || backup_ == nullptr) return;
  if (const char* why = verdict(*backup_, copy_.has_value()); why != nullptr) {
    std::fprintf(stderr, "%s: its copy to %s is given up (%s): %s\n", Name().c_str(),
                 backup_->name().c_str(), why, asked.c_str());
    DropFirstLink();
  }
}

void MemoryServer::Impl::DropFirstLink() {
  GiveUp(std::move(backup_));
  copy_.reset();
  degraded_ = true;
  whole_backup_.store(false);
  ForgetOwnPromises();
}

memory_ops::Region MemoryServer::Impl::BatchRegion(uint32_t pool, bool own_part) {
  const uint64_t own = chunks_.region_size();
  // Offsets past the server's own part address the mirror slots, for clients that have failed
  // their primaries over to this server (only once promoted: Mirror::Check).
  memory_ops::Region region{region_->data(),
                            own + (mirror_ ? mirror_->size() * mirror_->slots() : 0),
                            [this, own, pool, own_part](uint64_t offset, uint64_t size) {
                              ChunkAllocator::Access access = ChunkAllocator::Access::kOutside;
                              if (offset < own) {
                                if (own_part && size <= own - offset)
                                  access = chunks_.Check(offset, size, pool);
                              } else if (mirror_ != nullptr) {
                                access = mirror_->Check(offset - own, size, pool);
                              }
                              if (access == ChunkAllocator::Access::kOtherPool) denied_ = offset;
                              return access == ChunkAllocator::Access::kOk;
                            },
                            options_.id};
  // Always collected: waiters of a changed word are attempted again; only a replicated server
  // keeps them for its backup (KeepChanges).
  region.changed = &changed_;
  if (options_.shared_pages) {
    // In the root area of the region that holds the lock: this server's own, or the one a
    // promoted slot serves (whose next backup adopts that slot's pages).
    const uint64_t slot = mirror_ ? mirror_->size() : 0;
    region.insert_intent = [this, own, slot](uint64_t offset) {
      const uint64_t root = offset < own ? 0 : own + (offset - own) / slot * slot;
      return reinterpret_cast<uint64_t*>(region_->data() + root + wire::kInsertIntentOffset);
    };
  }
  return region;
}

Status MemoryServer::Impl::PoolRefused(uint32_t pool, const std::string& pool_name,
                                       const std::string& what) {
  ++pool_refused_;
  const std::string who = pool == 0 ? "the default pool" : "pool '" + pool_name + "'";
  if (!denied_)
    return Status::PermissionDenied(Name() + ": permission denied: " + who + ": " + what);
  const uint64_t at = *denied_;
  denied_.reset();
  return Status::PermissionDenied(Name() + ": permission denied: " + who +
                                  " may not touch offset " + std::to_string(at) +
                                  ": another pool's memory (" + what + ")");
}

Result<std::vector<std::byte>> MemoryServer::Impl::ExecuteBatch(uint64_t id,
                                                                const wire::BatchRequest& request,
                                                                std::span<const std::byte> ops,
                                                                const transport::Peer* from) {
  FARPOOL_RETURN_IF_ERROR(MayServe());
  const uint32_t pool = from != nullptr ? from->pool : 0;
  // Checked before anything is executed: the own part only with a backup (or degraded).
  const Status may_change = MayChange();
  const memory_ops::Region region = BatchRegion(pool, may_change.ok());
  const size_t before = changed_.size();
  denied_.reset();
  auto execution = memory_ops::Execution::Check(request.op_count, ops, region);
  if (!execution.ok()) {
    if (denied_) return PoolRefused(from, execution.status().message());
    ++rejected_;
    return may_change.ok() ? execution.status().WithContext(Name()) : may_change;
  }
  // Waits only with somewhere to answer and room for one more waiter.
  auto of = from == nullptr ? waiters_of_.end() : waiters_of_.find(from->id);
  const bool may_wait = from != nullptr && waiters_.size() < kMaxWaiters &&
                        (of == waiters_of_.end() || of->second < kMaxWaitersPerConnection);
  const bool done = execution->Run(
      region, may_wait ? memory_ops::Execution::Wait::kMay : memory_ops::Execution::Wait::kNever);
  // A lookup that led into another pool's chunk answered "out of bounds" without reading it.
  if (denied_) (void)PoolRefused(from, "a lookup followed a pointer");
  const bool changed = changed_.size() > before;
  if (changed) {
    WakeChanged({changed_.begin() + static_cast<ptrdiff_t>(before), changed_.end()});
  }
  KeepChanges(before);
  if (!done) {
    Waiter w{std::move(*execution),
             id,
             request.op_count,
             from->id,
             from->tag,
             from->pool,
             from->pool_name,
             0,
             {},
             changed && ForwardsBytes()};
    Park(std::move(w));
    return std::vector<std::byte>{};  // answered later
  }
  if (changed_.size() > before) round_.back() = id;
  std::vector<std::byte> results = execution->TakeReply();
  return wire::Encode(id, wire::BatchReply{request.op_count, static_cast<uint32_t>(results.size())},
                      results);
}

void MemoryServer::Impl::KeepChanges(size_t before) {
  if (!ForwardsBytes()) {
    changed_.resize(before);
    return;
  }
  // Changes to a promoted slot (a failed-over primary's data) go to that region's backup if it
  // has one again (slot_links_), else they have this one copy: not forwarded.
  const uint64_t own = chunks_.region_size();
  const uint64_t slot = mirror_ ? mirror_->size() : 0;
  auto forwarded = [&](const memory_ops::Range& r) {
    if (r.offset < own) return true;
    return std::any_of(slot_links_.begin(), slot_links_.end(), [&](const auto& l) {
      return r.offset >= l.second.base && r.offset < l.second.base + slot;
    });
  };
  changed_.erase(std::remove_if(changed_.begin() + static_cast<ptrdiff_t>(before), changed_.end(),
                                [&](const memory_ops::Range& r) { return !forwarded(r); }),
                 changed_.end());
}

void MemoryServer::Impl::Park(Waiter w) {
  w.word = w.execution.waiting_offset();
  w.deadline = Clock::now() + std::chrono::microseconds(w.execution.waiting_us());
  if (w.stopped_dirty) stopped_dirty_ = true;
  const uint64_t number = next_waiter_++;
  Queue& q = queues_[w.word];
  q.seen = __atomic_load_n(reinterpret_cast<uint64_t*>(region_->data() + w.word), __ATOMIC_SEQ_CST);
  q.numbers.push_back(number);
  ++waiters_of_[w.connection];
  if (waiters_.empty()) next_recheck_ = Clock::now() + kRecheckPeriod;
  waiters_.emplace(number, std::move(w));
}

void MemoryServer::Impl::Forget(uint64_t number) {
  auto it = waiters_.find(number);
  if (it == waiters_.end()) return;
  auto q = queues_.find(it->second.word);
  if (q != queues_.end()) {
    auto& numbers = q->second.numbers;
    numbers.erase(std::remove(numbers.begin(), numbers.end(), number), numbers.end());
    if (numbers.empty()) queues_.erase(q);
  }
  auto c = waiters_of_.find(it->second.connection);
  if (c != waiters_of_.end() && --c->second == 0) waiters_of_.erase(c);
  waiters_.erase(it);
}

void MemoryServer::Impl::Answer(uint64_t number, std::vector<std::byte> reply, bool promises) {
  const Waiter& w = waiters_.at(number);
  late_.push_back({w.connection, std::move(reply)});
  late_round_.push_back(promises ? w.request_id : 0);
  Forget(number);
}

void MemoryServer::Impl::Attempt(uint64_t number, bool expire,
                                 std::vector<memory_ops::Range>* woken) {
  Waiter& w = waiters_.at(number);
  if (IsEvicted(w.tag)) return Forget(number);  // its connections are closed or refused
  const memory_ops::Region region = BatchRegion(w.pool, MayChange().ok());
  Status may = fenced_ ? *fenced_ : MayServe();
  denied_.reset();
  if (may.ok()) may = w.execution.Recheck(region).WithContext(Name());
  // Its chunk released while it waited and leased to another pool since.
  if (denied_) may = PoolRefused(w.pool, w.pool_name, may.message());
  if (!may.ok()) return Answer(number, wire::EncodeError(w.request_id, may), false);
  const size_t before = changed_.size();
  const bool done = w.execution.Run(region, expire ? memory_ops::Execution::Wait::kExpireCurrent
                                                   : memory_ops::Execution::Wait::kMay);
  if (denied_) (void)PoolRefused(w.pool, w.pool_name, "a lookup followed a pointer");
  const bool changed = changed_.size() > before;
  if (changed)
    woken->insert(woken->end(), changed_.begin() + static_cast<ptrdiff_t>(before), changed_.end());
  KeepChanges(before);
  if (done) {
    std::vector<std::byte> results = w.execution.TakeReply();
    return Answer(
        number,
        wire::Encode(w.request_id,
                     wire::BatchReply{w.op_count, static_cast<uint32_t>(results.size())}, results),
        changed_.size() > before);
  }
  if (changed && ForwardsBytes()) {
    w.stopped_dirty = true;
    stopped_dirty_ = true;
  }
  if (w.execution.waiting_offset() == w.word && !expire) {
    queues_[w.word].seen =
        __atomic_load_n(reinterpret_cast<uint64_t*>(region_->data() + w.word), __ATOMIC_SEQ_CST);
    return;  // keeps its place
  }
  // Stopped at a later operation: at the back of that word's queue, with that one's bound.
  Waiter moved = std::move(w);
  Forget(number);
  Park(std::move(moved));
}

void MemoryServer::Impl::WakeChanged(std::vector<memory_ops::Range> changed) {
  while (!changed.empty()) {
    const memory_ops::Range r = changed.back();
    changed.pop_back();
    std::vector<uint64_t> words;
    for (auto it = queues_.lower_bound(r.offset);
         it != queues_.end() && it->first < r.offset + r.size; ++it) {
      words.push_back(it->first);
    }
    for (uint64_t word : words) {
      auto q = queues_.find(word);
      if (q == queues_.end()) continue;
      // Arrival order; a copy, since attempts change the queue.
      const std::deque<uint64_t> numbers = q->second.numbers;
      for (uint64_t number : numbers) {
        if (waiters_.count(number) != 0) Attempt(number, false, &changed);
      }
    }
  }
}

void MemoryServer::Impl::TakeLate(std::vector<transport::LateReply>* out) {
  if (!waiters_.empty()) {
    const auto now = Clock::now();
    if (now >= next_recheck_) {
      // Words changed by clients that bypass the loop (mapped, one-sided).
      std::vector<memory_ops::Range> changed;
      for (auto& [word, q] : queues_) {
        const uint64_t value =
            __atomic_load_n(reinterpret_cast<uint64_t*>(region_->data() + word), __ATOMIC_SEQ_CST);
        if (value != q.seen) changed.push_back({word, 8});
      }
      WakeChanged(std::move(changed));
      next_recheck_ = now + kRecheckPeriod;
    }
    std::vector<uint64_t> expired;
    for (const auto& [number, w] : waiters_) {
      if (w.deadline <= now) expired.push_back(number);
    }
    std::sort(expired.begin(), expired.end());  // arrival order
    for (uint64_t number : expired) {
      if (waiters_.count(number) == 0) continue;
      std::vector<memory_ops::Range> changed;
      Attempt(number, true, &changed);
      WakeChanged(std::move(changed));
    }
  }
  for (auto& late : late_) out->push_back(std::move(late));
  round_.insert(round_.end(), late_round_.begin(), late_round_.end());
  observes_.insert(observes_.end(), late_round_.size(), true);  // a batch's
  late_.clear();
  late_round_.clear();
}

std::optional<Clock::time_point> MemoryServer::Impl::WakeAt() const {
  if (waiters_.empty()) return std::nullopt;
  Clock::time_point at = next_recheck_;
  for (const auto& [number, w] : waiters_) at = std::min(at, w.deadline);
  return at;
}

void MemoryServer::Impl::Closed(const transport::Peer& peer) {
  if (waiters_of_.count(peer.id) == 0) return;
  std::vector<uint64_t> gone;
  for (const auto& [number, w] : waiters_) {
    if (w.connection == peer.id) gone.push_back(number);
  }
  for (uint64_t number : gone) Forget(number);
}

void MemoryServer::Impl::Settle(std::span<std::vector<std::byte>> replies,
                                std::span<const uint64_t> connections) {
  const bool promised = stopped_dirty_ || std::any_of(round_.begin(), round_.end(),
                                                      [](uint64_t id) { return id != 0; });
  if (DeclaredGone()) Degrade();
  // The own part's changes are posted to its backup, those in promoted slots (and the own
  // part's again, for its further backups) to the slot links: all pipelined.
  if (backup_ != nullptr && promised) {
    const uint64_t own = chunks_.region_size();
    std::vector<memory_ops::Range> mine;
    for (const memory_ops::Range& r : changed_) {
      if (r.offset < own) mine.push_back(r);
    }
    // Before a copy's first slice its lease book goes whole with that slice (CopyStep).
    const bool book_to_come = copy_ && !copy_->book_sent;
    const std::span<const LeaseChange> leases = book_to_come
                                                    ? std::span<const LeaseChange>{}
                                                    : std::span<const LeaseChange>(lease_changes_);
    // A round that changed only promoted slots posts nothing here: its replies wait for the
    // forwards posted before (below), and the slot links.
    if (!mine.empty() || !leases.empty()) {
      const uint64_t ticket =
          backup_->Post(region_->data(), mine, leases, [this] { return DeclaredGone(); });
      for (auto& [number, w] : waiters_) {
        if (w.stopped_dirty) w.dirty_ticket = ticket;
      }
    }
  }
  if (promised) PostSlotLinks(changed_);
  if (DeclaredGone()) Degrade();  // the rounds stand with one copy, as every later one
  // Every reply that may show memory waits for every forward posted so far, on every link that
  // promises a copy: it may have observed any change applied before it. Replies promise nothing
  // more than that. A link with a failure not taken yet holds them too: the failure may be of
  // a forward the link counts as settled (BackupLink::Fail), and FailForwards answers them.
  // While copying, a link promises nothing (the map's one copy fewer): nothing waits for it.
  auto behind = [](const BackupLink& link) {
    return link.settled() < link.posted() || link.failing();
  };
  const uint64_t ticket = backup_ != nullptr && !copy_ && behind(*backup_) ? backup_->posted() : 0;
  std::vector<SlotPromise> slots;
  for (const auto& [region, l] : slot_links_) {
    if (!l.copy && behind(*l.link)) slots.push_back({l.serial, l.link->posted()});
  }
  if (ticket != 0 || !slots.empty()) {
    for (size_t i = 0; i < replies.size(); ++i) {
      // A refusal (MayServe's, a drain's MovingReply) showed nothing: it goes as the definite
      // answer it is.
      const bool observes = i < observes_.size() && observes_[i];
      if (!observes || replies[i].empty() || IsRefusal(replies[i])) continue;
      held_.push_back({ticket, slots, {connections[i], std::move(replies[i])}});
      replies[i].clear();  // posted later, by TakeSettled
    }
  }
  // No Pump here: the loop calls TakeSettled right after Settle, which pumps (one progress of
  // each link's worker per round, not two).
  for (auto& [number, w] : waiters_) w.stopped_dirty = false;
  stopped_dirty_ = false;
  changed_.clear();
  lease_changes_.clear();
  round_.clear();
  observes_.clear();
}

void MemoryServer::Impl::TakeSettled(std::vector<transport::LateReply>* out) {
  if (DeclaredGone()) Degrade();
  Pump();
  for (transport::LateReply& r : released_) out->push_back(std::move(r));
  released_.clear();
}

void MemoryServer::Impl::Pump() {
  PumpOwnLink();
  PumpSlotLinks();
  ReleaseSettled();
}

void MemoryServer::Impl::PumpOwnLink() {
  if (backup_ == nullptr) return;
  backup_->Poll();
  std::vector<BackupLink::Failure> failures = backup_->TakeFailures();
  if (!failures.empty() && copy_) return AbandonCopy(failures.front().why);  // one copy promised
  for (const BackupLink::Failure& f : failures) FailForwards(kOwnLink, f);
  if (backup_->acknowledged_sent() > last_ack_) last_ack_ = backup_->acknowledged_sent();
}

void MemoryServer::Impl::PumpSlotLinks() {
  for (auto it = slot_links_.begin(); it != slot_links_.end();) {
    SlotLink& l = it->second;
    Status dropped = Status::Ok();
    if (DeclaredGone(*l.link)) {
      // The rounds it has not acknowledged stand with the copies left (ReleaseSettled).
      dropped = Status::Unavailable(l.link->name() + " is gone (a client says so)");
    } else {
      l.link->Poll();
      std::vector<BackupLink::Failure> failures = l.link->TakeFailures();
      if (!failures.empty() && l.copy) {
        dropped = failures.front().why;  // the map promises one copy fewer: the copy is given up
      } else {
        for (const BackupLink::Failure& f : failures) FailForwards(l.serial, f);
        // The serving lease counts from when the latest acknowledged forward was sent.
        l.last_ack = std::max(l.last_ack, l.link->acknowledged_sent());
      }
    }
    if (dropped.ok()) {
      ++it;
      continue;
    }
    std::fprintf(stderr, "%s: %s is no longer forwarded to %s: %s\n", Name().c_str(),
                 it->first == options_.id
                     ? "its region"
                     : ("server " + std::to_string(it->first) + "'s region").c_str(),
                 l.link->name().c_str(), dropped.message().c_str());
    GiveUp(std::move(l.link));
    it = slot_links_.erase(it);
  }
}

void MemoryServer::Impl::ReleaseSettled() {
  auto kept = [this](const Held& h) {
    // A link with failures not taken yet counts its failed tickets as settled (BackupLink::
    // failing): its promises wait for FailForwards.
    if (h.ticket != 0 && backup_ != nullptr &&
        (backup_->failing() || backup_->settled() < h.ticket)) {
      return false;
    }
    return std::all_of(h.slots.begin(), h.slots.end(), [this](const SlotPromise& p) {
      const BackupLink* link = SlotLinkOf(p.serial);
      return link == nullptr || (!link->failing() && link->settled() >= p.ticket);
    });
  };
  while (!held_.empty() && kept(held_.front())) {
    released_.push_back(std::move(held_.front().reply));
    held_.pop_front();
  }
}

void MemoryServer::Impl::FailForwards(uint64_t serial, const BackupLink::Failure& failure) {
  const bool fenced = failure.why.code() == StatusCode::kPermissionDenied;
  Status why = Status::Unavailable(Name() + ": the change was applied here but not acknowledged: " +
                                   (fenced ? "this server has been failed over; retry at the backup"
                                           : "its backup does not answer") +
                                   " (" + failure.why.message() + ")");
  if (fenced) Fence(failure.why);
  // Whether a promise on this link (its ticket there: 0 for none) is one of the failed ones.
  auto failed_on = [&](uint64_t own, const std::vector<SlotPromise>& slots) {
    uint64_t ticket = own;
    if (serial != kOwnLink) {
      auto p = std::find_if(slots.begin(), slots.end(),
                            [&](const SlotPromise& d) { return d.serial == serial; });
      ticket = p == slots.end() ? 0 : p->ticket;
    }
    return ticket >= failure.from && ticket <= failure.through;  // from >= 1
  };
  // Their replies go as errors, in their place (ReleaseSettled): they promise nothing now.
  for (Held& h : held_) {
    if (!failed_on(h.ticket, h.slots)) continue;
    h.reply.bytes = wire::EncodeError(transport::RequestIdOf(h.reply.bytes).value_or(0), why);
    h.ticket = 0;
    h.slots.clear();
  }
  // Batches that changed the region in a failed round and then stopped to wait: their reply
  // would promise those changes too.
  std::vector<uint64_t> failed;
  for (const auto& [number, w] : waiters_) {
    if (failed_on(w.dirty_ticket, w.dirty_slots)) failed.push_back(number);
  }
  for (uint64_t number : failed) {
    Answer(number, wire::EncodeError(waiters_.at(number).request_id, why), false);
  }
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
  server->mirror_port_ = server->impl_->mirror_port();
  server->options_.port = server->port_;
  server->impl_->Serve();
  return server;
}

void MemoryServer::Stop() { impl_->Stop(); }

Status MemoryServer::Drain(std::chrono::milliseconds timeout) { return impl_->Drain(timeout); }

MemoryServer::MemoryServer(const ServerOptions& options) : options_(options) {}

MemoryServer::~MemoryServer() { Stop(); }

}  // namespace farpool
