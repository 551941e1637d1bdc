"""NAM-DB Fig. 4 on one machine, on shared memory and across a network: a distributed
transaction on the pool engine (one-sided RSI) vs the sharded engine (partition servers with
message-based two-phase commit), over 1..16 clients (threads, one session each, in one compute
process), with a fresh cluster per point. Two workloads (--workload):

  tpcw    the TPC-W-buy-like transaction (`farpool bench tpcw`, src/workloads/tpcw.h: a
          customer, its cart, 1..5 items' stock, an order and its lines); 10,000 customers and
          items
  bank    a transfer between two uniform accounts of 10,000 (`farpool bench txn --workload
          bank`, src/workloads/bank.h)

Systems (peers.farpool_point sets them up, as for bench/experiments/tpcb):
  pool         2 memory servers over shared memory
  sharded      partition servers in the benchmark's process
  pool-tcp     2 memory servers over TCP, each in its own network namespace, event progress
  sharded-tcp  2 `farpool shard --transport tcp --progress event` partition servers, each in
               its own namespace
  pool-tcp-fu  pool-tcp with --for-update: the rows a transaction writes read for update with
               the update intent, so the commit skips its lock round (bank 3 round trips, TPC-W
               buy 4); not the default over shm, where it costs latency (docs/experiments.md)

Every point runs with --verify (stock taken == the order lines' quantities; money conserved).
The points run round-robin (for each client count every system once, then again, --repeat
times); the .md shows the median tps and its range, p50/p99, abort rate, round trips per
committed transaction, the ratios pool / sharded, pool-tcp / sharded-tcp and
pool-tcp-fu / sharded-tcp, and the load
average at start and end. `--binary NAME=PATH` (twice or more) runs every system once per
binary in the same round-robin, with the ratio of the second binary over the first (an A/B).

Output: bench/results/W.jsonl, W.md, W.png (linear), W_log.png (log-log), W the workload.
Usage: bench/experiments/tpcw [--workload tpcw|bank] [--clients 1,2,4,8,16] [--seconds S]
                              [--repeat R]
                              [--systems pool,sharded,pool-tcp,sharded-tcp,pool-tcp-fu]
                              [--binary NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from farpool.harness import peers, tpcb
from farpool.harness.peers import log

SYSTEMS = ["pool", "sharded", "pool-tcp", "sharded-tcp", "pool-tcp-fu"]
ROWS = 10000  # customers and items (tpcw), accounts (bank)
WORKLOADS = {"tpcw": "TPC-W buy transactions/s", "bank": "bank transfers/s"}
TITLES = {"tpcw": "TPC-W buy: pool vs sharded, shm and TCP (cf. NAM-DB Fig. 4)",
          "bank": "Bank transfer: pool vs sharded, shm and TCP"}


def command(workload: str, seconds: float, system: str, clients: int) -> list[str]:
    """The farpool benchmark of one point: `workload` on `system`'s engine, `clients` threads."""
    engine = peers.engine_of(system)
    if workload == "tpcw":
        cmd = ["tpcw", "--flows", str(clients), "--customers", str(ROWS), "--items", str(ROWS)]
    else:
        cmd = ["txn", "--workload", "bank", "--threads", str(clients), "--accounts", str(ROWS)]
    return [str(peers.farpool_bin()), "bench", *cmd, "--engine", engine, "--seconds",
            str(seconds), "--warmup", "0.5", "--verify", "--json",
            *(["--for-update"] if system.endswith("-fu") else [])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="tpcw")
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=2,
                    help="round-robin repetitions per client count; tables show the median")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated, of {','.join(SYSTEMS)} (default: all)")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    ap.add_argument("--binary", action="append", default=[], metavar="NAME=PATH",
                    help="run every system with this binary too (A/B in one run)")
    args = ap.parse_args(argv)
    binaries = peers.binaries_arg(ap, args.binary)
    clients = [int(c) for c in args.clients.split(",")]
    systems = peers.systems_arg(ap, args.systems, SYSTEMS)
    w = args.workload
    peers.stop_on_sigterm()
    load_start = os.getloadavg()
    rows, notes = tpcb.measure(
        systems, 1, clients, args.seconds, args.repeat, binaries,
        command=lambda system, n: command(w, args.seconds, system, n), experiment=w,
        fields={"workload": w, "rows": ROWS})
    load_end = os.getloadavg()
    if not rows:
        for s, n in notes.items():
            log(f"{s}: {n}")
        return 1
    med = tpcb.medians(rows)
    cmd = (f"bench/experiments/tpcw --workload {w} --systems {args.systems} --clients "
           f"{args.clients} --seconds {args.seconds:g} --repeat {args.repeat}"
           + "".join(f" --binary {b}" for b in args.binary))
    md = (peers.measured(rows[0], cmd, loads=(load_start, load_end)) + f" Committed "
          f"{WORKLOADS[w]} (verified): the median of {args.repeat} runs per point, run "
          f"round-robin (for each client count every system once, then again).\n\n"
          + tpcb.table(med, notes, clients))
    title = TITLES[w]
    out = Path(args.out)
    peers.publish(out, w, rows, md,
                  lambda path: tpcb.plot(med, path, title, WORKLOADS[w], logscale=False))
    tpcb.plot(med, out / f"{w}_log.png", title, WORKLOADS[w])
    return 0


if __name__ == "__main__":
    sys.exit(main())
