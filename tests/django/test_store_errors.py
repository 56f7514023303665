"""The store's operational errors as Django code sees them, from a real blob server.

``zerodb-server serve`` runs as a subprocess (SQLite storage, ``--garbage-retention 0``
and a garbage task every 50 ms), with two tenants: ``hr`` and ``small`` (a quota of
``MAX_BLOBS`` blobs). Two ``DATABASES`` aliases reach them over ``zerodb://``.

A full quota and a snapshot older than the retention must reach the ORM's caller as
``django.db.OperationalError``, and precisely as ``django_zerodb``'s
``QuotaExceededError`` / ``SnapshotTooOldError`` (both Django's class too), never as
an ``IntegrityError`` or the ``DatabaseError`` that tampering raises.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, IntegrityError, OperationalError, connections, transaction

from django_zerodb import exceptions as backend
from django_zerodb.store import forget_engines
from tests.django.testapp.models import Employee
from tests.server.test_server_e2e import ServerProcess, run
from zerodb_core import DB

pytestmark = pytest.mark.xdist_group("django_blob_server")

PASSPHRASE = "django store errors"
MAX_BLOBS = 40
ALIASES = {"hr": "errors_hr", "small": "errors_small"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_blocker) -> Iterator[tuple[ServerProcess, dict]]:
    tmp = tmp_path_factory.mktemp("django-errors")
    tenants = tmp / "tenants.json"
    cli = ("-m", "blob_server.cli")
    run(*cli, "add-tenant", "hr", "--tenants", str(tenants))
    run(*cli, "add-tenant", "small", "--max-blobs", str(MAX_BLOBS), "--tenants", str(tenants))
    keys = {}
    for tenant in ALIASES:
        keys[tenant] = tmp / f"{tenant}.zdbkey"
        public = run(
            "-m", "zerodb_core.keyfile", "create", "--tenant", tenant, "--out",
            str(keys[tenant]), "--kdf", "fast", env={"ZERODB_PASSPHRASE": PASSPHRASE},
        ).strip()  # fmt: skip
        run(*cli, "add-key", tenant, public, "--tenants", str(tenants))
    server = ServerProcess(f"sqlite:///{tmp}/blobs.zdb", tenants, tmp / "server.log")
    server.args += ["--garbage-retention", "0", "--gc-interval", "0.05"]
    server.start()
    for tenant, alias in ALIASES.items():
        entry = copy.deepcopy(connections.settings["encrypted"])
        entry["NAME"] = "hr"
        entry["OPTIONS"] = {
            "STORE": f"zerodb://127.0.0.1:{server.port}",
            "PASSPHRASE": PASSPHRASE,
            "KEY_FILE": str(keys[tenant]),
            "KDF": "fast",
            "FRESHNESS_PATH": str(tmp / f"{tenant}.fresh"),
        }
        connections.settings[alias] = entry
    with django_db_blocker.unblock():
        for alias in ALIASES.values():
            with connections[alias].schema_editor() as editor:
                editor.create_model(Employee)
        yield server, keys
        for alias in ALIASES.values():
            connections[alias].close()
    for alias in ALIASES.values():
        del connections.settings[alias]
    forget_engines(f"zerodb://127.0.0.1:{server.port}")
    server.stop()
    assert "Traceback" not in server.log.read_text(errors="replace")


def employee(i: int) -> Employee:
    return Employee(
        first_name=["Ann", "Bob", "Cleo"][i % 3],
        last_name=f"L{i}",
        email=f"e{i}@example.com",
        salary=(i * 7919) % 100_000,  # interleaves across batches: merges rewrite leaves
        bio=["kernel panic", "payroll audit"][i % 2],
    )


def test_a_full_quota_is_a_django_operational_error(server, django_db_blocker):
    alias = ALIASES["small"]
    with django_db_blocker.unblock(), pytest.raises(OperationalError) as caught:
        for i in range(MAX_BLOBS):
            employee(i).save(using=alias)
    assert isinstance(caught.value, backend.QuotaExceededError)
    assert not isinstance(caught.value, IntegrityError)
    assert "quota" in str(caught.value)


def test_a_snapshot_too_old_is_a_django_operational_error(server, django_db_blocker):
    _, keys = server
    alias = ALIASES["hr"]
    with django_db_blocker.unblock():
        for batch in range(3):  # three commits: three runs of every tree
            Employee.objects.using(alias).bulk_create([employee(batch * 10 + i) for i in range(10)])
        store = connections.settings[alias]["OPTIONS"]["STORE"]
        connections[alias].close()
        forget_engines(store)  # a new engine: what it reads next comes from the server
        port = int(store.rsplit(":", 1)[1])
        writer = DB(
            ("127.0.0.1", port), password=PASSPHRASE, key_file=keys["hr"], kdf="fast",
            database="hr", freshness_path=keys["hr"].parent / "writer.fresh",
        )  # fmt: skip
        try:
            with pytest.raises(OperationalError) as caught, transaction.atomic(using=alias):
                assert Employee.objects.using(alias).count() == 30  # the snapshot is pinned
                assert writer.compact() > 0  # another client merges the runs it reads
                deadline = time.monotonic() + 30
                while writer.transport.server_stats("hr")["garbage"]:
                    assert time.monotonic() < deadline, "the garbage was never collected"
                    time.sleep(0.05)
                list(Employee.objects.using(alias).filter(salary__gte=0).order_by("salary"))
        finally:
            writer.close()
        assert isinstance(caught.value, backend.SnapshotTooOldError)
        assert type(caught.value) is not DatabaseError  # what tampering raises
        assert "--garbage-retention" in str(caught.value)
        # Retried, on a new snapshot, it reads everything.
        assert Employee.objects.using(alias).filter(salary__gte=0).count() == 30
