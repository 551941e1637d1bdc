"""`make demo`: the social network of MEMSCALE and a short TPC-B, on farpool and on PostgreSQL,
in one run on this machine, summed up in one table.

Steps: generate the social network once and load the same data into farpool's local engine
(this process's RAM), into the pool (2 memory servers over shared memory), into the pool across
a network (2 memory servers over TCP, each in its own network namespace: the case of memory on
other machines; plain TCP over loopback where namespaces cannot be made) and into PostgreSQL
(started here, data on tmpfs, fsync off); check a sample of answers on each; run each of the
six queries for --seconds with one query flow; then TPC-B (pgbench's transaction) for --seconds
on each with one client; stop everything.

Usage: python -m farpool.harness.demo [--scale S] [--seconds S] [--tpcb-scale N] [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from farpool.harness import peers
from farpool.harness import tpcb as tpcb_mod

QUERIES = [("q1", "names of a user's friends"), ("q2", "number of new messages to a user"),
           ("q3", "new messages to the user's groups"), ("q4", "last 100 messages sent by a user"),
           ("q5", "text of one message"), ("q6", "names of the user's groups")]


def step(n: int, total: int, msg: str) -> None:
    print(f"[{n}/{total}] {msg}", flush=True)


def farpool_tpcb(engine: str, cluster: str | None, scale: int, clients: int, seconds: float) -> dict:
    cmd = [str(peers.farpool_bin()), "bench", "txn", "--engine", engine, "--workload", "tpcb",
           "--scale", str(scale), "--threads", str(clients), "--seconds", str(seconds),
           "--warmup", "0.5", "--verify", "--json"]
    if cluster:
        cmd += ["--cluster", cluster]
    return peers.run_json(cmd)


def fmt_us(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.1f} µs" if v < 1000 else f"{v / 1000:.2f} ms"


def ratio(a: float | None, b: float | None, lower_is_better: bool = True) -> str:
    if not a or not b:
        return "–"
    x = a / b
    return f"{x:.1f}x"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=30, help="social network: 1000 users per unit")
    ap.add_argument("--seconds", type=float, default=1.0, help="measured seconds per query")
    ap.add_argument("--tpcb-scale", type=int, default=1, help="TPC-B scale (100000 accounts each)")
    ap.add_argument("--tpcb-seconds", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=1, help="TPC-B clients (threads / pgbench -c)")
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    if not peers.farpool_bin().exists():
        print(f"demo: {peers.farpool_bin()} is missing; run `make build`", file=sys.stderr)
        return 1
    t_start = time.time()
    total = 7
    res: dict[str, dict] = {}
    tpcb: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="farpool-demo-", dir="/dev/shm") as tmp:
        step(1, total, f"generating the social network (scale {args.scale:g}) and exporting it "
             "as CSV for PostgreSQL")
        export = peers.export_social(args.scale, str(Path(tmp) / "csv"))
        meta = peers.read_meta(export)
        print(f"      {meta['users']:,} users, {meta['groups']:,} groups, {meta['messages']:,} "
              "messages (+ friendships, memberships, 3 message indexes)", flush=True)

        step(2, total, "farpool, local engine (the data in this process's RAM): load, verify, "
             "run the six queries")
        res["local"] = peers.farpool_social("local", args.scale, seconds=args.seconds)

        step(3, total, "starting a local farpool cluster: 2 memory servers x 1 GiB over shared "
             "memory; load, verify, run the six queries on the pool")
        with peers.Cluster(2, "1GiB", "shm") as cluster:
            subprocess.run([str(peers.farpool_bin()), "cluster", "status", "--dir",
                            str(Path(cluster).parent)])
            res["pool"] = peers.farpool_social("pool", args.scale, cluster, seconds=args.seconds)
            subprocess.run([str(peers.farpool_bin()), "cluster", "status", "--dir",
                            str(Path(cluster).parent)])

        step(4, total, "a second local cluster, across a network: 2 memory servers over TCP, each "
             "in its own network namespace; load, verify, run the six queries on the pool")
        tcp = peers.TcpCluster(2, "1GiB", attempts=1, log=lambda m: print(m, flush=True))
        with tcp as cluster:
            res["pool-tcp"] = peers.farpool_social("pool", args.scale, cluster, seconds=args.seconds)
        tcp_how = tcp.how

        step(5, total, "PostgreSQL 15 (started here: data on tmpfs, fsync off): load the same "
             "CSV, verify, run the six queries with pgbench (prepared statements)")
        with peers.Postgres(in_ram=True) as pg:
            t0 = time.perf_counter()
            pg.load_social(export)
            pg.verify_social(export)
            print(f"      loaded and verified in {time.perf_counter() - t0:.1f} s", flush=True)
            res["postgresql"] = {"queries": []}
            for q, _ in QUERIES:
                r = pg.social_query(q, meta, 1, args.seconds)
                r["query"] = q
                res["postgresql"]["queries"].append(r)

            step(6, total, f"TPC-B (pgbench's transaction), scale {args.tpcb_scale}, "
                 f"{args.clients} client(s), {args.tpcb_seconds:g} s each: PostgreSQL, farpool "
                 "local, farpool pool (shm, then TCP)")
            out = subprocess.run(["pgbench", *pg.conn_args(), "-i", "-q", "-s",
                                  str(args.tpcb_scale), "postgres"], capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"pgbench -i failed: {out.stderr.strip()[-300:]}")
            tpcb["postgresql"] = tpcb_mod.pgbench_run(pg, args.tpcb_scale, args.clients,
                                                      args.tpcb_seconds)
        tpcb["local"] = farpool_tpcb("local", None, args.tpcb_scale, args.clients, args.tpcb_seconds)
        with peers.Cluster(2, "1GiB", "shm") as cluster:
            tpcb["pool"] = farpool_tpcb("pool", cluster, args.tpcb_scale, args.clients,
                                        args.tpcb_seconds)
        with peers.TcpCluster(2, "1GiB", attempts=1, log=lambda m: print(m, flush=True)) as cluster:
            tpcb["pool-tcp"] = farpool_tpcb("pool", cluster, args.tpcb_scale, args.clients,
                                            args.tpcb_seconds)
    step(7, total, "clusters stopped, PostgreSQL stopped")

    # ------------------------------------------------------------ the one table
    def p50(system, q):
        r = next((x for x in res[system]["queries"] if x["query"] == q), None)
        return r["p50_us"] if r else None

    w = [40, 12, 12, 12, 12, 15, 17]
    head = ["", "farpool", "farpool", "farpool", "PostgreSQL", "pool / local", "PostgreSQL / pool"]
    head2 = ["", "local RAM", "pool (shm)", "pool (TCP)" if tcp_how == "tcp, netns" else "pool (TCP lo)", "(in RAM)",
             "(1.0x = same)", "(how much slower)"]
    line = lambda cells: "  ".join(c.ljust(w[0]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(cells))
    print()
    print("=" * 130)
    print(f"farpool demo: MEMSCALE's social network ({meta['users']:,} users, "
          f"{meta['messages']:,} messages), the same data in each system, answers verified.")
    print("Query latency is the median (p50) of one query, one query flow; lower is better.")
    print("=" * 130)
    print(line(head))
    print(line(head2))
    print("-" * 130)
    rows_out = []
    for q, desc in QUERIES:
        lo, po, pt, pg = p50("local", q), p50("pool", q), p50("pool-tcp", q), p50("postgresql", q)
        print(line([f"{q} {desc}", fmt_us(lo), fmt_us(po), fmt_us(pt), fmt_us(pg), ratio(po, lo),
                    ratio(pg, po)]))
        rows_out.append({"demo": "social", "query": q, "local_p50_us": lo, "pool_p50_us": po,
                         "pool_tcp_p50_us": pt, "pool_tcp_network": tcp_how,
                         "postgresql_p50_us": pg})
    print("-" * 130)
    tl, tp, tt, tg = (tpcb[s]["tps"] if "tps" in tpcb[s] else tpcb[s]["qps"]
                      for s in ("local", "pool", "pool-tcp", "postgresql"))
    print(line([f"TPC-B, {args.clients} client: transactions/s", f"{tl:,.0f}", f"{tp:,.0f}",
                f"{tt:,.0f}", f"{tg:,.0f}", f"{tl / tp:.1f}x" if tp else "–",
                f"{tp / tg:.1f}x" if tg else "–"]))
    print(line(["TPC-B: latency (p50; PostgreSQL: mean)", fmt_us(tpcb["local"]["p50_us"]),
                fmt_us(tpcb["pool"]["p50_us"]), fmt_us(tpcb["pool-tcp"]["p50_us"]),
                fmt_us(tpcb["postgresql"].get("mean_us")), "", ""]))
    print("=" * 130)
    print("pool / local: the cost of keeping the data in memory servers (other processes, which "
          "could be other machines)\ninstead of in the querying process. pool (TCP): the "
          "network case, each memory server in its own network namespace\n(TCP lo: over "
          "loopback); every round trip crosses a network stack (~50 µs here, ~2 µs on RDMA).\n"
          "PostgreSQL / pool: how much longer the same query takes in PostgreSQL.\nTPC-B (pgbench's schema and transaction; "
          "PostgreSQL run by pgbench, fsync off): the ratios are of time per transaction, so they "
          "read the same way.")
    print(f"Whole demo: {time.time() - t_start:.0f} s on {peers.context()['host']} "
          f"({peers.context()['cores']} cores).")
    ctx = peers.context()
    rows_out.append({"demo": "tpcb", "clients": args.clients, "scale": args.tpcb_scale,
                     "local_tps": tl, "pool_tps": tp, "pool_tcp_tps": tt,
                     "pool_tcp_network": tcp_how, "postgresql_tps": tg})
    for r in rows_out:
        r.update(ctx)
        r["social_scale"] = args.scale
    peers.write_jsonl(Path(args.out) / "demo.jsonl", rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
