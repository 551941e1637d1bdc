// `farpool bench txn`: see src/bench/txn_bench.h (and src/workloads/bank.h, tpcb.h).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/txn_bench.h"
#include "cli/commands.h"

namespace farpool::cli {
namespace {

struct TxnArgs : DbBenchArgs {
  TxnBenchOptions o;
};

int RunTxn(TxnArgs& a) {
  auto engine = ParseDbBenchEngine(a, a.o.cluster_file);
  if (!engine.ok()) return Fail("bench txn: " + engine.status().message());
  a.o.engine = *engine;
  auto r = RunTxnBench(a.o);
  if (!r.ok()) {
    // A client process tells its parent why, on the pipe its result would have taken.
    if (a.o.client_id >= 0)
      std::printf("%s\n", nlohmann::json{{"error", r.status().ToString()}}.dump().c_str());
    return Fail("bench txn: " + r.status().message());
  }
  if (a.json || a.o.client_id >= 0) {
    std::printf("%s\n", r->dump().c_str());
  } else {
    const auto& j = *r;
    std::printf(
        "%s %s: %d clients x %d threads: %.0f txn/s, p50 %.1f us, p99 %.1f us, abort rate "
        "%.3f, per txn %.1f round trips, %.1f reads %.1f writes %.1f cas %.1f faa%s\n",
        a.engine.c_str(), a.o.workload.c_str(), a.o.clients, a.o.threads, j["tps"].get<double>(),
        j["p50_us"].get<double>(), j["p99_us"].get<double>(), j["abort_rate"].get<double>(),
        j["round_trips_per_txn"].get<double>(), j["reads_per_txn"].get<double>(),
        j["writes_per_txn"].get<double>(), j["cas_per_txn"].get<double>(),
        j["faa_per_txn"].get<double>(), j.contains("verify") ? "; invariant verified" : "");
    // Under snapshot isolation a hot row (TPC-B's branch at a small scale) aborts every
    // commit but the first that writes it; locking reads wait for it instead.
    if (j["abort_rate"].get<double>() > 0.2 && a.o.isolation == "si" && !a.o.for_update) {
      std::fprintf(stderr,
                   "bench txn: %.0f%% of the transactions aborted on write conflicts; "
                   "--for-update (or --isolation rc) locks the rows they read and write, so "
                   "they wait instead (docs/database.md \"Locking reads and read committed\")\n",
                   100 * j["abort_rate"].get<double>());
    }
  }
  if (r->contains("clients_failed")) {
    // Reported and verified around, but a run with a failed client is no clean run.
    return Fail("bench txn: client processes failed: " + (*r)["clients_failed"].dump());
  }
  return 0;
}

}  // namespace

Command RegisterTxnBench(CLI::App& bench) {
  auto a = std::make_shared<TxnArgs>();
  CLI::App* txn = bench.add_subcommand("txn", "Transactions on the database: bank or tpcb");
  AddDbBenchOptions(txn, a.get(), &a->o.cluster_file, &a->o.seconds, &a->o.warmup_seconds,
                    &a->o.seed);
  txn->add_option("--workload", a->o.workload, "bank or tpcb");
  txn->add_option("--clients", a->o.clients, "Client processes");
  txn->add_option("--threads", a->o.threads, "Threads (sessions) per client process");
  txn->add_option("--accounts", a->o.accounts, "bank: number of accounts");
  txn->add_option("--scale", a->o.scale, "tpcb: scale factor (100000 accounts each)");
  txn->add_option("--history-keep", a->o.history_keep,
                  "tpcb: keep the last N history rows per thread (delete older; 0: keep all)");
  txn->add_option("--isolation", a->o.isolation,
                  "si (snapshot isolation, default) or rc (read committed; bank and tpcb read "
                  "their rows for update)");
  txn->add_flag("--for-update", a->o.for_update,
                "bank, tpcb: read the rows a transaction writes for update (LockIntent::kUpdate) "
                "under si too (always under rc)");
  txn->add_flag("--verify", a->o.verify, "Check the workload's invariant at the end");
  txn->add_option("--timeline-ms", a->o.timeline_ms,
                  "Also count commits per this many ms from the common start (JSON timeline)");
  txn->add_option("--client-id", a->o.client_id, "(internal) client process number")->group("");
  txn->add_option("--start-at", a->o.start_at_ms, "(internal) common start, steady clock ms")
      ->group("");
  return {txn, [a] { return RunTxn(*a); }};
}

}  // namespace farpool::cli
