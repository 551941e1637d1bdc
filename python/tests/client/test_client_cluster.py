"""farpool.LocalCluster leaves nothing behind, and the README's Python example runs as written."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import farpool
from farpool.repo import ROOT


def gone(pid):
    """No such process, or a zombie (dead; reparented servers wait for init to reap them)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def server_pids(cluster_file):
    return [s["pid"] for s in json.loads(Path(cluster_file).read_text())["servers"]]


def test_leaving_the_block_by_an_exception_stops_everything():
    with pytest.raises(RuntimeError, match="boom"):
        with farpool.LocalCluster(servers=2, memory="32MiB") as c:
            directory = c.directory
            pids = server_pids(c.cluster_file)
            assert all(not gone(p) for p in pids)
            pool = farpool.Pool.connect(c.cluster_file)
            pool.write(pool.alloc(8), b"12345678")
            raise RuntimeError("boom")
    assert all(gone(p) for p in pids)
    assert not any(Path(f"/dev/shm/farpool-ucx-{p}").exists() for p in pids)
    assert not directory.exists()
    c.stop()  # idempotent


def test_a_start_that_fails_says_why_and_leaves_nothing():
    c = farpool.LocalCluster(servers=2, memory="100TiB")
    with pytest.raises(farpool.Error, match="100 TiB|MemAvailable|available"):
        c.start()
    assert c.directory is None


def test_a_call_that_waits_lets_other_threads_run():
    # Pool.connect waits for a stopped server, which only this thread can wake: were the GIL
    # held while the call waits, this thread could not run until the connect gave up.
    with farpool.LocalCluster(servers=1, memory="32MiB") as c:
        (pid,) = server_pids(c.cluster_file)
        outcome = {}

        def connect():
            entered.set()
            try:
                outcome["pool"] = farpool.Pool.connect(c.cluster_file)
            except farpool.Error as e:
                outcome["error"] = e

        entered = threading.Event()
        os.kill(pid, signal.SIGSTOP)
        try:
            waiter = threading.Thread(target=connect)
            waiter.start()
            entered.wait()
        finally:
            os.kill(pid, signal.SIGCONT)
        waiter.join()
        assert "error" not in outcome, outcome.get("error")
        assert outcome["pool"].server_ids == [0]


def python_blocks(markdown):
    return re.findall(r"```python\n(.*?)```", markdown, re.S)


def test_the_readme_example_runs_as_written():
    (example,) = [b for b in python_blocks((ROOT / "README.md").read_text())
                  if "farpool.LocalCluster(servers=2" in b]
    run = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "100\n"


def test_the_example_program_runs():
    run = subprocess.run([sys.executable, str(ROOT / "python" / "examples" / "bank.py")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "money conserved" in run.stdout


def test_the_cluster_secret_is_read_through_the_cluster_file(cluster, tmp_path):
    """The cluster file names the secret's file (owner-only); a cluster file naming another
    cluster's secret is refused with PermissionDenied, which the server counts."""
    doc = json.loads(Path(cluster.cluster_file).read_text())
    assert doc["secret_file"] == "cluster.secret"
    secret = Path(cluster.cluster_file).parent / doc["secret_file"]
    assert secret.stat().st_mode & 0o777 == 0o600
    assert secret.read_text().strip() not in Path(cluster.cluster_file).read_text()
    wrong = tmp_path / "wrong.secret"
    wrong.write_text(os.urandom(32).hex() + "\n")
    wrong.chmod(0o600)
    doc["secret_file"] = str(wrong)
    (tmp_path / "cluster.json").write_text(json.dumps(doc))
    pool = farpool.Pool.connect(cluster.cluster_file)
    before = pool.stats(0)["auth_refused"]
    with pytest.raises(farpool.PermissionDenied,
                       match="authentication failed: wrong cluster secret"):
        farpool.Pool.connect(str(tmp_path / "cluster.json"))
    assert pool.stats(0)["auth_refused"] == before + 1


def test_a_replicated_cluster_keeps_every_byte_when_a_server_is_killed():
    with farpool.LocalCluster(servers=3, memory="32MiB", transport="tcp", progress="event",
                              replicas=1) as c:
        assert json.loads(Path(c.cluster_file).read_text())["replicas"] == 1
        pool = farpool.Pool.connect(c.cluster_file)
        written = {}
        for server in range(3):
            for i in range(8):
                address = pool.alloc(64, server=server)
                written[address] = bytes([server * 16 + i]) * 64
                pool.write(address, written[address])
        os.kill(server_pids(c.cluster_file)[1], signal.SIGKILL)

        # While the failover runs, calls may fail with Unavailable: on the dead server, and on
        # its predecessor, which serves nothing while its backup (the dead one) is silent until
        # the coordinator has it go on alone. Each call is retried until it succeeds; the 30 s
        # only bound a broken run.
        def retrying(call):
            deadline = time.monotonic() + 30
            while True:
                try:
                    return call()
                except farpool.Unavailable:
                    assert time.monotonic() < deadline, "the failover did not end"
                    time.sleep(0.05)

        for address, data in written.items():
            assert retrying(lambda: pool.read(address, 64)) == data
        # Server 1's data now lives at its backup, which takes new writes too.
        address = next(a for a in written if retrying(lambda: pool.read(a, 64))[0] // 16 == 1)
        retrying(lambda: pool.write(address, b"x" * 64))
        assert retrying(lambda: pool.read(address, 64)) == b"x" * 64


def test_a_pools_client_reads_only_its_pools_memory():
    """`farpool cluster pool add` writes a pool's credential and cluster file; its client gets
    its own root area and is refused another pool's bytes with PermissionDenied, which the
    server counts (docs/pool.md "Pools")."""
    from farpool._build import farpool_binary
    with farpool.LocalCluster(servers=1, memory="32MiB", transport="tcp", progress="event") as c:
        directory = Path(c.cluster_file).parent
        for name in ("a", "b"):
            subprocess.run([str(farpool_binary()), "cluster", "pool", "add", "--dir",
                            str(directory), name], check=True, capture_output=True)
        assert (directory / "pools" / "a.secret").stat().st_mode & 0o777 == 0o600
        a = farpool.Pool.connect(str(directory / "cluster-a.json"))
        b = farpool.Pool.connect(str(directory / "cluster-b.json"))
        assert a.access_path(0) == "messages"
        assert a.root(0) != b.root(0) != farpool.Pool.connect(c.cluster_file).root(0)
        theirs = b.alloc(8)
        b.write(theirs, b"b's data")
        before = b.stats(0)["pool_refused"]
        with pytest.raises(farpool.PermissionDenied, match="pool 'a' may not touch offset"):
            a.read(theirs, 8)
        with pytest.raises(farpool.PermissionDenied, match="pool 'a' may not touch offset"):
            a.write(theirs, b"a's data")
        assert b.read(theirs, 8) == b"b's data"
        assert b.stats(0)["pool_refused"] == before + 2
