"""Relations: ForeignKey (forward and reverse), OneToOne, ManyToMany, select_related,
prefetch_related, and filters that cross relations in both directions.

Runs on both stores. Expectations come from the ``hr`` fixture's objects. Filters across
a multi-valued relation follow Django's rules on SQL: ``Department.objects.filter(
employees__salary__gt=x)`` is a join, so a department appears once per matching
employee (``distinct()`` removes the repeats); conditions inside one ``filter()`` call
must hold for the same employee, conditions in chained calls may hold for different ones.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import Count, Exists, OuterRef, Prefetch, Q

from tests.django.conftest import BOTH_STORES, db
from tests.django.testapp.models import (
    Assignment,
    Badge,
    Department,
    Employee,
    Project,
    Tag,
)

pytestmark = [db, BOTH_STORES]


def names(qs):
    return sorted(d.name for d in qs)


# -- ForeignKey ----------------------------------------------------------------------------


def test_forward_access(hr):
    for e in hr.employees[:8]:
        got = Employee.objects.get(pk=e.pk)
        if e.department_id is None:
            assert got.department is None
        else:
            assert got.department.name == e.department.name


def test_reverse_manager(hr):
    for name, d in hr.departments.items():
        fresh = Department.objects.get(pk=d.pk)
        members = hr.by_dept(name)
        assert fresh.employees.count() == len(members)
        assert sorted(fresh.employees.values_list("pk", flat=True)) == sorted(e.pk for e in members)
        assert fresh.employees.filter(is_active=True).count() == sum(e.is_active for e in members)


def test_reverse_manager_writes(hr):
    empty = hr.departments["Empty"]
    new = empty.employees.create(first_name="Nia", email="nia@example.com")
    assert new.department_id == empty.pk
    homeless = [e for e in hr.employees if e.department_id is None]
    empty.employees.add(*homeless)
    assert empty.employees.count() == 1 + len(homeless)
    empty.employees.remove(homeless[0])  # nullable FK: remove() sets NULL
    assert Employee.objects.get(pk=homeless[0].pk).department_id is None
    empty.employees.clear()
    assert empty.employees.count() == 0
    assert Employee.objects.filter(pk=new.pk, department__isnull=True).exists()


def test_filter_forward(hr):
    rnd = hr.by_dept("R&D")
    got = Employee.objects.filter(department__name="R&D")
    assert sorted(e.pk for e in got) == sorted(e.pk for e in rnd)
    budgets = {d.pk: d.budget for d in hr.departments.values()}
    got = Employee.objects.filter(department__budget__gt=100_000, salary__isnull=False)
    assert sorted(e.pk for e in got) == sorted(
        e.pk
        for e in hr.employees
        if budgets.get(e.department_id) and budgets[e.department_id] > 100_000 and e.salary
    )
    got = Employee.objects.filter(department__name__in=["Sales", "Support"])
    assert len(got) == len(hr.by_dept("Sales")) + len(hr.by_dept("Support"))
    got = Employee.objects.filter(Q(department__name="Sales") | Q(department__isnull=True))
    assert sorted(e.pk for e in got) == sorted(
        e.pk for e in hr.employees if e.department_id in (None, hr.departments["Sales"].pk)
    )


def test_filter_by_instance_and_pk(hr):
    sales = hr.departments["Sales"]
    assert Employee.objects.filter(department=sales).count() == len(hr.by_dept("Sales"))
    assert Employee.objects.filter(department_id=sales.pk).count() == len(hr.by_dept("Sales"))
    assert Employee.objects.filter(department__pk=sales.pk).count() == len(hr.by_dept("Sales"))


def test_filter_reverse_repeats_per_match(hr):
    threshold = 60_000
    matches = [e for e in hr.employees if e.department_id and e.salary and e.salary > threshold]
    got = Department.objects.filter(employees__salary__gt=threshold)
    expected = Counter(e.department.name for e in matches)
    assert Counter(d.name for d in got) == expected
    assert names(got.distinct()) == sorted(expected)
    assert got.distinct().count() == len(expected)


def test_filter_reverse_same_or_different_employee(hr):
    def depts(pred):
        return {e.department.name for e in hr.employees if e.department_id and pred(e)}

    high = lambda e: e.salary is not None and e.salary > 50_000  # noqa: E731
    inactive = lambda e: not e.is_active  # noqa: E731
    same = Department.objects.filter(employees__salary__gt=50_000, employees__is_active=False)
    assert set(names(same)) == depts(lambda e: high(e) and inactive(e))
    chained = Department.objects.filter(employees__salary__gt=50_000).filter(
        employees__is_active=False
    )
    assert set(names(chained)) == depts(high) & depts(inactive)


def test_exclude_reverse(hr):
    threshold = 60_000
    having = {e.department_id for e in hr.employees if e.salary and e.salary > threshold}
    got = Department.objects.exclude(employees__salary__gt=threshold)
    assert names(got) == sorted(n for n, d in hr.departments.items() if d.pk not in having)


def test_reverse_isnull(hr):
    assert names(Department.objects.filter(employees__isnull=True)) == sorted(
        n for n in hr.departments if not hr.by_dept(n)
    )
    assert names(Department.objects.filter(employees__isnull=False).distinct()) == sorted(
        n for n in hr.departments if hr.by_dept(n)
    )


def test_exists_subquery(hr):
    threshold = 60_000
    rich = Employee.objects.filter(department=OuterRef("pk"), salary__gt=threshold)
    having = {e.department_id for e in hr.employees if e.salary and e.salary > threshold}
    got = Department.objects.filter(Exists(rich))
    assert names(got) == sorted(n for n, d in hr.departments.items() if d.pk in having)
    got = Department.objects.filter(~Exists(rich))
    assert names(got) == sorted(n for n, d in hr.departments.items() if d.pk not in having)


# -- select_related, prefetch_related ------------------------------------------------------


def test_select_related_is_one_query(hr, alias, django_assert_num_queries):
    with django_assert_num_queries(1, using=alias):
        got = {
            e.pk: e.department and e.department.name
            for e in Employee.objects.select_related("department")
        }
    assert got == {e.pk: e.department and e.department.name for e in hr.employees}


def test_select_related_two_levels(hr, alias, django_assert_num_queries):
    sales, rnd = hr.departments["Sales"], hr.departments["R&D"]
    p = Project.objects.create(code="S", year=2024, department=sales, lead=hr.by_dept("R&D")[0])
    Project.objects.create(code="R", year=2024, department=rnd)
    for e in hr.by_dept("Support")[:3]:
        Assignment.objects.create(employee=e, project=p, role="dev")
    with django_assert_num_queries(1, using=alias):
        rows = [
            (a.employee.email, a.project.code, a.project.department.name, a.project.lead.email)
            for a in Assignment.objects.select_related(
                "employee", "project__department", "project__lead"
            ).order_by("employee__email")
        ]
    lead = hr.by_dept("R&D")[0].email
    assert rows == sorted((e.email, "S", "Sales", lead) for e in hr.by_dept("Support")[:3])
    with django_assert_num_queries(1, using=alias):
        leads = {p.code: p.lead for p in Project.objects.select_related("lead")}
    assert leads["R"] is None and leads["S"].email == lead


def test_prefetch_related(hr, alias, django_assert_num_queries):
    with django_assert_num_queries(2, using=alias):
        got = {
            d.name: sorted(e.pk for e in d.employees.all())
            for d in Department.objects.prefetch_related("employees")
        }
    assert got == {n: sorted(e.pk for e in hr.by_dept(n)) for n in hr.departments}


def test_prefetch_with_a_queryset(hr, alias, django_assert_num_queries):
    active = Employee.objects.filter(is_active=True).order_by("-salary", "id")
    with django_assert_num_queries(2, using=alias):
        got = {
            d.name: [e.pk for e in d.active]
            for d in Department.objects.prefetch_related(
                Prefetch("employees", queryset=active, to_attr="active")
            )
        }
    for name in hr.departments:
        members = [e for e in hr.by_dept(name) if e.is_active]
        members.sort(key=lambda e: (e.salary is None, -(e.salary or 0), e.pk))
        # NULL salaries last when descending, as on SQLite
        assert got[name] == [e.pk for e in members]


def test_prefetch_forward(hr, alias, django_assert_num_queries):
    with django_assert_num_queries(2, using=alias):
        got = {
            e.pk: e.department and e.department.name
            for e in Employee.objects.prefetch_related("department")
        }
    assert got == {e.pk: e.department and e.department.name for e in hr.employees}


# -- OneToOne ------------------------------------------------------------------------------


def test_one_to_one(hr, alias, django_assert_num_queries):
    owners = hr.employees[:3]
    for i, e in enumerate(owners):
        Badge.objects.create(employee=e, number=f"N{i}")
    assert Employee.objects.get(pk=owners[1].pk).badge.number == "N1"
    assert Badge.objects.get(number="N2").employee.email == owners[2].email
    with pytest.raises(Employee.badge.RelatedObjectDoesNotExist):
        Employee.objects.get(pk=hr.employees[5].pk).badge  # noqa: B018
    assert Employee.objects.get(badge__number="N0").pk == owners[0].pk
    assert Employee.objects.filter(badge__isnull=True).count() == len(hr.employees) - 3
    with django_assert_num_queries(1, using=alias):
        got = {
            e.pk: e.badge.number
            for e in Employee.objects.select_related("badge").filter(badge__isnull=False)
        }
    assert got == {e.pk: f"N{i}" for i, e in enumerate(owners)}


# -- ManyToMany ----------------------------------------------------------------------------


def test_many_to_many(hr):
    remote, oncall = Tag.objects.create(label="remote"), Tag.objects.create(label="oncall")
    a, b, c = hr.employees[:3]
    remote.employees.add(a, b)
    oncall.employees.add(b, c)
    remote.employees.add(a)  # already there: nothing changes
    assert sorted(remote.employees.values_list("pk", flat=True)) == sorted([a.pk, b.pk])
    assert sorted(b.tags.values_list("label", flat=True)) == ["oncall", "remote"]
    assert sorted(
        Employee.objects.filter(tags__label="oncall").values_list("pk", flat=True)
    ) == sorted([b.pk, c.pk])
    assert Employee.objects.filter(tags__isnull=True).count() == len(hr.employees) - 3
    remote.employees.remove(b)
    assert list(b.tags.values_list("label", flat=True)) == ["oncall"]
    c.tags.set([remote])
    assert sorted(remote.employees.values_list("pk", flat=True)) == sorted([a.pk, c.pk])
    assert list(oncall.employees.values_list("pk", flat=True)) == [b.pk]
    oncall.employees.clear()
    assert oncall.employees.count() == 0
    assert b.tags.count() == 0


def test_many_to_many_queries(hr, alias, django_assert_num_queries):
    tags = [Tag.objects.create(label=f"t{i}") for i in range(4)]
    for i, e in enumerate(hr.employees):
        e.tags.add(*tags[: i % 4])
    counts = dict(Employee.objects.annotate(n=Count("tags")).values_list("pk", "n"))
    assert counts == {e.pk: i % 4 for i, e in enumerate(hr.employees)}
    rnd_tags = Tag.objects.filter(employees__department__name="R&D").distinct()
    rnd_idx = [i for i, e in enumerate(hr.employees) if e.department_id == hr.departments["R&D"].pk]
    assert sorted(t.label for t in rnd_tags) == sorted(
        {f"t{k}" for i in rnd_idx for k in range(i % 4)}
    )
    with django_assert_num_queries(2, using=alias):
        got = {
            e.pk: sorted(t.label for t in e.tags.all())
            for e in Employee.objects.prefetch_related("tags")
        }
    assert got == {e.pk: [f"t{k}" for k in range(i % 4)] for i, e in enumerate(hr.employees)}


def test_filter_through_a_relation_back_to_the_same_model(hr):
    # Employees whose department has someone earning > x: one row per such colleague.
    x = 70_000
    high = Counter(e.department_id for e in hr.employees if e.salary and e.salary > x)
    got = Employee.objects.filter(department__employees__salary__gt=x)
    assert got.count() == sum(high[e.department_id] for e in hr.employees if e.department_id)
    assert sorted(got.distinct().values_list("pk", flat=True)) == sorted(
        e.pk for e in hr.employees if e.department_id and high[e.department_id]
    )
    kept = Employee.objects.exclude(department__employees__salary__gt=x)
    assert sorted(kept.values_list("pk", flat=True)) == sorted(
        e.pk for e in hr.employees if not (e.department_id and high[e.department_id])
    )


def test_or_across_a_relation(hr):
    x = 70_000
    rich = {e.department_id for e in hr.employees if e.salary and e.salary > x}
    q = Q(employees__salary__gt=x) | Q(name="Empty")
    assert names(Department.objects.filter(q).distinct()) == sorted(
        n for n, d in hr.departments.items() if d.pk in rich or n == "Empty"
    )
    assert names(Department.objects.exclude(q)) == sorted(
        n for n, d in hr.departments.items() if d.pk not in rich and n != "Empty"
    )
