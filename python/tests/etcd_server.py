"""A real etcd for tests, as tests/integration/etcd_server.h is for the C++
ones: its own process on free loopback ports, its own data directory, waited
for with a deadline, killed and removed at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from typing import Optional

START_TIMEOUT_S = 30.0


def etcd_binary() -> Optional[str]:
    """$FERRY_ETCD, else `etcd` on PATH; None when there is none."""
    env = os.environ.get("FERRY_ETCD")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("etcd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    def __init__(self) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("no etcd binary ($FERRY_ETCD or PATH)")
        self._binary = binary
        self._dir = tempfile.mkdtemp(prefix="ferry-etcd-")
        self.port = _free_port()
        self._peer_port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self._launch()

    def url(self, cluster: str) -> str:
        return f"etcd://{self.endpoint}/{cluster}"

    def _launch(self) -> None:
        client = f"http://{self.endpoint}"
        peer = f"http://127.0.0.1:{self._peer_port}"
        self.proc = subprocess.Popen(
            [self._binary, "--name", "ferry-test", "--data-dir", os.path.join(self._dir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"ferry-test={peer}", "--logger", "zap",
             "--log-level", "error"],
            stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode} at start")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.close()
        raise TimeoutError(f"etcd at {self.endpoint} did not answer in {START_TIMEOUT_S} s")

    def kill(self) -> None:
        """SIGKILLs it; its data stays for restart()."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self._launch()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)
