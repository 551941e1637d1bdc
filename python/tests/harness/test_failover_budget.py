"""The failover harness's budget part: perf's per-thread counts summed by role."""
from farpool.harness.failover import budget_table, per_thread_counts, ratio_pairs

PERF = """\
fp-serve-101,12.50,msec,task-clock,12500000,100.00,,
fp-serve-101,40,,context-switches,12500000,100.00,,
fp-mirror-102,3.25,msec,task-clock,3250000,100.00,,
fp-serve-201,7.50,msec,task-clock,7500000,100.00,,
fp-serve-201,10,,raw_syscalls:sys_enter,7500000,100.00,,
fwdcost-base-fa-301,2.00,msec,task-clock,2000000,100.00,,
fwdcost-base-fa-301,6,,syscalls:sys_enter_sendto,2000000,100.00,,
ucx-async-103,<not counted>,msec,task-clock,0,100.00,,
# started on Sat Nov 28
"""


def test_counts_are_summed_by_the_role_of_each_thread():
    roles = {101: "serve", 201: "serve", 102: "mirror", 301: "client", 103: "other"}
    c = per_thread_counts(PERF, roles)
    assert c["serve"] == {"task-clock": 20.0, "context-switches": 40.0, "syscalls": 10.0}
    assert c["mirror"] == {"task-clock": 3.25}
    # A command name with dashes: the thread id is after the last one.
    assert c["client"] == {"task-clock": 2.0, "sendto": 6.0}
    assert "other" not in c  # not counted


def test_the_table_compares_replicas_0_and_1_per_role():
    def row(replicas, serve_us, mirror_us):
        per_txn = {"serve": {"cpu_us": serve_us, "sendmsg": 2.0}, "client": {"cpu_us": 10.0}}
        if mirror_us:
            per_txn["mirror"] = {"cpu_us": mirror_us}
        return {"part": "budget", "workload": "bank", "replicas": replicas, "window_tps": 100.0,
                "per_txn": per_txn}
    text = budget_table([row(0, 50.0, 0), row(1, 80.0, 30.0)])
    assert "| bank | serve | 50.0 / 80.0 |" in text
    assert "| bank | mirror | 0.0 / 30.0 |" in text
    assert "| bank | all | 60.0 / 120.0 |" in text


def test_an_ab_keeps_each_binarys_counts_apart():
    def row(binary, replicas, serve_us):
        return {"part": "budget", "workload": "bank", "replicas": replicas, "window_tps": 100.0,
                "binary": binary, "per_txn": {"serve": {"cpu_us": serve_us}}}
    text = budget_table([row("main", 0, 50.0), row("main", 1, 80.0),
                         row("new", 0, 40.0), row("new", 1, 200.0)])
    assert "| main: bank | serve | 50.0 / 80.0 |" in text
    assert "| new: bank | serve | 40.0 / 200.0 |" in text


def test_the_ratio_of_each_pair_is_taken_within_its_repeat_and_binary():
    def row(binary, rep, replicas, tps):
        return {"part": "cost", "fabric": "tcp", "workload": "bank", "binary": binary,
                "rep": rep, "replicas": replicas, "tps": tps}
    rows = [row("main", 0, 0, 1000.0), row("main", 0, 1, 600.0),
            row("new", 0, 0, 2000.0), row("new", 0, 1, 1000.0),
            row("main", 1, 0, 500.0), row("main", 1, 1, 350.0)]
    text = ratio_pairs(rows)
    assert "| main | tcp | bank | 0.65x | 0.60, 0.70 |" in text
    assert "| new | tcp | bank | 0.50x | 0.50 |" in text
