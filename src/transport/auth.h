// The cluster secret and the challenge-response by which a client and a memory server prove to
// each other that they know it, without sending it (transport/wire.h: ChallengeRequest,
// HelloRequest::proof, HelloReply::proof; docs/pool.md, "Access control").
//
// How it works: the secret is 256 random bits in a file of its owner only (mode 0600), named by
// the cluster file (`farpool cluster up` writes both) and passed to `farpool server` as a path
// (--secret-file), never in argv or the environment. On a new connection the client sends a
// fresh 256-bit nonce, the server answers with its own; each side then proves knowledge of the
// secret with HMAC-SHA256(secret, label || client nonce || server nonce), the label saying who
// proves ("farpool client proof" or "farpool server proof") so that neither proof can be
// replayed as the other. The client proves first, in its hello; the server checks it and only
// then proves itself in its hello reply, so an unauthenticated peer never obtains a proof
// computed over nonces of its choice. Both nonces are fresh per connection, so a recorded
// exchange proves nothing on another connection. Only the nonces and the proofs travel.
//
// Pools (tenants; docs/pool.md "Pools"): a pool's credential is derived from the cluster secret,
// PoolKey(NAME) = HMAC-SHA256(cluster secret, "farpool pool key" || NAME), and written to the
// pool's own file (`farpool cluster pool add`). Its clients prove with it exactly as above, the
// hello naming the pool; a server, which holds the cluster secret, derives the pool's key to
// check the proof. So servers need no list of pools and keep no per-pool secret, a pool's
// client never learns the cluster secret (HMAC is one-way), and the key of pool A proves
// nothing for pool B or for the cluster itself (the name is in the derivation).
//
// Thread-safety: pure functions and value types; the random source (OpenSSL's RAND_bytes) is
// thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "farpool/status.h"

namespace farpool::transport {

inline constexpr size_t kSecretSize = 32;  // 256 bits
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kProofSize = 32;  // HMAC-SHA256

using Nonce = std::array<uint8_t, kNonceSize>;
using Proof = std::array<uint8_t, kProofSize>;

// 256 secret bits. Its bytes are wiped when it is destroyed (OPENSSL_cleanse).
class ClusterSecret {
 public:
  // From the system's random source. Fails only if OpenSSL's generator cannot be seeded.
  static Result<ClusterSecret> Generate();
  // Reads a file written by Write: 64 hex digits and a newline. Refuses a file that is not
  // regular, is readable or writable by group or others (the error says `chmod 600`), or holds
  // anything else; every error names the file.
  static Result<ClusterSecret> Read(const std::string& path);
  // Creates `path` with mode 0600 (exclusively: an existing file is an error, so nobody can
  // have opened it before) and writes the secret to it.
  Status Write(const std::string& path) const;

  ClusterSecret(const ClusterSecret& other) = default;
  ClusterSecret& operator=(const ClusterSecret& other) = default;
  ~ClusterSecret();

  // The credential of pool `name` (see the header comment), of the same form as a cluster
  // secret: clients prove with it, the file holds it. REQUIRES: ValidPoolName(name).
  ClusterSecret DerivePool(std::string_view name) const;

  // The proof that whoever holds this secret is `role` of the connection with these nonces.
  enum class Role : uint8_t { kClient, kServer };
  Proof Prove(Role role, const Nonce& client, const Nonce& server) const;
  // Whether `proof` is Prove(role, client, server); compares in constant time.
  bool Verify(const Proof& proof, Role role, const Nonce& client, const Nonce& server) const;

 private:
  ClusterSecret() = default;
  std::array<uint8_t, kSecretSize> bytes_{};
};

// Pool names: 1 to kMaxPoolName letters, digits, '-' or '_' (they name files and go in the
// hello). The empty name is the cluster's default pool, whose credential is the cluster secret.
inline constexpr size_t kMaxPoolName = 31;
// Ok, or InvalidArgument saying what is wrong with `name`.
Status ValidPoolName(std::string_view name);
// The pool's id in servers' lease books: 0 for the default pool (""), else the first 32 bits
// of SHA-256("farpool pool id" || name), never 0. Two names may share an id (one in 2^32 per
// pair); `farpool cluster pool add` refuses a name whose id another pool of the cluster has.
uint32_t PoolId(std::string_view name);

// A fresh nonce from the system's random source.
Result<Nonce> RandomNonce();

// A connection's challenge in progress, as the server keeps it (transport::Peer).
struct Challenge {
  Nonce client{};
  Nonce server{};
};

}  // namespace farpool::transport
