"""The operations benchmark against its peers, in one run on one machine.

Same operation, same sizes, same machine, one after the other:

  local-memory   `farpool bench ops --local`: memcpy and CPU atomics on this process's RAM
  ucx            `farpool-rawucx`: a plain UCX program (ucp_mem_map(ALLOCATE) region, busy-
                 polling target) -- the floor for farpool over the same fabric; over shm it
                 maps the region (ucp_rkey_ptr) as farpool does
  tcp-floor      `farpool-tcpfloor`: a bare request/response over busy-polled TCP loopback
                 sockets; no TCP design answers faster on this machine
  ucx_perftest   UCX's own benchmark, `ucp_get`, as shipped (its target does not busy-poll
                 for emulated operations, so over TCP it is far slower than the plain program)
  farpool        `farpool bench ops` against a local cluster: one server over shm (event
                 progress: same-host clients need no server CPU) and one over tcp (busy)
  redis          `redis-benchmark` GET/SET against a redis-server started here on a private
                 port (no persistence), one client, no pipelining

Operations: 64 B and 4 KiB reads (get/GET), writes (put+flush/SET), fetch-and-add and
compare-and-swap on 8 B, and batched 4 KiB reads (32 per wait) for bandwidth. Results go to
bench/results/ops.jsonl (one JSON object per measurement), bench/results/ops.md (the table,
with the ratios the issue's targets name) and bench/results/ops.png.

Usage: bench/ops_vs_peers [--seconds S] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from farpool.harness import peers

ROOT = peers.ROOT
BUILD = ROOT / "build"
FARPOOL = peers.farpool_bin()
RAWUCX = BUILD / "farpool-rawucx"
TCPFLOOR = BUILD / "farpool-tcpfloor"


def farpool_ops(cluster: str | None, op: str, size: int, batch: int, seconds: float) -> dict:
    cmd = [str(FARPOOL), "bench", "ops", "--op", op, "--size", str(size), "--batch", str(batch),
           "--seconds", str(seconds), "--warmup", "0.3", "--json"]
    cmd += ["--cluster", cluster] if cluster else ["--local"]
    return peers.run_json(cmd)


# farpool's servers allocate their region from POSIX shared memory first (the path on which a
# same-host client maps it); the raw program gets the same allocation, so the comparison is of
# the software on top, not of the kind of memory underneath.
ALLOC_PRIO = "md:posix,md:sysv,huge,thp,md:*,mmap,heap"


def rawucx(tls: str, op: str, size: int, batch: int, seconds: float, mapped: bool) -> dict:
    env = dict(os.environ, UCX_TLS=tls, UCX_ALLOC_PRIO=ALLOC_PRIO)
    port = peers.free_port()
    server = subprocess.Popen([str(RAWUCX), "server", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready", "farpool-rawucx server did not start"
        cmd = [str(RAWUCX), "client", "--port", str(port), "--op", op, "--size", str(size),
               "--batch", str(batch), "--seconds", str(seconds)]
        if mapped:
            cmd.append("--mapped")
        return peers.run_json(cmd, env=env)
    finally:
        server.wait(timeout=30)


def perftest(tls: str, size: int, outstanding: int, iters: int) -> dict:
    """ucx_perftest ucp_get; returns typical latency and bandwidth from its 'Final:' line."""
    env = dict(os.environ, UCX_TLS=tls)
    port = peers.free_port()
    server = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        cmd = ["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "ucp_get", "-s", str(size),
               "-n", str(iters), "-w", str(min(1000, iters // 10))]
        if outstanding > 1:
            cmd += ["-O", str(outstanding)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        final = [line for line in out.stdout.splitlines() if line.startswith("Final:")]
        if not final:
            raise RuntimeError(f"ucx_perftest gave no result: {out.stderr.strip()[-300:]}")
        f = final[0].split()
        # Final: iterations typical_lat avg_lat overall_lat avg_bw overall_bw avg_rate overall_rate
        return {"p50_us": float(f[2]), "mean_us": float(f[3]), "mb_per_s": float(f[6]) * 1.048576,
                "ops_per_s": float(f[8])}
    finally:
        server.wait(timeout=30)


def redis(size: int, requests: int) -> list[dict]:
    port = peers.free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "",
                               "--appendonly", "no", "--bind", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                              text=True).stdout.strip() == "PONG":
                break
            time.sleep(0.05)
        out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "set,get", "-n",
                              str(requests), "-c", "1", "-P", "1", "-d", str(size), "-r", "10000",
                              "--csv"], capture_output=True, text=True, timeout=600, check=True)
        rows = []
        lines = out.stdout.strip().splitlines()
        header = [h.strip('"') for h in lines[0].split(",")]
        for line in lines[1:]:
            values = dict(zip(header, [v.strip('"') for v in line.split(",")]))
            op = {"SET": "write", "GET": "read"}[values["test"]]
            rows.append({"system": "redis", "op": op, "size": size, "batch": 1, "transport": "tcp",
                         "ops_per_s": float(values["rps"]),
                         "p50_us": float(values["p50_latency_ms"]) * 1000,
                         "p99_us": float(values["p99_latency_ms"]) * 1000,
                         "mean_us": float(values["avg_latency_ms"]) * 1000})
        return rows
    finally:
        server.terminate()
        server.wait(timeout=30)


OPS = [("read", 64, 1), ("read", 4096, 1), ("write", 64, 1), ("write", 4096, 1),
       ("faa", 8, 1), ("cas", 8, 1), ("read", 4096, 32)]
RAW_OP = {"read": "get", "write": "put", "faa": "fadd", "cas": "cswap"}


def measure(seconds: float, quick: bool, log) -> list[dict]:
    rows: list[dict] = []

    def add(row: dict, **extra):
        row.update(extra)
        rows.append(row)
        log(f"  {row['system']:<13} {row.get('transport', ''):<5} {row['op']:<5} "
            f"{row['size']:>5} B x{row.get('batch', 1):<3} p50 {row['p50_us']:9.3f} us  "
            f"{row['ops_per_s']:12.0f} ops/s")

    ops = OPS if not quick else [o for o in OPS if o in [("read", 64, 1), ("read", 4096, 32),
                                                         ("faa", 8, 1)]]
    log("local memory")
    for op, size, batch in ops:
        add(farpool_ops(None, op, size, batch, seconds), transport="local")
    log("raw UCX (farpool-rawucx)")
    for tls, transport, mapped in [("sm,self", "shm", True), ("tcp", "tcp", False)]:
        for op, size, batch in ops:
            r = rawucx(tls, RAW_OP[op], size, batch, seconds, mapped)
            add(r, op=op, transport=transport, threads=1)
    log("TCP loopback floor (farpool-tcpfloor)")
    for size in (64, 4096):
        add(peers.run_json([str(TCPFLOOR), "--size", str(size), "--seconds", str(seconds)]))
    log("ucx_perftest ucp_get")
    for tls, transport in [("sm,self", "shm"), ("tcp", "tcp")]:
        iters = 200000 if transport == "shm" else 20000
        for size, outstanding in [(64, 1), (4096, 32)]:
            r = perftest(tls, size, outstanding, iters // (4 if quick else 1))
            add(r, system="ucx_perftest", op="read", size=size, batch=outstanding,
                transport=transport)
    for transport, progress in [("shm", "event"), ("tcp", "busy")]:
        log(f"farpool over {transport} (server progress {progress})")
        with peers.Cluster(servers=1, memory="512MiB", transport=transport, progress=progress) as cluster:
            for op, size, batch in ops:
                add(farpool_ops(cluster, op, size, batch, seconds), server_progress=progress)
    log("redis (redis-benchmark, 1 client)")
    for size in (64, 4096):
        for r in redis(size, 20000 if quick else 100000):
            add(r)
    peers.stamp(rows)
    return rows


def find(rows, system, transport, op, size, batch=1):
    for r in rows:
        if (r["system"] == system and r.get("transport") == transport and r["op"] == op
                and r["size"] == size and r.get("batch", 1) == batch):
            return r
    return None


def measured_ops(rows: list[dict]) -> list[tuple]:
    return [o for o in OPS if any(find(rows, "farpool", t, *o) for t in ("shm", "tcp"))]


def table(rows: list[dict]) -> str:
    lines = ["| operation | local memory | raw UCX shm | farpool shm | TCP floor | raw UCX tcp | "
             "farpool tcp | Redis | farpool tcp / raw UCX tcp | Redis / farpool tcp |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for op, size, batch in measured_ops(rows):
        cells = []
        for system, transport in [("local-memory", "local"), ("ucx", "shm"), ("farpool", "shm"),
                                  ("tcp-floor", "tcp"), ("ucx", "tcp"), ("farpool", "tcp"),
                                  ("redis", "tcp")]:
            r = find(rows, system, transport, op, size, batch)
            if r is None:
                cells.append("–")
            elif batch > 1:
                cells.append(f"{r['mb_per_s']:.0f} MB/s")
            else:
                cells.append(f"{r['p50_us']:.3f} µs")
        fp, raw, rd = (find(rows, "farpool", "tcp", op, size, batch),
                       find(rows, "ucx", "tcp", op, size, batch),
                       find(rows, "redis", "tcp", op, size, batch))
        if batch > 1:
            ratio = f"{fp['mb_per_s'] / raw['mb_per_s']:.2f}x bandwidth" if fp and raw else "–"
        else:
            ratio = f"{fp['p50_us'] / raw['p50_us']:.2f}x" if fp and raw else "–"
        redis_ratio = f"{rd['p50_us'] / fp['p50_us']:.1f}x" if fp and rd and batch == 1 else "–"
        name = f"{op} {size} B" + (f", batch {batch}" if batch > 1 else "")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} | {redis_ratio} |")
    cpu = {}
    for r in rows:
        if r["system"] == "farpool" and "server_cpu_pct" in r:
            cpu.setdefault(r["transport"], []).append(r["server_cpu_pct"])
    if cpu:
        lines.append("")
        lines.append("Memory-server CPU while farpool was measured (% of one core, max over "
                     "the rows): " + "; ".join(
                         f"{t} ({'event' if t == 'shm' else 'busy'} progress) {max(v):.0f}%"
                         for t, v in cpu.items()))
    perf = [r for r in rows if r["system"] == "ucx_perftest"]
    if perf:
        lines.append("")
        lines.append("ucx_perftest `ucp_get` as shipped: " + "; ".join(
            f"{r['transport']} {r['size']} B" + (f" x{r['batch']} outstanding: {r['mb_per_s']:.0f} MB/s"
                                                 if r['batch'] > 1 else f": {r['p50_us']:.3f} µs")
            for r in perf))
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [("local-memory", "local", "local memory"), ("ucx", "shm", "raw UCX shm"),
               ("farpool", "shm", "farpool shm"), ("tcp-floor", "tcp", "TCP floor"),
               ("ucx", "tcp", "raw UCX tcp"),
               ("farpool", "tcp", "farpool tcp"), ("redis", "tcp", "Redis")]
    ops = [o for o in measured_ops(rows) if o[2] == 1]
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / len(systems)
    for k, (system, transport, label) in enumerate(systems):
        values = []
        for op, size, batch in ops:
            r = find(rows, system, transport, op, size, batch)
            values.append(r["p50_us"] if r else 0)
        ax.bar([i + k * width for i in range(len(ops))], values, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ops))])
    ax.set_xticklabels([f"{op} {size} B" for op, size, _ in ops])
    ax.set_yscale("log")
    ax.set_ylabel("p50 latency (µs, log scale)")
    ax.set_title("One-sided operations vs peers, one client thread (same machine, same run)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per point")
    ap.add_argument("--quick", action="store_true", help="fewer points, for the demo")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    for binary in (FARPOOL, RAWUCX, TCPFLOOR):
        if not binary.exists():
            print(f"ops_vs_peers: {binary} is missing; run `make build` first", file=sys.stderr)
            return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(args.seconds, args.quick, lambda m: print(m, flush=True))
    name = "ops_quick" if args.quick else "ops"
    with open(out / f"{name}.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    md = table(rows)
    header = (f"Measured {rows[0]['time']} on {rows[0]['host']} ({rows[0]['cores']} cores), "
              f"git {rows[0]['git_sha']}, with `bench/ops_vs_peers"
              f"{' --quick' if args.quick else ''} --seconds {args.seconds}`. p50 latency per "
              "operation (one client thread); batched rows are bandwidth.\n\n")
    (out / f"{name}.md").write_text(header + md)
    plot(rows, out / f"{name}.png")
    print()
    print(md)
    print(f"results: {out / (name + '.jsonl')}, {out / (name + '.md')}, {out / (name + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
