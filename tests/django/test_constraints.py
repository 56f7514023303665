"""Write-time checks the store does not make itself (``django_zerodb/constraints.py``):
check constraints, positive integer fields and JSON validity raise
``django.db.IntegrityError`` as SQLite's CHECK clauses do, on create, save, update and
bulk writes, and a refused write changes nothing. Model validation of check constraints
(``full_clean()``, which runs ``Q.check()``: a SELECT without a table) answers instead of
crashing.
"""

from __future__ import annotations

import datetime
import decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import CharField, F, Q, Value

from tests.django.conftest import BOTH_STORES, db
from tests.django.testapp.models import Booking

pytestmark = [db, BOTH_STORES]

DAY = datetime.date(2026, 3, 1)


def booking(**fields) -> Booking:
    values = {"seats": 2, "price": decimal.Decimal("10.00"), "starts": DAY, "ends": DAY}
    return Booking(**{**values, **fields})


def refused(alias, match, write):
    with pytest.raises(IntegrityError, match=match), transaction.atomic(using=alias):
        write()


# -- check constraints -----------------------------------------------------------------------


def test_check_constraint_on_create(alias):
    refused(alias, "CHECK constraint failed: price_not_negative", booking(price=-1).save)
    refused(
        alias,
        "CHECK constraint failed: ends_after_start",
        booking(ends=DAY - datetime.timedelta(days=1)).save,
    )
    assert not Booking.objects.exists()


def test_null_satisfies_a_check_as_in_sql(alias):
    """SQL's CHECK refuses FALSE only: ``NULL >= starts`` is unknown, so it passes."""
    b = booking(ends=None)
    b.save()
    assert Booking.objects.get().ends is None and b.pk is not None


def test_check_constraint_on_save_and_update(alias):
    b = booking()
    b.save()
    b.price = decimal.Decimal("-0.01")
    refused(alias, "price_not_negative", b.save)
    refused(alias, "price_not_negative", lambda: Booking.objects.update(price=F("price") - 11))
    refused(
        alias,
        "ends_after_start",
        lambda: Booking.objects.update(starts=F("ends") + datetime.timedelta(days=1)),
    )
    assert Booking.objects.values_list("price", "starts").get() == (decimal.Decimal("10"), DAY)
    Booking.objects.update(price=F("price") - 10)  # 0 is allowed
    assert Booking.objects.get().price == 0


def test_bulk_writes_are_all_or_nothing(alias):
    rows = [booking(), booking(price=-5), booking()]
    refused(alias, "price_not_negative", lambda: Booking.objects.bulk_create(rows))
    assert not Booking.objects.exists()
    made = Booking.objects.bulk_create([booking(), booking(seats=7)])
    for b in made:
        b.price = -b.seats
    refused(alias, "price_not_negative", lambda: Booking.objects.bulk_update(made, ["price"]))
    assert sorted(Booking.objects.values_list("price", flat=True)) == [10, 10]


# -- column checks ---------------------------------------------------------------------------


def test_positive_integer_field(alias):
    refused(alias, '"seats" >= 0', booking(seats=-1).save)
    b = booking(seats=0)
    b.save()
    b.seats = F("seats") - 1  # Django's own test of this: the database must refuse it
    refused(alias, '"seats" >= 0', b.save)
    assert Booking.objects.get().seats == 0


def test_json_must_be_valid(alias):
    b = booking(extra={"a": [1, 2]})
    b.save()
    bad = Value("{not json", output_field=CharField())
    refused(alias, "JSON_VALID", lambda: Booking.objects.update(extra=bad))
    Booking.objects.update(extra=Value('{"b": null}', output_field=CharField()))
    assert Booking.objects.get().extra == {"b": None}


# -- model validation (Q.check) --------------------------------------------------------------


def test_full_clean_validates_check_constraints(alias):
    booking().full_clean()
    with pytest.raises(ValidationError) as caught:
        booking(price=decimal.Decimal("-1")).full_clean()
    assert "price_not_negative" in str(caught.value)
    with pytest.raises(ValidationError, match="ends_after_start"):
        booking(ends=DAY - datetime.timedelta(days=2)).full_clean()
    booking(ends=None).full_clean()  # unknown is not a violation


def test_q_check_is_a_select_without_a_table(alias):
    assert Q(n__gt=1).check({"n": Value(2)}, using=alias) is True
    assert Q(n__gt=1).check({"n": Value(1)}, using=alias) is False
    assert (Q(n__gt=1) | Q(s__startswith="a")).check(
        {"n": Value(0), "s": Value("abc")}, using=alias
    )
