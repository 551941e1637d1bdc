"""Pool.close() and Database.close(): explicit, idempotent, context managers; a closed object
raises farpool.Closed naming what was closed."""
import threading

import pytest

import farpool


def test_pool_close_is_explicit_and_idempotent(cluster):
    with farpool.Pool.connect(cluster.cluster_file) as pool:
        a = pool.alloc(64)
        pool.write(a, b"closing")
        assert pool.read(a, 7) == b"closing"  # cached method, then closed below
        pool.free(a)
        assert not pool.closed
    assert pool.closed
    with pytest.raises(farpool.Closed, match="Pool is closed.*read"):
        pool.read(a, 7)
    with pytest.raises(farpool.Closed):
        pool.transport
    with pytest.raises(farpool.Closed):
        with pool:
            pass
    pool.close()  # idempotent
    assert isinstance(farpool.Closed("x"), farpool.Error) and "closed" in repr(pool)


def test_a_batch_keeps_its_pool_until_it_goes(cluster, pool):
    closing = farpool.Pool.connect(cluster.cluster_file)
    a = pool.alloc(8)
    pool.write(a, bytes(8))
    batch = closing.batch()
    closing.close()
    with pytest.raises(farpool.Closed):
        closing.batch()
    i = batch.fetch_add(a, 5)  # the native pool lives on with the batch
    assert batch.wait()[i] == 0
    del batch
    assert int.from_bytes(pool.read(a, 8), "little") == 5
    pool.free(a)


def test_database_close_drops_every_threads_session(cluster):
    db = farpool.Database.open(cluster=cluster.cluster_file)
    t = db.create_table("close_acct", [("balance", "int64")])
    with db.transaction() as txn:
        txn.put(t, 1, {"balance": 7})

    def other_thread():
        with db.transaction() as txn:
            assert txn.get(t, 1)["balance"] == 7

    th = threading.Thread(target=other_thread)
    th.start()
    th.join()
    with db:
        assert db.run(lambda txn: txn.get(t, 1)["balance"]) == 7
    assert db.closed
    for call in (db.transaction, db.list_tables, lambda: db.open_table("close_acct"),
                 lambda: db.run(lambda txn: None), lambda: db.engine):
        with pytest.raises(farpool.Closed, match="Database is closed"):
            call()
    db.close()  # idempotent
    assert "closed" in repr(db)

    # The data is the database's, not the handle's: another handle reads it.
    with farpool.Database.open(cluster=cluster.cluster_file) as again:
        assert again.run(lambda txn: txn.get(again.open_table("close_acct"), 1)["balance"]) == 7
        again.drop_table("close_acct")


def test_local_database_as_context_manager():
    with farpool.Database.open(engine="local") as db:
        t = db.create_table("t", [("v", "int64")])
        db.run(lambda txn: txn.put(t, 1, {"v": 1}))
    with pytest.raises(farpool.Closed):
        db.create_table("u", [("v", "int64")])
