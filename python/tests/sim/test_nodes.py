"""Node building blocks: FCFS stations, streams, the far-memory cache."""

import pytest
import simpy

from farpool.sim.nodes import FarMemoryCache, FifoServer, Stream, spawn_streams


def test_fifo_server_lindley_and_work_done():
    env = simpy.Environment()
    srv = FifoServer(env, 1)
    assert [srv.delay(10.0) for _ in range(3)] == [10.0, 20.0, 30.0]  # queued behind
    env.run(until=15)
    assert srv.done_ns() == pytest.approx(15.0)  # 30 ns booked, 15 ns still ahead
    env.run(until=100)
    assert srv.done_ns() == pytest.approx(30.0)
    assert srv.utilisation(100.0) == pytest.approx(0.3)


def test_fifo_multi_server_takes_the_first_free():
    env = simpy.Environment()
    srv = FifoServer(env, 2)
    assert [srv.delay(10.0) for _ in range(4)] == [10.0, 10.0, 20.0, 20.0]
    with pytest.raises(ValueError, match="at least one server"):
        FifoServer(env, 0)


def test_streams_are_reproducible_and_independent():
    a1, b1 = spawn_streams(3, 2)
    a2, _ = spawn_streams(3, 2)
    xs = [a1.uniform() for _ in range(5000)]
    assert xs == [a2.uniform() for _ in range(5000)]
    assert xs[:10] != [b1.uniform() for _ in range(10)]
    s = Stream(1)
    assert sum(s.exponential(2.0) for _ in range(20000)) / 20000 == pytest.approx(2.0, rel=0.03)
    assert all(0 <= s.below(7) < 7 for _ in range(1000))
    with pytest.raises(ValueError, match="seed"):
        spawn_streams(-1, 1)


def test_far_memory_cache_hit_rate():
    fmc = FarMemoryCache(0.75, Stream(5))
    hits = sum(fmc.lookup() for _ in range(20000))
    assert hits / 20000 == pytest.approx(0.75, abs=0.01)
    assert fmc.hits + fmc.misses == 20000
    with pytest.raises(ValueError, match="hit rate"):
        FarMemoryCache(1.0, Stream(5))
