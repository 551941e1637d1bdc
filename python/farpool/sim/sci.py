"""Seed 003 reproduced: a 4-node SCI ring carrying a clustered database machine's traffic.

What it models (section 3 of the paper, IEEE 1596-1992 where the paper is silent)
-----------------------------------------------------------------------------------
* The ring: 4 nodes, unidirectional links of 1 GB/s (16-bit symbols every 2 ns, the SCI
  standard's parallel link), 1 ns propagation delay between nodes, 8 ns bypass delay in each
  node, cut-through. Packets already on the ring (the bypass FIFO) go before a node's own
  insertions; the bypass FIFO itself is not bounded because SCI only lets a node insert when
  its bypass FIFO is empty, which is what keeps it from overflowing.
* Packets: a send packet is a 16-byte header, 0, 16 or 64 bytes of data and a 2-byte CRC; an
  echo is 8 bytes; every packet is followed by one 2-byte idle symbol. Read: request without
  data, response with 64 bytes. Write: request with 64 bytes, response without data. Lock and
  cache-tag (rollout) operations carry 16 bytes each way ("16 byte quantities", section 5).
* Node interface: a request output buffer and a response output buffer of 3 packets each; a
  send packet keeps its slot until its echo returns. A request input buffer of 3 packets at
  the target: when it is full the target strips the packet and returns a busy echo, and the
  sender retransmits (SCI's busy-retry). Requests are served by a memory responder (reads,
  writes), a lock server and a cache-tag update server, each first-come-first-served; a
  responder whose response output buffer is full stalls. Responses are consumed at once by
  the statistics module.
* Traffic: each node's generator issues operations as a Poisson process, the kind drawn from
  the mix, the home node uniformly among the other three (far references spread evenly).
  Latency is measured from generation (including any wait for an output-buffer slot) to the
  response's arrival; throughput counts payload bytes (64 per read/write, 16 per lock/tag).

Assumptions the paper does not fix (documented in docs/simulator.md)
--------------------------------------------------------------------
* Responder service times: memory 100 ns, lock server 100 ns (read-modify-write), cache-tag
  server 50 ns. They shift every latency by a constant and barely move the knee, which the
  links set.
* SCI's go-bit fairness, A/B retry ageing and the elasticity buffer are not modelled.
* The knee is where the mean read latency reaches twice its unloaded value (interpolated
  linearly between load points); the paper's own criterion ("starts to increase more
  dramatically") is not quantified.

Section 6 (Fig. 8) is computed by :func:`bus_traffic` with the paper's formula and by
:func:`fig8_table` with the paper's arithmetic; see their docstrings for the exact rounding.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from fractions import Fraction
from decimal import Decimal, ROUND_HALF_UP

import simpy
from simpy.events import Timeout

from .fabric import Fabric, LinkParams, Packet, Ring
from .mixes import SCI_OPS, SciMix, sci_mix
from .nodes import PoissonSource, Stream, spawn_streams

HEADER_BYTES = 16
CRC_BYTES = 2
IDLE_BYTES = 2
ECHO_BYTES = 8

# kind -> (request data bytes, response data bytes, payload bytes counted as throughput)
OP_BYTES = {
    "read": (0, 64, 64),
    "write": (64, 0, 64),
    "rollout": (16, 16, 16),
    "lock": (16, 16, 16),
}
SERVER_OF = {"read": "memory", "write": "memory", "lock": "lock", "rollout": "tag"}


def send_packet_bytes(data: int) -> int:
    return HEADER_BYTES + data + CRC_BYTES + IDLE_BYTES


@dataclass(frozen=True)
class SciParams:
    nodes: int = 4
    link_gb_s: float = 1.0
    prop_ns: float = 1.0
    bypass_ns: float = 8.0
    buffer_pkts: int = 3
    memory_ns: float = 100.0
    lock_ns: float = 100.0
    tag_ns: float = 50.0

    def service_ns(self, server: str) -> float:
        return {"memory": self.memory_ns, "lock": self.lock_ns, "tag": self.tag_ns}[server]


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for events/second)."""

    def __init__(self) -> None:
        super().__init__()
        self.events_processed = 0

    def step(self) -> None:
        self.events_processed += 1
        super().step()


class _Op:
    __slots__ = ("kind", "src", "dst", "t_gen", "t_done", "seq")

    def __init__(self, kind: str, src: int, dst: int, t_gen: float, seq: int) -> None:
        self.kind, self.src, self.dst, self.t_gen, self.seq = kind, src, dst, t_gen, seq
        self.t_done = -1.0


class _Responder:
    __slots__ = ("name", "service", "queue", "busy")

    def __init__(self, name: str, service: float) -> None:
        self.name, self.service = name, service
        self.queue: deque = deque()
        self.busy = False


class SciNode:
    """One node's SCI interface, responders and traffic generator."""

    def __init__(self, ring: "SciRing", idx: int) -> None:
        self.ring = ring
        self.idx = idx
        p = ring.params
        self.req_out_free = p.buffer_pkts
        self.resp_out_free = p.buffer_pkts
        self.req_in_used = 0
        self.backlog: deque[_Op] = deque()
        self.resp_wait: deque[tuple[_Responder, Packet]] = deque()
        self.responders = {s: _Responder(s, p.service_ns(s)) for s in ("memory", "lock", "tag")}
        self.busy_echoes = 0

    # requester side -------------------------------------------------------------------------
    def issue(self, op: _Op) -> None:
        if self.req_out_free > 0:
            self.req_out_free -= 1
            self._send_request(op)
        else:
            self.backlog.append(op)

    def _send_request(self, op: _Op) -> None:
        data = OP_BYTES[op.kind][0]
        self.ring.fabric.send(Packet(self.idx, op.dst, send_packet_bytes(data), kind="req",
                                     payload=op))

    # packet arrivals ------------------------------------------------------------------------
    def on_packet(self, pkt: Packet) -> None:
        kind = pkt.kind
        if kind == "echo":
            self._on_echo(pkt)
        elif kind == "req":
            self._on_request(pkt)
        else:
            self.ring.complete(pkt.payload)
            self._echo(pkt, busy=False)

    def _echo(self, pkt: Packet, busy: bool) -> None:
        self.ring.fabric.send(
            Packet(self.idx, pkt.src, ECHO_BYTES + IDLE_BYTES, kind="echo",
                   payload=(pkt, busy)), transit=True)

    def _on_echo(self, echo: Packet) -> None:
        orig, busy = echo.payload
        if busy:
            self.ring.retries += 1
            self.ring.fabric.send(orig)
            return
        if orig.kind == "req":
            if self.backlog:
                self._send_request(self.backlog.popleft())
            else:
                self.req_out_free += 1
        else:
            if self.resp_wait:
                r, resp = self.resp_wait.popleft()
                self._release_responder(r, resp)
            else:
                self.resp_out_free += 1

    # responder side -------------------------------------------------------------------------
    def _on_request(self, pkt: Packet) -> None:
        if self.req_in_used >= self.ring.params.buffer_pkts:
            self.busy_echoes += 1
            self._echo(pkt, busy=True)
            return
        self.req_in_used += 1
        self._echo(pkt, busy=False)
        r = self.responders[SERVER_OF[pkt.payload.kind]]
        r.queue.append(pkt.payload)
        if not r.busy:
            self._serve(r)

    def _serve(self, r: _Responder) -> None:
        r.busy = True
        ev = Timeout(self.ring.env, r.service, (r, r.queue.popleft()))
        ev.callbacks.append(self._served)

    def _served(self, ev: Timeout) -> None:
        r, op = ev.value
        resp = Packet(self.idx, op.src, send_packet_bytes(OP_BYTES[op.kind][1]), kind="resp",
                      payload=op)
        if self.resp_out_free > 0:
            self.resp_out_free -= 1
            self._release_responder(r, resp)
        else:
            self.resp_wait.append((r, resp))  # responder stalls holding its input slot

    def _release_responder(self, r: _Responder, resp: Packet) -> None:
        self.req_in_used -= 1
        self.ring.fabric.send(resp)
        if r.queue:
            self._serve(r)
        else:
            r.busy = False


@dataclass
class PointResult:
    """One load point of the throughput/latency sweep."""

    mix: str
    offered_read_mb_s: float
    read_mb_s: float
    total_mb_s: float
    wire_mb_s_per_link: float
    link_util_mean: float
    link_util_max: float
    ops_per_s: dict[str, float]
    latency_ns: dict[str, float]
    p99_read_ns: float
    retries: int
    ops: int
    sim_ns: float
    events: int

    def as_dict(self) -> dict:
        return asdict(self)


class SciRing:
    """A seed-003 SCI ring with traffic generators; :meth:`run` returns a :class:`PointResult`."""

    def __init__(self, mix: SciMix, offered_read_mb_s: float, n_ops: int, seed: int,
                 params: SciParams = SciParams()) -> None:
        if offered_read_mb_s <= 0:
            raise ValueError(f"offered read throughput must be positive, "
                             f"got {offered_read_mb_s} MB/s")
        shares = mix.shares()
        if shares["read"] <= 0:
            raise ValueError(f"mix {mix.name} has no reads; the sweep is driven by read load")
        if n_ops < 10 * params.nodes:
            raise ValueError(f"need at least {10 * params.nodes} operations, got {n_ops}")
        self.mix = mix
        self.params = params
        self.offered = offered_read_mb_s
        self.env = CountingEnvironment()
        self.fabric = Fabric(self.env, Ring(params.nodes),
                             LinkParams(bandwidth=params.link_gb_s, prop_ns=params.prop_ns,
                                        hop_ns=params.bypass_ns, policy="elastic"))
        self.nodes = [SciNode(self, i) for i in range(params.nodes)]
        for n in self.nodes:
            self.fabric.attach(n.idx, n.on_packet)
        # total ops/ns so that reads carry offered_read_mb_s (1 MB/s = 1e-3 bytes/ns)
        total_rate = offered_read_mb_s * 1e-3 / (64 * shares["read"])
        per_node = total_rate / params.nodes
        self.n_per_node = n_ops // params.nodes
        self.duration = self.n_per_node / per_node
        self.t0, self.t1 = 0.1 * self.duration, 0.9 * self.duration
        self._cum = []
        acc = 0.0
        for op in SCI_OPS:
            acc += shares[op]
            self._cum.append(acc)
        self._cum[-1] = 1.0
        streams = spawn_streams(seed, params.nodes)
        self._seq = 0
        self.retries = 0
        self.done: list[_Op] = []
        self.sources = [
            PoissonSource(self.env, per_node, streams[i], self._emitter(i, streams[i]),
                          self.n_per_node)
            for i in range(params.nodes)]
        self._snap: dict[str, list[float]] = {}
        for name, t in (("t0", self.t0), ("t1", self.t1)):
            ev = Timeout(self.env, t, name)
            ev.callbacks.append(self._snapshot)

    def _emitter(self, i: int, stream: Stream):
        n = self.params.nodes

        def emit() -> None:
            kind = SCI_OPS[stream.pick(self._cum)]
            dst = (i + 1 + stream.below(n - 1)) % n
            self._seq += 1
            self.nodes[i].issue(_Op(kind, i, dst, self.env.now, self._seq))
        return emit

    def _snapshot(self, ev: Timeout) -> None:
        self._snap[ev.value] = list(self.fabric.busy_ns) + [sum(self.fabric.link_bytes)]

    def complete(self, op: _Op) -> None:
        op.t_done = self.env.now
        self.done.append(op)

    def run(self) -> PointResult:
        self.env.run()
        total_ops = self.n_per_node * self.params.nodes
        if len(self.done) != total_ops or self.fabric.in_flight:
            raise RuntimeError(f"SCI ring lost operations: {len(self.done)} of {total_ops} "
                               f"completed, {self.fabric.in_flight} packets in flight")
        t0, t1 = self.t0, self.t1
        span = t1 - t0
        lat: dict[str, list[float]] = {k: [] for k in SCI_OPS}
        comp = {k: 0 for k in SCI_OPS}
        for op in self.done:
            if t0 <= op.t_gen < t1:
                lat[op.kind].append(op.t_done - op.t_gen)
            if t0 <= op.t_done < t1:
                comp[op.kind] += 1
        ops_per_s = {k: comp[k] / span * 1e9 for k in SCI_OPS}
        mb = {k: ops_per_s[k] * OP_BYTES[k][2] / 1e6 for k in SCI_OPS}
        latency = {k: (sum(v) / len(v) if v else math.nan) for k, v in lat.items()}
        reads = sorted(lat["read"])
        p99 = reads[min(len(reads) - 1, int(0.99 * len(reads)))] if reads else math.nan
        s0, s1 = self._snap["t0"], self._snap["t1"]
        nl = len(self.fabric.busy_ns)
        util = [(s1[i] - s0[i]) / span for i in range(nl)]
        wire = (s1[nl] - s0[nl]) / span * 1e3 / nl  # bytes/ns -> MB/s, per link
        return PointResult(
            mix=self.mix.name, offered_read_mb_s=self.offered, read_mb_s=mb["read"],
            total_mb_s=sum(mb.values()), wire_mb_s_per_link=wire,
            link_util_mean=sum(util) / nl, link_util_max=max(util), ops_per_s=ops_per_s,
            latency_ns=latency, p99_read_ns=p99, retries=self.retries, ops=total_ops,
            sim_ns=self.env.now, events=self.env.events_processed)


def run_point(mix: str | SciMix, offered_read_mb_s: float, n_ops: int, seed: int,
              params: SciParams = SciParams()) -> PointResult:
    m = sci_mix(mix) if isinstance(mix, str) else mix
    return SciRing(m, offered_read_mb_s, n_ops, seed, params).run()


DEFAULT_SWEEP = (10, 25, 50, 75, 100, 125, 150, 175, 190, 200, 210, 220, 230, 240, 250, 260,
                 275, 300)


@dataclass
class Knee:
    zero_load_read_ns: float
    read_mb_s: float
    latency_ns: float
    total_mb_s: float
    wire_mb_s_per_link: float
    link_util_mean: float
    read_mb_s_at_400ns: float | None
    total_mb_s_at_400ns: float | None


def _interp(x0: float, x1: float, y0: float, y1: float, y: float) -> float:
    return x0 if y1 == y0 else x0 + (x1 - x0) * (y - y0) / (y1 - y0)


def find_knee(points: list[PointResult], zero_load_read_ns: float,
              factor: float = 2.0) -> Knee:
    """Where mean read latency first reaches ``factor`` x its unloaded value (and 400 ns)."""
    pts = sorted(points, key=lambda p: p.offered_read_mb_s)

    def cross(level: float) -> tuple[float, float, float, float] | None:
        for a, b in zip(pts, pts[1:]):
            la, lb = a.latency_ns["read"], b.latency_ns["read"]
            if la < level <= lb:
                f = (level - la) / (lb - la)
                return (a.read_mb_s + f * (b.read_mb_s - a.read_mb_s),
                        a.total_mb_s + f * (b.total_mb_s - a.total_mb_s),
                        a.wire_mb_s_per_link + f * (b.wire_mb_s_per_link - a.wire_mb_s_per_link),
                        a.link_util_mean + f * (b.link_util_mean - a.link_util_mean))
        return None

    level = factor * zero_load_read_ns
    k = cross(level)
    if k is None:
        raise ValueError(f"the sweep never reaches {level:.0f} ns mean read latency "
                         f"({factor} x the unloaded {zero_load_read_ns:.0f} ns); "
                         "extend it to higher loads")
    at400 = cross(400.0)
    return Knee(zero_load_read_ns, k[0], level, k[1], k[2], k[3],
                at400[0] if at400 else None, at400[1] if at400 else None)


# --------------------------------------------------------------------------------------------
# Section 6: from SCI traffic back to local bus traffic (Fig. 8)
# --------------------------------------------------------------------------------------------

PAPER_XR_MB_S = 50
FIG8_PFR = (25, 50, 75)   # rows, percent far references
FIG8_CHR = (25, 50, 75)   # columns, percent far-memory-cache hit rate
FIG8_PAPER = ((1070, 1600, 3200),
              (267, 400, 800),
              (118, 178, 355))


def bus_traffic(x_r: float, p_fr: float, chr_: float) -> dict[str, float]:
    """The paper's back-calculation, exactly as printed (all in MB/s, fractions in (0, 1)).

    X_F = X_R / (P_FR (1 - CHR)); X_L = X_F / P_FR * (1 - P_FR); X_BUS = X_F + X_L.

    Note that it divides by P_FR twice (X_BUS = X_R / (P_FR^2 (1 - CHR))). If X_R is the
    interconnect read traffic, i.e. the far references that miss the cache, the far bus
    traffic is X_R / (1 - CHR) and the whole bus X_R / (P_FR (1 - CHR)); that single-division
    figure is returned as ``x_bus_single`` (it is what :class:`nodes.BusReferenceSource`
    produces when simulated).
    """
    if not (0 < p_fr <= 1 and 0 <= chr_ < 1):
        raise ValueError(f"need 0 < P_FR <= 1 and 0 <= CHR < 1, got {p_fr}, {chr_}")
    x_f = x_r / (p_fr * (1 - chr_))
    x_l = x_f / p_fr * (1 - p_fr)
    return {"x_f": x_f, "x_l": x_l, "x_bus": x_f + x_l,
            "x_bus_single": x_r / (p_fr * (1 - chr_))}


def _trunc1(x: Fraction) -> Fraction:
    return Fraction(math.floor(x * 10), 10)


def _round3(x: Fraction) -> int:
    d = Decimal(x.numerator) / Decimal(x.denominator)
    exp = d.adjusted() - 2
    return int(d.scaleb(-exp).quantize(Decimal(1), rounding=ROUND_HALF_UP).scaleb(exp))


def fig8_cell(x_r: float, pfr_pct: int, chr_pct: int) -> int:
    """One Fig. 8 cell with the paper's arithmetic.

    The worked example in section 6 writes X_F = 88.8 for 50 / (0.75 * 0.75) = 88.89, i.e.
    the intermediate terms are truncated to 0.1 MB/s; the table then gives X_F + X_L to three
    significant figures (1066.4 -> 1070). Exact arithmetic rounded to three figures would give
    119 instead of 118 and 356 instead of 355.
    """
    p = Fraction(pfr_pct, 100)
    c = Fraction(chr_pct, 100)
    x_f = _trunc1(Fraction(x_r) / (p * (1 - c)))
    x_l = _trunc1(x_f / p * (1 - p))
    return _round3(x_f + x_l)


def fig8_table(x_r: float = PAPER_XR_MB_S) -> list[list[int]]:
    """Rows: far references 25/50/75 %; columns: cache hit rate 25/50/75 %; MB/s."""
    return [[fig8_cell(x_r, p, c) for c in FIG8_CHR] for p in FIG8_PFR]


def fig8_exact(x_r: float) -> list[list[float]]:
    """The same table without the paper's rounding (and for any X_R, e.g. a simulated knee)."""
    return [[bus_traffic(x_r, p / 100, c / 100)["x_bus"] for c in FIG8_CHR] for p in FIG8_PFR]


def params_dict(p: SciParams = SciParams()) -> dict:
    d = asdict(p)
    d.update({"header_bytes": HEADER_BYTES, "crc_bytes": CRC_BYTES, "idle_bytes": IDLE_BYTES,
              "echo_bytes": ECHO_BYTES,
              "packet_bytes": {k: [send_packet_bytes(v[0]), send_packet_bytes(v[1])]
                               for k, v in OP_BYTES.items()}})
    return d


__all__ = ["SciParams", "SciRing", "PointResult", "run_point", "find_knee", "Knee",
           "bus_traffic", "fig8_table", "fig8_exact", "fig8_cell", "FIG8_PAPER",
           "DEFAULT_SWEEP", "params_dict", "CountingEnvironment"]


def sweep(mix: str, n_ops: int | None, seed: int, loads: tuple[float, ...] = DEFAULT_SWEEP,
          sim_seconds: float | None = None, params: SciParams = SciParams()) -> dict:
    """Throughput/latency sweep of one mix, its knee, and the Fig. 8 tables.

    Each load point runs ``n_ops`` operations, or as many as ``sim_seconds`` of simulated
    time holds at that load. The unloaded read latency comes from a separate run at
    1 MB/s.
    """
    m = sci_mix(mix)
    if (n_ops is None) == (sim_seconds is None):
        raise ValueError("give exactly one of an operation count or simulated seconds")

    def ops_at(mb_s: float) -> int:
        if n_ops is not None:
            return n_ops
        rate = mb_s * 1e6 / (64 * m.shares()["read"])  # ops/s
        return max(10 * params.nodes, int(rate * sim_seconds))

    zero = run_point(m, 1.0, max(10 * params.nodes, min(2000, ops_at(1.0))), seed, params)
    points = [run_point(m, x, ops_at(x), seed + i + 1, params) for i, x in enumerate(loads)]
    knee = find_knee(points, zero.latency_ns["read"])
    per_node = knee.read_mb_s / params.nodes
    return {
        "mix": m.name, "mix_label": m.label, "mix_printed_percent": {
            op: getattr(m, op) for op in SCI_OPS},
        "mix_printed_total_percent": m.printed_total, "shares": m.shares(),
        "params": params_dict(params), "seed": seed,
        "knee_rule": "mean read latency = 2 x unloaded (linear interpolation)",
        "zero_load_read_ns": zero.latency_ns["read"],
        "knee_read_mb_s": knee.read_mb_s, "knee_read_mb_s_per_node": per_node,
        "knee_latency_ns": knee.latency_ns, "total_mb_s_at_knee": knee.total_mb_s,
        "wire_mb_s_per_link_at_knee": knee.wire_mb_s_per_link,
        "link_util_at_knee": knee.link_util_mean,
        "read_mb_s_at_400ns": knee.read_mb_s_at_400ns,
        "total_mb_s_at_400ns": knee.total_mb_s_at_400ns,
        "saturation_read_mb_s": max(p.read_mb_s for p in points),
        "paper": {"knee_read_mb_s": 200, "knee_read_mb_s_per_node": 50,
                  "knee_latency_ns": 400, "total_mb_s_at_knee": 400},
        "fig8": fig8_table(), "fig8_paper": [list(r) for r in FIG8_PAPER],
        "fig8_matches_paper": fig8_table() == [list(r) for r in FIG8_PAPER],
        "fig8_unrounded": fig8_exact(PAPER_XR_MB_S),
        "fig8_from_sim": fig8_exact(per_node),
        "fig8_single_division_from_sim": [
            [bus_traffic(per_node, p / 100, c / 100)["x_bus_single"] for c in FIG8_CHR]
            for p in FIG8_PFR],
        "events": zero.events + sum(p.events for p in points),
        "points": [p.as_dict() for p in points],
    }
