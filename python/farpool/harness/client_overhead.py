"""What the Python client costs over the C++ path, on one local cluster, in one run.

Against a local cluster of two servers over shared memory (`farpool.LocalCluster`, the servers'
progress chosen by `cluster up`), one thread:

  pool read 64 B     `pool.read(a, 64)` (new bytes each call) and `pool.read_into(a, buf)` (a
                     reused bytearray) against `farpool bench ops --op read --size 64`
  pool faa 8 B       `pool.fetch_add(a, 1)` against `farpool bench ops --op faa`
                     (both sides on one object, `--working-set` = its size: cache-hot; the C++
                     figure includes its per-operation timer, `timer_overhead_ns` in the JSON)
  bank transfer      `db.run(transfer)`: multi_get of two accounts, two puts, commit, as the C++
                     bank workload does, against `farpool bench txn --workload bank` (one
                     client, one thread), on the accounts table that the C++ run made
  point get          `txn.get(t, k)` in an open read-only transaction (no C++ counterpart in
                     the CLI: absolute figures only)
  call floor         `farpool.address(1, 64)`: a native call that does no I/O (the cost of
                     crossing into C++ and back, without releasing the GIL)

Every figure is a p50, so that the preemptions of a shared machine do not decide it: for the
C++ side, the p50 its bench reports; for Python calls, the median over loops of 1,000 calls of
the loop's mean per call (a timer around each call would cost as much as a pool read); for the
bank transfer, the p50 of per-transaction times. The ratio column is Python / C++. Results: bench/results/python_client.jsonl (one JSON object per measurement) and
bench/results/python_client.md.

Usage: bench/python_client [--seconds S] [--calls N] [--out DIR]   (make bench-python)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import farpool
from farpool._build import farpool_binary
from farpool.harness import peers

ACCOUNTS = 1000


def typical_ns(call, calls: int) -> float:
    """The median of the mean times of loops of 1,000 calls, in ns: a per-call figure that, like
    a p50, ignores the loops that a preemption of this shared machine hit."""
    means = []
    for _ in range(max(1, calls // 1000)):
        t0 = time.perf_counter_ns()
        for _ in range(1000):
            call()
        means.append((time.perf_counter_ns() - t0) / 1000)
    return statistics.median(means)


def cxx_ops(cluster_file: str, op: str, size: int, seconds: float) -> dict:
    return peers.run_json([str(farpool_binary()), "bench", "ops", "--cluster", cluster_file,
                           "--op", op, "--size", str(size), "--working-set", str(size),
                           "--threads", "1", "--batch", "1", "--seconds", str(seconds), "--json"])


def cxx_bank(cluster_file: str, seconds: float) -> dict:
    return peers.run_json([str(farpool_binary()), "bench", "txn", "--engine", "pool",
                           "--cluster", cluster_file, "--workload", "bank", "--clients", "1",
                           "--threads", "1", "--accounts", str(ACCOUNTS), "--seconds",
                           str(seconds), "--json"])


def measure(seconds: float, calls: int) -> list[dict]:
    rows = []
    with farpool.LocalCluster(servers=2, memory="256MiB", transport="shm") as c:
        pool = farpool.Pool.connect(c.cluster_file)
        a = pool.alloc(64)
        pool.write(a, bytes(64))
        buf = bytearray(64)
        path = pool.access_path(a >> 48)
        address = farpool.address  # the native function itself, not the package's lookup
        floor_ns = typical_ns(lambda: address(1, 64), calls)
        rows.append({"bench": "python_client", "measure": "native call, no pool (floor)",
                     "path": "none", "python_us": floor_ns / 1000, "cxx_us": None,
                     "statistic": "p50"})
        for name, call, op, size in (
                ("pool.read 64 B", lambda: pool.read(a, 64), "read", 64),
                ("pool.read_into 64 B", lambda: pool.read_into(a, buf), "read", 64),
                ("pool.fetch_add 8 B", lambda: pool.fetch_add(a, 1), "faa", 8)):
            py_ns = typical_ns(call, calls)
            cxx = cxx_ops(c.cluster_file, op, size, seconds)
            rows.append({"bench": "python_client", "measure": name, "path": path,
                         "python_us": py_ns / 1000, "cxx_us": cxx["p50_us"],
                         "cxx_command": f"farpool bench ops --op {op} --size {size} "
                                        f"--working-set {size}",
                         "statistic": "p50"})

        # The C++ bank first: it wants a cluster without a database, and leaves its accounts
        # table for the Python side to use.
        cxx = cxx_bank(c.cluster_file, seconds)
        db = farpool.Database.open(cluster=c.cluster_file)
        t = db.open_table("accounts")
        with db.transaction() as txn:
            get_ns = typical_ns(lambda: txn.get(t, 7), calls // 10)
        rows.append({"bench": "python_client", "measure": "txn.get (point)", "path": path,
                     "python_us": get_ns / 1000, "cxx_us": None, "statistic": "p50"})

        rng = random.Random(1)
        latencies = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            src, dst, amount = rng.randrange(ACCOUNTS), rng.randrange(ACCOUNTS), rng.randint(1, 100)

            def transfer(txn):
                x, y = txn.multi_get([(t, src), (t, dst)])
                if src == dst:
                    return
                txn.put(t, src, {"balance": x["balance"] - amount})
                txn.put(t, dst, {"balance": y["balance"] + amount})

            t0 = time.perf_counter_ns()
            db.run(transfer)
            latencies.append(time.perf_counter_ns() - t0)
        rows.append({"bench": "python_client", "measure": "bank transfer (db.run)", "path": path,
                     "python_us": statistics.median(latencies) / 1000, "cxx_us": cxx["p50_us"],
                     "cxx_command": "farpool bench txn --workload bank --clients 1 --threads 1",
                     "statistic": "p50", "transactions": len(latencies)})
    peers.stamp(rows)
    return rows


def table(rows: list[dict]) -> str:
    r0 = rows[0]
    path = next(r["path"] for r in rows if r["cxx_us"] is not None)
    lines = [f"Python client vs C++ (`bench/python_client`), {r0['host']}, {r0['cores']} cores "
             f"(shared), git {r0['git_sha']}, {r0['time']}, access path {path}:", "",
             "| measure | statistic | Python | C++ | Python / C++ | Python - C++ |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["cxx_us"] is None:
            lines.append(f"| {r['measure']} | {r['statistic']} | {r['python_us']:.3f} µs | – | – | – |")
        else:
            lines.append(f"| {r['measure']} | {r['statistic']} | {r['python_us']:.3f} µs | "
                         f"{r['cxx_us']:.3f} µs | {r['python_us'] / r['cxx_us']:.1f}x | "
                         f"{r['python_us'] - r['cxx_us']:.3f} µs |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per C++ measurement "
                    "and for the Python transfers")
    ap.add_argument("--calls", type=int, default=200_000, help="calls per Python loop")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    rows = measure(args.seconds, args.calls)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "python_client.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    md = table(rows)
    (out / "python_client.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
