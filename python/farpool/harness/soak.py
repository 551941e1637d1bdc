"""Soak: the database at full speed for a long time must not grow the pool without bound.

For each workload (bank, then tpcb) on a fresh local cluster of SERVERS servers × MEMORY (by
default 2 × 256 MiB = a 512 MiB pool, shm), `farpool bench txn --verify` runs CLIENTS client
processes × THREADS threads for SECONDS/len(workloads) seconds, while this script samples the
pool memory in use — `leased`, summed over the servers, from `farpool cluster status --json` —
every INTERVAL seconds and prints it.

Pass, per workload:
  * memory: let W be the memory in use at the end of the warm-up (the first WARMUP fraction of
    the workload's wall time, 20 % by default, loading included). Every later sample must be
    ≤ 1.1 × W + one chunk (4 MiB) per client process per server. An engine without version
    garbage collection fails here: every commit leaves an old version behind, and the pool
    fills (the bench then fails with OutOfMemory, also a failure, reported with the timeline).
  * invariant: the bench's --verify at the end (bank: the total is conserved; tpcb:
    sum(accounts) == sum(tellers) == sum(branches)). TPC-B runs with --history-keep
    HISTORY_KEEP (each thread deletes its history row of HISTORY_KEEP transactions earlier), so
    its live data stays the same size: deleted rows must be reclaimed too.
  * reported, not judged: throughput, abort rate, p50/p99 and the longest wait of any committed
    transaction (max_us).
  * the bench finishes: within its seconds + max(60 s, its seconds), else it is killed (hung
    or livelocked): failure.

Output: one JSON line per workload appended to bench/results/soak.jsonl (git sha, host, options,
the memory timeline, the bound, the verdict); exit status 1 if any workload failed.

  python3 -m farpool.harness.soak --seconds 600          # make soak (SOAK_SECONDS overrides)
  python3 -m farpool.harness.soak --seconds 60           # the suite's short variant
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from farpool.harness.peers import ROOT, Cluster, farpool_bin, log, stamp, write_jsonl

CHUNK = 4 << 20  # the servers' chunk size (LocalClusterOptions::chunk_size default)


def pool_in_use(cluster_dir: str) -> int:
    out = subprocess.run([str(farpool_bin()), "cluster", "status", "--dir", cluster_dir,
                          "--json"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"cluster status: {out.stderr.strip()}")
    return int(json.loads(out.stdout)["leased"])


def judge_memory(timeline: list[tuple[float, int]], wall: float, warmup: float, clients: int,
                 servers: int) -> dict:
    """The memory bound: after the warm-up (the first `warmup` fraction of `wall` seconds), no
    sample may exceed 1.1 × the last warm-up sample + one chunk per client process per server.
    Returns in_use_at_warmup_end, bound, peak_after_warmup and, if it does not hold, failure."""
    warm_end = warmup * wall
    warm = [m for t, m in timeline if t <= warm_end]
    later = [m for t, m in timeline if t > warm_end]
    if not warm or not later:
        end = timeline[-1][0] if timeline else 0
        return {"failure": f"no memory sample after the warm-up (t={warm_end:.0f}s; "
                           f"{len(timeline)} samples, the last at t={end:.0f}s): cannot judge growth"}
    base = warm[-1]
    bound = int(1.1 * base + CHUNK * clients * servers)
    peak = max(later)
    out = {"in_use_at_warmup_end": base, "bound": bound, "peak_after_warmup": peak}
    if peak > bound:
        out["failure"] = (f"pool memory grew after the warm-up: peak {peak / 2**20:.1f} MiB > "
                          f"bound {bound / 2**20:.1f} MiB (1.1 × {base / 2**20:.1f} MiB at "
                          f"t={warm_end:.0f}s + {clients}×{servers} chunks of 4 MiB)")
    return out


def soak_one(workload: str, seconds: float, args: argparse.Namespace) -> dict:
    row = {"bench": "soak", "workload": workload, "engine": "pool", "seconds": seconds,
           "servers": args.servers, "memory_per_server": args.memory, "clients": args.clients,
           "threads": args.threads, "interval_s": args.interval,
           "warmup_fraction": args.warmup, "seed": args.seed}
    timeline: list[tuple[float, int]] = []
    with Cluster(servers=args.servers, memory=args.memory, transport="shm") as cluster_file:
        cluster_dir = str(Path(cluster_file).parent)
        cmd = [str(farpool_bin()), "bench", "txn", "--cluster", cluster_file, "--engine", "pool",
               "--workload", workload, "--clients", str(args.clients), "--threads",
               str(args.threads), "--seconds", str(seconds), "--warmup", "0", "--seed",
               str(args.seed), "--verify", "--json"]
        if workload == "bank":
            cmd += ["--accounts", str(args.accounts)]
        else:
            # pgbench's history grows by a row per transaction: keep a window of it, so that the
            # live data stays the same size and any growth is garbage left behind.
            cmd += ["--history-keep", str(args.history_keep)]
        log(f"soak {workload}: {' '.join(cmd)}")
        start = time.monotonic()
        # Its own process group, so that a hung bench goes down with its client processes; in
        # our session (a session of its own would be a scheduling autogroup of its own: starved
        # on a loaded host, docs/pool.md "Failure detection").
        bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 process_group=0)
        limit = start + seconds + max(60.0, seconds)
        while bench.poll() is None:
            now = time.monotonic()
            if now > limit:
                os.killpg(bench.pid, signal.SIGKILL)
                row["error"] = (f"bench did not finish within {seconds + max(60.0, seconds):.0f} s "
                                "(hung or livelocked): killed")
                break
            try:
                used = pool_in_use(cluster_dir)
                timeline.append((round(now - start, 1), used))
                log(f"soak {workload}: t={now - start:6.1f}s pool in use {used / 2**20:8.1f} MiB")
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
                log(f"soak {workload}: t={now - start:6.1f}s cluster status failed: {e}")
            deadline = time.monotonic() + args.interval
            while bench.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
        # Client processes the bench leaves behind (it died, or was evicted) hold its pipes
        # open: they go with it, or communicate() would wait for them.
        try:
            os.killpg(bench.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = bench.communicate()
        wall = time.monotonic() - start
        try:
            timeline.append((round(wall, 1), pool_in_use(cluster_dir)))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError):
            pass
    row["wall_s"] = round(wall, 1)
    row["timeline"] = timeline
    if bench.returncode != 0 and "error" not in row:
        row["error"] = f"bench exited {bench.returncode}: {err.strip()[-800:]}"
    elif "error" not in row:
        result = json.loads(out.strip().splitlines()[-1])
        row.update({k: result.get(k) for k in ("tps", "commits", "aborts", "abort_rate",
                                                "p50_us", "p99_us", "max_us", "verify")})
    failures = [row["error"]] if "error" in row else []
    # The warm-up is a fraction of the planned run, even when the bench died early.
    verdict = judge_memory(timeline, max(wall, seconds), args.warmup, args.clients, args.servers)
    row.update({k: v for k, v in verdict.items() if k != "failure"})
    if verdict.get("failure"):
        failures.append(verdict["failure"])
    if row.get("verify") not in (None, "ok"):
        failures.append(f"invariant: {row['verify']}")
    row["ok"] = not failures
    row["failures"] = failures
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=600, help="total, split across workloads")
    p.add_argument("--workloads", default="bank,tpcb")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--memory", default="256MiB", help="per server")
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--accounts", type=int, default=10000, help="bank")
    p.add_argument("--history-keep", type=int, default=1000,
                   help="tpcb: history rows kept per thread (older ones deleted)")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of each run")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak.jsonl"))
    args = p.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    rows = [soak_one(w, args.seconds / len(workloads), args) for w in workloads]
    stamp(rows)
    write_jsonl(Path(args.out), rows, append=True)
    ok = True
    for r in rows:
        if r["ok"]:
            log(f"soak {r['workload']}: ok (peak {r['peak_after_warmup'] / 2**20:.1f} MiB ≤ bound "
                f"{r['bound'] / 2**20:.1f} MiB; verify {r.get('verify')})")
            continue
        ok = False
        log(f"SOAK FAILED: {r['workload']}:")
        for f in r["failures"]:
            log(f"  {f}")
        log("  pool memory in use (t s: MiB): " +
            ", ".join(f"{t:.0f}: {m / 2**20:.0f}" for t, m in r["timeline"]))
    log(f"soak: results appended to {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
