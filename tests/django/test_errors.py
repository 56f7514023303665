"""What the backend refuses, and how: SQL (raw(), extra(), cursor().execute(), RawSQL),
query features the store cannot run, misconfigured ``DATABASES`` entries, and a wrong
passphrase.

Everything refused raises ``django.db.NotSupportedError`` whose message names what to do
instead; a bad configuration is an ``ImproperlyConfigured`` at connect and a system check
error (``django_zerodb.E001``) at startup; a wrong passphrase is a
``django.db.OperationalError`` when connecting.
"""

from __future__ import annotations

import re
import warnings

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, NotSupportedError, OperationalError, connections
from django.db.models import F, Window
from django.db.models.expressions import RawSQL
from django.test.utils import override_settings

import zerodb_core.exceptions as core_errors
from django_zerodb.base import DatabaseWrapper
from django_zerodb.checks import check_databases
from django_zerodb.exceptions import translated
from django_zerodb.store import forget_engines, open_engine, store_settings
from tests.django.conftest import BOTH_STORES, db
from tests.django.testapp.models import Department, Employee


@pytest.fixture
def some(store):
    Department.objects.create(name="R&D")
    Employee.objects.create(first_name="Ada", email="ada@example.com", salary=10)


# -- SQL -----------------------------------------------------------------------------------


@db
@BOTH_STORES
class TestSQLIsRefused:
    def test_raw(self, some):
        with pytest.raises(NotSupportedError, match="use the ORM"):
            list(Employee.objects.raw("SELECT * FROM testapp_employee"))

    def test_cursor(self, alias):
        with (
            pytest.raises(NotSupportedError, match="use the ORM"),
            connections[alias].cursor() as cursor,
        ):
            cursor.execute("SELECT 1")

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"where": ["salary > 5"]},
            {"select": {"double": "salary * 2"}},
            {"tables": ["testapp_department"]},
            {"order_by": ["-salary"]},
        ],
        ids=["where", "select", "tables", "order_by"],
    )
    def test_extra(self, some, kwargs):
        with pytest.raises(NotSupportedError, match=r"extra\(.*(annotate|filter)"):
            list(Employee.objects.extra(**kwargs))

    def test_raw_sql_expression(self, some):
        with pytest.raises(NotSupportedError, match="expressions"):
            list(Employee.objects.annotate(x=RawSQL("salary * 2", ())))
        with pytest.raises(NotSupportedError, match="expressions"):
            list(Employee.objects.filter(salary__gt=RawSQL("1", ())))


# -- query features the store does not have ------------------------------------------------


def excluding_window():
    from django.db.models import Sum
    from django.db.models.expressions import RowRange, WindowFrameExclusion

    frame = RowRange(start=-1, end=1, exclusion=WindowFrameExclusion.CURRENT_ROW)
    return Window(Sum("salary"), order_by=F("salary").desc(), frame=frame)


@db
@BOTH_STORES
class TestUnsupportedQueries:
    def test_distinct_on_fields(self, some):
        with pytest.raises(NotSupportedError):
            list(Employee.objects.order_by("first_name").distinct("first_name"))

    def test_select_for_update_options(self, some, alias):
        from django.db import transaction

        for kwargs in ({"nowait": True}, {"skip_locked": True}, {"of": ("self",)}):
            with pytest.raises(NotSupportedError), transaction.atomic(using=alias):
                list(Employee.objects.select_for_update(**kwargs))

    def test_window_frame_exclusion(self, some):
        with pytest.raises(NotSupportedError):
            list(Employee.objects.annotate(n=excluding_window()))

    @pytest.mark.parametrize(
        "make",
        [
            lambda: Employee.objects.order_by("email").distinct("email"),
            lambda: Employee.objects.extra(where=["1"]),
            lambda: Employee.objects.raw("SELECT 1"),
        ],
        ids=["distinct on", "extra", "raw"],
    )
    def test_message_names_an_alternative(self, some, make):
        with pytest.raises(NotSupportedError) as caught:
            list(make())
        # "<what> is not supported by the encrypted database ...: <what to do instead>"
        assert re.search(r"encrypted database.*: \w+", str(caught.value)), caught.value

    def test_order_by_random_works(self, some):
        assert len(Employee.objects.order_by("?")) == 1


# -- configuration -------------------------------------------------------------------------

GOOD = {
    "ENGINE": "django_zerodb",
    "NAME": "cfg",
    "OPTIONS": {"STORE": "memory://", "PASSPHRASE": "p", "KDF": "fast"},
}


def entry(**options):
    opts = {**GOOD["OPTIONS"], **options}
    return {**GOOD, "OPTIONS": {k: v for k, v in opts.items() if v is not None}}


BAD = {
    "missing passphrase": (entry(PASSPHRASE=None), "passphrase"),
    "unknown option": (entry(PASSWORD_FILE="x"), "unknown OPTIONS.*PASSWORD_FILE"),
    "bad store": (entry(STORE="postgres://db"), "unknown STORE"),
    "bad blob server address": (entry(STORE="zerodb://nohost"), "zerodb://host:port"),
    "missing store": (entry(STORE=None), "STORE"),
    "blob-server option on an embedded store": (entry(POOL_SIZE=8), "POOL_SIZE apply to"),
}


@pytest.mark.parametrize(("settings_dict", "message"), BAD.values(), ids=list(BAD))
def test_misconfiguration_is_improperly_configured(settings_dict, message, django_db_blocker):
    wrapper = DatabaseWrapper({**connections["encrypted"].settings_dict, **settings_dict}, "bad")
    with django_db_blocker.unblock(), pytest.raises(ImproperlyConfigured, match=message):
        wrapper.ensure_connection()


@pytest.mark.parametrize(("settings_dict", "message"), BAD.values(), ids=list(BAD))
def test_misconfiguration_is_a_system_check_error(settings_dict, message):
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3"}, "bad": settings_dict}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overriding DATABASES warns
        with override_settings(DATABASES=databases):
            errors = check_databases()
    assert [e.id for e in errors] == ["django_zerodb.E001"]
    assert "'bad'" in errors[0].obj


def test_blob_server_options_reach_the_engine():
    params = store_settings(
        entry(STORE="zerodb://127.0.0.1:8001", POOL_SIZE=8, TIMEOUT=5, TLS=True)
    )
    assert params["remote"] == {"pool_size": 8, "timeout": 5, "tls": True}


def test_merge_factor_reaches_the_engine(tmp_path):
    store = f"sqlite:///{tmp_path / 'merge.zdb'}"
    params = store_settings(entry(STORE=store, MERGE_FACTOR=8))
    assert params["merge_factor"] == 8
    try:
        assert open_engine(params).merge_factor == 8
    finally:
        forget_engines(store)


def test_good_configuration_passes_the_check():
    assert check_databases() == []
    params = store_settings(GOOD)
    assert params["store"] == "memory://" and params["database"] == "cfg"


def test_router_warning_without_the_router():
    with override_settings(DATABASE_ROUTERS=[]):
        assert [e.id for e in check_databases()] == ["django_zerodb.W001"]


def test_wrong_passphrase_is_operational_error(tmp_path, django_db_blocker):
    store = f"sqlite:///{tmp_path / 'locked.zdb'}"
    base = {**connections["encrypted"].settings_dict}

    def wrapper(passphrase):
        options = {"STORE": store, "PASSPHRASE": passphrase, "KDF": "fast"}
        return DatabaseWrapper({**base, "NAME": "locked", "OPTIONS": options}, "locked")

    with django_db_blocker.unblock():
        try:
            right = wrapper("the right one")
            right.ensure_connection()
            right.close()
            with pytest.raises(OperationalError, match="passphrase"):
                wrapper("a wrong one").ensure_connection()
            again = wrapper("the right one")
            again.ensure_connection()  # still opens with the right one
            again.close()
        finally:
            forget_engines(store)


# -- every error reaching Django is a django.db exception ----------------------------------


@db
@BOTH_STORES
def test_not_null_violation_is_djangos_integrity_error(alias):
    from django.db import transaction

    with pytest.raises(IntegrityError, match="NOT NULL"), transaction.atomic(using=alias):
        Department.objects.create(name=None)
    d = Department.objects.create(name="R&D")
    with pytest.raises(IntegrityError, match="NOT NULL"), transaction.atomic(using=alias):
        Department.objects.filter(pk=d.pk).update(name=None)
    assert Department.objects.get(pk=d.pk).name == "R&D"


@pytest.mark.parametrize(
    "engine_error",
    [
        core_errors.QuotaExceededError("over quota"),
        core_errors.CommitTooLargeError("too large"),
        core_errors.DoesNotExist("gone"),
        core_errors.ZeroDBError("anything"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_every_engine_error_is_translated(engine_error):
    from django.db import DatabaseError

    with pytest.raises(DatabaseError) as caught, translated():
        raise engine_error
    assert caught.value.__cause__ is engine_error


def test_backend_errors_are_djangos_classes():
    import django.db.utils as django_errors

    from django_zerodb import exceptions as backend

    for name in ("DataError", "OperationalError", "IntegrityError", "InternalError"):
        assert issubclass(getattr(backend, name), getattr(django_errors, name)), name
    for name in ("ProgrammingError", "NotSupportedError", "DatabaseError", "InterfaceError"):
        assert issubclass(getattr(backend, name), getattr(django_errors, name)), name


@db
@BOTH_STORES
def test_an_invalid_regex_is_a_data_error(some):
    from django.db import DataError

    with pytest.raises(DataError, match="regex"):
        list(Employee.objects.filter(first_name__regex="(unclosed"))
