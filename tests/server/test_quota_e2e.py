"""End to end on the production stack: ``zerodb-server serve --redis`` as a subprocess with
TLS, a default quota and a commit limit; tenants, keys and quotas made with the CLIs;
``DB((host, port), ca_file=..., timeout=...)`` as the client.

1. a tenant commits until its quota refuses (``QuotaExceededError``), and
   ``zerodb-server stats --redis`` reports exactly what Redis holds for it, byte for byte;
   ``set-quota`` lifts the limit without a restart;
2. a transaction past ``--max-commit-blobs`` is streamed (stage requests, then the
   commit naming them) and commits;
3. the key file was pinned to the server at its first login, and another server (valid
   certificate, same tenant and key registered) is refused, naming both ids.

Each test runs on one database of the session's redis-server and on the session's
3-master cluster (``--redis-cluster``): the ``server_backend`` fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blob_server.limits import FAIRNESS_KEYS
from tests.core.hr import Employee
from tests.server.conftest import ServerBackend
from tests.server.test_server_e2e import ServerProcess, run
from tests.server.wire import self_signed_cert
from zerodb_core import DB, AuthenticationError, QuotaExceededError
from zerodb_core.keyfile import KeyFile

pytestmark = pytest.mark.xdist_group("quota_e2e")  # see server_backend

REDIS_DB = 11  # apart from the storage tests (0) and test_redis_e2e (9)
PASSWORD = "quota end to end passphrase"
MAX_BLOBS = 40
MAX_COMMIT_BLOBS = 16


def cli(*args: str) -> str:
    return run("-m", "blob_server.cli", *args)


class TlsServer(ServerProcess):
    def __init__(self, storage: str, tenants: Path, log: Path, cert: tuple, *extra: str):
        super().__init__(storage, tenants, log)
        self.args += ["--tls-cert", str(cert[0]), "--tls-key", str(cert[1]), *extra]


@pytest.fixture(scope="module")
def deployment(server_backend, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quota_e2e")
    cert = self_signed_cert(tmp)
    tenants = tmp / "tenants.json"
    cli("add-tenant", "acme", "--max-blobs", str(MAX_BLOBS), "--tenants", str(tenants))
    cli("add-tenant", "beta", "--tenants", str(tenants))
    keys = {}
    for tenant in ("acme", "beta"):
        path = tmp / f"{tenant}.zdbkey"
        public = run(
            "-m",
            "zerodb_core.keyfile",
            "create",
            *("--tenant", tenant, "--out", str(path), "--kdf", "fast"),
            env={"ZERODB_PASSPHRASE": PASSWORD},
        ).strip()
        cli("add-key", tenant, public, "--tenants", str(tenants))
        keys[tenant] = path
    server = TlsServer(
        server_backend.address,
        tenants,
        tmp / "server.log",
        cert,
        *("--default-max-bytes", "64M", "--max-commit-blobs", str(MAX_COMMIT_BLOBS)),
    )
    server_backend.serve_on(server)
    server.start()
    yield {
        "backend": server_backend,
        "tmp": tmp,
        "cert": cert,
        "tenants": tenants,
        "keys": keys,
        "srv": server,
    }
    server.stop()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log


def open_db(dep: dict, tenant: str, server: ServerProcess | None = None) -> DB:
    return DB(
        ("127.0.0.1", (server or dep["srv"]).port),
        password=PASSWORD,
        key_file=dep["keys"][tenant],
        kdf="fast",
        ca_file=dep["cert"][0],
        timeout=10,
    )


def held_in_redis(backend: ServerBackend, tenant: str, database: str) -> tuple[int, int]:
    """Blobs and bytes (blobs + root + keyring slots) of one database, read from Redis
    (on the cluster: from every master)."""
    store = backend.storage()
    try:
        scope = store._scope(tenant, database)
    finally:
        store.close()
    client = backend.client()
    blob_keys = list(client.scan_iter(match=scope.blob_prefix + b"*", count=1000))
    size = sum(client.strlen(key) for key in blob_keys)
    size += client.hstrlen(scope.root, "data")
    size += sum(len(value) for value in client.hvals(scope.keyrings))
    return len(blob_keys), size


def test_quota_on_redis_over_tls_reported_by_stats_and_lifted_live(deployment):
    dep = deployment
    with open_db(dep, "acme") as db:
        added = 0
        with pytest.raises(QuotaExceededError, match=f"quota of {MAX_BLOBS} blobs") as caught:
            for i in range(MAX_BLOBS):
                db.add(Employee(name="Ann", surname=f"S{i}", salary=i, description="quota"))
                added += 1
        assert 0 < added < MAX_BLOBS
        assert "used, the write adds" in str(caught.value)
        seq = db.transport.get_root("main").seq
        own = db.transport.server_stats("main")["tenant"]
        assert own["max_blobs"] == MAX_BLOBS and own["max_bytes"] == 64 << 20
        assert own["blobs"] <= MAX_BLOBS

        # The admin's view: exactly what Redis holds for the tenant.
        blobs, size = held_in_redis(dep["backend"], "acme", "main")
        where = dep["backend"].cli_args()
        report = json.loads(cli("stats", *where, "--tenants", str(dep["tenants"]), "--json"))
        by_name = {entry["tenant"]: entry for entry in report["tenants"]}
        acme = by_name["acme"]
        assert (acme["blobs"], acme["bytes"]) == (blobs, size) == (own["blobs"], own["bytes"])
        assert (acme["max_blobs"], acme["max_bytes"]) == (MAX_BLOBS, "default")
        (database,) = acme["databases"]  # Redis holds no names: an opaque tag
        assert database["database"].startswith("tag:") and database["seq"] == seq
        assert "main" not in json.dumps(report)
        table = cli("stats", *where, "--tenants", str(dep["tenants"]))
        rows = [line.split() for line in table.splitlines()]
        fairness = ["default"] * len(FAIRNESS_KEYS)  # the server's connection and rate limits
        quota = [str(MAX_BLOBS), "default"]
        assert ["acme", "(1", "database)", str(blobs), str(size), *quota, *fairness] in rows

        # Raised while the server runs: the next commit goes through.
        cli("set-quota", "acme", "--max-blobs", "unlimited", "--tenants", str(dep["tenants"]))
        db.add(Employee(name="Bob", surname="after", salary=0, description="lifted"))
        assert len(db[Employee].all()) == added + 1


def test_a_transaction_past_the_servers_request_limit_is_streamed(deployment):
    with open_db(deployment, "beta") as db:
        db.add(Employee(name="One", surname="x", salary=1, description="small commit"))
        seq = db.transport.get_root("main").seq
        before = db.transport.server_stats("main")["blobs"]
        bulk = [
            Employee(name=f"N{i}", surname=f"S{i}", salary=i, description="bulk " * 20)
            for i in range(2000)
        ]
        trips = db.transport.counters.round_trips
        with db.transaction():
            db.add(*bulk)
        stats = db.transport.server_stats("main")
        assert stats["seq"] == seq + 1 and stats["staged"] == 0
        written = stats["blobs"] - before
        assert written > MAX_COMMIT_BLOBS  # more than one request could carry
        # At least one stage request per MAX_COMMIT_BLOBS new blobs, each counted.
        assert db.transport.counters.round_trips - trips > written // MAX_COMMIT_BLOBS
        assert len(db[Employee].all()) == 2001
    with open_db(deployment, "beta") as cold:
        assert sorted(e.salary for e in cold[Employee].all()) == sorted([1, *range(2000)])


def test_the_key_file_is_pinned_and_another_server_refused(deployment):
    dep = deployment
    with open_db(dep, "beta"):
        pass
    server_id = json.loads(dep["tenants"].read_text())["server_id"]
    assert KeyFile.load(dep["keys"]["beta"], PASSWORD).server_id == server_id
    # Another server with a valid certificate and the same tenant and key registered.
    other_tenants = dep["tmp"] / "other-tenants.json"
    cli("add-tenant", "beta", "--tenants", str(other_tenants))
    public = KeyFile.load(dep["keys"]["beta"], PASSWORD).public_key.hex()
    cli("add-key", "beta", public, "--tenants", str(other_tenants))
    other = TlsServer("memory://", other_tenants, dep["tmp"] / "other.log", dep["cert"])
    other.start()
    try:
        with pytest.raises(AuthenticationError) as caught:
            open_db(dep, "beta", server=other)
        other_id = json.loads(other_tenants.read_text())["server_id"]
        assert other_id in str(caught.value) and server_id in str(caught.value)
        assert "event=login " not in other.log.read_text()  # it never saw a login
    finally:
        other.stop()
