#!/usr/bin/env python3
"""Overhead of the Python API: p50 latency of a synchronous write through
ferry.TransferEngine.write, against the same Engine::Transfer loop run in C++
(ferry._ferry._bench.sync_write_latency, GIL released), in the same run, same
processes, same buffers. Rounds alternate between the two to cancel drift.

The ratio's reference is the C++ loop calling back to back. A second C++ loop
pauses (spinning, untimed) between calls for as long as the Python API spends
outside the engine per call, to show how much of the gap is the engine reacting
to a caller that is not back to back rather than Python's own cost.

    PYTHONPATH=build/python python3 python/bench/bench_latency.py [--transport tcp|shm]
        [--block 4096] [--iterations 2000] [--rounds 5] [--out FILE]

Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

import ferry
from ferry import _ferry

# Benchmark-only C++ loop, kept out of the extension's API.
sync_write_latency = _ferry._bench.sync_write_latency


def target(transport: str, block: int) -> None:
    """The peer: exposes a buffer, prints its segment and address, waits for EOF."""
    engine = ferry.TransferEngine(transport=transport or None)
    buf = np.zeros(block, np.uint8)
    address = engine.register(buf)
    print(json.dumps({"name": engine.name, "address": address}), flush=True)
    sys.stdin.read()


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transport", default="tcp", choices=["tcp", "shm"])
    p.add_argument("--block", type=int, default=4096)
    p.add_argument("--iterations", type=int, default=200, help="per round and per API")
    p.add_argument("--rounds", type=int, default=50,
                   help="alternations of the two APIs, so both see the same load")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.target:
        target(args.transport, args.block)
        return 0

    peer = subprocess.Popen([sys.executable, __file__, "--target", "--transport", args.transport,
                             "--block", str(args.block)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(peer.stdout.readline())
        engine = ferry.TransferEngine(transport=args.transport)
        seg = engine.open_segment(hello["name"])
        remote = hello["address"]
        src = np.random.default_rng(0).integers(0, 256, args.block, dtype=np.uint8)
        local = ferry.resolve(src, writable=False).address

        for _ in range(200):  # warm up both paths: connections, caches
            engine.write(seg, src, remote)
        raw = seg.id, remote, args.block
        sync_write_latency(engine._engine, local, *raw, 200)

        # The Python layer's own time per call: write() minus the raw binding call.
        def p50_ns(fn, n=2000):
            ts = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                fn()
                ts.append(time.perf_counter_ns() - t0)
            return sorted(ts)[n // 2]

        pause_ns = max(0, p50_ns(lambda: engine._prepare([ferry.Write(src, seg, remote)], None)))

        py_ns: list[int] = []
        cpp_ns: list[int] = []
        paused_ns: list[int] = []
        rounds = []
        for _ in range(args.rounds):
            round_py = []
            for _ in range(args.iterations):
                t0 = time.perf_counter_ns()
                engine.write(seg, src, remote)
                round_py.append(time.perf_counter_ns() - t0)
            round_cpp = sync_write_latency(engine._engine, local, *raw, args.iterations)
            paused_ns += sync_write_latency(engine._engine, local, *raw, args.iterations,
                                            pause_ns)
            py_ns += round_py
            cpp_ns += round_cpp
            rounds.append({"python_p50_us": percentile(round_py, 0.5),
                           "cpp_p50_us": percentile(round_cpp, 0.5)})
    finally:
        peer.stdin.close()
        peer.wait(30)

    result = {
        "bench": "python_sync_write_latency",
        "transport": args.transport,
        "block": args.block,
        "iterations": args.iterations * args.rounds,
        "python_p50_us": percentile(py_ns, 0.5),
        "python_p99_us": percentile(py_ns, 0.99),
        "cpp_p50_us": percentile(cpp_ns, 0.5),
        "cpp_p99_us": percentile(cpp_ns, 0.99),
        "ratio_p50": round(percentile(py_ns, 0.5) / percentile(cpp_ns, 0.5), 3),
        "cpp_paused_p50_us": percentile(paused_ns, 0.5),
        "pause_us": pause_ns / 1000.0,
        "ratio_to_paused_p50": round(percentile(py_ns, 0.5) / percentile(paused_ns, 0.5), 3),
        "round_ratio_median": round(statistics.median(
            r["python_p50_us"] / r["cpp_p50_us"] for r in rounds), 3),
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"{'API':<8}{'p50 us':>10}{'p99 us':>10}")
    print(f"{'python':<8}{result['python_p50_us']:>10.1f}{result['python_p99_us']:>10.1f}")
    print(f"{'c++':<8}{result['cpp_p50_us']:>10.1f}{result['cpp_p99_us']:>10.1f}")
    print(f"c++ pausing {result['pause_us']:.1f} us between calls: "
          f"p50 {result['cpp_paused_p50_us']:.1f} us (ratio {result['ratio_to_paused_p50']:.3f})")
    print(f"ratio python/c++ at p50: {result['ratio_p50']:.3f} "
          f"({args.transport}, {args.block} B, {result['iterations']} writes each)")
    line = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
