#include "bench/txn_bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <deque>
#include <random>
#include <span>
#include <thread>
#include <unordered_set>
#include <vector>

#include "bench/run_context.h"
#include "workloads/bank.h"
#include "workloads/tpcb.h"

namespace farpool {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t WallMs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

// The common start and the timeline are on the steady clock (CLOCK_MONOTONIC: one clock for
// every process of this host, where the bench forks its client processes): a step of the wall
// clock moved them (a client whose clock stepped back an hour before the start waited an hour;
// after a step back every commit fell outside the timeline, after a step forward an hour later).
uint64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

// A benchmark counts aborts rather than giving up: retry (practically) forever.
constexpr int kAttempts = 1 << 30;

// The tables of either workload (bank uses `accounts` only).
struct Tables {
  const Table* accounts = nullptr;
  workloads::TpcbTables tpcb;
};

Result<Tables> Load(Database& db, const TxnBenchOptions& o) {
  Tables t;
  if (o.workload == "bank") {
    FARPOOL_ASSIGN_OR_RETURN(t.accounts, workloads::LoadBank(db, o.accounts));
  } else {
    FARPOOL_ASSIGN_OR_RETURN(t.tpcb, workloads::LoadTpcb(db, o.scale));
  }
  return t;
}

Result<Tables> OpenTables(Database& db, const std::string& workload) {
  Tables t;
  if (workload == "bank") {
    FARPOOL_ASSIGN_OR_RETURN(t.accounts, workloads::OpenBank(db));
  } else {
    FARPOOL_ASSIGN_OR_RETURN(t.tpcb, workloads::OpenTpcb(db));
  }
  return t;
}

void AddInto(std::vector<uint64_t>& total, const std::vector<uint64_t>& more) {
  if (total.size() < more.size()) total.resize(more.size());
  for (size_t i = 0; i < more.size(); ++i) total[i] += more[i];
}

// Sessions a thread may give up to Unavailable errors (a server failing over under it: a read
// in flight then fails once; a commit it cuts settles itself, docs/database.md) within
// kRestartWindow before the run fails: a rate, not a total, so that a long run with a fault
// every few minutes (the network soak) goes on while a failover that never lands still ends
// it. As a total it ended a 50-minute soak with a fault every 2 minutes
// (bench/results/soak_hour.md).
constexpr size_t kMaxSessionRestarts = 16;
constexpr std::chrono::seconds kRestartWindow{60};

TxnCounters Sum(const TxnCounters& a, const TxnCounters& b) {
  TxnCounters c;
  c.reads = a.reads + b.reads;
  c.writes = a.writes + b.writes;
  c.cas = a.cas + b.cas;
  c.faa = a.faa + b.faa;
  c.messages = a.messages + b.messages;
  c.round_trips = a.round_trips + b.round_trips;
  for (size_t i = 0; i < kRoundTripCauses; ++i)
    c.round_trips_by_cause[i] = a.round_trips_by_cause[i] + b.round_trips_by_cause[i];
  c.round_trips_aborted = a.round_trips_aborted + b.round_trips_aborted;
  c.commits = a.commits + b.commits;
  c.aborts = a.aborts + b.aborts;
  c.commits_cut = a.commits_cut + b.commits_cut;
  return c;
}

struct ThreadStats {
  uint64_t commits = 0, aborts = 0;
  TxnCounters ops_start, ops_end;
  std::vector<uint32_t> latency_ns;  // sampled
  uint64_t max_ns = 0;               // every committed transaction, retries included
  uint64_t session_restarts = 0;     // sessions given up after a server failed over
  std::vector<uint64_t> timeline;    // commits per TxnBenchOptions::timeline_ms from the start
  Status status;
};

// Runs this process's threads from `start_ms` (SteadyMs()) on; returns raw stats as JSON
// (merged by the parent).
Result<nlohmann::json> RunClient(Database& db, const TxnBenchOptions& o, uint64_t start_ms) {
  FARPOOL_ASSIGN_OR_RETURN(Tables tables, OpenTables(db, o.workload));
  FARPOOL_ASSIGN_OR_RETURN(const Isolation isolation, ParseIsolation(o.isolation));
  const TransactionOptions txn_options{isolation};
  // Rows a transaction writes are read for update (LockIntent::kUpdate for bank, tpcb's intent).
  const bool lock_at_read = o.for_update || isolation == Isolation::kReadCommitted;
  const int cid = std::max(0, o.client_id);
  std::vector<ThreadStats> stats(o.threads);
  std::vector<std::thread> threads;
  for (int th = 0; th < o.threads; ++th) {
    threads.emplace_back([&, th] {
      ThreadStats& st = stats[th];
      auto session = db.NewSession();
      if (!session.ok()) {
        st.status = session.status();
        return;
      }
      std::unique_ptr<Session> owned = std::move(*session);
      Session* current = owned.get();
      // The counters of sessions this thread gave up (a server failed over under them).
      TxnCounters retired{};
      std::mt19937_64 rng(o.seed * 1000003 + cid * 1009 + th);
      const uint64_t na =
          o.workload == "bank" ? o.accounts : workloads::kTpcbAccountsPerBranch * o.scale;
      uint64_t history_seq = 0;
      // History keys of transactions that ended Unavailable: whether their row exists is not
      // known here (TpcbTxn::drop_may_be_absent). At most one per session restart.
      std::unordered_set<int64_t> uncertain_history;
      int64_t history_key = -1;                // of the TPC-B transaction last run
      std::deque<Clock::time_point> restarts;  // within the last kRestartWindow
      while (SteadyMs() < start_ms) std::this_thread::sleep_for(std::chrono::microseconds(200));
      const auto begin = Clock::now();
      const auto measure_from = begin + std::chrono::duration<double>(o.warmup_seconds);
      const auto until = measure_from + std::chrono::duration<double>(o.seconds);
      bool measuring = false;
      uint64_t aborts_before = 0;
      for (;;) {
        const auto now = Clock::now();
        if (now >= until) break;
        if (!measuring && now >= measure_from) {
          measuring = true;
          st.ops_start = Sum(retired, current->counters());
          aborts_before = st.ops_start.aborts;
        }
        Status r;
        const auto t0 = Clock::now();
        if (o.workload == "bank") {
          const int64_t from = rng() % na, to = rng() % na;
          const int64_t amount = 1 + rng() % 100;
          r = RunTransaction(
              *current, txn_options,
              [&](Transaction& txn) {
                return workloads::BankTransfer(txn, *tables.accounts, from, to, amount,
                                               lock_at_read);
              },
              kAttempts);
        } else {
          workloads::TpcbTxn p;
          p.aid = rng() % na;
          p.tid = rng() % (workloads::kTpcbTellersPerBranch * o.scale);
          p.bid = p.tid / workloads::kTpcbTellersPerBranch;
          p.delta = static_cast<int64_t>(rng() % 10001) - 5000;
          p.history_key = (int64_t(cid) << 48) | (int64_t(th) << 36) | int64_t(history_seq++);
          p.drop_history_key = o.history_keep == 0 || history_seq <= o.history_keep
                                   ? -1
                                   : p.history_key - int64_t(o.history_keep);
          p.drop_may_be_absent = uncertain_history.erase(p.drop_history_key) > 0;
          history_key = p.history_key;
          p.mtime_ms = static_cast<int64_t>(WallMs());
          p.lock_at_read = lock_at_read;
          r = RunTransaction(
              *current, txn_options,
              [&](Transaction& txn) { return workloads::TpcbTransaction(txn, tables.tpcb, p); },
              kAttempts);
        }
        const auto t1 = Clock::now();
        while (!restarts.empty() && t1 - restarts.front() > kRestartWindow) restarts.pop_front();
        if (!r.ok() && r.code() == StatusCode::kUnavailable &&
            restarts.size() < kMaxSessionRestarts) {
          // A server failed over to its backup under the transaction's reads (replicas 1; a
          // commit it cut has settled itself: committed, or Aborted and retried), or the session
          // could not settle its commit and stopped (recovery finishes it after its lease). The
          // thread goes on with a new session (docs/pool.md, Replication). Not after Evicted:
          // others fenced this process off the pool for good, and the client ends with it.
          std::fprintf(stderr, "bench txn: thread %d opens a new session after: %s\n", th,
                       r.ToString().c_str());
          if (history_key >= 0) uncertain_history.insert(history_key);
          retired = Sum(retired, current->counters());
          std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let the failover land
          auto fresh = db.NewSession();
          // Claiming a slot fails too while the failover lands (a primary whose backup died
          // serves nothing until a client tells it to go on alone): tried for up to 2 s.
          for (int i = 0;
               i < 40 && !fresh.ok() && fresh.status().code() == StatusCode::kUnavailable; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            fresh = db.NewSession();
          }
          if (fresh.ok()) {
            ++st.session_restarts;
            restarts.push_back(t1);
            owned = std::move(*fresh);
            current = owned.get();
            continue;
          }
          // Why the thread ends is the new session's failure (a server this process took for
          // gone and nobody failed over), not only the transaction's that led to it.
          r = fresh.status().WithContext("opening a new session after \"" + r.ToString() + "\"");
        }
        if (!r.ok()) {
          st.status = r;
          return;
        }
        if (o.timeline_ms > 0) {
          const uint64_t bucket = (SteadyMs() - start_ms) / o.timeline_ms;
          if (bucket < (1u << 20)) {
            if (st.timeline.size() <= bucket) st.timeline.resize(bucket + 1);
            ++st.timeline[bucket];
          }
        }
        if (measuring && t1 <= until) {
          ++st.commits;
          st.max_ns = std::max<uint64_t>(
              st.max_ns, std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
          if (st.latency_ns.size() < 200000) {
            st.latency_ns.push_back(static_cast<uint32_t>(std::min<int64_t>(
                UINT32_MAX,
                std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count())));
          }
        }
      }
      st.ops_end = Sum(retired, current->counters());
      st.aborts = st.ops_end.aborts - aborts_before;
    });
  }
  for (auto& t : threads) t.join();
  nlohmann::json out;
  uint64_t commits = 0, aborts = 0, reads = 0, writes = 0, cas = 0, faa = 0, messages = 0,
           round_trips = 0, session_restarts = 0, commits_cut = 0, round_trips_aborted = 0;
  std::array<uint64_t, kRoundTripCauses> by_cause{};
  std::vector<uint32_t> lat;
  uint64_t max_ns = 0;
  std::vector<uint64_t> timeline;
  for (auto& st : stats) {
    FARPOOL_RETURN_IF_ERROR(st.status);
    AddInto(timeline, st.timeline);
    max_ns = std::max(max_ns, st.max_ns);
    commits += st.commits;
    aborts += st.aborts;
    session_restarts += st.session_restarts;
    reads += st.ops_end.reads - st.ops_start.reads;
    writes += st.ops_end.writes - st.ops_start.writes;
    cas += st.ops_end.cas - st.ops_start.cas;
    faa += st.ops_end.faa - st.ops_start.faa;
    messages += st.ops_end.messages - st.ops_start.messages;
    round_trips += st.ops_end.round_trips - st.ops_start.round_trips;
    for (size_t i = 0; i < kRoundTripCauses; ++i)
      by_cause[i] += st.ops_end.round_trips_by_cause[i] - st.ops_start.round_trips_by_cause[i];
    round_trips_aborted += st.ops_end.round_trips_aborted - st.ops_start.round_trips_aborted;
    commits_cut += st.ops_end.commits_cut - st.ops_start.commits_cut;
    lat.insert(lat.end(), st.latency_ns.begin(), st.latency_ns.end());
  }
  out["commits"] = commits;
  out["aborts"] = aborts;
  out["reads"] = reads;
  out["writes"] = writes;
  out["cas"] = cas;
  out["faa"] = faa;
  out["messages"] = messages;
  out["session_restarts"] = session_restarts;
  out["commits_cut"] = commits_cut;
  out["timeline"] = timeline;
  out["round_trips"] = round_trips;
  out["round_trips_aborted"] = round_trips_aborted;
  nlohmann::json causes = nlohmann::json::object();
  for (size_t i = 0; i < kRoundTripCauses; ++i)
    causes[std::string(RoundTripCauseName(static_cast<RoundTripCause>(i)))] = by_cause[i];
  out["round_trips_by_cause"] = causes;
  out["latency_ns"] = lat;
  out["max_ns"] = max_ns;
  return out;
}

Status Verify(Database& db, const TxnBenchOptions& o) {
  FARPOOL_ASSIGN_OR_RETURN(Tables t, OpenTables(db, o.workload));
  FARPOOL_ASSIGN_OR_RETURN(auto session, db.NewSession());
  if (o.workload == "bank") return workloads::VerifyBank(*session, *t.accounts, o.accounts);
  return workloads::VerifyTpcb(*session, t.tpcb, o.scale);
}

double Percentile(std::vector<uint32_t>& v, double q) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i] / 1000.0;
}

std::vector<std::string> ChildArgs(const TxnBenchOptions& o, int id, uint64_t start_ms) {
  std::vector<std::string> args{"farpool",
                                "bench",
                                "txn",
                                "--cluster",
                                o.cluster_file,
                                "--engine",
                                std::string(EngineName(o.engine)),
                                "--workload",
                                o.workload,
                                "--threads",
                                std::to_string(o.threads),
                                "--seconds",
                                std::to_string(o.seconds),
                                "--warmup",
                                std::to_string(o.warmup_seconds),
                                "--accounts",
                                std::to_string(o.accounts),
                                "--scale",
                                std::to_string(o.scale),
                                "--history-keep",
                                std::to_string(o.history_keep),
                                "--isolation",
                                o.isolation,
                                "--seed",
                                std::to_string(o.seed),
                                "--timeline-ms",
                                std::to_string(o.timeline_ms),
                                "--client-id",
                                std::to_string(id),
                                "--start-at",
                                std::to_string(start_ms)};
  if (o.for_update) args.push_back("--for-update");
  return args;
}

}  // namespace

Result<nlohmann::json> RunTxnBench(const TxnBenchOptions& o) {
  if (o.workload != "bank" && o.workload != "tpcb") {
    return Status::InvalidArgument("unknown workload '" + o.workload + "' (expected bank or tpcb)");
  }
  FARPOOL_RETURN_IF_ERROR(ParseIsolation(o.isolation).status());
  if (o.clients < 1 || o.threads < 1)
    return Status::InvalidArgument("--clients and --threads must be at least 1");
  if (o.engine == Engine::kLocal && o.clients > 1) {
    return Status::InvalidArgument(
        "the local engine is one process's RAM: use --clients 1 (and --threads)");
  }
  if (o.engine == Engine::kSharded && o.clients > 1 && o.cluster_file.empty()) {
    return Status::InvalidArgument(
        "sharded without --cluster runs its partitions inside this process: use --clients 1, or "
        "start `farpool shard-cluster up` and pass its cluster.json");
  }
  DatabaseOptions dopts;
  dopts.engine = o.engine;
  dopts.cluster_file = o.cluster_file;
  dopts.local_memory = 2ull << 30;

  if (o.client_id >= 0) {  // a client process of a multi-client run
    FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(dopts));
    return RunClient(*db, o, o.start_at_ms);
  }

  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(dopts));
  {
    auto names = db->ListTables();
    if (names.ok() && !names->empty()) {
      return Status::InvalidArgument(
          "the cluster already holds a database (tables: " + (*names)[0] +
          ", ...): start a fresh cluster for each benchmark run");
    }
  }
  const auto load_start = Clock::now();
  FARPOOL_RETURN_IF_ERROR(Load(*db, o).status());
  // One plain line when the run starts (harnesses that act during the run wait for it).
  std::fprintf(stderr, "bench txn: loaded in %.1f s; running %d x %d threads for %g s\n",
               std::chrono::duration<double>(Clock::now() - load_start).count(), o.clients,
               o.threads, o.warmup_seconds + o.seconds);
  nlohmann::json merged = {{"commits", 0},
                           {"aborts", 0},
                           {"reads", 0},
                           {"writes", 0},
                           {"cas", 0},
                           {"faa", 0},
                           {"messages", 0},
                           {"round_trips", 0},
                           {"session_restarts", 0},
                           {"commits_cut", 0},
                           {"round_trips_aborted", 0}};
  std::array<uint64_t, kRoundTripCauses> by_cause{};
  std::vector<uint32_t> lat;
  uint64_t max_ns = 0;
  std::vector<uint64_t> timeline;
  // The common start on the wall clock, to line the timeline up with other logs.
  uint64_t start_unix_ms = WallMs();
  auto absorb = [&](const nlohmann::json& j) {
    AddInto(timeline, j["timeline"].get<std::vector<uint64_t>>());
    max_ns = std::max(max_ns, j["max_ns"].get<uint64_t>());
    for (const char* k :
         {"commits", "aborts", "reads", "writes", "cas", "faa", "messages", "round_trips",
          "session_restarts", "commits_cut", "round_trips_aborted"}) {
      merged[k] = merged[k].get<uint64_t>() + j[k].get<uint64_t>();
    }
    for (size_t i = 0; i < kRoundTripCauses; ++i) {
      by_cause[i] += j["round_trips_by_cause"].value(
          std::string(RoundTripCauseName(static_cast<RoundTripCause>(i))), uint64_t{0});
    }
    auto l = j["latency_ns"].get<std::vector<uint32_t>>();
    lat.insert(lat.end(), l.begin(), l.end());
  };
  // Client processes that failed (multi-client runs): reported with their reasons, and the
  // invariant still verified over what the others and recovery left (see txn_bench.h).
  nlohmann::json clients_failed = nlohmann::json::array();
  if (o.clients == 1) {
    FARPOOL_ASSIGN_OR_RETURN(auto j, RunClient(*db, o, SteadyMs()));
    absorb(j);
  } else {
    const uint64_t start_ms = SteadyMs() + 1500;
    start_unix_ms = WallMs() + 1500;
    struct Child {
      pid_t pid;
      FILE* out;
    };
    std::vector<Child> children;
    for (int i = 0; i < o.clients; ++i) {
      int fds[2];
      if (pipe(fds) != 0) return Status::IoError("pipe failed");
      pid_t pid = fork();
      if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        auto args = ChildArgs(o, i, start_ms);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        _exit(127);
      }
      close(fds[1]);
      children.push_back({pid, fdopen(fds[0], "r")});
    }
    for (auto& c : children) {
      std::string text;
      char buf[65536];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), c.out)) > 0) text.append(buf, n);
      fclose(c.out);
      int status = 0;
      waitpid(c.pid, &status, 0);
      // A client that failed printed {"error": ...} (RunTxn), or nothing if it was killed.
      auto j = nlohmann::json::parse(text, nullptr, false);
      const bool exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (exited_ok && j.is_object() && !j.contains("error")) {
        absorb(j);
        continue;
      }
      const std::string how = WIFSIGNALED(status)
                                  ? "killed by signal " + std::to_string(WTERMSIG(status))
                                  : "exit status " + std::to_string(WEXITSTATUS(status));
      clients_failed.push_back(
          {{"pid", c.pid},
           {"how", how},
           {"error", j.is_object() && j.contains("error") ? j["error"].get<std::string>()
                     : exited_ok                          ? "printed no result"
                                                          : "printed no reason"}});
    }
    if (clients_failed.size() == children.size()) {
      return Status::Internal("every client process failed, the first: " +
                              clients_failed[0].dump());
    }
  }
  const double commits = merged["commits"].get<uint64_t>();
  const double aborts = merged["aborts"].get<uint64_t>();
  const double per = commits > 0 ? commits : 1;
  nlohmann::json r = RunContext();
  r["bench"] = "txn";
  r["engine"] = std::string(EngineName(o.engine));
  r["workload"] = o.workload;
  r["clients"] = o.clients;
  r["threads"] = o.threads;
  r["seconds"] = o.seconds;
  r["isolation"] = o.isolation;
  r["for_update"] = o.for_update || o.isolation == "rc";
  if (o.workload == "bank")
    r["accounts"] = o.accounts;
  else
    r["scale"] = o.scale;
  r["commits"] = merged["commits"];
  r["aborts"] = merged["aborts"];
  r["session_restarts"] = merged["session_restarts"];
  if (!clients_failed.empty()) r["clients_failed"] = clients_failed;
  r["commits_cut"] = merged["commits_cut"];  // settled by their sessions (a failover cut them)
  r["tps"] = commits / o.seconds;
  r["p50_us"] = Percentile(lat, 0.50);
  r["p99_us"] = Percentile(lat, 0.99);
  r["p999_us"] = Percentile(lat, 0.999);
  r["max_us"] = max_ns / 1000.0;  // the longest wait of any committed transaction
  r["abort_rate"] = (commits + aborts) > 0 ? aborts / (commits + aborts) : 0.0;
  r["reads_per_txn"] = merged["reads"].get<uint64_t>() / per;
  r["writes_per_txn"] = merged["writes"].get<uint64_t>() / per;
  r["cas_per_txn"] = merged["cas"].get<uint64_t>() / per;
  r["faa_per_txn"] = merged["faa"].get<uint64_t>() / per;
  r["messages_per_txn"] = merged["messages"].get<uint64_t>() / per;
  r["round_trips_per_txn"] = merged["round_trips"].get<uint64_t>() / per;
  // The same by what they were for (pool engines; they add up to round_trips_per_txn), and the
  // part of them spent in attempts that aborted (counted in the causes too).
  nlohmann::json by = nlohmann::json::object();
  for (size_t i = 0; i < kRoundTripCauses; ++i)
    by[std::string(RoundTripCauseName(static_cast<RoundTripCause>(i)))] = by_cause[i] / per;
  r["round_trips_per_txn_by_cause"] = by;
  r["round_trips_aborted_per_txn"] = merged["round_trips_aborted"].get<uint64_t>() / per;
  r["seed"] = o.seed;
  if (o.workload == "tpcb") r["history_keep"] = o.history_keep;
  if (o.timeline_ms > 0) {
    r["timeline"] = {
        {"start_unix_ms", start_unix_ms}, {"bucket_ms", o.timeline_ms}, {"commits", timeline}};
  }
  if (auto g = db->CollectGarbage(); g.ok() && o.clients == 1) {
    // What version GC did in this process (multi-client runs collect in the children).
    r["gc"] = {{"versions_dropped", g->versions_dropped},
               {"versions_spilled", g->versions_spilled},
               {"chains_cut", g->chains_cut},
               {"nodes_freed", g->nodes_freed},
               {"blobs_freed", g->blobs_freed},
               {"objects_reused", g->objects_reused},
               {"objects_fresh", g->objects_fresh},
               {"chunks_opened", g->chunks_opened},
               {"chunks_released", g->chunks_released},
               {"records_removed", g->records_removed}};
  }
  if (o.verify) {
    Status v = Verify(*db, o).WithContext("verify");
    r["verify"] = v.ok() ? "ok" : v.ToString();
    // No JSON then: the failed client processes are named in the status (they may be why).
    if (!v.ok() && !clients_failed.empty())
      return v.WithContext("client processes failed " + clients_failed.dump());
    if (!v.ok()) return v;
  }
  return r;
}

}  // namespace farpool
