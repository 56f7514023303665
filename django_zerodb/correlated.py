"""Correlated subqueries, run once per distinct outer row.

A subquery that reads columns of the query around it (``OuterRef``) means one query per
outer row. The evaluator binds it to a row: a copy of the subquery in which every column
of an enclosing query is replaced by that row's stored value (:class:`Bound`), at any
depth (a subquery's subquery may read the outermost row too). The bound query has no
outer columns left, so it is planned and run like any other, indexes included: a bound
``inner.fk = outer.pk`` is an index lookup. Results are memoized per subquery and per
tuple of the outer values it reads, so a subquery runs once per distinct outer key, not
once per row.

``EXISTS`` whose only outer references are ``inner = outer`` equalities is still run once
for all rows (``SelectQuery._decorrelate``); this is the general case.
"""

from __future__ import annotations

import copy
from typing import Any

from django.db.models import Lookup
from django.db.models.expressions import Col, Subquery, Value
from django.db.models.sql.query import Query
from django.db.models.sql.where import WhereNode

from django_zerodb.registry import VALUES
from django_zerodb.values import hashable


class Bound(Value):
    """An enclosing row's column in a subquery bound to that row: the stored value,
    used as it is (it is already what the column holds)."""

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list]:
        return "%s", [self.value]


VALUES.add(Bound, lambda ev, expr, row: expr.value)


def memo_key(references: set[tuple[str, str]], row: dict) -> tuple:
    """The outer values a subquery reads, as a hashable key for its memo."""
    return tuple(
        (alias, column, hashable(_stored(row, alias, column)))
        for alias, column in sorted(references)
    )


def bind(query: Query, row: dict) -> Query:
    """A copy of ``query`` with every column of the aliases in ``row`` that is not the
    query's own replaced by the row's stored value."""
    bound = query.clone()
    _bind_parts(bound, row, set(bound.alias_map))
    return bound


def _stored(row: dict, alias: str, column: str) -> Any:
    record = row.get(alias)
    return None if record is None else record.get(column)


def _bind_parts(query: Query, row: dict, own: set[str]) -> None:
    query.where = _bind(query.where, row, own)
    query.select = tuple(_bind(e, row, own) for e in query.select)
    query.annotations = {k: _bind(v, row, own) for k, v in query.annotations.items()}
    query.order_by = tuple(o if isinstance(o, str) else _bind(o, row, own) for o in query.order_by)
    if isinstance(query.group_by, tuple):
        query.group_by = tuple(_bind(e, row, own) for e in query.group_by)
    query.combined_queries = tuple(_bind(part, row, own) for part in query.combined_queries)


def _bind(node: Any, row: dict, own: set[str]) -> Any:
    if isinstance(node, Col):
        if node.alias in own or node.alias not in row:
            return node
        value = _stored(row, node.alias, node.target.column)
        return Bound(value, output_field=node.output_field)
    if isinstance(node, Query):
        inner = node.clone()
        _bind_parts(inner, row, own | set(inner.alias_map))
        return inner
    if isinstance(node, Subquery):  # Exists too
        bound = node.copy()
        bound.query = _bind(node.query, row, own)
        return bound
    if isinstance(node, WhereNode):
        return WhereNode(
            [_bind(child, row, own) for child in node.children],
            connector=node.connector,
            negated=node.negated,
        )
    if isinstance(node, Lookup):
        bound = copy.copy(node)
        bound.lhs = _bind(node.lhs, row, own)
        rhs = node.rhs
        if isinstance(rhs, list | tuple):
            bound.rhs = type(rhs)(_bind(item, row, own) for item in rhs)
        elif hasattr(rhs, "resolve_expression") or isinstance(rhs, Query):
            bound.rhs = _bind(rhs, row, own)
        return bound
    if hasattr(node, "get_source_expressions"):
        sources = node.get_source_expressions()
        new = [_bind(s, row, own) for s in sources]
        if all(a is b for a, b in zip(sources, new, strict=True)):
            return node
        bound = node.copy()
        bound.set_source_expressions(new)
        return bound
    return node
