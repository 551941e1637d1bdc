// `farpool bench ops`: the raw operation benchmark of the pool.
//
// Workload: each of `threads` threads allocates its own working set (`working_set` bytes of
// `size`-byte objects, striped over the servers; 8-byte words for cas and faa), then, after a
// warm-up, repeatedly picks `batch` random objects (seeded per thread) and runs one operation
// on each: `read` and `write` of `size` bytes, `cas` (compare-and-swap with the value last
// seen, so most succeed) or `faa` (fetch-and-add 1). With batch 1 each operation is a sync
// call; with batch B the B operations are posted in one Batch and waited for once.
//
// Latency is measured per call (per batch when B > 1) with the steady clock, minus the
// clock's own measured cost, recorded in a log-linear histogram (<1% error); throughput is
// operations (not batches) per second over the measured interval, all threads together.
// With `local_memory` the same workload runs on an array in this process (memcpy and CPU
// atomics): the upper bound the pool is measured against.
// `server_cpu_pct` is the CPU the (same-host) servers used while measuring, in % of a core.
// Output: one JSON object (see OpsBenchResult fields); `verify` checks afterwards that every
// faa was counted and every write reads back.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "farpool/fabric.h"
#include "farpool/pool.h"
#include "farpool/status.h"

namespace farpool {

struct OpsBenchOptions {
  std::string cluster_file;
  std::string op = "read";  // read | write | cas | faa
  uint64_t size = 64;
  int threads = 1;
  int batch = 1;
  double seconds = 3.0;
  double warmup_seconds = 0.5;
  uint64_t working_set = 16ull << 20;  // per thread
  uint64_t seed = 42;
  std::optional<Fabric> transport;  // default: the cluster file's
  bool direct_access = true;
  RemoteAccess remote_access = RemoteAccess::kAuto;
  bool verify = false;
  // Run on a plain array in this process instead of the pool (the local-memory baseline).
  bool local_memory = false;
};

Result<nlohmann::json> RunOpsBench(const OpsBenchOptions& options);

}  // namespace farpool
