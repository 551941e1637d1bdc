"""The soak: its memory bounds on made-up timelines, a 60-second run on a real cluster over
shm, and a 50-second run (about 60 s with the cluster's start) over TCP in network namespaces
with replicas, a server added and one SIGKILLed every 10 s.

The real runs need the farpool binary ($FARPOOL_BIN, else build/farpool). The first fails on an
engine without version garbage collection: the pool fills (see farpool.harness.soak). The
network one fails on a process whose private memory grows (checked with servers that leaked
4 KB per executed batch: "server 2 (pid 2917): private memory (RssAnon) grew after the warm-up:
peak 1327.7 MiB > bound 256.0 MiB"), and on a kill that loses writes (checked with a mirror that
acknowledged every 50th forward without applying it: the bench failed on "index entry of key
7989 in table 'accounts' names a record of another key"). The one with a server stopped, a
client process stopped past its lease, etcd killed and restarted fails with main's binary
before branch `soakfaults` (FAILMAIN). Two more network runs: replicas 2 on 4 servers with
server stops, and the wall clock of the bench's processes and of one server stepped by an hour
(libfaketime; `WallClock` and the judging of a step are tested without a cluster too)."""

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from farpool.harness import soak, soak_faults, soak_probes
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


def test_process_growth_after_warmup_fails_and_names_it():
    flat = [(t, 20 * MIB) for t in range(0, 61, 3)]
    assert "failure" not in soak.judge_growth("etcd", "x", flat, 12.0, soak.PROCESS_SLACK)
    leak = [(t, (20 + t) * MIB) for t in range(0, 61, 3)]
    v = soak.judge_growth("server 1 (pid 7)", "private memory", leak, 12.0, soak.PROCESS_SLACK)
    assert v["failure"].startswith("server 1 (pid 7): private memory grew after the warm-up")
    # A process that started after the warm-up (a server added by --faults) is not judged.
    assert not soak.judge_growth("server 3", "x", leak[5:], 12.0, soak.PROCESS_SLACK)["judged"]


def test_no_sample_after_warmup_fails():
    assert "no memory sample after the warm-up" in soak.judge_memory([(0.0, 1)], 60.0, 0.2, 1,
                                                                      2)["failure"]


def test_client_stop_leaves_a_client_never_stopped(tmp_path):
    # A process group like the bench's: a parent and two client processes. The first
    # client-stop stops one of them (and resumes it at finish); the second finds one client
    # never stopped and skips (None): a bench whose every client was fenced reports nothing.
    # (It stopped the second client too when the rule counted clients not stopped at all:
    # the exploratory run with 2 clients ended "every client process failed".)
    bench = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"], process_group=0)
    try:
        while len(soak_probes.process_group(bench.pid)) < 3:
            time.sleep(0.01)
        faults = soak_faults.Faults(str(tmp_path), str(tmp_path / "cluster.json"), 10, 0, 1,
                                    ["client-stop"], 1, bench.pid)
        first = {"kind": "client-stop"}
        assert faults._client_stop(first) is True
        assert first["pid"] in soak_probes.process_group(bench.pid) and first["pid"] != bench.pid
        faults.events.append(first)
        second = {"kind": "client-stop"}
        assert faults._client_stop(second) is None, second
        assert "1 client processes stopped, 1 live ones never" in second["what"]
        faults.finish()
        assert first["t_cont"] >= 0
    finally:
        os.killpg(bench.pid, 9)
        bench.wait()


# A parent that never reaps its children, like the bench until its clients end: the first
# child exits at once (a zombie, like a client that failed early), the others sleep.
_PARENT_OF_A_ZOMBIE = """
import os, sys, time
for i in range(int(sys.argv[1])):
    if os.fork() == 0:
        if i > 0:
            time.sleep(60)
        os._exit(3)
time.sleep(60)
"""


def _group_with_a_zombie(live: int) -> subprocess.Popen:
    bench = subprocess.Popen([sys.executable, "-c", _PARENT_OF_A_ZOMBIE, str(live + 1)],
                             process_group=0)
    while sorted(soak_probes.proc_state(p) == "Z" for p in soak_probes.process_group(bench.pid)
                 if p != bench.pid) != [False] * live + [True]:
        time.sleep(0.01)
    return bench


def test_client_stop_skips_a_failed_client(tmp_path):
    # One live client and one that failed (a zombie): no client-stop, since stopping the live
    # one would leave none to carry the run, and the zombie is no victim — SIGSTOP on it
    # "succeeds" and does nothing, and judge then took its own failure for the stop's. (It
    # stopped one of the two when zombies counted as clients; _stop on the zombie returned
    # without saying it did not stop.)
    bench = _group_with_a_zombie(1)
    try:
        zombie = next(p for p in soak_probes.process_group(bench.pid)
                      if soak_probes.proc_state(p) == "Z")
        faults = soak_faults.Faults(str(tmp_path), str(tmp_path / "cluster.json"), 10, 0, 1,
                                    ["client-stop"], 1, bench.pid)
        event = {"kind": "client-stop"}
        assert faults._client_stop(event) is None, event
        assert "0 client processes stopped, 1 live ones never" in event["what"]
        event = {"kind": "client-stop"}
        assert faults._stop(event, zombie, soak_faults.CLIENT_STOP_S, "the zombie") is False, event
        assert "not stopped (state Z)" in event["what"] and not faults.later
    finally:
        os.killpg(bench.pid, 9)
        bench.wait()


def test_client_stop_stops_a_live_client(tmp_path):
    # Two live clients and a zombie: whichever the seed picks, it is a live one and it is
    # stopped (state T) until finish() resumes it.
    bench = _group_with_a_zombie(2)
    try:
        faults = soak_faults.Faults(str(tmp_path), str(tmp_path / "cluster.json"), 10, 0, 1,
                                    ["client-stop"], 1, bench.pid)
        for seed in range(8):
            faults.rng.seed(seed)
            event = {"kind": "client-stop"}
            assert faults._client_stop(event) is True, event
            assert soak_probes.proc_state(event["pid"]) == "T"
            faults.finish()
            assert soak_probes.proc_state(event["pid"]) != "T"
    finally:
        os.killpg(bench.pid, 9)
        bench.wait()


def test_later_now_waits_for_the_timer_running_it():
    # finish() while the timer thread is inside the callback (an etcd restart takes up to
    # 60 s) must return only once it has returned: judge reads its result, and the cluster
    # goes down after it. (now() returned at once when the timer had begun: the thread below
    # was done while the callback still waited at the gate.)
    started, gate, ran = threading.Event(), threading.Event(), []

    def fn():
        started.set()
        gate.wait()
        ran.append(1)
    later = soak_faults._Later(0, fn)
    started.wait()
    finisher = threading.Thread(target=later.now)
    finisher.start()
    finisher.join(0.5)
    assert finisher.is_alive() and later.pending
    gate.set()
    finisher.join()
    assert ran == [1] and not later.pending
    later.now()  # once only
    assert ran == [1]


def test_no_fault_while_a_stop_is_pending(tmp_path):
    # Faults due back to back (every 0 s): the second waits until the first one's SIGCONT has
    # run. (It stopped a second client while the first was still stopped.)
    bench = _group_with_a_zombie(3)
    status = {"etcd": {"alive": [0], "placement": [{"id": 0, "served_by": 0, "backups": []}]}}
    try:
        faults = soak_faults.Faults(str(tmp_path), str(tmp_path / "cluster.json"), 0, 0, 0,
                                    ["client-stop"], 1, bench.pid)
        faults.tick(0.0, status)
        faults.tick(0.1, status)
        assert len(faults.events) == 1 and faults.later[0].pending, faults.events
        faults.finish()
        faults.tick(0.2, status)
        assert len(faults.events) == 2, faults.events
        faults.finish()
    finally:
        os.killpg(bench.pid, 9)
        bench.wait()


@pytest.mark.skipif(not farpool_bin().exists(), reason="no farpool binary (build it first)")
def test_stopped_server_not_judged_without_placement(tmp_path):
    # A stopped server that still runs while `cluster status` cannot say who serves its region
    # (here: no cluster in the directory) is a failure saying so, not "serving its region".
    # (It passed as serving its region when a failed status counted as an empty placement.)
    server = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "cluster.json").write_text(json.dumps(
            {"servers": [{"id": 0, "pid": server.pid}]}))
        faults = soak_faults.Faults(str(tmp_path / "nothing"), str(tmp_path / "cluster.json"),
                                    10, 0, 1, ["stop"], 1, os.getpid())
        faults.events.append({"kind": "stop", "t": 12.0, "server": 0, "pid": server.pid})
        failures = faults.judge({})
        assert len(failures) == 1 and failures[0].startswith(
            f"cannot judge stopped server 0 (pid {server.pid}, stopped at t=12.0s): "
            "cluster status failed"), failures
        assert faults.events[0]["outcome"].startswith("runs on; cannot judge"), faults.events
    finally:
        server.kill()
        server.wait()


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


def network_soak(tmp_path, *extra: str) -> tuple[int, list[dict]]:
    """Bank for 50 s over TCP, every server in its own network namespace, 3 servers, replicas 1,
    a fault every 10 s from t = 15 s (the warm-up), each once every region has its backup
    again; `extra` arguments after these. Returns the soak's exit code and its rows."""
    out = tmp_path / "soak_net.jsonl"
    rc = soak.main(["--seconds", "50", "--workloads", "bank", "--transport", "tcp", "--netns",
                    "--servers", "3", "--replicas", "1", "--memory", "64MiB", "--faults", "10",
                    "--interval", "2", "--warmup", "0.3", "--dir", str(tmp_path),
                    "--out", str(out), *extra])
    return rc, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.skipif(not farpool_bin().exists(), reason="no farpool binary (build it first)")
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_soak_network_with_kills(tmp_path):
    # Each fault: a server added, then one SIGKILLed (a primary, then the coordinator).
    rc, rows = network_soak(tmp_path)
    assert len(rows) == 1
    row = rows[0]
    assert row["ok"] and rc == 0, f"soak failed: {row['failures']}"
    assert len(row["faults"]) >= 1, "no server was killed"
    assert row["verify"] == "ok"
    judged = {n for n, v in row["processes"].items() if v["judged"]}
    assert {"etcd", "bench"} <= judged and any(n.startswith("server ") for n in judged) and \
        any(n.startswith("client ") for n in judged), judged


@pytest.mark.skipif(not farpool_bin().exists(), reason="no farpool binary (build it first)")
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_soak_network_with_stops_and_etcd(tmp_path):
    # The other kinds of fault in turn: a primary SIGSTOPped for 1.5-4 s, a client process
    # SIGSTOPped past its session lease, etcd SIGKILLed and started again, then (time
    # permitting) the coordinator stopped (docs/pool.md "Soak with more kinds of fault"): the
    # clients but the stopped one finish, the invariant holds.
    rc, rows = network_soak(tmp_path, "--fault-kinds", "stop,client-stop,etcd", "--clients", "3")
    row = rows[-1]
    assert row["ok"] and rc == 0, f"soak failed: {row['failures']}"
    kinds = [e["kind"] for e in row["faults"]]
    assert kinds[:3] == ["stop", "client-stop", "etcd"], row["faults"]
    assert row["verify"] == "ok"
    stopped = row["faults"][1]
    # The stopped client was fenced and said so (or nobody needed to fence it); no other failed.
    assert stopped["outcome"] == "finished" or stopped["outcome"].startswith("failed"), stopped
    assert {c["pid"] for c in row.get("clients_failed") or []} <= {stopped["pid"]}
    assert row["faults"][2]["restart"].startswith("cluster restart-etcd"), row["faults"][2]


# A program that prints its three clocks, run under a WallClock.
_CLOCKS = """
import json, time
print(json.dumps({n: time.clock_gettime(getattr(time, "CLOCK_" + n))
                  for n in ("REALTIME", "MONOTONIC", "BOOTTIME")}))
"""


def _clocks(env=None) -> dict:
    out = subprocess.run([sys.executable, "-c", _CLOCKS], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(soak_faults.libfaketime() is None, reason="no libfaketime (Debian: faketime)")
def test_wall_clock_steps_realtime_only_and_cleans_up(tmp_path):
    # What the clock-step fault rests on: under the preload CLOCK_REALTIME moves by the offset,
    # CLOCK_MONOTONIC and CLOCK_BOOTTIME (the lease clock) do not (with libfaketime's own
    # default they would: it fakes every clock, the monotonic ones to the faked wall time).
    # Whatever libfaketime left in /dev/shm for them is gone after the `with`.
    with soak_faults.WallClock(soak_faults.libfaketime(), str(tmp_path)) as clock:
        for offset in (3600, -3600):
            clock.step(offset)
            proc = subprocess.Popen([sys.executable, "-c", _CLOCKS], env=clock.env(),
                                    stdout=subprocess.PIPE, text=True)
            clock.pids.add(proc.pid)
            faked = json.loads(proc.communicate()[0])
            real = _clocks()
            assert abs(faked["REALTIME"] - offset - real["REALTIME"]) < 60, (offset, faked, real)
            for name in ("MONOTONIC", "BOOTTIME"):
                assert abs(faked[name] - real[name]) < 60, (name, offset, faked, real)
    assert not [n for n in os.listdir("/dev/shm")
                if any(n.endswith(f"faketime_shm_{p}") or n.endswith(f"faketime_sem_{p}")
                       for p in clock.pids)]
    assert not clock.file.exists()


# The same, once per line read from stdin, in one process that runs on.
_CLOCKS_PER_LINE = """
import json, sys, time
for _ in sys.stdin:
    print(json.dumps({n: time.clock_gettime(getattr(time, "CLOCK_" + n))
                      for n in ("REALTIME", "MONOTONIC", "BOOTTIME")}), flush=True)
"""


@pytest.mark.skipif(soak_faults.libfaketime() is None, reason="no libfaketime (Debian: faketime)")
def test_wall_clock_step_reaches_a_running_process(tmp_path):
    # The soak steps processes that are running (the clock server, the bench): the offset file
    # changed under one process must move its CLOCK_REALTIME by the step at its next reading,
    # and its CLOCK_MONOTONIC and CLOCK_BOOTTIME not at all. Each reading is compared with this
    # process's own clocks read just before and after it (no bound on how long that takes).
    with soak_faults.WallClock(soak_faults.libfaketime(), str(tmp_path)) as clock:
        child = subprocess.Popen([sys.executable, "-c", _CLOCKS_PER_LINE], env=clock.env(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        clock.pids.add(child.pid)
        try:
            for offset in (0, 3600, 0, -3600):
                clock.step(offset)
                before = {n: time.clock_gettime(getattr(time, "CLOCK_" + n))
                          for n in ("REALTIME", "MONOTONIC", "BOOTTIME")}
                child.stdin.write("\n")
                child.stdin.flush()
                line = child.stdout.readline()
                after = {n: time.clock_gettime(getattr(time, "CLOCK_" + n)) for n in before}
                assert line, f"the child exited ({child.poll()})"
                seen = json.loads(line)
                for name, moved in (("REALTIME", offset), ("MONOTONIC", 0), ("BOOTTIME", 0)):
                    assert before[name] <= seen[name] - moved <= after[name], \
                        (offset, name, before, seen, after)
        finally:
            child.stdin.close()
            child.wait()
    assert not clock.file.exists()


@pytest.mark.skipif(not farpool_bin().exists(), reason="no farpool binary (build it first)")
@pytest.mark.skipif(soak_faults.libfaketime() is None, reason="no libfaketime (Debian: faketime)")
def test_bench_timeline_ignores_wall_clock_steps(tmp_path):
    # The soak judges "commits go on after a step" from `bench txn --timeline-ms`: its buckets
    # must not move with the wall clock. Local engine, one process, stepped +1 h, back to the
    # host's time, then -1 h while it runs: every commit is in a bucket between the process's
    # start and its exit on this host's steady clock (not the 3 s asked: transactions that end
    # late on a loaded host fall after them). (With the timeline on the wall clock, main's
    # a092ccd: the +1 h step put commits 3,600 s of buckets later, and after the step back
    # behind the start they fell out of it.)
    with soak_faults.WallClock(soak_faults.libfaketime(), str(tmp_path)) as clock:
        started = time.monotonic()
        bench = subprocess.Popen(
            [str(farpool_bin()), "bench", "txn", "--engine", "local", "--workload", "bank",
             "--threads", "2", "--seconds", "3", "--warmup", "0", "--timeline-ms", "100",
             "--json"], env=clock.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        clock.pids.add(bench.pid)
        while "loaded" not in bench.stderr.readline():
            assert bench.poll() is None, bench.stderr.read()
        for offset in (3600, 0, -3600):
            time.sleep(0.6)
            clock.step(offset)
        out, err = bench.communicate()
        lived_ms = (time.monotonic() - started) * 1000
    assert bench.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    commits, timeline = result["commits"], result["timeline"]["commits"]
    assert commits > 0 and len(timeline) <= lived_ms // 100 + 1, (commits, len(timeline), lived_ms)
    # Commits of the run's last transactions (ended after its end) are in the timeline only.
    assert commits <= sum(timeline) <= commits + 2, (commits, sum(timeline))


def _pids_not_running(n: int) -> list[int]:
    """`n` pids that no process has now (from the top of the range: the last to be reused)."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    return list(itertools.islice((p for p in range(top - 1, 1, -1)
                                  if not Path(f"/proc/{p}").exists()), n))


def test_wall_clock_removes_only_its_processes_files(tmp_path):
    # libfaketime names its files by the pid of the first preloaded process of a chain and
    # leaves them when that process dies unclean (SIGKILL, or as a Python process sometimes
    # does): the clock removes those of its processes, nobody else's, and none of a pid that
    # runs now (reused by someone, who may be another libfaketime user).
    shm = tmp_path / "shm"
    shm.mkdir()
    ours, other, never = _pids_not_running(3)
    running = os.getpid()
    for pid in (ours, other, running):
        (shm / f"faketime_shm_{pid}").touch()
        (shm / f"sem.faketime_sem_{pid}").touch()
    with soak_faults.WallClock("/nonexistent/libfaketime.so", str(tmp_path), str(shm)) as clock:
        clock.pids |= {ours, running, never}
        assert clock.file.read_text() == "+0\n"
        env = clock.env()
        assert env["LD_PRELOAD"].startswith("/nonexistent/libfaketime.so")
        assert env["DONT_FAKE_MONOTONIC"] == "1" and env["FAKETIME_NO_CACHE"] == "1"
        assert env["FAKETIME_TIMESTAMP_FILE"] == str(clock.file)
    assert sorted(os.listdir(shm)) == sorted(
        f"{kind}_{pid}" for pid in (other, running)
        for kind in ("faketime_shm", "sem.faketime_sem")), os.listdir(shm)
    assert not clock.file.exists()


def _mapped_library() -> str:
    """A shared library this process has mapped (as the stepped processes have libfaketime)."""
    return next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if ".so" in line.split()[-1])


def _clock_faults(tmp_path, kinds=("clock-step",), every=0,
                  lib="/nonexistent/libfaketime.so", bench_seconds=None) -> soak_faults.Faults:
    # Four servers, this process standing for each (the clock server is 3); no bench.
    (tmp_path / "cluster.json").write_text(json.dumps({"servers": [
        {"id": i, "pid": os.getpid()} for i in range(4)]}))
    clock = soak_faults.WallClock(lib, str(tmp_path))
    return soak_faults.Faults(str(tmp_path), str(tmp_path / "cluster.json"), every, 0, 1,
                              list(kinds), 1, 2 ** 22 + 1, clock, 3, bench_seconds)


def _status(epoch: int, alive=(0, 1, 2, 3), suspected=()) -> dict:
    return {"etcd": {"epoch": epoch, "alive": list(alive), "suspected": list(suspected),
                     "coordinator": 0,
                     "placement": [{"id": i, "served_by": i, "backups": [(i + 1) % 4]}
                                   for i in range(4)]}}


def test_clock_steps_go_forward_and_back_one_at_a_time(tmp_path):
    # Faults due back to back: the offsets +1 h, 0, -1 h, 0 in turn (steps +1 h, -1 h, -1 h,
    # +1 h), each written to the clock's file, each event with its step and the map it saw.
    faults = _clock_faults(tmp_path)
    for i in range(5):
        faults.tick(float(i), _status(7))
    assert [e["offset_s"] for e in faults.events] == [3600, 0, -3600, 0, 3600]
    assert [e["step_s"] for e in faults.events] == [3600, -3600, -3600, 3600, 3600]
    assert faults.clock.file.read_text() == "+3600\n"
    assert all(e["epoch"] == 7 and e["epochs_in_window"] == [7] and e["samples"] == 1
               for e in faults.events[:-1]), faults.events
    assert all("window_end_ms" in e for e in faults.events[:-1])
    faults.clock.__exit__(None, None, None)


def test_clock_step_judge_fails_on_a_changed_map_a_suspicion_or_no_commits(tmp_path):
    # The window of a step (until the next action) must see the same epoch, the same live
    # servers, no suspicion, and commits after the step; the clock server serves its region.
    faults = _clock_faults(tmp_path, every=10, lib=_mapped_library())
    faults._placement = lambda: ({i: i for i in range(4)}, "")
    faults.tick(0.0, _status(7))
    step = faults.events[0]
    start = step["wall_ms"] - 5500
    timeline = {"start_unix_ms": start, "bucket_ms": 1000, "commits": [100] * 12}
    faults.tick(1.0, _status(7))  # a sample in its window
    faults._close_clock_window()
    step["window_end_ms"] = start + 12000
    assert faults.judge({}, timeline) == [], faults.events
    assert step["commits_after"] == 600 and step["tps_after"] == 100, step
    assert step["outcome"].startswith("nothing changed: epoch 7"), step
    assert step["under_clock"] == ["server 3"], step

    faults = _clock_faults(tmp_path, every=10)
    faults._placement = lambda: ({0: 0, 1: 1, 2: 2, 3: 0}, "")
    faults.tick(0.0, _status(7))
    faults.tick(0.5, _status(8, alive=(0, 1, 2), suspected=(3,)))
    faults.tick(1.0, _status(8, alive=(0, 1, 2)))
    faults._close_clock_window()
    step = faults.events[0]
    step["window_end_ms"] = step["wall_ms"] + 6000
    start = step["wall_ms"] - 5500
    dead = {"start_unix_ms": start, "bucket_ms": 1000, "commits": [100] * 6 + [0] * 6}
    failures = faults.judge({}, dead)
    assert len(failures) == 6, failures
    for words in ("epoch 7 -> [8]", "servers [3] lost their etcd lease",
                  "servers [3] were reported gone", "no commit in the 5 s after it",
                  "clock server 3: its region is served by 0",
                  "libfaketime is not mapped in server 3: the step did not reach them"):
        assert any(words in f for f in failures), (words, failures)
    assert any(f.endswith("cannot tell whether commits went on") for f in faults.judge({}, None))
    faults.clock.__exit__(None, None, None)


def _judged_step(tmp_path, step_at_ms: int, window_end_ms: int, commits: list[int],
                 bench_seconds=None) -> tuple[dict, list[str]]:
    """One clock step with nothing else wrong, judged on a timeline of `commits` (1 s buckets)
    that starts at 0 ms: the step at `step_at_ms` and its window's end at `window_end_ms` of it.
    """
    faults = _clock_faults(tmp_path, every=10, lib=_mapped_library(),
                           bench_seconds=bench_seconds)
    faults._placement = lambda: ({i: i for i in range(4)}, "")
    faults.tick(0.0, _status(7))
    faults.tick(1.0, _status(7))
    faults._close_clock_window()
    step = faults.events[0]
    start = step["wall_ms"] - step_at_ms
    step["window_end_ms"] = start + window_end_ms
    failures = faults.judge({}, {"start_unix_ms": start, "bucket_ms": 1000, "commits": commits})
    faults.clock.__exit__(None, None, None)
    return step, failures


def test_clock_step_with_no_whole_bucket_after_it_is_not_judged(tmp_path):
    commits = [10 * (i + 1) for i in range(12)] + [3]  # 12 s measured, then late commits
    # A step before the bench's common start: its window's buckets from the first (a negative
    # index would have counted from the timeline's end: an empty slice, passed).
    step, failures = _judged_step(tmp_path, -2500, 4000, commits)
    assert not failures and step["buckets_after"] == 4, (failures, step)
    assert step["commits_after"] == 10 + 20 + 30 + 40, step
    # A step in the run's last whole bucket: the bucket after the measured seconds holds only
    # late commits, so nothing is left to judge: not judged, and not a pass.
    step, failures = _judged_step(tmp_path, 11500, 20000, commits, bench_seconds=12)
    assert not failures and step["buckets_after"] == 0, (failures, step)
    assert step["outcome"].startswith("not judged: no whole bucket after it"), step
    # Less than a whole bucket between the step and its window's end: the same.
    step, failures = _judged_step(tmp_path, 3500, 4900, commits)
    assert not failures and step["outcome"].startswith("not judged"), (failures, step)


def test_clock_step_judge_fails_when_commits_stall_for_the_window(tmp_path):
    # Commits in the first second after the step, none in the four after: not resumed.
    step, failures = _judged_step(tmp_path, 5500, 11000, [100] * 7 + [0] * 5)
    assert len(failures) == 1 and "commits had not resumed by its window's end: none in its " \
        "last 4 s of 5" in failures[0], (failures, step)
    step, failures = _judged_step(tmp_path, 5500, 11000, [100] * 6 + [0] * 4 + [100] * 2)
    assert not failures and step["outcome"].startswith("nothing changed"), (failures, step)


def test_clock_window_counts_a_server_that_registered_again(tmp_path):
    # Server 2 misses from etcd's alive keys at one sample and is back at the next; a sample
    # that could not read etcd is skipped (not "nobody alive", nor "epoch None").
    faults = _clock_faults(tmp_path, every=10, lib=_mapped_library())
    faults._placement = lambda: ({i: i for i in range(4)}, "")
    unreadable = {"etcd": {"error": "etcd unreachable: connection refused"}}
    faults.tick(0.0, unreadable)  # no step taken on a status without the map
    assert not faults.events and faults.clock.offset == 0
    faults.tick(0.5, _status(7))
    faults.tick(1.0, unreadable)
    faults.tick(1.5, _status(7, alive=(0, 1, 3)))
    faults.tick(2.0, _status(7))
    faults._close_clock_window()
    step = faults.events[0]
    assert step["samples"] == 2 and step["samples_unreadable"] == 1, step
    failures = faults.judge({}, None)
    assert any("servers [2] lost their etcd lease" in f for f in failures), failures
    assert not any("epoch" in f for f in failures), failures
    faults.clock.__exit__(None, None, None)
    # Only unreadable samples: nothing was seen, which is no pass.
    faults = _clock_faults(tmp_path, every=10, lib=_mapped_library())
    faults._placement = lambda: ({i: i for i in range(4)}, "")
    faults.tick(0.0, _status(7))
    faults.tick(1.0, unreadable)
    faults._close_clock_window()
    assert any("no sample of its window could read etcd (1 could not)" in f
               for f in faults.judge({}, None)), faults.events
    faults.clock.__exit__(None, None, None)


def test_no_clock_step_after_the_benchs_measured_seconds(tmp_path):
    faults = _clock_faults(tmp_path, bench_seconds=20)
    faults.tick(19.0, _status(7))
    faults.tick(20.0, _status(7))
    faults.tick(22.0, _status(7))
    assert [e["t"] for e in faults.events] == [19.0], faults.events
    assert faults.clock.offset == 3600
    faults.clock.__exit__(None, None, None)


def _fake_farpool(tmp_path, monkeypatch, body: str) -> Path:
    """FARPOOL_BIN set to a shell script with `body`; returns the file its pid is written to."""
    script, pid_file = tmp_path / "farpool", tmp_path / "add.pid"
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("FARPOOL_BIN", str(script))
    return pid_file


def test_cluster_add_that_hangs_is_killed_and_failed(tmp_path, monkeypatch):
    # Both adds (a kill's server, the clock server) go through `cluster_add`: one that hangs is
    # killed and recorded failed, the soak goes on; a failed one says why.
    pid_file = _fake_farpool(tmp_path, monkeypatch, "echo adding >&2\nexec sleep 600")
    monkeypatch.setattr(soak_faults, "ADD_TIMEOUT_S", 0.5)
    with soak_faults.WallClock("/nonexistent/libfaketime.so", str(tmp_path)) as clock:
        server = soak_faults.add_clock_server(str(tmp_path), str(tmp_path / "cluster.json"), clock)
        pid = int(pid_file.read_text())
        assert proc_state_gone(pid), pid
        assert clock.pids == {pid}, clock.pids
    assert list(server) == ["add"] and server["add"].startswith(
        "failed: cluster add did not finish within 0.5 s, killed: ") and \
        "adding" in server["add"], server  # (and ld.so: it cannot preload the library)
    faults = _clock_faults(tmp_path, ("kill",))
    faults.tick(0.0, _status(7))
    assert faults.added["add"].startswith("failed: cluster add did not finish"), faults.added
    assert proc_state_gone(int(pid_file.read_text()))
    faults.clock.__exit__(None, None, None)
    _fake_farpool(tmp_path, monkeypatch, "echo 'no room: 3 servers' >&2\nexit 3")
    assert soak_faults.cluster_add(str(tmp_path), []) == (False, "failed (3): no room: 3 servers")


def proc_state_gone(pid: int) -> bool:
    return soak_probes.proc_state(pid) is None


def test_server_faults_spare_the_clock_server(tmp_path):
    # Kills and stops never pick the clock server (its steps must be judged on a live server),
    # nor as the coordinator: a primary instead.
    faults = _clock_faults(tmp_path, ("kill",))
    status = _status(7)
    status["etcd"]["coordinator"] = 3
    picked = []
    for turn in range(4):
        faults.server_faults = turn
        event = {"kind": "stop"}
        faults._stop = lambda e, pid, span, name: picked.append(e["server"]) or True
        assert faults._server(event, status) is True
    assert 3 not in picked and picked, picked
    # The clock server as a primary, another server the coordinator: over turns 0-5 the
    # primaries' turns would pick it (1, 3, 2) but for the rule.
    status["etcd"]["coordinator"] = 0
    picked, events = [], []
    for turn in range(6):
        faults.server_faults = turn
        events.append({"kind": "stop"})
        assert faults._server(events[-1], status) is True
    assert picked == [1, 0, 1, 0, 1, 0], picked
    assert [e["role"] for e in events[:2]] == ["primary", "coordinator"], events
    # The coordinator is the clock server: its turns take a primary, and the event says so.
    status["etcd"]["coordinator"] = 3
    event = {"kind": "stop"}
    faults.server_faults = 1
    assert faults._server(event, status) is True
    assert event["role"] == "primary (the coordinator 3 is the clock server)", event
    assert event["spared"] == "the coordinator 3 is the clock server", event
    faults.clock.__exit__(None, None, None)


@pytest.mark.skipif(not farpool_bin().exists(), reason="no farpool binary (build it first)")
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_soak_network_replicas2_with_stops(tmp_path):
    # Two backups (4 servers, replicas 2), a server SIGSTOPped for 1.5-4 s at every fault (a
    # primary, then the coordinator, ...). It failed half the time before "Pipelined forwards to
    # further backups" (docs/pool.md, "Soak with more kinds of fault", finding 1): the primaries
    # that forward to a stopped further backup stopped answering and were taken for gone too.
    rc, rows = network_soak(tmp_path, "--servers", "4", "--replicas", "2", "--fault-kinds",
                            "stop")
    row = rows[-1]
    assert row["ok"] and rc == 0, f"soak failed: {row['failures']}"
    assert row["verify"] == "ok"
    assert row["cluster_up_extra"] == ["--mirror-slots", "6"], row["cluster_up_extra"]
    assert row["faults"] and {e["kind"] for e in row["faults"]} == {"stop"}, row["faults"]
    assert all(e["outcome"] in ("exited (fenced itself)", "runs on, serving its region")
               for e in row["faults"]), row["faults"]
    assert not row.get("clients_failed"), row["clients_failed"]


@pytest.mark.skipif(not farpool_bin().exists(), reason="no farpool binary (build it first)")
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.skipif(soak_faults.libfaketime() is None, reason="no libfaketime (Debian: faketime)")
def test_soak_network_with_clock_steps(tmp_path):
    # The bench's processes and an added server under libfaketime, their wall clock stepped
    # +1 h, -1 h, -1 h, +1 h (one step every 10 s): nothing may change — no client fails or
    # gives a session up, no server is suspected, lost or failed over, commits go on after
    # every step, the invariant holds (docs/pool.md "Clock steps").
    rc, rows = network_soak(tmp_path, "--fault-kinds", "clock-step")
    row = rows[-1]
    assert row["ok"] and rc == 0, f"soak failed: {row['failures']}"
    assert row["verify"] == "ok"
    steps = row["faults"]
    assert len(steps) >= 2 and [e["step_s"] for e in steps] == \
        [3600, -3600, -3600, 3600, 3600][:len(steps)], steps
    assert all(e["outcome"].startswith(("nothing changed", "not judged")) for e in steps), steps
    judged = [e for e in steps if e["outcome"].startswith("nothing changed")]
    assert judged and all(e["commits_after"] > 0 for e in judged), steps
    assert not row.get("clients_failed") and row["session_restarts"] == 0, row
    assert f"server {row['clock_server']['id']}" in row["processes"], row["processes"].keys()
