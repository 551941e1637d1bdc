"""Seed 001, IOPS: fio 4 KiB random reads and writes on the farpool mount vs tmpfs vs the
local disk, 1 and 16 jobs (issue 10, experiment 1; the seed's table redrawn).

  farpool-shm   `farpool mount` on a fresh `cluster up --servers 2 --transport shm --progress
                event` (2 x --memory); fio with O_DIRECT, so every 4 KiB goes through FUSE to
                the daemon and to pool memory (no page cache hit)
  farpool-shm-cached  the same mount without O_DIRECT: reads and writes hit the kernel's page
                cache (writeback cache, pages kept across opens), which is what an application
                that does not ask for O_DIRECT sees; it measures FUSE's cache, not the pool.
                With --invalidate=0 (as tmpfs): fio's default invalidate=1 drops the file's
                pages (POSIX_FADV_DONTNEED) every time it reopens the file, which a time-based
                job does after each pass over it, and a pass reads each block once (fio's
                random map), so no read would ever hit the cache
  farpool-tcp   the same on `cluster up --transport tcp --netns --progress event`: every server
                in its own network namespace behind a veth pair on a bridge, the daemon in the
                root namespace, so each 4 KiB crosses TCP; loopback TCP if namespaces fail
                (said in the notes)
  tmpfs         a directory in /dev/shm; tmpfs has no O_DIRECT, so page-cache I/O (the
                all-in-memory ceiling)
  disk          a directory in /var/tmp (the local disk), O_DIRECT (the device, not the cache)

Every point: `fio --name=iops --rw=randread|randwrite --bs=4k --ioengine=psync --numjobs=N
--size=SIZE --runtime=S --time_based --group_reporting --output-format=json` (plus --direct=1,
or --invalidate=0 for the page-cache systems) in the system's
directory after fio has laid the files out (one file per job). The machine may be shared, so
the points run round-robin (every system once per (workload, jobs), --repeat times); the table
shows the median IOPS and the .md the load average at start and end.

Output: bench/results/NAME.jsonl (every run), NAME.md (median IOPS, farpool/tmpfs and
farpool/disk), NAME.png; NAME is --out-name, by default fio_iops.

Usage: bench/experiments/fio_iops [--jobs 1,16] [--size 32m] [--seconds 5] [--repeat 3]
                                  [--systems farpool-shm,farpool-shm-cached,farpool-tcp,tmpfs,disk]
                                  [--out-name NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from farpool.harness import peers
from farpool.harness.peers import log

SYSTEMS = ["farpool-shm", "farpool-shm-cached", "farpool-tcp", "tmpfs", "disk"]
BUFFERED = {"farpool-shm-cached", "tmpfs"}  # no O_DIRECT
LABELS = {"farpool-shm": "farpool mount (shm)",
          "farpool-shm-cached": "farpool mount (shm, page cache)",
          "farpool-tcp": "farpool mount (tcp, netns)",
          "tmpfs": "tmpfs", "disk": "local disk (O_DIRECT)"}
WORKLOADS = ["randread", "randwrite"]
RATIOS = [("farpool-shm", "tmpfs"), ("farpool-shm", "disk"), ("farpool-shm-cached", "tmpfs"),
          ("farpool-tcp", "disk")]


@contextlib.contextmanager
def farpool_mount(transport: str, memory: str, notes: dict):
    """A fresh cluster and a mount of it; yields the mount point."""
    system = f"farpool-{transport}"
    try:
        cluster = peers.Cluster(2, memory, transport, netns=transport == "tcp", progress="event")
        cluster_file = cluster.__enter__()
    except RuntimeError as e:
        if transport != "tcp":
            raise
        notes[system] = f"namespaces failed ({str(e)[:120]}); plain loopback TCP"
        cluster = peers.Cluster(2, memory, transport, progress="event")
        cluster_file = cluster.__enter__()
    point = tempfile.mkdtemp(prefix="farpool-mnt-")
    try:
        out = subprocess.run([str(peers.farpool_bin()), "mount", "--cluster", cluster_file,
                              "--log", point + ".log", point], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"mount: {out.stderr.strip()}")
        yield point
    finally:
        subprocess.run([str(peers.farpool_bin()), "umount", point], capture_output=True)
        subprocess.run(["umount", "-l", point], capture_output=True)  # if the above failed
        shutil.rmtree(point, ignore_errors=True)
        cluster.__exit__(None, None, None)


@contextlib.contextmanager
def local_dir(base: str):
    d = tempfile.mkdtemp(prefix="farpool-fio-", dir=base)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fio(directory: str, rw: str, jobs: int, size: str, seconds: float, direct: bool) -> dict:
    cmd = ["fio", "--name=iops", f"--directory={directory}", f"--rw={rw}", "--bs=4k",
           "--ioengine=psync", f"--numjobs={jobs}", f"--size={size}", f"--runtime={seconds:g}",
           "--time_based", "--group_reporting", "--randrepeat=1", "--output-format=json",
           "--direct=1" if direct else "--invalidate=0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {(out.stderr or out.stdout).strip()[-300:]}")
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = job["read"] if rw == "randread" else job["write"]
    lat = side.get("clat_ns", {}).get("percentile", {})
    return {"iops": side["iops"], "bw_kib_s": side["bw"],
            "p50_us": lat.get("50.000000", 0) / 1000, "p99_us": lat.get("99.000000", 0) / 1000}


def measure(systems, jobs_list, size, seconds, repeat, memory):
    rows, notes = [], {}
    with contextlib.ExitStack() as stack:
        dirs = {}
        for s in systems:
            try:
                if s in ("farpool-shm", "farpool-shm-cached"):
                    dirs[s] = stack.enter_context(farpool_mount("shm", memory, notes))
                elif s == "farpool-tcp":
                    dirs[s] = stack.enter_context(farpool_mount("tcp", memory, notes))
                elif s == "tmpfs":
                    dirs[s] = stack.enter_context(local_dir("/dev/shm"))
                else:
                    dirs[s] = stack.enter_context(local_dir("/var/tmp"))
            except RuntimeError as e:
                notes[s] = f"not measured: {e}"
        for rep in range(repeat):
            for rw in WORKLOADS:
                for jobs in jobs_list:
                    for s, d in dirs.items():
                        log(f"rep {rep} {rw} jobs {jobs} {s}")
                        try:
                            r = fio(d, rw, jobs, size, seconds, direct=s not in BUFFERED)
                        except (RuntimeError, subprocess.TimeoutExpired) as e:
                            notes[s] = f"{rw} x{jobs} failed: {str(e)[:200]}"
                            continue
                        rows.append({"system": s, "rw": rw, "jobs": jobs, "rep": rep,
                                     "size_per_job": size, "seconds": seconds, **r})
    peers.stamp(rows)
    return rows, notes


def medians(rows):
    out = {}
    for key in sorted({(r["system"], r["rw"], r["jobs"]) for r in rows}):
        runs = [r for r in rows if (r["system"], r["rw"], r["jobs"]) == key]
        out[key] = {"iops": statistics.median(r["iops"] for r in runs),
                    "min": min(r["iops"] for r in runs), "max": max(r["iops"] for r in runs),
                    "p50_us": statistics.median(r["p50_us"] for r in runs),
                    "p99_us": statistics.median(r["p99_us"] for r in runs), "runs": len(runs)}
    return out


def table(med, notes, jobs_list) -> str:
    systems = [s for s in SYSTEMS if any(k[0] == s for k in med)]
    ratios = [(a, b) for a, b in RATIOS if a in systems and b in systems]
    lines = ["| workload | jobs | " + " | ".join(LABELS[s] for s in systems) +
             "".join(f" | {a} / {b}" for a, b in ratios) + " |",
             "|---" * (len(systems) + len(ratios) + 2) + "|"]
    for rw in WORKLOADS:
        for j in jobs_list:
            get = lambda s: med.get((s, rw, j))
            cells = [f"{get(s)['iops']:,.0f} ({get(s)['min']:,.0f}–{get(s)['max']:,.0f})"
                     if get(s) else "–" for s in systems]
            rr = [f"{get(a)['iops'] / get(b)['iops']:.2f}x" if get(a) and get(b) else "–"
                  for a, b in ratios]
            lines.append(f"| 4 KiB {rw} | {j} | " + " | ".join(cells + rr) + " |")
    lines += ["", "| system | workload | jobs | p50 µs | p99 µs |", "|---" * 5 + "|"]
    for (s, rw, j), m in med.items():
        lines.append(f"| {s} | {rw} | {j} | {m['p50_us']:.1f} | {m['p99_us']:.1f} |")
    for s, n in notes.items():
        lines.append(f"\n- {LABELS.get(s, s)}: {n}")
    return "\n".join(lines) + "\n"


def plot(med, jobs_list, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(10, 4.5), sharey=True)
    systems = [s for s in SYSTEMS if any(k[0] == s for k in med)]
    width = 0.8 / max(1, len(systems))
    for ax, rw in zip(axes, WORKLOADS):
        for i, s in enumerate(systems):
            xs = [x + i * width for x in range(len(jobs_list))]
            ys = [med[(s, rw, j)]["iops"] if (s, rw, j) in med else 0 for j in jobs_list]
            ax.bar(xs, ys, width, label=LABELS[s])
        ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(jobs_list))])
        ax.set_xticklabels([f"{j} job{'s' if j > 1 else ''}" for j in jobs_list])
        ax.set_yscale("log")
        ax.set_title(f"4 KiB {rw}")
    axes[0].set_ylabel("IOPS (median; log)")
    axes[0].legend(fontsize=8)
    fig.suptitle("fio on the farpool mount vs tmpfs vs local disk (seed 001's table)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="1,16")
    ap.add_argument("--size", default="32m", help="file size per job")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory", default="1GiB", help="per server (2 servers)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--out", default=str(peers.ROOT / "bench" / "results"))
    ap.add_argument("--out-name", default="fio_iops")
    args = ap.parse_args(argv)
    if shutil.which("fio") is None:
        log("fio is not installed (make setup installs it)")
        return 1
    jobs_list = [int(j) for j in args.jobs.split(",")]
    systems = peers.systems_arg(ap, args.systems, SYSTEMS)
    peers.stop_on_sigterm()
    load_start = os.getloadavg()
    rows, notes = measure(systems, jobs_list, args.size, args.seconds, args.repeat, args.memory)
    load_end = os.getloadavg()
    if not rows:
        for s, n in notes.items():
            log(f"{s}: {n}")
        return 1
    med = medians(rows)
    cmd = (f"bench/experiments/fio_iops --systems {args.systems} --jobs {args.jobs} --size "
           f"{args.size} --seconds {args.seconds:g} --repeat {args.repeat} --out-name {args.out_name}")
    md = (peers.measured(rows[0], cmd, loads=(load_start, load_end)) + f" IOPS: the median of "
          f"{args.repeat} runs per point (range in parentheses), run round-robin.\n\n"
          + table(med, notes, jobs_list))
    peers.publish(args.out, args.out_name, rows, md, lambda path: plot(med, jobs_list, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
