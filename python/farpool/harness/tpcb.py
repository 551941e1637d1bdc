"""TPC-B: farpool vs pgbench on PostgreSQL, same scale, same client counts, same machine.

  postgresql-ram      PostgreSQL 15 started here, data dir on tmpfs (/dev/shm), fsync,
                      synchronous_commit and full_page_writes off (the in-memory comparison)
  postgresql-default  the same with PostgreSQL's defaults, data dir on disk (/var/tmp)
  pool                `farpool bench txn --workload tpcb` on a fresh local cluster (2 memory
                      servers over shared memory) for each client count; clients are threads
                      with one session each in one compute process
  local               the same on the local engine
  sharded             the same on the sharded engine (in-process partition servers), if built

PostgreSQL: `pgbench -i -s SCALE` then `pgbench -c N -j N -T S -M prepared` (the built-in
tpcb-like script). farpool's tpcb is the same schema and transaction (src/db/txn_bench.h).
Output: bench/results/tpcb.jsonl, tpcb.md (tps per client count and pool / PostgreSQL), tpcb.png.

Usage: bench/experiments/tpcb [--scale N] [--clients 1,2,4,8] [--seconds S]
                              [--systems pool,local,sharded,postgresql-ram,postgresql-default]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from farpool.harness import peers
from farpool.harness.peers import log

SYSTEMS = ["pool", "local", "sharded", "postgresql-ram", "postgresql-default"]
LABELS = {"pool": "farpool pool (shm)", "local": "farpool local", "sharded": "farpool sharded",
          "postgresql-ram": "PostgreSQL (tmpfs, fsync off)",
          "postgresql-default": "PostgreSQL (defaults, disk)"}


def farpool_tpcb(engine: str, scale: int, clients: int, seconds: float) -> dict:
    cmd = [str(peers.farpool_bin()), "bench", "txn", "--engine", engine, "--workload", "tpcb",
           "--scale", str(scale), "--threads", str(clients), "--seconds", str(seconds),
           "--warmup", "0.5", "--verify", "--json"]
    if engine == "pool":
        with peers.Cluster(2, "1GiB", "shm") as c:
            return peers.run_json(cmd + ["--cluster", c])
    return peers.run_json(cmd)


def pgbench_run(pg: peers.Postgres, scale: int, clients: int, seconds: float) -> dict:
    out = subprocess.run(["pgbench", *pg.conn_args(), "-n", "-M", "prepared", "-c", str(clients),
                          "-j", str(clients), "-T", str(max(1, round(seconds))), "-s", str(scale),
                          "postgres"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"pgbench failed: {out.stderr.strip()[-300:]}")
    r = {}
    for line in out.stdout.splitlines():
        if line.startswith("tps"):
            r["tps"] = float(line.split()[2])
        elif line.startswith("latency average"):
            r["mean_us"] = float(line.split()[3]) * 1000
        elif line.startswith("number of failed"):
            r["failed"] = int(line.split(":")[1].split()[0])
    return r


def measure(systems, scale, clients, seconds):
    rows, notes = [], {}
    for system in systems:
        try:
            if system.startswith("postgresql"):
                in_ram = system == "postgresql-ram"
                with peers.Postgres(in_ram=in_ram) as pg:
                    log(f"== {LABELS[system]}: pgbench -i -s {scale}")
                    out = subprocess.run(["pgbench", *pg.conn_args(), "-i", "-q", "-s", str(scale),
                                          "postgres"], capture_output=True, text=True)
                    if out.returncode != 0:
                        raise RuntimeError(f"pgbench -i: {out.stderr.strip()[-300:]}")
                    for n in clients:
                        r = pgbench_run(pg, scale, n, seconds)
                        log(f"   {n} clients: {r['tps']:.0f} tps")
                        rows.append({"experiment": "tpcb", "system": system, "clients": n,
                                     "scale": scale, **r})
            else:
                if system == "sharded":
                    why = peers.sharded_available()
                    if why:
                        notes[system] = f"not available: {why}"
                        continue
                for n in clients:
                    r = farpool_tpcb(system, scale, n, seconds)
                    log(f"== {LABELS[system]} {n} clients: {r['tps']:.0f} tps, abort rate "
                        f"{r['abort_rate']:.3f}")
                    rows.append({"experiment": "tpcb", "system": system, "clients": n,
                                 "scale": scale, "tps": r["tps"], "p50_us": r["p50_us"],
                                 "p99_us": r["p99_us"], "abort_rate": r["abort_rate"]})
        except (RuntimeError, OSError) as e:
            log(f"   {system} failed: {e}")
            notes[system] = f"failed: {str(e)[:300]}"
    peers.stamp(rows)
    return rows, notes


def table(rows, notes, clients):
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    get = lambda s, n: next((r for r in rows if r["system"] == s and r["clients"] == n), None)
    lines = ["| clients | " + " | ".join(LABELS[s] for s in systems) +
             " | pool / PostgreSQL (RAM) | pool / PostgreSQL (defaults) |",
             "|---" * (len(systems) + 3) + "|"]
    for n in clients:
        cells = [f"{get(s, n)['tps']:,.0f}" if get(s, n) else "–" for s in systems]
        p = get("pool", n)
        rr = [f"{p['tps'] / get(s, n)['tps']:.1f}x" if p and get(s, n) and get(s, n)["tps"] else "–"
              for s in ("postgresql-ram", "postgresql-default")]
        lines.append(f"| {n} | " + " | ".join(cells) + " | " + " | ".join(rr) + " |")
    for s, n in notes.items():
        lines.append(f"\n- {LABELS.get(s, s)}: {n}")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for s in SYSTEMS:
        pts = sorted((r["clients"], r["tps"]) for r in rows if r["system"] == s)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=LABELS[s])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("clients")
    ax.set_ylabel("TPC-B transactions/s (log)")
    ax.set_title("TPC-B: farpool vs pgbench on PostgreSQL, same machine")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    rows, notes = measure(args.systems.split(","), args.scale, clients, args.seconds)
    if not rows:
        return 1
    out = Path(args.out)
    peers.write_jsonl(out / "tpcb.jsonl", rows)
    r0 = rows[0]
    md = (f"Measured {r0['time']} on {r0['host']} ({r0['cores']} cores), git {r0['git_sha']}, "
          f"`bench/experiments/tpcb --scale {args.scale} --clients {args.clients} --seconds "
          f"{args.seconds}`. Transactions per second.\n\n" + table(rows, notes, clients))
    (out / "tpcb.md").write_text(md)
    plot(rows, out / "tpcb.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
