"""Transactions over a memory pool as discrete-event processes: RSI and sharded 2PC.

What it models
--------------
* **Operations as paths.** Every remote operation or message is a path of stages: a fixed
  delay, a first-come-first-served station (:class:`nodes.FifoServer`: a link direction, a
  NIC's operation unit, a CPU pool, the lone server of a single-machine calibration), or an
  *apply* step where the operation takes effect on the shared state (a CAS succeeds or fails,
  a version is installed). :func:`execute` walks a batch of paths (operations posted
  together, then waited for once) in time order inside the calling process, booking each
  station at the instant the operation reaches it, so stations stay strictly FCFS.
* **Records** have a lock word and the time of their last committed version
  (:class:`RecordTable`). A lock attempt fails when the record is locked or when a version
  newer than the transaction's snapshot was committed (first committer wins); the
  transaction then releases what it locked, backs off and retries with the same records.
* **RSI** (DESIGN.md "db"; NAM-DB's protocol): read timestamp from the timestamp vector (one
  read of 8 bytes per compute thread) or, as a variant, a global counter (a read at begin, and
  a fetch-and-add for the commit timestamp before locking, as in the RSI paper's
  pseudo-code); per record one index-bucket read and one record read; commit:
  CAS per written record in one batch, then the new versions in one batch, then the unlocks
  carrying the commit timestamp; each insert one fetch-and-add on the node's own history
  tail and one write; last, the commit timestamp written into the thread's vector slot.
* **Sharded 2PC with snapshot isolation** (the classic design NAM-DB and MEMSCALE compare
  against): a timestamp oracle on node 0 (one RPC at begin, one at commit); each statement an
  RPC to the partition owning the record (a local call when it is the coordinator's own
  partition); prepare (validate and lock) to every written partition in one batch, then
  commit (install and unlock) or abort. Every message costs CPU at the node that receives it.

``timestamp="free"`` replaces the timestamp source of either design by one that costs nothing
(an idealised, perfectly scalable source) to show what saturates once it is gone.

Workloads: ``bank`` (transfer between two distinct accounts drawn uniformly) and ``tpcb``
(pgbench: account, teller and branch drawn independently and uniformly, plus a history
insert). Records are placed by branch (TPC-B) or by account (bank) modulo the node count.

Cost models (who decides how long a path takes) live with their callers: ``calibrate.py``
(one machine, from measured operation costs) and ``predict.py`` (a cluster).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol

import simpy

from .nodes import Stream

# Stage encodings (tuples for speed): (DELAY, ns) | (FIFO, server, ns) | (APPLY, fn)
DELAY, FIFO, APPLY = 0, 1, 2
Path = list[tuple]


def execute(env: simpy.Environment, paths: list[Path]) -> Iterator[simpy.events.Event]:
    """Run a batch of paths concurrently; returns (as a generator) when all are done."""
    if len(paths) == 1:  # the common case, without the heap (same arithmetic, same events)
        for st in paths[0]:
            kind = st[0]
            if kind == APPLY:
                st[1](env.now)
                continue
            t = env.now + (st[1] if kind == DELAY else st[1].delay(st[2]))
            if t > env.now:
                yield env.timeout(t - env.now)
        return
    now = env.now
    heap = [(now, i, 0) for i in range(len(paths))]
    heapq.heapify(heap)
    while heap:
        t, i, s = heapq.heappop(heap)
        if t > env.now:
            yield env.timeout(t - env.now)
        path = paths[i]
        while s < len(path):
            st = path[s]
            s += 1
            kind = st[0]
            if kind == DELAY:
                if st[1] > 0:
                    heapq.heappush(heap, (env.now + st[1], i, s))
                    break
            elif kind == FIFO:
                heapq.heappush(heap, (env.now + st[1].delay(st[2]), i, s))
                break
            else:
                st[1](env.now)


class CostModel(Protocol):
    """Builds the path of one operation; ``apply`` runs when it takes effect at the target."""

    def one_sided(self, op: str, src: int, dst: int, req_bytes: int, resp_bytes: int,
                  apply: Callable[[float], None] | None = None, hot: bool = False) -> Path: ...

    def rpc(self, src: int, dst: int, req_bytes: int, resp_bytes: int,
            apply: Callable[[float], None] | None = None) -> Path: ...

    def compute(self, ns: float) -> Path: ...


class RecordTable:
    """Lock word and last-commit time of every record touched so far."""

    def __init__(self) -> None:
        self.locks: dict[tuple, int] = {}
        self.commits: dict[tuple, float] = {}

    def try_lock(self, key: tuple, owner: int, snapshot: float) -> bool:
        if key in self.locks or self.commits.get(key, -1.0) > snapshot:
            return False
        self.locks[key] = owner
        return True

    def unlock(self, key: tuple, owner: int) -> None:
        if self.locks.get(key) != owner:
            raise RuntimeError(f"record {key} unlocked by {owner}, held by "
                               f"{self.locks.get(key)}")
        del self.locks[key]

    def commit(self, key: tuple, owner: int, t: float) -> None:
        self.unlock(key, owner)
        self.commits[key] = t


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------

RECORD_BYTES = {"account": 100, "teller": 100, "branch": 100, "history": 50}
BUCKET_BYTES = 64
TS_SLOT_BYTES = 8
MSG_BYTES = 128  # a 2PC message: opcode, keys, values, timestamps


@dataclass(frozen=True)
class Workload:
    """Key spaces and placement. ``scale`` = TPC-B branches; ``accounts`` for bank."""

    name: str
    nodes: int
    scale: int = 1
    accounts: int = 100_000

    def __post_init__(self) -> None:
        if self.name not in ("bank", "tpcb"):
            raise ValueError(f"unknown workload {self.name!r}; choose bank or tpcb")
        if self.nodes < 1 or self.scale < 1 or self.accounts < 2:
            raise ValueError(f"workload needs nodes >= 1, scale >= 1, accounts >= 2; got "
                             f"{self.nodes}, {self.scale}, {self.accounts}")

    def draw(self, s: Stream) -> list[tuple[tuple, bool]]:
        """The records of one transaction: ``[(key, written)]`` in statement order."""
        if self.name == "bank":
            a = s.below(self.accounts)
            b = s.below(self.accounts - 1)
            if b >= a:
                b += 1
            return [(("account", a), True), (("account", b), True)]
        n = self.scale
        return [(("account", s.below(100_000 * n)), True), (("teller", s.below(10 * n)), True),
                (("branch", s.below(n)), True)]

    @property
    def inserts(self) -> tuple[str, ...]:
        return ("history",) if self.name == "tpcb" else ()

    def home(self, key: tuple) -> int:
        table, idx = key
        if self.name == "bank":
            return idx % self.nodes
        branch = {"account": idx // 100_000, "teller": idx // 10, "branch": idx}[table]
        return branch % self.nodes


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------

class TxnStats:
    """Commits, aborts and latencies inside a measurement window.

    The window opens after ``warm`` commits and closes at ``target`` commits (``by="commits"``)
    or opens and closes at fixed simulated times (``by="time"``, ``t_open``/``t_close`` ns).
    ``on_open``/``on_close`` run when it does; ``done`` fires at the close.
    """

    def __init__(self, env: simpy.Environment, *, warm: int = 0, target: int = 0,
                 t_open: float = 0.0, t_close: float = 0.0, by: str = "commits",
                 on_open: Callable[[], None] = lambda: None,
                 on_close: Callable[[], None] = lambda: None) -> None:
        if by == "commits":
            if not 0 <= warm < target:
                raise ValueError(f"need 0 <= warm < target commits, got {warm}, {target}")
        elif by == "time":
            if not 0 <= t_open < t_close:
                raise ValueError(f"need 0 <= open < close time, got {t_open}, {t_close} ns")
        else:
            raise ValueError(f"window by {by!r}: use commits or time")
        self.env = env
        self.by, self.warm, self.target = by, warm, target
        self.on_open, self.on_close = on_open, on_close
        self.done = env.event()
        self.measuring = False
        self.t_open = self.t_close = -1.0
        self.total_commits = 0
        self.committed = 0
        self.aborted = 0
        self.latencies: list[float] = []
        if by == "time":
            for t, fn in ((t_open, self._open), (t_close, self._close)):
                env.timeout(t).callbacks.append(lambda _ev, fn=fn: fn())
        elif warm == 0:
            self._open()

    def _open(self) -> None:
        self.measuring = True
        self.t_open = self.env.now
        self.on_open()

    def _close(self) -> None:
        if not self.measuring:
            return
        self.measuring = False
        self.t_close = self.env.now
        self.on_close()
        self.done.succeed()

    def record(self, t_start: float, t_end: float) -> None:
        self.total_commits += 1
        if self.measuring:
            self.committed += 1
            self.latencies.append(t_end - t_start)
        if self.by == "commits":
            if self.total_commits == self.warm and not self.measuring:
                self._open()
            elif self.total_commits == self.target:
                self._close()

    def record_abort(self, t: float) -> None:
        if self.measuring:
            self.aborted += 1

    @property
    def span(self) -> float:
        return self.t_close - self.t_open

    def summary(self) -> dict:
        if self.t_close < 0 or self.committed == 0:
            raise RuntimeError("the measurement window never closed with commits in it; "
                               "allow more simulated time or fewer commits")
        lat = sorted(self.latencies)
        n = len(lat)
        return {"tps": self.committed / self.span * 1e9,
                "abort_rate": self.aborted / (self.aborted + self.committed),
                "committed": self.committed, "aborted": self.aborted,
                "mean_latency_us": sum(lat) / n / 1e3,
                "p50_latency_us": lat[n // 2] / 1e3,
                "p99_latency_us": lat[min(n - 1, int(0.99 * n))] / 1e3,
                "window_ns": self.span}


# Where read and commit timestamps come from. RSI: "vector" or "counter"; 2PC: "oracle".
# "free" (either design) costs nothing -- an idealised source that shows what saturates next.
TIMESTAMPS = ("vector", "counter", "oracle", "free")


@dataclass
class Context:
    """Everything the client processes share."""

    env: simpy.Environment
    cost: CostModel
    workload: Workload
    table: RecordTable
    stats: TxnStats
    clients: int
    timestamp: str = "vector"   # see TIMESTAMPS
    ts_node: int = 0
    backoff_ns: float = 1000.0
    # Operations a real engine performs beyond the derived protocol (measured counts minus
    # derived counts, per op type, per transaction); run one after another while the write
    # set is locked. Fractions are drawn per transaction.
    extra_ops: dict[str, float] = field(default_factory=dict)
    # Engine CPU work per attempt outside the operations (index hashing, record encoding):
    # a path from ``cost.compute`` run at begin; 0 leaves it out (the cluster model).
    compute_ns: float = 0.0

    def __post_init__(self) -> None:
        if self.timestamp not in TIMESTAMPS:
            raise ValueError(f"unknown timestamp source {self.timestamp!r}; "
                             f"use one of {', '.join(TIMESTAMPS)}")


def _backoff(ctx: Context, s: Stream, attempt: int) -> float:
    return ctx.backoff_ns * (1 << min(attempt, 6)) * s.uniform()


def rsi_client(ctx: Context, cid: int, node: int, s: Stream) -> Iterator:
    """A compute thread running RSI transactions back to back."""
    env, cm, wl, tab = ctx.env, ctx.cost, ctx.workload, ctx.table
    vector_bytes = TS_SLOT_BYTES * ctx.clients
    while True:
        recs = wl.draw(s)
        t_start = env.now
        attempt = 0
        while True:
            snap = [0.0]

            def take_snapshot(t: float) -> None:
                snap[0] = t

            if ctx.compute_ns > 0:
                yield from execute(env, [cm.compute(ctx.compute_ns)])
            if ctx.timestamp == "free":
                take_snapshot(env.now)
            else:
                size = vector_bytes if ctx.timestamp == "vector" else TS_SLOT_BYTES
                yield from execute(env, [cm.one_sided("read", node, ctx.ts_node, 0, size,
                                                      take_snapshot)])
            for key, _ in recs:
                home = wl.home(key)
                yield from execute(env, [cm.one_sided("read", node, home, 0, BUCKET_BYTES)])
                yield from execute(env, [cm.one_sided("read", node, home, 0,
                                                      RECORD_BYTES[key[0]])])
            got: dict[tuple, bool] = {}
            written = [k for k, w in recs if w]
            if ctx.timestamp == "counter":  # commit timestamp before locking, as in RSI
                yield from execute(env, [cm.one_sided("faa", node, ctx.ts_node, 8, 8, hot=True)])

            def cas(k: tuple) -> Callable[[float], None]:
                return lambda t: got.__setitem__(k, tab.try_lock(k, cid, snap[0]))

            yield from execute(env, [cm.one_sided("cas", node, wl.home(k), 16, 8, cas(k))
                                     for k in written])
            if not all(got.values()):
                held = [k for k, ok in got.items() if ok]
                if held:
                    yield from execute(env, [
                        cm.one_sided("write", node, wl.home(k), 8, 0,
                                     (lambda kk: lambda t: tab.unlock(kk, cid))(k))
                        for k in held])
                ctx.stats.record_abort(env.now)
                attempt += 1
                yield env.timeout(_backoff(ctx, s, attempt))
                continue
            for op, x in ctx.extra_ops.items():
                n = int(x) + (s.uniform() < x - int(x))
                for _ in range(n):
                    yield from execute(env, [cm.one_sided(op, node, wl.home(written[0]), 8,
                                                          RECORD_BYTES[written[0][0]])])
            yield from execute(env, [cm.one_sided("write", node, wl.home(k),
                                                  RECORD_BYTES[k[0]], 0) for k in written])
            yield from execute(env, [
                cm.one_sided("write", node, wl.home(k), 8, 0,
                             (lambda kk: lambda t: tab.commit(kk, cid, t))(k))
                for k in written])
            for tbl in wl.inserts:
                yield from execute(env, [cm.one_sided("faa", node, node, 8, 8)])
                yield from execute(env, [cm.one_sided("write", node, node,
                                                      RECORD_BYTES[tbl], 0)])
            if ctx.timestamp == "vector":
                yield from execute(env, [cm.one_sided("write", node, ctx.ts_node,
                                                      TS_SLOT_BYTES, 0)])
            ctx.stats.record(t_start, env.now)
            break


def twopc_client(ctx: Context, cid: int, node: int, s: Stream) -> Iterator:
    """A client of the sharded engine coordinating SI transactions with two-phase commit."""
    env, cm, wl, tab = ctx.env, ctx.cost, ctx.workload, ctx.table
    while True:
        recs = wl.draw(s)
        t_start = env.now
        attempt = 0
        while True:
            snap = [0.0]

            def take_snapshot(t: float) -> None:
                snap[0] = t

            oracle = ctx.timestamp != "free"
            if oracle:
                yield from execute(env, [cm.rpc(node, ctx.ts_node, MSG_BYTES, MSG_BYTES,
                                                take_snapshot)])
            else:
                take_snapshot(env.now)
            for key, _ in recs:
                yield from execute(env, [cm.rpc(node, wl.home(key), MSG_BYTES,
                                                MSG_BYTES + RECORD_BYTES[key[0]])])
            if oracle:
                yield from execute(env, [cm.rpc(node, ctx.ts_node, MSG_BYTES, MSG_BYTES)])
            parts: dict[int, list[tuple]] = {}
            for k, w in recs:
                if w:
                    parts.setdefault(wl.home(k), []).append(k)
            votes: dict[int, list[tuple]] = {}

            def prepare(p: int, keys: list[tuple]) -> Callable[[float], None]:
                def go(t: float) -> None:
                    locked = []
                    for k in keys:
                        if tab.try_lock(k, cid, snap[0]):
                            locked.append(k)
                        else:
                            for kk in locked:
                                tab.unlock(kk, cid)
                            votes[p] = []
                            return
                    votes[p] = locked
                return go

            yield from execute(env, [cm.rpc(node, p, MSG_BYTES, MSG_BYTES, prepare(p, ks))
                                     for p, ks in parts.items()])
            if any(not votes[p] for p in parts):
                yes = [p for p in parts if votes[p]]
                yield from execute(env, [
                    cm.rpc(node, p, MSG_BYTES, MSG_BYTES,
                           (lambda ks: lambda t: [tab.unlock(k, cid) for k in ks])(votes[p]))
                    for p in yes])
                ctx.stats.record_abort(env.now)
                attempt += 1
                yield env.timeout(_backoff(ctx, s, attempt))
                continue
            yield from execute(env, [
                cm.rpc(node, p, MSG_BYTES, MSG_BYTES,
                       (lambda ks: lambda t: [tab.commit(k, cid, t) for k in ks])(ks))
                for p, ks in parts.items()])
            ctx.stats.record(t_start, env.now)
            break


def start_clients(ctx: Context, design: str, placement: Iterable[int],
                  streams: list[Stream]) -> None:
    """Start one client process per entry of ``placement`` (the node it runs on).

    Clients run until the simulation stops (``env.run(until=ctx.stats.done)``).
    """
    fn = {"pool": rsi_client, "sharded": twopc_client}.get(design)
    if fn is None:
        raise ValueError(f"unknown design {design!r}; choose pool or sharded")
    for cid, (node, s) in enumerate(zip(placement, streams)):
        ctx.env.process(fn(ctx, cid, node, s))


