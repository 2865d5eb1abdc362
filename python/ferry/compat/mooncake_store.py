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

The implementation is split by concern: mooncake_errors (codes), mooncake_config
(MooncakeConfig, ReplicateConfig, sizes), mooncake_args (argument checks),
mooncake_memory (buffers and the host allocator), mooncake_store_base (set-up,
memory, error reporting) and this module's data calls.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable, Optional

from ..errors import AlreadyExists, Busy, FerryError
from ..store import Store
from .mooncake_args import _config, _flag, _key, _keys, _seq, _uint, _uint_lists, _uints, _view
from .mooncake_config import ReplicateConfig
from .mooncake_errors import INVALID_PARAMS, OK, _Refused
from .mooncake_memory import BufferHandle, MooncakeHostMemAllocator, _result_device, _tensor_at
from .mooncake_store_base import _StoreBase

# This module's public names since before the split: the codes, the defaults and
# the configuration classes.
from .mooncake_config import (DEFAULT_CLIENT_HTTP_PORT, DEFAULT_DICT_SEGMENT_SIZE,  # noqa: F401
                              DEFAULT_GLOBAL_SEGMENT_SIZE, DEFAULT_LOCAL_BUFFER_SIZE,
                              DEFAULT_MASTER_SERVER_ADDR, MooncakeConfig, SoftPinAction,
                              parse_size)
from .mooncake_errors import (ERROR_CODES, HC_HEALTHY, HC_MASTER_UNREACHABLE,  # noqa: F401
                              HC_NOT_INITIALIZED, INTERNAL_ERROR, NO_AVAILABLE_HANDLE,
                              OBJECT_ALREADY_EXISTS, OBJECT_HAS_LEASE, OBJECT_NOT_FOUND,
                              P2PHANDSHAKE, RPC_FAIL, TRANSFER_FAIL, mooncake_code)

log = logging.getLogger("ferry.compat.mooncake.store")


class MooncakeDistributedStore(_StoreBase):
    """See the module docstring: set-up, memory and errors come from _StoreBase,
    the data calls are here. One instance may be used from several threads;
    last_error() is per thread."""

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
        from ..tensor_store import tp_key

        keys = [key] if size <= 1 else [tp_key(key, r) for r in range(size)]

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


__all__ = ["BufferHandle", "ERROR_CODES", "MooncakeConfig", "MooncakeDistributedStore",
           "MooncakeHostMemAllocator", "ReplicateConfig", "SoftPinAction", "mooncake_code",
           "parse_size"]
