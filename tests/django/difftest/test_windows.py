"""Window functions on both databases: every ranking and navigation function, with and
without partitions, orderings with ties and NULLs, ROWS and RANGE frames (offsets
included), aggregates over frames, filters on windows (QUALIFY), windows over grouped
rows. SQLite is the reference.
"""

from __future__ import annotations

import pytest
from django.db.models import Avg, Count, F, Min, Sum, Window
from django.db.models.expressions import RowRange, ValueRange
from django.db.models.functions import (
    CumeDist,
    DenseRank,
    FirstValue,
    Lag,
    LastValue,
    Lead,
    NthValue,
    Ntile,
    PercentRank,
    Rank,
    RowNumber,
)

from tests.django.difftest.models import Item
from tests.django.difftest.test_differential import ENC, PLAIN, insert, make_data, same

pytestmark = pytest.mark.django_db(databases=["default", ENC, PLAIN])


@pytest.fixture
def data():
    rows = make_data(3, items=120)
    insert(rows, PLAIN)
    insert(rows, ENC)
    return rows


def both(make):
    plain, encrypted = list(make(PLAIN)), list(make(ENC))
    assert same(plain, encrypted), f"\nsqlite:    {plain!r}\nencrypted: {encrypted!r}"
    return encrypted


# Orderings that end in the pk are total (so every function has one answer); the others
# have ties, which only ranking functions and RANGE frames may see.
TOTAL = [F("m").asc(nulls_first=True), "pk"]
TIES = [F("flag").asc()]

FUNCTIONS = {
    "RowNumber": lambda: RowNumber(),
    "Rank": lambda: Rank(),
    "DenseRank": lambda: DenseRank(),
    "PercentRank": lambda: PercentRank(),
    "CumeDist": lambda: CumeDist(),
    "Ntile": lambda: Ntile(3),
    "Lag": lambda: Lag("n"),
    "Lead 2 with default": lambda: Lead("n", 2, default=-7),
    "FirstValue": lambda: FirstValue("n"),
    "LastValue": lambda: LastValue("n"),
    "NthValue": lambda: NthValue("n", 3),
    "Sum": lambda: Sum("n"),
    "Count": lambda: Count("m"),
    "Min": lambda: Min("name"),
}
RANKING = {"Rank", "DenseRank", "PercentRank", "CumeDist", "Count", "Sum", "Min"}


def run(expression, **window):
    def make(using):
        return (
            Item.objects.using(using)
            .filter(n__range=(-(10**6), 10**6))
            .annotate(w=Window(expression, **window))
            .order_by("pk")
            .values_list("pk", "w")
        )

    return make


@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("partition", [None, "flag", "group"], ids=["all", "flag", "group"])
def test_functions(data, name, partition):
    orders = [TOTAL] + ([TIES] if name in RANKING else [])
    for order_by in orders:
        assert both(run(FUNCTIONS[name](), partition_by=partition, order_by=order_by))


FRAMES = {
    "rows 2 preceding to current": RowRange(start=-2, end=0),
    "rows 1 following to 3 following": RowRange(start=1, end=3),
    "rows unbounded": RowRange(start=None, end=None),
    "rows 3 preceding to 1 preceding": RowRange(start=-3, end=-1),
    "range unbounded to current": ValueRange(start=None, end=0),
    "range current to unbounded": ValueRange(start=0, end=None),
    "range 5 preceding to 5 following": ValueRange(start=-5, end=5),
    "range 3 preceding to 1 following": ValueRange(start=-3, end=1),
}


@pytest.mark.parametrize("frame", list(FRAMES))
@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
def test_frames(data, frame, descending):
    order = F("m").desc() if descending else F("m").asc()
    offsets = isinstance(FRAMES[frame], ValueRange) and FRAMES[frame].start.value not in (0, None)

    def make(using):
        qs = Item.objects.using(using).filter(n__range=(-(10**6), 10**6))
        if offsets or isinstance(FRAMES[frame], ValueRange):
            qs = qs.filter(m__isnull=False)
        return (
            qs.annotate(
                s=Window(Sum("n"), partition_by="flag", order_by=order, frame=FRAMES[frame]),
                f=Window(FirstValue("n"), order_by=[order, "pk"], frame=FRAMES[frame]),
                c=Window(Count("pk"), order_by=order, frame=FRAMES[frame]),
            )
            .order_by("pk")
            .values_list("pk", "s", "c")
        )

    assert both(make)


def test_filter_on_a_window(data):
    def make(using):
        return (
            Item.objects.using(using)
            .annotate(r=Window(Rank(), partition_by="flag", order_by=[F("m").desc(), "pk"]))
            .filter(r__lte=3, n__isnull=False)
            .order_by("flag", "r")
            .values_list("flag", "r", "pk")
        )

    assert both(make)


def test_window_over_groups(data):
    def make(using):
        return (
            Item.objects.using(using)
            .values("group")
            .annotate(total=Count("pk"), avg=Avg("m"))
            .annotate(r=Window(Rank(), order_by=[F("total").desc(), "group"]))
            .order_by("group")
            .values_list("group", "total", "r")
        )

    assert both(make)
