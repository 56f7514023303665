"""Commit leases: whose turn it is to commit to a database, once commits started to collide.

Commits are optimistic: a commit swaps the root only if nobody committed since the
client's snapshot (``Storage.commit``), and the loser replays its transaction on the
newer root and tries again. Left at that, a client committing in a loop wins almost
every race (its next commit is ready at once; a loser must first read the winner's new
nodes and replay), and the others starve: 3 writers committed 1,232 / 330 / 1 records
in 20 s, and some gave up with ``ConflictError``.

So a client that lost a race asks for the database's *commit lease* (``acquire``) and
waits in a FIFO for it; the head of the queue holds it until its commit succeeds
(``release``), its connection closes (``forget``) or ``timeout`` seconds pass, and then
the next one holds it. While someone holds it, every other lease-aware commit to that
database is told to wait (``held_by_other``) and queues too: commits then go round the
queue in turn. Nobody queues until a race was lost, so an uncontended commit pays
nothing (one dict lookup), unlike ZEO's commit lock, which every commit takes.

The lease decides *when* a client retries, never *whether*: a client replays (or refuses
to replay, by its isolation level) exactly as after any lost race. It is a scheduling
aid, not a lock the data depends on: a commit that ignores it (an older client, one
whose lease expired) is still checked by the storage's compare-and-swap.

The state sits behind ``CommitLeases`` and the storage chooses where it lives
(``Storage.commit_leases``): ``MemoryCommitLeases`` keeps it in this server process,
which is right for the in-process storages (memory; SQLite, served by one process);
Redis keeps it in Redis keys with an expiry (``blob_server.storage.redis_leases``), so
that the clients of every server process in front of it queue in one FIFO (with a queue
per process, they would race as before: never wrongly, only less fairly).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

#: Seconds a client may hold a commit lease (``serve --commit-lease-timeout``): long
#: enough to replay a transaction and upload it, short enough that a client that hangs
#: holding it delays the others only that long.
DEFAULT_LEASE_TIMEOUT = 2.0
#: Longest a client may wait for its turn in one request (it may ask again).
MAX_LEASE_WAIT = 60.0
#: Bytes of a lease token: random, so that nobody can commit in another's turn.
TOKEN_BYTES = 16

log = logging.getLogger("blob_server.leases")

Key = tuple[str, str]  # (tenant, database)


def check_lease_timeout(timeout: object) -> float:
    """Return the lease timeout as a float; raise ``ValueError`` out of (0, 60] s."""
    if type(timeout) not in (int, float) or not 0 < timeout <= MAX_LEASE_WAIT:  # type: ignore[operator]
        raise ValueError(f"the commit lease timeout must be in (0, {MAX_LEASE_WAIT:.0f}] s")
    return float(timeout)  # type: ignore[arg-type]


class CommitLeases(abc.ABC):
    """Per (tenant, database): a FIFO of clients waiting for the commit lease; the head
    holds it for at most ``timeout`` seconds.

    ``owner`` identifies the connection that asked (its leases and places go with it,
    ``forget``); a token identifies one grant, and is what a commit presents.
    """

    timeout: float

    @abc.abstractmethod
    async def acquire(
        self, tenant: str, database: str, owner: Hashable, wait: float, alive: Callable[[], bool]
    ) -> bytes | None:
        """Queue for the lease and wait at most ``wait`` seconds for it; return its token,
        or None when the wait ran out (the place in the queue is then given up).
        ``alive`` tells whether the owner can still use a grant (a waiter whose
        connection closed meanwhile is skipped)."""

    @abc.abstractmethod
    async def release(self, tenant: str, database: str, token: bytes) -> bool:
        """Give the lease back (its commit succeeded, or the client gave up); return
        whether ``token`` held it. The next waiter holds it at once."""

    @abc.abstractmethod
    async def held_by_other(self, tenant: str, database: str, token: bytes | None) -> bool:
        """Whether someone other than ``token``'s holder holds the lease now: a commit
        presenting ``token`` (None: none) must then wait for its turn."""

    @abc.abstractmethod
    async def forget(self, owner: Hashable) -> None:
        """Release the leases of ``owner`` and give up its places (its connection closed)."""

    @abc.abstractmethod
    async def state(self, tenant: str, database: str) -> dict[str, int]:
        """The lease of one database now: ``held`` (0 or 1) and ``waiting`` (clients
        queued for it)."""

    @abc.abstractmethod
    def claims_of(self, owner: Hashable) -> int:
        """How many leases ``owner`` holds or waits for (the server bounds it)."""

    @abc.abstractmethod
    def stats(self) -> dict[str, int]:
        """Counters since start: ``granted``, ``released``, ``expired`` (timed out),
        ``dropped`` (released because the holder's connection closed), ``held``, ``waiting``."""


@dataclass(eq=False, slots=True)
class _Claim:
    """One request for the lease: waiting, then (maybe) holding it."""

    key: Key
    owner: Hashable
    alive: Callable[[], bool]
    granted: asyncio.Future
    token: bytes = field(default_factory=lambda: os.urandom(TOKEN_BYTES))
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class _Queue:
    holder: _Claim | None = None
    waiting: deque[_Claim] = field(default_factory=deque)


class MemoryCommitLeases(CommitLeases):
    """The lease table of one server process, on its event loop (call it from there)."""

    def __init__(self, timeout: float = DEFAULT_LEASE_TIMEOUT) -> None:
        self.timeout = check_lease_timeout(timeout)
        self._queues: dict[Key, _Queue] = {}
        self._claims: dict[Hashable, set[_Claim]] = {}  # owner -> its claims
        self._counts = dict.fromkeys(("granted", "released", "expired", "dropped"), 0)

    async def state(self, tenant: str, database: str) -> dict[str, int]:
        queue = self._queues.get((tenant, database))
        if queue is None:
            return {"held": 0, "waiting": 0}
        return {"held": int(queue.holder is not None), "waiting": len(queue.waiting)}

    def claims_of(self, owner: Hashable) -> int:
        return len(self._claims.get(owner, ()))

    async def acquire(
        self, tenant: str, database: str, owner: Hashable, wait: float, alive: Callable[[], bool]
    ) -> bytes | None:
        key = (tenant, database)
        claim = _Claim(key, owner, alive, asyncio.get_running_loop().create_future())
        self._claims.setdefault(owner, set()).add(claim)
        queue = self._queues.setdefault(key, _Queue())
        queue.waiting.append(claim)
        self._advance(key, queue)
        if not claim.granted.done():
            try:
                await asyncio.wait_for(asyncio.shield(claim.granted), wait)
            except TimeoutError:
                pass
            except BaseException:  # cancelled (the server stops): give the place up
                self._withdraw(claim)
                raise
        if claim.granted.done() and not claim.granted.cancelled():
            return claim.token
        self._withdraw(claim)
        return None

    async def release(self, tenant: str, database: str, token: bytes) -> bool:
        queue = self._queues.get((tenant, database))
        if queue is None or queue.holder is None or queue.holder.token != token:
            return False
        self._counts["released"] += 1
        self._end(queue.holder)
        return True

    async def held_by_other(self, tenant: str, database: str, token: bytes | None) -> bool:
        queue = self._queues.get((tenant, database))
        return queue is not None and queue.holder is not None and queue.holder.token != token

    async def forget(self, owner: Hashable) -> None:
        for claim in self._claims.pop(owner, ()):
            queue = self._queues.get(claim.key)
            if queue is not None and queue.holder is claim:
                self._counts["dropped"] += 1
                log.info(
                    "event=lease_dropped owner=%s tenant=%s why=disconnected", owner, claim.key[0]
                )
            self._withdraw(claim)

    def stats(self) -> dict[str, int]:
        return {
            **self._counts,
            "held": sum(q.holder is not None for q in self._queues.values()),
            "waiting": sum(len(q.waiting) for q in self._queues.values()),
        }

    # -- internals -----------------------------------------------------------------------

    def _advance(self, key: Key, queue: _Queue) -> None:
        """Hand a free lease to the first waiter that can still use it."""
        while queue.holder is None and queue.waiting:
            claim = queue.waiting.popleft()
            if claim.granted.done() or not claim.alive():
                self._untrack(claim)
                continue
            queue.holder = claim
            claim.timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, claim)
            claim.granted.set_result(None)
            self._counts["granted"] += 1
        if queue.holder is None and not queue.waiting:
            del self._queues[key]

    def _expire(self, claim: _Claim) -> None:
        queue = self._queues.get(claim.key)
        if queue is not None and queue.holder is claim:
            self._counts["expired"] += 1
            log.warning(
                "event=lease_expired owner=%s tenant=%s timeout=%s waiting=%d",
                claim.owner,
                claim.key[0],
                self.timeout,
                len(queue.waiting),
            )
            self._end(claim)

    def _end(self, claim: _Claim) -> None:
        """The holder ``claim`` lets go: the next waiter holds the lease."""
        queue = self._queues[claim.key]
        if claim.timer is not None:
            claim.timer.cancel()
        queue.holder = None
        self._untrack(claim)
        self._advance(claim.key, queue)

    def _withdraw(self, claim: _Claim) -> None:
        """Take ``claim`` out, whether it holds the lease or waits for it."""
        queue = self._queues.get(claim.key)
        if queue is not None and queue.holder is claim:
            self._end(claim)
            return
        if not claim.granted.done():
            claim.granted.cancel()
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.waiting.remove(claim)
            if queue.holder is None and not queue.waiting:
                del self._queues[claim.key]
        self._untrack(claim)

    def _untrack(self, claim: _Claim) -> None:
        claims = self._claims.get(claim.owner)
        if claims is not None:
            claims.discard(claim)
            if not claims:
                del self._claims[claim.owner]
