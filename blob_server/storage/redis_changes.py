"""Root changes through Redis pub/sub: one subscriber connection per server process.

The commit script publishes a database's new seq on a channel named like its root key
(``zdb:{S}:root``: opaque, derived from the scope tag, never from a name), atomically
with the root swap, so no acknowledged commit goes unannounced even when its server
process dies right after. Every server process keeps one connection SUBSCRIBEd to the
channels of the databases its clients subscribed to (``watch``), however many clients,
and hands each message to the server (``on_change``), which pushes it to its clients.

*Why pub/sub:* polling the roots costs a round trip per database per interval and is
late by the interval; keyspace notifications need a server-wide setting and send every
key event; a stream per database would be durable but must be trimmed and read per
database. Pub/sub costs nothing per commit when nobody listens, but it delivers at most
once: a subscriber that loses its connection misses what was published meanwhile, and
a client trusting its last push would then serve a stale root. So:

* the connection's health is checked: a PING every ``PING_INTERVAL`` seconds must be
  answered within ``PING_TIMEOUT``, else the connection counts as lost (a silent network
  failure, not only a closed socket);
* a lost connection is reconnected at once; after re-subscribing, the current seq of
  every watched database is read (one pipelined HGET) and delivered: whatever was
  missed is caught up, and a client whose root is older reads it again;
* if that first reconnection fails, or the catch-up does (Redis loading its data, a
  timeout), ``on_lost`` is called (the server disconnects its subscribed clients, which
  then read roots until they subscribe again), and the feed retries every
  ``RETRY_DELAY`` seconds; ``watch`` answers False meanwhile;
* ``watch`` answers True only if no loss was reported while it waited: a client whose
  subscription the server registers after a loss would not have been cut off by it.

Until a loss is noticed (at most ``PING_INTERVAL + PING_TIMEOUT`` for a silent one, at
once for a closed socket) a client may miss commits, like a push still on its way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from blob_server.exceptions import StorageUnavailableError
from blob_server.wire.storage import ChangeCallback, LostCallback, RootChanges

if TYPE_CHECKING:
    from blob_server.storage.redis import RedisStorage

#: Seconds between health checks of the subscriber connection.
PING_INTERVAL = 5.0
#: Seconds a PING (and a SUBSCRIBE) may take before the connection counts as lost.
PING_TIMEOUT = 5.0
#: Seconds between reconnection attempts after the immediate one failed.
RETRY_DELAY = 0.5
#: Longest a ``watch`` waits for the subscription (or for a reconnection under way).
WATCH_TIMEOUT = 2.0

log = logging.getLogger("blob_server.storage.redis_changes")

Key = tuple[str, str]
_LOST = (RedisError, OSError, TimeoutError, asyncio.IncompleteReadError)


class RedisRootChanges(RootChanges):
    """One subscriber connection following the watched databases' channels.

    The commands and message kinds are class attributes, so the cluster's sharded feed
    (``blob_server.storage.cluster_changes``) is this class with S-prefixed ones."""

    _SUBSCRIBE = "SUBSCRIBE"
    _UNSUBSCRIBE = "UNSUBSCRIBE"
    _MESSAGE = b"message"
    _CONFIRMED = b"subscribe"

    def __init__(
        self, storage: RedisStorage, on_change: ChangeCallback, on_lost: LostCallback
    ) -> None:
        self._storage = storage
        self._on_change = on_change
        self._on_lost = on_lost
        self._counts: Counter[Key] = Counter()
        self._channel_of: dict[Key, bytes] = {}
        self._key_of: dict[bytes, Key] = {}
        # SUBSCRIBEs sent and not yet confirmed, per channel, oldest first.
        self._pending: dict[bytes, deque[asyncio.Future]] = {}
        # The channels SUBSCRIBEd (confirmed or not) on the current connection.
        self._subscribed: set[bytes] = set()
        self._outbox: asyncio.Queue[tuple[Any, ...]] | None = None
        self._up = asyncio.Event()
        self._failing = False  # a reconnection failed: watch answers False at once
        self._losses = 0  # times on_lost was called
        # SUNSUBSCRIBEs sent on the current connection and not yet answered, per
        # channel: an answer beyond them is Redis's own (a slot that moved, on a cluster).
        self._unsubscribing: Counter[bytes] = Counter()
        # The highest seq delivered per watched channel: a catch-up that reads a lower
        # one finds a store that went back (a replaced or restored Redis).
        self._heard: dict[bytes, int] = {}
        self._last_pong = 0.0
        self._counters = dict.fromkeys(("delivered", "lost", "caught_up"), 0)
        self._task = asyncio.get_running_loop().create_task(self._run())

    # -- the RootChanges interface -------------------------------------------------------

    async def watch(self, tenant: str, database: str) -> bool:
        key = (tenant, database)
        channel = self._channel_of.get(key)
        if channel is None:
            try:
                channel = await self._storage.root_channel(tenant, database)
            except StorageUnavailableError:
                return False
            self._channel_of[key] = channel
            self._key_of[channel] = key
        self._counts[key] += 1
        losses = self._losses
        try:
            if not self._up.is_set():
                if self._failing:
                    raise TimeoutError
                await asyncio.wait_for(self._up.wait(), WATCH_TIMEOUT)  # reconnecting
            if channel not in self._subscribed:
                await asyncio.wait_for(self._subscribe(channel), WATCH_TIMEOUT)
            elif self._pending.get(channel):
                await asyncio.wait_for(asyncio.shield(self._pending[channel][-1]), WATCH_TIMEOUT)
        except (TimeoutError, *_LOST, asyncio.CancelledError) as exc:
            self.unwatch(tenant, database)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return False
        if self._losses != losses:  # the server may have cut off its clients meanwhile
            self.unwatch(tenant, database)
            return False
        return True

    def unwatch(self, tenant: str, database: str) -> None:
        key = (tenant, database)
        if self._counts[key] <= 1:
            del self._counts[key]
            channel = self._channel_of.pop(key, None)
            if channel is not None:
                self._key_of.pop(channel, None)
                self._heard.pop(channel, None)
                if channel in self._subscribed:
                    self._subscribed.discard(channel)
                    if self._send(self._UNSUBSCRIBE, channel):
                        self._unsubscribing[channel] += 1
        else:
            self._counts[key] -= 1

    def stats(self) -> dict[str, int]:
        return {"watched": len(self._counts), **self._counters}

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # -- the connection ------------------------------------------------------------------

    def _send(self, *command: Any) -> bool:
        """Queue a command on the live connection; False if there is none (dropped: the
        next connection subscribes to what is watched then)."""
        if self._outbox is None:
            return False
        self._outbox.put_nowait(command)
        return True

    def _subscribe(self, *channels: bytes) -> asyncio.Future:
        """Send SUBSCRIBE; return a future done when every channel is confirmed."""
        loop = asyncio.get_running_loop()
        futures = []
        for channel in channels:
            self._subscribed.add(channel)
            future = loop.create_future()
            self._pending.setdefault(channel, deque()).append(future)
            futures.append(future)
        self._send(self._SUBSCRIBE, *channels)
        # Shielded: a watch that gives up must not cancel a confirmation others await.
        return asyncio.gather(*map(asyncio.shield, futures))

    async def _run(self) -> None:
        connected_before = False  # a connection was up once: a loss may have missed changes
        while True:
            conn = self._connection()
            was_up = False
            try:
                await conn.connect()
                await self._serve(conn, catch_up=connected_before)
            except Exception as exc:  # whatever it was, the feed goes on
                # Lost, or the catch-up failed (StorageUnavailableError): a task that
                # ended here would leave subscribed clients trusting a silent feed.
                was_up = self._up.is_set()
                if was_up:  # lost a working connection: reconnect at once, catch up
                    self._counters["lost"] += 1
                    log.warning("event=root_changes_lost error=%s", type(exc).__name__)
                else:  # could not connect, or not subscribe (an ACL?): wait, retry
                    self._outage(exc, connected_before)
            finally:
                connected_before = connected_before or self._up.is_set()
                self._up.clear()
                self._outbox = None
                self._subscribed.clear()
                self._unsubscribing.clear()
                for futures in self._pending.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(ConnectionError("subscriber connection lost"))
                self._pending.clear()
                with contextlib.suppress(Exception):
                    await conn.disconnect()
            if not was_up:
                await asyncio.sleep(RETRY_DELAY)

    def _outage(self, exc: BaseException, connected_before: bool) -> None:
        """A connection attempt failed: the first one after a loss tells the server."""
        if not self._failing:
            self._failing = True
            log.warning("event=root_changes_unavailable error=%s", type(exc).__name__)
            if connected_before:
                self._lose()

    def _lose(self) -> None:
        """Tell the server that changes may have been missed."""
        self._losses += 1
        self._on_lost()

    async def _serve(self, conn: Any, *, catch_up: bool) -> None:
        """Subscribe to every watched channel, catch up if needed, then read messages and
        check the connection's health until it fails (raise)."""
        loop = asyncio.get_running_loop()
        self._outbox = asyncio.Queue()
        reader = loop.create_task(self._read(conn))
        sender = loop.create_task(self._write(conn, self._outbox))
        try:
            channels = list(self._key_of)
            if channels:
                await self._until(reader, self._subscribe(*channels), PING_TIMEOUT)
            if catch_up and channels:
                # Seqs heard before the read: one published since is not lower than what
                # the read finds, but may be delivered while it runs.
                heard = dict(self._heard)
                seqs = await asyncio.to_thread(self._storage.root_seqs, channels)
                back = [c for c, seq in zip(channels, seqs, strict=True) if seq < heard.get(c, 0)]
                if back:  # pushed seqs the store no longer has: clients must read roots
                    log.warning("event=root_changes_went_back databases=%d", len(back))
                    for channel in back:
                        self._heard.pop(channel, None)
                    self._lose()
                for channel, seq in zip(channels, seqs, strict=True):
                    self._deliver(channel, seq)
                self._counters["caught_up"] += 1
            self._failing = False
            self._up.set()
            while True:
                await self._until(reader, asyncio.sleep(PING_INTERVAL), None)
                sent = loop.time()
                self._send("PING")
                await self._until(reader, asyncio.sleep(PING_TIMEOUT), None)
                if self._last_pong < sent:
                    raise TimeoutError("no answer to PING")
        finally:
            reader.cancel()
            sender.cancel()
            for task in (reader, sender):
                with contextlib.suppress(BaseException):
                    await task

    @staticmethod
    async def _until(reader: asyncio.Task, work: Any, timeout: float | None) -> None:
        """Wait for ``work``, raising what the reader raised if it ends first."""
        work = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait(
                {reader, work}, timeout=timeout, return_when="FIRST_COMPLETED"
            )
        except BaseException:
            work.cancel()
            raise
        if reader in done:
            work.cancel()
            reader.result()  # raises the connection's error
            raise ConnectionError("subscriber connection closed")
        if work not in done:
            work.cancel()
            raise TimeoutError("the subscription was not confirmed")
        work.result()

    async def _write(self, conn: Any, outbox: asyncio.Queue) -> None:
        while True:
            await conn.send_command(*await outbox.get())

    async def _read(self, conn: Any) -> None:
        loop = asyncio.get_running_loop()
        while True:
            reply = await conn.read_response(timeout=float("inf"), push_request=True)
            if reply in (b"PONG", "PONG"):  # a PING while subscribed to nothing
                self._last_pong = loop.time()
                continue
            if not isinstance(reply, list) or not reply:
                continue
            kind = reply[0]
            if kind == self._MESSAGE and len(reply) == 3:
                self._deliver(reply[1], reply[2])
            elif kind == self._CONFIRMED and len(reply) == 3:
                futures = self._pending.get(reply[1])
                if futures:
                    future = futures.popleft()
                    if not future.done():
                        future.set_result(None)
                    if not futures:
                        del self._pending[reply[1]]
            elif kind == b"pong":
                self._last_pong = loop.time()
            else:
                self._other(reply)

    def _connection(self) -> Any:
        """A new, unconnected subscriber connection."""
        return self._storage.pubsub_connection()

    def _other(self, reply: list) -> None:
        """Another push (an unsubscribe confirmation): nothing to do here."""

    def _deliver(self, channel: bytes, seq: object) -> None:
        key = self._key_of.get(channel)
        if key is None:
            return
        try:
            value = int(seq)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            log.warning("event=root_changes_bad_message")
            return
        self._counters["delivered"] += 1
        self._heard[channel] = max(value, self._heard.get(channel, value))
        self._on_change(key[0], key[1], value)
