"""CUDA tensors in the store, on a real GPU (skipped, with the reason, without
torch or a CUDA device). The writer runs in its own process
(gpu_store_writer.py); this process reads every object back and compares it
byte for byte.

The seed's regression tests, made stronger: puts of CUDA tensors whose
producer still runs on a side stream that the current stream has joined.
Attached to a node (CUDA IPC, an interprocess event) and embedded (the engine).
A control that synchronizes first passes too; with readiness switched off
(FERRY_TEST_ATTACH_SKIP_READINESS=1) the same check must fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ferry
from conftest import gpu_skip_reason
from store_cluster import Cluster, needs_attach

HERE = Path(__file__).resolve().parent
_reason = gpu_skip_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=str(_reason))
TRIALS = 100


@pytest.fixture
def node():
    c = Cluster()
    c.start_master()
    path = c.socket_path()
    c.start_node("--socket", path, size="512MiB")
    yield c, path
    c.close()


def write(target: str, mode: str, stream: str, trials: int, tag: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, str(HERE / "gpu_store_writer.py"), target, mode, stream,
                          str(trials), tag], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def correct(store: ferry.Store, expected: dict) -> int:
    return sum(hashlib.sha256(store.get(k)).hexdigest() == want for k, want in expected.items())


@needs_attach
@pytest.mark.parametrize("readiness", ["sync", "event"])
@pytest.mark.parametrize("mode", ["single", "batch"])
def test_attached_puts_follow_the_current_stream(node, mode, readiness):
    c, path = node
    r = write(path, mode, "nonblocking", TRIALS, f"{mode}-{readiness}",
              FERRY_WRITER_READINESS=readiness)
    assert r["pending"] == TRIALS, "the producer finished before the put: raise SLEEP_CYCLES"
    assert r["ready"] == TRIALS  # the current stream's work was done when the call returned
    with ferry.Store.attach(path) as reader:  # another process than the writer
        assert correct(reader, r["expected"]) == len(r["expected"])


@needs_attach
def test_control_that_synchronizes_first_passes(node):
    c, path = node
    r = write(path, "sync", "nonblocking", 20, "sync")
    with ferry.Store.attach(path) as reader:
        assert correct(reader, r["expected"]) == len(r["expected"])


@needs_attach
@pytest.mark.parametrize("readiness", ["sync", "event"])
def test_without_readiness_the_check_fails(node, readiness):
    """Shows the check above can fail: the node copies before the producer is done."""
    c, path = node
    r = write(path, "single", "nonblocking", 20, f"stale-{readiness}",
              FERRY_TEST_ATTACH_SKIP_READINESS="1", FERRY_WRITER_READINESS=readiness)
    with ferry.Store.attach(path) as reader:
        assert correct(reader, r["expected"]) < len(r["expected"])


@needs_attach
@pytest.mark.parametrize("readiness", ["sync", "event"])
@pytest.mark.parametrize("loading", ["LAZY", "EAGER"])
@pytest.mark.parametrize("stream", ["legacy", "per_thread", "blocking", "nonblocking"])
def test_stream_kinds(node, stream, loading, readiness):
    c, path = node
    r = write(path, "single", stream, 20, f"{stream}-{loading}-{readiness}",
              CUDA_MODULE_LOADING=loading, FERRY_WRITER_READINESS=readiness)
    if "skip" in r:
        pytest.skip(r["skip"])
    assert r["pending"] == 20 and r["ready"] == 20
    with ferry.Store.attach(path) as reader:
        assert correct(reader, r["expected"]) == 20


@needs_attach
@pytest.mark.parametrize("alloc", ["cudaMalloc", "expandable_segments"])
def test_mixed_batches(node, alloc):
    """CPU, CUDA and zero-sized tensors in one batch; with torch's expandable
    segments (virtual memory that legacy IPC cannot export) the whole batch
    takes the staging fallback."""
    c, path = node
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if alloc != "cudaMalloc" else {}
    r = write(path, "mixed", "nonblocking", 10, f"mixed-{alloc}", **env)
    with ferry.Store.attach(path) as reader:
        assert correct(reader, r["expected"]) == len(r["expected"])


@needs_attach
def test_a_stream_being_captured_is_refused_and_nothing_is_sent(node):
    c, path = node
    r = write(path, "capturing", "nonblocking", 1, "captured")
    assert r["error"] == "NotSupported" and r["visible"] is False, r


def test_embedded_puts_follow_the_current_stream(node):
    c, path = node
    r = write(f"master={c.master}", "batch", "nonblocking", 50, "embedded")
    assert r["pending"] == 50 and r["ready"] == 50
    with ferry.Store(master=c.master, local_memory=0) as reader:
        assert correct(reader, r["expected"]) == len(r["expected"])
