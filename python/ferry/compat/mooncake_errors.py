"""Mooncake's error codes and how ferry's exceptions map onto them, for the compat
store (ferry.compat.mooncake_store) and, for the protocol names, the compat
TransferEngine (ferry.compat.mooncake)."""

from __future__ import annotations

from ..errors import (AlreadyExists, Busy, Cancelled, ConnectionLost, FerryError, Internal,
                      InvalidArgument, IoError, NotFound, NotSupported, OutOfRange,
                      PeerRestarted, ProtocolError, ResourceExhausted, Timeout, Unauthenticated,
                      Unavailable)

# Mooncake's fast-path protocols let Ferry pick the transport per peer; tcp and
# shm force one.
P2PHANDSHAKE = "P2PHANDSHAKE"
_AUTO_PROTOCOLS = {"", "rdma", "nvlink", "nvlink_intra", "efa", "barex", "hip", "cxl"}
_FORCED_PROTOCOLS = {"tcp", "shm"}

# Mooncake's ErrorCode values (mooncake-store/include/types.h) that the compat store returns.
OK = 0
INTERNAL_ERROR = -1
NO_AVAILABLE_HANDLE = -200  # no space
INVALID_PARAMS = -600       # also "not set up" and "buffer too small"
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706     # remove without force while read or written
TRANSFER_FAIL = -800
RPC_FAIL = -900

# ferry's exception classes and the Mooncake code each becomes. A class not
# listed here (FerryError itself) is INTERNAL_ERROR.
ERROR_CODES: dict[type, int] = {
    InvalidArgument: INVALID_PARAMS,
    OutOfRange: INVALID_PARAMS,  # a destination smaller than the value
    NotSupported: INVALID_PARAMS,  # e.g. GPU memory on an attached store
    NotFound: OBJECT_NOT_FOUND,
    AlreadyExists: OBJECT_ALREADY_EXISTS,
    Busy: OBJECT_HAS_LEASE,
    ResourceExhausted: NO_AVAILABLE_HANDLE,
    Timeout: TRANSFER_FAIL,
    PeerRestarted: TRANSFER_FAIL,
    IoError: TRANSFER_FAIL,
    ConnectionLost: RPC_FAIL,
    Unavailable: RPC_FAIL,
    ProtocolError: RPC_FAIL,
    Unauthenticated: RPC_FAIL,
    Cancelled: INTERNAL_ERROR,
    Internal: INTERNAL_ERROR,
}

# health_check()'s answers, as Mooncake's.
HC_HEALTHY, HC_NOT_INITIALIZED, HC_MASTER_UNREACHABLE = 0, 1, 2


def mooncake_code(error: BaseException) -> int:
    """The Mooncake code of a ferry exception (ERROR_CODES); -1 for any other."""
    for cls in type(error).__mro__:
        if cls in ERROR_CODES:
            return ERROR_CODES[cls]
    return INTERNAL_ERROR


class _Refused(Exception):
    """A failure found here, before ferry.Store is called: its code and message."""

    def __init__(self, code: int, message: str, error: type[FerryError] = InvalidArgument):
        super().__init__(message)
        self.code = code
        self.error = error
