"""Root pushes: a warm subscribed client skips the root read, and still sees others' commits.

The blob server runs as a subprocess (``zerodb-server serve``), on ``memory://`` except
where a restart must keep the data (SQLite). Round trips are counted by ``db.stats()``.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.cli import main as cli_main
from blob_server.storage import MemoryStorage
from blob_server.wire import protocol
from tests.core.hr import Employee
from tests.server.test_server_e2e import PASSWORD, ServerProcess
from tests.server.wire import InProcessServer, Wire, registry_with
from zerodb_core import DB
from zerodb_core.keyfile import KeyFile
from zerodb_core.query import InRange
from zerodb_core.transport import subscription
from zerodb_core.transport.remote import RemoteTransport

N_EMPLOYEES = 300
NAMES = ["Ann", "Bob", "Cleo", "Dan", "Eve"]
PUSH_WAIT = 10.0  # seconds a push may take to arrive on a loopback connection


def register(tmp: Path) -> tuple[Path, dict[str, Path]]:
    """Tenants acme and beta with one key file each, registered through the CLI."""
    tenants = tmp / "tenants.json"
    keys = {}
    for tenant in ("acme", "beta"):
        assert cli_main(["add-tenant", tenant, "--tenants", str(tenants)]) == 0
        key = KeyFile.create(tenant)
        path = tmp / f"{tenant}.zdbkey"
        key.save(path, PASSWORD, kdf="fast")
        assert cli_main(["add-key", tenant, key.public_key.hex(), "--tenants", str(tenants)]) == 0
        keys[tenant] = path
    return tenants, keys


@pytest.fixture(scope="module")
def memory_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("push")
    tenants, keys = register(tmp)
    server = ServerProcess("memory://", tenants, tmp / "server.log")
    server.start()
    yield server, keys
    server.stop()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log


def open_db(server: ServerProcess, key: Path, database: str) -> DB:
    return DB(
        ("127.0.0.1", server.port),
        password=PASSWORD,
        key_file=key,
        kdf="fast",
        database=database,
    )


def seed(db: DB, n: int = N_EMPLOYEES, seed: int = 5) -> None:
    rng = random.Random(seed)
    with db.transaction():
        db.add(
            *[
                Employee(
                    name=rng.choice(NAMES),
                    surname=f"S{i}",
                    salary=rng.randrange(30_000, 200_000),
                    description="staff",
                )
                for i in range(n)
            ]
        )


def eq_query(db: DB) -> list[int]:
    return sorted(e.pk for e in db[Employee].query(name="Ann"))


def range_query(db: DB) -> list[int]:
    return sorted(e.pk for e in db[Employee].query(InRange("salary", 100_000, 110_000)))


def round_trips(db: DB) -> int:
    return db.stats()["round_trips"]


def count_root_reads(db: DB) -> list[str]:
    """Record every root read the transport makes from now on."""
    reads: list[str] = []
    original = db.transport._get_root

    def spy(database):
        reads.append(database)
        return original(database)

    db.transport._get_root = spy
    return reads


def wait_for_seq(db: DB, seq: int) -> None:
    """Poll (no round trips) until the subscription knows the root is at least ``seq``."""
    deadline = time.monotonic() + PUSH_WAIT
    while time.monotonic() < deadline:
        known = db.transport.known_root_seq(db.database)
        if known is not None and known >= seq:
            return
        time.sleep(0.005)
    pytest.fail(f"no push of seq {seq} within {PUSH_WAIT}s")


def test_a_new_client_opens_in_one_round_trip(memory_server):
    """Keyring, subscription and root in one exchange; the first query uses that root."""
    server, keys = memory_server
    with open_db(server, keys["acme"], "opening") as db:
        seed(db)
    with open_db(server, keys["acme"], "opening") as db:
        assert round_trips(db) == 1
        reads = count_root_reads(db)
        assert len(eq_query(db)) > 0
        assert reads == []


def test_warm_indexed_queries_skip_the_root_read(memory_server):
    server, keys = memory_server
    with open_db(server, keys["acme"], "warm") as db:
        seed(db)
        first_eq, first_range = eq_query(db), range_query(db)  # warms the cache
        assert 0 < len(first_eq) <= 100 and 0 < len(first_range) <= 100
        assert db.transport.known_root_seq("warm") == db.stats()["seq"] == 1
        reads = count_root_reads(db)
        for _ in range(5):
            before = round_trips(db)
            assert eq_query(db) == first_eq
            eq_cost = round_trips(db) - before
            before = round_trips(db)
            assert range_query(db) == first_range
            range_cost = round_trips(db) - before
            assert eq_cost <= 2 and range_cost <= 2  # the bound
            assert eq_cost == range_cost == 0  # all cached and no root read: nothing at all
        assert reads == []


def test_a_commit_by_another_client_is_seen_once_its_push_arrived(memory_server):
    server, keys = memory_server
    with (
        open_db(server, keys["acme"], "shared") as reader,
        open_db(server, keys["acme"], "shared") as writer,
    ):
        seed(writer)
        expected_eq, expected_range = eq_query(writer), range_query(writer)
        assert (eq_query(reader), range_query(reader)) == (expected_eq, expected_range)
        reads = count_root_reads(reader)
        for i in range(10):
            seq_before = reader.stats()["seq"]
            new = Employee(name="Ann", surname=f"N{i}", salary=105_000 + i, description="new")
            writer.add(new)
            committed = writer.stats()["seq"]
            assert committed > seq_before
            wait_for_seq(reader, committed)
            # The push has been taken in: the very next query must see the write.
            expected_eq.append(new.pk)
            expected_range.append(new.pk)
            assert eq_query(reader) == sorted(expected_eq)
            assert range_query(reader) == sorted(expected_range)
            assert reader.stats()["seq"] == committed
            assert len(reads) == i + 1  # one root read per change, not one per query
            before = round_trips(reader)
            assert eq_query(reader) == sorted(expected_eq)  # warm again: no round trip
            assert range_query(reader) == sorted(expected_range)
            assert round_trips(reader) == before
        assert reader.transport.pushes >= 10


def test_any_round_trip_after_the_ack_takes_in_the_push(memory_server):
    """The server queues a push before it acknowledges the commit, so a request the
    reader sends after the writer's ack is answered after the push: no polling needed."""
    server, keys = memory_server
    with (
        open_db(server, keys["acme"], "causal") as reader,
        open_db(server, keys["acme"], "causal") as writer,
    ):
        seed(writer, n=20)
        assert len(eq_query(reader)) == len(eq_query(writer))
        for i in range(5):
            writer.add(Employee(name="Ann", surname=f"C{i}", salary=1, description="x"))
            reader.transport.ping()
            assert reader.transport.known_root_seq("causal") == writer.stats()["seq"]
            assert eq_query(reader) == eq_query(writer)


def test_reads_never_go_back_while_another_client_commits(memory_server):
    server, keys = memory_server
    with (
        open_db(server, keys["acme"], "race") as reader,
        open_db(server, keys["acme"], "race") as writer,
    ):
        seed(writer, n=50)
        done = threading.Event()
        commits = []

        def write() -> None:
            try:
                for i in range(30):
                    writer.add(Employee(name="Ann", surname=f"R{i}", salary=2, description="x"))
                    commits.append(writer.stats()["seq"])
            finally:
                done.set()

        thread = threading.Thread(target=write)
        thread.start()
        seen = []
        while not done.is_set():
            seen.append((reader.stats()["seq"], len(eq_query(reader))))
        thread.join()
        assert seen == sorted(seen)  # neither the root nor the answer ever goes back
        wait_for_seq(reader, commits[-1])
        assert eq_query(reader) == eq_query(writer)
        assert reader.stats()["seq"] == commits[-1]


def test_pushes_stay_within_the_tenant_and_database(memory_server):
    server, keys = memory_server
    with (
        open_db(server, keys["acme"], "iso") as acme,
        open_db(server, keys["acme"], "iso-other") as other_db,
        open_db(server, keys["beta"], "iso") as beta,
    ):
        for db in (acme, other_db, beta):
            eq_query(db)  # subscribes
        with open_db(server, keys["acme"], "iso") as writer:
            writer.add(Employee(name="Ann", surname="I", salary=1, description="x"))
        for db in (acme, other_db, beta):
            db.transport.ping()  # any push was queued before the commit's ack
        assert acme.transport.pushes == 1
        assert other_db.transport.pushes == 0
        assert beta.transport.pushes == 0
        assert beta.transport.known_root_seq("iso") == 0
        assert eq_query(beta) == []


def test_a_restarted_server_makes_the_client_read_roots_again(tmp_path):
    tenants, keys = register(tmp_path)
    server = ServerProcess(f"sqlite:///{tmp_path}/blobs.zdb", tenants, tmp_path / "server.log")
    server.start()
    try:
        with open_db(server, keys["acme"], "main") as db:
            seed(db)
            expected = (eq_query(db), range_query(db))
            assert db.transport.known_root_seq("main") == 1
            before = round_trips(db)
            assert (eq_query(db), range_query(db)) == expected
            assert round_trips(db) == before

            server.stop()
            server.start()  # same port, same SQLite file; the old connection is gone
            assert db.transport.known_root_seq("main") is None  # no guarantee any more
            reads = count_root_reads(db)
            assert (eq_query(db), range_query(db)) == expected
            assert reads == ["main"]  # read once on the new connection, subscribed again
            assert db.transport.reconnects >= 1
            assert db.transport.known_root_seq("main") == 1

            with open_db(server, keys["acme"], "main") as writer:
                writer.add(Employee(name="Ann", surname="late", salary=100_500, description=""))
                wait_for_seq(db, 2)
                assert eq_query(db) == eq_query(writer)
                assert range_query(db) == range_query(writer)
                assert len(eq_query(db)) == len(expected[0]) + 1
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text(errors="replace")


# -- in-process: pushes off, and the subscribe op itself ------------------------------------

KEY = PrivateKey()


@pytest.fixture
def push_off_server(tmp_path):
    registry = registry_with(tmp_path / "tenants.json", acme=[KEY])
    server = InProcessServer(MemoryStorage(), Authenticator(registry), push=False)
    yield server
    server.stop()


def test_with_pushes_off_every_query_reads_the_root(push_off_server):
    def connect() -> DB:
        transport = RemoteTransport(
            "127.0.0.1", push_off_server.port, tenant="acme", login_key=KEY.secret
        )
        return DB(transport, password=PASSWORD, kdf="fast")

    with connect() as reader, connect() as writer:
        seed(writer, n=50)
        first = eq_query(reader)
        assert reader.transport.known_root_seq("main") is None
        reads = count_root_reads(reader)
        assert eq_query(reader) == first
        assert reads == ["main"]  # not subscribed: the root is read every time
        writer.add(Employee(name="Ann", surname="off", salary=1, description=""))
        assert len(eq_query(reader)) == len(first) + 1  # seen at once, without a push


def test_a_refused_subscription_is_asked_again_later(push_off_server, monkeypatch):
    """A refusal (pushes off, or the feed of other processes down) is not for the life
    of the connection: a root read ``RETRY_REFUSED`` seconds later asks again, in the
    same round trip, and once the server subscribes, warm queries read no root."""
    monkeypatch.setattr(subscription, "RETRY_REFUSED", 0.0)
    transport = RemoteTransport(
        "127.0.0.1", push_off_server.port, tenant="acme", login_key=KEY.secret
    )
    with DB(transport, password=PASSWORD, kdf="fast") as db:
        seed(db, n=20)
        first = eq_query(db)
        assert db.transport.known_root_seq("main") is None  # refused
        push_off_server.server.push = True  # the feed is back
        assert eq_query(db) == first  # this root read subscribes
        assert db.transport.known_root_seq("main") is not None
        reads = count_root_reads(db)
        assert eq_query(db) == first
        assert reads == []


def test_subscribe_op_and_push_frames(tmp_path):
    registry = registry_with(tmp_path / "tenants.json", acme=[KEY])
    server = InProcessServer(MemoryStorage(), Authenticator(registry))
    try:
        anonymous = Wire(server.port)
        answer = anonymous.call("subscribe", {"database": "main"})
        assert not answer.ok and answer.result[0] == protocol.UNAUTHENTICATED
        anonymous.close()

        sub, committer = Wire(server.port), Wire(server.port)
        for w in (sub, committer):
            assert w.login("acme", KEY)[0].ok
        for bad in ({}, {"database": 1}, {"database": ""}, {"database": "x", "tenant": "y"}):
            answer = sub.call("subscribe", bad)
            assert not answer.ok and answer.result[0] == protocol.BAD_REQUEST
        assert sub.call("subscribe", {"database": "main"}).result == {"subscribed": True}
        assert sub.call("subscribe", {"database": "main"}).result == {"subscribed": True}
        for i in range(protocol.MAX_SUBSCRIPTIONS - 1):
            assert sub.call("subscribe", {"database": f"db{i}"}).ok
        answer = sub.call("subscribe", {"database": "one-too-many"})
        assert not answer.ok and answer.result[0] == protocol.TOO_LARGE

        commit = {"database": "main", "expected_seq": 0, "root": b"r1", "blobs": {}, "garbage": []}
        assert committer.call("commit", commit).result["ok"]
        push = protocol.parse_server_frame(protocol.recv_frame(sub.sock))
        assert push == protocol.Push("main", 1)
        assert sub.call("ping").ok  # the push did not disturb the request stream
        assert server.server.pushes_sent == 1
    finally:
        for w in (sub, committer):
            w.close()
        server.stop()


@pytest.mark.parametrize(
    "frame",
    [
        [0, "root", {"database": "main"}],
        [0, "root", {"database": "main", "seq": -1}],
        [0, "root", {"database": "main", "seq": "1"}],
        [0, "root", {"database": b"main", "seq": 1}],
        [0, "root", {"database": "", "seq": 1}],
        [0, "root", {"database": "main", "seq": 1, "data": b""}],
        [0, "root", ["main", 1]],
    ],
)
def test_malformed_pushes_are_refused(frame):
    import msgpack

    with pytest.raises(protocol.ProtocolError):
        protocol.parse_server_frame(msgpack.packb(frame, use_bin_type=True))
    with pytest.raises(protocol.ProtocolError):  # never an answer either
        protocol.parse_response(msgpack.packb(frame, use_bin_type=True))


def test_push_frames_round_trip():
    body = protocol.push_frame("main", 7)[protocol.LENGTH.size :]
    assert protocol.parse_server_frame(body) == protocol.Push("main", 7)
    answer = protocol.FramePacker().ok(0, {"x": 1})[1]
    assert protocol.parse_server_frame(answer) == protocol.Response(0, True, {"x": 1})
