"""Correlated subqueries on both databases, run per outer row (correlated.py):
``Subquery`` and ``Exists`` with ``OuterRef`` in annotations, filters, ordering and
aggregates, with operators on the outer reference, nested two levels, and as the right
side of ``in``. SQLite is the reference.
"""

from __future__ import annotations

import pytest
from django.db.models import (
    Count,
    Exists,
    F,
    IntegerField,
    Max,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce

from tests.django.difftest.models import Group, Item
from tests.django.difftest.test_differential import ENC, PLAIN, insert, make_data, same

pytestmark = pytest.mark.django_db(databases=["default", ENC, PLAIN])


@pytest.fixture
def data():
    rows = make_data(11, items=120)
    insert(rows, PLAIN)
    insert(rows, ENC)
    return rows


def both(make):
    plain, encrypted = list(make(PLAIN)), list(make(ENC))
    assert same(plain, encrypted), f"\nsqlite:    {plain!r}\nencrypted: {encrypted!r}"
    return encrypted


def first_n(using, **outer):
    return Subquery(
        Item.objects.using(using)
        .filter(**outer)
        .filter(n__isnull=False)
        .order_by("-n", "pk")
        .values("n")[:1]
    )


def groups(using):
    return Group.objects.using(using).order_by("pk")


CASES = {
    "annotation": lambda u: (
        groups(u).annotate(top=first_n(u, group=OuterRef("pk"))).values_list("pk", "top")
    ),
    "annotation, operator on the outer side": lambda u: (
        groups(u).annotate(top=first_n(u, n__lt=OuterRef("rank") + 10)).values_list("pk", "top")
    ),
    "annotation, arithmetic on the result": lambda u: (
        groups(u)
        .annotate(top=Coalesce(first_n(u, group=OuterRef("pk")), 0) * 2 + F("rank"))
        .values_list("pk", "top")
    ),
    "filter by a subquery": lambda u: (
        groups(u).filter(rank__lt=first_n(u, group=OuterRef("pk"))).values_list("pk", flat=True)
    ),
    "exists with a non-equality": lambda u: (
        groups(u)
        .filter(Exists(Item.objects.using(u).filter(group=OuterRef("pk"), n__gt=OuterRef("rank"))))
        .values_list("pk", flat=True)
    ),
    "not exists with an operator": lambda u: (
        groups(u)
        .filter(~Exists(Item.objects.using(u).filter(n=OuterRef("rank") + 1)))
        .values_list("pk", flat=True)
    ),
    "exists as a value": lambda u: (
        groups(u)
        .annotate(
            has=Exists(Item.objects.using(u).filter(group=OuterRef("pk"), m__gte=OuterRef("rank")))
        )
        .values_list("pk", "has")
    ),
    "ordered by a subquery": lambda u: (
        Group.objects.using(u)
        .annotate(top=first_n(u, group=OuterRef("pk")))
        .order_by(F("top").desc(nulls_last=True), "pk")
        .values_list("pk", flat=True)
    ),
    "in a correlated subquery": lambda u: (
        groups(u)
        .filter(
            pk__in=Item.objects.using(u)
            .filter(n__gt=OuterRef("rank"), group__isnull=False)
            .values("group")
        )
        .values_list("pk", flat=True)
    ),
    "aggregate in the subquery": lambda u: (
        groups(u)
        .annotate(
            total=Subquery(
                Item.objects.using(u)
                .filter(group=OuterRef("pk"))
                .values("group")
                .annotate(s=Sum("n"))
                .values("s"),
                output_field=IntegerField(),
            )
        )
        .values_list("pk", "total")
    ),
    "nested two levels": lambda u: (
        groups(u)
        .annotate(
            deep=Subquery(
                Item.objects.using(u)
                .filter(group=OuterRef("pk"))
                .filter(
                    Exists(
                        Item.objects.using(u).filter(
                            n=OuterRef("n"), group__rank__lt=OuterRef(OuterRef("rank"))
                        )
                    )
                )
                .order_by("pk")
                .values("pk")[:1]
            )
        )
        .values_list("pk", "deep")
    ),
    "grouped over a subquery": lambda u: (
        Item.objects.using(u)
        .annotate(
            peers=Subquery(
                Item.objects.using(u)
                .filter(group=OuterRef("group"))
                .values("group")
                .annotate(c=Count("pk"))
                .values("c")
            )
        )
        .values("peers")
        .annotate(rows=Count("pk"), top=Max("n"))
        .order_by("peers")
    ),
    "conditions mixing outer columns": lambda u: (
        Item.objects.using(u)
        .filter(Q(n__gte=first_n(u, group=OuterRef("group"))) | Q(m__lt=Value(0)))
        .order_by("pk")
        .values_list("pk", flat=True)
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_correlated(data, name):
    got = both(CASES[name])
    assert got
