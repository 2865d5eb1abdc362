"""Engine metadata on etcd from Python: TransferEngine(metadata="etcd://...")
and the Mooncake layer's metadata_server, against a real etcd process."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from conftest import pattern, sha
from ferry.compat.mooncake import TransferEngine as MooncakeEngine
from ferry.compat.mooncake import metadata_for

SIZE = 1 << 20


def test_transfer_between_processes_through_etcd(etcd, spawn_peer):
    url = etcd.url("py")
    peer = spawn_peer("--metadata", url, "--size", str(SIZE))
    with ferry.TransferEngine(metadata=url, metadata_ttl=5) as engine:
        seg = engine.open_segment(peer.name)
        src = pattern(7, SIZE)
        engine.write(seg, src, peer.buffers["numpy"])
        assert peer.digest("numpy", 0, SIZE) == sha(src)
        dst = np.zeros(SIZE, np.uint8)
        engine.read(seg, dst, peer.buffers["numpy"])
        assert sha(dst) == sha(src)
    peer.close()  # a clean exit withdraws its entry
    with ferry.TransferEngine(metadata=url) as engine:
        with pytest.raises(ferry.NotFound, match="no engine"):
            engine.open_segment(peer.name)


def test_bad_metadata_fails_at_creation(etcd):
    with pytest.raises(ferry.InvalidArgument, match="names no cluster"):
        ferry.TransferEngine(metadata=f"etcd://{etcd.endpoint}")
    with pytest.raises(ferry.InvalidArgument, match="metadata_ttl"):
        ferry.TransferEngine(metadata=etcd.url("py"), metadata_ttl=0)
    with pytest.raises(ferry.NotSupported, match="etcd://"):
        ferry.TransferEngine(metadata="consul://127.0.0.1:8500/c")
    etcd.kill()
    with pytest.raises(ferry.Unavailable, match=etcd.endpoint):
        ferry.TransferEngine(metadata=etcd.url("py"), connect_timeout=0.5)


def test_mooncake_metadata_server_strings_map_to_etcd(monkeypatch):
    monkeypatch.delenv("FERRY_ETCD_CLUSTER", raising=False)
    assert metadata_for("P2PHANDSHAKE") == "p2p"
    assert metadata_for("10.0.0.1:2379") == "etcd://10.0.0.1:2379/mooncake"
    assert metadata_for("etcd://10.0.0.1:2379;10.0.0.2:2379") == \
        "etcd://10.0.0.1:2379,10.0.0.2:2379/mooncake"
    assert metadata_for("etcd://10.0.0.1:2379/prod") == "etcd://10.0.0.1:2379/prod"
    monkeypatch.setenv("FERRY_ETCD_CLUSTER", "blue")
    assert metadata_for("10.0.0.1:2379") == "etcd://10.0.0.1:2379/blue"
    assert metadata_for("http://10.0.0.1:8080/metadata") is None
    assert metadata_for("redis://10.0.0.1:6379") is None
    assert metadata_for("") is None


def test_mooncake_engines_find_each_other_through_etcd(etcd, spawn_peer):
    # Mooncake users pass etcd as a bare host:port.
    peer = spawn_peer("--api", "mooncake", "--metadata", etcd.endpoint, "--size", str(SIZE))
    engine = MooncakeEngine()
    assert engine.initialize("127.0.0.1", f"etcd://{etcd.endpoint}", "tcp", "") == 0
    src = pattern(9, SIZE)
    buf = np.array(src)
    assert engine.register_memory(buf.ctypes.data, SIZE) == 0
    assert engine.transfer_sync_write(peer.name, buf.ctypes.data, peer.buffers["numpy"],
                                      SIZE) == 0
    assert peer.digest("numpy", 0, SIZE) == sha(src)
    bad = MooncakeEngine()
    assert bad.initialize("127.0.0.1", "redis://127.0.0.1:6379", "tcp", "") != 0
