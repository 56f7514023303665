"""Several ``zerodb-server`` processes on one Redis: root pushes reach the clients of
every process (Redis pub/sub), a lost subscription makes clients revalidate, and commit
leases are one queue for all processes.

Real processes (``zerodb-server serve --redis``) on the tests' redis-server; round trips
are counted by ``db.stats()``, as in ``test_push``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.cli import main as cli_main
from blob_server.storage import MemoryStorage
from blob_server.wire import protocol
from tests.core.hr import Employee
from tests.server.test_push import (
    count_root_reads,
    eq_query,
    open_db,
    range_query,
    register,
    round_trips,
    seed,
    wait_for_seq,
)
from tests.server.test_server_e2e import RedisServerProcess
from tests.server.wire import InProcessServer, Wire, registry_with

REDIS_DB = 13  # apart from the storage tests (0, 3) and the other e2e tests (9 to 12)
WIRE_KEY = PrivateKey()  # acme's key for raw protocol clients (``Wire``)


@pytest.fixture(scope="module")
def fleet(redis_server, tmp_path_factory) -> Iterator[tuple[list[RedisServerProcess], dict]]:
    """Three server processes on one Redis database, and key files for two tenants."""
    tmp = tmp_path_factory.mktemp("scale-out")
    redis_server.client(REDIS_DB).flushdb()
    tenants, keys = register(tmp)
    public = WIRE_KEY.public_key.format().hex()
    assert cli_main(["add-key", "acme", public, "--tenants", str(tenants)]) == 0
    url = redis_server.url(REDIS_DB)
    servers = [RedisServerProcess(url, tenants, tmp / f"server{i}.log") for i in range(3)]
    for server in servers:
        server.start()
    yield servers, keys
    for server in servers:
        server.stop()
    for server in servers:
        log = server.log.read_text(errors="replace")
        assert "Traceback" not in log, log


def test_a_commit_through_one_process_is_pushed_to_the_clients_of_the_others(fleet):
    (a, b, c), keys = fleet
    with (
        open_db(a, keys["acme"], "fleet") as writer,
        open_db(b, keys["acme"], "fleet") as reader_b,
        open_db(c, keys["acme"], "fleet") as reader_c,
    ):
        seed(writer)
        expected = eq_query(writer)
        readers = [reader_b, reader_c]
        for reader in readers:
            assert eq_query(reader) == expected
            range_query(reader)  # warms the cache
        reads = {id(r): count_root_reads(r) for r in readers}
        for i in range(5):
            new = Employee(name="Ann", surname=f"F{i}", salary=105_000 + i, description="new")
            writer.add(new)
            committed = writer.stats()["seq"]
            expected = sorted([*expected, new.pk])
            for reader in readers:
                wait_for_seq(reader, committed)  # pushed by another process
                assert eq_query(reader) == expected
                warm_range = range_query(reader)  # reads the new nodes once
                assert reader.stats()["seq"] == committed
                before = round_trips(reader)
                assert eq_query(reader) == expected  # warm again: no round trip at all
                assert range_query(reader) == warm_range
                assert round_trips(reader) == before
                assert len(reads[id(reader)]) == i + 1  # one root read per change
        for reader in readers:
            assert reader.transport.pushes >= 5


def test_pushes_across_processes_stay_within_the_tenant_and_database(fleet):
    (a, b, _), keys = fleet
    with (
        open_db(b, keys["acme"], "iso") as acme,
        open_db(b, keys["acme"], "iso-other") as other_db,
        open_db(b, keys["beta"], "iso") as beta,
    ):
        for db in (acme, other_db, beta):
            eq_query(db)  # subscribes
        with open_db(a, keys["acme"], "iso") as writer:
            writer.add(Employee(name="Ann", surname="I", salary=1, description="x"))
            committed = writer.stats()["seq"]
        wait_for_seq(acme, committed)
        for db in (acme, other_db, beta):
            db.transport.ping()
        assert acme.transport.pushes == 1
        assert other_db.transport.pushes == 0
        assert beta.transport.pushes == 0
        assert beta.transport.known_root_seq("iso") == 0


def kill_subscribers(admin, at_least: int = 0) -> int:
    """CLIENT KILL every pub/sub connection (every server process's feed), once at
    least ``at_least`` are up (the feeds killed last time have subscribed again)."""
    deadline = time.monotonic() + 10
    while len(admin.client_list(_type="pubsub")) < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    return admin.client_kill_filter(_type="pubsub")


def test_a_killed_subscription_is_caught_up_not_left_stale(fleet, redis_server):
    admin = redis_server.client(REDIS_DB)
    killed_subscriptions_are_caught_up(fleet, lambda: kill_subscribers(admin, at_least=2))


def killed_subscriptions_are_caught_up(fleet, kill: Callable[[], int]) -> None:
    """Three times: ``kill`` every feed's pub/sub connection, then commit through one
    process; a client subscribed through another process sees the commit."""
    (a, b, _), keys = fleet
    with (
        open_db(a, keys["acme"], "killed") as writer,
        open_db(b, keys["acme"], "killed") as reader,
    ):
        seed(writer, n=20)
        wait_for_seq(reader, writer.stats()["seq"])  # subscribed at open: pushed, not read
        assert eq_query(reader) == eq_query(writer)
        for i in range(3):
            assert kill() >= 2
            writer.add(Employee(name="Ann", surname=f"K{i}", salary=1, description="x"))
            committed = writer.stats()["seq"]
            # Whether the commit came before the feed subscribed again (caught up by
            # reading the seqs) or after (published to the new connection), it arrives.
            wait_for_seq(reader, committed)
            assert eq_query(reader) == eq_query(writer)


def test_a_feed_that_cannot_reconnect_makes_clients_read_roots(fleet, redis_server):
    feed_cannot_reconnect(fleet, redis_server.client(REDIS_DB))


def feed_cannot_reconnect(fleet, admin) -> None:
    """While no new connection to ``admin``'s Redis (on a cluster: the master that owns
    database ``cut``'s slot) is possible, a killed feed cannot catch up: the process
    closes its subscribed connections, and their clients read roots again."""
    (a, b, _), keys = fleet
    with (
        open_db(a, keys["acme"], "cut") as writer,
        open_db(b, keys["acme"], "cut") as reader,
    ):
        seed(writer, n=20)
        wait_for_seq(reader, writer.stats()["seq"])  # subscribed at open: pushed, not read
        assert eq_query(reader) == eq_query(writer)
        assert reader.transport.known_root_seq("cut") == writer.stats()["seq"]
        admin.ping()  # holds its connection through the cut
        maxclients = admin.config_get("maxclients")["maxclients"]
        connected = admin.info("clients")["connected_clients"]
        admin.config_set("maxclients", max(1, connected - 3))
        try:
            assert kill_subscribers(admin) >= 2
            deadline = time.monotonic() + 10
            # Both: the writer is subscribed through its own process, whose feed was
            # killed too; a commit sent before its cut-off would be dropped mid-write.
            while any(db.transport.known_root_seq("cut") is not None for db in (reader, writer)):
                assert time.monotonic() < deadline, "the subscribed clients were not cut off"
                time.sleep(0.01)
            writer.add(Employee(name="Ann", surname="cut", salary=1, description="x"))
            reads = count_root_reads(reader)
            for _ in range(2):
                assert eq_query(reader) == eq_query(writer)
            assert len(reads) == 2  # not subscribed while the feed is down: read each time
        finally:
            admin.config_set("maxclients", maxclients)
        deadline = time.monotonic() + 10
        while True:  # back: a new connection subscribes again
            reader.transport.close()
            eq_query(reader)
            if reader.transport.known_root_seq("cut") is not None:
                break
            assert time.monotonic() < deadline, "the feed did not come back"
            time.sleep(0.1)
        writer.add(Employee(name="Ann", surname="back", salary=1, description="x"))
        wait_for_seq(reader, writer.stats()["seq"])
        assert eq_query(reader) == eq_query(writer)


def wire_on(server: RedisServerProcess) -> Wire:
    wire = Wire(server.port, timeout=30)
    answer, _ = wire.login("acme", WIRE_KEY)
    assert answer.ok, answer.result
    return wire


def test_commit_leases_are_one_fifo_across_processes(fleet):
    """A lease taken through process A holds off lease-aware commits through B and C;
    waiters on B and C get it in the order they asked, whichever process they use."""
    servers, _ = fleet
    database = "leased"
    wires = [wire_on(server) for server in servers]
    probes = [wire_on(server) for server in servers]  # other clients, one per process
    try:
        first = wires[0].call("acquire_lease", {"database": database, "wait": 5.0}).result
        assert first["granted"]
        commit = {"database": database, "root": b"r", "blobs": {}, "garbage": []}
        told = wires[1].call("commit", {**commit, "expected_seq": 0, "lease": None}).result
        assert told["wait"] and not told["ok"]  # not tried: A's client holds the lease
        grants: list[tuple[int, dict]] = []

        def wait_for_turn(index: int) -> None:
            answer = wires[index].call("acquire_lease", {"database": database, "wait": 30.0})
            grants.append((index, answer.result))

        threads = []
        for index in (2, 1):  # C asks first, then B
            threads.append(threading.Thread(target=wait_for_turn, args=(index,)))
            threads[-1].start()
            deadline = time.monotonic() + 10
            while wires[0].call("stats", {"database": database}).result["lease"] != {
                "held": 1,
                "waiting": len(threads),
            }:
                assert time.monotonic() < deadline, "the waiter did not queue"
                time.sleep(0.01)
        done = wires[0].call("commit", {**commit, "expected_seq": 0, "lease": first["token"]})
        assert done.result["ok"]  # A's commit gives the lease back: C's turn
        seq = done.result["seq"]
        for index in (2, 1):
            deadline = time.monotonic() + 10
            while len(grants) < (1 if index == 2 else 2):
                assert time.monotonic() < deadline, "the lease was not handed on"
                time.sleep(0.01)
            holder, answer = grants[-1]
            assert holder == index and answer["granted"] and answer["seq"] == seq
            for probe in probes:  # every other client is told to wait, on every process
                refused = probe.call("commit", {**commit, "expected_seq": seq, "lease": None})
                assert refused.result["wait"]
            ok = wires[index].call(
                "commit", {**commit, "expected_seq": seq, "lease": answer["token"]}
            )
            assert ok.result["ok"], ok.result
            seq = ok.result["seq"]
        for thread in threads:
            thread.join()
        assert wires[0].call("stats", {"database": database}).result["lease"] == {
            "held": 0,
            "waiting": 0,
        }
    finally:
        for wire in wires + probes:
            wire.close()


# -- in-process: the feeds themselves ---------------------------------------------------------


@pytest.fixture(params=["redis", "cluster"])
def feed_backend(request) -> tuple[Callable, Callable[[], int]]:
    """A storage factory, and how to kill every pub/sub connection of its Redis (on the
    cluster: of every master, where the sharded subscriptions are)."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        return request.getfixturevalue("redis_storage_factory"), lambda: kill_subscribers(
            server.client()
        )
    cluster = request.getfixturevalue("redis_cluster")
    return request.getfixturevalue("cluster_storage_factory"), lambda: sum(
        kill_subscribers(node.client()) for node in cluster.masters()
    )


def test_a_change_published_while_the_feed_was_cut_is_caught_up(feed_backend):
    """Pub/sub delivers at most once: a commit published while the feed's connection was
    dead reaches nobody. The feed reconnects and reads the seqs, so it is delivered anyway."""
    factory, kill = feed_backend

    async def scenario() -> None:
        storage = factory()
        got: list[tuple[str, str, int]] = []
        lost: list[bool] = []
        feed = storage.root_changes(lambda *change: got.append(change), lambda: lost.append(True))
        try:
            assert await feed.watch("acme", "main")
            storage.commit("acme", "main", expected_seq=0, root=b"r1", blobs={})
            while ("acme", "main", 1) not in got:
                await asyncio.sleep(0.005)
            # Blocking calls: the feed's loop does not run between the kill and the
            # commit, so the commit is published while nobody is subscribed.
            assert kill() >= 1
            storage.commit("acme", "main", expected_seq=1, root=b"r2", blobs={})
            deadline = time.monotonic() + 10
            while ("acme", "main", 2) not in got:
                assert time.monotonic() < deadline, got
                await asyncio.sleep(0.005)
            assert feed.stats()["caught_up"] == 1 and feed.stats()["lost"] == 1
            assert lost == []  # caught up at once: nobody had to be cut off
        finally:
            await feed.aclose()

    asyncio.run(scenario())


def test_two_servers_on_one_memory_storage_push_each_others_commits(tmp_path):
    """The in-process feed (memory, SQLite): servers sharing a storage object hear each
    other's commits; each subscriber gets each change once."""
    registry = registry_with(tmp_path / "tenants.json", acme=[WIRE_KEY])
    storage = MemoryStorage()
    servers = [InProcessServer(storage, Authenticator(registry)) for _ in range(2)]
    wires = [Wire(server.port) for server in servers]
    try:
        for wire in wires:
            assert wire.login("acme", WIRE_KEY)[0].ok
            assert wire.call("subscribe", {"database": "main"}).result == {"subscribed": True}
        committer = Wire(servers[0].port)
        wires.append(committer)
        assert committer.login("acme", WIRE_KEY)[0].ok
        for seq in (1, 2):
            commit = {"database": "main", "root": b"r", "blobs": {}, "garbage": []}
            assert committer.call("commit", {**commit, "expected_seq": seq - 1}).result["ok"]
            for wire in wires[:2]:
                push = protocol.parse_server_frame(protocol.recv_frame(wire.sock))
                assert push == protocol.Push("main", seq)
        for wire in wires[:2]:
            assert wire.call("ping").ok  # no second push of a change queued before it
        assert [server.server.pushes_sent for server in servers] == [2, 2]
    finally:
        for wire in wires:
            wire.close()
        for server in servers:
            server.stop()
