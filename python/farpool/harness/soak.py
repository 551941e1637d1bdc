"""Soak: the database at full speed for a long time must not grow the pool or any process.

For each workload (bank, then tpcb) on a fresh local cluster of SERVERS servers × MEMORY (by
default 2 × 256 MiB = a 512 MiB pool over shm, no replicas; `--transport tcp --netns
--replicas 1 --servers 3` is the network case: every server in its own network namespace,
etcd membership, a coordinator, forwards to backups), `farpool bench txn --verify` runs CLIENTS
client processes × THREADS threads for SECONDS/len(workloads) seconds, while this script
samples every INTERVAL seconds and prints:
  * the pool memory in use — `leased`, summed over the servers that answer, from `farpool
    cluster status --json`;
  * the memory of every process of the run, from /proc/PID/status: each memory server, the
    cluster's etcd and the bench's processes (the parent and its client processes). VmRSS is
    everything resident: a server's region, mirror slots and shared pages (RssShmem) count as
    they are touched, so they grow while the pool fills and when a re-replication fills a slot;
    etcd's database file is mapped (RssFile). What is judged is RssAnon, the private memory: the
    heap, stacks, UCX's buffers — where a leak shows. The size of etcd's database file
    (member/snap/db) is sampled too.
With --faults K (replicas 1 or more), every K seconds from the end of the warm-up one fault,
the kinds of --fault-kinds (default kill) in turn: kill (`farpool cluster add` starts a server,
room for re-replication, then one memory server is SIGKILLed — in turn a primary that is not
the coordinator, then the elected coordinator), stop (the same, but SIGSTOP for 1.5-4 s, then
SIGCONT), client-stop (a bench client process SIGSTOPped past its session lease), etcd
(etcd SIGKILLed and started again on its data 2 s later) and clock-step (the wall clock of the
bench's processes and of one server stepped by an hour, as a host's NTP step does: see
`soak_faults.WallClock`) — each step once every region has its backups again (re-replication
done; a second loss before that loses data by design). What became of each victim is judged at
the end: see farpool.harness.soak_faults (the faults) and farpool.harness.soak_probes (what
both modules read of the cluster and /proc).

Pass, per workload:
  * pool memory: let W be the memory in use at the end of the warm-up (the first WARMUP
    fraction of the workload's wall time, 20 % by default, loading included). Every later
    sample must be ≤ 1.1 × W + one chunk (4 MiB) per client process per server. An engine
    without version garbage collection fails here: every commit leaves an old version behind,
    and the pool fills (the bench then fails with OutOfMemory, also a failure, reported with the
    timeline).
  * process memory: every process sampled both at the end of the warm-up and after it (a
    killed server until its death; a server added later is reported, not judged) must keep
    its RssAnon ≤ 1.1 × its value at the end of the warm-up + 32 MiB (the processes hold 6 to
    15 MiB each over TCP: the 32 MiB dominate). A leak of 1 KB per transaction crosses it in
    under a minute at bank's 1,600 tps over TCP here, in 2 minutes at TPC-B's 280, and in the
    8 minutes after a 10-minute run's warm-up from about 80 tps;
    etcd's database (its /metrics) must stay ≤ 1.1 × + 16 MiB likewise. The verdict names the
    process.
  * invariant: the bench's --verify at the end (bank: the total is conserved; tpcb:
    sum(accounts) == sum(tellers) == sum(branches)). TPC-B runs with --history-keep
    HISTORY_KEEP (each thread deletes its history row of HISTORY_KEEP transactions earlier), so
    its live data stays the same size: deleted rows must be reclaimed too.
  * the bench exits 0: with faults too (a failover is the client's to ride out). A client
    process the bench reports failed (clients_failed) must be one that a client-stop stopped;
    a server no fault was aimed at must still run at the end, and a stopped one must have
    exited or still serve its own region (`soak_faults.Faults.judge`).
  * reported, not judged: throughput, abort rate, p50/p99 and the longest wait of any committed
    transaction (max_us); the kills and additions with their times.
  * the bench finishes: within its seconds + max(60 s, its seconds), else it is killed (hung
    or livelocked): failure.

Output: one JSON line per workload appended to OUT (bench/results/soak.jsonl by default: git
sha, host, load average, options, the memory timelines, the bounds, the verdict); exit status 1
if any workload failed. A failed workload keeps its cluster's logs (server-N.log, etcd.log) and
the bench's stderr in DIR/soak-WORKLOAD-PID-logs (DIR: --dir, else the temporary directory);
with --keep-logs one that passed too.

  python3 -m farpool.harness.soak --seconds 600          # make soak (SOAK_SECONDS overrides)
  python3 -m farpool.harness.soak --seconds 1200 --transport tcp --netns --servers 3 \
      --replicas 1 --out bench/results/soak_net.jsonl    # make soak-net
  ... --faults 45                                        # make soak-net SOAK_FAULTS=45
  ... --faults 10 --fault-kinds kill,stop,client-stop,etcd,clock-step   # every kind in turn
  python3 -m farpool.harness.soak --seconds 60           # the suite's short variants
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from farpool.harness.peers import ROOT, Cluster, farpool_bin, log, stamp, write_jsonl
from farpool.harness.soak_faults import (FAULT_KINDS, Faults, WallClock, add_clock_server,
                                         libfaketime)
from farpool.harness.soak_probes import cluster_status, proc_memory, process_group

CHUNK = 4 << 20  # the servers' chunk size (LocalClusterOptions::chunk_size default)
MIB = 1 << 20
PROCESS_GROWTH = 1.1  # a process's RssAnon bound: PROCESS_GROWTH × at warm-up end + PROCESS_SLACK
PROCESS_SLACK = 32 * MIB
ETCD_DB_SLACK = 16 * MIB  # etcd's database file: PROCESS_GROWTH × + ETCD_DB_SLACK
TIMELINE_MS = 1000  # the bench's commit timeline with clock steps: commits after each step


def pool_in_use(status: dict) -> int:
    return sum(int(s["leased"]) for s in status["servers"] if s["up"])


def run_processes(cluster_file: str, bench_pid: int) -> dict[str, int]:
    """label -> pid of every process of the run: "server N" (cluster.json, rewritten by
    `cluster add`), "etcd", "bench" and "client PID" (its client processes)."""
    config = json.loads(Path(cluster_file).read_text())
    procs = {f"server {s['id']}": int(s["pid"]) for s in config["servers"] if s.get("pid")}
    if config.get("etcd", {}).get("pid", 0) > 0:
        procs["etcd"] = int(config["etcd"]["pid"])
    for pid in process_group(bench_pid):
        procs["bench" if pid == bench_pid else f"client {pid}"] = pid
    return procs


def judge_memory(timeline: list[tuple[float, int]], wall: float, warmup: float, clients: int,
                 servers: int) -> dict:
    """The memory bound: after the warm-up (the first `warmup` fraction of `wall` seconds), no
    sample may exceed 1.1 × the last warm-up sample + one chunk per client process per server.
    Returns in_use_at_warmup_end, bound, peak_after_warmup and, if it does not hold, failure."""
    warm_end = warmup * wall
    warm = [m for t, m in timeline if t <= warm_end]
    later = [m for t, m in timeline if t > warm_end]
    if not warm or not later:
        end = timeline[-1][0] if timeline else 0
        return {"failure": f"no memory sample after the warm-up (t={warm_end:.0f}s; "
                           f"{len(timeline)} samples, the last at t={end:.0f}s): cannot judge growth"}
    base = warm[-1]
    bound = int(1.1 * base + CHUNK * clients * servers)
    peak = max(later)
    out = {"in_use_at_warmup_end": base, "bound": bound, "peak_after_warmup": peak}
    if peak > bound:
        out["failure"] = (f"pool memory grew after the warm-up: peak {peak / 2**20:.1f} MiB > "
                          f"bound {bound / 2**20:.1f} MiB (1.1 × {base / 2**20:.1f} MiB at "
                          f"t={warm_end:.0f}s + {clients}×{servers} chunks of 4 MiB)")
    return out


def judge_growth(name: str, what: str, timeline: list[tuple[float, int]], warm_end: float,
                 slack: int) -> dict:
    """One process's (or file's) bound: every sample after `warm_end` seconds must be ≤
    PROCESS_GROWTH × the last sample at or before it + `slack`. A series without both (a process
    started after the warm-up, or gone before its end) is reported, not judged: judged False."""
    warm = [m for t, m in timeline if t <= warm_end]
    later = [m for t, m in timeline if t > warm_end]
    if not warm or not later:
        return {"judged": False, "peak": max((m for _, m in timeline), default=0)}
    base = warm[-1]
    bound = int(PROCESS_GROWTH * base + slack)
    peak = max(later)
    out = {"judged": True, "at_warmup_end": base, "bound": bound, "peak_after_warmup": peak}
    if peak > bound:
        out["failure"] = (f"{name}: {what} grew after the warm-up: peak {peak / MIB:.1f} MiB > "
                          f"bound {bound / MIB:.1f} MiB ({PROCESS_GROWTH} × {base / MIB:.1f} MiB "
                          f"at t={warm_end:.0f}s + {slack // MIB} MiB)")
    return out


def etcd_metrics(endpoint: str) -> dict | None:
    """etcd's own figures from its /metrics: db_size (etcd_mvcc_db_total_size_in_bytes, its
    database file as allocated), db_in_use, revision (one per write: the coordinator's map
    writes, servers' registrations) and keys; None if it does not answer."""
    names = {"etcd_mvcc_db_total_size_in_bytes": "db_size",
             "etcd_mvcc_db_total_size_in_use_in_bytes": "db_in_use",
             "etcd_debugging_mvcc_current_revision": "revision",
             "etcd_debugging_mvcc_keys_total": "keys"}
    try:
        with urllib.request.urlopen(endpoint + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return None
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[names[name]] = int(float(value))
    return out if "db_size" in out else None


def soak_one(workload: str, seconds: float, args: argparse.Namespace) -> dict:
    row = {"bench": "soak", "workload": workload, "engine": "pool", "seconds": seconds,
           "servers": args.servers, "memory_per_server": args.memory, "clients": args.clients,
           "threads": args.threads, "interval_s": args.interval,
           "warmup_fraction": args.warmup, "seed": args.seed, "transport": args.transport,
           "netns": args.netns, "replicas": args.replicas, "faults_every_s": args.faults,
           "fault_kinds": args.fault_kinds if args.faults else None,
           "binary": str(farpool_bin()), "loadavg_start": os.getloadavg()}
    timeline: list[tuple[float, int]] = []
    rss: dict[str, list[tuple[float, dict]]] = {}
    etcd_db: list[tuple[float, int]] = []
    etcd_revisions: list[tuple[float, int, int]] = []  # (t, revision, keys)
    max_servers = args.servers
    faults = None
    # With f ≥ 2 backups the first servers need room beyond `cluster up`'s f + 1 slots: a region
    # of an added server needs f backups on f *other* servers, and re-replication, greedy,
    # filled the first servers' slots with the failed-over regions' copies, so the added
    # server's region kept 1 of 2 backups and every later fault waited for good (see
    # soak_faults.Faults).
    extra = (("--mirror-slots", str(2 * (args.replicas + 1)))
             if args.faults and args.replicas >= 2 else ())
    row["cluster_up_extra"] = list(extra)
    cluster = Cluster(servers=args.servers, memory=args.memory, transport=args.transport,
                      netns=args.netns, replicas=args.replicas, parent=args.dir,
                      progress="event" if args.transport != "shm" else None, extra=extra)
    # With clock steps the bench's processes and one server added at the start (it holds a
    # region and copies from then on) run under a wall clock of their own; libfaketime's files
    # go once the cluster is down.
    clock = (WallClock(libfaketime(), args.dir)
             if args.faults and "clock-step" in args.fault_kinds.split(",") else None)
    with clock or contextlib.nullcontext(), cluster as cluster_file:
        cluster_dir = str(Path(cluster_file).parent)
        if clock is not None:
            row["clock_server"] = add_clock_server(cluster_dir, cluster_file, clock)
            log(f"soak {workload}: server {row['clock_server']['id']} (pid "
                f"{row['clock_server']['pid']}) runs under the stepped wall clock"
                if "id" in row["clock_server"] else
                f"soak {workload}: no clock server: {row['clock_server']['add']}")
        # The cluster's etcd, if its file names one.
        etcd_endpoint = (json.loads(Path(cluster_file).read_text()).get("etcd", {})
                         .get("endpoints") or [None])[0]
        row["how"] = f"{args.transport}{', netns' if args.netns else ''}, replicas {args.replicas}"
        cmd = [str(farpool_bin()), "bench", "txn", "--cluster", cluster_file, "--engine", "pool",
               "--workload", workload, "--clients", str(args.clients), "--threads",
               str(args.threads), "--seconds", str(seconds), "--warmup", "0", "--seed",
               str(args.seed), "--verify", "--json"]
        if workload == "bank":
            cmd += ["--accounts", str(args.accounts)]
        else:
            # pgbench's history grows by a row per transaction: keep a window of it, so that the
            # live data stays the same size and any growth is garbage left behind.
            cmd += ["--history-keep", str(args.history_keep)]
        if clock is not None:
            cmd += ["--timeline-ms", str(TIMELINE_MS)]
        log(f"soak {workload}: {' '.join(cmd)}")
        start = time.monotonic()
        # Its own process group, so that a hung bench goes down with its client processes; in
        # our session (a session of its own would be a scheduling autogroup of its own: starved
        # on a loaded host, docs/pool.md "Failure detection").
        bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 process_group=0, env=clock.env() if clock else None)
        if clock is not None:
            clock.pids.add(bench.pid)  # the chain's first process: its /dev/shm files
        try:
            if args.faults:
                faults = Faults(cluster_dir, cluster_file, args.faults, args.warmup * seconds,
                                args.replicas, args.fault_kinds.split(","), args.seed, bench.pid,
                                clock, row.get("clock_server", {}).get("id"), seconds)
            limit = start + seconds + max(60.0, seconds)
            while bench.poll() is None:
                now = time.monotonic()
                t = round(now - start, 1)
                if now > limit:
                    os.killpg(bench.pid, signal.SIGKILL)
                    row["error"] = (f"bench did not finish within "
                                    f"{seconds + max(60.0, seconds):.0f} s (hung or livelocked): "
                                    "killed")
                    break
                for name, pid in run_processes(cluster_file, bench.pid).items():
                    m = proc_memory(pid)
                    if m is not None:
                        # A process started again under the same name (etcd after the etcd
                        # fault) is a series of its own.
                        if rss.get(name) and rss[name][0][1]["pid"] != pid:
                            name = f"{name} (pid {pid})"
                        rss.setdefault(name, []).append((t, m | {"pid": pid}))
                etcd = etcd_metrics(etcd_endpoint) if etcd_endpoint else None
                if etcd is not None:
                    etcd_db.append((t, etcd["db_size"]))
                    etcd_revisions.append((t, etcd["revision"], etcd["keys"]))
                try:
                    status = cluster_status(cluster_dir)
                    used = pool_in_use(status)
                    max_servers = max(max_servers, sum(s["up"] for s in status["servers"]))
                    timeline.append((t, used))
                    anon = {n: s[-1][1]["RssAnon"] for n, s in rss.items() if s[-1][0] == t}
                    log(f"soak {workload}: t={t:6.1f}s pool in use {used / MIB:8.1f} MiB; "
                        "RssAnon "
                        + ", ".join(f"{n} {a / MIB:.0f}" for n, a in sorted(anon.items()))
                        + (f" MiB; etcd db {etcd['db_size'] / MIB:.2f} MiB, revision "
                           f"{etcd['revision']}" if etcd else " MiB; etcd does not answer"))
                    if faults is not None:
                        faults.tick(t, status)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
                    log(f"soak {workload}: t={t:6.1f}s cluster status failed: {e}")
                deadline = time.monotonic() + args.interval
                while bench.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
        finally:
            # Also on an exception: no process stopped or etcd left dead, and no bench left
            # running, when the cluster goes down. Client processes the bench leaves behind (it
            # died, or was evicted) hold its pipes open: they go with it, or communicate()
            # would wait for them.
            if faults is not None:
                faults.finish()
            try:
                os.killpg(bench.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = bench.communicate()
        wall = time.monotonic() - start
        # Its JSON, also when it exits 1 only because client processes failed (clients_failed).
        result = None
        if "error" not in row:
            try:
                result = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                pass
            if bench.returncode != 0 and not (result or {}).get("clients_failed"):
                result = None
        # What became of the faults' victims and of everyone else, while the cluster runs.
        failed_clients = (None if result is None else
                          {int(c["pid"]): c for c in result.get("clients_failed", [])})
        fault_failures = (faults.judge(failed_clients, (result or {}).get("timeline"))
                          if faults is not None else
                          [f"client process {pid} failed: {c}" for pid, c in
                           (failed_clients or {}).items()])
        try:
            timeline.append((round(wall, 1), pool_in_use(cluster_status(cluster_dir))))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError):
            pass
        # The cluster's directory goes with it: its logs (servers, etcd) and the bench's stderr
        # are kept for whoever reads a failure (removed again below if the run passed).
        logs = Path(args.dir or tempfile.gettempdir()) / f"soak-{workload}-{os.getpid()}-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for f in Path(cluster_dir).glob("*.log"):
            shutil.copy(f, logs / f.name)
        (logs / "bench.stderr").write_text(err)
    row["wall_s"] = round(wall, 1)
    row["loadavg_end"] = os.getloadavg()
    row["timeline"] = timeline
    row["etcd_db_timeline"] = etcd_db
    row["etcd_revision_timeline"] = etcd_revisions
    row["rss_timelines"] = {n: [(t, m["pid"], m["VmRSS"], m["RssAnon"], m["RssShmem"])
                                for t, m in s] for n, s in rss.items()}
    if faults is not None:
        row["faults"] = faults.events
    if result is None and "error" not in row:
        row["error"] = f"bench exited {bench.returncode}: {err.strip()[-800:]}"
    elif result is not None:
        row.update({k: result.get(k) for k in ("tps", "commits", "aborts", "abort_rate",
                                                "p50_us", "p99_us", "max_us", "verify",
                                                "session_restarts", "clients_failed")})
    failures = ([row["error"]] if "error" in row else []) + fault_failures
    # The warm-up is a fraction of the planned run, even when the bench died early.
    planned = max(wall, seconds)
    verdict = judge_memory(timeline, planned, args.warmup, args.clients, max_servers)
    row.update({k: v for k, v in verdict.items() if k != "failure"})
    if verdict.get("failure"):
        failures.append(verdict["failure"])
    warm_end = args.warmup * planned
    row["processes"] = {}
    # The bench's own process verifies after its client processes have exited (it reads whole
    # tables: TPC-B's took 43 MiB more): its samples from then on are not the workload's.
    clients_end = max((s[-1][0] for n, s in rss.items() if n.startswith("client ")), default=None)
    for name, series in sorted(rss.items()):
        if name == "bench" and clients_end is not None:
            series = [(t, m) for t, m in series if t <= clients_end]
        v = judge_growth(f"{name} (pid {series[-1][1]['pid']})", "private memory (RssAnon)",
                         [(t, m["RssAnon"]) for t, m in series], warm_end, PROCESS_SLACK)
        row["processes"][name] = {k: v[k] for k in v if k != "failure"}
        if v.get("failure"):
            failures.append(v["failure"])
    v = judge_growth("etcd", "its database (etcd_mvcc_db_total_size_in_bytes)", etcd_db,
                     warm_end, ETCD_DB_SLACK)
    row["etcd_db"] = {k: v[k] for k in v if k != "failure"}
    if v.get("failure"):
        failures.append(v["failure"])
    if faults is not None:
        if not faults.events:
            failures.append(f"--faults {args.faults}: no fault in {wall:.0f} s")
        adds = faults.events + ([faults.added] if faults.added else [])
        failures += [f"cluster add at t={e['t_add']}s: {e['add']}"
                     for e in adds if e.get("add", "").startswith("failed")]
    if row.get("verify") not in (None, "ok"):
        failures.append(f"invariant: {row['verify']}")
    if faults is not None and set(faults.kinds) == {"clock-step"} and row.get("session_restarts"):
        # Only wall clocks moved: no server may have been taken for gone by any client.
        failures.append(f"{row['session_restarts']} sessions given up after Unavailable (a "
                        "server taken for gone) in a run whose only faults were clock steps")
    row["ok"] = not failures
    row["failures"] = failures
    if failures or args.keep_logs:
        row["logs"] = str(logs)
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=600, help="total, split across workloads")
    p.add_argument("--workloads", default="bank,tpcb")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--memory", default="256MiB", help="per server")
    p.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    p.add_argument("--netns", action="store_true",
                   help="every server in its own network namespace (root; with --transport tcp)")
    p.add_argument("--replicas", type=int, default=0, help="backups of every byte")
    p.add_argument("--faults", type=float, default=0,
                   help="every this many seconds after the warm-up, a fault of --fault-kinds "
                        "(needs --replicas 1 or more)")
    p.add_argument("--fault-kinds", default="kill",
                   help="with --faults, the faults to take turns, a comma list of "
                        + ", ".join(FAULT_KINDS) + " (see soak_faults.Faults)")
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--accounts", type=int, default=10000, help="bank")
    p.add_argument("--history-keep", type=int, default=1000,
                   help="tpcb: history rows kept per thread (older ones deleted)")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of each run")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--dir", default=None,
                   help="where the clusters' directories go (default: the temporary directory)")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the logs of a workload that passed too (what became of a fault's "
                        "victims is in the servers' and the bench's logs)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak.jsonl"))
    args = p.parse_args(argv)
    if args.faults and args.replicas < 1:
        p.error("--faults needs --replicas 1 or more: without a backup a killed server's data is lost")
    unknown = set(args.fault_kinds.split(",")) - set(FAULT_KINDS)
    if unknown:
        p.error(f"--fault-kinds: unknown {sorted(unknown)}: choose from {', '.join(FAULT_KINDS)}")
    if args.faults and "clock-step" in args.fault_kinds.split(",") and libfaketime() is None:
        p.error("--fault-kinds clock-step needs libfaketime (Debian: apt-get install faketime; or "
                "set FARPOOL_LIBFAKETIME to libfaketimeMT.so.1)")
    workloads = [w for w in args.workloads.split(",") if w]
    rows = [soak_one(w, args.seconds / len(workloads), args) for w in workloads]
    stamp(rows)
    write_jsonl(Path(args.out), rows, append=True)
    ok = True
    for r in rows:
        if r["ok"]:
            judged = {n: v for n, v in r["processes"].items() if v["judged"]}
            log(f"soak {r['workload']}: ok (pool peak {r['peak_after_warmup'] / MIB:.1f} MiB ≤ "
                f"bound {r['bound'] / MIB:.1f} MiB; RssAnon peak/bound MiB: "
                + ", ".join(f"{n} {v['peak_after_warmup'] / MIB:.0f}/{v['bound'] / MIB:.0f}"
                            for n, v in judged.items())
                + f"; {len(r.get('faults', []))} faults; verify {r.get('verify')})")
            continue
        ok = False
        log(f"SOAK FAILED: {r['workload']}:")
        for f in r["failures"]:
            log(f"  {f}")
        log("  pool memory in use (t s: MiB): " +
            ", ".join(f"{t:.0f}: {m / 2**20:.0f}" for t, m in r["timeline"]))
        log(f"  the servers', etcd's and the bench's logs: {r['logs']}")
    log(f"soak: results appended to {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
