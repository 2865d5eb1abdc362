#!/usr/bin/python3
"""Writes the seed corpora of the C++ fuzz targets (tests/fuzz/corpus/<target>/seed-*).

Small valid inputs, each of one kind, written from the formats' documentation
(docs/wire-protocol.md, docs/attach-protocol.md, src/proto/store.proto); the
version numbers are read from the headers, so a bump shows here. Regression
inputs (regress-*) are kept by hand and left alone. Run it again after a
format changes:

    tests/fuzz/make_corpus.py
"""

from __future__ import annotations

import os
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")


def constant(path: str, name: str) -> int:
    with open(os.path.join(SRC, path)) as f:
        return int(re.search(rf"\b{name} = (\w+);", f.read())[1], 0)


# ---- the listener's frames (transfer/frame_wire.h) ----

FRAME_VERSION = constant("transfer/frame_wire.h", "kVersion")
HELLO, HELLO_ACK, GET_DESC, DESC, WRITE, WRITE_ACK, READ, READ_DATA = range(1, 9)
SPLIT, MEM = 1536, 4096  # frame_stream_fuzz.cc's two registrations


def frame(opcode: int, rid: int = 1, addr: int = 0, length: int = 0, status: int = 0,
          payload: bytes = b"") -> bytes:
    return struct.pack("<IBBBBQQQ", 0x59524546, FRAME_VERSION, opcode, status, 0, rid, addr,
                       length) + payload


def write(rid: int, off: int, data: bytes) -> bytes:
    return frame(WRITE, rid, off, len(data), payload=data)


def frame_header_seeds() -> dict[str, bytes]:
    return {f"op{op}": frame(op, 7, 0x1000, 64) for op in range(1, 11)}


def frame_stream_seeds() -> dict[str, bytes]:
    s = {
        "hello": frame(HELLO),
        "hello-epoch": frame(HELLO, 1, 0x5eed),
        "hello-stale-epoch": frame(HELLO, 1, 0x1234),
        "descriptor": frame(GET_DESC, 2),
        "write-read": write(1, 16, bytes(range(64))) + frame(READ, 2, 16, 64),
        "write-each-side": write(1, SPLIT - 8, b"a" * 8) + write(2, SPLIT, b"b" * 8) +
        frame(READ, 3, SPLIT - 8, 8) + frame(READ, 4, SPLIT, 8),
        "across-registrations": write(1, SPLIT - 4, b"c" * 8) + frame(READ, 2, SPLIT - 4, 8),
        "empty-and-outside": write(1, 0, b"") + frame(READ, 2, 0, 0) + frame(READ, 3, MEM, 1) +
        write(4, MEM - 1, b"dd"),
        # More than the replies a connection may have queued (kMaxQueuedReplies).
        "pipelined": b"".join(frame(READ, i, 64 * i, 64) for i in range(12)) + frame(HELLO, 12),
        "cut-short": frame(HELLO) + frame(WRITE, 2, 0, 100) + b"x" * 10,
        "then-bad": frame(HELLO) + frame(WRITE_ACK, 2),
    }
    if FRAME_VERSION >= 2:  # a Hello with an initiator's nonce
        s["hello-nonce"] = frame(HELLO, 1, 0, 32, payload=bytes(range(32))) + frame(GET_DESC, 2)
    return s


CHALLENGE, PROOF = 9, 10


def handshake_seeds() -> dict[str, bytes]:
    # handshake_fuzz.cc: the first byte picks the side and the harness's part.
    nonce = bytes(range(32))
    return {
        "peer-hello-nonce": b"\0" + frame(HELLO, 1, 0, 32, payload=nonce),
        "peer-hello-proof": b"\0" + frame(HELLO, 1, 0x5eed, 32, payload=nonce) +
        frame(PROOF, 2, 0, 32, payload=b"p" * 32) + frame(GET_DESC, 3),
        "peer-no-nonce": b"\0" + frame(HELLO, 1),
        "peer-descriptor-first": b"\0" + frame(GET_DESC, 1),
        "peer-write-first": b"\0" + write(1, 0, b"w" * 16),
        "peer-proof-first": b"\0" + frame(PROOF, 1, 0, 32, payload=b"p" * 32),
        "peer-two-hellos": b"\0" + frame(HELLO, 1, 0, 32, payload=nonce) +
        frame(HELLO, 2, 0, 32, payload=nonce),
        "honest": b"\1" + nonce + b"\0",
        "honest-epoch": b"\1" + nonce + b"\1",
        "honest-stale": b"\1" + nonce + b"\2",
        "replay": b"\2" + nonce + b"\1",
        "target-ack": b"\3\0" + frame(HELLO_ACK, 0, 0x5eed),
        "target-refuses": b"\3\1" + frame(HELLO_ACK, 0, 0, 0, status=16),
        "target-garbage": b"\3\0" + b"x" * 40,
        "target-challenge-ack": b"\4\0" + nonce + struct.pack("<Q", 0x5eed) +
        frame(HELLO_ACK, 0, 0x5eed),
        "target-challenge-restarted": b"\4\1" + nonce + struct.pack("<Q", 7) +
        frame(HELLO_ACK, 0, 7, 0, status=12),
        "target-challenge-twice": b"\4\0" + nonce + struct.pack("<Q", 1) +
        frame(CHALLENGE, 0, 1, 64, payload=b"c" * 64),
    }


# ---- the segment descriptor (transfer/descriptor.h) ----

DESC_FORMAT = constant("transfer/descriptor.h", "kDescriptorFormat")


def string(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def descriptor(transports: list[tuple[bytes, bytes]], regions: list[tuple]) -> bytes:
    out = struct.pack("<IQ", 0x00534446 | ((0x30 + DESC_FORMAT) << 24), 0x5eed)
    out += string(b"host-1") + struct.pack("<IQi", 4242, 3, 17)
    out += struct.pack("<I", len(transports))
    for name, blob in transports:
        out += string(name) + string(blob)
    out += struct.pack("<I", len(regions))
    for addr, length, kind, flags, device, serial in regions:
        out += struct.pack("<QQBBiQ", addr, length, kind, flags, device, serial)
        out += b"".join(string(b"blob-%d" % i) for i in range(len(transports)))
    return out


def descriptor_seeds() -> dict[str, bytes]:
    return {
        "empty": descriptor([], []),
        "tcp-shm": descriptor([(b"tcp", b""), (b"shm", b"memfd")],
                              [(0x10000, 4096, 0, 1, -1, 1), (0x20000, 1 << 20, 1, 0, -1, 2),
                               (0x7f0000000000, 1 << 30, 2, 1, 0, 3)]),
        "adjacent": descriptor([(b"tcp", b"")], [(0x1000, 0x1000, 0, 0, -1, 1),
                                                 (0x2000, 0x1000, 0, 0, -1, 2)]),
    }


# ---- the attach socket (store/rpc/attach_wire.h) ----

ATTACH_VERSION = constant("store/rpc/attach_wire.h", "kVersion")
(A_HELLO, A_REGISTER, A_UNREGISTER, A_PUT, A_GET, A_EXISTS, A_REMOVE, A_PIN, A_LOCATE, A_STATS,
 A_REMOVE_ALL) = range(1, 12)


def attach(type_: int, rid: int, payload: bytes = b"", deadline: int = 1000) -> bytes:
    return struct.pack("<IHHQIIB3x", 0x31544146, ATTACH_VERSION, type_, rid, len(payload),
                       deadline, 0) + payload


def keys(*ks: bytes) -> bytes:
    return struct.pack("<I", len(ks)) + b"".join(string(k) for k in ks)


def part(off: int, length: int, buffer: int = 1) -> bytes:
    return struct.pack("<BIQQ", 0, buffer, off, length)


def put(rid: int, items: list[tuple[bytes, list[bytes]]], replicas: int = 1, pin: int = 0) -> bytes:
    p = struct.pack("<IBQ", replicas, pin, 0) + string(b"") + struct.pack("<i", -1) + string(b"")
    p += struct.pack("<I", len(items))
    for key, parts in items:
        p += string(key) + struct.pack("<I", len(parts)) + b"".join(parts)
    return attach(A_PUT, rid, p)


def get(rid: int, items: list[tuple[bytes, list[bytes]]], pack: tuple = (1, 0, 0),
        expect: bytes = b"") -> bytes:
    p = struct.pack("<IQQ", *pack) + struct.pack("<i", -1) + string(b"") + string(expect)
    p += struct.pack("<I", len(items))
    for key, parts in items:
        p += string(key) + struct.pack("<I", len(parts)) + b"".join(parts)
    return attach(A_GET, rid, p)


def attach_seeds() -> dict[str, bytes]:
    return {
        "stats": attach(A_STATS, 1),
        "exists": attach(A_EXISTS, 1, keys(b"k")),
        "put-get": put(1, [(b"k", [part(0, 100)])]) + get(2, [(b"k", [part(4096, 100)])]),
        "put-parts-get-packed": put(1, [(b"k1", [part(0, 10), part(100, 20)]),
                                        (b"k2", [part(200, 5)])]) +
        get(2, [(b"k1", []), (b"k2", [])], pack=(1, 8192, 4096)),
        "get-expect": put(1, [(b"k", [part(0, 64)])]) +
        get(2, [(b"k", [part(1024, 64)])], expect=b"\0" * 8),
        "locate-pin-remove": put(1, [(b"k", [part(0, 8)])]) + attach(A_LOCATE, 2, keys(b"k")) +
        attach(A_PIN, 3, struct.pack("<BQ", 1, 60000) + keys(b"k")) +
        attach(A_REMOVE, 4, b"\1" + keys(b"k", b"absent")),
        "remove-all": put(1, [(b"a", [part(0, 1)])], pin=2) + attach(A_REMOVE_ALL, 2, b"\0"),
        "unregister": attach(A_UNREGISTER, 1, struct.pack("<I", 1)) +
        put(2, [(b"k", [part(0, 8)])]),
        "register-no-fd": attach(A_REGISTER, 1, struct.pack("<Q", 4096)),
        "second-hello": attach(A_HELLO, 1, struct.pack("<I", 1)),
        "gpu-part": attach(A_PUT, 1, struct.pack("<IBQ", 1, 0, 0) + string(b"") +
                           struct.pack("<i", 0) + string(b"") + struct.pack("<I", 1) +
                           string(b"g") + struct.pack("<IBI", 1, 1, 0) + string(b"h" * 64) +
                           struct.pack("<QQ", 0, 8)),
        "cut-short": attach(A_STATS, 1) + attach(A_EXISTS, 2, keys(b"key"))[:-2],
    }


# ---- the master's requests (src/proto/store.proto), for master_fuzz.cc ----

(MOUNT, HEARTBEAT, UNMOUNT, PUT_BEGIN, PUT_END, GET, RELEASE, EXISTS, REMOVE, PIN, REMOVE_ALL,
 STATS, TICK) = range(13)


def varint(v: int) -> bytes:
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num: int, value) -> bytes:
    if isinstance(value, bytes):
        return varint(num << 3 | 2) + varint(len(value)) + value
    return varint(num << 3) + varint(value)


def msg(*fields: tuple) -> bytes:
    return b"".join(field(n, v) for n, v in fields)


def call(method: int, body: bytes = b"") -> bytes:
    return struct.pack("<BH", method, len(body)) + body


def mount(node: bytes, *regions: tuple[int, int]) -> bytes:
    return call(MOUNT, msg((1, node), *[(2, msg((1, b), (2, s))) for b, s in regions], (3, 1)))


def put_begin(*items: bytes, client: bytes = b"", local: int = 0) -> bytes:
    fields = [(1, i) for i in items]
    if client:
        fields += [(2, client), (3, local)]
    return call(PUT_BEGIN, msg(*fields))


def item(key: bytes, size: int, replicas: int = 1, pin: int = 0, ttl: int = 0) -> bytes:
    return msg((1, key), (2, size), (3, replicas), (5, pin), (6, ttl))


def master_seeds() -> dict[str, bytes]:
    two = mount(b"n1", (0x10000, 1 << 20)) + mount(b"n2", (0x10000, 1 << 20), (1 << 30, 4096))
    commit = call(PUT_END, msg((1, msg((1, b"k"), (2, 1), (3, 1)))))
    return {
        "mount-stats": b"\0" + two + call(STATS) + call(HEARTBEAT, msg((1, b"n1"))),
        "put-commit-get": b"\0" + two + put_begin(item(b"k", 1000, 2)) + commit +
        call(GET, msg((1, b"k"))) + call(RELEASE, msg((1, msg((1, b"k"), (2, 1))))) +
        call(EXISTS, msg((1, b"k"), (1, b"x"))),
        "put-abort-tick": b"\1" + two + put_begin(item(b"k", 4096), item(b"j", 10, 3)) +
        call(PUT_END, msg((1, msg((1, b"k"), (2, 1), (3, 0))))) + call(TICK),
        "pin-remove": b"\0" + two + put_begin(item(b"k", 64, 1, 1, 1000)) + commit +
        call(PIN, msg((1, msg((1, b"k"), (2, 2), (3, 0))))) +
        call(REMOVE, msg((1, b"k"), (2, 1))) + call(REMOVE_ALL, msg((1, 1))),
        "prefer-local-full": b"\0" + mount(b"n1", (0x10000, 8192)) +
        put_begin(item(b"a", 8192), client=b"n1", local=1) + put_begin(item(b"b", 1)) +
        call(UNMOUNT, msg((1, b"n1"))) + call(STATS),
        "expire": b"\1" + two + put_begin(item(b"k", 100)) + commit + call(GET, msg((1, b"k"))) +
        call(TICK) + call(GET, msg((1, b"k"))),
    }


def main() -> None:
    for target, seeds in [("fuzz_frame_header", frame_header_seeds()),
                          ("fuzz_frame_stream", frame_stream_seeds()),
                          ("fuzz_handshake", handshake_seeds()),
                          ("fuzz_descriptor", descriptor_seeds()),
                          ("fuzz_attach", attach_seeds()),
                          ("fuzz_master", master_seeds())]:
        d = os.path.join(HERE, "corpus", target)
        os.makedirs(d, exist_ok=True)
        for name in os.listdir(d):
            if name.startswith("seed-"):
                os.remove(os.path.join(d, name))
        for name, data in seeds.items():
            with open(os.path.join(d, f"seed-{name}"), "wb") as f:
                f.write(data)
        print(f"{target}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
