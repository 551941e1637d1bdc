"""tpcw's commands and one real short run of each workload on every system (skipped without a
farpool binary; the network systems need root for their namespaces, and fall back to loopback
TCP when other runs' bridges make `cluster up --netns` fail, so the network is not asserted)."""

import json
import os

import pytest

from farpool.harness import peers, tpcw


def test_each_workload_runs_its_benchmark_on_the_systems_engine():
    bank = tpcw.command("bank", 1.5, "sharded-tcp", 4)
    assert bank[1:5] == ["bench", "txn", "--workload", "bank"]
    assert bank[bank.index("--engine") + 1] == "sharded"
    assert bank[bank.index("--threads") + 1] == "4" and "--verify" in bank
    buy = tpcw.command("tpcw", 1.5, "pool-tcp", 8)
    assert buy[1:3] == ["bench", "tpcw"] and buy[buy.index("--flows") + 1] == "8"
    assert buy[buy.index("--engine") + 1] == "pool" and "--json" in buy
    assert "--for-update" not in buy and "--for-update" in tpcw.command("bank", 1, "pool-tcp-fu", 1)


@pytest.mark.skipif(not peers.farpool_bin().exists(), reason="no farpool binary (build it first)")
@pytest.mark.parametrize("workload", ["tpcw", "bank"])
def test_one_client_on_every_system_is_verified_and_written(tmp_path, workload):
    systems = tpcw.SYSTEMS if os.geteuid() == 0 else ["pool", "sharded"]
    rc = tpcw.main(["--workload", workload, "--clients", "1", "--seconds", "0.2", "--repeat", "1",
                    "--systems", ",".join(systems), "--out", str(tmp_path)])
    assert rc == 0
    got = [json.loads(line) for line in (tmp_path / f"{workload}.jsonl").read_text().splitlines()]
    assert sorted(r["system"] for r in got) == sorted(systems)
    for r in got:
        assert r["experiment"] == workload and r["tps"] > 0, r
        assert r["round_trips_per_txn"] > 0 and 0 <= r["abort_rate"] < 1, r
    md = (tmp_path / f"{workload}.md").read_text()
    assert "| pool / sharded |" in md
    if "pool-tcp" in systems:
        assert "| pool-tcp / sharded-tcp | pool-tcp-fu / sharded-tcp |" in md
        (fu,) = [r for r in got if r["system"] == "pool-tcp-fu"]
        assert fu["round_trips_per_txn"] < (3.5 if workload == "bank" else 4.9), fu
    assert (tmp_path / f"{workload}.png").exists() and (tmp_path / f"{workload}_log.png").exists()
