"""PostgreSQL with its data directory on `farpool mount` (issue 10): initdb, pgbench with fsync
on, a crash (`pg_ctl stop -m immediate`: no checkpoint), the filesystem unmounted and mounted
again, and PostgreSQL's WAL recovery from what the pool held. pgbench's invariants must hold
before and after, and every transaction pgbench counted as committed must be in the history."""

import os
import subprocess

import pytest

from farpool.harness import peers

CLIENTS, TRANSACTIONS = 4, 150


def totals(pg: peers.Postgres) -> tuple[int, ...]:
    """The history's row count, then the sums of the deltas and of the account, teller and
    branch balances (TPC-B's consistency conditions: the four sums are equal)."""
    out = pg.psql("SELECT (SELECT count(*) FROM pgbench_history), "
                  "(SELECT coalesce(sum(delta), 0) FROM pgbench_history), "
                  "(SELECT sum(abalance) FROM pgbench_accounts), "
                  "(SELECT sum(tbalance) FROM pgbench_tellers), "
                  "(SELECT sum(bbalance) FROM pgbench_branches);")
    return tuple(int(v) for v in out.strip().split("|"))


def pgbench(pg: peers.Postgres, *args: str) -> str:
    out = subprocess.run(["pgbench", *pg.conn_args(), *args, "postgres"],
                               capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"pgbench {' '.join(args)}: {out.stderr[-600:]}"
    return out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting (FUSE, allow_other) needs root")
@pytest.mark.skipif(peers.mount_available() is not None, reason=str(peers.mount_available()))
@pytest.mark.skipif(not (peers.PG_BIN / "initdb").exists(), reason="no PostgreSQL 15 (make setup)")
def test_pgbench_survives_a_crash_and_a_remount():
    mount = peers.FarpoolMount("shm", servers=2, memory="1GiB", name="pgdata")
    with mount as mountpoint, peers.Postgres(in_ram=False, shared_buffers="16MB", directory=mountpoint) as pg:
        assert pg.data.startswith(mountpoint)
        assert pg.psql("SHOW fsync;").strip() == "on"
        pgbench(pg, "-i", "-s", "1", "-q")
        out = pgbench(pg, "-n", "-M", "prepared", "-c", str(CLIENTS), "-j", "2", "-t",
                      str(TRANSACTIONS))
        assert f"number of transactions actually processed: {CLIENTS * TRANSACTIONS}/" in out, out
        before = totals(pg)
        assert before[0] == CLIENTS * TRANSACTIONS
        assert before[1] == before[2] == before[3] == before[4], before

        pg.stop("immediate")
        mount.remount()
        pg.start()  # replays the WAL written through the old mount
        assert totals(pg) == before
        assert pg.psql("SELECT count(*) FROM pgbench_accounts;").strip() == "100000"
