// ServerAuth: a memory server's side of the cluster secret's challenge-response
// (transport/auth.h, transport/wire.h "Access control"), shared by its loops (the clients'
// and the mirror's, pool/server/mirror.h).
//
// With a secret, a connection executes nothing until it has authenticated: a challenge, then a
// hello whose proof checks; the server proves itself in its hello reply. Every other request
// before that, and every hello with a wrong or no proof, is refused with PermissionDenied
// ("authentication failed: ...", "not authenticated: ...") and counted. Without a secret
// nobody is authenticated and every connection is served.
//
// Pools (transport/auth.h, docs/pool.md "Pools"): a hello that names a pool proves with that
// pool's key, which the server derives from the cluster secret; the connection is then the
// pool's (Peer::pool, Peer::pool_name) for good. A server without a secret has no pools and
// refuses such hellos. What a pool's connection may then do is the loops' business (the
// memory server: its pool's chunks; the mirror: only promotions).
//
// Thread-safety: set_name before the loops start; then any thread (each Peer is its loop's).
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "farpool/status.h"
#include "transport/am_server.h"
#include "transport/auth.h"
#include "transport/wire.h"

namespace farpool {

class ServerAuth {
 public:
  explicit ServerAuth(std::optional<transport::ClusterSecret> secret)
      : secret_(std::move(secret)) {}

  // How refusals name the server ("server 3 (host:port)").
  void set_name(std::string name) { name_ = std::move(name); }
  const transport::ClusterSecret* secret() const { return secret_ ? &*secret_ : nullptr; }

  // Ok if a request of `opcode` may run on `from`: the challenge and the hello always, anything
  // else only on an authenticated connection (or without a secret).
  Status Admit(wire::Opcode opcode, const transport::Peer* from);
  // A fresh challenge for the connection (replacing any earlier one).
  Result<wire::ChallengeReply> Challenge(const wire::ChallengeRequest& request,
                                         transport::Peer* from);
  // For every hello: on a connection that has not authenticated (with a secret) checks its
  // proof with the credential of the pool it names; Ok marks the connection authenticated (and
  // its pool's) and puts our proof into `reply`. Later hellos of an authenticated connection
  // pass (they cannot change its pool); without a secret, a hello that names a pool is refused.
  Status Hello(const wire::HelloRequest& hello, transport::Peer* from, wire::HelloReply& reply);
  bool NeedsProof(const transport::Peer* from) const {
    return secret_ && (from == nullptr || !from->authenticated);
  }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  Status Refused(std::string why);
  Status Authenticate(const wire::HelloRequest& hello, transport::Peer* from,
                      wire::HelloReply& reply);

  std::optional<transport::ClusterSecret> secret_;
  std::string name_;
  std::atomic<uint64_t> refused_{0};
};

}  // namespace farpool
