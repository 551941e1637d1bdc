// BackupLink: a primary memory server's connection to its backup's mirror (pool/server/mirror.h,
// docs/pool.md "Replication"), used on the primary's progress thread only.
//
// Connect() says hello on the backup's port (which must answer that it mirrors this server,
// with room for its region) to learn the mirror's port, then connects there and says hello
// again; both with the cluster secret's challenge-response. Forward() sends the current bytes
// of the ranges a round of requests changed (as writes, in messages of at most
// wire::kMaxBatchTail) and the round's lease changes, all at once, then waits for every
// acknowledgement: the primary answers those requests only after it returns Ok.
//
// Thread-safety: one thread (the primary's progress thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "farpool/fabric.h"
#include "farpool/status.h"
#include "pool/control_client.h"
#include "pool/memory_ops.h"
#include "transport/auth.h"

namespace farpool {

// A lease or release of [offset, offset + size) in the primary's book, by pool `owner`
// (wire::MirrorLeaseRequest::leased: kMirrorLease, kMirrorLeaseRoot or kMirrorRelease).
struct LeaseChange {
  uint64_t offset;
  uint64_t size;
  uint16_t kind;
  uint32_t owner;
};

class BackupLink {
 public:
  struct Target {
    uint16_t id;
    std::string host;
    uint16_t port;  // the backup's clients' port
  };
  // `primary_id`, `region_size`: this server's. Every wait is bounded by `timeout`.
  static Result<std::unique_ptr<BackupLink>> Connect(const Target& backup, uint16_t primary_id,
                                                     uint64_t region_size,
                                                     const transport::ClusterSecret* secret,
                                                     Fabric fabric,
                                                     std::chrono::milliseconds timeout);
  ~BackupLink() = default;

  // Sends the bytes of `changed` (offsets into `region`) and `leases`; Ok once the backup has
  // applied all of them. PermissionDenied ("fenced: ...") if the backup has taken this
  // server's data over; Unavailable or TimedOut if it cannot be reached; Aborted as soon as
  // `give_up()` says so while waiting (the backup was declared gone).
  Status Forward(const std::byte* region, std::span<const memory_ops::Range> changed,
                 std::span<const LeaseChange> leases, const std::function<bool()>& give_up);

  const std::string& name() const { return name_; }
  int id() const { return id_; }

 private:
  BackupLink() = default;

  std::string name_;
  int id_ = 0;  // the backup's server id
  uint16_t primary_id_ = 0;
  std::unique_ptr<control::Connection> mirror_;  // to the backup's mirror port
};

}  // namespace farpool
