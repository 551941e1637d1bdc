"""What the soak harness reads of a running cluster and its processes: `farpool cluster status
--json` and /proc (a process's memory, its state, its mapped files, a process group's members).
Shared by the sampling of farpool.harness.soak and the fault injection of
farpool.harness.soak_faults, which must not import soak (soak imports it). Each call reads once,
now. The /proc readers return None for a process that is gone; `cluster_status` raises
RuntimeError, with the command's stderr, when it prints no JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from farpool.harness.peers import farpool_bin


def cluster_status(cluster_dir: str) -> dict:
    """`farpool cluster status --json`: it exits 1 when a server is down (a killed one), and
    still prints every server's state."""
    out = subprocess.run([str(farpool_bin()), "cluster", "status", "--dir", cluster_dir,
                          "--json"], capture_output=True, text=True, timeout=60)
    try:
        return json.loads(out.stdout)
    except ValueError:
        raise RuntimeError(f"cluster status ({out.returncode}): {out.stderr.strip()[-300:]}")


def proc_memory(pid: int) -> dict | None:
    """VmRSS, RssAnon, RssFile and RssShmem of `pid` in bytes; None if it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        return None
    return out if "RssAnon" in out else None  # a zombie has no memory lines


def proc_state(pid: int) -> str | None:
    """The state letter of `pid` from /proc/PID/stat (R, S, D, T stopped, Z zombie, ...); None
    if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def maps_file(pid: int, path: str) -> bool | None:
    """Whether `pid` has the file `path` mapped (a preloaded library: /proc/PID/maps); None if
    it is gone or a zombie."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    if not maps:
        return None
    real = os.path.realpath(path)
    return any(line.endswith((" " + path, " " + real)) for line in maps.splitlines())


def process_group(pgid: int) -> list[int]:
    """The processes of process group `pgid` (the bench and its client processes), zombies
    included (a client that failed stays one until the bench reaps it at the end)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
            pids.append(int(entry))
    return pids
