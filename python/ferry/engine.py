"""ferry.TransferEngine: one-sided reads and writes between registered memory.

Every call that can block releases the GIL inside the extension. Errors raise the
subclass of ferry.FerryError that matches the C++ status code.
"""

from __future__ import annotations

import asyncio
import ctypes
import enum
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional, Sequence, Union

from . import _ferry
from .buffers import Buffer, resolve, stream_handle
from .errors import InvalidArgument, error_class


class Op(enum.IntEnum):
    """A request's direction. Plain ints (0, 1) are accepted wherever an Op is."""

    READ = 0
    WRITE = 1


READ, WRITE = Op.READ, Op.WRITE

# Wait in slices so that Ctrl-C is seen; requests carry their own deadlines.
_WAIT_SLICE_MS = 1000


def _millis(seconds: Optional[float]) -> int:
    if seconds is None:
        return 0  # the engine's request_timeout
    if seconds <= 0:
        raise InvalidArgument(f"a timeout must be positive, got {seconds}")
    return max(1, round(seconds * 1000))


@dataclass(frozen=True)
class Segment:
    """An opened peer (or this engine's own) segment."""

    id: int
    name: str


@dataclass(frozen=True)
class BufferInfo:
    addr: int
    length: int
    memfd: bool


@dataclass(frozen=True)
class SegmentInfo:
    name: str
    epoch: int
    same_host: bool
    buffers: list[BufferInfo]


class Request(NamedTuple):
    """One read or write. `local`: anything ferry.buffers.resolve accepts; `remote`:
    a virtual address inside the target's registered memory; `length`: defaults
    to the whole local buffer."""

    op: Union[Op, int]
    local: Any
    segment: Union[Segment, str, int]
    remote: int
    length: Optional[int] = None


def Read(local: Any, segment: Union[Segment, str, int], remote: int,
         length: Optional[int] = None) -> Request:
    return Request(READ, local, segment, remote, length)


def Write(local: Any, segment: Union[Segment, str, int], remote: int,
          length: Optional[int] = None) -> Request:
    return Request(WRITE, local, segment, remote, length)


class RequestResult(NamedTuple):
    done: bool
    error: Optional[Exception]  # None when it succeeded (or is still running)
    transport: str  # "local", "shm", "tcp", "cuda_ipc"; "none" before it ran


class BatchStatus(NamedTuple):
    total: int
    succeeded: int
    failed: int

    @property
    def done(self) -> bool:
        return self.succeeded + self.failed == self.total


class Transfer:
    """A submitted batch: poll it, wait on it or `await` it. It holds the buffers
    and the engine alive until it is closed or collected; closing cancels what has
    not started and returns once the engine no longer touches the buffers."""

    def __init__(self, batch: Any, owner: "TransferEngine", keepalive: list[Any]) -> None:
        self._batch = batch
        self._owner = owner
        self._keepalive = keepalive

    def __len__(self) -> int:
        return len(self._batch)

    def poll(self) -> BatchStatus:
        """Never blocks."""
        return BatchStatus(*self._batch.poll())

    def done(self) -> bool:
        return self.poll().done

    def wait(self, timeout: Optional[float] = None) -> bool:
        """True once every request succeeded; False if `timeout` seconds passed
        first (the batch goes on). Raises the first request's error. None waits
        until each request finishes or meets its own deadline."""
        if timeout is not None:
            if timeout < 0:
                raise InvalidArgument(f"a timeout cannot be negative, got {timeout}")
            return self._batch.wait(round(timeout * 1000))
        while not self._batch.wait(_WAIT_SLICE_MS):
            pass
        return True

    def results(self) -> list[RequestResult]:
        out = []
        for i in range(len(self._batch)):
            done, code, text, transport = self._batch.result(i)
            error = error_class(code)(text) if done and code != 0 else None
            out.append(RequestResult(done, error, transport))
        return out

    def __await__(self):
        return self._until_done().__await__()

    async def _until_done(self) -> None:
        delay = 50e-6
        while not self.done():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2e-3)
        self._batch.wait(0)  # raises the first error

    def close(self) -> None:
        self._batch.close()
        self._keepalive = []

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # Free the batch before the buffers it may still touch.
        batch = getattr(self, "_batch", None)
        if batch is not None:
            batch.close()


class TransferEngine:
    """An engine with a listener at `host:port` (0 picks a free port); `name` is
    the segment name peers open. `transport`: None picks the best per peer, "tcp"
    or "shm" forces one. Timeouts are in seconds; None keeps the C++ defaults.
    `auth_key_file`: the cluster secret's file (mode 0600); peers must prove it,
    and this engine proves it to the peers it opens. None: $FERRY_AUTH_KEY_FILE,
    else no authentication. `metadata`: "p2p" (descriptors from each peer's
    listener), or "etcd://host:port[,host:port]/CLUSTER": the engine publishes
    itself in etcd under a lease of `metadata_ttl` seconds (None: 10, or
    $FERRY_METADATA_TTL_S) and finds peers there. The `tcp_*`, `io_threads` and
    `copy_threads` knobs are EngineOptions' (docs/engine.md); 0 keeps the
    default, and a value out of range raises InvalidArgument."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 transport: Optional[str] = None, metadata: str = "p2p",
                 request_timeout: Optional[float] = None,
                 connect_timeout: Optional[float] = None, tcp_lanes: int = 0,
                 tcp_chunk_bytes: int = 0, tcp_chunks_in_flight: int = 0,
                 tcp_gpu_lanes: int = 0, tcp_gpu_chunk_bytes: int = 0,
                 tcp_staging_buffers: int = 0, io_threads: int = 0, copy_threads: int = 0,
                 auth_key_file: Optional[str] = None,
                 metadata_ttl: Optional[int] = None) -> None:
        if metadata_ttl is not None and int(metadata_ttl) < 1:
            raise InvalidArgument(f"metadata_ttl must be at least 1 s, not {metadata_ttl}")
        self._engine = _ferry.Engine(
            host=host, port=port, metadata=metadata, transport=transport or "",
            tcp_lanes=tcp_lanes, tcp_chunk_bytes=tcp_chunk_bytes,
            tcp_chunks_in_flight=tcp_chunks_in_flight, tcp_gpu_lanes=tcp_gpu_lanes,
            tcp_gpu_chunk_bytes=tcp_gpu_chunk_bytes, tcp_staging_buffers=tcp_staging_buffers,
            io_threads=io_threads,
            copy_threads=copy_threads, request_timeout_ms=_millis(request_timeout),
            connect_timeout_ms=_millis(connect_timeout), auth_key_file=auth_key_file or "",
            metadata_ttl_s=int(metadata_ttl or 0))
        self._registered: dict[int, Buffer] = {}  # keeps registered objects alive
        self._segments: dict[str, Segment] = {}

    @property
    def name(self) -> str:
        return self._engine.name

    @property
    def epoch(self) -> int:
        return self._engine.epoch

    @property
    def auth_failures(self) -> int:
        """Peers the listener refused for not proving the cluster secret."""
        return self._engine.auth_failures

    def close(self) -> None:
        """Stops the engine once its last Transfer is freed. Registered objects
        stay referenced until this object is collected."""
        self._engine.close()

    def __enter__(self) -> "TransferEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # Memory.

    def register(self, obj: Any) -> int:
        """Exposes `obj`'s memory to peers and keeps `obj` alive until unregister.
        Returns its address, the base of the remote addresses peers use."""
        buf = resolve(obj, writable=True)
        self._engine.register_memory(buf.address, buf.nbytes)
        self._registered[buf.address] = buf
        return buf.address

    def unregister(self, obj_or_address: Any) -> None:
        address = (obj_or_address if isinstance(obj_or_address, int)
                   else resolve(obj_or_address, writable=False).address)
        self._engine.unregister_memory(address)
        self._registered.pop(address, None)

    def allocate(self, nbytes: int) -> memoryview:
        """Engine-owned, registered, memfd-backed host memory that same-host peers
        map once. Valid until free() or the engine's end: drop views before."""
        address = self._engine.allocate_memory(nbytes)
        return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")

    def free(self, view_or_address: Union[memoryview, int]) -> None:
        address = (view_or_address if isinstance(view_or_address, int)
                   else resolve(view_or_address, writable=False).address)
        self._engine.free_memory(address)

    # Segments.

    def open_segment(self, name: str) -> Segment:
        """Resolves "host:port" (blocking up to connect_timeout); cached by name."""
        seg = self._segments.get(name)
        if seg is None:
            seg = Segment(self._engine.open_segment(name), name)
            self._segments[name] = seg
        return seg

    def segment_info(self, segment: Union[Segment, str, int]) -> SegmentInfo:
        d = self._engine.segment_info(self._segment_id(segment))
        return SegmentInfo(d["name"], d["epoch"], d["same_host"],
                           [BufferInfo(**b) for b in d["buffers"]])

    def close_segment(self, segment: Union[Segment, str, int]) -> None:
        seg_id = self._segment_id(segment)
        self._engine.close_segment(seg_id)
        self._segments = {k: v for k, v in self._segments.items() if v.id != seg_id}

    def _segment_id(self, segment: Union[Segment, str, int]) -> int:
        if isinstance(segment, Segment):
            return segment.id
        if isinstance(segment, str):
            return self.open_segment(segment).id
        if isinstance(segment, int):
            return segment
        raise InvalidArgument(f"a segment is a Segment, a name or an id, not {segment!r}")

    # Transfers.

    def read(self, segment: Union[Segment, str, int], local: Any, remote: int, *,
             length: Optional[int] = None, timeout: Optional[float] = None,
             stream: Any = None, already_ready: bool = False) -> None:
        """Reads [remote, remote+length) of `segment` into `local`; returns when the
        data is there."""
        self._sync([Read(local, segment, remote, length)], timeout, stream, already_ready)

    def write(self, segment: Union[Segment, str, int], local: Any, remote: int, *,
              length: Optional[int] = None, timeout: Optional[float] = None,
              stream: Any = None, already_ready: bool = False) -> None:
        """Writes `local` to `remote`; returns once the target has applied it."""
        self._sync([Write(local, segment, remote, length)], timeout, stream, already_ready)

    def read_async(self, segment: Union[Segment, str, int], local: Any, remote: int, *,
                   length: Optional[int] = None, timeout: Optional[float] = None,
                   stream: Any = None, already_ready: bool = False) -> Transfer:
        """read() that returns at once: wait on, poll or `await` the Transfer."""
        return self.submit([Read(local, segment, remote, length)], timeout=timeout,
                           stream=stream, already_ready=already_ready)

    def write_async(self, segment: Union[Segment, str, int], local: Any, remote: int, *,
                    length: Optional[int] = None, timeout: Optional[float] = None,
                    stream: Any = None, already_ready: bool = False) -> Transfer:
        """write() that returns at once: wait on, poll or `await` the Transfer."""
        return self.submit([Write(local, segment, remote, length)], timeout=timeout,
                           stream=stream, already_ready=already_ready)

    def transfer(self, requests: Sequence[Request], *, timeout: Optional[float] = None,
                 stream: Any = None, already_ready: bool = False) -> None:
        """Submits a batch and waits for all of it; raises the first error."""
        self._sync(requests, timeout, stream, already_ready)

    def submit(self, requests: Sequence[Request], *, timeout: Optional[float] = None,
               stream: Any = None, already_ready: bool = False) -> Transfer:
        """Posts a batch and returns at once. GPU buffers are touched only after the
        work already enqueued on the submission stream: `stream`, else a torch
        tensor's current stream, else the CUDA default stream."""
        tuples, bufs, submit_stream = self._prepare(requests, stream)
        batch = self._engine.submit(tuples, _millis(timeout), submit_stream, already_ready)
        return Transfer(batch, self, bufs)

    def submit_on_stream(self, requests: Sequence[Request], stream: Any = None) -> Transfer:
        """Stream-ordered: returns at once; work enqueued on the stream afterwards
        sees the data, so synchronizing the stream implies completion. GPU memory
        only. Keep the Transfer until the stream has passed it."""
        tuples, bufs, submit_stream = self._prepare(requests, stream)
        return Transfer(self._engine.submit_on_stream(tuples, submit_stream), self, bufs)

    def _sync(self, requests: Sequence[Request], timeout: Optional[float], stream: Any,
              already_ready: bool) -> None:
        tuples, bufs, submit_stream = self._prepare(requests, stream)
        if len(tuples) == 1 and not any(b.gpu for b in bufs) and stream is None:
            self._transfer_one(tuples[0], _millis(timeout))
            return
        batch = self._engine.submit(tuples, _millis(timeout), submit_stream, already_ready)
        with Transfer(batch, self, bufs) as t:
            t.wait()

    def _transfer_one(self, request: tuple, timeout_ms: int) -> None:
        # One line, so tests can tell from a thread that the main thread is inside.
        self._engine.transfer(*request, timeout_ms)

    def _prepare(self, requests: Iterable[Request],
                 stream: Any) -> tuple[list[tuple], list[Buffer], int]:
        tuples, bufs = [], []
        for r in requests:
            if not isinstance(r, Request):
                raise InvalidArgument(f"expected ferry.Read(...) or ferry.Write(...), got {r!r}")
            buf = resolve(r.local, writable=r.op == READ)
            length = buf.nbytes if r.length is None else r.length
            if length <= 0 or length > buf.nbytes:
                raise InvalidArgument(
                    f"length {length} is not within the {buf.nbytes}-byte local buffer")
            if not isinstance(r.remote, int) or r.remote <= 0:
                raise InvalidArgument(f"remote must be a positive address, got {r.remote!r}")
            tuples.append((r.op, buf.address, self._segment_id(r.segment), r.remote, length))
            bufs.append(buf)
        if not tuples:
            raise InvalidArgument("empty batch")
        if stream is not None:
            return tuples, bufs, stream_handle(stream)
        defaults = {b.stream for b in bufs if b.stream is not None}
        if len(defaults) > 1:
            raise InvalidArgument(
                "the tensors have different current streams; pass stream= explicitly")
        return tuples, bufs, defaults.pop() if defaults else 0
