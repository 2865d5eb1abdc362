"""ferry.Store against `ferry master` and `ferry node` processes: replicas that
outlive a node, and clients attached to a node's Unix socket (killed mid-put, a
node restart, the GIL, garbage on the socket, another uid)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import socket
import sys
import threading
import time

import numpy as np
import pytest

import ferry
from conftest import pattern
from store_client import value_bytes, writer_value
from store_cluster import FERRY_BIN, MiB, Proc, needs_attach, needs_cluster, wait_for_nodes, wait_until

pytestmark = pytest.mark.skipif(
    not hasattr(ferry._ferry, "Store"),
    reason="the extension was built without the store (python/build-ext.sh found no "
    "libferry_store.a)")

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
def test_a_node_without_a_master_runs_one(cluster):
    # One command serves a host: the node runs the master, attached clients
    # share values, and the master it prints serves other nodes and clients.
    path = cluster.socket_path()
    node = cluster.spawn(FERRY_BIN, "node", "--segment-size", "16MiB", "--socket", path)
    hello = node.json()
    cluster.master = hello["master"]
    assert hello["mounted"] is True, hello
    a, b = ferry.Store.attach(path), ferry.Store.attach(path)
    try:
        value = pattern(7, MiB).tobytes()
        a.put("one-command", value)
        assert b.get("one-command") == value
        with pytest.raises(ferry.errors.AlreadyExists):
            b.put("one-command", b"again")
        with pytest.raises(ferry.errors.InvalidArgument):
            a.put("", b"no key")
        other, _ = cluster.start_node(size="16MiB")
        cluster.wait_nodes(2)
        with ferry.Store(master=hello["master"], local_memory=0, replicas=2) as remote:
            assert remote.get("one-command") == value
            remote.put("two-copies", b"v" * 4096)
        other.stop(signal.SIGKILL)
        assert a.get("two-copies") == b"v" * 4096
    finally:
        a.close()
        b.close()


@needs_attach
def test_clients_killed_mid_put(cluster):
    # No background eviction (the high watermark is never passed): the checks
    # below read what batch_exists found, which the master must not evict in
    # between; puts that need room still evict synchronously.
    cluster.start_master("--put-timeout-ms", "1000", "--high-watermark", "1.0",
                         "--low-watermark", "1.0")
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


@needs_attach
def test_attached_clients_prove_the_cluster_secret(cluster, tmp_path):
    key = tmp_path / "key"
    key.write_bytes(b"this cluster's secret: 32 bytes!")
    key.chmod(0o600)
    cluster.start_master("--auth-key-file", str(key))
    path = cluster.socket_path()
    cluster.start_node("--socket", path, "--auth-key-file", str(key))
    with ferry.Store.attach(path, auth_key_file=str(key)) as s:
        s.put("k", b"proved")
        assert s.get("k") == b"proved"
    with pytest.raises(ferry.Unauthenticated, match="requires the cluster secret"):
        ferry.Store.attach(path)
