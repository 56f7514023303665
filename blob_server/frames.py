"""Memory held by frames being received: a budget for all tenants and one per tenant.

*Why:* a frame's header announces up to 64 MiB, and reading the body with
``StreamReader.readexactly`` kept every byte received until the last one came: eight
connections that announced 48 MiB and then stalled grew the server by 393 MiB, and
nothing stopped one tenant from holding all of it. Now a frame's announced length is
**reserved** before its body is read, against the server's total and the tenant's own
budget (anonymous connections' frames, at most 64 KiB, count in the total only). A
frame that does not fit waits, reading nothing (its bytes stay in the kernel's socket
buffers, which TCP flow control bounds), until others are done with theirs; one that
still does not fit after the frame timeout is refused with ``busy`` and its connection
closed (its body was not read, so the stream cannot go on). The whole frame, waiting
included, must arrive within the frame timeout, so a stalled frame gives its memory
back. The reservation is held until the request is answered: its decoded arguments are
the same bytes again.

The body is read in chunks into a growing ``bytearray``, so the memory a frame holds is
what was received (never the announced length up front), and there is no second copy
at the end as ``readexactly`` makes.
"""

from __future__ import annotations

import asyncio
from typing import Final

from blob_server import protocol

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
        cancels the wait)."""
        loop = asyncio.get_running_loop()
        while not self.try_reserve(tenant, size, cap):
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
