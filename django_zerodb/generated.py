"""``GeneratedField``: computed by the backend whenever a row is written.

The store keeps records, not column definitions, so a generated column's value is
computed here from the record being inserted or updated (after every other column is
set) and stored with it, as SQLite stores a ``STORED`` column. A ``VIRTUAL`` column
(``db_persist=False``) is stored the same way: it is recomputed on every write of its row,
so a read sees what computing it then would give. The expression is evaluated by the
fail-closed evaluator: one it does not implement refuses the write.
"""

from __future__ import annotations

from typing import Any

from django_zerodb.evaluate import Evaluator, check_supported
from django_zerodb.jsonvalues import exported


def generated_fields(model: Any) -> list:
    return [f for f in model._meta.concrete_fields if f.generated]


def _resolved(field: Any) -> Any:
    """The field's expression resolved on its model (columns without a table alias)."""
    resolved = field.__dict__.get("_zerodb_resolved")
    if resolved is None:
        resolved = field.expression.resolve_expression(field._query, allow_joins=False)
        check_supported(resolved)
        field.__dict__["_zerodb_resolved"] = resolved
    return resolved


def value_of(ev: Evaluator, field: Any, record: dict) -> Any:
    """A generated column's value for a complete record."""
    return exported(ev.value(_resolved(field), {None: record}))


def fill(ev: Evaluator, model: Any, records: list[dict]) -> None:
    """Set every generated column of ``records`` (complete records of ``model``)."""
    fields = generated_fields(model)
    for record in records:
        for field in fields:
            record[field.column] = value_of(ev, field, record)


def rewriter(connection: Any, field: Any) -> Any:
    """What a migration applies to every stored record when it adds or changes a
    generated field: the record with the column computed."""
    ev = Evaluator(connection, _no_subquery, _no_subquery)
    return lambda record: {**record, field.column: value_of(ev, field, record)}


def _no_subquery(query: Any) -> Any:
    raise AssertionError("a generated column reads its own row only (allow_joins=False)")
