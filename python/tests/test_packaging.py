"""The package's surface: its version (one place, the CMake project's), PEP 561
types, Op, and the benchmark hook kept out of the extension's API."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import ferry
from ferry import _ferry

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_cmake_project_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", ferry.__version__)
    cmake = ROOT / "CMakeLists.txt"
    if not cmake.exists():
        pytest.skip(f"no {cmake}: the package was copied without the sources")
    m = re.search(r"^project\(ferry VERSION (\S+)", cmake.read_text(), re.M)
    assert m and m.group(1) == ferry.__version__


def test_the_package_ships_its_types():
    assert (Path(ferry.__file__).parent / "py.typed").is_file()


def test_op_is_an_int_enum():
    assert issubclass(ferry.Op, int)
    assert (ferry.Op.READ, ferry.Op.WRITE) == (0, 1)
    assert ferry.READ is ferry.Op.READ and ferry.WRITE is ferry.Op.WRITE
    assert ferry.Read(bytearray(1), "h:1", 8).op is ferry.Op.READ
    assert ferry.Write(bytearray(1), "h:1", 8).op is ferry.Op.WRITE


def test_async_calls_take_what_the_sync_ones_take():
    engine = ferry.TransferEngine
    for sync, async_ in ((engine.read, engine.read_async), (engine.write, engine.write_async)):
        s, a = inspect.signature(sync), inspect.signature(async_)
        assert list(s.parameters.values()) == list(a.parameters.values())
        assert a.return_annotation in (ferry.Transfer, "Transfer")


def test_ops_as_ints_and_the_async_keywords(spawn_peer):
    peer = spawn_peer("--transport", "tcp")
    with ferry.TransferEngine(transport="tcp") as engine:
        seg = engine.open_segment(peer.name)
        remote = peer.buffers["numpy"]
        src = np.arange(4096, dtype=np.uint32).view(np.uint8)[:4096].copy()
        engine.transfer([ferry.Request(1, src, seg, remote)])  # 1: a write
        back = np.zeros(4096, np.uint8)
        engine.transfer([ferry.Request(0, back, seg, remote)])
        assert back.tobytes() == src.tobytes()
        with pytest.raises(ferry.InvalidArgument, match="op must be"):
            engine.transfer([ferry.Request(2, src, seg, remote)])
        back[:] = 0
        with engine.read_async(seg, back, remote, length=2048, timeout=10,
                               stream=None, already_ready=False) as t:
            assert t.wait()
        assert back[:2048].tobytes() == src[:2048].tobytes() and not back[2048:].any()


def test_the_bench_hook_is_outside_the_api(spawn_peer):
    assert not any(name.startswith("_bench") for name in dir(_ferry) if name != "_bench")
    peer = spawn_peer("--transport", "tcp")
    with ferry.TransferEngine(transport="tcp") as engine:
        seg = engine.open_segment(peer.name)
        src = np.ones(4096, np.uint8)
        local = ferry.resolve(src, writable=False).address
        ns = _ferry._bench.sync_write_latency(engine._engine, local, seg.id,
                                              peer.buffers["numpy"], 4096, 3)
        assert len(ns) == 3 and all(n > 0 for n in ns)
