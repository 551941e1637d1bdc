"""Seed 001 on one machine: the social-network database is larger than the memory a compute
process may use. The compute process runs in a memory cgroup with a limit (`--limit`, default
64 MiB) below the size of the database at `--scale`:

  pool        the network is loaded into a 2-server shm cluster by a loader process outside the
              cgroup (the memory servers hold it); the query process `bench social --attach`
              runs inside the cgroup. Expected: same latency as without the limit.
  local       `bench social --engine local` inside the cgroup: the data must fit in the
              process. Expected: killed by the cgroup's OOM killer while loading (reported:
              exit signal, rows loaded by then, the cgroup's peak and OOM-kill count).
  sqlite      the database file on disk (/var/tmp), loaded outside the cgroup, its pages
              dropped from the page cache (posix_fadvise DONTNEED), then queried by a process
              inside the cgroup: its page cache is bounded by the limit.
  postgresql  data directory on disk, shared_buffers 16MB, loaded; then restarted with the
              postmaster inside the cgroup (every backend inherits it) after dropping its
              files from the page cache; pgbench (outside) runs the queries.

Every system is also measured without the limit (a cgroup without limit, which still records
the peak memory of the run). Output: bench/results/beyond_memory.jsonl, beyond_memory.md and
beyond_memory.png (p50 per query, with and without the limit).

Cgroups: the memory controller of cgroup v2 (memory.max) if this machine's unified hierarchy
has it, else cgroup v1 (memory.limit_in_bytes, and memory.memsw.limit_in_bytes if present);
the groups are children of this process's own memory cgroup. Needs root. Without a usable
memory cgroup the script says why and runs `local` with `--local-memory` set to the limit
(the engine's own budget) instead, and skips the SQL peers' limited runs.

Usage: bench/experiments/beyond_memory [--scale 40] [--limit 64MiB] [--seconds S]
                                       [--systems pool,local,sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from farpool.harness import peers
from farpool.harness.peers import log

QUERIES = ["q1", "q2", "q3", "q4", "q5", "q6"]


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(f"bad size {text!r} (e.g. 160MiB)")
    return int(float(m.group(1)) * 1024 ** "BKMGT".index((m.group(2) or "B").upper()))


# ------------------------------------------------------------------ memory cgroups

class MemoryCgroup:
    """A child memory cgroup of this process's own, with a limit (None: no limit, still
    accounted). Processes enter it through prefix(cmd). Removed on close."""

    def __init__(self, name: str, limit: int | None):
        self.limit = limit
        self.path, self.version = self._create(name)

    @staticmethod
    def _own(controller: str) -> tuple[Path, int] | None:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.exists() and "memory" in v2.read_text().split():
            rel = next(l.split(":", 2)[2] for l in lines if l.startswith("0::"))
            return Path("/sys/fs/cgroup") / rel.lstrip("/"), 2
        for l in lines:
            _, ctrls, rel = l.split(":", 2)
            if controller in ctrls.split(","):
                base = Path("/sys/fs/cgroup") / controller
                if base.exists():
                    return base / rel.lstrip("/"), 1
        return None

    @classmethod
    def why_unavailable(cls) -> str | None:
        if os.geteuid() != 0:
            return "not root (cgroups need root here)"
        own = cls._own("memory")
        if own is None:
            return "no memory controller in /sys/fs/cgroup (neither cgroup v2 memory.max nor v1 memory)"
        try:
            probe = cls("farpool-probe", 64 << 20)
            probe.close()
        except OSError as e:
            return f"cannot create a memory cgroup under {own[0]}: {e}"
        return None

    def _create(self, name: str) -> tuple[Path, int]:
        own = self._own("memory")
        if own is None:
            raise OSError("no memory cgroup controller")
        base, version = own
        path = base / f"{name}-{os.getpid()}"
        path.mkdir()
        if self.limit is not None:
            if version == 2:
                (path / "memory.max").write_text(str(self.limit))
                if (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(self.limit))
                if (path / "memory.memsw.limit_in_bytes").exists():
                    (path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
        return path, version

    def prefix(self, cmd: list[str]) -> list[str]:
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *cmd]

    def stats(self) -> dict:
        def read(name):
            p = self.path / name
            return p.read_text() if p.exists() else ""
        if self.version == 2:
            ev = dict(l.split() for l in read("memory.events").splitlines() if l)
            return {"peak_bytes": int(read("memory.peak") or 0), "oom_kills": int(ev.get("oom_kill", 0)),
                    "limit_hits": int(ev.get("max", 0))}
        oom = dict(l.split() for l in read("memory.oom_control").splitlines() if l)
        return {"peak_bytes": int(read("memory.max_usage_in_bytes") or 0),
                "oom_kills": int(oom.get("oom_kill", 0)), "limit_hits": int(read("memory.failcnt") or 0)}

    def close(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)  # its last process may still be exiting


def drop_page_cache(root: str) -> None:
    """Evicts the clean cached pages of every file under root (only those files)."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            try:
                fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def du(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs
               if os.path.isfile(os.path.join(d, f)))


# ------------------------------------------------------------------ systems

def farpool_cmd(engine: str, args, extra: list[str]) -> list[str]:
    return [str(peers.farpool_bin()), "bench", "social", "--engine", engine, "--scale", str(args.scale),
            "--seed", str(args.seed), "--query", "all", "--seconds", str(args.seconds), "--json", *extra]


def run_in(cg: MemoryCgroup | None, cmd: list[str], timeout: float = 1800) -> tuple[int, str, str]:
    full = cg.prefix(cmd) if cg else cmd
    p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def query_rows(system: str, limited: bool, result: dict, stats: dict) -> list[dict]:
    return [{"experiment": "beyond_memory", "system": system, "limited": limited, "query": q["query"],
             "p50_us": q["p50_us"], "p99_us": q["p99_us"], "mean_us": q["mean_us"], "qps": q["qps"],
             "count": q["count"], "status": "ok", **stats} for q in result["queries"]]


def describe_failure(rc: int, err: str, stats: dict) -> str:
    how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
    if rc in (-9, 137) and stats.get("oom_kills"):
        how += " (SIGKILL from the cgroup's OOM killer)"
    progress = [l for l in re.split(r"[\r\n]", err) if "loading" in l]
    tail = progress[-1].strip() if progress else (err.strip()[-300:] or "none (killed before the first progress line)")
    return f"{how}; last output: {tail}"


def measure_pool(args, limit, rows, notes):
    cluster = peers.Cluster(2, args.memory, "shm")
    path = cluster.__enter__()
    try:
        log(f"== pool: loading scale {args.scale} into the memory servers (loader outside the cgroup)")
        load = peers.run_json(farpool_cmd("pool", args, ["--cluster", path, "--load-only", "--verify"]),
                              stream_stderr=True)
        notes["pool"] = (f"loaded by a process outside the cgroup in {load['load_seconds']:.1f} s "
                         f"({load['rows']:,} rows); the memory servers run outside it")
        for limited in (False, True):
            cg = MemoryCgroup("farpool-pool", limit if limited else None)
            try:
                rc, out, err = run_in(cg, farpool_cmd("pool", args, ["--cluster", path, "--attach", "--verify"]))
                stats = cg.stats()
            finally:
                cg.close()
            if rc != 0:
                rows.append({"experiment": "beyond_memory", "system": "pool", "limited": limited,
                             "status": describe_failure(rc, err, stats), **stats})
                log(f"   pool limited={limited}: FAILED {rows[-1]['status']}")
                continue
            rows += query_rows("pool", limited, json.loads(out.strip().splitlines()[-1]), stats)
            log(f"   pool limited={limited}: ok, peak {stats['peak_bytes'] / 2**20:.0f} MiB")
    finally:
        cluster.__exit__(None, None, None)


def measure_local(args, limit, rows, notes, use_cgroup: bool):
    for limited in (False, True):
        extra = ["--verify", "--local-memory", "4GiB"]
        if limited and not use_cgroup:
            extra = ["--verify", "--local-memory", str(limit)]
        cg = MemoryCgroup("farpool-local", limit if limited else None) if use_cgroup else None
        log(f"== local{' under the limit' if limited else ''}: loading scale {args.scale} in the process")
        try:
            rc, out, err = run_in(cg, farpool_cmd("local", args, extra))
            stats = cg.stats() if cg else {}
        finally:
            if cg:
                cg.close()
        if rc != 0:
            status = describe_failure(rc, err, stats)
            rows.append({"experiment": "beyond_memory", "system": "local", "limited": limited,
                         "status": status, **stats})
            log(f"   local limited={limited}: FAILED {status}")
            continue
        r = json.loads(out.strip().splitlines()[-1])
        rows += query_rows("local", limited, r, stats)
        if not limited:
            notes["local"] = (f"without the limit the process peaks at {stats.get('peak_bytes', 0) / 2**20:.0f} MiB "
                              f"(scale {args.scale}: {r['rows']:,} rows, loaded in {r['load_seconds']:.1f} s)")
        log(f"   local limited={limited}: ok")


def sqlite_child(db: str, meta: dict, seconds: float) -> None:
    """The query process of the SQLite runs (inside or outside the cgroup): one JSON line."""
    out = []
    for q in QUERIES:
        r = peers.time_queries(sqlite3.connect(db), [q], meta, seconds, seed=42)
        out.append({"query": q, "qps": r["qps"], **r})
    print(json.dumps({"queries": out}))


def measure_sqlite(args, limit, rows, notes, export: Path):
    meta = peers.read_meta(export)
    with peers.SQLiteDb() as lite:
        log("== SQLite: loading the CSV export into a file on disk (outside the cgroup)")
        load = lite.load_social(export)
        lite.verify_social(export)
        size = du(lite.dir)
        notes["sqlite"] = f"database file {size / 2**20:.0f} MiB on /var/tmp (disk), loaded in {load:.0f} s"
        for limited in (False, True):
            if limited:
                drop_page_cache(lite.dir)
            cg = MemoryCgroup("farpool-sqlite", limit if limited else None)
            child = [sys.executable, "-m", "farpool.harness.beyond_memory", "--sqlite-child", lite.target,
                     "--seconds", str(args.seconds), "--meta", json.dumps(meta)]
            try:
                env_cmd = ["env", f"PYTHONPATH={peers.ROOT / 'python'}", *child]
                rc, out, err = run_in(cg, env_cmd)
                stats = cg.stats()
            finally:
                cg.close()
            if rc != 0:
                rows.append({"experiment": "beyond_memory", "system": "sqlite", "limited": limited,
                             "status": describe_failure(rc, err, stats), **stats})
                continue
            rows += query_rows("sqlite", limited, json.loads(out.strip().splitlines()[-1]), stats)
            log(f"   sqlite limited={limited}: ok, peak {stats['peak_bytes'] / 2**20:.0f} MiB")


def measure_postgres(args, limit, rows, notes, export: Path):
    meta = peers.read_meta(export)
    pg = peers.Postgres(in_ram=False, shared_buffers="16MB")
    with pg:
        log("== PostgreSQL: loading the CSV export (data directory on disk, shared_buffers 16MB)")
        load = pg.load_social(export)
        pg.verify_social(export)
        size = du(pg.data)
        notes["postgresql"] = (f"data directory {size / 2**20:.0f} MiB on /var/tmp (disk), shared_buffers "
                               f"16MB, loaded in {load:.0f} s")
        pg_ctl = str(peers.PG_BIN / "pg_ctl")
        opts = (f"-p {pg.port} -k {pg.dir} -c listen_addresses='' -c shared_buffers=16MB "
                "-c max_connections=200")
        for limited in (False, True):
            pg._as_postgres([pg_ctl, "-D", pg.data, "-m", "fast", "-w", "stop"])
            drop_page_cache(pg.data)
            cg = MemoryCgroup("farpool-pg", limit if limited else None)
            try:
                start = [pg_ctl, "-D", pg.data, "-l", os.path.join(pg.dir, "log"), "-w", "-o", opts, "start"]
                if os.geteuid() == 0:
                    start = ["runuser", "-u", "postgres", "--"] + start
                rc, out, err = run_in(cg, start)
                if rc != 0:
                    raise RuntimeError(f"PostgreSQL did not start in the cgroup: {err.strip()[-300:]}")
                result = []
                for q in QUERIES:
                    r = pg.social_query(q, meta, 1, args.seconds)
                    result.append({"query": q, **r})
                stats = cg.stats()
            finally:
                pg._as_postgres([pg_ctl, "-D", pg.data, "-m", "fast", "-w", "stop"])
                cg.close()
            rows += query_rows("postgresql", limited, {"queries": result}, stats)
            log(f"   postgresql limited={limited}: ok, peak {stats['peak_bytes'] / 2**20:.0f} MiB")
        # Postgres.__exit__ stops it again (already stopped) and removes the directory.
        pg._as_postgres([pg_ctl, "-D", pg.data, "-o", opts, "-l", os.path.join(pg.dir, "log"), "-w", "start"])


# ------------------------------------------------------------------ report

LABELS = {"pool": "farpool pool (shm)", "local": "farpool local", "sqlite": "SQLite (file)",
          "postgresql": "PostgreSQL (disk, 16MB shared_buffers)"}


def table(rows, notes, args, limit, ctx, elapsed, mode) -> str:
    systems = [s for s in LABELS if any(r["system"] == s for r in rows)]
    get = lambda s, lim, q: next((r for r in rows if r["system"] == s and r["limited"] == lim
                                  and r.get("query") == q), None)
    fail = lambda s, lim: next((r for r in rows if r["system"] == s and r["limited"] == lim
                                and r["status"] != "ok"), None)
    lines = [peers.measured(ctx, f"bench/experiments/beyond_memory --scale {args.scale} --limit "
                            f"{args.limit} --seconds {args.seconds}", elapsed) + f" {mode}. p50 latency of each query, one flow, "
             "without the limit → with it (ratio).\n",
             "| query | " + " | ".join(LABELS[s] for s in systems) + " |", "|---" * (len(systems) + 1) + "|"]
    for q in QUERIES:
        cells = []
        for s in systems:
            a, b = get(s, False, q), get(s, True, q)
            if a and b:
                cells.append(f"{a['p50_us']:.1f} → {b['p50_us']:.1f} µs ({b['p50_us'] / a['p50_us']:.1f}x)")
            elif a and fail(s, True):
                cells.append(f"{a['p50_us']:.1f} µs → fails")
            else:
                cells.append("–")
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    lines.append("")
    for s in systems:
        peaks = {lim: next((r.get("peak_bytes") for r in rows if r["system"] == s and r["limited"] == lim), None)
                 for lim in (False, True)}
        f = fail(s, True)
        desc = f"- {LABELS[s]}: "
        if peaks[False] is not None:
            desc += f"peak memory of the measured process(es) without the limit {peaks[False] / 2**20:.0f} MiB"
        if peaks[True] is not None:
            desc += f", under it {peaks[True] / 2**20:.0f} MiB"
        if f:
            desc += f"; under the limit: {f['status']}"
        lines.append(desc)
    for k, v in notes.items():
        lines.append(f"- {LABELS.get(k, k)}: {v}")
    return "\n".join(lines) + "\n"


def plot(rows, path: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bars = [(s, lim) for s in LABELS for lim in (False, True)
            if any(r["system"] == s and r["limited"] == lim and r["status"] == "ok" for r in rows)]
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / max(1, len(bars))
    for k, (s, lim) in enumerate(bars):
        vals = [next((r["p50_us"] for r in rows if r["system"] == s and r["limited"] == lim
                      and r.get("query") == q), 0) for q in QUERIES]
        ax.bar([i + k * width for i in range(len(QUERIES))], vals, width,
               label=f"{LABELS[s]}{', limited to ' + args.limit if lim else ''}",
               hatch="//" if lim else None)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(QUERIES))])
    ax.set_xticklabels(QUERIES)
    ax.set_yscale("log")
    ax.set_ylabel("p50 latency (µs, log)")
    ax.set_title(f"Database larger than the compute process's memory limit ({args.limit}), scale {args.scale:g} "
                 "(cf. seed 001)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=40, help="1000 users per unit (default 40)")
    ap.add_argument("--limit", default="64MiB", help="memory limit of the compute process's cgroup")
    ap.add_argument("--seconds", type=float, default=1.0, help="measured seconds per query")
    ap.add_argument("--systems", default="pool,local,sqlite,postgresql")
    ap.add_argument("--memory", default="2GiB", help="per memory server")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    ap.add_argument("--sqlite-child", help=argparse.SUPPRESS)
    ap.add_argument("--meta", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sqlite_child:
        sqlite_child(args.sqlite_child, json.loads(args.meta), args.seconds)
        return 0
    limit = parse_size(args.limit)
    why = MemoryCgroup.why_unavailable()
    use_cgroup = why is None
    mode = (f"Limit: a memory cgroup ({'v2 memory.max' if use_cgroup and MemoryCgroup._own('memory')[1] == 2 else 'v1 memory.limit_in_bytes'}) "
            f"of {args.limit}" if use_cgroup else f"No memory cgroup ({why}): local runs with --local-memory {args.limit}")
    log(f"== {mode}")
    rows, notes = [], {}
    t0 = time.time()
    systems = args.systems.split(",")
    export_dir = None
    try:
        for system in systems:
            try:
                if system == "pool" and use_cgroup:
                    measure_pool(args, limit, rows, notes)
                elif system == "local":
                    measure_local(args, limit, rows, notes, use_cgroup)
                elif system in ("sqlite", "postgresql") and use_cgroup:
                    if export_dir is None:
                        export_dir = tempfile.mkdtemp(prefix="farpool-export-", dir="/var/tmp")
                        peers.export_social(args.scale, export_dir, seed=args.seed)
                    (measure_sqlite if system == "sqlite" else measure_postgres)(args, limit, rows, notes,
                                                                                 Path(export_dir))
                else:
                    notes[system] = f"skipped: {why or 'unknown system'}"
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                log(f"   {system} failed: {e}")
                notes[system] = f"failed: {str(e)[:300]}"
    finally:
        if export_dir:
            shutil.rmtree(export_dir, ignore_errors=True)
    if not rows:
        print("beyond_memory: nothing measured", file=sys.stderr)
        return 1
    ctx = peers.context()
    for r in rows:
        r.update({"scale": args.scale, "limit_bytes": limit, "cgroup": use_cgroup, **ctx})
    md = table(rows, notes, args, limit, ctx, time.time() - t0, mode)
    peers.publish(args.out, "beyond_memory", rows, md, lambda path: plot(rows, path, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
