"""aggregate(), annotate() and GROUP BY (``values().annotate()``), HAVING.

Aggregates are computed by the backend in Python over the matching rows; the expected
values here are computed independently from the ``hr`` fixture's objects, with SQL's
rules: aggregates skip NULLs, ``Count`` of nothing is 0, and every other aggregate of
nothing is NULL.
"""

from __future__ import annotations

import decimal
import statistics
from collections import defaultdict

import pytest
from django.db.models import (
    Avg,
    Case,
    Count,
    F,
    IntegerField,
    Max,
    Min,
    Q,
    StdDev,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Concat, ExtractYear, Upper

from tests.django.conftest import BOTH_STORES, db
from tests.django.testapp.models import Department, Employee

pytestmark = [db, BOTH_STORES]


def salaries(employees):
    return [e.salary for e in employees if e.salary is not None]


def test_aggregate_basic(hr):
    values = salaries(hr.employees)
    got = Employee.objects.aggregate(
        n=Count("id"),
        n_salary=Count("salary"),
        total=Sum("salary"),
        mean=Avg("salary"),
        low=Min("salary"),
        high=Max("salary"),
        first_hire=Min("hire_date"),
        last_update=Max("updated"),
    )
    assert got["n"] == len(hr.employees)
    assert got["n_salary"] == len(values)
    assert got["total"] == sum(values)
    assert got["mean"] == pytest.approx(sum(values) / len(values))
    assert (got["low"], got["high"]) == (min(values), max(values))
    assert got["first_hire"] == min(e.hire_date for e in hr.employees if e.hire_date)
    assert got["last_update"] == max(e.updated for e in hr.employees if e.updated)


def test_aggregate_filtered_and_distinct(hr):
    active = [e for e in hr.employees if e.is_active]
    got = Employee.objects.filter(is_active=True).aggregate(Sum("salary"), Count("first_name"))
    assert got == {
        "salary__sum": sum(salaries(active)),
        "first_name__count": len(active),
    }
    got = Employee.objects.aggregate(
        names=Count("first_name", distinct=True),
        active=Count("id", filter=Q(is_active=True)),
        active_total=Sum("salary", filter=Q(is_active=True)),
    )
    assert got == {
        "names": len({e.first_name for e in hr.employees}),
        "active": len(active),
        "active_total": sum(salaries(active)),
    }


def test_aggregate_of_nothing(hr):
    got = Employee.objects.filter(salary__gt=10**9).aggregate(
        n=Count("id"), total=Sum("salary"), mean=Avg("salary"), high=Max("salary")
    )
    assert got == {"n": 0, "total": None, "mean": None, "high": None}
    got = Employee.objects.filter(salary__gt=10**9).aggregate(
        total=Sum("salary", default=0), high=Coalesce(Max("salary"), -1)
    )
    assert got == {"total": 0, "high": -1}


def test_aggregate_across_a_relation(hr):
    got = Department.objects.aggregate(total=Sum("employees__salary"), n=Count("employees"))
    placed = [e for e in hr.employees if e.department_id is not None]
    assert got == {"total": sum(salaries(placed)), "n": len(placed)}
    got = Employee.objects.filter(department__name="Sales").aggregate(Max("salary"))
    assert got == {"salary__max": max(salaries(hr.by_dept("Sales")))}


def test_aggregate_of_a_slice(hr):
    ordered = sorted(
        hr.employees, key=lambda e: (e.salary is not None, e.salary or 0, e.pk), reverse=True
    )
    got = Employee.objects.order_by("-salary", "-id")[:5].aggregate(Sum("salary"), Count("id"))
    assert got == {"salary__sum": sum(salaries(ordered[:5])), "id__count": 5}


def test_aggregate_of_an_annotation(hr):
    got = Employee.objects.annotate(double=F("salary") * 2).aggregate(total=Sum("double"))
    assert got == {"total": 2 * sum(salaries(hr.employees))}


def test_stddev(hr):
    values = salaries(hr.employees)
    got = Employee.objects.aggregate(pop=StdDev("salary"), sample=StdDev("salary", sample=True))
    assert got["pop"] == pytest.approx(statistics.pstdev(values))
    assert got["sample"] == pytest.approx(statistics.stdev(values))


def test_count_distinct_queryset(hr):
    qs = Employee.objects.values("first_name").distinct()
    assert qs.count() == len({e.first_name for e in hr.employees})


# -- annotate ------------------------------------------------------------------------------


def test_annotate_expressions(hr):
    qs = Employee.objects.annotate(
        full=Concat("first_name", Value(" "), "last_name"),
        raised=F("salary") + 1000,
        shout=Upper("last_name"),
        band=Case(
            When(salary__gte=60_000, then=Value(2)),
            When(salary__gte=45_000, then=Value(1)),
            default=Value(0),
            output_field=IntegerField(),
        ),
    ).order_by("id")
    expected = []
    for e in sorted(hr.employees, key=lambda e: e.pk):
        band = (
            0 if e.salary is None else 2 if e.salary >= 60_000 else 1 if e.salary >= 45_000 else 0
        )
        expected.append(
            (
                f"{e.first_name} {e.last_name}",
                None if e.salary is None else e.salary + 1000,
                e.last_name.upper(),
                band,
            )
        )
    assert [(o.full, o.raised, o.shout, o.band) for o in qs] == expected


def test_filter_and_order_on_annotation(hr):
    qs = (
        Employee.objects.annotate(raised=F("salary") * 2)
        .filter(raised__gt=100_000)
        .order_by("-raised", "id")
        .values_list("pk", "raised")
    )
    expected = sorted(
        ((e.pk, e.salary * 2) for e in hr.employees if e.salary and e.salary * 2 > 100_000),
        key=lambda t: (-t[1], t[0]),
    )
    assert list(qs) == expected


def test_annotate_count_of_a_reverse_relation(hr):
    got = dict(Department.objects.annotate(n=Count("employees")).values_list("name", "n"))
    assert got == {name: len(hr.by_dept(name)) for name in hr.departments}


def test_annotate_sum_ordered_with_null_group(hr):
    qs = Department.objects.annotate(total=Sum("employees__salary")).order_by("-total", "name")
    expected = {name: sum(salaries(hr.by_dept(name))) or None for name in hr.departments}
    # Descending puts NULL (the department without employees) last, as on SQLite.
    want = sorted(expected.items(), key=lambda kv: (kv[1] is None, -(kv[1] or 0), kv[0]))
    assert list(qs.values_list("name", "total")) == want


def test_annotate_with_a_filtered_aggregate(hr):
    qs = Department.objects.annotate(
        active=Count("employees", filter=Q(employees__is_active=True))
    ).values_list("name", "active")
    assert dict(qs) == {
        name: sum(1 for e in hr.by_dept(name) if e.is_active) for name in hr.departments
    }


# -- GROUP BY and HAVING ------------------------------------------------------------------


def group(employees, key):
    groups = defaultdict(list)
    for e in employees:
        groups[key(e)].append(e)
    return groups


def test_values_annotate_groups(hr):
    qs = (
        Employee.objects.values("first_name")
        .annotate(n=Count("id"), total=Sum("salary"), mean=Avg("salary"))
        .order_by("first_name")
    )
    expected = []
    for name, members in sorted(group(hr.employees, lambda e: e.first_name).items()):
        values = salaries(members)
        expected.append(
            {
                "first_name": name,
                "n": len(members),
                "total": sum(values) if values else None,
                "mean": sum(values) / len(values) if values else None,
            }
        )
    got = list(qs)
    assert [{**g, "mean": g["mean"] and pytest.approx(g["mean"])} for g in got] == expected


def test_group_by_a_related_field(hr):
    names = {d.pk: d.name for d in hr.departments.values()}
    qs = Employee.objects.values("department__name").annotate(n=Count("id"), top=Max("salary"))
    got = {row["department__name"]: (row["n"], row["top"]) for row in qs}
    expected = {
        names.get(k): (len(v), max(salaries(v), default=None))
        for k, v in group(hr.employees, lambda e: e.department_id).items()
    }
    assert got == expected


def test_group_by_a_transform(hr):
    qs = (
        Employee.objects.filter(hire_date__isnull=False)
        .annotate(year=ExtractYear("hire_date"))
        .values("year")
        .annotate(n=Count("id"))
        .order_by("year")
    )
    dated = [e for e in hr.employees if e.hire_date]
    expected = sorted(
        (year, len(members)) for year, members in group(dated, lambda e: e.hire_date.year).items()
    )
    assert [(r["year"], r["n"]) for r in qs] == expected


def test_group_by_two_fields(hr):
    qs = Employee.objects.values_list("is_active", "title").annotate(n=Count("id"))
    expected = {k: len(v) for k, v in group(hr.employees, lambda e: (e.is_active, e.title)).items()}
    assert {(a, t): n for a, t, n in qs} == expected


def test_having(hr):
    qs = (
        Employee.objects.values("first_name")
        .annotate(n=Count("id"))
        .filter(n__gte=3)
        .values_list("first_name", flat=True)
    )
    expected = {k for k, v in group(hr.employees, lambda e: e.first_name).items() if len(v) >= 3}
    assert set(qs) == expected
    assert expected  # the data set has such groups


def test_having_across_a_relation(hr):
    qs = Department.objects.annotate(n=Count("employees")).filter(n__gte=5)
    assert {d.name for d in qs} == {n for n in hr.departments if len(hr.by_dept(n)) >= 5}
    qs = Department.objects.annotate(top=Max("employees__salary")).filter(top__gt=70_000)
    assert {d.name for d in qs} == {
        n for n in hr.departments if max(salaries(hr.by_dept(n)), default=0) > 70_000
    }
    qs = Department.objects.annotate(n=Count("employees")).exclude(n=0)
    assert {d.name for d in qs} == {n for n in hr.departments if hr.by_dept(n)}


def test_having_and_where_together(hr):
    qs = (
        Department.objects.filter(employees__is_active=True)
        .annotate(total=Sum("employees__salary"))
        .filter(total__gt=100_000)
        .values_list("name", "total")
    )
    expected = {}
    for name in hr.departments:
        total = sum(salaries(e for e in hr.by_dept(name) if e.is_active))
        if total > 100_000:
            expected[name] = total
    assert dict(qs) == expected


def test_aggregate_over_grouped_annotation(hr):
    got = (
        Department.objects.annotate(n=Count("employees"))
        .filter(n__gt=0)
        .aggregate(most=Max("n"), groups=Count("id"))
    )
    sizes = [len(hr.by_dept(n)) for n in hr.departments if hr.by_dept(n)]
    assert got == {"most": max(sizes), "groups": len(sizes)}


def test_decimal_sum(hr):
    got = Department.objects.aggregate(Sum("budget"), Avg("budget"))
    budgets = [d.budget for d in hr.departments.values() if d.budget is not None]
    assert got["budget__sum"] == sum(budgets, decimal.Decimal(0))
    assert got["budget__avg"] == pytest.approx(sum(budgets) / len(budgets))


def test_annotate_a_duration(hr):
    import datetime

    qs = Employee.objects.annotate(tenure=F("updated__date") - F("hire_date"))
    expected = {
        e.pk: None if e.updated is None or e.hire_date is None else e.updated.date() - e.hire_date
        for e in hr.employees
    }
    assert dict(qs.values_list("pk", "tenure")) == expected
    year = datetime.timedelta(days=365)
    assert sorted(qs.filter(tenure__gt=year).values_list("pk", flat=True)) == sorted(
        pk for pk, t in expected.items() if t is not None and t > year
    )


def test_annotate_an_uncorrelated_subquery(hr):
    from django.db.models import Subquery

    top = Employee.objects.order_by("-salary").values("salary")[:1]
    highest = max(salaries(hr.employees))
    got = Department.objects.annotate(top=Subquery(top)).values_list("name", "top")
    assert dict(got) == dict.fromkeys(hr.departments, highest)
    assert list(Employee.objects.filter(salary=Subquery(top)).values_list("salary", flat=True)) == [
        highest
    ]
