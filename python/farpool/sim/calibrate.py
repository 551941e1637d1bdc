"""Experiment 3: predict farpool's TPC-B and bank throughput on this machine from its op costs.

Inputs
------
* ``bench/results/ops.jsonl`` (or ``--ops FILE``), written by ``farpool bench ops --json``:
  JSON lines with ``op`` (read|write|cas|faa), ``size``, ``threads``, ``batch``,
  ``transport``, ``ops_per_s``, ``p50_us``, ``p99_us``, ``p999_us`` and ``system``. Only
  ``system == "farpool"`` rows with ``batch == 1`` are used; peers' rows (redis, memcpy, ...)
  are ignored. A missing file is an error naming the command that produces it; no number is
  ever made up.
* Per-transaction op counts: measured ones from a ``farpool bench txn --json`` file
  (``--txn FILE``), otherwise the RSI derivation of ``mixes.rsi_op_counts``, labelled so.

Model
-----
Each operation type is fitted with two numbers from its measured curve: the service time of
the one shared station S = 1 / (highest measured ops/s), i.e. what saturates when many
threads hammer the pool (the server's progress thread on TCP, the cores and memory system on
shared memory), and a pure delay D = L1 - S, where L1 = 1 / (ops/s at 1 thread) is the mean
latency of one synchronous thread (Little's law). The fit is checked against the measured
ops/s at every other thread count (exact mean value analysis of the closed two-station
model) and the error is reported.

Engine CPU per transaction comes from the ``local`` engine of the transaction file (the same
code on local RAM, one thread): its time per transaction less its own memory accesses, each
at the one-thread cost of ``farpool bench ops --local`` (``system == "local-memory"`` rows of
the ops file). The pool engine's operations replace exactly those accesses and are added by
the model, so without the subtraction they would be counted twice.

Transactions are then predicted two ways for 1..8 client threads:
* ``des``: the RSI protocol of ``txn.py`` executed as a discrete-event simulation, each
  operation a path delay D/2 -> station S -> delay D/2, with real record conflicts, aborts
  and retries (TPC-B's branch hot spot) and the commit phases batched;
* ``mva``: mean value analysis with the op counts (measured if given), no aborts -- the
  simplest model that uses the counts alone. Every operation takes its turn at the station;
  the path delay is paid once per operation (back to back), or, when the measured rows carry
  ``round_trips_per_txn``, once per round trip (operations posted together travel together).

What it cannot do here: compare with measured transaction throughput until
``bench/results/txn.jsonl`` exists (``farpool bench txn ... --json``); until then the output
says so (``"measured_txn": null``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import simpy

from ..repo import read_jsonl
from .mixes import OpCounts, load_txn_counts, load_txn_rows, rsi_op_counts, shape
from .nodes import FifoServer, spawn_streams
from .txn import APPLY, DELAY, FIFO, Context, Path as OpPath, RecordTable, TxnStats, \
    Workload, start_clients

OPS_FIELDS = ("op", "size", "threads", "batch", "transport", "ops_per_s", "p50_us", "p99_us",
              "p999_us", "system")
OP_KINDS = ("read", "write", "cas", "faa")
OPS_HINT = ("run `farpool bench ops --json` (the C++ benchmark; it writes "
            "bench/results/ops.jsonl) or pass --ops FILE")
TXN_HINT = ("the comparison against measured transaction runs needs bench/results/txn.jsonl "
            "(`farpool bench txn ... --json`, not available yet); pass it with --txn FILE")


def load_ops(path: Path) -> list[dict]:
    rows = read_jsonl(path, OPS_FIELDS, "row", OPS_HINT)
    for n, row in enumerate(rows, 1):
        if row["op"] not in OP_KINDS:
            raise ValueError(f"{path}: row {n}: unknown op {row['op']!r} (want {OP_KINDS})")
        if not row["ops_per_s"] > 0 or row["threads"] < 1 or row["batch"] < 1:
            raise ValueError(f"{path}: row {n}: need ops_per_s > 0, threads >= 1, batch >= 1")
    return rows


@dataclass
class OpCost:
    op: str
    size: int
    service_ns: float
    delay_ns: float
    measured: dict[int, float]  # threads -> ops/s

    def model_ops_per_s(self, threads: int) -> float:
        return mva(self.service_ns, self.delay_ns, threads)[0] * 1e9

    def check(self) -> dict:
        model = {t: self.model_ops_per_s(t) for t in self.measured}
        err = {t: (model[t] - x) / x * 100 for t, x in self.measured.items()}
        return {"op": self.op, "size": self.size, "service_us": self.service_ns / 1e3,
                "delay_us": self.delay_ns / 1e3,
                "latency_1thread_us": (self.service_ns + self.delay_ns) / 1e3,
                "measured_ops_per_s": self.measured, "model_ops_per_s": model,
                "max_abs_error_pct": max(abs(e) for e in err.values())}


def mva(service_ns: float, delay_ns: float, customers: int) -> tuple[float, float]:
    """Exact MVA of a closed network: one FCFS station plus a delay. Returns (X per ns, R ns)."""
    q = 0.0
    x = r = 0.0
    for k in range(1, customers + 1):
        r = service_ns * (1 + q)
        x = k / (r + delay_ns)
        q = x * r
    return x, r + delay_ns


def fit_costs(rows: list[dict], transport: str | None, size: int) -> tuple[str, dict[str, OpCost]]:
    mine = [r for r in rows if r["system"] == "farpool" and r["batch"] == 1]
    if not mine:
        raise ValueError("no rows with system \"farpool\" and batch 1 in the ops file; "
                         + OPS_HINT)
    transports = sorted({r["transport"] for r in mine})
    if transport is None:
        transport = "shm" if "shm" in transports else transports[0]
    elif transport not in transports:
        raise ValueError(f"no farpool rows for transport {transport!r}; the file has "
                         f"{', '.join(transports)}")
    costs = {}
    for op in OP_KINDS:
        sel = [r for r in mine if r["transport"] == transport and r["op"] == op]
        if not sel:
            raise ValueError(f"no farpool {op} rows on transport {transport!r}; "
                             "need read, write, cas and faa")
        best = min({r["size"] for r in sel}, key=lambda s: (abs(s - size), s))
        sel = [r for r in sel if r["size"] == best]
        by_t: dict[int, list[float]] = {}
        for r in sel:
            by_t.setdefault(int(r["threads"]), []).append(float(r["ops_per_s"]))
        measured = {t: sum(v) / len(v) for t, v in sorted(by_t.items())}
        if 1 not in measured:
            raise ValueError(f"farpool {op} ({transport}, {best} B) has no 1-thread row; "
                             "the fit needs the single-thread latency")
        s = 1e9 / max(measured.values())
        d = max(0.0, 1e9 / measured[1] - s)
        costs[op] = OpCost(op, best, s, d, measured)
    return transport, costs


class MeasuredCost:
    """Cost model of one machine: every op is delay D/2, the shared station, delay D/2;
    engine CPU work queues for the machine's cores."""

    def __init__(self, env: simpy.Environment, costs: dict[str, OpCost], cores: int) -> None:
        self.costs = costs
        self.server = FifoServer(env, 1, "pool")
        self.cpu = FifoServer(env, cores, "cores")

    def compute(self, ns: float) -> OpPath:
        return [(FIFO, self.cpu, ns)]

    def one_sided(self, op, src, dst, req_bytes, resp_bytes, apply=None, hot=False) -> OpPath:
        c = self.costs[op]
        path: OpPath = [(DELAY, c.delay_ns / 2), (FIFO, self.server, c.service_ns)]
        if apply:
            path.append((APPLY, apply))
        path.append((DELAY, c.delay_ns / 2))
        return path

    def rpc(self, src, dst, req_bytes, resp_bytes, apply=None) -> OpPath:
        raise ValueError("calibration models the pool engine only; 2PC has no measured costs")


def extra_ops(measured: OpCounts | None, derived: OpCounts) -> dict[str, float]:
    """Operations per transaction the measured engine performs beyond the derivation."""
    if measured is None:
        return {}
    pairs = (("read", measured.reads, derived.reads), ("write", measured.writes, derived.writes),
             ("cas", measured.cas, derived.cas), ("faa", measured.faa, derived.faa))
    return {op: m - d for op, m, d in pairs if m - d > 0.01}


def predict_des(costs: dict[str, OpCost], workload: str, threads: int, seed: int,
                commits: int, scale: int = 1, accounts: int = 10_000,
                extra: dict[str, float] | None = None, compute_ns: float = 0.0,
                cores: int = 2) -> dict:
    env = simpy.Environment()
    cm = MeasuredCost(env, costs, cores)
    stats = TxnStats(env, warm=commits // 5, target=commits)
    wl = Workload(workload, 1, scale=scale, accounts=accounts)
    ctx = Context(env, cm, wl, RecordTable(), stats, threads, extra_ops=extra or {},
                  compute_ns=compute_ns)
    start_clients(ctx, "pool", [0] * threads, spawn_streams(seed, threads))
    env.run(until=stats.done)
    return stats.summary()


def predict_mva(costs: dict[str, OpCost], counts: OpCounts, threads: int,
                compute_ns: float = 0.0) -> float:
    """MVA with the op station; the engine's compute is counted as delay (no core queue).
    With measured round trips the path delay is their count times the mean delay of the
    transaction's operations, instead of one delay per operation."""
    n = {"read": counts.reads, "write": counts.writes, "cas": counts.cas, "faa": counts.faa}
    s = sum(n[o] * costs[o].service_ns for o in OP_KINDS)
    d = sum(n[o] * costs[o].delay_ns for o in OP_KINDS)
    if counts.round_trips is not None and counts.total() > 0:
        d = d / counts.total() * counts.round_trips
    return mva(s, d + compute_ns, threads)[0] * 1e9


def local_op_ns(rows: list[dict], size: int) -> dict[str, float]:
    """Latency of one operation on this process's RAM: ``farpool bench ops --local`` rows
    (``system == "local-memory"``, batch 1, one thread, the size nearest ``size``), 1e9 / their
    ops/s. Only the ops that have such rows are returned (none: an empty dict)."""
    sel = [r for r in rows if r["system"] == "local-memory" and r["batch"] == 1
           and int(r["threads"]) == 1]
    out = {}
    for op in OP_KINDS:
        mine = [r for r in sel if r["op"] == op]
        if not mine:
            continue
        best = min({r["size"] for r in mine}, key=lambda s: (abs(s - size), s))
        v = [float(r["ops_per_s"]) for r in mine if r["size"] == best]
        out[op] = 1e9 / (sum(v) / len(v))
    return out


def local_compute(rows: list[dict] | None, workload: str,
                  local_ns: dict[str, float] | None = None) -> dict | None:
    """Engine CPU per transaction, from the ``local`` engine (same code on local RAM) at one
    client thread: its time per transaction, 1 / tps, *less* the memory accesses it performs
    (its own measured op counts x the local-memory latency of each op). Those accesses are
    what the pool engine replaces by pool operations, which the model adds separately;
    without the subtraction every access would be counted twice. When an op the local engine
    performs has no local-memory row, nothing is subtracted and ``note`` says so. None when
    the local engine was not measured."""
    sel = [r for r in rows or [] if r["engine"] == "local" and r["workload"] == workload
           and int(r["clients"]) * int(r["threads"]) == 1 and r["tps"] > 0]
    if not sel:
        return None
    per_txn = 1e9 / (sum(r["tps"] for r in sel) / len(sel))
    counts = load_txn_counts(sel, workload, engine="local")
    n = {"read": counts.reads, "write": counts.writes, "cas": counts.cas, "faa": counts.faa}
    local_ns = local_ns or {}
    missing = [o for o in OP_KINDS if n[o] > 0 and o not in local_ns]
    out = {"local_txn_ns": per_txn, "local_counts": n}
    if missing:
        out.update(compute_ns=per_txn, memory_ns=None,
                   note=("engine CPU includes its memory accesses (no local-memory rows for "
                         f"{', '.join(missing)}: run `farpool bench ops --local --json`); "
                         "at one thread the accesses are counted twice"))
        return out
    mem = sum(n[o] * local_ns[o] for o in OP_KINDS if n[o] > 0)
    out.update(compute_ns=max(0.0, per_txn - mem), memory_ns=mem,
               note="local engine time less its memory accesses at local-memory cost"
                    + (" (clamped at 0)" if mem > per_txn else ""))
    return out


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Measured pool-engine runs grouped by (workload, client threads, key space)."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["engine"] != "pool":
            continue
        space = r.get("scale", 1) if r["workload"] == "tpcb" else r.get("accounts", 10_000)
        out.setdefault((r["workload"], int(r["clients"]) * int(r["threads"]), int(space)),
                       []).append(r)
    return out


def calibrate(ops_path: Path, txn_path: Path | None = None, transport: str | None = None,
              size: int = 64, threads: tuple[int, ...] = tuple(range(1, 9)), scale: int = 1,
              accounts: int = 10_000, seed: int = 1, commits: int = 5000) -> dict:
    """Experiment 3; see the module docstring. ``scale``/``accounts`` describe the modelled
    runs (defaults: those of ``farpool bench txn``); measured runs are modelled each with
    its own client count and key space."""
    rows = load_ops(ops_path)
    transport, costs = fit_costs(rows, transport, size)
    txn_rows = load_txn_rows(txn_path) if txn_path is not None else None
    cores = max((int(r.get("cores", 0)) for r in rows), default=0) or 2
    local_ns = local_op_ns(rows, size)
    counts, extras, compute, compute_info = {}, {}, {}, {}
    for w in ("bank", "tpcb"):
        derived = rsi_op_counts(shape(w))
        measured = load_txn_counts(txn_rows, w) if txn_rows else None
        counts[w] = measured or derived
        extras[w] = extra_ops(measured, derived)
        compute_info[w] = local_compute(txn_rows, w, local_ns)
        compute[w] = compute_info[w]["compute_ns"] if compute_info[w] else None
    predicted = []
    for w in ("bank", "tpcb"):
        for t in threads:
            des = predict_des(costs, w, t, seed, commits, scale, accounts, extras[w],
                              compute[w] or 0.0, cores)
            predicted.append({"workload": w, "threads": t, "des_tps": des["tps"],
                              "des_abort_rate": des["abort_rate"],
                              "des_mean_latency_us": des["mean_latency_us"],
                              "mva_tps": predict_mva(costs, counts[w], t, compute[w] or 0.0)})
    out = {"ops_file": str(ops_path), "transport": transport, "record_size": size,
           "scale": scale, "accounts": accounts, "cores": cores,
           "op_costs": {o: c.check() for o, c in costs.items()},
           "op_counts": {w: c.as_dict() for w, c in counts.items()},
           "extra_ops_per_txn": extras,
           "engine_compute_us": {w: (v / 1e3 if v else None) for w, v in compute.items()},
           "local_memory_op_us": {o: v / 1e3 for o, v in local_ns.items()},
           "engine_compute_detail": {
               w: None if c is None else {
                   "local_engine_txn_us": c["local_txn_ns"] / 1e3,
                   "local_engine_ops_per_txn": c["local_counts"],
                   "memory_accesses_us": (c["memory_ns"] / 1e3
                                          if c["memory_ns"] is not None else None),
                   "note": c["note"]}
               for w, c in compute_info.items()},
           "predicted": predicted}
    if txn_rows is None:
        out["measured_txn"] = None
        out["message"] = TXN_HINT
        return out
    comparison = []
    for (w, t, space), grp in sorted(_groups(txn_rows).items()):
        m = sum(r["tps"] for r in grp) / len(grp)
        own = load_txn_counts(grp, w)
        des = predict_des(costs, w, t, seed, commits,
                          scale=space if w == "tpcb" else 1,
                          accounts=space if w == "bank" else 10_000,
                          extra=extra_ops(own, rsi_op_counts(shape(w))),
                          compute_ns=compute[w] or 0.0, cores=cores)
        mva_tps = predict_mva(costs, own, t, compute[w] or 0.0)
        comparison.append({
            "workload": w, "client_threads": t, "key_space": space, "runs": len(grp),
            "measured_tps": m,
            "measured_abort_rate": sum(r["abort_rate"] for r in grp) / len(grp),
            "des_tps": des["tps"], "des_abort_rate": des["abort_rate"], "mva_tps": mva_tps,
            "des_error_pct": (des["tps"] - m) / m * 100,
            "mva_error_pct": (mva_tps - m) / m * 100})
    out["measured_txn"] = comparison
    if comparison:
        worst = max(abs(c["des_error_pct"]) for c in comparison)
        within = sum(abs(c["des_error_pct"]) <= 25 for c in comparison)
        out["message"] = (f"compared with {len(comparison)} measured configuration(s) from "
                          f"{txn_path}: DES within 25% for {within}, largest DES error "
                          f"{worst:.0f}%")
    else:
        out["message"] = f"{txn_path} has no engine=pool rows; nothing to compare"
    return out
