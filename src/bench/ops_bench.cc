#include "bench/ops_bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "bench/histogram.h"
#include "bench/run_context.h"
#include "farpool/pool.h"

namespace farpool {
namespace {

using Clock = std::chrono::steady_clock;

enum class Op { kRead, kWrite, kCas, kFaa };

Result<Op> ParseOp(const std::string& s) {
  if (s == "read") return Op::kRead;
  if (s == "write") return Op::kWrite;
  if (s == "cas") return Op::kCas;
  if (s == "faa") return Op::kFaa;
  return Status::InvalidArgument("unknown op '" + s + "' (expected read, write, cas or faa)");
}

// User + system CPU seconds of process `pid` so far, or -1 if it is not a process of this host.
double ProcessCpuSeconds(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // fields 14 and 15: utime, stime
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

uint64_t Ns(Clock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

struct ThreadResult {
  Histogram latency;
  uint64_t ops = 0;
  Status status;
};

// Value a verify run expects in the first word of object i of thread t after setup.
uint64_t Pattern(int thread, size_t i) {
  return (uint64_t(thread) << 40) ^ (i * 0x9E3779B97F4A7C15ull);
}

}  // namespace

Result<nlohmann::json> RunOpsBench(const OpsBenchOptions& o) {
  FARPOOL_ASSIGN_OR_RETURN(Op op, ParseOp(o.op));
  if (o.threads < 1 || o.batch < 1) {
    return Status::InvalidArgument("--threads and --batch must be at least 1");
  }
  const bool atomic = op == Op::kCas || op == Op::kFaa;
  const uint64_t size = atomic ? 8 : o.size;
  if (size == 0) return Status::InvalidArgument("--size must be at least 1 byte");
  std::unique_ptr<Pool> pool;
  std::vector<int64_t> server_pids;  // same-host servers, for their CPU time
  if (!o.local_memory) {
    FARPOOL_ASSIGN_OR_RETURN(ClusterConfig cluster, ClusterConfig::Load(o.cluster_file));
    for (const ServerAddress& s : cluster.servers) {
      if (s.pid > 0 && ProcessCpuSeconds(s.pid) >= 0) server_pids.push_back(s.pid);
    }
    PoolOptions po;
    po.transport = o.transport;
    po.direct_access = o.direct_access;
    po.remote_access = o.remote_access;
    FARPOOL_ASSIGN_OR_RETURN(pool, Pool::Connect(cluster, po));
  }

  const size_t objects = std::max<uint64_t>(
      1, std::min<uint64_t>(o.working_set / std::max<uint64_t>(size, 64), 1 << 16));
  const uint64_t timer = ClockOverheadNs();
  std::vector<ThreadResult> results(o.threads);
  std::atomic<bool> measuring{false}, stop{false};
  std::barrier ready(o.threads + 1);

  auto worker = [&](int t) {
    ThreadResult& r = results[t];
    std::vector<GlobalAddress> addrs;
    std::vector<uint64_t> shadow(objects, 0);  // cas: value last seen; faa: increments
    std::vector<uint64_t> previous(o.batch);
    Status setup;
    std::vector<std::byte> buf(size * o.batch);
    // Local-memory baseline: the same objects in one arena of this process, 64-byte slots.
    const uint64_t slot = (size + 63) / 64 * 64;
    std::vector<std::byte> arena(o.local_memory ? objects * slot + 64 : 0);
    void* aligned = arena.data();
    size_t space = arena.size();
    auto* base = static_cast<std::byte*>(std::align(64, objects * slot, aligned, space));
    auto local_op = [&](size_t i, int k) {
      std::byte* obj = base + i * slot;
      auto* word = reinterpret_cast<uint64_t*>(obj);
      switch (op) {
        case Op::kRead:
          std::memcpy(buf.data() + k * size, obj, size);
          break;
        case Op::kWrite:
          std::memcpy(obj, buf.data() + k * size, size);
          break;
        case Op::kCas: {
          uint64_t expected = shadow[i];
          __atomic_compare_exchange_n(word, &expected, shadow[i] + 1, false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST);
          previous[k] = expected;
          break;
        }
        case Op::kFaa:
          previous[k] = __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
          break;
      }
    };
    for (size_t i = 0; i < objects && o.local_memory; ++i) {
      uint64_t p = atomic ? 0 : Pattern(t, i);
      std::memcpy(base + i * slot, &p, std::min<uint64_t>(8, size));
    }
    for (size_t i = 0; i < objects && setup.ok() && !o.local_memory; ++i) {
      auto a = pool->Alloc(size);
      if (!a.ok()) {
        setup = a.status();
        break;
      }
      addrs.push_back(*a);
      std::vector<std::byte> init(size, std::byte{0});
      if (!atomic) {
        uint64_t p = Pattern(t, i);
        std::memcpy(init.data(), &p, std::min<uint64_t>(8, size));
      }
      setup = pool->Write(*a, init.data(), size);
    }
    ready.arrive_and_wait();
    if (!setup.ok()) {
      r.status = setup;
      return;
    }
    std::mt19937_64 rng(o.seed + t);
    std::vector<size_t> picks(o.batch);
    // One Batch per thread, reused after every Wait (as an application would).
    std::unique_ptr<Batch> batch = pool ? std::make_unique<Batch>(*pool) : nullptr;
    while (!stop.load(std::memory_order_relaxed)) {
      for (auto& p : picks) p = rng() % objects;
      const auto start = Clock::now();
      Status s;
      if (o.local_memory) {
        for (int k = 0; k < o.batch; ++k) local_op(picks[k], k);
      } else if (o.batch == 1) {
        const size_t i = picks[0];
        switch (op) {
          case Op::kRead:
            s = pool->Read(addrs[i], buf.data(), size);
            break;
          case Op::kWrite:
            s = pool->Write(addrs[i], buf.data(), size);
            break;
          case Op::kCas: {
            auto v = pool->CompareAndSwap(addrs[i], shadow[i], shadow[i] + 1);
            s = v.status();
            if (v.ok()) previous[0] = *v;
            break;
          }
          case Op::kFaa: {
            auto v = pool->FetchAdd(addrs[i], 1);
            s = v.status();
            if (v.ok()) previous[0] = *v;
            break;
          }
        }
      } else {
        Batch& b = *batch;
        for (int k = 0; k < o.batch && s.ok(); ++k) {
          const size_t i = picks[k];
          switch (op) {
            case Op::kRead:
              s = b.Read(addrs[i], buf.data() + k * size, size);
              break;
            case Op::kWrite:
              s = b.Write(addrs[i], buf.data() + k * size, size);
              break;
            case Op::kCas:
              s = b.CompareAndSwap(addrs[i], shadow[i], shadow[i] + 1, &previous[k]);
              break;
            case Op::kFaa:
              s = b.FetchAdd(addrs[i], 1, &previous[k]);
              break;
          }
        }
        Status w = b.Wait();
        if (s.ok()) s = w;
      }
      const auto end = Clock::now();
      if (!s.ok()) {
        r.status = s;
        break;
      }
      // Shadow bookkeeping after the clock stopped. A batch may pick an object twice; then
      // only the first CAS of it can succeed, which the shadow follows from `previous`.
      for (int k = 0; k < o.batch; ++k) {
        const size_t i = picks[k];
        if (op == Op::kCas) {
          shadow[i] = previous[k] == shadow[i] ? shadow[i] + 1 : previous[k];
        } else if (op == Op::kFaa) {
          ++shadow[i];
        } else if (op == Op::kRead && o.verify) {
          uint64_t got = 0;
          std::memcpy(&got, buf.data() + k * size, std::min<uint64_t>(8, size));
          uint64_t want = Pattern(t, i);
          if (std::memcmp(&got, &want, std::min<uint64_t>(8, size)) != 0) {
            r.status = Status::Internal("verify: read of object " + std::to_string(i) +
                                        " returned bytes that were never written");
          }
        }
      }
      if (!r.status.ok()) break;
      if (measuring.load(std::memory_order_relaxed)) {
        const uint64_t ns = Ns(end - start);
        r.latency.Record(ns > timer ? ns - timer : 0);
        r.ops += o.batch;
      }
    }
    if (o.verify && r.status.ok() && atomic) {
      // Every counted increment (and every successful CAS) must be in memory, exactly.
      for (size_t i = 0; i < objects; ++i) {
        uint64_t v = 0;
        Status s;
        if (o.local_memory) {
          std::memcpy(&v, base + i * slot, 8);
        } else {
          s = pool->Read(addrs[i], &v, 8);
        }
        if (!s.ok() || v != shadow[i]) {
          r.status = s.ok() ? Status::Internal("verify: word " + std::to_string(i) + " holds " +
                                               std::to_string(v) + ", expected " +
                                               std::to_string(shadow[i]))
                            : s;
          break;
        }
      }
    }
    for (GlobalAddress a : addrs) {
      Status s = pool->Free(a);
      if (r.status.ok() && !s.ok()) r.status = s;
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(o.threads);
  for (int t = 0; t < o.threads; ++t) threads.emplace_back(worker, t);
  ready.arrive_and_wait();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_seconds));
  auto server_cpu = [&] {
    double total = 0;
    for (int64_t pid : server_pids) total += std::max(0.0, ProcessCpuSeconds(pid));
    return total;
  };
  const OpCounters counters_before = pool ? pool->counters() : OpCounters{};
  measuring.store(true);
  const double cpu_before = server_cpu();
  const auto begin = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  measuring.store(false);
  OpCounters measured_counters = pool ? pool->counters() : OpCounters{};
  measured_counters.round_trips -= counters_before.round_trips;
  measured_counters.messages -= counters_before.messages;
  const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
  const double server_cpu_pct = (server_cpu() - cpu_before) / elapsed * 100.0;
  stop.store(true);
  for (auto& th : threads) th.join();

  Histogram all;
  uint64_t ops = 0;
  for (const ThreadResult& r : results) {
    if (!r.status.ok()) return r.status;
    all.Merge(r.latency);
    ops += r.ops;
  }
  nlohmann::json out = {
      {"system", o.local_memory ? "local-memory" : "farpool"},
      {"op", o.op},
      {"size", size},
      {"threads", o.threads},
      {"batch", o.batch},
      {"transport", pool ? std::string(FabricName(pool->transport())) : "none"},
      {"path", pool ? pool->AccessPath(pool->server_ids().front()) : "memcpy"},
      {"servers", pool ? pool->server_ids().size() : 0},
      {"seconds", elapsed},
      {"ops", ops},
      {"ops_per_s", ops / elapsed},
      {"mb_per_s", ops * static_cast<double>(size) / elapsed / 1e6},
      {"p50_us", all.Percentile(0.50) / 1000.0},
      {"p99_us", all.Percentile(0.99) / 1000.0},
      {"p999_us", all.Percentile(0.999) / 1000.0},
      {"mean_us", all.mean() / 1000.0},
      {"latency_unit", o.batch == 1 ? "operation" : "batch"},
      {"round_trips_per_op", pool && ops > 0 ? double(measured_counters.round_trips) / ops : 0.0},
      {"messages_per_op", pool && ops > 0 ? double(measured_counters.messages) / ops : 0.0},
      {"timer_overhead_ns", timer},
      {"verified", o.verify},
  };
  // Server CPU while measuring (all same-host servers together, % of one core): ~0 when
  // clients reach the region without the server (mapped shared memory); one core per busy
  // server otherwise. Absent when the servers are not processes of this host.
  if (!server_pids.empty()) out["server_cpu_pct"] = server_cpu_pct;
  out.update(RunContext());
  return out;
}

}  // namespace farpool
