"""The GPU writer of test_store_gpu.py, in a process of its own (a fresh CUDA
context, so lazy module loading is real, and test-only settings stay here).

    gpu_store_writer.py TARGET MODE STREAM TRIALS TAG

TARGET: a node's socket path (attached) or "master=HOST:PORT" (embedded pure
client). MODE: single | batch | sync (synchronizes before each put, a control)
| mixed | capturing (a put while the stream is captured into a graph). STREAM: legacy | per_thread | blocking | nonblocking: the
current stream the puts are made from.

Each trial fills CUDA tensors on a producer stream after a sleep kernel, joins
it into the current stream with wait_stream, and puts them while the producer
still runs; then launches a kernel never launched before in this process.
Prints one JSON line: counts of producers pending at the call and of current
streams ready after it, and the sha256 every key's object must have.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys

import numpy as np
import torch

import ferry
from ferry import tensor

SLEEP_CYCLES = 20_000_000  # ~10 ms: still running when the put is made
NBYTES = 1 << 20
# Elementwise ops, each a kernel of its own, launched once each, after a put.
FRESH = [torch.sin, torch.cos, torch.exp, torch.tanh, torch.sqrt, torch.log1p, torch.sigmoid,
         torch.erf, torch.rsqrt, torch.atan, torch.asinh, torch.expm1, torch.trunc, torch.frac]


def stream_of(kind: str):
    if kind == "legacy":
        return torch.cuda.default_stream()
    if kind == "per_thread":
        return torch.cuda.ExternalStream(2)  # cudaStreamPerThread
    if kind == "nonblocking":
        return torch.cuda.Stream()
    # A blocking stream (cudaStreamCreate), from the runtime torch has loaded.
    handle = ctypes.c_void_p()
    create = getattr(ctypes.CDLL(None), "cudaStreamCreate", None)
    if create is None or create(ctypes.byref(handle)) != 0:
        print(json.dumps({"skip": "no cudaStreamCreate reachable from Python"}), flush=True)
        sys.exit(0)
    return torch.cuda.ExternalStream(handle.value)


def object_sha(t_cpu) -> str:
    header, data = tensor.encode(t_cpu)
    return hashlib.sha256(header + bytes(data)).hexdigest()


def main() -> int:
    target, mode, kind, trials, tag = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \
        sys.argv[5]
    readiness = os.environ.get("FERRY_WRITER_READINESS", "sync")
    store = (ferry.Store(master=target[len("master="):], local_memory=0)
             if target.startswith("master=") else ferry.Store.attach(target, readiness=readiness))
    current = stream_of(kind)
    producer = torch.cuda.Stream()
    n = 3 if mode in ("batch", "mixed") else 1
    srcs = [torch.empty(NBYTES, dtype=torch.uint8, device="cuda") for _ in range(n)]
    expected, pending, ready = {}, 0, 0
    with torch.cuda.stream(current):
        if mode == "capturing":
            graph, result = torch.cuda.CUDAGraph(), {"error": None}
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                graph.capture_begin()
                try:
                    store.put_tensor(f"{tag}-captured", srcs[0])
                except ferry.FerryError as e:
                    result = {"error": type(e).__name__, "message": str(e)}
                finally:
                    graph.capture_end()
            result["visible"] = store.exists(f"{tag}-captured")
            print(json.dumps(result), flush=True)
            return 0
        # One untimed round first: under lazy loading the first launches of the
        # sleep and fill kernels load their modules, which waits for the GPU.
        with torch.cuda.stream(producer):
            torch.cuda._sleep(1000)
            for s in srcs:
                s.fill_(0)
        torch.cuda.synchronize()
        for i in range(trials):
            value = i % 251 + 1
            with torch.cuda.stream(producer):
                torch.cuda._sleep(SLEEP_CYCLES)
                for s in srcs:
                    s.fill_(value)
                done = producer.record_event()
            current.wait_stream(producer)
            if mode == "sync":
                torch.cuda.synchronize()
            pending += not done.query()
            keys = [f"{tag}-{i}-{k}" for k in range(n)]
            if mode == "single":
                store.put_tensor(keys[0], srcs[0])
                items = [srcs[0]]
            else:
                items = list(srcs)
                if mode == "mixed":
                    # CPU, zero-sized and CUDA tensors in one batch.
                    items = [srcs[0], torch.full((5,), value, dtype=torch.uint8),
                             torch.empty(0, device="cuda"), srcs[1], srcs[2]]
                    keys = [f"{tag}-{i}-{k}" for k in range(len(items))]
                errors = store.batch_put_tensor(keys, items)
                assert all(e is None for e in errors), errors
            ready += current.query()
            FRESH[i % len(FRESH)](torch.ones(4, device="cuda"))  # a kernel never launched
            for key, t in zip(keys, items):
                expected[key] = object_sha(t.cpu() if t.is_cuda else t)
    print(json.dumps({"pending": pending, "ready": ready, "expected": expected}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
