#include "coord/membership.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

namespace farpool::coord {

Membership::Membership(const Options& options) : options_(options), keys_{options.prefix} {}

Result<std::unique_ptr<Membership>> Membership::Start(const Options& options) {
  std::unique_ptr<Membership> m(new Membership(options));
  // Each call must end well within the TTL, or one slow call would let the lease lapse.
  FARPOOL_ASSIGN_OR_RETURN(m->etcd_, EtcdClient::Create({options.endpoints, options.ttl / 4}));
  Status s = m->Register();
  if (!s.ok()) {
    return s.WithContext("server " + std::to_string(options.id) + ": registering in etcd (" +
                         m->etcd_->EndpointList() + ")");
  }
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

Membership::~Membership() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  if (lease_ != 0 && registered_) {
    Status s = etcd_->RevokeLease(lease_);
    (void)s;  // leaving anyway: the lease then lapses within its TTL
  }
}

Status Membership::Register() {
  FARPOOL_ASSIGN_OR_RETURN(LeaseAnswer lease, etcd_->GrantLease(options_.ttl));
  const nlohmann::json value = {
      {"id", options_.id}, {"address", options_.address}, {"pid", static_cast<int64_t>(getpid())}};
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

void Membership::Run() {
  const auto period = options_.ttl / 4;
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, period, [&] { return stop_; })) {
    lock.unlock();
    Status s = etcd_->KeepAlive(lease_).status();
    if (s.code() == StatusCode::kNotFound) {
      // The lease lapsed (etcd was unreachable for longer than the TTL, or lost it): the key
      // went with it. Register again.
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
    std::fflush(stdout);
    lock.lock();
  }
}

}  // namespace farpool::coord
