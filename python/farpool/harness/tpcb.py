"""TPC-B: farpool vs pgbench on PostgreSQL, same scale, same client counts, same machine.

  postgresql-ram      PostgreSQL 15 started here, data dir on tmpfs (/dev/shm), fsync,
                      synchronous_commit and full_page_writes off (the in-memory comparison)
  postgresql-default  the same with PostgreSQL's defaults, data dir on disk (/var/tmp)
  pool                `farpool bench txn --workload tpcb` on a fresh local cluster (2 memory
                      servers over shared memory) for each client count; clients are threads
                      with one session each in one compute process
  local               the same on the local engine
  sharded             the same on the sharded engine (in-process partition servers), if built

Across a network (issue 9; clients in the root network namespace, every server in a namespace
of its own behind a veth pair on one bridge, so all three cross the same path over TCP):
  pool-tcp            the pool engine on a fresh `cluster up --transport tcp --netns --progress
                      event` (2 memory servers) per point; plain loopback TCP if namespaces
                      fail (said in the notes)
  sharded-tcp         the sharded engine with 2 `farpool shard --transport tcp --progress event`
                      partition servers, each in its own namespace (started here: `shard-cluster
                      up` has no --netns), fresh per point; loopback TCP if namespaces fail
  postgresql-tcp      postgresql-ram in its own namespace, listening on its veth address only;
                      pgbench connects over TCP (-h ADDRESS)

Read committed (farpool's `--isolation rc`: the account, teller and branch read for update, as
pgbench's UPDATEs lock them; the plain names run snapshot isolation):
  pool-rc             pool, read committed
  pool-tcp-rc         pool-tcp, read committed
  pool-tcp-fu         pool-tcp, snapshot isolation with the three rows read for update
                      (`--for-update`: locked at read, the snapshot taken again once they are
                      held, so writers of one branch row wait instead of aborting)

PostgreSQL: `pgbench -i -s SCALE` once per server, then `pgbench -c N -j N -T S -M prepared -l`
(the built-in tpcb-like script; p50/p99 from the per-transaction log). farpool's tpcb is the
same schema and transaction (src/workloads/tpcb.h), `--threads N --warmup 0.5 --verify`.

The machine may be shared, so the points run round-robin: for each client count every system
once, then again, --repeat times; the tables show the median (and the tps range), and the .md
the load average at start and end. Output: bench/results/NAME.jsonl (every run, with its
`rep`), NAME.md (median tps, ratios, p50/p99, abort rate, round trips per transaction),
NAME.png; NAME is --out-name, by default `tpcb`, or `tpcb_tcp` when a -tcp system is selected.

A/B of farpool binaries in one run: `--binary NAME=PATH` (twice or more) runs every farpool
system once per binary, in the same round-robin (systems then read `pool-tcp@NAME`, with
ratio columns of the second binary over the first, and of each over PostgreSQL over TCP);
PostgreSQL runs once per point.

Usage: bench/experiments/tpcb [--scale N] [--clients 1,2,4,8] [--seconds S] [--repeat R]
                              [--systems pool,local,sharded,postgresql-ram,postgresql-default,
                                         pool-tcp,sharded-tcp,postgresql-tcp] [--out-name NAME]
                              [--binary NAME=PATH ...]
The network run of docs/experiments.md:
  bench/experiments/tpcb --systems pool-tcp,sharded-tcp,postgresql-tcp --clients 1,2,4 --seconds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from farpool.harness import peers
from farpool.harness.peers import log

SHM_SYSTEMS = ["pool", "local", "sharded", "postgresql-ram", "postgresql-default"]
TCP_SYSTEMS = ["pool-tcp", "sharded-tcp", "postgresql-tcp"]
RC_SYSTEMS = ["pool-rc", "pool-tcp-rc", "pool-tcp-fu"]  # rows locked at read; not default
SYSTEMS = SHM_SYSTEMS + TCP_SYSTEMS + RC_SYSTEMS
LABELS = {"pool": "farpool pool (shm)", "local": "farpool local", "sharded": "farpool sharded",
          "postgresql-ram": "PostgreSQL (tmpfs, fsync off)",
          "postgresql-default": "PostgreSQL (defaults, disk)",
          "pool-tcp": "farpool pool (tcp)", "sharded-tcp": "farpool sharded (tcp)",
          "postgresql-tcp": "PostgreSQL (tcp, tmpfs, fsync off)",
          "pool-rc": "farpool pool (shm, read committed)",
          "pool-tcp-rc": "farpool pool (tcp, read committed)",
          "pool-tcp-fu": "farpool pool (tcp, SI, rows read for update)"}
# (numerator, denominator) of the ratio columns, shown when both were measured.
RATIOS = [("pool", "sharded"), ("pool", "postgresql-ram"), ("pool", "postgresql-default"),
          ("pool-tcp", "postgresql-tcp"), ("pool-tcp", "sharded-tcp"),
          ("pool-tcp-fu", "sharded-tcp"),
          ("pool-rc", "postgresql-ram"), ("pool-tcp-rc", "postgresql-tcp"),
          ("pool-tcp-rc", "pool-tcp"), ("pool-tcp-fu", "postgresql-tcp")]
PG_ROUND_TRIPS = 7  # statements of pgbench's tpcb-like script, each waited for
METRICS = ["tps", "p50_us", "p99_us", "abort_rate", "round_trips_per_txn", "messages_per_txn",
           "reads_per_txn", "writes_per_txn", "cas_per_txn"]
# Kept per run beside METRICS (pool engines): round trips per committed transaction by cause
# (TxnCounters::round_trips_by_cause) and those of aborted attempts; a table of their medians.
CAUSES = "round_trips_per_txn_by_cause"
EXTRA = [CAUSES, "round_trips_aborted_per_txn"]


def tpcb_command(system: str, clients: int, scale: int, seconds: float) -> list[str]:
    """`farpool bench txn --workload tpcb` for one point of a farpool system (its engine, and
    read committed for *-rc, rows read for update for *-fu)."""
    cmd = [str(peers.farpool_bin()), "bench", "txn", "--engine", peers.engine_of(system),
           "--workload", "tpcb", "--scale", str(scale), "--threads", str(clients), "--seconds",
           str(seconds), "--warmup", "0.5", "--verify", "--json", "--isolation",
           "rc" if system.endswith("-rc") else "si"]
    return cmd + (["--for-update"] if system.endswith("-fu") else [])


def pgbench_run(pg: peers.Postgres, scale: int, clients: int, seconds: float) -> dict:
    work = tempfile.mkdtemp(prefix="farpool-pgbench-")
    try:
        out = subprocess.run(["pgbench", *pg.conn_args(), "-n", "-M", "prepared", "-c",
                              str(clients), "-j", str(clients), "-T", str(max(1, round(seconds))),
                              "-s", str(scale), "-l", "--log-prefix", os.path.join(work, "log"),
                              "postgres"], capture_output=True, text=True, cwd=work)
        if out.returncode != 0:
            raise RuntimeError(f"pgbench failed: {out.stderr.strip()[-300:]}")
        r = {"failed": 0}
        for line in out.stdout.splitlines():
            if line.startswith("tps"):
                r["tps"] = float(line.split()[2])
            elif line.startswith("latency average"):
                r["mean_us"] = float(line.split()[3]) * 1000
            elif line.startswith("number of failed"):
                r["failed"] = int(line.split(":")[1].split()[0])
            elif line.startswith("number of transactions actually processed"):
                r["count"] = int(line.split(":")[1].split()[0].split("/")[0])
        p = peers.percentiles(peers.pgbench_latencies(work))
        r["p50_us"], r["p99_us"] = p["p50_us"], p["p99_us"]
        r["abort_rate"] = r["failed"] / max(1, r.get("count", 0) + r["failed"])
        return r
    finally:
        shutil.rmtree(work, ignore_errors=True)


class Systems:
    """Runs one point of a system: a farpool one by `command` on peers.farpool_point's set-up
    (tpcw.py passes its own workload's command), PostgreSQL by pgbench. The shm PostgreSQL servers are started (and loaded) once and
    kept; everything of a network system is made for its point and removed right after: its
    namespaces, its servers, PostgreSQL's too (initdb + `pgbench -i` per point). Only one set of
    namespaces exists at a time: with another bridge of ours present, `cluster up --netns`
    mostly fails ("server 0 does not answer"; see docs/experiments.md). close() (or leaving
    the `with`) stops and removes what is left, also after a failure or SIGTERM."""

    def __init__(self, scale: int, seconds: float, command=None):
        self.scale = scale
        self.seconds = seconds
        # (system, clients) -> the farpool benchmark command of a point (peers.farpool_point).
        self.command = command or (lambda system, clients: tpcb_command(system, clients, scale,
                                                                         seconds))
        self.stack = contextlib.ExitStack()
        self.pg: dict[str, peers.Postgres] = {}
        self.network: dict[str, str] = {}  # system -> how it was reached
        self.notes: dict[str, str] = {}

    def __enter__(self) -> "Systems":
        return self

    def __exit__(self, *exc):
        self.stack.close()

    def _pgbench_init(self, pg: peers.Postgres) -> None:
        out = subprocess.run(["pgbench", *pg.conn_args(), "-i", "-q", "-s", str(self.scale),
                              "postgres"], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"pgbench -i: {out.stderr.strip()[-300:]}")

    def _postgres(self, system: str) -> peers.Postgres:
        if system not in self.pg:
            pg = self.stack.enter_context(peers.Postgres(in_ram=system == "postgresql-ram"))
            self.network[system] = "Unix socket"
            log(f"== {LABELS[system]}: pgbench -i -s {self.scale}")
            self._pgbench_init(pg)
            self.pg[system] = pg
        return self.pg[system]

    def _postgresql_tcp(self, clients: int) -> dict:
        with peers.Netns(1) as ns, peers.Postgres(in_ram=True, netns=(ns, 0)) as pg:
            self.network["postgresql-tcp"] = "TCP, server in its own netns"
            self._pgbench_init(pg)
            return pgbench_run(pg, self.scale, clients, self.seconds)

    def run(self, system: str, clients: int) -> dict:
        """One point: the metrics of `system` at `clients` clients."""
        if system == "postgresql-tcp":
            return self._postgresql_tcp(clients)
        if system.startswith("postgresql"):
            return pgbench_run(self._postgres(system), self.scale, clients, self.seconds)
        r, self.network[system], note = peers.farpool_point(system, self.command(system, clients),
                                                            log)
        if note:
            self.notes[system] = note
        return {k: r[k] for k in METRICS + EXTRA if k in r}


@contextlib.contextmanager
def farpool_binary(path: str | None):
    """FARPOOL_BIN set to `path` (None: unchanged) for what runs inside."""
    saved = os.environ.get("FARPOOL_BIN")
    if path is not None:
        os.environ["FARPOOL_BIN"] = path
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FARPOOL_BIN", None)
        else:
            os.environ["FARPOOL_BIN"] = saved


def with_binaries(systems, binaries):
    """The (system, binary name, binary path) runs of one round: farpool systems once per
    binary (named `system@NAME`, added to SYSTEMS, LABELS and RATIOS), PostgreSQL once."""
    if not binaries:
        return [(s, s, None) for s in systems]
    runs = []
    for s in systems:
        if s.startswith("postgresql"):
            runs.append((s, s, None))
            continue
        for name, path in binaries:
            key = f"{s}@{name}"
            if key not in SYSTEMS:
                SYSTEMS.append(key)
                LABELS[key] = f"{LABELS[s]} [{name}]"
            runs.append((s, key, path))
        if len(binaries) > 1 and (f"{s}@{binaries[1][0]}", f"{s}@{binaries[0][0]}") not in RATIOS:
            base, candidate = f"{s}@{binaries[0][0]}", f"{s}@{binaries[1][0]}"
            RATIOS.append((candidate, base))
            if "postgresql-tcp" in systems and s.endswith(("-tcp", "-tcp-rc", "-tcp-fu")):
                RATIOS.extend([(base, "postgresql-tcp"), (candidate, "postgresql-tcp")])
    return runs


def measure(systems, scale, clients, seconds, repeat=1, binaries=None, command=None,
            experiment="tpcb", fields=None):
    """Round-robin: for each client count, every system once (once per binary of `binaries`,
    [(name, path)]), `repeat` times. `command` (Systems) runs another farpool workload than
    TPC-B; each row is marked `experiment` and carries `fields` (default: the scale). Returns
    the raw rows (one per run) and the notes."""
    rows = []
    fields = {"scale": scale} if fields is None else fields
    with Systems(scale, seconds, command) as sy:
        if "sharded" in systems or "sharded-tcp" in systems:
            why = peers.sharded_available()
            if why:
                for s in ("sharded", "sharded-tcp"):
                    sy.notes[s] = f"not available: {why}"
                systems = [s for s in systems if s not in ("sharded", "sharded-tcp")]
        failed: dict[str, int] = {}
        runs = with_binaries(systems, binaries)
        for n in clients:
            for rep in range(repeat):
                for system, key, path in runs:
                    try:
                        with farpool_binary(path):
                            r = sy.run(system, n)
                    except (RuntimeError, OSError) as e:
                        log(f"   {system} failed: {e}")
                        failed[system] = failed.get(system, 0) + 1
                        sy.notes[system] = (f"{failed[system]} run(s) failed, the last: "
                                            f"{str(e)[:300]}")
                        continue
                    rt = r.get("round_trips_per_txn")
                    log(f"== {LABELS[key]} {n} clients, run {rep + 1}/{repeat}: "
                        f"{r['tps']:,.0f} tps, abort rate {r['abort_rate']:.3f}"
                        + (f", {rt:.2f} round trips/txn" if rt is not None else ""))
                    rows.append({"experiment": experiment, "system": key, "clients": n,
                                 **fields, "rep": rep, "seconds": seconds,
                                 "network": sy.network.get(system, ""), **r,
                                 **({"binary": path} if path else {})})
        notes = dict(sy.notes)
    peers.stamp(rows)
    return rows, notes


def medians(rows) -> list[dict]:
    """One row per (system, clients): the median of every metric over the repetitions, and
    the tps range."""
    out = []
    keys = sorted({(r["system"], r["clients"]) for r in rows},
                  key=lambda k: (SYSTEMS.index(k[0]), k[1]))
    for system, n in keys:
        runs = [r for r in rows if r["system"] == system and r["clients"] == n]
        nets = sorted({r["network"] for r in runs})
        network = nets[0] if len(nets) == 1 else "; ".join(
            f"{sum(r['network'] == x for r in runs)}x {x}" for x in nets)
        m = {"system": system, "clients": n, "runs": len(runs), "network": network,
             "tps_min": min(r["tps"] for r in runs), "tps_max": max(r["tps"] for r in runs)}
        for k in METRICS + EXTRA[1:]:
            vals = [r[k] for r in runs if k in r]
            if vals:
                m[k] = statistics.median(vals)
        by = [r[CAUSES] for r in runs if CAUSES in r]
        if by:
            m[CAUSES] = {c: statistics.median(b.get(c, 0.0) for b in by) for c in by[0]}
        out.append(m)
    return out


def table(med, notes, clients) -> str:
    """Two tables: median tps per client count with the ratios, then every system's detail."""
    systems = [s for s in SYSTEMS if any(m["system"] == s for m in med)]
    get = lambda s, n: next((m for m in med if m["system"] == s and m["clients"] == n), None)
    ratios = [(a, b) for a, b in RATIOS if a in systems and b in systems]
    lines = ["| clients | " + " | ".join(LABELS[s] for s in systems) +
             "".join(f" | {a} / {b}" for a, b in ratios) + " |",
             "|---" * (len(systems) + len(ratios) + 1) + "|"]
    for n in clients:
        cells = [f"{get(s, n)['tps']:,.0f}" if get(s, n) else "–" for s in systems]
        rr = [f"{get(a, n)['tps'] / get(b, n)['tps']:.2f}x"
              if get(a, n) and get(b, n) and get(b, n)["tps"] else "–" for a, b in ratios]
        lines.append(f"| {n} | " + " | ".join(cells + rr) + " |")
    lines += ["", "| system | clients | tps (median) | tps range | p50 µs | p99 µs | abort rate "
              "| round trips/txn | p50 µs / round trip | network |", "|---" * 10 + "|"]
    f = lambda m, k, fmt: format(m[k], fmt) if k in m else "–"
    # pgbench's tpcb-like script sends 7 statements (BEGIN, 3 UPDATEs, SELECT, INSERT, END)
    # and waits for each: 7 round trips, from the script (PostgreSQL does not count them).
    rts = lambda m: m.get("round_trips_per_txn") or (PG_ROUND_TRIPS if m["system"].startswith(
        "postgresql") else None)
    per_rt = lambda m: f"{m['p50_us'] / rts(m):.0f}" if rts(m) and "p50_us" in m else "–"
    rt_cell = lambda m: (f(m, "round_trips_per_txn", ".2f") if "round_trips_per_txn" in m
                         else f"{PG_ROUND_TRIPS} (script)" if rts(m) else "–")
    for m in med:
        lines.append(f"| {m['system']} | {m['clients']} | {m['tps']:,.0f} | "
                     f"{m['tps_min']:,.0f}–{m['tps_max']:,.0f} | {f(m, 'p50_us', ',.0f')} | "
                     f"{f(m, 'p99_us', ',.0f')} | {f(m, 'abort_rate', '.3f')} | "
                     f"{rt_cell(m)} | {per_rt(m)} | {m['network']} |")
    causes = [c for c in next((m[CAUSES] for m in med if CAUSES in m), {})
              if any(m.get(CAUSES, {}).get(c, 0) >= 0.005 for m in med)]
    if causes:
        lines += ["", "Round trips per committed transaction by cause (medians; `bench txn` "
                  "round_trips_per_txn_by_cause, docs/database.md; *aborted*: the part spent in "
                  "attempts that aborted):", "",
                  "| system | clients | " + " | ".join(causes) + " | aborted |",
                  "|---" * (len(causes) + 3) + "|"]
        for m in med:
            if CAUSES in m:
                lines.append(f"| {m['system']} | {m['clients']} | " + " | ".join(
                    f"{m[CAUSES].get(c, 0):.2f}" for c in causes) +
                    f" | {f(m, 'round_trips_aborted_per_txn', '.2f')} |")
    for s, n in notes.items():
        lines.append(f"\n- {LABELS.get(s, s)}: {n}")
    return "\n".join(lines) + "\n"


def plot(med, path, title, ylabel="TPC-B transactions/s", logscale=True):
    """Throughput per client count of every system in `med` (median, bars: the range), on
    log-log axes or linear ones."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for s in SYSTEMS:
        pts = sorted((m["clients"], m["tps"], m["tps_min"], m["tps_max"])
                     for m in med if m["system"] == s)
        if pts:
            x = [p[0] for p in pts]
            y = [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=LABELS[s])
    if logscale:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    ax.set_xlabel("clients")
    ax.set_ylabel(f"{ylabel} (median, bars: range{'; log' if logscale else ''})")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="round-robin repetitions per client count; tables show the median")
    ap.add_argument("--systems", default=",".join(SHM_SYSTEMS),
                    help=f"comma-separated, of {','.join(SYSTEMS)} (default: the shm set)")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    ap.add_argument("--out-name", default=None,
                    help="output file stem (default tpcb, or tpcb_tcp with a -tcp system)")
    ap.add_argument("--binary", action="append", default=[], metavar="NAME=PATH",
                    help="run the farpool systems with this binary too (A/B in one run)")
    args = ap.parse_args(argv)
    binaries = peers.binaries_arg(ap, args.binary)
    clients = [int(c) for c in args.clients.split(",")]
    systems = peers.systems_arg(ap, args.systems, SYSTEMS)
    tcp_set = TCP_SYSTEMS + ["pool-tcp-rc", "pool-tcp-fu"]
    name = args.out_name or ("tpcb_tcp" if any(s in tcp_set for s in systems) else "tpcb")
    peers.stop_on_sigterm()
    load_start = os.getloadavg()
    rows, notes = measure(systems, args.scale, clients, args.seconds, args.repeat, binaries)
    load_end = os.getloadavg()
    if not rows:
        for s, n in notes.items():
            log(f"{s}: {n}")
        return 1
    med = medians(rows)
    cmd = (f"bench/experiments/tpcb --systems {args.systems} --scale {args.scale} --clients "
           f"{args.clients} --seconds {args.seconds:g} --repeat {args.repeat}"
           + (f" --out-name {args.out_name}" if args.out_name else "")
           + "".join(f" --binary {b}" for b in args.binary))
    md = (peers.measured(rows[0], cmd, loads=(load_start, load_end)) + f" TPC-B scale "
          f"{args.scale}, transactions per second: the median of {args.repeat} runs per point, run "
          f"round-robin (for each client count every system once, then again).\n\n"
          + table(med, notes, clients))
    title = ("TPC-B over TCP, servers in network namespaces, same machine"
             if any(s in tcp_set for s in systems)
             else "TPC-B: farpool vs pgbench on PostgreSQL, same machine")
    peers.publish(args.out, name, rows, md, lambda path: plot(med, path, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
