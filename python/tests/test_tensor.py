"""Tensor objects in the store (docs/tensor-format.md): round trips of every dtype and
shape, the TP helpers, destinations validated before they are written, corrupt
objects refused, and the header checked byte for byte against one packed here from
the documented table (not from ferry.tensor)."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

import ferry
from ferry import tensor as ft
from ferry import tensor_store

pytestmark = pytest.mark.skipif(
    not hasattr(ferry._ferry, "Store"),
    reason="the extension was built without the store (python/build-ext.sh found no "
    "libferry_store.a)")

MiB = 1 << 20

# The documented layout, written out independently of ferry.tensor.
MAGIC, HEADER = 0x4D4F4F4E, 304
CODES = {np.float32: 0, np.float64: 1, np.int8: 2, np.uint8: 3, np.int16: 4, np.uint16: 5,
         np.int32: 6, np.uint32: 7, np.int64: 8, np.uint64: 9, np.bool_: 10, np.float16: 11}
BF16, FP8_E4M3 = 12, 13


def packed_header(dtype: int, global_shape, local_shape, data_bytes: int, *, kind: int = 0,
                  axes=(), data_offset: int = HEADER, ndim=None, flags: int = 0,
                  version: int = 1, header_size: int = HEADER, magic: int = MAGIC) -> bytes:
    """The header as the docs' table states it: head at 0, shapes at 40 and 104,
    axis count at 168, four 32-byte axes from 176."""
    n = len(local_shape) if ndim is None else ndim
    pad_g = [-1] * (8 - len(global_shape))
    pad_l = [-1] * (8 - len(local_shape))
    h = struct.pack("<IHHiiIIQQ", magic, version, header_size, dtype, n, kind, flags,
                    data_offset, data_bytes)
    h += struct.pack("<8q", *global_shape, *pad_g) + struct.pack("<8q", *local_shape, *pad_l)
    h += struct.pack("<II", len(axes), 0)
    for a in axes:
        h += struct.pack("<iiiiiiq", *a)
    h += bytes(32 * (4 - len(axes)))
    assert len(h) == HEADER
    return h


def full_object(a: np.ndarray) -> bytes:
    a = np.ascontiguousarray(a)
    return packed_header(CODES[a.dtype.type], a.shape, a.shape, a.nbytes) + a.tobytes()


@pytest.fixture
def store():
    with ferry.Store(local_memory=48 * MiB) as s:
        yield s


def torch_or_skip():
    """Only a missing top-level torch skips; any other import failure fails."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        pytest.skip("torch is not installed (Debian: python3-torch)")
    return torch


def rng_array(shape, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(size=shape).astype(dtype)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


# Round trips.


@pytest.mark.parametrize("dtype", list(CODES), ids=lambda d: np.dtype(d).name)
def test_every_numpy_dtype_round_trips(store, dtype):
    a = rng_array((3, 5, 7), dtype)
    store.put_tensor("t", a)
    value = store.get("t")
    assert len(value) == HEADER + a.nbytes
    assert struct.unpack_from("<i", value, 8)[0] == CODES[dtype]
    got = store.get_tensor("t")
    assert_same(got, a)
    assert got.flags.writeable and got.flags.c_contiguous
    dst = np.zeros_like(a)
    assert store.get_tensor_into("t", dst) is dst
    assert_same(dst, a)


@pytest.mark.parametrize("ndim", range(9))
def test_every_ndim_round_trips(store, ndim):
    shape = (3, 1, 2, 4, 1, 2, 3, 2)[:ndim]
    a = rng_array(shape, np.int32, ndim)
    store.put_tensor(f"nd{ndim}", a)
    assert_same(store.get_tensor(f"nd{ndim}"), a)
    value = store.get(f"nd{ndim}")
    assert struct.unpack_from("<i", value, 12)[0] == ndim
    assert struct.unpack_from("<8q", value, 40) == shape + (-1,) * (8 - ndim)


def test_more_than_8_dims_is_refused(store):
    with pytest.raises(ferry.InvalidArgument, match="at most 8 dimensions"):
        store.put_tensor("nd9", np.zeros((1,) * 9, np.float32))
    assert not store.exists("nd9")


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (0,) * 8, (2, 0)])
def test_zero_sized_tensors_round_trip(store, shape):
    # Allowed, as in Mooncake (#2470): the object is the header alone.
    a = np.zeros(shape, np.float16)
    store.put_tensor("z", a)
    assert len(store.get("z")) == HEADER
    assert_same(store.get_tensor("z"), a)
    dst = np.empty(shape, np.float16)
    assert store.get_tensor_into("z", dst) is dst


def test_scalars_round_trip(store):
    store.put_tensor("s", np.float64(2.5))
    got = store.get_tensor("s")
    assert got.shape == () and got.dtype == np.float64 and got == 2.5
    assert len(store.get("s")) == HEADER + 8


def test_16_mib_round_trips(store):
    a = rng_array((4 * MiB,), np.float32, 7)  # 16 MiB
    store.put_tensor("big", a.reshape(1024, 4096))
    assert_same(store.get_tensor("big"), a.reshape(1024, 4096))
    dst = np.zeros((1024, 4096), np.float32)
    store.get_tensor_into("big", dst)
    assert_same(dst, a.reshape(1024, 4096))


def test_non_contiguous_and_aliased_inputs(store):
    base = rng_array((6, 8), np.int64, 3)
    for i, a in enumerate([base[:, ::2], base.T, base[::-1], np.asfortranarray(base)]):
        store.put_tensor(f"v{i}", a)
        assert_same(store.get_tensor(f"v{i}"), np.ascontiguousarray(a))
    # Aliases match by kind and size; big-endian input is stored little-endian.
    for i, a in enumerate([np.arange(5, dtype=np.intc), np.arange(5, dtype=np.longlong),
                           np.arange(5, dtype=">i4"), np.arange(5, dtype=">f8")]):
        store.put_tensor(f"alias{i}", a)
        got = store.get_tensor(f"alias{i}")
        assert got.dtype.byteorder in "=<|" and np.array_equal(got, a)


@pytest.mark.parametrize("bad", [np.zeros(3, np.complex64), np.array(["a"]),
                                 np.array([object()]), np.zeros(2, "datetime64[s]"),
                                 np.zeros(2, [("a", "i4")]), [1, 2, 3], b"bytes"],
                         ids=["complex", "str", "object", "datetime", "struct", "list",
                              "bytes"])
def test_unsupported_inputs_are_refused(store, bad):
    with pytest.raises(ferry.InvalidArgument):
        store.put_tensor("bad", bad)
    assert not store.exists("bad")


def test_missing_key_is_not_found(store):
    with pytest.raises(ferry.NotFound):
        store.get_tensor("nothing")


# The header, byte for byte.


def test_header_matches_the_documented_table(store):
    a = rng_array((2, 3, 4), np.float16, 1)
    store.put_tensor("h", a)
    assert store.get("h") == packed_header(11, (2, 3, 4), (2, 3, 4), a.nbytes) + a.tobytes()
    header, data = ft.encode(a)
    assert header == packed_header(11, (2, 3, 4), (2, 3, 4), a.nbytes)
    assert bytes(data) == a.tobytes()
    info, offset, nbytes = ft.decode(store.get("h"))
    assert (info.dtype, info.shape, info.global_shape, info.layout_kind, info.axes) == \
        (11, (2, 3, 4), (2, 3, 4), 0, ())
    assert (offset, nbytes) == (304, a.nbytes)


def test_a_larger_data_offset_is_read(store):
    # Mooncake's reader accepts data anywhere from 304 on; so does Ferry's.
    a = np.arange(6, dtype=np.uint16).reshape(2, 3)
    obj = packed_header(5, (2, 3), (2, 3), a.nbytes, data_offset=320) + bytes(16) + a.tobytes()
    store.put("off", obj)
    assert_same(store.get_tensor("off"), a)


def test_a_shard_without_axes_is_read(store):
    # Mooncake's zero-copy put_tensor_with_tp_from writes SHARD with no axes.
    a = np.arange(8, dtype=np.int8).reshape(2, 4)
    store.put("raw_tp_0", packed_header(2, (4, 4), (2, 4), a.nbytes, kind=1) + a.tobytes())
    assert_same(store.get_tensor_with_tp("raw", 0, 2), a)


# Corrupt objects, stored with plain put().


def _patched(fmt: str, offset: int, value) -> bytes:
    obj = bytearray(full_object(np.arange(12, dtype=np.int32).reshape(3, 4)))
    struct.pack_into(fmt, obj, offset, value)
    return bytes(obj)


GOOD = full_object(np.arange(12, dtype=np.int32).reshape(3, 4))
CORRUPT = {
    "wrong magic": (_patched("<I", 0, 0x12345678), "magic 0x12345678"),
    "plain bytes": (b"x" * 400, "magic"),
    "short": (GOOD[:100], "shorter than the 304-byte"),
    "truncated": (GOOD[:-4], "truncated"),
    "trailing": (GOOD + b"\0" * 4, "trailing bytes"),
    "version": (_patched("<H", 4, 2), "version 2"),
    "header size": (_patched("<H", 6, 40), "header size 40"),
    "dtype 15": (_patched("<i", 8, 15), "dtype code 15"),
    "dtype -1": (_patched("<i", 8, -1), "dtype code -1"),
    "ndim 9": (_patched("<i", 12, 9), "ndim 9"),
    "ndim -1": (_patched("<i", 12, -1), "ndim -1"),
    "layout kind": (_patched("<I", 16, 2), "layout kind 2"),
    "flags": (_patched("<I", 20, 1), "unknown flags"),
    "offset low": (_patched("<Q", 24, 40), "data offset 40"),
    "offset high": (_patched("<Q", 24, 10_000), "data offset 10000"),
    "bytes vs shape": (_patched("<q", 104, 2), "shape (2, 4)"),
    "data bytes": (_patched("<Q", 32, 44), "44 data bytes"),
    "negative dim": (_patched("<q", 112, -4), "negative local"),
    "unused dim": (_patched("<q", 104 + 8 * 5, 7), "past ndim 2"),
    "full shapes differ": (_patched("<q", 40, 6), "FULL object"),
    "axis count": (_patched("<I", 168, 5), "axis count 5"),
    "axis rank": (bytes(bytearray(GOOD[:168]) + struct.pack("<II", 1, 0)
                        + struct.pack("<iiiiiiq", 1, 0, 4, 4, 0, 0, 0) + GOOD[208:]),
                  "shard rank 4 of 4"),
    # Found by tests/fuzz/tensor_header_fuzz.py: it decoded, and then numpy
    # refused to make even an empty array of that shape (ValueError).
    "empty but huge": (packed_header(6, (1 << 62, 0, 4), (1 << 62, 0, 4), 0),
                       "too large for an array"),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupt_objects_are_refused(store, name):
    obj, message = CORRUPT[name]
    store.put("bad", obj)
    with pytest.raises(ferry.ProtocolError, match=re.escape(message)):
        store.get_tensor("bad")
    dst = np.full((3, 4), 7, np.int32)
    with pytest.raises(ferry.ProtocolError):
        store.get_tensor_into("bad", dst)
    assert (dst == 7).all()
    [err] = store.batch_get_tensor(["bad"])
    assert isinstance(err, ferry.ProtocolError)


def test_an_empty_view_of_any_shape_is_too_short():
    # Found by tests/fuzz/tensor_header_fuzz.py: the cast to bytes came before
    # the length check, and raised TypeError for a 2-D view with no rows.
    with pytest.raises(ferry.ProtocolError, match="shorter than the 304-byte"):
        ft.decode(np.empty((0, 1), np.float32))


def test_good_object_before_patching_is_read(store):
    store.put("good", GOOD)
    assert_same(store.get_tensor("good"), np.arange(12, dtype=np.int32).reshape(3, 4))


# Destinations: validated against the object before anything is written.


@pytest.mark.parametrize("dst", [
    np.full((3, 4), 7, np.float32),      # dtype
    np.full((4, 3), 7, np.int32),        # shape, same byte count
    np.full((3, 5), 7, np.int32),        # size
    np.full((12,), 7, np.int32),         # ndim
    np.full((3, 4), 7, np.int64),        # dtype and byte count
], ids=["dtype", "shape", "size", "ndim", "bytes"])
def test_get_tensor_into_mismatch_leaves_destination(store, dst):
    store.put_tensor("m", np.arange(12, dtype=np.int32).reshape(3, 4))
    before = dst.copy()
    with pytest.raises(ferry.InvalidArgument, match="holds I32"):
        store.get_tensor_into("m", dst)
    assert_same(dst, before)


def test_get_tensor_into_refuses_unusable_destinations(store):
    store.put_tensor("m", np.arange(12, dtype=np.int32).reshape(6, 2))
    wide = np.full((6, 4), 7, np.int32)
    readonly = np.full((6, 2), 7, np.int32)
    readonly.flags.writeable = False
    for dst, msg in [(wide[:, :2], "not C-contiguous"), (readonly, "read-only"),
                     (bytearray(48), "numpy array or a torch tensor"),
                     (np.full((6, 2), 7, ">i4"), "big-endian")]:
        with pytest.raises(ferry.InvalidArgument, match=msg):
            store.get_tensor_into("m", dst)
    assert (wide == 7).all() and (readonly == 7).all()
    with pytest.raises(ferry.NotFound):
        store.get_tensor_into("missing", np.zeros((6, 2), np.int32))


# Batch forms.


def test_batch_round_trip(store):
    arrays = [rng_array((i + 1, 3), dt, i) for i, dt in enumerate(CODES)]
    keys = [f"b{i}" for i in range(len(arrays))]
    assert store.batch_put_tensor(keys, arrays) == [None] * len(keys)
    for got, want in zip(store.batch_get_tensor(keys), arrays):
        assert_same(got, want)
    dsts = [np.zeros_like(a) for a in arrays]
    assert store.batch_get_tensor_into(keys, dsts) == dsts
    for got, want in zip(dsts, arrays):
        assert_same(got, want)


def test_batch_errors_are_per_item(store):
    a, b = np.arange(4, dtype=np.float32), np.arange(6, dtype=np.uint8)
    res = store.batch_put_tensor(["p0", "p1", "p2"], [a, np.zeros(2, np.complex128), b])
    assert res[0] is None and res[2] is None and isinstance(res[1], ferry.InvalidArgument)
    assert not store.exists("p1")
    store.put("corrupt", b"not a tensor" * 40)
    got = store.batch_get_tensor(["p0", "missing", "corrupt", "p2"])
    assert_same(got[0], a)
    assert isinstance(got[1], ferry.NotFound)
    assert isinstance(got[2], ferry.ProtocolError)
    assert_same(got[3], b)
    d0, bad, d2 = np.zeros(4, np.float32), np.full(6, 9, np.int8), np.zeros(6, np.uint8)
    got = store.batch_get_tensor_into(["p0", "p2", "p2"], [d0, bad, d2])
    assert got[0] is d0 and got[2] is d2 and isinstance(got[1], ferry.InvalidArgument)
    assert (bad == 9).all()
    assert_same(d0, a)
    assert_same(d2, b)
    with pytest.raises(ferry.InvalidArgument, match="2 keys but 1 tensors"):
        store.batch_put_tensor(["x", "y"], [a])
    with pytest.raises(ferry.InvalidArgument, match="2 keys but 1 tensors"):
        store.batch_get_tensor_into(["x", "y"], [a])


# Tensor parallelism.


@pytest.mark.parametrize("split_dim", [0, 1])
def test_tp_4_shards_concatenate_to_the_original(store, split_dim):
    a = rng_array((8, 12, 3), np.float32, split_dim)
    store.put_tensor_with_tp("w", a, 4, split_dim=split_dim)
    assert not store.exists("w")
    shards = [store.get_tensor_with_tp("w", r, 4) for r in range(4)]
    for r, (got, want) in enumerate(zip(shards, np.split(a, 4, axis=split_dim))):
        assert_same(got, want)
        assert_same(store.get_tensor_with_tp("w", r, 4, split_dim=split_dim), want)
        # Byte for byte: SHARD, global and local shapes, one TP axis as Mooncake writes.
        local = want.shape
        assert store.get(f"w_tp_{r}") == packed_header(
            0, a.shape, local, want.nbytes, kind=1,
            axes=[(1, 0, r, 4, split_dim, 0, local[split_dim])]) + want.tobytes()
    assert_same(np.concatenate(shards, axis=split_dim), a)


def test_tp_uneven_split_stores_nothing(store):
    a = np.zeros((6, 8), np.float32)
    with pytest.raises(ferry.InvalidArgument, match="cannot split evenly"):
        store.put_tensor_with_tp("u", a, 4, split_dim=0)
    with pytest.raises(ferry.InvalidArgument, match="cannot split evenly"):
        store.put_tensor_with_tp("u", a, 3, split_dim=1)
    for bad in [dict(tp_size=0), dict(tp_size=2, split_dim=2), dict(tp_size=2, split_dim=-1)]:
        with pytest.raises(ferry.InvalidArgument):
            store.put_tensor_with_tp("u", a, **bad)
    with pytest.raises(ferry.InvalidArgument):
        store.put_tensor_with_tp("u", np.float32(1), 2)
    assert store.batch_exists(["u"] + [f"u_tp_{r}" for r in range(4)]) == [False] * 5
    assert store.stats()["objects"] == 0


def test_tp_size_1_is_a_plain_put(store):
    a = np.arange(4, dtype=np.int16)
    store.put_tensor_with_tp("one", a, 1)
    assert store.get("one") == full_object(a) and not store.exists("one_tp_0")
    assert_same(store.get_tensor_with_tp("one", 0, 1), a)


def test_tp_read_checks_rank_and_split_dim(store):
    a = np.arange(16, dtype=np.int32).reshape(4, 4)
    store.put_tensor_with_tp("c", a, 2, split_dim=1)
    with pytest.raises(ferry.InvalidArgument, match="split along dim 1, not 0"):
        store.get_tensor_with_tp("c", 0, 2, split_dim=0)
    with pytest.raises(ferry.InvalidArgument, match="not in 0..1"):
        store.get_tensor_with_tp("c", 2, 2)
    shard1 = store.get("c_tp_1")
    store.remove("c_tp_0")
    store.put("c_tp_0", shard1)  # rank 1's shard under rank 0's key
    with pytest.raises(ferry.InvalidArgument, match="holds TP rank 1 of 2"):
        store.get_tensor_with_tp("c", 0, 2)
    with pytest.raises(ferry.NotFound):
        store.get_tensor_with_tp("c", 3, 4)


def test_tp_zero_sized_dimension_and_bytes_keys(store):
    a = np.zeros((2, 0, 3), np.float32)
    store.put_tensor_with_tp(b"zk", a, 2, split_dim=0)
    for r in range(2):
        assert_same(store.get_tensor_with_tp(b"zk", r, 2), a[r:r + 1])
        assert store.exists(f"zk_tp_{r}")


class _FailingStore:
    """Stands in for Store: the batch put fails one key."""

    def __init__(self):
        self.removed = None

    def batch_put(self, keys, values):
        return [ferry.ResourceExhausted("full") if k.endswith("_tp_2") else None for k in keys]

    def batch_remove(self, keys, force=False):
        self.removed = (list(keys), force)
        return [None] * len(keys)


def test_tp_partial_failure_removes_the_stored_shards():
    fake = _FailingStore()
    with pytest.raises(ferry.ResourceExhausted):
        tensor_store.put_tensor_with_tp(fake, "f", np.zeros((4, 4), np.uint8), 4)
    assert fake.removed == (["f_tp_0", "f_tp_1", "f_tp_3"], True)


# numpy has no bf16/fp8; torch.


def test_bf16_object_without_numpy_dtype(store):
    bits = np.array([0x3F80, 0x4000, 0xC040], np.uint16)  # 1.0, 2.0, -3.0 in bf16
    store.put("bf", packed_header(BF16, (3,), (3,), 6) + bits.tobytes())
    with pytest.raises(ferry.NotSupported, match="numpy has no dtype"):
        store.get_tensor("bf")
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        with pytest.raises(ferry.NotSupported, match="torch is not installed"):
            store.get_tensor("bf", device="cpu")
        return
    got = store.get_tensor("bf", device="cpu")
    assert got.dtype == torch.bfloat16 and got.tolist() == [1.0, 2.0, -3.0]


def test_torch_cpu_round_trips(store):
    torch = torch_or_skip()
    names = ["float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
             "float16", "bfloat16", "uint16", "uint32", "uint64", "float8_e4m3fn",
             "float8_e5m2"]
    codes = dict(zip(names, [0, 1, 2, 3, 4, 6, 8, 10, 11, 12, 5, 7, 9, 13, 14]))
    def raw(x):
        return x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

    for name in names:
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue  # an older torch (python3-torch 1.13 has no uint16 or float8)
        t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).to(dtype)
        nbytes = t.numel() * t.element_size()
        store.put_tensor(name, t)
        value = store.get(name)
        assert value == packed_header(codes[name], (2, 3, 4), (2, 3, 4), nbytes) + raw(t)
        got = store.get_tensor(name, device="cpu")
        assert got.dtype == dtype and tuple(got.shape) == (2, 3, 4) and raw(got) == raw(t)
        dst = torch.zeros(nbytes, dtype=torch.uint8).view(dtype).reshape(2, 3, 4)
        assert store.get_tensor_into(name, dst) is dst
        assert raw(dst) == raw(t)
    # numpy readers get numpy; torch readers of numpy-written objects get torch.
    store.put_tensor("np", np.arange(6, dtype=np.int64).reshape(2, 3))
    assert torch.equal(store.get_tensor("np", device="cpu"),
                       torch.arange(6, dtype=torch.int64).reshape(2, 3))
    store.put_tensor("pt", torch.arange(6, dtype=torch.int32))
    assert_same(store.get_tensor("pt"), np.arange(6, dtype=np.int32))


def test_torch_non_contiguous_tp_and_refusals(store):
    torch = torch_or_skip()
    t = torch.arange(96, dtype=torch.float32).reshape(8, 12).to(torch.bfloat16)
    store.put_tensor("nc", t.t())  # non-contiguous: a copy is stored
    assert torch.equal(store.get_tensor("nc", device="cpu"), t.t().contiguous())
    for split_dim in (0, 1):
        store.put_tensor_with_tp(f"tp{split_dim}", t, 4, split_dim=split_dim)
        shards = [store.get_tensor_with_tp(f"tp{split_dim}", r, 4, split_dim=split_dim,
                                           device="cpu") for r in range(4)]
        for got, want in zip(shards, torch.chunk(t, 4, dim=split_dim)):
            assert torch.equal(got, want)
        assert torch.equal(torch.cat(shards, dim=split_dim), t)
    # Scalars, zero-sized tensors and tensors that require grad.
    for name, x in [("t0", torch.tensor(3.5, dtype=torch.bfloat16)),
                    ("tz", torch.empty(2, 0, 3, dtype=torch.float16)),
                    ("tg", torch.ones(3, requires_grad=True))]:
        store.put_tensor(name, x)
        got = store.get_tensor(name, device="cpu")
        assert got.dtype == x.dtype and got.shape == x.shape and torch.equal(got, x.detach())
    with pytest.raises(ferry.InvalidArgument, match="requires grad"):
        store.get_tensor_into("tg", torch.zeros(3, requires_grad=True))
    dst = torch.full((8, 12), 7.0)  # float32, the object is bf16
    with pytest.raises(ferry.InvalidArgument, match="holds BF16"):
        store.get_tensor_into("nc", dst)
    assert bool((dst == 7).all())
    with pytest.raises(ferry.InvalidArgument, match="not contiguous"):
        store.get_tensor_into("nc", torch.zeros(12, 16, dtype=torch.bfloat16)[:, :8])
    with pytest.raises(ferry.NotSupported, match="CPU or CUDA"):
        store.get_tensor("nc", device="meta")
    with pytest.raises(ferry.NotSupported, match="CPU and CUDA"):
        store.put_tensor("meta", torch.zeros(2, device="meta"))
    with pytest.raises(ferry.InvalidArgument):
        store.put_tensor("cx", torch.zeros(2, dtype=torch.complex64))
    assert not store.exists("cx") and not store.exists("meta")
