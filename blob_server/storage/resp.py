"""Blob reads from Redis on the event loop: MGET replies received straight into a kept
buffer, each blob handed out as a view of it, never copied.

*Why not redis-py's asyncio client*, which the first version used: a get_blobs answer is
typically 1 MiB (64 nodes of 16 KiB) and may be 48 MiB. redis-py moves every reply
through asyncio's ``StreamReader`` and then hiredis: four copies of each byte, and a
Python-level read, feed and parse step per 64 KiB, with the transport paused and resumed
as the stream buffer fills. Profiled in the blob server, that was the largest single
cost of a fetch of 64 x 16 KiB (docs/performance.md, "The fetch path"). Here the kernel
writes the reply into the connection's buffer (``asyncio.BufferedProtocol``), the parser
below walks its bulk-string headers, and each value is a read-only ``memoryview`` of the
buffer, which the server writes to its client as it is; a buffer is reused only once no
view of it is left (``_Connection._unviewed_buffer``).

This module speaks one command, MGET (several pipelined for long id lists), plus the
connection set-up a URL asks for (AUTH, SELECT). Everything else the storage does
(commit scripts, roots, keyrings, garbage collection) stays in redis-py; so does the
parsing of the URL (``redis.ConnectionPool.from_url``), so both always reach the same
Redis. A reply that is not exactly the RESP2 array MGET returns closes the connection and
raises ``StorageUnavailableError``: it is never guessed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from typing import Any, Final

import hiredis

from blob_server.exceptions import StorageUnavailableError
from blob_server.storage.validation import MAX_BLOB_SIZE

#: Keys per MGET; longer lists go out as several MGETs in one pipeline, so Redis is not
#: held by one huge command (the blocking client in ``redis.py`` chunks alike).
MGET_CHUNK: Final = 1_000
#: A fresh connection's buffer; it doubles as replies need. One that grew past
#: ``KEEP_BYTES`` is let go after its reply, so a rare huge read does not pin memory.
INITIAL_BYTES: Final = 256 * 1024
KEEP_BYTES: Final = 8 * 1024 * 1024
#: Buffers a connection keeps while values of earlier replies still point into them.
MAX_SPARES: Final = 2
#: The longest header line (``$<length>``, ``*<count>``) accepted; an error line may be
#: longer, up to ``MAX_ERROR_BYTES``.
MAX_HEADER_BYTES: Final = 24
MAX_ERROR_BYTES: Final = 4096

#: The URL options this reader honours (as ``redis.connection.parse_url`` names them); a
#: URL with any other option is refused instead of being half-followed.
SUPPORTED_OPTIONS: Final = frozenset(
    {"host", "port", "db", "username", "password", "socket_timeout", "socket_connect_timeout"}
)


#: A value's header, ``$<length>\r\n`` or ``$-1\r\n`` (a missing key), and any start of
#: one (``fullmatch`` tells a header still arriving from a malformed one).
_BULK: Final = re.compile(rb"\$(-1|\d{1,19})\r\n")
_BULK_START: Final = re.compile(rb"(?:\$(?:-1?|\d{0,19})\r?)?")


class RespError(Exception):
    """Redis answered an error (``-ERR ...``); the connection is still in step."""


class RespProtocolError(Exception):
    """The bytes from Redis are not the reply expected; the connection is out of step."""


def _digits(raw: bytes | bytearray, what: str) -> int:
    """A RESP length or count: ``-1`` or ASCII digits, nothing else (``int()`` alone
    would take spaces, signs and underscores)."""
    if raw == b"-1" or (raw.isdigit() and raw.isascii()):
        return int(raw)
    raise RespProtocolError(f"bad {what} {bytes(raw[:MAX_HEADER_BYTES])!r}")


def _viewed(buffer: bytearray) -> bool:
    """Whether a view of ``buffer`` exists: a bytearray refuses to change size then."""
    try:
        buffer.append(0)
    except BufferError:
        return True
    del buffer[-1]
    return False


def _mget_command(keys: Sequence[bytes]) -> bytes:
    """``MGET keys...`` in RESP, byte for byte as ``hiredis.pack_command`` writes it.

    *Why:* the key names of one read all have one length, so the command is a join in C,
    several times faster than ``pack_command``. Other key lists go through hiredis."""
    sizes = set(map(len, keys))
    if len(sizes) != 1:
        return hiredis.pack_command(("MGET", *keys))
    header = b"$%d\r\n" % sizes.pop()
    return b"".join(
        (b"*%d\r\n$4\r\nMGET\r\n" % (len(keys) + 1), header, (b"\r\n" + header).join(keys), b"\r\n")
    )


class _Line:
    """Parse one status reply (``+OK``), as AUTH and SELECT answer.

    Parsers share one interface: ``feed(buffer, start, end)`` returns (where the reply
    ends, its value) once the reply is complete, else None, having set ``consumed`` to
    where the next call should start.
    """

    __slots__ = ("consumed",)

    def __init__(self) -> None:
        self.consumed = 0

    def feed(self, buffer: bytearray, start: int, end: int) -> tuple[int, object] | None:
        stop = buffer.find(b"\r\n", start, end)
        if stop < 0:
            if end - start > MAX_ERROR_BYTES:
                raise RespProtocolError("status line too long")
            self.consumed = start
            return None
        line = bytes(buffer[start:stop])
        if line[:1] == b"-":
            raise RespError(line[1:].decode("utf-8", "replace"))
        if line[:1] != b"+":
            raise RespProtocolError(f"expected a status reply, got {line[:MAX_HEADER_BYTES]!r}")
        return stop + 2, line[1:]


class _Mget:
    """Parse one MGET reply of ``count`` values as it arrives, never scanning a byte twice:
    ``*<count>``, then per key ``$<length>`` and the value, or ``$-1`` for a missing key."""

    __slots__ = ("consumed", "count", "values")

    def __init__(self, count: int) -> None:
        self.consumed = 0
        self.count = count
        self.values: list[memoryview | None] | None = None

    def feed(self, buffer: bytearray, start: int, end: int) -> tuple[int, object] | None:
        """See ``_Line.feed``."""
        pos = start
        if self.values is None:
            stop = buffer.find(b"\r\n", pos, end)
            if stop < 0:
                longest = MAX_ERROR_BYTES if buffer[pos : pos + 1] == b"-" else MAX_HEADER_BYTES
                if end - pos > longest:
                    raise RespProtocolError("reply header too long")
                self.consumed = pos
                return None
            kind = buffer[pos]
            if kind == 0x2D:  # "-": an error instead of the array
                raise RespError(bytes(buffer[pos + 1 : stop]).decode("utf-8", "replace"))
            if kind != 0x2A or stop - pos > MAX_HEADER_BYTES:  # "*"
                raise RespProtocolError("an MGET reply must be an array")
            if _digits(buffer[pos + 1 : stop], "array length") != self.count:
                raise RespProtocolError("an MGET reply must have one value per key")
            self.values = []
            pos = stop + 2
        values = self.values
        # Values are read-only views of the buffer, not copies: see _Connection.request.
        view = memoryview(buffer).toreadonly()
        # Blobs are padded to a few size classes, so consecutive values often share a
        # header: one equal to the last is recognised by a prefix test, not the regex.
        last_header, size = b"", 0
        while len(values) < self.count:
            if not (last_header and buffer.startswith(last_header, pos, end)):
                header = _BULK.match(buffer, pos, end)
                if header is None:
                    if _BULK_START.fullmatch(buffer, pos, end) is None:
                        raise RespProtocolError("an MGET value must be a bulk string")
                    break  # its header is still on the way
                length = int(header[1])
                if length > MAX_BLOB_SIZE:  # no blob is larger: refuse to buffer one that is
                    raise RespProtocolError(f"a value of {length} bytes is larger than any blob")
                if length < 0:
                    values.append(None)
                    pos = header.end()
                    continue
                last_header, size = header[0], length
            first = pos + len(last_header)
            last = first + size
            if last + 2 > end:
                break
            if not buffer.startswith(b"\r\n", last):
                raise RespProtocolError("a bulk string must end with CRLF")
            values.append(view[first:last])
            pos = last + 2
        if len(values) == self.count:
            return pos, values
        self.consumed = pos
        return None


class _Connection(asyncio.BufferedProtocol):
    """One Redis connection: the kernel writes replies into ``_buffer``; one request at a
    time, its replies parsed by a queue of parsers as the bytes arrive."""

    def __init__(self) -> None:
        self._buffer = bytearray(INITIAL_BYTES)
        self._spares: list[bytearray] = []  # buffers that values may still point into
        self._filled = 0  # bytes received of the current request's replies
        self._parsed = 0  # bytes of them parsed
        self._parsers: list[Any] = []
        self._results: list[object] = []
        self._waiter: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None
        self.lost = False

    # -- asyncio.BufferedProtocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        free = len(self._buffer) - self._filled
        if free < 64 * 1024:
            # A new buffer, not a resize: the view handed out last time may still exist.
            grown = bytearray(max(2 * len(self._buffer), self._filled + 64 * 1024))
            grown[: self._filled] = memoryview(self._buffer)[: self._filled]
            self._buffer = grown
        return memoryview(self._buffer)[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._waiter is None or self._waiter.done():
            self._fail(RespProtocolError("Redis sent bytes nobody asked for"))
            return
        try:
            while self._parsers:
                done = self._parsers[0].feed(self._buffer, self._parsed, self._filled)
                if done is None:
                    self._parsed = self._parsers[0].consumed
                    return
                self._parsed, result = done
                self._results.append(result)
                self._parsers.pop(0)
            if self._parsed != self._filled:
                raise RespProtocolError("Redis sent more than the replies asked for")
            self._waiter.set_result(self._results)
        except (RespError, RespProtocolError) as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"Redis closed the connection: {exc}"))

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost tells the waiter

    # -- requests -------------------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        """Stop using the connection: after an error reply the bytes still to come would
        belong to the replies after it, which nobody would read."""
        self.lost = True
        if self.transport is not None:
            self.transport.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    async def request(self, commands: bytes, parsers: list[Any]) -> list[object]:
        """Send pipelined commands and return their parsed replies, in order."""
        if self.lost or self.transport is None or self.transport.is_closing():
            raise ConnectionError("the Redis connection is closed")
        self._buffer = self._unviewed_buffer()
        self._filled = self._parsed = 0
        self._parsers = parsers
        self._results = []
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(commands)
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def _unviewed_buffer(self) -> bytearray:
        """A buffer for the next reply that no value handed out still points into.

        *Why:* the values of an MGET are views of the buffer their reply arrived in, not
        copies (copying them was a measurable share of a fetch, docs/performance.md),
        and the server writes those views to its client as they are. So a buffer is
        written again only once every view of it is gone: normally the answer has been
        sent before the next request, and the same buffer serves again; if not, a spare
        one does, and the viewed one waits among the spares. One that grew past
        ``KEEP_BYTES`` is let go, so a rare huge read does not pin memory.
        """
        for buffer in [self._buffer, *self._spares]:
            if len(buffer) <= KEEP_BYTES and not _viewed(buffer):
                break
        else:
            buffer = bytearray(INITIAL_BYTES)
        self._spares = [
            spare
            for spare in [self._buffer, *self._spares]
            if spare is not buffer and len(spare) <= KEEP_BYTES
        ][:MAX_SPARES]
        return buffer

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class RespBlobReader:
    """MGET on the event loop over a pool of ``_Connection``, each used by one read at a
    time (at most ``max_connections`` at once; None: no limit).

    ``options`` are a ``redis://`` URL's, parsed by ``redis.connection.parse_url`` (so
    they are the ones redis-py follows for the rest of the storage; see
    ``SUPPORTED_OPTIONS``); timeouts in the URL win over the arguments, as in redis-py.
    ``url`` (redacted) names Redis in errors. A pooled connection that turns out dead
    (Redis restarted) is replaced and the read sent again once: reads are idempotent.
    Connections belong to the event loop that opened them.
    """

    def __init__(
        self,
        options: dict[str, Any],
        *,
        url: str,
        socket_timeout: float,
        connect_timeout: float,
        max_connections: int | None,
    ) -> None:
        unsupported = sorted(set(options) - SUPPORTED_OPTIONS)
        if unsupported:
            raise StorageUnavailableError(
                f"Redis at {url}: the blob reader does not support the URL options "
                f"{', '.join(unsupported)}"
            )
        self.url = url
        self._host = options.get("host", "localhost")
        self._port = int(options.get("port", 6379))
        self._setup = self._setup_commands(options)
        self._socket_timeout = options.get("socket_timeout", socket_timeout)
        self._connect_timeout = options.get("socket_connect_timeout", connect_timeout)
        self._max_connections = max_connections
        self._idle: list[_Connection] = []  # open and in step, most recent last
        self._limit: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def _setup_commands(options: dict[str, Any]) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        password, username = options.get("password"), options.get("username")
        if password:
            commands.append(("AUTH", username, password) if username else ("AUTH", password))
        db = int(options.get("db") or 0)
        if db:
            commands.append(("SELECT", db))
        return commands

    async def mget(self, keys: Sequence[bytes]) -> list[memoryview | None]:
        """The values of ``keys`` (None where a key is missing), in order, as read-only
        views that stay valid as long as they are kept."""
        chunks = [keys[i : i + MGET_CHUNK] for i in range(0, len(keys), MGET_CHUNK)]
        commands = b"".join(map(_mget_command, chunks))
        limit = self._bind()
        if limit is not None:
            await limit.acquire()
        try:
            for attempt in range(2):
                conn = self._take_idle()
                reused = conn is not None
                if conn is None:
                    conn = await self._connect()
                try:
                    async with asyncio.timeout(self._socket_timeout):
                        replies = await conn.request(commands, [_Mget(len(c)) for c in chunks])
                except Exception as exc:
                    conn.close()  # whatever went wrong, it is out of step now
                    if isinstance(exc, ConnectionError) and reused and not attempt:
                        continue  # a connection from before a Redis restart: once more
                    raise self._error(exc) from None
                except BaseException:  # cancelled mid-reply: out of step too
                    conn.close()
                    raise
                self._idle.append(conn)
                return [value for reply in replies for value in reply]  # type: ignore[attr-defined]
            raise AssertionError("unreachable")
        finally:
            if limit is not None:
                limit.release()

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost:  # Redis may have closed it meanwhile
                return conn
        return None

    def _error(self, exc: Exception) -> Exception:
        if isinstance(exc, TimeoutError):
            return StorageUnavailableError(f"Redis at {self.url}: read timed out")
        if isinstance(exc, RespProtocolError):
            return StorageUnavailableError(f"Redis at {self.url} sent a malformed reply: {exc}")
        if isinstance(exc, (ConnectionError, RespError, StorageUnavailableError)):
            return StorageUnavailableError(f"Redis at {self.url}: {exc}")
        return exc

    def _bind(self) -> asyncio.Semaphore | None:
        """The limit of the running loop's pool: connections belong to the loop that
        opened them, so a new loop (as in tests) starts a new pool."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._idle, self._loop = [], loop
            self._limit = (
                None if self._max_connections is None else asyncio.Semaphore(self._max_connections)
            )
        return self._limit

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(_Connection, self._host, self._port)
        except (OSError, TimeoutError) as exc:
            raise StorageUnavailableError(f"Redis at {self.url}: cannot connect ({exc})") from None
        if self._setup:
            commands = b"".join(hiredis.pack_command(c) for c in self._setup)
            try:
                async with asyncio.timeout(self._socket_timeout):
                    await conn.request(commands, [_Line() for _ in self._setup])
            except (ConnectionError, TimeoutError, RespError, RespProtocolError) as exc:
                conn.close()
                raise StorageUnavailableError(
                    f"Redis at {self.url}: connection set-up failed ({exc})"
                ) from None
        return conn

    async def aclose(self) -> None:
        """Close the idle connections (those in use close as they come back)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()
