"""Evaluate Django expressions and lookups in Python, on decrypted rows, as SQL would.

A *row* maps each table alias of a query to its record (a dict of column -> value, the
primary key included) or to None (an outer join that found nothing). Conditions use SQL's
three-valued logic: a comparison with NULL is *unknown* (None), ``NOT unknown`` is
unknown, and a row passes a WHERE clause only when it is True. Expressions dispatch on
their class name (and lookups on ``lookup_name``, as django-mongodb-backend does), never
on SQL text; anything unknown raises ``NotSupportedError`` naming what to do instead.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import math
import random
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.db.models.sql.where import AND, OR, XOR, NothingNode, WhereNode
from django.utils import timezone
from django.utils.duration import duration_microseconds

from django_zerodb.exceptions import NotSupportedError
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import QueryError
from zerodb_core.query.operators import Contains

Row = dict[str, Any]

# Aggregate values of the current group, keyed by ``id(aggregate expression)``.
AGGREGATES = "__aggregates__"
# Annotation values already computed for a row (``Ref`` points to them by name).
ANNOTATIONS = "__annotations__"


def compare(a: Any, b: Any) -> int:
    """-1, 0 or 1, ordering values as the engine's indexes do (numbers by value, then
    strings, ...), so a filter checked in Python agrees with an index scan."""
    try:
        if a == b:
            return 0
        return -1 if a < b else 1
    except TypeError:
        try:
            ka, kb = encode_key(a), encode_key(b)
        except QueryError:  # values with no key order (JSON lists, dicts): by type, text
            ka, kb = (type(a).__name__, repr(a)), (type(b).__name__, repr(b))
        return (ka > kb) - (ka < kb)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


LOOKUP_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "exact": lambda a, b: compare(a, b) == 0,
    "iexact": lambda a, b: _text(a).lower() == _text(b).lower(),
    "gt": lambda a, b: compare(a, b) > 0,
    "gte": lambda a, b: compare(a, b) >= 0,
    "lt": lambda a, b: compare(a, b) < 0,
    "lte": lambda a, b: compare(a, b) <= 0,
    "contains": lambda a, b: _text(b) in _text(a),
    "icontains": lambda a, b: _text(b).lower() in _text(a).lower(),
    "startswith": lambda a, b: _text(a).startswith(_text(b)),
    "istartswith": lambda a, b: _text(a).lower().startswith(_text(b).lower()),
    "endswith": lambda a, b: _text(a).endswith(_text(b)),
    "iendswith": lambda a, b: _text(a).lower().endswith(_text(b).lower()),
    "regex": lambda a, b: re.search(_text(b), _text(a)) is not None,
    "iregex": lambda a, b: re.search(_text(b), _text(a), re.IGNORECASE) is not None,
    "search": lambda a, b: Contains("", _text(b)).test(a),
}


def lookup_test(name: str, lhs: Any, rhs: Any) -> bool | None:
    """Decide ``lhs <name> rhs`` with SQL NULL semantics (None = unknown)."""
    if name == "isnull":
        return (lhs is None) == bool(rhs)
    if name == "in" and not rhs:
        return False  # IN over nothing is False, even for NULL
    if lhs is None:
        return None
    if name == "in":
        values = [v for v in rhs if v is not None]
        if any(compare(lhs, v) == 0 for v in values):
            return True
        return None if len(values) != len(rhs) else False
    if name == "range":
        low, high = rhs
        if low is None or high is None:
            return None
        return compare(lhs, low) >= 0 and compare(lhs, high) <= 0
    test = LOOKUP_TESTS.get(name)
    if test is None:
        raise NotSupportedError(
            f"the lookup {name!r} is not supported by the encrypted database; use one of "
            f"{', '.join(sorted([*LOOKUP_TESTS, 'in', 'range', 'isnull']))}"
        )
    if rhs is None:
        return None
    return test(lhs, rhs)


def and3(values) -> bool | None:
    result: bool | None = True
    for v in values:
        if v is False:
            return False
        if v is None:
            result = None
    return result


def or3(values) -> bool | None:
    result: bool | None = False
    for v in values:
        if v is True:
            return True
        if v is None:
            result = None
    return result


def not3(value: bool | None) -> bool | None:
    return None if value is None else not value


class Evaluator:
    """Evaluate expressions and conditions of one query on rows.

    ``prepare_rhs`` turns a lookup's right-hand side into stored values once per lookup
    (subqueries run once, values go through the field's ``get_db_prep_value``).
    """

    def __init__(
        self,
        connection,
        resolve_subquery: Callable[[Any], list],
        decorrelate: Callable[[Any], tuple[list, set]],
    ) -> None:
        self.connection = connection
        self.resolve_subquery = resolve_subquery
        self.decorrelate = decorrelate
        self._rhs: dict[int, Any] = {}
        self._exists: dict[int, tuple[list, set]] = {}
        # ``extra(select=...)`` columns Django itself adds (see query._extra_columns).
        self.raw_columns: dict[str, tuple[str, str]] = {}

    # -- conditions ------------------------------------------------------------------------

    def truth(self, node: Any, row: Row) -> bool | None:
        if isinstance(node, WhereNode):
            values = (self.truth(child, row) for child in node.children)
            if node.connector == AND:
                result = and3(values)
            elif node.connector == OR:
                result = or3(values)
            elif node.connector == XOR:
                result = _xor3(list(values))
            else:
                raise NotSupportedError(f"unknown connector {node.connector!r}")
            return not3(result) if node.negated else result
        if isinstance(node, NothingNode):
            return False
        if hasattr(node, "lookup_name") and hasattr(node, "rhs"):
            return self.lookup_truth(node, row)
        value = self.value(node, row)
        if value is None:
            return None
        return bool(value)

    def lookup_truth(self, lookup: Any, row: Row) -> bool | None:
        lhs = self.value(lookup.lhs, row)
        rhs = self.rhs(lookup, row)
        if _is_json(lookup.lhs):
            return _json_lookup(lookup, lhs, rhs)
        return lookup_test(lookup.lookup_name, lhs, rhs)

    def rhs(self, lookup: Any, row: Row) -> Any:
        """The right-hand side of a lookup as stored values (cached when constant)."""
        key = id(lookup)
        if key in self._rhs:
            return self._rhs[key]
        rhs = lookup.rhs
        constant = True
        name = lookup.lookup_name
        if _is_query(rhs):
            db = getattr(rhs, "_db", None)
            if db is not None and db != self.connection.alias:
                raise ValueError(
                    "Subqueries aren't allowed across different databases. Force the "
                    "inner query to be evaluated using `list(inner_query)`."
                )
            value = self.resolve_subquery(rhs)
            if name not in ("in",):
                value = value[0] if value else None
        elif hasattr(rhs, "resolve_expression") or hasattr(rhs, "as_sql"):
            constant = _is_constant(rhs)
            value = self.value(rhs, row)
        elif name in ("in", "range"):
            # Django drops None from a list of values for ``in`` (NULL equals nothing).
            value = [self._item(lookup, v, row) for v in rhs if v is not None or name == "range"]
            constant = all(not hasattr(v, "resolve_expression") for v in rhs)
        elif name == "isnull":
            value = rhs
        else:
            value = self.prep(lookup, rhs)
        if constant:
            self._rhs[key] = value
        return value

    def _item(self, lookup: Any, value: Any, row: Row) -> Any:
        if hasattr(value, "resolve_expression"):
            return self.value(value, row)
        return self.prep(lookup, value)

    def prep(self, lookup: Any, value: Any) -> Any:
        """A direct value as the lhs field stores it (dates, decimals, naive UTC...)."""
        if value is None or lookup.lookup_name in _PATTERN_LOOKUPS:
            return value
        if _is_json(lookup.lhs):
            return value  # compared as Python values (see _json_lookup)
        if not getattr(lookup, "prepare_rhs", True) and not _is_field_lookup(lookup):
            return value
        field = getattr(lookup.lhs, "output_field", None)
        if field is None or not hasattr(field, "get_db_prep_value"):
            return value
        try:
            return field.get_db_prep_value(value, self.connection, prepared=True)
        except (TypeError, ValueError, decimal.InvalidOperation):
            return value

    # -- values ----------------------------------------------------------------------------

    def value(self, expr: Any, row: Row) -> Any:
        handler = _HANDLERS.get(type(expr).__name__)
        if handler is None:
            for klass in type(expr).__mro__[1:]:
                handler = _HANDLERS.get(klass.__name__)
                if handler is not None:
                    break
        if handler is None:
            if hasattr(expr, "lookup_name") and hasattr(expr, "rhs"):
                return self.lookup_truth(expr, row)
            raise NotSupportedError(
                f"the expression {type(expr).__name__} cannot be evaluated by the encrypted "
                "database; compute it in Python on the fetched objects instead"
            )
        return handler(self, expr, row)


# -- JSONField ----------------------------------------------------------------------------
# JSON is stored as its text. Key transforms parse it and walk keys in Python; lookups on
# JSON compare Python values (so key order and spacing never matter).

_MISSING = object()


def _is_json(expr: Any) -> bool:
    field = getattr(expr, "_output_field_or_none", None)
    return field is not None and field.get_internal_type() == "JSONField"


def _parsed(value: Any) -> Any:
    """The Python value of a stored JSON text (a key transform's value is already one)."""
    if isinstance(value, _Parsed):
        return value.value
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return _MISSING
    return value


def exported(value: Any) -> Any:
    """A value as a query returns it: a JSON key's value is handed to JSONField's
    ``from_db_value`` (strings as JSON text, as SQLite returns them)."""
    if isinstance(value, _Parsed):
        inner = value.value
        if inner is _MISSING or inner is None:
            return None
        return json.dumps(inner) if isinstance(inner, str) else inner
    return value


def sortable(value: Any) -> Any:
    if isinstance(value, _Parsed):
        return None if value.value is _MISSING else value.value
    return value


class _Parsed:
    """A value extracted from JSON by a key transform (not JSON text any more)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _key_transform(ev: Evaluator, expr: Any, row: Row) -> Any:
    document = _parsed(ev.value(expr.lhs, row))
    key = expr.key_name
    if isinstance(document, dict):
        found = document.get(key, _MISSING)
    elif isinstance(document, list):
        try:
            index = int(key)
            found = document[index] if -len(document) <= index < len(document) else _MISSING
        except ValueError:
            found = _MISSING
    else:
        found = _MISSING
    if type(expr).__name__ == "KeyTextTransform":
        if found is _MISSING or found is None:
            return None
        return json.dumps(found) if isinstance(found, dict | list) else found
    return _Parsed(found)


def _json_lookup(lookup: Any, lhs: Any, rhs: Any) -> bool | None:
    """A lookup whose left side is JSON (a column or a key of one)."""
    name = lookup.lookup_name
    value = _parsed(lhs)
    keyed = isinstance(lhs, _Parsed)
    if name == "isnull":
        absent = value is _MISSING or (not keyed and lhs is None)
        return absent == bool(rhs)
    if value is _MISSING or (lhs is None and not keyed):
        return None
    if name in ("has_key", "has_keys", "has_any_keys"):
        keys = [rhs] if name == "has_key" else list(rhs)
        found = [_has_key(value, str(k)) for k in keys]
        return any(found) if name == "has_any_keys" else all(found)
    if name in ("exact", "iexact"):
        target = _json_rhs(rhs)
        if name == "iexact" and isinstance(value, str) and isinstance(target, str):
            return value.lower() == target.lower()
        return _json_equal(value, target)
    if name == "in":
        return any(_json_equal(value, _json_rhs(v)) for v in rhs)
    if name in _PATTERN_LOOKUPS:
        if value is None:
            return None
        text = value if isinstance(value, str) else json.dumps(value)
        return lookup_test(name, text, rhs)
    if value is None:
        return None
    return lookup_test(name, value, _json_rhs(rhs))


def _json_rhs(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _has_key(value: Any, key: str) -> bool:
    if isinstance(value, dict):
        return key in value
    if isinstance(value, list):
        try:
            return -len(value) <= int(key) < len(value)
        except ValueError:
            return False
    return False


def _xor3(values: list) -> bool | None:
    """XOR as Django writes it for SQL without XOR: ``(a OR b ...) AND`` an odd number
    of the terms are TRUE (an unknown term counts as not TRUE)."""
    parity = sum(v is True for v in values) % 2 == 1
    return and3([or3(values), parity])


_PATTERN_LOOKUPS = frozenset(
    {
        "contains",
        "icontains",
        "startswith",
        "istartswith",
        "endswith",
        "iendswith",
        "regex",
        "iregex",
        "iexact",
        "search",
    }
)


def _is_field_lookup(lookup: Any) -> bool:
    return hasattr(getattr(lookup.lhs, "output_field", None), "get_db_prep_value")


def _is_query(value: Any) -> bool:
    from django.db.models.sql.query import Query

    return isinstance(value, Query) or type(value).__name__ == "Subquery"


def _is_constant(expr: Any) -> bool:
    if type(expr).__name__ in ("Col", "Ref", "ResolvedOuterRef", "OuterRef"):
        return False
    return all(_is_constant(e) for e in expr.get_source_expressions() if e is not None)


# -- expression handlers, by class name -------------------------------------------------------


def _col(ev: Evaluator, expr: Any, row: Row) -> Any:
    record = row.get(expr.alias)
    if record is None:
        return None
    return record.get(expr.target.column)


def _col_pairs(ev: Evaluator, expr: Any, row: Row) -> Any:
    """A row value ``(a, b, ...)`` (tuple lookups); NULL if any part is NULL."""
    values = tuple(_col(ev, col, row) for col in expr.get_cols())
    return None if None in values else values


def _raw_sql(ev: Evaluator, expr: Any, row: Row) -> Any:
    ref = ev.raw_columns.get(expr.sql)
    if ref is None or expr.params:
        raise NotSupportedError(
            "raw SQL (RawSQL, QuerySet.extra()) is not supported by the encrypted database: "
            "use annotate()/filter() with F() and expressions instead"
        )
    record = row.get(ref[0])
    return None if record is None else record.get(ref[1])


def _extra_where(ev: Evaluator, expr: Any, row: Row) -> Any:
    raise NotSupportedError(
        "QuerySet.extra(where=...) is not supported by the encrypted database: use "
        "filter() with Q objects and expressions instead"
    )


def _ref(ev: Evaluator, expr: Any, row: Row) -> Any:
    computed = row.get(ANNOTATIONS)
    if computed is not None and expr.refs in computed:
        return computed[expr.refs]
    return ev.value(expr.source, row)


def _aggregate(ev: Evaluator, expr: Any, row: Row) -> Any:
    values = row.get(AGGREGATES)
    if values is None or id(expr) not in values:
        raise NotSupportedError(
            f"{type(expr).__name__}() is only supported in aggregate() and annotate() "
            "on the encrypted database"
        )
    return values[id(expr)]


def _combined(ev: Evaluator, expr: Any, row: Row) -> Any:
    a = ev.value(expr.lhs, row)
    b = ev.value(expr.rhs, row)
    if a is None or b is None:
        return None
    kind = type(expr).__name__
    if kind == "DurationExpression":  # date/datetime +- duration (stored as microseconds)
        a, b = _duration_operand(expr.lhs, a), _duration_operand(expr.rhs, b)
    elif kind == "TemporalSubtraction":  # a DurationField value: microseconds
        return duration_microseconds(a - b)
    op = expr.connector
    try:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            if b == 0:
                return None
            if isinstance(a, int) and isinstance(b, int):
                q = abs(a) // abs(b)
                return q if (a >= 0) == (b >= 0) else -q
            if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
                return decimal.Decimal(a) / decimal.Decimal(b)
            return a / b
        if op == "%%" or op == "%":
            return None if b == 0 else a % b
        if op == "^":
            return a**b
        if op == "&":
            return a & b
        if op == "|":
            return a | b
        if op == "<<":
            return a << b
        if op == ">>":
            return a >> b
        if op == "#":
            return a ^ b
    except (TypeError, ArithmeticError):
        if isinstance(a, float | int) and isinstance(b, decimal.Decimal | float | int):
            return _combined_decimal(op, a, b)
        raise NotSupportedError(
            f"cannot compute {type(a).__name__} {op} {type(b).__name__} on the encrypted database"
        ) from None
    raise NotSupportedError(f"the operator {op!r} is not supported by the encrypted database")


def _duration_operand(side: Any, value: Any) -> Any:
    """A duration operand as a timedelta: there is no native duration type, so
    DurationField values (and timedelta literals) are microseconds."""
    field = getattr(side, "_output_field_or_none", None)
    if type(value) is int and field is not None and field.get_internal_type() == "DurationField":
        return datetime.timedelta(microseconds=value)
    return value


def _combined_decimal(op: str, a: Any, b: Any) -> Any:
    a, b = decimal.Decimal(str(a)), decimal.Decimal(str(b))
    return {"+": a + b, "-": a - b, "*": a * b}.get(op)


def _func_args(ev: Evaluator, expr: Any, row: Row) -> list:
    return [ev.value(e, row) for e in expr.get_source_expressions()]


def _strict(fn: Callable) -> Callable:
    """A function of values that is NULL when any argument is NULL (as SQL functions are)."""

    def handler(ev: Evaluator, expr: Any, row: Row) -> Any:
        args = _func_args(ev, expr, row)
        if any(a is None for a in args):
            return None
        return fn(expr, *args)

    return handler


def _coalesce(ev: Evaluator, expr: Any, row: Row) -> Any:
    for e in expr.get_source_expressions():
        value = ev.value(e, row)
        if value is not None:
            return value
    return None


def _concat(ev: Evaluator, expr: Any, row: Row) -> Any:
    args = _func_args(ev, expr, row)
    return "".join("" if a is None else _text(a) for a in args)


def _case(ev: Evaluator, expr: Any, row: Row) -> Any:
    for when in expr.cases:
        if ev.truth(when.condition, row) is True:
            return ev.value(when.result, row)
    return ev.value(expr.default, row)


def _when_condition(ev: Evaluator, expr: Any, row: Row) -> Any:
    if isinstance(expr, Q):
        raise NotSupportedError("unresolved Q object in an expression")
    return ev.truth(expr, row)


def _local(value: Any, expr: Any) -> Any:
    """A stored datetime (naive UTC when USE_TZ) in the expression's time zone, naive."""
    if isinstance(value, datetime.datetime) and settings.USE_TZ:
        tz = expr.get_tzname() if hasattr(expr, "get_tzname") else None
        aware = timezone.make_aware(value, datetime.UTC) if timezone.is_naive(value) else value
        zone = timezone.get_current_timezone() if tz is None else _zone(tz)
        return timezone.make_naive(aware, zone)
    return value


def _zone(name: str):
    import zoneinfo

    return datetime.UTC if name == "UTC" else zoneinfo.ZoneInfo(name)


def _extract(ev: Evaluator, expr: Any, row: Row) -> Any:
    value = ev.value(expr.lhs, row)
    if value is None:
        return None
    value = _local(value, expr)
    kind = expr.lookup_name
    if isinstance(value, datetime.timedelta):
        return _extract_duration(kind, value)
    if kind == "year":
        return value.year
    if kind == "iso_year":
        return value.isocalendar()[0]
    if kind == "month":
        return value.month
    if kind == "day":
        return value.day
    if kind == "week":
        return value.isocalendar()[1]
    if kind == "week_day":
        return value.isoweekday() % 7 + 1
    if kind == "iso_week_day":
        return value.isoweekday()
    if kind == "quarter":
        return (value.month - 1) // 3 + 1
    if kind == "hour":
        return value.hour
    if kind == "minute":
        return value.minute
    if kind == "second":
        return value.second
    raise NotSupportedError(f"Extract({kind!r}) is not supported by the encrypted database")


def _extract_duration(kind: str, value: datetime.timedelta) -> int:
    seconds = int(value.total_seconds())
    return {
        "day": value.days,
        "hour": seconds // 3600 % 24,
        "minute": seconds // 60 % 60,
        "second": seconds % 60,
    }[kind]


def _trunc(ev: Evaluator, expr: Any, row: Row) -> Any:
    value = ev.value(expr.lhs, row)
    if value is None:
        return None
    value = _local(value, expr)
    kind = expr.kind
    if kind == "date":
        return value.date() if isinstance(value, datetime.datetime) else value
    if kind == "time":
        return value.time() if isinstance(value, datetime.datetime) else value
    if isinstance(value, datetime.time):
        parts = {"hour": 1, "minute": 2, "second": 3}
        keep = parts[kind]
        return value.replace(
            minute=value.minute if keep > 1 else 0,
            second=value.second if keep > 2 else 0,
            microsecond=0,
        )
    is_datetime = isinstance(value, datetime.datetime)
    day = value.date() if is_datetime else value
    if kind == "year":
        day = day.replace(month=1, day=1)
    elif kind == "quarter":
        day = day.replace(month=(day.month - 1) // 3 * 3 + 1, day=1)
    elif kind == "month":
        day = day.replace(day=1)
    elif kind == "week":
        day = day - datetime.timedelta(days=day.weekday())
    if kind in ("year", "quarter", "month", "week", "day"):
        return datetime.datetime.combine(day, datetime.time()) if is_datetime else day
    if not is_datetime:
        raise NotSupportedError(f"cannot truncate a date to {kind!r}")
    keep = {"hour": 1, "minute": 2, "second": 3}[kind]
    return value.replace(
        minute=value.minute if keep > 1 else 0,
        second=value.second if keep > 2 else 0,
        microsecond=0,
    )


def _cast(ev: Evaluator, expr: Any, row: Row) -> Any:
    value = ev.value(expr.source_expressions[0], row)
    if value is None:
        return None
    internal = expr.output_field.get_internal_type()
    try:
        if internal in ("CharField", "TextField"):
            return _text(value)
        if internal.endswith("IntegerField") or internal.endswith("AutoField"):
            return int(value)
        if internal == "FloatField":
            return float(value)
        if internal == "DecimalField":
            return decimal.Decimal(str(value))
        if internal == "DateField" and isinstance(value, datetime.datetime):
            return value.date()
    except (TypeError, ValueError, decimal.InvalidOperation):
        return None
    return value


def _substr(expr: Any, text: Any, pos: int, length: int | None = None) -> str:
    start = int(pos) - 1
    return _text(text)[start : None if length is None else start + int(length)]


def _mod(expr: Any, a: Any, b: Any) -> Any:
    """SQL MOD: the sign of the dividend (not Python's floor modulo); NULL for b = 0."""
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return abs(a) % abs(b) * (1 if a >= 0 else -1)
    return math.fmod(a, b)


def _pad(text: str, length: int, fill: str, *, left: bool) -> str:
    """LPAD/RPAD: pad (or cut) to ``length`` characters with ``fill`` repeated."""
    if length <= len(text) or not fill:
        return text[:length]
    padding = (fill * length)[: length - len(text)]
    return padding + text if left else text + padding


def _round(expr: Any, value: Any, places: int = 0) -> Any:
    return round(value, int(places))


def _now(ev: Evaluator, expr: Any, row: Row) -> Any:
    now = timezone.now()
    return timezone.make_naive(now, datetime.UTC) if settings.USE_TZ else now


def _greatest(expr: Any, *args: Any) -> Any:
    return max(args, key=_Order)


def _least(expr: Any, *args: Any) -> Any:
    return min(args, key=_Order)


class _Order:
    """Sort key wrapper that orders like the indexes (see :func:`compare`)."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _Order) -> bool:
        return compare(self.v, other.v) < 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Order) and compare(self.v, other.v) == 0


def _value(ev: Evaluator, expr: Any, row: Row) -> Any:
    value = expr.value
    field = getattr(expr, "_output_field_or_none", None)
    if value is not None and field is not None and hasattr(field, "get_db_prep_value"):
        try:
            return field.get_db_prep_value(value, ev.connection, prepared=False)
        except (TypeError, ValueError, decimal.InvalidOperation, QueryError):
            return value
    return value


def _scalar_subquery(ev: Evaluator, expr: Any, row: Row) -> Any:
    """``Subquery(...)`` used as a value: run once (it cannot depend on the row)."""
    from django_zerodb.translate import columns_of

    query = getattr(expr, "query", expr)
    if columns_of(query):  # OuterRef: columns of the outer query
        raise NotSupportedError(
            "a correlated Subquery() (OuterRef) as a value is not supported by the encrypted "
            "database: annotate with an aggregate across the relation (such as "
            "Max('employees__salary')), or use prefetch_related()"
        )
    key = id(query)
    if key not in ev._rhs:
        found = ev.resolve_subquery(query)
        ev._rhs[key] = found[0] if found else None
    return ev._rhs[key]


def _exists(ev: Evaluator, expr: Any, row: Row) -> Any:
    """``EXISTS (subquery)``, decorrelated once: the subquery runs without its
    ``inner = outer`` conditions, selecting the inner columns; a row passes when its
    outer values are among the results."""
    found = ev._exists.get(id(expr))
    if found is None:
        found = ev._exists[id(expr)] = ev.decorrelate(expr.query)
    outer, keys = found
    if not outer:
        return bool(keys)
    values = tuple(ev.value(c, row) for c in outer)
    return None not in values and tuple(map(hashable, values)) in keys


def hashable(value: Any) -> Any:
    """A value usable as a dict key (grouping, joins, DISTINCT)."""
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


_HANDLERS: dict[str, Callable[[Evaluator, Any, Row], Any]] = {
    "ExpressionList": lambda ev, e, row: tuple(
        ev.value(x, row) for x in e.get_source_expressions()
    ),
    "KeyTransform": _key_transform,
    "Random": lambda ev, e, row: random.random(),
    "Exists": _exists,
    "Subquery": _scalar_subquery,
    "Query": _scalar_subquery,
    "Col": _col,
    "ColPairs": _col_pairs,
    "RawSQL": _raw_sql,
    "ExtraWhere": _extra_where,
    "Ref": _ref,
    "Value": _value,
    "CombinedExpression": _combined,
    "DurationExpression": _combined,
    "TemporalSubtraction": _combined,
    "ExpressionWrapper": lambda ev, e, row: ev.value(e.expression, row),
    # ~Exists(...), ~F("flag"): a subclass of ExpressionWrapper, so named before it.
    "NegatedExpression": lambda ev, e, row: not3(ev.truth(e.expression, row)),
    "Aggregate": _aggregate,
    "AggregateFilter": lambda ev, e, row: ev.truth(e.condition, row),
    "Coalesce": _coalesce,
    "Concat": lambda ev, e, row: ev.value(e.source_expressions[0], row),
    "ConcatPair": _concat,
    "Lower": _strict(lambda e, v: _text(v).lower()),
    "Upper": _strict(lambda e, v: _text(v).upper()),
    "Length": _strict(lambda e, v: len(_text(v))),
    "Trim": _strict(lambda e, v: _text(v).strip()),
    "LTrim": _strict(lambda e, v: _text(v).lstrip()),
    "RTrim": _strict(lambda e, v: _text(v).rstrip()),
    "Reverse": _strict(lambda e, v: _text(v)[::-1]),
    "Substr": _strict(_substr),
    "Left": _strict(lambda e, v, n: _text(v)[: int(n)]),
    "Right": _strict(lambda e, v, n: _text(v)[-int(n) :] if int(n) else ""),
    "Replace": _strict(lambda e, v, old, new: _text(v).replace(_text(old), _text(new))),
    "StrIndex": _strict(lambda e, v, sub: _text(v).find(_text(sub)) + 1),
    "Abs": _strict(lambda e, v: abs(v)),
    "Repeat": _strict(lambda e, v, n: _text(v) * max(int(n), 0)),
    "LPad": _strict(lambda e, v, n, fill: _pad(_text(v), int(n), _text(fill), left=True)),
    "RPad": _strict(lambda e, v, n, fill: _pad(_text(v), int(n), _text(fill), left=False)),
    "Chr": _strict(lambda e, v: chr(int(v))),
    "Ord": _strict(lambda e, v: ord(_text(v)[0]) if _text(v) else None),
    "MD5": _strict(lambda e, v: hashlib.md5(_text(v).encode(), usedforsecurity=False).hexdigest()),
    "SHA1": _strict(lambda e, v: hashlib.sha1(_text(v).encode()).hexdigest()),
    "SHA256": _strict(lambda e, v: hashlib.sha256(_text(v).encode()).hexdigest()),
    "SHA512": _strict(lambda e, v: hashlib.sha512(_text(v).encode()).hexdigest()),
    "Sign": _strict(lambda e, v: (v > 0) - (v < 0)),
    "Ceil": _strict(lambda e, v: math.ceil(v)),
    "Floor": _strict(lambda e, v: math.floor(v)),
    "Mod": _strict(_mod),
    "Power": _strict(lambda e, a, b: a**b),
    "Sqrt": _strict(lambda e, v: math.sqrt(v)),
    "Round": _strict(_round),
    "Greatest": _strict(_greatest),
    "Least": _strict(_least),
    "NullIf": _strict(lambda e, a, b: None if compare(a, b) == 0 else a),
    "Case": _case,
    "When": _when_condition,
    "Extract": _extract,
    "TruncBase": _trunc,
    "Cast": _cast,
    "Now": _now,
    "WhereNode": lambda ev, e, row: ev.truth(e, row),
    "NothingNode": lambda ev, e, row: False,
}
