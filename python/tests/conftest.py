"""Shared fixtures: a target process (peer.py) driven over pipes, every read bounded."""

from __future__ import annotations

import hashlib
import json
import selectors
import subprocess
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import ferry

HERE = Path(__file__).resolve().parent
REPLY_TIMEOUT_S = 60.0


class Peer:
    """A peer.py process: its segment name and buffer addresses, and commands."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "peer.py"), *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        hello = json.loads(self._line())
        self.name: str = hello["name"]
        self.buffers: dict[str, int] = hello["buffers"]
        self.size: int = hello["size"]
        self.pid = self.proc.pid

    def _line(self, timeout: float = REPLY_TIMEOUT_S) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            self.proc.kill()
            raise TimeoutError(f"peer {self.proc.args} did not answer in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer exited with {self.proc.wait(timeout)}")
        return line.strip()

    def command(self, *words: object) -> str:
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        return self._line()

    def digest(self, kind: str, offset: int, length: int) -> str:
        return self.command("digest", kind, offset, length)

    def fill(self, kind: str, seed: int) -> None:
        assert self.command("fill", kind, seed) == "ok"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(30)


def sha(data) -> str:
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


def pattern(seed: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def addr(obj) -> int:
    """The address of `obj`'s memory, for the Mooncake API's int addresses."""
    return ferry.resolve(obj, writable=True).address


@pytest.fixture
def spawn_peer():
    peers: list[Peer] = []

    def make(*args: str) -> Peer:
        peers.append(Peer(*args))
        return peers[-1]

    yield make
    for p in peers:
        p.close()


def gpu_skip_reason() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    return None


@pytest.fixture
def etcd():
    """A fresh etcd_server.EtcdServer on loopback ports; skips the test, saying
    why, when etcd is not installed. Killed, and its data removed, after it."""
    from etcd_server import EtcdServer, etcd_binary

    if etcd_binary() is None:
        pytest.skip("etcd is not installed (Debian: etcd-server; scripts/install-deps)")
    server = EtcdServer()
    yield server
    server.close()


@pytest.fixture
def cluster():
    """A fresh store_cluster.Cluster: start `ferry master` and `ferry node` in it;
    its processes are stopped after the test."""
    from store_cluster import Cluster

    c = Cluster()
    yield c
    c.close()
