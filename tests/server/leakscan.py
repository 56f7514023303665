"""Looking for plaintext in what Redis holds and sees: a fast many-needle scanner, a raw
``MONITOR`` capture, and a dump of every key and value of one Redis database.

The needles themselves (a marker as UTF-8, UTF-16, base64 at three alignments, hex; an
integer as decimal and 8-byte big/little-endian) come from ``tests/core/test_canary.py``;
this module only makes scanning tens of megabytes for tens of thousands of them cheap.
"""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from array import array
from collections import defaultdict
from itertools import compress, count

import redis

WINDOW = 4  # bytes per probe; every needle must be at least 2 * WINDOW - 1 bytes long


class FastScanner:
    """Find any of many needles (each at least 7 bytes) in a haystack, at C speed.

    An occurrence of a needle of length ``L >= 2*WINDOW - 1`` always covers a whole
    ``WINDOW``-byte window that starts at a multiple of ``WINDOW``. So every window of every
    needle (at every offset) is indexed, the haystack is cut into aligned windows (one
    ``array`` of machine ints), ``map(dict.get)`` + ``compress`` pick the aligned windows
    that appear in some needle, and only those candidates are compared in full.
    """

    def __init__(self, needles: dict[bytes, str]) -> None:
        self.index: dict[int, list[tuple[bytes, int, str]]] = defaultdict(list)
        for needle, label in needles.items():
            assert len(needle) >= 2 * WINDOW - 1, f"needle too short to scan for: {label}"
            for offset in range(len(needle) - WINDOW + 1):
                key = int.from_bytes(needle[offset : offset + WINDOW], sys.byteorder)
                self.index[key].append((needle, offset, label))
        self.index = dict(self.index)

    def find(self, data: bytes) -> list[str]:
        """Return the labels of the needles found in ``data`` (one per occurrence)."""
        words = array("I")
        assert words.itemsize == WINDOW
        words.frombytes(memoryview(data)[: len(data) - len(data) % WINDOW])
        found: set[tuple[int, str]] = set()
        for position in compress(count(0, WINDOW), map(self.index.__contains__, words)):
            key = int.from_bytes(data[position : position + WINDOW], sys.byteorder)
            for needle, offset, label in self.index[key]:
                start = position - offset
                if start >= 0 and data.startswith(needle, start):
                    found.add((start, label))
        return [label for _, label in sorted(found)]


# -- MONITOR ---------------------------------------------------------------------------------

_ESCAPE = re.compile(rb'\\(x[0-9a-fA-F]{2}|[\\"nrtab])')
_SIMPLE = {
    b"\\": b"\\",
    b'"': b'"',
    b"n": b"\n",
    b"r": b"\r",
    b"t": b"\t",
    b"a": b"\a",
    b"b": b"\b",
}


def unescape_monitor(raw: bytes) -> bytes:
    """Undo Redis' ``sdscatrepr`` quoting of MONITOR lines (``\\xHH``, ``\\n``, ``\\"``...),
    so binary arguments (UTF-16, 8-byte integers) are scanned as the bytes that were sent."""

    def replace(match: re.Match) -> bytes:
        code = match.group(1)
        if code[:1] == b"x":
            return bytes([int(code[1:], 16)])
        return _SIMPLE[code]

    return _ESCAPE.sub(replace, raw)


class MonitorCapture:
    """A raw ``MONITOR`` connection read by a thread into memory, for at most ``limit`` s.

    A raw socket (not redis-py's ``monitor()``, which drops nothing but returns decoded
    text) keeps every byte Redis sent; ``data()`` returns it unescaped.
    """

    def __init__(self, port: int, *, limit: float = 300.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        first = b""
        while not first.endswith(b"\r\n"):
            chunk = self.sock.recv(1)
            assert chunk, "redis closed the MONITOR connection"
            first += chunk
        assert first == b"+OK\r\n", first
        self.sock.settimeout(0.2)
        self.raw = bytearray()
        self.deadline = time.monotonic() + limit
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while not self.stopping.is_set() and time.monotonic() < self.deadline:
                try:
                    chunk = self.sock.recv(1 << 20)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                self.raw += chunk
        finally:
            self.sock.close()

    def stop(self) -> bytes:
        """Stop reading (call ``flush_monitor`` first) and return the capture, unescaped."""
        self.stopping.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "MONITOR reader did not stop"
        return unescape_monitor(bytes(self.raw))


def flush_monitor(client: redis.Redis, capture: MonitorCapture, tag: bytes) -> None:
    """Send a marker command and wait until the capture has it: everything before is in."""
    client.echo(tag)
    deadline = time.monotonic() + 30
    while tag not in capture.raw:
        assert time.monotonic() < deadline, "MONITOR capture fell behind"
        time.sleep(0.02)


# -- the keyspace ------------------------------------------------------------------------------


def keyspace(client: redis.Redis, names: list[bytes] | None = None) -> tuple[list[bytes], bytes]:
    """Return every key name of the client's database (or ``names``), and all their
    contents as one buffer: the logical values by type and the ``DUMP`` serialisation of
    each key. A cluster client (``redis.RedisCluster``) reads every master."""
    names = sorted(client.scan_iter(count=1000) if names is None else names)
    parts: list[bytes] = []
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
    kinds = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for name, kind in zip(names, kinds, strict=True):
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "string":
            pipe.get(name)
        elif kind == "hash":
            pipe.hgetall(name)
        elif kind == "zset":
            pipe.zrange(name, 0, -1, withscores=True)
        elif kind == "set":
            pipe.smembers(name)
        elif kind == "list":
            pipe.lrange(name, 0, -1)
        else:
            raise AssertionError(f"unexpected key type {kind} for {name!r}")
        pipe.dump(name)
    for value in pipe.execute():
        parts += list(_flatten(value))
    return names, b"\x00".join(parts)


def _flatten(value) -> list[bytes]:
    if isinstance(value, bytes):
        return [value]
    if isinstance(value, (int, float)):
        return [repr(value).encode()]
    if isinstance(value, dict):
        return [b for k, v in value.items() for b in (*_flatten(k), *_flatten(v))]
    if isinstance(value, (list, tuple, set)):
        return [b for item in value for b in _flatten(item)]
    raise AssertionError(f"unexpected reply {type(value).__name__}")
