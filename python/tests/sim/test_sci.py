"""Seed 003: Fig. 8 exactly, the section-6 formula, mixes, the ring's latency and determinism."""

import pytest
import simpy

from farpool.sim import sci
from farpool.sim.mixes import SCI_MIXES, TABLE1_PER_TXN, sci_mix
from farpool.sim.nodes import BusReferenceSource, FarMemoryCache, spawn_streams

# Fig. 8 as printed in the paper (MB/s): rows far references 25/50/75 %, columns cache hit
# rate 25/50/75 %. Typed in here from the paper, independently of sci.FIG8_PAPER.
PAPER_FIG8 = [[1070, 1600, 3200],
              [267, 400, 800],
              [118, 178, 355]]


def test_fig8_table_exact():
    assert sci.fig8_table(50) == PAPER_FIG8


def test_fig8_needs_the_papers_truncation():
    # Exact arithmetic rounded to three figures misses two cells; the table is only exact
    # with the intermediate terms truncated to 0.1 MB/s, as in the worked example.
    exact = [[round(float(f"{x:.3g}")) for x in row] for row in sci.fig8_exact(50)]
    assert exact != PAPER_FIG8
    assert exact[2][0] == 119 and exact[2][2] == 356


def test_section6_worked_example():
    # "for X_R = 50 MB/sec, CHR = 25% and P_FR = 75%: X_F = 88.8, X_L = 29.6, X_BUS = 118"
    b = sci.bus_traffic(50, 0.75, 0.25)
    assert b["x_f"] == pytest.approx(88.89, abs=0.01)
    assert b["x_l"] == pytest.approx(29.63, abs=0.01)
    assert b["x_bus"] == pytest.approx(118.5, abs=0.1)
    # The formula divides by P_FR twice; the single-division figure is smaller by P_FR.
    assert b["x_bus_single"] == pytest.approx(b["x_bus"] * 0.75)
    with pytest.raises(ValueError):
        sci.bus_traffic(50, 0, 0.25)


def test_bus_source_matches_single_division_back_calculation():
    # Simulate a node's bus: the interconnect read rate it produces, put through the
    # section-6 model, must give back the bus rate -- with one division by P_FR.
    env = simpy.Environment()
    s_bus, s_fmc = spawn_streams(9, 2)
    misses = []
    fmc = FarMemoryCache(0.25, s_fmc)
    bus = BusReferenceSource(env, 1.0, 0.75, fmc, s_bus, lambda: misses.append(env.now),
                             200_000)
    env.run()
    x_r = len(misses) / env.now  # per ns
    x_bus = bus.references / env.now
    back = sci.bus_traffic(x_r, 0.75, 0.25)
    assert back["x_bus_single"] == pytest.approx(x_bus, rel=0.02)
    assert back["x_bus"] == pytest.approx(x_bus / 0.75, rel=0.02)


def test_mixes_as_printed():
    assert {m: (x.read, x.write, x.rollout, x.lock) for m, x in SCI_MIXES.items()} == {
        "1a": (25, 17, 8, 50), "1b": (21, 14, 19, 50), "2": (21, 11, 11, 57),
        "3": (20, 0, 20, 60)}
    assert SCI_MIXES["1b"].printed_total == 104  # the paper's own inconsistency
    assert sum(SCI_MIXES["1b"].shares().values()) == pytest.approx(1.0)
    total = sum(TABLE1_PER_TXN.values())
    assert round(100 * TABLE1_PER_TXN["read"] / total) == 21
    with pytest.raises(ValueError, match="unknown SCI traffic mix"):
        sci_mix("4")


def test_unloaded_read_latency_matches_hand_calculation():
    # Request 20 B, response 84 B, 4 nodes: whatever the distance h, the request and the
    # response together cross 4 links = 2 bypasses of (1 + 8) ns, 2 x 1 ns of wire on the
    # last hops, 20 + 84 ns of transmission and the 100 ns memory responder: 224 ns.
    r = sci.run_point("2", 1.0, 4000, seed=3)
    assert r.latency_ns["read"] == pytest.approx(224.0, rel=0.01)
    assert r.retries == 0


def test_ring_is_deterministic_and_conserves_operations():
    a = sci.run_point("2", 180.0, 8000, seed=21)
    b = sci.run_point("2", 180.0, 8000, seed=21)
    c = sci.run_point("2", 180.0, 8000, seed=22)
    assert a.as_dict() == b.as_dict()
    assert a.as_dict() != c.as_dict()
    assert a.ops == 8000  # run() raises if any operation or packet went missing


def test_overload_saturates_the_links_and_triggers_busy_retries():
    r = sci.run_point("2", 400.0, 8000, seed=5)
    assert r.link_util_max > 0.95
    assert r.retries > 0
    assert r.read_mb_s < 300  # 1 GB/s links cannot carry 400 MB/s of reads with this mix


def test_knee_interpolation():
    def pt(mb, lat):
        return sci.PointResult("2", mb, mb, 2 * mb, 0, 0.5, 0.5, {}, {"read": lat}, 0, 0, 0,
                               0, 0)
    k = sci.find_knee([pt(100, 250), pt(150, 350), pt(200, 550)], zero_load_read_ns=225)
    assert k.latency_ns == 450
    assert k.read_mb_s == pytest.approx(175)
    assert k.read_mb_s_at_400ns == pytest.approx(162.5)
    with pytest.raises(ValueError, match="never reaches"):
        sci.find_knee([pt(100, 250)], 225)
