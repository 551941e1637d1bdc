"""Bulk loading (issue 9): rows per second loading the social network, farpool against
PostgreSQL's COPY of the same rows, same machine, same run.

  pool-shm        `farpool bench social --load-only` on a fresh 2-server cluster over shared
                  memory (`Database::NewLoader`: whole chunks, B+trees built bottom-up)
  pool-tcp        the same over TCP, every server in its own network namespace, event
                  progress (plain loopback TCP if namespaces fail, said in the notes)
  postgresql      PostgreSQL 15 on tmpfs (fsync off), `\\copy` of the generator's CSV export
                  through psql over its Unix socket, then the same indexes and VACUUM ANALYZE
  postgresql-tcp  the same, the server in its own network namespace, psql over TCP

--binary NAME=PATH (repeatable) loads with other farpool builds too, for A/B comparisons of
the loader (`--binary main=/work/main/build/farpool`); the build under test is "this". Every
point runs on a fresh cluster or server, round-robin over --rounds, so a shared machine's
load spreads over all systems; the .md reports the median and the range.

Output: bench/results/bulkload.jsonl (every run), bulkload.md (median seconds and rows/s per
system, build and scale; the speed-up over PostgreSQL on the same fabric).

Usage: bench/experiments/bulkload [--scales 1,30] [--systems pool-shm,pool-tcp,postgresql,
                                  postgresql-tcp] [--rounds 3] [--threads 1]
                                  [--binary NAME=PATH ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from farpool.harness import peers
from farpool.harness.peers import log

SYSTEMS = ["pool-shm", "pool-tcp", "postgresql", "postgresql-tcp"]
# The PostgreSQL system loading over the same fabric as each farpool system.
PEER = {"pool-shm": "postgresql", "pool-tcp": "postgresql-tcp"}


@contextlib.contextmanager
def pool_cluster(binary: Path, transport: str, notes: dict):
    """A fresh 2-server cluster of `binary` (1 GiB each): TCP ones in network namespaces."""
    saved = os.environ.get("FARPOOL_BIN")
    os.environ["FARPOOL_BIN"] = str(binary)
    try:
        try:
            cluster = peers.Cluster(2, "1GiB", transport, netns=transport == "tcp",
                                    progress="event")
            path = cluster.__enter__()
        except RuntimeError as e:
            if transport != "tcp":
                raise
            notes["pool-tcp"] = f"--netns failed ({str(e)[:120]}); plain TCP loopback"
            cluster = peers.Cluster(2, "1GiB", transport, progress="event")
            path = cluster.__enter__()
        try:
            yield path
        finally:
            cluster.__exit__(None, None, None)
    finally:
        if saved is None:
            os.environ.pop("FARPOOL_BIN", None)
        else:
            os.environ["FARPOOL_BIN"] = saved


def load_pool(binary: Path, system: str, scale: float, threads: int, notes: dict) -> dict:
    with pool_cluster(binary, "tcp" if system == "pool-tcp" else "shm", notes) as cluster:
        r = peers.run_json([str(binary), "bench", "social", "--cluster", cluster, "--engine",
                            "pool", "--scale", str(scale), "--load-only", "--load-threads",
                            str(threads), "--verify", "--json"])
    return {"rows": r["rows"], "seconds": r["load_seconds"]}


def load_postgres(system: str, export: Path) -> dict:
    with contextlib.ExitStack() as stack:
        netns = (stack.enter_context(peers.Netns(1)), 0) if system == "postgresql-tcp" else None
        pg = stack.enter_context(peers.Postgres(in_ram=True, netns=netns))
        seconds = pg.load_social(export)
        pg.verify_social(export)
    rows = sum(sum(1 for _ in open(export / f)) - 1 for _, f in peers.TABLES)
    return {"rows": rows, "seconds": seconds}


def table(rows: list[dict], scales: list[float], systems: list[str]) -> list[str]:
    """Median seconds (range, runs) per system, build and scale, rows/s and the speed-up over
    the PostgreSQL peer on the same fabric (its median seconds / this one's)."""
    def runs(who: str, system: str, scale: float) -> list[dict]:
        return [r for r in rows if r["who"] == who and r["system"] == system and r["scale"] == scale]

    whos = list(dict.fromkeys(r["who"] for r in rows))
    lines = ["| system | build | scale | rows stored | seconds, median (range; runs) | rows/s | "
             "speed vs PostgreSQL, same fabric (its seconds / these) |", "|---|---|---|---|---|---|---|"]
    for scale in scales:
        for system in systems:
            for who in whos:
                got = runs(who, system, scale)
                if not got:
                    continue
                secs = [r["seconds"] for r in got]
                med = statistics.median(secs)
                peer = [r["seconds"] for r in runs("postgresql", PEER.get(system, ""), scale)]
                ratio = f"{statistics.median(peer) / med:.1f}x" if peer else "–"
                lines.append(f"| {system} | {who} | {scale:g} | {got[0]['rows']:,} | {med:.2f} "
                             f"({min(secs):.2f}–{max(secs):.2f}; {len(secs)}) | "
                             f"{got[0]['rows'] / med:,.0f} | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    peers.stop_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="1,30")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="farpool's load sessions")
    ap.add_argument("--binary", action="append", default=[], metavar="NAME=PATH",
                    help="also load with this farpool build (A/B)")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    scales = [float(s) for s in args.scales.split(",")]
    systems = peers.systems_arg(ap, args.systems, SYSTEMS)
    builds = {"this": peers.farpool_bin()}
    for b in args.binary:
        name, sep, path = b.partition("=")
        if not sep or not Path(path).is_file():
            ap.error(f"--binary {b}: expected NAME=PATH of a farpool binary")
        builds[name] = Path(path)
    ctx = peers.context()
    start, t0 = os.getloadavg(), time.monotonic()
    rows: list[dict] = []
    notes: dict[str, str] = {}
    for scale in scales:
        with tempfile.TemporaryDirectory(prefix="farpool-export-", dir="/dev/shm") as d:
            export = None
            for rnd in range(args.rounds):
                for system in systems:
                    points = builds.items() if system.startswith("pool") else [("postgresql", None)]
                    for who, binary in points:
                        load0 = os.getloadavg()[0]
                        try:
                            if binary is not None:
                                r = load_pool(binary, system, scale, args.threads, notes)
                            else:
                                export = export or peers.export_social(scale, d)
                                r = load_postgres(system, export)
                        except RuntimeError as e:
                            notes[f"{system} {who} scale {scale:g}"] = str(e)[-300:]
                            log(f"   {system} ({who}) scale {scale:g} failed: {e}")
                            continue
                        row = {"experiment": "bulkload", "system": system, "who": who,
                               "scale": scale, "rows": r["rows"], "seconds": r["seconds"],
                               "rows_per_s": r["rows"] / r["seconds"], "round": rnd,
                               "load_threads": args.threads if binary is not None else 1,
                               "load_before": load0, "load_after": os.getloadavg()[0], **ctx}
                        rows.append(row)
                        log(f"== {system} ({who}) scale {scale:g}: {row['rows']:,} rows in "
                            f"{row['seconds']:.2f} s = {row['rows_per_s']:,.0f} rows/s "
                            f"(load {load0:.1f} -> {row['load_after']:.1f})")
    if not rows:
        return 1
    command = "bench/experiments/bulkload " + " ".join(sys.argv[1:] if argv is None else argv)
    md = [peers.measured(ctx, command.strip(), time.monotonic() - t0, (start, os.getloadavg())),
          "Seconds to load the social network (users, messages, friendships, groups, memberships "
          f"and their indexes); farpool with {args.threads} load session(s), PostgreSQL with "
          "psql's `\\copy` of the generator's CSV export, the same indexes and VACUUM ANALYZE. "
          "Rows stored: farpool counts its index tables' rows too (the bench's `rows`), "
          "PostgreSQL the CSV rows, so compare seconds. Every run is checked: farpool's "
          "`--verify`, PostgreSQL's sampled answers.\n", *table(rows, scales, systems)]
    md += [f"\n- {k}: {v}" for k, v in notes.items()]
    peers.publish(args.out, "bulkload", rows, "\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
