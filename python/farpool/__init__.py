"""farpool's Python side.

- The client (`farpool.Pool`, `farpool.Database`, `farpool.LocalCluster`; python/README.md):
  the pool and the transactional database from Python, through the C++ library.
- The simulator (`farpool.sim`, `farpool-sim`) and the benchmark harness (`farpool.harness`),
  which read measured results and model clusters larger than the ones we can run.

The client's C++ half is the native module `farpool._native`, which `make build` writes into the
build directory (build/python/farpool/, or $FARPOOL_BUILD/python/farpool/), not into this
source tree: this package adds that directory to its search path, and loads the client only
when one of its names is first used, so `farpool.sim` and `farpool.harness` never need the
build. The exceptions (`farpool.Error` and one subclass per status code) are plain Python.
"""
from farpool._build import native_dir as _native_dir
from farpool.errors import (Aborted, AlreadyExists, Closed, Error, Evicted, Internal,
                            InvalidArgument, IoError, NotFound, OutOfMemory, PermissionDenied,
                            Protocol, ResourceExhausted, TimedOut, Unavailable)

__path__.append(str(_native_dir()))  # noqa: F821 (`__path__` is set for packages)

# Names of the client, resolved on first use (PEP 562) from farpool.client.
_CLIENT = ("Pool", "Batch", "Database", "Session", "Transaction", "Table", "LocalCluster",
           "address", "address_str", "ROOT_SIZE")

__all__ = ["Error", "InvalidArgument", "NotFound", "OutOfMemory", "Unavailable", "TimedOut",
           "Protocol", "Aborted", "IoError", "Internal", "AlreadyExists", "ResourceExhausted",
           "PermissionDenied", "Evicted", "Closed", *_CLIENT]


def __getattr__(name: str):
    if name in _CLIENT:
        from farpool import client
        value = globals()[name] = getattr(client, name)  # later lookups skip this function
        return value
    raise AttributeError(f"module 'farpool' has no attribute '{name}'")
