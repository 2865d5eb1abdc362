"""Cluster mode on etcd as real processes, for tests and the failover benchmark:
`ferry master --etcd` candidates, `ferry node --etcd` nodes, and their health."""

from __future__ import annotations

import random
import signal
import time
import urllib.request
from typing import Optional

from store_cluster import FERRY_BIN, Proc, wait_until

# Short enough that a test sees a failover in seconds: the leader's lease,
# and the put timeout and lease that bound how long a new leader fences
# fresh allocations after rebuilding (docs/store.md).
MASTER_ARGS = ["--leader-ttl-s", "2", "--put-timeout-ms", "2000", "--lease-ms", "1000",
               "--write-grace-ms", "200", "--node-ttl-ms", "3000"]
LEADER_TTL_S = 2


class HaCluster:
    def __init__(self, etcd, cluster: str) -> None:
        self.etcd = etcd
        self.name = cluster
        self.url = etcd.url(cluster)
        self.masters: list[tuple[Proc, dict]] = []
        self.nodes: list[Proc] = []

    def start_master(self) -> tuple[Proc, dict]:
        m = Proc([FERRY_BIN, "master", "--etcd", self.etcd.endpoint, "--cluster", self.name,
                  *MASTER_ARGS])
        hello = m.json()
        self.masters.append((m, hello))
        return m, hello

    def start_node(self, size: str = "64MiB") -> Proc:
        n = Proc([FERRY_BIN, "node", "--etcd", self.etcd.endpoint, "--cluster", self.name,
                  "--segment-size", size, "--heartbeat-ms", "200"])
        n.json()
        self.nodes.append(n)
        return n

    def leader(self, timeout: float = 30.0, among: Optional[list] = None) -> tuple[Proc, dict]:
        """The master whose /health says it leads, waiting for one."""
        found: list = []

        def one() -> bool:
            for m, hello in among or self.masters:
                if m.proc.poll() is None and health(hello["http_port"]).get("leading") == "yes":
                    found.append((m, hello))
                    return True
            return False

        wait_until("a master leads", one, timeout)
        return found[0]

    def close(self) -> None:
        for m, _ in self.masters:
            if m.proc.poll() is None:
                m.proc.send_signal(signal.SIGCONT)
            m.stop()
        for n in self.nodes:
            n.stop()


def health(http_port: int) -> dict:
    """/health as {field: value}; {} when the master does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        out[k] = v
    return out


def value_of(i: int, size: int = 4096) -> bytes:
    return random.Random(i).randbytes(size)


class Load:
    """Puts key i with value_of(i) and reads back earlier ones, paced at `rate`
    ops per second: records when each put was acknowledged, every failure,
    and every read that returned other bytes than its key's."""

    def __init__(self, store, rate: float = 200.0) -> None:
        self.store = store
        self.period = 1.0 / rate
        self.acked: dict[int, float] = {}
        self.failures: list[tuple[float, str]] = []
        self.wrong = 0
        self.ops = 0
        self.stop = False

    def run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self.stop:
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
            next_at += self.period
            self.ops += 1
            try:
                if self.ops % 2 == 1:
                    # A failed put may still have landed: its key is never reused.
                    i += 1
                    self.store.put(f"k{i}", value_of(i))
                    self.acked[i] = time.monotonic()
                elif self.acked:
                    j = random.choice(list(self.acked))
                    if self.store.get(f"k{j}") != value_of(j):
                        self.wrong += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted
                self.failures.append((time.monotonic(), type(e).__name__ + ": " + str(e)))
