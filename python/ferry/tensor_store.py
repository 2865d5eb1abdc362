"""The Store's tensor methods (python/ferry/store.py forwards to these): tensor
objects in the format of ferry.tensor, put and read whole, in batches, into
existing tensors, and as TP shards."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np

from .errors import FerryError, InvalidArgument, OutOfRange
from .tensor import (AxisKind, LayoutAxis, LayoutKind, TensorHeader, _as_source, _check_fits,
                     _copy_into, _destination, _encode_source, _is_torch, _little_endian,
                     _materialize, _torch_device, decode, encode)

Key = Union[str, bytes]


def tp_key(key: Key, rank: int) -> Key:
    """The key of a TP shard: f"{key}_tp_{rank}" (bytes keys get bytes)."""
    if isinstance(key, bytes):
        return key + b"_tp_%d" % rank
    if isinstance(key, str):
        return f"{key}_tp_{rank}"
    raise InvalidArgument(f"a key is str or bytes, not {type(key).__name__}")


def _put_one(store: Any, key: Key, header: bytes, data: memoryview, options: dict) -> None:
    put_parts = getattr(store, "put_parts", None)
    if put_parts is not None:
        put_parts(key, [header, data], **options)
    else:
        store.put(key, b"".join((header, data)), **options)


def _put_many(store: Any, keys: list, encoded: list, options: dict) -> list:
    batch_put_parts = getattr(store, "batch_put_parts", None)
    if batch_put_parts is not None:
        return list(batch_put_parts(keys, [[h, d] for h, d in encoded], **options))
    return list(store.batch_put(keys, [b"".join((h, d)) for h, d in encoded], **options))


def put_tensor(store: Any, key: Key, t: Any, **options: Any) -> None:
    header, data = encode(t)
    _put_one(store, key, header, data, options)


def get_tensor(store: Any, key: Key, device: Any = None) -> Any:
    value = store.get(key)
    header, _, _ = decode(value)
    return _materialize(header, value, device)


def _read_direct(store: Any, key: Key, dst: tuple) -> bool:
    """A CUDA destination is read into straight from the node when the object's
    header is exactly the one a whole tensor of its dtype and shape has: the
    store checks those bytes before it writes any (expect=). False when they
    differ; the caller then reads through the host, which checks every field
    and says what is wrong."""
    code, shape, raw = dst
    header = TensorHeader(dtype=code, global_shape=shape, local_shape=shape,
                          layout_kind=LayoutKind.FULL, axes=(), data_bytes=raw.nbytes).pack()
    # The header lands in memory the store shares (attached: with the node), so
    # the whole item is read by reference, the data straight into the tensor.
    scratch = getattr(store, "_header_scratch", None)
    if scratch is None:
        scratch = store._header_scratch = store.allocate_buffer(len(header))
    got = store.batch_get_into_parts([key], [[scratch, raw]], expect=header)[0]
    if isinstance(got, (InvalidArgument, OutOfRange)):
        return False
    if isinstance(got, FerryError):
        raise got
    return True


def get_tensor_into(store: Any, key: Key, t: Any) -> Any:
    dst = _destination(t)
    if not isinstance(dst[2], np.ndarray) and _read_direct(store, key, dst):
        return t
    value = store.get(key)
    header, _, _ = decode(value)
    _check_fits(header, dst, key)
    _copy_into(header, value, dst[2])
    return t


def _same_length(keys: Sequence[Any], items: Sequence[Any], what: str) -> None:
    if len(keys) != len(items):
        raise InvalidArgument(f"{len(keys)} keys but {len(items)} {what}")


def batch_put_tensor(store: Any, keys: Sequence[Key], tensors: Sequence[Any],
                     **options: Any) -> list[Optional[FerryError]]:
    _same_length(keys, tensors, "tensors")
    results: list[Optional[FerryError]] = [None] * len(keys)
    todo, encoded = [], []
    for i, t in enumerate(tensors):
        try:
            encoded.append(encode(t))
            todo.append(i)
        except FerryError as e:
            results[i] = e
    if todo:
        for i, r in zip(todo, _put_many(store, [keys[i] for i in todo], encoded, options)):
            results[i] = r
    return results


def _decoded(value: Any, then: Any) -> Any:
    if isinstance(value, FerryError):
        return value
    try:
        return then(value, decode(value)[0])
    except FerryError as e:
        return e


def batch_get_tensor(store: Any, keys: Sequence[Key],
                     device: Any = None) -> list[Union[Any, FerryError]]:
    if device is not None:
        _torch_device(device)  # a bad device fails the call, not each item
    return [_decoded(v, lambda value, h: _materialize(h, value, device))
            for v in store.batch_get(keys)]


def batch_get_tensor_into(store: Any, keys: Sequence[Key],
                          tensors: Sequence[Any]) -> list[Union[Any, FerryError]]:
    _same_length(keys, tensors, "tensors")
    results: list[Any] = [None] * len(keys)
    dsts: dict[int, Any] = {}
    for i, t in enumerate(tensors):
        try:
            dsts[i] = _destination(t)
        except FerryError as e:
            results[i] = e
    todo = list(dsts)
    values = store.batch_get([keys[i] for i in todo]) if todo else []
    for i, value in zip(todo, values):
        def fill(v: Any, h: TensorHeader, i: int = i) -> Any:
            _check_fits(h, dsts[i], keys[i])
            _copy_into(h, v, dsts[i][2])
            return tensors[i]
        results[i] = _decoded(value, fill)
    return results


def _tp_args(tp_size: Any, tp_rank: Optional[Any] = None) -> None:
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise InvalidArgument(f"tp_size is a positive int, got {tp_size!r}")
    if tp_rank is not None and (not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size):
        raise InvalidArgument(f"tp_rank {tp_rank!r} is not in 0..{tp_size - 1}")


def _narrow(src: Any, dim: int, start: int, length: int) -> Any:
    if _is_torch(src):
        return src.narrow(dim, start, length).contiguous()
    index = (slice(None),) * dim + (slice(start, start + length),)
    return src[index].copy(order="C")


def put_tensor_with_tp(store: Any, key: Key, t: Any, tp_size: int, split_dim: int = 0,
                       **options: Any) -> None:
    """Stores every rank's shard as tp_key(key, r), each a SHARD object with a TP
    axis. tp_size 1 stores the whole tensor under `key`, as Mooncake does. Shards
    already stored are removed if a later one fails."""
    _tp_args(tp_size)
    if tp_size == 1:
        return put_tensor(store, key, t, **options)
    _little_endian()
    src = _as_source(t)
    shape = tuple(int(d) for d in src.shape)
    if not isinstance(split_dim, int) or not 0 <= split_dim < len(shape):
        raise InvalidArgument(f"split_dim {split_dim!r} is not a dimension of shape {shape}")
    if shape[split_dim] % tp_size:
        raise InvalidArgument(f"dimension {split_dim} of shape {shape} is {shape[split_dim]}, "
                              f"which {tp_size} ranks cannot split evenly; nothing was stored")
    tp_key(key, 0)  # the key's type, before anything is stored
    step = shape[split_dim] // tp_size
    keys, encoded = [], []
    for r in range(tp_size):
        shard = _narrow(src, split_dim, r * step, step)
        axis = LayoutAxis(AxisKind.TP, 0, r, tp_size, split_dim, 0, step)
        keys.append(tp_key(key, r))
        encoded.append(_encode_source(shard, global_shape=shape, axes=(axis,)))
    results = _put_many(store, keys, encoded, options)
    failed = [r for r in results if r is not None]
    if failed:
        stored = [k for k, r in zip(keys, results) if r is None]
        if stored:
            store.batch_remove(stored, force=True)
        raise failed[0]


def get_tensor_with_tp(store: Any, key: Key, tp_rank: int, tp_size: int,
                       split_dim: Optional[int] = None, device: Any = None) -> Any:
    """Reads rank tp_rank's shard (tp_key(key, tp_rank); with tp_size 1, `key`). When
    the shard carries a TP axis, its rank and count must match, and split_dim too
    when given."""
    _tp_args(tp_size, tp_rank)
    if tp_size == 1:
        return get_tensor(store, key, device)
    shard_key = tp_key(key, tp_rank)
    value = store.get(shard_key)
    header, _, _ = decode(value)
    axis = header.axis(AxisKind.TP)
    if axis is not None:
        if (axis.shard_rank, axis.shard_count) != (tp_rank, tp_size):
            raise InvalidArgument(f"{shard_key!r} holds TP rank {axis.shard_rank} of "
                                  f"{axis.shard_count}, not {tp_rank} of {tp_size}")
        if split_dim is not None and axis.split_dim != split_dim:
            raise InvalidArgument(f"{shard_key!r} was split along dim {axis.split_dim}, "
                                  f"not {split_dim}")
    return _materialize(header, value, device)
