"""``Cast(expression, output_field)``: the conversions SQL databases agree on, or a refusal.

A cast is evaluated on the stored value by the target field's type (a foreign key casts
to the type of the key it points to). Conversions on which SQL databases give different
answers are refused with ``NotSupportedError`` naming a way that is exact everywhere
(the text of a decimal is ``'1.1'`` on SQLite and ``'1.10'`` on PostgreSQL; a float cast
to an integer is truncated by one and rounded by the other). Text that does not read as
the target type is a ``DataError``, as on PostgreSQL (SQLite would read a prefix).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import re
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldError
from django.db.models.functions import Cast

from django_zerodb.exceptions import DataError, NotSupportedError
from django_zerodb.registry import VALUES
from django_zerodb.values import computing

# Half away from zero, as a numeric cast rounds (PostgreSQL, MySQL; rounds_to_even False).
WIDE = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP)
INT64 = (-(2**63), 2**63 - 1)
_INTEGER = re.compile(r"\s*([+-]?\d+)\s*")
_NUMBER = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def cast(ev: Any, expr: Any, row: dict) -> Any:
    source = expr.source_expressions[0]
    value = ev.value(source, row)
    if value is None:
        return None
    with computing("Cast"):
        return convert(value, _internal_type(source), expr.output_field)


def convert(value: Any, source_type: str | None, target: Any) -> Any:
    """``value`` (stored, of a field of ``source_type``) as the target field stores it."""
    target_type = target.get_internal_type()
    if target_type in ("ForeignKey", "OneToOneField"):
        target = _key_field(target)
        target_type = target.get_internal_type()
    if target_type == "JSONField" and source_type != "JSONField" and isinstance(value, str):
        return to_json(value)
    # Stored as integers (durations) and text (JSON): only a cast to the same type keeps
    # their meaning here.
    for special in ("DurationField", "JSONField"):
        if special in (source_type, target_type):
            if source_type == target_type:
                return value
            raise _refused(value, target_type, f"a {special} is stored in its own form here")
    conversion = CONVERSIONS.get(target_type)
    if conversion is None:
        raise _refused(value, target_type, "this target type has no cast here")
    return conversion(value, target)


def _refused(value: Any, target_type: str, why: str) -> NotSupportedError:
    return NotSupportedError(
        f"Cast of a {type(value).__name__} to {target_type} is not supported by the "
        f"encrypted database ({why}): convert the value in Python, or cast from a type "
        "SQL databases agree on"
    )


def _internal_type(source: Any) -> str | None:
    try:
        field = source._output_field_or_none
    except FieldError:
        return None
    return None if field is None else field.get_internal_type()


def _key_field(field: Any) -> Any:
    try:
        return field.target_field
    except (AttributeError, ValueError, FieldError) as exc:
        raise NotSupportedError(
            "Cast to a foreign key whose target is not resolved is not supported by the "
            "encrypted database: cast to the key's own field type (IntegerField...)"
        ) from exc


def to_text(value: Any, field: Any) -> str:
    if isinstance(value, str):
        result = value
    elif isinstance(value, bool):
        raise _refused(value, "text", "'1' on SQLite, 'true' on PostgreSQL")
    elif isinstance(value, int):
        result = str(value)
    elif isinstance(value, datetime.datetime):
        if settings.USE_TZ:
            raise _refused(value, "text", "PostgreSQL writes the offset of an aware datetime")
        result = value.isoformat(sep=" ")
    elif isinstance(value, datetime.date | datetime.time):
        result = value.isoformat()
    else:
        raise _refused(value, "text", "SQL databases write it differently")
    max_length = getattr(field, "max_length", None)
    return result[:max_length] if max_length else result  # varchar(n) cuts (SQL standard)


def to_integer(value: Any, field: Any) -> int:
    if isinstance(value, bool):
        result = int(value)
    elif isinstance(value, int):
        result = value
    elif isinstance(value, float | decimal.Decimal):
        if not math.isfinite(value):
            raise DataError(f"cannot cast {value} to an integer")
        if value != int(value):
            raise _refused(
                value,
                "an integer",
                "SQLite truncates toward zero, PostgreSQL rounds: apply Round, Floor or Ceil first",
            )
        result = int(value)
    elif isinstance(value, str):
        match = _INTEGER.fullmatch(value)
        if match is None:
            raise DataError(f"invalid input syntax for type integer: {value!r}")
        result = int(match.group(1))
    else:
        raise _refused(value, "an integer", "no such conversion")
    if not INT64[0] <= result <= INT64[1]:
        raise DataError("integer out of range")
    return result


def to_float(value: Any, field: Any) -> float:
    if isinstance(value, bool):
        raise _refused(value, "FloatField", "no such conversion on PostgreSQL")
    if isinstance(value, int | float | decimal.Decimal):
        return float(value)
    if isinstance(value, str):
        match = _NUMBER.fullmatch(value)
        if match is None:
            raise DataError(f"invalid input syntax for type double precision: {value!r}")
        return float(match.group(1))
    raise _refused(value, "FloatField", "no such conversion")


def to_decimal(value: Any, field: Any) -> decimal.Decimal:
    if isinstance(value, bool):
        raise _refused(value, "DecimalField", "no such conversion on PostgreSQL")
    if isinstance(value, int):
        number = decimal.Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise DataError(f"cannot cast {value} to a decimal")
        # The 15 significant digits PostgreSQL keeps of a double cast to numeric (and
        # Django's SQLite converter of a REAL).
        number = decimal.Decimal(format(value, ".15g"))
    elif isinstance(value, decimal.Decimal):
        number = value
    elif isinstance(value, str):
        match = _NUMBER.fullmatch(value)
        if match is None:
            raise DataError(f"invalid input syntax for type numeric: {value!r}")
        number = decimal.Decimal(match.group(1))
    else:
        raise _refused(value, "DecimalField", "no such conversion")
    places, digits = field.decimal_places, field.max_digits
    if places is not None:
        number = number.quantize(decimal.Decimal(1).scaleb(-places), context=WIDE)
    if digits is not None and number and number.adjusted() >= digits - (places or 0):
        raise DataError(f"numeric field overflow: {number} does not fit ({digits}, {places})")
    return number


def to_boolean(value: Any, field: Any) -> bool:
    if isinstance(value, bool | int):
        return value != 0
    raise _refused(value, "BooleanField", "SQL databases read it differently")


def to_date(value: Any, field: Any) -> datetime.date:
    if isinstance(value, datetime.datetime):
        return value.date()  # stored in UTC, the connection's time zone
    if isinstance(value, datetime.date):
        return value
    if isinstance(value, str):
        if not _DATE.fullmatch(value.strip()):
            raise DataError(f"invalid input syntax for type date: {value!r}")
        return datetime.date.fromisoformat(value.strip())
    raise _refused(value, "DateField", "no such conversion")


def to_datetime(value: Any, field: Any) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return value
    if isinstance(value, datetime.date):
        return datetime.datetime.combine(value, datetime.time())  # midnight, UTC
    raise _refused(value, "DateTimeField", "SQL databases read it differently")


def to_time(value: Any, field: Any) -> datetime.time:
    if isinstance(value, datetime.datetime):
        return value.time()  # of the stored UTC value, as both SQLite and PostgreSQL
    if isinstance(value, datetime.time):
        return value
    raise _refused(value, "TimeField", "SQL databases read it differently")


def to_json(value: str) -> str:
    """Text read as JSON (PostgreSQL's ``text::jsonb``): kept as the JSON text it is,
    which is how JSON is stored here; text that is not JSON is a DataError."""
    try:
        json.loads(value)
    except ValueError as exc:
        raise DataError(f"invalid input syntax for type json: {value!r}") from exc
    return value


def to_uuid(value: Any, field: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError as exc:
            raise DataError(f"invalid input syntax for type uuid: {value!r}") from exc
    raise _refused(value, "UUIDField", "no such conversion")


CONVERSIONS: dict[str, Callable[[Any, Any], Any]] = {
    "CharField": to_text,
    "TextField": to_text,
    "SlugField": to_text,
    "FloatField": to_float,
    "DecimalField": to_decimal,
    "BooleanField": to_boolean,
    "DateField": to_date,
    "DateTimeField": to_datetime,
    "TimeField": to_time,
    "UUIDField": to_uuid,
}
# The integer fields (auto, big, small, positive...), all stored as Python ints.
INTEGER_FIELDS = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "SmallAutoField",
        "IntegerField",
        "BigIntegerField",
        "SmallIntegerField",
        "PositiveIntegerField",
        "PositiveBigIntegerField",
        "PositiveSmallIntegerField",
    }
)
for _name in INTEGER_FIELDS:
    CONVERSIONS[_name] = to_integer

VALUES.add(Cast, cast)


def assigned(field: Any, value: Any) -> Any:
    """A computed value stored into ``field`` (an UPDATE's ``SET`` or an INSERT of an
    expression), converted as SQL's assignment casts do it between dates and datetimes:
    ``date + duration`` is a datetime (Django types it so), kept as its date in a
    DateField, as PostgreSQL does and as SQLite's text arithmetic gives."""
    internal = field.get_internal_type()
    if internal == "DateField" and isinstance(value, datetime.datetime):
        return value.date()
    if internal == "DateTimeField" and type(value) is datetime.date:
        return datetime.datetime.combine(value, datetime.time())
    return value
