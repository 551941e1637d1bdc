"""Models of the nodes attached to a fabric: traffic generators, far-memory cache, servers.

What it models
--------------
* :class:`Stream` -- seeded random numbers (numpy PCG64), drawn in blocks for speed. Every
  generator and node gets its own stream spawned from one seed, so a run is a function of its
  seed alone (determinism is tested).
* :class:`PoissonSource` -- an open-loop traffic generator: operations arrive as a Poisson
  process of a given rate (or any inter-arrival law passed in); each arrival calls ``emit``.
  It stops after ``limit`` arrivals.
* :class:`FarMemoryCache` -- seed 003's far-memory cache (FMC) as a hit-rate filter: a far
  reference hits with probability ``hit_rate``, independently of the others (the paper gives a
  hit rate, not an address trace, so there is nothing to replay through an LRU).
* :class:`BusReferenceSource` -- the local system bus of one seed-003 node: references at a
  given rate, a fraction ``p_far`` of them to far memory, far references filtered by the FMC;
  each miss becomes an interconnect operation. It is the forward direction of the section-6
  back-calculation (``sci.bus_traffic``) and is used to check it.
* :class:`FifoServer` -- a first-come-first-served station with ``servers`` identical servers
  and a service time per job (a memory server's CPU or NIC, a timestamp oracle, a link
  modelled as one queue). Waiting times follow Lindley's recursion, computed when the job
  arrives; this is exact for FCFS as long as jobs are offered in arrival order, which a
  discrete-event simulation guarantees.

Time is in nanoseconds.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

import numpy as np
import simpy
from simpy.events import Timeout

_BLOCK = 4096


class Stream:
    """Block-buffered random numbers from one numpy Generator."""

    def __init__(self, seed: int | np.random.SeedSequence) -> None:
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._u = np.empty(0)
        self._ui = _BLOCK
        self._e = np.empty(0)
        self._ei = _BLOCK

    def uniform(self) -> float:
        if self._ui >= len(self._u):
            self._u = self.rng.random(_BLOCK)
            self._ui = 0
        v = self._u[self._ui]
        self._ui += 1
        return float(v)

    def exponential(self, mean: float) -> float:
        if self._ei >= len(self._e):
            self._e = self.rng.standard_exponential(_BLOCK)
            self._ei = 0
        v = self._e[self._ei]
        self._ei += 1
        return float(v) * mean

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        return min(int(self.uniform() * n), n - 1)

    def pick(self, cumulative: Sequence[float]) -> int:
        """Index i with probability cumulative[i] - cumulative[i-1] (cumulative[-1] == 1)."""
        u = self.uniform()
        for i, c in enumerate(cumulative):
            if u < c:
                return i
        return len(cumulative) - 1


def spawn_streams(seed: int, n: int) -> list[Stream]:
    """``n`` independent streams derived from one seed."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return [Stream(s) for s in np.random.SeedSequence(seed).spawn(n)]


class PoissonSource:
    """Calls ``emit()`` at the arrival instants of a Poisson process of ``rate`` per ns.

    ``interarrival`` overrides the law (a callable returning the next gap in ns). The source
    stops after ``limit`` arrivals; ``emitted`` counts them.
    """

    def __init__(self, env: simpy.Environment, rate: float, stream: Stream,
                 emit: Callable[[], None], limit: int,
                 interarrival: Callable[[], float] | None = None) -> None:
        if rate <= 0 and interarrival is None:
            raise ValueError(f"arrival rate must be positive, got {rate} per ns")
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.env = env
        self.emit = emit
        self.limit = limit
        self.emitted = 0
        mean = 1.0 / rate if rate > 0 else 0.0
        self._gap = interarrival or (lambda: stream.exponential(mean))
        if limit:
            self._schedule()

    def _schedule(self) -> None:
        ev = Timeout(self.env, self._gap())
        ev.callbacks.append(self._fire)

    def _fire(self, _ev: Timeout) -> None:
        self.emitted += 1
        self.emit()
        if self.emitted < self.limit:
            self._schedule()


class FarMemoryCache:
    """Far-memory cache as a Bernoulli filter with a fixed hit rate."""

    def __init__(self, hit_rate: float, stream: Stream) -> None:
        if not 0.0 <= hit_rate < 1.0:
            raise ValueError(f"cache hit rate must be in [0, 1), got {hit_rate}")
        self.hit_rate = hit_rate
        self.stream = stream
        self.hits = 0
        self.misses = 0

    def lookup(self) -> bool:
        """One far reference; True on a hit."""
        if self.stream.uniform() < self.hit_rate:
            self.hits += 1
            return True
        self.misses += 1
        return False


class BusReferenceSource:
    """References on one node's local bus; far misses go out as interconnect operations.

    ``rate`` is bus references per ns. Each reference is far with probability ``p_far``; a
    far reference that misses in ``cache`` calls ``on_miss()``. Counters: ``references``,
    ``far``, ``local``.
    """

    def __init__(self, env: simpy.Environment, rate: float, p_far: float,
                 cache: FarMemoryCache, stream: Stream, on_miss: Callable[[], None],
                 limit: int) -> None:
        if not 0.0 < p_far <= 1.0:
            raise ValueError(f"fraction of far references must be in (0, 1], got {p_far}")
        self.p_far = p_far
        self.cache = cache
        self.stream = stream
        self.on_miss = on_miss
        self.references = 0
        self.far = 0
        self.local = 0
        self.source = PoissonSource(env, rate, stream, self._reference, limit)

    def _reference(self) -> None:
        self.references += 1
        if self.stream.uniform() < self.p_far:
            self.far += 1
            if not self.cache.lookup():
                self.on_miss()
        else:
            self.local += 1


class FifoServer:
    """FCFS station with ``servers`` identical servers; :meth:`delay` books one job.

    ``delay(service_ns)`` returns the job's time in the station (wait + service) for a job
    arriving now. ``busy_ns`` accumulates booked service time (some of it may still lie
    ahead; :meth:`done_ns` is what has been served by now); ``jobs`` counts jobs.
    """

    def __init__(self, env: simpy.Environment, servers: int = 1, name: str = "") -> None:
        if servers < 1:
            raise ValueError(f"{name or 'server'}: needs at least one server, got {servers}")
        self.env = env
        self.name = name
        self.servers = servers
        self._free = [0.0] * servers  # heap of instants each server becomes free
        self.busy_ns = 0.0
        self.jobs = 0
        self.wait_ns = 0.0

    def delay(self, service_ns: float) -> float:
        now = self.env.now
        free = self._free[0]
        start = free if free > now else now
        end = start + service_ns
        heapq.heapreplace(self._free, end)
        self.busy_ns += service_ns
        self.jobs += 1
        self.wait_ns += start - now
        return end - now

    def done_ns(self) -> float:
        """Service actually performed by now (booked service minus the backlog still ahead).

        Every booking was made for a job that had arrived, so each server is busy without a
        gap from now until its free instant; the backlog is exactly the time left to those.
        """
        now = self.env.now
        return self.busy_ns - sum(f - now for f in self._free if f > now)

    def utilisation(self, elapsed_ns: float) -> float:
        """Share of ``elapsed_ns`` (ending now, starting at 0) the servers spent serving."""
        if elapsed_ns <= 0:
            raise ValueError(f"elapsed time must be positive, got {elapsed_ns} ns")
        return self.done_ns() / (elapsed_ns * self.servers)
