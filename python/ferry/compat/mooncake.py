"""`mooncake.engine.TransferEngine` on Ferry: change the import, keep the code.

Same method names, arguments and return conventions: 0 for success and a
negative code for failure, addresses and batch ids as ints. A failure is also
logged once on the "ferry.compat.mooncake" logger with the Ferry status. Every
difference from Mooncake is listed in docs/mooncake-compat.md.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import logging
import os
import threading
from typing import Any, Callable, Optional, Sequence

from ..buffers import resolve
from ..engine import READ, WRITE, Request, Transfer
from ..engine import TransferEngine as _Engine
from ..errors import FerryError, InvalidArgument, Timeout

# Mooncake's protocol names, shared with the compat store.
from .mooncake_errors import _AUTO_PROTOCOLS, _FORCED_PROTOCOLS, P2PHANDSHAKE

log = logging.getLogger("ferry.compat.mooncake")

_FAILED = -1


def _first_error(handle: Transfer) -> Optional[Exception]:
    return next((r.error for r in handle.results() if r.error is not None), None)


# The etcd cluster name Mooncake's metadata strings do not carry.
ETCD_CLUSTER_ENV = "FERRY_ETCD_CLUSTER"
DEFAULT_ETCD_CLUSTER = "mooncake"


def metadata_for(metadata_server: str) -> Optional[str]:
    """Ferry's EngineOptions.metadata for Mooncake's metadata_server, or None
    for one Ferry does not serve (http://, redis://). Mooncake takes etcd as
    "etcd://host:port" or a bare "host:port" (several joined by ',' or ';');
    those map to "etcd://host:port,.../CLUSTER", CLUSTER from
    $FERRY_ETCD_CLUSTER (default "mooncake"). Ferry's own
    "etcd://ENDPOINTS/CLUSTER" passes unchanged."""
    if metadata_server == P2PHANDSHAKE:
        return "p2p"
    rest = metadata_server or ""
    if rest.startswith("etcd://"):
        rest = rest[len("etcd://"):]
    elif "://" in rest or not rest:
        return None
    endpoints, slash, cluster = rest.partition("/")
    if not slash:
        cluster = os.environ.get(ETCD_CLUSTER_ENV) or DEFAULT_ETCD_CLUSTER
    return "etcd://" + endpoints.replace(";", ",") + "/" + cluster


class TransferOpcode(enum.IntEnum):
    Read = READ
    Write = WRITE


def _status(what: str, fn: Callable[[], Any]) -> int:
    """Mooncake's convention: 0, or -1 with the reason logged."""
    try:
        fn()
        return 0
    except (FerryError, ValueError, TypeError) as e:
        log.error("%s failed: %s", what, e)
        return _FAILED


class TransferEngine:
    """Host and GPU memory by address, as in Mooncake. `target_hostname` is the
    peer's session id, "host:port", as returned by its get_rpc_port()."""

    TransferOpcode = TransferOpcode

    def __init__(self) -> None:
        self._engine: Optional[_Engine] = None
        self._batches: dict[int, Transfer] = {}
        self._batch_ids = itertools.count(1)  # next() is atomic under the GIL
        self._lock = threading.Lock()  # guards the two lists below
        self._on_stream: list[Transfer] = []  # kept until their streams pass them
        self._stream_errors: list[Exception] = []

    # Set-up.

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str,
                   device_name: str = "") -> int:
        if self._engine is not None:
            log.error("initialize: already initialized")
            return _FAILED
        metadata = metadata_for(metadata_server)
        if metadata is None:
            log.error("initialize: metadata server %r is not supported; use %s or an etcd "
                      "address (host:port, etcd://host:port)", metadata_server, P2PHANDSHAKE)
            return _FAILED
        proto = (protocol or "").lower()
        if proto not in _AUTO_PROTOCOLS | _FORCED_PROTOCOLS:
            log.error("initialize: unknown protocol %r", protocol)
            return _FAILED
        host, _, port = (local_hostname or "127.0.0.1").partition(":")
        if host == "localhost":
            host = "127.0.0.1"
        transport = proto if proto in _FORCED_PROTOCOLS else None

        def create() -> None:
            # Mooncake's MC_TRANSFER_TIMEOUT (seconds) bounds each transfer.
            timeout = os.environ.get("MC_TRANSFER_TIMEOUT")
            self._engine = _Engine(host, int(port or 0), transport=transport, metadata=metadata,
                                   request_timeout=float(timeout) if timeout else None)

        return _status("initialize", create)

    def get_rpc_port(self) -> int:
        return int(self._ready().name.rpartition(":")[2])

    def get_local_session_id(self) -> str:
        """Ferry extension: "host:port", the name peers pass as target_hostname."""
        return self._ready().name

    def _ready(self) -> _Engine:
        if self._engine is None:
            raise InvalidArgument("TransferEngine.initialize() has not succeeded")
        return self._engine

    # Memory.

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        return _status("register_memory",
                       lambda: self._ready().register((buffer_addr, capacity)))

    def unregister_memory(self, buffer_addr: int) -> int:
        return _status("unregister_memory", lambda: self._ready().unregister(buffer_addr))

    def batch_register_memory(self, buffer_addresses: Sequence[int],
                              capacities: Sequence[int], location: str = "*") -> int:
        """All or nothing: a failure unregisters what this call registered."""
        if len(buffer_addresses) != len(capacities):
            log.error("batch_register_memory: %d addresses but %d capacities",
                      len(buffer_addresses), len(capacities))
            return _FAILED
        done: list[int] = []
        for addr, cap in zip(buffer_addresses, capacities):
            if self.register_memory(addr, cap) != 0:
                for d in done:
                    self.unregister_memory(d)
                return _FAILED
            done.append(addr)
        return 0

    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        results = [self.unregister_memory(a) for a in buffer_addresses]
        return _FAILED if any(results) else 0

    def allocate_managed_buffer(self, length: int) -> int:
        """Registered, memfd-backed host memory; its address, or 0 on failure."""
        try:
            return resolve(self._ready().allocate(length), writable=False).address
        except (FerryError, ValueError, TypeError) as e:
            log.error("allocate_managed_buffer(%d) failed: %s", length, e)
            return 0

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        return _status("free_managed_buffer", lambda: self._ready().free(buffer_addr))

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes, length: int) -> int:
        ctypes.memmove(dest_address, src_ptr, min(length, len(src_ptr)))
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        return ctypes.string_at(source_address, length)

    def get_first_buffer_address(self, segment_name: str) -> int:
        return self._ready().segment_info(segment_name).buffers[0].addr

    # Synchronous transfers.

    def _requests(self, opcode: int, target_hostname: str, buffers: Sequence[int],
                  peer_buffer_addresses: Sequence[int],
                  lengths: Sequence[int]) -> list[Request]:
        """TransferOpcode's values are ferry's READ and WRITE; the extension refuses
        any other opcode with InvalidArgument."""
        if not len(buffers) == len(peer_buffer_addresses) == len(lengths):
            raise InvalidArgument("buffers, peer_buffer_addresses and lengths differ in length")
        return [Request(opcode, (b, n), target_hostname, p, n)
                for b, p, n in zip(buffers, peer_buffer_addresses, lengths)]

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int, transport_hint: str = "") -> int:
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length,
                                  TransferOpcode.Write)

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int, transport_hint: str = "") -> int:
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length,
                                  TransferOpcode.Read)

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                      length: int, opcode: int, notify: Any = None) -> int:
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], opcode)

    def batch_transfer_sync_write(self, target_hostname: str, buffers: Sequence[int],
                                  peer_buffer_addresses: Sequence[int],
                                  lengths: Sequence[int], transport_hint: str = "") -> int:
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Write)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: Sequence[int],
                                 peer_buffer_addresses: Sequence[int],
                                 lengths: Sequence[int], transport_hint: str = "") -> int:
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Read)

    def batch_transfer_sync(self, target_hostname: str, buffers: Sequence[int],
                            peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                            opcode: int, notify: Any = None) -> int:
        return _status("transfer", lambda: self._ready().transfer(self._requests(
            opcode, target_hostname, buffers, peer_buffer_addresses, lengths)))

    # Asynchronous batches.

    def batch_transfer_async_write(self, target_hostname: str, buffers: Sequence[int],
                                   peer_buffer_addresses: Sequence[int],
                                   lengths: Sequence[int], transport_hint: str = "") -> int:
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.Write)

    def batch_transfer_async_read(self, target_hostname: str, buffers: Sequence[int],
                                  peer_buffer_addresses: Sequence[int],
                                  lengths: Sequence[int], transport_hint: str = "") -> int:
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.Read)

    def batch_transfer_async(self, target_hostname: str, buffers: Sequence[int],
                             peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                             opcode: int) -> int:
        """A batch id (> 0) for get_batch_transfer_status, or 0 on failure."""
        try:
            handle = self._ready().submit(self._requests(
                opcode, target_hostname, buffers, peer_buffer_addresses, lengths))
        except (FerryError, ValueError, TypeError) as e:
            log.error("batch_transfer_async failed: %s", e)
            return 0
        batch_id = next(self._batch_ids)
        self._batches[batch_id] = handle
        return batch_id

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                              length: int, transport_hint: str = "") -> int:
        batch_id = self.batch_transfer_async_write(target_hostname, [buffer],
                                                   [peer_buffer_address], [length])
        return batch_id or _FAILED

    def transfer_check_status(self, batch_id: int) -> int:
        """1 done (the id is freed), 0 running, -1 failed (freed), -2 timed out."""
        handle = self._batches.get(batch_id)
        if handle is None:
            return _FAILED
        if not handle.done():
            return 0
        error = _first_error(handle)
        self._batches.pop(batch_id).close()
        if error is None:
            return 1
        log.error("batch %d failed: %s", batch_id, error)
        return -2 if isinstance(error, TimeoutError) else _FAILED

    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Blocks until every batch is done; 0 if all succeeded, else -1. The ids
        are freed either way."""
        handles = [self._batches.pop(i, None) for i in batch_ids]
        rc = 0
        for batch_id, handle in zip(batch_ids, handles):
            if handle is None:
                log.error("get_batch_transfer_status: unknown batch id %r", batch_id)
                rc = _FAILED
                continue
            with handle:
                if _status(f"batch {batch_id}", handle.wait) != 0:
                    rc = _FAILED
        return rc

    # Stream-ordered transfers (Engine::SubmitOnStream): return at once; work
    # enqueued on the stream afterwards sees the data.

    def transfer_write_on_cuda(self, target_hostname: str, buffer: int,
                               peer_buffer_address: int, length: int, stream_ptr: int = 0,
                               transport_hint: str = "") -> None:
        self.batch_transfer_on_cuda(target_hostname, [buffer], [peer_buffer_address], [length],
                                    TransferOpcode.Write, stream_ptr)

    def transfer_read_on_cuda(self, target_hostname: str, buffer: int,
                              peer_buffer_address: int, length: int, stream_ptr: int = 0,
                              transport_hint: str = "") -> None:
        self.batch_transfer_on_cuda(target_hostname, [buffer], [peer_buffer_address], [length],
                                    TransferOpcode.Read, stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname: str, buffers: Sequence[int],
                                     peer_buffer_addresses: Sequence[int],
                                     lengths: Sequence[int], stream_ptr: int = 0,
                                     transport_hint: str = "") -> None:
        self.batch_transfer_on_cuda(target_hostname, buffers, peer_buffer_addresses, lengths,
                                    TransferOpcode.Write, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname: str, buffers: Sequence[int],
                                    peer_buffer_addresses: Sequence[int],
                                    lengths: Sequence[int], stream_ptr: int = 0,
                                    transport_hint: str = "") -> None:
        self.batch_transfer_on_cuda(target_hostname, buffers, peer_buffer_addresses, lengths,
                                    TransferOpcode.Read, stream_ptr)

    def batch_transfer_on_cuda(self, target_hostname: str, buffers: Sequence[int],
                               peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                               opcode: int, stream_ptr: int = 0,
                               transport_hint: str = "") -> None:
        """Raises ferry.FerryError if the batch cannot be enqueued (Mooncake logs and
        returns None). A failure after that is raised by the next call here or by
        check_cuda_transfers()."""
        self._reap_on_stream()
        requests = self._requests(opcode, target_hostname, buffers, peer_buffer_addresses,
                                  lengths)
        handle = self._ready().submit_on_stream(requests, stream_ptr)
        with self._lock:
            self._on_stream.append(handle)

    def check_cuda_transfers(self, timeout: Optional[float] = None) -> None:
        """Ferry extension: waits (up to `timeout` s each) for the stream-ordered
        transfers still held and raises the first error any of them met."""
        with self._lock:
            pending = list(self._on_stream)
        for handle in pending:
            try:
                finished = handle.wait(timeout)
            except FerryError:
                if not handle.done():
                    raise
                continue  # its error is raised by _reap_on_stream
            if not finished and not handle.done():
                raise Timeout(f"stream-ordered transfer still running after {timeout} s")
        self._reap_on_stream()

    def _reap_on_stream(self) -> None:
        """Frees the finished stream-ordered transfers; raises the first error seen."""
        with self._lock:
            running = []
            for handle in self._on_stream:
                if not handle.done():
                    running.append(handle)
                    continue
                error = _first_error(handle)
                if error is not None:
                    self._stream_errors.append(error)
                handle.close()
            self._on_stream = running
            if not self._stream_errors:
                return
            first, self._stream_errors = self._stream_errors[0], []
        raise first

# The store (mooncake.store's names), so that one import serves both.
from .mooncake_store import MooncakeDistributedStore  # noqa: E402,F401
from .mooncake_store import MooncakeHostMemAllocator  # noqa: E402,F401
from .mooncake_store import ReplicateConfig  # noqa: E402,F401
