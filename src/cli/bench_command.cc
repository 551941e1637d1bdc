// `farpool bench ops`: see src/bench/ops_bench.h for the workload.
#include <cstdio>
#include <memory>

#include "bench/ops_bench.h"
#include "cli/commands.h"
#include "common/units.h"

namespace farpool::cli {
namespace {

struct BenchArgs {
  OpsBenchOptions ops;
  std::string size = "64";
  std::string working_set = "16MiB";
  std::string transport;
  bool no_direct = false;
  std::string remote_access = "auto";
  bool json = false;
};

int RunOps(BenchArgs& a) {
  if (a.ops.cluster_file.empty() && !a.ops.local_memory) {
    return Fail("bench ops: --cluster FILE is required (or --local for the local-memory baseline)");
  }
  auto size = ParseSize(a.size);
  if (!size.ok()) return Fail("--size: " + size.status().message());
  a.ops.size = *size;
  auto ws = ParseSize(a.working_set);
  if (!ws.ok()) return Fail("--working-set: " + ws.status().message());
  a.ops.working_set = *ws;
  if (!a.transport.empty()) {
    auto f = ParseFabric(a.transport);
    if (!f.ok()) return Fail("--transport: " + f.status().message());
    a.ops.transport = *f;
  }
  a.ops.direct_access = !a.no_direct;
  auto remote = ParseRemoteAccess(a.remote_access);
  if (!remote.ok()) return Fail("--remote-access: " + remote.status().message());
  a.ops.remote_access = *remote;
  auto result = RunOpsBench(a.ops);
  if (!result.ok()) return Fail("bench ops: " + result.status().message());
  const auto& r = *result;
  if (a.json) {
    std::printf("%s\n", r.dump().c_str());
  } else {
    std::printf(
        "%s %s B x%d threads, batch %d, %s (%s): %.0f ops/s, p50 %.3f us, p99 %.3f us, "
        "p99.9 %.3f us\n",
        r["op"].get<std::string>().c_str(), std::to_string(r["size"].get<uint64_t>()).c_str(),
        a.ops.threads, a.ops.batch, r["transport"].get<std::string>().c_str(),
        r["path"].get<std::string>().c_str(), r["ops_per_s"].get<double>(),
        r["p50_us"].get<double>(), r["p99_us"].get<double>(), r["p999_us"].get<double>());
  }
  return 0;
}

}  // namespace

Command RegisterBench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Benchmarks");
  sub->require_subcommand(1);
  CLI::App* ops = sub->add_subcommand("ops", "Raw pool operations: read, write, cas, faa");
  ops->add_option("--cluster", args->ops.cluster_file, "cluster.json");
  ops->add_flag("--local", args->ops.local_memory,
                "Run on local memory instead of the pool (baseline; no cluster)");
  ops->add_option("--op", args->ops.op, "read, write, cas or faa");
  ops->add_option("--size", args->size, "Bytes per read/write (atomics are 8 bytes)");
  ops->add_option("--threads", args->ops.threads, "Client threads");
  ops->add_option("--batch", args->ops.batch, "Operations posted per wait");
  ops->add_option("--seconds", args->ops.seconds, "Measured seconds");
  ops->add_option("--warmup", args->ops.warmup_seconds, "Warm-up seconds (not measured)");
  ops->add_option("--working-set", args->working_set, "Bytes of objects per thread");
  ops->add_option("--seed", args->ops.seed, "Random seed");
  ops->add_option("--transport", args->transport, "Override the cluster's fabric: auto, shm, tcp");
  ops->add_flag("--no-direct", args->no_direct, "Use UCX operations even where mapping works");
  ops->add_option("--remote-access", args->remote_access,
                  "Unmapped servers: auto, one-sided (UCX get/put/atomics) or messages "
                  "(a batch per message, executed by the server)");
  ops->add_flag("--verify", args->ops.verify, "Check reads and atomics against a shadow");
  ops->add_flag("--json", args->json, "Print one JSON object");
  Command txn = RegisterTxnBench(*sub);
  Command social = RegisterSocialBench(*sub);
  Command tpcw = RegisterTpcwBench(*sub);
  return {sub, [args, ops, txn, social, tpcw] {
            if (ops->parsed()) return RunOps(*args);
            if (txn.app->parsed()) return txn.run();
            if (social.app->parsed()) return social.run();
            if (tpcw.app->parsed()) return tpcw.run();
            return Fail("bench: expected ops or txn");
          }};
}

}  // namespace farpool::cli
