"""The soak: its memory bound on made-up timelines, and a 60-second run on a real cluster.

The real run needs the farpool binary ($FARPOOL_BIN, else build/farpool). It fails on an
engine without version garbage collection: the pool fills (see farpool.harness.soak).
"""

import json

import pytest

from farpool.harness import soak
from farpool.harness.peers import farpool_bin

MIB = 1 << 20


def test_flat_memory_after_warmup_passes():
    timeline = [(t, 100 * MIB) for t in range(0, 61, 3)]
    v = soak.judge_memory(timeline, 60.0, 0.2, clients=2, servers=2)
    assert "failure" not in v
    assert v["in_use_at_warmup_end"] == 100 * MIB
    assert v["bound"] == int(110 * MIB + 4 * soak.CHUNK)


def test_growth_after_warmup_fails_and_says_how_much():
    timeline = [(t, (100 + 5 * t) * MIB) for t in range(0, 61, 3)]
    v = soak.judge_memory(timeline, 60.0, 0.2, clients=2, servers=2)
    assert "pool memory grew after the warm-up" in v["failure"]
    assert v["peak_after_warmup"] == 400 * MIB


def test_no_sample_after_warmup_fails():
    assert "no memory sample after the warm-up" in soak.judge_memory([(0.0, 1)], 60.0, 0.2, 1,
                                                                      2)["failure"]


@pytest.mark.skipif(not farpool_bin().exists(), reason="no farpool binary (build it first)")
def test_soak_60_seconds(tmp_path):
    out = tmp_path / "soak.jsonl"
    # 30 s per workload: the first half is warm-up (TPC-B's history window and the recyclers'
    # caches fill over the first ~15 s on this 2-core machine); `make soak` uses 20 % of 5 min.
    rc = soak.main(["--seconds", "60", "--interval", "2", "--warmup", "0.5", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["workload"] for r in rows] == ["bank", "tpcb"]
    assert all(r["git_sha"] and r["host"] for r in rows)
    failures = {r["workload"]: r["failures"] for r in rows if not r["ok"]}
    assert rc == 0 and not failures, f"soak failed: {failures}"
