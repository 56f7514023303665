"""Root changes on a Redis Cluster: sharded pub/sub, one subscriber connection per master.

The swap script SPUBLISHes a database's new seq on the channel named like its root key
(``zdb:{S}:root``), atomically with the swap, as on one Redis. A shard channel lives in
its key's slot: a SPUBLISH reaches only the SSUBSCRIBErs connected to the master that
owns the slot (plain PUBLISH would be broadcast over the cluster bus to every node,
which is what sharded pub/sub avoids). So a server process keeps one feed per master
it has watched channels on (``_ShardFeed``: ``RedisRootChanges`` with the S-commands, on
that node), each with its health checks, reconnection and catch-up.

When a slot moves (resharding) or its master fails over, Redis unsubscribes the
channels of the slot (an unrequested ``sunsubscribe``), or the feed's node stops
answering. Either way commits may now be published where this process does not
listen, so ``on_lost`` is called: the server disconnects its subscribed clients, which
read roots until they subscribe again, and a new ``watch`` is routed to the slot's
current master (the topology read again). A late push is never trusted as current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from blob_server.exceptions import StorageUnavailableError
from blob_server.storage.redis_changes import RedisRootChanges
from blob_server.wire.storage import ChangeCallback, LostCallback, RootChanges

if TYPE_CHECKING:
    from redis.cluster import ClusterNode

    from blob_server.storage.cluster import ClusterStorage

log = logging.getLogger("blob_server.storage.cluster_changes")

Key = tuple[str, str]


class _ShardFeed(RedisRootChanges):
    """The channels of the watched databases whose slots one master owns."""

    _SUBSCRIBE = "SSUBSCRIBE"
    _UNSUBSCRIBE = "SUNSUBSCRIBE"
    _MESSAGE = b"smessage"
    _CONFIRMED = b"ssubscribe"

    def __init__(
        self,
        storage: ClusterStorage,
        node: ClusterNode,
        on_change: ChangeCallback,
        on_lost: LostCallback,
    ) -> None:
        self._node = node
        super().__init__(storage, on_change, on_lost)  # type: ignore[arg-type]

    def _connection(self) -> Any:
        return self._storage.pubsub_connection(self._node)  # type: ignore[call-arg]

    def _other(self, reply: list) -> None:
        """An ``sunsubscribe`` beyond the SUNSUBSCRIBEs this feed sent, for a channel
        still watched: Redis moved its slot. (Answers come in order, so counting is
        exact: the answer to our own SUNSUBSCRIBE of a database watched again since is
        not a move.)"""
        if reply[0] != b"sunsubscribe" or len(reply) != 3:
            return
        channel = reply[1]
        if self._unsubscribing[channel]:
            self._unsubscribing[channel] -= 1
            if not self._unsubscribing[channel]:
                del self._unsubscribing[channel]
        elif channel in self._key_of:
            self._subscribed.discard(channel)
            log.warning("event=root_changes_moved node=%s", self._node.name)
            self._lose()


class ClusterRootChanges(RootChanges):
    """One ``_ShardFeed`` per master that owns a watched database's slot."""

    def __init__(
        self, storage: ClusterStorage, on_change: ChangeCallback, on_lost: LostCallback
    ) -> None:
        self._storage = storage
        self._on_change = on_change
        self._on_lost = on_lost
        self._feeds: dict[str, _ShardFeed] = {}
        self._routes: defaultdict[Key, list[str]] = defaultdict(list)  # a node per watch
        self._closing: set[asyncio.Task] = set()

    async def watch(self, tenant: str, database: str) -> bool:
        try:
            channel = await self._storage.root_channel(tenant, database)
            node = await asyncio.to_thread(self._storage.master_of, channel)
        except StorageUnavailableError:
            return False
        feed = self._feeds.get(node.name)
        if feed is None:
            feed = self._feeds[node.name] = _ShardFeed(
                self._storage, node, self._on_change, self._on_lost
            )
        if not await feed.watch(tenant, database):
            self._close_if_idle(node.name)
            return False
        self._routes[(tenant, database)].append(node.name)
        return True

    def unwatch(self, tenant: str, database: str) -> None:
        routes = self._routes.get((tenant, database))
        if not routes:
            return
        name = routes.pop()
        if not routes:
            del self._routes[(tenant, database)]
        feed = self._feeds.get(name)
        if feed is not None:
            feed.unwatch(tenant, database)
            self._close_if_idle(name)

    def _close_if_idle(self, name: str) -> None:
        """Stop a feed left with nothing to watch (its node may be gone for good)."""
        feed = self._feeds.get(name)
        if feed is not None and not feed.stats()["watched"]:
            del self._feeds[name]
            task = asyncio.get_running_loop().create_task(feed.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def stats(self) -> dict[str, int]:
        totals = dict.fromkeys(("delivered", "lost", "caught_up"), 0)
        for feed in self._feeds.values():
            for name, value in feed.stats().items():
                if name in totals:
                    totals[name] += value
        return {"watched": len(self._routes), **totals, "feeds": len(self._feeds)}

    async def aclose(self) -> None:
        feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            await feed.aclose()
        for task in list(self._closing):
            with contextlib.suppress(BaseException):
                await task
