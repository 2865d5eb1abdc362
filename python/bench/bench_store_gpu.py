#!/usr/bin/env python3
"""CUDA tensors in the store, on a GPU, against their physical references.

- no_stall: put_tensor of a ready 4 KiB CUDA tensor while a 1 s kernel runs on
  an unrelated non-blocking stream, attached and embedded (wall time of the call).
- overhead: put_tensor p50/p95 at 4 KiB and 16 MiB, attached, with each readiness
  form ("sync", "event") and with it skipped (FERRY_TEST_ATTACH_SKIP_READINESS=1),
  the three alternating call by call in one process (each three in a shuffled
  order), so that drift hits all alike; 200 and 100 calls a form.
- bandwidth: put_tensor and get_tensor_into of 64 MiB attached, against pinned
  device-to-host and host-to-device copies of the same bytes, alternating.

Each runs against a `ferry master` and a `ferry node --socket` apart; no_stall
and bandwidth run again (keys "..._master_in_node") against one `ferry node
--socket` that runs the master itself, whose attached calls reach it directly.

Every measurement runs in 3 rounds, each in a fresh process; the file holds
each round and the median over rounds.

    python3 python/bench/bench_store_gpu.py [--ferry build/ferry] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from store_node import master_and_node

ROOT = Path(__file__).resolve().parents[2]


def pct(values: list, q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def child(args) -> dict:
    """Runs in its own process: the measurements that need torch."""
    import torch

    import ferry
    store = (ferry.Store(master=args.master, local_memory=0) if args.embedded
             else ferry.Store.attach(args.socket, staging=256 << 20, readiness=args.readiness))
    out = {}
    if args.what == "no_stall":
        t = torch.ones(4096, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        # Each round's keys are its own: the rounds share one cluster.
        tag = f"{'embedded' if args.embedded else 'attached'}-{os.getpid()}"
        store.put_tensor(f"warm-{tag}", t)
        other = torch.cuda.Stream()
        with torch.cuda.stream(other):
            torch.cuda._sleep(2_000_000_000)  # about 1 s
        times = []
        for i in range(5):
            t0 = time.perf_counter()
            store.put_tensor(f"nostall-{tag}-{i}", t)
            times.append((time.perf_counter() - t0) * 1e3)
        out["no_stall_ms"] = times
        out["kernel_still_running"] = not other.query()
        torch.cuda.synchronize()
    elif args.what == "overhead":
        stores = {"sync": store,
                  "event": ferry.Store.attach(args.socket, staging=256 << 20, readiness="event")}
        forms = ("sync", "event", "skipped")
        for size in (4096, 16 << 20):
            t = torch.ones(size, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            ms = {f: [] for f in forms}
            # Each three calls take the forms in a fresh order, so that nothing
            # periodic (a reservation's refill, say) always lands on one form;
            # 100 calls a form at 16 MiB make its p95 more than a maximum.
            rng = random.Random(size)
            order: list = []
            for i in range(600 if size == 4096 else 300):
                if not order:
                    order = rng.sample(forms, len(forms))
                form = order.pop()
                if form == "skipped":
                    os.environ["FERRY_TEST_ATTACH_SKIP_READINESS"] = "1"
                s = stores.get(form, store)
                t0 = time.perf_counter()
                s.put_tensor(f"oh-{size}-{i}", t)
                ms[form].append((time.perf_counter() - t0) * 1e3)
                os.environ.pop("FERRY_TEST_ATTACH_SKIP_READINESS", None)
                s.remove(f"oh-{size}-{i}", force=True)
            out[str(size)] = {f: {"p50_ms": pct(v, 0.5), "p95_ms": pct(v, 0.95)}
                              for f, v in ms.items()}
        stores["event"].close()
    elif args.what == "bandwidth":
        n = 64 << 20
        t = torch.ones(n, dtype=torch.uint8, device="cuda")
        back = torch.empty_like(t)
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        torch.cuda.synchronize()
        put, get, d2h, h2d = [], [], [], []
        for i in range(9):
            t0 = time.perf_counter()
            store.put_tensor(f"bw-{i}", t)
            put.append(n / (time.perf_counter() - t0) / 1e9)
            t0 = time.perf_counter()
            store.get_tensor_into(f"bw-{i}", back)
            torch.cuda.current_stream().synchronize()
            get.append(n / (time.perf_counter() - t0) / 1e9)
            store.remove(f"bw-{i}", force=True)
            t0 = time.perf_counter()
            host.copy_(t, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            d2h.append(n / (time.perf_counter() - t0) / 1e9)
            t0 = time.perf_counter()
            t.copy_(host, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            h2d.append(n / (time.perf_counter() - t0) / 1e9)
        med = statistics.median
        put, get, d2h, h2d = put[1:], get[1:], d2h[1:], h2d[1:]  # the first warms up
        out = {"put_gbps": med(put), "get_gbps": med(get), "pinned_d2h_gbps": med(d2h),
               "pinned_h2d_gbps": med(h2d), "put_vs_d2h": med(put) / med(d2h),
               "get_vs_h2d": med(get) / med(h2d), "correct": bool(torch.equal(back, t))}
    store.close()
    return out


def median_of(rounds: dict) -> dict:
    """Each number's median over the rounds that have it, nested as they are."""
    def merge(items: list):
        items = [x for x in items if not (isinstance(x, dict) and "error" in x)]
        if not items:
            return None
        if isinstance(items[0], dict):
            return {k: merge([x[k] for x in items if k in x]) for k in items[0]}
        if isinstance(items[0], bool):
            return all(items)
        if isinstance(items[0], list):
            return statistics.median(v for x in items for v in x)
        return statistics.median(items)
    return {k: merge(v) for k, v in rounds.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ferry", default=os.environ.get("FERRY_BIN", str(ROOT / "build/ferry")))
    p.add_argument("--out")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--what", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    p.add_argument("--embedded", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--readiness", default="sync", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    rounds: dict = {}

    def measure(master_in_node: bool, whats: list) -> None:
        suffix = "_master_in_node" if master_in_node else ""
        with master_and_node(args.ferry, "2GiB", master_in_node) as (master, sock):

            def run(what: str, *extra: str) -> dict:
                out = subprocess.run([sys.executable, __file__, "--child", "--what", what,
                                      "--socket", sock, "--master", master, *extra],
                                     capture_output=True, text=True, timeout=300)
                if out.returncode != 0:
                    return {"error": out.stderr[-2000:]}
                return json.loads(out.stdout.strip().splitlines()[-1])

            for _ in range(3):
                for name, what, extra in whats:
                    rounds.setdefault(name + suffix, []).append(run(what, *extra))

    measure(False, [("no_stall_attached", "no_stall", []),
                    ("no_stall_embedded", "no_stall", ["--embedded"]),
                    ("overhead", "overhead", []), ("bandwidth_attached", "bandwidth", [])])
    measure(True, [("no_stall_attached", "no_stall", []),
                   ("bandwidth_attached", "bandwidth", [])])
    result = {"rounds": rounds, "median": median_of(rounds)}
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
