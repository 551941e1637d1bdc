"""farpool's exceptions: one class per status code of the C++ API (include/farpool/status.h).

Every failed pool or database call raises the class of its Status code with the Status message,
which names the component and the reason ("server 1 (127.0.0.1:41001): ..."). `Aborted` is a
retryable conflict (a transaction lost a race: retry it, or let `Database.run` do it); every
other class is a failure. All derive from `farpool.Error`, whose `code` is the C++ code name.

Standard library only: importable without the native module (`farpool._native` imports it to
map codes to classes).
"""


class Error(Exception):
    """A farpool call failed; `str(e)` and `e.message` are the Status message."""

    code: str = "Error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(Error, ValueError):
    """The caller passed something malformed (a bad address, size, schema, row)."""

    code = "InvalidArgument"


class NotFound(Error, LookupError):
    """A named thing does not exist (a table; a key for delete)."""

    code = "NotFound"


class OutOfMemory(Error):
    """The pool (or a server) has no room for the request."""

    code = "OutOfMemory"


class Unavailable(Error):
    """A server is unreachable, dead or shut down."""

    code = "Unavailable"


class TimedOut(Error):
    """An operation did not complete within its deadline."""

    code = "TimedOut"


class Protocol(Error):
    """A peer sent a malformed or incompatible message."""

    code = "Protocol"


class Aborted(Error):
    """A retryable conflict: the transaction lost to another (first committer wins)."""

    code = "Aborted"


class IoError(Error):
    """An operating-system call failed."""

    code = "IoError"


class Internal(Error):
    """A bug or an unexpected library error."""

    code = "Internal"


class AlreadyExists(Error):
    """A thing to be created exclusively exists already (a table, a file)."""

    code = "AlreadyExists"


class ResourceExhausted(Error):
    """A fixed-size table is full: no free session slot, the catalog's tables, the file
    store's names."""

    code = "ResourceExhausted"


class PermissionDenied(Error, PermissionError):
    """A server or this client refused the other side: it did not prove it knows the cluster
    secret (a wrong secret, none, or a server started without one)."""

    code = "PermissionDenied"


class Evicted(Unavailable):
    """This process was evicted from the pool (another process fenced it off, taking it for
    stalled): every server refuses it for good; open a new Pool (or Database). A subclass of
    Unavailable, which it was reported as before it had a code of its own."""

    code = "Evicted"


class Closed(Error, ValueError):
    """A Pool or Database was used after its close() (not a C++ status code: the client's
    own)."""

    code = "Closed"


_BY_CODE = {c.code: c for c in (InvalidArgument, NotFound, OutOfMemory, Unavailable, TimedOut,
                                Protocol, Aborted, IoError, Internal, AlreadyExists,
                                ResourceExhausted, PermissionDenied, Evicted)}


def from_status(code: str, message: str) -> Error:
    """The exception for a C++ Status of code name `code` (StatusCodeName) and `message`.
    A code this module does not know yet gives a plain `Error` whose `code` is that name."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message)
    error = Error(message)
    error.code = code
    return error
