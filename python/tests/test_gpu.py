"""The stream contract from Python, with torch CUDA tensors. Skipped, with the
reason, where torch or a CUDA GPU is missing.

(a) Readiness: a producer fills the source on a side stream after a long sleep
    kernel; the current stream joins it with wait_stream; the tensor is submitted
    while the producer still runs. The transfer must carry the produced bytes.
(b) The deadlock scenario through ferry.compat.mooncake (gpu_compat_case.py), each
    case in its own process under a 30 s watchdog.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import gpu_skip_reason, pattern, sha

_reason = gpu_skip_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")

if _reason is None:
    import torch

import ferry

HERE = Path(__file__).resolve().parent
ROUNDS = 100
NBYTES = 1 << 20
SLEEP_CYCLES = 20_000_000  # ~10 ms at 2 GHz: long enough to still run at submit
WATCHDOG_S = 30


def produce(producer, tensors, value: int):
    """Sleep, then fill, on the producer stream; the current stream joins it.
    Returns the event recorded after the fill."""
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SLEEP_CYCLES)
        for t in tensors:
            t.fill_(value)
        done = torch.cuda.Event()
        done.record(producer)
    torch.cuda.current_stream().wait_stream(producer)
    return done


@pytest.fixture(params=["default", "side"])
def current_stream(request):
    """The current stream the tensors are submitted from: torch's default (the
    legacy stream) or a side stream made current."""
    if request.param == "default":
        yield torch.cuda.current_stream()
    else:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            yield s


@pytest.fixture(params=["local", "cuda_ipc", "tcp"])
def destination(request, spawn_peer):
    """(engine, segment, list of (remote address, reader)) for 4 destinations.
    local: GPU memory of the engine's own segment; cuda_ipc: a peer process's GPU
    memory; tcp: a peer's host memory over tcp (GPU memory on this side only)."""
    kind = request.param
    if kind == "local":
        engine = ferry.TransferEngine()
        dsts = [torch.zeros(NBYTES, dtype=torch.uint8, device="cuda") for _ in range(4)]
        for d in dsts:
            engine.register(d)

        def reader(i):
            return lambda: sha(dsts[i].cpu().numpy())

        yield engine, engine.open_segment(engine.name), [
            (d.data_ptr(), reader(i)) for i, d in enumerate(dsts)]
        return
    gpu = kind == "cuda_ipc"
    peer = spawn_peer("--size", str(4 * NBYTES), *(["--gpu"] if gpu else ["--transport", "tcp"]))
    engine = ferry.TransferEngine(transport=None if gpu else "tcp")
    buf = "gpu" if gpu else "numpy"
    base = peer.buffers[buf]
    yield engine, engine.open_segment(peer.name), [
        (base + i * NBYTES, (lambda i=i: peer.digest(buf, i * NBYTES, NBYTES))) for i in range(4)]


@pytest.mark.parametrize("mode", ["sync", "async", "sync_batch", "async_batch"])
def test_written_while_producer_runs(destination, current_stream, mode):
    engine, seg, dsts = destination
    batch = mode.endswith("batch")
    srcs = [torch.empty(NBYTES, dtype=torch.uint8, device="cuda") for _ in range(4 if batch else 1)]
    producer = torch.cuda.Stream()
    correct = 0
    for i in range(ROUNDS):
        value = i % 251 + 1
        done = produce(producer, srcs, value)
        assert not done.query(), "the producer finished before the submit: raise SLEEP_CYCLES"
        requests = [ferry.Write(s, seg, dsts[k][0]) for k, s in enumerate(srcs)]
        if mode == "sync":
            engine.write(seg, srcs[0], dsts[0][0], timeout=WATCHDOG_S)
        elif mode == "sync_batch":
            engine.transfer(requests, timeout=WATCHDOG_S)
        if mode.startswith("sync"):
            assert done.query(), "a synchronous call returned before its data was produced"
        else:
            handle = (engine.write_async(seg, srcs[0], dsts[0][0], timeout=WATCHDOG_S)
                      if mode == "async" else engine.submit(requests, timeout=WATCHDOG_S))
            assert handle.wait(WATCHDOG_S)
            handle.close()
        expected = sha(np.full(NBYTES, value, np.uint8))
        correct += all(dsts[k][1]() == expected for k in range(len(srcs)))
    assert correct == ROUNDS


def test_stream_override():
    """stream= overrides the tensor's current stream."""
    engine = ferry.TransferEngine()
    dst = torch.zeros(NBYTES, dtype=torch.uint8, device="cuda")
    engine.register(dst)
    seg = engine.open_segment(engine.name)
    src = torch.empty(NBYTES, dtype=torch.uint8, device="cuda")
    producer = torch.cuda.Stream()
    for value in (7, 9):
        with torch.cuda.stream(producer):
            torch.cuda._sleep(SLEEP_CYCLES)
            src.fill_(value)
        # No join: the caller names the producer stream instead.
        engine.write(seg, src, dst.data_ptr(), stream=producer, timeout=WATCHDOG_S)
        assert bool((dst == value).all())


# torch is only there when _reason is None; else pytestmark skips, giving its reason.
@pytest.mark.skipif(_reason is None and torch.cuda.device_count() < 2,
                    reason="needs two GPUs")
def test_mixed_device_streams_need_stream():
    """Devices 0 and 1 each have a current stream; a batch spanning both needs
    stream=."""
    engine = ferry.TransferEngine()
    dst = torch.zeros(NBYTES, dtype=torch.uint8, device="cuda")
    engine.register(dst)
    seg = engine.open_segment(engine.name)
    src = torch.empty(NBYTES, dtype=torch.uint8, device="cuda")
    other1 = torch.empty(16, dtype=torch.uint8, device="cuda:1")
    with torch.cuda.stream(torch.cuda.Stream(device="cuda:1")):
        with pytest.raises(ferry.InvalidArgument, match="stream="):
            engine.submit([ferry.Write(src, seg, dst.data_ptr()),
                           ferry.Write(other1, seg, dst.data_ptr() + 16)])


def _run_case(*args: str) -> str:
    try:
        proc = subprocess.run([sys.executable, str(HERE / "gpu_compat_case.py"), *args],
                              capture_output=True, text=True, timeout=WATCHDOG_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung: no completion within the {WATCHDOG_S} s watchdog\n{e.stderr}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("OK "), proc.stdout + proc.stderr
    return line.split()[1]


CASE_STREAMS = ["legacy", "blocking", "nonblocking"]


def _expected(modulus: int) -> str:
    return sha((np.arange(4 << 20) % modulus).astype(np.uint8))


@pytest.mark.parametrize("stream", CASE_STREAMS)
@pytest.mark.parametrize("op", ["write", "read"])
def test_compat_on_cuda_same_process(op, stream):
    digest = _run_case("--op", op, "--stream", stream)
    assert digest == _expected(253 if op == "write" else 251)


@pytest.mark.parametrize("stream", CASE_STREAMS)
@pytest.mark.parametrize("op", ["write", "read"])
def test_compat_on_cuda_across_processes(spawn_peer, op, stream):
    size = 4 << 20
    peer = spawn_peer("--api", "mooncake", "--transport", "tcp", "--gpu", "--size", str(size))
    if op == "read":
        peer.fill("gpu", 11)
    digest = _run_case("--op", op, "--stream", stream, "--target", peer.name,
                       "--remote", str(peer.buffers["gpu"]))
    if op == "write":
        assert peer.digest("gpu", 0, size) == _expected(253)
    else:
        assert digest == sha(pattern(11, size))
