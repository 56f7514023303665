"""``union()``, ``intersection()`` and ``difference()`` on both databases: duplicates,
NULLs, ``all=True``, values() of several columns, ordering and slicing of the result,
a set operation inside a subquery (correlated too) and counts. SQLite is the reference.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError
from django.db.models import OuterRef, Subquery

from tests.django.difftest.models import Group, Item
from tests.django.difftest.test_differential import ENC, PLAIN, insert, make_data, same

pytestmark = pytest.mark.django_db(databases=["default", ENC, PLAIN])


@pytest.fixture
def data():
    rows = make_data(5, items=150)
    insert(rows, PLAIN)
    insert(rows, ENC)
    return rows


def both(make):
    plain, encrypted = make(PLAIN), make(ENC)
    plain = list(plain) if hasattr(plain, "query") else plain
    encrypted = list(encrypted) if hasattr(encrypted, "query") else encrypted
    assert same(plain, encrypted), f"\nsqlite:    {plain!r}\nencrypted: {encrypted!r}"
    return encrypted


def items(using):
    return Item.objects.using(using)


def low(u):
    return items(u).filter(n__lt=10).values("flag", "m")


def high(u):
    return items(u).filter(n__gte=0).values("flag", "m")


CASES = {
    "union": lambda u: sorted(map(repr, low(u).union(high(u)))),
    "union all": lambda u: sorted(map(repr, low(u).union(high(u), all=True))),
    "intersection": lambda u: sorted(map(repr, low(u).intersection(high(u)))),
    "difference": lambda u: sorted(map(repr, low(u).difference(high(u)))),
    "three parts": lambda u: sorted(
        map(repr, low(u).union(high(u), items(u).filter(m__isnull=True).values("flag", "m")))
    ),
    "ordered and sliced": lambda u: (
        items(u)
        .filter(n__lt=10)
        .values_list("m", "pk")
        .union(items(u).filter(m__gt=0).values_list("m", "pk"))
        .order_by("-m", "pk")[3:12]
    ),
    "ordered by a column not selected": lambda u: (
        items(u)
        .filter(n__lt=0)
        .union(items(u).filter(m__gt=5))
        .order_by("name", "pk")
        .values_list("pk", flat=True)
    ),
    "count": lambda u: [low(u).union(high(u)).count(), low(u).intersection(high(u)).count()],
    "objects": lambda u: [
        i.pk for i in items(u).filter(n__lt=0).union(items(u).filter(flag=True)).order_by("pk")
    ],
    "in a subquery": lambda u: (
        Group.objects.using(u)
        .filter(
            pk__in=items(u)
            .filter(n__lt=0)
            .values("group")
            .union(items(u).filter(m__gt=100).values("group"))
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    ),
    "correlated in a subquery": lambda u: (
        Group.objects.using(u)
        .annotate(
            one=Subquery(
                items(u)
                .filter(group=OuterRef("pk"), n__lt=0)
                .values("n")
                .union(items(u).filter(group=OuterRef("pk"), m__gt=100).values("n"))
                .order_by("n")[:1]
            )
        )
        .order_by("pk")
        .values_list("pk", "one")
    ),
    "empty parts": lambda u: [
        len(items(u).none().union(low(u))),
        len(low(u).intersection(items(u).filter(pk__in=[]).values("flag", "m"))),
        len(low(u).difference(items(u).none())),
        len(low(u).union(items(u).filter(pk__in=[]).values("flag", "m"))),
    ],
}


@pytest.mark.parametrize("name", list(CASES))
def test_combined(data, name):
    assert both(CASES[name])


def test_a_part_ordered_on_its_own_is_refused_as_on_sqlite(data):
    for using in (PLAIN, ENC):
        with pytest.raises(DatabaseError, match="ORDER BY not allowed"):
            list(low(using).order_by("m").union(high(using)))
