"""Field lookups, transforms, Q objects, exclude() and F() in filters.

Expected rows are computed in Python from the ``hr`` fixture's objects with SQL's
three-valued logic written out (a comparison with NULL is unknown, and a row passes a
WHERE only when it is true). What Django means by a negation is what it compiles on
SQLite: ``exclude(salary__gt=5)`` and ``filter(~Q(salary__gt=5))`` are the same query,
``WHERE NOT (salary > 5 AND salary IS NOT NULL)``, so both *keep* NULL salaries, while
``filter(salary__lte=5)`` drops them. Pattern lookups follow Django's documented meaning
(``contains`` is case-sensitive, ``%`` and ``_`` are literal), which SQLite's LIKE only
approximates.
"""

from __future__ import annotations

import datetime
import re

import django
import pytest
from django.db.models import F, Q
from django.db.models.functions import Lower

from tests.django.conftest import BOTH_STORES, db
from tests.django.testapp.models import Department, Employee

pytestmark = [db, BOTH_STORES]


def got(qs):
    return sorted(qs.values_list("pk", flat=True))


def want(hr, predicate):
    """pks of the employees for which ``predicate`` is True (None counts as unknown)."""
    return sorted(e.pk for e in hr.employees if predicate(e) is True)


def gt(a, b):
    return None if a is None or b is None else a > b


def not3(v):
    return None if v is None else not v


@pytest.mark.parametrize(
    ("lookup", "predicate"),
    [
        ({"first_name": "Ada"}, lambda e: e.first_name == "Ada"),
        ({"first_name__iexact": "aDA"}, lambda e: e.first_name.lower() == "ada"),
        ({"first_name__in": ["Ada", "Ken", "Nobody"]}, lambda e: e.first_name in ("Ada", "Ken")),
        ({"salary__gt": 50_000}, lambda e: gt(e.salary, 50_000)),
        ({"salary__gte": 54_757}, lambda e: None if e.salary is None else e.salary >= 54_757),
        ({"salary__lt": 40_000}, lambda e: None if e.salary is None else e.salary < 40_000),
        ({"salary__lte": 62_076}, lambda e: None if e.salary is None else e.salary <= 62_076),
        (
            {"salary__range": (40_000, 60_000)},
            lambda e: None if e.salary is None else 40_000 <= e.salary <= 60_000,
        ),
        ({"salary__isnull": True}, lambda e: e.salary is None),
        ({"salary__isnull": False}, lambda e: e.salary is not None),
        ({"department__isnull": True}, lambda e: e.department_id is None),
        ({"first_name__startswith": "Al"}, lambda e: e.first_name.startswith("Al")),
        ({"first_name__startswith": "al"}, lambda e: e.first_name.startswith("al")),
        ({"first_name__istartswith": "al"}, lambda e: e.first_name.lower().startswith("al")),
        ({"last_name__endswith": "er"}, lambda e: e.last_name.endswith("er")),
        ({"last_name__iendswith": "ER"}, lambda e: e.last_name.lower().endswith("er")),
        ({"bio__contains": "panic"}, lambda e: "panic" in e.bio),
        ({"bio__contains": "Kernel"}, lambda e: "Kernel" in e.bio),
        ({"bio__icontains": "KERNEL"}, lambda e: "kernel" in e.bio.lower()),
        ({"email__contains": "_"}, lambda e: "_" in e.email),  # literal, not a wildcard
        ({"email__contains": "%"}, lambda e: "%" in e.email),
        ({"title__exact": ""}, lambda e: e.title == ""),
        ({"last_name__regex": r"^[HT]o"}, lambda e: re.search(r"^[HT]o", e.last_name) is not None),
        (
            {"last_name__iregex": r"^[ht]O"},
            lambda e: re.search(r"(?i)^[ht]O", e.last_name) is not None,
        ),
        ({"is_active": False}, lambda e: not e.is_active),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "",
)
def test_lookup(hr, lookup, predicate):
    assert got(Employee.objects.filter(**lookup)) == want(hr, predicate)


def test_in_with_none_and_empty(hr):
    some = hr.employees[0].salary
    assert got(Employee.objects.filter(salary__in=[some, None])) == want(
        hr, lambda e: e.salary == some
    )
    assert got(Employee.objects.filter(salary__in=[])) == []
    # Django 6.1: NOT (salary IN (x) OR salary IS NULL), it adds the IS NULL for the None;
    # NOT (salary IS NULL) for [None]. Before: NOT (salary IN (x) AND salary IS NOT NULL)
    # and no condition at all, which keep the NULLs.
    assert any(e.salary is None for e in hr.employees)
    if django.VERSION >= (6, 1):
        kept = want(hr, lambda e: e.salary is not None and e.salary != some)
        kept_without_none = want(hr, lambda e: e.salary is not None)
    else:
        kept = want(hr, lambda e: e.salary != some)
        kept_without_none = want(hr, lambda e: True)
    assert got(Employee.objects.exclude(salary__in=[some, None])) == kept
    assert got(Employee.objects.filter(salary__in=[None])) == []
    assert got(Employee.objects.exclude(salary__in=[None])) == kept_without_none
    # IN () is False even for NULL, so its negation keeps every row.
    assert got(Employee.objects.exclude(salary__in=[])) == want(hr, lambda e: True)


def test_not_in_a_subquery_with_null(hr):
    # SQL's trap, kept: NOT IN (..., NULL) is never True, since some department_id is NULL.
    assert any(e.department_id is None for e in hr.employees)
    assert list(Department.objects.exclude(pk__in=Employee.objects.values("department"))) == []
    assigned = Employee.objects.filter(department__isnull=False).values("department")
    unassigned = sorted(name for name in hr.departments if not hr.by_dept(name))
    got_names = Department.objects.exclude(pk__in=assigned).values_list("name", flat=True)
    assert sorted(got_names) == unassigned


def test_in_subquery(hr):
    big = Department.objects.filter(budget__gt=100_000)
    expected_depts = {d.pk for d in hr.departments.values() if d.budget and d.budget > 100_000}
    assert got(Employee.objects.filter(department__in=big)) == want(
        hr, lambda e: e.department_id in expected_depts
    )
    rich = Employee.objects.filter(salary__gt=60_000).values("department")
    rich_depts = {e.department_id for e in hr.employees if e.salary and e.salary > 60_000} - {None}
    assert sorted(Department.objects.filter(pk__in=rich).values_list("pk", flat=True)) == sorted(
        rich_depts
    )


def test_date_lookups(hr):
    day = hr.employees[6].hire_date
    assert got(Employee.objects.filter(hire_date=day)) == want(hr, lambda e: e.hire_date == day)
    assert got(Employee.objects.filter(hire_date__gt=day)) == want(
        hr, lambda e: gt(e.hire_date, day)
    )
    low, high = datetime.date(2017, 1, 1), datetime.date(2019, 12, 31)
    assert got(Employee.objects.filter(hire_date__range=(low, high))) == want(
        hr, lambda e: e.hire_date and low <= e.hire_date <= high
    )


@pytest.mark.parametrize(
    ("lookup", "predicate"),
    [
        ({"hire_date__year": 2016}, lambda d: d.year == 2016),
        ({"hire_date__year__gte": 2019}, lambda d: d.year >= 2019),
        ({"hire_date__month": 3}, lambda d: d.month == 3),
        ({"hire_date__month__in": [1, 2, 12]}, lambda d: d.month in (1, 2, 12)),
        ({"hire_date__day__lt": 10}, lambda d: d.day < 10),
        ({"hire_date__quarter": 2}, lambda d: (d.month - 1) // 3 + 1 == 2),
        ({"hire_date__week_day": 2}, lambda d: d.isoweekday() % 7 + 1 == 2),
        ({"hire_date__iso_week_day": 5}, lambda d: d.isoweekday() == 5),
        ({"hire_date__week": 10}, lambda d: d.isocalendar()[1] == 10),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_date_transforms(hr, lookup, predicate):
    assert got(Employee.objects.filter(**lookup)) == want(
        hr, lambda e: None if e.hire_date is None else predicate(e.hire_date)
    )


@pytest.mark.parametrize(
    ("lookup", "predicate"),
    [
        ({"updated__year": 2024}, lambda t: t.year == 2024),
        ({"updated__month": 5}, lambda t: t.month == 5),
        ({"updated__day__gt": 15}, lambda t: t.day > 15),
        ({"updated__hour__lt": 6}, lambda t: t.hour < 6),
        (
            {"updated__date": datetime.date(2024, 3, 3)},
            lambda t: t.date() == datetime.date(2024, 3, 3),
        ),
        (
            {"updated__date__gte": datetime.date(2024, 6, 1)},
            lambda t: t.date() >= datetime.date(2024, 6, 1),
        ),
        (
            {"updated__gt": datetime.datetime(2024, 7, 1, tzinfo=datetime.UTC)},
            lambda t: t > datetime.datetime(2024, 7, 1, tzinfo=datetime.UTC),
        ),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_datetime_transforms(hr, lookup, predicate):
    assert got(Employee.objects.filter(**lookup)) == want(
        hr, lambda e: None if e.updated is None else predicate(e.updated)
    )


def test_datetime_transform_in_another_time_zone(hr):
    # TIME_ZONE is UTC; the current time zone decides what __hour and __date mean.
    from zoneinfo import ZoneInfo

    from django.utils import timezone

    tokyo = ZoneInfo("Asia/Tokyo")
    with timezone.override(tokyo):
        result = got(Employee.objects.filter(updated__hour=9))
    assert result == want(
        hr, lambda e: None if e.updated is None else e.updated.astimezone(tokyo).hour == 9
    )


# -- Q objects, exclude and NULL -----------------------------------------------------------


def test_q_and_or_not(hr):
    q = Q(salary__lt=40_000) | Q(first_name="Grace")
    assert got(Employee.objects.filter(q)) == want(
        hr, lambda e: (e.salary is not None and e.salary < 40_000) or e.first_name == "Grace"
    )
    q = Q(is_active=True) & (Q(title="Manager") | Q(department__isnull=True))
    assert got(Employee.objects.filter(q)) == want(
        hr, lambda e: e.is_active and (e.title == "Manager" or e.department_id is None)
    )
    q = ~Q(first_name="Ada") & ~Q(first_name="Ken")
    assert got(Employee.objects.filter(q)) == want(hr, lambda e: e.first_name not in ("Ada", "Ken"))
    q = Q(first_name="Ada") ^ Q(is_active=True)
    assert got(Employee.objects.filter(q)) == want(
        hr, lambda e: (e.first_name == "Ada") != e.is_active
    )


def test_exclude_keeps_null(hr):
    keeps_null = want(hr, lambda e: not3(gt(e.salary, 50_000)) or e.salary is None)
    assert got(Employee.objects.exclude(salary__gt=50_000)) == keeps_null
    # Django compiles ~Q inside filter() exactly like exclude().
    assert got(Employee.objects.filter(~Q(salary__gt=50_000))) == keeps_null
    assert any(e.salary is None for e in Employee.objects.exclude(salary__gt=50_000))
    # A plain comparison does not: NULL <= 50000 is unknown.
    assert got(Employee.objects.filter(salary__lte=50_000)) == want(
        hr, lambda e: not3(gt(e.salary, 50_000))
    )


def test_exclude_multiple_conditions_is_not_of_and(hr):
    result = got(Employee.objects.exclude(salary__gt=50_000, hire_date__year=2016))
    assert result == want(
        hr,
        lambda e: (
            not (
                e.salary is not None
                and e.salary > 50_000
                and e.hire_date is not None
                and e.hire_date.year == 2016
            )
        ),
    )
    chained = got(Employee.objects.exclude(salary__gt=50_000).exclude(first_name="Ada"))
    assert chained == want(
        hr, lambda e: not (e.salary is not None and e.salary > 50_000) and e.first_name != "Ada"
    )


def test_exclude_across_a_nullable_relation(hr):
    rnd = hr.departments["R&D"].pk
    # Employees without a department are kept (LEFT JOIN, NULL name).
    assert got(Employee.objects.exclude(department__name="R&D")) == want(
        hr, lambda e: e.department_id != rnd
    )
    assert got(Employee.objects.filter(~Q(department__name="R&D"))) == want(
        hr, lambda e: e.department_id != rnd
    )


def test_exclude_isnull(hr):
    assert got(Employee.objects.exclude(department__isnull=True)) == want(
        hr, lambda e: e.department_id is not None
    )
    assert got(Employee.objects.exclude(hire_date__isnull=False)) == want(
        hr, lambda e: e.hire_date is None
    )


def test_exclude_pattern_and_in(hr):
    assert got(Employee.objects.exclude(title__startswith="E")) == want(
        hr, lambda e: not e.title.startswith("E")
    )
    assert got(Employee.objects.exclude(first_name__in=["Ada", "Alan"])) == want(
        hr, lambda e: e.first_name not in ("Ada", "Alan")
    )


def test_negated_or_with_nulls(hr):
    q = ~(Q(salary__gt=50_000) | Q(hire_date__year=2016))
    result = got(Employee.objects.filter(q))

    def expected(e):
        high = e.salary is not None and e.salary > 50_000
        year = e.hire_date is not None and e.hire_date.year == 2016
        return not (high or year)

    assert result == want(hr, expected)


# -- F() -----------------------------------------------------------------------------------


def test_f_in_filters(hr):
    assert got(Employee.objects.filter(salary__gt=F("id") * 2_000)) == want(
        hr, lambda e: gt(e.salary, e.pk * 2_000)
    )
    assert got(Employee.objects.filter(hire_date__lt=F("updated__date"))) == want(
        hr,
        lambda e: (
            None if e.hire_date is None or e.updated is None else e.hire_date < e.updated.date()
        ),
    )
    budgets = {d.pk: d.budget for d in hr.departments.values()}
    assert got(Employee.objects.filter(salary__lt=F("department__budget") / 5)) == want(
        hr,
        lambda e: (
            None
            if e.salary is None or budgets.get(e.department_id) is None
            else e.salary < budgets[e.department_id] / 5
        ),
    )
    assert got(Employee.objects.exclude(salary=F("salary"))) == want(hr, lambda e: e.salary is None)


def test_function_in_filter(hr):
    assert got(Employee.objects.annotate(low=Lower("last_name")).filter(low="hopper")) == want(
        hr, lambda e: e.last_name.lower() == "hopper"
    )


# -- full-text search ----------------------------------------------------------------------


def words(text):
    return re.findall(r"[^\W_]+", text.casefold())


@pytest.mark.parametrize("text", ["kernel panic", "panic", "compilers debuggers", "nothing here"])
def test_search_lookup(hr, text):
    wanted = words(text)
    assert got(Employee.objects.filter(bio__search=text)) == want(
        hr, lambda e: all(w in words(e.bio) for w in wanted)
    )


def test_search_phrase_and_manager(hr):
    assert got(Employee.objects.filter(bio__search='"panic at"')) == want(
        hr, lambda e: "panic at" in " ".join(words(e.bio))
    )
    ranked = list(Employee.objects.search("kernel panic"))
    assert sorted(e.pk for e in ranked) == want(
        hr, lambda e: {"kernel", "panic"} <= set(words(e.bio))
    )
    combined = Employee.objects.filter(bio__search="kernel", salary__gt=40_000)
    assert got(combined) == want(hr, lambda e: "kernel" in words(e.bio) and gt(e.salary, 40_000))


def test_none_and_type_coercions(hr):
    # exact=None is IS NULL; iexact=None too.
    assert got(Employee.objects.filter(salary=None)) == want(hr, lambda e: e.salary is None)
    assert got(Employee.objects.filter(title__iexact=None)) == []
    # A pattern on a number compares its text, as SQL does.
    assert got(Employee.objects.filter(salary__startswith=3)) == want(
        hr, lambda e: None if e.salary is None else str(e.salary).startswith("3")
    )
    budgets = {d.pk: d.budget for d in hr.departments.values()}
    some = next(b for b in budgets.values() if b is not None)
    assert sorted(Department.objects.filter(budget=int(some)).values_list("pk", flat=True)) == (
        sorted(pk for pk, b in budgets.items() if b is not None and b == int(some))
    )
