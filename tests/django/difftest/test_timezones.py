"""A database's ``TIME_ZONE`` on both databases: datetimes are written naive in it and
read back aware in it (so a value written under one setting reads shifted under
another, as on SQLite), and date functions and lookups start from it.
"""

from __future__ import annotations

import contextlib
import datetime
import zoneinfo

import pytest
from django.db import connections
from django.db.models.functions import ExtractHour, Now, TruncDay
from django.utils import timezone

from tests.django.difftest.models import Item
from tests.django.difftest.test_differential import ENC, PLAIN

pytestmark = pytest.mark.django_db(databases=["default", ENC, PLAIN])

UTC = datetime.UTC
BANGKOK = "Asia/Bangkok"
AT = datetime.datetime(2011, 9, 1, 20, 20, 30, tzinfo=UTC)


@contextlib.contextmanager
def database_zone(using: str, name: str):
    """A database's TIME_ZONE for a while (as Django's own timezones tests set it)."""
    connection = connections[using]
    before = connection.settings_dict["TIME_ZONE"]

    def reset():
        for cached in ("timezone", "timezone_name"):
            connection.__dict__.pop(cached, None)

    connection.settings_dict["TIME_ZONE"] = name
    reset()
    try:
        yield
    finally:
        connection.settings_dict["TIME_ZONE"] = before
        reset()


def both(make):
    plain, encrypted = make(PLAIN), make(ENC)
    assert plain == encrypted, f"\nsqlite:    {plain!r}\nencrypted: {encrypted!r}"
    return encrypted


def test_written_in_one_zone_read_in_another():
    def run(using):
        manager = Item.objects.using(using)
        manager.create(pk=1, at=AT)
        with database_zone(using, BANGKOK):
            manager.create(pk=2, at=AT)
            inside = [i.at for i in manager.order_by("pk")]
        outside = [i.at for i in manager.order_by("pk")]
        return inside, outside

    inside, outside = both(run)
    assert inside[1] == AT and outside[0] == AT and outside[1] != AT


@pytest.mark.parametrize("current", ["UTC", "America/New_York", BANGKOK])
def test_functions_and_lookups_start_from_the_database_zone(current):
    def run(using):
        manager = Item.objects.using(using)
        with database_zone(using, BANGKOK):
            manager.bulk_create(
                [Item(pk=i, at=AT + datetime.timedelta(hours=5 * i)) for i in range(1, 6)]
            )
            with timezone.override(zoneinfo.ZoneInfo(current)):
                return (
                    list(
                        manager.order_by("pk").values_list(
                            ExtractHour("at"), TruncDay("at"), "at__date"
                        )
                    ),
                    sorted(manager.filter(at__date=datetime.date(2011, 9, 2)).values_list("pk")),
                    sorted(manager.filter(at__hour__gte=12).values_list("pk")),
                    manager.filter(at__lt=Now()).count(),
                )

    both(run)
