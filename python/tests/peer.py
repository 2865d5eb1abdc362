"""A target process for the tests: exposes memory, then answers commands on stdin.

Startup prints one JSON line: {"name": segment, "pid": ..., "buffers": {kind: address}}.
Commands, one per line, each answered with one line:
    digest KIND OFFSET LENGTH   -> sha256 hex of those bytes
    fill KIND SEED              -> "ok" (a deterministic pattern over the whole buffer)
    quit
KIND is "numpy", "bytearray" or "managed" (engine memory); with --gpu also "gpu".
--api mooncake exposes the memory through ferry.compat.mooncake instead.
--metadata is the engine's metadata (Mooncake's metadata_server with --api mooncake).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import sys

import numpy as np

from conftest import addr, pattern


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--api", choices=["ferry", "mooncake"], default="ferry")
    p.add_argument("--transport", default="")
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--metadata", default="")
    args = p.parse_args()
    # Replies get their own descriptor; the library's log lines go to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    views: dict[str, memoryview] = {}
    arrays = {"numpy": np.zeros(args.size, np.uint8), "bytearray": bytearray(args.size)}
    gpu = None
    if args.gpu:
        import torch

        gpu = torch.zeros(args.size, dtype=torch.uint8, device="cuda")

    if args.api == "ferry":
        import ferry

        engine = ferry.TransferEngine(transport=args.transport or None,
                                      metadata=args.metadata or "p2p")
        addresses = {k: engine.register(v) for k, v in arrays.items()}
        views["managed"] = engine.allocate(args.size)
        addresses["managed"] = ferry.resolve(views["managed"], writable=False).address
        if gpu is not None:
            addresses["gpu"] = engine.register(gpu)
        name = engine.name
    else:
        from ferry.compat.mooncake import TransferEngine

        engine = TransferEngine()
        assert engine.initialize("127.0.0.1", args.metadata or "P2PHANDSHAKE",
                                 args.transport or "rdma", "") == 0
        addresses = {}
        for k, v in arrays.items():
            addresses[k] = addr(v)
            assert engine.register_memory(addresses[k], args.size) == 0
        addresses["managed"] = engine.allocate_managed_buffer(args.size)
        assert addresses["managed"] != 0
        views["managed"] = memoryview(
            (ctypes.c_char * args.size).from_address(addresses["managed"])).cast("B")
        if gpu is not None:
            addresses["gpu"] = gpu.data_ptr()
            assert engine.register_memory(addresses["gpu"], args.size) == 0
        name = engine.get_local_session_id()

    def host_bytes(kind: str) -> np.ndarray:
        if kind == "gpu":
            import torch

            torch.cuda.synchronize()
            return gpu.cpu().numpy()
        obj = views.get(kind, arrays.get(kind))
        return np.frombuffer(obj, dtype=np.uint8)

    print(json.dumps({"name": name, "buffers": addresses, "size": args.size}), file=out)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "digest":
            off, length = int(cmd[2]), int(cmd[3])
            print(hashlib.sha256(host_bytes(cmd[1])[off:off + length].tobytes()).hexdigest(),
                  file=out)
        elif cmd[0] == "fill":
            data = pattern(int(cmd[2]), args.size)
            if cmd[1] == "gpu":
                import torch

                gpu.copy_(torch.from_numpy(data).cuda())
                torch.cuda.synchronize()
            else:
                host_bytes(cmd[1])[:] = data
            print("ok", file=out)
        else:
            print(f"error: unknown command {cmd[0]}", file=out)


if __name__ == "__main__":
    main()
