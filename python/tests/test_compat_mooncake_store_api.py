"""ferry.compat.mooncake's MooncakeDistributedStore against real `ferry master` and
`ferry node` processes: bad input (TypeError as pybind raises it; every other
failure a code, logged once), configuration (files, the environment, setup(dict))
and tensors. The frameworks' call sequences: test_compat_mooncake_store.py."""

from __future__ import annotations

import json
import logging
import signal
import struct
import threading
import urllib.request

import numpy as np
import pytest

import ferry
from conftest import addr, pattern
from ferry.compat import mooncake_store as ms
from ferry.compat.mooncake import MooncakeDistributedStore, ReplicateConfig
from store_cluster import module_cluster as cluster  # noqa: F401 (a fixture)
from store_cluster import (FERRY_BIN, P2P, Cluster, MiB, cluster_skip_reason,
                           connected, unique, wait_until)

pytestmark = [
    pytest.mark.skipif(not hasattr(ferry._ferry, "Store"),
                       reason="the extension was built without the store"),
    pytest.mark.skipif(cluster_skip_reason() is not None, reason=str(cluster_skip_reason())),
]


# Bad input: TypeError as pybind raises it; every other failure a code, logged once.


def test_wrong_types_raise_type_error(cluster):
    store = connected(cluster, segment=4 * MiB)
    key = unique("types")
    calls = [
        lambda: store.put(1, b"v"),
        lambda: store.put(key, "a str is not a buffer"),
        lambda: store.put(key, b"v", config={"replica_num": 1}),
        lambda: store.put_from(key, "0x1000", 4),
        lambda: store.get_into(key, 4096, 1.5),
        lambda: store.register_buffer(-1, 16),
        lambda: store.batch_put_from(key, [1], [1]),
        lambda: store.batch_get_into([key], [None], [1]),
        lambda: store.batch_put_from_multi_buffers([key], [1], [[1]]),
        lambda: store.batch_is_exist([key, 3]),
        lambda: store.remove(key, force="yes"),
        lambda: store.put_parts(key, b"a", 5),
        lambda: store.setup("127.0.0.1", P2P, 4 * MiB),
        lambda: store.setup("127.0.0.1", P2P, -1, 0, "tcp", "", cluster.master),
        lambda: store.setup_dummy(0, 0, 42),
    ]
    for call in calls:
        with pytest.raises(TypeError):
            call()
    with pytest.raises(RuntimeError, match="1-D bytes-like"):
        store.put_parts(key, np.zeros((2, 2), np.uint8))
    cfg = ReplicateConfig()
    with pytest.raises(TypeError):
        cfg.replica_num = "2"
    with pytest.raises(TypeError):
        cfg.preferred_segments = "h:1"
    with pytest.raises(AttributeError):
        cfg.replicas = 2
    assert store.is_exist(key) == 0  # nothing was written
    assert store.close() == 0


def test_failures_return_codes_and_write_nothing(cluster, caplog):
    store = connected(cluster, segment=8 * MiB)
    buf = np.zeros(64 * 1024, np.uint8)
    assert store.register_buffer(addr(buf), buf.nbytes) == 0
    unregistered = np.zeros(4096, np.uint8)
    old = unique("old")
    assert store.put(old, b"first") == 0
    assert store.put(old, b"second") == 0  # write-once: 0, and the old value stays
    assert store.get(old) == b"first"
    new = unique("new")
    buf[:] = 0xAB
    caplog.set_level(logging.DEBUG, logger="ferry.compat.mooncake.store")
    cases = [
        (ms.INVALID_PARAMS, lambda: store.put(new, b"")),
        (ms.INVALID_PARAMS, lambda: store.put("", b"v")),
        (ms.INVALID_PARAMS, lambda: store.put_from(new, addr(unregistered), 4096)),
        (ms.INVALID_PARAMS, lambda: store.put_from(new, 0, 16)),
        (ms.INVALID_PARAMS, lambda: store.get_into(old, addr(buf), 2)),  # too small
        (ms.OBJECT_NOT_FOUND, lambda: store.get_into(unique("none"), addr(buf), 16)),
        (ms.OBJECT_NOT_FOUND, lambda: store.remove(unique("none"))),
        (ms.OBJECT_NOT_FOUND, lambda: store.get_size(unique("none"))),
        (ms.INVALID_PARAMS, lambda: store.register_buffer(addr(buf) + 8, 16)),  # overlaps
        (ms.INVALID_PARAMS, lambda: store.put(new, b"v", config=_config(replica_num=0))),
        (ms.INVALID_PARAMS, lambda: store.put(new, b"v", config=_config(replica_num=20))),
        (ms.INVALID_PARAMS, lambda: store.put_batch([new, new + "2"], [b"v"])),
        ([ms.INVALID_PARAMS] * 2,
         lambda: store.batch_put_from([new, new + "2"], [addr(buf)], [16, 16])),
        ([ms.INVALID_PARAMS],
         lambda: store.batch_put_from_multi_buffers([new], [[addr(buf), addr(buf)]], [[8]])),
        ([ms.INVALID_PARAMS] * 2,
         lambda: store.batch_put_from([new, new + "2"], [addr(buf), 0], [16, 16])),
        ([ms.INVALID_PARAMS],
         lambda: store.batch_put_from([new], [addr(buf)], [16], _config(group_ids=["a", "b"]))),
    ]
    for i, (code, call) in enumerate(cases):
        caplog.clear()
        assert call() == code, (i, store.last_error())
        assert store.last_error(), i
        records = [r for r in caplog.records if r.name == "ferry.compat.mooncake.store"]
        assert len(records) == 1 and records[0].getMessage() == store.last_error(), i
        assert store.is_exist(new) == 0 and store.is_exist(new + "2") == 0, i
        assert store.last_error() == ""  # the latest call succeeded
    assert (buf == 0xAB).all()  # refused reads left the destination alone
    assert store.get(unique("none")) == b"" and "-704" in store.last_error()
    assert store.get_batch([old, unique("none")]) == [b"first", b""]
    assert store.get_size(old) == 5
    assert store.close() == 0


def _config(**fields) -> ReplicateConfig:
    cfg = ReplicateConfig()
    for k, v in fields.items():
        setattr(cfg, k, v)
    return cfg


def test_not_set_up_and_refused_setups(cluster):
    store = MooncakeDistributedStore()
    assert store.put("k", b"v") == ms.INVALID_PARAMS and "not set up" in store.last_error()
    assert store.get("k") == b"" and store.is_exist("k") == ms.INVALID_PARAMS
    assert store.batch_is_exist(["a", "b"]) == [ms.INVALID_PARAMS] * 2
    assert store.register_buffer(4096, 16) == ms.INVALID_PARAMS
    assert store.health_check() == ms.HC_NOT_INITIALIZED and store.get_hostname() == ""
    assert store.remove_all() == ms.INVALID_PARAMS
    assert store.close() == 0

    # An etcd metadata server (no scheme: etcd, as Mooncake) is not needed either.
    for etcd in ("etcd://127.0.0.1:2379", "127.0.0.1:2379"):
        assert store.setup("127.0.0.1", etcd, 0, 0, "tcp", "", cluster.master) == 0
        assert store.close() == 0
    # Masters elected through etcd: one that does not answer fails the setup.
    assert store.setup("127.0.0.1", P2P, 0, 0, "tcp", "", "etcd://127.0.0.1:1") != 0
    assert "etcd" in store.last_error()
    assert store.setup("127.0.0.1", P2P, 0, 0, "carrier-pigeon", "",
                       cluster.master) == ms.INVALID_PARAMS
    # An HTTP metadata server (LMCache's MooncakeBackend default) is not needed.
    assert store.setup("localhost", "http://127.0.0.1:8080/metadata", 0, 0, "rdma", "mlx5_0",
                       cluster.master) == 0
    assert store.setup("localhost", P2P, 0, 0, "tcp", "", cluster.master) == ms.INVALID_PARAMS
    assert "already set up" in store.last_error()
    assert store.health_check() == ms.HC_HEALTHY
    assert store.close() == 0 and store.health_check() == ms.HC_NOT_INITIALIZED


def test_strict_raises_ferry_errors(cluster):
    store = MooncakeDistributedStore(strict=True)
    with pytest.raises(ferry.InvalidArgument, match="not set up"):
        store.put("k", b"v")
    with pytest.raises(ferry.InvalidArgument, match="etcd endpoint"):
        store.setup("127.0.0.1", P2P, 0, 0, "tcp", "", "etcd://nohostport/c")
    assert store.setup("127.0.0.1", P2P, 4 * MiB, 0, "tcp", "", cluster.master) == 0
    key = unique("strict")
    assert store.put(key, b"v") == 0 and store.put(key, b"w") == 0  # still write-once
    with pytest.raises(ferry.NotFound):
        store.get(unique("none"))
    buf = np.zeros(64, np.uint8)
    assert store.register_buffer(addr(buf), buf.nbytes) == 0
    with pytest.raises(ferry.NotFound):
        store.batch_get_into([key, unique("none")], [addr(buf), addr(buf) + 32], [16, 16])
    assert buf[:1].tobytes() == b"v"  # the other item was done
    assert store.remove(key) == 0
    store.close()


def test_no_space_is_200_and_hard_pins():
    """Hard-pinned values fill the only node, this client's: NO_AVAILABLE_HANDLE,
    which vLLM takes as "pause the stores"."""
    own = Cluster()
    try:
        own.start_master()
        store = MooncakeDistributedStore()
        assert store.setup("127.0.0.1", P2P, 4 * MiB, 0, "tcp", "", own.master) == 0
        cfg = _config(with_hard_pin=True)
        value = bytes(MiB)
        codes = [store.put(unique("pinned"), value, cfg) for _ in range(6)]  # more than fits
        assert codes[0] == 0 and codes[-1] == ms.NO_AVAILABLE_HANDLE, codes
        assert "ResourceExhausted" in store.last_error()
        assert store.remove_all(force=True) == codes.count(0)
        assert store.put(unique("after"), value) == 0
        assert store.close() == 0
    finally:
        own.close()


def metric(http_port: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return int(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_remove_of_a_leased_value_is_706():
    """A read in flight holds a lease: remove answers OBJECT_HAS_LEASE unless
    forced. The node holding the value is stopped (SIGSTOP) under the read; the
    master (Mooncake's flags: lease, metrics port) counts the reader's lookup."""
    own = Cluster()
    try:
        master = own.spawn(FERRY_BIN, "master", "--rpc_port", "0", "--metrics_port", "0",
                           "--default_kv_lease_ttl", "20s", "--eviction_high_watermark_ratio",
                           "0.9", "--client_ttl", "10")
        hello = master.json()
        own.master = hello["address"]
        node, _ = own.start_node(size="16MiB")
        own.wait_nodes(1)
        writer, reader = MooncakeDistributedStore(), MooncakeDistributedStore()
        for s in (writer, reader):  # pure clients: the bytes are on the node
            assert s.setup("127.0.0.1", P2P, 0, 0, "tcp", "", own.master) == 0
        key, value = unique("leased"), pattern(3, MiB).tobytes()
        assert writer.put(key, value) == 0
        gets = metric(hello["http_port"], "ferry_store_gets_total")
        result: list = []
        node.proc.send_signal(signal.SIGSTOP)
        try:
            t = threading.Thread(target=lambda: result.append(reader.get(key)))
            t.start()
            wait_until("the reader's lookup",
                       lambda: metric(hello["http_port"], "ferry_store_gets_total") > gets)
            assert writer.remove(key) == ms.OBJECT_HAS_LEASE
            assert "Busy" in writer.last_error()
            assert writer.batch_remove([key]) == [ms.OBJECT_HAS_LEASE]
            assert writer.remove(key, force=True) == 0
        finally:
            node.proc.send_signal(signal.SIGCONT)
        t.join(30)
        assert result == [value]  # the space waits for the lease: the read is whole
        assert writer.is_exist(key) == 0
        assert writer.close() == 0 and reader.close() == 0
    finally:
        own.close()


# Configuration.


def test_setup_from_config_file_and_environment(cluster, tmp_path, monkeypatch):
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({
        "local_hostname": "localhost", "metadata_server": P2P, "global_segment_size": "8mb",
        "local_buffer_size": "16 MB", "protocol": "TCP", "device_name": "",
        "master_server_address": cluster.master, "enable_ssd_offload": "false"}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    c = ms.MooncakeConfig.load_from_env()
    assert (c.global_segment_size, c.local_buffer_size, c.protocol) == (8 * MiB, 16 * MiB, "tcp")
    store = MooncakeDistributedStore()
    assert store.setup() == 0, store.last_error()
    assert store.put(unique("cfg"), b"v") == 0 and store.close() == 0

    monkeypatch.delenv("MOONCAKE_CONFIG_PATH")
    monkeypatch.setenv("MOONCAKE_MASTER", cluster.master)
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "rdma")
    c = ms.MooncakeConfig.load_from_env()
    assert (c.master_server_address, c.local_hostname, c.metadata_server) == (
        cluster.master, "localhost", P2P)
    assert c.global_segment_size == 4 << 30 and c.local_buffer_size == ms.DEFAULT_LOCAL_BUFFER_SIZE
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "0")
    assert store.setup() == 0, store.last_error()  # a pure client
    assert store.put(unique("env"), b"v") == 0 and store.close() == 0

    monkeypatch.delenv("MOONCAKE_MASTER")
    assert store.setup() == ms.INVALID_PARAMS and "MOONCAKE_MASTER" in store.last_error()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"local_hostname": "localhost", "metadata_server": P2P}))
    with pytest.raises(ValueError, match="master_server_address"):
        ms.MooncakeConfig.from_file(str(bad))
    assert [ms.parse_size(v) for v in ("4gb", "512 MB", "1.5g", 1024, "7")] == [
        4 << 30, 512 << 20, 3 << 29, 1024, 7]
    for v in ("lots", "-1mb", -5, True):
        with pytest.raises(ValueError):
            ms.parse_size(v)


def test_setup_dict(cluster, caplog):
    store = MooncakeDistributedStore()
    config = {"local_hostname": "127.0.0.1", "metadata_server": P2P,
              "global_segment_size": "8mb", "local_buffer_size": 16 * MiB, "protocol": "tcp",
              "rdma_devices": "", "master_server_addr": cluster.master, "no_such_key": 1}
    with caplog.at_level(logging.WARNING, logger="ferry.compat.mooncake.store"):
        assert store.setup(config) == 0, store.last_error()
    assert "no_such_key" in caplog.text  # Mooncake ignores it silently
    assert store.close() == 0
    # The config file's names for two of the keys are taken too.
    alias = {"local_hostname": "127.0.0.1", "metadata_server": P2P, "global_segment_size": 0,
             "device_name": "", "master_server_address": cluster.master}
    assert store.setup(alias) == 0 and store.close() == 0
    assert store.setup({"metadata_server": P2P}) == ms.INVALID_PARAMS
    assert "local_hostname" in store.last_error()


# Tensors: Mooncake's layout (docs/tensor-format.md).


def test_tensor_calls(cluster):
    store = connected(cluster, segment=8 * MiB)
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    key = unique("tensor")
    assert store.put_tensor(key, a) == 0
    assert store.put_tensor(key, a + 1) == 0  # write-once
    raw = store.get(key)
    # The header, field by field: magic, version, header size, dtype F32 (0), ndim,
    # layout FULL, flags, data offset, data bytes, then the shapes padded with -1.
    head = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, 0, 3, 0, 0, 304, a.nbytes)
    shapes = struct.pack("<8q8q", *(2, 3, 4), *(-1,) * 5, *(2, 3, 4), *(-1,) * 5)
    assert raw[:40] == head and raw[40:168] == shapes and raw[168:304] == bytes(136)
    assert raw[304:] == a.tobytes()
    assert np.array_equal(store.get_tensor(key), a)
    assert store.get_tensor(unique("none")) is None and "-704" in store.last_error()

    keys = [unique("bt"), unique("bt")]
    assert store.batch_put_tensor(keys, [a, a * 2]) == [0, 0]
    got = store.batch_get_tensor(keys + [unique("none")])
    assert np.array_equal(got[0], a) and np.array_equal(got[1], a * 2) and got[2] is None

    tp = unique("tp")
    assert store.put_tensor_with_tp(tp, a, tp_rank=1, tp_size=2, split_dim=2) == 0
    assert store.put_tensor_with_tp(tp, a, tp_rank=0, tp_size=2, split_dim=2) == 0
    assert np.array_equal(store.get_tensor_with_tp(tp, tp_rank=1, tp_size=2), a[:, :, 2:])
    assert store.put_tensor_with_tp(unique("tp"), a, tp_size=5, split_dim=0) == ms.INVALID_PARAMS

    buf = np.zeros(4096, np.uint8)
    assert store.register_buffer(addr(buf), buf.nbytes) == 0
    view = store.get_tensor_into(key, addr(buf), buf.nbytes)
    assert np.array_equal(view, a)
    view[0, 0, 0] = 100.0  # a view over the caller's buffer, as Mooncake returns
    assert np.frombuffer(buf[304:308].tobytes(), np.float32)[0] == 100.0
    views = store.batch_get_tensor_into([keys[1], unique("none")], [addr(buf), addr(buf) + 2048],
                                        [2048, 2048])
    assert np.array_equal(views[0], a * 2) and views[1] is None
    assert store.remove_all() >= 5 and store.is_exist(key) == 0 and store.close() == 0
