// Membership: a memory server's registration in etcd (docs/pool.md "Membership on etcd").
//
// How it works: Start grants an etcd lease of Options::ttl and puts MapKeys::Alive(id) =
// {"id", "address", "mirror_port", "pid"} under it, then a thread keeps the lease alive every
// ttl/4. The key is thus present exactly while the server lives and reaches etcd; a SIGKILLed
// server's key is deleted by etcd within the TTL. When etcd cannot be reached the server keeps
// serving (etcd is not on the data path) and the thread keeps trying; when it answers again and the
// lease is gone (expired meanwhile), the thread grants a new lease and puts the key again
// (re-registration). Every change of that state is one line on stdout (the server's log).
// Destruction revokes the lease (an orderly leave: the key goes at once).
//
// Coordinator election (Options::coordinate set): every server campaigns by a txn that puts
// MapKeys::Coordinator() = its id under its own lease only if the key does not exist
// (create_revision == 0); one wins, the others find the key taken and try again every tick, so
// when the coordinator dies (its lease lapses and the key with it) or leaves (revoked) the next
// tick elects another. While this server holds the key, `coordinate` runs every tick (100 ms)
// on this thread: the coordinator's duties (pool/server/coordinator.h), handed the key's
// create_revision (its term: a later election creates the key anew, at a higher revision), on
// which the coordinator makes every map write conditional. A coordinator that lost its lease
// stops at its next tick (the key names it no more); one that does not know it yet (cut off
// from etcd, or between ticks) has its map writes refused by etcd once the key is gone or held
// by another (docs/pool.md "The coordinator's term").
//
// Dead peers (branch `failfast`): a SIGKILLed server's key lapsed only after the TTL (2 s), and
// when it was the coordinator nothing was decided until then, while the primary whose backup it
// was failed its held replies after 1 s. A server that sees a peer's connection close
// (Options::closed) and then finds its port refusing connections revokes the peer's lease. The
// revocation is safe whatever it is based on: it only removes keys; a failover still needs the
// backup to find its primary's connection closed or its serving lease lapsed (pool/server/
// mirror.h), and a live server whose lease was revoked registers again at its next keepalive.
// A killed process's connections close before its listening port does (measured: the peers
// read EOF 2 ms after the SIGKILL, the port refused from 72 ms on; branch `coordkill`), so a
// single probe at the close found the port still accepting: the peer stays suspect and is
// probed again every kProbeInterval until its port refuses, its alive key goes, or the TTL
// since the close has passed (by then its lease has lapsed if it is dead). Not only the
// primary's connection: every server whose connection from the coordinator closed
// (Options::coordinator_closed; the coordinator keeps one to every mirror) probes the server
// the coordinator key names, so that the coordinator's death is acted on also without replicas
// or when its backups died with it.
//
// The probes run on a thread of their own (branch `coordload2`), with a client of etcd of their
// own: a probe waits up to kProbeTimeout for a peer that drops packets (a cut link), and
// several such suspects probed on the membership thread, as before, held back its keepalives
// past the TTL (this server's own lease lapsed) and its elections.
//
// Watching the cluster's keys (branch `etcdwatch`): with on_map or coordinate set, Start also
// opens an EtcdWatch on the whole prefix. A put of the map is handed to on_map at once (fencing
// by epoch no longer waits for the next keepalive; the map is read after a keepalive only while
// the watch is down). A server that is not the coordinator campaigns only while the watch does
// not show the coordinator key held (it did so every tick). The coordinator reads its key again
// only when the watch shows a change of it (or is down), and a change of an alive key, a
// suspicion or the map wakes the thread for a tick at once instead of at the next 100 ms.
//
// Start fails, naming the etcd endpoints and etcd's reason, if the first registration fails:
// a server that cannot register would look dead to the cluster. etcd unreachable (Unavailable)
// is tried again every ttl/8 for up to Options::first_registration: a server that `cluster add`
// starts in a network namespace made just before it found etcd's address unreachable for over
// 500 ms (ttl/4, a call's limit) in 2 of 3 adds under load (the network soak, docs/database.md),
// and the add failed.
//
// Thread-safety: Start and the destructor from one owning thread; registered(), coordinator()
// and Wake() from any. Two threads: the membership thread (keepalives, elections, the
// coordinator's ticks) and the prober (the suspects), each with its own EtcdClient.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coord/cluster_map.h"
#include "coord/etcd_client.h"
#include "farpool/status.h"

namespace farpool::coord {

class Membership {
 public:
  struct Options {
    std::vector<std::string> endpoints;
    std::string prefix;  // MapKeys::prefix
    uint16_t id = 0;
    std::string address;       // HOST:PORT the server listens on
    uint16_t mirror_port = 0;  // its mirror's loop (replication), 0: none
    std::chrono::milliseconds ttl{2000};
    // How long Start tries the first registration while etcd is unreachable.
    std::chrono::milliseconds first_registration{10000};
    // The coordinator's work, run each tick while this server is the coordinator, with the
    // coordinator key's create_revision (`term`); empty: this server does not campaign.
    std::function<void(EtcdClient& etcd, const MapKeys& keys, int64_t term)> coordinate;
    // Called with the cluster map after every keepalive that reached etcd (every ttl/4) and
    // after a re-registration: how a server learns that the map moved its region away
    // (fencing by epoch). Empty: the map is not read.
    std::function<void(const ClusterMap& map)> on_map;
    // The servers whose connection to this one closed since the last call (taken by the
    // prober, at each Wake and every tick). For each, the prober tries a TCP connection to the
    // address of its alive key, again every kProbeInterval for up to the TTL; once that is
    // refused, no process listens there any more: its lease is revoked, so that its alive key
    // (and the coordinator key, if it held that) goes at once instead of after the TTL. See
    // "Dead peers". Empty: none are checked.
    std::function<std::vector<uint16_t>()> closed;
    // Whether a connection of the coordinator's to this server closed since the last call
    // (taken by the prober, as `closed`): the server the coordinator key names is then checked
    // as those of `closed` are (not by the coordinator itself). Empty: never. With neither
    // `closed` nor this, no prober runs.
    std::function<bool()> coordinator_closed;
  };
  static Result<std::unique_ptr<Membership>> Start(const Options& options);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Whether the last contact with etcd kept the key alive.
  bool registered() const { return registered_.load(std::memory_order_relaxed); }
  // Whether this server holds the coordinator key (as of its last tick).
  bool coordinator() const { return coordinator_.load(std::memory_order_relaxed); }
  // The watch of the cluster's keys; nullptr without on_map and coordinate.
  const EtcdWatch* watch() const { return watch_.get(); }
  // Has the prober take Options::closed and coordinator_closed now rather than at the next
  // 100 ms: a peer's connection closed. Any thread, also under the lock those take: Wake takes
  // only mu_, which the prober never holds while it calls them.
  void Wake();

 private:
  explicit Membership(const Options& options);
  Status Register();  // a new lease and the key under it
  void Run();
  void KeepAliveOnce();
  // The prober's loop: CheckClosedPeers at each Wake, every kProbeInterval while there are
  // suspects, else every tick.
  void Probe();
  // Takes the peers Options::closed reports as suspects (and the coordinator, if
  // coordinator_closed says its connection closed), probes each suspect once: its lease
  // is revoked if its port refuses; it stays suspect while its port accepts, its alive key
  // exists and its deadline has not passed. On the prober only.
  void CheckClosedPeers();
  void ReadMap();
  // What the watch delivers (on its thread): the map to on_map, the coordinator key's state,
  // and a wake-up of the thread.
  void Watched(const EtcdWatch::Update& u);
  // One election step: campaigns if nobody holds the key; checks that the key is still ours.
  void Elect();

  const Options options_;
  const MapKeys keys_;
  std::unique_ptr<EtcdClient> etcd_;        // the membership thread's
  std::unique_ptr<EtcdClient> probe_etcd_;  // the prober's
  // How often a suspect (see "Dead peers") is probed while its port still accepts.
  static constexpr std::chrono::milliseconds kProbeInterval{20};
  // How long one probe waits for the refusal.
  static constexpr std::chrono::milliseconds kProbeTimeout{300};

  int64_t lease_ = 0;  // owned by the thread after Start
  int64_t term_ = 0;   // owned by the thread: the coordinator key's create_revision while held
  // Owned by the thread: a campaign's reply was lost (it may have won; Elect reads the key).
  bool campaign_unknown_ = false;
  // Peers whose connection closed and whose port has not refused yet: id -> probe until.
  std::map<uint16_t, std::chrono::steady_clock::time_point> suspects_;  // owned by the prober
  std::atomic<bool> registered_{false};
  std::atomic<bool> coordinator_{false};
  std::mutex mu_;
  std::condition_variable cv_;        // the membership thread's
  std::condition_variable probe_cv_;  // the prober's
  bool stop_ = false;                 // guarded by mu_
  bool woken_ = false;                // guarded by mu_: the watch saw a change; tick now
  bool probe_woken_ = false;          // guarded by mu_: a peer's connection closed; take it now
  // From the watch: whether the coordinator key exists, and changes of it not yet checked
  // (by the coordinator). Valid while watch_->up().
  std::atomic<bool> coordinator_held_{false};
  std::atomic<uint64_t> coordinator_changes_{1};
  uint64_t coordinator_checked_ = 0;  // owned by the thread: coordinator_changes_ last read
  std::unique_ptr<EtcdWatch> watch_;  // reset by the destructor (its thread calls Watched)
  std::thread thread_;
  std::thread prober_;  // with Options::closed or coordinator_closed only
};

}  // namespace farpool::coord
