"""Issue 10, experiment 4 (MEMSCALE with an unmodified SQL engine): SQLite through the farpool
VFS runs the social network's six queries on a database whose pages live in the pool, next to
SQLite on a local file and farpool's own engine, same data, same run.

Part 1, latency (one process, one query flow; p50/p99 per query):
  sqlite-file      SQLite on a file in /var/tmp (page cache warm): the baseline
  sqlite-vfs-shm   SQLite, database in the pool, 2 memory servers over shared memory
  sqlite-vfs-tcp   SQLite, database in the pool, 2 memory servers over TCP, each in its own
                   network namespace, the client in a third (as on another host)
  sqlite-vfs-tcp-nokeep  the same with `farpool_keep_shared=0`: every read transaction takes
                   SHARED (1 round trip) instead of keeping it (docs/files.md, "Read
                   transactions without a round trip"); run query by query beside the above
  native-shm       farpool's pool engine on the same data (`farpool bench social`, shm)

Part 2, readers that scale: 1, 2, 4 processes run the six queries in turn on one database at
once (their measured windows start together); total queries/s. sqlite-file: processes on this
host; sqlite-vfs-shm: processes mapping the servers' memory; sqlite-vfs-tcp: each reader in a
network namespace of its own, reaching the servers over TCP.

The database is loaded once from the generator's CSV export into the local file (checked against
the generator's answers), then copied page by page into the pool with SQLite's backup API, and
checked again there. Output: bench/results/sqlite_vfs.{jsonl,md,png}.

Usage: bench/experiments/sqlite_vfs [--scale S] [--seconds S] [--readers 1,2,4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from farpool.harness import peers
from farpool.harness.peers import log

QUERIES = ["q1", "q2", "q3", "q4", "q5", "q6"]
SYSTEMS = ["sqlite-file", "sqlite-vfs-shm", "sqlite-vfs-tcp", "native-shm",
           "sqlite-vfs-tcp-nokeep"]
LABELS = {"sqlite-file": "SQLite (local file)", "sqlite-vfs-shm": "SQLite on farpool (shm)",
          "sqlite-vfs-tcp": "SQLite on farpool (tcp)", "native-shm": "farpool engine (shm)",
          "sqlite-vfs-tcp-nokeep": "SQLite on farpool (tcp, SHARED not kept)"}


def reader(target: str, uri: bool, meta: dict, seconds: float, seed: int, start_at: float,
           queries: list[str], cache_mib: int) -> dict:
    """One reader process: waits for the common start, runs the queries in turn."""
    if uri:
        peers.load_farpool_vfs()
    con = peers.sqlite_connect(target, uri, cache_mib)
    con.execute("SELECT count(*) FROM sn_users").fetchall()  # opened and cached before the start
    time.sleep(max(0.0, start_at - time.time()))
    return peers.time_queries(con, queries, meta, seconds, seed, round_trips=uri)


def run_readers(db: peers.SQLiteDb, meta: dict, n: int, seconds: float,
                prefixes: list[list[str]]) -> dict:
    """n reader processes (reader i under prefixes[i], e.g. `ip netns exec NS`); their results
    summed."""
    start_at = time.time() + 2.0 + 0.3 * n
    procs = []
    for i in range(n):
        cmd = [*prefixes[i], sys.executable, "-m", "farpool.harness.sqlite_vfs", "--reader",
               json.dumps({"target": db.target, "uri": db.uri, "meta": meta, "seconds": seconds,
                           "seed": 1000 + i, "start_at": start_at, "cache_mib": db.cache_mib})]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=seconds + 120)
        if p.returncode != 0:
            raise RuntimeError(f"reader failed ({p.returncode}): {err.strip()[-400:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {"readers": n, "qps": sum(r["qps"] for r in results),
            "p50_us": sorted(r["p50_us"] for r in results)[n // 2],
            "p99_us": max(r["p99_us"] for r in results)}


def measure(scale: float, seconds: float, readers: list[int], memory: str,
            cache_mib: int) -> tuple[list[dict], list[str]]:
    rows: list[dict] = []
    notes: list[str] = []

    def latency(system: str, db: peers.SQLiteDb, meta: dict) -> None:
        for q in QUERIES:
            r = db.social_query(q, meta, seconds)
            rows.append({"experiment": "sqlite_vfs", "part": "latency", "system": system,
                         "query": q, "scale": scale, **r})
            log(f"   {system} {q}: p50 {r['p50_us']:.1f} us")

    def scaling(system: str, db: peers.SQLiteDb, meta: dict, prefixes: list[list[str]]) -> None:
        for n in readers:
            r = run_readers(db, meta, n, seconds * 2, prefixes)
            rows.append({"experiment": "sqlite_vfs", "part": "readers", "system": system,
                         "scale": scale, **r})
            log(f"   {system} {n} readers: {r['qps']:.0f} queries/s")

    max_readers = max(readers)
    with ExitStack() as stack:
        d = stack.enter_context(tempfile.TemporaryDirectory(prefix="farpool-export-", dir="/dev/shm"))
        export = peers.export_social(scale, d)
        meta = peers.read_meta(export)
        log(f"== SQLite on a local file: loading the CSV export (scale {scale})")
        local = stack.enter_context(peers.SQLiteDb(cache_mib=cache_mib))
        load = local.load_social(export)
        local.verify_social(export)
        size = os.path.getsize(local.target)
        notes.append(f"database {size / 2**20:.1f} MiB, loaded from CSV in {load:.1f} s")
        latency("sqlite-file", local, meta)
        scaling("sqlite-file", local, meta, [[] for _ in range(max_readers)])

        log("== SQLite on farpool, 2 memory servers over shared memory")
        with peers.Cluster(2, memory, "shm") as cluster:
            db = peers.SQLiteDb(cluster=cluster, cache_mib=cache_mib)
            copy = db.copy_from(local)
            db.verify_social(export)
            notes.append(f"copied into the pool over shm in {copy:.2f} s")
            latency("sqlite-vfs-shm", db, meta)
            scaling("sqlite-vfs-shm", db, meta, [[] for _ in range(max_readers)])
            log("== farpool's own engine on the same data (shm)")
            native = peers.farpool_social("pool", scale, cluster, seconds=seconds)
            for q in native["queries"]:
                rows.append({"experiment": "sqlite_vfs", "part": "latency", "system": "native-shm",
                             "query": q["query"], "scale": scale, "p50_us": q["p50_us"],
                             "p99_us": q["p99_us"], "mean_us": q["mean_us"], "qps": q["qps"],
                             "count": q["count"]})

        log("== SQLite on farpool, 2 memory servers over TCP in network namespaces")
        ns = stack.enter_context(peers.Netns(2 + max_readers))
        cluster = stack.enter_context(peers.PoolServers(ns, 2, memory))
        db = peers.SQLiteDb(cluster=cluster, cache_mib=cache_mib)
        copy = db.copy_from(local)
        db.verify_social(export)
        notes.append(f"copied into the pool over TCP in {copy:.2f} s; {ns.describe()}")
        # Part 1 from a reader in its own namespace, like the readers of part 2; each query
        # with SHARED kept (the default) and not, one after the other.
        variants = {"sqlite-vfs-tcp": db.target,
                    "sqlite-vfs-tcp-nokeep": db.target + "&farpool_keep_shared=0"}
        for q in QUERIES:
            for system, target in variants.items():
                out = subprocess.run(
                    [*ns.exec_prefix(2), sys.executable, "-m", "farpool.harness.sqlite_vfs",
                     "--reader",
                     json.dumps({"target": target, "uri": True, "meta": meta, "seconds": seconds,
                                 "seed": 42, "start_at": 0, "queries": [q],
                                 "cache_mib": cache_mib})],
                    capture_output=True, text=True, timeout=seconds + 120)
                if out.returncode != 0:
                    raise RuntimeError(f"tcp reader failed: {out.stderr.strip()[-400:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append({"experiment": "sqlite_vfs", "part": "latency", "system": system,
                             "query": q, "scale": scale, **r})
                log(f"   {system} {q}: p50 {r['p50_us']:.1f} us")
        scaling("sqlite-vfs-tcp", db, meta, [ns.exec_prefix(2 + i) for i in range(max_readers)])
    peers.stamp(rows)
    return rows, notes


def find(rows, system, query):
    return next((r for r in rows if r["part"] == "latency" and r["system"] == system
                 and r["query"] == query), None)


def table(rows: list[dict], notes: list[str]) -> str:
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    lines = ["| query | " + " | ".join(LABELS[s] for s in systems) + " |",
             "|---" * (len(systems) + 1) + "|"]
    for q in QUERIES:
        base = find(rows, "sqlite-file", q)
        cells = []
        for s in systems:
            r = find(rows, s, q)
            cell = "–" if r is None else f"{r['p50_us']:.1f} µs"
            if r and base and s != "sqlite-file" and base["p50_us"] > 0:
                cell += f" ({r['p50_us'] / base['p50_us']:.2f}x)"
            if r and "round_trips_per_query" in r:
                cell += f", {r['round_trips_per_query']:.2f} RTT"
            if r and r.get("watch_round_trips_per_s") is not None:
                cell += f" (+{r['watch_round_trips_per_s']:,.0f}/s watch)"
            cells.append(cell)
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    lines.append("")
    for s in systems[1:]:
        vals = [find(rows, s, q)["p50_us"] / find(rows, "sqlite-file", q)["p50_us"]
                for q in QUERIES if find(rows, s, q) and find(rows, "sqlite-file", q)]
        if vals:
            g = math.exp(sum(map(math.log, vals)) / len(vals))
            lines.append(f"- {LABELS[s]}: {g:.2f}x the latency of SQLite on a local file "
                         "(geometric mean)")
    lines += ["", "| readers | " + " | ".join(LABELS[s] for s in SYSTEMS[:3]) + " |",
              "|---" * 4 + "|"]
    counts = sorted({r["readers"] for r in rows if r["part"] == "readers"})
    for n in counts:
        cells = []
        for s in SYSTEMS[:3]:
            r = next((x for x in rows if x["part"] == "readers" and x["system"] == s
                      and x["readers"] == n), None)
            one = next((x for x in rows if x["part"] == "readers" and x["system"] == s
                        and x["readers"] == counts[0]), None)
            cells.append("–" if r is None else
                         f"{r['qps']:,.0f} q/s ({r['qps'] / one['qps']:.2f}x)")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(1, len(systems))
    for k, s in enumerate(systems):
        vals = [(find(rows, s, q) or {}).get("p50_us", 0) for q in QUERIES]
        a.bar([i + k * width for i in range(len(QUERIES))], vals, width, label=LABELS[s])
    a.set_xticks([i + 0.4 - width / 2 for i in range(len(QUERIES))])
    a.set_xticklabels(QUERIES)
    a.set_yscale("log")
    a.set_ylabel("p50 latency (µs, log)")
    a.set_title("Social queries, one process")
    a.legend(fontsize=7)
    for s in SYSTEMS[:3]:
        pts = sorted((r["readers"], r["qps"]) for r in rows if r["part"] == "readers"
                     and r["system"] == s)
        if pts:
            b.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=LABELS[s])
    b.set_xlabel("reader processes")
    b.set_ylabel("queries/s (all readers)")
    b.set_title("Readers of one database at once")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=10, help="1000 users per unit (default 10)")
    ap.add_argument("--seconds", type=float, default=1.5, help="measured seconds per query")
    ap.add_argument("--readers", default="1,2,4")
    ap.add_argument("--memory", default="1GiB", help="per memory server")
    ap.add_argument("--cache-mib", type=int, default=0,
                    help="every SQLite connection's page cache in MiB (PRAGMA cache_size; "
                         "default 0: SQLite's own, 2 MB); results go to sqlite_vfs_cacheN")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    ap.add_argument("--reader", help=argparse.SUPPRESS)  # internal: one reader process
    args = ap.parse_args(argv)
    if args.reader:
        spec = json.loads(args.reader)
        print(json.dumps(reader(spec["target"], spec["uri"], spec["meta"], spec["seconds"],
                                spec["seed"], spec["start_at"], spec.get("queries", QUERIES),
                                spec["cache_mib"])))
        return 0
    if os.geteuid() != 0:
        print("sqlite_vfs: needs root (network namespaces)", file=sys.stderr)
        return 1
    load_start = os.getloadavg()
    rows, notes = measure(args.scale, args.seconds, [int(n) for n in args.readers.split(",")],
                          args.memory, args.cache_mib)
    cmd = (f"bench/experiments/sqlite_vfs --scale {args.scale} --seconds {args.seconds} "
           f"--readers {args.readers}" + (f" --cache-mib {args.cache_mib}" if args.cache_mib else ""))
    header = (peers.measured(rows[0], cmd, loads=(load_start, os.getloadavg())) + " p50 latency of one query, one process; in "
              "brackets the ratio to SQLite on a local file.\n\n")
    name = f"sqlite_vfs_cache{args.cache_mib}" if args.cache_mib else "sqlite_vfs"
    peers.publish(args.out, name, rows, header + table(rows, notes),
                  lambda path: plot(rows, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
