"""Calibration from ops.jsonl: parsing, the fit, RSI op counts, and the no-txn-file path."""

import json
from pathlib import Path

import pytest

from farpool.sim import calibrate as cal
from farpool.sim.mixes import BANK, TPCB, rsi_op_counts

FIXTURE = Path(__file__).parent / "fixtures" / "ops_fixture.jsonl"


def test_missing_ops_file_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ops\.jsonl.*farpool bench ops --json"):
        cal.load_ops(tmp_path / "ops.jsonl")


def test_malformed_rows_are_refused(tmp_path):
    f = tmp_path / "ops.jsonl"
    f.write_text('{"op": "read"}\n')
    with pytest.raises(ValueError, match=":1: row lacks"):
        cal.load_ops(f)
    f.write_text("not json\n")
    with pytest.raises(ValueError, match="not a JSON object"):
        cal.load_ops(f)


def test_fit_uses_farpool_batch1_rows_of_the_nearest_size():
    transport, costs = cal.fit_costs(cal.load_ops(FIXTURE), None, 64)
    assert transport == "shm"
    read = costs["read"]
    assert read.size == 64
    assert read.measured == {1: 2.5e6, 2: 4.4e6, 4: 5.0e6, 8: 5.2e6}  # no redis/memcpy/batch
    assert read.service_ns == pytest.approx(1e9 / 5.2e6)
    assert read.service_ns + read.delay_ns == pytest.approx(400.0)  # 1 / 2.5 M/s
    assert read.model_ops_per_s(1) == pytest.approx(2.5e6)
    with pytest.raises(ValueError, match="transport 'rdma'"):
        cal.fit_costs(cal.load_ops(FIXTURE), "rdma", 64)


def test_mva_single_customer_and_saturation():
    x, r = cal.mva(100.0, 300.0, 1)
    assert x == pytest.approx(1 / 400) and r == pytest.approx(400)
    x, _ = cal.mva(100.0, 300.0, 50)
    assert x == pytest.approx(1 / 100, rel=1e-3)


def test_rsi_op_counts():
    b, t = rsi_op_counts(BANK), rsi_op_counts(TPCB)
    assert (b.reads, b.writes, b.cas, b.faa) == (5, 5, 2, 0)
    assert (t.reads, t.writes, t.cas, t.faa) == (7, 8, 3, 1)
    assert "not measured" in t.source


def test_calibrate_without_txn_file_says_so():
    r = cal.calibrate(FIXTURE, None, threads=(1, 4), commits=600)
    assert r["measured_txn"] is None
    assert "bench/results/txn.jsonl" in r["message"]
    by = {(p["workload"], p["threads"]): p for p in r["predicted"]}
    assert set(by) == {("bank", 1), ("bank", 4), ("tpcb", 1), ("tpcb", 4)}
    # One thread: no conflicts; the DES batches commit phases so it beats the serial MVA.
    assert by["bank", 1]["des_abort_rate"] == 0
    assert by["bank", 1]["des_tps"] > by["bank", 1]["mva_tps"]
    assert by["bank", 4]["des_tps"] > by["bank", 1]["des_tps"]


def test_calibrate_compares_with_measured_runs(tmp_path):
    txn = tmp_path / "txn.jsonl"
    rows = [{"engine": "pool", "workload": w, "clients": 1, "threads": t, "tps": 100000.0,
             "p50_us": 10, "p99_us": 30, "abort_rate": 0.0, "reads_per_txn": 5,
             "writes_per_txn": 9, "cas_per_txn": 2, "faa_per_txn": 0, "accounts": 1000}
            for w in ("bank", "tpcb") for t in (1, 2)]
    rows.append(dict(rows[0], engine="sharded"))  # other engines are not compared
    txn.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cal.calibrate(FIXTURE, txn, threads=(1, 2), commits=600)
    assert len(r["measured_txn"]) == 4
    c = r["measured_txn"][0]
    assert (c["workload"], c["client_threads"], c["key_space"]) == ("bank", 1, 1000)
    assert c["des_error_pct"] == pytest.approx((c["des_tps"] - 1e5) / 1e5 * 100)
    assert r["op_counts"]["tpcb"]["source"].startswith("measured")
    # bank measured 9 writes against 5 derived: the DES runs the 4 extra writes
    assert r["extra_ops_per_txn"]["bank"] == {"write": pytest.approx(4.0)}


def test_results_and_plot_are_written(tmp_path):
    from farpool.sim.experiments import calibration

    txn = tmp_path / "txn.jsonl"
    txn.write_text(json.dumps({
        "engine": "pool", "workload": "bank", "clients": 1, "threads": 2, "tps": 1e5,
        "p50_us": 10, "p99_us": 30, "abort_rate": 0.0, "reads_per_txn": 4,
        "writes_per_txn": 9, "cas_per_txn": 2, "faa_per_txn": 0}) + "\n" + json.dumps({
        "engine": "local", "workload": "bank", "clients": 1, "threads": 1, "tps": 3e5,
        "p50_us": 3, "p99_us": 9, "abort_rate": 0.0, "reads_per_txn": 4,
        "writes_per_txn": 9, "cas_per_txn": 2, "faa_per_txn": 0}) + "\n")
    for t in (None, txn):
        r = cal.calibrate(FIXTURE, t, threads=(1, 2), commits=400)
        files = calibration.write(r, tmp_path)
        assert [f.name for f in files] == ["sim_calibrate.jsonl", "sim_calibrate.png"]
        rows = [json.loads(x) for x in files[0].read_text().splitlines()]
        assert rows[-1]["record"] == "summary"
    assert r["engine_compute_us"]["bank"] == pytest.approx(1e6 / 3e5)


def _local_rows(ns: dict[str, float], size: int = 64) -> list[dict]:
    """``farpool bench ops --local`` rows (invented for the test) with the given one-thread
    latency per op, plus a 2-thread row per op that must not be used."""
    rows = []
    for op, lat in ns.items():
        for t, x in ((1, 1e9 / lat), (2, 3e9 / lat)):
            rows.append({"op": op, "size": size if op in ("read", "write") else 8,
                         "threads": t, "batch": 1, "transport": "none", "ops_per_s": x,
                         "p50_us": 0.01, "p99_us": 0.1, "p999_us": 0.3,
                         "system": "local-memory", "note": "test, invented"})
    return rows


def _txn_local(tps: float, counts=(4, 9, 2, 0)) -> dict:
    r, w, c, f = counts
    return {"engine": "local", "workload": "bank", "clients": 1, "threads": 1, "tps": tps,
            "p50_us": 2, "p99_us": 5, "abort_rate": 0.0, "reads_per_txn": r,
            "writes_per_txn": w, "cas_per_txn": c, "faa_per_txn": f}


def test_local_memory_rows_are_one_thread_latencies():
    rows = cal.load_ops(FIXTURE) + _local_rows({"read": 80.0, "write": 50.0})
    got = cal.local_op_ns(rows, 64)
    assert got == {"read": pytest.approx(80.0), "write": pytest.approx(50.0)}
    assert cal.local_op_ns(cal.load_ops(FIXTURE), 64) == {}  # memcpy/redis rows are not it


def test_engine_compute_excludes_the_local_engines_memory_accesses():
    local_ns = {"read": 80.0, "write": 50.0, "cas": 100.0, "faa": 70.0}
    c = cal.local_compute([_txn_local(250_000.0)], "bank", local_ns)
    # 4 us per transaction, of which 4 x 80 + 9 x 50 + 2 x 100 ns are memory accesses
    assert c["memory_ns"] == pytest.approx(970.0)
    assert c["compute_ns"] == pytest.approx(4000.0 - 970.0)
    # without local-memory rows nothing is subtracted, and the note says so
    raw = cal.local_compute([_txn_local(250_000.0)], "bank", {"read": 80.0})
    assert raw["compute_ns"] == pytest.approx(4000.0) and raw["memory_ns"] is None
    assert "counted twice" in raw["note"] and "write, cas" in raw["note"]


def test_one_thread_pool_on_local_speed_memory_matches_the_local_engine(tmp_path):
    """The double count: if the pool's operations cost what local memory costs, the pool
    engine at one thread must be predicted at the local engine's speed, not slower."""
    lat = {"read": 400.0, "write": 1e9 / 2.4e6, "cas": 500.0, "faa": 1e9 / 2.1e6}  # = fixture
    ops = tmp_path / "ops.jsonl"
    ops.write_text(FIXTURE.read_text()
                   + "".join(json.dumps(r) + "\n" for r in _local_rows(lat)))
    txn = tmp_path / "txn.jsonl"
    pool = dict(_txn_local(1.0), engine="pool", tps=1e5)
    txn.write_text(json.dumps(_txn_local(100_000.0)) + "\n" + json.dumps(pool) + "\n")
    r = cal.calibrate(ops, txn, threads=(1,), commits=400)
    c = r["measured_txn"][0]
    assert (c["workload"], c["client_threads"]) == ("bank", 1)
    assert c["mva_tps"] == pytest.approx(100_000.0, rel=1e-9)
    assert r["engine_compute_detail"]["bank"]["memory_accesses_us"] == pytest.approx(
        (4 * 400 + 9 * 1e9 / 2.4e6 + 2 * 500) / 1e3)


def test_mva_pays_the_path_delay_once_per_round_trip():
    costs = cal.fit_costs(cal.load_ops(FIXTURE), None, 64)[1]
    row = dict(_txn_local(1e5), engine="pool")
    back_to_back = cal.load_txn_counts([row], "bank")
    assert back_to_back.round_trips is None  # rows written before the field existed
    batched = cal.load_txn_counts([dict(row, round_trips_per_txn=3)], "bank")
    assert batched.round_trips == 3
    one = cal.predict_mva(costs, back_to_back, 1)
    assert cal.predict_mva(costs, batched, 1) > one  # 3 delays instead of 15
    every_op = dict(row, round_trips_per_txn=back_to_back.total())
    assert cal.predict_mva(costs, cal.load_txn_counts([every_op], "bank"), 1) == \
        pytest.approx(one)
