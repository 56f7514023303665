"""Quotas and commit limits through the server: the error answers, the typed client
exceptions, quotas changed without a restart, and the admin commands.

The accounting itself (atomic, per tenant, given back by garbage collection) is part of
the storage contract (``test_storage.py``, all three backends); here the server runs in
process on memory or on the session's real redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.cli import STATS_LIMITS, build_parser, parse_size
from blob_server.cli import main as cli_main
from blob_server.exceptions import NotStagedError
from blob_server.limits import FAIRNESS_KEYS
from blob_server.server import DEFAULT_MAX_COMMIT_BLOBS, DEFAULT_MAX_COMMIT_BYTES, BlobServer
from blob_server.storage import MemoryStorage, Quota, SQLiteStorage
from blob_server.tenants import DEFAULT, TenantRegistry
from blob_server.wire import protocol
from tests.core.hr import Employee
from tests.server.wire import InProcessServer, Wire, registry_with
from zerodb_core import (
    DB,
    CommitTooLargeError,
    IntegrityError,
    QuotaExceededError,
    StoreUnavailableError,
    ZeroDBError,
)
from zerodb_core.keyfile import KeyFile
from zerodb_core.transport.answers import FALLBACK_LIMITS
from zerodb_core.transport.remote import RemoteTransport

KEY_A = PrivateKey()
KEY_B = PrivateKey()
PASSWORD = "quota test passphrase"


@pytest.fixture
def registry(tmp_path) -> TenantRegistry:
    return registry_with(tmp_path / "tenants.json", acme=[KEY_A], beta=[KEY_B])


@pytest.fixture(params=["memory", "redis", "cluster"])
def backend(request):
    if request.param == "memory":
        return MemoryStorage()
    return request.getfixturevalue(f"{request.param}_storage_factory")()


@pytest.fixture
def serve(registry, backend):
    """Start in-process servers on ``backend`` with the given options; stop them after."""
    running: list[InProcessServer] = []

    def start(**kwargs) -> InProcessServer:
        server = InProcessServer(backend, Authenticator(registry), **kwargs)
        running.append(server)
        return server

    yield start
    for server in running:
        server.stop()


def logged_in(server: InProcessServer, tenant: str = "acme", key: PrivateKey = KEY_A) -> Wire:
    wire = Wire(server.port)
    assert wire.login(tenant, key)[0].ok
    return wire


def commit_args(seq: int, blobs: dict, root: bytes = b"", database: str = "main") -> dict:
    return {
        "database": database,
        "expected_seq": seq,
        "root": root,
        "blobs": blobs,
        "garbage": [],
    }


def transport(server: InProcessServer, tenant: str = "acme", key: PrivateKey = KEY_A):
    return RemoteTransport("127.0.0.1", server.port, tenant=tenant, login_key=key.secret)


# -- quotas --------------------------------------------------------------------------------


def test_a_commit_past_the_quota_gets_a_quota_answer(serve, registry):
    registry.set_limits("acme", max_blobs=2)
    wire = logged_in(serve())
    two = {os.urandom(16): b"x" * 10, os.urandom(16): b"y" * 10}
    assert wire.call("commit", commit_args(0, two, b"root")).result["ok"]
    answer = wire.call("commit", commit_args(1, {os.urandom(16): b"z"}, b"root"))
    assert not answer.ok
    code, message = answer.result
    assert code == protocol.QUOTA
    assert message == "tenant 'acme' would exceed its quota of 2 blobs: 2 used, the write adds 1"
    assert wire.call("get_root", {"database": "main"}).result["seq"] == 1  # nothing written
    # The tenant's own stats say the same: usage and quota.
    stats = wire.call("stats", {"database": "main"}).result
    assert stats["tenant"] == {
        "blobs": 2,
        "bytes": 24,
        "databases": 1,
        "max_blobs": 2,
        "max_bytes": None,
    }
    assert (stats["seq"], stats["blobs"], stats["bytes"]) == (1, 2, 20)
    wire.close()


def test_db_raises_quota_exceeded_and_set_quota_needs_no_restart(serve, registry, tmp_path):
    server = serve()
    key = KeyFile(KEY_A.secret, "acme")
    with DB(("127.0.0.1", server.port), password=PASSWORD, key_file=key, kdf="fast") as db:
        db.add(Employee(name="Ann", surname="A", salary=1, description="first"))
        used = db.transport.server_stats("main")["tenant"]
        assert used["blobs"] > 0 and used["bytes"] > used["blobs"] * 256  # padded blobs
        registry.set_limits("acme", max_bytes=used["bytes"] + 100)  # the server re-reads it
        seq = db.transport.get_root("main").seq
        with pytest.raises(QuotaExceededError) as caught:
            db.add(Employee(name="Bob", surname="B", salary=2, description="second"))
        assert isinstance(caught.value, ZeroDBError)
        message = str(caught.value)
        assert f"quota of {used['bytes'] + 100} bytes: {used['bytes']} used" in message
        assert db.transport.get_root("main").seq == seq  # nothing was committed
        assert db.transport.server_stats("main")["tenant"]["bytes"] == used["bytes"]
        assert [e.name for e in db[Employee].all()] == ["Ann"]

        registry.set_limits("acme", max_bytes=None)  # no limit at all
        db.add(Employee(name="Bob", surname="B", salary=2, description="second"))
        assert sorted(e.name for e in db[Employee].all()) == ["Ann", "Bob"]


def test_the_server_default_quota_applies_to_tenants_without_their_own(serve, registry):
    registry.set_limits("beta", max_blobs=None)  # beta: explicitly no limit
    server = serve(default_quota=Quota(max_blobs=1))
    acme, beta = logged_in(server), logged_in(server, "beta", KEY_B)
    blob = {os.urandom(16): b"x"}
    assert acme.call("commit", commit_args(0, blob)).result["ok"]
    refused = acme.call("commit", commit_args(1, {os.urandom(16): b"y"}))
    assert refused.result[0] == protocol.QUOTA
    assert beta.call("commit", commit_args(0, {os.urandom(16): b"1", os.urandom(16): b"2"})).ok
    registry.set_limits("acme", max_blobs=5)  # its own limit now overrides the default
    assert acme.call("commit", commit_args(1, {os.urandom(16): b"y"})).result["ok"]
    registry.set_limits("acme", max_blobs=DEFAULT)  # back to the default
    assert acme.call("commit", commit_args(2, {os.urandom(16): b"z"})).result[0] == "quota"
    acme.close()
    beta.close()


def test_a_keyring_write_past_the_quota_raises_quota_exceeded(serve, registry):
    registry.set_limits("acme", max_bytes=100)
    client = transport(serve())
    try:
        assert client.put_keyring("main", "slot", b"k" * 100, expected=None)
        with pytest.raises(QuotaExceededError, match="100 used, the write adds 1"):
            client.put_keyring("main", "other", b"k", expected=None)
        assert client.get_keyring("main", "other") is None
    finally:
        client.close()


# -- request limits and streamed commits ---------------------------------------------------


def test_request_limits_are_enforced_with_clear_answers(serve):
    server = serve(max_commit_blobs=3, max_commit_bytes=1000)
    wire = logged_in(server)
    four = {os.urandom(16): b"x" for _ in range(4)}
    answer = wire.call("commit", commit_args(0, four))
    assert answer.result == (
        protocol.TOO_LARGE,
        "commit of 4 blobs exceeds the limit of 3 blobs per request",
    )
    answer = wire.call("stage", {"database": "main", "blobs": four})
    assert answer.result == (
        protocol.TOO_LARGE,
        "stage of 4 blobs exceeds the limit of 3 blobs per request",
    )
    over = {os.urandom(16): b"x" * 300 for _ in range(3)}  # 900 + a root of 101
    answer = wire.call("commit", commit_args(0, over, b"r" * 101))
    assert answer.result == (
        protocol.TOO_LARGE,
        "commit of 1001 bytes (blobs and root) exceeds the limit of 1000 bytes per request",
    )
    two = {os.urandom(16): b"x" * 600, os.urandom(16): b"y" * 401}
    answer = wire.call("stage", {"database": "main", "blobs": two})
    assert answer.result == (
        protocol.TOO_LARGE,
        "stage of 1001 bytes (blobs) exceeds the limit of 1000 bytes per request",
    )
    assert wire.call("get_root", {"database": "main"}).result["seq"] == 0
    assert wire.call("stats", {"database": "main"}).result["blobs"] == 0
    assert wire.call("commit", commit_args(0, over, b"r" * 100)).result["ok"]  # exactly
    # A single item cannot be split, so only the per-blob limit bounds it: one blob
    # staged alone, a root committed without blobs.
    big = {os.urandom(16): b"b" * 5000}
    assert wire.call("stage", {"database": "main", "blobs": big}).result == {"staged": 1}
    answer = wire.call("commit", commit_args(1, {}, b"r" * 5000) | {"staged": list(big)})
    assert answer.result["ok"] and answer.result["seq"] == 2
    wire.close()


def test_the_login_answer_announces_the_limits(serve):
    client = transport(serve(max_commit_blobs=7, max_commit_bytes=12345))
    try:
        assert (client.limits.blobs, client.limits.bytes) == (7, 12345)
        assert client.limits.blob == protocol.MAX_BLOB_BYTES
        assert client.limits.frame == protocol.MAX_FRAME_BYTES
    finally:
        client.close()


def test_a_server_from_before_streamed_commits_gets_commits_in_one_request(serve, monkeypatch):
    """A server that announces no limits has no ``stage`` op either: a commit goes to it
    whole, as before, up to what such a server accepted by default."""
    login = BlobServer._op_login

    async def old_login(self, session, args):
        answer = await login(self, session, args)
        del answer["limits"]
        return answer

    monkeypatch.setattr(BlobServer, "_op_login", old_login)  # before the server binds it
    server = serve()
    del server.server._ops["stage"]
    client = transport(server)
    try:
        assert client.limits == FALLBACK_LIMITS
        assert (FALLBACK_LIMITS.blobs, FALLBACK_LIMITS.bytes) == (
            DEFAULT_MAX_COMMIT_BLOBS,
            DEFAULT_MAX_COMMIT_BYTES,
        )
        blobs = {os.urandom(16): b"x" * 100 for _ in range(300)}
        before = client.counters.round_trips
        assert client.commit("main", expected_seq=0, root=b"r", blobs=blobs).ok
        assert client.counters.round_trips - before == 1  # the commit alone
        assert client.get_blobs("main", list(blobs)) == blobs
    finally:
        client.close()


@pytest.mark.parametrize(
    "limits",
    [{"max_commit_blobs": 0, "max_commit_bytes": 5}, {"max_commit_blobs": "7"}, [1, 2], 7],
)
def test_malformed_announced_limits_are_refused(serve, monkeypatch, limits):
    login = BlobServer._op_login

    async def lying_login(self, session, args):
        return {**await login(self, session, args), "limits": limits}

    monkeypatch.setattr(BlobServer, "_op_login", lying_login)
    server = serve()
    with pytest.raises(IntegrityError, match="malformed request limits"):
        transport(server)


def counted(client: RemoteTransport) -> tuple[int, int]:
    return client.counters.round_trips, client.counters.bytes_sent


def test_a_transaction_larger_than_a_request_is_streamed(serve):
    server = serve(max_commit_blobs=8, max_commit_bytes=1000)
    client = transport(server)
    try:
        blobs = {os.urandom(16): os.urandom(100) for _ in range(50)}
        trips, sent = counted(client)
        requests = server.server.total_requests
        result = client.commit("main", expected_seq=0, root=b"r" * 50, blobs=blobs)
        assert result.ok and result.root.seq == 1
        # Six stage requests of 8 blobs (800 bytes), then the commit with the last 2
        # blobs, the root and the 48 staged ids: each one counted round trip.
        assert server.server.total_requests - requests == 7
        assert counted(client)[0] - trips == 7
        payload = 50 * (16 + 100)
        overhead = 7 * 16 + 8 + 48 * 16  # frames, the seq, the named ids
        assert counted(client)[1] - sent == payload + 50 + overhead
        assert client.get_blobs("main", list(blobs)) == blobs
        stats = client.server_stats("main")
        assert (stats["blobs"], stats["staged"], stats["garbage"]) == (50, 0, 0)
    finally:
        client.close()


def test_a_retry_after_a_conflict_reuses_the_staged_blobs(serve):
    server = serve(max_commit_blobs=4, max_commit_bytes=10_000)
    client, rival = transport(server), transport(server)
    try:
        assert rival.commit("main", expected_seq=0, root=b"rival", blobs={}).ok
        first = {os.urandom(16): os.urandom(64) for _ in range(12)}
        trips = client.counters.round_trips
        result = client.commit("main", expected_seq=0, root=b"mine", blobs=first)
        assert not result.ok and result.root.seq == 1  # 2 stages, then the stale commit
        assert client.counters.round_trips - trips == 3
        assert client.server_stats("main")["staged"] == 8  # still pending, for the retry
        # The retry keeps 6 staged blobs, drops 2, adds 3 new ones: only those go out.
        kept = dict(list(first.items())[:6])
        new = {os.urandom(16): os.urandom(64) for _ in range(3)}
        trips = client.counters.round_trips
        result = client.commit("main", expected_seq=1, root=b"mine", blobs=kept | new)
        assert result.ok and client.counters.round_trips - trips == 1
        assert client.get_blobs("main", [*kept, *new]) == kept | new
        stats = client.server_stats("main")
        # Dropped: the 2 staged blobs it no longer uses, released as garbage.
        assert (stats["staged"], stats["garbage"], stats["blobs"]) == (0, 2, 11)
    finally:
        client.close()
        rival.close()


def test_a_refused_stage_keeps_what_was_staged_for_release(serve, registry):
    registry.set_limits("acme", max_blobs=10)
    client = transport(serve(max_commit_blobs=4))
    try:
        blobs = {os.urandom(16): b"x" for _ in range(14)}
        with pytest.raises(QuotaExceededError, match="quota of 10 blobs: 8 used"):
            client.commit("main", expected_seq=0, root=b"r", blobs=blobs)
        stats = client.server_stats("main")
        assert (stats["seq"], stats["staged"], stats["tenant"]["blobs"]) == (0, 8, 8)
        # The next commit of this thread releases them rather than leave them to expire.
        assert client.commit("main", expected_seq=0, root=b"r", blobs={}).ok
        stats = client.server_stats("main")
        assert (stats["seq"], stats["staged"], stats["garbage"]) == (1, 0, 8)
    finally:
        client.close()


def test_a_commit_with_an_unknown_outcome_forgets_its_staged_blobs(serve, monkeypatch):
    server = serve(max_commit_blobs=4)
    client = transport(server)
    try:
        blobs = {os.urandom(16): b"x" for _ in range(10)}
        original = RemoteTransport._call_many

        def lost_commit(self, requests, **kwargs):
            if requests[0][0] == "commit":
                raise StoreUnavailableError("the connection dropped; its outcome is unknown")
            return original(self, requests, **kwargs)

        monkeypatch.setattr(RemoteTransport, "_call_many", lost_commit)
        with pytest.raises(StoreUnavailableError):
            client.commit("main", expected_seq=0, root=b"r", blobs=blobs)
        monkeypatch.undo()
        # They may have become live: the next commit must not name them as garbage.
        assert client.commit("main", expected_seq=0, root=b"r", blobs={}).ok
        stats = client.server_stats("main")
        assert (stats["staged"], stats["garbage"]) == (8, 0)
        # Orphans after all: the collector deletes them once the staging timeout passed.
        collector = serve(staging_timeout=0)
        assert (
            asyncio.run_coroutine_threadsafe(
                collector.server.collect_garbage(), collector.loop
            ).result(10)
            == 8
        )
        assert client.server_stats("main")["staged"] == 0
    finally:
        client.close()


def test_staged_ids_of_another_tenant_or_database_cannot_be_committed(serve):
    server = serve()
    acme, beta = logged_in(server), logged_in(server, "beta", KEY_B)
    blob = os.urandom(16)
    assert acme.call("stage", {"database": "main", "blobs": {blob: b"acme's"}}).ok
    for wire, database in ((beta, "main"), (acme, "other")):
        answer = wire.call("commit", commit_args(0, {}, database=database) | {"staged": [blob]})
        assert answer.result[0] == protocol.NOT_STAGED
        assert wire.call("get_blobs", {"database": database, "ids": [blob]}).result["blobs"] == {}
    assert beta.call("stats", {"database": "main"}).result["tenant"]["blobs"] == 0
    # A client of beta that believes it staged the blob: NotStagedError, nothing changed.
    client = transport(server, "beta", KEY_B)
    try:
        client._staged.of("main").add({blob: b"acme's"})
        with pytest.raises(NotStagedError, match="not_staged"):
            client.commit("main", expected_seq=0, root=b"r", blobs={blob: b"acme's"})
        assert client.get_root("main").seq == 0
    finally:
        client.close()
    assert acme.call("commit", commit_args(0, {}) | {"staged": [blob]}).result["ok"]
    acme.close()
    beta.close()


def test_db_commits_a_transaction_larger_than_a_request(serve):
    server = serve(max_commit_blobs=4, max_commit_bytes=64 * 1024)
    key = KeyFile(KEY_A.secret, "acme")
    with DB(("127.0.0.1", server.port), password=PASSWORD, key_file=key, kdf="fast") as db:
        requests = server.server.total_requests
        with db.transaction():
            db.add(
                *(
                    Employee(name=f"E{i}", surname="S", salary=i, description="word " * 30)
                    for i in range(300)
                )
            )
        assert server.server.total_requests - requests > 2  # stages went ahead
        assert len(db[Employee]) == 300
        assert db.transport.server_stats("main")["staged"] == 0
    with DB(("127.0.0.1", server.port), password=PASSWORD, key_file=key, kdf="fast") as cold:
        assert sorted(e.salary for e in cold[Employee].all()) == list(range(300))


def test_only_a_blob_past_the_per_blob_limit_is_too_large(serve):
    client = transport(serve(max_commit_blobs=2, max_commit_bytes=1000))
    try:
        trips = client.counters.round_trips
        huge = {os.urandom(16): b"\0" * (protocol.MAX_BLOB_BYTES + 1)}
        with pytest.raises(CommitTooLargeError, match="at most 33554432 per blob"):
            client.commit("main", expected_seq=0, root=b"", blobs=huge)
        with pytest.raises(CommitTooLargeError, match="the root is"):
            client.commit("main", expected_seq=0, root=next(iter(huge.values())), blobs={})
        assert client.counters.round_trips == trips  # refused before anything is sent
        # Far past the request limits, a blob of 5 KB and a root of 3 KB still go in.
        big = {os.urandom(16): b"b" * 5000, os.urandom(16): b"c" * 5000}
        assert client.commit("main", expected_seq=0, root=b"r" * 3000, blobs=big).ok
        assert client.counters.round_trips - trips == 3
    finally:
        client.close()


@pytest.mark.parametrize(
    "limits",
    [
        {"max_commit_blobs": 0},
        {"max_commit_blobs": protocol.MAX_IDS_PER_REQUEST + 1},
        {"max_commit_bytes": 0},
        {"max_commit_bytes": protocol.MAX_FRAME_BYTES + 1},
    ],
)
def test_commit_limits_must_fit_the_protocol(registry, limits):
    with pytest.raises(ValueError, match="max_commit"):
        BlobServer(MemoryStorage(), Authenticator(registry), **limits)


# -- the admin commands ----------------------------------------------------------------------


def test_size_arguments():
    assert parse_size("1048576") == 1 << 20
    assert parse_size("512K") == parse_size("512 KiB") == parse_size("512kb") == 512 << 10
    assert parse_size("10G") == 10 << 30
    assert parse_size("1TiB") == 1 << 40
    for bad in ("", "-1", "1.5G", "10X", "ib", "1ib", "9" * 20):
        with pytest.raises(argparse.ArgumentTypeError, match=r"size|2\*\*53"):
            parse_size(bad)


def test_add_tenant_set_quota_and_list_tenants(tmp_path, capsys):
    tenants = str(tmp_path / "tenants.json")
    add = ["add-tenant", "acme", "--max-bytes", "10M", "--max-blobs", "1000"]
    assert cli_main([*add, "--tenants", tenants]) == 0
    assert cli_main(["add-tenant", "beta", "--tenants", tenants]) == 0
    data = json.loads((tmp_path / "tenants.json").read_text())
    assert (data["tenants"]["acme"]["max_bytes"], data["tenants"]["acme"]["max_blobs"]) == (
        10 << 20,
        1000,
    )
    assert "max_bytes" not in data["tenants"]["beta"]  # the server's default applies
    capsys.readouterr()
    assert cli_main(["list-tenants", "--tenants", tenants]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0] == f"server id: {data['server_id']}"
    others = (
        "max_connections default  max_frame_memory default  rate default  burst default"
        "  max_login_failures default"
    )
    assert f"acme  max_bytes 10485760  max_blobs 1000  {others}" in listing
    assert f"beta  max_bytes default  max_blobs default  {others}" in listing

    assert cli_main(["set-quota", "acme", "--max-bytes", "unlimited", "--tenants", tenants]) == 0
    assert capsys.readouterr().out.startswith("tenant acme: max_bytes unlimited, max_blobs 1000,")
    assert cli_main(["set-quota", "acme", "--max-blobs", "default", "--tenants", tenants]) == 0
    entry = json.loads((tmp_path / "tenants.json").read_text())["tenants"]["acme"]
    assert entry["max_bytes"] is None and "max_blobs" not in entry
    registry = TenantRegistry(tenants)
    assert registry.quota("acme", Quota(max_bytes=5, max_blobs=7)) == Quota(None, 7)
    assert registry.quota("beta", Quota(max_bytes=5)) == Quota(5, None)

    with pytest.raises(SystemExit, match="give at least one of --max-bytes, --max-blobs"):
        cli_main(["set-quota", "acme", "--tenants", tenants])
    assert cli_main(["set-quota", "nobody", "--max-blobs", "1", "--tenants", tenants]) == 1
    assert "no tenant 'nobody'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        cli_main(["add-tenant", "gamma", "--max-bytes", "lots", "--tenants", tenants])
    assert bad.value.code == 2
    with pytest.raises(SystemExit) as bad:  # 'default' is for set-quota only
        cli_main(["add-tenant", "gamma", "--max-blobs", "default", "--tenants", tenants])
    assert bad.value.code == 2


def test_a_malformed_quota_in_the_tenants_file_is_refused(tmp_path):
    path = tmp_path / "tenants.json"
    registry_with(path, acme=[KEY_A])
    data = json.loads(path.read_text())
    data["tenants"]["acme"]["max_bytes"] = -5
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="malformed max_bytes"):
        TenantRegistry(path)


def test_serve_refuses_commit_limits_outside_the_protocol(tmp_path):
    with pytest.raises(SystemExit, match="max_commit_blobs must be between 1 and 4096"):
        cli_main(["serve", "--tenants", str(tmp_path / "t.json"), "--max-commit-blobs", "5000"])


def test_the_staging_timeout_is_a_checked_setting(tmp_path, registry):
    args = ["serve", "--tenants", str(tmp_path / "t.json")]
    assert build_parser().parse_args(args).staging_timeout == 3600.0
    assert build_parser().parse_args([*args, "--staging-timeout", "90"]).staging_timeout == 90.0
    with pytest.raises(SystemExit, match="staging_timeout must be finite and >= 0"):
        cli_main([*args, "--staging-timeout", "-1"])
    for bad in (float("inf"), float("nan"), "60"):
        with pytest.raises(ValueError, match="staging_timeout"):
            BlobServer(MemoryStorage(), Authenticator(registry), staging_timeout=bad)


def test_stats_command_on_sqlite(tmp_path, capsys):
    path = tmp_path / "blobs.zdb"
    url = f"sqlite:///{path}"
    tenants = str(path) + ".tenants.json"
    assert cli_main(["add-tenant", "acme", "--max-bytes", "1K", "--storage", url]) == 0
    assert cli_main(["add-tenant", "idle", "--storage", url]) == 0
    store = SQLiteStorage(path)
    blob = os.urandom(16)
    store.commit("acme", "main", expected_seq=0, root=b"r" * 10, blobs={blob: b"x" * 100})
    store.commit("acme", "main", expected_seq=1, root=b"r" * 10, blobs={}, garbage=[blob])
    store.commit("acme", "logs", expected_seq=0, root=b"", blobs={os.urandom(16): b"y" * 5})
    store.put_keyring("acme", "main", "slot", b"k" * 20, expected=None)
    store.stage("acme", "logs", {os.urandom(16): b"s" * 7})  # pending, and counted
    store.commit("local", "main", expected_seq=0, root=b"", blobs={})  # not in the file
    store.close()
    capsys.readouterr()

    assert cli_main(["stats", "--storage", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["server_id"] == json.loads(Path(tenants).read_text())["server_id"]
    assert report["durability"] == {
        "mode": "durable",
        "detail": f"SQLite {path} with synchronous=FULL",
    }
    by_name = {entry["tenant"]: entry for entry in report["tenants"]}
    assert sorted(by_name) == ["acme", "idle", "local"]
    acme = by_name["acme"]
    assert (acme["blobs"], acme["bytes"], acme["max_bytes"], acme["max_blobs"]) == (
        3,
        100 + 10 + 5 + 20 + 7,
        1024,
        "default",
    )
    assert acme["databases"] == [
        {"database": "logs", "seq": 1, "blobs": 2, "bytes": 12, "garbage": 0, "staged": 1},
        {"database": "main", "seq": 2, "blobs": 1, "bytes": 100, "garbage": 1, "staged": 0},
    ]
    assert (by_name["idle"]["blobs"], by_name["idle"]["databases"]) == (0, [])
    assert not by_name["local"]["registered"] and by_name["acme"]["registered"]

    assert cli_main(["stats", "--storage", url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"server id: {report['server_id']}"
    assert table.pop(1) == f"durability: durable (SQLite {path} with synchronous=FULL)"
    assert table[1].split() == [
        "tenant",
        "database",
        "seq",
        "blobs",
        "bytes",
        "garbage",
        "staged",
        *STATS_LIMITS,
    ]
    limits = ["default", "1024", *("default" for _ in FAIRNESS_KEYS)]
    assert table[2].split() == ["acme", "(2", "databases)", "3", "142", *limits]
    assert table[3].split() == ["acme", "logs", "1", "2", "12", "0", "1"]
    with pytest.raises(SystemExit, match="no store at"):
        cli_main(["stats", "--storage", f"sqlite:///{tmp_path}/missing.zdb"])
