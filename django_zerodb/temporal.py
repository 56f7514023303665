"""Dates, times and durations: Extract, Trunc, Now, and date arithmetic, as SQL does them.

Datetimes are stored naive in the connection's time zone when ``USE_TZ`` is on (UTC, or
the database's ``TIME_ZONE``, as on SQLite), durations as integer microseconds. A
function with a time zone (the current one, or ``tzinfo=``) first turns the stored value
into the wall time of that zone, with Django's own rules for zone names that carry an
offset (``"UTC+05:00"``, ``"-10"``), as its SQLite and PostgreSQL backends do.
"""

from __future__ import annotations

import datetime
import decimal
import zoneinfo
from typing import Any

from django.core.exceptions import FieldError
from django.db.backends.utils import split_tzname_delta
from django.db.models import DateField, DateTimeField, TimeField
from django.db.models.expressions import DurationExpression, TemporalSubtraction
from django.db.models.functions import datetime as dt_functions
from django.utils import timezone
from django.utils.duration import duration_microseconds

from django_zerodb.exceptions import DataError, NotSupportedError
from django_zerodb.registry import VALUES
from django_zerodb.values import computing

UTC = datetime.UTC
DATE_KINDS = ("year", "quarter", "month", "week", "day")
TIME_KINDS = ("hour", "minute", "second")


def zone(name: str) -> datetime.tzinfo:
    if name == "UTC":
        return UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise DataError(f"time zone {name!r} not recognized") from exc


def stored_zone(connection: Any) -> datetime.tzinfo:
    """The zone stored naive datetimes are in: the connection's (UTC unless the database
    sets ``TIME_ZONE``)."""
    return connection.timezone or UTC


def wall_time(
    value: datetime.datetime, tzname: str | None, stored: datetime.tzinfo = UTC
) -> datetime.datetime:
    """A stored datetime (naive in ``stored``) as the naive wall time in ``tzname``
    (None: unchanged)."""
    if tzname is None:
        return value
    aware = value.replace(tzinfo=stored) if value.tzinfo is None else value
    name, sign, offset = split_tzname_delta(tzname)
    if offset:
        hours, minutes = offset.split(":")
        delta = datetime.timedelta(hours=int(hours), minutes=int(minutes))
        aware = aware + delta if sign == "+" else aware - delta
    # A bare offset ("+03:00", "-10") leaves no name: the connection's zone.
    return aware.astimezone(zone(name) if name else stored).replace(tzinfo=None)


def local(ev: Any, value: Any, expr: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return wall_time(value, expr.get_tzname(), stored_zone(ev.connection))
    return value


# -- Extract --------------------------------------------------------------------------------


def extract(ev: Any, expr: Any, row: dict) -> Any:
    if _internal_type(expr.lhs) == "DurationField":
        # Django's own words on a backend without a native duration type.
        raise ValueError("Extract requires native DurationField database support.")
    kind = expr.lookup_name
    if kind not in EXTRACTS:
        raise ValueError(f"Invalid lookup type: {kind!r}")  # as Django's backends say it
    value = ev.value(expr.lhs, row)
    if value is None:
        return None
    with computing(f"Extract({kind!r})"):
        return EXTRACTS[kind](local(ev, value, expr))


EXTRACTS = {
    "year": lambda v: v.year,
    "iso_year": lambda v: v.isocalendar()[0],
    "month": lambda v: v.month,
    "day": lambda v: v.day,
    "week": lambda v: v.isocalendar()[1],
    "week_day": lambda v: v.isoweekday() % 7 + 1,
    "iso_week_day": lambda v: v.isoweekday(),
    "quarter": lambda v: (v.month - 1) // 3 + 1,
    "hour": lambda v: v.hour,
    "minute": lambda v: v.minute,
    "second": lambda v: v.second,
}


# -- Trunc ----------------------------------------------------------------------------------


def trunc(ev: Any, expr: Any, row: dict) -> Any:
    """Truncate to ``expr.kind``; the shape of the answer is the output field's, as
    Django's SQL picks datetime, date or time truncation by it (``Trunc(dt, "day",
    output_field=DateField())`` is a date)."""
    value = ev.value(expr.lhs, row)
    if value is None:
        return None
    kind = expr.kind
    value = local(ev, value, expr)
    is_datetime = isinstance(value, datetime.datetime)
    if isinstance(expr, dt_functions.TruncDate):  # a cast to date, in the time zone
        return value.date() if is_datetime else value
    if isinstance(expr, dt_functions.TruncTime):
        return value.time() if is_datetime else value
    output = expr.output_field
    if isinstance(output, DateTimeField):
        if not is_datetime:
            raise DataError(f"cannot truncate a {type(value).__name__} to a datetime")
        if kind in DATE_KINDS:
            return datetime.datetime.combine(_trunc_date(value.date(), kind), datetime.time())
        return datetime.datetime.combine(value.date(), _trunc_time(value.time(), kind))
    if isinstance(output, DateField):
        if isinstance(value, datetime.time):
            raise DataError("cannot truncate a time to a date")
        return _trunc_date(value.date() if is_datetime else value, kind)
    if isinstance(output, TimeField):
        if isinstance(value, datetime.date) and not is_datetime:
            raise DataError("cannot truncate a date to a time")
        return _trunc_time(value.time() if is_datetime else value, kind)
    raise NotSupportedError(
        f"Trunc to {type(output).__name__} is not supported by the encrypted database: use "
        "a DateTimeField, DateField or TimeField output_field"
    )


def _trunc_date(day: datetime.date, kind: str) -> datetime.date:
    if kind == "year":
        return day.replace(month=1, day=1)
    if kind == "quarter":
        return day.replace(month=(day.month - 1) // 3 * 3 + 1, day=1)
    if kind == "month":
        return day.replace(day=1)
    if kind == "week":
        return day - datetime.timedelta(days=day.weekday())
    if kind == "day":
        return day
    raise DataError(f"unsupported truncation of a date to {kind!r}")


def _trunc_time(t: datetime.time, kind: str) -> datetime.time:
    if kind == "hour":
        return t.replace(minute=0, second=0, microsecond=0)
    if kind == "minute":
        return t.replace(second=0, microsecond=0)
    if kind == "second":
        return t.replace(microsecond=0)
    raise DataError(f"unsupported truncation of a time to {kind!r}")


# -- Now ------------------------------------------------------------------------------------


def now(ev: Any, expr: Any, row: dict) -> Any:
    """CURRENT_TIMESTAMP: one value for the whole statement (it is per transaction on
    PostgreSQL, per statement on SQLite; never per row)."""
    if ev.now is None:
        current = timezone.now()
        if timezone.is_aware(current):
            current = timezone.make_naive(current, stored_zone(ev.connection))
        ev.now = current
    return ev.now


# -- arithmetic -----------------------------------------------------------------------------


def _internal_type(side: Any) -> str | None:
    try:
        field = side._output_field_or_none
    except FieldError:
        return None
    return None if field is None else field.get_internal_type()


def operand(side: Any, value: Any) -> Any:
    """A duration operand as a timedelta (DurationField values are microseconds); a date
    added to a duration is its midnight (the result is a datetime, as Django types it:
    DateField + DurationField is a DateTimeField)."""
    if _internal_type(side) == "DurationField" and isinstance(value, int):
        return datetime.timedelta(microseconds=value)
    if type(value) is datetime.date:
        return datetime.datetime.combine(value, datetime.time())
    return value


def duration_expression(ev: Any, expr: Any, row: dict) -> Any:
    """``date/datetime +- duration``, ``duration * number``, ``duration / number``."""
    a = ev.value(expr.lhs, row)
    b = ev.value(expr.rhs, row)
    if a is None or b is None:
        return None
    a, b = operand(expr.lhs, a), operand(expr.rhs, b)
    op = expr.connector
    with computing(f"the duration arithmetic {op!r}"):
        if isinstance(a, datetime.time) or isinstance(b, datetime.time):
            raise NotSupportedError(
                "time +- duration is not supported by the encrypted database (PostgreSQL "
                "wraps around midnight, SQLite answers NULL): use a DateTimeField"
            )
        if op in ("+", "-"):
            if op == "-" and isinstance(b, datetime.datetime):
                raise TypeError("a duration minus a datetime")
            result = a + b if op == "+" else a - b
            if isinstance(result, datetime.timedelta):
                return duration_microseconds(result)
            return result
        if op in ("*", "/"):
            return _scaled(a, b, op)
    raise NotSupportedError(f"the operator {op!r} on durations is not supported")


def _scaled(a: Any, b: Any, op: str) -> int:
    """A duration times or divided by a number, in microseconds rounded half to even
    (Python's timedelta arithmetic, and what a float of microseconds becomes)."""
    if isinstance(a, datetime.timedelta) and not isinstance(b, datetime.timedelta):
        duration, number = a, b
    elif op == "*" and isinstance(b, datetime.timedelta) and not isinstance(a, datetime.timedelta):
        duration, number = b, a
    else:
        raise TypeError(f"{type(a).__name__} {op} {type(b).__name__}")
    if isinstance(number, bool) or not isinstance(number, int | float | decimal.Decimal):
        raise TypeError(f"a duration {op} {type(number).__name__}")
    if op == "/" and number == 0:
        raise ZeroDivisionError("division by zero")
    if isinstance(number, decimal.Decimal):
        micro = decimal.Decimal(duration_microseconds(duration))
        exact = micro * number if op == "*" else micro / number
        return int(exact.to_integral_value(decimal.ROUND_HALF_EVEN))
    result = duration * number if op == "*" else duration / number
    return duration_microseconds(result)


def temporal_subtraction(ev: Any, expr: Any, row: dict) -> Any:
    """``a - b`` of two dates, datetimes or times: a duration (microseconds)."""
    a = ev.value(expr.lhs, row)
    b = ev.value(expr.rhs, row)
    if a is None or b is None:
        return None
    with computing("the subtraction of two temporal values"):
        if isinstance(a, datetime.time) and isinstance(b, datetime.time):
            # Times of day: the difference of their microseconds since midnight.
            return _time_micro(a) - _time_micro(b)
        if type(a) is datetime.date and isinstance(b, datetime.datetime):
            a = datetime.datetime.combine(a, datetime.time())
        if type(b) is datetime.date and isinstance(a, datetime.datetime):
            b = datetime.datetime.combine(b, datetime.time())
        return duration_microseconds(a - b)


def _time_micro(t: datetime.time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


for _extract in (
    dt_functions.Extract,
    dt_functions.ExtractYear,
    dt_functions.ExtractIsoYear,
    dt_functions.ExtractMonth,
    dt_functions.ExtractDay,
    dt_functions.ExtractWeek,
    dt_functions.ExtractWeekDay,
    dt_functions.ExtractIsoWeekDay,
    dt_functions.ExtractQuarter,
    dt_functions.ExtractHour,
    dt_functions.ExtractMinute,
    dt_functions.ExtractSecond,
):
    VALUES.add(_extract, extract)
for _trunc in (
    dt_functions.Trunc,
    dt_functions.TruncYear,
    dt_functions.TruncQuarter,
    dt_functions.TruncMonth,
    dt_functions.TruncWeek,
    dt_functions.TruncDay,
    dt_functions.TruncDate,
    dt_functions.TruncTime,
    dt_functions.TruncHour,
    dt_functions.TruncMinute,
    dt_functions.TruncSecond,
):
    VALUES.add(_trunc, trunc)
VALUES.add(dt_functions.Now, now)
VALUES.add(DurationExpression, duration_expression)
VALUES.add(TemporalSubtraction, temporal_subtraction)
