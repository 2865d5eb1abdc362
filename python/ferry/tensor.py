"""Tensor objects in the store: a 304-byte self-describing header, then the raw bytes.

The header is the one Mooncake's store writes (its `TensorMetadata`), so either
system reads the other's tensors. docs/tensor-format.md states it field by field.

    header, data = encode(array)           # bytes (304), a buffer of the raw bytes
    info, offset, nbytes = decode(value)   # validates every field; ProtocolError if not

`encode` takes numpy arrays and CPU torch tensors (made contiguous, a copy, when they
are not). torch is imported only when a torch tensor is passed or a torch result is
asked for: a tensor is recognised by its type's module. CUDA tensors are refused for
now. The Store methods (`Store.put_tensor` and the rest) are in ferry.tensor_store,
which calls this module's conversions.
"""

from __future__ import annotations

import struct
import sys
import warnings
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Optional, Sequence

import numpy as np

from .errors import InvalidArgument, NotSupported, ProtocolError

MAGIC = 0x4D4F4F4E
VERSION = 1
HEADER_SIZE = 304
MAX_DIMS = 8
MAX_AXES = 4
_MAX_ARRAY_BYTES = (1 << 63) - 1

# Little-endian, no padding: 40 bytes of header, two shapes of 8 int64s, the axis
# count and a pad, four 32-byte layout axes. 40 + 128 + 8 + 128 = 304.
_HEAD = "IHHiiIIQQ"
_AXIS = "iiiiiiq"
_FORMAT = struct.Struct("<" + _HEAD + "8q8q" + "II" + _AXIS * MAX_AXES)
assert _FORMAT.size == HEADER_SIZE


class DType(IntEnum):
    F32 = 0
    F64 = 1
    I8 = 2
    U8 = 3
    I16 = 4
    U16 = 5
    I32 = 6
    U32 = 7
    I64 = 8
    U64 = 9
    BOOL = 10
    F16 = 11
    BF16 = 12
    FP8_E4M3 = 13
    FP8_E5M2 = 14


class LayoutKind(IntEnum):
    FULL = 0   # the whole tensor: global shape == local shape
    SHARD = 1  # one piece of a larger tensor: local shape within global shape


class AxisKind(IntEnum):
    DP = 0
    TP = 1
    EP = 2
    PP = 3
    RESERVED = 4


ITEM_SIZE = {DType.F32: 4, DType.F64: 8, DType.I8: 1, DType.U8: 1, DType.I16: 2,
             DType.U16: 2, DType.I32: 4, DType.U32: 4, DType.I64: 8, DType.U64: 8,
             DType.BOOL: 1, DType.F16: 2, DType.BF16: 2, DType.FP8_E4M3: 1,
             DType.FP8_E5M2: 1}

# numpy has no bfloat16 or float8: those codes have no numpy dtype.
_NUMPY_DTYPE = {DType.F32: "<f4", DType.F64: "<f8", DType.I8: "i1", DType.U8: "u1",
                DType.I16: "<i2", DType.U16: "<u2", DType.I32: "<i4", DType.U32: "<u4",
                DType.I64: "<i8", DType.U64: "<u8", DType.BOOL: "?", DType.F16: "<f2"}
_NUMPY_CODE = {("f", 4): DType.F32, ("f", 8): DType.F64, ("i", 1): DType.I8,
               ("u", 1): DType.U8, ("i", 2): DType.I16, ("u", 2): DType.U16,
               ("i", 4): DType.I32, ("u", 4): DType.U32, ("i", 8): DType.I64,
               ("u", 8): DType.U64, ("b", 1): DType.BOOL, ("f", 2): DType.F16}

# torch dtypes by name (str(torch.float32) is "torch.float32"; aliases print the same).
_TORCH_NAME = {DType.F32: "float32", DType.F64: "float64", DType.I8: "int8",
               DType.U8: "uint8", DType.I16: "int16", DType.U16: "uint16",
               DType.I32: "int32", DType.U32: "uint32", DType.I64: "int64",
               DType.U64: "uint64", DType.BOOL: "bool", DType.F16: "float16",
               DType.BF16: "bfloat16", DType.FP8_E4M3: "float8_e4m3fn",
               DType.FP8_E5M2: "float8_e5m2"}
_TORCH_CODE = {name: code for code, name in _TORCH_NAME.items()}


@dataclass(frozen=True)
class LayoutAxis:
    """One parallelism axis of a SHARD object. `reserved0` carries an expert id (EP)
    or a stage id (PP) in Mooncake; `reserved1` the shard's extent along split_dim."""

    kind: int
    axis_index: int
    shard_rank: int
    shard_count: int
    split_dim: int = -1
    reserved0: int = 0
    reserved1: int = 0


@dataclass(frozen=True)
class TensorHeader:
    """The decoded header. `shape` is the local shape: the shape of the bytes stored."""

    dtype: int
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    layout_kind: int = LayoutKind.FULL
    axes: tuple[LayoutAxis, ...] = ()
    data_offset: int = HEADER_SIZE
    data_bytes: int = 0

    @property
    def ndim(self) -> int:
        return len(self.local_shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.local_shape

    @property
    def itemsize(self) -> int:
        return ITEM_SIZE[DType(self.dtype)]

    def axis(self, kind: int) -> Optional[LayoutAxis]:
        return next((a for a in self.axes if a.kind == kind), None)

    def pack(self) -> bytes:
        """The 304 header bytes. Unused dims are -1; unused axes and pads are 0."""
        ndim = len(self.local_shape)
        if len(self.global_shape) != ndim or ndim > MAX_DIMS or len(self.axes) > MAX_AXES:
            raise InvalidArgument(f"cannot pack a header of shapes {self.global_shape} and "
                                  f"{self.local_shape} with {len(self.axes)} axes")
        pad = (-1,) * (MAX_DIMS - ndim)
        axes: list[int] = []
        for a in self.axes:
            axes += [a.kind, a.axis_index, a.shard_rank, a.shard_count, a.split_dim,
                     a.reserved0, a.reserved1]
        axes += [0] * (7 * (MAX_AXES - len(self.axes)))
        return _FORMAT.pack(MAGIC, VERSION, HEADER_SIZE, int(self.dtype), ndim,
                            int(self.layout_kind), 0, self.data_offset, self.data_bytes,
                            *self.global_shape, *pad, *self.local_shape, *pad,
                            len(self.axes), 0, *axes)


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def dtype_name(code: int) -> str:
    try:
        return DType(code).name
    except ValueError:
        return f"code {code}"


# Sources and destinations: numpy arrays and CPU torch tensors.


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch")


def _import_torch() -> Any:
    import torch  # only here: a torch tensor was passed or a torch result asked for

    return torch


def _check_host_torch(t: Any, what: str) -> None:
    """CPU and CUDA tensors; CUDA ones move on torch's current stream for their
    device (a put reads them after the work already queued there)."""
    if t.device.type not in ("cpu", "cuda"):
        raise NotSupported(f"{what} is on device {t.device}; the store takes CPU and CUDA "
                           "tensors")


def _torch_code(t: Any) -> DType:
    name = str(t.dtype).rpartition(".")[2]
    if name not in _TORCH_CODE:
        raise InvalidArgument(f"torch.{name} has no dtype code in the tensor format "
                              f"(codes: {', '.join(_TORCH_NAME.values())})")
    return _TORCH_CODE[name]


def _numpy_code(dtype: np.dtype) -> DType:
    code = _NUMPY_CODE.get((dtype.kind, dtype.itemsize))
    if code is None or dtype.fields is not None or dtype.subdtype is not None:
        raise InvalidArgument(f"numpy dtype {dtype} has no dtype code in the tensor format "
                              "(numpy: bool, int8-64, uint8-64, float16/32/64)")
    return code


def _torch_bytes(t: Any) -> Any:
    """A flat uint8 view of a contiguous tensor's memory (it keeps t alive): numpy
    for a CPU tensor, a uint8 CUDA tensor for a CUDA one."""
    torch = _import_torch()
    flat = t.detach().reshape(-1).view(torch.uint8)
    return flat if flat.is_cuda else flat.numpy()


def _numpy_bytes(a: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array's memory (reshape(-1) is a view)."""
    return a.reshape(-1).view(np.uint8)


def _as_source(t: Any) -> Any:
    """t as a contiguous host numpy array or torch tensor (a copy only if needed)."""
    if _is_torch(t):
        if not hasattr(t, "is_contiguous") or not hasattr(t, "dtype"):
            raise InvalidArgument(f"a {type(t).__name__} is not a tensor")
        _check_host_torch(t, "the tensor")
        _torch_code(t)
        return t if t.is_contiguous() else t.contiguous()
    if isinstance(t, np.generic):
        t = np.asarray(t)
    if not isinstance(t, np.ndarray):
        raise InvalidArgument(f"a tensor is a numpy array or a torch tensor, not a "
                              f"{type(t).__name__}")
    _numpy_code(t.dtype)
    if t.dtype.byteorder == ">":
        t = t.astype(t.dtype.newbyteorder("<"))  # the format's bytes are little-endian
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return t if t.flags.c_contiguous else t.copy(order="C")


def _source_parts(src: Any) -> tuple[DType, tuple[int, ...], np.ndarray]:
    if _is_torch(src):
        return _torch_code(src), tuple(int(d) for d in src.shape), _torch_bytes(src)
    return _numpy_code(src.dtype), tuple(src.shape), _numpy_bytes(src)


def _little_endian() -> None:
    if sys.byteorder != "little":
        raise NotSupported("tensor objects hold little-endian bytes; this host is big-endian")


def _encode_source(src: Any, global_shape: Optional[tuple[int, ...]] = None,
                   axes: tuple[LayoutAxis, ...] = ()) -> tuple[bytes, memoryview]:
    code, shape, raw = _source_parts(src)
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(f"a tensor has at most {MAX_DIMS} dimensions, not {len(shape)} "
                              f"(shape {shape})")
    kind = LayoutKind.FULL if global_shape is None and not axes else LayoutKind.SHARD
    header = TensorHeader(dtype=code, global_shape=shape if global_shape is None else global_shape,
                          local_shape=shape, layout_kind=kind, axes=axes,
                          data_bytes=raw.nbytes)
    return header.pack(), raw if _is_torch(raw) else memoryview(raw)


def encode(t: Any) -> tuple[bytes, memoryview]:
    """The header (304 bytes) and the raw bytes of a numpy array or CPU torch tensor.
    The object stored is header + data. The data view keeps its memory alive."""
    _little_endian()
    return _encode_source(_as_source(t))


def _fields(mv: memoryview) -> tuple:
    return _FORMAT.unpack_from(mv, 0)


def decode(buf: Any) -> tuple[TensorHeader, int, int]:
    """Validates a whole stored object (header + data) and returns its header, the
    offset of the data and its byte count. ProtocolError names the first bad field."""
    _little_endian()
    try:
        mv = memoryview(buf)
    except TypeError:
        raise InvalidArgument(f"cannot decode a {type(buf).__name__}: pass bytes or a "
                              "buffer") from None
    if not mv.c_contiguous:
        raise InvalidArgument("the tensor object's buffer is not contiguous")
    total = mv.nbytes

    def bad(what: str) -> ProtocolError:
        return ProtocolError(f"not a valid tensor object ({total} bytes): {what}")

    # Before the cast, which refuses an empty view of more than one dimension.
    if total < HEADER_SIZE:
        raise bad(f"shorter than the {HEADER_SIZE}-byte tensor header")
    mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    f = _fields(mv)
    (magic, version, header_size, dtype, ndim, layout_kind, flags, data_offset,
     data_bytes) = f[:9]
    global_dims, local_dims = f[9:17], f[17:25]
    axis_count = f[25]
    raw_axes = [f[27 + 7 * i: 34 + 7 * i] for i in range(MAX_AXES)]

    if magic != MAGIC:
        raise bad(f"magic {magic:#010x}, expected {MAGIC:#010x} (a value written with put(), "
                  "or an old-format object?)")
    if version != VERSION:
        raise bad(f"version {version}; this reader knows version {VERSION}")
    if header_size != HEADER_SIZE:
        raise bad(f"header size {header_size}, expected {HEADER_SIZE}")
    if flags != 0:
        raise bad(f"unknown flags {flags:#x}")
    if not 0 <= dtype < len(DType):
        raise bad(f"dtype code {dtype}, not in 0..{len(DType) - 1}")
    if not 0 <= ndim <= MAX_DIMS:
        raise bad(f"ndim {ndim}, not in 0..{MAX_DIMS}")
    if layout_kind not in (LayoutKind.FULL, LayoutKind.SHARD):
        raise bad(f"layout kind {layout_kind}, expected 0 (FULL) or 1 (SHARD)")
    if axis_count > MAX_AXES:
        raise bad(f"axis count {axis_count}, more than {MAX_AXES}")
    if not HEADER_SIZE <= data_offset <= total:
        raise bad(f"data offset {data_offset} outside {HEADER_SIZE}..{total}")
    if data_bytes != total - data_offset:
        held = total - data_offset
        raise bad(f"the header says {data_bytes} data bytes at offset {data_offset}, the object "
                  f"holds {held} ({'truncated' if data_bytes > held else 'trailing bytes'})")
    for name, dims in (("global", global_dims), ("local", local_dims)):
        if any(d < 0 for d in dims[:ndim]):
            raise bad(f"negative {name} dimension in {dims[:ndim]}")
        if any(d != -1 for d in dims[ndim:]):
            raise bad(f"{name} dims past ndim {ndim} are not -1: {dims[ndim:]}")
    global_shape, local_shape = tuple(global_dims[:ndim]), tuple(local_dims[:ndim])
    itemsize = ITEM_SIZE[DType(dtype)]
    # As numpy and torch size a shape, where a zero dimension does not excuse
    # the others: beyond 2**63 - 1 bytes neither can make the array, even empty.
    for name, shape in (("global", global_shape), ("local", local_shape)):
        if _prod(max(d, 1) for d in shape) * itemsize > _MAX_ARRAY_BYTES:
            raise bad(f"{name} shape {shape} of {DType(dtype).name} is too large for an array")
    expected = _prod(local_shape) * itemsize
    if data_bytes != expected:
        raise bad(f"shape {local_shape} of {DType(dtype).name} is {expected} bytes, the header "
                  f"says {data_bytes}")
    if layout_kind == LayoutKind.FULL and global_shape != local_shape:
        raise bad(f"a FULL object with global shape {global_shape} != local shape {local_shape}")
    if layout_kind == LayoutKind.SHARD and any(l > g for l, g in zip(local_shape, global_shape)):
        raise bad(f"a shard of shape {local_shape} larger than its tensor {global_shape}")
    axes = []
    for i, (kind, index, rank, count, split_dim, r0, r1) in enumerate(raw_axes[:axis_count]):
        if not AxisKind.DP <= kind <= AxisKind.RESERVED:
            raise bad(f"axis {i}: kind {kind}, not in 0..{int(AxisKind.RESERVED)}")
        if count <= 0 or not 0 <= rank < count:
            raise bad(f"axis {i}: shard rank {rank} of {count}")
        if not -1 <= split_dim < ndim:
            raise bad(f"axis {i}: split dim {split_dim} for ndim {ndim}")
        if split_dim >= 0 and r1 != 0 and r1 != local_shape[split_dim]:
            raise bad(f"axis {i}: shard extent {r1} != local dim {split_dim} "
                      f"({local_shape[split_dim]})")
        axes.append(LayoutAxis(kind, index, rank, count, split_dim, r0, r1))
    header = TensorHeader(dtype=dtype, global_shape=global_shape, local_shape=local_shape,
                          layout_kind=layout_kind, axes=tuple(axes), data_offset=data_offset,
                          data_bytes=data_bytes)
    return header, data_offset, data_bytes


# Results and destinations.


def _data_view(value: Any, offset: int, nbytes: int) -> np.ndarray:
    return np.frombuffer(value, np.uint8, count=nbytes, offset=offset)


def _torch_device(device: Any) -> Any:
    try:
        torch = _import_torch()
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise NotSupported("device= returns a torch tensor, and torch is not installed; "
                           "leave device out for a numpy array") from None
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise NotSupported(f"device {dev}: the store reads into CPU or CUDA tensors")
    return torch, dev


def _materialize(header: TensorHeader, value: Any, device: Any) -> Any:
    """A new array (numpy) or tensor (torch, when device is given) with the object's data."""
    code = DType(header.dtype)
    if device is None:
        if code not in _NUMPY_DTYPE:
            raise NotSupported(f"the object holds {code.name}, which numpy has no dtype for; "
                               "pass device='cpu' for a torch tensor")
        out = np.empty(header.shape, np.dtype(_NUMPY_DTYPE[code]))
        raw = _numpy_bytes(out)
    else:
        torch, dev = _torch_device(device)
        dtype = getattr(torch, _TORCH_NAME[code], None)
        if dtype is None:
            raise NotSupported(f"the object holds {code.name}, and this torch "
                               f"({torch.__version__}) has no torch.{_TORCH_NAME[code]}")
        out = torch.empty(header.shape, dtype=dtype, device=dev)
        raw = _torch_bytes(out)
    _copy_into(header, value, raw)
    return out


def _destination(t: Any) -> tuple[DType, tuple[int, ...], np.ndarray]:
    """The dtype code, shape and writable bytes of a destination; nothing is written."""
    if _is_torch(t):
        if not hasattr(t, "is_contiguous") or not hasattr(t, "dtype"):
            raise InvalidArgument(f"a {type(t).__name__} is not a tensor")
        _check_host_torch(t, "the destination tensor")
        if not t.is_contiguous():
            raise InvalidArgument("the destination tensor is not contiguous")
        if t.requires_grad:
            raise InvalidArgument("the destination tensor requires grad")
        return _torch_code(t), tuple(int(d) for d in t.shape), _torch_bytes(t)
    if not isinstance(t, np.ndarray):
        raise InvalidArgument(f"a destination is a numpy array or a torch tensor, not a "
                              f"{type(t).__name__}")
    code = _numpy_code(t.dtype)
    if t.dtype.byteorder == ">":
        raise InvalidArgument(f"the destination's dtype {t.dtype} is big-endian")
    if not t.flags.c_contiguous:
        raise InvalidArgument("the destination array is not C-contiguous")
    if not t.flags.writeable:
        raise InvalidArgument("the destination array is read-only")
    return code, tuple(t.shape), _numpy_bytes(t)


def _check_fits(header: TensorHeader, dst: tuple[DType, tuple[int, ...], np.ndarray],
                key: Any) -> None:
    code, shape, raw = dst
    stored = f"{key!r} holds {DType(header.dtype).name} {header.shape}"
    if code != header.dtype:
        raise InvalidArgument(f"{stored}; the destination is {code.name}")
    if shape != header.shape:
        raise InvalidArgument(f"{stored}; the destination's shape is {shape}")
    if raw.nbytes != header.data_bytes:
        raise InvalidArgument(f"{stored} ({header.data_bytes} bytes); the destination has "
                              f"{raw.nbytes}")


def _copy_into(header: TensorHeader, value: Any, raw: Any) -> None:
    if not header.data_bytes:
        return
    view = _data_view(value, header.data_offset, header.data_bytes)
    if isinstance(raw, np.ndarray):
        raw[:] = view
        return
    # A CUDA destination: copied on torch's current stream for its device, so
    # the work queued after this call there sees the value.
    torch = _import_torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only source is fine for a copy
        raw.copy_(torch.frombuffer(view, dtype=torch.uint8))
