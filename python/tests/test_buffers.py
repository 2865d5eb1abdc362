"""How ferry.resolve reads the objects users pass, and how the submission stream is
chosen, without a GPU: CUDA-array and DLPack objects here describe host memory."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from ferry.buffers import stream_handle


class CudaArray:
    """An object exposing only __cuda_array_interface__ (version 3)."""

    def __init__(self, array: np.ndarray, stream=None, readonly=False):
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str, "version": 3,
            "data": (array.__array_interface__["data"][0], readonly),
            "strides": None if array.flags.c_contiguous else array.strides,
        }
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream


class DLPackOnly:
    """An object exposing only __dlpack__."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_buffer_protocol_objects():
    a = np.zeros((16, 16), np.float32)
    buf = ferry.resolve(a, writable=True)
    assert (buf.address, buf.nbytes, buf.gpu, buf.stream) == (address(a), a.nbytes, False, None)
    ba = bytearray(100)
    assert ferry.resolve(ba, writable=True).nbytes == 100
    assert ferry.resolve(b"abc", writable=False).nbytes == 3
    assert ferry.resolve(memoryview(ba)[10:20], writable=True).nbytes == 10
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        ferry.resolve(b"abc", writable=True)
    with pytest.raises(ferry.InvalidArgument, match="contiguous"):
        ferry.resolve(a[:, ::2], writable=False)


def test_raw_address_and_length():
    buf = ferry.resolve((0x1000, 64), writable=True)
    assert (buf.address, buf.nbytes, buf.stream) == (0x1000, 64, None)
    with pytest.raises(ferry.InvalidArgument):
        ferry.resolve((0, 64), writable=True)
    with pytest.raises(ferry.InvalidArgument):
        ferry.resolve(0x1000, writable=True)


def test_cuda_array_interface():
    a = np.zeros((8, 4), np.int64)
    buf = ferry.resolve(CudaArray(a), writable=True)
    assert (buf.address, buf.nbytes, buf.gpu, buf.stream) == (address(a), a.nbytes, True, None)
    # Version 3 streams: 1 is the legacy default stream (null), 2 per-thread, else a handle.
    assert ferry.resolve(CudaArray(a, stream=1), writable=True).stream == 0
    assert ferry.resolve(CudaArray(a, stream=2), writable=True).stream == 2
    assert ferry.resolve(CudaArray(a, stream=0xABC), writable=True).stream == 0xABC
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        ferry.resolve(CudaArray(a, readonly=True), writable=True)
    assert ferry.resolve(CudaArray(a, readonly=True), writable=False).nbytes == a.nbytes
    with pytest.raises(ferry.InvalidArgument, match="contiguous"):
        ferry.resolve(CudaArray(a[:, ::2]), writable=False)


def test_dlpack():
    a = np.arange(64, dtype=np.int16)
    buf = ferry.resolve(DLPackOnly(a), writable=True)
    assert (buf.address, buf.nbytes, buf.gpu) == (address(a), a.nbytes, False)
    assert ferry.resolve(DLPackOnly(a[8:]), writable=True).address == address(a) + 16
    with pytest.raises(ferry.InvalidArgument, match="contiguous"):
        ferry.resolve(DLPackOnly(a[::2]), writable=False)


def test_stream_handles():
    class TorchLike:
        cuda_stream = 0x1234

    class CupyLike:
        ptr = 0x5678

    assert stream_handle(None) == 0
    assert stream_handle(7) == 7
    assert stream_handle(TorchLike()) == 0x1234
    assert stream_handle(CupyLike()) == 0x5678
    with pytest.raises(ferry.InvalidArgument, match="stream"):
        stream_handle("default")


def test_submission_stream_choice():
    """Buffers whose own streams differ need stream=; it is checked before anything
    is submitted."""
    engine = ferry.TransferEngine()
    a, b = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    remote = engine.register(np.zeros(128, np.uint8))
    seg = engine.open_segment(engine.name)
    mixed = [ferry.Write(CudaArray(a, stream=0x10), seg, remote),
             ferry.Write(CudaArray(b, stream=0x20), seg, remote + 64)]
    with pytest.raises(ferry.InvalidArgument, match="stream="):
        engine.submit(mixed)
    with pytest.raises(ferry.InvalidArgument, match="stream="):
        engine.transfer(mixed)
    # Host buffers with no stream of their own: a plain local copy.
    a[:] = 5
    engine.transfer([ferry.Write(a, seg, remote), ferry.Write(b, seg, remote + 64)])
    out = np.zeros(128, np.uint8)
    engine.read(seg, out, remote)
    assert out[:64].tolist() == [5] * 64 and out[64:].tolist() == [0] * 64
