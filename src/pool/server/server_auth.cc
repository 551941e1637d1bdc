#include "pool/server/server_auth.h"

#include <cstring>

namespace farpool {

Status ServerAuth::Refused(std::string why) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  return Status::PermissionDenied(name_ + ": " + std::move(why));
}

Status ServerAuth::Admit(wire::Opcode opcode, const transport::Peer* from) {
  if (!NeedsProof(from) || opcode == wire::Opcode::kChallengeRequest ||
      opcode == wire::Opcode::kHelloRequest) {
    return Status::Ok();
  }
  return Refused("not authenticated: " + std::string(wire::OpcodeName(opcode)) +
                 " refused (a connection proves it knows the cluster secret in its hello "
                 "before anything else)");
}

Result<wire::ChallengeReply> ServerAuth::Challenge(const wire::ChallengeRequest& request,
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

Status ServerAuth::Hello(const wire::HelloRequest& hello, transport::Peer* from,
                         wire::HelloReply& reply) {
  if (NeedsProof(from)) return Authenticate(hello, from, reply);
  if (!secret_ && hello.pool[0] != '\0') {
    return Refused(
        "authentication failed: this server has no cluster secret, hence no pools (the "
        "hello names one)");
  }
  return Status::Ok();
}

Status ServerAuth::Authenticate(const wire::HelloRequest& hello, transport::Peer* from,
                                wire::HelloReply& reply) {
  const std::string pool(hello.pool, strnlen(hello.pool, sizeof(hello.pool)));
  if (!pool.empty()) {
    if (Status valid = transport::ValidPoolName(pool); !valid.ok()) {
      return Refused("authentication failed: " + valid.message());
    }
  }
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
  // The default pool proves with the cluster secret, a pool with the key derived from it.
  const transport::ClusterSecret key = pool.empty() ? *secret_ : secret_->DerivePool(pool);
  if (!key.Verify(proof, transport::ClusterSecret::Role::kClient, c.client, c.server)) {
    return Refused(pool.empty() ? "authentication failed: wrong cluster secret"
                                : "authentication failed: wrong credential for pool '" + pool +
                                      "' (or no such pool in this cluster)");
  }
  from->authenticated = true;
  from->pool = transport::PoolId(pool);
  from->pool_name = pool;
  const transport::Proof mine =
      key.Prove(transport::ClusterSecret::Role::kServer, c.client, c.server);
  std::memcpy(reply.proof, mine.data(), mine.size());
  reply.flags = wire::kHelloServerProof;
  return Status::Ok();
}

}  // namespace farpool
