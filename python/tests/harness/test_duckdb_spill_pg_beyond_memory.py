"""The duckdb_spill and pg_beyond_memory harnesses' pure parts: answers, query lists, tables."""

import argparse
import csv
from decimal import Decimal

from farpool.harness import duckdb_spill, pg_beyond_memory

CTX = {"time": "t", "host": "h", "cores": 2, "git_sha": "x"}


def stored_answer(n, scale="1"):
    with open(duckdb_spill.TPCH_DIR / "answers" / f"sf{scale}" / f"q{n:02d}.csv", newline="") as f:
        return list(csv.reader(f, delimiter="|"))[1:]


def test_every_query_has_sql_and_answers():
    assert duckdb_spill.parse_queries("all") == list(range(1, 23))
    assert duckdb_spill.parse_queries("q1,18") == [1, 18]
    for n in range(1, 23):
        assert "select" in duckdb_spill.query_sql(n).lower()
        assert stored_answer(n) or n in (2, 15, 21)


def test_check_answer_accepts_the_stored_rows_and_rejects_a_changed_number():
    want = stored_answer(1)
    rows = [tuple(Decimal(v) if v.replace(".", "").replace("-", "").isdigit() else v for v in r)
            for r in want]
    assert duckdb_spill.check_answer(1, 1.0, rows) == "ok"
    bad = list(rows)
    bad[0] = (bad[0][0], bad[0][1], bad[0][2] + 1, *bad[0][3:])
    assert duckdb_spill.check_answer(1, 1.0, bad).startswith("row 0")
    assert duckdb_spill.check_answer(1, 1.0, rows[:-1]).endswith(f"expected {len(rows)}")
    assert duckdb_spill.check_answer(1, 7.0, rows) == "no answer for this scale"
    assert duckdb_spill.check_answer(13, 1.0, []).startswith("not comparable")


def test_check_answer_ignores_random_text_columns():
    want = stored_answer(10)
    rows = [tuple(v if i not in (5, 7) else "other text" for i, v in enumerate(r)) for r in want]
    assert duckdb_spill.check_answer(10, 1.0, rows) == "ok"


def test_duckdb_table_ratios_to_tmpfs_and_spilling_queries():
    rows = []
    for v, t in (("disk", 4.0), ("tmpfs", 2.0), ("farpool-shm", 2.4)):
        rows.append({"variant": v, "query": 18, "seconds": t, "status": "ok", "rep": 0,
                     "spill_written_bytes": 50 << 20, "spill_peak_bytes": 40 << 20, "answer": "ok"})
        rows.append({"variant": v, "query": 6, "seconds": 1.0, "status": "ok", "rep": 0,
                     "spill_written_bytes": 0, "spill_peak_bytes": 0, "answer": "ok"})
    args = argparse.Namespace(scale=1.0, memory_limit="40MB", threads=2, database="file", repeat=1,
                              spill_threshold=1 << 20, mount_cache="direct")
    md = duckdb_spill.table(rows, ["disk", "tmpfs", "farpool-shm"], [6, 18], args, {}, CTX, 1.0, (1, 2))
    assert "--mount-cache direct`" in md  # the command that reproduces it names the mount's cache
    assert "| q18 | 4.00 | 2.00 | 2.40 | 2.00x | 1.20x | 50 | 40 |" in md
    assert "Queries that spill (more than 1 MiB written to the temp directory): q18." in md
    assert "1 of 1 within 1.3x of tmpfs; faster than the local disk on 1 of 1" in md


def test_pg_table_ratios():
    rows = [{"system": s, "clients": c, "status": "ok", "tps": tps, "p50_us": 1000.0, "p99_us": 5000.0,
             "cgroup_peak_bytes": 1 << 28, "cgroup_limit_hits": 3, "rep": 0}
            for s, tps in (("memory", 1000.0), ("disk", 200.0), ("farpool-shm", 850.0)) for c in (1, 16)]
    args = argparse.Namespace(limit="256MiB", scale_n=69, clients="1,16", clients_list=[1, 16], seconds=30,
                              repeat=1, shared_buffers="32MB", mount_cache="page")
    md = pg_beyond_memory.table(rows, ["memory", "disk", "farpool-shm"], args, {}, CTX, 1.0, (1, 2))
    assert "--mount-cache page`" in md
    assert "| 1 | 1,000 | 200 | 850 | 0.20x | 0.85x | 4.25x |" in md
