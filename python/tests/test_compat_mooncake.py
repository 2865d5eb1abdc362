"""ferry.compat.mooncake.TransferEngine with host memory, against a target process
that uses the same module."""

from __future__ import annotations

import ctypes
import glob
import time

import numpy as np
import pytest

import ferry
from conftest import addr, gpu_skip_reason, pattern, sha
from ferry.compat.mooncake import TransferEngine

SIZE = 1 << 20


def test_initialize_conventions():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "redis://127.0.0.1:6379", "tcp", "") == -1
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "") == -1
    assert te.initialize("localhost", "P2PHANDSHAKE", "tcp", "") == 0
    port = te.get_rpc_port()
    assert 0 < port < 65536 and te.get_local_session_id() == f"127.0.0.1:{port}"
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1  # only once

    for bad in ("a:b", "127.0.0.1:99999"):
        assert TransferEngine().initialize(bad, "P2PHANDSHAKE", "tcp", "") == -1

    uninitialized = TransferEngine()
    assert uninitialized.register_memory(addr(bytearray(16)), 16) == -1
    assert uninitialized.transfer_sync_write("127.0.0.1:1", 1, 1, 1) == -1


def test_register_forms():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    a, b = np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)
    assert te.register_memory(addr(a), a.nbytes) == 0
    assert te.register_memory(addr(a), a.nbytes) == -1  # overlaps
    assert te.unregister_memory(addr(a)) == 0
    assert te.unregister_memory(addr(a)) == -1
    # All or nothing: the second range overlaps the first, so neither stays.
    assert te.batch_register_memory([addr(a), addr(a) + 8], [4096, 16]) == -1
    assert te.batch_register_memory([addr(a), addr(b)], [4096, 4096]) == 0
    assert te.batch_register_memory([addr(a)], [1, 2]) == -1
    assert te.batch_unregister_memory([addr(a), addr(b)]) == 0
    assert te.register_memory(0, 16) == -1

    buf = te.allocate_managed_buffer(SIZE)
    assert buf != 0
    assert te.write_bytes_to_buffer(buf, b"hello", 5) == 0
    assert te.read_bytes_from_buffer(buf, 5) == b"hello"
    assert te.free_managed_buffer(buf, SIZE) == 0
    assert te.free_managed_buffer(buf, SIZE) == -1


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_transfers_between_processes(spawn_peer, protocol):
    peer = spawn_peer("--api", "mooncake", "--transport", protocol, "--size", str(SIZE))
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    target = peer.name

    # Single synchronous write and read through a managed buffer.
    local = te.allocate_managed_buffer(SIZE)
    view = np.ctypeslib.as_array((ctypes.c_uint8 * SIZE).from_address(local))
    view[:] = pattern(1, SIZE)
    assert te.transfer_sync_write(target, local, peer.buffers["managed"], SIZE) == 0
    assert peer.digest("managed", 0, SIZE) == sha(view)
    peer.fill("numpy", 2)
    assert te.transfer_sync_read(target, local, peer.buffers["numpy"], SIZE) == 0
    assert sha(view) == sha(pattern(2, SIZE))

    # Batches of registered numpy memory.
    chunk = SIZE // 4
    src = pattern(3, SIZE)
    assert te.register_memory(addr(src), SIZE) == 0
    locals_ = [addr(src) + i * chunk for i in range(4)]
    remotes = [peer.buffers["bytearray"] + i * chunk for i in range(4)]
    assert te.batch_transfer_sync_write(target, locals_, remotes, [chunk] * 4) == 0
    assert peer.digest("bytearray", 0, SIZE) == sha(src)
    dst = np.zeros(SIZE, np.uint8)
    dst_addrs = [addr(dst) + i * chunk for i in range(4)]
    assert te.batch_transfer_sync_read(target, dst_addrs, remotes, [chunk] * 4) == 0
    assert sha(dst) == sha(src)

    # Asynchronous batches, then one blocking status call for all of them.
    peer.fill("numpy", 4)
    dst[:] = 0
    ids = [te.batch_transfer_async_read(target, dst_addrs[:2], [peer.buffers["numpy"],
                                        peer.buffers["numpy"] + chunk], [chunk] * 2),
           te.batch_transfer_async_write(target, locals_[2:], remotes[2:], [chunk] * 2)]
    assert all(i > 0 for i in ids)
    assert te.get_batch_transfer_status(ids) == 0
    assert sha(dst[:2 * chunk]) == sha(pattern(4, SIZE)[:2 * chunk])
    assert te.get_batch_transfer_status(ids) == -1  # the ids were freed

    batch_id = te.transfer_submit_write(target, local, peer.buffers["managed"], 4096)
    deadline = time.monotonic() + 30
    while (rc := te.transfer_check_status(batch_id)) == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert rc == 1

    # Failures are negative codes, and the engine keeps working.
    assert te.transfer_sync_write(target, local, 0x1000, 4096) == -1
    assert te.batch_transfer_sync_write(target, [local], [0x1000, 0x2000], [16]) == -1
    assert te.transfer_sync_write("127.0.0.1:1", local, 0x1000, 16) == -1
    # An opcode other than TransferOpcode.Read/Write is refused, not taken for a read.
    assert te.transfer_sync(target, local, peer.buffers["managed"], 16, 2) == -1
    assert te.batch_transfer_async(target, [local], [peer.buffers["managed"]], [16], 2) == 0
    bad = te.batch_transfer_async_write(target, [local], [0x1000], [4096])
    assert bad > 0 and te.get_batch_transfer_status([bad]) == -1
    assert te.batch_transfer_async_write(target, [local], [], [16]) == 0
    assert te.transfer_sync_write(target, local, peer.buffers["managed"], SIZE) == 0
    assert peer.digest("managed", 0, SIZE) == sha(view)
    assert te.get_first_buffer_address(target) == min(peer.buffers.values())


# Looked up once: it imports torch and asks CUDA.
_GPU_REASON = gpu_skip_reason()


def _on_cuda_engine(spawn_peer):
    peer = spawn_peer("--api", "mooncake", "--transport", "tcp")
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return peer, te


@pytest.mark.skipif(_GPU_REASON is not None, reason=str(_GPU_REASON))
def test_on_cuda_forms_with_host_memory(spawn_peer):
    """Stream-ordered transfers of host memory, with a GPU: ordered on the stream
    by a signal and a wait (no host function)."""
    peer, te = _on_cuda_engine(spawn_peer)
    src = pattern(12, 4096)
    te.transfer_write_on_cuda(peer.name, addr(src), peer.buffers["numpy"], 4096, 0)
    te.check_cuda_transfers(timeout=30)
    assert peer.digest("numpy", 0, 4096) == sha(src)


@pytest.mark.skipif(_GPU_REASON is None or bool(glob.glob("/dev/nvidia[0-9]*")),
                    reason="this host has a GPU: the refusal is for hosts without one")
def test_on_cuda_refused_without_a_gpu(spawn_peer):
    """Without a GPU, stream-ordered transfers are refused up front with NotSupported."""
    peer, te = _on_cuda_engine(spawn_peer)
    src = pattern(12, 4096)
    with pytest.raises(ferry.NotSupported, match="need a GPU"):
        te.transfer_write_on_cuda(peer.name, addr(src), peer.buffers["numpy"], 4096, 0)


def test_on_cuda_bad_batch_is_refused(spawn_peer):
    """A batch whose lists differ in length is refused before anything is queued."""
    peer, te = _on_cuda_engine(spawn_peer)
    src = pattern(12, 4096)
    with pytest.raises(ferry.InvalidArgument):
        te.batch_transfer_read_on_cuda(peer.name, [addr(src)], [], [4096])
    te.check_cuda_transfers(timeout=5)  # nothing pending, nothing failed
