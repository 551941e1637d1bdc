// `farpool bench social`: the MEMSCALE social network (src/workloads/social.h) on one engine.
//
// The run: create the eight tables in a fresh database (a fresh cluster for pool), load the
// generated network at --scale with `load_threads` sessions (progress on stderr), optionally
// verify (every query for a deterministic sample of users and messages against the
// generator's expected answers), then measure.
//
// Measurement, one of:
//   queries   for each query in `queries`, in turn: `flows` threads (one session each, fixed
//             seed per thread) run that query back to back with a uniform random user (a
//             uniform message for q5) for `warmup` + `seconds`; latency of each query (one
//             read-only transaction) in a log-linear histogram -> p50/p99/mean, and qps.
//             With flows 1 this is MEMSCALE Fig. 3 (one query flow).
//   mix       (`mix`) every flow picks one of the six queries uniformly for each operation,
//             and with probability `write_pct`/100 does a write instead (half "post a
//             message", half "mark a message read"): one measurement of all flows together
//             (MEMSCALE Fig. 4/7: throughput vs concurrent query flows). Per-query and
//             overall numbers.
// Output: one JSON object (fields below plus RunContext()).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "farpool/db.h"
#include "farpool/status.h"
#include "workloads/social.h"

namespace farpool::workloads {

struct SocialBenchOptions {
  std::string cluster_file;
  Engine engine = Engine::kPool;
  double scale = 1.0;
  std::vector<SocialQuery> queries;  // default: all six
  bool mix = false;
  double write_pct = 0;
  int flows = 1;
  double seconds = 2.0;
  double warmup_seconds = 0.3;
  uint64_t seed = 42;
  bool verify = false;
  int samples = 100;
  int load_threads = 2;
  uint64_t local_memory = 4ull << 30;  // kLocal: per simulated server (reserved lazily)
  bool progress = true;                // loading progress on stderr
};

Result<nlohmann::json> RunSocialBench(const SocialBenchOptions& options);

// Loads nothing: checks the sample's answers on an already loaded database.
Status VerifySocial(Database& db, const SocialData& data, int samples);

}  // namespace farpool::workloads
