"""Errors that say what happened: the real blob server driven into each state.

``IntegrityError`` is the tamper alarm: an operator pages on it. So a server that is
full, busy, rate limiting, unreachable or without its storage, and a transaction older
than the garbage retention, must each raise an ``OperationalError`` subclass whose
message says "retry later" or names the limit, never an ``IntegrityError``. And the
alarm must still ring where it should: a blob missing from a snapshot the store must
still hold.

Each test runs ``zerodb-server serve`` as a subprocess (SQLite storage, or for the
storage outage a real Redis or a 3-master Redis Cluster, every node killed) with the
flags that make the state happen: a tenant with a quota, ``--max-connections 1``,
failed logins, ``--garbage-retention 0``.
"""

from __future__ import annotations

import random
import re
import sqlite3
import time
from pathlib import Path

import pytest

from blob_server.tenants import TenantRegistry
from tests.core.hr import Employee
from tests.server.conftest import free_port
from tests.server.crash import server_on
from tests.server.test_server_e2e import ServerProcess
from zerodb_core import (
    DB,
    AuthenticationError,
    IntegrityError,
    MissingBlobError,
    OperationalError,
    QuotaExceededError,
    RateLimitedError,
    ServerBusyError,
    SnapshotTooOldError,
    StoreUnavailableError,
)
from zerodb_core.keyfile import KeyFile
from zerodb_core.query import InRange

PASSWORD = "operational errors passphrase"
MAX_BLOBS = 30


class Deployment:
    """A tenants file with ``acme`` (unlimited) and ``small`` (at most MAX_BLOBS blobs),
    a key file each, and a stranger's key file (a key nobody registered)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        registry = TenantRegistry(tmp / "tenants.json")
        self.tenants = registry.path
        self.keys: dict[str, Path] = {}
        for tenant, quota in (("acme", {}), ("small", {"max_blobs": MAX_BLOBS})):
            registry.add_tenant(tenant, **quota)
            self.keys[tenant] = self._key(tenant)
            registry.add_key(tenant, KeyFile.load(self.keys[tenant], PASSWORD).public_key)
        self.keys["stranger"] = self._key("acme", "stranger")

    def _key(self, tenant: str, name: str | None = None) -> Path:
        path = self.tmp / f"{name or tenant}.zdbkey"
        KeyFile.create(tenant).save(path, PASSWORD, kdf="fast")
        return path

    def server(self, storage: str | None = None, *flags: str) -> ServerProcess:
        server = ServerProcess(
            storage or f"sqlite:///{self.tmp}/blobs.zdb", self.tenants, self.tmp / "server.log"
        )
        server.args += flags
        server.start()
        return server

    def open(self, server: ServerProcess, tenant: str = "acme", **kwargs) -> DB:
        kwargs.setdefault("freshness_path", self.tmp / f"{tenant}.fresh")
        return DB(
            ("127.0.0.1", server.port),
            password=PASSWORD,
            key_file=self.keys[tenant],
            kdf="fast",
            **kwargs,
        )


@pytest.fixture
def dep(tmp_path) -> Deployment:
    return Deployment(tmp_path)


def operational(error: BaseException, *words: str) -> None:
    """An outage or a limit: never the tamper alarm, and the message says what to do."""
    assert isinstance(error, OperationalError), repr(error)
    assert not isinstance(error, IntegrityError), repr(error)
    for word in words:
        assert word in str(error), str(error)


def employees(n: int, rng: random.Random, start: int = 0) -> list[Employee]:
    """Records whose index values interleave with earlier batches' (random names and
    salaries), so that merging runs rewrites index leaves: the old ones become garbage."""
    return [
        Employee(
            name=rng.choice(["ann", "bob", "cleo"]),
            surname=f"s{start + i}",
            salary=rng.randrange(10**6),
            description=rng.choice(["kernel panic", "payroll audit", "printer fire"]),
        )
        for i in range(n)
    ]


# -- limits and outages ----------------------------------------------------------------------


def test_quota_is_an_operational_error_that_says_quota(dep, servers):
    server = dep.server()
    servers.append(server)
    with dep.open(server, "small") as db, pytest.raises(QuotaExceededError) as caught:
        for i in range(MAX_BLOBS):
            db.add(Employee(name="ann", surname=f"q{i}", salary=i, description="quota"))
    operational(caught.value, "quota", f"{MAX_BLOBS} blobs")


def test_a_busy_server_is_busy_not_tampering(dep, servers):
    server = dep.server(None, "--max-connections", "1")
    servers.append(server)
    with dep.open(server, pool_size=1) as first:
        first.read_root()  # holds the only connection the server takes
        with pytest.raises(ServerBusyError) as caught:
            dep.open(server)
        operational(caught.value, "busy", "retry later")
        assert isinstance(caught.value, StoreUnavailableError)
    with dep.open(server) as later:  # once the connection is free, served again
        later.read_root()
    assert "why=busy" in server.log.read_text()


def test_rate_limited_logins_say_retry_later(dep, servers):
    server = dep.server()
    servers.append(server)
    for _ in range(10):  # failed logins from this address: a key nobody registered
        with pytest.raises(AuthenticationError):
            dep.open(server, "stranger")
    with pytest.raises(RateLimitedError) as caught:  # now even the right key, for a minute
        dep.open(server)
    operational(caught.value, "too many failed logins", "retry later")


def test_a_server_nobody_runs_is_unavailable(dep):
    with pytest.raises(StoreUnavailableError) as caught:
        DB(
            ("127.0.0.1", free_port()),
            password=PASSWORD,
            key_file=dep.keys["acme"],
            kdf="fast",
            timeout=2,
        )
    operational(caught.value, "cannot reach the blob server", "retry later")


#: The log line of a request that the storage failed.
STORAGE_OUTAGE = re.compile(r"event=storage_unavailable .*")


@pytest.mark.parametrize(
    "aof_store",
    # On a cluster the server re-sends its steps for 20 s before it answers (a
    # failover takes the node timeout): more than 20 s for this test.
    ["redis", pytest.param("cluster", marks=pytest.mark.slow)],
    indirect=True,
)
def test_a_server_whose_redis_is_down_says_retry_later(dep, servers, aof_store):
    store = aof_store  # appendfsync always: served without a flag
    try:
        server = server_on(store, dep.tenants, dep.tmp / "server.log")
        server.start()
        servers.append(server)
        with dep.open(server) as db:
            db.add(*employees(3, random.Random(1)))
            store.kill()
            with pytest.raises(StoreUnavailableError) as caught:
                db.add(*employees(3, random.Random(2), start=3))
            operational(caught.value, "retry later")
            # The operator's log says why (the client is only told to retry). The
            # client may have been told by the loss of its push feed before its
            # request reached the storage: one more request surely does.
            with pytest.raises(StoreUnavailableError):
                db.add(*employees(3, random.Random(2), start=3))
            deadline = time.monotonic() + 10
            while not (outage := STORAGE_OUTAGE.search(server.log.read_text())):
                assert time.monotonic() < deadline, "no storage_unavailable line"
                time.sleep(0.05)
            assert re.search(r'detail="(Redis|Redis Cluster) at ', outage.group())
            store.start()
            deadline = time.monotonic() + 30  # the server's pool finds Redis again
            while True:
                try:
                    db.add(*employees(3, random.Random(3), start=6))
                    break
                except StoreUnavailableError:
                    assert time.monotonic() < deadline, "the server did not reconnect"
                    time.sleep(0.05)
            assert len(db[Employee].all()) in (6, 9)  # the failed one: all or nothing
    finally:
        store.kill()


# -- old snapshots ---------------------------------------------------------------------------


def snapshot_blobs(txn) -> list[bytes]:
    """The run roots and filters of every tree of a transaction's snapshot."""
    return [
        blob
        for runs in txn.runs.values()
        for run in runs
        for blob in (run.root, run.filter)
        if blob is not None
    ]


def old_snapshot_setup(dep: Deployment, server: ServerProcess):
    """A writer that committed three batches, and a reader in a transaction pinned on
    the first two (nothing of it read yet): after the writer compacts, the reader's
    snapshot reaches blobs that are garbage."""
    rng = random.Random(7)
    writer, reader = dep.open(server), dep.open(server, freshness_path=dep.tmp / "r.fresh")
    writer.add(*employees(20, rng))
    writer.add(*employees(20, rng, start=20))
    return writer, reader, rng


def test_a_snapshot_older_than_the_retention_is_too_old_not_tampered(dep, servers):
    server = dep.server(None, "--garbage-retention", "0", "--gc-interval", "0.05")
    servers.append(server)
    writer, reader, rng = old_snapshot_setup(dep, server)
    try:
        assert reader.transport.garbage_retention == 0  # announced at login
        with pytest.raises(SnapshotTooOldError) as caught, reader.transaction() as txn:
            pinned = snapshot_blobs(txn)
            writer.add(*employees(20, rng, start=40))
            assert writer.compact() > 0  # the old runs' nodes are now garbage...
            deadline = time.monotonic() + 30
            while len(writer.transport.get_blobs(writer.database, pinned)) == len(pinned):
                assert time.monotonic() < deadline, "the garbage was never collected"
                time.sleep(0.05)  # ...collected by the server's garbage task
            list(reader[Employee].query(InRange("salary", 0, 10**6)))
        operational(caught.value, "garbage retention", "--garbage-retention", "retry")
        # A new transaction reads the current root: everything is there.
        with reader.transaction():
            assert len(list(reader[Employee].query(InRange("salary", 0, 10**6)))) == 60
    finally:
        writer.close()
        reader.close()


def test_a_blob_missing_from_a_young_snapshot_is_still_the_tamper_alarm(dep, servers):
    """Same story with the default retention (600 s): the compacted runs' blobs are
    garbage, not yet collectable. One deleted behind the server's back is missing from a
    snapshot the store must still hold: ``MissingBlobError``, an ``IntegrityError``."""
    server = dep.server()
    servers.append(server)
    writer, reader, rng = old_snapshot_setup(dep, server)
    try:
        with pytest.raises(IntegrityError) as caught, reader.transaction() as txn:
            pinned = snapshot_blobs(txn)
            writer.add(*employees(20, rng, start=40))
            assert writer.compact() > 0
            with sqlite3.connect(dep.tmp / "blobs.zdb") as store:  # the store misbehaves
                for blob in pinned:
                    store.execute("DELETE FROM blobs WHERE id = ?", (blob,))
            list(reader[Employee].query(InRange("salary", 0, 10**6)))
        assert type(caught.value) is MissingBlobError
    finally:
        writer.close()
        reader.close()
