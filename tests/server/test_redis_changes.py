"""The one-Redis root-change feed (``blob_server.storage.redis_changes``) on its own, on a
private redis-server: what it does when the connection comes back but the catch-up
cannot be made, and when several watches wait on one slow subscription."""

from __future__ import annotations

import asyncio
import time

import pytest

from blob_server.storage.redis import RedisStorage
from tests.server.conftest import start_redis_server, stop_redis_server


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of this test alone (its ACLs and pauses touch nobody else)."""
    server = start_redis_server(tmp_path)
    yield server
    stop_redis_server(server.process)


async def eventually(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the feed did not get there"
        await asyncio.sleep(0.05)


def test_a_catch_up_that_fails_reports_the_loss_and_the_feed_recovers(private_redis):
    """The subscriber connection is killed; it reconnects and subscribes, but reading
    the seqs to catch up is refused. The clients may have missed a commit, so the loss
    is reported; once Redis serves the reads again the feed catches up and delivers."""
    admin = private_redis.client()

    async def scenario() -> None:
        storage = RedisStorage(private_redis.url())
        changes: list[tuple[str, str, int]] = []
        lost: list[bool] = []
        storage.commit("acme", "main", expected_seq=0, root=b"r1", blobs={})
        feed = storage.root_changes(lambda *c: changes.append(c), lambda: lost.append(True))
        try:
            assert await feed.watch("acme", "main")
            admin.execute_command("ACL", "SETUSER", "default", "-hget")  # no catch-up
            assert admin.client_kill_filter(_type="pubsub") == 1
            await eventually(lambda: lost)
            assert lost == [True] and not feed._task.done()
            other = RedisStorage(private_redis.url())
            other.commit("acme", "main", expected_seq=1, root=b"r2", blobs={})
            admin.execute_command("ACL", "SETUSER", "default", "+hget")
            await eventually(lambda: ("acme", "main", 2) in changes)  # caught up
            assert await feed.watch("acme", "other")
            other.close()
        finally:
            await feed.aclose()
            storage.close()

    asyncio.run(scenario())


def test_a_watch_that_gives_up_does_not_cancel_another_waiting_on_the_same_channel(
    private_redis,
):
    """Redis answers nothing for 3 s: a first watch gives up after its 2 s, a second
    watch of the same database, which waits on the same subscription, is answered
    False too (the client reads roots) instead of having its task cancelled."""
    admin = private_redis.client()

    async def scenario() -> None:
        storage = RedisStorage(private_redis.url())
        feed = storage.root_changes(lambda *c: None, lambda: None)
        try:
            assert await feed.watch("acme", "keep")
            await storage.root_channel("acme", "x")
            admin.execute_command("CLIENT", "PAUSE", "3000", "ALL")
            first = asyncio.ensure_future(feed.watch("acme", "x"))
            await asyncio.sleep(0.5)
            second = asyncio.ensure_future(feed.watch("acme", "x"))
            await asyncio.wait({first, second})
            assert not second.cancelled()
            assert (first.result(), second.result()) == (False, False)
        finally:
            await feed.aclose()
            storage.close()

    asyncio.run(scenario())


def test_a_store_that_went_back_is_reported_lost_on_catch_up(private_redis):
    """After pushes of seqs 1-3, the feed's connection drops and the Redis it finds again
    holds seq 1 (a restored or replaced Redis, reached without a failed reconnection):
    clients trust seq 3, which the store no longer has, so the loss is reported (they
    read roots, and their freshness floor raises the alarm)."""
    admin = private_redis.client()

    async def scenario() -> None:
        storage = RedisStorage(private_redis.url())
        changes: list[tuple[str, str, int]] = []
        lost: list[bool] = []
        feed = storage.root_changes(lambda *c: changes.append(c), lambda: lost.append(True))
        try:
            assert await feed.watch("acme", "main")
            for seq in range(3):
                storage.commit("acme", "main", expected_seq=seq, root=b"r", blobs={})
            await eventually(lambda: ("acme", "main", 3) in changes)
            root = storage._scope("acme", "main").root
            admin.hset(root, "seq", 1)  # the store went back
            assert admin.client_kill_filter(_type="pubsub") == 1
            await eventually(lambda: lost)
            assert lost == [True]
        finally:
            await feed.aclose()
            storage.close()

    asyncio.run(scenario())


def test_a_commit_heard_while_catching_up_is_not_a_store_that_went_back(private_redis):
    """The catch-up reads seq 1, and before its answer is compared the feed already
    delivered the push of seq 2 (a commit just after the read): nothing went back, so
    nothing is reported lost."""
    admin = private_redis.client()

    async def scenario() -> None:
        storage, other = RedisStorage(private_redis.url()), RedisStorage(private_redis.url())
        changes: list[tuple[str, str, int]] = []
        lost: list[bool] = []
        feed = storage.root_changes(lambda *c: changes.append(c), lambda: lost.append(True))
        read = storage.root_seqs

        def read_then_commit(channels):
            seqs = read(channels)
            other.commit("acme", "main", expected_seq=1, root=b"r", blobs={})
            time.sleep(0.5)  # the feed delivers the push of seq 2 meanwhile
            return seqs

        try:
            assert await feed.watch("acme", "main")
            storage.commit("acme", "main", expected_seq=0, root=b"r", blobs={})
            await eventually(lambda: ("acme", "main", 1) in changes)
            storage.root_seqs = read_then_commit
            assert admin.client_kill_filter(_type="pubsub") == 1
            await eventually(lambda: feed.stats()["caught_up"] == 1)
            assert ("acme", "main", 2) in changes and lost == []
        finally:
            await feed.aclose()
            storage.close()
            other.close()

    asyncio.run(scenario())
