#!/usr/bin/python3
"""A mutation fuzzer for the tensor header's decoder (python/ferry/tensor.py).

libFuzzer does not reach Python, so this one is deterministic and plain: from a
fixed seed it takes valid objects (every dtype, FULL and SHARD layouts, the seed
corpus in tests/fuzz/corpus/fuzz_tensor_header/) and random bytes, mutates them
(bit flips, header fields set to edge values, resizes, splices) and hands them
to `decode` in the containers callers pass. Each input must either be refused
with a FerryError, or decode to a header that

- accounts for the object's bytes exactly (offset + data bytes = size),
- packs back to a header that decodes to the same thing, and
- gives an array of its shape and bytes from get_tensor's `_materialize`, or
  a FerryError there (NotSupported for dtypes numpy lacks).

Anything else (another exception, a wrong answer) is a failure: the input is
written to --artifact-dir and the run exits 1. Runs --runs inputs or for
--seconds; with --json, prints its statistics as one JSON line at the end.

    tensor_header_fuzz.py --seconds 20
    tensor_header_fuzz.py --replay FILE...
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import re
import struct
import sys
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")


def _load_ferry_modules():
    """ferry.tensor and ferry.errors from the source tree. The package's
    __init__ loads the compiled extension, which the decoder does not need, so
    the package is stood in for by an empty module with the same path."""
    pkg = types.ModuleType("ferry")
    pkg.__path__ = [os.path.join(PYTHON_SRC, "ferry")]
    sys.modules.setdefault("ferry", pkg)
    return importlib.import_module("ferry.tensor"), importlib.import_module("ferry.errors")


tensor, errors = _load_ferry_modules()
np = tensor.np
HEADER = tensor.HEADER_SIZE

# The header's fields: (offset, struct format), from tensor.py's layout.
FIELDS = ([(0, "<I"), (4, "<H"), (6, "<H"), (8, "<i"), (12, "<i"), (16, "<I"), (20, "<I"),
           (24, "<Q"), (32, "<Q")] + [(40 + 8 * i, "<q") for i in range(16)] +
          [(168, "<I"), (172, "<I")] +
          [(176 + 32 * a + off, fmt) for a in range(4)
           for off, fmt in ((0, "<i"), (4, "<i"), (8, "<i"), (12, "<i"), (16, "<i"),
                            (20, "<i"), (24, "<q"))])
EDGES = [0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 255, 256, 303, 304, 305, 1 << 31, (1 << 31) - 1,
         1 << 32, (1 << 32) - 1, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -1, -2,
         -(1 << 31), -(1 << 63)]


def _fit(value: int, fmt: str) -> int:
    """`value` wrapped into the range of `fmt`."""
    bits = struct.calcsize(fmt) * 8
    value &= (1 << bits) - 1
    if fmt[-1].islower() and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def valid_objects() -> list[bytes]:
    """Well-formed objects of every dtype and layout, to mutate."""
    out = []
    for code in tensor.DType:
        item = tensor.ITEM_SIZE[code]
        for shape in [(), (0,), (3,), (2, 3), (1, 0, 4), (2, 1, 1, 1, 1, 1, 1, 2)]:
            n = 1
            for d in shape:
                n *= d
            h = tensor.TensorHeader(dtype=code, global_shape=shape, local_shape=shape,
                                    data_bytes=n * item)
            out.append(h.pack() + bytes(range(256)) * (n * item // 256) +
                       bytes(n * item % 256))
    axes = (tensor.LayoutAxis(tensor.AxisKind.TP, 0, 1, 4, 1, 0, 2),
            tensor.LayoutAxis(tensor.AxisKind.EP, 1, 0, 2, -1, 7, 0))
    h = tensor.TensorHeader(dtype=tensor.DType.F32, global_shape=(4, 8), local_shape=(4, 2),
                            layout_kind=tensor.LayoutKind.SHARD, axes=axes, data_bytes=32)
    out.append(h.pack() + bytes(32))
    header, data = tensor.encode(np.arange(12, dtype=np.float16).reshape(3, 4))
    out.append(header + bytes(data))
    corpus = os.path.join(HERE, "corpus", "fuzz_tensor_header")
    if os.path.isdir(corpus):
        for name in sorted(os.listdir(corpus)):
            with open(os.path.join(corpus, name), "rb") as f:
                out.append(f.read())
    return out


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    if rng.random() < 0.05:
        return rng.randbytes(rng.choice([0, 1, 100, HEADER - 1, HEADER, HEADER + 64, 2000]))
    b = bytearray(rng.choice(seeds))
    for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
        r = rng.random()
        if r < 0.45 and len(b) >= HEADER:  # a field to an edge value, or near one
            off, fmt = rng.choice(FIELDS)
            v = rng.choice(EDGES) + rng.choice([0, 0, 0, -1, 1])
            if rng.random() < 0.2:  # sizes that agree with the object: the next check
                v = rng.choice([len(b), len(b) - HEADER, len(b) - HEADER - 1])
            struct.pack_into(fmt, b, off, _fit(v, fmt))
        elif r < 0.55 and len(b) >= HEADER:  # one dimension of both shapes
            i = rng.randrange(8)
            v = _fit(rng.choice(EDGES) + rng.choice([0, 0, -1, 1]), "<q")
            struct.pack_into("<q", b, 40 + 8 * i, v)
            struct.pack_into("<q", b, 104 + 8 * i, v)
        elif r < 0.65 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif r < 0.75 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif r < 0.85:  # truncate or extend the data
            if rng.random() < 0.5 and b:
                del b[rng.randrange(len(b)):]
            else:
                b += rng.randbytes(rng.choice([1, 2, 4, 8, 64]))
        elif r < 0.95 and len(b) >= HEADER:  # another object's data, or head
            other = rng.choice(seeds)
            cut = rng.randrange(min(len(b), len(other)) + 1)
            b = b[:cut] + bytearray(other[cut:])
        elif len(b) >= HEADER:  # swap two fields
            (o1, f1), (o2, f2) = rng.choice(FIELDS), rng.choice(FIELDS)
            v1, v2 = struct.unpack_from(f1, b, o1)[0], struct.unpack_from(f2, b, o2)[0]
            struct.pack_into(f1, b, o1, _fit(v2, f1))
            struct.pack_into(f2, b, o2, _fit(v1, f2))
    return bytes(b)


def containers(rng: random.Random, data: bytes) -> object:
    """`data` as one of the buffers callers hand decode."""
    r = rng.random()
    if r < 0.55:
        return data
    if r < 0.7:
        return bytearray(data)
    if r < 0.8:
        return memoryview(data)
    if r < 0.9:
        return np.frombuffer(data, np.uint8)
    if r < 0.95 and len(data) % 4 == 0:
        return np.frombuffer(data, np.uint8).view(np.float32).reshape(-1, 1)
    return np.frombuffer(data, np.uint8)


class Failure(Exception):
    pass


def check(data: bytes, buf: object) -> str:
    """One input: the outcome's name when all is well; Failure otherwise."""
    try:
        header, offset, nbytes = tensor.decode(buf)
    except errors.FerryError as e:
        # What was refused, not the values: a rough measure of the checks reached.
        what = re.sub(r"0x[0-9a-f]+|[-0-9(),]+", " ", str(e).partition("): ")[2] or str(e))
        return f"{type(e).__name__}: {' '.join(what.split()[:4])}"
    except Exception as e:
        raise Failure(f"decode raised {type(e).__name__}: {e}") from e
    if offset != header.data_offset or nbytes != header.data_bytes or \
            offset + nbytes != len(data):
        raise Failure(f"decode accounts for {offset}+{nbytes} of {len(data)} bytes")
    try:
        again, _, _ = tensor.decode(header.pack() + data[HEADER:])
    except Exception as e:
        raise Failure(f"the decoded header packs to one that decode refuses: {e!r}") from e
    if again != header:
        raise Failure(f"the decoded header packs to another: {header} != {again}")
    try:
        arr = tensor._materialize(header, data, None)
    except errors.FerryError as e:
        return f"materialize {type(e).__name__}"
    except Exception as e:
        raise Failure(f"materializing {header} raised {type(e).__name__}: {e}") from e
    if tuple(arr.shape) != header.shape or arr.nbytes != nbytes or \
            arr.tobytes() != data[offset:offset + nbytes]:
        raise Failure(f"materialized {arr.shape} {arr.dtype} for {header}")
    return "decoded"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--seconds", type=float, default=0, help="run this long (0: --runs)")
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--artifact-dir", default=".")
    ap.add_argument("--json", action="store_true", help="print statistics as JSON at the end")
    ap.add_argument("--replay", nargs="*", help="check these files, then stop")
    args = ap.parse_args()

    if args.replay is not None:
        for path in args.replay:
            with open(path, "rb") as f:
                data = f.read()
            print(f"{path}: {check(data, data)}")
        return 0

    rng = random.Random(args.seed)
    seeds = valid_objects()
    outcomes: dict[str, int] = {}
    runs = 0
    start = time.monotonic()
    end = start + args.seconds
    while (time.monotonic() < end) if args.seconds else (runs < args.runs):
        data = seeds[runs] if runs < len(seeds) else mutate(rng, seeds)
        buf = containers(rng, data)
        try:
            outcome = check(data, buf)
        except Failure as e:
            path = os.path.join(args.artifact_dir, f"tensor-header-crash-{runs}.bin")
            with open(path, "wb") as f:
                f.write(data)
            sys.stderr.write(f"fuzz_tensor_header: run {runs} (seed {args.seed}, a "
                             f"{type(buf).__name__}): {e}\n{traceback.format_exc()}"
                             f"input written to {path}\n")
            return 1
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        runs += 1
    elapsed = time.monotonic() - start
    stats = {"runs": runs, "execs_per_sec": int(runs / elapsed) if elapsed else 0,
             "outcomes": len(outcomes), "decoded": outcomes.get("decoded", 0)}
    sys.stderr.write(f"fuzz_tensor_header: {runs} inputs in {elapsed:.1f} s, "
                     f"{len(outcomes)} distinct outcomes, {stats['decoded']} decoded\n")
    if args.json:
        print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
