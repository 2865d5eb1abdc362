"""The compat store's set-up (setup, setup_dummy), lifecycle, registered memory
and error reporting, under MooncakeDistributedStore (mooncake_store.py)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

from ..buffers import resolve
from ..errors import AlreadyExists, Busy, FerryError
from ..store import Store
from .mooncake_args import _flag, _text, _type_error, _uint
from .mooncake_config import (DEFAULT_CLIENT_HTTP_PORT, DEFAULT_DICT_SEGMENT_SIZE,
                              DEFAULT_MASTER_SERVER_ADDR, MooncakeConfig, _parse_bool,
                              _DEFAULT_STAGING, parse_size)
from .mooncake_errors import (_AUTO_PROTOCOLS, _FORCED_PROTOCOLS, HC_HEALTHY,
                              HC_MASTER_UNREACHABLE, HC_NOT_INITIALIZED, INVALID_PARAMS, OK,
                              OBJECT_NOT_FOUND, P2PHANDSHAKE, _Refused, mooncake_code)

log = logging.getLogger("ferry.compat.mooncake.store")

_MISSING: Any = object()
_SETUP_ARGS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
               "protocol", "rdma_devices", "master_server_addr")
# setup(dict): Mooncake's keys, and the config file's names for two of them.
_DICT_ALIASES = {"device_name": "rdma_devices", "master_server_address": "master_server_addr"}
_DICT_KEYS = set(_SETUP_ARGS) | {"enable_ssd_offload", "ssd_offload_path", "tenant_id",
                                 "enable_client_http_server", "client_http_port",
                                 "ipc_socket_path"}


class _StoreBase:
    """MooncakeDistributedStore's set-up, lifecycle, registered memory and error
    reporting; its data calls are in mooncake_store.py. One instance may be used
    from several threads; last_error() is per thread."""

    def __init__(self, *, strict: bool = False) -> None:
        if not isinstance(strict, bool):
            raise _type_error("MooncakeDistributedStore", "strict", strict, "bool")
        self._strict = strict
        self._store: Optional[Store] = None
        self._lock = threading.Lock()
        self._local = threading.local()
        # allocate_buffer areas (MooncakeHostMemAllocator(store), alloc_from_mem_pool):
        # address -> (size, view keeping the mapping alive).
        self._areas: dict[int, tuple[int, memoryview]] = {}

    # Errors.

    def last_error(self) -> str:
        """The message of the latest call's failure on this thread; "" if it succeeded."""
        return getattr(self._local, "error", "")

    def _begin(self) -> None:
        self._local.error = ""

    def _report(self, what: str, failures: list[tuple[Any, BaseException, int]],
                total: int = 1) -> None:
        """Logs one line for a call's failures, remembers it, raises if strict.
        `failures`: (key or None, exception, code)."""
        if not failures:
            return
        key, err, code = failures[0]

        def one(k: Any, e: BaseException, c: int) -> str:
            where = "" if k is None else f"key {k!r}: "
            name = e.error.__name__ if isinstance(e, _Refused) else type(e).__name__
            text = str(e)  # ferry's messages start with their status name
            return f"{where}{c} ({text if text.startswith(name + ':') else f'{name}: {text}'})"

        if total == 1 and len(failures) == 1:
            message = f"{what}: {one(key, err, code)}"
        else:
            listed = "; ".join(one(*f) for f in failures[:3])
            more = f"; and {len(failures) - 3} more" if len(failures) > 3 else ""
            message = f"{what}: {len(failures)} of {total} failed: {listed}{more}"
        self._local.error = message
        misses = all(c == OBJECT_NOT_FOUND for _, _, c in failures)
        log.log(logging.DEBUG if misses else logging.ERROR, "%s", message)
        if self._strict:
            if isinstance(err, _Refused):
                raise err.error(str(err)) from None
            raise err

    def _fail(self, what: str, err: BaseException, key: Any = None) -> int:
        code = err.code if isinstance(err, _Refused) else mooncake_code(err)
        self._report(what, [(key, err, code)])
        return code

    def _ready(self) -> Store:
        store = self._store
        if store is None:
            raise _Refused(INVALID_PARAMS, "the store is not set up: setup() or setup_dummy() "
                           "has not succeeded, or close() was called")
        return store

    def _status(self, what: str, fn: Callable[[], Any], key: Any = None) -> int:
        """0, or the failure's code (logged once)."""
        self._begin()
        try:
            fn()
            return OK
        except (FerryError, _Refused) as e:
            return self._fail(what, e, key)

    def _codes(self, what: str, keys: Sequence, results: Sequence[Any],
               ok: Callable[[Any], int], *, put: bool = False) -> list[int]:
        """Per-key results (a value, None or an exception) as Mooncake ints, the
        failures reported once."""
        out: list[int] = []
        failures: list[tuple[Any, BaseException, int]] = []
        for k, r in zip(keys, results):
            if isinstance(r, FerryError):
                if put and isinstance(r, (AlreadyExists, Busy)):
                    out.append(OK)  # Mooncake's put is write-once: the old value stays
                    continue
                code = mooncake_code(r)
                out.append(code)
                failures.append((k, r, code))
            else:
                out.append(ok(r))
        self._report(what, failures, len(keys))
        return out

    def _batch(self, what: str, keys: Sequence, run: Callable[[Store], Sequence[Any]],
               ok: Callable[[Any], int], *, put: bool = False) -> list[int]:
        """A batch call: one int per key; a failure of the whole call is every key's."""
        self._begin()
        try:
            results = run(self._ready())
        except (FerryError, _Refused) as e:
            code = e.code if isinstance(e, _Refused) else mooncake_code(e)
            self._report(what, [(None, e, code)])
            return [code] * len(keys)
        return self._codes(what, keys, results, ok, put=put)

    # Set-up.

    def setup(self, local_hostname: Any = _MISSING, metadata_server: Any = _MISSING,
              global_segment_size: Any = _MISSING, local_buffer_size: Any = _MISSING,
              protocol: Any = _MISSING, rdma_devices: Any = _MISSING,
              master_server_addr: Any = _MISSING, engine: Any = None,
              enable_ssd_offload: Any = False, ssd_offload_path: Any = "",
              tenant_id: Any = "default", enable_client_http_server: Any = False,
              client_http_port: Any = DEFAULT_CLIENT_HTTP_PORT) -> int:
        """Joins the `ferry master` at master_server_addr ("host:port"), contributing
        global_segment_size bytes of this process as a node (0: a pure client).
        Also setup(dict), with Mooncake's keys; and setup() with no arguments, from
        MOONCAKE_CONFIG_PATH or the MOONCAKE_* variables (MooncakeConfig)."""
        given = [local_hostname, metadata_server, global_segment_size, local_buffer_size,
                 protocol, rdma_devices, master_server_addr]
        rest = dict(engine=engine, enable_ssd_offload=enable_ssd_offload,
                    ssd_offload_path=ssd_offload_path, tenant_id=tenant_id,
                    enable_client_http_server=enable_client_http_server,
                    client_http_port=client_http_port)
        if isinstance(local_hostname, Mapping) and all(v is _MISSING for v in given[1:]):
            return self._setup_dict(local_hostname)
        if all(v is _MISSING for v in given):
            return self._setup_env()
        missing = [n for n, v in zip(_SETUP_ARGS, given) if v is _MISSING]
        if missing:
            raise TypeError(f"setup(): missing required arguments: {', '.join(missing)} "
                            "(or pass one dict, or nothing to read MOONCAKE_CONFIG_PATH)")
        return self._setup_args("setup", *given, **rest)

    def _setup_dict(self, config: Mapping) -> int:
        self._begin()
        values: dict[str, Any] = {}
        for k, v in config.items():
            if not isinstance(k, str):
                raise _type_error("setup", "a config key", k, "str")
            name = _DICT_ALIASES.get(k, k)
            if name not in _DICT_KEYS:
                log.warning("setup(dict): unknown key %r ignored", k)
                continue
            values[name] = v
        try:
            for name in ("local_hostname", "metadata_server"):
                if not str(values.get(name, "")):
                    raise _Refused(INVALID_PARAMS, f"setup(dict): {name!r} is required")
            sizes = {n: parse_size(values.get(n, DEFAULT_DICT_SEGMENT_SIZE))
                     for n in ("global_segment_size", "local_buffer_size")}
            flags = {n: _parse_bool(values.get(n, False))
                     for n in ("enable_ssd_offload", "enable_client_http_server")}
            port = int(values.get("client_http_port", DEFAULT_CLIENT_HTTP_PORT))
        except ValueError as e:
            return self._fail("setup", _Refused(INVALID_PARAMS, f"setup(dict): {e}"))
        except _Refused as e:
            return self._fail("setup", e)
        return self._setup_args(
            "setup", str(values["local_hostname"]), str(values["metadata_server"]),
            sizes["global_segment_size"], sizes["local_buffer_size"],
            str(values.get("protocol", "tcp")), str(values.get("rdma_devices", "")),
            str(values.get("master_server_addr", DEFAULT_MASTER_SERVER_ADDR)), None,
            flags["enable_ssd_offload"], str(values.get("ssd_offload_path", "")),
            str(values.get("tenant_id", "default")), flags["enable_client_http_server"], port)

    def _setup_env(self) -> int:
        self._begin()
        try:
            c = MooncakeConfig.load_from_env()
        except (OSError, ValueError) as e:
            return self._fail("setup", _Refused(INVALID_PARAMS, f"setup(): {e}"))
        return self._setup_args("setup", c.local_hostname, c.metadata_server,
                                c.global_segment_size, c.local_buffer_size, c.protocol,
                                c.device_name, c.master_server_address, None,
                                c.enable_ssd_offload, c.ssd_offload_path, c.tenant_id,
                                c.enable_client_http_server, c.client_http_port)

    def _setup_args(self, what: str, local_hostname: Any, metadata_server: Any,
                    global_segment_size: Any, local_buffer_size: Any, protocol: Any,
                    rdma_devices: Any, master_server_addr: Any, engine: Any = None,
                    enable_ssd_offload: Any = False, ssd_offload_path: Any = "",
                    tenant_id: Any = "default", enable_client_http_server: Any = False,
                    client_http_port: Any = DEFAULT_CLIENT_HTTP_PORT) -> int:
        hostname = _text(what, "local_hostname", local_hostname)
        metadata = _text(what, "metadata_server", metadata_server)
        segment = _uint(what, "global_segment_size", global_segment_size)
        _uint(what, "local_buffer_size", local_buffer_size)
        proto = _text(what, "protocol", protocol).lower()
        _text(what, "rdma_devices", rdma_devices)
        master = _text(what, "master_server_addr", master_server_addr)
        ssd = _flag(what, "enable_ssd_offload", enable_ssd_offload)
        _text(what, "ssd_offload_path", ssd_offload_path)
        tenant = _text(what, "tenant_id", tenant_id)
        http = _flag(what, "enable_client_http_server", enable_client_http_server)
        _uint(what, "client_http_port", client_http_port)
        self._begin()
        try:
            if self._store is not None:
                raise _Refused(INVALID_PARAMS, "already set up; close() first")
            _check_metadata(metadata)
            if master.startswith("etcd://"):
                # Mooncake's HA form; the cluster as for its metadata strings.
                from .mooncake import metadata_for  # it imports this module

                master = metadata_for(master) or master
            elif not master or ":" not in master:
                raise _Refused(INVALID_PARAMS, f"master_server_addr {master!r}: expected the "
                               "`ferry master` address, host:port")
            if proto not in _AUTO_PROTOCOLS | _FORCED_PROTOCOLS:
                raise _Refused(INVALID_PARAMS, f"protocol {protocol!r} is not supported: tcp, "
                               "rdma (Ferry picks the transport per peer) or shm")
            host, port = _local_address(hostname)
            for name, on in (("enable_ssd_offload", ssd), ("enable_client_http_server", http)):
                if on:
                    log.warning("%s: %s has no meaning in Ferry; ignored", what, name)
            if tenant != "default":
                log.warning("%s: tenant_id %r ignored: Ferry has one key space", what, tenant)
            if engine is not None:
                log.info("%s: the engine argument is ignored; the store runs its own", what)
            store = Store(master=master, local_memory=segment, host=host, port=port,
                          transport=proto if proto in _FORCED_PROTOCOLS else "")
        except (FerryError, _Refused) as e:
            return self._fail(what, e)
        self._store = store
        return OK

    def setup_dummy(self, mem_pool_size: Any, local_buffer_size: Any,
                    server_address: Any) -> int:
        """Attaches to the `ferry node --socket PATH` of this host: server_address is
        that socket's path. mem_pool_size is unused (as in Mooncake);
        local_buffer_size is the staging area shared with the node."""
        _uint("setup_dummy", "mem_pool_size", mem_pool_size)
        staging = _uint("setup_dummy", "local_buffer_size", local_buffer_size)
        path = _text("setup_dummy", "server_address", server_address)
        self._begin()
        try:
            if self._store is not None:
                raise _Refused(INVALID_PARAMS, "already set up; close() first")
            if "/" not in path:
                raise _Refused(INVALID_PARAMS, f"server_address {path!r}: Ferry attaches "
                               "through the Unix socket of this host's node: pass the path "
                               "given to `ferry node --socket`")
            store = Store.attach(path, staging=staging or _DEFAULT_STAGING)
        except (FerryError, _Refused) as e:
            return self._fail("setup_dummy", e)
        self._store = store
        return OK

    def close(self) -> int:
        self._begin()
        with self._lock:
            store, self._store = self._store, None
            self._areas.clear()
        if store is None:
            return OK
        try:
            store.close()
        except FerryError as e:
            return self._fail("close", e)
        return OK

    def health_check(self) -> int:
        """0 healthy, 1 not set up (or closed), 2 the master (or node) unreachable."""
        self._begin()
        store = self._store
        if store is None:
            return HC_NOT_INITIALIZED
        try:
            store.stats()
        except FerryError as e:
            self._local.error = f"health_check: {type(e).__name__}: {e}"
            log.warning("%s", self._local.error)
            return HC_MASTER_UNREACHABLE
        return HC_HEALTHY

    def get_hostname(self) -> str:
        """This process's segment, "host:port": a preferred_segment for its own node.
        Attached, the node's; "" before setup."""
        store = self._store
        if store is None:
            return ""
        try:
            return store.segment
        except FerryError:
            return ""

    # Memory.

    def register_buffer(self, buffer_ptr: Any, size: Any) -> int:
        """Registers host or GPU memory for the zero-copy calls, which read GPU
        memory after the work queued on the legacy default stream. Memory from
        alloc_from_mem_pool or MooncakeHostMemAllocator(store) is registered
        already: 0."""
        ptr = _uint("register_buffer", "buffer_ptr", buffer_ptr)
        n = _uint("register_buffer", "size", size)

        def run() -> None:
            store = self._ready()
            if self._in_area(ptr, n):
                return
            try:
                store.register_buffer((ptr, n))
            except AlreadyExists as e:  # an overlap: bad parameters, not an object
                raise _Refused(INVALID_PARAMS, str(e), AlreadyExists) from None

        return self._status("register_buffer", run)

    def unregister_buffer(self, buffer_ptr: Any) -> int:
        ptr = _uint("unregister_buffer", "buffer_ptr", buffer_ptr)

        def run() -> None:
            store = self._ready()
            if self._in_area(ptr, 0):
                return  # freed with the allocator
            store.unregister_buffer(ptr)

        return self._status("unregister_buffer", run)

    def alloc_from_mem_pool(self, size: Any) -> int:
        """Registered memfd memory from the store (attached: shared with the node);
        its address, or 0. Freed by close()."""
        n = _uint("alloc_from_mem_pool", "size", size)
        self._begin()
        try:
            return self._allocate(n)[0]
        except (FerryError, _Refused) as e:
            self._fail("alloc_from_mem_pool", e)
            return 0

    def _allocate(self, size: int) -> tuple[int, memoryview]:
        view = self._ready().allocate_buffer(size)
        address = resolve(view, writable=False).address
        with self._lock:
            self._areas[address] = (size, view)
        return address, view

    def _release(self, address: int) -> None:
        with self._lock:
            area = self._areas.pop(address, None)
        store = self._store
        if area is not None and store is not None:
            try:
                store.unregister_buffer(address)
            except FerryError as e:
                log.warning("free(%#x): %s: %s", address, type(e).__name__, e)

    def _in_area(self, ptr: int, size: int) -> bool:
        with self._lock:
            return any(a <= ptr and ptr + size <= a + n for a, (n, _) in self._areas.items())


def _check_metadata(metadata: str) -> None:
    """P2PHANDSHAKE, or an HTTP, Redis or etcd metadata server (without a
    scheme Mooncake takes the address as etcd's), which Ferry does not need:
    the master knows the nodes."""
    if not metadata:
        raise _Refused(INVALID_PARAMS, f"metadata_server is required: {P2PHANDSHAKE}")
    if (metadata == P2PHANDSHAKE or "://" not in metadata or
            metadata.startswith(("http://", "https://", "redis://", "etcd://"))):
        if metadata != P2PHANDSHAKE:
            log.info("metadata server %r is not used: Ferry finds nodes through its master",
                     metadata)
        return
    raise _Refused(INVALID_PARAMS, f"metadata_server {metadata!r} is not supported; use "
                   f"{P2PHANDSHAKE}")


def _local_address(hostname: str) -> tuple[str, int]:
    """Mooncake's local_hostname, "host" or "host:port", as Ferry's listen address
    (no port, or 0: a free one)."""
    host, port = hostname, 0
    if hostname.count(":") == 1:
        host, _, text = hostname.partition(":")
        if not text.isdigit() or int(text) > 65535:
            raise _Refused(INVALID_PARAMS, f"local_hostname {hostname!r}: bad port")
        port = int(text)
    if host in ("", "localhost"):
        return "127.0.0.1", port
    try:
        ipaddress.ip_address(host)
        return host, port
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host), port
    except OSError as e:
        raise _Refused(INVALID_PARAMS, f"local_hostname {hostname!r}: {e}") from None
