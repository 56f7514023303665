"""Transactions: atomic() commit and rollback, nested savepoints, on_commit, isolation
between connections, concurrent increments and select_for_update().

These tests need real commits, so they use pytest-django's ``transaction=True`` (each
test ends by emptying the tables) and run on both stores. "Another connection" is another
thread: Django's connections are per thread, and each one keeps its own transaction over
the store. On the SQLite store one test also opens a second engine on the same file (a
second client; a memory store cannot be shared by two engines). The last two tests check
the isolation of ordinary (non-transactional) pytest-django tests, which wrap each test
in a transaction that is rolled back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import pytest
from django.db import (
    IntegrityError,
    OperationalError,
    connections,
    transaction,
)
from django.db.models import F

from django_zerodb.exceptions import SerializationError
from django_zerodb.transaction import conflict_attempts, retry_on_conflict
from tests.django.conftest import BOTH_STORES, db, transactional_db
from tests.django.testapp.models import Counter, Department

pytestmark = [BOTH_STORES]


def elsewhere(fn: Callable, *args):
    """Run ``fn`` on another thread (so on another connection) and return its result."""

    def run():
        try:
            return fn(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result(timeout=60)


def count_elsewhere(model=Department, **filters):
    return elsewhere(lambda: model.objects.filter(**filters).count())


# -- atomic --------------------------------------------------------------------------------


@transactional_db
def test_autocommit_writes_are_visible_at_once(alias):
    Department.objects.create(name="A")
    assert count_elsewhere() == 1


@transactional_db
def test_atomic_commits_at_the_end(alias):
    with transaction.atomic(using=alias):
        Department.objects.create(name="A")
        Department.objects.create(name="B")
        assert Department.objects.count() == 2  # reads its own writes
        assert count_elsewhere() == 0  # not committed yet
    assert count_elsewhere() == 2


@transactional_db
def test_exception_rolls_back_everything(alias):
    keep = Department.objects.create(name="Keep", budget=1)
    with pytest.raises(ZeroDivisionError), transaction.atomic(using=alias):
        Department.objects.create(name="A")
        Department.objects.filter(pk=keep.pk).update(budget=2)
        Department.objects.filter(pk=keep.pk).delete()
        1 / 0  # noqa: B018
    assert list(Department.objects.values_list("name", "budget")) == [("Keep", 1)]
    assert count_elsewhere() == 1


@transactional_db
def test_rollback_of_deletes_and_updates(alias):
    a = Department.objects.create(name="A", budget=1)
    Department.objects.create(name="B", budget=2)
    with transaction.atomic(using=alias):
        Department.objects.filter(pk=a.pk).delete()
        Department.objects.update(budget=F("budget") * 10)
        assert Department.objects.count() == 1
        transaction.set_rollback(True, using=alias)
    assert sorted(Department.objects.values_list("name", "budget")) == [("A", 1), ("B", 2)]


@transactional_db
def test_nested_savepoints(alias):
    with transaction.atomic(using=alias):
        Department.objects.create(name="outer")
        with transaction.atomic(using=alias):
            Department.objects.create(name="kept")
        with pytest.raises(ValueError), transaction.atomic(using=alias):
            Department.objects.create(name="dropped")
            with transaction.atomic(using=alias):
                Department.objects.create(name="dropped too")
            raise ValueError
        with transaction.atomic(using=alias):
            Department.objects.create(name="inner")
            with pytest.raises(ValueError), transaction.atomic(using=alias):
                Department.objects.filter(name="outer").update(budget=5)
                raise ValueError
        assert sorted(Department.objects.values_list("name", flat=True)) == [
            "inner",
            "kept",
            "outer",
        ]
    got = dict(Department.objects.values_list("name", "budget"))
    assert got == {"outer": None, "kept": None, "inner": None}


@transactional_db
def test_integrity_error_in_a_savepoint_keeps_the_transaction(alias):
    with transaction.atomic(using=alias):
        Department.objects.create(name="A")
        with pytest.raises(IntegrityError), transaction.atomic(using=alias):
            Department.objects.create(name="A")
        Department.objects.create(name="B")
    assert sorted(Department.objects.values_list("name", flat=True)) == ["A", "B"]


@transactional_db
def test_integrity_error_rolls_back_the_transaction(alias):
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Department.objects.create(name="A")
        Department.objects.create(name="A")
    assert Department.objects.count() == 0


@transactional_db
def test_repeatable_reads_inside_atomic(alias):
    Department.objects.create(name="A")
    with transaction.atomic(using=alias):
        assert Department.objects.count() == 1
        elsewhere(lambda: Department.objects.create(name="B"))
        assert Department.objects.count() == 1  # the snapshot of the first read
    assert Department.objects.count() == 2


# -- on_commit -----------------------------------------------------------------------------


@transactional_db
def test_on_commit(alias):
    ran = []
    with transaction.atomic(using=alias):
        Department.objects.create(name="A")
        transaction.on_commit(lambda: ran.append("outer"), using=alias)
        with pytest.raises(ValueError), transaction.atomic(using=alias):
            transaction.on_commit(lambda: ran.append("rolled back"), using=alias)
            raise ValueError
        with transaction.atomic(using=alias):
            transaction.on_commit(lambda: ran.append("inner"), using=alias)
        assert ran == []
    assert ran == ["outer", "inner"]
    with pytest.raises(ValueError), transaction.atomic(using=alias):
        transaction.on_commit(lambda: ran.append("never"), using=alias)
        raise ValueError
    assert ran == ["outer", "inner"]
    transaction.on_commit(lambda: ran.append("autocommit"), using=alias)
    assert ran == ["outer", "inner", "autocommit"]


# -- concurrency ---------------------------------------------------------------------------

ROUNDS = 15


@transactional_db
def test_concurrent_increments_are_not_lost(alias):
    """Two connections increment the same row; every round both transactions start on the
    same snapshot (a barrier), so one commit always meets the other's and replays."""
    counter = Counter.objects.create(name="hits")
    barrier = threading.Barrier(2, timeout=30)

    def worker():
        for _ in range(ROUNDS):
            with transaction.atomic(using=alias):
                Counter.objects.filter(pk=counter.pk).update(value=F("value") + 1)
                barrier.wait()

    def run():
        try:
            worker()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(run), pool.submit(run)]:
            future.result(timeout=120)
    counter.refresh_from_db()
    assert counter.value == 2 * ROUNDS


@transactional_db
def test_concurrent_autocommit_increments(alias):
    counter = Counter.objects.create(name="hits")
    n = 20

    def run():
        try:
            for _ in range(n):
                Counter.objects.filter(pk=counter.pk).update(value=F("value") + 1)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(run), pool.submit(run)]:
            future.result(timeout=120)
    assert Counter.objects.get(pk=counter.pk).value == 2 * n


@transactional_db
def test_select_for_update_refuses_a_lost_update(alias):
    counter = Counter.objects.create(name="c", value=1)
    with pytest.raises(OperationalError), transaction.atomic(using=alias):
        mine = Counter.objects.select_for_update().get(pk=counter.pk)
        elsewhere(lambda: Counter.objects.filter(pk=counter.pk).update(value=100))
        mine.value += 1
        mine.save()
    assert Counter.objects.get(pk=counter.pk).value == 100  # the other write stands


@transactional_db
def test_select_for_update_without_interference_commits(alias):
    counter = Counter.objects.create(name="c", value=1)
    other = Counter.objects.create(name="other", value=1)
    with transaction.atomic(using=alias):
        mine = Counter.objects.select_for_update().get(pk=counter.pk)
        # A concurrent change of a row not read for update does not conflict.
        elsewhere(lambda: Counter.objects.filter(pk=other.pk).update(value=7))
        mine.value += 1
        mine.save()
    assert dict(Counter.objects.values_list("name", "value")) == {"c": 2, "other": 7}


@transactional_db
def test_select_for_update_needs_a_transaction(alias):
    from django.db.transaction import TransactionManagementError

    Counter.objects.create(name="c")
    with pytest.raises(TransactionManagementError):
        list(Counter.objects.select_for_update())


@pytest.fixture
def isolation(request, alias):
    """Connections of ``alias`` opened from now on use the isolation level
    ``request.param`` (the settings dict is shared by every thread's connection)."""
    options = connections[alias].settings_dict["OPTIONS"]
    before = options.get("ISOLATION_LEVEL")
    options["ISOLATION_LEVEL"] = request.param
    connections[alias].close()
    yield request.param
    if before is None:
        options.pop("ISOLATION_LEVEL", None)
    else:
        options["ISOLATION_LEVEL"] = before
    connections[alias].close()


LEVELS = ["read committed", "repeatable read", "serializable"]


@pytest.mark.parametrize("isolation", LEVELS, indirect=True)
@transactional_db
def test_get_and_save_at_each_level(alias, isolation):
    """A get() + save() that another connection's update overtakes: replayed over it at
    read committed (that update is lost), refused as a serialization failure above."""
    counter = Counter.objects.create(name="c", value=1)
    outcome = pytest.raises(SerializationError) if isolation != "read committed" else nullcontext()
    with outcome, transaction.atomic(using=alias):
        mine = Counter.objects.get(pk=counter.pk)
        elsewhere(lambda: Counter.objects.filter(pk=counter.pk).update(value=100))
        mine.value += 1
        mine.save()
    assert Counter.objects.get(pk=counter.pk).value == (2 if isolation == "read committed" else 100)


WRITERS = 6
SAVES = 8


@pytest.mark.parametrize("isolation", ["repeatable read"], indirect=True)
@transactional_db
def test_retry_on_conflict_counts_exactly(alias, isolation):
    """Six connections each get() + save() the same row, every save through the retry
    helper: whatever the interleaving, no increment is lost."""
    counter = Counter.objects.create(name="c", value=0)
    retries = []

    @retry_on_conflict(using=alias, retries=200)
    def increment() -> None:
        retries.append(1)
        row = Counter.objects.get(pk=counter.pk)
        row.value += 1
        row.save()

    def run():
        try:
            for _ in range(SAVES):
                increment()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(WRITERS) as pool:
        for future in [pool.submit(run) for _ in range(WRITERS)]:
            future.result(timeout=300)
    assert Counter.objects.get(pk=counter.pk).value == WRITERS * SAVES
    assert len(retries) >= WRITERS * SAVES


@pytest.mark.parametrize("isolation", ["repeatable read"], indirect=True)
@transactional_db
def test_conflict_attempts_run_a_block_again(alias, isolation):
    """The block form: the first attempt is overtaken by another connection's update,
    the second commits on the newer data."""
    counter = Counter.objects.create(name="c", value=1)
    runs = 0
    for attempt in conflict_attempts(using=alias):
        with attempt:
            runs += 1
            row = Counter.objects.get(pk=counter.pk)
            if runs == 1:
                elsewhere(lambda: Counter.objects.filter(pk=counter.pk).update(value=10))
            row.value += 1
            row.save()
    assert runs == 2
    assert Counter.objects.get(pk=counter.pk).value == 11


@pytest.mark.parametrize("isolation", ["repeatable read"], indirect=True)
@transactional_db
def test_conflict_attempts_give_up_after_their_retries(alias, isolation):
    counter = Counter.objects.create(name="c", value=1)
    runs = 0
    with pytest.raises(SerializationError):
        for attempt in conflict_attempts(using=alias, retries=2):
            with attempt:
                runs += 1
                row = Counter.objects.get(pk=counter.pk)
                elsewhere(
                    lambda: Counter.objects.filter(pk=counter.pk).update(value=F("value") + 1)
                )
                row.value = 0
                row.save()
    assert runs == 3
    assert Counter.objects.get(pk=counter.pk).value == 4  # the three updates from elsewhere


def test_unknown_isolation_levels_are_a_configuration_error():
    from django.core.exceptions import ImproperlyConfigured

    from django_zerodb.store import store_settings

    entry = {"OPTIONS": {"STORE": "memory://", "PASSPHRASE": "p", "ISOLATION_LEVEL": "snapshot"}}
    with pytest.raises(ImproperlyConfigured, match="ISOLATION_LEVEL"):
        store_settings(entry)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # memory lives in one engine
@transactional_db
def test_a_second_client_on_the_same_sqlite_file(alias):
    """Another engine (another client with its own cache and root) on the same file."""
    from django_zerodb.base import DatabaseWrapper

    settings = {**connections[alias].settings_dict}
    settings["OPTIONS"] = {**settings["OPTIONS"], "DELAY": 1e-9}  # a distinct engine
    second = DatabaseWrapper(settings, alias="second_client")
    connections["second_client"] = second
    try:
        assert second.session.engine is not connections[alias].session.engine
        counter = Counter.objects.create(name="c")
        Counter.objects.using("second_client").filter(pk=counter.pk).update(value=F("value") + 5)
        assert Counter.objects.get(pk=counter.pk).value == 5
        with transaction.atomic(using=alias):
            Counter.objects.filter(pk=counter.pk).update(value=F("value") + 1)
            Counter.objects.using("second_client").filter(pk=counter.pk).update(
                value=F("value") + 10
            )
        assert Counter.objects.using("second_client").get(pk=counter.pk).value == 16
    finally:
        second.close()
        del connections["second_client"]


# -- isolation of non-transactional tests --------------------------------------------------


@pytest.mark.xdist_group("isolation")
@db
def test_isolation_first(store):
    Department.objects.create(name="left behind?")
    assert Department.objects.filter(name="left behind?").exists()


@pytest.mark.xdist_group("isolation")
@db
def test_isolation_second(store):
    assert not Department.objects.filter(name="left behind?").exists()
