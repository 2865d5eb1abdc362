"""A client process for test_store_attached.py, attached to a `ferry node --socket`.

    store_client.py serve SOCKET BUFFER_BYTES
        Prints {"pid": ...}, then answers JSON commands on stdin, one line each:
        {"op": "put", "key", "seed", "size", "how": "plain"|"from"} -> {"ok": true}
        {"op": "get", "key", "how": "plain"|"into"}  -> {"ok": true, "sha", "nbytes"}
        {"op": "exists", "key"} -> {"ok": true, "exists"}; {"op": "remove", "key"}
        A failure answers {"error": class name, "message"}. "from"/"into" use one
        allocate_buffer of BUFFER_BYTES.
    store_client.py writer SOCKET TAG BYTES
        Prints {"pid": ...} once attached, then puts TAG-0, TAG-1, ... (put_from
        of BYTES each, see writer_value) until killed, printing "begin I" before
        and "done I" after each put.
    store_client.py attach-as UID SOCKET
        Drops to UID, attaches, puts one key; prints {"attached": true} or
        {"error", "message"}.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys

HEADER = 64


def value_bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def writer_value(key: str, size: int) -> bytes:
    """What a writer puts under `key`: the key, zero-padded, then a fixed pattern."""
    fill = (bytes(range(256)) * (size // 256 + 1))[:size]
    return key.encode().ljust(HEADER, b"\0") + fill[HEADER:]


def _replies():
    # Replies get their own descriptor; the library's log lines go to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return out


def _error(e: Exception) -> dict:
    return {"error": type(e).__name__, "message": str(e)}


def serve(path: str, nbytes: int) -> None:
    import ferry

    out = _replies()
    store = ferry.Store.attach(path)
    buf = store.allocate_buffer(nbytes)
    out.write(json.dumps({"pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        key, op = cmd.get("key"), cmd["op"]
        try:
            if op == "put":
                data = value_bytes(cmd["seed"], cmd["size"])
                if cmd["how"] == "from":
                    buf[:len(data)] = data
                    store.put_from(key, buf[:len(data)])
                else:
                    store.put(key, data)
                reply = {"ok": True}
            elif op == "get":
                if cmd["how"] == "into":
                    n = store.get_into(key, buf)
                    data = bytes(buf[:n])
                else:
                    data = store.get(key)
                reply = {"ok": True, "sha": hashlib.sha256(data).hexdigest(), "nbytes": len(data)}
            elif op == "exists":
                reply = {"ok": True, "exists": store.exists(key)}
            elif op == "remove":
                store.remove(key)
                reply = {"ok": True}
            else:
                reply = {"error": "BadCommand", "message": op}
        except ferry.FerryError as e:
            reply = _error(e)
        out.write(json.dumps(reply) + "\n")


def writer(path: str, tag: str, nbytes: int) -> None:
    import ferry

    out = _replies()
    # A small staging area: this client moves only its allocated buffer.
    store = ferry.Store.attach(path, staging=1 << 20)
    buf = store.allocate_buffer(nbytes)
    buf[:] = writer_value("", nbytes)
    out.write(json.dumps({"pid": os.getpid()}) + "\n")
    i = 0
    while True:
        key = f"{tag}-{i}"
        buf[:HEADER] = key.encode().ljust(HEADER, b"\0")
        out.write(f"begin {i}\n")
        try:
            store.put_from(key, buf)
            out.write(f"done {i}\n")
        except ferry.FerryError as e:
            out.write(f"error {i} {type(e).__name__}: {e}\n")
        i += 1


def attach_as(uid: int, path: str) -> None:
    import ferry  # before dropping privileges: the package may not be readable after

    out = _replies()
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    try:
        store = ferry.Store.attach(path, timeout=5.0)
        store.put("attach-as", b"x")
        reply = {"attached": True}
    except ferry.FerryError as e:
        reply = _error(e)
    out.write(json.dumps(reply) + "\n")


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "serve":
        serve(args[0], int(args[1]))
    elif mode == "writer":
        writer(args[0], args[1], int(args[2]))
    elif mode == "attach-as":
        attach_as(int(args[0]), args[1])
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
