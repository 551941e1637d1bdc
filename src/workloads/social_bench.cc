#include "workloads/social_bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "bench/histogram.h"
#include "bench/run_context.h"

namespace farpool::workloads {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A kind of operation (one query, or the writes): its latencies and the round trips of the
// measured ones.
struct OpStats {
  Histogram latency;
  uint64_t round_trips = 0;
  void Merge(const OpStats& o) {
    latency.Merge(o.latency);
    round_trips += o.round_trips;
  }
};

struct FlowStats {
  std::vector<OpStats> per_query = std::vector<OpStats>(kSocialQueries);
  OpStats writes;
  Status status;
};

// Runs `flows` threads for warmup + seconds; `op(session, rng, flow, &query)` runs one
// operation and says which query it was (0 for a write).
Result<std::vector<FlowStats>> RunFlows(
    Database& db, const SocialBenchOptions& o,
    const std::function<Status(Session&, std::mt19937_64&, int, int*)>& op) {
  std::vector<FlowStats> stats(o.flows);
  std::vector<std::thread> threads;
  const uint64_t clock_ns = ClockOverheadNs();
  // One measured window for every flow, so the sum of queries in it is a throughput.
  // With a common start (several processes), the window starts at start_at + warmup on the
  // system clock, translated to this process's steady clock.
  auto start = Clock::now() + std::chrono::milliseconds(200);
  if (o.start_at_ms > 0) {
    const auto sys_now = std::chrono::system_clock::now();
    const auto sys_start =
        std::chrono::system_clock::time_point(std::chrono::milliseconds(o.start_at_ms));
    start = Clock::now() + std::chrono::duration_cast<Clock::duration>(sys_start - sys_now);
  }
  const auto from = start + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(o.warmup_seconds));
  const auto until =
      from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  for (int f = 0; f < o.flows; ++f) {
    threads.emplace_back([&, f] {
      FlowStats& st = stats[f];
      auto session = db.NewSession();
      if (!session.ok()) {
        st.status = session.status();
        return;
      }
      std::mt19937_64 rng(o.seed * 7919 + f);
      for (;;) {
        const auto t0 = Clock::now();
        if (t0 >= until) break;
        int q = 0;
        const uint64_t rt0 = (*session)->counters().round_trips;
        Status s = op(**session, rng, f, &q);
        const auto t1 = Clock::now();
        if (!s.ok()) {
          st.status = s;
          return;
        }
        if (t0 >= from && t1 <= until) {
          const uint64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
          OpStats& kind = q == 0 ? st.writes : st.per_query[q - 1];
          kind.latency.Record(ns > clock_ns ? ns - clock_ns : 0);
          kind.round_trips += (*session)->counters().round_trips - rt0;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& st : stats) FARPOOL_RETURN_IF_ERROR(st.status);
  return stats;
}

nlohmann::json Summary(const OpStats& o, double seconds) {
  const Histogram& h = o.latency;
  return {{"count", h.count()},
          {"qps", h.count() / seconds},
          {"p50_us", h.Percentile(0.5) / 1000.0},
          {"p99_us", h.Percentile(0.99) / 1000.0},
          {"p999_us", h.Percentile(0.999) / 1000.0},
          {"mean_us", h.mean() / 1000.0},
          {"round_trips_per_query", h.count() > 0 ? double(o.round_trips) / h.count() : 0.0}};
}

}  // namespace

Status VerifySocial(Database& db, const SocialData& data, int samples) {
  FARPOOL_ASSIGN_OR_RETURN(SocialTables t, OpenSocialTables(db));
  FARPOOL_ASSIGN_OR_RETURN(auto session, db.NewSession());
  std::vector<uint64_t> users, mids;
  SocialSample(data, samples, &users, &mids);
  const auto expect = data.Expect(users, mids);
  for (size_t i = 0; i < users.size(); ++i) {
    for (int q = 1; q <= kSocialQueries; ++q) {
      const int64_t param = int64_t(q == 5 ? mids[i] : users[i]);
      Answer got;
      FARPOOL_RETURN_IF_ERROR(RunSocialQuery(*session, t, SocialQuery(q), param, &got));
      const Answer& want = expect[i][q - 1];
      if (!(got == want)) {
        return Status::Internal("social verify: q" + std::to_string(q) + "(" +
                                std::to_string(param) + ") returned " + std::to_string(got.rows) +
                                " rows (checksum " + std::to_string(got.checksum) + "), expected " +
                                std::to_string(want.rows) + " rows (checksum " +
                                std::to_string(want.checksum) + ")");
      }
    }
  }
  return Status::Ok();
}

// An attached process cannot see the generator's parameters in the database: check that the
// user ids end where this --scale says they do (cheap, catches a wrong --scale).
Status CheckLoadedScale(Database& db, const SocialTables& t, const SocialData& data) {
  FARPOOL_ASSIGN_OR_RETURN(auto session, db.NewSession());
  FARPOOL_ASSIGN_OR_RETURN(auto txn, session->Begin());
  Row row(t.users->schema());
  Status last = txn->Get(*t.users, int64_t(data.users()) - 1, &row);
  Status past = txn->Get(*t.users, int64_t(data.users()), &row);
  txn->Rollback();
  if (!last.ok() && last.code() != StatusCode::kNotFound) return last;
  if (!past.ok() && past.code() != StatusCode::kNotFound) return past;
  if (!last.ok() || past.ok()) {
    return Status::InvalidArgument("--attach: the loaded social network does not have " +
                                   std::to_string(data.users()) +
                                   " users: use the --scale (and --seed) it was loaded with");
  }
  return Status::Ok();
}

Result<nlohmann::json> RunSocialBench(const SocialBenchOptions& in) {
  SocialBenchOptions o = in;
  if (o.flows < 1) return Status::InvalidArgument("--flows must be at least 1");
  if (o.scale < 0.1) return Status::InvalidArgument("--scale must be at least 0.1 (100 users)");
  if (o.write_pct < 0 || o.write_pct > 100)
    return Status::InvalidArgument("--writes is a percentage 0..100");
  if (o.attach && o.load_only)
    return Status::InvalidArgument("--attach and --load-only exclude each other");
  if ((o.attach || o.load_only) && o.engine == Engine::kLocal) {
    return Status::InvalidArgument(
        "--attach/--load-only need a database that outlives the process (pool, or sharded with "
        "--cluster); the local engine is this process's RAM");
  }
  if (o.client_id < 0 || o.client_id >= 64 || o.flows > 256) {
    return Status::InvalidArgument(
        "--client-id is 0..63 and --flows at most 256 (message ids of the write mix)");
  }
  if (o.queries.empty()) {
    for (int q = 1; q <= kSocialQueries; ++q) o.queries.push_back(SocialQuery(q));
  }
  DatabaseOptions dopts;
  dopts.engine = o.engine;
  dopts.cluster_file = o.cluster_file;
  dopts.local_memory = o.local_memory;
  dopts.max_sessions = std::max<uint32_t>(256, uint32_t(o.flows + o.load_threads + 8));
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(dopts));
  const SocialData data(o.scale, o.seed);
  SocialTables tables;
  if (o.attach) {
    auto opened = OpenSocialTables(*db);
    if (!opened.ok()) {
      return Status::NotFound("--attach: no social network in this cluster (" +
                              opened.status().message() + "): load one first with --load-only");
    }
    tables = *opened;
    FARPOOL_RETURN_IF_ERROR(CheckLoadedScale(*db, tables, data));
  } else {
    auto names = db->ListTables();
    if (names.ok() && !names->empty()) {
      return Status::InvalidArgument(
          "the cluster already holds a database (tables: " + (*names)[0] +
          ", ...): start a fresh cluster for each benchmark run, or "
          "--attach to run on the loaded social network");
    }
  }
  const auto load_start = Clock::now();
  auto last_print = load_start;
  uint64_t rows_loaded = 0;
  bool finished = false;
  // On a terminal one line redrawn in place twice a second; into a file or a pipe (logs, the
  // Python harness) a plain line every 10 s, so the log stays readable.
  const bool terminal = isatty(STDERR_FILENO) == 1;
  const auto interval = terminal ? std::chrono::milliseconds(500) : std::chrono::seconds(10);
  auto progress = [&](uint64_t done, uint64_t total) {
    rows_loaded = done;
    const auto now = Clock::now();
    if (!o.progress || finished) return;
    if (done < total && now - last_print < interval) return;
    finished = done >= total;
    last_print = now;
    const double s = Seconds(now - load_start);
    std::fprintf(stderr, "%s  loading %s: %5.1f%% of %llu rows, %.0f rows/s, %.0f s%s",
                 terminal ? "\r" : "", std::string(EngineName(o.engine)).c_str(),
                 100.0 * done / total, static_cast<unsigned long long>(total),
                 done / std::max(s, 1e-3), s, terminal && done < total ? "" : "\n");
    std::fflush(stderr);
  };
  if (!o.attach) {
    FARPOOL_ASSIGN_OR_RETURN(tables, LoadSocial(*db, data, o.load_threads, progress));
  }
  const double load_seconds = o.attach ? 0.0 : Seconds(Clock::now() - load_start);

  nlohmann::json r = RunContext();
  r["bench"] = "social";
  r["engine"] = std::string(EngineName(o.engine));
  r["scale"] = o.scale;
  r["users"] = data.users();
  r["groups"] = data.groups();
  r["messages"] = data.messages();
  r["rows"] = rows_loaded;
  r["load_seconds"] = load_seconds;
  r["flows"] = o.flows;
  r["seconds"] = o.seconds;
  r["seed"] = o.seed;
  r["attach"] = o.attach;
  r["client_id"] = o.client_id;
  if (o.verify) {
    Status v = VerifySocial(*db, data, o.samples);
    if (!v.ok()) return v;
    r["verify"] = "ok";
  }
  if (o.load_only) {
    r["mode"] = "load";
    r["queries"] = nlohmann::json::array();
    return r;
  }
  const int64_t users = int64_t(data.users()), messages = int64_t(data.messages());
  auto param = [&](SocialQuery q, std::mt19937_64& rng) {
    return q == SocialQuery::kText ? int64_t(rng() % messages) : int64_t(rng() % users);
  };
  nlohmann::json per = nlohmann::json::array();
  if (!o.mix) {
    r["mode"] = "queries";
    for (SocialQuery q : o.queries) {
      FARPOOL_ASSIGN_OR_RETURN(
          auto stats, RunFlows(*db, o, [&](Session& s, std::mt19937_64& rng, int, int* which) {
            *which = int(q);
            Answer a;
            return RunSocialQuery(s, tables, q, param(q, rng), &a);
          }));
      OpStats h;
      for (auto& st : stats) h.Merge(st.per_query[int(q) - 1]);
      nlohmann::json j = Summary(h, o.seconds);
      j["query"] = std::string(SocialQueryName(q));
      j["description"] = std::string(SocialQueryDescription(q));
      per.push_back(j);
    }
  } else {
    r["mode"] = "mix";
    r["write_pct"] = o.write_pct;
    std::vector<std::atomic<uint64_t>> next_mid(o.flows);
    FARPOOL_ASSIGN_OR_RETURN(
        auto stats,
        RunFlows(*db, o, [&](Session& s, std::mt19937_64& rng, int flow, int* which) -> Status {
          if (o.write_pct > 0 && double(rng() % 1000000) < o.write_pct * 10000) {
            *which = 0;
            if (rng() & 1) return MarkRead(s, tables, int64_t(rng() % messages));
            Message m = data.GetMessage(rng() % messages);  // a realistic shape, new id and time
            // Disjoint ids for every flow of every process: 2^21 posts per flow and run, 256
            // flows per process, 64 client ids (all below 2^36 with the generated messages).
            const int64_t n = int64_t(next_mid[flow]++);
            if (n >= (int64_t(1) << 21)) {
              return Status::InvalidArgument(
                  "write mix: more than 2^21 posts by one flow in one run "
                  "(fewer --seconds or --writes)");
            }
            m.mid = messages + ((int64_t(o.client_id) * 256 + flow) << 21) + n;
            m.sender = int64_t(rng() % users);
            m.time = m.mid + 1600000000;
            m.is_read = 0;
            return PostMessage(s, tables, m);
          }
          const SocialQuery q = o.queries[rng() % o.queries.size()];
          *which = int(q);
          Answer a;
          return RunSocialQuery(s, tables, q, param(q, rng), &a);
        }));
    OpStats all, writes;
    for (SocialQuery q : o.queries) {
      OpStats h;
      for (auto& st : stats) h.Merge(st.per_query[int(q) - 1]);
      all.Merge(h);
      nlohmann::json j = Summary(h, o.seconds);
      j["query"] = std::string(SocialQueryName(q));
      j["description"] = std::string(SocialQueryDescription(q));
      per.push_back(j);
    }
    for (auto& st : stats) writes.Merge(st.writes);
    r["all"] = Summary(all, o.seconds);
    r["writes"] = Summary(writes, o.seconds);
    r["qps"] = all.latency.count() / o.seconds;
  }
  r["queries"] = per;
  return r;
}

}  // namespace farpool::workloads
