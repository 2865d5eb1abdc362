"""Turns the objects users pass into (address, length) plus what keeps them alive.

Accepted: `(address, length)` tuples, torch tensors, objects with
`__cuda_array_interface__`, buffer-protocol objects (bytearray, numpy, memoryview,
mmap) and DLPack producers. torch is never imported here: a tensor is recognised by
its type's module, and only its own methods are called.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, NamedTuple, Optional

from . import _ferry
from .errors import InvalidArgument

# cudaStreamPerThread, the handle CUDA defines for the per-thread default stream.
_PER_THREAD_STREAM = 2


class Buffer(NamedTuple):
    """Resolved local memory. `stream` is the object's own default submission
    stream (None: it has none, so the CUDA default stream applies). A NamedTuple:
    it is built on every transfer."""

    address: int
    nbytes: int
    gpu: bool
    stream: Optional[int]
    keepalive: Any


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch")


def _from_torch(obj: Any) -> Buffer:
    if not obj.is_contiguous():
        raise InvalidArgument("the tensor is not contiguous; call .contiguous() first")
    nbytes = obj.numel() * obj.element_size()
    if not obj.is_cuda:
        return Buffer(obj.data_ptr(), nbytes, False, None, obj)
    import torch  # only now: a CUDA tensor was passed, so torch is installed

    stream = torch.cuda.current_stream(obj.device).cuda_stream
    return Buffer(obj.data_ptr(), nbytes, True, stream, obj)


def _c_contiguous(shape: tuple, strides: Optional[tuple], itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _from_cuda_array_interface(obj: Any, writable: bool) -> Buffer:
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    itemsize = int(cai["typestr"][2:])
    address, readonly = cai["data"]
    if not _c_contiguous(shape, cai.get("strides"), itemsize):
        raise InvalidArgument("the CUDA array is not C-contiguous")
    if writable and readonly:
        raise InvalidArgument("the CUDA array is read-only and cannot receive data")
    # Version 3's optional producer stream: 1 is the legacy default (null), 2 per-thread.
    stream = cai.get("stream")
    if stream == 1:
        stream = 0
    return Buffer(address, math.prod(shape) * itemsize, True, stream, obj)


def _from_buffer_protocol(obj: Any, writable: bool) -> Optional[Buffer]:
    try:
        view = memoryview(obj)
    except TypeError:
        return None
    if writable and view.readonly:
        raise InvalidArgument(f"a read-only {type(obj).__name__} cannot receive data")
    if not view.c_contiguous:
        raise InvalidArgument(f"the {type(obj).__name__} is not C-contiguous")
    if view.nbytes == 0:
        return Buffer(0, 0, False, None, view)
    address, nbytes = _ferry.buffer_address(view, writable)
    # The view pins the exporter: a bytearray cannot be resized while it lives.
    return Buffer(address, nbytes, False, None, view)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj: Any) -> Buffer:
    capsule = obj.__dlpack__()
    # A DLManagedTensor starts with its DLTensor; the capsule is not consumed,
    # so its deleter runs when the capsule is collected, after the transfer.
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    strides = None if not t.strides else tuple(t.strides[i] * itemsize for i in range(t.ndim))
    if not _c_contiguous(shape, strides, itemsize):
        raise InvalidArgument("the DLPack tensor is not C-contiguous")
    kind = t.device.device_type
    if kind not in (_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED):
        raise InvalidArgument(f"DLPack device type {kind} is not host or CUDA memory")
    gpu = kind in (_DL_CUDA, _DL_CUDA_MANAGED)
    address = (t.data or 0) + t.byte_offset
    return Buffer(address, math.prod(shape) * itemsize, gpu, None, (obj, capsule))


def resolve(obj: Any, *, writable: bool) -> Buffer:
    """The memory behind `obj`. `writable`: it will receive data (a read)."""
    if isinstance(obj, Buffer):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(v, int) for v in obj):
        address, length = obj
        if address <= 0 or length < 0:
            raise InvalidArgument(f"bad (address, length): ({address:#x}, {length})")
        return Buffer(address, length, False, None, None)
    if _is_torch(obj):
        return _from_torch(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_array_interface(obj, writable)
    found = _from_buffer_protocol(obj, writable)
    if found is not None:
        return found
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj)
    raise InvalidArgument(
        f"cannot transfer a {type(obj).__name__}: pass a buffer (bytearray, numpy), a CUDA "
        "array (__cuda_array_interface__ or DLPack, e.g. a torch tensor) or (address, length)")


def stream_handle(stream: Any) -> int:
    """A cudaStream_t as an int, from an int, a torch/cupy stream or None (0)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise InvalidArgument(f"cannot use a {type(stream).__name__} as a CUDA stream")
