"""Expressions on both databases: functions, casts, date arithmetic, aggregates over
nothing, and what the encrypted database must refuse rather than answer.

The seeded rows of ``test_differential`` are written to SQLite ("plain") and to the
encrypted database; each case below is one queryset built for either, and the answers
must be equal (``same``: the differential test's normalisations). Where SQLite itself
is not the reference (it does not truncate ``CAST(x AS varchar(1))``, it refuses
``ROUND`` with a negative precision, it rounds a decimal through a binary float), the
expectation is computed from the definition in plain Python, on the rows read back
without any expression.
"""

from __future__ import annotations

import datetime
import decimal

import pytest
from django.db.models import (
    CASCADE,
    Avg,
    CharField,
    Count,
    DateField,
    DateTimeField,
    DecimalField,
    DurationField,
    ExpressionWrapper,
    F,
    FloatField,
    ForeignKey,
    IntegerField,
    Max,
    Sum,
    TimeField,
    Value,
)
from django.db.models.functions import (
    Abs,
    ACos,
    ASin,
    ATan,
    ATan2,
    Cast,
    Coalesce,
    Cos,
    Cot,
    Degrees,
    Exp,
    Extract,
    ExtractHour,
    Ln,
    Log,
    NullIf,
    Pi,
    Radians,
    Round,
    Sin,
    Tan,
    Trunc,
    TruncDate,
    Upper,
)
from django.test.utils import register_lookup
from django.utils import timezone

from django_zerodb import compat
from tests.django.difftest.models import Group, Item
from tests.django.difftest.support import both, load
from tests.django.difftest.test_differential import ENC, PLAIN

pytestmark = pytest.mark.django_db(databases=["default", ENC, PLAIN])

SEED = 7
UTC = datetime.UTC


@pytest.fixture
def data():
    return load(SEED)


def items(using):
    return Item.objects.using(using).order_by("pk")


# -- aggregates over no rows ------------------------------------------------------------------


@pytest.mark.parametrize(
    "nothing",
    [
        lambda qs: qs.none(),
        lambda qs: qs.filter(pk__in=[]),
        lambda qs: qs.filter(n__gt=2**62),  # matches nothing, but not known in advance
    ],
    ids=["none", "in-empty", "no-match"],
)
def test_aggregates_over_no_rows(data, nothing):
    aggregates = {
        "count": Count("pk"),
        "count_plus": Count("pk") + 1,
        "sum_times": Sum("n") * 2,
        "sum_default": Sum("n", default=0),
        "coalesced": Coalesce(Sum("m"), Value(-1)),
        "avg_default": Avg("n", default=Value(1.5)),
        "max_day": Max("day", default=Value(datetime.date(2000, 1, 1))),
        "sum_price_default": Sum("price", default=Value(decimal.Decimal("0.50"))),
    }
    answer = both(lambda using: nothing(items(using)).aggregate(**aggregates))
    assert NotImplemented not in answer.values()
    assert answer["count"] == 0 and answer["count_plus"] == 1


# -- functions ------------------------------------------------------------------------------


def test_nullif_with_a_null_argument(data):
    """NULLIF(a, NULL) is a: the comparison with NULL is unknown, not true."""
    answer = both(lambda using: items(using).values_list("n", "m", NullIf("n", "m")))
    assert any(m is None and n is not None and out == n for n, m, out in answer)


def test_round_decimals_half_away_from_zero(data):
    """ROUND of a numeric: half away from zero (PostgreSQL; SQLite rounds a binary
    float). Whole places agree with SQLite, which rounds x.50 up as well."""
    both(lambda using: items(using).values_list("price", Round("price")))
    got = list(items(ENC).values_list("price", Round("price", 1)))
    ties = 0
    for price, rounded in got:
        if price is None:
            assert rounded is None
            continue
        cents = int(price * 100)
        sign = -1 if cents < 0 else 1
        tenths = sign * ((abs(cents) + 5) // 10)  # half away from zero, in integers
        ties += abs(cents) % 10 == 5
        assert rounded == decimal.Decimal(tenths) / 10, (price, rounded)
    assert ties, "the data must hold ties"


def test_round_with_negative_precision(data):
    """SQLite refuses it (Django raises ValueError there); PostgreSQL rounds to tens."""
    got = list(items(ENC).values_list("n", Round("n", -1)))
    for n, rounded in got:
        if n is None:
            assert rounded is None
            continue
        sign = -1 if n < 0 else 1
        assert rounded == sign * ((abs(n) + 5) // 10 * 10), (n, rounded)
        assert isinstance(rounded, int)


# -- casts ----------------------------------------------------------------------------------


def test_cast_date_and_datetime(data):
    both(lambda using: items(using).values_list("day", Cast("day", DateTimeField())))
    both(lambda using: items(using).values_list("at", Cast("at", DateField())))


def test_cast_datetime_to_time(data):
    """SQLite keeps milliseconds (``time_cast_precision = 3``): compared to the time of
    the stored value, to the microsecond."""
    got = list(items(ENC).values_list("at", Cast("at", TimeField())))
    assert any(at is not None and at.microsecond % 1000 for at, _ in got)
    for at, cast in got:
        assert cast == (None if at is None else at.astimezone(UTC).time().replace(tzinfo=None))


def test_cast_to_short_text_truncates(data):
    """``CAST(x AS varchar(1))`` keeps one character (SQLite ignores the length)."""
    got = list(items(ENC).values_list("n", Cast("n", CharField(max_length=1))))
    for n, text in got:
        assert text == (None if n is None else str(n)[:1])


def test_cast_to_decimal_quantizes(data):
    field = DecimalField(max_digits=12, decimal_places=1)
    got = list(items(ENC).values_list("price", Cast("price", field)))
    for price, cast in got:
        if price is None:
            assert cast is None
        else:
            cents = int(price * 100)
            sign = -1 if cents < 0 else 1
            assert cast == decimal.Decimal(sign * ((abs(cents) + 5) // 10)) / 10
            assert cast.as_tuple().exponent == -1


def test_cast_to_an_integer_foreign_key(data):
    both(
        lambda using: items(using).values_list(
            Cast(Value("0"), ForeignKey(Group, on_delete=CASCADE)), Cast("n", IntegerField())
        )
    )


# -- dates ----------------------------------------------------------------------------------


@pytest.mark.parametrize("zone", [None, "Asia/Kathmandu", "America/New_York"])
def test_trunc_on_the_right_of_date(data, zone):
    def run(using):
        trunc = Trunc("at", "day", output_field=DateField())
        return items(using).filter(at__date=trunc).values_list("pk", flat=True)

    with timezone.override(zone or "UTC"):
        answer = both(run)
    assert answer


@pytest.mark.parametrize(
    "tzinfo",
    [
        datetime.timezone(datetime.timedelta(hours=5)),
        datetime.timezone(datetime.timedelta(hours=-3, minutes=-30)),
        __import__("zoneinfo").ZoneInfo("Etc/GMT+10"),
    ],
    ids=str,
)
def test_zones_with_offsets(data, tzinfo):
    both(
        lambda using: items(using).values_list(
            ExtractHour("at", tzinfo=tzinfo),
            Trunc("at", "day", tzinfo=tzinfo),
            TruncDate("at", tzinfo=tzinfo),
            Extract("at", "week_day", tzinfo=tzinfo),
        )
    )


def test_dates_plus_durations_in_filters(data):
    day = datetime.timedelta(days=1)
    both(lambda using: items(using).filter(at__gte=F("day") + day).values_list("pk", flat=True))
    both(
        lambda using: (
            items(using)
            .filter(day__lt=F("at") - datetime.timedelta(hours=5))
            .values_list("pk", flat=True)
        )
    )
    both(
        lambda using: (
            items(using)
            .filter(at__lt=F("at") + datetime.timedelta(microseconds=1))
            .values_list("pk", flat=True)
        )
    )


def test_datetime_minus_datetime(data):
    def run(using):
        midnight = Cast("day", output_field=DateTimeField())
        diff = ExpressionWrapper(F("at") - midnight, output_field=DurationField())
        return items(using).values_list("pk", diff)

    answer = both(run)
    assert any(d is not None for _, d in answer)


# -- transforms -----------------------------------------------------------------------------


class UpperBilateral(Upper):
    bilateral = True


def test_bilateral_transform_on_the_right(data):
    """``name__upper__exact="abc"`` compares ``UPPER(name) = UPPER('abc')``. ASCII names
    only: SQLite's UPPER leaves other letters alone."""
    with register_lookup(CharField, UpperBilateral):

        def run(using):
            ascii_names = items(using).filter(name__regex=r"^[ -~]+$")
            return ascii_names.filter(name__upper__in=["alpha", "Ab", "zzz"]).values_list(
                "pk", flat=True
            )

        assert both(run)
        assert both(
            lambda using: (
                items(using)
                .filter(name__regex=r"^[ -~]+$", name__upper="beta")
                .values_list("pk", flat=True)
            )
        )


# -- aggregates -----------------------------------------------------------------------------


@pytest.mark.skipif(compat.BitAnd is None, reason="BitAnd/BitOr/BitXor are new in Django 6.1")
def test_bit_aggregates(data):
    from django.db.models import BitAnd, BitOr, BitXor

    aggregates = {"a": BitAnd("n"), "o": BitOr("m"), "x": BitXor("n"), "f": BitAnd("flag")}
    both(lambda using: items(using).filter(n__gte=0).aggregate(**aggregates))
    both(lambda using: items(using).none().aggregate(a=BitAnd("n", default=Value(-1))))
    grouped = {"a": BitAnd("n"), "o": BitOr("n")}
    both(lambda using: items(using).values("group").annotate(**grouped).order_by("group"))


@pytest.mark.skipif(
    compat.StringAgg is None,
    reason="django.db.models.StringAgg is new in Django 6.0 (django.contrib.postgres' before)",
)
def test_string_agg(data):
    """SQLite 3.40 has no ORDER BY inside an aggregate: the expectation is computed from
    the rows (codes of each group's items by code, then by descending pk)."""
    from django.db.models import StringAgg

    ordered = StringAgg("items__code", Value("|"), order_by=("items__code", "-items__pk"))
    got = dict(Group.objects.using(ENC).annotate(names=ordered).values_list("pk", "names"))
    expected = {}
    for group in data.groups:
        codes = [
            (row["code"], row["id"])
            for row in data.items
            if row["group_id"] == group["id"] and row["code"] is not None
        ]
        codes.sort(key=lambda c: (c[0], -c[1]))
        expected[group["id"]] = "|".join(c for c, _ in codes) if codes else None
    assert got == expected
    assert any(got.values())
    # Unordered, so in whatever order each database reads the rows (SQLite reads the
    # index on code): compared as the sorted parts.
    both(
        lambda using: sorted(
            items(using)
            .filter(code__regex="^a")
            .aggregate(s=StringAgg("code", Value(",")))["s"]
            .split(",")
        )
    )
    both(
        lambda using: (
            items(using).none().aggregate(s=StringAgg("code", Value(","), default=Value("-")))
        )
    )


def test_cast_text_to_json(data):
    from django.db.models import JSONField

    both(lambda using: items(using).filter(name="12").values_list(Cast("name", JSONField())))


def test_distinct_keeps_rows_apart_by_ordering_columns(data):
    """SELECT DISTINCT selects the ORDER BY columns too (Django's get_extra_select)."""
    both(lambda using: Item.objects.using(using).values("flag").distinct().order_by("m", "pk"))
    both(lambda using: Item.objects.using(using).values("flag").distinct().order_by("flag"))


def test_random_ordering_never_splits_groups(data):
    def run(using):
        groups = Item.objects.using(using).values("flag").annotate(c=Count("pk")).order_by("?")
        return sorted((g["flag"], g["c"]) for g in groups)

    both(run)


MATH = {
    "Exp": lambda: Exp(Cast("m", FloatField()) / 100.0),
    "Ln": lambda: Ln(Abs("n") + 1),
    "Log": lambda: Log(2, Abs("n") + 1),
    "Pi": lambda: Pi() * F("m"),
    "Sin": lambda: Sin("n"),
    "Cos": lambda: Cos("m"),
    "Tan": lambda: Tan("n"),
    "Cot": lambda: Cot(Abs("n") + 1),
    "ASin": lambda: ASin(Cast("m", FloatField()) / 1000000.0),
    "ACos": lambda: ACos(Cast("m", FloatField()) / 1000000.0),
    "ATan": lambda: ATan("n"),
    "ATan2": lambda: ATan2("n", "m"),
    "Degrees": lambda: Degrees("m"),
    "Radians": lambda: Radians("n"),
    "decimal": lambda: Sin("price"),
}


@pytest.mark.parametrize("name", list(MATH))
def test_math_functions(data, name):
    """Inside their domains (SQLite raises outside, the encrypted database DataError)."""
    small = {"n__range": (-1000, 1000), "m__range": (-1000, 1000)}

    def run(using):
        qs = items(using).filter(**small).annotate(v=MATH[name]()).order_by("pk")
        return [None if v is None else round(float(v), 9) for v in qs.values_list("v", flat=True)]

    assert any(v is not None for v in both(run))
