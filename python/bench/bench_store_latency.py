#!/usr/bin/env python3
"""Overhead of the Python store API: p50 of one 4 KiB get_into through
ferry.Store, against the same Store::GetInto loop in C++: run in this process
on the same store (`python_vs_cpp`), and in a process of its own (`ferry bench
store-latency`, `python_vs_cpp_process`). All attached to one `ferry node
--socket` (or, with --embedded, pure clients of its master; with
--master-in-node, the node runs the master), in alternating rounds. On two
cores the separate process's figure swings with where the scheduler puts it
(Python over it measured 0.39 to 1.42 on one VM), so the ratio is taken
in-process.

    PYTHONPATH=build/python python3 python/bench/bench_store_latency.py
        [--ferry build/ferry] [--size 4096] [--iterations 2000] [--rounds 3]
        [--embedded] [--master-in-node] [--out FILE]

Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ferry
from ferry.buffers import resolve
from store_node import master_and_node

ROOT = Path(__file__).resolve().parents[2]


def p50s(store: ferry.Store, size: int, iterations: int, block: int = 50) -> tuple[float, float]:
    """Python's p50, then the same call's from C++ in this process: blocks of
    `block` calls taking turns, so that both see the same scheduling (on two
    cores it moves a call between about 40 and 170 us from one second to the
    next)."""
    buf = store.allocate_buffer(size)
    buf[:] = b"\x5a" * size
    key = f"latency/py/{os.getpid()}"
    store.put_from(key, buf)
    view = resolve(buf, writable=True)
    us: list = []
    cpp: list = []
    while len(us) < iterations:
        for _ in range(block):
            t0 = time.perf_counter()
            store.get_into(key, buf)
            us.append((time.perf_counter() - t0) * 1e6)
        cpp += store._store._time_get_into(key, view.address, view.nbytes, block)
    store.remove(key, force=True)
    return statistics.median(us), statistics.median(cpp)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ferry", default=os.environ.get("FERRY_BIN", str(ROOT / "build/ferry")))
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--embedded", action="store_true",
                   help="pure clients of the master, not attached to the node")
    p.add_argument("--master-in-node", action="store_true",
                   help="no master process: the node runs it")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args()

    with master_and_node(args.ferry, "64MiB", args.master_in_node) as (address, sock):
        where = ["--master", address] if args.embedded else ["--socket", sock]
        store = (ferry.Store(master=address, local_memory=0) if args.embedded
                 else ferry.Store.attach(sock))
        py, cpp, proc = [], [], []
        for _ in range(args.rounds):
            here = p50s(store, args.size, args.iterations)
            py.append(here[0])
            cpp.append(here[1])
            out = subprocess.run([args.ferry, "bench", "store-latency", *where, "--size",
                                  str(args.size), "--iterations", str(args.iterations)],
                                 capture_output=True, text=True, timeout=300, check=True)
            proc.append(json.loads(out.stdout.strip().splitlines()[-1])["p50_us"])
        store.close()
    result = {
        "size": args.size, "iterations": args.iterations, "rounds": args.rounds,
        "mode": "embedded" if args.embedded else "attached",
        "master_in_node": args.master_in_node,
        "python_p50_us": statistics.median(py), "cpp_p50_us": statistics.median(cpp),
        "cpp_process_p50_us": statistics.median(proc),
        "python_rounds_us": py, "cpp_rounds_us": cpp, "cpp_process_rounds_us": proc,
    }
    result["python_vs_cpp"] = result["python_p50_us"] / result["cpp_p50_us"]
    result["python_vs_cpp_process"] = result["python_p50_us"] / result["cpp_process_p50_us"]
    print(f"get_into {args.size} B, {result['mode']}, medians of {args.rounds} rounds")
    print(f"  python p50 {result['python_p50_us']:.1f} us   C++ p50 {result['cpp_p50_us']:.1f} us"
          f"   ratio {result['python_vs_cpp']:.2f}   (C++ in its own process"
          f" {result['cpp_process_p50_us']:.1f} us, {result['python_vs_cpp_process']:.2f})")
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
