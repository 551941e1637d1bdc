#include "coord/membership.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "farpool/cluster.h"

namespace farpool::coord {
namespace {

// Whether a TCP connection to `address` (HOST:PORT) is refused within `timeout`: nothing
// listens there (the host answered). A timeout, an unreachable host or an accepted connection
// is not a refusal.
bool Refused(const std::string& address, std::chrono::milliseconds timeout) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(hp->first.c_str(), std::to_string(hp->second).c_str(), &hints, &found) != 0) {
    return false;
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool refused = false;
  if (fd >= 0) {
    int error = connect(fd, found->ai_addr, found->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      socklen_t length = sizeof(error);
      error = poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
                      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0
                  ? error
                  : ETIMEDOUT;
    }
    refused = error == ECONNREFUSED;
    close(fd);
  }
  freeaddrinfo(found);
  return refused;
}

}  // namespace

Membership::Membership(const Options& options) : options_(options), keys_{options.prefix} {}

Result<std::unique_ptr<Membership>> Membership::Start(const Options& options) {
  std::unique_ptr<Membership> m(new Membership(options));
  // Each call must end well within the TTL, or one slow call would let the lease lapse.
  FARPOOL_ASSIGN_OR_RETURN(m->etcd_, EtcdClient::Create({options.endpoints, options.ttl / 4}));
  const bool probes = options.closed || options.coordinator_closed;
  if (probes) {
    FARPOOL_ASSIGN_OR_RETURN(m->probe_etcd_,
                             EtcdClient::Create({options.endpoints, options.ttl / 4}));
  }
  Status s = m->Register();
  const auto give_up = std::chrono::steady_clock::now() + options.first_registration;
  while (s.code() == StatusCode::kUnavailable && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(options.ttl / 8);
    s = m->Register();
  }
  if (!s.ok()) {
    return s.WithContext("server " + std::to_string(options.id) + ": registering in etcd (" +
                         m->etcd_->EndpointList() + ")");
  }
  if (options.on_map || options.coordinate) {
    EtcdWatch::Options wo;
    wo.endpoints = options.endpoints;
    wo.key = m->keys_.prefix;
    wo.prefix = true;
    wo.timeout = options.ttl / 4;
    wo.on_update = [p = m.get()](const EtcdWatch::Update& u) { p->Watched(u); };
    FARPOOL_ASSIGN_OR_RETURN(m->watch_, EtcdWatch::Start(std::move(wo)));
  }
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  if (probes) m->prober_ = std::thread([p = m.get()] { p->Probe(); });
  return m;
}

void Membership::Watched(const EtcdWatch::Update& u) {
  const std::string map_key = keys_.Map();
  const std::string* map = nullptr;
  bool wake = false;
  auto saw = [&](const KeyValue& kv, bool put) {
    if (kv.key == map_key) {
      map = put ? &kv.value : nullptr;
      wake = true;
    } else if (kv.key == keys_.Coordinator()) {
      coordinator_held_.store(put);
      coordinator_changes_.fetch_add(1);
      wake = true;
    } else if (kv.key.compare(0, keys_.AlivePrefix().size(), keys_.AlivePrefix()) == 0) {
      wake = wake || !put;  // a server gone
    } else if (kv.key.compare(0, keys_.SuspectPrefix().size(), keys_.SuspectPrefix()) == 0) {
      wake = wake || put;  // a client lost a server
    }
  };
  if (u.snapshot) {
    coordinator_held_.store(false);
    coordinator_changes_.fetch_add(1);
    wake = true;
  }
  for (const KeyValue& kv : u.kvs) saw(kv, true);
  for (const WatchEvent& e : u.events) saw(e.kv, e.type == WatchEvent::Type::kPut);
  if (map != nullptr && options_.on_map) {
    auto parsed = ClusterMap::Parse(*map, map_key);
    if (parsed.ok()) options_.on_map(*parsed);
  }
  if (!wake || !options_.coordinate) return;
  {
    std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void Membership::Wake() {
  {
    std::lock_guard lock(mu_);
    probe_woken_ = true;
  }
  probe_cv_.notify_all();
}

Membership::~Membership() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  probe_cv_.notify_all();
  if (prober_.joinable()) prober_.join();
  if (thread_.joinable()) thread_.join();
  // After the thread (it asks the watch whether it is up), before the members Watched uses.
  watch_.reset();
  if (lease_ != 0 && registered_) {
    Status s = etcd_->RevokeLease(lease_);
    (void)s;  // leaving anyway: the lease then lapses within its TTL
  }
}

Status Membership::Register() {
  FARPOOL_ASSIGN_OR_RETURN(LeaseAnswer lease, etcd_->GrantLease(options_.ttl));
  const nlohmann::json value = {{"id", options_.id},
                                {"address", options_.address},
                                {"mirror_port", options_.mirror_port},
                                {"pid", static_cast<int64_t>(getpid())}};
  auto put = etcd_->Put(keys_.Alive(options_.id), value.dump(), lease.id);
  if (!put.ok()) {
    Status revoked = etcd_->RevokeLease(lease.id);
    (void)revoked;  // the put's error is the one to report; the lease lapses anyway
    return put.status();
  }
  lease_ = lease.id;
  registered_ = true;
  return Status::Ok();
}

void Membership::Probe() {
  const auto tick =
      std::min<std::chrono::milliseconds>(std::chrono::milliseconds(100), options_.ttl / 4);
  std::unique_lock lock(mu_);
  while (true) {
    probe_cv_.wait_for(lock, suspects_.empty() ? tick : kProbeInterval,
                       [&] { return stop_ || probe_woken_; });
    if (stop_) break;
    probe_woken_ = false;
    lock.unlock();
    CheckClosedPeers();
    std::fflush(stdout);
    lock.lock();
  }
}

void Membership::CheckClosedPeers() {
  const auto now = std::chrono::steady_clock::now();
  if (options_.closed) {
    for (uint16_t id : options_.closed()) {
      if (id != options_.id) suspects_.insert_or_assign(id, now + options_.ttl);
    }
  }
  if (options_.coordinator_closed && options_.coordinator_closed() && !coordinator_) {
    auto key = probe_etcd_->Get(keys_.Coordinator());
    if (key.ok() && key->has_value()) {
      const auto& held = (*key)->value;
      uint16_t id = 0;
      if (std::from_chars(held.data(), held.data() + held.size(), id).ec == std::errc() &&
          id != options_.id) {
        suspects_.insert_or_assign(id, now + options_.ttl);
      }
    }
  }
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    const uint16_t id = it->first;
    if (now > it->second) {  // its lease has lapsed by now if it is dead
      it = suspects_.erase(it);
      continue;
    }
    auto kv = probe_etcd_->Get(keys_.Alive(id));
    if (!kv.ok()) {  // etcd unreachable: ask again at the next probe
      ++it;
      continue;
    }
    if (!kv->has_value() || (*kv)->lease == 0) {  // gone already, or unknown
      it = suspects_.erase(it);
      continue;
    }
    auto value = nlohmann::json::parse((*kv)->value, nullptr, /*allow_exceptions=*/false);
    if (!value.is_object() || !value.contains("address") || !value["address"].is_string()) {
      it = suspects_.erase(it);
      continue;
    }
    const std::string address = value["address"].get<std::string>();
    if (!Refused(address, kProbeTimeout)) {  // alive, or not dead yet
      ++it;
      continue;
    }
    Status revoked = probe_etcd_->RevokeLease((*kv)->lease);
    std::printf("farpool server %u: server %u's connection closed and %s refuses connections: %s\n",
                options_.id, id, address.c_str(),
                revoked.ok() ? "its lease revoked (it is gone)"
                             : ("revoking its lease: " + revoked.message()).c_str());
    it = suspects_.erase(it);
  }
}

void Membership::Elect() {
  const std::string me = std::to_string(options_.id);
  const bool watched = watch_ != nullptr && watch_->up();
  if (coordinator_) {
    // Read again only when the watch shows the key changed (or cannot say).
    const uint64_t changes = coordinator_changes_.load();
    if (watched && changes == coordinator_checked_) return;
    coordinator_checked_ = changes;
    auto key = etcd_->Get(keys_.Coordinator());
    if (!key.ok()) return;  // unknown: keep the role until etcd says otherwise or the lease ends
    if (key->has_value() && (*key)->value == me && (*key)->lease == lease_ &&
        (*key)->create_revision == term_) {
      return;
    }
    coordinator_ = false;
    std::printf("farpool server %u: no longer the coordinator\n", options_.id);
    return;
  }
  if (campaign_unknown_) {
    // A campaign whose reply was lost may have won: the key under our lease is then ours.
    auto key = etcd_->Get(keys_.Coordinator());
    if (!key.ok()) return;
    campaign_unknown_ = false;
    if (key->has_value() && (*key)->value == me && (*key)->lease == lease_) {
      term_ = (*key)->create_revision;
      coordinator_ = true;
      std::printf("farpool server %u: elected coordinator\n", options_.id);
      return;
    }
  }
  if (watched && coordinator_held_.load()) return;  // held: a campaign would lose
  auto won = etcd_->PutIf({{keys_.Coordinator(), Compare::Target::kCreateRevision, 0}},
                          keys_.Coordinator(), me, lease_);
  if (!won.ok()) {
    campaign_unknown_ = true;
  } else if (won->succeeded) {
    term_ = won->revision;  // the put's revision: the key's create_revision
    coordinator_ = true;
    std::printf("farpool server %u: elected coordinator\n", options_.id);
  }
}

void Membership::Run() {
  // Ticks every 100 ms (the coordinator's pace), or at once when woken; keepalives every
  // ttl/4.
  const auto tick =
      std::min<std::chrono::milliseconds>(std::chrono::milliseconds(100), options_.ttl / 4);
  auto next_keepalive = std::chrono::steady_clock::now() + options_.ttl / 4;
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait_for(lock, tick, [&] { return stop_ || woken_; });
    if (stop_) break;
    woken_ = false;
    lock.unlock();
    if (std::chrono::steady_clock::now() >= next_keepalive || !registered_) {
      next_keepalive = std::chrono::steady_clock::now() + options_.ttl / 4;
      KeepAliveOnce();
      // The watch hands maps over as they change; read here only while it is down.
      if (registered_ && options_.on_map && !watch_->up()) ReadMap();
    }
    if (registered_ && options_.coordinate) {
      Elect();
      if (coordinator_) options_.coordinate(*etcd_, keys_, term_);
    }
    std::fflush(stdout);
    lock.lock();
  }
}

void Membership::ReadMap() {
  auto kv = etcd_->Get(keys_.Map());
  if (!kv.ok() || !kv->has_value()) return;  // none yet (cluster up writes it last), or no etcd
  auto map = ClusterMap::Parse((*kv)->value, keys_.Map());
  if (map.ok()) options_.on_map(*map);
}

void Membership::KeepAliveOnce() {
  Status s = etcd_->KeepAlive(lease_).status();
  if (s.code() == StatusCode::kNotFound) {
    // The lease lapsed (etcd was unreachable for longer than the TTL, or lost it): the key
    // went with it, and the coordinator key if this server held it. Register again.
    coordinator_ = false;
    s = Register();
    if (s.ok()) {
      std::printf("farpool server %u: re-registered in etcd (lease %lld)\n", options_.id,
                  static_cast<long long>(lease_));
    }
  }
  const bool was = registered_.exchange(s.ok());
  if (was && !s.ok()) {
    std::printf("farpool server %u: etcd unreachable, serving on and retrying: %s\n", options_.id,
                s.message().c_str());
  } else if (!was && s.ok()) {
    std::printf("farpool server %u: etcd reachable again, registered\n", options_.id);
  }
}

}  // namespace farpool::coord
