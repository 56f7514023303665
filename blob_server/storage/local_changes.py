"""Root changes within one Python process: the feed of the memory and SQLite backends.

A ``memory://`` store lives in one process, so every commit to it passes through its
storage object, which announces it here; a SQLite file may be shared by several
processes, whose commits nobody announces (``PRAGMA data_version`` could tell that
something changed, not what): several server processes on one SQLite file still need
``serve --no-push``, and Redis is the storage for several processes.

The hub of a storage object keeps the feeds made from it (one per server on it; tests
run several servers on one storage in one process); a commit, made on any thread,
reaches each feed on its own event loop. Nothing here can be lost, so ``on_lost`` is
never called.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from blob_server.storage.base import ChangeCallback, LostCallback, RootChanges, Storage


class _Hub:
    """The feeds of one storage object; ``announce`` is called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._feeds: set[LocalRootChanges] = set()

    def feed(self, on_change: ChangeCallback, on_lost: LostCallback) -> LocalRootChanges:
        feed = LocalRootChanges(self, on_change, asyncio.get_running_loop())
        with self._lock:
            self._feeds.add(feed)
        return feed

    def drop(self, feed: LocalRootChanges) -> None:
        with self._lock:
            self._feeds.discard(feed)

    def announce(self, tenant: str, database: str, seq: int) -> None:
        with self._lock:
            feeds = [feed for feed in self._feeds if (tenant, database) in feed.watched]
        for feed in feeds:
            feed.post(tenant, database, seq)


_hub_lock = threading.Lock()


def hub_of(storage: Storage) -> _Hub:
    """The hub of ``storage`` (made on first use, kept on the storage object)."""
    with _hub_lock:
        hub = storage.__dict__.get("_root_hub")
        if hub is None:
            hub = storage.__dict__["_root_hub"] = _Hub()
    return hub


class LocalRootChanges(RootChanges):
    """The changes announced through one storage object, delivered on ``loop``."""

    def __init__(self, hub: _Hub, on_change: ChangeCallback, loop: asyncio.AbstractEventLoop):
        self._hub = hub
        self._on_change = on_change
        self._loop = loop
        self.watched: Counter[tuple[str, str]] = Counter()
        self._delivered = 0

    def post(self, tenant: str, database: str, seq: int) -> None:
        """Deliver a change on this feed's loop (from any thread)."""
        try:
            self._loop.call_soon_threadsafe(self._deliver, tenant, database, seq)
        except RuntimeError:  # the loop is closed: its server is gone
            self._hub.drop(self)

    def _deliver(self, tenant: str, database: str, seq: int) -> None:
        if (tenant, database) in self.watched:
            self._delivered += 1
            self._on_change(tenant, database, seq)

    async def watch(self, tenant: str, database: str) -> bool:
        self.watched[(tenant, database)] += 1
        return True

    def unwatch(self, tenant: str, database: str) -> None:
        key = (tenant, database)
        self.watched[key] -= 1
        if self.watched[key] <= 0:
            del self.watched[key]

    def stats(self) -> dict[str, int]:
        return {
            "watched": len(self.watched),
            "delivered": self._delivered,
            "lost": 0,
            "caught_up": 0,
        }

    async def aclose(self) -> None:
        self._hub.drop(self)
        self.watched.clear()
