"""MEMSCALE Fig. 3 on one machine: latency of each of the six social-network queries, one query
flow, on every system, same data, same run.

  local        farpool, local engine (the data in this process's RAM: the upper bound)
  pool-shm     farpool, pool engine, 2 memory servers over shared memory (same host)
  pool-tcp     farpool, pool engine, 2 memory servers over TCP, each in its own network
               namespace (`cluster up --netns`; plain loopback if namespaces are unavailable),
               servers in event progress (busy-polling servers starve a 2-core machine); at
               (the same scale as the others unless --tcp-scale says otherwise: bulk loading
               runs at 100,000+ rows/s over TCP here)
  sharded      farpool, sharded engine (when the build has it)
  postgresql   PostgreSQL 15, data dir on tmpfs, fsync off, same tables and indexes, queries
               by pgbench with prepared statements (one client), over its Unix socket
  postgresql-tcp  the same, the server in its own network namespace, pgbench over TCP (the
               peer of pool-tcp)
  sqlite       SQLite on a file, Python's sqlite3 module (one connection)

Every system loads the CSV export of the same generator (`farpool bench social --export`) and
checks a sample of its answers against the generator's before it is measured. Output:
bench/results/query_latency.jsonl (one object per system and query), query_latency.md (p50 per
query and ratio to local) and query_latency.png (log scale, as the paper's figure).

Usage: bench/experiments/query_latency [--scale S] [--seconds S] [--systems a,b] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from farpool.harness import peers
from farpool.harness.peers import log

QUERY_NAMES = {"q1": "friends' names", "q2": "new msgs to user", "q3": "new msgs to groups",
               "q4": "last 100 msgs sent", "q5": "text of a msg", "q6": "groups' names"}
ALL_SYSTEMS = ["local", "pool-shm", "pool-tcp", "sharded", "postgresql", "postgresql-tcp",
               "sqlite"]
LABELS = {"local": "farpool local", "pool-shm": "farpool pool (shm)",
          "pool-tcp": "farpool pool (tcp)", "sharded": "farpool sharded",
          "postgresql": "PostgreSQL (RAM)", "postgresql-tcp": "PostgreSQL (RAM, tcp)",
          "sqlite": "SQLite (file)"}


def farpool_rows(system: str, result: dict, **extra) -> list[dict]:
    rows = []
    for q in result["queries"]:
        rows.append({"experiment": "query_latency", "system": system, "query": q["query"],
                     "p50_us": q["p50_us"], "p99_us": q["p99_us"], "mean_us": q["mean_us"],
                     "qps": q["qps"], "count": q["count"], "scale": result["scale"],
                     "flows": result["flows"], "load_seconds": result["load_seconds"], **extra})
    return rows


def measure(systems: list[str], scale: float, seconds: float, memory: str = "2GiB",
            tcp_scale: float | None = None) -> tuple[list[dict], dict]:
    tcp_scale = scale if tcp_scale is None else tcp_scale
    rows: list[dict] = []
    notes: dict[str, str] = {}
    for system in systems:
        try:
            if system == "local":
                log(f"== farpool local engine, scale {scale}")
                rows += farpool_rows(system, peers.farpool_social("local", scale, seconds=seconds))
            elif system == "pool-shm":
                log("== farpool pool engine, 2 memory servers over shared memory")
                with peers.Cluster(2, memory, "shm") as c:
                    rows += farpool_rows(system, peers.farpool_social("pool", scale, c, seconds=seconds),
                                         transport="shm")
            elif system == "pool-tcp":
                log("== farpool pool engine, 2 memory servers over TCP (network namespaces)")
                cluster = peers.TcpCluster(2, memory, attempts=1, log=log)
                with cluster as c:
                    if cluster.failure:
                        notes[system] = cluster.failure
                    rows += farpool_rows(system, peers.farpool_social("pool", tcp_scale, c, seconds=seconds,
                                                                      extra=["--load-threads", "1"]),
                                         transport=cluster.how)
                    notes.setdefault(system, f"scale {tcp_scale:g}, servers in event progress "
                                             "(2 cores)")
            elif system == "sharded":
                why = peers.sharded_available()
                if why:
                    log(f"== sharded engine not available: {why}")
                    notes[system] = f"not available in this build: {why}"
                    continue
                log("== farpool sharded engine (in-process partition servers)")
                rows += farpool_rows(system, peers.farpool_social("sharded", scale, seconds=seconds))
            elif system in ("postgresql", "postgresql-tcp", "sqlite"):
                with tempfile.TemporaryDirectory(prefix="farpool-export-", dir="/dev/shm") as d:
                    export = peers.export_social(scale, d)
                    meta = peers.read_meta(export)
                    if system in ("postgresql", "postgresql-tcp"):
                        how = ", over TCP" if system == "postgresql-tcp" else ""
                        log(f"== PostgreSQL 15 (tmpfs, fsync off{how}): loading the CSV export")
                        with contextlib.ExitStack() as stack:
                            netns = None
                            if system == "postgresql-tcp":
                                netns = (stack.enter_context(peers.Netns(1)), 0)
                            pg = stack.enter_context(peers.Postgres(in_ram=True, netns=netns))
                            load = pg.load_social(export)
                            pg.verify_social(export)
                            for q in QUERY_NAMES:
                                r = pg.social_query(q, meta, 1, seconds)
                                rows.append({"experiment": "query_latency", "system": system,
                                             "query": q, "scale": scale, "flows": 1,
                                             "load_seconds": load, **r})
                                log(f"   {q} p50 {r['p50_us']:.1f} us")
                    else:
                        log("== SQLite (file): loading the CSV export")
                        with peers.SQLiteDb() as lite:
                            load = lite.load_social(export)
                            lite.verify_social(export)
                            for q in QUERY_NAMES:
                                r = lite.social_query(q, meta, seconds)
                                rows.append({"experiment": "query_latency", "system": system,
                                             "query": q, "scale": scale, "flows": 1,
                                             "load_seconds": load, **r})
            else:
                raise ValueError(f"unknown system {system}")
        except (RuntimeError, OSError) as e:
            log(f"   {system} failed: {e}")
            notes[system] = f"failed: {str(e)[:300]}"
    peers.stamp(rows)
    return rows, notes


def find(rows, system, query):
    return next((r for r in rows if r["system"] == system and r["query"] == query), None)


def table(rows: list[dict], notes: dict) -> str:
    systems = [s for s in ALL_SYSTEMS if any(r["system"] == s for r in rows)]
    head = "| query | " + " | ".join(LABELS[s] for s in systems) + " |"
    lines = [head, "|---" * (len(systems) + 1) + "|"]
    for q, name in QUERY_NAMES.items():
        base = find(rows, "local", q)
        cells = []
        for s in systems:
            r = find(rows, s, q)
            if r is None:
                cells.append("–")
                continue
            cell = f"{r['p50_us']:.1f} µs"
            if base and s != "local" and base["p50_us"] > 0:
                cell += f" ({r['p50_us'] / base['p50_us']:.2f}x)"
            cells.append(cell)
        lines.append(f"| {q} {name} | " + " | ".join(cells) + " |")
    # Geometric means of the ratios to local, and pool vs PostgreSQL.
    def gmean_ratio(a, b):
        import math
        vals = [find(rows, a, q)["p50_us"] / find(rows, b, q)["p50_us"] for q in QUERY_NAMES
                if find(rows, a, q) and find(rows, b, q) and find(rows, b, q)["p50_us"] > 0]
        return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None
    lines.append("")
    for s in systems:
        if s == "local":
            continue
        g = gmean_ratio(s, "local")
        if g:
            lines.append(f"- {LABELS[s]}: {g:.2f}x the latency of local (geometric mean over the queries)")
    for pg, pool in (("postgresql", "pool-shm"), ("postgresql-tcp", "pool-tcp")):
        g = gmean_ratio(pg, pool)
        if g:
            verdict = f"pool is {g:.1f}x faster" if g >= 1 else f"pool is {1 / g:.1f}x slower"
            lines.append(f"- {LABELS[pg]} / {LABELS[pool]}: {g:.2f}x ({verdict}; geometric mean)")
    for s, n in notes.items():
        lines.append(f"- {LABELS.get(s, s)}: {n}")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    systems = [s for s in ALL_SYSTEMS if any(r["system"] == s for r in rows)]
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / max(1, len(systems))
    qs = list(QUERY_NAMES)
    for k, s in enumerate(systems):
        vals = [(find(rows, s, q) or {}).get("p50_us", 0) for q in qs]
        ax.bar([i + k * width for i in range(len(qs))], vals, width, label=LABELS[s])
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(qs))])
    ax.set_xticklabels([f"{q}\n{QUERY_NAMES[q]}" for q in qs], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("p50 query latency (µs, log scale)")
    ax.set_title("Social-network query latency, one query flow (cf. MEMSCALE Fig. 3)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=10, help="1000 users per unit (default 10)")
    ap.add_argument("--seconds", type=float, default=1.0, help="measured seconds per query")
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    ap.add_argument("--memory", default="2GiB", help="per memory server")
    ap.add_argument("--tcp-scale", type=float, default=None,
                    help="scale for pool-tcp (default: --scale)")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    if not peers.farpool_bin().exists():
        print(f"query_latency: {peers.farpool_bin()} is missing; run `make build`", file=sys.stderr)
        return 1
    rows, notes = measure(args.systems.split(","), args.scale, args.seconds, args.memory,
                          args.tcp_scale)
    if not rows:
        print("query_latency: nothing measured", file=sys.stderr)
        return 1
    cmd = (f"bench/experiments/query_latency --scale {args.scale:g} --seconds {args.seconds:g}"
           + (f" --systems {args.systems}" if args.systems != ",".join(ALL_SYSTEMS) else "")
           + (f" --tcp-scale {args.tcp_scale:g}" if args.tcp_scale is not None else ""))
    header = (peers.measured(rows[0], cmd) + f" {rows[0].get('scale')} x 1000 users. p50 latency "
              "of one query, one query flow; in brackets the ratio to farpool local.\n\n")
    peers.publish(args.out, "query_latency", rows, header + table(rows, notes),
                  lambda path: plot(rows, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
