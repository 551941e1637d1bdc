"""farpool.Pool from Python: every buffer type, atomics, batches, and errors as exceptions."""
import threading

import numpy as np
import pytest

import farpool


def test_write_then_read_every_buffer_type(pool):
    a = pool.alloc(4096)
    pool.write(a, b"hello")
    pool.write(a + 5, bytearray(b", "))
    pool.write(a + 7, memoryview(b"xxpool!")[2:])
    assert pool.read(a, 12) == b"hello, pool!"

    array = np.arange(512, dtype=np.uint64)  # 4096 bytes
    pool.write(a, array)
    back = np.zeros(512, dtype=np.uint64)
    pool.read_into(a, back)
    assert np.array_equal(back, array)

    # Into part of a larger buffer, through a memoryview slice: the bytes land in place.
    target = bytearray(b"-" * 16)
    pool.read_into(a, memoryview(target)[4:12])
    assert target[:4] == b"----" and target[12:] == b"----"
    assert bytes(target[4:12]) == array[:1].tobytes()
    pool.free(a)


def test_read_into_refuses_what_it_cannot_fill(pool):
    a = pool.alloc(64)
    with pytest.raises(BufferError):
        pool.read_into(a, b"immutable bytes")
    with pytest.raises((BufferError, ValueError)):  # not contiguous (numpy says ValueError)
        pool.read_into(a, np.zeros((8, 8), dtype=np.uint8)[:, 1])
    pool.free(a)


def test_cas_and_fetch_add_return_the_previous_value(pool):
    a = pool.alloc(8)
    pool.write(a, (0).to_bytes(8, "little"))
    assert pool.cas(a, 0, 7) == 0          # swapped
    assert pool.cas(a, 0, 9) == 7          # not swapped: previous != expected
    assert pool.fetch_add(a, 5) == 7
    assert pool.fetch_add(a, 2**64 - 1) == 12  # adding -1 mod 2**64
    assert int.from_bytes(pool.read(a, 8), "little") == 11
    pool.free(a)


def test_fetch_add_from_threads_loses_no_increment(pool):
    # The GIL is released around each call, so the threads' operations really interleave.
    a = pool.alloc(8)
    pool.write(a, bytes(8))
    threads, per_thread = 4, 2000

    def add():
        for _ in range(per_thread):
            pool.fetch_add(a, 1)

    workers = [threading.Thread(target=add) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert int.from_bytes(pool.read(a, 8), "little") == threads * per_thread
    pool.free(a)


def test_placement_puts_objects_on_the_server_asked_for(pool):
    for server in pool.server_ids:
        a = pool.alloc(64, server=server)
        assert a >> 48 == server
        assert farpool.address_str(a).startswith(f"s{server}+")
        pool.free(a)
    by_key = [pool.alloc(64, key=42) for _ in range(3)]
    assert len({a >> 48 for a in by_key}) == 1
    for a in by_key:
        pool.free(a)
    with pytest.raises(farpool.InvalidArgument, match="not both"):
        pool.alloc(64, server=0, key=1)


def test_batch_posts_many_and_waits_once(pool):
    addresses = [pool.alloc(64) for _ in range(8)]
    counter = pool.alloc(8)
    pool.write(counter, bytes(8))
    with pool.batch() as b:
        for i, a in enumerate(addresses):
            b.write(a, bytes([i]) * 64)
    with pool.batch() as b:
        reads = [b.read(a, 64) for a in addresses]
    assert [bytes(r) for r in reads] == [bytes([i]) * 64 for i in range(8)]

    b = pool.batch()
    first = b.fetch_add(counter, 10)
    b.fence()
    second = b.cas(counter, 10, 99)
    out = np.zeros(64, dtype=np.uint8)
    b.read_into(addresses[3], out)
    assert b.posted >= 2
    previous = b.wait()
    assert (previous[first], previous[second]) == (0, 10)
    assert int.from_bytes(pool.read(counter, 8), "little") == 99
    assert out.tobytes() == bytes([3]) * 64
    for a in addresses + [counter]:
        pool.free(a)


def test_errors_are_exceptions_with_the_reason(pool):
    with pytest.raises(farpool.InvalidArgument) as null:
        pool.read(0, 8)
    assert null.value.code == "InvalidArgument" and "null" in str(null.value)
    assert isinstance(null.value, ValueError) and isinstance(null.value, farpool.Error)

    a = pool.alloc(64)
    with pytest.raises(farpool.InvalidArgument, match="align"):
        pool.cas(a + 4, 0, 1)
    pool.free(a)
    with pytest.raises(farpool.InvalidArgument, match="free"):  # use after free
        pool.read(a, 8)

    with pytest.raises(farpool.InvalidArgument, match="server 77"):
        pool.read(farpool.address(77, 4096), 8)

    b = pool.batch()
    with pytest.raises(farpool.InvalidArgument):
        b.read(0, 8)  # checked when posted: nothing is sent
    assert b.wait() == []


def test_an_evicted_status_is_evicted_and_still_unavailable():
    """The C++ code Evicted (this process was fenced off the pool) has its own class, which
    callers that caught Unavailable for it before still catch."""
    e = farpool.errors.from_status("Evicted", "server 0 (...): evicted by server 0 (...): ...")
    assert type(e) is farpool.Evicted and e.code == "Evicted"
    assert isinstance(e, farpool.Unavailable) and "evicted by server 0" in str(e)
    assert type(farpool.errors.from_status("Unavailable", "gone")) is farpool.Unavailable


def test_connect_names_what_is_wrong(tmp_path):
    with pytest.raises(farpool.Error, match="nothing.json"):
        farpool.Pool.connect(str(tmp_path / "nothing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "servers": "no"}')
    with pytest.raises(farpool.InvalidArgument, match="bad.json"):
        farpool.Pool.connect(str(bad))


def test_a_stopped_cluster_is_unavailable(tmp_path):
    c = farpool.LocalCluster(servers=1, memory="32MiB", directory=tmp_path / "c").start()
    stale = tmp_path / "stale.json"  # `cluster down` removes the cluster file: keep a copy
    stale.write_text(open(c.cluster_file).read())
    secret = tmp_path / "cluster.secret"  # ... and of the secret it names (relative to it)
    secret.write_text((tmp_path / "c" / "cluster.secret").read_text())
    secret.chmod(0o600)
    c.stop()
    with pytest.raises(farpool.Unavailable, match="server 0"):
        farpool.Pool.connect(str(stale))
