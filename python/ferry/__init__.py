"""Ferry from Python: one-sided, batched reads and writes between the registered
memory (host or GPU) of any two processes, and a distributed key-value store.

    import ferry
    engine = ferry.TransferEngine(transport="tcp")
    seg = engine.open_segment("127.0.0.1:41234")
    engine.write(seg, numpy_array, remote_address)
    handle = engine.submit([ferry.Read(buf, seg, remote_address)]); handle.wait()

    store = ferry.Store()  # or ferry.Store(master="host:port"), ferry.Store.attach(path)
    store.put("key", numpy_array); store.get("key")

Mooncake users: `from ferry.compat.mooncake import TransferEngine`.
"""

from . import _ferry  # noqa: F401  (the extension; fails early if it is missing)
from . import errors
from ._version import __version__
from .buffers import Buffer, resolve
from .engine import (READ, WRITE, BatchStatus, BufferInfo, Op, Read, Request, RequestResult,
                     Segment, SegmentInfo, Transfer, TransferEngine, Write)
from .errors import (AlreadyExists, Busy, Cancelled, ConnectionLost, FerryError, Internal,
                     InvalidArgument, IoError, NotFound, NotSupported, OutOfRange,
                     PeerRestarted, ProtocolError, ResourceExhausted, Timeout, Unauthenticated,
                     Unavailable, error_class)
from .store import Store

__all__ = [
    "READ", "WRITE", "BatchStatus", "Buffer", "BufferInfo", "Op", "Read", "Request",
    "RequestResult", "Segment", "SegmentInfo", "Store", "Transfer", "TransferEngine", "Write",
    "__version__", "resolve",
] + errors.__all__
