"""`mooncake.store.MooncakeDistributedStore` on Ferry: change the import, keep the code.

    from ferry.compat.mooncake import MooncakeDistributedStore, ReplicateConfig

The method names, arguments and return conventions of Mooncake's store, for the
set LMCache, vLLM and SGLang use: status methods return 0 or a negative Mooncake
error code (OK, NO_AVAILABLE_HANDLE, ...; see ERROR_CODES), reads return the bytes
read or a negative code, `get` returns b"" and `batch_get_buffer` None on a miss.
Beyond Mooncake, every failure is logged once on the "ferry.compat.mooncake.store"
logger with Ferry's status (misses at DEBUG, the rest at ERROR), `last_error()`
returns that message, and `MooncakeDistributedStore(strict=True)` raises the
`ferry` exceptions instead of returning codes. Wrong argument types raise
TypeError, as Mooncake's pybind module does.

Each method maps onto ferry.Store: `setup` joins a `ferry master` (its
global_segment_size becomes this process's node; 0 makes a pure client) and
`setup_dummy` attaches to the `ferry node --socket PATH` of this host. Every
difference from Mooncake is listed in docs/mooncake-compat.md.
"""

from __future__ import annotations

import ctypes
import enum
import ipaddress
import json
import logging
import mmap
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional, Union

from ..buffers import resolve
from ..errors import (AlreadyExists, Busy, Cancelled, ConnectionLost, FerryError, Internal,
                      InvalidArgument, IoError, NotFound, NotSupported, OutOfRange,
                      PeerRestarted, ProtocolError, ResourceExhausted, Timeout, Unavailable)
from ..store import Store

log = logging.getLogger("ferry.compat.mooncake.store")

# As the compat TransferEngine (ferry.compat.mooncake, which re-exports this
# module's names and so cannot be imported from here): Mooncake's fast-path
# protocols let Ferry pick the transport per peer; tcp and shm force one.
P2PHANDSHAKE = "P2PHANDSHAKE"
_AUTO_PROTOCOLS = {"", "rdma", "nvlink", "nvlink_intra", "efa", "barex", "hip", "cxl"}
_FORCED_PROTOCOLS = {"tcp", "shm"}

# Mooncake's ErrorCode values (mooncake-store/include/types.h) that this module returns.
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
    Cancelled: INTERNAL_ERROR,
    Internal: INTERNAL_ERROR,
}

# health_check()'s answers, as Mooncake's.
HC_HEALTHY, HC_NOT_INITIALIZED, HC_MASTER_UNREACHABLE = 0, 1, 2

# Mooncake's defaults (mooncake-wheel/mooncake/mooncake_config.py; setup(dict)'s
# sizes: mooncake-store real_client.cpp).
DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824
DEFAULT_DICT_SEGMENT_SIZE = 16 << 20
DEFAULT_MASTER_SERVER_ADDR = "127.0.0.1:50051"
DEFAULT_CLIENT_HTTP_PORT = 9300
# Ferry's own staging area for attached clients when local_buffer_size is 0.
_DEFAULT_STAGING = 64 << 20

_SIZE_SUFFIXES = (("kb", 1 << 10), ("mb", 1 << 20), ("gb", 1 << 30), ("tb", 1 << 40),
                  ("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40), ("b", 1))


def mooncake_code(error: BaseException) -> int:
    """The Mooncake code of a ferry exception (ERROR_CODES); -1 for any other."""
    for cls in type(error).__mro__:
        if cls in ERROR_CODES:
            return ERROR_CODES[cls]
    return INTERNAL_ERROR


def parse_size(value: Any) -> int:
    """Bytes from an int or a string such as "4gb", "512 MB", "1.5g" or "1073741824"
    (binary multiples), as Mooncake's configuration reads them."""
    if isinstance(value, bool):
        raise ValueError(f"a size is a number of bytes, not {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative: {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"a size is an int or a string such as '4gb', not {value!r}")
    text = value.strip().lower()
    mul = 1
    for suffix, m in _SIZE_SUFFIXES:
        if text.endswith(suffix):
            text, mul = text[:-len(suffix)].strip(), m
            break
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"bad size {value!r}: a number with kb, mb, gb or tb") from None
    if number < 0:
        raise ValueError(f"a size cannot be negative: {value!r}")
    return int(number * mul)


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("", "false", "0", "no", "off", "disable"):
        return False
    if text in ("true", "1", "yes", "on", "enable"):
        return True
    raise ValueError(f"not a boolean: {value!r}")


# Argument checks: pybind refuses a wrong type with TypeError, and so do these.


def _type_error(what: str, name: str, value: Any, expected: str) -> TypeError:
    return TypeError(f"{what}(): {name} must be {expected}, not {type(value).__name__}")


def _text(what: str, name: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    raise _type_error(what, name, value, "str")


def _uint(what: str, name: str, value: Any) -> int:
    """An unsigned int, as pybind's size_t and uintptr_t take it."""
    if not isinstance(value, int):
        raise _type_error(what, name, value, "an int")
    if not 0 <= value < 1 << 64:
        raise TypeError(f"{what}(): {name} must be a non-negative int below 2**64, not {value}")
    return int(value)


def _flag(what: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, int)):
        raise _type_error(what, name, value, "bool")
    return bool(value)


def _key(what: str, value: Any) -> Union[str, bytes]:
    if isinstance(value, (str, bytes)):
        return value
    raise _type_error(what, "key", value, "str")


def _seq(what: str, name: str, value: Any) -> Sequence:
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
        raise _type_error(what, name, value, "a list")
    return value


def _keys(what: str, value: Any) -> list:
    return [_key(what, k) for k in _seq(what, "keys", value)]


def _uints(what: str, name: str, value: Any) -> list[int]:
    return [_uint(what, name, v) for v in _seq(what, name, value)]


def _uint_lists(what: str, name: str, value: Any) -> list[list[int]]:
    return [_uints(what, name, v) for v in _seq(what, name, value)]


def _config(what: str, value: Any) -> "ReplicateConfig":
    if value is None:
        return ReplicateConfig()
    if not isinstance(value, ReplicateConfig):
        raise _type_error(what, "config", value, "a ReplicateConfig")
    return value


def _view(value: Any, what: str) -> memoryview:
    """A buffer-protocol object as bytes, as py::buffer takes it."""
    try:
        view = memoryview(value)
    except TypeError:
        raise TypeError(f"{what}(): a value must support the buffer protocol (bytes, "
                        f"bytearray, numpy), not {type(value).__name__}") from None
    if not view.c_contiguous:
        raise TypeError(f"{what}(): a value's buffer must be contiguous")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


# Module-level names.


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


def _check_uint(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TypeError(f"a non-negative int is required, not {v!r}")
    return v


def _check_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"a bool is required, not {type(v).__name__}")
    return v


def _check_str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"a str is required, not {type(v).__name__}")
    return v


def _check_strs(v: Any) -> list[str]:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise TypeError(f"a list of str is required, not {type(v).__name__}")
    return [_check_str(x) for x in v]


def _check_optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else check(v)


class ReplicateConfig:
    """Mooncake's ReplicateConfig. What Ferry does with each field:
    replica_num: copies on distinct nodes. with_hard_pin: never evicted.
    soft_pin_ttl_ms, or soft_pin_action ENABLE: a soft pin (Ferry's default TTL
    when soft_pin_ttl_ms is None). preferred_segments[0], else preferred_segment:
    the node for the first copy ("host:port", as get_hostname() returns).
    prefer_alloc_in_same_node: this host's node for the first copy when nothing is
    preferred. group_ids (one per key): checked, otherwise ignored. The other fields
    (nof_replica_num, dfs_replica_num, preferred_nof_segments, data_type) are kept
    and ignored. Assigning a wrong type raises TypeError, as pybind does."""

    _FIELDS: dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]] = {
        "replica_num": (_check_uint, lambda: 1),
        "nof_replica_num": (_check_uint, lambda: 0),
        "dfs_replica_num": (_check_uint, lambda: 0),
        "soft_pin_action": (lambda v: SoftPinAction(v), lambda: SoftPinAction.PRESERVE),
        "soft_pin_ttl_ms": (_check_optional(_check_uint), lambda: None),
        "with_hard_pin": (_check_bool, lambda: False),
        "preferred_segments": (_check_strs, list),
        "preferred_segment": (_check_str, str),
        "preferred_nof_segments": (_check_strs, list),
        "prefer_alloc_in_same_node": (_check_bool, lambda: False),
        "data_type": (lambda v: v, lambda: 0),
        "group_ids": (_check_optional(_check_strs), lambda: None),
    }
    __slots__ = tuple(_FIELDS)

    def __init__(self) -> None:
        for name, (_, default) in self._FIELDS.items():
            object.__setattr__(self, name, default())

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._FIELDS:
            raise AttributeError(f"'ReplicateConfig' object has no attribute '{name}'")
        try:
            object.__setattr__(self, name, self._FIELDS[name][0](value))
        except (TypeError, ValueError) as e:
            raise TypeError(f"ReplicateConfig.{name}: {e}") from None

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}: {getattr(self, n)!r}" for n in self._FIELDS)
        return f"ReplicateConfig: {{ {fields} }}"

    __str__ = __repr__


class BufferHandle(bytearray):
    """A value read by get_buffer/batch_get_buffer: ptr(), size(), len() and the
    buffer protocol, as Mooncake's BufferHandle. Its memory is this object's own
    (a copy); it stays valid as long as the object lives."""

    def ptr(self) -> int:
        if not self:
            return 0
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))

    def size(self) -> int:
        return len(self)


class MooncakeHostMemAllocator:
    """Host memory for SGLang's host KV pool with an attached store (setup_dummy).

    alloc(size) returns the address of memfd-backed memory, with its pages
    populated; free(ptr) returns 0, or -1 for an unknown address. With `store` (a
    MooncakeDistributedStore that has been set up) the memory comes from its
    allocate_buffer: registered, and shared with the node, which moves it with no
    copy. Without one (SGLang allocates its pool before setup_dummy) it is a memfd
    of this process; register_buffer makes it usable, and an attached store moves
    it through its staging area (one copy) until Ferry can share an existing memfd
    with the node (docs/mooncake-compat.md)."""

    def __init__(self, store: Optional["MooncakeDistributedStore"] = None) -> None:
        if store is not None and not isinstance(store, MooncakeDistributedStore):
            raise _type_error("MooncakeHostMemAllocator", "store", store,
                              "a MooncakeDistributedStore")
        self._owner = store
        self._lock = threading.Lock()
        self._blocks: dict[int, tuple[Any, ...]] = {}

    def alloc(self, size: int) -> int:
        size = _uint("alloc", "size", size)
        if size == 0:
            log.error("MooncakeHostMemAllocator.alloc(0): a size must be positive")
            return 0
        try:
            if self._owner is not None:
                address, keep = self._owner._allocate(size)
            else:
                address, keep = _memfd_block(size)
        except (FerryError, _Refused, OSError) as e:
            log.error("MooncakeHostMemAllocator.alloc(%d) failed: %s: %s", size,
                      type(e).__name__, e)
            return 0
        with self._lock:
            self._blocks[address] = keep
        return address

    def free(self, ptr: int) -> int:
        ptr = _uint("free", "ptr", ptr)
        with self._lock:
            keep = self._blocks.pop(ptr, None)
        if keep is None:
            log.error("MooncakeHostMemAllocator.free(%#x): not an address from alloc", ptr)
            return -1
        if self._owner is not None:
            self._owner._release(ptr)
        else:
            mm, fd = keep[1], keep[2]
            del keep  # and with it the ctypes view: mmap refuses to close while it lives
            mm.close()
            os.close(fd)
        return 0


def _memfd_block(size: int) -> tuple[int, tuple[Any, ...]]:
    fd = os.memfd_create("ferry-host-pool", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    view = (ctypes.c_char * size).from_buffer(mm)
    return ctypes.addressof(view), (view, mm, fd)


class MooncakeConfig:
    """Mooncake's standard configuration (mooncake-wheel/mooncake/mooncake_config.py):
    the JSON file named by MOONCAKE_CONFIG_PATH, else the MOONCAKE_* environment
    variables. Sizes may be strings such as "4gb". `setup()` with no arguments
    uses load_from_env()."""

    FIELDS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
              "protocol", "device_name", "master_server_address", "enable_ssd_offload",
              "ssd_offload_path", "tenant_id", "enable_client_http_server", "client_http_port")

    def __init__(self, local_hostname: str, metadata_server: str,
                 global_segment_size: Any = DEFAULT_GLOBAL_SEGMENT_SIZE,
                 local_buffer_size: Any = DEFAULT_LOCAL_BUFFER_SIZE, protocol: str = "tcp",
                 device_name: Optional[str] = "", master_server_address: str = "",
                 enable_ssd_offload: Any = False, ssd_offload_path: str = "",
                 tenant_id: str = "default", enable_client_http_server: Any = False,
                 client_http_port: Any = DEFAULT_CLIENT_HTTP_PORT) -> None:
        self.local_hostname = local_hostname
        self.metadata_server = metadata_server
        self.global_segment_size = parse_size(global_segment_size)
        self.local_buffer_size = parse_size(local_buffer_size)
        if not isinstance(protocol, str) or not protocol.strip():
            raise ValueError(f"protocol must be a non-empty string such as 'tcp', not "
                             f"{protocol!r}")
        self.protocol = protocol.strip().lower()
        self.device_name = device_name or ""
        self.master_server_address = master_server_address
        self.enable_ssd_offload = _parse_bool(enable_ssd_offload)
        self.ssd_offload_path = str(ssd_offload_path or "")
        self.tenant_id = str(tenant_id or "default")
        self.enable_client_http_server = _parse_bool(enable_client_http_server)
        self.client_http_port = int(client_http_port)
        for name in ("local_hostname", "metadata_server", "master_server_address"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"config field {name!r} must be a non-empty string, got "
                                 f"{value!r}")

    def __repr__(self) -> str:
        return "MooncakeConfig(" + ", ".join(f"{n}={getattr(self, n)!r}"
                                             for n in self.FIELDS) + ")"

    @staticmethod
    def from_file(path: str) -> "MooncakeConfig":
        with open(path) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError(f"{path}: the configuration is a JSON object")
        for name in ("local_hostname", "metadata_server", "master_server_address"):
            if name not in config:
                raise ValueError(f"{path}: missing required config field: {name}")
        unknown = sorted(set(config) - set(MooncakeConfig.FIELDS))
        if unknown:
            log.debug("%s: fields not read by MooncakeConfig: %s", path, ", ".join(unknown))
        return MooncakeConfig(**{k: v for k, v in config.items() if k in MooncakeConfig.FIELDS})

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        path = os.environ.get("MOONCAKE_CONFIG_PATH")
        if path:
            return MooncakeConfig.from_file(path)
        master = os.environ.get("MOONCAKE_MASTER")
        if not master:
            raise ValueError("neither MOONCAKE_CONFIG_PATH nor MOONCAKE_MASTER is set")
        env = os.environ.get
        return MooncakeConfig(
            local_hostname=env("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env("MOONCAKE_TE_META_DATA_SERVER", P2PHANDSHAKE),
            global_segment_size=env("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE),
            local_buffer_size=env("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE),
            protocol=env("MOONCAKE_PROTOCOL", "tcp"), device_name=env("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=env("MOONCAKE_OFFLOAD_ENABLED", "false"),
            ssd_offload_path=env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=env("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false"),
            client_http_port=env("MOONCAKE_CLIENT_HTTP_PORT", DEFAULT_CLIENT_HTTP_PORT))


# The store.

_MISSING: Any = object()
_SETUP_ARGS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
               "protocol", "rdma_devices", "master_server_addr")
# setup(dict): Mooncake's keys, and the config file's names for two of them.
_DICT_ALIASES = {"device_name": "rdma_devices", "master_server_address": "master_server_addr"}
_DICT_KEYS = set(_SETUP_ARGS) | {"enable_ssd_offload", "ssd_offload_path", "tenant_id",
                                 "enable_client_http_server", "client_http_port",
                                 "ipc_socket_path"}


class _Refused(Exception):
    """A failure found here, before ferry.Store is called: its code and message."""

    def __init__(self, code: int, message: str, error: type[FerryError] = InvalidArgument):
        super().__init__(message)
        self.code = code
        self.error = error


class MooncakeDistributedStore:
    """See the module docstring. One instance may be used from several threads;
    last_error() is per thread."""

    def __init__(self, *, strict: bool = False) -> None:
        if not isinstance(strict, bool):
            raise _type_error("MooncakeDistributedStore", "strict", strict, "bool")
        self._strict = strict
        self._store: Optional[Store] = None
        self._lock = threading.Lock()
        self._local = threading.local()
        # Keys put through this client, for remove_all (ferry.Store cannot list keys).
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
                raise _Refused(INVALID_PARAMS, f"master_server_addr {master!r}: masters found "
                               "through etcd need cluster mode, which Ferry does not have yet; "
                               "pass the `ferry master` address, host:port")
            if not master or ":" not in master:
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

    def _put_options(self, config: ReplicateConfig, nkeys: int = 1) -> dict[str, Any]:
        if config.replica_num < 1:
            raise _Refused(INVALID_PARAMS, "ReplicateConfig.replica_num must be at least 1")
        if config.group_ids is not None and len(config.group_ids) != nkeys:
            raise _Refused(INVALID_PARAMS, f"ReplicateConfig.group_ids has "
                           f"{len(config.group_ids)} entries for {nkeys} keys")
        preferred = (config.preferred_segments[0] if config.preferred_segments
                     else config.preferred_segment)
        if not preferred and config.prefer_alloc_in_same_node:
            preferred = self.get_hostname()
        options: dict[str, Any] = {"replicas": config.replica_num, "preferred": preferred or None}
        if config.with_hard_pin:
            options["pin"] = "hard"
        elif config.soft_pin_ttl_ms is not None or config.soft_pin_action == SoftPinAction.ENABLE:
            options["pin"] = "soft"
            if config.soft_pin_ttl_ms:
                options["pin_ttl"] = config.soft_pin_ttl_ms / 1000
        return options

    # Copying calls.

    def put(self, key: Any, value: Any, config: Any = None) -> int:
        """0 also when the key exists already: the old value stays (write-once)."""
        key = _key("put", key)
        view = _view(value, "put")
        cfg = _config("put", config)
        return self._put_one("put", key, lambda s, o: s.put(key, view, **o), cfg)

    def put_parts(self, key: Any, *parts: Any, config: Any = None) -> int:
        """One object from several 1-D byte buffers, concatenated (no copy in Python)."""
        key = _key("put_parts", key)
        views = []
        for p in parts:
            v = _view(p, "put_parts")
            if memoryview(p).ndim != 1 or memoryview(p).itemsize != 1:
                raise RuntimeError("parts must be 1-D bytes-like")
            views.append(v)
        cfg = _config("put_parts", config)
        return self._put_one("put_parts", key, lambda s, o: s.put_parts(key, views, **o), cfg)

    def _put_one(self, what: str, key: Any, put: Callable[[Store, dict], None],
                 config: ReplicateConfig) -> int:
        self._begin()
        try:
            put(self._ready(), self._put_options(config))
        except (AlreadyExists, Busy):
            pass  # Mooncake's put is write-once: the old value (or the other writer's) wins
        except (FerryError, _Refused) as e:
            return self._fail(what, e, key)
        return OK

    def put_batch(self, keys: Any, values: Any, config: Any = None) -> int:
        """One int for the batch: 0, or the first failure's code. Each object is
        written whole or not at all; the others of a failed batch may be stored."""
        ks = _keys("put_batch", keys)
        views = [_view(v, "put_batch") for v in _seq("put_batch", "values", values)]
        cfg = _config("put_batch", config)
        if len(ks) != len(views):
            return self._status("put_batch", lambda: self._refuse_lengths(ks, views))
        codes = self._batch("put_batch", ks, lambda s: s.batch_put(
            ks, views, **self._put_options(cfg, len(ks))), lambda _: OK, put=True)
        return next((c for c in codes if c != OK), OK)

    def get(self, key: Any) -> bytes:
        """The value, or b"" (a miss or a failure: last_error() says which)."""
        key = _key("get", key)
        self._begin()
        try:
            return self._ready().get(key)
        except (FerryError, _Refused) as e:
            self._fail("get", e, key)
            return b""

    def get_batch(self, keys: Any) -> list[bytes]:
        ks = _keys("get_batch", keys)
        self._begin()
        try:
            results = self._ready().batch_get(ks)
        except (FerryError, _Refused) as e:
            self._fail("get_batch", e)
            return [b""] * len(ks)
        self._codes("get_batch", ks, results, lambda _: OK)
        return [b"" if isinstance(r, FerryError) else r for r in results]

    def get_buffer(self, key: Any) -> Optional[BufferHandle]:
        return self.batch_get_buffer([_key("get_buffer", key)])[0]

    def batch_get_buffer(self, keys: Any) -> list[Optional[BufferHandle]]:
        """A BufferHandle per key, None for a miss or a failure."""
        ks = _keys("batch_get_buffer", keys)
        self._begin()
        try:
            results = self._ready().batch_get(ks)
        except (FerryError, _Refused) as e:
            self._fail("batch_get_buffer", e)
            return [None] * len(ks)
        self._codes("batch_get_buffer", ks, results, lambda _: OK)
        return [None if isinstance(r, FerryError) else BufferHandle(r) for r in results]

    def get_size(self, key: Any) -> int:
        """The value's size, or a negative code. Ferry reads the value to know it."""
        key = _key("get_size", key)
        self._begin()
        try:
            return len(self._ready().get(key))
        except (FerryError, _Refused) as e:
            return self._fail("get_size", e, key)

    # Zero-copy calls: registered memory, by address.

    def put_from(self, key: Any, buffer_ptr: Any, size: Any, config: Any = None) -> int:
        key = _key("put_from", key)
        buf = (_uint("put_from", "buffer_ptr", buffer_ptr), _uint("put_from", "size", size))
        cfg = _config("put_from", config)
        return self._put_one("put_from", key, lambda s, o: s.put_from(key, buf, **o), cfg)

    def get_into(self, key: Any, buffer_ptr: Any, size: Any) -> int:
        """Bytes read, or a negative code (-600 when the value is larger than size)."""
        key = _key("get_into", key)
        buf = (_uint("get_into", "buffer_ptr", buffer_ptr), _uint("get_into", "size", size))
        self._begin()
        try:
            return self._ready().get_into(key, buf)
        except (FerryError, _Refused) as e:
            return self._fail("get_into", e, key)

    def batch_put_from(self, keys: Any, buffer_ptrs: Any, sizes: Any,
                       config: Any = None) -> list[int]:
        ks = _keys("batch_put_from", keys)
        ptrs = _uints("batch_put_from", "buffer_ptrs", buffer_ptrs)
        ns = _uints("batch_put_from", "sizes", sizes)
        cfg = _config("batch_put_from", config)

        def run(s: Store) -> Sequence[Any]:
            self._check_lengths(ks, ptrs, ns)
            return s.batch_put_from(ks, list(zip(ptrs, ns)), **self._put_options(cfg, len(ks)))

        return self._batch("batch_put_from", ks, run, lambda _: OK, put=True)

    def batch_get_into(self, keys: Any, buffer_ptrs: Any, sizes: Any) -> list[int]:
        """Bytes read per key, or a negative code."""
        ks = _keys("batch_get_into", keys)
        ptrs = _uints("batch_get_into", "buffer_ptrs", buffer_ptrs)
        ns = _uints("batch_get_into", "sizes", sizes)

        def run(s: Store) -> Sequence[Any]:
            self._check_lengths(ks, ptrs, ns)
            return s.batch_get_into(ks, list(zip(ptrs, ns)))

        return self._batch("batch_get_into", ks, run, int)

    def batch_put_from_multi_buffers(self, keys: Any, all_buffer_ptrs: Any, all_sizes: Any,
                                     config: Any = None) -> list[int]:
        """Each object is the concatenation of its buffers (vLLM: one per layer)."""
        what = "batch_put_from_multi_buffers"
        ks = _keys(what, keys)
        ptrs = _uint_lists(what, "all_buffer_ptrs", all_buffer_ptrs)
        ns = _uint_lists(what, "all_sizes", all_sizes)
        cfg = _config(what, config)

        def run(s: Store) -> Sequence[Any]:
            lists = self._scatter_lists(ks, ptrs, ns)
            return s.batch_put_from_multi(ks, lists, **self._put_options(cfg, len(ks)))

        return self._batch(what, ks, run, lambda _: OK, put=True)

    def batch_get_into_multi_buffers(self, keys: Any, all_buffer_ptrs: Any, all_sizes: Any,
                                     prefer_alloc_in_same_node: Any = False) -> list[int]:
        """Bytes read per key (its buffers filled in order), or a negative code."""
        what = "batch_get_into_multi_buffers"
        ks = _keys(what, keys)
        ptrs = _uint_lists(what, "all_buffer_ptrs", all_buffer_ptrs)
        ns = _uint_lists(what, "all_sizes", all_sizes)
        _flag(what, "prefer_alloc_in_same_node", prefer_alloc_in_same_node)

        def run(s: Store) -> Sequence[Any]:
            return s.batch_get_into_multi(ks, self._scatter_lists(ks, ptrs, ns))

        return self._batch(what, ks, run, int)

    @staticmethod
    def _check_lengths(keys: list, ptrs: list, sizes: list) -> None:
        if not len(keys) == len(ptrs) == len(sizes):
            raise _Refused(INVALID_PARAMS, f"{len(keys)} keys, {len(ptrs)} buffer pointers "
                           f"and {len(sizes)} sizes")

    @staticmethod
    def _refuse_lengths(keys: list, values: list) -> None:
        raise _Refused(INVALID_PARAMS, f"{len(keys)} keys but {len(values)} values")

    def _scatter_lists(self, keys: list, ptrs: list[list[int]],
                       sizes: list[list[int]]) -> list[list[tuple[int, int]]]:
        self._check_lengths(keys, ptrs, sizes)
        out = []
        for k, p, n in zip(keys, ptrs, sizes):
            if len(p) != len(n):
                raise _Refused(INVALID_PARAMS, f"key {k!r}: {len(p)} buffer pointers but "
                               f"{len(n)} sizes")
            out.append(list(zip(p, n)))
        return out

    # Lookup and removal.

    def is_exist(self, key: Any) -> int:
        """1 if the key exists, 0 if not, or a negative code."""
        key = _key("is_exist", key)
        self._begin()
        try:
            return 1 if self._ready().exists(key) else 0
        except (FerryError, _Refused) as e:
            return self._fail("is_exist", e, key)

    def batch_is_exist(self, keys: Any) -> list[int]:
        ks = _keys("batch_is_exist", keys)
        return self._batch("batch_is_exist", ks, lambda s: s.batch_exists(ks), int)

    def remove(self, key: Any, force: Any = False) -> int:
        """-706 while the value is read or written, unless force; -704 if unknown."""
        key = _key("remove", key)
        force = _flag("remove", "force", force)
        return self._status("remove", lambda: self._ready().remove(key, force), key)

    def batch_remove(self, keys: Any, force: Any = False) -> list[int]:
        ks = _keys("batch_remove", keys)
        force = _flag("batch_remove", "force", force)
        return self._batch("batch_remove", ks, lambda s: s.batch_remove(ks, force),
                           lambda _: OK)

    def remove_all(self, force: Any = False) -> int:
        """The number of objects removed from the whole store, or a negative code.
        Objects being read (leased) or written stay unless force."""
        force = _flag("remove_all", "force", force)
        self._begin()
        try:
            return self._ready().remove_all(force)
        except (FerryError, _Refused) as e:
            return self._fail("remove_all", e)

    # Tensors (torch): Mooncake's 304-byte header then the bytes (docs/tensor-format.md).

    def put_tensor(self, key: Any, tensor: Any) -> int:
        key = _key("put_tensor", key)
        return self._put_one("put_tensor", key, lambda s, o: s.put_tensor(key, tensor, **o),
                             ReplicateConfig())

    def pub_tensor(self, key: Any, tensor: Any, config: Any = None) -> int:
        key = _key("pub_tensor", key)
        cfg = _config("pub_tensor", config)
        return self._put_one("pub_tensor", key, lambda s, o: s.put_tensor(key, tensor, **o), cfg)

    def batch_put_tensor(self, keys: Any, tensors_list: Any) -> list[int]:
        ks = _keys("batch_put_tensor", keys)
        ts = list(_seq("batch_put_tensor", "tensors_list", tensors_list))
        return self._batch("batch_put_tensor", ks, lambda s: s.batch_put_tensor(ks, ts),
                           lambda _: OK, put=True)

    def get_tensor(self, key: Any) -> Any:
        """A new torch tensor (numpy array when torch is not loaded), or None."""
        key = _key("get_tensor", key)
        self._begin()
        try:
            return self._ready().get_tensor(key, _result_device())
        except (FerryError, _Refused) as e:
            self._fail("get_tensor", e, key)
            return None

    def batch_get_tensor(self, keys: Any) -> list[Any]:
        ks = _keys("batch_get_tensor", keys)
        self._begin()
        try:
            results = self._ready().batch_get_tensor(ks, _result_device())
        except (FerryError, _Refused) as e:
            self._fail("batch_get_tensor", e)
            return [None] * len(ks)
        self._codes("batch_get_tensor", ks, results, lambda _: OK)
        return [None if isinstance(r, FerryError) else r for r in results]

    def put_tensor_with_tp(self, key: Any, tensor: Any, tp_rank: Any = 0, tp_size: Any = 1,
                           split_dim: Any = 0) -> int:
        """Stores every rank's shard as f"{key}_tp_{r}", whatever tp_rank is."""
        key = _key("put_tensor_with_tp", key)
        _uint("put_tensor_with_tp", "tp_rank", tp_rank)
        size = _uint("put_tensor_with_tp", "tp_size", tp_size)
        dim = _uint("put_tensor_with_tp", "split_dim", split_dim)
        from .. import tensor as _tensor

        keys = [key] if size <= 1 else [_tensor.tp_key(key, r) for r in range(size)]

        def run() -> None:
            store = self._ready()
            try:
                store.put_tensor_with_tp(key, tensor, max(size, 1), dim)
            except AlreadyExists:
                # Write-once, as Mooncake: fine when every shard is there.
                if not all(store.batch_exists(keys)):
                    raise

        return self._status("put_tensor_with_tp", run, key)

    def get_tensor_with_tp(self, key: Any, tp_rank: Any = 0, tp_size: Any = 1,
                           split_dim: Any = 0) -> Any:
        """Rank tp_rank's shard, or None. split_dim is not checked (as Mooncake)."""
        key = _key("get_tensor_with_tp", key)
        rank = _uint("get_tensor_with_tp", "tp_rank", tp_rank)
        size = _uint("get_tensor_with_tp", "tp_size", tp_size)
        _uint("get_tensor_with_tp", "split_dim", split_dim)
        self._begin()
        try:
            return self._ready().get_tensor_with_tp(key, rank if size > 1 else 0, max(size, 1),
                                                   None, _result_device())
        except (FerryError, _Refused) as e:
            self._fail("get_tensor_with_tp", e, key)
            return None

    def get_tensor_into(self, key: Any, buffer_ptr: Any, size: Any) -> Any:
        """Reads the tensor object (header and data) into registered host memory
        and returns a tensor over its data there (no copy), or None."""
        return self.batch_get_tensor_into([_key("get_tensor_into", key)], [buffer_ptr],
                                          [size], _what="get_tensor_into")[0]

    def batch_get_tensor_into(self, keys: Any, buffer_ptrs: Any, sizes: Any,
                              _what: str = "batch_get_tensor_into") -> list[Any]:
        ks = _keys(_what, keys)
        ptrs = _uints(_what, "buffer_ptrs", buffer_ptrs)
        ns = _uints(_what, "sizes", sizes)
        self._begin()
        try:
            self._check_lengths(ks, ptrs, ns)
            results = self._ready().batch_get_into(ks, list(zip(ptrs, ns)))
        except (FerryError, _Refused) as e:
            self._fail(_what, e)
            return [None] * len(ks)
        out: list[Any] = []
        for k, p, r in zip(ks, ptrs, results):
            if not isinstance(r, FerryError):
                try:
                    r = _tensor_at(p, r)
                except FerryError as e:
                    r = e
            out.append(r)
        self._codes(_what, ks, out, lambda _: OK)
        return [None if isinstance(r, FerryError) else r for r in out]


def _check_metadata(metadata: str) -> None:
    """P2PHANDSHAKE, or an HTTP or Redis metadata server (which Ferry does not
    need: the master knows the nodes). etcd needs cluster mode."""
    if metadata == P2PHANDSHAKE or metadata.startswith(("http://", "https://", "redis://")):
        if metadata != P2PHANDSHAKE:
            log.info("metadata server %r is not used: Ferry finds nodes through its master",
                     metadata)
        return
    if not metadata:
        raise _Refused(INVALID_PARAMS, f"metadata_server is required: {P2PHANDSHAKE}")
    if metadata.startswith("etcd://") or "://" not in metadata:
        # Without a scheme Mooncake takes the address as etcd's.
        raise _Refused(INVALID_PARAMS, f"metadata_server {metadata!r}: an etcd metadata server "
                       "needs cluster mode, which Ferry does not have yet; use P2PHANDSHAKE")
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


def _result_device() -> Any:
    """Mooncake returns torch tensors: "cpu" when torch is loaded, else numpy."""
    return "cpu" if "torch" in sys.modules else None


def _tensor_at(address: int, nbytes: int) -> Any:
    """A tensor over the data of the tensor object of `nbytes` at `address`."""
    import numpy as np

    from .. import tensor as _tensor

    raw = (ctypes.c_ubyte * nbytes).from_address(address)
    header, offset, length = _tensor.decode(raw)
    code = _tensor.DType(header.dtype).name

    if "torch" in sys.modules:
        import torch

        data = torch.frombuffer(raw, dtype=torch.uint8, count=length, offset=offset)
        name = _TORCH_DTYPES[code]
        dtype = getattr(torch, name, None)
        if dtype is None:
            raise NotSupported(f"this torch has no torch.{name}")
        return data.view(dtype).reshape(header.shape)
    if code not in _NUMPY_DTYPES:
        raise NotSupported(f"numpy has no dtype for {code}; import torch first")
    data = np.frombuffer(raw, np.uint8, count=length, offset=offset)
    return data.view(np.dtype(_NUMPY_DTYPES[code])).reshape(header.shape)


# The tensor format's dtype codes, by name (ferry.tensor.DType), as torch and numpy types.
_TORCH_DTYPES = {"F32": "float32", "F64": "float64", "I8": "int8", "U8": "uint8",
                 "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
                 "I64": "int64", "U64": "uint64", "BOOL": "bool", "F16": "float16",
                 "BF16": "bfloat16", "FP8_E4M3": "float8_e4m3fn", "FP8_E5M2": "float8_e5m2"}
_NUMPY_DTYPES = {"F32": "<f4", "F64": "<f8", "I8": "i1", "U8": "u1", "I16": "<i2",
                 "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8", "U64": "<u8",
                 "BOOL": "?", "F16": "<f2"}

__all__ = ["BufferHandle", "ERROR_CODES", "MooncakeConfig", "MooncakeDistributedStore",
           "MooncakeHostMemAllocator", "ReplicateConfig", "SoftPinAction", "mooncake_code",
           "parse_size"]
