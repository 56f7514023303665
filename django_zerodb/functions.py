"""Django's text, math and comparison functions, evaluated in Python as SQL defines them.

Each implementation is registered for Django's exact class (``registry.VALUES``): a
function this module does not list is refused, and so is a subclass that changes its
SQL. Where SQL databases disagree, the choice is written next to the code; where the
result would depend on which database one asks, the function refuses instead.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import math
import random
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db.models import functions as fn
from django.db.models.expressions import Func

from django_zerodb import compat, jsonvalues, temporal
from django_zerodb.exceptions import DataError, NotSupportedError
from django_zerodb.registry import VALUES
from django_zerodb.values import Order, compare, computing, text

# Rounding of exact decimals: half away from zero, as SQL's ROUND on numeric values and
# numeric casts do (PostgreSQL, MySQL, Oracle; SQLite's ROUND too). Python's round()
# rounds half to even.
HALF_UP = decimal.ROUND_HALF_UP
# Enough digits for any rounding of a stored value (the default 28 would cut 30 digits).
WIDE = decimal.Context(prec=200, rounding=HALF_UP)


def args_of(ev: Any, expr: Any, row: dict) -> list:
    return [ev.value(e, row) for e in expr.get_source_expressions()]


def strict(function: Callable[..., Any]) -> Callable[[Any, Any, dict], Any]:
    """A function of values that is NULL when any argument is NULL (as SQL's are)."""

    def handler(ev: Any, expr: Any, row: dict) -> Any:
        args = args_of(ev, expr, row)
        if any(a is None for a in args):
            return None
        with computing(type(expr).__name__):
            return function(*args)

    return handler


def register(klass: type[Func], handler: Callable[[Any, Any, dict], Any]) -> None:
    VALUES.add(klass, handler)


# -- comparison ---------------------------------------------------------------------------


def coalesce(ev: Any, expr: Any, row: dict) -> Any:
    for e in expr.get_source_expressions():
        value = ev.value(e, row)
        if value is not None:
            return value
    return None


def nullif(ev: Any, expr: Any, row: dict) -> Any:
    """``NULLIF(a, b)``: NULL when ``a = b`` is TRUE, else ``a``. With ``b`` NULL the
    comparison is unknown, not TRUE, so the answer is ``a``."""
    a, b = args_of(ev, expr, row)
    if a is None or b is None:
        return a
    return None if compare(a, b) == 0 else a


register(fn.Coalesce, coalesce)
register(fn.NullIf, nullif)
# NULL if any argument is NULL (features.greatest_least_ignores_nulls = False).
register(fn.Greatest, strict(lambda *args: max(args, key=Order)))
register(fn.Least, strict(lambda *args: min(args, key=Order)))


# -- text ---------------------------------------------------------------------------------


def concat_pair(ev: Any, expr: Any, row: dict) -> Any:
    # ConcatPair coalesces NULL to '' on every backend (Django writes it so).
    return "".join("" if a is None else text(a) for a in args_of(ev, expr, row))


def substr(value: Any, pos: Any, length: Any = None) -> str:
    """SQL SUBSTR: characters ``pos .. pos + length - 1``, 1-based, of which the ones
    before the first are simply absent (``SUBSTR('abc', 0, 2)`` is ``'a'``)."""
    s, pos = text(value), int(pos)
    start = max(pos - 1, 0)
    if length is None:
        return s[start:]
    if int(length) < 0:
        raise DataError("negative substring length not allowed")
    return s[start : max(pos - 1 + int(length), 0)]


def pad(value: Any, length: Any, fill: Any, *, left: bool) -> str:
    """LPAD/RPAD: pad (or cut) to ``length`` characters with ``fill`` repeated."""
    s, length, fill = text(value), int(length), text(fill)
    if length <= len(s) or not fill:
        return s[: max(length, 0)]
    padding = (fill * length)[: length - len(s)]
    return padding + s if left else s + padding


def right(value: Any, n: Any) -> str:
    n = int(n)
    return text(value)[-n:] if n > 0 else ""


def digest(name: str) -> Callable[[Any], str]:
    def hexdigest(value: Any) -> str:
        return hashlib.new(name, text(value).encode(), usedforsecurity=False).hexdigest()

    return hexdigest


register(fn.ConcatPair, concat_pair)
# Concat nests ConcatPairs: its one source expression is the pair.
register(fn.Concat, lambda ev, e, row: ev.value(e.source_expressions[0], row))
register(fn.Lower, strict(lambda v: text(v).lower()))
register(fn.Upper, strict(lambda v: text(v).upper()))
register(fn.Length, strict(lambda v: len(text(v))))
register(fn.Trim, strict(lambda v: text(v).strip(" ")))
register(fn.LTrim, strict(lambda v: text(v).lstrip(" ")))
register(fn.RTrim, strict(lambda v: text(v).rstrip(" ")))
register(fn.Reverse, strict(lambda v: text(v)[::-1]))
register(fn.Substr, strict(substr))
register(fn.Left, strict(lambda v, n: text(v)[: max(int(n), 0)]))
register(fn.Right, strict(right))
register(fn.Replace, strict(lambda v, old, new: text(v).replace(text(old), text(new))))
register(fn.StrIndex, strict(lambda v, sub: text(v).find(text(sub)) + 1))
register(fn.Repeat, strict(lambda v, n: text(v) * max(int(n), 0)))
register(fn.LPad, strict(lambda v, n, fill: pad(v, n, fill, left=True)))
register(fn.RPad, strict(lambda v, n, fill: pad(v, n, fill, left=False)))
register(fn.Chr, strict(lambda v: chr(int(v))))
register(fn.Ord, strict(lambda v: ord(text(v)[0]) if text(v) else None))
register(fn.MD5, strict(digest("md5")))
register(fn.SHA1, strict(digest("sha1")))
register(fn.SHA224, strict(digest("sha224")))
register(fn.SHA256, strict(digest("sha256")))
register(fn.SHA384, strict(digest("sha384")))
register(fn.SHA512, strict(digest("sha512")))


# -- math ---------------------------------------------------------------------------------


def sql_round(value: Any, places: Any = 0) -> Any:
    """SQL ROUND: half away from zero, to ``places`` digits after the point (before it
    when negative). An integer becomes a float (SQLite's ROUND gives a REAL; with a
    negative precision, which SQLite refuses, it stays an integer); a float is first
    read as the decimal of its 15 significant digits (what PostgreSQL's cast of a double
    to numeric keeps, and where SQLite's own rounding starts), so 2.675 rounds to 2.68,
    not Python's 2.67."""
    places = int(places)
    if isinstance(value, bool):
        raise TypeError("ROUND of a boolean")
    if isinstance(value, int):
        if places >= 0:
            return float(value)  # SQLite's ROUND always gives a REAL: ROUND(7) is 7.0
        return int(decimal.Decimal(value).quantize(decimal.Decimal(f"1E{-places}"), context=WIDE))
    if isinstance(value, float):
        if not math.isfinite(value):
            return value
        exact = decimal.Decimal(format(value, ".15g"))
        return float(_quantize(exact, places))
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return value
        return _quantize(value, places)
    raise TypeError(f"ROUND of {type(value).__name__}")


def _quantize(value: decimal.Decimal, places: int) -> decimal.Decimal:
    rounded = value.quantize(decimal.Decimal(1).scaleb(-places), context=WIDE)
    # 1.2E+3 is 1200: give the plain form a numeric column would hold.
    return rounded.quantize(decimal.Decimal(1), context=WIDE) if places < 0 else rounded


def sql_mod(a: Any, b: Any) -> Any:
    """SQL MOD: the sign of the dividend (not Python's floor modulo); NULL for b = 0
    (as SQLite; PostgreSQL raises division by zero)."""
    if b == 0:
        return None
    if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
        if isinstance(a, float) or isinstance(b, float):
            raise TypeError("MOD of a float and a decimal")
        # Decimal's remainder has the sign of the dividend, as SQL's.
        return WIDE.remainder(decimal.Decimal(a), decimal.Decimal(b))
    # Integers too give a float, as Django's SQLite MOD (math.fmod) does: MOD(7, 2) / 2
    # is 0.5 there (PostgreSQL's integer MOD would make it 0).
    return math.fmod(a, b)


def sql_power(a: Any, b: Any) -> Any:
    result = a**b
    if isinstance(result, complex):
        raise DataError("a negative number raised to a non-integer power yields a complex result")
    return result


def sql_sqrt(value: Any) -> Any:
    if value < 0:
        raise DataError("cannot take square root of a negative number")
    return math.sqrt(value)


register(fn.Abs, strict(abs))
register(fn.Sign, strict(lambda v: (v > 0) - (v < 0)))
register(fn.Ceil, strict(math.ceil))
register(fn.Floor, strict(math.floor))
register(fn.Mod, strict(sql_mod))
register(fn.Power, strict(sql_power))
register(fn.Sqrt, strict(sql_sqrt))
register(fn.Round, strict(sql_round))
register(fn.Random, lambda ev, e, row: random.random())


def _real(function: Callable[..., float]) -> Callable[..., float]:
    """A math function of reals, as Django's SQLite functions compute it (Python's
    ``math`` on the values; a decimal is read as a float first). A value outside the
    function's domain is a DataError (SQLite: an error raised by the function)."""

    def compute(*args: Any) -> float:
        if any(isinstance(a, bool) for a in args):
            raise TypeError("a boolean argument")
        return function(*(float(a) for a in args))

    return compute


register(fn.Exp, strict(_real(math.exp)))
register(fn.Ln, strict(_real(math.log)))
# LOG(base, x), arguments in SQL's order (Django's Log(a, b) is log base a of b).
register(fn.Log, strict(_real(lambda base, x: math.log(x, base))))
register(fn.Pi, lambda ev, e, row: math.pi)
register(fn.Sin, strict(_real(math.sin)))
register(fn.Cos, strict(_real(math.cos)))
register(fn.Tan, strict(_real(math.tan)))
register(fn.Cot, strict(_real(lambda x: 1 / math.tan(x))))
register(fn.ASin, strict(_real(math.asin)))
register(fn.ACos, strict(_real(math.acos)))
register(fn.ATan, strict(_real(math.atan)))
register(fn.ATan2, strict(_real(math.atan2)))
register(fn.Degrees, strict(_real(math.degrees)))
register(fn.Radians, strict(_real(math.radians)))


# -- identifiers --------------------------------------------------------------------------

_MILLISECOND = 1_000_000  # nanoseconds
# One step of the 12 bits of sub-millisecond time, rounded up (1 ms / 4096).
_STEP = _MILLISECOND // 4096 + 1
_clock_lock = threading.Lock()
_last_clock = 0


def _rising_clock() -> int:
    """``time.time_ns()``, but always at least one step past the last value it gave,
    as PostgreSQL keeps its ``uuidv7()`` time rising within a backend: a clock that
    steps back or ticks coarsely must not make later values sort earlier."""
    global _last_clock
    with _clock_lock:
        _last_clock = max(time.time_ns(), _last_clock + _STEP)
        return _last_clock


def uuid7(shift: datetime.timedelta | None = None) -> uuid.UUID:
    """A version 7 UUID (RFC 9562) as PostgreSQL 18's ``uuidv7()`` makes it: the Unix
    time in milliseconds (moved by ``shift``), 12 bits of sub-millisecond time (so that
    values made one after another in this process sort in the order they were made,
    RFC 9562's method 3), 62 random bits."""
    nanoseconds = _rising_clock()
    if shift is not None:
        if not isinstance(shift, datetime.timedelta):
            raise DataError(f"the shift of UUID7 must be an interval, not {shift!r}")
        nanoseconds += shift // datetime.timedelta(microseconds=1) * 1000
    milliseconds, rest = divmod(nanoseconds, _MILLISECOND)
    if not 0 <= milliseconds < 1 << 48:
        raise DataError("UUID7's time, shifted, is outside the 48 bits of a version 7 UUID")
    fraction = rest * 4096 // _MILLISECOND
    value = milliseconds << 80 | 7 << 76 | fraction << 64 | 0b10 << 62 | secrets.randbits(62)
    return uuid.UUID(int=value)


def uuid7_of(ev: Any, expr: Any, row: dict) -> Any:
    """``UUID7()`` or ``UUID7(shift)``: NULL for a NULL shift, as PostgreSQL's."""
    sources = expr.get_source_expressions()
    if not sources:
        return uuid7()
    shift = ev.value(sources[0], row)
    return None if shift is None else uuid7(temporal.operand(sources[0], shift))


register(compat.UUID4, lambda ev, e, row: uuid.uuid4())
register(compat.UUID7, uuid7_of)


# -- JSON ---------------------------------------------------------------------------------


def json_item(ev: Any, expr: Any, row: dict) -> Any:
    """A value as JSON_ARRAY/JSON_OBJECT embed it: a nested JSONArray/JSONObject as JSON,
    SQL values as the JSON scalar SQL databases agree on. A JSONField value, a boolean
    (SQLite writes 1, PostgreSQL true), a datetime (a space or a ``T``), anything else
    without one JSON form is refused."""
    value = ev.value(expr, row)
    if isinstance(expr, fn.JSONArray | fn.JSONObject):
        return json.loads(value)  # nested: embedded as JSON, as everywhere
    if jsonvalues.is_json(expr) or isinstance(value, jsonvalues.Parsed):
        # SQLite embeds a JSONField's text as a JSON string, PostgreSQL its document.
        raise NotSupportedError(
            "a JSONField value in JSONArray/JSONObject is not supported by the encrypted "
            "database (SQL databases embed it differently): build the JSON in Python"
        )
    if value is None or (isinstance(value, str | int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, decimal.Decimal):
        return float(value)  # a number, as both write it
    if type(value) is datetime.date:
        return value.isoformat()
    raise NotSupportedError(
        f"a {type(value).__name__} in JSONArray/JSONObject is not supported by the encrypted "
        "database (SQL databases write it differently in JSON): Cast it to text first"
    )


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def json_array(ev: Any, expr: Any, row: dict) -> str:
    return _json_text([json_item(ev, e, row) for e in expr.get_source_expressions()])


def json_object(ev: Any, expr: Any, row: dict) -> str:
    """JSON_OBJECT(key, value, ...): Django passes the keys as Values, in pairs."""
    exprs = expr.get_source_expressions()
    pairs = zip(exprs[::2], exprs[1::2], strict=True)
    return _json_text({str(ev.value(k, row)): json_item(ev, v, row) for k, v in pairs})


register(fn.JSONArray, json_array)
register(fn.JSONObject, json_object)
