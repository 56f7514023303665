"""Commit leases in Redis: one FIFO per database, shared by every server process.

``blob_server.leases`` explains what a commit lease is for. In one process the queue is
a deque (``MemoryCommitLeases``); several processes in front of one Redis (or one Redis
Cluster) must share it, or the clients of different processes would race as if there
were no lease. Keys, in the database's cluster slot (``{S}`` is its scope tag, so no
name appears; on a cluster every script below runs on the master of that slot)::

    zdb:{S}:lh    string: the token holding the lease, with PX = the lease timeout
    zdb:{S}:lq    sorted set: waiting tokens, scored by arrival (``zdb:{S}:ln`` counts)
    zdb:{S}:lb    hash: waiting token -> the time (Redis' clock, ms) it must poll again by

One script (``_TURN``) does everything a waiter needs, atomically: join the queue if not
in it, note that it is alive, and, when nobody holds the lease (released, or the PX ran
out: the holder hung or died), hand it to the first waiter still alive (dead waiters,
whose process stopped polling, are dropped). Waiting is polling that script, every
``POLL_FIRST`` seconds at first, backing off to ``POLL_MAX``: a lease is only asked for
after a lost race, so only contended databases poll. *Why not pub/sub or BLPOP to wake
the next waiter:* a blocking pop needs a connection per waiter, and a wake-up message
can be lost; polling also notices expiry with no timer anywhere. The cost: a released
lease waits up to ``POLL_MAX`` for its next holder to notice.

Every lease-aware commit asks who holds the lease (one GET, a Redis round trip; the
memory table answers with a dict lookup). Counters (``stats``) are this process's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisClusterException, RedisError

from blob_server.exceptions import StorageUnavailableError
from blob_server.leases import MAX_LEASE_WAIT, TOKEN_BYTES, CommitLeases, check_lease_timeout

if TYPE_CHECKING:
    from blob_server.storage.cluster import ClusterStorage
    from blob_server.storage.redis import RedisStorage

#: What redis-py raises when Redis does not answer: ``RedisError``s, and on a cluster
#: ``RedisClusterException``s (no node reachable), which are not ``RedisError``s.
_REDIS_ERRORS = (RedisError, RedisClusterException)

#: Seconds between a waiter's first polls, and at most (it backs off by doubling).
POLL_FIRST = 0.002
POLL_MAX = 0.02
#: A waiter that has not polled for this long is taken for dead and skipped.
WAITER_GRACE_MS = 2000
#: Idle queues vanish after this long (each poll extends it).
QUEUE_TTL_MS = 120_000

# KEYS: holder, queue, beats, arrivals. ARGV: token, lease ms, grace ms, queue ttl ms.
# Returns 1 when ``token`` holds the lease (now or already), else 0.
_TURN = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  return 1
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])
end
redis.call('HSET', KEYS[3], ARGV[1], now + tonumber(ARGV[3]))
while not holder do
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not head then
    break
  end
  local alive = tonumber(redis.call('HGET', KEYS[3], head) or '0') >= now
  redis.call('ZREM', KEYS[2], head)
  redis.call('HDEL', KEYS[3], head)
  if alive then
    redis.call('SET', KEYS[1], head, 'PX', ARGV[2])
    holder = head
  end
end
for i = 2, 4 do
  redis.call('PEXPIRE', KEYS[i], ARGV[4])
end
if holder == ARGV[1] then
  return 1
end
return 0
"""

# KEYS: holder, queue, beats. ARGV: token. Gives the lease back if ``token`` holds it
# (returns 1), and takes the token out of the queue either way.
_LEAVE = """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

Key = tuple[str, str]


class RedisCommitLeases(CommitLeases):
    """Commit leases kept in Redis (see the module doc); call it on the event loop."""

    def __init__(self, storage: RedisStorage | ClusterStorage, timeout: float) -> None:
        self.timeout = check_lease_timeout(timeout)
        self._storage = storage
        # owner -> {token: (key, granted at (monotonic) or None while waiting)}
        self._claims: dict[Hashable, dict[bytes, tuple[Key, float | None]]] = {}
        self._counts = dict.fromkeys(("granted", "released", "expired", "dropped"), 0)
        self._turn: Any = None
        self._leave: Any = None

    async def _call(self, script: str, key: Key, *args: Any) -> int:
        base = await self._storage.scope_prefix(*key)  # remembered by the storage
        keys = [base + s for s in (b"lh", b"lq", b"lb", b"ln")]
        client = self._storage.async_client()
        try:
            if script is _TURN:
                if self._turn is None:
                    self._turn = client.register_script(_TURN)
                return int(await self._turn(keys=keys, args=args, client=client))
            if self._leave is None:
                self._leave = client.register_script(_LEAVE)
            return int(await self._leave(keys=keys[:3], args=args, client=client))
        except _REDIS_ERRORS as exc:
            raise StorageUnavailableError(f"Redis at {self._storage.url}: {exc}") from exc

    async def acquire(
        self, tenant: str, database: str, owner: Hashable, wait: float, alive: Callable[[], bool]
    ) -> bytes | None:
        key = (tenant, database)
        token = os.urandom(TOKEN_BYTES)
        claims = self._claims.setdefault(owner, {})
        claims[token] = (key, None)
        lease_ms = str(round(self.timeout * 1000))
        args = (token, lease_ms, str(WAITER_GRACE_MS), str(QUEUE_TTL_MS))
        deadline = time.monotonic() + min(wait, MAX_LEASE_WAIT)
        pause = POLL_FIRST
        try:
            # Until the wait runs out, the owner's connection closes, or ``forget``
            # took the claim away (a poll under way may then have queued it again).
            while alive() and token in self._claims.get(owner, ()):
                if await self._call(_TURN, key, *args):
                    if token not in self._claims.get(owner, ()):
                        break
                    self._granted(owner, token, key)
                    return token
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, POLL_MAX)
        finally:
            if token not in self._claims.get(owner, {}) or self._claims[owner][token][1] is None:
                await self._withdraw(owner, token, key)
        return None

    def _granted(self, owner: Hashable, token: bytes, key: Key) -> None:
        """Note a grant; a lease of this process on the same database that is still
        noted as held has run out (only one token holds it at a time)."""
        self._counts["granted"] += 1
        for other_owner, claims in list(self._claims.items()):
            for other, (other_key, granted) in list(claims.items()):
                if other_key == key and granted is not None and other != token:
                    self._counts["expired"] += 1
                    del claims[other]
            if not claims:
                del self._claims[other_owner]
        self._claims.setdefault(owner, {})[token] = (key, time.monotonic())

    async def _withdraw(self, owner: Hashable, token: bytes, key: Key) -> bool:
        """Take ``token`` out of the queue and give its lease back if it holds it;
        return whether it held it."""
        claims = self._claims.get(owner, {})
        claims.pop(token, None)
        if not claims:
            self._claims.pop(owner, None)
        with contextlib.suppress(StorageUnavailableError):  # its entry then dies unpolled
            return bool(await self._call(_LEAVE, key, token))
        return False

    async def release(self, tenant: str, database: str, token: bytes) -> bool:
        released = bool(await self._call(_LEAVE, (tenant, database), token))
        for owner, claims in list(self._claims.items()):
            claim = claims.get(token)
            if claim is not None and claim[0] == (tenant, database):
                del claims[token]
                if not claims:
                    del self._claims[owner]
                if not released and claim[1] is not None:
                    self._counts["expired"] += 1
        if released:
            self._counts["released"] += 1
        return released

    async def held_by_other(self, tenant: str, database: str, token: bytes | None) -> bool:
        prefix = await self._storage.scope_prefix(tenant, database) + b"lh"
        try:
            holder = await self._storage.async_client().get(prefix)
        except _REDIS_ERRORS as exc:
            raise StorageUnavailableError(f"Redis at {self._storage.url}: {exc}") from exc
        return holder is not None and holder != token

    async def forget(self, owner: Hashable) -> None:
        claims = self._claims.get(owner, {})
        for token, (key, granted) in list(claims.items()):
            if await self._withdraw(owner, token, key) and granted is not None:
                self._counts["dropped"] += 1

    async def state(self, tenant: str, database: str) -> dict[str, int]:
        prefix = await self._storage.scope_prefix(tenant, database)
        try:
            pipe = self._storage.async_client().pipeline(transaction=False)
            pipe.exists(prefix + b"lh")
            pipe.zcard(prefix + b"lq")
            held, waiting = await pipe.execute()
        except _REDIS_ERRORS as exc:
            raise StorageUnavailableError(f"Redis at {self._storage.url}: {exc}") from exc
        return {"held": int(held), "waiting": int(waiting)}

    def claims_of(self, owner: Hashable) -> int:
        return len(self._claims.get(owner, ()))

    def stats(self) -> dict[str, int]:
        now = time.monotonic()
        held = waiting = 0
        for claims in self._claims.values():
            for _, granted in claims.values():
                if granted is None:
                    waiting += 1
                elif now - granted < self.timeout:
                    held += 1
        return {**self._counts, "held": held, "waiting": waiting}
