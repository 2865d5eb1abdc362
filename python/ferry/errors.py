"""One exception class per ferry::StatusCode (include/ferry/status.h).

Every class derives from FerryError, and also from the built-in exception a
Python caller would expect to catch (ValueError, TimeoutError, ...).
"""

from __future__ import annotations


class FerryError(Exception):
    """A non-OK ferry::Status. `code` is the numeric StatusCode."""

    code: int = -1


class InvalidArgument(FerryError, ValueError):
    code = 1


class NotFound(FerryError, LookupError):
    code = 2


class AlreadyExists(FerryError):
    code = 3


class OutOfRange(FerryError, IndexError):
    code = 4


class Timeout(FerryError, TimeoutError):
    code = 5


class Cancelled(FerryError):
    code = 6


class ConnectionLost(FerryError, ConnectionError):
    code = 7


class ProtocolError(FerryError):
    code = 8


class NotSupported(FerryError, NotImplementedError):
    code = 9


class ResourceExhausted(FerryError, MemoryError):
    code = 10


class Unavailable(FerryError, ConnectionError):
    code = 11


class PeerRestarted(FerryError):
    code = 12


class IoError(FerryError, OSError):
    code = 13


class Internal(FerryError):
    code = 14


class Busy(FerryError):
    """In use: a store object under a read lease or being written."""
    code = 15


class Unauthenticated(FerryError, PermissionError):
    """The peer did not prove the cluster secret (FERRY_AUTH_KEY_FILE)."""
    code = 16


_BY_CODE: dict[int, type[FerryError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, AlreadyExists, OutOfRange, Timeout, Cancelled,
                ConnectionLost, ProtocolError, NotSupported, ResourceExhausted, Unavailable,
                PeerRestarted, IoError, Internal, Busy, Unauthenticated)
}


def error_class(code: int) -> type[FerryError]:
    """The class raised for `code`; FerryError for a code this package does not know."""
    return _BY_CODE.get(code, FerryError)


__all__ = ["FerryError", "error_class"] + [cls.__name__ for cls in _BY_CODE.values()]
