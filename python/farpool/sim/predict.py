"""Experiment 4: farpool's transactions on clusters of 8 to 4096 nodes over a modern fabric.

What it models
--------------
N nodes, each a memory server and a compute node running ``threads`` client threads, on a
two-level non-blocking fat tree. Two designs run the same transactions (``txn.py``):

* ``pool`` -- RSI over one-sided operations (reads, writes, CAS, fetch-and-add executed by the
  target's NIC; the target's CPU is not involved);
* ``sharded`` -- shared-nothing partitions with message-based two-phase commit under snapshot
  isolation and a timestamp oracle; every message costs CPU where it is received.

Cost of one operation or message (a path of FCFS stations and delays):
sender's link out (serialisation of header + payload) -> NIC and wire latency -> receiver's
link in -> the receiver's NIC operation unit (pool) or CPU pool (sharded) -> effect -> link out
-> wire and NIC -> sender's link in. Same-address atomics (the global timestamp counter of the
``counter`` variant) are serialised by one atomic unit on the owning NIC.

Parameters (``ClusterParams``; all documented in docs/simulator.md): 200 Gb/s links (100-400
selectable), 200 ns per switch, 5 ns per cable, 350 ns NIC/PCIe overhead per message and
direction -- a 64-byte one-sided read across the spines takes about 1.95 us unloaded, the
"~2 us" of current RDMA fabrics --, 64 bytes of headers per packet, 100 M one-sided ops/s
per NIC (25 M/s for atomics), 5 M/s for atomics on one address, 1 us CPU per 2PC message
with 2 cores per node serving messages, 100 ns for a local memory access.

The coarse model, and why
-------------------------
The fabric core is not simulated packet by packet: a non-blocking fat tree has no internal
contention under uniform traffic (the d-mod-k routes spread it evenly), so only the hosts'
link directions, NIC units and CPUs are queues, and switches add a fixed latency (one switch
within a leaf, three across the spines). Messages are not cut into MTU-sized packets. This
keeps a 4096-node run (32768 client threads) to minutes; ``fabric.py`` is the packet-level
model for the small configurations.

Timestamps: the pool reads a timestamp vector (8 bytes per client thread, on node 0) or,
as a variant, a global counter (a read and a same-address fetch-and-add on node 0); the
sharded design asks an oracle on node 0 (two RPCs). ``free`` replaces either by a source that
costs nothing, to show what saturates next.

Saturation analysis: each run reports, per resource class, the busiest instance's
utilisation in the measurement window and the analytic throughput bound (capacity divided by
the demand one committed transaction puts on that instance), plus the abort rate (lock
contention). ``saturates_on`` is the class with the lowest bound (the first to saturate as
load grows); ``limited_by`` says what holds this run: a class above 85 % busy, lock
contention (30 % or more of the attempts abort), or latency.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import simpy

from .nodes import FifoServer, spawn_streams
from .txn import (BUCKET_BYTES, DELAY, FIFO, APPLY, MSG_BYTES, RECORD_BYTES, TS_SLOT_BYTES,
                  Context, Path, RecordTable, TxnStats, Workload, start_clients)


@dataclass(frozen=True)
class ClusterParams:
    nodes: int
    threads: int = 8
    link_gbit: float = 200.0
    switch_ns: float = 200.0
    prop_ns: float = 5.0
    nic_ns: float = 350.0
    header_bytes: int = 64
    nic_mops: float = 100.0
    nic_atomic_mops: float = 25.0
    hot_atomic_mops: float = 5.0
    rpc_cpu_ns: float = 1000.0
    cpu_cores: int = 2
    local_ns: float = 100.0
    hosts_per_leaf: int = 64

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.threads < 1:
            raise ValueError(f"need nodes >= 1 and threads >= 1, got {self.nodes}, "
                             f"{self.threads}")
        if not 1 <= self.link_gbit <= 3200:
            raise ValueError(f"link bandwidth {self.link_gbit} Gb/s is out of range")
        for name in ("nic_mops", "nic_atomic_mops", "hot_atomic_mops", "rpc_cpu_ns"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def bytes_per_ns(self) -> float:
        return self.link_gbit / 8.0

    def switches(self, src: int, dst: int) -> int:
        return 1 if src // self.hosts_per_leaf == dst // self.hosts_per_leaf else 3

    def wire_ns(self, src: int, dst: int) -> float:
        k = self.switches(src, dst)
        return self.nic_ns + k * self.switch_ns + (k + 1) * self.prop_ns

    def unloaded_read_ns(self, nbytes: int = 64) -> float:
        """Round trip of one one-sided read across the spines with no other traffic."""
        ser = lambda b: (b + self.header_bytes) / self.bytes_per_ns  # noqa: E731
        return (2 * ser(0) + 2 * ser(nbytes) + 2 * self.wire_ns(0, self.hosts_per_leaf)
                + 1e3 / self.nic_mops)


class ClusterCost:
    """Paths of one-sided operations and RPCs on the cluster (see module docstring)."""

    def __init__(self, env: simpy.Environment, p: ClusterParams) -> None:
        self.p = p
        n = p.nodes
        self.tx = [FifoServer(env, 1, f"link-out {i}") for i in range(n)]
        self.rx = [FifoServer(env, 1, f"link-in {i}") for i in range(n)]
        self.nic = [FifoServer(env, 1, f"nic {i}") for i in range(n)]
        self.cpu = [FifoServer(env, p.cpu_cores, f"cpu {i}") for i in range(n)]
        self.hot = FifoServer(env, 1, "hot atomic unit")
        self._op_ns = 1e3 / p.nic_mops
        self._atomic_ns = 1e3 / p.nic_atomic_mops
        self._hot_ns = 1e3 / p.hot_atomic_mops

    def _ser(self, payload: int) -> float:
        return (payload + self.p.header_bytes) / self.p.bytes_per_ns

    def _path(self, src: int, dst: int, req: int, resp: int, unit: FifoServer,
              unit_ns: float, apply) -> Path:
        tail = [(APPLY, apply)] if apply else []
        if src == dst:
            return [(DELAY, self.p.local_ns), (FIFO, unit, unit_ns)] + tail
        w = self.p.wire_ns(src, dst)
        return ([(FIFO, self.tx[src], self._ser(req)), (DELAY, w),
                 (FIFO, self.rx[dst], self._ser(req)), (FIFO, unit, unit_ns)] + tail +
                [(FIFO, self.tx[dst], self._ser(resp)), (DELAY, w),
                 (FIFO, self.rx[src], self._ser(resp))])

    def one_sided(self, op, src, dst, req_bytes, resp_bytes, apply=None, hot=False) -> Path:
        if hot:
            return self._path(src, dst, req_bytes, resp_bytes, self.hot, self._hot_ns, apply)
        ns = self._atomic_ns if op in ("cas", "faa") else self._op_ns
        return self._path(src, dst, req_bytes, resp_bytes, self.nic[dst], ns, apply)

    def rpc(self, src, dst, req_bytes, resp_bytes, apply=None) -> Path:
        return self._path(src, dst, req_bytes, resp_bytes, self.cpu[dst], self.p.rpc_cpu_ns,
                          apply)


def analytic_bounds(p: ClusterParams, design: str, wl: Workload, timestamp: str) -> dict:
    """Transactions/s at which each resource class saturates (no aborts, uniform placement).

    Demand one committed transaction puts on the busiest instance of each class; bound =
    capacity / demand. Record traffic is spread over all nodes; the timestamp source (the
    vector or counter of RSI, the oracle of 2PC) sits on node 0.
    """
    n = p.nodes
    bw = p.bytes_per_ns
    h = p.header_bytes
    n_rec = 2 if wl.name == "bank" else 3
    rec = RECORD_BYTES["account"]
    remote = (n - 1) / n
    op_ns = 1e3 / p.nic_mops
    out: dict[str, float] = {}
    if design == "pool":
        # per record: bucket read, record read, CAS, new version, unlock (payload out, back)
        per_rec = [(0, BUCKET_BYTES), (0, rec), (16, 8), (rec, 0), (8, 0)]
        net = n_rec * sum(a + b + 2 * h for a, b in per_rec) * remote
        out["links"] = n * bw / net * 1e9
        nic = n_rec * (4 * op_ns + 1e3 / p.nic_atomic_mops)
        ts_ops = 0 if timestamp == "free" else 2  # begin read and publish/FAA on node 0
        out["nic"] = 1e9 / (nic / n + ts_ops * op_ns)
        if timestamp == "vector":
            out["timestamp_source"] = bw / (TS_SLOT_BYTES * n * p.threads + h) * 1e9
        elif timestamp == "counter":
            out["timestamp_source"] = p.hot_atomic_mops * 1e6
    else:
        msgs = 3 * n_rec  # one statement RPC, one prepare, one commit per record's partition
        net = (msgs * 2 * (MSG_BYTES + h) + n_rec * rec) * remote
        out["links"] = n * bw / net * 1e9
        out["cpu"] = n * p.cpu_cores / (msgs * p.rpc_cpu_ns) * 1e9
        if timestamp != "free":
            out["timestamp_source"] = p.cpu_cores / (2 * p.rpc_cpu_ns) * 1e9
    return out


@dataclass
class Prediction:
    nodes: int
    design: str
    workload: str
    timestamp: str
    clients: int
    scale: int
    tps: float
    abort_rate: float
    mean_latency_us: float
    p99_latency_us: float
    committed: int
    utilisation: dict
    bounds_tps: dict
    saturates_on: str
    busiest: str
    limited_by: str
    unloaded_read_us: float
    sim_ms: float
    wall_s: float

    def as_dict(self) -> dict:
        return asdict(self)


SATURATED = 0.85


def limited_by(util: dict[str, float], abort_rate: float) -> str:
    """What holds a run's throughput: a resource above 85 % busy, aborts, or latency."""
    busiest = max(util, key=util.get)
    if util[busiest] >= SATURATED:
        return f"{busiest} ({util[busiest]:.0%} busy)"
    if abort_rate >= 0.3:
        return f"lock contention ({abort_rate:.0%} of attempts abort)"
    return "latency (no resource above 85% busy; throughput = clients / latency)"


def run_prediction(p: ClusterParams, design: str, workload: str, *, timestamp: str = "vector",
                   seed: int = 1, commits: int | None = None, sim_seconds: float | None = None,
                   scale: int | None = None, accounts: int | None = None) -> Prediction:
    """Simulate ``workload`` on the ``design`` with ``p.nodes * p.threads`` client threads.

    The window is the commits from 25 % to 100 % of ``commits`` (default: eight per client,
    at least 20000, so that two per client are warm-up: a saturated closed system needs a
    full round of every client before its queues are in steady state), or, with
    ``sim_seconds``, the last 75 % of that simulated time.
    ``scale`` (TPC-B branches) defaults to one per client thread, pgbench's guidance;
    ``accounts`` (bank) to 100000 per node.
    """
    if design not in ("pool", "sharded"):
        raise ValueError(f"unknown design {design!r}; choose pool or sharded")
    allowed = ("vector", "counter", "free") if design == "pool" else ("oracle", "free")
    if design == "sharded" and timestamp in ("vector", "counter"):
        timestamp = "oracle"  # the RSI sources do not apply; 2PC uses its oracle
    if timestamp not in allowed:
        raise ValueError(f"timestamp source {timestamp!r} does not apply to {design}; "
                         f"use one of {', '.join(allowed)}")
    clients = p.nodes * p.threads
    wl = Workload(workload, p.nodes, scale=scale or clients,
                  accounts=accounts or 100_000 * p.nodes)
    env = simpy.Environment()
    cost = ClusterCost(env, p)
    groups = {"link_out": cost.tx, "link_in": cost.rx, "nic": cost.nic, "cpu": cost.cpu,
              "hot_atomic": [cost.hot]}
    snap: dict[str, list[float]] = {}
    util: dict[str, float] = {}

    def on_open() -> None:
        for g, srvs in groups.items():
            snap[g] = [s.done_ns() for s in srvs]

    def on_close() -> None:
        span = stats.span
        for g, srvs in groups.items():
            util[g] = max((s.done_ns() - b) / (span * s.servers) for s, b in zip(srvs, snap[g]))

    if sim_seconds is not None:
        if sim_seconds <= 0:
            raise ValueError(f"--seconds must be positive, got {sim_seconds}")
        t_end = sim_seconds * 1e9
        stats = TxnStats(env, by="time", t_open=0.25 * t_end, t_close=t_end,
                         on_open=on_open, on_close=on_close)
    else:
        target = commits if commits is not None else max(20_000, 8 * clients)
        if target < 4:
            raise ValueError(f"need at least 4 commits to measure, got {target}")
        stats = TxnStats(env, warm=target // 4, target=target, on_open=on_open,
                         on_close=on_close)
    ctx = Context(env, cost, wl, RecordTable(), stats, clients, timestamp=timestamp)
    streams = spawn_streams(seed, clients)
    start_clients(ctx, design, [c // p.threads for c in range(clients)], streams)
    wall = time.perf_counter()
    env.run(until=stats.done)
    wall = time.perf_counter() - wall
    s = stats.summary()
    bounds = analytic_bounds(p, design, wl, timestamp)
    relevant = {k: v for k, v in util.items()
                if not (design == "pool" and k == "cpu")
                and not (design == "sharded" and k in ("nic", "hot_atomic"))
                and not (k == "hot_atomic" and timestamp != "counter")}
    return Prediction(
        nodes=p.nodes, design=design, workload=workload,
        timestamp=timestamp, clients=clients,
        scale=wl.scale if workload == "tpcb" else wl.accounts, tps=s["tps"],
        abort_rate=s["abort_rate"], mean_latency_us=s["mean_latency_us"],
        p99_latency_us=s["p99_latency_us"], committed=s["committed"], utilisation=relevant,
        bounds_tps=bounds, saturates_on=min(bounds, key=bounds.get),
        busiest=max(relevant, key=relevant.get),
        limited_by=limited_by(relevant, s["abort_rate"]),
        unloaded_read_us=p.unloaded_read_ns() / 1e3,
        sim_ms=env.now / 1e6, wall_s=wall)
