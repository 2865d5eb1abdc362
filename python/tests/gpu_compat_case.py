"""One case of the deadlock scenario, run in its own process under a watchdog:
ferry.compat.mooncake over forced tcp, a stream-ordered 4 MiB write or read of GPU
memory, on the legacy default stream, a blocking stream or a non-blocking one.

    gpu_compat_case.py --op write|read --stream legacy|blocking|nonblocking
                       [--target HOST:PORT --remote ADDR]   (else a second engine here)

Prints "OK <sha256 of the bytes now at the destination>" and exits 0, or fails.
Modelled on the failure seen elsewhere: the caller's stream also carries a kernel
never launched before, enqueued right after the submit.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import sys

import torch

from ferry.compat.mooncake import TransferEngine

SIZE = 4 << 20


def cudart() -> ctypes.CDLL:
    """The CUDA runtime torch loaded, for a blocking stream torch cannot create."""
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart" in line}
    for path in sorted(paths):
        return ctypes.CDLL(path)
    return ctypes.CDLL("libcudart.so")


def make_stream(kind: str) -> torch.cuda.Stream:
    if kind == "legacy":
        return torch.cuda.default_stream()  # handle 0: the legacy default stream
    if kind == "nonblocking":
        return torch.cuda.Stream()  # torch's pool streams are cudaStreamNonBlocking
    handle = ctypes.c_void_p()
    rc = cudart().cudaStreamCreateWithFlags(ctypes.byref(handle), 0)  # cudaStreamDefault
    if rc != 0:
        raise RuntimeError(f"cudaStreamCreateWithFlags failed: {rc}")
    return torch.cuda.ExternalStream(handle.value)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--op", choices=["write", "read"], required=True)
    p.add_argument("--stream", choices=["legacy", "blocking", "nonblocking"], required=True)
    p.add_argument("--target")
    p.add_argument("--remote", type=int)
    args = p.parse_args()

    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    local = torch.zeros(SIZE, dtype=torch.uint8, device="cuda")
    assert te.register_memory(local.data_ptr(), SIZE) == 0
    peer = remote_buf = None
    if args.target:
        target, remote = args.target, args.remote
    else:
        peer = TransferEngine()
        assert peer.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        remote_buf = torch.zeros(SIZE, dtype=torch.uint8, device="cuda")
        assert peer.register_memory(remote_buf.data_ptr(), SIZE) == 0
        target, remote = peer.get_local_session_id(), remote_buf.data_ptr()
        if args.op == "read":
            remote_buf.copy_(torch.arange(SIZE, device="cuda", dtype=torch.int64) % 251)
    torch.cuda.synchronize()

    stream = make_stream(args.stream)
    with torch.cuda.stream(stream):
        if args.op == "write":
            # Produced on the stream itself: the write must wait for it.
            local.copy_(torch.arange(SIZE, device="cuda", dtype=torch.int64) % 253)
            te.transfer_write_on_cuda(target, local.data_ptr(), remote, SIZE, stream.cuda_stream)
        else:
            te.transfer_read_on_cuda(target, local.data_ptr(), remote, SIZE, stream.cuda_stream)
        # A kernel this process has never launched, right after the submit.
        after = torch.cumprod(torch.ones(7, device="cuda", dtype=torch.float64), 0)
        if args.op == "read":
            seen = local.clone()  # ordered after the read on the stream
    stream.synchronize()  # the watchdog in the parent bounds this
    te.check_cuda_transfers(timeout=10)
    assert after[-1].item() == 1.0

    if args.op == "read":
        data = seen.cpu().numpy().tobytes()
    elif remote_buf is not None:
        torch.cuda.synchronize()
        data = remote_buf.cpu().numpy().tobytes()
    else:
        data = b""  # the parent asks the target process
    print("OK", hashlib.sha256(data).hexdigest(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
