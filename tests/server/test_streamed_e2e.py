"""End to end for streamed commits: ``zerodb-server serve --redis`` as a subprocess with
small request limits (``--max-commit-bytes 1M --max-commit-blobs 256``), real clients.

1. a commit of 20 MB in 10,000 blobs goes out in counted stage requests and reads back;
2. a 10,000-record import in one transaction commits through ``DB`` and reads back;
3. a client killed between its stage requests and its commit leaves orphans: they hold
   the tenant's quota until the collector deletes them after the staging timeout.

Each test runs on one database of the session's redis-server and on the session's
3-master cluster (``--redis-cluster``): the ``server_backend`` fixture.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from coincurve import PrivateKey

from blob_server.tenants import TenantRegistry
from tests.core.hr import Employee
from tests.server.conftest import ServerBackend
from tests.server.test_server_e2e import ROOT, ServerProcess
from tests.server.wire import registry_with
from zerodb_core import DB, QuotaExceededError
from zerodb_core.keyfile import KeyFile
from zerodb_core.transport.remote import RemoteTransport

pytestmark = pytest.mark.xdist_group("streamed_e2e")  # see server_backend

REDIS_DB = 12  # apart from the storage tests (0), test_redis_e2e (9), quota e2e (11)
PASSWORD = "streamed end to end passphrase"
MAX_COMMIT_BLOBS = 256
MAX_COMMIT_BYTES = 1 << 20


@dataclass
class Deployment:
    backend: ServerBackend
    server: ServerProcess
    registry: TenantRegistry
    key: PrivateKey

    def client(self) -> RemoteTransport:
        port = self.server.port
        return RemoteTransport("127.0.0.1", port, tenant="acme", login_key=self.key.secret)


@pytest.fixture(scope="module")
def dep(server_backend, tmp_path_factory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("streamed_e2e")
    key = PrivateKey()
    registry = registry_with(tmp / "tenants.json", acme=[key])
    server = ServerProcess(server_backend.address, registry.path, tmp / "server.log")
    server_backend.serve_on(server)
    server.args += ["--max-commit-bytes", "1M", "--max-commit-blobs", str(MAX_COMMIT_BLOBS)]
    server.start()
    yield Deployment(server_backend, server, registry, key)
    server.stop()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log


def test_a_20_mb_commit_of_10000_blobs_goes_out_in_small_requests(dep):
    client = dep.client()
    try:
        assert (client.limits.blobs, client.limits.bytes) == (MAX_COMMIT_BLOBS, MAX_COMMIT_BYTES)
        blobs = {os.urandom(16): os.urandom(2000) for _ in range(10_000)}  # 20 MB
        trips, sent = client.counters.round_trips, client.counters.bytes_sent
        result = client.commit("bulk", expected_seq=0, root=b"r" * 100, blobs=blobs)
        assert result.ok and result.root.seq == 1
        # 256 blobs (512,000 bytes) per stage request: 39 of them, then the commit with
        # the last 16 blobs, the root and the 9,984 staged ids; each one round trip.
        assert client.counters.round_trips - trips == 40
        staged = 39 * MAX_COMMIT_BLOBS
        expected = 40 * 16 + 10_000 * (16 + 2000) + 8 + 100 + staged * 16
        assert client.counters.bytes_sent - sent == expected
        assert client.get_blobs("bulk", list(blobs)) == blobs
        stats = client.server_stats("bulk")
        assert (stats["blobs"], stats["bytes"], stats["staged"]) == (10_000, 20_000_000, 0)
    finally:
        client.close()


def test_a_10000_record_import_commits_in_one_transaction(dep, tmp_path):
    key = KeyFile(dep.key.secret, "acme")
    address = ("127.0.0.1", dep.server.port)
    options = {"password": PASSWORD, "key_file": key, "kdf": "fast", "database": "import"}
    with DB(address, **options) as db:
        with db.transaction():
            db.add(
                *(
                    Employee(name=f"N{i}", surname=f"S{i}", salary=i, description="import " * 20)
                    for i in range(10_000)
                )
            )
        stats = db.transport.server_stats("import")
        assert stats["seq"] == 1 and stats["staged"] == 0
        assert stats["bytes"] > 3 * MAX_COMMIT_BYTES  # several requests at the least
    with DB(address, **options) as cold:
        assert len(cold[Employee]) == 10_000
        assert sorted(e.salary for e in cold[Employee].all()) == list(range(10_000))


def stage_then_die() -> None:
    """The child of the next test: stage a commit's blobs, then die (SIGKILL) just as the
    commit would go out."""
    port, key = int(os.environ["ZDB_PORT"]), bytes.fromhex(os.environ["ZDB_KEY"])
    client = RemoteTransport("127.0.0.1", port, tenant="acme", login_key=key)

    def die(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    client._commit = die  # type: ignore[method-assign]
    blobs = {os.urandom(16): os.urandom(1000) for _ in range(1000)}
    client.commit("orphans", expected_seq=0, root=b"r", blobs=blobs)


def test_a_client_killed_mid_upload_leaves_orphans_that_are_collected(dep):
    child = subprocess.run(
        [sys.executable, "-c", f"from {__name__} import stage_then_die; stage_then_die()"],
        cwd=ROOT,
        env={**os.environ, "ZDB_PORT": str(dep.server.port), "ZDB_KEY": dep.key.secret.hex()},
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    client = dep.client()
    try:
        # Three stage requests of 256 blobs went out (the last 232 would have ridden in
        # the commit): pending, counted toward the quota, reached by no root.
        stats = client.server_stats("orphans")
        assert (stats["seq"], stats["staged"], stats["bytes"]) == (0, 768, 768_000)
        used = stats["tenant"]["blobs"]
        dep.registry.set_limits("acme", max_blobs=used + 100)  # the server re-reads it
        more = {os.urandom(16): b"x" for _ in range(300)}
        with pytest.raises(QuotaExceededError, match=f"{used} used"):
            client.commit("after", expected_seq=0, root=b"", blobs=more)

        # Within the staging timeout the collector keeps them (their client might still
        # commit); an hour later (the default timeout) it deletes them.
        storage = dep.backend.storage()
        later = dep.backend.storage(clock=lambda: time.time() + 3600)
        try:
            assert storage.collect_garbage() == 0
            assert later.collect_garbage() == 768
        finally:
            storage.close()
            later.close()
        stats = client.server_stats("orphans")
        assert (stats["staged"], stats["blobs"], stats["tenant"]["blobs"]) == (0, 0, used - 768)
        assert client.commit("after", expected_seq=0, root=b"", blobs=more).ok
    finally:
        dep.registry.set_limits("acme", max_blobs=None)
        client.close()
