"""Join keys of different types compared as SQLite compares them.

A generic relation joins a model's integer primary key to a text ``object_id`` column
(``GenericRelation`` with a ``CharField`` object id). SQLite compares an INTEGER column
with a TEXT one after giving the text numeric affinity: ``'2'`` equals ``2``, ``'x'``
equals no number. Joins here match keys in Python, so the text side is converted the
same way before matching; two columns of one kind are compared as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_NUMERIC = frozenset(
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
        "FloatField",
        "DecimalField",
    }
)
_TEXT = frozenset({"CharField", "TextField", "SlugField", "EmailField", "URLField"})
_INTEGER = re.compile(r"\s*[+-]?\d+\s*")
_REAL = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")


def numeric(value: Any) -> Any:
    """SQLite's numeric affinity applied to a value: text that reads as a number
    becomes that number (a whole REAL an INTEGER); anything else is unchanged."""
    if not isinstance(value, str):
        return value
    if _INTEGER.fullmatch(value):
        return int(value)
    if _REAL.fullmatch(value):
        number = float(value)
        return int(number) if number.is_integer() and abs(number) < 2**63 else number
    return value


def _kind(field: Any) -> str | None:
    internal = field.get_internal_type()
    if internal in _NUMERIC:
        return "number"
    if internal in _TEXT:
        return "text"
    return None


def coercions(
    parent_field: Any, child_field: Any
) -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]:
    """What to apply to values of two columns compared for equality (a join's keys, a
    correlated subquery's ``inner = outer``) before comparing them (None: as stored)."""
    parent, child = _kind(parent_field), _kind(child_field)
    if parent == "text" and child == "number":
        return numeric, None
    if parent == "number" and child == "text":
        return None, numeric
    return None, None


def join_coercions(join: Any) -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]:
    """:func:`coercions` of a one-column join's parent and child keys."""
    ((parent_field, child_field),) = join.join_fields
    return coercions(parent_field, child_field)
