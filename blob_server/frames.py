"""Memory held by frames being received: a budget for all tenants and one per tenant.

*Why:* a frame's header announces up to 64 MiB, and reading the body with
``StreamReader.readexactly`` kept every byte received until the last one came: eight
connections that announced 48 MiB and then stalled grew the server by 393 MiB, and
nothing stopped one tenant from holding all of it. Now a frame's announced length is
**reserved** before its body is read, against the server's total and the tenant's own
budget (anonymous connections' frames, at most 64 KiB, count in the total only). A
frame that does not fit waits, reading nothing (its bytes stay in the kernel's socket
buffers, which TCP flow control bounds), until others are done with theirs; one that
still does not fit after the frame timeout is read and thrown away chunk by chunk
(holding nothing) and answered ``busy``, so the connection goes on and the client learns
that this request was not carried out. The whole frame, waiting included, must arrive
within the frame timeout (a stalled frame gives its memory back: its connection is
closed); a frame of at most ``CHUNK_BYTES`` that found room at once has the connection's
idle deadline instead (a second timer per request cost a fifth of a ping's CPU time),
so it holds at most that much for that long. The reservation is held until the request
is answered: its decoded arguments are the same bytes again.

The body is read in chunks into a growing ``bytearray``, so the memory a frame holds is
what was received (never the announced length up front), and there is no second copy
at the end as ``readexactly`` makes.
"""

from __future__ import annotations

import asyncio
from typing import Final

import msgpack

from blob_server.wire import protocol

#: Seconds from a frame's header to its last byte (waiting for frame memory included).
DEFAULT_FRAME_TIMEOUT: Final = 60.0
#: Bytes read from the stream at a time into a large frame's body.
CHUNK_BYTES: Final = 256 * 1024


class FrameMemory:
    """Reservations of frame bytes: at most ``limit`` in all, and at most a tenant's cap
    for its frames. Used on the event loop's thread only."""

    def __init__(self, limit: int) -> None:
        if type(limit) is not int or limit < protocol.MAX_FRAME_BYTES:
            raise ValueError(
                f"max_frame_memory must be at least {protocol.MAX_FRAME_BYTES} bytes "
                "(one largest frame)"
            )
        self.limit = limit
        self.held = 0
        self._tenants: dict[str, int] = {}
        self._waiters: set[asyncio.Future] = set()
        self._closed = False

    def held_by(self, tenant: str) -> int:
        """Bytes the tenant's frames hold now."""
        return self._tenants.get(tenant, 0)

    def _fits(self, tenant: str | None, size: int, cap: int | None) -> bool:
        if self.held + size > self.limit:
            return False
        return tenant is None or cap is None or self._tenants.get(tenant, 0) + size <= cap

    def try_reserve(self, tenant: str | None, size: int, cap: int | None) -> bool:
        """Reserve ``size`` bytes for a frame of ``tenant`` (None: anonymous) if they fit
        now; return whether they did."""
        if not self._fits(tenant, size, cap):
            return False
        self.held += size
        if tenant is not None:
            self._tenants[tenant] = self._tenants.get(tenant, 0) + size
        return True

    async def reserve(self, tenant: str | None, size: int, cap: int | None) -> None:
        """Reserve, waiting for room as long as it takes (the caller's frame timeout
        cancels the wait); raise ``ConnectionAbortedError`` once the server closes."""
        loop = asyncio.get_running_loop()
        while not self.try_reserve(tenant, size, cap):
            if self._closed:
                raise ConnectionAbortedError("the server is closing")
            waiter = loop.create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)

    def why_full(self, tenant: str | None, size: int, cap: int | None) -> str:
        """Say why a frame of ``size`` bytes finds no room (for its refusal)."""
        why = (
            f"no room for a frame of {size} bytes: frames being received hold {self.held} of "
            f"the server's {self.limit} bytes"
        )
        if tenant is not None and cap is not None:
            why += f", and {self._tenants.get(tenant, 0)} of this tenant's {cap}"
        return why

    def release(self, tenant: str | None, size: int) -> None:
        """Give a reservation back and wake the frames waiting for room."""
        self.held -= size
        if tenant is not None:
            left = self._tenants.pop(tenant) - size
            if left:
                self._tenants[tenant] = left
        self._wake()

    def close(self) -> None:
        """End every wait for room (the server is closing: its connections must end by
        themselves, a handler cancelled instead would be logged as failed)."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()


async def read_body(reader: asyncio.StreamReader, length: int) -> bytes | bytearray:
    """Read a frame body of ``length`` bytes (its memory reserved already); raise
    ``asyncio.IncompleteReadError`` if the stream ends first."""
    if length <= CHUNK_BYTES:
        return await reader.readexactly(length)
    body = bytearray()
    while len(body) < length:
        chunk = await reader.read(min(length - len(body), CHUNK_BYTES))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", length)
        body += chunk
    return body


async def discard_body(reader: asyncio.StreamReader, length: int) -> int:
    """Read a frame body of ``length`` bytes and throw it away, holding at most a chunk;
    return its request id (0 when its first bytes are no request), to answer it by."""
    head = b""
    left = length
    while left:
        chunk = await reader.read(min(left, CHUNK_BYTES))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", length)
        if len(head) < REQUEST_HEAD_BYTES:
            head += chunk[: REQUEST_HEAD_BYTES - len(head)]
        left -= len(chunk)
    return request_id_of(head)


#: A request begins with a msgpack array header and its id: at most 1 + 9 bytes.
REQUEST_HEAD_BYTES: Final = 10


def request_id_of(head: bytes) -> int:
    """The request id the first bytes of a request body carry, or 0."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(head)
    try:
        if unpacker.read_array_header() == 3:
            request_id = unpacker.unpack()
            if type(request_id) is int and 0 <= request_id <= protocol.MAX_REQUEST_ID:
                return request_id
    except Exception:  # msgpack raises several types for short or malformed bytes
        pass
    return 0
