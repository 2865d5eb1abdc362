"""The processes the store tests run: `ferry master`, `ferry node` and
store_client.py (Proc, Cluster), the skips for a missing binary or option, and
the Mooncake-compat helpers. Imported by test_store*.py and
test_compat_mooncake_store*.py."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import ferry

HERE = Path(__file__).resolve().parent
FERRY_BIN = Path(os.environ.get("FERRY_BIN", HERE.parents[1] / "build" / "ferry"))
REPLY_TIMEOUT_S = 60.0
MiB = 1 << 20
P2P = "P2PHANDSHAKE"


def wait_until(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """A bounded wait for a state, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout} s")
        time.sleep(0.02)


class Proc:
    """A child process that prints JSON lines; every read is bounded."""

    def __init__(self, args: list, **kwargs) -> None:
        self.proc = subprocess.Popen([str(a) for a in args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, **kwargs)
        self.pid = self.proc.pid

    def line(self, timeout: float = REPLY_TIMEOUT_S) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            self.proc.kill()
            raise TimeoutError(f"{self.proc.args} printed nothing in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.proc.args} exited with {self.proc.wait(timeout)}")
        return line.strip()

    def json(self, timeout: float = REPLY_TIMEOUT_S) -> dict:
        return json.loads(self.line(timeout))

    def request(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.json()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


@lru_cache(maxsize=None)
def node_help() -> Optional[str]:
    if not FERRY_BIN.exists():
        return None
    return subprocess.run([str(FERRY_BIN), "node", "--help"], capture_output=True, text=True,
                          timeout=30).stdout


def cluster_skip_reason() -> Optional[str]:
    if node_help() is None:
        return f"no ferry binary at {FERRY_BIN} (set FERRY_BIN)"
    return None


def attached_skip_reason() -> Optional[str]:
    if cluster_skip_reason():
        return cluster_skip_reason()
    if "--socket" not in node_help():
        return f"{FERRY_BIN} node has no --socket option yet (attached clients)"
    return None


needs_cluster = pytest.mark.skipif(cluster_skip_reason() is not None,
                                   reason=str(cluster_skip_reason()))
needs_attach = pytest.mark.skipif(attached_skip_reason() is not None,
                                  reason=str(attached_skip_reason()))


class Cluster:
    def __init__(self) -> None:
        self.procs: list[Proc] = []
        self.master: Optional[str] = None
        self.dir = tempfile.mkdtemp(prefix="ferry-", dir="/tmp")  # short: sun_path

    def spawn(self, *args, **kwargs) -> Proc:
        self.procs.append(Proc(list(args), **kwargs))
        return self.procs[-1]

    def start_master(self, *args: str) -> str:
        m = self.spawn(FERRY_BIN, "master", "--http-port", "-1", *args)
        self.master = m.json()["address"]
        return self.master

    def start_node(self, *args: str, size: str = "64MiB") -> tuple[Proc, dict]:
        node = self.spawn(FERRY_BIN, "node", "--master", self.master, "--segment-size", size,
                          *args)
        return node, node.json()

    def socket_path(self, name: str = "node.sock") -> str:
        return os.path.join(self.dir, name)

    def client(self, mode: str, *args, **kwargs) -> Proc:
        return self.spawn(sys.executable, HERE / "store_client.py", mode, *args, **kwargs)

    def wait_nodes(self, n: int) -> None:
        with ferry.Store(master=self.master, local_memory=0) as s:
            wait_for_nodes(s, n)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def wait_for_nodes(store: ferry.Store, n: int) -> None:
    wait_until(f"{n} nodes mounted", lambda: store.stats()["nodes"] == n)


# Mooncake compat: a cluster its tests share, and a client set up against it.


def attached_cluster() -> Cluster:
    """One master, and one node serving attached clients on its socket."""
    c = Cluster()
    c.start_master()
    c.node_socket = c.socket_path()
    if attached_skip_reason() is None:
        c.start_node("--socket", c.node_socket, size="64MiB")
        c.wait_nodes(1)
    return c


@pytest.fixture(scope="module")
def module_cluster():
    """One attached cluster shared by a module's tests (import it as `cluster`)."""
    c = attached_cluster()
    yield c
    c.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def connected(cluster: Cluster, segment: int = 32 * MiB, **kw) -> Any:
    """A MooncakeDistributedStore set up against `cluster`'s master."""
    from ferry.compat.mooncake import MooncakeDistributedStore

    s = MooncakeDistributedStore(**kw)
    assert s.setup("127.0.0.1", P2P, segment, 16 * MiB, "tcp", "", cluster.master) == 0, \
        s.last_error()
    return s
