// BackupLink: a primary memory server's connection to its backup's mirror (pool/server/mirror.h,
// docs/pool.md "Replication"), used on the primary's progress thread only.
//
// Connect() says hello on the backup's port to learn the mirror's port, then connects there,
// says hello again (both with the cluster secret's challenge-response) and attaches the
// backup's mirror slot Target::slot (an empty forward with wire::kReplicateAttach: the slot
// becomes this server's copy, its lease book empty; the slot must be as large as the region).
// Forward() sends the current bytes of the ranges a round of requests changed (as writes, in
// messages of at most wire::kMaxBatchTail) and the round's lease changes, all at once, then waits
// for every acknowledgement: the primary answers those requests only after it returns Ok.
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

// A lease (leased) or release of [offset, offset + size) in the primary's book.
struct LeaseChange {
  uint64_t offset;
  uint64_t size;
  bool leased;
};

class BackupLink {
 public:
  struct Target {
    uint16_t id;
    std::string host;
    uint16_t port;  // the backup's clients' port
    uint16_t slot;  // the mirror slot that holds the copy
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
  uint16_t slot() const { return slot_; }

 private:
  BackupLink() = default;

  std::string name_;
  int id_ = 0;  // the backup's server id
  uint16_t primary_id_ = 0;
  uint16_t slot_ = 0;
  std::unique_ptr<control::Connection> mirror_;  // to the backup's mirror port
};

}  // namespace farpool
