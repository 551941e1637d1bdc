"""Replication (issue 11): what a backup of every byte costs, and a server's SIGKILL under load.

  cost      `farpool bench txn` (--workloads: TPC-B scale 1 under snapshot isolation and read
            committed, and bank; 8 threads, --verify) on a fresh
            3-server cluster with --replicas 0 and with --replicas 1, interleaved, per fabric:
            shm (same host, mapped; replicas 1 there is shared-pages backups, the default of
            `cluster up` over shm: changes stay mapped stores) and tcp (every server in its own
            network namespace, event progress). --forward-copies adds shm replicas 1 with
            forwarded copies (`cluster up --forward-copies`: every change a message), the design
            before shared pages, in the same run
  failover  TPC-B, 8 threads, --replicas 1, --timeline-ms 10: the --victim server (1, or the
            one elected coordinator) SIGKILLed --kill-at seconds into the run; the gap from the
            kill to the next commit, the throughput before and after, whether the invariant
            holds (--verify), commits the kill cut that their sessions settled themselves
            (commits_cut), sessions restarted
  budget    where the CPU of a transaction goes, replicas 0 against 1 (TPC-B and bank, tcp in
            network namespaces): `perf stat --per-thread` on every server and client process for
            --window seconds in the middle of a `bench txn` run, divided by the transactions
            committed in that window (the run's --timeline-ms buckets): CPU µs, context switches
            and system calls per transaction of each server's loop (fp-serve: a primary's
            requests and its backup link), its mirror's loop (fp-mirror: the forwards it backs
            up), the servers' other threads, and the client process

--binaries LABEL=PATH,... runs every part once per binary in each repeat, interleaved in that
order (an A/B of two builds: FARPOOL_BIN per run); the rows and tables name the binary, each
binary's cost and budget figures are kept apart, and the ratio replicas 1 / 0 is also given per
repeat (the pair of cost runs that ran back to back). Every row records the load average.

Output: bench/results/failover.jsonl (every run), failover.md (tables), failover.png (the
commit timelines around the kill).

Usage: bench/experiments/failover [--fabrics shm,tcp] [--seconds 3] [--run 8] [--kill-at 3]
                                  [--workloads tpcb,tpcb-rc,bank]
                                  [--repeat 2] [--parts cost,failover,budget] [--window 2]
                                  [--forward-copies] [--name failover]
                                  [--victim 1|coordinator] [--binaries LABEL=PATH,...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from farpool.harness import peers
from farpool.harness.peers import log

SERVERS = 3
THREADS = 8


def cluster(fabric: str, replicas: int, copies: bool = False) -> peers.Cluster:
    return peers.Cluster(SERVERS, "512MiB", fabric, netns=fabric == "tcp", progress="event",
                         replicas=replicas, extra=("--forward-copies",) if copies else ())


# The workloads, by the name the rows and tables give them: `farpool bench txn`'s workload and
# options. tpcb runs under snapshot isolation (its one branch row aborts most attempts at 8
# threads); tpcb-rc as pgbench runs it, read committed with its rows read for update (no
# aborts: the branch row's lock is held across the client's round trips instead).
WORKLOADS = {"tpcb": ("tpcb", []), "tpcb-rc": ("tpcb", ["--isolation", "rc"]),
             "bank": ("bank", ["--accounts", "10000"])}


def bench_args(path: str, workload: str, seconds: float) -> list[str]:
    name, extra = WORKLOADS[workload]
    return [str(peers.farpool_bin()), "bench", "txn", "--cluster", path, "--engine", "pool",
            "--workload", name, "--threads", str(THREADS), "--seconds", str(seconds),
            "--verify", "--json", *extra]


def cost(fabric: str, workload: str, replicas: int, seconds: float, copies: bool = False) -> dict:
    with cluster(fabric, replicas, copies) as path:
        shared = json.load(open(path)).get("shared_pages", False)
        r = peers.run_json(bench_args(path, workload, seconds), timeout=600)
    r.update(part="cost", workload=workload, fabric=fabric, replicas=replicas, shared_pages=shared,
             setup=fabric + (", forwarded copies" if copies else
                             ", shared pages" if shared else ""))
    return r


# What `budget` counts per thread, and the threads' roles by name (AmServerOptions::thread_name).
BUDGET_EVENTS = ("task-clock", "context-switches", "raw_syscalls:sys_enter",
                 "syscalls:sys_enter_sendmsg", "syscalls:sys_enter_sendto",
                 "syscalls:sys_enter_recvfrom", "syscalls:sys_enter_recvmsg",
                 "syscalls:sys_enter_poll", "syscalls:sys_enter_epoll_wait",
                 "syscalls:sys_enter_futex", "syscalls:sys_enter_write", "syscalls:sys_enter_read")
ROLES = {"fp-serve": "serve", "fp-mirror": "mirror"}


def threads_of(pids: list[int], role) -> dict[int, str]:
    """tid -> role of every thread of `pids`; role(pid, comm) names it."""
    out = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                continue  # exited meanwhile
            out[int(tid)] = role(pid, comm)
    return out


def budget(fabric: str, workload: str, replicas: int, seconds: float, window: float) -> dict:
    with cluster(fabric, replicas) as path:
        servers = [s["pid"] for s in json.load(open(path))["servers"]]
        cmd = bench_args(path, workload, seconds) + ["--timeline-ms", "100"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()  # "bench txn: loaded in ...; running ...": the run starts
        if "running" not in first:
            proc.kill()
            raise RuntimeError(f"bench txn did not start: {first.strip()}")
        time.sleep(1.0)  # past the warm-up (0.5 s)
        clients = [proc.pid] + [int(p) for p in os.listdir("/proc") if p.isdigit() and
                                _ppid(int(p)) == proc.pid]
        roles = threads_of(servers, lambda pid, comm: ROLES.get(comm, "other"))
        roles |= threads_of(clients, lambda pid, comm: "client")
        t0 = time.time() * 1000
        perf = subprocess.run(["perf", "stat", "--per-thread", "-x", ",", "-e",
                               ",".join(BUDGET_EVENTS), "-p",
                               ",".join(str(p) for p in servers + clients), "--", "sleep",
                               str(window)], capture_output=True, text=True)
        t1 = time.time() * 1000
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"bench txn failed: {(first + err).strip()[-400:]}")
        r = json.loads(out.strip().splitlines()[-1])
    t = r.pop("timeline")
    width, start = t["bucket_ms"], t["start_unix_ms"]
    # Commits in [t0, t1]: whole buckets, the two ends by the part of them inside.
    commits = sum(c * max(0.0, min(t1, start + (b + 1) * width) - max(t0, start + b * width))
                  / width for b, c in enumerate(t["commits"]))
    counts = per_thread_counts(perf.stderr, roles)
    per_txn = {role: {e: v / commits for e, v in c.items()} for role, c in counts.items()}
    for c in per_txn.values():
        c["cpu_us"] = c.pop("task-clock") * 1000  # msec -> µs per transaction
    r.update(part="budget", fabric=fabric, replicas=replicas, setup=fabric, window_s=window,
             window_commits=commits, window_tps=commits * 1000 / (t1 - t0), per_txn=per_txn)
    return r


def per_thread_counts(perf_output: str, roles: dict[int, str]) -> dict[str, dict[str, float]]:
    """Sums `perf stat --per-thread -x ,` lines ("COMM-TID,COUNT,UNIT,EVENT,...") by the role of
    each thread (`roles`: tid -> role; others: "other") and event (short names: "poll" for
    syscalls:sys_enter_poll, "syscalls" for raw_syscalls:sys_enter). Lines not counted are
    skipped."""
    counts: dict[str, dict[str, float]] = {}
    for line in perf_output.splitlines():
        f = line.split(",")
        if len(f) < 4 or "-" not in f[0] or not f[1].replace(".", "", 1).isdigit():
            continue
        role = roles.get(int(f[0].rsplit("-", 1)[1]), "other")
        event = f[3].split(":")[-1].replace("sys_enter_", "").replace("sys_enter", "syscalls")
        counts.setdefault(role, {}).setdefault(event, 0.0)
        counts[role][event] += float(f[1])
    return counts


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def coordinator_of(path: str) -> int:
    """The id of the server elected coordinator of the cluster at `path` (cluster.json), as
    `farpool cluster status` reads it from etcd; waits up to 10 s for an election."""
    deadline = time.time() + 10
    while True:
        out = subprocess.run([str(peers.farpool_bin()), "cluster", "status", "--dir",
                              os.path.dirname(path), "--json"], capture_output=True, text=True)
        if out.returncode == 0:
            coordinator = json.loads(out.stdout).get("etcd", {}).get("coordinator", -1)
            if coordinator >= 0:
                return coordinator
        if time.time() > deadline:
            raise RuntimeError(f"no coordinator elected: {out.stderr.strip()[-300:]}")
        time.sleep(0.1)


def failover(fabric: str, run: float, kill_at: float, copies: bool = False,
             victim: str = "1") -> dict:
    with cluster(fabric, 1, copies) as path:
        shared = json.load(open(path)).get("shared_pages", False)
        victim_id = coordinator_of(path) if victim == "coordinator" else int(victim)
        coordinator = victim_id if victim == "coordinator" else coordinator_of(path)
        victim_pid = json.load(open(path))["servers"][victim_id]["pid"]
        cmd = bench_args(path, "tpcb", run) + ["--timeline-ms", "10", "--warmup", "0.5"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()  # "bench txn: loaded in ...; running ...": the run starts
        if "running" not in first:
            proc.kill()
            raise RuntimeError(f"bench txn did not start: {first.strip()}")
        time.sleep(kill_at)
        kill_ms = time.time() * 1000
        os.kill(victim_pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
        err = first + err
        if proc.returncode != 0:
            raise RuntimeError(f"bench txn failed after the kill: {err.strip()[-400:]}")
        r = json.loads(out.strip().splitlines()[-1])
    t = r.pop("timeline")
    width, commits = t["bucket_ms"], t["commits"]
    k = int((kill_ms - t["start_unix_ms"]) // width)  # the bucket the kill fell in
    after = next((b for b in range(k + 1, len(commits)) if commits[b] > 0), None)
    # The longest run of 10 ms buckets without a commit in the 3 s after the kill.
    stall = run = 0
    for c in commits[k + 1:k + 301]:
        run = run + 1 if c == 0 else 0
        stall = max(stall, run)
    before = [c for c in commits[max(0, k - 100):k]]  # the second before the kill
    later = commits[k + 100:k + 200] if after is not None else []  # the second after 1 s
    r.update(part="failover", fabric=fabric, replicas=1, kill_at_s=kill_at, shared_pages=shared,
             setup=fabric + (", forwarded copies" if copies else
                             ", shared pages" if shared else ""),
             kill_offset_ms=kill_ms - t["start_unix_ms"], bucket_ms=width,
             victim=victim_id, victim_was_coordinator=victim_id == coordinator,
             timeline=commits,
             first_commit_after_kill_ms=(None if after is None else
                                         after * width - (kill_ms - t["start_unix_ms"])),
             longest_stall_after_kill_ms=stall * width,
             tps_before=sum(before) * 1000 / (len(before) * width) if before else None,
             tps_after=sum(later) * 1000 / (len(later) * width) if later else None,
             victim_stderr=err.strip()[-300:])
    return r


def table(rows: list[dict]) -> str:
    lines = ["| fabric | workload | tps replicas 0 | tps replicas 1 | ratio | abort rate 0 / 1 "
             "| round trips/txn 0 / 1 | verify |", "|---" * 8 + "|"]
    for setup in sorted({r["setup"] for r in rows if r["part"] == "cost" and r["replicas"] == 1}):
        fabric = setup.split(",")[0]
        for w in WORKLOADS:
            r0 = [r for r in rows if r["part"] == "cost" and r["fabric"] == fabric
                  and r["workload"] == w and r["replicas"] == 0]
            r1 = [r for r in rows if r["part"] == "cost" and r.get("setup") == setup
                  and r["workload"] == w and r["replicas"] == 1]
            if not r0 or not r1:
                continue
            med = lambda rs, k: statistics.median(r[k] for r in rs)
            t0, t1 = med(r0, "tps"), med(r1, "tps")
            lines.append(
                f"| {setup} | {w} | {t0:,.0f} | {t1:,.0f} | {t1 / t0:.2f}x | "
                f"{med(r0, 'abort_rate'):.3f} / {med(r1, 'abort_rate'):.3f} | "
                f"{med(r0, 'round_trips_per_txn'):.2f} / {med(r1, 'round_trips_per_txn'):.2f} | "
                f"{'ok' if all(r['verify'] == 'ok' for r in r0 + r1) else 'FAILED'} |")
    lines += ["", "| binary | fabric | victim | first commit after the kill (ms) "
              "| longest stall in the 3 s after (ms) "
              "| tps the second before | tps 1–2 s after | longest wait of a committed txn (ms) "
              "| commits cut and settled | sessions restarted | verify |", "|---" * 11 + "|"]
    for r in rows:
        if r["part"] != "failover":
            continue
        gap = r["first_commit_after_kill_ms"]
        victim = (f"{r['victim']}{' (coordinator)' if r['victim_was_coordinator'] else ''}"
                  if "victim" in r else "1")
        lines.append(f"| {r.get('binary', '')} | {r.get('setup', r['fabric'])} | {victim} | "
                     f"{'none' if gap is None else f'{gap:.0f}'} | "
                     f"{r['longest_stall_after_kill_ms']} | "
                     f"{r['tps_before'] or 0:,.0f} | {r['tps_after'] or 0:,.0f} | "
                     f"{r['max_us'] / 1000:,.0f} | {r.get('commits_cut', 0)} | "
                     f"{r['session_restarts']} | {r['verify']} |")
    return "\n".join(lines) + "\n"


def failover_summary(rows: list[dict]) -> str:
    """Per binary and setup: the median and range of the first commit after the kill and of
    the longest stall, and the runs whose --verify held."""
    rows = [r for r in rows if r["part"] == "failover"]
    lines = []
    for key in sorted({(r.get("binary", ""), r.get("setup", r["fabric"])) for r in rows}):
        rs = [r for r in rows if (r.get("binary", ""), r.get("setup", r["fabric"])) == key]
        gaps = [r["first_commit_after_kill_ms"] for r in rs
                if r["first_commit_after_kill_ms"] is not None]
        stalls = [r["longest_stall_after_kill_ms"] for r in rs]
        name = " ".join(k for k in key if k)
        lines.append(
            f"{name}: first commit after the kill median "
            f"{statistics.median(gaps) if gaps else float('nan'):.0f} ms, range "
            f"{min(gaps, default=float('nan')):.0f}-{max(gaps, default=float('nan')):.0f} ms; "
            f"longest stall median {statistics.median(stalls):.0f} ms, range "
            f"{min(stalls)}-{max(stalls)} ms; {len(rs)} runs ({len(rs) - len(gaps)} with no "
            f"commit after), verify ok in {sum(r['verify'] == 'ok' for r in rs)}\n")
    return "\n".join(lines) + ("\n" if lines else "")


def ratio_pairs(rows: list[dict]) -> str:
    """Per binary (an A/B of --binaries), fabric and workload: the ratio replicas 1 / replicas 0
    of each repeat's pair of cost runs (the two ran back to back, so the load they met is as
    alike as it gets on a shared host), their median and range."""
    rows = [r for r in rows if r["part"] == "cost" and r["replicas"] in (0, 1)]
    lines = []
    for binary in sorted({r.get("binary", "") for r in rows}):
        for fabric in sorted({r["fabric"] for r in rows}):
            for w in WORKLOADS:
                ratios = []
                for rep in sorted({r["rep"] for r in rows}):
                    pair = {r["replicas"]: r["tps"] for r in rows
                            if r.get("binary", "") == binary and r["fabric"] == fabric
                            and r["workload"] == w and r["rep"] == rep}
                    if 0 in pair and 1 in pair and pair[0] > 0:
                        ratios.append(pair[1] / pair[0])
                if ratios:
                    lines.append(f"| {binary} | {fabric} | {w} | "
                                 f"{statistics.median(ratios):.2f}x | "
                                 + ", ".join(f"{x:.2f}" for x in sorted(ratios)) + " |")
    if not lines:
        return ""
    return ("| binary | fabric | workload | ratio 1 / 0, median of the pairs | per pair |\n"
            + "|---" * 5 + "|\n" + "\n".join(lines) + "\n")


def budget_table(rows: list[dict]) -> str:
    """Per transaction, medians over the runs: each role's CPU, context switches, system calls,
    sends (sendmsg + sendto), receives (recvmsg + recvfrom) and sleeps (poll + epoll_wait)."""
    rows = [r for r in rows if r["part"] == "budget"]
    if not rows:
        return ""
    lines = ["| workload | thread | CPU µs 0 / 1 | context switches 0 / 1 | system calls 0 / 1 "
             "| sends 0 / 1 | receives 0 / 1 | polls 0 / 1 | futex 0 / 1 |", "|---" * 9 + "|"]
    metrics = {"cpu": lambda c: c.get("cpu_us", 0),
               "cs": lambda c: c.get("context-switches", 0),
               "sys": lambda c: c.get("syscalls", 0),
               "send": lambda c: c.get("sendmsg", 0) + c.get("sendto", 0),
               "recv": lambda c: c.get("recvmsg", 0) + c.get("recvfrom", 0),
               "poll": lambda c: c.get("poll", 0) + c.get("epoll_wait", 0),
               "futex": lambda c: c.get("futex", 0)}
    for b, w in ((b, w) for b in sorted({r.get("binary", "") for r in rows})
                 for w in ("tpcb", "bank")):
        by = {n: [r for r in rows if r["workload"] == w and r["replicas"] == n
                  and r.get("binary", "") == b] for n in (0, 1)}
        if not by[0] or not by[1]:
            continue
        w = f"{b}: {w}" if b else w
        for role in ("serve", "mirror", "other", "client", "all"):
            def med(n, m):
                vals = []
                for r in by[n]:
                    pt = r["per_txn"]
                    cs = pt.values() if role == "all" else [pt.get(role, {})]
                    vals.append(sum(metrics[m](c) for c in cs))
                return statistics.median(vals)
            cells = [f"{med(0, m):,.1f} / {med(1, m):,.1f}" for m in metrics]
            lines.append(f"| {w} | {role} | " + " | ".join(cells) + " |")
        tps = [f"{statistics.median(r['window_tps'] for r in by[n]):,.0f}" for n in (0, 1)]
        lines.append(f"| {w} | (tps in the window) | {tps[0]} / {tps[1]} |" + " |" * 6)
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in rows:
        if r["part"] != "failover":
            continue
        w = r["bucket_ms"]
        x = [(b * w - r["kill_offset_ms"]) / 1000 for b in range(len(r["timeline"]))]
        y = [c * 1000 / w for c in r["timeline"]]
        ax.plot(x, y, lw=0.8, label=f"{r.get('binary', '')} {r.get('setup', r['fabric'])} "
                f"(first commit +"
                f"{r['first_commit_after_kill_ms'] or float('nan'):.0f} ms)")
    ax.axvline(0, color="red", ls="--", lw=1)
    victims = {"the coordinator" if r.get("victim_was_coordinator") else f"server {r.get('victim', 1)}"
               for r in rows if r["part"] == "failover"}
    ax.text(0.02, 0.95, "SIGKILL of " + " / ".join(sorted(victims)),
            transform=ax.get_xaxis_transform(), color="red")
    ax.set_xlabel("seconds from the kill")
    ax.set_ylabel("TPC-B commits/s (10 ms buckets)")
    ax.set_title(f"TPC-B, {THREADS} threads, {SERVERS} servers, replicas 1: a server dies")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fabrics", default="shm,tcp")
    ap.add_argument("--seconds", type=float, default=3.0, help="each cost run")
    ap.add_argument("--run", type=float, default=8.0, help="each failover run")
    ap.add_argument("--kill-at", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--parts", default="cost,failover")
    ap.add_argument("--workloads", default="tpcb,tpcb-rc,bank",
                    help="the cost part's, of " + ", ".join(WORKLOADS))
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    ap.add_argument("--window", type=float, default=2.0, help="each budget's measured window")
    ap.add_argument("--name", default="failover", help="the results' file names")
    ap.add_argument("--replicas", default="0,1",
                    help="the cost part's --replicas settings, interleaved in this order")
    ap.add_argument("--forward-copies", action="store_true",
                    help="also shm replicas 1 with forwarded copies (the A/B for shared pages)")
    ap.add_argument("--victim", default="1",
                    help="the failover's victim: a server id, or 'coordinator' (the server "
                         "elected coordinator when the run starts)")
    ap.add_argument("--binaries", default="",
                    help="LABEL=PATH,...: every part once per binary in each repeat, "
                         "interleaved (FARPOOL_BIN per run); empty: this build's")
    args = ap.parse_args(argv)
    binaries = [tuple(b.split("=", 1)) for b in args.binaries.split(",") if b] or [("", None)]
    peers.stop_on_sigterm()
    fabrics = args.fabrics.split(",")
    parts = args.parts.split(",")
    load_start = os.getloadavg()
    rows = []
    for rep, (label, binary) in ((r, b) for r in range(args.repeat) for b in binaries):
        if binary is not None:
            os.environ["FARPOOL_BIN"] = binary
        tag = {"rep": rep} | ({"binary": label} if label else {})
        for fabric in fabrics:
            if "cost" in parts:
                for workload in args.workloads.split(","):
                    setups = [(int(n), False) for n in args.replicas.split(",")]
                    if fabric == "shm" and args.forward_copies:
                        setups.append((1, True))
                    for replicas, copies in setups:
                        log(f"rep {rep}: cost {fabric} {workload} replicas {replicas}"
                            f"{' (forwarded copies)' if copies else ''}")
                        rows.append(cost(fabric, workload, replicas, args.seconds, copies)
                                    | tag | {"load": os.getloadavg()})
            if "budget" in parts:
                for workload in ("tpcb", "bank"):
                    for replicas in (0, 1):
                        log(f"rep {rep}: budget {fabric} {workload} replicas {replicas}")
                        rows.append(budget(fabric, workload, replicas, args.seconds, args.window)
                                    | tag | {"load": os.getloadavg()})
            if "failover" in parts:
                for copies in ([False, True] if fabric == "shm" and args.forward_copies
                               else [False]):
                    log(f"rep {rep}: {label + ': ' if label else ''}failover {fabric}"
                        f"{' (forwarded copies)' if copies else ''}, victim {args.victim}")
                    rows.append(failover(fabric, args.run, args.kill_at, copies, args.victim)
                                | tag | {"load": os.getloadavg()})
    load_end = os.getloadavg()
    cmd = (f"bench/experiments/failover --fabrics {args.fabrics} --seconds {args.seconds:g} "
           f"--run {args.run:g} --kill-at {args.kill_at:g} --repeat {args.repeat} --parts "
           f"{args.parts}" + (f" --window {args.window:g}" if "budget" in parts else "") +
           (" --forward-copies" if args.forward_copies else "") +
           (f" --victim {args.victim}" if args.victim != "1" else "") +
           (f" --binaries {args.binaries}" if args.binaries else "") +
           (f" --name {args.name}" if args.name != "failover" else ""))
    md = (peers.measured(rows[0], cmd, loads=(load_start, load_end)) + f" {SERVERS} memory "
          f"servers, {THREADS} client threads; cost: medians of {args.repeat} interleaved runs."
          "\n\n" + "".join((f"Binary {b}:\n\n" if b else "")
                           + table([r for r in rows if r.get("binary", "") == b]) + "\n"
                           for b in sorted({r.get("binary", "") for r in rows}))
          + ratio_pairs(rows) + "\n" + failover_summary(rows) + budget_table(rows))
    peers.publish(args.out, args.name, rows, md,
                  (lambda path: plot(rows, path)) if "failover" in parts else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
