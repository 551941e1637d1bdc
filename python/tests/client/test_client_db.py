"""farpool.Database from Python: schemas, rows as dicts, transactions, conflicts, retries."""
import itertools
import threading

import pytest

import farpool

_names = itertools.count()


def fresh(db, columns, **options):
    """A table of its own for each test (the session's database is shared)."""
    return db.create_table(f"t{next(_names)}", columns, **options)


def test_rows_are_dicts_of_every_column_type(db):
    t = fresh(db, [("n", "int64"), ("x", "double"), ("name", "char", 8), ("blob", "bytes")])
    assert t.columns == [("n", "int64"), ("x", "double"), ("name", "char", 8), ("blob", "bytes")]
    with db.transaction() as txn:
        txn.put(t, 1, {"n": -5, "x": 2.5, "name": "ünï", "blob": b"\x00" * 1000})
        txn.put(t, 2, (7, 1.0, b"abc", bytearray(b"xyz")))  # a sequence: every column in order
        txn.put(t, 3, {"n": 1})  # absent columns are zero or empty
    with db.transaction() as txn:
        assert txn.get(t, 1) == {"n": -5, "x": 2.5, "name": "ünï", "blob": b"\x00" * 1000}
        assert txn.get(t, 2) == {"n": 7, "x": 1.0, "name": "abc", "blob": b"xyz"}
        assert txn.get(t, 3) == {"n": 1, "x": 0.0, "name": "", "blob": b""}
        assert txn.get(t, 4) is None


def test_bad_rows_and_schemas_say_what_is_wrong(db):
    t = fresh(db, [("n", "int64"), ("name", "char", 4)])
    with db.transaction() as txn:
        with pytest.raises(farpool.InvalidArgument, match="no column 'nope'.*columns: n, name"):
            txn.put(t, 1, {"nope": 1})
        with pytest.raises(farpool.InvalidArgument, match="at most 4 bytes, got 5"):
            txn.put(t, 1, {"name": "12345"})
        with pytest.raises(TypeError, match="int64"):
            txn.put(t, 1, {"n": "1"})
        with pytest.raises(farpool.InvalidArgument, match="2 columns, the row gives 1"):
            txn.put(t, 1, [1])
    with pytest.raises(farpool.InvalidArgument, match="unknown column type 'text'"):
        fresh(db, [("s", "text")])
    with pytest.raises(farpool.InvalidArgument, match="length"):
        fresh(db, [("s", "char")])
    for malformed in (["abc"], [("s", "char", -1)], [("s", 5)], [("s",)]):
        with pytest.raises(farpool.InvalidArgument, match="a column is"):
            fresh(db, malformed)
    with pytest.raises(farpool.AlreadyExists, match=t.name):
        db.create_table(t.name, [("n", "int64")])
    with pytest.raises(farpool.NotFound, match="no_such_table"):
        db.open_table("no_such_table")


def test_open_table_finds_what_create_made(db):
    t = fresh(db, [("v", "int64")], ordered=True)
    again = db.open_table(t.name)
    assert (again.id, again.name, again.ordered) == (t.id, t.name, True)
    assert t.name in db.list_tables()


def test_delete_scan_and_multi_get(db):
    t = fresh(db, [("v", "int64")], ordered=True)
    with db.transaction() as txn:
        for k in range(10):
            txn.put(t, k, {"v": k * k})
    with db.transaction() as txn:
        txn.delete(t, 3)
        with pytest.raises(farpool.NotFound):
            txn.delete(t, 100)
    with db.transaction() as txn:
        assert txn.scan(t, 2, 5) == [(2, {"v": 4}), (4, {"v": 16}), (5, {"v": 25})]
        assert txn.scan(t, limit=2, reverse=True) == [(9, {"v": 81}), (8, {"v": 64})]
        assert txn.multi_get([(t, 1), (t, 3), (t, 9)]) == [{"v": 1}, None, {"v": 81}]


def test_a_block_that_raises_rolls_back(db):
    t = fresh(db, [("v", "int64")])
    with pytest.raises(RuntimeError):
        with db.transaction() as txn:
            txn.put(t, 1, {"v": 1})
            raise RuntimeError("changed my mind")
    with db.transaction() as txn:
        assert txn.get(t, 1) is None
        txn.put(t, 1, {"v": 2})
        txn.commit()  # explicitly: leaving the block then does nothing more
        assert txn.finished
        with pytest.raises(farpool.InvalidArgument, match="finished"):
            txn.get(t, 1)


def test_first_committer_wins_and_the_loser_gets_aborted(db):
    t = fresh(db, [("v", "int64")])
    with db.transaction() as txn:
        txn.put(t, 1, {"v": 0})
    a, b = db.session().begin(), db.session().begin()
    assert a.get(t, 1) == {"v": 0} and b.get(t, 1) == {"v": 0}  # both snapshots taken
    a.put(t, 1, {"v": 1})
    b.put(t, 1, {"v": 2})
    a.commit()
    with pytest.raises(farpool.Aborted) as lost:
        b.commit()
    assert isinstance(lost.value, farpool.Error) and str(lost.value)
    with db.transaction() as txn:
        assert txn.get(t, 1) == {"v": 1}


def test_run_retries_aborted_and_returns_the_result(db):
    t = fresh(db, [("v", "int64")])
    with db.transaction() as txn:
        txn.put(t, 1, {"v": 10})
    rival = db.session()
    attempts = []

    def increment(txn):
        v = txn.get(t, 1)["v"]
        attempts.append(v)
        if len(attempts) == 1:  # another session commits in between: this attempt must abort
            with rival.begin() as other:
                other.put(t, 1, {"v": 100})
        txn.put(t, 1, {"v": v + 1})
        return v + 1

    assert db.run(increment) == 101
    assert attempts == [10, 100]
    with db.transaction() as txn:
        assert txn.get(t, 1) == {"v": 101}


def test_run_raises_other_exceptions_at_once_and_commits_nothing(db):
    t = fresh(db, [("v", "int64")])
    calls = []

    def body(txn):
        calls.append(1)
        txn.put(t, 1, {"v": 1})
        raise KeyError("not a conflict")

    with pytest.raises(KeyError, match="not a conflict"):
        db.run(body)
    assert calls == [1]
    with db.transaction() as txn:
        assert txn.get(t, 1) is None


def test_run_gives_up_after_max_attempts(db):
    def always_conflicts(txn):
        raise farpool.Aborted("made-up conflict")

    with pytest.raises(farpool.Aborted, match="3"):
        db.run(always_conflicts, max_attempts=3)


def test_a_transaction_of_run_cannot_escape_it(db):
    t = fresh(db, [("v", "int64")])
    kept = db.run(lambda txn: txn)
    with pytest.raises(farpool.InvalidArgument, match="run"):
        kept.get(t, 1)
    with pytest.raises(farpool.InvalidArgument, match="run"):
        db.run(lambda txn: txn.commit())


def test_threads_transfer_without_losing_money(db):
    # Each thread has its own session (Database.run); the GIL is released while they wait.
    t = fresh(db, [("balance", "int64")])
    accounts, threads, transfers = 8, 4, 150
    with db.transaction() as txn:
        for k in range(accounts):
            txn.put(t, k, {"balance": 1000})

    def transfer(seed):
        for i in range(transfers):
            src, dst = (seed + i) % accounts, (seed * 3 + i * 5 + 1) % accounts

            def body(txn):
                a, b = txn.multi_get([(t, src), (t, dst)])
                if src != dst:
                    txn.put(t, src, {"balance": a["balance"] - 1})
                    txn.put(t, dst, {"balance": b["balance"] + 1})

            db.run(body)

    workers = [threading.Thread(target=transfer, args=(s,)) for s in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    with db.transaction() as txn:
        rows = txn.multi_get([(t, k) for k in range(accounts)])
    assert sum(r["balance"] for r in rows) == accounts * 1000


def test_read_committed_increments_with_get_for_update_lose_nothing(db):
    # Threads add 1 to a random counter and to the total, both locked as they are read: under
    # read committed each read sees the newest row, and the locks make the increments serial.
    t = fresh(db, [("v", "int64")])
    counters, threads, steps = 4, 4, 60
    with db.transaction() as txn:
        for k in range(counters + 1):
            txn.put(t, k, {"v": 0})

    def work(seed):
        for i in range(steps):
            c = 1 + (seed * 7 + i) % counters

            def body(txn):
                row, total = txn.multi_get_for_update([(t, c), (t, 0)])
                txn.put(t, c, {"v": row["v"] + 1})
                txn.put(t, 0, {"v": total["v"] + 1})

            db.run(body, isolation="rc")

    workers = [threading.Thread(target=work, args=(s,)) for s in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    with db.transaction() as txn:
        rows = txn.multi_get([(t, k) for k in range(counters + 1)])
    assert rows[0]["v"] == threads * steps
    assert sum(r["v"] for r in rows[1:]) == threads * steps


def test_get_for_update_holds_the_row_until_the_holder_ends(db):
    t = fresh(db, [("v", "int64")])
    with db.transaction() as txn:
        txn.put(t, 1, {"v": 5})
    holder = db.session().begin(isolation="rc")
    assert holder.get_for_update(t, 1) == {"v": 5}
    assert holder.get_for_update(t, 2) is None  # an absent key: None, as get()
    for lock in (lambda txn: txn.get_for_update(t, 1),
                 lambda txn: txn.multi_get_for_update([(t, 2), (t, 1)])):
        rival = db.session().begin(isolation="rc")
        assert rival.get(t, 1) == {"v": 5}  # a plain read passes the lock by
        with pytest.raises(farpool.Aborted):
            lock(rival)  # waits briefly for the live holder, then gives up
        rival.rollback()
    holder.put(t, 1, {"v": 6})
    holder.commit()
    with db.transaction(isolation="rc") as txn:
        assert txn.get_for_update(t, 1) == {"v": 6}


def test_an_unknown_isolation_level_is_refused(db):
    with pytest.raises(farpool.InvalidArgument, match="serializable"):
        db.transaction(isolation="serializable")
    with pytest.raises(farpool.InvalidArgument):
        db.run(lambda txn: None, isolation="")


def test_the_local_engine_needs_no_cluster():
    db = farpool.Database.open(engine="local")
    t = db.create_table("x", [("v", "double")])
    assert db.run(lambda txn: txn.put(t, 1, {"v": 0.5})) is None
    with db.transaction() as txn:
        assert txn.get(t, 1) == {"v": 0.5}
