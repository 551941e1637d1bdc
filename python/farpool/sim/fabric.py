"""Packet-level model of an interconnect fabric: links, buffers, back-pressure, topologies.

What it models
--------------
* **Links** are unidirectional. Each has a bandwidth (bytes per ns, i.e. GB/s), a propagation
  delay, and a per-hop delay charged at the router the link enters (SCI's node bypass delay, a
  switch's forwarding latency). A link transmits one packet at a time, non-preemptively.
* **Buffers.** Every link ends in an input buffer at its downstream router, one per virtual
  channel (VC), holding ``buffer_pkts`` packets. A packet occupies a slot from the moment its
  transmission on the link starts until its tail has left on the next link (or, at the last
  hop, until it has been fully received by the endpoint). Three policies:

  - ``"credit"`` -- lossless, credit-based back-pressure: a link starts a packet only when the
    downstream buffer has room, so a full buffer stalls the upstream link, and so on back to
    the sender (InfiniBand, CXL, SCI's ring flow control in spirit).
  - ``"drop"`` -- tail drop: the packet is transmitted and discarded at a full buffer; it is
    counted in ``dropped`` and reported to ``on_drop`` (lossy Ethernet).
  - ``"elastic"`` -- unbounded buffers. Used for SCI's bypass FIFO, which the SCI protocol
    guarantees never overflows (a node may insert only when its bypass FIFO is empty), and for
    the queueing tests that compare a link with M/M/1 and M/D/1.
* **Routers** forward cut-through (a packet may leave once its head has arrived and the hop
  delay has passed; all links of one fabric share one bandwidth, so its tail follows) or
  store-and-forward (``cut_through=False``: the whole packet is received first).
* **Topologies**: SCI-style unidirectional ring, 2D/3D (any-D) mesh and torus with
  dimension-order routing, a single switch, and a two-level fat tree (leaf/spine folded Clos
  with destination-mod-k spine choice). Endpoint ``i`` is router ``i``; switches are extra
  routers numbered after the endpoints.

Assumptions and simplifications
-------------------------------
* Arbitration at each output link: packets already in the network (transit) go before
  packets being injected -- SCI's "bypass FIFO first" rule and the usual router rule --, and
  within each class the higher VC goes first (callers put responses on the higher VC), then
  FIFO. Packets waiting for one output never block packets for another (virtual output
  queues), so head-of-line blocking exists only per (output link, VC, class). Under bubble
  flow control (below) packets entering a ring queue apart from those circulating in it.
* Endpoints always accept a delivered packet. End-to-end flow control (SCI's busy echo, a
  memory server's queue) belongs to the node models (``sci.py``, ``nodes.py``).
* Deadlock freedom: meshes use dimension-order routing and the fat tree up/down routing, both
  free of cyclic buffer dependencies. Rings and tori have cycles; under ``"credit"`` they use
  bubble flow control: a packet entering a ring dimension (injected, or turning from another
  dimension) needs two free slots, one continuing along the ring needs one. Requests and
  responses must travel on different VCs when a node's reply depends on receiving a request
  (protocol deadlock); the node models do that.
* A packet sent to its own endpoint is delivered at once without touching the fabric.
* Idle symbols, link-level retries after bit errors and clock-domain elasticity buffers are
  not modelled.

Time is in nanoseconds, sizes in bytes. The model is deterministic: it draws no random
numbers; callers' packets and their send times decide everything.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import simpy
from simpy.events import Timeout

POLICIES = ("credit", "drop", "elastic")


class Packet:
    """One packet in flight. ``payload`` is free for the node models (the operation it carries)."""

    __slots__ = (
        "pid", "src", "dst", "size", "vc", "kind", "payload", "t_sent", "t_delivered",
        "route", "hop", "holding", "dropped",
    )

    def __init__(self, src: int, dst: int, size: float, *, vc: int = 0, kind: str = "",
                 payload: Any = None) -> None:
        if size <= 0:
            raise ValueError(f"packet size must be positive, got {size} bytes")
        self.pid = -1
        self.src = src
        self.dst = dst
        self.size = size
        self.vc = vc
        self.kind = kind
        self.payload = payload
        self.t_sent = 0.0
        self.t_delivered = -1.0
        self.route: tuple[int, ...] = ()
        self.hop = 0
        self.holding = -1
        self.dropped = False

    def __repr__(self) -> str:
        return (f"Packet(pid={self.pid}, {self.kind or 'pkt'} {self.src}->{self.dst}, "
                f"{self.size} B, vc={self.vc}, hop={self.hop}/{len(self.route)})")


# --------------------------------------------------------------------------------------------
# Topologies
# --------------------------------------------------------------------------------------------

class Topology:
    """Routers, unidirectional links between them, and a deterministic route for each pair.

    ``links[i] = (src_router, dst_router, dim)``; ``dim`` is the ring dimension a link belongs
    to (ring: 0, torus: its dimension) or -1 when the link is not part of a wrap-around ring.
    Endpoint ``e`` is attached to router ``e``.
    """

    name = "topology"

    def __init__(self, n_endpoints: int, n_routers: int) -> None:
        if n_endpoints < 1:
            raise ValueError(f"{self.name}: needs at least one endpoint, got {n_endpoints}")
        self.n_endpoints = n_endpoints
        self.n_routers = n_routers
        self.links: list[tuple[int, int, int]] = []
        self._link_of: dict[tuple[int, int, int], int] = {}

    @property
    def wraps(self) -> bool:
        """True if some link is part of a wrap-around ring (bubble flow control applies)."""
        return any(dim >= 0 for _, _, dim in self.links)

    def _add_link(self, src: int, dst: int, dim: int = -1, tag: int = 0) -> int:
        key = (src, dst, tag)
        if key in self._link_of:
            raise ValueError(f"{self.name}: duplicate link {src}->{dst} (tag {tag})")
        self._link_of[key] = len(self.links)
        self.links.append((src, dst, dim))
        return self._link_of[key]

    def _check_pair(self, src: int, dst: int) -> None:
        n = self.n_endpoints
        if not (0 <= src < n and 0 <= dst < n):
            raise ValueError(f"{self.name}: endpoints must be in [0, {n}), got {src}->{dst}")

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link ids from endpoint ``src`` to endpoint ``dst`` (empty when ``src == dst``)."""
        raise NotImplementedError

    def hops(self, src: int, dst: int) -> int:
        return len(self.route(src, dst))

    def mean_hops(self) -> float:
        """Mean route length over all ordered pairs of distinct endpoints."""
        n = self.n_endpoints
        if n < 2:
            return 0.0
        total = sum(self.hops(s, d) for s in range(n) for d in range(n) if s != d)
        return total / (n * (n - 1))

    def describe(self) -> str:
        return f"{self.name} ({self.n_endpoints} endpoints, {len(self.links)} links)"


class Ring(Topology):
    """SCI-style unidirectional ring: link ``i`` goes from node ``i`` to node ``i+1 mod n``."""

    name = "ring"

    def __init__(self, n: int) -> None:
        if n < 2:
            raise ValueError(f"ring: needs at least 2 nodes, got {n}")
        super().__init__(n, n)
        for i in range(n):
            self._add_link(i, (i + 1) % n, dim=0)

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        self._check_pair(src, dst)
        n = self.n_endpoints
        return tuple((src + k) % n for k in range((dst - src) % n))


class Mesh(Topology):
    """k-ary n-dimensional mesh (``torus=True``: with wrap-around links), dimension-order routing.

    ``dims=(16, 16)`` is a 16x16 2D mesh, ``(6, 6, 6)`` a 6x6x6 3D mesh. Router ids are
    mixed-radix coordinates with dimension 0 varying fastest. Links are bidirectional pairs. In
    a torus a packet takes the shorter way round each dimension (ties go the positive way).
    """

    def __init__(self, dims: Sequence[int], torus: bool = False) -> None:
        dims = tuple(int(k) for k in dims)
        self.name = f"{'torus' if torus else 'mesh'}{len(dims)}d_{'x'.join(map(str, dims))}"
        if not dims or any(k < 1 for k in dims):
            raise ValueError(f"{self.name}: every dimension needs at least 1 node, got {dims}")
        n = 1
        for k in dims:
            n *= k
        super().__init__(n, n)
        self.dims = dims
        self.torus = torus
        self._stride = []
        s = 1
        for k in dims:
            self._stride.append(s)
            s *= k
        for r in range(n):
            c = self.coords(r)
            for d, k in enumerate(dims):
                if k < 2:
                    continue
                for step in (+1, -1):
                    nc = c[d] + step
                    if not 0 <= nc < k:
                        if not torus:
                            continue
                        nc %= k
                    dst = r + (nc - c[d]) * self._stride[d]
                    self._add_link(r, dst, dim=d if torus else -1, tag=step)

    def coords(self, r: int) -> tuple[int, ...]:
        return tuple((r // s) % k for s, k in zip(self._stride, self.dims))

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        self._check_pair(src, dst)
        out = []
        cur = src
        cs, cd = self.coords(src), self.coords(dst)
        for d, k in enumerate(self.dims):
            delta = cd[d] - cs[d]
            if delta == 0:
                continue
            if self.torus:
                fwd = delta % k
                step, count = (+1, fwd) if fwd <= k - fwd else (-1, k - fwd)
            else:
                step, count = (1 if delta > 0 else -1), abs(delta)
            for _ in range(count):
                c = (cur // self._stride[d]) % k
                nc = (c + step) % k
                nxt = cur + (nc - c) * self._stride[d]
                out.append(self._link_of[(cur, nxt, step)])
                cur = nxt
        return tuple(out)

    def mean_hops(self) -> float:
        # Dimension-order routes are minimal, so the mean is the sum of per-dimension means.
        n = self.n_endpoints
        if n < 2:
            return 0.0
        total = 0.0
        for k in self.dims:
            if self.torus:
                per = sum(min(d, k - d) for d in range(k)) / k
            else:
                per = (k * k - 1) / (3 * k)
            total += per
        return total * n / (n - 1)  # the per-dimension means include src == dst pairs


class Switch(Topology):
    """Single switch (router ``n``) with a host link in each direction per endpoint."""

    name = "switch"

    def __init__(self, n: int) -> None:
        super().__init__(n, n + 1)
        self._up = [self._add_link(h, n) for h in range(n)]
        self._down = [self._add_link(n, h) for h in range(n)]

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        self._check_pair(src, dst)
        return () if src == dst else (self._up[src], self._down[dst])


class FatTree(Topology):
    """Two-level fat tree (folded Clos): hosts -> leaf switches -> spine switches.

    ``hosts_per_leaf`` hosts hang off each leaf; every leaf has one link to every spine in each
    direction. With ``spines == hosts_per_leaf`` the tree is non-blocking (full bisection).
    Traffic between leaves goes up to spine ``dst mod spines`` (deterministic d-mod-k routing).
    """

    name = "fattree"

    def __init__(self, n: int, hosts_per_leaf: int, spines: int | None = None) -> None:
        if hosts_per_leaf < 1:
            raise ValueError(f"fattree: hosts_per_leaf must be >= 1, got {hosts_per_leaf}")
        spines = hosts_per_leaf if spines is None else spines
        if spines < 1:
            raise ValueError(f"fattree: spines must be >= 1, got {spines}")
        leaves = -(-n // hosts_per_leaf)
        super().__init__(n, n + leaves + spines)
        self.hosts_per_leaf, self.leaves, self.spines = hosts_per_leaf, leaves, spines
        leaf0, spine0 = n, n + leaves
        self._up = [self._add_link(h, leaf0 + h // hosts_per_leaf) for h in range(n)]
        self._down = [self._add_link(leaf0 + h // hosts_per_leaf, h) for h in range(n)]
        self._ls = [[self._add_link(leaf0 + l, spine0 + s) for s in range(spines)]
                    for l in range(leaves)]
        self._sl = [[self._add_link(spine0 + s, leaf0 + l) for l in range(leaves)]
                    for s in range(spines)]

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        self._check_pair(src, dst)
        if src == dst:
            return ()
        ls, ld = src // self.hosts_per_leaf, dst // self.hosts_per_leaf
        if ls == ld:
            return (self._up[src], self._down[dst])
        s = dst % self.spines
        return (self._up[src], self._ls[ls][s], self._sl[s][ld], self._down[dst])


def make_topology(spec: str) -> Topology:
    """Build a topology from a short spec.

    ``ring:4``, ``mesh:16x16``, ``mesh:6x6x6``, ``torus:8x8``, ``switch:32``,
    ``fattree:512:16`` (hosts, hosts per leaf; spines = hosts per leaf) or
    ``fattree:512:16:8`` (with 8 spines).
    """
    kind, _, rest = spec.partition(":")
    try:
        if kind == "ring":
            return Ring(int(rest))
        if kind in ("mesh", "torus"):
            return Mesh([int(x) for x in rest.split("x")], torus=(kind == "torus"))
        if kind == "switch":
            return Switch(int(rest))
        if kind == "fattree":
            parts = [int(x) for x in rest.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError("expected fattree:HOSTS:HOSTS_PER_LEAF[:SPINES]")
            return FatTree(*parts)
    except ValueError as e:
        raise ValueError(f"bad topology spec {spec!r}: {e}") from None
    raise ValueError(f"bad topology spec {spec!r}: unknown kind {kind!r} "
                     "(ring, mesh, torus, switch, fattree)")


# --------------------------------------------------------------------------------------------
# The fabric
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LinkParams:
    """Parameters shared by every link of a fabric."""

    bandwidth: float          # bytes per ns (= GB/s)
    prop_ns: float = 0.0      # propagation delay of the wire
    hop_ns: float = 0.0       # bypass / switch delay at the router the link enters
    buffer_pkts: int = 3      # input buffer per link and VC, packets
    policy: str = "credit"    # "credit", "drop" or "elastic"
    vcs: int = 1              # virtual channels
    cut_through: bool = True

    def __post_init__(self) -> None:
        if self.bandwidth <= 0:
            raise ValueError(f"link bandwidth must be positive, got {self.bandwidth} bytes/ns")
        if self.prop_ns < 0 or self.hop_ns < 0:
            raise ValueError(f"delays must be >= 0, got prop {self.prop_ns} ns, "
                             f"hop {self.hop_ns} ns")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown buffer policy {self.policy!r}; use one of {POLICIES}")
        if self.policy != "elastic" and self.buffer_pkts < 1:
            raise ValueError(f"buffer_pkts must be >= 1, got {self.buffer_pkts}")
        if self.vcs < 1:
            raise ValueError(f"need at least one virtual channel, got {self.vcs}")


class Fabric:
    """A topology made of links with the given parameters, running on a SimPy environment.

    Nodes register a handler per endpoint with :meth:`attach` and call :meth:`send`.
    Counters: ``sent``, ``delivered``, ``dropped`` (``sent == delivered + dropped +
    in_flight`` at every instant), per-link ``busy_ns``, ``link_bytes`` and ``link_pkts``.
    """

    def __init__(self, env: simpy.Environment, topology: Topology, params: LinkParams,
                 on_drop: Callable[[Packet], None] | None = None) -> None:
        self.env = env
        self.topo = topology
        self.p = params
        self.on_drop = on_drop
        nl = len(topology.links)
        v = params.vcs
        self._busy = [False] * nl
        self._transit = [[deque() for _ in range(v)] for _ in range(nl)]
        self._entering_q = [[deque() for _ in range(v)] for _ in range(nl)]
        self._inject = [[deque() for _ in range(v)] for _ in range(nl)]
        self._occ = [[0] * v for _ in range(nl)]
        self._dim = [dim for _, _, dim in topology.links]
        self._bubble = params.policy == "credit" and topology.wraps
        if self._bubble and params.buffer_pkts < 2:
            raise ValueError(f"{topology.describe()}: bubble flow control on rings and tori "
                             f"needs buffers of at least 2 packets, got {params.buffer_pkts}")
        # Service order per link: (queues, credits needed). Under bubble flow control a
        # packet entering a ring waits in its own queue for two free slots, so it never
        # blocks the packets already circulating, which need one.
        ring = [self._bubble and d >= 0 for d in self._dim]
        self._order = [((self._transit[i], 1), (self._entering_q[i], 2 if ring[i] else 1),
                        (self._inject[i], 2 if ring[i] else 1)) for i in range(nl)]
        self._ring = ring
        self._vc_order = tuple(range(v - 1, -1, -1))
        self._tx_ns = 1.0 / params.bandwidth
        self._handlers: list[Callable[[Packet], None] | None] = [None] * topology.n_endpoints
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._pid = itertools.count()
        self.sent = 0
        self.delivered = 0
        self.dropped = 0
        self.busy_ns = [0.0] * nl
        self.link_bytes = [0.0] * nl
        self.link_pkts = [0] * nl
        self.max_occ = [0] * nl

    # ---- public API ------------------------------------------------------------------------

    def attach(self, endpoint: int, handler: Callable[[Packet], None]) -> None:
        """Call ``handler(pkt)`` for every packet delivered to ``endpoint``."""
        if not 0 <= endpoint < self.topo.n_endpoints:
            raise ValueError(f"no endpoint {endpoint} in {self.topo.describe()}")
        self._handlers[endpoint] = handler

    @property
    def in_flight(self) -> int:
        return self.sent - self.delivered - self.dropped

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self.topo.route(src, dst)
            if len(self._routes) < 1_000_000:
                self._routes[key] = r
        return r

    def send(self, pkt: Packet, transit: bool = False) -> None:
        """Hand ``pkt`` to the router of ``pkt.src``.

        ``transit=True`` queues it with the packets already in the network (SCI echoes, which
        take the place of the send packet they answer) instead of behind the node's own
        injections. Sending the same Packet object again (a retry) is allowed once it has
        been delivered or dropped.
        """
        if not 0 <= pkt.vc < self.p.vcs:
            raise ValueError(f"{pkt!r}: vc must be in [0, {self.p.vcs})")
        if self._handlers[pkt.dst] is None:
            raise ValueError(f"{pkt!r}: endpoint {pkt.dst} has no handler attached")
        pkt.pid = next(self._pid)
        pkt.route = self.route(pkt.src, pkt.dst)
        pkt.hop = 0
        pkt.holding = -1
        pkt.dropped = False
        pkt.t_sent = self.env.now
        pkt.t_delivered = -1.0
        self.sent += 1
        if not pkt.route:
            ev = Timeout(self.env, 0.0, pkt)
            ev.callbacks.append(self._on_local)
            return
        link = pkt.route[0]
        if not transit:
            self._inject[link][pkt.vc].append(pkt)
        elif self._ring[link]:
            self._entering_q[link][pkt.vc].append(pkt)
        else:
            self._transit[link][pkt.vc].append(pkt)
        self._kick(link)

    def utilisation(self, elapsed_ns: float) -> list[float]:
        """Fraction of ``elapsed_ns`` each link spent transmitting."""
        if elapsed_ns <= 0:
            raise ValueError(f"elapsed time must be positive, got {elapsed_ns} ns")
        return [b / elapsed_ns for b in self.busy_ns]

    # ---- machinery -------------------------------------------------------------------------

    def _kick(self, link: int) -> None:
        """Start the next eligible packet on an idle link."""
        if self._busy[link]:
            return
        credit = self.p.policy == "credit"
        free = [self.p.buffer_pkts - o for o in self._occ[link]]
        for queues, need in self._order[link]:
            for vc in self._vc_order:
                q = queues[vc]
                if q and (not credit or free[vc] >= need):
                    self._start(link, q.popleft())
                    return
                # else: a slot freeing in this buffer kicks this link again

    def _entering(self, pkt: Packet, link: int) -> bool:
        """True if ``pkt`` enters the ring dimension of ``link`` there (bubble rule)."""
        h = pkt.hop
        return h == 0 or self._dim[pkt.route[h - 1]] != self._dim[link]

    def _start(self, link: int, pkt: Packet) -> None:
        p = self.p
        tx = pkt.size * self._tx_ns
        self._busy[link] = True
        self.busy_ns[link] += tx
        self.link_bytes[link] += pkt.size
        self.link_pkts[link] += 1
        prev = pkt.holding
        vc = pkt.vc
        occ = self._occ[link]
        if p.policy == "drop" and occ[vc] >= p.buffer_pkts:
            pkt.dropped = True
            pkt.holding = -1
        else:
            if p.policy != "elastic":
                occ[vc] += 1
                if occ[vc] > self.max_occ[link]:
                    self.max_occ[link] = occ[vc]
            pkt.holding = link
        end = Timeout(self.env, tx, (link, prev, vc))
        end.callbacks.append(self._on_end_tx)
        if pkt.dropped:
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(pkt)
            return
        last = pkt.hop == len(pkt.route) - 1
        if last:
            ev = Timeout(self.env, p.prop_ns + tx, pkt)
            ev.callbacks.append(self._on_deliver)
        else:
            # Cut-through: the head may leave after the hop delay. All links of a fabric share
            # one bandwidth, so the tail can never be overtaken.
            extra = 0.0 if p.cut_through else tx
            ev = Timeout(self.env, p.prop_ns + p.hop_ns + extra, pkt)
            ev.callbacks.append(self._on_arrive)

    def _on_end_tx(self, ev: Timeout) -> None:
        link, prev, vc = ev.value
        self._busy[link] = False
        if prev >= 0 and self.p.policy != "elastic":
            self._occ[prev][vc] -= 1
            self._kick(prev)
        self._kick(link)

    def _on_arrive(self, ev: Timeout) -> None:
        pkt = ev.value
        pkt.hop += 1
        link = pkt.route[pkt.hop]
        if self._ring[link] and self._entering(pkt, link):
            self._entering_q[link][pkt.vc].append(pkt)
        else:
            self._transit[link][pkt.vc].append(pkt)
        self._kick(link)

    def _on_deliver(self, ev: Timeout) -> None:
        pkt = ev.value
        link = pkt.holding
        pkt.holding = -1
        if self.p.policy != "elastic":
            self._occ[link][pkt.vc] -= 1
            self._kick(link)
        self._finish(pkt)

    def _on_local(self, ev: Timeout) -> None:
        self._finish(ev.value)

    def _finish(self, pkt: Packet) -> None:
        pkt.t_delivered = self.env.now
        self.delivered += 1
        self._handlers[pkt.dst](pkt)
