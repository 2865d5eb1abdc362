"""ferry.TransferEngine against a real target process, over tcp and shm."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
import weakref

import numpy as np
import pytest

import ferry
from conftest import pattern, sha

SIZE = 1 << 20


def local_buffer(kind: str, nbytes: int = SIZE):
    return np.zeros(nbytes, np.uint8) if kind == "numpy" else bytearray(nbytes)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("local_kind", ["numpy", "bytearray"])
@pytest.mark.parametrize("remote_kind", ["numpy", "bytearray", "managed"])
def test_round_trip(spawn_peer, transport, local_kind, remote_kind):
    peer = spawn_peer("--transport", transport, "--size", str(SIZE))
    with ferry.TransferEngine(transport=transport) as engine:
        seg = engine.open_segment(peer.name)
        remote = peer.buffers[remote_kind]
        src = local_buffer(local_kind)
        np.frombuffer(src, np.uint8)[:] = pattern(1, SIZE)

        engine.write(seg, src, remote)
        assert peer.digest(remote_kind, 0, SIZE) == sha(src)

        peer.fill(remote_kind, 2)
        dst = local_buffer(local_kind)
        engine.read(seg, dst, remote)
        assert sha(dst) == sha(pattern(2, SIZE))

        # The handle form reports which transport served the request.
        with engine.read_async(seg, dst, remote + 4096, length=4096) as handle:
            assert handle.wait(30)
            assert handle.results()[0] == (True, None, transport)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_batched_sync_and_async(spawn_peer, transport):
    peer = spawn_peer("--transport", transport, "--size", str(SIZE))
    engine = ferry.TransferEngine(transport=transport)
    seg = engine.open_segment(peer.name)
    base = peer.buffers["numpy"]
    chunk = SIZE // 8
    data = pattern(3, SIZE)
    # Alternate numpy views and bytearrays within one batch.
    parts = [data[i * chunk:(i + 1) * chunk] if i % 2 else bytearray(data[i * chunk:(i + 1) * chunk])
             for i in range(8)]

    async def write_all():
        handle = engine.submit([ferry.Write(p, seg, base + i * chunk) for i, p in enumerate(parts)])
        await handle
        return handle

    handle = asyncio.run(write_all())
    assert handle.poll() == (8, 8, 0) and handle.done()
    assert all(r.done and r.error is None for r in handle.results())
    assert peer.digest("numpy", 0, SIZE) == sha(data)

    back = [np.zeros(chunk, np.uint8) for _ in range(8)]
    engine.transfer([ferry.Read(b, seg, base + i * chunk) for i, b in enumerate(back)])
    assert sha(np.concatenate(back)) == sha(data)

    # wait(0) polls; wait(None) returns by the request deadline at the latest.
    handle = engine.submit([ferry.Read(b, seg, base) for b in back[:1]], timeout=10)
    handle.wait(0)
    assert handle.wait()
    assert sha(back[0]) == sha(data[:chunk])


def test_handle_keeps_buffers_alive(spawn_peer):
    peer = spawn_peer("--transport", "tcp")
    engine = ferry.TransferEngine(transport="tcp")
    data = pattern(4, SIZE)
    src = data.copy()
    alive = weakref.ref(src)
    handle = engine.write_async(peer.name, src, peer.buffers["numpy"])
    del src
    gc.collect()
    assert alive() is not None, "the handle must keep the source buffer alive"
    assert handle.wait(30)
    handle.close()
    gc.collect()
    assert alive() is None, "closing the handle releases the buffer"
    assert peer.digest("numpy", 0, SIZE) == sha(data)


def test_bad_input_raises_and_loses_nothing(spawn_peer):
    peer = spawn_peer("--transport", "tcp")
    engine = ferry.TransferEngine(transport="tcp", request_timeout=10)
    seg = engine.open_segment(peer.name)
    remote = peer.buffers["numpy"]
    data = pattern(5, SIZE)
    engine.write(seg, data, remote)

    # Rejected before anything moves: the range is not registered there.
    with pytest.raises(ferry.OutOfRange, match="not inside one registered buffer"):
        engine.write(seg, data[:4096], remote + SIZE - 2048)
    with pytest.raises(ferry.OutOfRange):
        engine.read(seg, np.zeros(16, np.uint8), 0x1000)
    # Rejected before anything moves.
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        engine.read(seg, b"immutable", remote)
    with pytest.raises(ferry.InvalidArgument, match="contiguous"):
        engine.write(seg, np.zeros((64, 64), np.uint8)[:, ::2], remote)
    with pytest.raises(ferry.InvalidArgument, match="within"):
        engine.write(seg, bytearray(16), remote, length=17)
    with pytest.raises(ferry.InvalidArgument, match="within"):
        engine.write(seg, bytearray(16), remote, length=0)
    with pytest.raises(ferry.InvalidArgument, match="cannot transfer a str"):
        engine.write(seg, "text", remote)
    with pytest.raises(ferry.InvalidArgument, match="empty batch"):
        engine.submit([])
    with pytest.raises(ferry.InvalidArgument, match="remote"):
        engine.write(seg, bytearray(16), -5)
    with pytest.raises(ferry.InvalidArgument):
        engine.open_segment("no port here")
    with pytest.raises(ferry.Unavailable):
        ferry.TransferEngine(connect_timeout=2).open_segment("127.0.0.1:1")
    with pytest.raises(ferry.NotFound):
        engine.write(12345, bytearray(16), remote)
    # Registration errors leave the first registration in place.
    mine = np.zeros(4096, np.uint8)
    engine.register(mine)
    with pytest.raises(ferry.AlreadyExists):
        engine.register(mine)
    with pytest.raises(ferry.NotFound):
        engine.unregister(0x1000)
    assert engine.segment_info(engine.name).buffers[0].addr == ferry.resolve(mine, writable=False).address
    engine.unregister(mine)
    # Every class is a FerryError and the built-in a caller would expect.
    assert issubclass(ferry.OutOfRange, ferry.FerryError)
    assert issubclass(ferry.InvalidArgument, ValueError)
    assert issubclass(ferry.Timeout, TimeoutError)

    # One bad request fails alone; the batch reports it and the good one lands.
    good = pattern(6, 4096)
    with engine.submit([ferry.Write(good, seg, remote), ferry.Write(good, seg, 0x1000)]) as h:
        with pytest.raises(ferry.OutOfRange):
            h.wait(30)
        results = h.results()
    assert results[0].error is None and isinstance(results[1].error, ferry.OutOfRange)
    # The engine and the target's memory are intact.
    assert peer.digest("numpy", 0, 4096) == sha(good)
    assert peer.digest("numpy", 4096, SIZE - 4096) == sha(data[4096:])
    engine.write(seg, data, remote)
    assert peer.digest("numpy", 0, SIZE) == sha(data)


def test_partly_out_of_range_write_changes_nothing(spawn_peer):
    size = 8 << 20  # many tcp chunks; only the last one reaches past the buffer
    peer = spawn_peer("--transport", "tcp", "--size", str(size))
    engine = ferry.TransferEngine(transport="tcp", request_timeout=10)
    before = peer.digest("numpy", 0, size)
    with pytest.raises(ferry.OutOfRange):
        engine.write(peer.name, pattern(8, size), peer.buffers["numpy"] + 16)
    assert peer.digest("numpy", 0, size) == before


def test_closed_engine_and_handle_raise(spawn_peer):
    peer = spawn_peer("--transport", "tcp")
    engine = ferry.TransferEngine(transport="tcp")
    data = pattern(9, 4096)
    handle = engine.write_async(peer.name, data, peer.buffers["numpy"])
    engine.close()  # the engine lives on until its last handle is freed
    assert handle.wait(30)
    assert peer.digest("numpy", 0, 4096) == sha(data)
    handle.close()
    with pytest.raises(ferry.InvalidArgument, match="batch is closed"):
        handle.poll()
    with pytest.raises(ferry.InvalidArgument, match="engine is closed"):
        engine.write(peer.name, data, peer.buffers["numpy"])
    with pytest.raises(ferry.InvalidArgument, match="port"):
        ferry.TransferEngine(port=70000)


def test_tcp_knobs_apply_and_out_of_range_ones_raise(spawn_peer):
    # In range, host memory still moves (GPU chunks and staging are not its);
    # out of range, the engine is refused, so the knobs reach EngineOptions.
    peer = spawn_peer("--transport", "tcp")
    with ferry.TransferEngine(transport="tcp", tcp_gpu_lanes=2, tcp_gpu_chunk_bytes=1 << 16,
                              tcp_staging_buffers=8) as engine:
        data = pattern(12, 4096)
        engine.write(peer.name, data, peer.buffers["numpy"])
        assert peer.digest("numpy", 0, 4096) == sha(data)
    for bad in ({"tcp_gpu_chunk_bytes": 1000}, {"tcp_gpu_chunk_bytes": (64 << 20) + 1},
                {"tcp_staging_buffers": 5000}, {"tcp_staging_buffers": -1}):
        with pytest.raises(ferry.InvalidArgument, match="tcp options"):
            ferry.TransferEngine(**bad)


def test_error_class_per_status_code():
    seen = set()
    for code in range(1, 17):
        cls = ferry.error_class(code)
        assert issubclass(cls, ferry.FerryError) and cls.code == code
        assert cls.__name__ == ferry._ferry.status_code_name(code)
        seen.add(cls)
    assert len(seen) == 16
    assert ferry.error_class(200) is ferry.FerryError


@pytest.mark.skipif(sys.platform != "linux", reason="SIGSTOP/SIGCONT of the peer")
def key_file(tmp_path, name: str, secret: bytes, mode: int = 0o600) -> str:
    path = tmp_path / name
    path.write_bytes(secret)
    path.chmod(mode)
    return str(path)


def test_cluster_secret(tmp_path):
    key = key_file(tmp_path, "key", b"this cluster's secret: 32 bytes!\n")
    with ferry.TransferEngine(auth_key_file=key) as target, \
            ferry.TransferEngine(transport="tcp", auth_key_file=key) as engine:
        mem = bytearray(4096)
        addr = target.register(mem)
        engine.write(engine.open_segment(target.name), b"proved", addr)
        assert bytes(mem[:6]) == b"proved"
        with ferry.TransferEngine(transport="tcp") as stranger:
            with pytest.raises(ferry.Unauthenticated, match="cluster secret"):
                stranger.open_segment(target.name)
        assert target.auth_failures == 1
    loose = key_file(tmp_path, "loose", b"this cluster's secret: 32 bytes!", 0o644)
    with pytest.raises(ferry.InvalidArgument, match="group or others"):
        ferry.TransferEngine(auth_key_file=loose)


def test_blocking_call_releases_the_gil(spawn_peer):
    """A synchronous tcp write to a stopped target cannot finish until a second
    Python thread resumes the target. That thread first sees the main thread inside
    the call, then keeps running Python code; had the call held the GIL, the
    thread could not run, the target would stay stopped and the write would time out."""
    size = 32 << 20
    peer = spawn_peer("--transport", "tcp", "--size", str(size))
    engine = ferry.TransferEngine(transport="tcp", request_timeout=20)
    seg = engine.open_segment(peer.name)
    data = pattern(7, size)
    engine.write(seg, data[:4096], peer.buffers["numpy"])  # lanes connected

    main = threading.get_ident()
    seen = {"in_call": False, "iterations": 0, "still_in_call": False}

    def main_in_call() -> bool:
        frame = sys._current_frames().get(main)
        return frame is not None and frame.f_code.co_name == "_transfer_one"

    def helper():
        try:
            for _ in range(20000):  # up to ~20 s
                if main_in_call():
                    seen["in_call"] = True
                    break
                threading.Event().wait(0.001)
            n = 0
            while n < 200_000:  # plain Python work while the write is blocked
                n += 1
            seen["iterations"] = n
            seen["still_in_call"] = main_in_call()
        finally:
            os.kill(peer.pid, signal.SIGCONT)

    os.kill(peer.pid, signal.SIGSTOP)
    thread = threading.Thread(target=helper)
    thread.start()
    try:
        engine.write(seg, data, peer.buffers["numpy"])
    finally:
        os.kill(peer.pid, signal.SIGCONT)
        thread.join(30)
    assert seen["in_call"], "the helper never saw the main thread inside the call"
    assert seen["iterations"] == 200_000
    assert seen["still_in_call"], "the write returned before the stopped target was resumed"
    assert peer.digest("numpy", 0, size) == sha(data)
