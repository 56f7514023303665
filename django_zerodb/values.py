"""How SQL treats values: ordering, three-valued logic, and evaluation errors.

Shared by the evaluator (``evaluate.py``) and the function implementations
(``functions.py``, ``temporal.py``, ``casts.py``), so that a comparison made in Python
agrees with an index scan and every error of a computation reaches Django as one of
``django.db``'s exceptions.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Iterable, Iterator
from typing import Any

from django_zerodb.exceptions import DataError, NotSupportedError
from zerodb_core.api import QueryError, encode_key


def _promoted(a: Any, b: Any) -> tuple[Any, Any]:
    """A date compared with a datetime is its midnight (PostgreSQL casts the date; on
    SQLite ``'2020-01-02' < '2020-01-02 10:00'`` as text, the same order)."""
    if type(a) is datetime.date and isinstance(b, datetime.datetime) and b.tzinfo is None:
        return datetime.datetime.combine(a, datetime.time()), b
    if type(b) is datetime.date and isinstance(a, datetime.datetime) and a.tzinfo is None:
        return a, datetime.datetime.combine(b, datetime.time())
    return a, b


def compare(a: Any, b: Any) -> int:
    """-1, 0 or 1, ordering values as the engine's indexes do (numbers by value, then
    strings, ...), so a filter checked in Python agrees with an index scan."""
    if type(a) is not type(b):
        a, b = _promoted(a, b)
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


class Order:
    """Sort key wrapper that orders like the indexes (see :func:`compare`)."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: Order) -> bool:
        return compare(self.v, other.v) < 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Order) and compare(self.v, other.v) == 0


def text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def and3(values: Iterable[bool | None]) -> bool | None:
    result: bool | None = True
    for v in values:
        if v is False:
            return False
        if v is None:
            result = None
    return result


def or3(values: Iterable[bool | None]) -> bool | None:
    result: bool | None = False
    for v in values:
        if v is True:
            return True
        if v is None:
            result = None
    return result


def not3(value: bool | None) -> bool | None:
    return None if value is None else not value


def xor3(values: list) -> bool | None:
    """XOR as Django writes it for SQL without XOR: ``(a OR b ...) AND`` an odd number
    of the terms are TRUE (an unknown term counts as not TRUE)."""
    parity = sum(v is True for v in values) % 2 == 1
    return and3([or3(values), parity])


def hashable(value: Any) -> Any:
    """A value usable as a dict key (grouping, joins, DISTINCT)."""
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


@contextlib.contextmanager
def computing(what: str) -> Iterator[None]:
    """Turn Python's errors while computing ``what`` into the database's: a value the
    operation cannot take is a ``DataError`` (as PostgreSQL's ``data_exception``:
    division by zero, a square root of a negative number, an unknown time zone...);
    operands of types whose combination SQL databases answer differently are refused."""
    try:
        yield
    except (DataError, NotSupportedError):
        raise
    except (TypeError, AttributeError) as exc:
        raise NotSupportedError(
            f"{what} is not supported by the encrypted database on these values ({exc}): "
            "cast the operands to one type (Cast, output_field), or compute it in Python"
        ) from exc
    except (ArithmeticError, ValueError, LookupError, re.error) as exc:
        raise DataError(f"{what}: {exc}") from exc
