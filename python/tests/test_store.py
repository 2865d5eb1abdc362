"""ferry.Store embedded (master and node in this process): round trips, bad input,
batches, pins and multi-buffer objects; the attached forms of the last checks too.
test_store_attached.py runs `ferry master`, `ferry node` and attached clients."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ferry
from conftest import gpu_skip_reason, pattern
from store_cluster import MiB, needs_attach

pytestmark = pytest.mark.skipif(
    not hasattr(ferry._ferry, "Store"),
    reason="the extension was built without the store (python/build-ext.sh found no "
    "libferry_store.a)")


@pytest.fixture
def store():
    with ferry.Store(local_memory=192 * MiB) as s:
        yield s


@pytest.mark.parametrize("size", [1, 4096, MiB, 64 * MiB])
def test_put_get_round_trip(store, size):
    data = pattern(size, size)
    store.put("np", data)
    store.put("bytes", data.tobytes())
    assert store.get("np") == data.tobytes()
    assert store.get("bytes") == data.tobytes()


@pytest.mark.parametrize("size", [1, 4096, MiB, 64 * MiB])
@pytest.mark.parametrize("kind", ["allocated", "numpy"])
def test_put_from_get_into_round_trip(store, size, kind):
    if kind == "allocated":
        src, dst = store.allocate_buffer(size), store.allocate_buffer(size)
        assert not dst.readonly and dst.nbytes == size
    else:
        src, dst = np.empty(size, np.uint8), np.zeros(size, np.uint8)
        store.batch_register_buffer([src, dst])
    np.frombuffer(src, np.uint8)[:] = pattern(size + 1, size)
    store.put_from("k", src)
    assert store.get_into("k", dst) == size
    assert bytes(dst) == bytes(src)
    assert store.get("k") == bytes(src)
    store.batch_unregister_buffer([src, dst])
    with pytest.raises(ferry.InvalidArgument):
        store.get_into("k", dst)  # no longer registered


def test_puts_with_and_without_reserved_space_round_trip():
    with pytest.raises(ferry.InvalidArgument):
        ferry.Store(local_memory=4 * MiB, reserve_bytes=-1)
    for reserve in (0, None):
        with ferry.Store(local_memory=16 * MiB, reserve_bytes=reserve) as s:
            # The same shape again and again: with reservations, from the
            # second put on each commits space reserved for it.
            for i in range(20):
                s.batch_put([f"k{i}_{j}" for j in range(4)],
                            [pattern(i * 4 + j, 4096) for j in range(4)])
            for i in range(20):
                assert s.get(f"k{i}_3") == pattern(i * 4 + 3, 4096).tobytes()
            with pytest.raises(ferry.AlreadyExists):
                s.put("k0_0", b"x" * 4096)  # a taken key fails, reserved or not


def test_allocated_memory_outlives_the_store():
    s = ferry.Store(local_memory=4 * MiB)
    view = s.allocate_buffer(MiB)
    arr = np.frombuffer(view, np.uint8)
    arr[:] = 7
    s.put_from("k", view)
    s.close()
    del s
    gc.collect()
    arr[-1] = 8  # still mapped: the memoryview holds the Memory
    assert arr[0] == 7 and arr[-1] == 8 and view.nbytes == MiB


def test_batch_forms(store):
    sizes = [1, 100, 4096, MiB]
    values = [pattern(i, n) for i, n in enumerate(sizes)]
    kinds = [values[0].tobytes(), bytearray(values[1]), memoryview(values[2]), values[3]]
    keys = [f"b{i}" for i in range(len(sizes))]
    assert store.batch_put(keys, kinds) == [None] * len(keys)

    got = store.batch_get(keys + ["missing"])
    assert got[:-1] == [v.tobytes() for v in values]
    assert isinstance(got[-1], ferry.NotFound)
    assert store.batch_exists(keys + ["missing"]) == [True] * len(keys) + [False]

    # Slices of one allocated buffer; one destination too small for its value.
    area = store.allocate_buffer(4 * MiB)
    dsts = [area[i * MiB:(i + 1) * MiB] for i in range(4)]
    dsts[2] = area[2 * MiB:2 * MiB + 10]
    got = store.batch_get_into(keys, dsts)
    assert got[0] == 1 and got[1] == 100 and got[3] == MiB
    assert isinstance(got[2], ferry.OutOfRange)
    assert bytes(dsts[0][:1]) == values[0].tobytes() and bytes(dsts[3]) == values[3].tobytes()

    out_keys = ["from0", "from1", "b0"]  # the last exists already
    res = store.batch_put_from(out_keys, [area[:MiB], area[MiB:MiB + 100], area[:5]])
    assert res[:2] == [None, None] and isinstance(res[2], ferry.AlreadyExists)
    assert store.get("from1") == values[1].tobytes()

    assert store.batch_pin(keys, "soft", ttl=60) == [None] * len(keys)
    assert store.batch_pin(keys, None) == [None] * len(keys)
    res = store.batch_remove(keys + ["missing"])
    assert res[:-1] == [None] * len(keys) and isinstance(res[-1], ferry.NotFound)
    assert store.batch_exists(keys) == [False] * len(keys)
    assert store.batch_exists(["from0"]) == [True]


def test_exists_remove_pin(store):
    assert not store.exists("k")
    store.put("k", b"v")
    assert store.exists("k")
    store.pin("k")
    store.pin("k", "soft", ttl=30)
    store.pin("k", None)
    with pytest.raises(ferry.NotFound):
        store.pin("unknown")
    with pytest.raises(ferry.InvalidArgument):
        store.pin("k", "sticky")
    store.remove("k")
    assert not store.exists("k")
    with pytest.raises(ferry.NotFound):
        store.remove("k")
    store.put("k", b"again")  # the key is free once removed
    assert store.get("k") == b"again"


def test_hard_pins_survive_eviction():
    with ferry.Store(local_memory=16 * MiB) as s:
        value = pattern(1, 4 * MiB)
        s.put("pinned", value, pin="hard")
        for i in range(12):  # three times what fits: the others get evicted
            s.put(f"filler{i}", pattern(i + 2, 4 * MiB))
        assert s.get("pinned") == value.tobytes()
        assert not all(s.batch_exists([f"filler{i}" for i in range(12)]))
        # With every byte pinned, nothing is evictable.
        pinned = ["pinned"]
        for i in range(3):
            err = s.batch_put([f"more{i}"], [pattern(20 + i, 4 * MiB)], pin="hard")[0]
            if err is not None:
                assert isinstance(err, ferry.ResourceExhausted)
                break
            pinned.append(f"more{i}")
        with pytest.raises(ferry.ResourceExhausted):
            s.put("one-too-many", pattern(30, 4 * MiB), pin="hard")
        assert s.batch_exists(pinned) == [True] * len(pinned)


def test_stats(store):
    st = store.stats()
    assert st == {"capacity": 192 * MiB, "used": 0, "nodes": 1, "objects": 0}
    store.batch_put(["s1", "s2", "s3"], [b"x" * 1000, b"y" * 4096, b"z"])
    st = store.stats()
    assert st["objects"] == 3 and st["nodes"] == 1
    assert 1000 + 4096 + 1 <= st["used"] <= st["capacity"]
    store.remove("s2")
    assert store.stats()["objects"] == 2


def test_bad_input_leaves_the_store_working(store):
    kept = {f"kept{i}": pattern(100 + i, 4096 * (i + 1)).tobytes() for i in range(4)}
    for k, v in kept.items():
        store.put(k, v)

    def still_working():
        assert store.batch_get(list(kept)) == list(kept.values())

    registered = np.zeros(8192, np.uint8)
    store.register_buffer(registered)
    unregistered = np.zeros(8192, np.uint8)
    small = registered[:100]
    registered[:] = 0xAB
    cases = [
        (ferry.InvalidArgument, lambda: store.put("", b"v")),
        (ferry.InvalidArgument, lambda: store.put(b"k" * 1025, b"v")),
        (ferry.InvalidArgument, lambda: store.get("k" * 1025)),
        (ferry.InvalidArgument, lambda: store.put("empty", b"")),
        (ferry.InvalidArgument, lambda: store.put("empty", np.zeros(0, np.uint8))),
        (ferry.NotFound, lambda: store.get("unknown")),
        (ferry.NotFound, lambda: store.get_into("unknown", registered)),
        (ferry.InvalidArgument, lambda: store.get_into("kept1", unregistered)),
        (ferry.InvalidArgument, lambda: store.put_from("new", unregistered)),
        (ferry.OutOfRange, lambda: store.get_into("kept1", small)),
        (ferry.AlreadyExists, lambda: store.put("kept0", b"other")),
        (ferry.InvalidArgument, lambda: store.put(42, b"v")),
        (ferry.InvalidArgument, lambda: store.get(bytearray(b"kept0"))),
        (ferry.InvalidArgument, lambda: store.exists(None)),
        (ferry.InvalidArgument, lambda: store.put("k", "a str is not bytes")),
        (ferry.InvalidArgument, lambda: store.batch_put(["a", "b"], [b"1"])),
        (ferry.InvalidArgument, lambda: store.batch_get_into(["a"], [])),
        (ferry.InvalidArgument, lambda: store.put("k", b"v", replicas=0)),
        (ferry.Unavailable, lambda: store.put("k", b"v", replicas=2)),  # one node: for now
        (ferry.AlreadyExists, lambda: store.register_buffer(registered[10:20])),
    ]
    for i, (error, call) in enumerate(cases):
        with pytest.raises(error):
            call()
        still_working()
        # Nothing half-written: a failed put left its key free.
        assert not store.exists("empty") and not store.exists("new"), i
    # The destination of a refused get_into is untouched.
    assert (registered == 0xAB).all() and (unregistered == 0).all()
    store.put("k" * 1024, b"longest key")  # the limit itself is fine
    assert store.get("k" * 1024) == b"longest key"
    assert isinstance(store.batch_put(["", "ok"], [b"v", b"v"])[0], ferry.InvalidArgument)
    assert store.get("ok") == b"v"


def test_closed_store_raises():
    s = ferry.Store(local_memory=4 * MiB)
    s.put("k", b"v")
    s.close()
    s.close()  # idempotent
    with pytest.raises(ferry.InvalidArgument, match="closed"):
        s.get("k")
    with pytest.raises(ferry.InvalidArgument, match="closed"):
        s.segment


def test_str_and_bytes_keys_are_one_key(store):
    store.put("k", b"from str")
    assert store.get(b"k") == b"from str"
    with pytest.raises(ferry.AlreadyExists):
        store.put(b"k", b"from bytes")
    store.put("ключ", b"utf-8")
    assert store.get("ключ".encode()) == b"utf-8"
    assert store.batch_exists([b"k", "k", "ключ"]) == [True, True, True]
    store.remove(b"k")
    assert not store.exists("k")


def multi_round_trip(s: ferry.Store, prefix: str) -> None:
    """One object from several buffers of uneven sizes, read back split elsewhere."""
    sizes = [100, MiB, 3, 5 * MiB]
    total = sum(sizes)
    src = np.frombuffer(s.allocate_buffer(total), np.uint8)
    src[:] = np.random.default_rng(7).integers(0, 256, total, dtype=np.uint8)
    dst = np.frombuffer(s.allocate_buffer(total + 5), np.uint8)
    parts, off = [], 0
    for n in sizes:
        parts.append(src[off:off + n])
        off += n
    assert s.batch_put_from_multi([prefix + "m"], [parts]) == [None]
    dst[:] = 0
    third = total // 3
    assert s.batch_get_into_multi([prefix + "m"], [[dst[:third], dst[third:]]]) == [total]
    assert np.array_equal(dst[:total], src)
    # put_parts copies from any host memory, with no concatenation in Python.
    s.put_parts(prefix + "p", [bytes(p) for p in parts])
    assert s.get(prefix + "p") == src.tobytes()
    # Too little room: OutOfRange, and the buffers untouched.
    dst[:] = 0xEE
    out = s.batch_get_into_multi([prefix + "m"], [[dst[:10], dst[10:total - 1]]])
    assert isinstance(out[0], ferry.OutOfRange)
    assert (dst == 0xEE).all()
    # A part in memory the store does not know: refused, nothing stored.
    out = s.batch_put_from_multi([prefix + "x"], [[parts[0], np.zeros(10, np.uint8)]])
    assert isinstance(out[0], ferry.InvalidArgument)
    assert not s.exists(prefix + "x")


def test_multi_buffer_objects_embedded(store):
    multi_round_trip(store, "embedded/")


@needs_attach
def test_multi_buffer_objects_attached(cluster):
    cluster.start_master()
    path = cluster.socket_path()
    cluster.start_node("--socket", path)
    with ferry.Store.attach(path) as s:
        multi_round_trip(s, "attached/")


@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
def test_registered_gpu_memory_follows_the_current_stream():
    """vLLM's pattern on an embedded store: a registered GPU KV cache, one object
    per block from a pointer per layer, written by a kernel still running on a
    side stream that the current stream has joined; no synchronize before the put."""
    import torch

    layers, block = 4, 1 << 20
    with ferry.Store(local_memory=64 << 20) as s:
        kv = torch.zeros(layers, 8, block, dtype=torch.uint8, device="cuda")
        s.register_buffer(kv)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # the producer is still busy at the put
            kv[:, 3].fill_(0x3C)
        torch.cuda.current_stream().wait_stream(side)
        assert s.batch_put_from_multi(["block3"], [[kv[l, 3] for l in range(layers)]]) == [None]
        back = torch.empty(layers, block, dtype=torch.uint8, device="cuda")
        s.register_buffer(back)
        # The read lands after work already queued on the current stream.
        torch.cuda._sleep(50_000_000)
        back.fill_(0)
        assert s.batch_get_into_multi(["block3"], [[back[l] for l in range(layers)]]) == [
            layers * block]
        assert bool((back == 0x3C).all())
        # The same value read back to the host.
        assert s.get("block3") == bytes([0x3C]) * (layers * block)


def expect_prefix_checks(s: ferry.Store) -> None:
    """A get with expect= reads only a value that begins with those bytes, and
    leaves the buffers untouched otherwise."""
    s.put("ex", b"HEADER" + bytes(range(200)))
    head, body = s.allocate_buffer(6), np.zeros(200, np.uint8)
    assert s.batch_get_into_parts(["ex"], [[head, body]], expect=b"HEADER") == [206]
    assert bytes(head) == b"HEADER" and bytes(body) == bytes(range(200))
    body[:] = 7
    out = s.batch_get_into_parts(["ex"], [[head, body]], expect=b"HEADEX")
    assert isinstance(out[0], ferry.InvalidArgument) and "expected bytes" in str(out[0])
    assert (body == 7).all()


def test_get_with_expected_prefix_embedded(store):
    expect_prefix_checks(store)


@needs_attach
def test_get_with_expected_prefix_attached(cluster):
    cluster.start_master()
    path = cluster.socket_path()
    cluster.start_node("--socket", path)
    with ferry.Store.attach(path) as s:
        expect_prefix_checks(s)


def test_remove_all(store):
    for i in range(5):
        store.put(f"ra/{i}", b"x" * 10)
    store.get("ra/0")  # its lease ends right after the read
    assert store.remove_all() == 5
    assert store.stats()["objects"] == 0
    assert store.remove_all(force=True) == 0


def test_cluster_secret(tmp_path):
    key = tmp_path / "key"
    key.write_bytes(b"this cluster's secret: 32 bytes!\n")
    key.chmod(0o600)
    with ferry.Store(local_memory=8 << 20, auth_key_file=str(key)) as owner:
        owner.put("k", b"proved")
        assert owner.get("k") == b"proved"
        # A pure client of its master without the secret is refused.
        with ferry.Store(owner.master_address, local_memory=0) as stranger:
            with pytest.raises(ferry.Unauthenticated, match="cluster secret"):
                stranger.get("k")
    key.chmod(0o640)
    with pytest.raises(ferry.InvalidArgument, match="group or others"):
        ferry.Store(local_memory=8 << 20, auth_key_file=str(key))
