"""ferry.Store: a distributed key-value store for KV cache.

    with ferry.Store() as store:          # embedded: master and node in this process
        store.put("k", b"bytes")
        store.get("k")

    store = ferry.Store(master="host:port", local_memory=0, replicas=2)  # a cluster client
    store = ferry.Store.attach("/run/ferry.sock")                        # the host's node

Keys are str (UTF-8) or bytes; "k" and b"k" are the same key. Values are
anything with the buffer protocol (bytes, bytearray, numpy, memoryview), read in
place, without a copy in Python. put_from/get_into move data straight between a
registered buffer (register_buffer, or allocate_buffer's memory) and the nodes;
attached, only allocate_buffer's memory is shared with the node, and other
memory goes through the staging area.
Timeouts are in seconds. Single calls raise ferry.FerryError subclasses; batch
calls return one result per key, an exception object in place of a failed item.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence, Union

from . import _ferry
from .buffers import Buffer, resolve, stream_handle
from .errors import FerryError, InvalidArgument, NotFound, NotSupported, error_class

Key = Union[str, bytes]
_PINS = {None: 0, "soft": 1, "hard": 2}


def _key(key: Any) -> bytes:
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes):
        return key
    raise InvalidArgument(f"a key is str or bytes, not {type(key).__name__}")


def _keys(keys: Sequence[Key]) -> list[bytes]:
    return [_key(k) for k in keys]


def _millis(seconds: Optional[float], what: str) -> int:
    if seconds is None:
        return 0  # the C++ default
    if seconds <= 0:
        raise InvalidArgument(f"{what} must be positive, got {seconds}")
    return max(1, round(seconds * 1000))


def _pin(kind: Optional[str]) -> int:
    try:
        return _PINS[kind]
    except (KeyError, TypeError):
        raise InvalidArgument(f'a pin is "hard", "soft" or None, not {kind!r}') from None


def _host(obj: Any, *, writable: bool) -> Buffer:
    buf = resolve(obj, writable=writable)
    if buf.gpu:
        # put and put_parts copy with memcpy; GPU memory goes through put_from.
        raise NotSupported("put copies host memory; register GPU memory and use put_from")
    return buf


def _stream(bufs: Sequence[Buffer], stream: Any) -> int:
    """The submission stream of a call: `stream` when given, else the GPU
    buffers' own (torch's current stream for their device); 0, the legacy
    default stream, when they have none."""
    if stream is not None:
        return stream_handle(stream)
    own = {b.stream for b in bufs if b.gpu and b.stream is not None}
    if len(own) > 1:
        raise InvalidArgument("GPU buffers on different current streams in one call; "
                              "pass stream= explicitly")
    return own.pop() if own else 0


def _error(code: int, message: str) -> Optional[FerryError]:
    return None if code == 0 else error_class(code)(message)


class Store:
    """A ferry::Store. Without `master`, a master runs in this process; with one
    ("host:port" of `ferry master`) this process joins that cluster. Either way
    `local_memory` bytes of this process become a node (0: a pure client).
    lease, put_timeout and node_ttl set the in-process master (None: defaults).
    `auth_key_file`: the cluster secret's file (mode 0600), proven to the master
    and to the nodes' engines (None: $FERRY_AUTH_KEY_FILE, else none).
    `reserve_bytes`: at most this much space reserved at the master ahead of
    puts of the value sizes recent puts used, which then skip a master round
    trip (None: 256 MiB; 0: none)."""

    def __init__(self, master: Optional[str] = None, local_memory: int = 256 << 20,
                 replicas: int = 1, *, prefer_local: bool = True, host: str = "127.0.0.1",
                 port: int = 0, transport: str = "", rpc_timeout: float = 5.0,
                 lease: Optional[float] = None, put_timeout: Optional[float] = None,
                 node_ttl: Optional[float] = None, auth_key_file: Optional[str] = None,
                 reserve_bytes: Optional[int] = None) -> None:
        if replicas < 1:
            raise InvalidArgument(f"replicas must be at least 1, got {replicas}")
        if local_memory < 0:
            raise InvalidArgument(f"local_memory cannot be negative, got {local_memory}")
        if reserve_bytes is not None and reserve_bytes < 0:
            raise InvalidArgument(f"reserve_bytes cannot be negative, got {reserve_bytes}")
        self._init(_binding().create(
            master=master or "", local_memory=local_memory, replicas=replicas,
            prefer_local=prefer_local, host=host, port=port, transport=transport or "",
            rpc_timeout_ms=_millis(rpc_timeout, "rpc_timeout"),
            lease_ms=_millis(lease, "lease"), put_timeout_ms=_millis(put_timeout, "put_timeout"),
            node_ttl_ms=_millis(node_ttl, "node_ttl"), auth_key_file=auth_key_file or "",
            reserve_bytes=-1 if reserve_bytes is None else reserve_bytes))

    @classmethod
    def attach(cls, path: str, *, timeout: float = 5.0, staging: int = 64 << 20,
               readiness: str = "sync", auth_key_file: Optional[str] = None) -> "Store":
        """Attaches to the `ferry node --socket PATH` of this host: no engine and
        no port here. `timeout` bounds each call; `staging` is the area shared
        with the node for memory outside allocate_buffer. `readiness`, for CUDA
        memory: "sync" (this thread waits for the stream's earlier work, then
        sends; the default, and the faster) or "event" (the node's stream waits
        for it on the GPU; no CPU waits before sending). `auth_key_file`: the
        cluster secret's file, when the node holds one (None: $FERRY_AUTH_KEY_FILE)."""
        if staging <= 0:
            raise InvalidArgument(f"staging must be positive, got {staging}")
        if readiness not in ("sync", "event"):
            raise InvalidArgument(f'readiness is "sync" or "event", not {readiness!r}')
        self = cls.__new__(cls)
        self._init(_binding().attach(str(path), rpc_timeout_ms=_millis(timeout, "timeout"),
                                     staging_bytes=staging, readiness=int(readiness == "event"),
                                     auth_key_file=auth_key_file or ""))
        return self

    def _init(self, store: Any) -> None:
        self._store = store
        # Registered objects stay alive until unregistered: the C++ Store keeps
        # their addresses.
        self._registered: dict[int, Any] = {}

    @property
    def segment(self) -> str:
        """This process's engine name ("host:port"); attached, the node's."""
        return self._store.segment

    @property
    def master_address(self) -> str:
        return self._store.master_address

    def close(self) -> None:
        """Unmounts the embedded node (values with no other replica go) or
        detaches. Later calls raise InvalidArgument. Registered objects stay
        referenced until this object is collected: a call still running on
        another thread may be using them."""
        self._store.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # Values.

    def put(self, key: Key, data: Any, *, replicas: Optional[int] = None,
            preferred: Optional[str] = None, pin: Optional[str] = None,
            pin_ttl: Optional[float] = None) -> None:
        """Stores a copy of `data`'s bytes. Visible complete or not at all."""
        buf = _host(data, writable=False)
        self._store.put(_key(key), buf.address, buf.nbytes,
                        **_put_options(replicas, preferred, pin, pin_ttl))

    def get(self, key: Key) -> bytes:
        return self._store.get(_key(key))

    def put_from(self, key: Key, buf: Any, *, replicas: Optional[int] = None,
                 preferred: Optional[str] = None, pin: Optional[str] = None,
                 pin_ttl: Optional[float] = None, stream: Any = None) -> None:
        """As put, from registered memory, with no staging copy. Registered GPU
        memory (embedded stores) is read after the work already enqueued on
        `stream` (default: torch's current stream for the tensor's device)."""
        b = resolve(buf, writable=False)
        self._store.put_from(_key(key), b.address, b.nbytes,
                             **_put_options(replicas, preferred, pin, pin_ttl),
                             stream=_stream([b], stream))

    def get_into(self, key: Key, buf: Any, *, stream: Any = None) -> int:
        """Reads the value into registered memory; returns its size. OutOfRange
        if `buf` is smaller. GPU memory is written after the work already
        enqueued on `stream` and holds the value when this returns."""
        b = resolve(buf, writable=True)
        return self._store.get_into(_key(key), b.address, b.nbytes, stream=_stream([b], stream))

    def exists(self, key: Key) -> bool:
        return self._store.exists(_key(key))

    def remove(self, key: Key, force: bool = False) -> None:
        """Busy while the value is read or written, unless `force`."""
        self._store.remove(_key(key), force)

    def remove_all(self, force: bool = False) -> int:
        """Removes every object of the store that remove() would (all of them
        with `force`); returns how many."""
        return self._store.remove_all(force)

    def pin(self, key: Key, kind: Optional[str] = "hard", ttl: Optional[float] = None) -> None:
        """kind "hard": never evicted; "soft": not evicted in the background for
        `ttl` seconds; None unpins."""
        self._store.pin(_key(key), _pin(kind), _ttl(ttl))

    def stats(self) -> dict[str, int]:
        """capacity, used (bytes), nodes and objects, as the master counts them."""
        return self._store.stats()

    # Memory.

    def register_buffer(self, buf: Any) -> None:
        """Makes `buf` usable by put_from/get_into and keeps it alive until
        unregister_buffer. GPU memory (a CUDA tensor, say) registers with an
        embedded store; an attached one refuses it with NotSupported."""
        b = resolve(buf, writable=False)
        self._store.register_buffer(b.address, b.nbytes)
        self._registered[b.address] = b.keepalive

    def unregister_buffer(self, buf: Any) -> None:
        address = buf if isinstance(buf, int) else resolve(buf, writable=False).address
        self._store.unregister_buffer(address)
        self._registered.pop(address, None)

    def batch_register_buffer(self, bufs: Sequence[Any]) -> None:
        """All or nothing: on a failure the buffers registered here are unregistered."""
        done = []
        try:
            for b in bufs:
                self.register_buffer(b)
                done.append(b)
        except BaseException:
            for b in done:
                with contextlib.suppress(FerryError):
                    self.unregister_buffer(b)
            raise

    def batch_unregister_buffer(self, bufs: Sequence[Any]) -> None:
        """Unregisters every buffer it can, then raises the first error."""
        first = None
        for b in bufs:
            try:
                self.unregister_buffer(b)
            except FerryError as e:
                first = first or e
        if first is not None:
            raise first

    def allocate_buffer(self, nbytes: int) -> memoryview:
        """Registered, memfd-backed memory (attached: shared with the node, which
        moves bytes with no copy). Valid as long as the view or any view of it
        lives; registered until unregister_buffer or close."""
        if nbytes <= 0:
            raise InvalidArgument(f"nbytes must be positive, got {nbytes}")
        mem = self._store.allocate_buffer(nbytes)
        self._registered[mem.address] = mem
        return memoryview(mem)

    # Batch forms: one result per key, in order; each item's error in its place.

    def batch_put(self, keys: Sequence[Key], values: Sequence[Any], *,
                  replicas: Optional[int] = None, preferred: Optional[str] = None,
                  pin: Optional[str] = None,
                  pin_ttl: Optional[float] = None) -> list[Optional[FerryError]]:
        ks = _keys(keys)
        bufs = _buffers(ks, values, writable=False)
        res = self._store.batch_put(ks, [(b.address, b.nbytes) for b in bufs],
                                    **_put_options(replicas, preferred, pin, pin_ttl))
        return [_error(*r) for r in res]

    def batch_get(self, keys: Sequence[Key]) -> list[Union[bytes, FerryError]]:
        return [value if code == 0 else error_class(code)(text)
                for code, text, value in self._store.batch_get(_keys(keys))]

    def batch_put_from(self, keys: Sequence[Key], bufs: Sequence[Any], *,
                       replicas: Optional[int] = None, preferred: Optional[str] = None,
                       pin: Optional[str] = None, pin_ttl: Optional[float] = None,
                       stream: Any = None) -> list[Optional[FerryError]]:
        ks = _keys(keys)
        bs = _buffers(ks, bufs, writable=False, gpu=True)
        res = self._store.batch_put_from(ks, [(b.address, b.nbytes) for b in bs],
                                         **_put_options(replicas, preferred, pin, pin_ttl),
                                         stream=_stream(bs, stream))
        return [_error(*r) for r in res]

    def batch_get_into(self, keys: Sequence[Key], bufs: Sequence[Any], *,
                       stream: Any = None) -> list[Union[int, FerryError]]:
        ks = _keys(keys)
        bs = _buffers(ks, bufs, writable=True, gpu=True)
        res = self._store.batch_get_into(ks, [(b.address, b.nbytes) for b in bs],
                                         stream=_stream(bs, stream))
        return [n if code == 0 else error_class(code)(text) for code, text, n in res]

    # Multi-buffer forms: each object is the concatenation of its buffers, in
    # order; a get fills them in order (OutOfRange when their sum is too small).

    def put_parts(self, key: Key, parts: Sequence[Any], *, replicas: Optional[int] = None,
                  preferred: Optional[str] = None, pin: Optional[str] = None,
                  pin_ttl: Optional[float] = None, stream: Any = None) -> None:
        """As put, of the concatenation of `parts`, with no Python copy. Parts may
        be CUDA memory (registered or not): read after the work already queued on
        `stream` (default: torch's current stream for their device)."""
        err = self.batch_put_parts([key], [parts], replicas=replicas, preferred=preferred,
                                   pin=pin, pin_ttl=pin_ttl, stream=stream)[0]
        if err is not None:
            raise err

    def batch_put_parts(self, keys: Sequence[Key], parts_lists: Sequence[Sequence[Any]], *,
                        replicas: Optional[int] = None, preferred: Optional[str] = None,
                        pin: Optional[str] = None, pin_ttl: Optional[float] = None,
                        stream: Any = None) -> list[Optional[FerryError]]:
        ks = _keys(keys)
        lists = _buffer_lists(ks, parts_lists, writable=False, gpu=True)
        res = self._store.batch_put_parts(ks, [[(b.address, b.nbytes) for b in l] for l in lists],
                                          **_put_options(replicas, preferred, pin, pin_ttl),
                                          stream=_stream([b for l in lists for b in l], stream))
        return [_error(*r) for r in res]

    def batch_put_from_multi(self, keys: Sequence[Key], buffer_lists: Sequence[Sequence[Any]], *,
                             replicas: Optional[int] = None, preferred: Optional[str] = None,
                             pin: Optional[str] = None, pin_ttl: Optional[float] = None,
                             stream: Any = None) -> list[Optional[FerryError]]:
        """As batch_put_from, each object from a list of registered buffers."""
        ks = _keys(keys)
        lists = _buffer_lists(ks, buffer_lists, writable=False, gpu=True)
        res = self._store.batch_put_from_multi(
            ks, [[(b.address, b.nbytes) for b in l] for l in lists],
            **_put_options(replicas, preferred, pin, pin_ttl),
            stream=_stream([b for l in lists for b in l], stream))
        return [_error(*r) for r in res]

    def batch_get_into_parts(self, keys: Sequence[Key], parts_lists: Sequence[Sequence[Any]], *,
                             stream: Any = None,
                             expect: bytes = b"") -> list[Union[int, FerryError]]:
        """As batch_get_into_multi, into any memory: host memory by copy, CUDA
        memory (registered or not) after the work already queued on `stream`."""
        return self._get_into_lists(self._store.batch_get_into_parts, keys, parts_lists,
                                    stream, expect)

    def batch_get_into_multi(self, keys: Sequence[Key], buffer_lists: Sequence[Sequence[Any]], *,
                             stream: Any = None,
                             expect: bytes = b"") -> list[Union[int, FerryError]]:
        """As batch_get_into, each value spread over a list of registered buffers.
        With `expect`, a value that does not begin with those bytes fails
        (InvalidArgument) before any byte reaches the buffers."""
        return self._get_into_lists(self._store.batch_get_into_multi, keys, buffer_lists,
                                    stream, expect)

    @staticmethod
    def _get_into_lists(call: Any, keys: Sequence[Key], lists: Sequence[Sequence[Any]],
                        stream: Any, expect: bytes) -> list[Union[int, FerryError]]:
        ks = _keys(keys)
        bufs = _buffer_lists(ks, lists, writable=True, gpu=True)
        res = call(ks, [[(b.address, b.nbytes) for b in l] for l in bufs],
                   stream=_stream([b for l in bufs for b in l], stream), expect=expect)
        return [n if code == 0 else error_class(code)(text) for code, text, n in res]

    def batch_exists(self, keys: Sequence[Key]) -> list[bool]:
        """Raises the first error other than NotFound."""
        out = []
        for code, text in self._store.batch_exists(_keys(keys)):
            err = _error(code, text)
            if err is not None and code != NotFound.code:
                raise err
            out.append(err is None)
        return out

    def batch_remove(self, keys: Sequence[Key],
                     force: bool = False) -> list[Optional[FerryError]]:
        return [_error(*r) for r in self._store.batch_remove(_keys(keys), force)]

    def batch_pin(self, keys: Sequence[Key], kind: Optional[str] = "hard",
                  ttl: Optional[float] = None) -> list[Optional[FerryError]]:
        return [_error(*r) for r in self._store.batch_pin(_keys(keys), _pin(kind), _ttl(ttl))]

    # Tensors: a 304-byte header (Mooncake's layout, docs/tensor-format.md), then the
    # raw bytes. numpy arrays and CPU torch tensors; CUDA tensors raise NotSupported
    # for now. Reads return numpy arrays, or torch tensors when `device` is given.
    # `options` are put's (replicas, preferred, pin, pin_ttl).

    def put_tensor(self, key: Key, t: Any, **options: Any) -> None:
        """Stores `t` (made contiguous, a copy, if it is not) with its header."""
        from . import tensor_store
        tensor_store.put_tensor(self, key, t, **options)

    def get_tensor(self, key: Key, device: Any = None) -> Any:
        """A new numpy array; with `device` ("cpu" for now), a torch tensor on it.
        ProtocolError if the object is not a valid tensor object."""
        from . import tensor_store
        return tensor_store.get_tensor(self, key, device)

    def get_tensor_into(self, key: Key, t: Any) -> Any:
        """Reads into `t` (contiguous, writable) and returns it. InvalidArgument, with
        `t` untouched, unless its dtype, shape and byte count match the object's."""
        from . import tensor_store
        return tensor_store.get_tensor_into(self, key, t)

    def batch_put_tensor(self, keys: Sequence[Key], tensors: Sequence[Any],
                         **options: Any) -> list[Optional[FerryError]]:
        from . import tensor_store
        return tensor_store.batch_put_tensor(self, keys, tensors, **options)

    def batch_get_tensor(self, keys: Sequence[Key],
                         device: Any = None) -> list[Union[Any, FerryError]]:
        from . import tensor_store
        return tensor_store.batch_get_tensor(self, keys, device)

    def batch_get_tensor_into(self, keys: Sequence[Key],
                              tensors: Sequence[Any]) -> list[Union[Any, FerryError]]:
        """Each item: its destination, filled, or the error (that destination untouched)."""
        from . import tensor_store
        return tensor_store.batch_get_tensor_into(self, keys, tensors)

    def put_tensor_with_tp(self, key: Key, t: Any, tp_size: int, split_dim: int = 0,
                           **options: Any) -> None:
        """Splits `t` evenly along split_dim and stores rank r's shard as
        f"{key}_tp_{r}" for every rank (tp_size 1: `t` under `key`). An uneven split
        raises InvalidArgument before anything is stored."""
        from . import tensor_store
        tensor_store.put_tensor_with_tp(self, key, t, tp_size, split_dim, **options)

    def get_tensor_with_tp(self, key: Key, tp_rank: int, tp_size: int,
                           split_dim: Optional[int] = None, device: Any = None) -> Any:
        """Rank tp_rank's shard. split_dim, when given, must match the stored one."""
        from . import tensor_store
        return tensor_store.get_tensor_with_tp(self, key, tp_rank, tp_size, split_dim, device)


def _binding() -> Any:
    cls = getattr(_ferry, "Store", None)
    if cls is None:
        raise NotSupported("this ferry was built without the store (python/build-ext.sh "
                           "found no libferry_store.a)")
    return cls


def _ttl(seconds: Optional[float]) -> int:
    return 0 if seconds is None else _millis(seconds, "a pin's ttl")


def _put_options(replicas: Optional[int], preferred: Optional[str], pin: Optional[str],
                 pin_ttl: Optional[float]) -> dict[str, Any]:
    if replicas is not None and replicas < 1:
        raise InvalidArgument(f"replicas must be at least 1, got {replicas}")
    return {"replicas": replicas or 0, "preferred": preferred or "", "pin": _pin(pin),
            "pin_ttl_ms": _ttl(pin_ttl)}


def _buffers(keys: list[bytes], objs: Sequence[Any], *, writable: bool,
             gpu: bool = False) -> list[Buffer]:
    """One buffer per key; `gpu`: registered GPU memory is allowed (put_from
    and get_into forms), else host memory only (put forms, which copy)."""
    if len(objs) != len(keys):
        raise InvalidArgument(f"{len(keys)} keys but {len(objs)} buffers")
    return _resolved(objs, writable=writable, gpu=gpu)


def _resolved(objs: Sequence[Any], *, writable: bool, gpu: bool) -> list[Buffer]:
    if gpu:
        return [resolve(o, writable=writable) for o in objs]
    return [_host(o, writable=writable) for o in objs]


def _buffer_lists(keys: list[bytes], lists: Sequence[Sequence[Any]], *, writable: bool,
                  gpu: bool) -> list[list[Buffer]]:
    if len(lists) != len(keys):
        raise InvalidArgument(f"{len(keys)} keys but {len(lists)} buffer lists")
    return [_resolved(l, writable=writable, gpu=gpu) for l in lists]
