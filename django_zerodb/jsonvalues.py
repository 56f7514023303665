"""JSONField values as SQLite's JSON functions see them.

JSON is stored as its text. A key transform parses it and walks a path as SQLite's
``JSON_EXTRACT(value, '$."a"[0]')`` does: a key that reads as an integer indexes an array
(negative ones from its end) and finds nothing in an object; any other key finds an
object's member and nothing in an array. ``has_key`` ends its path with a member name
even when it reads as an integer (Django's ``compile_json_path_final_key``).

Three states stay apart: a missing key (:data:`MISSING`, SQL's NULL), JSON's ``null``
(``None`` inside a :class:`Parsed`) and a NULL column. Where a key's value leaves JSON
(an ``ExpressionWrapper`` to another type, a group key, an aggregate's input) it becomes
the scalar SQLite's ``JSON_TYPE``/``JSON_EXTRACT`` pair yields (:func:`scalar`).
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models.fields.json import KeyTransform

MISSING: Any = object()  # a path that finds nothing


class Parsed:
    """A value found by a key transform: a Python value of the JSON document, or
    :data:`MISSING`. Not JSON text any more."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def is_json(expr: Any) -> bool:
    """Whether an expression's output field is a JSONField (its values are JSON text)."""
    field = getattr(expr, "_output_field_or_none", None)
    return field is not None and field.get_internal_type() == "JSONField"


def document(value: Any) -> Any:
    """The Python value of stored JSON text or of a key's value; MISSING for SQL's NULL
    and for text that is not JSON."""
    if isinstance(value, Parsed):
        return value.value
    if value is None:
        return MISSING
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return MISSING
    return value


def step(doc: Any, key: Any) -> Any:
    """One step of a JSON path (SQLite's ``[n]`` for integer keys, ``."key"`` else)."""
    try:
        index = int(key)
    except (TypeError, ValueError):
        return doc.get(str(key), MISSING) if isinstance(doc, dict) else MISSING
    if isinstance(doc, list) and -len(doc) <= index < len(doc):
        return doc[index]
    return MISSING


def key_path(transform: KeyTransform) -> list[Any]:
    """The keys of a chain of key transforms, outermost document first."""
    keys: list[Any] = []
    expr: Any = transform
    while isinstance(expr, KeyTransform):
        keys.append(expr.key_name)
        expr = expr.lhs
    return keys[::-1]


def has_path(doc: Any, keys: list[Any]) -> bool:
    """``JSON_TYPE(doc, path) IS NOT NULL`` for a ``has_key`` path: every key but the
    last a path step, the last an object's member name."""
    for key in keys[:-1]:
        doc = step(doc, key)
    return isinstance(doc, dict) and str(keys[-1]) in doc


def operand(expr: Any, value: Any) -> Any:
    """The Python value an expression gives a JSON lookup's right-hand side: a key's
    value, JSON text parsed (a JSONField column, ``Value(..., JSONField())``, a cast
    to JSON), any other value as it is."""
    if isinstance(value, Parsed):
        return value.value
    if is_json(expr) and isinstance(value, str):
        return document(value)
    return value


def equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``; objects compare by members."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def scalar(value: Any) -> Any:
    """A key's value outside JSON, as SQLite's ``CASE WHEN JSON_TYPE(...) IN ('null',
    'true', 'false') THEN JSON_TYPE(...) ELSE JSON_EXTRACT(...) END`` yields it;
    other values unchanged."""
    if not isinstance(value, Parsed):
        return value
    inner = value.value
    if inner is MISSING:
        return None
    if inner is None or isinstance(inner, bool):
        return json.dumps(inner)
    if isinstance(inner, dict | list):
        return json.dumps(inner, separators=(",", ":"))
    return inner


def exported(value: Any) -> Any:
    """A value as a query returns it: a key's value as JSON text, which JSONField's
    ``from_db_value`` parses (whether the expression is a key transform or a cast)."""
    if isinstance(value, Parsed):
        return None if value.value is MISSING else json.dumps(value.value)
    return value


def sortable(value: Any) -> Any:
    """A key's value for ORDER BY (NULL when missing)."""
    if isinstance(value, Parsed):
        return None if value.value is MISSING else value.value
    return value
