"""The main Django cases against the production stack: a real redis-server, the blob
server as a subprocess (``zerodb-server serve --redis``), a tenant and key made with the
CLI, and a ``DATABASES`` entry with ``STORE: zerodb://host:port`` and ``KEY_FILE``.

The encrypted tables are created with the backend's schema editor on that connection, the
workload runs through the ORM (``.using("remote")``), the server is restarted, and a new
connection (a new engine: fresh keyring unlock, cold cache) must give the same answers.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator

import pytest
from django.db import IntegrityError, connections, transaction
from django.db.models import Count, F, Sum

from django_zerodb.store import forget_engines
from tests.django.testapp.models import Counter, Department, Employee
from tests.server.conftest import start_redis_server, stop_redis_server
from tests.server.test_server_e2e import RedisServerProcess, run

pytestmark = pytest.mark.xdist_group("django_blob_server")

ALIAS = "remote"
PASSPHRASE = "django over the blob server"
N = 600


@pytest.fixture(scope="module")
def remote(tmp_path_factory, django_db_blocker) -> Iterator[RedisServerProcess]:
    tmp = tmp_path_factory.mktemp("django-remote")
    redis_server = start_redis_server(tmp)
    tenants = tmp / "tenants.json"
    key_file = tmp / "hr.zdbkey"
    run("-m", "blob_server.cli", "add-tenant", "hr", "--tenants", str(tenants))
    public = run(
        "-m", "zerodb_core.keyfile", "create", "--tenant", "hr", "--out", str(key_file),
        "--kdf", "fast", env={"ZERODB_PASSPHRASE": PASSPHRASE},
    ).strip()  # fmt: skip
    run("-m", "blob_server.cli", "add-key", "hr", public, "--tenants", str(tenants))
    server = RedisServerProcess(redis_server.url(3), tenants, tmp / "server.log")
    server.start()
    entry = copy.deepcopy(connections.settings["encrypted"])
    entry["NAME"] = "hr"
    entry["OPTIONS"] = {
        "STORE": f"zerodb://127.0.0.1:{server.port}",
        "PASSPHRASE": PASSPHRASE,
        "KEY_FILE": str(key_file),
        "KDF": "fast",
        "FRESHNESS_PATH": str(tmp / "hr.fresh"),
    }
    connections.settings[ALIAS] = entry
    with django_db_blocker.unblock():
        with connections[ALIAS].schema_editor() as editor:
            for model in (Department, Employee, Counter):
                editor.create_model(model)
        yield server
        connections[ALIAS].close()
    del connections.settings[ALIAS]
    forget_engines(f"zerodb://127.0.0.1:{server.port}")
    server.stop()
    stop_redis_server(redis_server.process)
    assert "Traceback" not in server.log.read_text(errors="replace")


def answers() -> dict:
    employees = Employee.objects.using(ALIAS)
    departments = Department.objects.using(ALIAS)
    in_range = employees.filter(salary__range=(100_000, 120_000))
    found = employees.filter(bio__search="kernel panic")
    return {
        "count": employees.count(),
        "range": sorted(in_range.values_list("id", flat=True)),
        "top": list(employees.order_by("-salary").values_list("email", flat=True)[:10]),
        "dept": employees.filter(department__name="D3").count(),
        "search": sorted(found.values_list("id", flat=True)),
        "groups": list(
            departments.annotate(n=Count("employees")).order_by("name").values_list("name", "n")
        ),
        "total": employees.aggregate(s=Sum("salary"))["s"],
    }


def test_orm_workload_survives_a_server_restart(remote, django_db_blocker):
    """Real commits (no test transaction around it): each statement commits through the
    server, as in production."""
    with django_db_blocker.unblock():
        _workload(remote)


def _workload(remote) -> None:
    rng = random.Random(7)
    departments = [Department.objects.using(ALIAS).create(name=f"D{i}") for i in range(6)]
    rows = [
        Employee(
            first_name=rng.choice(["Ann", "Bob", "Cleo"]),
            last_name=f"L{i}",
            email=f"e{i}@example.com",
            salary=rng.randrange(50_000, 200_000),
            department_id=rng.choice(departments).pk,  # the router would pick "encrypted"
            bio=rng.choice(["kernel panic at boot", "payroll audit", "printer on fire"]),
        )
        for i in range(N)
    ]
    Employee.objects.using(ALIAS).bulk_create(rows)
    expected = {
        "count": N,
        "range": sorted(e.pk for e in rows if 100_000 <= e.salary <= 120_000),
        "top": [e.email for e in sorted(rows, key=lambda e: (-e.salary, -e.pk))][:10],
        "dept": sum(e.department_id == departments[3].pk for e in rows),
        "search": sorted(e.pk for e in rows if e.bio == "kernel panic at boot"),
        "groups": sorted((d.name, sum(e.department_id == d.pk for e in rows)) for d in departments),
        "total": sum(e.salary for e in rows),
    }
    got = answers()
    # Ties of "-salary" may come in any order in SQL; compare the salaries of the top ten.
    salary = {e.email: e.salary for e in rows}
    assert [salary[m] for m in got.pop("top")] == [salary[m] for m in expected.pop("top")]
    assert got == expected

    # Writes through the server: F() update, unique violation, rollback, cascade.
    counter = Counter.objects.using(ALIAS).create(name="hits")
    Counter.objects.using(ALIAS).filter(pk=counter.pk).update(value=F("value") + 5)
    assert Counter.objects.using(ALIAS).get(pk=counter.pk).value == 5
    with pytest.raises(IntegrityError):
        Department.objects.using(ALIAS).create(name="D1")
    with pytest.raises(RuntimeError), transaction.atomic(using=ALIAS):
        Employee.objects.using(ALIAS).filter(department__name="D0").delete()
        raise RuntimeError("roll back")
    before = answers()
    assert before["count"] == N

    # Restart the server and open a new engine (cold cache, keyring unlocked again).
    remote.stop()
    remote.start()
    connections[ALIAS].close()
    forget_engines(f"zerodb://127.0.0.1:{remote.port}")
    assert answers() == before

    deleted = Department.objects.using(ALIAS).get(name="D0")
    n_deleted = Employee.objects.using(ALIAS).filter(department=deleted).count()
    departments = Department.objects.using(ALIAS)
    pk = deleted.pk
    assert departments.filter(pk=pk).count() == 1
    deleted.delete()  # the router sends it to the database the object came from
    assert departments.filter(pk=pk).count() == 0
    assert Employee.objects.using(ALIAS).count() == N - n_deleted
