"""The benchmarks' local cluster (peers.Cluster) leaves nothing running behind it."""
import json
import os

import pytest

from farpool.harness import peers


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, which nobody may reap in a container, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not peers.farpool_bin().exists(), reason="no farpool binary (build it first)")
def test_a_cluster_whose_down_fails_is_kept_and_said(tmp_path, monkeypatch):
    cluster = peers.Cluster(servers=1, memory="16MiB", parent=str(tmp_path))
    path = cluster.__enter__()
    pid = json.loads(open(path).read())["servers"][0]["pid"]
    real = peers.farpool_bin()
    try:
        monkeypatch.setattr(peers, "farpool_bin", lambda: tmp_path / "no-such-farpool")
        with pytest.raises(RuntimeError, match="the directory is kept"):
            cluster.__exit__(None, None, None)
        assert os.path.exists(path), "the cluster's file went with its servers running"
        assert running(pid), "the server was stopped though cluster down failed"
    finally:
        monkeypatch.setattr(peers, "farpool_bin", lambda: real)
        cluster.__exit__(None, None, None)
    assert not os.path.exists(cluster.dir)
    assert not running(pid), f"server pid {pid} runs after cluster down"


def test_a_cluster_under_a_parent_not_made_yet_makes_it(tmp_path):
    parent = tmp_path / "runs" / "soak"
    cluster = peers.Cluster(servers=1, memory="16MiB", parent=str(parent))
    assert os.path.isdir(cluster.dir)
    assert os.path.dirname(cluster.dir) == str(parent)
