"""What a SQL table definition enforces and the store does not: checked on every write.

The encrypted store keeps records, not column definitions, so the backend checks each
record an INSERT or UPDATE writes, as SQLite's ``CREATE TABLE`` would have it checked:

* NOT NULL for fields without ``null=True``;
* the column checks Django gives SQLite (``data_type_check_constraints``): positive
  integer fields are ``>= 0``, a JSONField holds valid JSON;
* every ``CheckConstraint`` of the model, evaluated as SQL's CHECK: the record is refused
  only when the condition is FALSE (NULL passes).

A violation raises ``IntegrityError`` with SQLite's message (``CHECK constraint failed:
<name>``). The conditions come from the model being written (its ``Meta.constraints``),
so a migration's historical model checks the constraints of its own state.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from django.core.exceptions import FieldError
from django.db.models import CheckConstraint
from django.db.models.sql.query import Query

from django_zerodb.exceptions import IntegrityError, NotSupportedError

POSITIVE = frozenset(
    {"PositiveIntegerField", "PositiveBigIntegerField", "PositiveSmallIntegerField"}
)


def check_not_null(table: str, fields: Any, record: dict) -> None:
    """Refuse NULL in a column declared ``null=False`` (the store has no NOT NULL)."""
    for field in fields:
        if not field.null and record.get(field.column) is None and not field.primary_key:
            raise IntegrityError(f"NOT NULL constraint failed: {table}.{field.column}")


def check_columns(fields: Any, record: dict) -> None:
    """The column checks of the fields written: positive integers, valid JSON."""
    for field in fields:
        value = record.get(field.column)
        if value is None:
            continue
        internal = field.get_internal_type()
        if internal in POSITIVE and value < 0:
            raise IntegrityError(f'CHECK constraint failed: "{field.column}" >= 0')
        if internal == "JSONField":
            try:
                json.loads(value)
            except (TypeError, ValueError):
                raise IntegrityError(
                    f'CHECK constraint failed: JSON_VALID("{field.column}")'
                ) from None


def check_constraints(model: Any, ev: Any, records: list[dict]) -> None:
    """Every ``CheckConstraint`` of ``model`` on every record about to be written."""
    checks = _conditions(model)
    if not checks:
        return
    for record in records:
        for name, alias, where in checks:
            if ev.truth(where, {alias: record}) is False:
                raise IntegrityError(f"CHECK constraint failed: {name}")


@functools.lru_cache(maxsize=512)
def _conditions(model: Any) -> tuple[tuple[str, str, Any], ...]:
    """``(name, table alias, WHERE node)`` of each check constraint, built once."""
    found = []
    for constraint in model._meta.constraints:
        if not isinstance(constraint, CheckConstraint):
            continue
        query = Query(model)
        alias = query.get_initial_alias()
        try:
            where = query.build_where(constraint.condition)
        except FieldError as exc:
            raise NotSupportedError(
                f"the check constraint {constraint.name!r} of {model._meta.label} cannot be "
                f"enforced by the encrypted database ({exc}): write it on the model's own "
                "fields"
            ) from exc
        found.append((constraint.name, alias, where))
    return tuple(found)


def check_record_writes(model: Any, ev: Any, fields: Any, records: list[dict]) -> None:
    """All the checks of a write of ``records`` (the ``fields`` written) to ``model``."""
    table = model._meta.db_table
    for record in records:
        check_not_null(table, fields, record)
        check_columns(fields, record)
    check_constraints(model, ev, records)
