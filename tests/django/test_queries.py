"""Reading through the ORM: ordering, slicing, count, exists, get, first/last,
earliest/latest, values, values_list, distinct, dates/datetimes, in_bulk.

Every test runs on both stores (memory and SQLite, see conftest.py), and every expected
value is computed in Python from the objects the ``hr`` fixture created. Ordering follows
SQLite's (Django's reference backend): NULL sorts before any value ascending, after them
descending.
"""

from __future__ import annotations

import datetime

import pytest
from django.db import connections

from tests.django.conftest import BOTH_STORES, db, transactional_db
from tests.django.testapp.models import Department, Employee

pytestmark = [db, BOTH_STORES]


def nulls_first(value):
    """Sort key of SQL ascending order with NULL smallest (SQLite)."""
    return (value is not None, value if value is not None else 0)


def pks(objects):
    return [o.pk for o in objects]


def ordered(employees, *fields):
    """Employees sorted as ``order_by(*fields)`` on SQLite (stable sorts, last key first)."""
    out = list(employees)
    for field in reversed(fields):
        desc = field.startswith("-")
        name = field.lstrip("-")
        out.sort(key=lambda e, n=name: nulls_first(getattr(e, n)), reverse=desc)
    return out


# -- count, exists -------------------------------------------------------------------------


def test_count(hr):
    assert Employee.objects.count() == len(hr.employees)
    rich = [e for e in hr.employees if e.salary is not None and e.salary > 50_000]
    assert Employee.objects.filter(salary__gt=50_000).count() == len(rich)
    assert Employee.objects.filter(salary__gt=10**9).count() == 0
    assert Employee.objects.none().count() == 0


def test_count_of_a_slice(hr):
    n = len(hr.employees)
    assert Employee.objects.all()[2:7].count() == 5
    assert Employee.objects.all()[n - 3 :].count() == 3
    assert Employee.objects.all()[n + 5 :].count() == 0


def test_exists(hr):
    assert Employee.objects.exists()
    assert Employee.objects.filter(email="person3@example.com").exists()
    assert not Employee.objects.filter(email="nobody@example.com").exists()
    assert not Employee.objects.filter(pk__in=[]).exists()


def test_len_and_bool(hr):
    assert len(Employee.objects.all()) == len(hr.employees)
    assert bool(Employee.objects.filter(first_name="Ada"))
    assert not Employee.objects.filter(first_name="Nobody")


# -- ordering ------------------------------------------------------------------------------


def test_default_ordering_is_meta_ordering(hr):
    assert pks(Employee.objects.all()) == sorted(pks(hr.employees))


@pytest.mark.parametrize(
    "fields",
    [
        ("salary", "id"),
        ("-salary", "-id"),
        ("hire_date", "id"),
        ("-hire_date", "id"),
        ("last_name", "-salary", "id"),
        ("-is_active", "first_name", "-id"),
        ("title", "updated", "id"),
    ],
)
def test_order_by(hr, fields):
    assert pks(Employee.objects.order_by(*fields)) == pks(ordered(hr.employees, *fields))


def test_order_by_filtered(hr):
    got = Employee.objects.filter(salary__gte=40_000).order_by("-salary", "id")
    rows = [e for e in hr.employees if e.salary is not None and e.salary >= 40_000]
    assert pks(got) == pks(ordered(rows, "-salary", "id"))


def test_order_by_related_field(hr):
    got = Employee.objects.order_by("department__name", "id")
    names = {d.pk: d.name for d in hr.departments.values()}
    want = sorted(hr.employees, key=lambda e: (nulls_first(names.get(e.department_id)), e.pk))
    assert pks(got) == pks(want)


def test_reverse(hr):
    got = Employee.objects.order_by("salary", "id").reverse()
    assert pks(got) == pks(ordered(hr.employees, "-salary", "-id"))


# -- slicing -------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [("salary", "id"), ("-hire_date", "id"), ("id",)])
@pytest.mark.parametrize("bounds", [(0, 5), (3, 8), (20, 40), (5, None)])
def test_slices(hr, fields, bounds):
    low, high = bounds
    got = Employee.objects.order_by(*fields)[low:high]
    assert pks(got) == pks(ordered(hr.employees, *fields)[low:high])


def test_index_and_step(hr):
    want = ordered(hr.employees, "salary", "id")
    qs = Employee.objects.order_by("salary", "id")
    assert qs[4].pk == want[4].pk
    assert pks(qs[1:12:3]) == pks(want[1:12:3])
    with pytest.raises(IndexError):
        qs[len(want)]
    with pytest.raises(ValueError):
        qs[-1]


def test_slice_of_a_filter_across_a_relation(hr):
    rnd = hr.departments["R&D"]
    got = Employee.objects.filter(department__name="R&D").order_by("-salary", "id")[1:4]
    assert pks(got) == pks(ordered(hr.by_dept("R&D"), "-salary", "id")[1:4])
    assert all(e.department_id == rnd.pk for e in got)


# -- get, first, last, earliest, latest ----------------------------------------------------


def test_get(hr):
    e = hr.employees[5]
    got = Employee.objects.get(pk=e.pk)
    assert (got.email, got.salary, got.hire_date, got.updated) == (
        e.email,
        e.salary,
        e.hire_date,
        e.updated,
    )
    assert Employee.objects.get(email=e.email).pk == e.pk
    with pytest.raises(Employee.DoesNotExist):
        Employee.objects.get(email="nobody@example.com")
    with pytest.raises(Employee.MultipleObjectsReturned):
        Employee.objects.get(first_name="Ada")


def test_values_round_trip_their_types(hr):
    e = hr.employees[1]
    got = Employee.objects.get(pk=e.pk)
    assert type(got.hire_date) is datetime.date
    assert got.updated.tzinfo is not None and got.updated == e.updated
    dept = Department.objects.get(name="Sales")
    assert dept.budget == hr.departments["Sales"].budget


def test_first_last(hr):
    asc = ordered(hr.employees, "hire_date", "id")
    qs = Employee.objects.order_by("hire_date", "id")
    assert qs.first().pk == asc[0].pk
    assert qs.last().pk == asc[-1].pk
    assert Employee.objects.first().pk == min(pks(hr.employees))
    assert Employee.objects.last().pk == max(pks(hr.employees))
    assert Employee.objects.filter(first_name="Nobody").first() is None


def test_earliest_latest(hr):
    # As on SQLite, NULL is the smallest value: earliest() can be a row without a date.
    asc = ordered(hr.employees, "hire_date", "id")
    assert Employee.objects.earliest("hire_date", "id").pk == asc[0].pk
    assert Employee.objects.latest("hire_date", "id").pk == asc[-1].pk
    dated = Employee.objects.filter(hire_date__isnull=False)
    assert dated.earliest("hire_date").hire_date == min(
        e.hire_date for e in hr.employees if e.hire_date
    )


# -- values, values_list, distinct ---------------------------------------------------------


def test_values(hr):
    got = list(Employee.objects.filter(salary__lt=45_000).values("email", "salary"))
    want = [
        {"email": e.email, "salary": e.salary}
        for e in sorted(hr.employees, key=lambda e: e.pk)
        if e.salary is not None and e.salary < 45_000
    ]
    assert got == want


def test_values_across_a_relation(hr):
    names = {d.pk: d.name for d in hr.departments.values()}
    got = list(Employee.objects.values_list("email", "department__name"))
    want = [(e.email, names.get(e.department_id)) for e in sorted(hr.employees, key=lambda e: e.pk)]
    assert got == want


def test_values_list_flat_and_named(hr):
    emails = list(Employee.objects.order_by("-email").values_list("email", flat=True))
    assert emails == sorted((e.email for e in hr.employees), reverse=True)
    row = Employee.objects.values_list("first_name", "salary", named=True).get(
        pk=hr.employees[0].pk
    )
    assert (row.first_name, row.salary) == (hr.employees[0].first_name, hr.employees[0].salary)


def test_distinct(hr):
    got = list(Employee.objects.order_by("first_name").values_list("first_name", flat=True))
    assert got == sorted(e.first_name for e in hr.employees)
    distinct = Employee.objects.order_by("first_name").values_list("first_name", flat=True)
    assert list(distinct.distinct()) == sorted({e.first_name for e in hr.employees})
    assert distinct.distinct().count() == len({e.first_name for e in hr.employees})
    pairs = Employee.objects.values("first_name", "is_active").order_by().distinct()
    assert len(pairs) == len({(e.first_name, e.is_active) for e in hr.employees})
    # Meta.ordering (id) is selected too by SELECT DISTINCT, as Django's SQL does: rows
    # that differ only in it stay apart.
    ordered = Employee.objects.values("first_name", "is_active").distinct()
    assert len(ordered) == len(hr.employees)


def test_only_and_defer(hr):
    e = hr.employees[7]
    got = Employee.objects.only("email").get(pk=e.pk)
    assert got.get_deferred_fields() >= {"salary", "bio"}
    assert got.salary == e.salary  # loaded on access
    got = Employee.objects.defer("bio").get(pk=e.pk)
    assert got.bio == e.bio


# -- dates, datetimes, in_bulk -------------------------------------------------------------


def test_dates(hr):
    days = [e.hire_date for e in hr.employees if e.hire_date]
    years = sorted({d.replace(month=1, day=1) for d in days})
    months = sorted({d.replace(day=1) for d in days})
    assert list(Employee.objects.dates("hire_date", "year")) == years
    assert list(Employee.objects.dates("hire_date", "month", order="DESC")) == months[::-1]
    rnd = [e.hire_date.replace(day=1) for e in hr.by_dept("R&D") if e.hire_date]
    got = Employee.objects.filter(department__name="R&D").dates("hire_date", "month")
    assert list(got) == sorted(set(rnd))


def test_datetimes(hr):
    stamps = [e.updated for e in hr.employees if e.updated]
    months = sorted({s.replace(day=1, hour=0, minute=0) for s in stamps})
    assert list(Employee.objects.datetimes("updated", "month")) == months
    hours = sorted({s.replace(minute=0) for s in stamps})
    assert list(Employee.objects.datetimes("updated", "hour")) == hours


def test_in_bulk(hr):
    chosen = hr.employees[2:9]
    got = Employee.objects.in_bulk([e.pk for e in chosen])
    assert {pk: o.email for pk, o in got.items()} == {e.pk: e.email for e in chosen}
    by_email = Department.objects.in_bulk(["R&D", "Sales", "nope"], field_name="name")
    assert {k: v.pk for k, v in by_email.items()} == {
        "R&D": hr.departments["R&D"].pk,
        "Sales": hr.departments["Sales"].pk,
    }
    assert Employee.objects.in_bulk([]) == {}
    assert len(Employee.objects.in_bulk()) == len(hr.employees)


def test_iterator(hr):
    got = [e.pk for e in Employee.objects.order_by("-id").iterator(chunk_size=5)]
    assert got == sorted(pks(hr.employees), reverse=True)


# -- round trips and the plan --------------------------------------------------------------


def test_get_by_pk_takes_few_round_trips(hr, alias):
    connection = connections[alias]
    e = hr.employees[3]
    Employee.objects.get(pk=e.pk)  # warm: the nodes on the path are cached
    before = connection.round_trips()
    for _ in range(5):
        assert Employee.objects.get(pk=e.pk).email == e.email
    assert connection.round_trips() - before <= 5


def test_queries_are_logged_with_their_plan(hr, alias, django_assert_num_queries):
    with django_assert_num_queries(1, using=alias) as captured:
        list(Employee.objects.filter(salary__gt=40_000))
    entry = captured.captured_queries[0]
    assert "salary" in entry["sql"]
    assert isinstance(entry["round_trips"], int) and entry["round_trips"] >= 0
    assert "salary" in str(Employee.objects.filter(salary__gt=1).query)
    assert "rows:" in Employee.objects.filter(salary__gt=1).explain()


def test_runs_on_the_chosen_store(hr, store, alias):
    assert alias == store
    assert Employee.objects.all().db == alias
    assert hr.employees[0]._state.db == alias
    test_store = connections[alias].settings_dict["OPTIONS"]["STORE"]
    assert test_store.startswith("sqlite:///" if alias.endswith("sqlite") else "memory://")


def test_explicit_null_placement(hr):
    from django.db.models import F

    def placed(nulls_last, desc):
        present = [e for e in hr.employees if e.salary is not None]
        present.sort(key=lambda e: (-e.salary if desc else e.salary, e.pk))
        missing = sorted((e for e in hr.employees if e.salary is None), key=lambda e: e.pk)
        return present + missing if nulls_last else missing + present

    got = Employee.objects.order_by(F("salary").desc(nulls_last=True), "id")
    assert pks(got) == pks(placed(nulls_last=True, desc=True))
    got = Employee.objects.order_by(F("salary").asc(nulls_last=True), "id")
    assert pks(got) == pks(placed(nulls_last=True, desc=False))
    got = Employee.objects.order_by(F("salary").desc(nulls_first=True), "id")
    assert pks(got) == pks(placed(nulls_last=False, desc=True))


@transactional_db
def test_round_trips_in_autocommit(alias):
    """Outside a transaction every statement reads the current root (one round trip) and
    finds the rest of a warm path in the cache."""
    connection = connections[alias]
    d = Department.objects.create(name="RT")
    made = Employee.objects.bulk_create(
        [Employee(first_name="a", email=f"rt{i}@x", salary=i, department=d) for i in range(300)]
    )
    target = made[150]

    def trips(fn):
        before = connection.round_trips()
        fn()
        return connection.round_trips() - before

    trips(lambda: Employee.objects.get(pk=target.pk))  # warm the path
    assert trips(lambda: Employee.objects.get(pk=target.pk)) <= 2
    assert trips(lambda: Employee.objects.filter(salary__gt=100).count()) <= 2
    page = Employee.objects.filter(salary__gt=100).select_related("department")[:10]
    assert trips(lambda: list(page)) <= 3
    assert trips(lambda: Employee.objects.filter(pk=target.pk).update(salary=5)) <= 3


def test_distinct_on_fields(hr):
    """distinct(*fields): the first row, in the ordering, of each set of equal fields."""
    got = list(
        Employee.objects.order_by("is_active", "-salary", "pk")
        .distinct("is_active")
        .values_list("is_active", "salary", "pk")
    )
    ordered = sorted(
        hr.employees, key=lambda e: (e.is_active, -(e.salary if e.salary is not None else -1), e.pk)
    )
    first: dict = {}
    for e in ordered:
        first.setdefault(e.is_active, (e.is_active, e.salary, e.pk))
    assert got == list(first.values())


def test_running_a_query_leaves_its_alias_references_as_they_were(hr):
    """Planning joins the tables of the ordering into the query, as Django's SQL compiler
    does; like it, the backend puts the reference counts back afterwards, so the query
    can still be combined (``&``) without its ordering's joins becoming part of it."""
    query = Employee.objects.filter(salary__gt=0).order_by("department__name")
    before = {alias: n for alias, n in query.query.alias_refcount.items() if n}
    list(query)
    query.exists()
    str(query.query)
    assert {alias: n for alias, n in query.query.alias_refcount.items() if n} == before
    combined = (Employee.objects.order_by("last_name") & query).query
    assert [alias for alias in combined.alias_map if combined.alias_refcount[alias]] == [
        combined.base_table
    ]
