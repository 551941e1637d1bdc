"""MEMSCALE Fig. 5: the hop law, the mesh hop metrics and why the predictions differ."""

import pytest

from farpool.sim import memscale


def test_hop_sweep_follows_the_texts_figures():
    p = memscale.MemscaleParams(loads_per_query=10)
    rows = memscale.hop_sweep(p, 4, queries=3, seed=1)
    # +20 % query time per hop (caches) from the text's 1->2 hop figures.
    assert [round(r["relative"], 6) for r in rows] == [1.0, 1.2, 1.4, 1.6]


def test_latency_per_hop_is_32_percent():
    p = memscale.MemscaleParams()
    assert 2 * (p.hop_ns + p.prop_ns) == pytest.approx(0.32 * p.one_hop_ns)


def test_hop_metrics_of_the_two_meshes():
    m2 = memscale.hop_metrics((16, 16))
    m3 = memscale.hop_metrics((6, 6, 6))
    assert m2["mean"] == pytest.approx(10.6667, abs=1e-3)
    assert m3["mean"] == pytest.approx(5.8605, abs=1e-3)
    assert m2["diameter"] == 30 and m3["diameter"] == 15


def test_predictions_and_the_verdict():
    r = memscale.predict(memscale.MemscaleParams(loads_per_query=20), seed=2, loads=2000,
                         loaded=False)
    # The linear law with mean distances: +20% x (10.67 - 1) and +20% x (5.86 - 1).
    assert r["mesh2d_16x16_pct"] == pytest.approx(193.3, rel=0.1)
    assert r["mesh3d_6x6x6_pct"] == pytest.approx(97.2, rel=0.1)
    assert r["reproduced"] is False
    ratios = r["increase_ratio_2d_over_3d"]
    assert ratios["paper"] == pytest.approx(95 / 27)
    assert all(v < 2.2 for v in ratios["by_metric"].values())
