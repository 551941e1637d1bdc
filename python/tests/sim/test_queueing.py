"""A single fabric link against queueing theory: M/M/1 and M/D/1 mean waiting times.

Packets arrive as a Poisson process on a 1 byte/ns link with an unbounded buffer; their
sizes are exponential (M/M/1) or fixed (M/D/1). The waiting time is delivery time minus send
time minus the transmission time. Closed forms: W = rho S / (1 - rho) for M/M/1 and
W = rho S / (2 (1 - rho)) for M/D/1, S the mean service time. The packet counts were chosen
from the spread over eight seeds (largest deviation 2.7 % for M/M/1 at rho 0.7 with 500k
packets) so that the tolerances sit several standard deviations out.
"""

import pytest
import simpy

from farpool.sim.fabric import Fabric, LinkParams, Packet, Ring
from farpool.sim.nodes import PoissonSource, spawn_streams

MEAN_BYTES = 100.0  # 100 ns of service on a 1 byte/ns link


def mean_wait(rho: float, n: int, seed: int, exponential: bool) -> float:
    env = simpy.Environment()
    fab = Fabric(env, Ring(2), LinkParams(bandwidth=1.0, policy="elastic"))
    waits = []
    fab.attach(1, lambda p: waits.append(p.t_delivered - p.t_sent - p.size))
    fab.attach(0, lambda p: None)
    arrivals, sizes = spawn_streams(seed, 2)
    size = (lambda: sizes.exponential(MEAN_BYTES)) if exponential else (lambda: MEAN_BYTES)
    PoissonSource(env, rho / MEAN_BYTES, arrivals, lambda: fab.send(Packet(0, 1, size())), n)
    env.run()
    assert len(waits) == n
    w = waits[n // 10:]  # drop the warm-up from an empty queue
    return sum(w) / len(w)


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7])
def test_mm1_waiting_time(rho):
    expected = rho * MEAN_BYTES / (1 - rho)
    got = mean_wait(rho, 500_000, seed=11, exponential=True)
    assert got == pytest.approx(expected, rel=0.05), (rho, got, expected)


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7])
def test_md1_waiting_time(rho):
    expected = rho * MEAN_BYTES / (2 * (1 - rho))
    got = mean_wait(rho, 300_000, seed=12, exponential=False)
    assert got == pytest.approx(expected, rel=0.04), (rho, got, expected)


def test_md1_is_half_of_mm1():
    # Same load, same seeds: deterministic service halves the wait (Pollaczek-Khinchine).
    mm1 = mean_wait(0.5, 200_000, seed=5, exponential=True)
    md1 = mean_wait(0.5, 200_000, seed=5, exponential=False)
    assert md1 / mm1 == pytest.approx(0.5, rel=0.08)
