"""Acknowledged means durable: what ``zerodb-server serve`` accepts as storage, and what
its clients are told.

Every Redis here is a real ``redis-server`` of the test (``PrivateRedis``), configured
as an operator would: with the append-only file and ``appendfsync always``,
``everysec`` or ``no``; without it (the default of a fresh redis-server); and with
``CONFIG`` renamed away, as managed Redis services do. The server is the real CLI in a
subprocess, and the clients are ``DB`` over the network. What ``serve`` accepts and
announces runs on a 3-master Redis Cluster too (``--redis-cluster``, every node so
configured; ``ClusterStorage.durability`` reports the weakest node, see test_cluster).

* ``RedisStorage.durability()`` reads ``appendonly`` and ``appendfsync``;
* ``serve`` refuses a Redis without the append-only file, saying why and what to do,
  unless ``--allow-volatile-redis``; it refuses a Redis that hides CONFIG unless the
  operator states what they know (``--assume-redis-aof``, checked against INFO);
* whatever it accepts, every client is told at login: it logs one warning per
  connection pool when a crash may lose acknowledged commits, and ``DB.stats()``, the
  ``stats`` operation and ``zerodb-server stats`` show it;
* a Redis that loses its append-only file while served gets no more writes until it is
  fixed;
* a login answer whose durability or garbage retention is malformed is refused.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.exceptions import PersistenceUnknownError
from blob_server.server import BlobServer
from blob_server.storage import MemoryStorage, RedisStorage
from blob_server.tenants import TenantRegistry
from tests.core.hr import Employee
from tests.server.conftest import start_store
from tests.server.crash import server_on
from tests.server.test_server_e2e import ROOT, ServerProcess, run
from tests.server.wire import InProcessServer, registry_with
from zerodb_core import DB, IntegrityError, StoreUnavailableError
from zerodb_core.keyfile import KeyFile
from zerodb_core.transport.remote import RemoteTransport

PASSWORD = "durability passphrase"
TENANT = "acme"
WARNING = "may lose acknowledged commits"


@pytest.fixture
def tenants(tmp_path) -> tuple[Path, Path]:
    """A tenants file with one tenant, and the path of its key file."""
    registry = TenantRegistry(tmp_path / "tenants.json")
    registry.add_tenant(TENANT)
    key = KeyFile.create(TENANT)
    key.save(tmp_path / "acme.zdbkey", PASSWORD, kdf="fast")
    registry.add_key(TENANT, key.public_key)
    return registry.path, tmp_path / "acme.zdbkey"


def _starter(kind: str, tmp_path: Path):
    """Start deployments of ``kind`` with the options given; all are killed afterwards."""
    started: list = []

    def start(name: str, **options):
        store = start_store(kind, tmp_path / name, **options)
        started.append(store)
        return store

    yield start
    for store in started:
        store.kill()


@pytest.fixture
def private_redis(tmp_path):
    """Start PrivateRedis servers with the options given."""
    yield from _starter("redis", tmp_path)


@pytest.fixture(params=["redis", "cluster"])
def private_store(request, tmp_path):
    """Start PrivateRedis servers, then 3-master clusters each node of which has the
    options given: what ``serve`` accepts and announces must not depend on which."""
    yield from _starter(request.param, tmp_path)


def durability_of(url: str):
    store = RedisStorage(url)
    try:
        return store.durability()
    finally:
        store.close()


def serve_refused(store, tenants: Path, *flags: str) -> str:
    """Run ``serve`` on ``store``; it must exit at once with an error: return stderr."""
    argv = [sys.executable, "-m", "blob_server.cli", "serve", *store.serve_args()]
    argv += ["--tenants", str(tenants), "--bind", "127.0.0.1:0", *flags]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, done.stderr
    assert "event=listening" not in done.stderr
    return done.stderr


def started_on(store, tenants: Path, log: Path, *flags: str) -> ServerProcess:
    server = server_on(store, tenants, log, *flags)
    server.start()
    return server


def open_db(server: ServerProcess, key_file: Path) -> DB:
    return DB(("127.0.0.1", server.port), password=PASSWORD, key_file=key_file, kdf="fast")


# -- what RedisStorage reads -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fsync", "mode"), [("always", "durable"), ("everysec", "everysec"), ("no", "os")]
)
def test_redis_with_an_append_only_file(private_redis, fsync, mode):
    store = private_redis(f"aof-{fsync}", appendfsync=fsync)
    found = durability_of(store.url)
    assert found.mode == mode
    assert f"appendonly yes, appendfsync {fsync}" in found.detail


def test_redis_without_an_append_only_file_is_volatile(private_redis):
    store = private_redis("no-aof", appendonly="no")
    found = durability_of(store.url)
    assert found.mode == "volatile"
    assert "appendonly no" in found.detail


HIDDEN = {
    "renamed": {"rename_command": ("CONFIG", "")},
    "acl": {"user": ("default", "on", "nopass", "~*", "&*", "+@all", "-config")},
}


@pytest.mark.parametrize("how", sorted(HIDDEN))
def test_redis_that_hides_config_is_unknown_not_guessed(private_redis, how):
    store = private_redis(f"hidden-{how}", **HIDDEN[how])
    with pytest.raises(PersistenceUnknownError, match="CONFIG") as caught:
        durability_of(store.url)
    assert "aof_enabled:1" in str(caught.value)  # what INFO says is quoted, not trusted


# -- what serve accepts -----------------------------------------------------------------------


def test_serve_refuses_a_redis_without_aof_and_says_what_to_do(private_store, tenants):
    store = private_store("default", appendonly="no")  # a fresh redis-server's default
    error = serve_refused(store, tenants[0])
    assert "appendonly no" in error
    assert "would lose acknowledged commits" in error
    assert "appendonly yes" in error and "--allow-volatile-redis" in error
    assert "Traceback" not in error


def test_with_the_flag_every_client_is_told_once(private_store, tenants, tmp_path, caplog):
    store = private_store("volatile", appendonly="no")
    server = started_on(store, tenants[0], tmp_path / "s.log", "--allow-volatile-redis")
    try:
        log = server.log.read_text()
        assert "event=durability mode=volatile" in log and "WARNING" in log
        with caplog.at_level(logging.WARNING, "zerodb_core.transport.remote"):
            with open_db(server, tenants[1]) as db:
                assert db.transport.durability()["mode"] == "volatile"
                assert db.stats()["durability"] == "volatile"
                stats = db.transport.server_stats("main")
                assert stats["durability"]["mode"] == "volatile"
                assert "appendonly no" in stats["durability"]["detail"]
                db.transport.close()  # the next call logs in again: no second warning
                db.read_root()
                assert db.transport.connections_opened == 2
            told = [r for r in caplog.records if WARNING in r.getMessage()]
            assert len(told) == 1
            assert "volatile" in told[0].getMessage() and "FreshnessError" in told[0].getMessage()
            with open_db(server, tenants[1]):  # another client is told too
                pass
            assert len([r for r in caplog.records if WARNING in r.getMessage()]) == 2
    finally:
        server.stop()


def test_a_redis_that_writes_every_commit_needs_no_flag_and_warns_nobody(
    private_store, tenants, tmp_path, caplog
):
    store = private_store("always")
    server = started_on(store, tenants[0], tmp_path / "s.log")
    try:
        assert "event=durability mode=durable" in server.log.read_text()
        with caplog.at_level(logging.WARNING), open_db(server, tenants[1]) as db:
            db.read_root()
            assert db.stats()["durability"] == "durable"
        assert not [r for r in caplog.records if WARNING in r.getMessage()]
    finally:
        server.stop()


def test_a_redis_that_hides_config_needs_the_operator_to_say(private_redis, tenants, tmp_path):
    store = private_redis("managed", rename_command=("CONFIG", ""))
    error = serve_refused(store, tenants[0])
    assert "does not let the server read its persistence settings" in error
    assert "will not guess" in error
    assert "--assume-redis-aof always" in error and "--allow-volatile-redis" in error

    server = started_on(store, tenants[0], tmp_path / "s.log", "--assume-redis-aof", "everysec")
    try:
        with open_db(server, tenants[1]) as db:
            told = db.transport.durability()
            assert told["mode"] == "unverified"
            assert "vouches for appendonly yes, appendfsync everysec" in told["detail"]
    finally:
        server.stop()


def test_the_operator_cannot_vouch_for_an_aof_that_info_says_is_off(private_redis, tenants):
    store = private_redis("managed-no-aof", appendonly="no", rename_command=("CONFIG", ""))
    error = serve_refused(store, tenants[0], "--assume-redis-aof", "always")
    assert "INFO reports aof_enabled:0" in error


def test_stats_command_shows_the_durability(private_store, tenants):
    store = private_store("stats", appendfsync="everysec")
    out = run(
        "-m", "blob_server.cli", "stats", *store.serve_args(), "--tenants", str(tenants[0]),
        "--json",
    )  # fmt: skip
    assert json.loads(out)["durability"]["mode"] == "everysec"


# -- what a client accepts ----------------------------------------------------------------


@pytest.mark.parametrize(
    "lie",
    [
        {"durability": "durable"},
        {"durability": {"mode": "durable"}},
        {"durability": {"mode": "", "detail": ""}},
        {"durability": {"mode": 1, "detail": "x"}},
        {"durability": {"mode": "durable", "detail": "x" * 2000}},
        {"garbage_retention": -1},
        {"garbage_retention": float("nan")},
        {"garbage_retention": True},
        {"garbage_retention": "600"},
    ],
)
def test_a_malformed_announcement_is_refused(tmp_path, monkeypatch, lie):
    """The server is not trusted: what its login answer says is checked (fail closed)."""
    login = BlobServer._op_login

    async def lying_login(self, session, args):
        return {**await login(self, session, args), **lie}

    monkeypatch.setattr(BlobServer, "_op_login", lying_login)
    key = PrivateKey()
    server = InProcessServer(
        MemoryStorage(), Authenticator(registry_with(tmp_path / "t.json", acme=[key]))
    )
    try:
        with pytest.raises(IntegrityError, match="malformed"):
            RemoteTransport("127.0.0.1", server.port, tenant="acme", login_key=key.secret)
    finally:
        server.stop()


def test_a_redis_that_loses_its_aof_while_served_gets_no_more_writes(
    private_store, tenants, tmp_path
):
    """``CONFIG SET appendonly no`` behind a running server (or a Redis restarted with
    another configuration; on a cluster, on one of its nodes): the garbage task reads the
    durability again and, while ``serve`` would refuse the storage, writes are answered
    "retry later"."""
    store = private_store("drift")
    server = started_on(store, tenants[0], tmp_path / "s.log", "--gc-interval", "0.05")
    admin = store.node_clients()[-1]
    try:
        with open_db(server, tenants[1]) as db:
            db.add(Employee(name="ann", surname="before", salary=1))
            admin.config_set("appendonly", "no")
            deadline = time.monotonic() + 30
            while True:  # commits may pass until the next check notices
                assert time.monotonic() < deadline, "the server never noticed"
                try:
                    db.add(Employee(name="ann", surname="maybe", salary=2))
                except StoreUnavailableError as exc:
                    refused = exc
                    break
                time.sleep(0.02)
            assert "writes are refused until it is fixed" in str(refused)
            assert "retry later" in str(refused)
            assert "event=durability_lost" in server.log.read_text()
            assert len(db[Employee].query(name="ann")) >= 1  # reads go on

            admin.config_set("appendonly", "yes")
            deadline = time.monotonic() + 30
            while True:
                assert time.monotonic() < deadline, "writes never came back"
                try:
                    db.add(Employee(name="ann", surname="after", salary=3))
                    break
                except StoreUnavailableError:
                    time.sleep(0.02)
        assert "event=durability mode=durable" in server.log.read_text()
    finally:
        admin.close()
        server.stop()
