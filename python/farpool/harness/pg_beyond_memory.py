"""Seed 001 ("Adaptive Memory System over Ethernet"): PostgreSQL's pgbench (TPC-B-like) keeps
>79% of its all-in-memory throughput when the database outgrows RAM, the data reaching the
host from memory over a network. Here the postmaster (and so every backend) runs in a memory
cgroup whose limit (`--limit`, default 256 MiB) is about a quarter of the database
(`--scale auto`: pgbench's scale for a database ~4x the limit), page cache included, and its
data directory is on:

  memory       tmpfs (/dev/shm), in a cgroup without a limit: the all-in-memory run, the
               reference of every ratio (fsync on; on tmpfs it has nothing to write)
  disk         the local disk (/var/tmp), under the limit: what does not fit is read from disk
  farpool-shm  the farpool FUSE mount (`farpool mount`, 2 memory servers over shared memory),
               under the limit: what does not fit is read from the pool through the mount's
               daemon, which runs outside the cgroup with the servers
  farpool-tcp  the same over TCP, every server in its own network namespace (not in the
               default list)
  disk-nolimit the local disk without a limit (optional)

fsync stays on (PostgreSQL's defaults except shared_buffers, `--shared-buffers` 32MB, and
max_connections). The database is made once per scale (`pgbench -i`, a template data directory
kept in --template-dir) and copied to each medium; the copy's pages are dropped from the page
cache (posix_fadvise DONTNEED) so the limited postmaster starts cold and pays for what it
reads. Then, per system, pgbench (outside the cgroup, Unix socket) runs the built-in
tpcb-like script with `-M prepared` at each client count of `--clients` (1,16,100) for
`--seconds` after a `--warmup`; tps from pgbench, latency p50/p99 from its per-transaction log
(-l). Systems run one after the other, `--repeat` times round-robin (tables: medians).

The cgroup code is beyond_memory's (v1 memory.limit_in_bytes here, v2 memory.max elsewhere).
Output: bench/results/pg_beyond_memory.{jsonl,md,png}.

Usage: bench/experiments/pg_beyond_memory [--limit 256MiB] [--scale auto] [--clients 1,16,100]
         [--seconds 30] [--systems memory,disk,farpool-shm] [--farpool-dir DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from farpool.harness import peers
from farpool.harness.beyond_memory import MemoryCgroup, drop_page_cache, du, parse_size
from farpool.harness.peers import PG_BIN, log

SYSTEMS = ["memory", "disk", "farpool-shm", "farpool-tcp", "disk-nolimit"]
LABELS = {"memory": "all in memory (tmpfs, no limit)", "disk": "local disk, limited",
          "farpool-shm": "farpool mount (shm), limited", "farpool-tcp": "farpool mount (tcp), limited",
          "disk-nolimit": "local disk, no limit"}
MIB_PER_SCALE = 15  # pgbench's tables + indexes per scale unit on PostgreSQL 15 (measured: 979 MiB at scale 64)


def as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--"] + cmd if os.geteuid() == 0 else cmd


def make_template(args, scale: int) -> Path:
    """A stopped data directory with pgbench's tables at `scale`, kept for later runs."""
    d = Path(args.template_dir) / f"pgbench-s{scale}"
    if (d / "done").exists():
        return d / "data"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(d, "postgres", "postgres")
    data, sock = d / "data", tempfile.mkdtemp(prefix="farpool-pgsock-")
    if os.geteuid() == 0:
        shutil.chown(sock, "postgres", "postgres")
    port = peers.free_port()
    log(f"== pgbench -i -s {scale} into the template {data} (once per scale)")
    t0 = time.time()
    try:
        run(as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]))
        run(as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(d / "log"), "-w", "-o",
                         f"-p {port} -k {sock} -c listen_addresses=''", "start"]))
        try:
            run(["pgbench", "-h", sock, "-p", str(port), "-U", "postgres", "-i", "-q", "-s", str(scale),
                 "postgres"], timeout=3600)
            run(["psql", "-h", sock, "-p", str(port), "-U", "postgres", "-c", "CHECKPOINT", "postgres"])
        finally:
            run(as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]))
    finally:
        shutil.rmtree(sock, ignore_errors=True)
    (d / "done").write_text(f"{time.time() - t0:.0f} s\n")
    return data


def run(cmd: list[str], timeout: float = 600) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    return out.stdout


class Server:
    """A copy of the template on `root`, its postmaster started in cgroup `cg`."""

    def __init__(self, template: Path, root: str, cg: MemoryCgroup, args):
        self.dir = tempfile.mkdtemp(prefix="farpool-pgdata-", dir=root)
        self.data = os.path.join(self.dir, "data")
        self.sock = tempfile.mkdtemp(prefix="farpool-pgsock-")
        self.cg, self.args = cg, args
        self.port = peers.free_port()
        self.started = False
        self.template = template

    def __enter__(self) -> "Server":
        try:
            t0 = time.time()
            run(["cp", "-a", str(self.template), self.data], timeout=1800)
            self.copy_seconds = time.time() - t0
            if os.geteuid() == 0:
                for p in (self.dir, self.sock):
                    shutil.chown(p, "postgres", "postgres")
            drop_page_cache(self.data)
            opts = (f"-p {self.port} -k {self.sock} -c listen_addresses='' "
                    f"-c shared_buffers={self.args.shared_buffers} -c max_connections={max(self.args.clients_list) + 10}")
            start = as_postgres([str(PG_BIN / "pg_ctl"), "-D", self.data, "-l",
                                 os.path.join(self.sock, "log"), "-w", "-t", "300", "-o", opts, "start"])
            out = subprocess.run(self.cg.prefix(start), capture_output=True, text=True, timeout=400)
            if out.returncode != 0:
                logtext = Path(self.sock, "log").read_text()[-400:] if Path(self.sock, "log").exists() else ""
                raise RuntimeError(f"PostgreSQL did not start: {out.stderr.strip()[-200:]} {logtext}")
            self.started = True
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.started:
            subprocess.run(as_postgres([str(PG_BIN / "pg_ctl"), "-D", self.data, "-m", "immediate",
                                        "-w", "stop"]), capture_output=True, text=True)
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.sock, ignore_errors=True)

    def pgbench(self, clients: int, seconds: float) -> dict:
        work = tempfile.mkdtemp(prefix="farpool-pgbench-")
        try:
            cmd = ["pgbench", "-h", self.sock, "-p", str(self.port), "-U", "postgres", "-n", "-M",
                   "prepared", "-b", "tpcb-like", "-c", str(clients), "-j", str(min(clients, 2)),
                   "-T", str(max(1, round(seconds))), "-l", "--log-prefix", os.path.join(work, "log"),
                   "postgres"]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=seconds * 4 + 600)
            if out.returncode != 0:
                raise RuntimeError(f"pgbench -c {clients} failed: {(out.stderr or out.stdout).strip()[-400:]}")
            r = peers.percentiles(peers.pgbench_latencies(work))
            tps = peers.pgbench_tps(out.stdout)
            r["tps"] = tps if tps is not None else r["count"] / max(1, round(seconds))
            failed = [l for l in out.stdout.splitlines() if "failed transactions" in l]
            r["failed"] = failed[0].split(":")[1].strip() if failed else ""
            return r
        finally:
            shutil.rmtree(work, ignore_errors=True)


def measure(args, system: str, root: str, template: Path, limit: int, rep: int) -> list[dict]:
    limited = system in ("disk", "farpool-shm", "farpool-tcp")
    cg = MemoryCgroup("farpool-pgbm", limit if limited else None)
    rows = []
    try:
        with Server(template, root, cg, args) as srv:
            log(f"   {system}: copied the database in {srv.copy_seconds:.0f} s, postmaster started"
                f"{' under ' + args.limit if limited else ' without a limit'}")
            if args.warmup > 0:
                srv.pgbench(1, args.warmup)
            for c in args.clients_list:
                load0 = os.getloadavg()[0]
                try:
                    r = srv.pgbench(c, args.seconds)
                    status = "ok"
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    r, status = {}, str(e)[:300]
                st = cg.stats()
                row = {"experiment": "pg_beyond_memory", "system": system, "limited": limited,
                       "clients": c, "rep": rep, "status": status, "load_avg_start": load0,
                       "load_avg_end": os.getloadavg()[0], "copy_seconds": srv.copy_seconds,
                       **{k: r[k] for k in ("tps", "p50_us", "p99_us", "mean_us", "count", "failed") if k in r},
                       **{f"cgroup_{k}": v for k, v in st.items()}}
                rows.append(row)
                log(f"   {system} -c {c}: " + (f"{row['tps']:.0f} tps, p50 {row['p50_us'] / 1000:.1f} ms, "
                                               f"p99 {row['p99_us'] / 1000:.1f} ms, cgroup peak "
                                               f"{st['peak_bytes'] / 2**20:.0f} MiB (load {load0:.1f})"
                                               if status == "ok" else status))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        rows.append({"experiment": "pg_beyond_memory", "system": system, "limited": limited, "rep": rep,
                     "clients": None, "status": f"failed: {str(e)[:300]}"})
        log(f"   {system}: FAILED {e}")
    finally:
        cg.close()
    return rows


def med(rows, system, clients, key):
    vals = [r[key] for r in rows if r["system"] == system and r.get("clients") == clients
            and r["status"] == "ok" and key in r]
    return statistics.median(vals) if vals else None


def table(rows, systems, args, notes, ctx, elapsed, loads) -> str:
    lines = [f"Measured {ctx['time']} on {ctx['host']} ({ctx['cores']} cores), git {ctx['git_sha']}, "
             f"`bench/experiments/pg_beyond_memory --limit {args.limit} --scale {args.scale_n} --clients "
             f"{args.clients} --seconds {args.seconds:g} --repeat {args.repeat} --mount-cache "
             f"{args.mount_cache}` ({elapsed:.0f} s); load "
             f"average {loads[0]:.1f} at start, {loads[1]:.1f} at end. pgbench tpcb-like, -M prepared, fsync on, "
             f"shared_buffers {args.shared_buffers}; median of {args.repeat} run(s).\n"]
    head = ["clients"] + [f"{LABELS[s]} tps" for s in systems]
    ratio_pairs = [(s, "memory") for s in systems if s != "memory" and "memory" in systems]
    ratio_pairs += [(s, "disk") for s in systems if s.startswith("farpool") and "disk" in systems]
    head += [f"{a} / {b}" for a, b in ratio_pairs]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in args.clients_list:
        cells = [str(c)]
        for s in systems:
            t = med(rows, s, c, "tps")
            cells.append(f"{t:,.0f}" if t is not None else "fails")
        for a, b in ratio_pairs:
            ta, tb = med(rows, a, c, "tps"), med(rows, b, c, "tps")
            cells.append(f"{ta / tb:.2f}x" if ta and tb else "–")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| system, clients | p50 ms | p99 ms | cgroup peak MiB | limit hits |", "|---|---|---|---|---|"]
    for s in systems:
        for c in args.clients_list:
            p50, p99 = med(rows, s, c, "p50_us"), med(rows, s, c, "p99_us")
            peak = med(rows, s, c, "cgroup_peak_bytes")
            hits = med(rows, s, c, "cgroup_limit_hits")
            if p50 is None:
                continue
            lines.append(f"| {LABELS[s]}, {c} | {p50 / 1000:.2f} | {p99 / 1000:.2f} | "
                         f"{peak / 2**20:.0f} | {hits:.0f} |")
    lines.append("")
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"- {LABELS[r['system']]}, {r.get('clients')} clients (run {r['rep'] + 1}): {r['status']}")
    for k, v in notes.items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"


def plot(rows, systems, args, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.8 / max(1, len(systems))
    cl = args.clients_list
    for k, s in enumerate(systems):
        ref = [med(rows, "memory", c, "tps") for c in cl]
        vals = [(med(rows, s, c, "tps") or 0) / r * 100 if r else 0 for c, r in zip(cl, ref)]
        bars = ax.bar([i + k * width for i in range(len(cl))], vals, width, label=LABELS[s])
        for b, c in zip(bars, cl):
            t = med(rows, s, c, "tps")
            if t:
                ax.annotate(f"{t:,.0f}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                            va="bottom", fontsize=7)
    ax.axhline(79, color="grey", linestyle="--", linewidth=1)
    ax.text(len(cl) - 0.5, 80, "seed 001: 79%", fontsize=7, color="grey")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cl))])
    ax.set_xticklabels([f"{c} client{'s' if c > 1 else ''}" for c in cl])
    ax.set_ylabel("tps, % of all-in-memory (labels: tps)")
    ax.set_title(f"pgbench, database {args.db_mib:.0f} MiB, postmaster's cgroup limited to {args.limit} "
                 "(cf. seed 001)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", default="256MiB", help="memory cgroup limit of the postmaster")
    ap.add_argument("--scale", default="auto", help="pgbench scale (auto: database ~4x the limit)")
    ap.add_argument("--clients", default="1,16,100")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--systems", default="memory,disk,farpool-shm")
    ap.add_argument("--shared-buffers", default="32MB")
    ap.add_argument("--farpool-dir", help="an existing farpool mount's directory for farpool-shm")
    peers.add_mount_cache_arg(ap, "page")  # PostgreSQL rereads its pages from the OS cache
    ap.add_argument("--pool-memory", default="2GiB", help="per memory server (2 servers)")
    ap.add_argument("--template-dir", default="/var/tmp/farpool-pgbench")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    args.clients_list = [int(c) for c in args.clients.split(",") if c]
    limit = parse_size(args.limit)
    args.scale_n = (math.ceil(4 * limit / (MIB_PER_SCALE * 2**20)) if args.scale == "auto"
                    else int(args.scale))
    why = MemoryCgroup.why_unavailable()
    if why:
        print(f"pg_beyond_memory: needs a memory cgroup: {why}", file=sys.stderr)
        return 1
    if not (PG_BIN / "initdb").exists():
        print(f"pg_beyond_memory: PostgreSQL not found in {PG_BIN}: run `make setup`", file=sys.stderr)
        return 1
    systems = [s for s in args.systems.split(",") if s]
    notes = {}
    t0 = time.time()
    loads = [os.getloadavg()[0], 0.0]
    template = make_template(args, args.scale_n)
    args.db_mib = du(str(template / "base")) / 2**20
    notes["database"] = (f"pgbench scale {args.scale_n}: tables and indexes (base/) {args.db_mib:.0f} MiB = "
                         f"{args.db_mib * 2**20 / limit:.1f}x the limit of {args.limit}; the whole data "
                         f"directory with WAL {du(str(template)) / 2**20:.0f} MiB (template {template})")
    roots = {"memory": "/dev/shm", "disk": "/var/tmp", "disk-nolimit": "/var/tmp"}
    mounts: dict[str, peers.FarpoolMount] = {}
    rows: list[dict] = []
    try:
        mounts = peers.mount_farpool_variants(
            systems, roots, notes, args.pool_memory, args.farpool_dir, "data directory",
            also="; the mount's daemon and the servers run outside the cgroup",
            flags=peers.MOUNT_CACHE_FLAGS[args.mount_cache])
        systems = [s for s in systems if s in roots]
        for rep in range(args.repeat):
            for s in systems:
                log(f"== run {rep + 1}/{args.repeat}: {s} (load {os.getloadavg()[0]:.1f})")
                rows += measure(args, s, roots[s], template, limit, rep)
    finally:
        for m in mounts.values():
            m.__exit__(None, None, None)
    loads[1] = os.getloadavg()[0]
    if not rows:
        print("pg_beyond_memory: nothing measured", file=sys.stderr)
        return 1
    ctx = peers.context()
    for r in rows:
        r.update({"scale": args.scale_n, "limit_bytes": limit, "db_bytes": int(args.db_mib * 2**20),
                  "shared_buffers": args.shared_buffers, "seconds": args.seconds, **ctx})
    md = table(rows, systems, args, notes, ctx, time.time() - t0, loads)
    peers.publish(args.out, "pg_beyond_memory", rows, md,
                  lambda path: plot(rows, systems, args, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
