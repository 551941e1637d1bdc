// `farpool bench social`: see src/workloads/social_bench.h for the workload and the output.
#include <cstdio>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "common/units.h"
#include "workloads/social_bench.h"
#include "workloads/tpcw.h"

namespace farpool::cli {
namespace {

struct SocialArgs : DbBenchArgs {
  workloads::SocialBenchOptions o;
  std::string query = "all";
  std::string local_memory = "4GiB";
  std::string export_dir;
};

int RunSocial(SocialArgs& a) {
  if (!a.export_dir.empty()) {
    if (a.o.scale < 0.1) return Fail("--scale must be at least 0.1");
    workloads::SocialData data(a.o.scale, a.o.seed);
    Status s = workloads::ExportSocialCsv(data, a.export_dir, a.o.samples);
    if (!s.ok()) return Fail("bench social --export: " + s.message());
    std::printf("exported %llu users, %llu groups, %llu messages to %s\n",
                static_cast<unsigned long long>(data.users()),
                static_cast<unsigned long long>(data.groups()),
                static_cast<unsigned long long>(data.messages()), a.export_dir.c_str());
    return 0;
  }
  auto engine = ParseDbBenchEngine(a, a.o.cluster_file);
  if (!engine.ok()) return Fail("bench social: " + engine.status().message());
  a.o.engine = *engine;
  auto mem = ParseSize(a.local_memory);
  if (!mem.ok()) return Fail("--local-memory: " + mem.status().message());
  a.o.local_memory = *mem;
  if (a.query == "mix") {
    a.o.mix = true;
  } else if (a.query != "all") {
    std::stringstream ss(a.query);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto q = workloads::ParseSocialQuery(item);
      if (!q.ok()) return Fail("--query: " + q.status().message() + " (or all, mix)");
      a.o.queries.push_back(*q);
    }
  }
  auto r = workloads::RunSocialBench(a.o);
  if (!r.ok()) return Fail("bench social: " + r.status().message());
  if (a.json) {
    std::printf("%s\n", r->dump().c_str());
    return 0;
  }
  const auto& j = *r;
  std::printf("social network on %s: %llu users, %llu messages, loaded in %.1f s; %d flow(s)%s\n",
              a.engine.c_str(), static_cast<unsigned long long>(j["users"].get<uint64_t>()),
              static_cast<unsigned long long>(j["messages"].get<uint64_t>()),
              j["load_seconds"].get<double>(), a.o.flows,
              j.contains("verify") ? ", answers verified" : "");
  for (const auto& q : j["queries"]) {
    std::printf("  %s %-44s p50 %9.1f us  p99 %9.1f us  %10.0f queries/s  %6.1f round trips\n",
                q["query"].get<std::string>().c_str(), q["description"].get<std::string>().c_str(),
                q["p50_us"].get<double>(), q["p99_us"].get<double>(), q["qps"].get<double>(),
                q["round_trips_per_query"].get<double>());
  }
  if (a.o.load_only) std::printf("  loaded; other processes can --attach\n");
  if (j.contains("qps")) {
    std::printf("  all: %.0f queries/s; writes: %.0f/s\n", j["qps"].get<double>(),
                j["writes"]["qps"].get<double>());
  }
  return 0;
}

struct TpcwArgs : DbBenchArgs {
  workloads::TpcwOptions o;
};

int RunTpcw(TpcwArgs& a) {
  auto engine = ParseDbBenchEngine(a, a.o.cluster_file);
  if (!engine.ok()) return Fail("bench tpcw: " + engine.status().message());
  a.o.engine = *engine;
  auto r = workloads::RunTpcwBench(a.o);
  if (!r.ok()) return Fail("bench tpcw: " + r.status().message());
  if (a.json) {
    std::printf("%s\n", r->dump().c_str());
  } else {
    std::printf(
        "tpcw buy on %s, %d flows: %.0f txn/s, p50 %.1f us, p99 %.1f us, abort rate %.3f, "
        "%.1f round trips per txn%s\n",
        a.engine.c_str(), a.o.flows, (*r)["tps"].get<double>(), (*r)["p50_us"].get<double>(),
        (*r)["p99_us"].get<double>(), (*r)["abort_rate"].get<double>(),
        (*r)["round_trips_per_txn"].get<double>(), a.o.verify ? ", verified" : "");
  }
  return 0;
}

}  // namespace

Command RegisterTpcwBench(CLI::App& bench) {
  auto a = std::make_shared<TpcwArgs>();
  CLI::App* c = bench.add_subcommand("tpcw", "TPC-W buy-like distributed transaction (seed 004)");
  AddDbBenchOptions(c, a.get(), &a->o.cluster_file, &a->o.seconds, &a->o.warmup_seconds,
                    &a->o.seed);
  c->add_option("--customers", a->o.customers, "Customers (each with a cart of 1..5 lines)");
  c->add_option("--items", a->o.items, "Items");
  c->add_option("--flows", a->o.flows, "Clients (threads, one session each)");
  c->add_flag("--verify", a->o.verify, "Check stock against order lines afterwards");
  c->add_flag("--for-update", a->o.for_update,
              "Read the customer, its cart and the items for update (LockIntent::kUpdate)");
  return {c, [a] { return RunTpcw(*a); }};
}

Command RegisterSocialBench(CLI::App& bench) {
  auto a = std::make_shared<SocialArgs>();
  CLI::App* c =
      bench.add_subcommand("social", "The MEMSCALE social network: six queries, write mix");
  AddDbBenchOptions(c, a.get(), &a->o.cluster_file, &a->o.seconds, &a->o.warmup_seconds,
                    &a->o.seed);
  c->add_option("--scale", a->o.scale, "1000 users (10000 messages) per unit; >= 0.1");
  c->add_option("--query", a->query, "all, mix, or a list: q1,q4");
  c->add_option("--flows", a->o.flows, "Concurrent query flows (threads, one session each)");
  c->add_option("--writes", a->o.write_pct, "mix: percent of operations that write");
  c->add_option("--load-threads", a->o.load_threads, "Sessions loading the data");
  c->add_option("--local-memory", a->local_memory, "local engine: bytes per simulated server")
      ->check(SizeValidator);
  c->add_flag("--verify", a->o.verify, "Check query answers against the generator after loading");
  c->add_option("--samples", a->o.samples, "Users (and messages) checked by --verify / exported");
  c->add_option("--export", a->export_dir, "Write the generated data as CSV to DIR and exit");
  c->add_flag("--attach", a->o.attach,
              "Run on the social network already loaded in the cluster (same --scale, --seed)");
  c->add_flag("--load-only", a->o.load_only, "Create and load (and --verify), then exit");
  c->add_option("--start-at", a->o.start_at_ms,
                "Common start of several processes (Unix time in ms; warm-up from there)");
  c->add_option("--client-id", a->o.client_id, "This process's number (disjoint ids for writes)");
  return {c, [a] { return RunSocial(*a); }};
}

}  // namespace farpool::cli
