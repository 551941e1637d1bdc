"""Seed 002 ("Remote Memory Revisited"): an analytical database spills its large intermediate
results to remote memory instead of disk. DuckDB (PyPI) runs the 22 TPC-H queries with a
`memory_limit` small enough that the big joins and aggregations spill, with its
`temp_directory` on:

  disk         /var/tmp (the machine's disk, through the page cache)
  tmpfs        /dev/shm (local RAM: the reference every ratio is taken against)
  farpool-shm  the farpool FUSE mount (`farpool mount`) on a 2-server cluster over shared memory
  farpool-tcp  the same on a cluster over TCP, every server in its own network namespace

Data: `tpchgen-cli` (PyPI) writes the tables as Parquet once per scale into a cache directory
(`--data-dir`, /var/tmp/farpool-tpch), loaded into a DuckDB database file on tmpfs
(/dev/shm) by this process, so the base data is in RAM for every variant and only the temp
directory differs. Queries: bench/tpch/queries/qNN.sql, the TPC-H specification's queries
(section 2.4) with its validation parameters, written for this project in DuckDB's dialect;
the answers at SF 1 and 0.1 (bench/tpch/answers/, made by `--write-answers`: see
bench/tpch/README.md) are checked in the first repetition of every variant.

Each (repetition, variant) is a child process (this module with --child) that opens the
database read-only, sets memory_limit, threads, temp_directory and max_temp_directory_size,
and runs the queries once each, in order; the variants are run round-robin, `--repeat` times,
and the tables show the median time. Per query: wall time; bytes written to the temp
directory (the process's write-syscall byte count, /proc/self/io wchar, across the query: it
writes nothing else); the peak size of the temp directory (its files' sizes sampled every
20 ms).

The child runs in a memory cgroup (`--cgroup-limit`, default memory_limit + 384 MiB; the
cgroup code of beyond_memory) so that its page cache cannot hold what it spills: as on a
machine whose RAM is taken, spilled pages of the disk variant must be written back and read
from the disk, and a FUSE mount's pages must go to the daemon, which runs outside the cgroup
with the pool's memory. The tmpfs variant cannot run under that limit (its pages are the
spill itself, charged to the cgroup and not reclaimable without swap), so it runs in a cgroup
without a limit: tmpfs is the unconstrained local-RAM reference. `--cgroup-limit none`
turns the limit off for every variant.

Output: bench/results/duckdb_spill.{jsonl,md,png} (the png: the seed's figure, average time
per query per variant on a log axis).

Usage: bench/experiments/duckdb_spill [--scale 1] [--database file|memory] [--memory-limit auto] [--threads 2]
         [--queries all|1,3,9] [--variants disk,tmpfs,farpool-shm,farpool-tcp] [--repeat 3]
         [--farpool-dir DIR]   (use an existing mount's directory instead of starting one)
       bench/experiments/duckdb_spill --write-answers --scale 0.1   (regenerate the answers)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path

from farpool.harness import peers
from farpool.harness.beyond_memory import MemoryCgroup, parse_size
from farpool.harness.peers import log

TPCH_DIR = peers.ROOT / "bench" / "tpch"
VARIANTS = ["disk", "tmpfs", "farpool-shm", "farpool-tcp"]
LABELS = {"disk": "local disk (/var/tmp)", "tmpfs": "tmpfs (/dev/shm)",
          "farpool-shm": "farpool mount, shm", "farpool-tcp": "farpool mount, tcp (netns)"}
# The stored answers are our queries' results on tpchgen-cli data (write_answers). They agreed,
# when they were made, with the answers on the reference dbgen's data in every column but the
# random text (comments, addresses), where tpchgen-cli may differ: those columns are not
# compared, nor is q13 (it filters on o_comment), so that results on either generator's data pass.
TEXT_DEPENDENT = {13}
TABLES = ["region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"]


# ------------------------------------------------------------------ data

def tpchgen() -> str:
    exe = Path(sys.executable).parent / "tpchgen-cli"
    if exe.exists():
        return str(exe)
    found = shutil.which("tpchgen-cli")
    if not found:
        raise RuntimeError("tpchgen-cli not found: run `make setup` (it is a PyPI dependency)")
    return found


def parquet_dir(data_dir: Path, scale: float) -> Path:
    """The tables at `scale` as Parquet, generated once by tpchgen-cli and kept."""
    d = data_dir / f"sf{scale:g}"
    if all((d / f"{t}.parquet").exists() for t in TABLES) and (d / "done").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    log(f"== generating TPC-H SF {scale:g} with tpchgen-cli into {d}")
    t0 = time.time()
    out = subprocess.run([tpchgen(), "parquet", "-s", f"{scale:g}", "-o", str(d), "--overwrite"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"tpchgen-cli failed: {out.stderr.strip()[-400:]}")
    (d / "done").write_text(f"{time.time() - t0:.1f} s\n")
    return d


def load_database(parquet: Path, path: str) -> float:
    import duckdb
    t0 = time.time()
    con = duckdb.connect(path)
    for t in TABLES:
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{parquet / (t + '.parquet')}')")
    con.execute("CHECKPOINT")
    con.close()
    return time.time() - t0


def query_sql(n: int) -> str:
    return (TPCH_DIR / "queries" / f"q{n:02d}.sql").read_text()


# ------------------------------------------------------------------ answers

def _same(got, want: str) -> bool:
    if got is None:
        return want in ("", "NULL")
    if isinstance(got, (int, float, Decimal)):
        try:
            a, b = float(got), float(Decimal(want))
        except (InvalidOperation, ValueError):
            return False
        return abs(a - b) <= 1e-9 * abs(b) + 0.006
    return str(got).strip() == want.strip()


def check_answer(n: int, scale: float, rows: list[tuple]) -> str:
    """'ok', 'no answer for this scale', or what differs."""
    path = TPCH_DIR / "answers" / f"sf{scale:g}" / f"q{n:02d}.csv"
    if n in TEXT_DEPENDENT:
        return "not comparable (depends on comment text)"
    if not path.exists():
        return "no answer for this scale"
    with open(path, newline="") as f:
        header, *want = list(csv.reader(f, delimiter="|"))
    text = {i for i, name in enumerate(header) if name.endswith(("_address", "_comment"))}
    if len(want) != len(rows):
        return f"{len(rows)} rows, expected {len(want)}"
    for i, (g, w) in enumerate(zip(rows, want)):
        if len(g) != len(w) or not all(_same(a, b) for k, (a, b) in enumerate(zip(g, w))
                                       if k not in text):
            return f"row {i}: {g!r} != {w!r}"
    return "ok"


def _csv_value(v) -> str:
    return "NULL" if v is None else str(v)


def write_answers(scale: float, data_dir: Path) -> Path:
    """Runs the 22 queries in DuckDB, in memory and without a memory limit, on tpchgen-cli's
    tables at `scale` and writes their results as bench/tpch/answers/sfSCALE/qNN.csv (a header
    of column names, then the rows, `|`-separated)."""
    import duckdb
    parquet = parquet_dir(data_dir, scale)
    out = TPCH_DIR / "answers" / f"sf{scale:g}"
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(":memory:")
    for t in TABLES:
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{parquet / (t + '.parquet')}')")
    for n in range(1, 23):
        cur = con.execute(query_sql(n))
        header = [d[0] for d in cur.description]
        rows = cur.fetchall()
        with open(out / f"q{n:02d}.csv", "w", newline="") as f:
            w = csv.writer(f, delimiter="|", lineterminator="\n")
            w.writerow(header)
            w.writerows([_csv_value(v) for v in r] for r in rows)
        log(f"q{n:02d}: {len(rows)} rows")
    con.close()
    return out


# ------------------------------------------------------------------ the child (one variant)

def _wchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("wchar:"))


class TempSampler:
    """Samples the total size of the files under a directory every `period` seconds; peak()
    returns the largest size seen since reset()."""

    def __init__(self, root: str, period: float = 0.02):
        self.root, self.period = root, period
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _size(self) -> int:
        total = 0
        try:
            for e in os.scandir(self.root):
                try:
                    total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
        except OSError:
            pass
        return total

    def _run(self):
        while not self._stop.is_set():
            self._peak = max(self._peak, self._size())
            self._stop.wait(self.period)

    def reset(self):
        self._peak = self._size()

    def peak(self) -> int:
        return max(self._peak, self._size())

    def close(self):
        self._stop.set()
        self._thread.join()


def child(args) -> None:
    """Runs the queries once with temp_directory = args.child (inside the caller's cgroup);
    prints one JSON object per query."""
    import duckdb
    temp = args.child
    con = duckdb.connect(args.db if args.database == "file" else ":memory:",
                         read_only=args.database == "file")
    con.execute(f"SET memory_limit = '{args.memory_limit}'")
    con.execute(f"SET threads = {args.threads}")
    con.execute(f"SET temp_directory = '{temp}'")
    con.execute(f"SET max_temp_directory_size = '{args.max_temp}'")
    sampler = TempSampler(temp)
    try:
        if args.database == "memory":
            # The tables themselves are DuckDB temporary data: what exceeds memory_limit is
            # written to the temp directory and read back by every query that scans it.
            w0, t0 = _wchar(), time.perf_counter()
            status = "ok"
            try:
                for t in TABLES:
                    con.execute(f"CREATE TABLE {t} AS SELECT * FROM "
                                f"read_parquet('{Path(args.db) / (t + '.parquet')}')")
            except duckdb.Error as e:
                status = f"error: {str(e).splitlines()[0][:300]}"
            print(json.dumps({"query": 0, "seconds": time.perf_counter() - t0, "status": status,
                              "rows": 0, "spill_written_bytes": _wchar() - w0,
                              "spill_peak_bytes": sampler.peak(), "answer": None}), flush=True)
            if status != "ok":
                return
        for n in parse_queries(args.queries):
            sql = query_sql(n)
            sampler.reset()
            w0 = _wchar()
            t0 = time.perf_counter()
            status, rows = "ok", []
            try:
                rows = con.execute(sql).fetchall()
            except duckdb.Error as e:
                status = f"error: {str(e).splitlines()[0][:300]}"
            secs = time.perf_counter() - t0
            written = _wchar() - w0
            peak = sampler.peak()
            check = check_answer(n, args.scale, rows) if (status == "ok" and args.verify) else None
            print(json.dumps({"query": n, "seconds": secs, "status": status, "rows": len(rows),
                              "spill_written_bytes": written, "spill_peak_bytes": peak,
                              "answer": check}), flush=True)
    finally:
        sampler.close()
        con.close()


def parse_queries(text: str) -> list[int]:
    if text == "all":
        return list(range(1, 23))
    return [int(x.lower().lstrip("q")) for x in text.split(",") if x]


# ------------------------------------------------------------------ the parent

def run_variant(args, variant: str, temp_root: str, cg_limit: int | None, rep: int,
                db: str) -> tuple[list[dict], dict]:
    """One child on one temp directory; returns its rows and the cgroup's stats."""
    temp = tempfile.mkdtemp(prefix="duckdb-temp-", dir=temp_root)
    limited = cg_limit is not None and variant != "tmpfs"
    cg = MemoryCgroup("farpool-duckdb", cg_limit if limited else None) if cg_limit is not None else None
    cmd = [sys.executable, "-m", "farpool.harness.duckdb_spill", "--child", temp, "--db", db,
           "--scale", f"{args.scale:g}", "--memory-limit", args.memory_limit, "--threads",
           str(args.threads), "--queries", args.queries, "--max-temp", args.max_temp,
           "--database", args.database]
    if rep == 0:
        cmd.append("--verify")
    cmd = ["env", f"PYTHONPATH={peers.ROOT / 'python'}", *cmd]
    if cg:
        cmd = cg.prefix(cmd)
    rows, stats = [], {}
    load0 = os.getloadavg()[0]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=args.timeout)
        stats = cg.stats() if cg else {}
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
        if p.returncode != 0:
            how = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
            if stats.get("oom_kills"):
                how += " (the cgroup's OOM killer)"
            done = {r["query"] for r in rows}
            for n in parse_queries(args.queries):
                if n not in done:
                    rows.append({"query": n, "status": f"child died: {how}: {p.stderr.strip()[-200:]}"})
                    break
    except subprocess.TimeoutExpired:
        rows.append({"query": None, "status": f"timeout after {args.timeout} s"})
    finally:
        if cg:
            cg.close()
        shutil.rmtree(temp, ignore_errors=True)
    for r in rows:
        r.update({"experiment": "duckdb_spill", "variant": variant, "rep": rep,
                  "cgroup_limit_bytes": cg_limit if limited else None,
                  "load_avg_start": load0, "load_avg_end": os.getloadavg()[0]})
    return rows, stats


def median_by(rows, variant, n, key="seconds"):
    vals = [r[key] for r in rows if r["variant"] == variant and r.get("query") == n
            and r.get("status") == "ok" and key in r]
    return statistics.median(vals) if vals else None


def table(rows, variants, queries, args, notes, ctx, elapsed, loads) -> str:
    lines = [f"Measured {ctx['time']} on {ctx['host']} ({ctx['cores']} cores), git {ctx['git_sha']}, "
             f"`bench/experiments/duckdb_spill --scale {args.scale:g} --memory-limit {args.memory_limit} "
             f"--threads {args.threads} --repeat {args.repeat} --mount-cache {args.mount_cache}` "
             f"({elapsed:.0f} s); DuckDB "
             f"{notes.get('duckdb_version', '?')}; load average {loads[0]:.1f} at start, {loads[1]:.1f} at end. "
             f"Median of {args.repeat} hot run(s) per query; spilled = bytes written to the temp "
             "directory (median), peak = its largest size seen.\n"]
    ref = "tmpfs" if "tmpfs" in variants else None
    head = ["query"] + [f"{LABELS[v]} s" for v in variants]
    if ref:
        head += [f"{LABELS[v]} / tmpfs" for v in variants if v != ref]
    head += ["spilled (MiB)", "peak temp (MiB)"]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for n in queries:
        cells = [f"q{n:02d}"]
        t = {v: median_by(rows, v, n) for v in variants}
        for v in variants:
            if t[v] is not None:
                cells.append(f"{t[v]:.2f}")
            else:
                bad = next((r["status"] for r in rows if r["variant"] == v and r.get("query") == n
                            and r.get("status") != "ok"), "–")
                cells.append("fails" if bad != "–" else "–")
        if ref:
            for v in variants:
                if v != ref:
                    cells.append(f"{t[v] / t[ref]:.2f}x" if t[v] and t[ref] else "–")
        spill = [median_by(rows, v, n, "spill_written_bytes") for v in variants]
        spill = [s for s in spill if s is not None]
        peak = [r.get("spill_peak_bytes", 0) for r in rows if r.get("query") == n]
        cells.append(f"{max(spill) / 2**20:.0f}" if spill else "–")
        cells.append(f"{max(peak) / 2**20:.0f}" if peak else "–")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    spilling = [n for n in queries
                if any((median_by(rows, v, n, "spill_written_bytes") or 0) > args.spill_threshold
                       for v in variants)]
    lines.append(f"Queries that spill (more than {args.spill_threshold / 2**20:.0f} MiB written to the "
                 f"temp directory): {', '.join(f'q{n:02d}' for n in spilling) or 'none'}.")
    for v in variants:
        if v == "tmpfs" or not ref:
            continue
        ratios = [(n, median_by(rows, v, n) / median_by(rows, ref, n)) for n in spilling
                  if median_by(rows, v, n) and median_by(rows, ref, n)]
        if not ratios:
            continue
        worst = max(ratios, key=lambda x: x[1])
        gm = statistics.geometric_mean([r for _, r in ratios])
        within = sum(1 for _, r in ratios if r <= 1.3)
        line = (f"- {LABELS[v]} on the spilling queries: geometric mean {gm:.2f}x tmpfs, worst "
                f"q{worst[0]:02d} {worst[1]:.2f}x; {within} of {len(ratios)} within 1.3x of tmpfs")
        if v != "disk" and "disk" in variants:
            faster = sum(1 for n, _ in ratios if median_by(rows, "disk", n)
                         and median_by(rows, v, n) < median_by(rows, "disk", n))
            line += f"; faster than the local disk on {faster} of {len(ratios)}"
        lines.append(line + ".")
    failures = [r for r in rows if r.get("status") not in (None, "ok")]
    for r in failures[:12]:
        lines.append(f"- {LABELS[r['variant']]}, q{r['query'] if r.get('query') else '?'} "
                     f"(repetition {r['rep']}): {r['status']}")
    wrong = [r for r in rows if r.get("answer") not in (None, "ok", "no answer for this scale",
                                                  "not comparable (depends on comment text)")]
    checked = [r for r in rows if r.get("answer") == "ok"]
    lines.append(f"- Answers: {len(checked)} checked against the TPC-H answers at SF {args.scale:g}, "
                 f"{len(wrong)} wrong" + (": " + "; ".join(f"{r['variant']} q{r['query']:02d} {r['answer']}"
                                                          for r in wrong[:5]) if wrong else "")
                 + ("" if checked or wrong else " (no stored answers at this scale)") + ".")
    for k, v in notes.items():
        if k != "duckdb_version":
            lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"


def plot(rows, variants, queries, path: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    fig, ax = plt.subplots(figsize=(12, 4.8))
    width = 0.8 / max(1, len(variants))
    for k, v in enumerate(variants):
        vals = [median_by(rows, v, n) or 0 for n in queries]
        ax.bar([i + k * width for i in range(len(queries))], vals, width, label=LABELS[v])
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(queries))])
    ax.set_xticklabels([f"q{n:02d}" for n in queries])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_ylabel("execution time (s, log)")
    ax.set_xlabel("query")
    ax.set_title(f"DuckDB TPC-H SF {args.scale:g}, memory_limit {args.memory_limit}: temp directory on "
                 "each medium (cf. seed 002, RRAM vs HDD)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    ap.add_argument("--memory-limit", default="auto",
                    help="DuckDB memory_limit (auto: 40MB with --database file, 100MB with memory)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--database", choices=["file", "memory"], default="file",
                    help="file: the tables in a DuckDB file on tmpfs, only intermediates spill; memory: "
                         "an in-memory database loaded from Parquet, its tables spill too")
    ap.add_argument("--queries", default="all", help="all, or e.g. 1,3,9,13,18,21")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cgroup-limit", default="auto",
                    help="memory cgroup limit of the DuckDB process (auto: memory_limit + 384MiB; none)")
    ap.add_argument("--max-temp", default="20GiB", help="DuckDB max_temp_directory_size")
    ap.add_argument("--farpool-dir", help="an existing farpool mount's directory for farpool-shm")
    peers.add_mount_cache_arg(ap, "direct")  # spill files: written once, read back once
    ap.add_argument("--pool-memory", default="2GiB", help="per memory server (2 servers)")
    ap.add_argument("--data-dir", default="/var/tmp/farpool-tpch", help="Parquet cache")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--spill-threshold", type=int, default=1 << 20)
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    ap.add_argument("--write-answers", action="store_true",
                    help="write bench/tpch/answers/sfSCALE/ from the queries run without a memory "
                         "limit on tpchgen-cli's data at --scale, and exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--verify", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.write_answers:
        log(f"== wrote {write_answers(args.scale, Path(args.data_dir))}")
        return 0

    import duckdb
    if args.memory_limit == "auto":
        args.memory_limit = "40MB" if args.database == "file" else "100MB"
    variants = [v for v in args.variants.split(",") if v]
    queries = parse_queries(args.queries)
    notes = {"duckdb_version": duckdb.__version__}
    cg_limit = None
    if args.cgroup_limit != "none":
        why = MemoryCgroup.why_unavailable()
        if why:
            notes["cgroup"] = f"no memory cgroup ({why}): the children run without a limit"
        else:
            cg_limit = (parse_size(args.memory_limit) + (384 << 20) if args.cgroup_limit == "auto"
                        else parse_size(args.cgroup_limit))
            notes["cgroup"] = (f"disk and farpool variants run in a memory cgroup limited to "
                               f"{cg_limit / 2**20:.0f} MiB (page cache included); tmpfs in one "
                               "without a limit")
    t0 = time.time()
    loads = [os.getloadavg()[0], 0.0]
    rows: list[dict] = []
    parquet = parquet_dir(Path(args.data_dir), args.scale)
    work = tempfile.mkdtemp(prefix="farpool-duckdb-", dir="/dev/shm")
    if args.database == "file":
        db = os.path.join(work, f"tpch-sf{args.scale:g}.duckdb")
        log(f"== loading {parquet} into {db} (tmpfs)")
        notes["data"] = (f"tpchgen-cli Parquet in {parquet}, loaded into a DuckDB file on tmpfs in "
                         f"{load_database(parquet, db):.0f} s ({os.path.getsize(db) / 2**20:.0f} MiB); "
                         "only intermediate results can spill")
    else:
        db = str(parquet)
        notes["data"] = (f"tpchgen-cli Parquet in {parquet}, loaded by every child into an in-memory "
                         "database (`:memory:`) under the memory_limit: its tables are DuckDB temporary "
                         "data, written to the temp directory beyond the limit and read back by the "
                         "queries (load: " + "LOADTIMES" + ")")
    roots = {"disk": "/var/tmp", "tmpfs": "/dev/shm"}
    mounts: dict[str, peers.FarpoolMount] = {}
    try:
        mounts = peers.mount_farpool_variants(variants, roots, notes, args.pool_memory,
                                              args.farpool_dir, "temp directory",
                                              flags=peers.MOUNT_CACHE_FLAGS[args.mount_cache])
        variants = [v for v in variants if v in roots]
        for rep in range(args.repeat):
            for v in variants:
                log(f"== repetition {rep + 1}/{args.repeat}: {v} (load {os.getloadavg()[0]:.1f})")
                got, stats = run_variant(args, v, roots[v], cg_limit, rep, db)
                for r in got:
                    r.update({f"cgroup_{k}": x for k, x in stats.items()})
                    if r.get("status") == "ok":
                        log(f"   {'load' if r['query'] == 0 else 'q%02d' % r['query']} {r['seconds']:.2f} s, spilled "
                            f"{r['spill_written_bytes'] / 2**20:.0f} MiB, answer {r.get('answer')}")
                    else:
                        log(f"   q{r.get('query')}: {r['status']}")
                rows += got
    finally:
        for m in mounts.values():
            m.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)
    loads[1] = os.getloadavg()[0]
    if not rows:
        print("duckdb_spill: nothing measured", file=sys.stderr)
        return 1
    ctx = peers.context()
    for r in rows:
        r.update({"scale": args.scale, "memory_limit": args.memory_limit, "threads": args.threads,
                  "database": args.database,
                  "duckdb": notes["duckdb_version"], **ctx})
    out = Path(args.out)
    name = "duckdb_spill" if args.database == "file" else "duckdb_spill_inmem"
    if args.database == "memory":
        notes["data"] = notes["data"].replace("LOADTIMES", ", ".join(
            f"{LABELS[v]} {median_by(rows, v, 0):.1f} s, {median_by(rows, v, 0, 'spill_written_bytes') / 2**20:.0f} MiB "
            "written to temp" for v in variants if median_by(rows, v, 0) is not None) or "failed")
    md = table(rows, variants, queries, args, notes, ctx, time.time() - t0, loads)
    peers.publish(out, name, rows, md, lambda path: plot(rows, variants, queries, path, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
