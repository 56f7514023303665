"""Pooled connections: threads sharing one ``RemoteTransport`` run their requests at once.

The blob server runs as a subprocess (``zerodb-server serve``), on ``memory://`` except
where a restart must keep the data (SQLite). Only deterministic things are asserted: every
answer, the exact round-trip and byte counters, and how many connections were opened
while the primary connection was held busy on purpose (holding ``transport._lock`` is
what a thread in the middle of an exchange on it does), never timings.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.core.hr import Employee
from tests.server.test_push import (
    PASSWORD,
    eq_query,
    open_db,
    range_query,
    register,
    seed,
    wait_for_seq,
)
from tests.server.test_server_e2e import ServerProcess
from zerodb_core import DB, QueryError
from zerodb_core.keyfile import KeyFile
from zerodb_core.transport.base import FRAME_OVERHEAD
from zerodb_core.transport.remote import RemoteTransport

THREADS = 8
ROUNDS = 6


@pytest.fixture(scope="module")
def memory_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool")
    tenants, keys = register(tmp)
    server = ServerProcess("memory://", tenants, tmp / "server.log")
    server.start()
    yield server, keys
    server.stop()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log


def connect(server: ServerProcess, key_path: Path, pool_size: int = 4) -> RemoteTransport:
    key = KeyFile.load(key_path, PASSWORD)
    return RemoteTransport(
        "127.0.0.1",
        server.port,
        tenant=key.tenant,
        login_key=key.login_key,
        timeout=10,
        pool_size=pool_size,
    )


class Ledger:
    """The exchanges made through a transport and what the counters must say about them
    (the formulas of ``Transport``: payload sizes plus FRAME_OVERHEAD each way)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.round_trips = self.sent = self.received = 0

    def add(self, sent: int, received: int) -> None:
        with self.lock:
            self.round_trips += 1
            self.sent += FRAME_OVERHEAD + sent
            self.received += FRAME_OVERHEAD + received

    def matches(self, transport: RemoteTransport) -> None:
        assert transport.counters.snapshot() == {
            "round_trips": self.round_trips,
            "bytes_sent": self.sent,
            "bytes_received": self.received,
        }


class Worker:
    """One thread's database ``pool-<tag>-<n>``: it commits new blobs on top of its own
    root, then reads them back, reads the root and reads blobs shared by all."""

    def __init__(self, transport: RemoteTransport, ledger: Ledger, tag: str, n: int) -> None:
        self.transport, self.ledger = transport, ledger
        self.database = f"pool-{tag}-{n}"
        self.n = n
        self.seq = 0
        self.blobs: dict[bytes, bytes] = {}

    def get_root(self) -> None:
        root = self.transport.get_root(self.database)
        expected = f"root {self.database} {self.seq}".encode() if self.seq else b""
        assert (root.seq, root.data) == (self.seq, expected)
        self.ledger.add(0, 8 + len(root.data))

    def commit(self) -> None:
        new = {os.urandom(16): os.urandom(100 + 37 * self.n) for _ in range(3)}
        root = f"root {self.database} {self.seq + 1}".encode()
        result = self.transport.commit(
            self.database, expected_seq=self.seq, root=root, blobs=new, garbage=[]
        )
        assert result.ok and (result.root.seq, result.root.data) == (self.seq + 1, root)
        self.seq += 1
        self.blobs.update(new)
        self.ledger.add(8 + len(root) + sum(len(k) + len(v) for k, v in new.items()), 8 + len(root))

    def get_blobs(self, shared: tuple[str, dict[bytes, bytes]]) -> None:
        missing = os.urandom(16)
        ids = [*self.blobs, missing]
        assert self.transport.get_blobs(self.database, ids) == self.blobs
        self.ledger.add(16 * len(ids), sum(len(k) + len(v) for k, v in self.blobs.items()))
        database, blobs = shared
        assert self.transport.get_blobs(database, list(blobs)) == blobs
        self.ledger.add(16 * len(blobs), sum(len(k) + len(v) for k, v in blobs.items()))

    def round(self, shared: tuple[str, dict[bytes, bytes]]) -> None:
        self.commit()
        self.get_blobs(shared)
        self.get_root()


def run_threads(items: list, body: Callable) -> None:
    """Run ``body(item)`` for every item on its own thread, all released at once;
    re-raise the first failure."""
    start = threading.Barrier(len(items))
    errors: list[BaseException] = []

    def main(item) -> None:
        try:
            start.wait()
            body(item)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=main, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if errors:
        raise errors[0]


def shared_blobs(transport: RemoteTransport, ledger: Ledger, database: str):
    blobs = {os.urandom(16): os.urandom(2000) for _ in range(20)}
    assert transport.commit(database, expected_seq=0, root=b"shared", blobs=blobs).ok
    ledger.add(8 + len(b"shared") + sum(len(k) + len(v) for k, v in blobs.items()), 8 + 6)
    return database, blobs


def subscribe_all(workers: list[Worker]) -> None:
    """Each worker's first root read, from this thread: it subscribes on the primary."""
    for worker in workers:
        worker.get_root()


def test_threads_share_one_pooled_transport(memory_server):
    server, keys = memory_server
    transport = connect(server, keys["acme"], pool_size=4)
    ledger = Ledger()
    try:
        assert transport.connections_opened == 1  # pooled connections open lazily
        shared = shared_blobs(transport, ledger, "pool-shared")
        workers = [Worker(transport, ledger, "a", n) for n in range(THREADS)]
        subscribe_all(workers)
        assert all(transport.known_root_seq(w.database) == 0 for w in workers)
        assert transport.connections_opened == 1  # one thread: always the primary

        # The primary is busy (held here): every request goes to a pooled connection.
        with transport._lock:
            run_threads(workers, lambda w: [w.round(shared) for _ in range(ROUNDS)])
        opened = transport.connections_opened
        assert 2 <= opened <= transport.pool_size  # at least one pooled, never more
        ledger.matches(transport)

        # Free for all: the primary takes whoever finds it free, the pool the rest.
        run_threads(workers, lambda w: [w.round(shared) for _ in range(ROUNDS)])
        assert transport.connections_opened <= transport.pool_size
        assert transport.reconnects == 0
        ledger.matches(transport)

        # Commits through pooled connections were pushed to the primary's subscription.
        for worker in workers:
            assert worker.seq == 2 * ROUNDS
            wait_for_seq_of(transport, worker.database, worker.seq)
            worker.get_root()
        ledger.matches(transport)
    finally:
        transport.close()


def wait_for_seq_of(transport: RemoteTransport, database: str, seq: int) -> None:
    wait_for_seq(SimpleNamespace(transport=transport, database=database), seq)
    assert transport.known_root_seq(database) == seq  # pushes never run ahead


def test_a_pool_of_one_is_one_connection(memory_server):
    server, keys = memory_server
    transport = connect(server, keys["acme"], pool_size=1)
    ledger = Ledger()
    try:
        shared = shared_blobs(transport, ledger, "pool-one-shared")
        workers = [Worker(transport, ledger, "one", n) for n in range(4)]
        run_threads(workers, lambda w: [w.round(shared) for _ in range(3)])
        assert transport.connections_opened == 1
        ledger.matches(transport)
    finally:
        transport.close()


def test_threads_query_one_db_at_once(memory_server):
    server, keys = memory_server
    with (
        open_db(server, keys["acme"], "pool-db") as db,
        open_db(server, keys["acme"], "pool-db") as writer,
    ):
        assert db.transport.pool_size == 4  # DB's default
        seed(writer, n=200)
        expected = (eq_query(writer), range_query(writer))
        assert (eq_query(db), range_query(db)) == expected  # subscribes on the primary
        results: list[tuple[list[int], list[int]]] = []
        lock = threading.Lock()

        def query(_: int) -> None:
            for _ in range(5):
                got = (eq_query(db), range_query(db))
                with lock:
                    results.append(got)

        with db.transport._lock:  # the primary busy: the first reads go through the pool
            run_threads(list(range(THREADS)), query)
        assert results == [expected] * (THREADS * 5)
        assert db.transport.connections_opened >= 2
        writer.add(Employee(name="Ann", surname="late", salary=100_001, description=""))
        wait_for_seq(db, writer.stats()["seq"])
        assert (eq_query(db), range_query(db)) == (eq_query(writer), range_query(writer))


def test_pooled_connections_survive_a_server_restart(tmp_path):
    tenants, keys = register(tmp_path)
    server = ServerProcess(f"sqlite:///{tmp_path}/blobs.zdb", tenants, tmp_path / "server.log")
    server.start()
    try:
        transport = connect(server, keys["acme"], pool_size=4)
        ledger = Ledger()
        try:
            shared = shared_blobs(transport, ledger, "restart-shared")
            workers = [Worker(transport, ledger, "r", n) for n in range(THREADS)]
            subscribe_all(workers)
            with transport._lock:
                run_threads(workers, lambda w: [w.round(shared) for _ in range(3)])
            before = transport.connections_opened
            assert before >= 2

            server.stop()
            server.start()  # same port, same SQLite file: every connection is gone

            # Pooled connections notice the closed stream before sending and log in again.
            with transport._lock:
                run_threads(workers, lambda w: [w.round(shared) for _ in range(3)])
            assert transport.connections_opened > before
            after_pooled = transport.connections_opened
            assert transport.reconnects == 0  # the primary was not used yet
            assert transport.known_root_seq(workers[0].database) is None  # and lost its subs

            run_threads(workers, lambda w: [w.round(shared) for _ in range(3)])
            assert transport.reconnects == 1
            assert transport.connections_opened >= after_pooled + 1
            ledger.matches(transport)
            for worker in workers:
                assert worker.seq == 9
                worker.get_root()
            ledger.matches(transport)
        finally:
            transport.close()
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text(errors="replace")


def test_pool_size_reaches_the_transport_and_is_checked(memory_server):
    server, keys = memory_server
    with DB(
        ("127.0.0.1", server.port),
        password=PASSWORD,
        key_file=keys["acme"],
        kdf="fast",
        pool_size=2,
    ) as db:
        assert db.transport.pool_size == 2
    with pytest.raises(QueryError, match="pool_size: for a blob server"):
        DB("memory://", password=PASSWORD, kdf="fast", pool_size=2)
    for bad in (0, -1, 1.5, "4", True):
        with pytest.raises(QueryError, match="pool_size"):
            connect(server, keys["acme"], pool_size=bad)
