"""ferry.compat.mooncake's MooncakeDistributedStore against real `ferry master` and
`ferry node` processes: the call sequences of LMCache (mooncakestore:// connector
and MooncakeBackend), vLLM's MooncakeStoreConnector and SGLang's HiCache, written
from their public code; bad input; configuration; and `ferry master`'s Mooncake
flag spellings."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
import uuid

import numpy as np
import pytest

import ferry
from conftest import addr, gpu_skip_reason, pattern
from ferry.compat import mooncake_store as ms
from ferry.compat.mooncake import (MooncakeDistributedStore, MooncakeHostMemAllocator,
                                   ReplicateConfig)
from test_store import (FERRY_BIN, Cluster, attached_skip_reason, cluster_skip_reason,
                        wait_until)

MiB = 1 << 20
P2P = "P2PHANDSHAKE"

pytestmark = [
    pytest.mark.skipif(not hasattr(ferry._ferry, "Store"),
                       reason="the extension was built without the store"),
    pytest.mark.skipif(cluster_skip_reason() is not None, reason=str(cluster_skip_reason())),
]
needs_attach = pytest.mark.skipif(attached_skip_reason() is not None,
                                  reason=str(attached_skip_reason()))


@pytest.fixture(scope="module")
def cluster():
    """One master, and one node serving attached clients on its socket."""
    c = Cluster()
    c.start_master()
    c.node_socket = c.socket_path()
    if attached_skip_reason() is None:
        c.start_node("--socket", c.node_socket, size="64MiB")
        c.wait_nodes(1)
    yield c
    c.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def connected(cluster, segment: int = 32 * MiB, **kw) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore(**kw)
    assert s.setup("127.0.0.1", P2P, segment, 16 * MiB, "tcp", "", cluster.master) == 0, \
        s.last_error()
    return s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `ferry master` with Mooncake's flag spellings.


def test_master_takes_mooncake_flags():
    port = free_port()
    master = subprocess.Popen(
        [str(FERRY_BIN), "master", "--rpc_port", str(port), "--rpc_address", "127.0.0.1",
         "--default_kv_lease_ttl", "5s", "--eviction_high_watermark_ratio", "0.9",
         "-eviction_ratio=0.1", "--client_ttl", "10", "--metrics_port", "0",
         "--enable_ha=false", "--etcd_endpoints", "127.0.0.1:2379", "--rpc_thread_num", "4",
         "--enable_offload"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        hello = json.loads(master.stdout.readline())
        assert hello["address"] == f"127.0.0.1:{port}"
        assert hello["http_port"] > 0  # --metrics_port 0 picks one, as --http-port 0
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", P2P, 4 * MiB, 0, "tcp", "", hello["address"]) == 0
        assert s.put("k", b"served") == 0 and s.get("k") == b"served"
        assert s.close() == 0
    finally:
        master.terminate()
        _, err = master.communicate(timeout=30)
    # Reported once each: the flags with no meaning in Ferry, and those not there yet.
    assert err.count("--etcd_endpoints: not supported yet") == 1, err
    assert err.count("no meaning in Ferry: --rpc_thread_num, --enable_offload") == 1, err


@pytest.mark.parametrize("args, message", [
    (["--default_kv_lease_ttl", "5x"], "bad duration unit"),
    (["--default_kv_lease_ttl", "0"], "must be 1 ms to 24 h"),
    (["--eviction_high_watermark_ratio", "1.5"], "between 0 and 1"),
    (["--eviction_ratio", "abc"], "not a number"),
    (["--client_ttl", "0"], "out of range"),
    (["--rpc_port", "70000"], "out of range"),
    (["--metrics_port", "x"], "not an integer"),
    (["--enable_ha"], "not supported yet"),
    (["--enable_ha=true", "--etcd_endpoints", "h:2379"], "not supported yet"),
    (["--enable_ha=maybe"], "not a boolean"),
    (["--lease-ms", "100", "--default_kv_lease_ttl", "100"], "not both"),
])
def test_master_refuses_bad_mooncake_flags(args, message):
    r = subprocess.run([str(FERRY_BIN), "master", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
    assert r.stdout == ""


# LMCache.


def test_lmcache_mooncakestore_connector(cluster, tmp_path, monkeypatch):
    """lmcache/v1/storage_backend/connector/mooncakestore_connector.py: the config
    from MOONCAKE_CONFIG_PATH, setup with 7 positional arguments, one registered
    pinned buffer, is_exist as a bool, put_from of chunks, batch_get_into (n <= 0 a
    miss); with save_chunk_meta, put_parts(key, meta, kv) and batch_get_buffer."""
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({
        "local_hostname": "localhost", "metadata_server": P2P,
        "global_segment_size": 32 * MiB, "local_buffer_size": 16 * MiB, "protocol": "tcp",
        "device_name": "", "master_server_address": "127.0.0.1:1", "transfer_timeout": 1,
        "prefer_local_alloc": True}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    with open(os.environ["MOONCAKE_CONFIG_PATH"]) as f:
        config = json.load(f)
    config["master_server_address"] = cluster.master  # the mooncakestore://host:port URL

    store = MooncakeDistributedStore()
    rc = store.setup(config.get("local_hostname"), config.get("metadata_server"),
                     config.get("global_segment_size"), config.get("local_buffer_size"),
                     config.get("protocol"), config.get("device_name"),
                     config.get("master_server_address"))
    assert rc == 0, store.last_error()
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    if config["prefer_local_alloc"]:
        cfg.preferred_segment = store.get_hostname()
    assert cfg.preferred_segment.startswith("127.0.0.1:")

    chunk, chunks = 256 * 1024, 6
    pinned = np.zeros(2 * chunk * chunks, np.uint8)  # LMCache's pinned CPU buffer
    assert store.register_buffer(addr(pinned), pinned.nbytes) == 0
    keys = [unique(f"lmcache@model@{i}") for i in range(chunks)]
    src = pinned[:chunk * chunks].reshape(chunks, chunk)
    src[:] = pattern(1, src.size).reshape(src.shape)
    for i, key in enumerate(keys):
        assert not store.is_exist(key)
        assert store.put_from(key, addr(src[i]), chunk, cfg) == 0
        assert store.is_exist(key)
    dst = pinned[chunk * chunks:].reshape(chunks, chunk)
    wanted = keys[::2] + [unique("lmcache@missing")]
    reads = store.batch_get_into(wanted, [addr(dst[i]) for i in range(len(wanted))],
                                 [chunk] * len(wanted))
    assert reads[:-1] == [chunk] * (len(wanted) - 1) and reads[-1] <= 0
    assert reads[-1] == ms.OBJECT_NOT_FOUND
    for j, i in enumerate(range(0, chunks, 2)):
        assert np.array_equal(dst[j], src[i])

    # save_chunk_meta=True: a 28-byte RemoteMetadata, then the KV bytes.
    meta = struct.pack("<7i", 1, 2, 3, 4, 5, 6, 7)
    legacy = unique("lmcache@legacy")
    assert store.put_parts(legacy, meta, src[0], config=cfg) == 0
    handles = store.batch_get_buffer([legacy, unique("lmcache@none")])
    assert handles[1] is None
    view = memoryview(handles[0])
    assert handles[0].size() == len(view) == 28 + chunk and handles[0].ptr() != 0
    assert bytes(view[:28]) == meta and bytes(view[28:]) == src[0].tobytes()

    assert store.unregister_buffer(addr(pinned)) == 0
    assert store.close() == 0


def test_lmcache_mooncake_backend(cluster):
    """lmcache/v1/storage_backend/mooncake_backend.py: batch_is_exist, one
    batch_put_from per batch of chunks, is_exist == 1, then get_into and
    batch_get_into into full-chunk buffers (a partial chunk is known by its size)."""
    store = connected(cluster)
    chunk = 128 * 1024
    sizes = [chunk, chunk, chunk // 3]  # the last chunk of a request is partial
    src = np.frombuffer(pattern(2, sum(sizes)).tobytes(), np.uint8).copy()
    dst = np.zeros(len(sizes) * chunk, np.uint8)
    for buf in (src, dst):
        assert store.register_buffer(addr(buf), buf.nbytes) == 0
    keys = [unique(f"vllm@backend@{i}") for i in range(len(sizes))]
    assert store.batch_is_exist(keys) == [0, 0, 0]
    offsets = np.cumsum([0] + sizes[:-1]).tolist()
    assert store.batch_put_from(keys, [addr(src) + o for o in offsets], sizes,
                                ReplicateConfig()) == [0, 0, 0]
    assert all(store.is_exist(k) == 1 for k in keys)
    assert store.batch_is_exist(keys) == [1, 1, 1]

    assert store.get_into(keys[2], addr(dst), chunk) == sizes[2]
    assert dst[:sizes[2]].tobytes() == src[offsets[2]:].tobytes()
    dst[:] = 0
    got = store.batch_get_into(keys, [addr(dst) + i * chunk for i in range(3)], [chunk] * 3)
    assert got == sizes
    for i, (o, n) in enumerate(zip(offsets, sizes)):
        assert dst[i * chunk:i * chunk + n].tobytes() == src[o:o + n].tobytes()
    assert not dst[2 * chunk + sizes[2]:].any()  # past the partial chunk: untouched
    assert store.close() == 0


# vLLM.


def vllm_key(block_hash: str, rank: int = 0) -> str:
    # vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/data.py PoolKey
    return f"Qwen/Qwen3-8B@tp_rank:{rank}@pcp0@dcp0@pp_rank:0@group:0@{block_hash}"


def vllm_sequence(store: MooncakeDistributedStore, layers: list, block_bytes: int,
                  blocks: int, fill, read) -> None:
    """The connector's save (batch_is_exist, then batch_put_from_multi_buffers of
    the blocks not stored, one pointer per layer) and load
    (batch_get_into_multi_buffers), then remove_all(force=True). `layers` are
    (address, nbytes, keepalive); fill(i, seed) writes layer i, read(i) returns
    its bytes."""
    for i, (ptr, n, _) in enumerate(layers):
        assert store.register_buffer(ptr, n) == 0, store.last_error()
        fill(i, 10 + i)
    want = [read(i) for i in range(len(layers))]
    keys = [vllm_key(uuid.uuid4().hex) for _ in range(blocks)]

    def block_ptrs(b: int) -> list[int]:
        return [ptr + b * block_bytes for ptr, _, _ in layers]

    def save(block_ids: list[int]) -> list[int]:
        ks = [keys[b] for b in block_ids]
        exists = store.batch_is_exist(ks)
        todo = [i for i, e in enumerate(exists) if e != 1]
        if not todo:
            return []
        res = store.batch_put_from_multi_buffers(
            [ks[i] for i in todo], [block_ptrs(block_ids[i]) for i in todo],
            [[block_bytes] * len(layers) for _ in todo], ReplicateConfig())
        return res

    assert save([0, 1]) == [0, 0]
    assert save([0, 1, 2, 3]) == [0, 0]  # blocks 0 and 1 de-duplicated
    assert save(list(range(blocks))) == []
    for i in range(len(layers)):
        fill(i, 99)  # overwritten before the load
    got = store.batch_get_into_multi_buffers(keys, [block_ptrs(b) for b in range(blocks)],
                                             [[block_bytes] * len(layers)] * blocks)
    assert got == [block_bytes * len(layers)] * blocks, store.last_error()
    assert [read(i) for i in range(len(layers))] == want
    assert store.remove_all(force=True) == blocks
    assert store.batch_is_exist(keys) == [0] * blocks
    for ptr, _, _ in layers:
        assert store.unregister_buffer(ptr) == 0


def test_vllm_mooncake_store_connector_host(cluster):
    store = connected(cluster)
    block_bytes, blocks = 16 * 1024, 4
    arrays = [np.zeros(block_bytes * blocks, np.uint8) for _ in range(3)]

    def fill(i, seed):
        arrays[i][:] = pattern(seed, arrays[i].size)

    vllm_sequence(store, [(addr(a), a.nbytes, a) for a in arrays], block_bytes, blocks, fill,
                  lambda i: arrays[i].tobytes())
    assert store.close() == 0


@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
def test_vllm_mooncake_store_connector_gpu(cluster):
    """register_buffer on GPU KV-cache memory (one tensor per layer), as vLLM does."""
    import torch

    store = connected(cluster)
    block_bytes, blocks = 16 * 1024, 4
    layers = [torch.zeros(block_bytes * blocks, dtype=torch.uint8, device="cuda")
              for _ in range(3)]

    def fill(i, seed):
        layers[i].copy_(torch.from_numpy(pattern(seed, layers[i].numel())).cuda())
        torch.cuda.synchronize()  # vLLM waits on its event before the put

    def read(i):
        torch.cuda.synchronize()
        return layers[i].cpu().numpy().tobytes()

    vllm_sequence(store, [(t.data_ptr(), t.numel(), t) for t in layers], block_bytes, blocks,
                  fill, read)
    assert store.close() == 0


# SGLang.


def sglang_warmup(store: MooncakeDistributedStore) -> None:
    key = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex
    value = bytes(4 * 1024)
    for _ in range(10):
        if store.put(key, value) == 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"warm-up put failed: {store.last_error()}")
    assert store.is_exist(key) == 1
    assert store.get(key) == value


def sglang_set_get(store: MooncakeDistributedStore, pool_ptr: int, pool: np.ndarray,
                   page_bytes: int) -> None:
    """batch_set_v1 for MHA (keys {hash}_{tp}_k and _v), then batch_get_v1."""
    pages = 4
    hashes = [uuid.uuid4().hex for _ in range(pages)]
    keys = [f"{h}_0_{kv}" for h in hashes for kv in ("k", "v")]
    ptrs = [pool_ptr + i * page_bytes for i in range(len(keys))]
    sizes = [page_bytes] * len(keys)
    pool[:len(keys) * page_bytes] = pattern(5, len(keys) * page_bytes)
    want = pool[:len(keys) * page_bytes].copy()

    def batch_set(indices: list[int]) -> list[bool]:
        ks = [keys[i] for i in indices]
        exist = store.batch_is_exist(ks)
        results = [0 if e == 1 else -1 for e in exist]
        missing = [i for i, e in enumerate(exist) if e != 1]
        if missing:
            put = store.batch_put_from([ks[i] for i in missing],
                                       [ptrs[indices[i]] for i in missing],
                                       [sizes[indices[i]] for i in missing])
            for i, r in zip(missing, put):
                results[i] = r
        return [all(r == 0 for r in results[i:i + 2]) for i in range(0, len(results), 2)]

    assert batch_set([0, 1, 2, 3]) == [True, True]
    assert batch_set(list(range(len(keys)))) == [True] * pages  # pages 0, 1 exist
    pool[:len(keys) * page_bytes] = 0
    got = store.batch_get_into(keys, ptrs, sizes)
    assert all(n > 0 for n in got), (got, store.last_error())
    assert np.array_equal(pool[:len(keys) * page_bytes], want)
    missing = store.batch_get_into([f"{uuid.uuid4().hex}_0_k"], ptrs[:1], sizes[:1])
    assert not missing[0] > 0


def test_sglang_hicache_setup(cluster):
    """mooncake_store.py's normal set-up: setup(..., transfer_engine, **kwargs),
    retried without the keyword arguments a TypeError names."""
    store = MooncakeDistributedStore()
    setup_kwargs = {"enable_client_http_server": True, "client_http_port": 9300,
                    "ssd_offload_path": "", "a_newer_mooncake_option": 1}
    while True:
        try:
            rc = store.setup("localhost", P2P, 32 * MiB, 16 * MiB, "tcp", "",
                             cluster.master, None, **setup_kwargs)
            break
        except TypeError as e:
            unsupported = [k for k in list(setup_kwargs) if k in str(e)]
            assert unsupported == ["a_newer_mooncake_option"], e
            for k in unsupported:
                setup_kwargs.pop(k)
    assert rc == 0, store.last_error()
    sglang_warmup(store)
    page_bytes = 8 * 1024
    pool = np.zeros(16 * page_bytes, np.uint8)
    assert store.register_buffer(addr(pool), pool.nbytes) == 0
    sglang_set_get(store, addr(pool), pool, page_bytes)
    store.remove_all()  # clear()
    assert store.remove_all() == 0
    assert store.close() == 0


@needs_attach
@pytest.mark.parametrize("pool_from", ["before_setup", "store"])
def test_sglang_hicache_standalone(cluster, pool_from):
    """Standalone storage: the host pool from MooncakeHostMemAllocator, then
    setup_dummy(required_bytes, 16 MiB, the node), register_buffer on the pool.
    SGLang allocates the pool before setup_dummy; with the store given, the
    allocator's memory is the node's shared memory (no copy)."""
    page_bytes = 8 * 1024
    required = 16 * page_bytes
    store = MooncakeDistributedStore()
    if pool_from == "before_setup":
        allocator = MooncakeHostMemAllocator()
        ptr = allocator.alloc(required)
        assert ptr != 0
    assert store.setup_dummy(required, 16 * MiB, cluster.node_socket) == 0, store.last_error()
    if pool_from == "store":
        allocator = MooncakeHostMemAllocator(store)
        ptr = allocator.alloc(required)
        assert ptr != 0
    pool = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * required).from_address(ptr))
    sglang_warmup(store)
    assert store.register_buffer(ptr, required) == 0, store.last_error()
    assert store.get_hostname() != ""
    sglang_set_get(store, ptr, pool, page_bytes)
    assert store.remove_all() >= 8
    assert store.unregister_buffer(ptr) == 0
    del pool
    assert allocator.free(ptr) == 0 and allocator.free(ptr) == -1
    assert store.close() == 0


def test_setup_dummy_refuses_a_host_port(cluster):
    store = MooncakeDistributedStore()
    assert store.setup_dummy(0, 16 * MiB, "127.0.0.1:50052") == ms.INVALID_PARAMS
    assert "ferry node --socket" in store.last_error()
    missing = os.path.join(cluster.dir, "no-such.sock")
    assert store.setup_dummy(0, 16 * MiB, missing) == ms.RPC_FAIL  # Unavailable
    assert "Unavailable" in store.last_error()


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

    etcd = store.setup("127.0.0.1", "etcd://127.0.0.1:2379", 0, 0, "tcp", "", cluster.master)
    assert etcd == ms.INVALID_PARAMS and "cluster mode" in store.last_error()
    assert store.setup("127.0.0.1", "127.0.0.1:2379", 0, 0, "tcp", "",
                       cluster.master) == ms.INVALID_PARAMS  # no scheme: etcd, as Mooncake
    assert store.setup("127.0.0.1", P2P, 0, 0, "tcp", "",
                       "etcd://127.0.0.1:2379") == ms.INVALID_PARAMS
    assert "cluster mode" in store.last_error()
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
    with pytest.raises(ferry.InvalidArgument, match="cluster mode"):
        store.setup("127.0.0.1", "etcd://h:2379", 0, 0, "tcp", "", cluster.master)
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
