"""Fixtures of the backend tests: both embedded stores, and an HR data set.

How the SQLite store is covered: ``settings.py`` declares a second encrypted alias,
``encrypted_sqlite``, whose test store is a ``sqlite:///`` file in pytest's temporary
directory (set by ``django_db_modify_db_settings`` below, before the test databases are
created; each xdist worker has its own directory). The router sends the encrypted apps to
``settings.ZERODB_DATABASE`` (or the first ``django_zerodb`` alias), so the ``store``
fixture, parametrized ``memory``/``sqlite``, points ``ZERODB_DATABASE`` at one alias or
the other: the same test, with the same ORM calls and no ``using()``, runs on both
stores. ``migrate`` runs the encrypted apps only on the alias the router names (and
records them as applied everywhere), so ``django_db_setup`` unapplies testapp on
``encrypted_sqlite`` (``--fake``) and migrates it again with the setting pointed at it.
Modules that should run on both stores mark themselves with ``BOTH_STORES``. A
``transaction=True`` test on ``encrypted_sqlite`` is emptied by the ``store`` fixture
itself, since pytest-django flushes after the setting is gone.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal

import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import override_settings

MEMORY = "encrypted"
SQLITE = "encrypted_sqlite"
# Every database a test may touch (pytest-django wraps each in a transaction).
DATABASES = ["default", MEMORY, SQLITE]
STORES = {"memory": MEMORY, "sqlite": SQLITE}

db = pytest.mark.django_db(databases=DATABASES)
transactional_db = pytest.mark.django_db(databases=DATABASES, transaction=True)
BOTH_STORES = pytest.mark.usefixtures("store")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    path = tmp_path_factory.mktemp("zerodb") / "store.zdb"
    connections[SQLITE].settings_dict.setdefault("TEST", {})["STORE"] = f"sqlite:///{path}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    connection = connections[SQLITE]
    if connection.settings_dict["OPTIONS"]["STORE"].startswith("sqlite:///"):  # set up
        with django_db_blocker.unblock(), override_settings(ZERODB_DATABASE=SQLITE):
            # The first migrate recorded testapp's migrations without running them here.
            call_command("migrate", "testapp", "zero", database=SQLITE, fake=True, verbosity=0)
            call_command("migrate", "testapp", database=SQLITE, verbosity=0)
    yield


@pytest.fixture(params=sorted(STORES))
def store(request, settings):
    """The alias of the encrypted database the test runs on (``memory`` or ``sqlite``)."""
    alias = STORES[request.param]
    settings.ZERODB_DATABASE = alias
    yield alias
    marker = request.node.get_closest_marker("django_db")
    if alias != MEMORY and marker is not None and marker.kwargs.get("transaction"):
        # pytest-django empties the tables after this fixture is gone, when the router no
        # longer names this alias: empty them now (as TransactionTestCase's flush would).
        call_command("flush", database=alias, interactive=False, verbosity=0)


@pytest.fixture
def alias():
    """The alias the router uses now (``store`` may have changed it)."""
    from django_zerodb.routers import encrypted_alias

    return encrypted_alias()


# -- the HR data set ----------------------------------------------------------------------

FIRST = ["Ada", "Alan", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis"]
LAST = ["Lovelace", "Turing", "Hopper", "Torvalds", "Liskov", "Thompson", "Hamilton"]
TITLES = ["Engineer", "Senior Engineer", "Manager", "", "Intern"]
BIOS = [
    "kernel panic at dawn",
    "writes compilers and debuggers",
    "",
    "Kernel hacker; panic is a state of mind",
    "sales of encrypted databases",
]


@dataclasses.dataclass
class HR:
    departments: dict  # name -> Department
    employees: list  # Employee objects as created (the expectations' source)

    def by_dept(self, name):
        d = self.departments[name]
        return [e for e in self.employees if e.department_id == d.pk]


@pytest.fixture
def hr():
    """Four departments (one empty, one without a budget) and 24 employees with NULL
    salaries, departments, dates and timestamps sprinkled in."""
    from tests.django.testapp.models import Department, Employee

    departments = {
        "R&D": Department.objects.create(name="R&D", budget=decimal.Decimal("1000000.00")),
        "Sales": Department.objects.create(name="Sales", budget=decimal.Decimal("250000.50")),
        "Support": Department.objects.create(name="Support", budget=None),
        "Empty": Department.objects.create(name="Empty", budget=decimal.Decimal("10.00")),
    }
    homes = [departments["R&D"], departments["Sales"], departments["Support"], None]
    employees = []
    for i in range(24):
        employees.append(
            Employee(
                first_name=FIRST[i % len(FIRST)],
                last_name=LAST[i % len(LAST)],
                email=f"person{i}@example.com",
                title=TITLES[i % len(TITLES)],
                salary=None if i % 7 == 3 else 30_000 + (i * 7919) % 50_000,
                department=homes[i % 4] if i % 11 else None,
                hire_date=None if i % 9 == 4 else datetime.date(2015 + i % 8, 1 + i % 12, 1 + i),
                is_active=i % 5 != 2,
                bio=BIOS[i % len(BIOS)],
                updated=None
                if i % 6 == 5
                else datetime.datetime(2024, 1 + i % 12, 1 + i, i % 24, 30, tzinfo=datetime.UTC),
            )
        )
    for e in employees:
        e.save()
    return HR(departments, employees)
