"""Mooncake's configuration: sizes and flags as its config files spell them,
MooncakeConfig (the file or the MOONCAKE_* variables) and ReplicateConfig."""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Sequence
from typing import Any, Callable, Optional

from .mooncake_errors import P2PHANDSHAKE

log = logging.getLogger("ferry.compat.mooncake.store")

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
