"""From Django's ``WhereNode`` to the engine's query expressions.

A WHERE clause is split into its top-level conjuncts. A conjunct that reads columns of one
table alias only is *pushed down* to that table as an engine expression that is exactly
"this conjunct is True" under SQL's three-valued logic: negations are pushed to the leaves
(De Morgan holds in Kleene logic), and a negated comparison becomes the engine's "present
value outside ..." operator (``NotEq``, ``NotInRange``, ``NotAny``, ``Le``...), which is
what ``NOT (x > 5)`` means when ``x`` may be NULL. Index-servable leaves become index scans;
anything else becomes a check on the decrypted record (``RowCondition``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import CharField, Lookup, TextField
from django.db.models.expressions import (
    Case,
    Col,
    ColPairs,
    OuterRef,
    ResolvedOuterRef,
    Subquery,
)
from django.db.models.sql.query import Query
from django.db.models.sql.where import AND, OR, NothingNode, WhereNode

from django_zerodb.affinity import coercions
from django_zerodb.correlated import Bound
from django_zerodb.evaluate import Evaluator, lookup_kind, lookup_test
from zerodb_core.api import (
    And,
    Any_,
    Contains,
    Eq,
    Expr,
    Ge,
    Gt,
    InRange,
    IsNull,
    Le,
    Lt,
    Match,
    NotAny,
    NotEq,
    NotInRange,
    Or,
    QueryError,
    StartsWith,
)


class RowCondition(Expr):
    """A condition on several columns of one record, evaluated by the Django layer."""

    def __init__(self, node: Any, alias: str, columns: set[str], ev: Evaluator, negated: bool):
        self.node = node
        self.alias = alias
        self.columns = columns
        self.ev = ev
        self.negated = negated

    def matches(self, record: dict) -> bool:
        value = self.ev.truth(self.node, {self.alias: record})
        return value is (not self.negated)

    def fields(self) -> set[str]:
        return set(self.columns)

    def __repr__(self) -> str:
        return f"{'Not' if self.negated else ''}Check({', '.join(sorted(self.columns))})"


class Never(Expr):
    """Matches nothing (``filter(pk__in=[])``, a ``NothingNode``)."""

    def matches(self, record: dict) -> bool:
        return False

    def fields(self) -> set[str]:
        return set()

    def __repr__(self) -> str:
        return "Nothing"


def columns_of(node: Any) -> set[tuple[str, str]]:
    """``(alias, column)`` of every column a node reads (subqueries excluded)."""
    found: set[tuple[str, str]] = set()
    _collect_columns(node, found)
    return found


def _collect_columns(node: Any, found: set) -> None:
    if node is None or isinstance(node, str | int | float | bytes | bool):
        return
    if isinstance(node, WhereNode):
        for child in node.children:
            _collect_columns(child, found)
        return
    if isinstance(node, Col):
        found.add((node.alias, node.target.column))
        return
    if isinstance(node, ResolvedOuterRef | OuterRef):
        found.add((OUTER, node.name))  # never an alias of any query
        return
    if isinstance(node, Subquery | Query):  # Exists and PlanQuery too
        query = getattr(node, "query", node)
        found.update(c for c in query_columns(query) if c[0] not in query.alias_map)
        return
    if isinstance(node, Lookup):
        _collect_columns(node.lhs, found)
        rhs = node.rhs
        if isinstance(rhs, list | tuple):
            for item in rhs:
                if hasattr(item, "resolve_expression"):
                    _collect_columns(item, found)
        elif hasattr(rhs, "resolve_expression") or hasattr(rhs, "as_sql"):
            _collect_columns(rhs, found)
        return
    if hasattr(node, "get_source_expressions"):
        for child in node.get_source_expressions():
            _collect_columns(child, found)
        if isinstance(node, Case):
            for when in node.cases:
                _collect_columns(when, found)


# The alias of an OuterRef that was never resolved to a column.
OUTER = "\x00outer"


def query_columns(query: Any) -> set[tuple[str, str]]:
    """Every column a (sub)query reads, of its own tables and of enclosing queries: in
    its WHERE clause, selected columns, annotations, ordering and grouping."""
    found: set[tuple[str, str]] = set()
    _collect_columns(query.where, found)
    for expr in query.select:
        _collect_columns(expr, found)
    for expr in query.annotations.values():
        _collect_columns(expr, found)
    for item in query.order_by:
        if not isinstance(item, str):
            _collect_columns(item, found)
    if isinstance(query.group_by, tuple):
        for expr in query.group_by:
            _collect_columns(expr, found)
    for part in query.combined_queries:  # union() and the like
        found.update(c for c in query_columns(part) if c[0] not in part.alias_map)
    return found


def conjuncts(node: WhereNode | None) -> list[Any]:
    """Top-level AND terms of a WHERE clause (a negated or OR node is one term)."""
    if node is None:
        return []
    if isinstance(node, WhereNode) and node.connector == AND and not node.negated:
        out = []
        for child in node.children:
            out.extend(conjuncts(child))
        return out
    return [node]


def aliases_of(node: Any) -> set[str]:
    return {alias for alias, _ in columns_of(node)}


def pushdown(
    node: Any,
    alias: str,
    ev: Evaluator,
    negated: bool = False,
    serve: Callable[[Any], Expr | None] | None = None,
) -> Expr:
    """The engine expression meaning ``node is True`` (``is False`` when ``negated``) on
    records of ``alias``; the caller checked that ``node`` reads no other alias.

    ``serve(lookup)`` may give, for a lookup that is not negated, an expression of the
    same meaning that an index of a computed value serves (``derived.served``,
    ``substring.trigram_served``); None leaves the lookup as translated here."""
    if isinstance(node, NothingNode):
        return Never() if not negated else _always()
    if isinstance(node, WhereNode):
        neg = negated != node.negated
        if node.connector not in (AND, OR):  # XOR: truth() applies node.negated itself
            return _row(node, alias, negated, ev)
        parts = [pushdown(child, alias, ev, neg, serve) for child in node.children]
        if not parts:
            return _always() if node.connector == AND and not neg else Never()
        conjunctive = (node.connector == AND) != neg
        if len(parts) == 1:
            return parts[0]
        return And(*parts) if conjunctive else Or(*parts)
    if isinstance(node, Lookup):
        served = serve(node) if serve is not None and not negated else None
        return served if served is not None else _lookup(node, alias, ev, negated)
    return _row(node, alias, negated, ev)


def _always() -> Expr:
    return IsNull("__never_a_column__")


def _row(node: Any, alias: str, negated: bool, ev: Evaluator) -> Expr:
    columns = {column for _, column in columns_of(node)}
    return RowCondition(node, alias, columns, ev, negated)


def direct_lookup(lookup: Any) -> bool:
    """Whether a lookup compares with constants: no expression, no subquery, no
    bilateral transform, a builtin lookup (a user's is evaluated in Python)."""
    rhs = lookup.rhs
    direct = not (hasattr(rhs, "resolve_expression") or hasattr(rhs, "as_sql"))
    if isinstance(rhs, list | tuple):
        direct = direct and not any(hasattr(v, "resolve_expression") for v in rhs)
    return (
        direct
        and isinstance(lookup_kind(lookup), str)
        and not isinstance(rhs, Query)
        and not getattr(lookup, "bilateral_transforms", None)
    )


def build_operator(name: str, column: str, value: Any) -> Expr | None:
    """The index-servable operator for ``column <name> value``, if there is one."""
    try:
        return _operator(name, column, value, False)
    except (QueryError, ValueError):
        return None


def _lookup(lookup: Any, alias: str, ev: Evaluator, negated: bool) -> Expr:
    lhs = lookup.lhs
    rhs = lookup.rhs
    direct = not (hasattr(rhs, "resolve_expression") or hasattr(rhs, "as_sql"))
    if isinstance(rhs, list | tuple):
        direct = direct and not any(hasattr(v, "resolve_expression") for v in rhs)
    name = lookup_kind(lookup)
    if not isinstance(name, str):  # a registered user lookup: evaluated in Python
        return _row(lookup, alias, negated, ev)
    if isinstance(rhs, Bound):  # an enclosing row's value in a bound subquery
        return _bound(lookup, name, alias, ev, negated)
    # A one-column tuple lookup (Django prefetches by a foreign key with TupleIn).
    pair = isinstance(lhs, ColPairs) and len(lhs) == 1 and name in ("in", "exact")
    if (type(lhs) is not Col and not pair) or not direct or isinstance(rhs, Query):
        return _row(lookup, alias, negated, ev)
    if getattr(lookup, "bilateral_transforms", None):
        return _row(lookup, alias, negated, ev)
    if not pair and lhs.target.get_internal_type() == "JSONField":
        return _row(lookup, alias, negated, ev)  # compared as parsed JSON (evaluate.py)
    column = lhs.targets[0].column if pair else lhs.target.column
    value = ev.rhs(lookup, {})
    if pair:
        value = [v[0] for v in value] if name == "in" else value[0]
    # A prefix scan finds strings only: startswith on a number or a date tests its text
    # (as SQL casts it), below.
    scan = name != "startswith" or pair or isinstance(lhs.target, CharField | TextField)
    try:
        built = _operator(name, column, value, negated) if scan else None
    except QueryError:
        built = None
    if built is not None:
        return built
    want = not negated
    return Match(
        column,
        lambda v, n=name, r=value, w=want: lookup_test(n, v, r) is w,
        f"{'not ' if negated else ''}{name} {value!r}",
    )


def _bound(lookup: Any, name: str, alias: str, ev: Evaluator, negated: bool) -> Expr:
    """``column <op> outer value``: an index-servable operator when the two columns are
    of one kind (else SQLite's affinity applies, in Python)."""
    lhs = lookup.lhs
    plain = (
        type(lhs) is Col
        and not getattr(lookup, "bilateral_transforms", None)
        and lhs.target.get_internal_type() != "JSONField"
        and coercions(lhs.output_field, lookup.rhs.output_field) == (None, None)
    )
    if plain:
        try:
            built = _operator(name, lhs.target.column, lookup.rhs.value, negated)
        except QueryError:
            built = None
        if built is not None:
            return built
    return _row(lookup, alias, negated, ev)


def _operator(name: str, column: str, value: Any, negated: bool) -> Expr | None:
    """An index-servable engine operator for a simple lookup, if there is one."""
    if name == "isnull":
        if not isinstance(value, bool):
            raise ValueError("The QuerySet value for an isnull lookup must be True or False.")
        return IsNull(column, value != negated)
    if value is None:
        return Never()  # a comparison with NULL is never True, nor is its negation
    if name == "exact":
        return NotEq(column, value) if negated else Eq(column, value)
    if name == "in":
        # Django drops None from a list of values (NULL equals nothing); IN () is False.
        values = [v for v in value if v is not None]
        if not values:
            return _always() if negated else Never()
        return NotAny(column, values) if negated else Any_(column, values)
    if name == "range":
        low, high = value
        if low is None or high is None:
            return Never()
        return NotInRange(column, low, high) if negated else InRange(column, low, high)
    if name in ("gt", "gte", "lt", "lte"):
        ops = {"gt": (Gt, Le), "gte": (Ge, Lt), "lt": (Lt, Ge), "lte": (Le, Gt)}[name]
        return ops[1](column, value) if negated else ops[0](column, value)
    if name == "startswith" and not negated and isinstance(value, str):
        return StartsWith(column, value)
    if name == "search" and not negated and isinstance(value, str):
        return Contains(column, value)
    return None


def combine(exprs: list[Expr]) -> Expr | None:
    if not exprs:
        return None
    return exprs[0] if len(exprs) == 1 else And(*exprs)
