// The sharded engine's coordinator side of the wire (db/shard_wire.h): one thread's UCX
// connections to every partition server, requests posted by id, replies matched by id.
// Requests posted before one Wait travel together (one round trip, counted in TxnCounters);
// a reply may also be collected lazily (MarkLazy, CollectLazy) when its outcome is already
// decided (commit installs, see sharded_engine.cc).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "db/shard_wire.h"
#include "farpool/cluster.h"
#include "farpool/db.h"
#include "transport/ucx.h"

namespace farpool::db::shard {

// A decoded reply that owns its bytes.
struct Reply {
  std::vector<std::byte> bytes;
  Message message;
};

// One thread's connections to every partition: a worker, an endpoint per partition, replies
// by request id. Thread-safety: one thread at a time.
class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(transport::Context& context,
                                                 const std::vector<ServerAddress>& partitions,
                                                 TxnCounters* counters);
  ~Client();
  size_t size() const { return eps_.size(); }
  const std::string& name(size_t p) const { return names_[p]; }

  // Posts a request to partition p; returns its id for Wait.
  template <typename Body>
  Result<uint64_t> Post(size_t p, Opcode op, const Body& body,
                        std::span<const std::byte> tail = {}) {
    const uint64_t id = next_id_++;
    if (eps_[p]->failed()) return Status::Unavailable(names_[p] + ": connection failed");
    FARPOOL_RETURN_IF_ERROR(
        transport::PostAm(eps_[p]->get(), kShardAm, Encode(id, op, body, tail), true)
            .WithContext(names_[p]));
    ++counters_->messages;
    ++unwaited_;
    pending_[id] = p;
    return id;
  }
  // Waits for the reply of `id`; an ErrorReply becomes its Status; a reply of another opcode
  // than `expected` is a Protocol error.
  // The first Wait after requests were posted is one round trip: those requests went out
  // together (the partitions work on them in parallel).
  Result<Reply> Wait(uint64_t id, Opcode expected);
  template <typename Body>
  Result<Reply> Call(size_t p, Opcode op, const Body& body, Opcode expected,
                     std::span<const std::byte> tail = {}) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t id, Post(p, op, body, tail));
    return Wait(id, expected);
  }
  // A request whose reply is collected later (CollectLazy).
  void MarkLazy(uint64_t id) { lazy_.insert(id); }
  // Consumes the lazy replies that arrived; returns the first failure among them.
  Status CollectLazy();
  // Collects lazy replies until none is left or `deadline` passes (for shutting down).
  void DrainLazy(std::chrono::steady_clock::time_point deadline);

 private:
  Client() = default;
  static ucs_status_t OnMessage(void* arg, const void*, size_t, void* data, size_t length,
                                const ucp_am_recv_param_t* param);

  TxnCounters* counters_ = nullptr;  // messages and round trips are counted here
  uint64_t unwaited_ = 0;            // requests posted since the last Wait
  std::unique_ptr<transport::Worker> worker_;
  std::vector<std::unique_ptr<transport::Endpoint>> eps_;
  std::vector<std::string> names_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, size_t> pending_;  // request id -> partition
  std::unordered_map<uint64_t, std::vector<std::byte>> box_;
  std::unordered_set<uint64_t> lazy_;
};

}  // namespace farpool::db::shard
