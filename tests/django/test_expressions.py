"""The fail-closed evaluator and its hook (``django_zerodb/registry.py``,
``django_zerodb/expressions.py``).

Classes are known by identity: a subclass that changes its SQL (``as_sql``,
``as_<vendor>``, ``template``, ``function``...) or an instance carrying its own SQL is
refused with ``NotSupportedError`` naming it and ``django_zerodb.expressions.register``;
a subclass that changes nothing of its SQL is its parent. ``register`` gives a function,
lookup or aggregate of one's own a Python meaning, with SQL's NULL rules.
Expectations are computed in Python from the objects the ``hr`` fixture created.
"""

from __future__ import annotations

import datetime
import math

import pytest
from django.db import NotSupportedError
from django.db.models import (
    Aggregate,
    CharField,
    F,
    Func,
    IntegerField,
    Lookup,
    Q,
    Sum,
)
from django.db.models.functions import Collate, Now, Upper
from django.db.models.lookups import Exact
from django.test.utils import register_lookup

from django_zerodb import compat, expressions
from tests.django.conftest import BOTH_STORES, db
from tests.django.testapp.models import Employee

pytestmark = [db, BOTH_STORES]

HOOK = "django_zerodb.expressions.register"


class NowTomorrow(Now):
    """Means something else than Now: its SQL says so."""

    template = "CURRENT_TIMESTAMP + INTERVAL '1 day'"


class PlainNow(Now):
    """The same SQL as Now: it is Now."""


class Shouting(Upper):
    lookup_name = "shouting"  # a name changes no SQL


class Exclaim(Func):
    function = "EXCLAIM"
    output_field = CharField()


class Louder(Exclaim):
    template = "UPPER(EXCLAIM(%(expressions)s))"


class NotEqual(Lookup):
    lookup_name = "ne"

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} <> {rhs}", (*lhs_params, *rhs_params)


class FoldedExact(Exact):
    lookup_name = "folded"

    def as_sql(self, compiler, connection):
        raise AssertionError("never compiled")


class Product(Aggregate):
    function = "PRODUCT"
    output_field = IntegerField()


def refused(match, make):
    with pytest.raises(NotSupportedError, match=match) as caught:
        list(make())
    return str(caught.value)


# -- what is refused -------------------------------------------------------------------------


def test_a_subclass_with_other_sql_is_refused(hr):
    message = refused("NowTomorrow", lambda: Employee.objects.annotate(t=NowTomorrow()))
    assert "template" in message and f"{HOOK}(NowTomorrow)" in message
    refused("NowTomorrow", lambda: Employee.objects.filter(updated__lt=NowTomorrow()))


def test_a_subclass_with_the_same_sql_is_its_parent(hr):
    assert Employee.objects.filter(updated__lt=PlainNow()).count() == sum(
        e.updated is not None for e in hr.employees
    )
    with register_lookup(CharField, Shouting):
        got = set(Employee.objects.filter(last_name__shouting="TURING").values_list("pk"))
    assert got == {(e.pk,) for e in hr.employees if e.last_name.upper() == "TURING"}
    assert got


def test_an_instance_with_its_own_sql_is_refused(hr):
    refused("Func", lambda: Employee.objects.annotate(x=Func(F("last_name"), function="UPPER")))
    refused("Upper", lambda: Employee.objects.annotate(x=Upper("last_name", function="LOWER")))


@pytest.mark.filterwarnings("ignore:The PostgreSQL specific StringAgg")  # used on purpose
@pytest.mark.filterwarnings("ignore:delimiter. str will be resolved")
def test_an_older_djangos_look_alike_is_refused(hr):
    """django.contrib.postgres' StringAgg (the only one on Django 5.2) is not
    django.db.models.StringAgg (Django 6.0): dispatch on real classes refuses it."""
    from django.contrib.postgres.aggregates import StringAgg

    refused("StringAgg", lambda: [Employee.objects.aggregate(s=StringAgg("last_name", ","))])


def test_a_function_not_implemented_is_refused_by_name(hr):
    message = refused(
        "Collate", lambda: Employee.objects.annotate(x=Collate("first_name", "nocase"))
    )
    assert f"{HOOK}(Collate)" in message


def test_sql_added_to_a_class_later_is_refused(hr):
    class MySum(Sum):
        pass

    total = sum(e.salary or 0 for e in hr.employees)
    assert Employee.objects.aggregate(s=MySum("salary"))["s"] == total
    MySum.as_zerodb = lambda self, compiler, connection: ("sum(1)", ())  # Django's own test
    with pytest.raises(NotSupportedError, match=r"MySum.*as_zerodb"):
        Employee.objects.aggregate(s=MySum("salary"))


def test_a_lookup_subclass_with_other_sql_is_refused(hr):
    with register_lookup(CharField, FoldedExact):
        refused("FoldedExact", lambda: Employee.objects.filter(last_name__folded="Turing"))
    with register_lookup(IntegerField, NotEqual):
        message = refused("NotEqual", lambda: Employee.objects.filter(salary__ne=1))
    assert f"{HOOK}(NotEqual)" in message


# -- the hook --------------------------------------------------------------------------------


@pytest.fixture
def registered():
    """Classes registered by a test, forgotten afterwards."""
    done = []

    def register(klass, **options):
        done.append(klass)
        return expressions.register(klass, **options)

    yield register
    for klass in done:
        expressions.unregister(klass)


def test_register_a_function(hr, registered):
    registered(Exclaim)(lambda value: f"{value}!")
    got = dict(Employee.objects.annotate(x=Exclaim("title")).values_list("pk", "x"))
    assert got == {e.pk: f"{e.title}!" for e in hr.employees}
    ada = {e.pk for e in hr.employees if e.first_name == "Ada"}
    found = Employee.objects.annotate(x=Exclaim("first_name")).filter(x="Ada!")
    assert set(found.values_list("pk", flat=True)) == ada
    # A subclass with other SQL is still refused; NULL in, NULL out (strict).
    refused("Louder", lambda: Employee.objects.annotate(x=Louder("title")))
    nulls = Employee.objects.annotate(x=Exclaim("salary")).filter(salary__isnull=True)
    assert set(nulls.values_list("x", flat=True)) == {None}


def test_a_function_that_takes_nulls(hr, registered):
    registered(Exclaim, strict=False)(lambda value: "none!" if value is None else f"{value}!")
    got = dict(Employee.objects.annotate(x=Exclaim("salary")).values_list("pk", "x"))
    assert got == {e.pk: "none!" if e.salary is None else f"{e.salary}!" for e in hr.employees}


def test_unregister_refuses_again(hr, registered):
    registered(Exclaim)(lambda value: value)
    list(Employee.objects.annotate(x=Exclaim("title")))
    expressions.unregister(Exclaim)
    refused("Exclaim", lambda: Employee.objects.annotate(x=Exclaim("title")))


def test_register_a_lookup(hr, registered):
    registered(NotEqual)(lambda lhs, rhs: lhs != rhs)
    target = hr.employees[0].salary
    with register_lookup(IntegerField, NotEqual):
        kept = set(Employee.objects.filter(salary__ne=target).values_list("pk", flat=True))
        dropped = set(Employee.objects.exclude(salary__ne=target).values_list("pk", flat=True))
    assert kept == {e.pk for e in hr.employees if e.salary is not None and e.salary != target}
    # Django writes exclude() on a nullable column as NOT (salary <> x AND salary IS NOT
    # NULL): NULL salaries are excluded from the filter and kept by the exclude.
    assert dropped == {e.pk for e in hr.employees if e.salary in (target, None)}


def test_register_an_aggregate(hr, registered):
    registered(Product)(math.prod)
    small = Q(salary__lt=40_000)
    got = Employee.objects.aggregate(p=Product("salary", filter=small), none=Product("pk") * 0)
    expected = math.prod(e.salary for e in hr.employees if e.salary and e.salary < 40_000)
    assert got["p"] == expected
    assert Employee.objects.none().aggregate(p=Product("salary"))["p"] is None
    assert Employee.objects.filter(salary__gt=10**9).aggregate(p=Product("salary"))["p"] is None


def test_register_takes_expression_classes_only():
    with pytest.raises(TypeError):
        expressions.register(int)


def test_json_containment_is_refused_in_djangos_words(hr):
    from tests.django.testapp.models import Booking

    for lookup in ("contains", "contained_by"):
        message = f"{lookup} lookup is not supported on this database backend"
        with pytest.raises(NotSupportedError, match=message):
            list(Booking.objects.filter(**{f"extra__{lookup}": {"a": 1}}))


def test_refused_when_built_even_if_no_row_reaches_it(hr):
    nobody = Employee.objects.filter(pk=-1)
    refused("Collate", lambda: nobody.annotate(x=Collate("first_name", "nocase")))
    refused("Collate", lambda: nobody.filter(first_name__gt=Collate("first_name", "nocase")))
    refused("NowTomorrow", lambda: Employee.objects.order_by(NowTomorrow()))
    with pytest.raises(NotSupportedError, match="Collate"):
        nobody.update(first_name=Collate("first_name", "nocase"))
    with pytest.raises(NotSupportedError, match="Product"):
        nobody.aggregate(p=Product("salary"))


def test_an_aggregate_with_its_own_sql_is_refused(hr):
    with pytest.raises(NotSupportedError, match="Sum"):
        Employee.objects.aggregate(s=Sum("salary", function="MAX"))


@pytest.mark.skipif(compat.UUID4 is None, reason="UUID4/UUID7 came with Django 6.1")
def test_uuid4_and_uuid7_are_made_per_row(hr):
    """UUID4()/UUID7() as SQL makes them: a new value for every row, of its version; a
    UUID7's first 48 bits are the (shifted) time in milliseconds."""
    from django.db.models.functions import UUID4, UUID7

    rows = list(Employee.objects.annotate(u4=UUID4(), u7=UUID7()).values_list("u4", "u7"))
    assert len(rows) == len(hr.employees) > 1
    assert {u4.version for u4, _ in rows} == {4} and {u7.version for _, u7 in rows} == {7}
    assert len({u4 for u4, _ in rows}) == len({u7 for _, u7 in rows}) == len(rows)
    shift = datetime.timedelta(days=400)
    before = datetime.datetime.now(datetime.UTC) + shift
    (moved,) = Employee.objects.annotate(u=UUID7(shift)).values_list("u", flat=True)[:1]
    after = datetime.datetime.now(datetime.UTC) + shift
    stamp = datetime.datetime.fromtimestamp(int.from_bytes(moved.bytes[:6]) / 1000, tz=datetime.UTC)
    assert before - datetime.timedelta(milliseconds=1) <= stamp <= after


def test_uuid7_values_sort_in_the_order_they_were_made(monkeypatch):
    """The time part keeps rising within the process (as PostgreSQL's within a backend),
    whatever the clock does: with a clock that stands still, as a coarse one does between
    ticks, 2,000 values made back to back still sort as made."""
    from django_zerodb import functions

    standing = functions.time.time_ns()
    monkeypatch.setattr(functions.time, "time_ns", lambda: standing)
    made = [functions.uuid7() for _ in range(2000)]
    assert sorted(made) == made and len(set(made)) == len(made)
