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
//             read-only transaction) in a log-linear histogram -> p50/p99/mean, qps, and the
//             mean round trips of a query (round_trips_per_query; see TxnCounters).
//             With flows 1 this is MEMSCALE Fig. 3 (one query flow).
//   mix       (`mix`) every flow picks one of the six queries uniformly for each operation,
//             and with probability `write_pct`/100 does a write instead (half "post a
//             message", half "mark a message read"): one measurement of all flows together
//             (MEMSCALE Fig. 4/7: throughput vs concurrent query flows). Per-query and
//             overall numbers.
// Several compute processes on one pool (MEMSCALE Fig. 7): one process loads the database into
// the cluster and exits (`load_only`); then any number of processes open it (`attach`: no
// create, no load; the tables must hold the network of the same --scale and --seed) and run
// their flows. `start_at_ms` (Unix time in ms) makes every process measure the same window
// (warm-up from start_at, measured from start_at + warmup), so their queries/s add up; a
// distinct `client_id` (0..63) per process keeps the message ids its writes post disjoint
// (also from earlier runs on the same cluster: a harness gives every process a new id).
// `attach` and `load_only` need an engine whose data outlives the process (pool, or sharded
// with --cluster); the local engine is this process's RAM.
// Output: one JSON object (fields below plus RunContext(), bench/run_context.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "farpool/db.h"
#include "farpool/status.h"
#include "workloads/social/social.h"

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
  bool attach = false;                 // open the loaded database; do not create or load
  bool load_only = false;              // create and load (and verify), then return
  int64_t start_at_ms = 0;             // 0: start now; else the common start (Unix ms)
  int client_id = 0;                   // this process's number in a multi-process run
};

Result<nlohmann::json> RunSocialBench(const SocialBenchOptions& options);

// Loads nothing: checks the sample's answers on an already loaded database.
Status VerifySocial(Database& db, const SocialData& data, int samples);

}  // namespace farpool::workloads
