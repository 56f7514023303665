"""Functional and partial indexes as *derived columns* of the encrypted records.

An index on ``Lower("last_name")``, or on ``email`` where ``active`` holds, indexes a
value SQL computes per row. The engine indexes stored columns only (it never imports
Django, and its catalog drives index maintenance for every writer), so the backend stores
the computed value in the record itself, under a hidden column, and the engine indexes
that column like any other:

* the column's name is ``~`` and a digest of the expression and the condition
  (``~3fa09c2b41``): the same definition always gives the same column, in every process;
* its value is the expression evaluated by the backend's own evaluator (the one that
  answers ``filter()``), or None where the condition is not True, so a partial unique
  index lets those rows repeat as SQL's lets rows outside its predicate;
* every write path sets it: INSERT (``bulk_create`` included) and UPDATE (``save()``,
  ``update()``, ``bulk_update()``) call :func:`add_derived` on each record they write,
  and migrations that add or change an index rewrite the records first
  (``schema.py``); deletes remove the record and so the value.

A record keeps only the derived columns its model declares: the others are dropped on
every write, so an index a migration removed leaves no value behind to collide with.
The values are encrypted with the record: they cost bytes (a lowered name once more),
never confidentiality. Which derived columns a model has is read from its indexes and
constraints in ``indexes.py`` (``Derived``, ``model_derived``); this module computes
them on writes and plans queries with them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import FieldError
from django.db import models
from django.db.models import Lookup
from django.db.models.expressions import Col
from django.db.models.sql.query import Query

from django_zerodb.evaluate import Evaluator, lookup_kind
from django_zerodb.exceptions import NotSupportedError
from django_zerodb.indexes import is_derived, model_derived
from django_zerodb.translate import build_operator, conjuncts, direct_lookup

__all__ = ["add_derived", "deriver", "is_derived", "served", "served_column"]


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A model's derived columns resolved against a query of the model, built once."""

    alias: str
    columns: tuple[tuple[str, Any, Any], ...]  # (column, resolved expression, where)


@functools.lru_cache(maxsize=512)
def compiled(model: type[models.Model]) -> _Compiled:
    query = Query(model)
    alias = query.get_initial_alias()
    columns = []
    for part in model_derived(model):
        try:
            resolved = part.expression.resolve_expression(query, allow_joins=False)
            where = query.build_where(part.condition) if part.condition is not None else None
        except FieldError as exc:
            raise NotSupportedError(
                f"an index of {model._meta.label} cannot be kept by the encrypted database "
                f"({exc}): index expressions of the model's own fields"
            ) from exc
        columns.append((part.column, resolved, where))
    return _Compiled(alias, tuple(columns))


def add_derived(
    model: type[models.Model], ev: Any, records: Iterable[dict], keep: frozenset | None = None
) -> None:
    """Set every derived column ``model`` declares (those in ``keep``, if given) on each
    record, in place, and drop the other derived columns."""
    spec = compiled(model)
    columns = [c for c in spec.columns if keep is None or c[0] in keep]
    for record in records:
        for stale in [k for k in record if is_derived(k)]:
            del record[stale]
        if not columns:
            continue
        row = {spec.alias: record}
        values = {}
        for column, resolved, where in columns:
            if where is not None and ev.truth(where, row) is not True:
                values[column] = None
            else:
                values[column] = ev.value(resolved, row)
        record.update(values)


def deriver(connection: Any, model: type[models.Model], keep: frozenset | None = None):
    """``change(fields) -> fields`` setting the derived columns of one stored record, for
    a migration's rewrite of every record (``schema.RewriteRecords``)."""

    def no_subquery(query: Any) -> Any:
        raise NotSupportedError("subqueries are not supported in index expressions")

    ev = Evaluator(connection, no_subquery, no_subquery)

    def change(fields: dict) -> dict:
        add_derived(model, ev, [fields], keep)
        return fields

    return change


def served(model: Any, term: Any, terms: list, ev: Any) -> Any:
    """An engine expression on a derived column meaning exactly what the top-level
    conjunct ``term`` of a query of ``model`` means, or None.

    * ``Lower(x)``, ``Upper(x)``... compared to a constant, where an unconditional index
      keeps that expression: the same comparison on its column;
    * ``x__iexact`` / ``x__istartswith`` where a ``Lower("x")`` index exists: equality
      with (prefix of) the lowered value (the evaluator's ``iexact`` is ``lower() ==
      lower()``, its ``Lower`` is ``lower()``);
    * a comparison of ``x`` where a partial index on ``x`` exists and every conjunct of
      its condition is itself a conjunct of the query (provably implied; nothing else is
      inferred): there the derived column equals ``x``. Only comparisons that a NULL
      never satisfies, since the column is NULL outside the condition.
    """
    if model is None or not isinstance(term, Lookup) or not direct_lookup(term):
        return None
    name = lookup_kind(term)  # the builtin lookup it is (a str: direct_lookup)
    lhs = term.lhs
    if not isinstance(lhs, Col):
        column = served_column(model, lhs)
        value = ev.rhs(term, {}) if column is not None else None
        return build_operator(name, column, value) if column is not None else None
    if name in ("iexact", "istartswith"):
        column = lowered_column(model, lhs.target.column)
        value = ev.rhs(term, {}) if column is not None else None
        if not isinstance(value, str):
            return None
        return build_operator("exact" if name == "iexact" else "startswith", column, value.lower())
    if name == "isnull":
        return None
    for column, field_column, where in partial_columns(model):
        if field_column == lhs.target.column and all(
            any(c == t for t in terms) for c in conjuncts(where)
        ):
            value = ev.rhs(term, {})
            return build_operator(name, column, value) if value is not None else None
    return None


def served_column(model: type[models.Model], lhs: Any) -> str | None:
    """The derived column holding ``lhs`` (a resolved expression of a query's base
    table) for every row, if an unconditional index keeps one."""
    if model is None or isinstance(lhs, Col):
        return None
    spec = compiled(model)
    for column, resolved, where in spec.columns:
        if where is None and _same(resolved, lhs, spec.alias):
            return column
    return None


def partial_columns(model: type[models.Model]) -> list[tuple[str, str, Any]]:
    """``(derived column, field column, where)`` of each partial index on one plain
    field: the derived column equals the field wherever ``where`` is True."""
    if model is None:
        return []
    spec = compiled(model)
    out = []
    for column, resolved, where in spec.columns:
        if where is not None and isinstance(resolved, Col):
            out.append((column, resolved.target.column, where))
    return out


def lowered_column(model: type[models.Model], column: str) -> str | None:
    """The derived column of an unconditional ``Lower`` index on ``column``, if any."""
    if model is None:
        return None
    spec = compiled(model)
    for derived_column, resolved, where in spec.columns:
        if (
            where is None
            and type(resolved) is models.functions.Lower
            and isinstance(resolved.source_expressions[0], Col)
            and resolved.source_expressions[0].target.column == column
        ):
            return derived_column
    return None


def _same(resolved: Any, expression: Any, alias: str) -> bool:
    """Whether two resolved expressions compute the same thing on the same table (Django
    expressions compare by their class and arguments, columns by alias and field)."""
    try:
        return resolved == expression.relabeled_clone({_alias_of(expression): alias})
    except (AttributeError, TypeError):
        return False


def _alias_of(expression: Any) -> str | None:
    for col in expression.flatten():
        if isinstance(col, Col):
            return col.alias
    return None
