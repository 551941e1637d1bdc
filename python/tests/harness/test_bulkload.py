"""bulkload's table from made-up runs, and one real small run of every farpool fabric beside
PostgreSQL (skipped without a farpool binary or PostgreSQL)."""

import json

import pytest

from farpool.harness import bulkload, peers


def run(system, who, seconds, rows=1000, scale=1.0):
    return {"system": system, "who": who, "scale": scale, "seconds": seconds, "rows": rows}


def test_table_takes_medians_and_compares_seconds_on_the_same_fabric():
    rows = [run("pool-tcp", "this", s) for s in (0.5, 0.1, 0.4)]
    rows += [run("pool-tcp", "main", 8.0), run("postgresql-tcp", "postgresql", 2.0, rows=600),
             run("postgresql", "postgresql", 1.0, rows=600)]
    lines = bulkload.table(rows, [1.0], bulkload.SYSTEMS)
    assert "| pool-tcp | this | 1 | 1,000 | 0.40 (0.10–0.50; 3) | 2,500 | 5.0x |" in lines
    assert "| pool-tcp | main | 1 | 1,000 | 8.00 (8.00–8.00; 1) | 125 | 0.2x |" in lines
    # The TCP peer, not the Unix-socket one; a peer has no ratio of its own.
    assert "| postgresql-tcp | postgresql | 1 | 600 | 2.00 (2.00–2.00; 1) | 300 | – |" in lines
    assert not any("pool-shm" in line for line in lines)


def test_unknown_system_is_refused_with_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        bulkload.main(["--systems", "pool-shm,oracle"])
    assert "unknown system(s) oracle; expected some of pool-shm, pool-tcp" in capsys.readouterr().err


@pytest.mark.skipif(not peers.farpool_bin().exists(), reason="no farpool binary (build it first)")
@pytest.mark.skipif(not (peers.PG_BIN / "initdb").exists(), reason="no PostgreSQL 15")
def test_a_small_load_on_every_system_is_verified_and_written(tmp_path):
    rc = bulkload.main(["--scales", "0.1", "--rounds", "1", "--out", str(tmp_path)])
    assert rc == 0
    got = [json.loads(line) for line in (tmp_path / "bulkload.jsonl").read_text().splitlines()]
    assert sorted(r["system"] for r in got) == sorted(bulkload.SYSTEMS)
    assert all(r["rows"] > 0 and r["seconds"] > 0 for r in got)
    md = (tmp_path / "bulkload.md").read_text()
    assert "| pool-tcp | this | 0.1 |" in md and "| postgresql | postgresql | 0.1 |" in md
