"""Argument checks of the compat store: pybind refuses a wrong type with
TypeError, and so do these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

from .mooncake_config import ReplicateConfig

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


def _config(what: str, value: Any) -> ReplicateConfig:
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
