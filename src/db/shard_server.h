// A partition server of the sharded engine: owns one partition of every table in its own RAM
// and executes the coordinators' requests (db/shard_wire.h) on it. Runs as `farpool shard` or,
// for tests, as a thread of the compute process (DatabaseOptions::cluster_file empty).
//
// How it works
//   PartitionState is the partition, message in -> reply out, with no I/O (so tests and the
//   fuzz-style test drive it directly). PartitionServer serves it with an AmServer
//   (transport/am_server.h: listener, one progress thread, inbox, reaping of dead
//   coordinators); the progress thread is the only thread that touches the state: requests
//   are executed one at a time, so a Prepare checks and locks its whole write set atomically.
//
//   Records: per table an ordered map key -> record: committed versions (ascending commit
//   timestamp; a delete is a tombstone version; never garbage-collected, like the pool engine)
//   plus at most one lock: holder transaction id, the holder's read timestamp, the lock's lease
//   expiry (this server's steady clock) and the pending new version.
//
//   Timestamps (any partition can serve them; coordinators use partition 0): `clock` is the
//   last commit timestamp. Begin returns it as the read timestamp; Decide gives a transaction
//   commit timestamp ++clock and records the decision. A transaction is decided only after
//   every participant prepared it, so:
//
// Invariants
//   I1  A reader at read_ts R that finds a record unlocked sees every version with ts <= R:
//       a writer with commit ts t <= R was decided before R was handed out, hence had the
//       record locked (prepared) before the read, and unlocks it only by installing.
//   I2  A reader at R that finds a record locked by T waits (kBusy) unless R <= T's read_ts
//       (then T's commit ts > R and the pending version is invisible to it anyway).
//   I3  Every transaction has at most one decision (commit ts, or 0 = aborted) in the
//       timestamp service; Decide after a Resolve that aborted it fails with Aborted, so a
//       coordinator fenced by a resolver never installs anywhere.
//   I4  A lock is released only by Commit(T, ts) with T's decision (install) or with 0 (abort;
//       sent by T's coordinator before any decision, or by a resolver after Resolve(T) = 0).
//
// Dead coordinators: locks carry the coordinator's lease. A reader or writer that meets a lock
// whose lease expired (kBusy / a conflict with `expired`) asks the timestamp service to
// Resolve(T) (commit ts if decided, else it marks T aborted) and sends Commit(T, outcome) to
// that partition; Database::RecoverExpired does it for every expired lock. Decisions are kept
// for kDecisionRetention; a lock older than that whose holder never finished would be resolved
// as aborted (documented limitation).
//
// Thread-safety: PartitionState is single-threaded; PartitionServer's Start/Stop from one
// owning thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "db/shard_wire.h"
#include "farpool/fabric.h"
#include "farpool/status.h"
#include "transport/am_server.h"

namespace farpool::db::shard {

inline constexpr std::chrono::seconds kDecisionRetention{120};

class PartitionState {
 public:
  explicit PartitionState(uint16_t id) : id_(id) {}
  // Executes one request; the reply (an ErrorReply naming the problem for malformed input).
  std::vector<std::byte> Handle(std::span<const std::byte> request);
  uint64_t rejected() const { return rejected_; }
  uint64_t served() const { return served_; }

 private:
  struct Version {
    uint64_t ts;
    bool deleted;
    std::string value;
  };
  struct Record {
    std::vector<Version> versions;
    uint64_t lock_txn = 0;  // 0: unlocked
    uint64_t lock_read_ts = 0;
    int64_t lock_expiry_ms = 0;
    bool pending_delete = false;
    std::string pending;
  };
  using Rows = std::map<int64_t, Record>;
  struct Decision {
    uint64_t ts;  // 0: aborted
    int64_t at_ms;
  };

  Result<std::vector<std::byte>> Answer(const Message& m);
  Result<std::vector<std::byte>> Read(const Message& m);
  Result<std::vector<std::byte>> Scan(const Message& m);
  Result<std::vector<std::byte>> Prepare(const Message& m);
  // Installs (ts != 0) or drops the pending versions of `txn` and unlocks; returns the count.
  uint64_t Finish(uint64_t txn, uint64_t ts);
  // The decision of `txn`: commit ts, or Aborted if it was resolved as aborted.
  Result<uint64_t> Decide(uint64_t txn);
  uint64_t Resolve(uint64_t txn);
  void PruneDecisions();
  // Appends the read outcome of `rec` (null: no record) at `read_ts` to `tail`.
  void AppendRead(TailWriter& tail, int64_t key, const Record* rec, uint64_t read_ts) const;
  std::string Name() const { return "partition " + std::to_string(id_); }
  int64_t NowMs() const;

  uint16_t id_;
  std::unordered_map<uint32_t, Rows> tables_;
  std::unordered_map<uint64_t, std::vector<std::pair<uint32_t, int64_t>>> prepared_;
  uint64_t clock_ = 1;  // last commit timestamp (1: the empty database)
  std::unordered_map<uint64_t, Decision> decisions_;
  std::deque<std::pair<int64_t, uint64_t>> decision_order_;
  std::map<std::string, TableDesc> catalog_;
  uint32_t next_table_id_ = 1;
  uint64_t rejected_ = 0, served_ = 0;
};

struct PartitionServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port (see PartitionServer::port)
  uint16_t id = 0;
  ProgressMode progress = ProgressMode::kBusy;
  // kEvent: keep polling this long after the last request before sleeping on the event
  // descriptor (a coordinator's next phase often follows within microseconds; a wake-up costs
  // more than that when a core is free, and steals the core when none is).
  std::chrono::microseconds event_spin{0};
  Fabric fabric = Fabric::kAuto;
};

class PartitionServer {
 public:
  static Result<std::unique_ptr<PartitionServer>> Start(const PartitionServerOptions& options);
  ~PartitionServer();
  PartitionServer(const PartitionServer&) = delete;
  PartitionServer& operator=(const PartitionServer&) = delete;

  uint16_t port() const { return port_; }
  // Joins the progress thread and closes connections. Idempotent.
  void Stop();

 private:
  class Impl;
  PartitionServer() = default;
  uint16_t port_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace farpool::db::shard
