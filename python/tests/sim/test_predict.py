"""Cluster prediction: small runs, saturation bounds, determinism."""

import pytest

from farpool.sim.predict import ClusterParams, analytic_bounds, run_prediction
from farpool.sim.txn import Workload


def test_unloaded_read_is_about_two_microseconds():
    assert ClusterParams(8).unloaded_read_ns() == pytest.approx(1965, abs=10)


def test_vector_timestamp_bound_is_the_vector_read_on_node_0():
    p = ClusterParams(64)
    b = analytic_bounds(p, "pool", Workload("tpcb", 64, 512), "vector")
    vector = 8 * 64 * 8 + p.header_bytes
    assert b["timestamp_source"] == pytest.approx(p.bytes_per_ns / vector * 1e9)
    c = analytic_bounds(p, "pool", Workload("tpcb", 64, 512), "counter")
    assert c["timestamp_source"] == pytest.approx(5e6)


def test_saturated_vector_run_stays_under_its_bound_and_fills_the_link():
    p = ClusterParams(64, threads=8)
    r = run_prediction(p, "pool", "bank", commits=6000, seed=3)
    assert r.saturates_on == "timestamp_source"
    # every attempt (commit or abort) reads the vector once
    attempts = r.tps / (1 - r.abort_rate)
    assert attempts <= r.bounds_tps["timestamp_source"] * 1.02
    assert r.utilisation["link_out"] > 0.9


def test_sharded_oracle_saturates_cpu():
    r = run_prediction(ClusterParams(8, threads=8), "sharded", "bank", commits=4000, seed=3)
    assert r.utilisation["cpu"] > 0.9
    assert r.tps < r.bounds_tps["timestamp_source"] * 1.02


def test_prediction_is_deterministic():
    p = ClusterParams(8, threads=2)
    a = run_prediction(p, "pool", "tpcb", commits=1500, seed=9).as_dict()
    b = run_prediction(p, "pool", "tpcb", commits=1500, seed=9).as_dict()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_bad_arguments():
    with pytest.raises(ValueError, match="design"):
        run_prediction(ClusterParams(8), "nam", "tpcb", commits=100)
    with pytest.raises(ValueError, match="workload"):
        run_prediction(ClusterParams(8), "pool", "tpcc", commits=100)
    with pytest.raises(ValueError, match="nodes"):
        ClusterParams(0)
