"""NAM-DB Fig. 4 on one machine: the TPC-W-buy-like distributed transaction
(`farpool bench tpcw`, src/workloads/tpcw.h) on the pool engine (one-sided RSI: 2 memory
servers over shared memory, a fresh cluster per point) vs the sharded engine (partition servers
with message-based two-phase commit, in-process) over 1..64 clients (threads, one session
each, in one compute process). Linear and log plots.

Output: bench/results/tpcw.jsonl, tpcw.md, tpcw.png (linear), tpcw_log.png (log-log).
Usage: bench/experiments/tpcw [--clients 1,2,4,8,16,32,64] [--seconds S] [--systems pool,sharded]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from farpool.harness import peers
from farpool.harness.peers import log


def run(engine: str, clients: int, seconds: float) -> dict:
    cmd = [str(peers.farpool_bin()), "bench", "tpcw", "--engine", engine, "--flows", str(clients),
           "--seconds", str(seconds), "--verify", "--json"]
    if engine == "pool":
        with peers.Cluster(2, "1GiB", "shm") as c:
            return peers.run_json(cmd + ["--cluster", c])
    return peers.run_json(cmd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,2,4,8,16,32,64")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--systems", default="pool,sharded")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    rows, notes = [], {}
    for system in args.systems.split(","):
        if system == "sharded" and (why := peers.sharded_available()):
            notes[system] = f"not available: {why}"
            continue
        for n in clients:
            try:
                r = run(system, n, args.seconds)
            except RuntimeError as e:
                notes[f"{system} {n}"] = str(e)[-300:]
                log(f"   {system} {n} clients failed: {e}")
                continue
            log(f"== {system} {n} clients: {r['tps']:.0f} tps, p50 {r['p50_us']:.1f} us, "
                f"abort rate {r['abort_rate']:.3f}")
            rows.append({"experiment": "tpcw", "system": system, "clients": n, "tps": r["tps"],
                         "p50_us": r["p50_us"], "p99_us": r["p99_us"],
                         "abort_rate": r["abort_rate"], "verify": r.get("verify")})
    if not rows:
        return 1
    ctx = peers.context()
    for r in rows:
        r.update(ctx)
    out = Path(args.out)
    peers.write_jsonl(out / "tpcw.jsonl", rows)
    get = lambda s, n: next((r for r in rows if r["system"] == s and r["clients"] == n), None)
    lines = [f"Measured {ctx['time']} on {ctx['host']} ({ctx['cores']} cores), git "
             f"{ctx['git_sha']}, `bench/experiments/tpcw --clients {args.clients} --seconds "
             f"{args.seconds}`. Committed TPC-W buy transactions per second (abort rate).\n",
             "| clients | pool (shm) | sharded (2PC) | pool / sharded |", "|---|---|---|---|"]
    for n in clients:
        p, s = get("pool", n), get("sharded", n)
        cell = lambda r: f"{r['tps']:,.0f} ({r['abort_rate']:.2f})" if r else "–"
        ratio = f"{p['tps'] / s['tps']:.1f}x" if p and s and s["tps"] else "–"
        lines.append(f"| {n} | {cell(p)} | {cell(s)} | {ratio} |")
    for k, v in notes.items():
        lines.append(f"\n- {k}: {v}")
    md = "\n".join(lines) + "\n"
    (out / "tpcw.md").write_text(md)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for name, logscale in (("tpcw.png", False), ("tpcw_log.png", True)):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s, label in (("pool", "farpool pool (one-sided RSI)"), ("sharded", "farpool sharded (2PC)")):
            pts = sorted((r["clients"], r["tps"]) for r in rows if r["system"] == s)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label)
        if logscale:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        ax.set_xlabel("clients")
        ax.set_ylabel("TPC-W buy transactions/s" + (" (log)" if logscale else ""))
        ax.set_title("Distributed TPC-W buy: pool vs sharded (cf. NAM-DB Fig. 4)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
