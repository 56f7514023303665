"""The cluster's root-change feeds (``blob_server.storage.cluster_changes``) on the
session's cluster: telling Redis's own unsubscribes (a slot moved) from the answers to
ours, and never answering a watch True when its slot moved while it waited."""

from __future__ import annotations

import asyncio
import time

from blob_server.storage.cluster import ClusterStorage
from tests.server.cluster import LocalCluster, move_slot


async def same_master(storage: ClusterStorage, count: int) -> tuple[int, list[str]]:
    """A master's port and ``count`` databases whose channels it owns."""
    by_port: dict[int, list[str]] = {}
    for i in range(200):
        channel = await storage.root_channel("acme", f"db{i}")
        port = storage.master_of(channel).port
        by_port.setdefault(port, []).append(f"db{i}")
        if len(by_port[port]) == count:
            return port, by_port[port]
    raise AssertionError("no master owns enough of 200 databases")


def test_the_answer_to_our_own_unsubscribe_is_not_a_moved_slot(redis_cluster):
    """A database's last watcher leaves and a new one comes before Redis answered the
    SUNSUBSCRIBE (the feed stays open for another database): nothing is reported
    lost, and the database's commits are still delivered."""

    async def scenario() -> None:
        storage = ClusterStorage(redis_cluster.spec)
        changes: list[tuple[str, str, int]] = []
        lost: list[bool] = []
        feed = storage.root_changes(lambda *c: changes.append(c), lambda: lost.append(True))
        try:
            _, (keep, again) = await same_master(storage, 2)
            assert await feed.watch("acme", keep)
            assert await feed.watch("acme", again)
            feed.unwatch("acme", again)
            assert await feed.watch("acme", again)
            await asyncio.sleep(0.5)
            seq = storage.get_root("acme", again).seq
            await asyncio.to_thread(
                storage.commit, "acme", again, expected_seq=seq, root=b"r", blobs={}
            )
            deadline = time.monotonic() + 10
            while ("acme", again, seq + 1) not in changes:
                assert time.monotonic() < deadline, "the commit was not delivered"
                await asyncio.sleep(0.05)
            assert lost == []
        finally:
            await feed.aclose()
            storage.close()

    asyncio.run(scenario())


def test_a_slot_moved_while_a_watch_waits_answers_it_false(redis_cluster: LocalCluster):
    """Redis confirms the SSUBSCRIBE and, before the watch resumes, moves the slot (its
    unsolicited sunsubscribe read with the confirmation): the loss is reported before
    the watcher is registered anywhere, so the watch must answer False, or its client
    would trust a channel nobody listens to any more."""

    async def scenario() -> None:
        storage = ClusterStorage(redis_cluster.spec)
        lost: list[bool] = []
        feed = storage.root_changes(lambda *c: None, lambda: lost.append(True))
        port, (keep, moved) = await same_master(storage, 2)
        channel = await storage.root_channel("acme", moved)
        slot = storage._client().keyslot(channel)
        source = next(n for n in redis_cluster.masters() if n.port == port)
        target = next(n for n in redis_cluster.masters() if n.port != port)
        try:
            assert await feed.watch("acme", keep)
            shard = next(iter(feed._feeds.values()))
            watch = asyncio.ensure_future(feed.watch("acme", moved))
            while not (channel in shard._subscribed and shard._outbox.empty()):
                await asyncio.sleep(0)
            # The SSUBSCRIBE is on the wire; with this loop blocked, Redis confirms it
            # and then the slot moves.
            time.sleep(0.2)
            move_slot(redis_cluster, slot, target)
            time.sleep(0.3)
            assert await watch is False
            assert lost == [True]
        finally:
            await feed.aclose()
            storage.close()
            move_slot(redis_cluster, slot, source)

    asyncio.run(scenario())
