"""MEMSCALE Fig. 4 and 7 on one machine: throughput of the social-network query mix vs the
number of concurrent query flows, in one compute process and in several compute processes on
the same pool.

Configurations (one line each in the plot):
  pool xP      farpool pool engine, 2 memory servers over shared memory. The network is loaded
               once into the cluster (`bench social --load-only --verify`); then P compute
               processes (`bench social --attach`) split the flows (P=1: threads of one
               process) and measure the same window (`--start-at`), their queries/s summed.
  local        farpool local engine (the data in the process's RAM; one process only, loads
               the network again for every point)
  sharded      farpool sharded engine, partition servers as threads of the process (one
               process only; loads again for every point)

Every flow runs MEMSCALE's mix: each operation is one of the six queries, uniformly (and, with
--writes PCT, a write instead with that probability: post a message or mark one read).
A point with F flows and P processes gives each process F/P flows (points with F < P or F not
a multiple of P are skipped).

Output: bench/results/flows.jsonl (one object per configuration and flow count), flows.md and
flows.png (queries/s vs flows, log2 x axis).

Usage: bench/experiments/flows [--scale S] [--flows 1,2,4,...] [--procs 1,2,4] [--seconds S]
                               [--writes PCT] [--systems pool,local,sharded]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from farpool.harness import peers
from farpool.harness.peers import log

MAX_CLIENT_IDS = 64  # `bench social --client-id` range (disjoint message ids of the write mix)


def social_cmd(engine: str, scale: float, seed: int, extra: list[str]) -> list[str]:
    return [str(peers.farpool_bin()), "bench", "social", "--engine", engine, "--scale", str(scale),
            "--seed", str(seed), "--json", *extra]


def mix_args(flows: int, seconds: float, warmup: float, writes: float) -> list[str]:
    return ["--query", "mix", "--flows", str(flows), "--seconds", str(seconds), "--warmup",
            str(warmup), "--writes", str(writes)]


def point_row(config: str, engine: str, procs: int, flows: int, results: list[dict],
              seconds: float) -> dict:
    """Sums the processes' throughput; latency: the count-weighted mean and the worst p99."""
    count = sum(r["all"]["count"] for r in results)
    writes = sum(r["writes"]["count"] for r in results)
    mean = sum(r["all"]["mean_us"] * r["all"]["count"] for r in results) / max(1, count)
    return {"experiment": "flows", "config": config, "engine": engine, "procs": procs,
            "flows": flows, "qps": count / seconds, "writes_per_s": writes / seconds,
            "mean_us": mean, "p50_us": max(r["all"]["p50_us"] for r in results),
            "p99_us": max(r["all"]["p99_us"] for r in results),
            "per_process_qps": [r["all"]["count"] / seconds for r in results],
            "per_query_qps": {q["query"]: sum(next(x["qps"] for x in r["queries"] if x["query"] == q["query"])
                                              for r in results) for q in results[0]["queries"]}}


class PoolRunner:
    """One loaded cluster; attached processes get fresh client ids (reloads when they run out)."""

    def __init__(self, scale: float, seed: int, memory: str):
        self.scale, self.seed, self.memory = scale, seed, memory
        self.cluster = None
        self.path = None
        self.next_id = 0
        self.load_seconds = None

    def _load(self) -> None:
        self.close()
        self.cluster = peers.Cluster(2, self.memory, "shm")
        self.path = self.cluster.__enter__()
        log(f"== pool: loading scale {self.scale} into a 2-server shm cluster")
        r = peers.run_json(social_cmd("pool", self.scale, self.seed,
                                      ["--cluster", self.path, "--load-only", "--verify"]),
                           stream_stderr=True)
        self.load_seconds = r["load_seconds"]
        self.next_id = 0

    def run(self, procs: int, flows: int, seconds: float, warmup: float, writes: float) -> list[dict]:
        if self.cluster is None or self.next_id + procs > MAX_CLIENT_IDS:
            self._load()
        per = flows // procs
        # Process start-up and Database::Open take well under a second here; the common start
        # leaves that margin so every process measures the same window.
        start_at = int((time.time() + (0.8 if procs > 1 else 0.3)) * 1000)
        popens = []
        for _ in range(procs):
            cmd = social_cmd("pool", self.scale, self.seed,
                             ["--cluster", self.path, "--attach", "--client-id", str(self.next_id),
                              "--start-at", str(start_at), *mix_args(per, seconds, warmup, writes)])
            self.next_id += 1
            popens.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = []
        for p in popens:
            out, err = p.communicate(timeout=300 + seconds)
            if p.returncode != 0:
                raise RuntimeError(f"attached process failed ({p.returncode}): {err.strip()[-400:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.__exit__(None, None, None)
            self.cluster = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=10, help="1000 users per unit (default 10)")
    ap.add_argument("--flows", default="1,2,4,8,16,32,64")
    ap.add_argument("--procs", default="1,2,4", help="compute process counts on the pool")
    ap.add_argument("--seconds", type=float, default=1.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=0.3)
    ap.add_argument("--writes", type=float, default=0.0, help="percent of operations that write")
    ap.add_argument("--systems", default="pool,local,sharded")
    ap.add_argument("--memory", default="1GiB", help="per memory server")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    if not peers.farpool_bin().exists():
        print(f"flows: {peers.farpool_bin()} is missing; run `make build`", file=sys.stderr)
        return 1
    flows = [int(x) for x in args.flows.split(",")]
    procs = [int(x) for x in args.procs.split(",")]
    rows, notes = [], {}
    t_start = time.time()
    for system in args.systems.split(","):
        if system == "pool":
            runner = PoolRunner(args.scale, args.seed, args.memory)
            try:
                for p in procs:
                    for f in flows:
                        if f < p or f % p:
                            continue
                        res = runner.run(p, f, args.seconds, args.warmup, args.writes)
                        row = point_row(f"pool x{p}", "pool", p, f, res, args.seconds)
                        row["load_seconds"] = runner.load_seconds
                        rows.append(row)
                        log(f"   pool, {p} process(es), {f} flows: {row['qps']:,.0f} queries/s "
                            f"(per process {', '.join(f'{q:,.0f}' for q in row['per_process_qps'])})")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                log(f"   pool failed: {e}")
                notes["pool"] = f"failed: {str(e)[:300]}"
            finally:
                runner.close()
        elif system in ("local", "sharded"):
            if system == "sharded" and (why := peers.sharded_available()):
                notes[system] = f"not available: {why}"
                continue
            log(f"== {system}: one process, loading scale {args.scale} for every point")
            for f in flows:
                try:
                    r = peers.run_json(social_cmd(system, args.scale, args.seed,
                                                  mix_args(f, args.seconds, args.warmup, args.writes)))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    log(f"   {system} {f} flows failed: {e}")
                    notes[f"{system} {f}"] = f"failed: {str(e)[-300:]}"
                    continue
                row = point_row(system, system, 1, f, [r], args.seconds)
                row["load_seconds"] = r["load_seconds"]
                rows.append(row)
                log(f"   {system}, {f} flows: {row['qps']:,.0f} queries/s")
        else:
            notes[system] = "unknown system"
    if not rows:
        print("flows: nothing measured", file=sys.stderr)
        return 1
    ctx = peers.context()
    for r in rows:
        r.update({"scale": args.scale, "seconds": args.seconds, "write_pct": args.writes, **ctx})
    cmdline = (f"bench/experiments/flows --scale {args.scale} --flows {args.flows} --procs {args.procs} "
               f"--seconds {args.seconds} --writes {args.writes} --systems {args.systems}")
    md = table(rows, flows, notes, ctx, cmdline, time.time() - t_start)
    peers.publish(args.out, "flows", rows, md, lambda path: plot(rows, path, args))
    return 0


def configs(rows: list[dict]) -> list[str]:
    seen = []
    for r in rows:
        if r["config"] not in seen:
            seen.append(r["config"])
    return seen


def table(rows, flows, notes, ctx, cmdline, elapsed) -> str:
    cfgs = configs(rows)
    get = lambda c, f: next((r for r in rows if r["config"] == c and r["flows"] == f), None)
    lines = [peers.measured(ctx, cmdline, elapsed) + " Social-network query mix (six queries uniformly"
             f"{', plus writes' if rows[0]['write_pct'] else ''}), queries/s summed over the "
             "processes; in brackets the mean latency.\n",
             "| flows | " + " | ".join(cfgs) + " |", "|---" * (len(cfgs) + 1) + "|"]
    for f in flows:
        cells = []
        for c in cfgs:
            r = get(c, f)
            cells.append(f"{r['qps']:,.0f} ({r['mean_us']:.0f} µs)" if r else "–")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    lines.append("")
    for c in cfgs:
        pts = sorted((r["flows"], r["qps"]) for r in rows if r["config"] == c)
        best = max(pts, key=lambda x: x[1])
        first = pts[0]
        # Saturation: the first flow count that reaches 90% of the best throughput.
        sat = next(f for f, q in pts if q >= 0.9 * best[1])
        lines.append(f"- {c}: peak {best[1]:,.0f} queries/s at {best[0]} flows "
                     f"({best[1] / first[1]:.1f}x its {first[0]}-flow throughput); 90% of the "
                     f"peak from {sat} flows on")
    base = {r["flows"]: r["qps"] for r in rows if r["config"] == "local"}
    for c in cfgs:
        if c == "local" or not base:
            continue
        ratios = [r["qps"] / base[r["flows"]] for r in rows if r["config"] == c and r["flows"] in base]
        if ratios:
            lines.append(f"- {c} / local: {min(ratios):.2f}x .. {max(ratios):.2f}x over the flow counts")
    for k, v in notes.items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"


def plot(rows, path: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for c in configs(rows):
        pts = sorted((r["flows"], r["qps"]) for r in rows if r["config"] == c)
        label = {"local": "farpool local (1 process)", "sharded": "farpool sharded (1 process)"}.get(
            c, f"farpool pool (shm), {c.split('x')[-1]} process(es)")
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent query flows")
    ax.set_ylabel("queries/s (log)")
    ax.set_title(f"Social-network query mix vs flows, scale {args.scale:g}, {peers.context()['cores']} cores "
                 "(cf. MEMSCALE Fig. 4/7)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
