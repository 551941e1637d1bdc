"""The flows and beyond_memory harnesses' pure parts: summing processes, tables, sizes."""

import pytest

from farpool.harness import beyond_memory, flows


def fake_result(count, mean_us, seconds=1.0):
    return {"all": {"count": count, "mean_us": mean_us, "p50_us": mean_us, "p99_us": 2 * mean_us},
            "writes": {"count": 0},
            "queries": [{"query": "q1", "qps": count / seconds}]}


def test_point_sums_processes_and_weights_latency():
    row = flows.point_row("pool x2", "pool", 2, 4, [fake_result(100, 10), fake_result(300, 20)], 2.0)
    assert row["qps"] == 200
    assert row["per_process_qps"] == [50, 150]
    assert row["mean_us"] == pytest.approx((100 * 10 + 300 * 20) / 400)
    assert row["per_query_qps"] == {"q1": 400}


def test_table_reports_peak_and_saturation():
    rows = [flows.point_row("local", "local", 1, f, [fake_result(q, 1)], 1.0)
            for f, q in ((1, 100), (2, 195), (4, 200))]
    for r in rows:
        r["write_pct"] = 0
    ctx = {"time": "t", "host": "h", "cores": 2, "git_sha": "x"}
    md = flows.table(rows, [1, 2, 4], {}, ctx, "cmd", 1.0)
    assert "peak 200 queries/s at 4 flows" in md
    assert "90% of the peak from 2 flows on" in md


def test_parse_size():
    assert beyond_memory.parse_size("64MiB") == 64 << 20
    assert beyond_memory.parse_size("1.5G") == 3 << 29
    with pytest.raises(ValueError):
        beyond_memory.parse_size("lots")


def test_describe_failure_names_the_oom_killer():
    msg = beyond_memory.describe_failure(-9, "\r  loading local:  12.0% of 10 rows", {"oom_kills": 1})
    assert "OOM killer" in msg and "12.0%" in msg
