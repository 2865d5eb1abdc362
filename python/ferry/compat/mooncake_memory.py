"""Memory of the compat store: BufferHandle (a value read), MooncakeHostMemAllocator
(SGLang's host pool) and tensors over a tensor object in registered memory."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import threading
from typing import Any, Optional

from ..errors import FerryError, NotSupported
from .mooncake_args import _type_error, _uint
from .mooncake_errors import _Refused
from .mooncake_store_base import _StoreBase

log = logging.getLogger("ferry.compat.mooncake.store")

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

    def __init__(self, store: Optional[_StoreBase] = None) -> None:
        if store is not None and not isinstance(store, _StoreBase):
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


def _result_device() -> Any:
    """Mooncake returns torch tensors: "cpu" when torch is loaded, else numpy."""
    return "cpu" if "torch" in sys.modules else None


def _tensor_at(address: int, nbytes: int) -> Any:
    """A tensor over the data of the tensor object of `nbytes` at `address`."""
    import numpy as np

    from .. import tensor as _tensor

    raw = (ctypes.c_ubyte * nbytes).from_address(address)
    header, offset, length = _tensor.decode(raw)
    code = _tensor.DType(header.dtype)

    if "torch" in sys.modules:
        import torch

        data = torch.frombuffer(raw, dtype=torch.uint8, count=length, offset=offset)
        name = _tensor._TORCH_NAME[code]
        dtype = getattr(torch, name, None)
        if dtype is None:
            raise NotSupported(f"this torch has no torch.{name}")
        return data.view(dtype).reshape(header.shape)
    if code not in _tensor._NUMPY_DTYPE:
        raise NotSupported(f"numpy has no dtype for {code.name}; import torch first")
    data = np.frombuffer(raw, np.uint8, count=length, offset=offset)
    return data.view(np.dtype(_tensor._NUMPY_DTYPE[code])).reshape(header.shape)
