"""Systems the seed experiments compare farpool with, started and stopped by the harness.

  farpool      `farpool bench social|txn` on the local engine (in-process RAM), the pool
               engine on a local cluster (`farpool cluster up`: shm, or tcp with --netns), and
               the sharded engine when the build has it.
  PostgreSQL   15 from Debian, started here as the `postgres` user on a private port with its
               data directory on tmpfs (/dev/shm) and fsync/synchronous_commit/full_page_writes
               off (data in RAM), or with the defaults (`durable=True`, data dir on disk).
               Queries are run by `pgbench` with one custom script per query (prepared
               statements, `-l` per-transaction log for p50/p99): PostgreSQL's own C client, so
               the client costs no more than farpool's in-process driver does.
  SQLite       the `sqlite3` module on a database file on disk (page cache warm), one flow.

Network variants (issue 9): `Netns` makes network namespaces on a bridge the way
`farpool cluster up --netns` does; `ShardCluster` runs the sharded engine's partition servers
over TCP, each in its own namespace; `Postgres(netns=...)` runs PostgreSQL in one, listening on
its veth address only, so clients reach it over TCP from the root namespace.

All of them load the same data: the CSV files of `farpool bench social --export DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from farpool._build import farpool_binary

from farpool.repo import ROOT, stamp, write_jsonl  # noqa: F401 (the harness's helpers)
from farpool.repo import run_context as context  # noqa: F401
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def farpool_bin() -> Path:
    """The farpool binary: $FARPOOL_BIN, else build/farpool ($FARPOOL_BUILD/farpool)."""
    return farpool_binary()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_json(cmd: list[str], timeout: float = 3600, stream_stderr: bool = False,
             env: dict | None = None) -> dict:
    """Runs a command that prints one JSON object last; its stderr (progress) passes through
    when stream_stderr."""
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if stream_stderr else subprocess.PIPE,
                         text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        err = (out.stderr or "").strip()
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {err[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ farpool

class Cluster:
    """A local farpool cluster (`farpool cluster up`) for one benchmark run. `replicas` is
    always passed to `cluster up`, whatever its default: the peers compare one copy (0) unless
    a benchmark is about replication (failover.py asks for 1)."""

    def __init__(self, servers: int = 2, memory: str = "1GiB", transport: str = "shm",
                 netns: bool = False, progress: str | None = None, replicas: int = 0,
                 extra: tuple[str, ...] = (), parent: str | None = None):
        # The cluster's directory: a new one under `parent` (default: the temporary directory),
        # which is made if missing (`soak.py --dir D` failed with FileNotFoundError otherwise).
        if parent is not None:
            os.makedirs(parent, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=f"farpool-{transport}-", dir=parent)
        self.args = ["--servers", str(servers), "--memory", memory, "--transport", transport,
                     "--progress", progress or ("event" if transport == "shm" else "busy"),
                     "--replicas", str(replicas)]
        if netns:
            self.args.append("--netns")
        self.args += list(extra)

    def __enter__(self) -> str:
        out = subprocess.run([str(farpool_bin()), "cluster", "up", "--dir", self.dir, *self.args],
                             capture_output=True, text=True)
        if out.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"cluster up {' '.join(self.args)}: {out.stderr.strip()}")
        return os.path.join(self.dir, "cluster.json")

    def __exit__(self, exc_type, *exc):
        # The directory goes only once `cluster down` stopped what it names: when the command
        # fails (the binary being rebuilt, say), the servers may run on and their pids are in
        # cluster.json; the error says so, and is raised unless another is on its way.
        try:
            out = subprocess.run([str(farpool_bin()), "cluster", "down", "--dir", self.dir],
                                 capture_output=True, text=True)
            failure = (out.stderr.strip() or f"exit {out.returncode}") if out.returncode else ""
        except OSError as e:
            failure = str(e)
        if not failure:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        message = (f"cluster down --dir {self.dir} failed ({failure[-300:]}); its servers may "
                   f"still run: the directory is kept, run it again")
        if exc_type is None:
            raise RuntimeError(message)
        print(message, file=sys.stderr)


class TcpCluster:
    """A local cluster over TCP with every server in its own network namespace (`cluster up
    --netns`, event progress): the network case. `cluster up --netns` is retried `attempts`
    times (it needs root, and another bridge on the host has made it fail); then plain TCP over
    loopback. `how` says which one it got; `failure` why it fell back (empty if it did not)."""

    def __init__(self, servers: int = 2, memory: str = "1GiB", attempts: int = 3, log=print):
        self.servers, self.memory, self.attempts, self.log = servers, memory, attempts, log
        self.cluster: Cluster | None = None
        self.how = ""
        self.failure = ""

    def __enter__(self) -> str:
        for attempt in range(self.attempts):
            cluster = Cluster(self.servers, self.memory, "tcp", netns=True, progress="event")
            try:
                path = cluster.__enter__()
            except RuntimeError as e:
                self.log(f"   cluster up --netns failed (attempt {attempt + 1} of "
                         f"{self.attempts}): {e}")
                self.failure = f"--netns failed ({str(e)[:160]}); plain TCP loopback"
                continue
            self.cluster, self.how, self.failure = cluster, "tcp, netns", ""
            return path
        self.log("   using TCP over loopback")
        self.cluster, self.how = Cluster(self.servers, self.memory, "tcp", progress="event"), \
            "tcp, loopback"
        return self.cluster.__enter__()

    def __exit__(self, *exc):
        if self.cluster is not None:
            self.cluster.__exit__(*exc)


def farpool_social(engine: str, scale: float, cluster: str | None = None, query: str = "all",
                   flows: int = 1, seconds: float = 1.0, verify: bool = True,
                   extra: list[str] | None = None) -> dict:
    cmd = [str(farpool_bin()), "bench", "social", "--engine", engine, "--scale", str(scale),
           "--query", query, "--flows", str(flows), "--seconds", str(seconds), "--json"]
    if cluster:
        cmd += ["--cluster", cluster]
    if verify:
        cmd.append("--verify")
    return run_json(cmd + (extra or []), stream_stderr=True)


def sharded_available() -> str | None:
    """None if `--engine sharded` works in this build, else the reason it does not."""
    try:
        run_json([str(farpool_bin()), "bench", "txn", "--engine", "sharded", "--workload", "bank",
                  "--accounts", "100", "--seconds", "0.1", "--warmup", "0", "--json"], timeout=60)
        return None
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return str(e).split(": ", 2)[-1][:200]


def mount_available() -> str | None:
    """None if this build has `farpool mount` (the FUSE filesystem in the pool), else why not."""
    if not farpool_bin().exists():
        return f"no farpool binary at {farpool_bin()} (build it, or set FARPOOL_BIN)"
    out = subprocess.run([str(farpool_bin()), "mount", "--help"], capture_output=True, text=True)
    if out.returncode != 0:
        return (f"{farpool_bin()} has no `mount` command (the FUSE filesystem of issue 10 is not "
                f"in this build): {(out.stderr or out.stdout).strip()[-160:]}")
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse on this machine"
    return None


class FarpoolMount:
    """A local cluster (`Cluster`: shm, or tcp with every server in its own network namespace)
    and `farpool mount` of a filesystem in it on a fresh directory; yields the mount point.
    On exit: `farpool umount` (then `--lazy` if it is still busy), `cluster down`, the
    directory removed. The mount's daemon runs in this process's cgroup and network namespace:
    a process limited by a memory cgroup reaches the pool through it without being charged for
    the pool's memory."""

    def __init__(self, transport: str = "shm", servers: int = 2, memory: str = "2GiB",
                 name: str = "fs", flags: tuple[str, ...] = ()):
        self.transport = transport
        self.flags = flags  # more `farpool mount` flags, e.g. ("--direct-io",)
        self._cluster_args = (servers, memory, transport, transport == "tcp", "event")
        self.cluster = Cluster(*self._cluster_args)
        self.name = name
        self.mountpoint = tempfile.mkdtemp(prefix=f"farpool-mnt-{transport}-")
        self.log_path = self.mountpoint + ".log"  # the daemon's errors; kept if it wrote any
        self.mounted = False
        self.cluster_json: str | None = None

    def __enter__(self) -> str:
        # Up to 3 attempts of cluster up + mount: on this shared machine a connection sometimes
        # fails while another user's bridge comes or goes ("connection lost" to a server that
        # is up; see the TPC-B over TCP section of docs/experiments.md).
        for attempt in range(3):
            try:
                self.cluster_json = self.cluster.__enter__()
                self._mount()
                os.chmod(self.mountpoint, 0o1777)
                return self.mountpoint
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                self._teardown()
                if attempt == 2:
                    os.rmdir(self.mountpoint)
                    raise RuntimeError(f"{e} (3 attempts)") from e
                log(f"   {self.transport} cluster + mount, attempt {attempt + 1} failed: {str(e)[:200]}")
                self.cluster = Cluster(*self._cluster_args)
                time.sleep(2)
        raise AssertionError("unreachable")

    def remount(self) -> None:
        """`farpool umount`, then `farpool mount` of the same filesystem on the same mount
        point: the files are then what the pool held (no page of the old mount's cache
        survives an unmount)."""
        self._unmount()
        self._mount()

    def _mount(self) -> None:
        out = subprocess.run([str(farpool_bin()), "mount", "--cluster", self.cluster_json,
                              "--name", self.name, "--log", self.log_path, *self.flags,
                              self.mountpoint],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"farpool mount ({self.transport}): "
                               f"{(out.stderr or out.stdout).strip()[-400:]}")
        self.mounted = True

    def _unmount(self) -> None:
        if self.mounted:
            for extra in ([], [], ["--lazy"]):
                out = subprocess.run([str(farpool_bin()), "umount", *extra, self.mountpoint],
                                     capture_output=True, text=True, timeout=120)
                if out.returncode == 0:
                    break
                time.sleep(1)
            self.mounted = False

    def _teardown(self):
        self._unmount()
        self.cluster.__exit__(None, None, None)

    def __exit__(self, *exc):
        self._teardown()
        try:
            os.rmdir(self.mountpoint)
            if os.path.getsize(self.log_path) == 0:
                os.remove(self.log_path)
        except OSError:
            pass


# `farpool mount` flags by --mount-cache: through the page cache, or bypassing it (--direct-io).
MOUNT_CACHE_FLAGS = {"page": (), "direct": ("--direct-io",)}


def add_mount_cache_arg(ap: argparse.ArgumentParser, default: str) -> None:
    """--mount-cache page|direct: how the experiment's farpool mounts cache file data."""
    ap.add_argument("--mount-cache", choices=sorted(MOUNT_CACHE_FLAGS), default=default,
                    help=f"farpool mounts through the page cache or with --direct-io (default "
                         f"{default})")


def mount_farpool_variants(variants: list[str], roots: dict[str, str], notes: dict[str, str],
                           pool_memory: str, given_dir: str | None, what: str,
                           also: str = "", flags: tuple[str, ...] = ()) -> dict[str, FarpoolMount]:
    """For each variant named farpool-<transport> (farpool-shm, farpool-tcp): mounts a farpool
    filesystem on a fresh 2-server cluster and sets roots[v] to the mount point and notes[v] to
    how (`what` names the experiment's directory on it, `also` is added to the note, `flags` go
    to `farpool mount`);
    farpool-shm uses `given_dir` instead when given. A variant that cannot be mounted gets a
    note saying why and no root. Returns the mounts, which the caller exits (unmounts)."""
    farpool = [v for v in variants if v.startswith("farpool-")]
    why = mount_available() if farpool else None
    mounts: dict[str, FarpoolMount] = {}
    try:
        for v in farpool:
            if v == "farpool-shm" and given_dir:
                roots[v] = given_dir
                notes[v] = f"{what} under {given_dir} (given)"
            elif why:
                notes[v] = f"not run: {why}"
            else:
                try:
                    m = FarpoolMount(v.split("-")[1], 2, pool_memory, flags=flags)
                    roots[v] = m.__enter__()
                    mounts[v] = m
                    netns = ", servers in network namespaces" if m.transport == "tcp" else ""
                    notes[v] = (f"2 servers x {pool_memory}, {m.transport}{netns}, mounted "
                                f"{' '.join(flags) + ' ' if flags else ''}on {roots[v]}{also}")
                except RuntimeError as e:
                    notes[v] = f"not run: {e}"
    except BaseException:
        for m in mounts.values():
            m.__exit__(None, None, None)
        raise
    return mounts


# ------------------------------------------------------------------ network namespaces

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


class Netns:
    """`count` network namespaces, each with a veth pair whose host end is on one bridge in the
    root namespace: the topology of `farpool cluster up --netns` (src/pool/local_cluster.cc),
    so every system measured over it crosses the same veth + bridge path.

    Names: fq<tag>br (bridge), fq<tag>s<i> (namespace), fq<tag>h<i> / fq<tag>p<i> (host / peer
    veth); tag is 4 hex digits, names stay within Linux's 15 characters. Addresses:
    10.<net>.0.1/16 on the bridge, 10.<net>.0.<i + 2> in namespace i, with net in 100..149
    (the cluster tool uses 150..249) and not already on an interface here.
    Everything is removed on exit, also after a partial set-up. Processes started inside a
    namespace must be stopped before (deleting a namespace does not stop them).
    Needs root (CAP_NET_ADMIN)."""

    def __init__(self, count: int):
        self.count = count
        self.tag = f"{(os.getpid() * 7919 + int(time.time() * 1000)) & 0xffff:04x}"
        used = _ip("-4", "-o", "addr", check=False).stdout
        free = [n for n in range(100, 150) if f" 10.{n}." not in used]
        if not free:
            raise RuntimeError("no free 10.N.0.0/16 (N in 100..149) for the namespaces")
        self.net = free[int(self.tag, 16) % len(free)]

    def bridge(self) -> str:
        return f"fq{self.tag}br"

    def name(self, i: int) -> str:
        return f"fq{self.tag}s{i}"

    def address(self, i: int) -> str:
        return f"10.{self.net}.0.{i + 2}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.name(i)]

    def __enter__(self) -> "Netns":
        try:
            br = self.bridge()
            _ip("link", "add", br, "type", "bridge")
            _ip("addr", "add", f"10.{self.net}.0.1/16", "dev", br)
            _ip("link", "set", br, "up")
            for i in range(self.count):
                ns, host, peer = self.name(i), f"fq{self.tag}h{i}", f"fq{self.tag}p{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", host, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", ns)
                _ip("link", "set", host, "master", br)
                _ip("link", "set", host, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/16", "dev", peer)
                _ip("-n", ns, "link", "set", peer, "up")
                _ip("-n", ns, "route", "add", "default", "via", f"10.{self.net}.0.1")
        except RuntimeError:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for i in range(self.count):
            _ip("netns", "del", self.name(i), check=False)
            _ip("link", "del", f"fq{self.tag}h{i}", check=False)
        _ip("link", "del", self.bridge(), check=False)

    def describe(self) -> str:
        return f"{self.count} netns on bridge {self.bridge()} (10.{self.net}.0.0/16)"


def stop_processes(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds, to processes this harness started."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def start_in_netns(netns: Netns, count: int, directory: str, kind: str, transport: str,
                   argv) -> list[subprocess.Popen]:
    """Starts `farpool <argv(i)>` in namespace i of `netns` for i < count (each with
    --ready-file, logs in directory/<kind>-i.log), waits until every one is listening and
    writes directory/cluster.json naming them at their namespace's address. Stops them all and
    raises RuntimeError naming the one that failed if any does not start within 30 s."""
    if netns.count < count:
        raise RuntimeError(f"{count} {kind} processes need as many namespaces")
    procs: list[subprocess.Popen] = []
    try:
        for i in range(count):
            with open(os.path.join(directory, f"{kind}-{i}.log"), "w") as log_file:
                procs.append(subprocess.Popen(
                    [*netns.exec_prefix(i), str(farpool_bin()), *argv(i), "--ready-file",
                     os.path.join(directory, f"{kind}-{i}.ready")],
                    # A process group, not a session of its own: a session is a scheduling
                    # group under autogroup, and a server alone in one starved on a loaded
                    # host (docs/pool.md, "Failure detection").
                    stdout=log_file, stderr=subprocess.STDOUT, process_group=0))
        servers = []
        deadline = time.time() + 30
        for i, p in enumerate(procs):
            ready = Path(directory, f"{kind}-{i}.ready")
            while not ready.exists():
                if p.poll() is not None or time.time() > deadline:
                    tail = Path(directory, f"{kind}-{i}.log").read_text()[-400:]
                    raise RuntimeError(f"{kind} {i} in {netns.name(i)} did not start"
                                       f" (exit {p.poll()}): {tail}")
                time.sleep(0.05)
            info = json.loads(ready.read_text())
            servers.append({"id": i, "address": f"{netns.address(i)}:{info['port']}",
                            "pid": info.get("pid", p.pid), "netns": netns.name(i)})
        Path(directory, "cluster.json").write_text(
            json.dumps({"version": 1, "transport": transport, "servers": servers}, indent=2) + "\n")
    except (RuntimeError, OSError, ValueError):
        stop_processes(procs)
        raise
    return procs


class PoolServers:
    """`count` memory servers (`farpool server`, TCP, event progress) in namespaces 0..count-1
    of a Netns; yields their cluster.json. Unlike `Cluster(netns=True)` (the cluster tool's own
    namespaces), clients can then run in the other namespaces of the same Netns, so each client
    process reaches the servers over its own veth, as a process on another host would."""

    def __init__(self, netns: Netns, count: int = 2, memory: str = "1GiB"):
        self.netns, self.count, self.memory = netns, count, memory
        self.dir = tempfile.mkdtemp(prefix="farpool-netns-pool-")
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> str:
        try:
            self.procs = start_in_netns(
                self.netns, self.count, self.dir, "server", "tcp",
                lambda i: ["server", "--listen", f"{self.netns.address(i)}:0", "--id", str(i),
                           "--memory", self.memory, "--progress", "event", "--transport", "tcp"])
        except (RuntimeError, OSError):
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        return os.path.join(self.dir, "cluster.json")

    def __exit__(self, *exc):
        stop_processes(self.procs)
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)


class ShardCluster:
    """The sharded engine's partition servers as `farpool shard` processes for one run; yields
    the cluster.json path `bench txn --engine sharded --cluster` takes.

    netns given: partition i runs in namespace i of that Netns, listening on its address over
    TCP (`farpool shard-cluster up` has no --netns, so this does what it does by hand and
    writes the same cluster.json). Else: `farpool shard-cluster up --transport T`, loopback."""

    def __init__(self, partitions: int = 2, transport: str = "tcp", progress: str = "event",
                 netns: Netns | None = None):
        self.partitions = partitions
        self.transport = transport
        self.progress = progress
        self.netns = netns
        self.dir = tempfile.mkdtemp(prefix="farpool-shards-")
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> str:
        path = os.path.join(self.dir, "cluster.json")
        if self.netns is None:
            out = subprocess.run([str(farpool_bin()), "shard-cluster", "up", "--dir", self.dir,
                                  "--partitions", str(self.partitions), "--transport",
                                  self.transport, "--progress", self.progress],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise RuntimeError(f"shard-cluster up: {out.stderr.strip()}")
            return path
        try:
            self.procs = start_in_netns(
                self.netns, self.partitions, self.dir, "shard", self.transport,
                lambda i: ["shard", "--listen", f"{self.netns.address(i)}:0", "--id", str(i),
                           "--progress", self.progress, "--transport", self.transport])
        except (RuntimeError, OSError):
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        return path

    def __exit__(self, *exc):
        if self.netns is None:
            subprocess.run([str(farpool_bin()), "shard-cluster", "down", "--dir", self.dir],
                           capture_output=True, text=True)
        else:
            stop_processes(self.procs)
            self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)


def engine_of(system: str) -> str:
    """The farpool engine (`--engine`) of an experiment's system name: its first part
    (pool-tcp-rc -> pool, sharded-tcp -> sharded, local -> local)."""
    return system.split("-")[0]


def farpool_point(system: str, cmd: list[str], log=print) -> tuple[dict, str, str]:
    """Runs the farpool benchmark `cmd` (`farpool bench ... --engine ENGINE --json`, without
    --cluster) once on servers made for this run and removed right after, as `system` says:
      pool, pool-*        2 memory servers over shared memory (`cluster up`, 1 GiB each)
      pool-tcp, pool-tcp-*  2 memory servers over TCP, each in its own network namespace, event
                          progress (TcpCluster; plain loopback TCP if namespaces fail)
      sharded-tcp         2 `farpool shard --transport tcp --progress event` partition servers,
                          each in its own namespace (ShardCluster; loopback if namespaces fail)
      local, sharded      none: the engine runs in the benchmark's process (sharded: in-process
                          partition servers)
    The systems of tpcb and tpcw, set up in one place. Only one set of our namespaces exists at
    a time (with another bridge of ours present `cluster up --netns` mostly fails).
    Returns (the benchmark's JSON, how its servers were reached, why it fell back to loopback:
    '' when it did not). Raises RuntimeError if the benchmark or the servers fail."""
    if system == "pool-tcp" or system.startswith("pool-tcp-"):
        cluster = TcpCluster(2, "1GiB", log=log)
        with cluster as path:
            network = ("TCP, 2 memory servers each in its own netns, event"
                       if cluster.how == "tcp, netns" else "TCP over loopback, event")
            return run_json(cmd + ["--cluster", path]), network, cluster.failure
    if system == "sharded-tcp":
        with contextlib.ExitStack() as point:
            try:
                ns = point.enter_context(Netns(2))
                network, note = "TCP, 2 partitions each in its own netns, event", ""
            except RuntimeError as e:
                log(f"   namespaces unavailable ({e}); sharded over TCP loopback")
                network, note = "TCP over loopback, event", \
                    f"netns failed ({str(e)[:120]}); TCP over loopback"
                ns = None
            path = point.enter_context(ShardCluster(2, "tcp", "event", ns))
            return run_json(cmd + ["--cluster", path]), network, note
    if engine_of(system) == "pool":
        with Cluster(2, "1GiB", "shm") as path:
            return run_json(cmd + ["--cluster", path]), "shm", ""
    return run_json(cmd), "in-process", ""


# ------------------------------------------------------------------ the SQL schema

SQL_SCHEMA = """
CREATE TABLE sn_users (uid bigint PRIMARY KEY, name varchar(32) NOT NULL);
CREATE TABLE sn_groups (gid bigint PRIMARY KEY, name varchar(32) NOT NULL);
CREATE TABLE sn_friends (uid bigint NOT NULL, fid bigint NOT NULL, since bigint, PRIMARY KEY (uid, fid));
CREATE TABLE sn_members (uid bigint NOT NULL, gid bigint NOT NULL, joined bigint, PRIMARY KEY (uid, gid));
CREATE TABLE sn_messages (mid bigint PRIMARY KEY, sender bigint NOT NULL, to_user bigint,
                          to_group bigint, time bigint NOT NULL, is_read int NOT NULL,
                          text varchar(200) NOT NULL);
"""
SQL_INDEXES = """
CREATE INDEX sn_by_sender ON sn_messages (sender, mid);
CREATE INDEX sn_inbox ON sn_messages (to_user, mid);
CREATE INDEX sn_group_inbox ON sn_messages (to_group, mid);
"""
TABLES = [("sn_users", "users.csv"), ("sn_groups", "groups.csv"), ("sn_friends", "friends.csv"),
          ("sn_members", "members.csv"), ("sn_messages", "messages.csv")]

# The six queries; :p is a uid (a mid for q5). Same indexes as farpool's index tables.
QUERIES = {
    "q1": "SELECT u.name FROM sn_friends f JOIN sn_users u ON u.uid = f.fid WHERE f.uid = :p",
    "q2": "SELECT count(*) FROM sn_messages WHERE to_user = :p AND is_read = 0",
    "q3": ("SELECT count(*) FROM sn_members s JOIN sn_messages m ON m.to_group = s.gid "
           "WHERE s.uid = :p AND m.is_read = 0"),
    "q4": "SELECT mid, time, text FROM sn_messages WHERE sender = :p ORDER BY mid DESC LIMIT 100",
    "q5": "SELECT text FROM sn_messages WHERE mid = :p",
    "q6": "SELECT g.name FROM sn_members s JOIN sn_groups g ON g.gid = s.gid WHERE s.uid = :p",
}
COUNT_QUERIES = {"q2", "q3"}


def read_meta(export_dir: Path) -> dict:
    with open(export_dir / "meta.csv") as f:
        return {k: int(v) for k, v in next(csv.DictReader(f)).items()}


def read_expect(export_dir: Path, limit: int = 20) -> list[tuple[str, int, int]]:
    with open(export_dir / "expect.csv") as f:
        rows = [(r["query"], int(r["param"]), int(r["rows"])) for r in csv.DictReader(f)]
    return rows[: limit * 6]


def percentiles(lat_us: list[float]) -> dict:
    lat = sorted(lat_us)
    if not lat:
        return {"count": 0, "p50_us": 0.0, "p99_us": 0.0, "mean_us": 0.0}
    pick = lambda q: lat[min(len(lat) - 1, int(q * (len(lat) - 1)))]
    return {"count": len(lat), "p50_us": pick(0.5), "p99_us": pick(0.99),
            "mean_us": statistics.fmean(lat)}


def pgbench_latencies(work: str) -> list[float]:
    """Every transaction's latency (µs) from the files `pgbench -l --log-prefix WORK/log` wrote."""
    lat = []
    for name in os.listdir(work):
        if name.startswith("log"):
            with open(os.path.join(work, name)) as f:
                lat += [float(line.split()[2]) for line in f if line.strip()]
    return lat


def pgbench_tps(stdout: str) -> float | None:
    """The tps pgbench printed, or None."""
    tps = [line for line in stdout.splitlines() if line.startswith("tps")]
    return float(tps[0].split()[2]) if tps else None


# ------------------------------------------------------------------ PostgreSQL

class Postgres:
    """A private PostgreSQL 15 server. in_ram: data dir on /dev/shm, fsync and synchronous
    commit off; else the defaults with the data dir on disk.

    netns given (a Netns and the index of its namespace): the server runs in that namespace,
    listens on that namespace's address only (TCP, trust from any address: the namespace is
    private) and conn_args() point clients at it over TCP; else it listens on a Unix socket
    only."""

    def __init__(self, in_ram: bool = True, shared_buffers: str = "512MB",
                 netns: tuple["Netns", int] | None = None, directory: str | None = None):
        """directory: where the data directory goes (default /dev/shm in RAM, else /var/tmp)."""
        self.in_ram = in_ram
        base = directory or ("/dev/shm" if in_ram else "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="farpool-pg-", dir=base)
        self.data = os.path.join(self.dir, "data")
        # The Unix socket beside the data, unless that is on a filesystem of the caller's
        # choosing (the farpool mount has no socket files: mknod is EPERM there).
        self.sockets = self.dir if directory is None else tempfile.mkdtemp(prefix="farpool-pg-")
        self.port = free_port()
        self.shared_buffers = shared_buffers
        self.netns = netns
        self.host = netns[0].address(netns[1]) if netns else None

    def _as_postgres(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        if self.netns:
            cmd = self.netns[0].exec_prefix(self.netns[1]) + cmd
        return subprocess.run(cmd, capture_output=True, text=True, **kw)

    def __enter__(self) -> "Postgres":
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL not found in {PG_BIN}: run `make setup`")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            shutil.chown(self.sockets, "postgres", "postgres")
        out = self._as_postgres([str(PG_BIN / "initdb"), "-D", self.data, "-A", "trust", "-U",
                                 "postgres", "--no-sync"])
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr.strip()[-400:]}")
        if self.host:
            with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
                f.write("host all all 0.0.0.0/0 trust\n")
        self.start()
        return self

    def start(self) -> None:
        """Starts the server on its data directory (after __enter__'s initdb, or a stop)."""
        listen = self.host or "''"
        opts = [f"-p {self.port}", f"-k {self.sockets}", f"-c listen_addresses={listen}",
                f"-c shared_buffers={self.shared_buffers}", "-c max_connections=200"]
        if self.in_ram:
            opts += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        out = self._as_postgres([str(PG_BIN / "pg_ctl"), "-D", self.data, "-l",
                                 os.path.join(self.dir, "log"), "-w", "-o", " ".join(opts), "start"])
        if out.returncode != 0:
            log = Path(self.dir, "log").read_text() if Path(self.dir, "log").exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {out.stderr.strip()} {log[-400:]}")

    def stop(self, mode: str = "immediate") -> None:
        """pg_ctl stop; `immediate` is a crash as far as the data directory knows (no
        checkpoint: the next start replays the WAL)."""
        self._as_postgres([str(PG_BIN / "pg_ctl"), "-D", self.data, "-m", mode, "stop"])

    def __exit__(self, *exc):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.sockets, ignore_errors=True)

    def conn_args(self) -> list[str]:
        return ["-h", self.host or self.sockets, "-p", str(self.port), "-U", "postgres"]

    def psql(self, sql: str, db: str = "postgres") -> str:
        out = subprocess.run(["psql", *self.conn_args(), "-d", db, "-v", "ON_ERROR_STOP=1", "-At",
                              "-q"], input=sql, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"psql: {out.stderr.strip()[-400:]}")
        return out.stdout

    def load_social(self, export_dir: Path) -> float:
        t0 = time.perf_counter()
        copies = "".join(f"\\copy {t} FROM '{export_dir / f}' WITH (FORMAT csv, HEADER true)\n"
                         for t, f in TABLES)
        self.psql(SQL_SCHEMA + copies + SQL_INDEXES + "VACUUM ANALYZE;\n")
        return time.perf_counter() - t0

    def verify_social(self, export_dir: Path, samples: int = 20) -> None:
        script, expected = [], []
        for q, p, rows in read_expect(export_dir, samples):
            sql = QUERIES[q].replace(":p", str(p))
            script.append(f"{sql};" if q in COUNT_QUERIES else f"SELECT count(*) FROM ({sql}) x;")
            expected.append((q, p, rows))
        got = self.psql("\n".join(script) + "\n").split()
        for (q, p, rows), g in zip(expected, got):
            if int(g) != rows:
                raise RuntimeError(f"PostgreSQL verify: {q}({p}) returned {g}, expected {rows}")

    def pgbench_script(self, script: str, clients: int, seconds: float, db: str = "postgres",
                       extra: list[str] | None = None) -> dict:
        """Runs one pgbench script file; returns count, qps and latency percentiles."""
        work = tempfile.mkdtemp(prefix="farpool-pgbench-")
        try:
            path = os.path.join(work, "script.sql")
            Path(path).write_text(script)
            cmd = ["pgbench", *self.conn_args(), "-n", "-M", "prepared", "-c", str(clients),
                   "-j", str(clients), "-T", str(max(1, round(seconds))), "-f", path, "-l",
                   "--log-prefix", os.path.join(work, "log"), *(extra or []), db]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
            if out.returncode != 0:
                raise RuntimeError(f"pgbench failed: {out.stderr.strip()[-400:]}")
            r = percentiles(pgbench_latencies(work))
            tps = pgbench_tps(out.stdout)
            r["qps"] = tps if tps is not None else r["count"] / max(1, round(seconds))
            return r
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def social_query(self, q: str, meta: dict, flows: int, seconds: float) -> dict:
        n = meta["messages"] if q == "q5" else meta["users"]
        script = f"\\set p random(0, {n - 1})\n{QUERIES[q]};\n"
        return self.pgbench_script(script, flows, seconds)


# ------------------------------------------------------------------ SQLite

def farpool_vfs() -> Path:
    """The farpool SQLite VFS extension (built next to the farpool binary)."""
    return farpool_bin().parent / "src" / "tier" / "farpool_vfs.so"


def load_farpool_vfs() -> None:
    """Registers the `farpool` VFS in this process's SQLite (it stays loaded: the extension
    asks SQLite to keep it after the loading connection closes)."""
    if not farpool_vfs().exists():
        raise RuntimeError(f"{farpool_vfs()} is missing: run `make build`")
    con = sqlite3.connect(":memory:")
    con.enable_load_extension(True)
    con.load_extension(str(farpool_vfs()))
    con.close()


def sqlite_connect(target: str, uri: bool, cache_mib: int = 0) -> sqlite3.Connection:
    """A connection to `target` with a page cache of `cache_mib` MiB (0: SQLite's default)."""
    con = sqlite3.connect(target, uri=uri)
    if cache_mib:
        con.execute(f"PRAGMA cache_size = -{cache_mib * 1024}")
    return con


class SQLiteDb:
    """The social network in an SQLite database: a file on disk (the page cache keeps it warm),
    or, with `cluster`, the file `name` in the pool through the farpool VFS (docs/files.md).
    `cache_mib`: each connection's page cache (`PRAGMA cache_size`), 0 for SQLite's default."""

    def __init__(self, cluster: str | None = None, name: str = "social.db", cache_mib: int = 0):
        self.cache_mib = cache_mib
        self.dir = None  # a directory of its own only for a local file (removed at exit)
        if cluster:
            load_farpool_vfs()
            self.target, self.uri = f"file:{name}?vfs=farpool&cluster={cluster}", True
        else:
            self.dir = tempfile.mkdtemp(prefix="farpool-sqlite-", dir="/var/tmp")
            self.target, self.uri = os.path.join(self.dir, name), False

    def __enter__(self) -> "SQLiteDb":
        return self

    def __exit__(self, *exc):
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def connect(self) -> sqlite3.Connection:
        return sqlite_connect(self.target, self.uri, self.cache_mib)

    def load_social(self, export_dir: Path) -> float:
        t0 = time.perf_counter()
        con = self.connect()
        con.executescript(SQL_SCHEMA)
        for table, name in TABLES:
            with open(export_dir / name, newline="") as f:
                rd = csv.reader(f)
                header = next(rd)
                marks = ",".join("?" * len(header))
                con.executemany(f"INSERT INTO {table} VALUES ({marks})",
                                ([None if v == "" else v for v in row] for row in rd))
        con.executescript(SQL_INDEXES + "ANALYZE;")
        con.commit()
        con.close()
        return time.perf_counter() - t0

    def copy_from(self, other: "SQLiteDb") -> float:
        """Copies another database's pages into this one (SQLite's backup API); seconds."""
        t0 = time.perf_counter()
        src, dst = other.connect(), self.connect()
        src.backup(dst)
        src.close()
        dst.close()
        return time.perf_counter() - t0

    def verify_social(self, export_dir: Path, samples: int = 20) -> None:
        con = self.connect()
        for q, p, rows in read_expect(export_dir, samples):
            res = con.execute(QUERIES[q], {"p": p}).fetchall()
            got = res[0][0] if q in COUNT_QUERIES else len(res)
            if got != rows:
                raise RuntimeError(f"SQLite verify: {q}({p}) returned {got}, expected {rows}")
        con.close()

    def social_query(self, q: str, meta: dict, seconds: float, seed: int = 42) -> dict:
        """Runs query q (random parameters) for `seconds` on one connection; latencies after
        a 0.2 s warm-up."""
        return time_queries(self.connect(), [q], meta, seconds, seed)


def time_queries(con: sqlite3.Connection, queries: list[str], meta: dict, seconds: float,
                 seed: int, round_trips: bool = False) -> dict:
    """Runs the queries in turn (random parameters) on `con` for `seconds`, closes it, and
    returns count, qps and latency percentiles of what ran after a 0.2 s warm-up; with
    `round_trips` (a database on the farpool VFS), also the pool round trips per query
    (`PRAGMA farpool_round_trips`, over every query run) and the VFS watch's round trips per
    second beside them (`PRAGMA farpool_watch_round_trips`; None for a VFS without one)."""
    import random
    rnd = random.Random(seed)

    def trips(pragma: str = "farpool_round_trips") -> int | None:
        row = con.execute(f"PRAGMA {pragma}").fetchone()
        return None if row is None else int(row[0])

    trips_before = trips() if round_trips else 0
    watch_before = trips("farpool_watch_round_trips") if round_trips else None
    started = time.perf_counter()
    lat = []
    clock = time.perf_counter_ns
    end = time.perf_counter() + seconds
    warm = time.perf_counter() + 0.2
    i = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        q = queries[i % len(queries)]
        i += 1
        p = rnd.randrange(meta["messages"] if q == "q5" else meta["users"])
        t0 = clock()
        con.execute(QUERIES[q], {"p": p}).fetchall()
        t1 = clock()
        if now >= warm:
            lat.append((t1 - t0) / 1000)
    trips_after = trips() if round_trips else 0
    watch_after = trips("farpool_watch_round_trips") if round_trips else None
    elapsed = time.perf_counter() - started
    con.close()
    r = percentiles(lat)
    r["qps"] = len(lat) / max(1e-9, seconds - 0.2)
    if round_trips:
        r["round_trips_per_query"] = (trips_after - trips_before) / max(1, i)
        r["watch_round_trips_per_s"] = (None if watch_before is None or watch_after is None
                                        else (watch_after - watch_before) / elapsed)
    return r


def export_social(scale: float, directory: str, seed: int = 42) -> Path:
    subprocess.run([str(farpool_bin()), "bench", "social", "--export", directory, "--scale",
                    str(scale), "--seed", str(seed), "--samples", "20"], check=True,
                   capture_output=True, text=True)
    return Path(directory)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stop_on_sigterm() -> None:
    """Makes SIGTERM raise SystemExit, so that an experiment's `with` blocks unwind: servers
    stopped, network namespaces and mounts removed."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def load_text(load: tuple[float, float, float]) -> str:
    """os.getloadavg() as "1.00/2.00/3.00" (1/5/15 minutes), for result headers."""
    return "/".join(f"{x:.2f}" for x in load)


def measured(ctx: dict, command: str, elapsed: float | None = None,
             loads: tuple | None = None) -> str:
    """The opening sentence of a result file: when, on which machine, which code, the command
    that reproduces it, how long it took and the load average at start and end
    (os.getloadavg() tuples)."""
    load = (f", shared with other work: load average (1/5/15 min) {load_text(loads[0])} at start, "
            f"{load_text(loads[1])} at end" if loads else "")
    took = f" ({elapsed:.0f} s)" if elapsed is not None else ""
    return (f"Measured {ctx['time']} on {ctx['host']} ({ctx['cores']} cores{load}), git "
            f"{ctx['git_sha']}, `{command}`{took}.")


def publish(out: str | Path, name: str, rows: list[dict], md: str, plot=None) -> None:
    """Writes an experiment's results to `out`: NAME.jsonl (rows), NAME.md and, when `plot` is
    given, NAME.png (plot(path) draws it); prints the table and where the files went."""
    out = Path(out)
    write_jsonl(out / f"{name}.jsonl", rows)
    (out / f"{name}.md").write_text(md)
    if plot is not None:
        plot(out / f"{name}.png")
    print(md)
    print(f"results: {out}/{name}.{{jsonl,md{',png' if plot is not None else ''}}}")


def systems_arg(ap: argparse.ArgumentParser, text: str, valid: list[str]) -> list[str]:
    """An experiment's comma-separated --systems, each one of `valid`; else ap.error naming the
    unknown ones and the valid ones (exits 2, as argparse does)."""
    systems = text.split(",")
    unknown = [s for s in systems if s not in valid]
    if unknown:
        ap.error(f"unknown system(s) {', '.join(unknown)}; expected some of {', '.join(valid)}")
    return systems


def binaries_arg(ap: argparse.ArgumentParser, given: list[str]) -> list[tuple[str, str]]:
    """--binary NAME=PATH values (A/B runs of the farpool systems) as (name, absolute path);
    an argument error for one that does not name an executable."""
    binaries = []
    for b in given:
        name, _, path = b.partition("=")
        if not name or not path or not os.access(path, os.X_OK):
            ap.error(f"--binary {b}: expected NAME=PATH of an executable")
        binaries.append((name, os.path.abspath(path)))
    return binaries
