"""The client of farpool's pool and database (`import farpool`; python/README.md).

    import farpool
    with farpool.LocalCluster(servers=2, memory="256MiB") as c:
        db = farpool.Database.open(cluster=c.cluster_file)
        t = db.create_table("acct", [("balance", "int64")])
        with db.transaction() as txn:
            txn.put(t, 1, {"balance": 100})

`Batch`, `Session`, `Transaction` and `Table` are the native classes (farpool._native, C++
through nanobind; their types are in _native.pyi); `Pool` is the native pool (same methods)
behind an explicit `close()`; `Database` adds a session per thread, `transaction()`, `run()`
and `close()` to the native database; `LocalCluster` runs `farpool cluster up` and `down`.
Every failure raises a `farpool.Error` subclass carrying the C++ Status message.

Closing: `Pool.close()` and `Database.close()` (or leaving their `with` block) give up the
handle at once: any later use raises `farpool.Closed`, and closing again does nothing. The
connections and session slots go when the native object does: at once, unless objects made
from it are still alive (a Batch of the Pool; a Session, Transaction or Table of the
Database), which keep it until they go.
The GIL is released around every call that goes to the pool, so threads overlap their waits.

Processes: a process that has connected (a Pool or a Database) must not fork and go on using
farpool in the child; start workers with `subprocess` or multiprocessing's "spawn" or
"forkserver" contexts, each connecting on its own.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

from farpool._build import farpool_binary, native_dir
from farpool.errors import Closed, Error

try:
    from farpool import _native
except ImportError as e:  # not built, or built for another interpreter
    raise ImportError(f"farpool's native module is not built for this interpreter ({e}): run "
                      f"`make build` (looked in {native_dir()}; FARPOOL_BUILD names another "
                      "build directory)") from e

Batch = _native.Batch
Session = _native.Session
Transaction = _native.Transaction
Table = _native.Table
address = _native.address
address_str = _native.address_str
ROOT_SIZE = _native.ROOT_SIZE

T = TypeVar("T")
# A column: (name, type) with type "int64", "double" or "bytes", or (name, "char", length).
Column = Union[tuple[str, str], tuple[str, str, int]]


class Pool:
    """A process's view of the memory pool (include/farpool/pool.h; the methods of
    `farpool._native.Pool`, see _native.pyi). Safe for use by any number of threads. Addresses
    are ints. A context manager: leaving the block closes it (see the module docstring)."""

    def __init__(self, native: _native.Pool) -> None:
        """Use `Pool.connect`."""
        self._pool: Optional[_native.Pool] = native

    @classmethod
    def connect(cls, cluster_file: Union[str, os.PathLike], transport: Optional[str] = None,
                remote_access: str = "auto", direct_access: bool = True) -> "Pool":
        """Connects to every server of the cluster file. Raises (naming the server) if one is
        unreachable."""
        return cls(_native.Pool.connect(os.fspath(cluster_file), transport, remote_access,
                                        direct_access))

    @property
    def closed(self) -> bool:
        return self._pool is None

    def close(self) -> None:
        """Gives up this Pool: later calls raise farpool.Closed. Idempotent."""
        self.__dict__.clear()  # the native methods cached by __getattr__ hold the pool
        self._pool = None

    def __enter__(self) -> "Pool":
        if self._pool is None:
            raise Closed("the Pool is closed")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # Only names this class does not have: the native pool's methods and properties.
        native = self.__dict__.get("_pool")
        if native is None:
            raise Closed(f"the Pool is closed (Pool.{name})")
        value = getattr(native, name)
        if callable(value):
            self.__dict__[name] = value  # later calls skip this function
        return value

    def __repr__(self) -> str:
        return "<farpool.Pool closed>" if self._pool is None else f"<farpool.Pool {self._pool!r}>"


class Database:
    """The transactional database (include/farpool/db.h): tables of typed rows with an int64
    key, snapshot-isolation transactions, shared by every process that opens the same cluster.

    Safe for use by any number of threads: `transaction()` and `run()` use a session of the
    calling thread's own, claimed on its first use and given back when the thread ends or the
    Database is closed or goes away (sessions are slots in the database: `max_sessions` at
    once, over all processes). A context manager: leaving the block closes it (see the module
    docstring); close() must not race with transactions of other threads.
    """

    def __init__(self, native: _native.Database) -> None:
        """Use `Database.open`."""
        self._native: Optional[_native.Database] = native
        self._sessions = threading.local()

    @property
    def _db(self) -> _native.Database:
        if self._native is None:
            raise Closed("the Database is closed")
        return self._native

    @property
    def closed(self) -> bool:
        return self._native is None

    def close(self) -> None:
        """Gives up this Database and every thread's session of it: later calls raise
        farpool.Closed. Idempotent."""
        self._native = None
        self._sessions = threading.local()  # drops the per-thread sessions of every thread

    def __enter__(self) -> "Database":
        self._db  # noqa: B018 (raises Closed if closed)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return ("<farpool.Database closed>" if self._native is None
                else f"<farpool.Database engine={self._native.engine}>")

    @classmethod
    def open(cls, cluster: Union[str, os.PathLike, None] = None, *, engine: str = "pool",
             max_sessions: int = 256, lease: float = 2.0) -> "Database":
        """Opens the database of the cluster file `cluster`, creating it if it has none.

        engine: "pool" (the data in the memory pool; needs `cluster`), "local" (this process's
        RAM, for trying things out) or "sharded". max_sessions and lease (seconds a stalled
        session keeps its locks) apply only when this call creates the database.
        """
        return cls(_native.Database.open(engine, os.fspath(cluster) if cluster else "",
                                         max_sessions, lease))

    @property
    def engine(self) -> str:
        return self._db.engine

    def create_table(self, name: str, columns: Sequence[Column], *, ordered: bool = False,
                     expected_rows: int = 1024) -> Table:
        """Creates table `name` with `columns` (at most 16, names at most 23 bytes); `ordered`
        also keeps a B+tree for `scan`. Raises AlreadyExists if the name is taken."""
        return self._db.create_table(name, list(columns), ordered, expected_rows)

    def open_table(self, name: str) -> Table:
        """The existing table `name`; raises NotFound."""
        return self._db.open_table(name)

    def drop_table(self, name: str) -> None:
        """Frees the name; the table's memory is reclaimed once older snapshots end.
        REQUIRES: no transaction of any process uses the table any more."""
        self._db.drop_table(name)

    def list_tables(self) -> list[str]:
        return self._db.list_tables()

    def session(self) -> Session:
        """A new session of its own (for one thread at a time); `transaction()` and `run()`
        need none."""
        return self._db.new_session()

    def transaction(self, isolation: str = "si") -> Transaction:
        """A new transaction in this thread's session. As a context manager it commits when the
        block ends normally (raising farpool.Aborted if it lost a conflict) and rolls back if
        the block raises. isolation: "si" (snapshot isolation, the default) or "rc" (read
        committed: each read sees the newest committed row; pair it with get_for_update for
        read-modify-write, as pgbench's UPDATEs do)."""
        return self._session().begin(isolation)

    def run(self, body: Callable[[Transaction], T], max_attempts: int = 1000,
            isolation: str = "si") -> T:
        """Runs body(txn) in a transaction of this thread's session and commits, retrying with
        randomized backoff while body or the commit raises farpool.Aborted, at most
        `max_attempts` times (then raises Aborted naming the last conflict). Returns what body
        returned. Any other exception rolls back and is raised at once. body must not commit or
        roll back itself (raise to roll back). isolation as for transaction()."""
        return self._session().run(body, max_attempts, isolation)

    def _session(self) -> Session:
        db = self._db  # raises Closed first
        session = getattr(self._sessions, "session", None)
        if session is None:
            session = self._sessions.session = db.new_session()
        return session


class LocalCluster:
    """A pool of `servers` memory servers of `memory` each on this machine, as real
    `farpool server` processes (`farpool cluster up` / `down`), for notebooks and tests.

        with farpool.LocalCluster(servers=2, memory="256MiB") as c:
            pool = farpool.Pool.connect(c.cluster_file)

    start() (or entering the block) starts them and writes `cluster_file`; stop() (or leaving
    the block, by an exception too) stops every server and removes what they left, including
    their shared memory; a cluster still running when the interpreter exits is stopped then.
    `directory` keeps the cluster file and the server logs there (default: a temporary
    directory, removed by stop()). `transport` is the clients' default fabric ("auto", "shm",
    "tcp"); `progress` the servers' ("busy", "event"; default: chosen from the cores);
    `replicas` 1 keeps a second copy of every byte on the next server (at least 2 servers;
    docs/pool.md, "Replication"); 0 (the default here) one copy, passed to `cluster up`
    explicitly whatever its default. Raises farpool.Error with `farpool cluster up`'s reason if the servers cannot start.
    """

    def __init__(self, servers: int = 1, memory: Union[str, int] = "256MiB", *,
                 transport: str = "auto", progress: Optional[str] = None, replicas: int = 0,
                 directory: Union[str, os.PathLike, None] = None,
                 binary: Union[str, os.PathLike, None] = None) -> None:
        self.servers = servers
        self.memory = str(memory)
        self.transport = transport
        self.progress = progress
        self.replicas = replicas
        self.binary = Path(binary) if binary else farpool_binary()
        self._directory = Path(directory) if directory else None
        self.directory: Optional[Path] = None
        self._stopper: Optional[weakref.finalize] = None

    @property
    def cluster_file(self) -> str:
        """The cluster file for Pool.connect and Database.open. REQUIRES: started."""
        if self.directory is None:
            raise Error("the LocalCluster is not started")
        return str(self.directory / "cluster.json")

    def start(self) -> "LocalCluster":
        if self._stopper is not None and self._stopper.alive:
            raise Error(f"the LocalCluster in {self.directory} is already started")
        if not self.binary.exists():
            raise Error(f"no farpool binary at {self.binary}: run `make build` (or set "
                        "FARPOOL_BIN / FARPOOL_BUILD)")
        owned = self._directory is None
        directory = Path(tempfile.mkdtemp(prefix="farpool-cluster-")) if owned else self._directory
        command = [str(self.binary), "cluster", "up", "--dir", str(directory), "--servers",
                   str(self.servers), "--memory", self.memory, "--transport", self.transport]
        if self.progress:
            command += ["--progress", self.progress]
        # Always said: what a cluster keeps must not change with `cluster up`'s default.
        command += ["--replicas", str(self.replicas)]
        # From here on the finalizer stops whatever runs: `cluster down` of a directory whose
        # servers did not all start stops the others (cluster up does too, on failure).
        self._stopper = weakref.finalize(self, _stop, str(self.binary), directory, owned)
        self.directory = directory
        up = subprocess.run(command, capture_output=True, text=True)
        if up.returncode != 0:
            self.stop()
            reason = (up.stderr.strip() or up.stdout.strip()).removeprefix("farpool: ")
            raise Error(f"LocalCluster: {reason}")
        return self

    def stop(self) -> None:
        """Stops every server and removes their shared memory (and the temporary directory).
        Idempotent."""
        if self._stopper is not None:
            self._stopper()
        self.directory = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.directory if self.directory else "stopped"
        return f"<farpool.LocalCluster {self.servers} x {self.memory} ({where})>"


def _stop(binary: str, directory: Path, owned: bool) -> None:
    """Stops the cluster in `directory` (`farpool cluster down`), then removes the directory if
    the LocalCluster made it. Raises Error if the servers could not be stopped."""
    down = subprocess.run([binary, "cluster", "down", "--dir", str(directory)],
                          capture_output=True, text=True)
    if down.returncode != 0 and (directory / "cluster.json").exists():
        raise Error(f"LocalCluster: {down.stderr.strip().removeprefix('farpool: ')}")
    if owned:
        shutil.rmtree(directory, ignore_errors=True)


__all__ = ["Pool", "Batch", "Session", "Transaction", "Table", "Database", "LocalCluster",
           "address", "address_str", "ROOT_SIZE", "Column"]

