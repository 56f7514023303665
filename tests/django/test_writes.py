"""Writing through the ORM: create, save, bulk_create, bulk_update, update() with F(),
delete() with CASCADE and SET_NULL, get_or_create / update_or_create, and the unique
indexes (unique=True, unique_together, UniqueConstraint, the primary key) raising
``django.db.IntegrityError``.

Runs on both stores. A write that fails inside the test's transaction is wrapped in its
own ``atomic()`` (a savepoint), as Django requires to keep using the connection.
"""

from __future__ import annotations

import datetime
import decimal

import pytest
from django.core.exceptions import FieldError
from django.db import IntegrityError, NotSupportedError, transaction
from django.db.models import Case, F, Max, Value, When

from tests.django.conftest import BOTH_STORES, db
from tests.django.testapp.models import (
    Assignment,
    Badge,
    Counter,
    Department,
    Employee,
    Project,
    Setting,
    Tag,
)

pytestmark = [db, BOTH_STORES]


def stored(pk):
    return Employee.objects.get(pk=pk)


# -- create and save -----------------------------------------------------------------------


def test_create_and_read_back(alias):
    d = Department.objects.create(name="Ops", budget=decimal.Decimal("12.50"))
    e = Employee.objects.create(
        first_name="Ann",
        last_name="Bee",
        email="ann@example.com",
        salary=42,
        department=d,
        hire_date=datetime.date(2020, 2, 29),
        updated=datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC),
    )
    assert isinstance(e.pk, int)
    got = stored(e.pk)
    assert (got.first_name, got.salary, got.department_id, got.is_active) == ("Ann", 42, d.pk, True)
    assert got.hire_date == datetime.date(2020, 2, 29)
    assert got.updated == e.updated
    assert Department.objects.get(pk=d.pk).budget == decimal.Decimal("12.50")
    assert got._state.db == alias


def test_new_primary_keys_are_distinct():
    made = [Counter.objects.create(name=f"c{i}") for i in range(30)]
    assert len({c.pk for c in made}) == 30


def test_save_changes_and_update_fields(hr):
    e = stored(hr.employees[0].pk)
    e.title = "CTO"
    e.salary = 99_999
    e.save()
    got = stored(e.pk)
    assert (got.title, got.salary) == ("CTO", 99_999)
    e.title = "not saved"
    e.last_name = "Saved"
    e.save(update_fields=["last_name"])
    got = stored(e.pk)
    assert (got.title, got.last_name) == ("CTO", "Saved")
    other = hr.employees[1]
    assert stored(other.pk).title == other.title  # nothing else changed


def test_refresh_from_db(hr):
    e = hr.employees[2]
    Employee.objects.filter(pk=e.pk).update(title="Changed")
    e.refresh_from_db()
    assert e.title == "Changed"


def test_save_nullable_to_null(hr):
    e = next(x for x in hr.employees if x.salary is not None)
    e.salary = None
    e.department = None
    e.save()
    got = stored(e.pk)
    assert got.salary is None and got.department_id is None
    assert Employee.objects.filter(pk=e.pk, salary__isnull=True).exists()


def test_given_primary_key():
    Setting.objects.create(key="theme", value="dark")
    assert Setting.objects.get(pk="theme").value == "dark"
    s = Setting(key="theme", value="light")
    s.save()  # an existing pk: an update
    assert Setting.objects.get(pk="theme").value == "light"
    assert Setting.objects.count() == 1


# -- bulk ----------------------------------------------------------------------------------


def test_bulk_create_returns_pks():
    d = Department.objects.create(name="Bulk")
    objs = [
        Employee(first_name=f"B{i}", last_name="Ulk", email=f"b{i}@x", salary=i, department=d)
        for i in range(50)
    ]
    made = Employee.objects.bulk_create(objs, batch_size=16)
    assert all(o.pk is not None for o in made)
    assert len({o.pk for o in made}) == 50
    got = dict(Employee.objects.filter(department=d).values_list("pk", "salary"))
    assert got == {o.pk: o.salary for o in objs}


def test_bulk_create_is_all_or_nothing(hr, alias):
    taken = hr.employees[0].email
    objs = [Employee(first_name="x", email=f"new{i}@x") for i in range(3)]
    objs.append(Employee(first_name="dup", email=taken))
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Employee.objects.bulk_create(objs)
    assert not Employee.objects.filter(email__startswith="new").exists()
    assert Employee.objects.count() == len(hr.employees)


def test_bulk_create_duplicates_within_the_batch(alias):
    objs = [Department(name="Twin"), Department(name="Twin")]
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Department.objects.bulk_create(objs)
    assert not Department.objects.filter(name="Twin").exists()


def test_bulk_create_conflict_handling_is_refused(hr):
    # The store has no ON CONFLICT: Django refuses before anything is written.
    for kwargs in (
        {"ignore_conflicts": True},
        {"update_conflicts": True, "unique_fields": ["name"], "update_fields": ["budget"]},
    ):
        with pytest.raises(NotSupportedError):
            Department.objects.bulk_create([Department(name="Fresh")], **kwargs)
    assert not Department.objects.filter(name="Fresh").exists()


def test_bulk_update(hr):
    chosen = [stored(e.pk) for e in hr.employees[3:12]]
    for i, e in enumerate(chosen):
        e.salary = 1_000 + i
        e.title = f"T{i}"
    Employee.objects.bulk_update(chosen, ["salary", "title"], batch_size=4)
    got = {
        e.pk: (e.salary, e.title) for e in Employee.objects.filter(pk__in=[c.pk for c in chosen])
    }
    assert got == {e.pk: (e.salary, e.title) for e in chosen}
    untouched = hr.employees[0]
    assert stored(untouched.pk).salary == untouched.salary


# -- update() ------------------------------------------------------------------------------


def test_update_with_f(hr):
    rnd = hr.by_dept("R&D")
    n = Employee.objects.filter(department__name="R&D").update(salary=F("salary") + 100)
    assert n == len(rnd)
    got = dict(Employee.objects.values_list("pk", "salary"))
    for e in hr.employees:
        if e in rnd:
            assert got[e.pk] == (None if e.salary is None else e.salary + 100)
        else:
            assert got[e.pk] == e.salary


def test_update_from_other_fields_and_expressions(hr):
    Employee.objects.update(last_name=F("first_name"), title=Value("Staff"))
    assert all(e.last_name == e.first_name for e in Employee.objects.all())
    Employee.objects.filter(salary__isnull=False).update(
        salary=Case(When(salary__gte=50_000, then=F("salary") / 2), default=F("salary") * 2)
    )
    got = dict(Employee.objects.values_list("pk", "salary"))
    for e in hr.employees:
        if e.salary is None:
            assert got[e.pk] is None
        else:
            assert got[e.pk] == (e.salary // 2 if e.salary >= 50_000 else e.salary * 2)


def test_update_dates_and_decimals(hr):
    Employee.objects.filter(hire_date__isnull=False).update(
        hire_date=F("hire_date") + datetime.timedelta(days=1)
    )
    got = dict(Employee.objects.values_list("pk", "hire_date"))
    assert got == {
        e.pk: e.hire_date and e.hire_date + datetime.timedelta(days=1) for e in hr.employees
    }
    Department.objects.update(budget=F("budget") * 2)
    assert dict(Department.objects.values_list("name", "budget")) == {
        name: d.budget and d.budget * 2 for name, d in hr.departments.items()
    }


def test_update_nothing_and_foreign_key(hr):
    assert Employee.objects.filter(salary__gt=10**9).update(title="x") == 0
    sales = hr.departments["Sales"]
    n = Employee.objects.filter(department__isnull=True).update(department=sales)
    assert n == sum(1 for e in hr.employees if e.department_id is None)
    assert Employee.objects.filter(department__isnull=True).count() == 0


def test_update_with_an_aggregate_refuses():
    with pytest.raises(FieldError):
        Employee.objects.update(salary=Max("salary"))


# -- delete --------------------------------------------------------------------------------


def test_delete_one_and_many(hr):
    e = hr.employees[0]
    e.delete()
    assert not Employee.objects.filter(pk=e.pk).exists()
    inactive = [x for x in hr.employees[1:] if not x.is_active]
    count, per_model = Employee.objects.filter(is_active=False).delete()
    assert count == len(inactive)
    assert per_model == {"testapp.Employee": len(inactive)}
    assert Employee.objects.count() == len(hr.employees) - 1 - len(inactive)


def test_delete_cascades_and_sets_null(hr):
    rnd, sales = hr.departments["R&D"], hr.departments["Sales"]
    rnd_people = hr.by_dept("R&D")
    sales_people = hr.by_dept("Sales")
    # R&D's people lead Sales projects and R&D projects; Sales people work on both.
    projects = [
        Project.objects.create(code=f"P{i}", year=2024, department=dept, lead=lead)
        for i, (dept, lead) in enumerate(
            [(rnd, sales_people[0]), (sales, rnd_people[0]), (sales, rnd_people[1])]
        )
    ]
    pairs = [(person, p) for p in projects for person in (rnd_people[2], sales_people[1])]
    for person, p in pairs:
        Assignment.objects.create(employee=person, project=p, role="dev")
    Badge.objects.create(employee=rnd_people[0], number="B1")
    Badge.objects.create(employee=sales_people[0], number="B2")
    tag = Tag.objects.create(label="remote")
    tag.employees.add(rnd_people[0], sales_people[0])

    # Assignments of R&D's people or of R&D's project go with the department.
    gone = [(e, p) for e, p in pairs if p.department_id == rnd.pk or e.department_id == rnd.pk]
    kept = sorted((p.code, e.pk) for e, p in pairs if (e, p) not in gone)

    count, per_model = rnd.delete()

    assert not Employee.objects.filter(pk__in=[e.pk for e in rnd_people]).exists()
    assert Employee.objects.filter(department=sales).count() == len(sales_people)
    # R&D's project went with it; the Sales projects it led lost their lead.
    assert list(Project.objects.order_by("code").values_list("code", "lead")) == [
        ("P1", None),
        ("P2", None),
    ]
    assert sorted(Assignment.objects.values_list("project__code", "employee")) == kept
    assert list(Badge.objects.values_list("number", flat=True)) == ["B2"]
    assert list(tag.employees.values_list("pk", flat=True)) == [sales_people[0].pk]
    assert per_model["testapp.Employee"] == len(rnd_people)
    assert per_model["testapp.Department"] == 1
    assert per_model["testapp.Project"] == 1
    assert per_model["testapp.Badge"] == 1
    assert per_model["testapp.Assignment"] == len(gone)
    assert count == sum(per_model.values())


def test_delete_everything(hr):
    Employee.objects.all().delete()
    assert Employee.objects.count() == 0
    assert Department.objects.count() == len(hr.departments)


# -- get_or_create, update_or_create -------------------------------------------------------


def test_get_or_create(hr):
    d, created = Department.objects.get_or_create(name="R&D")
    assert (d.pk, created) == (hr.departments["R&D"].pk, False)
    d, created = Department.objects.get_or_create(
        name="Legal", defaults={"budget": decimal.Decimal("5")}
    )
    assert created and Department.objects.get(name="Legal").budget == 5
    assert Department.objects.count() == len(hr.departments) + 1


def test_update_or_create(hr):
    e = hr.employees[4]
    obj, created = Employee.objects.update_or_create(
        email=e.email, defaults={"title": "Updated", "salary": 1}
    )
    assert (obj.pk, created) == (e.pk, False)
    assert (stored(e.pk).title, stored(e.pk).salary) == ("Updated", 1)
    obj, created = Employee.objects.update_or_create(
        email="new@example.com",
        defaults={"title": "ignored on create"},
        create_defaults={"first_name": "New", "title": "Created"},
    )
    assert created and stored(obj.pk).title == "Created"


# -- unique indexes ------------------------------------------------------------------------


def test_unique_field(hr, alias):
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Department.objects.create(name="R&D")
    e = stored(hr.employees[0].pk)
    e.email = hr.employees[1].email
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        e.save()
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Employee.objects.filter(pk=e.pk).update(email=hr.employees[1].email)
    assert stored(e.pk).email == hr.employees[0].email
    # Freeing a value makes it usable again.
    Employee.objects.filter(pk=hr.employees[1].pk).update(email="moved@example.com")
    Employee.objects.filter(pk=e.pk).update(email=hr.employees[1].email)
    assert stored(e.pk).email == hr.employees[1].email


def test_unique_together(hr, alias):
    d = hr.departments["Sales"]
    Project.objects.create(code="X", year=2023, department=d)
    Project.objects.create(code="X", year=2024, department=d)
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Project.objects.create(code="X", year=2024, department=d)
    assert Project.objects.filter(code="X").count() == 2


def test_unique_constraint(hr, alias):
    p = Project.objects.create(code="Y", year=2024, department=hr.departments["Sales"])
    e = hr.employees[0]
    Assignment.objects.create(employee=e, project=p, role="dev")
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Assignment.objects.create(employee=e, project=p, role="lead")
    Assignment.objects.create(employee=hr.employees[1], project=p, role="lead")
    assert Assignment.objects.filter(project=p).count() == 2


def test_one_to_one_is_unique(hr, alias):
    e = hr.employees[0]
    Badge.objects.create(employee=e, number="1")
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Badge.objects.create(employee=e, number="2")


def test_duplicate_primary_key(hr, alias):
    taken = hr.employees[0]
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Employee.objects.create(pk=taken.pk, first_name="Clone", email="clone@example.com")
    assert stored(taken.pk).first_name == taken.first_name
    Setting.objects.create(key="k", value="1")
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Setting.objects.create(key="k", value="2")
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Setting(key="k", value="3").save(force_insert=True)
    assert Setting.objects.get(pk="k").value == "1"


def test_unique_violation_in_autocommit_leaves_nothing(hr, alias):
    before = Department.objects.count()
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Department.objects.create(name="Brand new")
        Department.objects.create(name="R&D")
    assert Department.objects.count() == before


def test_aware_datetimes_are_stored_as_instants():
    from zoneinfo import ZoneInfo

    tokyo = datetime.datetime(2024, 1, 1, 9, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    utc = datetime.datetime(2024, 1, 1, 0, 0, tzinfo=datetime.UTC)
    e = Employee.objects.create(first_name="T", email="t@example.com", updated=tokyo)
    assert stored(e.pk).updated == utc == tokyo
    assert Employee.objects.filter(updated=utc).count() == 1
    assert Employee.objects.filter(updated__date=datetime.date(2024, 1, 1)).count() == 1
    assert Employee.objects.filter(updated__lt=tokyo + datetime.timedelta(seconds=1)).count() == 1
