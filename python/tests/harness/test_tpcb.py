"""tpcb's tables from made-up runs, and peers.Netns leaving nothing behind (root only)."""

import os
import subprocess

import pytest

from farpool.harness import peers, tpcb


def run(system, clients, rep, tps, **kw):
    return {"system": system, "clients": clients, "rep": rep, "tps": tps, "p50_us": 1e6 / tps,
            "p99_us": 2e6 / tps, "abort_rate": 0.0, "network": kw.pop("network", "netns"), **kw}


def test_medians_take_the_middle_run_and_keep_the_range():
    rows = [run("pool-tcp", 1, r, t, round_trips_per_txn=11.0) for r, t in enumerate([900, 100, 1000])]
    (m,) = tpcb.medians(rows)
    assert (m["tps"], m["tps_min"], m["tps_max"], m["runs"]) == (900, 100, 1000, 3)
    assert m["round_trips_per_txn"] == 11.0


def test_mixed_networks_are_shown_not_hidden():
    rows = [run("pool-tcp", 1, 0, 900), run("pool-tcp", 1, 1, 800, network="loopback")]
    (m,) = tpcb.medians(rows)
    assert m["network"] == "1x loopback; 1x netns"


def test_table_has_the_network_ratios():
    rows = [run("pool-tcp", 1, 0, 1000, round_trips_per_txn=11.0), run("sharded-tcp", 1, 0, 2000),
            run("postgresql-tcp", 1, 0, 4000)]
    md = tpcb.table(tpcb.medians(rows), {}, [1])
    assert "| pool-tcp / postgresql-tcp | pool-tcp / sharded-tcp |" in md
    assert "| 1 | 1,000 | 2,000 | 4,000 | 0.25x | 0.50x |" in md
    assert "7 (script)" in md  # PostgreSQL's round trips come from pgbench's script


def test_two_binaries_run_every_farpool_system_once_each_with_their_ratio():
    runs = tpcb.with_binaries(["pool-tcp-rc", "postgresql-tcp"],
                              [("main", "/bin/a"), ("new", "/bin/b")])
    assert runs == [("pool-tcp-rc", "pool-tcp-rc@main", "/bin/a"),
                    ("pool-tcp-rc", "pool-tcp-rc@new", "/bin/b"),
                    ("postgresql-tcp", "postgresql-tcp", None)]
    rows = [run("pool-tcp-rc@main", 4, 0, 1000), run("pool-tcp-rc@new", 4, 0, 3000),
            run("postgresql-tcp", 4, 0, 4000)]
    md = tpcb.table(tpcb.medians(rows), {}, [4])
    assert "| pool-tcp-rc@new / pool-tcp-rc@main |" in md
    assert "3.00x" in md and "0.75x" in md  # new over main; new over PostgreSQL


def test_read_committed_runs_beside_si_with_their_ratios():
    rows = [run("pool-tcp", 4, 0, 500, abort_rate=0.3), run("pool-tcp-rc", 4, 0, 2000),
            run("postgresql-tcp", 4, 0, 4000)]
    md = tpcb.table(tpcb.medians(rows), {}, [4])
    assert "| pool-tcp-rc / postgresql-tcp | pool-tcp-rc / pool-tcp |" in md
    assert "0.50x | 4.00x |" in md
    assert "farpool pool (tcp, read committed)" in md


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_netns_removes_what_it_made():
    with peers.Netns(2) as ns:
        assert ns.name(1) in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                            text=True).stdout
        route = subprocess.run(["ip", "route", "get", ns.address(1)], capture_output=True,
                               text=True).stdout
        assert f"dev {ns.bridge()}" in route, route
        inside = subprocess.run(["ip", "-n", ns.name(1), "-4", "-o", "addr"], capture_output=True,
                                text=True).stdout
        assert ns.address(1) + "/16" in inside, inside
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert ns.name(0) not in left and ns.name(1) not in left
    assert f"fq{ns.tag}" not in links
