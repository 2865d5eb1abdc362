"""Ferry from Python: one-sided, batched reads and writes between the registered
memory (host or GPU) of any two processes.

    import ferry
    engine = ferry.TransferEngine(transport="tcp")
    seg = engine.open_segment("127.0.0.1:41234")
    engine.write(seg, numpy_array, remote_address)
    handle = engine.submit([ferry.Read(buf, seg, remote_address)]); handle.wait()

Mooncake users: `from ferry.compat.mooncake import TransferEngine`.
"""

from . import _ferry, errors
from .buffers import Buffer, resolve
from .engine import (READ, WRITE, BatchStatus, BufferInfo, Read, Request, RequestResult,
                     Segment, SegmentInfo, Transfer, TransferEngine, Write)
from .errors import *  # noqa: F401,F403  one class per status code
from .errors import FerryError, error_class

__all__ = [
    "READ", "WRITE", "BatchStatus", "Buffer", "BufferInfo", "FerryError", "Read", "Request",
    "RequestResult", "Segment", "SegmentInfo", "Transfer", "TransferEngine", "Write",
    "error_class", "resolve",
] + errors.__all__
