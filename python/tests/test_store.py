"""ferry.Store: embedded round trips and bad input, a cluster of `ferry master`
and `ferry node` processes, and clients attached to a node's Unix socket."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest

import ferry
from conftest import gpu_skip_reason, pattern
from store_client import value_bytes, writer_value

HERE = Path(__file__).resolve().parent
FERRY_BIN = Path(os.environ.get("FERRY_BIN", HERE.parents[1] / "build" / "ferry"))
REPLY_TIMEOUT_S = 60.0
MiB = 1 << 20

pytestmark = pytest.mark.skipif(
    not hasattr(ferry._ferry, "Store"),
    reason="the extension was built without the store (python/build-ext.sh found no "
    "libferry_store.a)")


@pytest.fixture
def store():
    with ferry.Store(local_memory=192 * MiB) as s:
        yield s


def wait_until(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """A bounded wait for a state, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout} s")
        time.sleep(0.02)


# Embedded: master and node in this process.


@pytest.mark.parametrize("size", [1, 4096, MiB, 64 * MiB])
def test_put_get_round_trip(store, size):
    data = pattern(size, size)
    store.put("np", data)
    store.put("bytes", data.tobytes())
    assert store.get("np") == data.tobytes()
    assert store.get("bytes") == data.tobytes()


@pytest.mark.parametrize("size", [1, 4096, MiB, 64 * MiB])
@pytest.mark.parametrize("kind", ["allocated", "numpy"])
def test_put_from_get_into_round_trip(store, size, kind):
    if kind == "allocated":
        src, dst = store.allocate_buffer(size), store.allocate_buffer(size)
        assert not dst.readonly and dst.nbytes == size
    else:
        src, dst = np.empty(size, np.uint8), np.zeros(size, np.uint8)
        store.batch_register_buffer([src, dst])
    np.frombuffer(src, np.uint8)[:] = pattern(size + 1, size)
    store.put_from("k", src)
    assert store.get_into("k", dst) == size
    assert bytes(dst) == bytes(src)
    assert store.get("k") == bytes(src)
    store.batch_unregister_buffer([src, dst])
    with pytest.raises(ferry.InvalidArgument):
        store.get_into("k", dst)  # no longer registered


def test_allocated_memory_outlives_the_store():
    s = ferry.Store(local_memory=4 * MiB)
    view = s.allocate_buffer(MiB)
    arr = np.frombuffer(view, np.uint8)
    arr[:] = 7
    s.put_from("k", view)
    s.close()
    del s
    gc.collect()
    arr[-1] = 8  # still mapped: the memoryview holds the Memory
    assert arr[0] == 7 and arr[-1] == 8 and view.nbytes == MiB


def test_batch_forms(store):
    sizes = [1, 100, 4096, MiB]
    values = [pattern(i, n) for i, n in enumerate(sizes)]
    kinds = [values[0].tobytes(), bytearray(values[1]), memoryview(values[2]), values[3]]
    keys = [f"b{i}" for i in range(len(sizes))]
    assert store.batch_put(keys, kinds) == [None] * len(keys)

    got = store.batch_get(keys + ["missing"])
    assert got[:-1] == [v.tobytes() for v in values]
    assert isinstance(got[-1], ferry.NotFound)
    assert store.batch_exists(keys + ["missing"]) == [True] * len(keys) + [False]

    # Slices of one allocated buffer; one destination too small for its value.
    area = store.allocate_buffer(4 * MiB)
    dsts = [area[i * MiB:(i + 1) * MiB] for i in range(4)]
    dsts[2] = area[2 * MiB:2 * MiB + 10]
    got = store.batch_get_into(keys, dsts)
    assert got[0] == 1 and got[1] == 100 and got[3] == MiB
    assert isinstance(got[2], ferry.OutOfRange)
    assert bytes(dsts[0][:1]) == values[0].tobytes() and bytes(dsts[3]) == values[3].tobytes()

    out_keys = ["from0", "from1", "b0"]  # the last exists already
    res = store.batch_put_from(out_keys, [area[:MiB], area[MiB:MiB + 100], area[:5]])
    assert res[:2] == [None, None] and isinstance(res[2], ferry.AlreadyExists)
    assert store.get("from1") == values[1].tobytes()

    assert store.batch_pin(keys, "soft", ttl=60) == [None] * len(keys)
    assert store.batch_pin(keys, None) == [None] * len(keys)
    res = store.batch_remove(keys + ["missing"])
    assert res[:-1] == [None] * len(keys) and isinstance(res[-1], ferry.NotFound)
    assert store.batch_exists(keys) == [False] * len(keys)
    assert store.batch_exists(["from0"]) == [True]


def test_exists_remove_pin(store):
    assert not store.exists("k")
    store.put("k", b"v")
    assert store.exists("k")
    store.pin("k")
    store.pin("k", "soft", ttl=30)
    store.pin("k", None)
    with pytest.raises(ferry.NotFound):
        store.pin("unknown")
    with pytest.raises(ferry.InvalidArgument):
        store.pin("k", "sticky")
    store.remove("k")
    assert not store.exists("k")
    with pytest.raises(ferry.NotFound):
        store.remove("k")
    store.put("k", b"again")  # the key is free once removed
    assert store.get("k") == b"again"


def test_hard_pins_survive_eviction():
    with ferry.Store(local_memory=16 * MiB) as s:
        value = pattern(1, 4 * MiB)
        s.put("pinned", value, pin="hard")
        for i in range(12):  # three times what fits: the others get evicted
            s.put(f"filler{i}", pattern(i + 2, 4 * MiB))
        assert s.get("pinned") == value.tobytes()
        assert not all(s.batch_exists([f"filler{i}" for i in range(12)]))
        # With every byte pinned, nothing is evictable.
        pinned = ["pinned"]
        for i in range(3):
            err = s.batch_put([f"more{i}"], [pattern(20 + i, 4 * MiB)], pin="hard")[0]
            if err is not None:
                assert isinstance(err, ferry.ResourceExhausted)
                break
            pinned.append(f"more{i}")
        with pytest.raises(ferry.ResourceExhausted):
            s.put("one-too-many", pattern(30, 4 * MiB), pin="hard")
        assert s.batch_exists(pinned) == [True] * len(pinned)


def test_stats(store):
    st = store.stats()
    assert st == {"capacity": 192 * MiB, "used": 0, "nodes": 1, "objects": 0}
    store.batch_put(["s1", "s2", "s3"], [b"x" * 1000, b"y" * 4096, b"z"])
    st = store.stats()
    assert st["objects"] == 3 and st["nodes"] == 1
    assert 1000 + 4096 + 1 <= st["used"] <= st["capacity"]
    store.remove("s2")
    assert store.stats()["objects"] == 2


def test_bad_input_leaves_the_store_working(store):
    kept = {f"kept{i}": pattern(100 + i, 4096 * (i + 1)).tobytes() for i in range(4)}
    for k, v in kept.items():
        store.put(k, v)

    def still_working():
        assert store.batch_get(list(kept)) == list(kept.values())

    registered = np.zeros(8192, np.uint8)
    store.register_buffer(registered)
    unregistered = np.zeros(8192, np.uint8)
    small = registered[:100]
    registered[:] = 0xAB
    cases = [
        (ferry.InvalidArgument, lambda: store.put("", b"v")),
        (ferry.InvalidArgument, lambda: store.put(b"k" * 1025, b"v")),
        (ferry.InvalidArgument, lambda: store.get("k" * 1025)),
        (ferry.InvalidArgument, lambda: store.put("empty", b"")),
        (ferry.InvalidArgument, lambda: store.put("empty", np.zeros(0, np.uint8))),
        (ferry.NotFound, lambda: store.get("unknown")),
        (ferry.NotFound, lambda: store.get_into("unknown", registered)),
        (ferry.InvalidArgument, lambda: store.get_into("kept1", unregistered)),
        (ferry.InvalidArgument, lambda: store.put_from("new", unregistered)),
        (ferry.OutOfRange, lambda: store.get_into("kept1", small)),
        (ferry.AlreadyExists, lambda: store.put("kept0", b"other")),
        (ferry.InvalidArgument, lambda: store.put(42, b"v")),
        (ferry.InvalidArgument, lambda: store.get(bytearray(b"kept0"))),
        (ferry.InvalidArgument, lambda: store.exists(None)),
        (ferry.InvalidArgument, lambda: store.put("k", "a str is not bytes")),
        (ferry.InvalidArgument, lambda: store.batch_put(["a", "b"], [b"1"])),
        (ferry.InvalidArgument, lambda: store.batch_get_into(["a"], [])),
        (ferry.InvalidArgument, lambda: store.put("k", b"v", replicas=0)),
        (ferry.InvalidArgument, lambda: store.put("k", b"v", replicas=2)),  # one node
        (ferry.AlreadyExists, lambda: store.register_buffer(registered[10:20])),
    ]
    for i, (error, call) in enumerate(cases):
        with pytest.raises(error):
            call()
        still_working()
        # Nothing half-written: a failed put left its key free.
        assert not store.exists("empty") and not store.exists("new"), i
    # The destination of a refused get_into is untouched.
    assert (registered == 0xAB).all() and (unregistered == 0).all()
    store.put("k" * 1024, b"longest key")  # the limit itself is fine
    assert store.get("k" * 1024) == b"longest key"
    assert isinstance(store.batch_put(["", "ok"], [b"v", b"v"])[0], ferry.InvalidArgument)
    assert store.get("ok") == b"v"


def test_closed_store_raises():
    s = ferry.Store(local_memory=4 * MiB)
    s.put("k", b"v")
    s.close()
    s.close()  # idempotent
    with pytest.raises(ferry.InvalidArgument, match="closed"):
        s.get("k")
    with pytest.raises(ferry.InvalidArgument, match="closed"):
        s.segment


def test_str_and_bytes_keys_are_one_key(store):
    store.put("k", b"from str")
    assert store.get(b"k") == b"from str"
    with pytest.raises(ferry.AlreadyExists):
        store.put(b"k", b"from bytes")
    store.put("ключ", b"utf-8")
    assert store.get("ключ".encode()) == b"utf-8"
    assert store.batch_exists([b"k", "k", "ключ"]) == [True, True, True]
    store.remove(b"k")
    assert not store.exists("k")


# Processes: `ferry master`, `ferry node`, and store_client.py.


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


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    c.close()


def wait_for_nodes(store: ferry.Store, n: int) -> None:
    wait_until(f"{n} nodes mounted", lambda: store.stats()["nodes"] == n)


@needs_cluster
@pytest.mark.parametrize("killed", [0, 1])
def test_replicas_survive_a_dead_node(cluster, killed):
    addr = cluster.start_master()
    nodes = [cluster.start_node()[0] for _ in range(2)]
    with ferry.Store(master=addr, local_memory=0, replicas=2) as s:
        assert s.master_address == addr
        wait_for_nodes(s, 2)
        value = pattern(5, 3 * MiB)
        s.put("replicated", value)
        nodes[killed].stop(signal.SIGKILL)
        assert s.get("replicated") == value.tobytes()
        assert s.get(b"replicated") == value.tobytes()
        # The survivor alone cannot hold two copies of a new value.
        with pytest.raises(ferry.FerryError):
            s.put("two-copies", b"v")


def expect_ready(p: Proc) -> None:
    hello = p.json()
    assert "pid" in hello, hello


@needs_attach
def test_attached_clients_share_values(cluster):
    cluster.start_master()
    path = cluster.socket_path()
    node, hello = cluster.start_node("--socket", path)
    assert hello["socket"] == path and hello["pid"] == node.pid
    cluster.wait_nodes(1)
    a, b = cluster.client("serve", path, 4 * MiB), cluster.client("serve", path, 4 * MiB)
    expect_ready(a)
    expect_ready(b)
    sizes = [1, 4096, MiB, 3 * MiB]
    for writer, reader, name in ((a, b, "a"), (b, a, "b")):
        for i, size in enumerate(sizes):
            for how in ("plain", "from"):
                key, seed = f"{name}-{how}-{i}", ord(name) * 100 + (how == "from") * 10 + i
                want = value_bytes(seed, size)
                r = writer.request(op="put", key=key, seed=seed, size=size, how=how)
                assert r == {"ok": True}, r
                for get in ("plain", "into"):
                    r = reader.request(op="get", key=key, how=get)
                    assert r.get("nbytes") == size, r
                    assert r["sha"] == hashlib.sha256(want).hexdigest()
    assert a.request(op="exists", key="b-plain-0") == {"ok": True, "exists": True}
    assert b.request(op="remove", key="a-plain-0") == {"ok": True}
    assert a.request(op="exists", key="a-plain-0") == {"ok": True, "exists": False}
    r = a.request(op="get", key="a-plain-0", how="plain")
    assert r["error"] == "NotFound", r
    r = b.request(op="put", key="a-from-1", seed=1, size=10, how="plain")
    assert r["error"] == "AlreadyExists", r


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@needs_attach
def test_clients_killed_mid_put(cluster):
    cluster.start_master("--put-timeout-ms", "1000")
    path = cluster.socket_path()
    node, _ = cluster.start_node("--socket", path, size="128MiB")
    cluster.wait_nodes(1)
    size, kills, rng = 8 * MiB, 100, random.Random(1234)
    logs: dict[str, list[str]] = {}
    baseline = None
    for n in range(kills):
        tag = f"kill{n}"
        w = cluster.client("writer", path, tag, size)
        expect_ready(w)
        early = []
        if n == kills - 1:
            # The last is killed once two of its puts completed: those must stay.
            while "done 1" not in early and len(early) < 50:  # not an endless error stream
                early.append(w.line())
        else:
            time.sleep(rng.uniform(0, 0.05))
        w.proc.kill()
        w.proc.wait(30)
        logs[tag] = early + w.proc.stdout.read().split("\n")  # the child is dead: EOF is near
        w.stop()
        cluster.procs.remove(w)
        if n == 9:
            baseline = (vm_rss(node.pid), fd_count(node.pid))
    assert node.proc.poll() is None, "the node died"
    errors = [line for lines in logs.values() for line in lines if line.startswith("error")]
    assert not errors, errors[:5]

    # The node released what the dead clients held (their connections, mapped
    # buffers); it may still be finishing with the last ones.
    rss0, fds0 = baseline
    wait_until("node fds and RSS back to the level after 10 kills",
               lambda: fd_count(node.pid) <= fds0 + 2 and vm_rss(node.pid) <= rss0 + 64 * MiB)

    # Every key a client began is complete with the right content, or free
    # again (its put aborted, or reclaimed after the master's put timeout):
    # each client's last key, and all keys of every tenth client.
    keys, in_flight = [], 0
    for n, (tag, lines) in enumerate(logs.items()):
        begun = [line.split()[1] for line in lines if line.startswith("begin ")]
        done = {line.split()[1] for line in lines if line.startswith("done ")}
        in_flight += bool(begun) and begun[-1] not in done
        keys += [f"{tag}-{i}" for i in (begun if n % 10 == 9 else begun[-1:])]
    assert in_flight > 0, "no kill landed inside a put"
    with ferry.Store.attach(path) as s:
        # Looked up before any put here can evict them.
        complete = {k for k, there in zip(keys, s.batch_exists(keys)) if there}
        last = f"kill{kills - 1}"
        assert {f"{last}-0", f"{last}-1"} <= complete, complete
        for key in complete:
            assert s.get(key) == writer_value(key, size), f"{key} has the wrong bytes"
        pending = [k for k in keys if k not in complete]
        deadline = time.monotonic() + 30
        while pending:
            key = pending.pop(0)
            try:
                s.put(key, writer_value(key, size))
            except ferry.Busy:
                # Still being written by a dead client until the master reclaims it.
                assert time.monotonic() < deadline, f"{key} is still being written"
                pending.append(key)
                time.sleep(0.05)

        s.put("fresh", b"after the kills")
        assert s.get("fresh") == b"after the kills"
        s.remove("fresh")
        assert not s.exists("fresh")


@needs_attach
def test_node_restart_under_an_attached_client(cluster):
    cluster.start_master()
    path = cluster.socket_path()
    node, _ = cluster.start_node("--socket", path)
    cluster.wait_nodes(1)
    with ferry.Store.attach(path, timeout=5.0) as s:
        buf = s.allocate_buffer(MiB)
        arr = np.frombuffer(buf, np.uint8)
        arr[:] = pattern(1, MiB)
        s.put_from("before", buf)
        assert s.get("before") == arr.tobytes()

        node.stop(signal.SIGTERM)
        cluster.start_node("--socket", path)
        with pytest.raises((ferry.ConnectionLost, ferry.Unavailable)):
            s.get("before")
        # Attached again; the old node's memory, and the value, went with it.
        assert not s.exists("before")
        cluster.wait_nodes(1)
        s.put("after", b"plain")
        assert s.get("after") == b"plain"
        # The allocated memory is shared with the new node too.
        arr[:] = pattern(2, MiB)
        s.put_from("after-from", buf)
        arr[:] = 0
        assert s.get_into("after-from", buf) == MiB
        assert arr.tobytes() == pattern(2, MiB).tobytes()


def get_in_thread(s: ferry.Store, key: str, result: list) -> threading.Thread:
    """Starts s.get(key) on a thread and returns once the thread is inside it."""
    def run():
        try:
            result.append(s.get(key))
        except ferry.FerryError as e:
            result.append(e)

    t = threading.Thread(target=run)
    t.start()
    wait_until("the thread inside get",
               lambda: getattr(sys._current_frames().get(t.ident), "f_code", None)
               is ferry.Store.get.__code__, timeout=10)
    return t


@needs_attach
def test_blocking_calls_release_the_gil(cluster):
    cluster.start_master()
    path = cluster.socket_path()
    node, _ = cluster.start_node("--socket", path)
    cluster.wait_nodes(1)
    with ferry.Store.attach(path, timeout=5.0) as s:
        s.put("k", b"value")
        result: list = []
        node.proc.send_signal(signal.SIGSTOP)
        try:
            # The node answers only once this thread resumes it, which it can
            # do only while the other thread waits inside get without the GIL.
            t = get_in_thread(s, "k", result)
            time.sleep(0.2)
        finally:
            node.proc.send_signal(signal.SIGCONT)
        t.join(30)
        assert result == [b"value"]

        # close() while a call is in flight: that call keeps the store alive
        # until it returns.
        result.clear()
        node.proc.send_signal(signal.SIGSTOP)
        try:
            t = get_in_thread(s, "k", result)
            s.close()
            assert t.is_alive()
        finally:
            node.proc.send_signal(signal.SIGCONT)
        t.join(30)
        assert result == [b"value"]
        with pytest.raises(ferry.InvalidArgument, match="closed"):
            s.get("k")


@needs_attach
def test_node_closes_a_garbage_connection(cluster):
    cluster.start_master()
    path = cluster.socket_path()
    cluster.start_node("--socket", path)
    cluster.wait_nodes(1)
    assert os.stat(path).st_mode & 0o777 == 0o600
    with ferry.Store.attach(path) as s:
        s.put("k", b"before")
        # Garbage instead of a handshake: the node closes the connection.
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.settimeout(30)
        raw.connect(path)
        raw.sendall(b"\xff" * 16 + random.Random(7).randbytes(4096))
        try:
            while raw.recv(65536):
                pass  # whatever the node answers, then EOF; a timeout fails the test
        except ConnectionResetError:
            pass  # closed with our garbage still unread
        raw.close()
        assert s.get("k") == b"before"
        s.put("k2", b"after")
        assert s.get("k2") == b"after"


@needs_attach
@pytest.mark.skipif(os.geteuid() != 0, reason="attaching as uid 65534 needs root to setuid")
def test_node_refuses_another_uid(cluster):
    cluster.start_master()
    path, allowed = cluster.socket_path(), cluster.socket_path("allowed.sock")
    cluster.start_node("--socket", path)
    cluster.start_node("--socket", allowed, "--allow-uid", "65534")
    cluster.wait_nodes(2)

    def attach_as_nobody(p: str) -> dict:
        return cluster.client("attach-as", 65534, p).json()

    # The socket's mode (0600) stops another uid at connect...
    os.chmod(cluster.dir, 0o755)  # not mkdtemp's 0700, which would stop it first
    r = attach_as_nobody(path)
    assert r.get("error") == "Unavailable" and "Permission denied" in r["message"], r
    # ...and past that, the node's SO_PEERCRED check, with its reason.
    os.chmod(path, 0o666)
    r = attach_as_nobody(path)
    assert r.get("error") == "Unavailable" and "65534" in r["message"], r
    # --allow-uid opens the socket's mode itself, and lets that uid in.
    assert os.stat(allowed).st_mode & 0o777 == 0o666
    assert attach_as_nobody(allowed) == {"attached": True}
    with ferry.Store.attach(path) as s:  # this uid still may
        s.put("k", b"v")
        assert s.get("k") == b"v"


def multi_round_trip(s: ferry.Store, prefix: str) -> None:
    """One object from several buffers of uneven sizes, read back split elsewhere."""
    sizes = [100, MiB, 3, 5 * MiB]
    total = sum(sizes)
    src = np.frombuffer(s.allocate_buffer(total), np.uint8)
    src[:] = np.random.default_rng(7).integers(0, 256, total, dtype=np.uint8)
    dst = np.frombuffer(s.allocate_buffer(total + 5), np.uint8)
    parts, off = [], 0
    for n in sizes:
        parts.append(src[off:off + n])
        off += n
    assert s.batch_put_from_multi([prefix + "m"], [parts]) == [None]
    dst[:] = 0
    third = total // 3
    assert s.batch_get_into_multi([prefix + "m"], [[dst[:third], dst[third:]]]) == [total]
    assert np.array_equal(dst[:total], src)
    # put_parts copies from any host memory, with no concatenation in Python.
    s.put_parts(prefix + "p", [bytes(p) for p in parts])
    assert s.get(prefix + "p") == src.tobytes()
    # Too little room: OutOfRange, and the buffers untouched.
    dst[:] = 0xEE
    out = s.batch_get_into_multi([prefix + "m"], [[dst[:10], dst[10:total - 1]]])
    assert isinstance(out[0], ferry.OutOfRange)
    assert (dst == 0xEE).all()
    # A part in memory the store does not know: refused, nothing stored.
    out = s.batch_put_from_multi([prefix + "x"], [[parts[0], np.zeros(10, np.uint8)]])
    assert isinstance(out[0], ferry.InvalidArgument)
    assert not s.exists(prefix + "x")


def test_multi_buffer_objects_embedded(store):
    multi_round_trip(store, "embedded/")


@needs_attach
def test_multi_buffer_objects_attached(cluster):
    cluster.start_master()
    path = cluster.socket_path()
    cluster.start_node("--socket", path)
    with ferry.Store.attach(path) as s:
        multi_round_trip(s, "attached/")


@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
def test_registered_gpu_memory_follows_the_current_stream():
    """vLLM's pattern on an embedded store: a registered GPU KV cache, one object
    per block from a pointer per layer, written by a kernel still running on a
    side stream that the current stream has joined; no synchronize before the put."""
    import torch

    layers, block = 4, 1 << 20
    with ferry.Store(local_memory=64 << 20) as s:
        kv = torch.zeros(layers, 8, block, dtype=torch.uint8, device="cuda")
        s.register_buffer(kv)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # the producer is still busy at the put
            kv[:, 3].fill_(0x3C)
        torch.cuda.current_stream().wait_stream(side)
        assert s.batch_put_from_multi(["block3"], [[kv[l, 3] for l in range(layers)]]) == [None]
        back = torch.empty(layers, block, dtype=torch.uint8, device="cuda")
        s.register_buffer(back)
        # The read lands after work already queued on the current stream.
        torch.cuda._sleep(50_000_000)
        back.fill_(0)
        assert s.batch_get_into_multi(["block3"], [[back[l] for l in range(layers)]]) == [
            layers * block]
        assert bool((back == 0x3C).all())
        # The same value read back to the host.
        assert s.get("block3") == bytes([0x3C]) * (layers * block)


def expect_prefix_checks(s: ferry.Store) -> None:
    """A get with expect= reads only a value that begins with those bytes, and
    leaves the buffers untouched otherwise."""
    s.put("ex", b"HEADER" + bytes(range(200)))
    head, body = s.allocate_buffer(6), np.zeros(200, np.uint8)
    assert s.batch_get_into_parts(["ex"], [[head, body]], expect=b"HEADER") == [206]
    assert bytes(head) == b"HEADER" and bytes(body) == bytes(range(200))
    body[:] = 7
    out = s.batch_get_into_parts(["ex"], [[head, body]], expect=b"HEADEX")
    assert isinstance(out[0], ferry.InvalidArgument) and "expected bytes" in str(out[0])
    assert (body == 7).all()


def test_get_with_expected_prefix_embedded(store):
    expect_prefix_checks(store)


@needs_attach
def test_get_with_expected_prefix_attached(cluster):
    cluster.start_master()
    path = cluster.socket_path()
    cluster.start_node("--socket", path)
    with ferry.Store.attach(path) as s:
        expect_prefix_checks(s)


def test_remove_all(store):
    for i in range(5):
        store.put(f"ra/{i}", b"x" * 10)
    store.get("ra/0")  # its lease ends right after the read
    assert store.remove_all() == 5
    assert store.stats()["objects"] == 0
    assert store.remove_all(force=True) == 0
