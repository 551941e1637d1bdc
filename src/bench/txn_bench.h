// `farpool bench txn`: transactions per second of the database on each engine.
//
// Workloads (src/workloads: schema, transaction and invariant in each header; fixed seed per
// thread; keys uniform at random):
//   bank   workloads/bank.h: `accounts` accounts; a transfer of a random amount between two
//          random accounts. --verify: the total is conserved.
//   tpcb   workloads/tpcb.h: pgbench's TPC-B-like schema and transaction at scale factor S
//          (S branches, 10·S tellers, 100000·S accounts, history); a random account, teller
//          and its branch, delta uniform in [-5000, 5000].
//          --history-keep N (not pgbench; for soaks): each thread also deletes the history row
//          it inserted N transactions earlier, so the history table stays at N rows per
//          thread and a run can last for hours in a fixed pool. 0 (default) keeps every row.
//          --verify: sum(accounts) == sum(tellers) == sum(branches).
//          --isolation rc: read committed, the three rows read for update (TpcbTxn::
//          lock_at_read), as pgbench runs; si (default): snapshot isolation, plain reads.
//
// --isolation si|rc sets every transaction's isolation level (db.h Isolation; bank: rc
// validates the two balances read at commit, as si does, so only tpcb differs much).
//
// The first process loads the data (a fresh database: a fresh cluster for pool), then runs
// `clients` client processes (this binary re-run) of `threads` threads each. Every thread has
// its own session; after `warmup` seconds it counts, for `seconds`, the committed
// transactions, the aborts (each retry of an Aborted transaction counts one), the latency of
// each committed transaction including its retries, and the memory operations (pool/local)
// or request messages (sharded) it issued, the round trips they took (round_trips_per_txn:
// sequential waits on the pool or the partitions, see TxnCounters; on the pool engines also
// round_trips_per_txn_by_cause, split by RoundTripCause, and round_trips_aborted_per_txn, the
// part spent in attempts that aborted), and the longest latency of any committed transaction
// (max_us). Per-transaction counts divide by committed transactions, so they include the work
// of aborted attempts. Output: one JSON object (TxnBench fields below
// plus RunContext(), bench/run_context.h).
//
// A client process that fails (a process stalled past its session lease is fenced: the others
// evict it and recover its sessions, and it ends on the refusals) does not end the run: its
// pid, how it ended and its error go into clients_failed, the counts are the other clients',
// and --verify still checks the invariant over what they and recovery left; `farpool bench
// txn` then prints the JSON and exits 1 naming the failed clients (the soak's client-stop
// fault expects exactly its stopped client there). If --verify fails too, the error is the
// verify status with the failed clients named in it ("client processes failed [...]: verify:
// ..."), and no JSON. Every client failing is an error.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "farpool/db.h"
#include "farpool/status.h"

namespace farpool {

struct TxnBenchOptions {
  std::string cluster_file;
  Engine engine = Engine::kPool;
  std::string workload = "bank";
  int clients = 1;
  int threads = 1;
  double seconds = 3.0;
  double warmup_seconds = 0.5;
  uint64_t accounts = 10000;     // bank
  int scale = 1;                 // tpcb
  uint64_t history_keep = 0;     // tpcb: history rows kept per thread (0: all)
  std::string isolation = "si";  // "si" | "rc" (db.h Isolation)
  // tpcb: read the three rows for update (TpcbTxn::lock_at_read) under SI too; always under rc.
  bool for_update = false;
  uint64_t seed = 42;
  bool verify = false;
  // > 0: also count commits per `timeline_ms` milliseconds from the common start, measured on
  // the steady clock (JSON "timeline": start_unix_ms, the start on the wall clock to line it up
  // with logs; bucket_ms; commits[]), e.g. to see a failover's gap. A wall-clock step moves
  // nothing in it.
  uint64_t timeline_ms = 0;
  // Internal: set in client processes started by the benchmark. start_at_ms: the common start
  // on the steady clock (CLOCK_MONOTONIC ms, shared by the processes of this host).
  int client_id = -1;
  uint64_t start_at_ms = 0;
};

Result<nlohmann::json> RunTxnBench(const TxnBenchOptions& options);

}  // namespace farpool
