"""ferry.compat.mooncake's MooncakeDistributedStore against real `ferry master` and
`ferry node` processes: the call sequences of LMCache (mooncakestore:// connector
and MooncakeBackend), vLLM's MooncakeStoreConnector and SGLang's HiCache, written
from their public code, and `ferry master`'s Mooncake flag spellings. Bad input,
configuration and tensors: test_compat_mooncake_store_api.py."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
import uuid

import numpy as np
import pytest

import ferry
from conftest import addr, gpu_skip_reason, pattern
from ferry.compat import mooncake_store as ms
from ferry.compat.mooncake import (MooncakeDistributedStore, MooncakeHostMemAllocator,
                                   ReplicateConfig)
from store_cluster import module_cluster as cluster  # noqa: F401 (a fixture)
from store_cluster import (FERRY_BIN, P2P, MiB, cluster_skip_reason, connected,
                           needs_attach, unique)

pytestmark = [
    pytest.mark.skipif(not hasattr(ferry._ferry, "Store"),
                       reason="the extension was built without the store"),
    pytest.mark.skipif(cluster_skip_reason() is not None, reason=str(cluster_skip_reason())),
]


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
    assert err.count("--etcd_endpoints and --cluster_id mean nothing without --enable_ha") == 1, err
    assert err.count("no meaning in Ferry: --rpc_thread_num, --enable_offload") == 1, err


@pytest.mark.parametrize("args, message", [
    (["--default_kv_lease_ttl", "5x"], "bad duration unit"),
    (["--default_kv_lease_ttl", "0"], "must be 1 ms to 24 h"),
    (["--eviction_high_watermark_ratio", "1.5"], "between 0 and 1"),
    (["--eviction_ratio", "abc"], "not a number"),
    (["--client_ttl", "0"], "out of range"),
    (["--rpc_port", "70000"], "out of range"),
    (["--metrics_port", "x"], "not an integer"),
    (["--enable_ha"], "needs --etcd_endpoints"),
    (["--enable_ha=true", "--etcd_endpoints", "nohostport"], "etcd endpoint"),
    (["--enable_ha=true", "--etcd_endpoints", "h:1", "--etcd", "h:2"], "not both"),
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
