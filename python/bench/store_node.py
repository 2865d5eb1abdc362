"""A `ferry master` and a `ferry node --socket` for the store benchmarks, or one
`ferry node --socket` that runs the master itself."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import tempfile
import time
from typing import Iterator


def ready(proc: subprocess.Popen, timeout: float = 30.0) -> dict:
    """The JSON line a `ferry` server prints once it serves."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not sel.select(max(0.0, end - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("{"):
            return json.loads(line)
    proc.kill()
    raise RuntimeError(f"{proc.args} did not get ready")


@contextlib.contextmanager
def master_and_node(ferry_bin: str, segment_size: str,
                    master_in_node: bool = False) -> Iterator[tuple[str, str]]:
    """(master address, node socket path), stopped on exit."""
    sock = os.path.join(tempfile.gettempdir(), f"ferry-bench-{os.getpid()}.sock")
    procs: list[subprocess.Popen] = []
    try:
        where: list[str] = []
        if not master_in_node:
            procs.append(subprocess.Popen([ferry_bin, "master", "--http-port", "-1"],
                                          stdout=subprocess.PIPE, text=True))
            where = ["--master", ready(procs[-1])["address"]]
        procs.append(subprocess.Popen([ferry_bin, "node", *where, "--segment-size",
                                       segment_size, "--socket", sock],
                                      stdout=subprocess.PIPE, text=True))
        master = ready(procs[-1])["master"]
        yield master, sock
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
