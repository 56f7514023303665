"""Evaluate Django expressions and lookups in Python, on decrypted rows, as SQL would.

A *row* maps each table alias of a query to its record (a dict of column -> value, the
primary key included) or to None (an outer join that found nothing). Conditions use SQL's
three-valued logic: a comparison with NULL is *unknown* (None), ``NOT unknown`` is
unknown, and a row passes a WHERE clause only when it is True.

Fail closed: expressions, functions, transforms and aggregates are dispatched on their
real classes, lookups on the builtin lookup they derive from (``registry.py``); anything
this backend does not implement exactly (a class it does not know, a subclass that
changes its SQL, a column of an enclosing query) raises ``NotSupportedError`` naming it
and the way out (``django_zerodb.expressions.register``). Never SQL text.
"""

from __future__ import annotations

import decimal
import json
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

from django.db.models import Aggregate, Lookup, Q
from django.db.models.expressions import (
    Case,
    Col,
    ColPairs,
    CombinedExpression,
    Exists,
    ExpressionList,
    ExpressionWrapper,
    NegatedExpression,
    OrderBy,
    OuterRef,
    RawSQL,
    Ref,
    ResolvedOuterRef,
    Star,
    Subquery,
    Value,
    When,
)
from django.db.models.fields.json import (
    JSONExact,
    KeyTextTransform,
    KeyTransform,
    KeyTransformExact,
    KeyTransformIExact,
)
from django.db.models.sql.compiler import PositionRef
from django.db.models.sql.query import Query
from django.db.models.sql.where import AND, OR, XOR, ExtraWhere, NothingNode, WhereNode

from django_zerodb import (  # noqa: F401  (they register)
    aggregates,
    casts,
    functions,
    jsonvalues,
    temporal,
    windows,
)
from django_zerodb.affinity import coercions
from django_zerodb.compat import JSON_NONE_DEPRECATION, AggregateFilter, AggregateOrderBy, JSONNull
from django_zerodb.correlated import Bound, bind, memo_key
from django_zerodb.exceptions import NotSupportedError
from django_zerodb.expressions import UserLookup
from django_zerodb.registry import AGGREGATES as AGGREGATE_FUNCTIONS
from django_zerodb.registry import LOOKUPS, VALUES, own_sql, unsupported
from django_zerodb.values import (
    Order,
    and3,
    compare,
    computing,
    hashable,
    not3,
    or3,
    text,
    xor3,
)
from zerodb_core.api import Contains

__all__ = [
    "AGGREGATES",
    "ANNOTATIONS",
    "Evaluator",
    "Order",
    "check_supported",
    "compare",
    "hashable",
    "lookup_kind",
    "lookup_test",
]

Row = dict[str, Any]

# Aggregate values of the current group, keyed by ``id(aggregate expression)``.
AGGREGATES = "__aggregates__"
# Annotation values already computed for a row (``Ref`` points to them by name).
ANNOTATIONS = "__annotations__"


LOOKUP_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "exact": lambda a, b: compare(a, b) == 0,
    "iexact": lambda a, b: text(a).lower() == text(b).lower(),
    "gt": lambda a, b: compare(a, b) > 0,
    "gte": lambda a, b: compare(a, b) >= 0,
    "lt": lambda a, b: compare(a, b) < 0,
    "lte": lambda a, b: compare(a, b) <= 0,
    "contains": lambda a, b: text(b) in text(a),
    "icontains": lambda a, b: text(b).lower() in text(a).lower(),
    "startswith": lambda a, b: text(a).startswith(text(b)),
    "istartswith": lambda a, b: text(a).lower().startswith(text(b).lower()),
    "endswith": lambda a, b: text(a).endswith(text(b)),
    "iendswith": lambda a, b: text(a).lower().endswith(text(b).lower()),
    "regex": lambda a, b: re.search(text(b), text(a)) is not None,
    "iregex": lambda a, b: re.search(text(b), text(a), re.IGNORECASE) is not None,
    "search": lambda a, b: Contains("", text(b)).test(a),
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
    with computing(f"the lookup {name!r}"):
        return test(lhs, rhs)


def lookup_kind(lookup: Any) -> str | UserLookup:
    """What a lookup means: the name of the builtin lookup its class derives from
    (``"exact"`` for ``IntegerFieldExact``...), or the user's registered implementation.
    NotSupportedError for any other lookup class."""
    kind = LOOKUPS.find(type(lookup))
    if isinstance(kind, Refused):
        raise NotSupportedError(kind.message)
    return kind


def check_supported(node: Any) -> None:
    """Refuse now what evaluating ``node`` would refuse on the first row: a query is
    refused when it is built, whether or not any row reaches the expression (an empty
    table, a CASE branch no row takes). Subqueries are checked when they run."""
    if node is None or isinstance(node, NothingNode | Star | str | int | float | bool):
        return
    if isinstance(node, WhereNode):
        for child in node.children:
            check_supported(child)
        return
    if isinstance(node, Subquery | Query):
        return
    if isinstance(node, ResolvedOuterRef | OuterRef):
        raise ValueError(OUTSIDE_SUBQUERY)
    if isinstance(node, Lookup):
        if lookup_kind(node) == "isnull" and not isinstance(node.rhs, bool):
            raise ValueError("The QuerySet value for an isnull lookup must be True or False.")
        check_supported(node.lhs)
        rhs = node.rhs
        for item in rhs if isinstance(rhs, list | tuple) else [rhs]:
            if hasattr(item, "resolve_expression") or isinstance(item, WhereNode):
                check_supported(item)
        return
    if isinstance(node, Aggregate):
        AGGREGATE_FUNCTIONS.find(type(node))
    elif isinstance(node, OrderBy) or (
        AggregateOrderBy is not None and isinstance(node, AggregateOrderBy)
    ):
        pass  # sorting, not a value: its expressions are checked below
    elif hasattr(node, "resolve_expression"):
        VALUES.find(type(node))
    else:
        return
    if own_sql(node):
        raise unsupported(type(node))
    for child in node.get_source_expressions():
        check_supported(child)


class Refused:
    """A lookup refused with the words Django itself uses for it."""

    def __init__(self, message: str) -> None:
        self.message = message


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
        self._exists: dict[int, Any] = {}
        # Subqueries: the enclosing columns each reads, and results per outer values.
        self._references: dict[int, set] = {}
        self._subqueries: dict[tuple, list] = {}
        # ``extra(select=...)`` columns Django itself adds (see query._extra_columns).
        self.raw_columns: dict[str, tuple[str, str]] = {}
        # CURRENT_TIMESTAMP of this statement (temporal.now), taken when first asked.
        self.now: Any = None

    # -- conditions ------------------------------------------------------------------------

    def truth(self, node: Any, row: Row) -> bool | None:
        if isinstance(node, WhereNode):
            values = (self.truth(child, row) for child in node.children)
            if node.connector == AND:
                result = and3(values)
            elif node.connector == OR:
                result = or3(values)
            elif node.connector == XOR:
                result = xor3(list(values))
            else:
                raise NotSupportedError(f"unknown connector {node.connector!r}")
            return not3(result) if node.negated else result
        if isinstance(node, NothingNode):
            return False
        if isinstance(node, Lookup):
            return self.lookup_truth(node, row)
        value = self.value(node, row)
        if value is None:
            return None
        return bool(value)

    def lookup_truth(self, lookup: Any, row: Row) -> bool | None:
        kind = lookup_kind(lookup)
        lhs = self.value(lookup.lhs, row)
        rhs = self.rhs(lookup, row)
        if isinstance(kind, UserLookup):
            with computing(type(lookup).__name__):
                return kind.test(lhs, rhs)
        if isinstance(lookup, KeyTransformIExact) and lookup.rhs is None:
            # key__iexact=None is Django's key__exact=None: the key holds JSON null.
            key = lookup.lhs
            found = jsonvalues.step(jsonvalues.document(self.value(key.lhs, row)), key.key_name)
            return None if found is jsonvalues.MISSING else found is None
        if jsonvalues.is_json(lookup.lhs):
            return _json_lookup(kind, lhs, rhs)
        if isinstance(lookup.lhs, Col) and isinstance(lookup.rhs, Col | Bound):
            # Two columns of different kinds compare as SQLite compares them.
            to_lhs, to_rhs = coercions(lookup.lhs.output_field, lookup.rhs.output_field)
            lhs, rhs = (to_lhs or _same)(lhs), (to_rhs or _same)(rhs)
        return lookup_test(kind, jsonvalues.scalar(lhs), rhs)

    def rhs(self, lookup: Any, row: Row) -> Any:
        """The right-hand side of a lookup as stored values (cached when constant)."""
        key = id(lookup)
        if key in self._rhs:
            return self._rhs[key]
        rhs = lookup.rhs
        constant = True
        kind = lookup_kind(lookup)
        name = kind if isinstance(kind, str) else None
        if name in _HAS_KEY:
            value = _key_paths(rhs)
        elif getattr(lookup, "bilateral_transforms", None):
            value, constant = self._bilateral(lookup, name, row)
        elif _is_query(rhs):
            db = getattr(rhs, "_db", None)
            if db is not None and db != self.connection.alias:
                raise ValueError(
                    "Subqueries aren't allowed across different databases. Force the "
                    "inner query to be evaluated using `list(inner_query)`."
                )
            constant = not self.correlated(rhs)
            value = self.subquery_rows(getattr(rhs, "query", rhs), row)
            if name != "in":
                value = value[0] if value else None
        elif hasattr(rhs, "resolve_expression") or hasattr(rhs, "as_sql"):
            constant = _is_constant(rhs)
            value = self._operand(lookup, rhs, row)
        elif name in ("in", "range"):
            # Django drops None from a list of values for ``in`` (NULL equals nothing).
            value = [self._item(lookup, v, row) for v in rhs if v is not None or name == "range"]
            constant = all(not hasattr(v, "resolve_expression") for v in rhs)
        elif name == "isnull":
            value = rhs
        else:
            value = self.prep(lookup, rhs, name)
            if value is None and isinstance(lookup, JSONExact):
                _warn_json_exact_none(lookup)
        if constant:
            self._rhs[key] = value
        return value

    def _bilateral(self, lookup: Any, name: str | None, row: Row) -> tuple[Any, bool]:
        """The right-hand side with the lookup's bilateral transforms applied, as
        Django's SQL applies them (``name__upper__exact="x"`` with an ``Upper``
        registered as bilateral compares ``UPPER(name) = UPPER('x')``)."""
        field = lookup.lhs.output_field

        def transformed(item: Any) -> Any:
            if not hasattr(item, "resolve_expression"):
                item = Value(item, output_field=field)
            return self.value(lookup.apply_bilateral_transforms(item), row)

        rhs = lookup.rhs
        if name in ("in", "range") and isinstance(rhs, list | tuple | set | frozenset):
            items = [v for v in rhs if v is not None or name == "range"]
            constant = all(_is_constant(v) for v in items if hasattr(v, "resolve_expression"))
            return [transformed(v) for v in items], constant
        if name == "isnull":
            return rhs, True
        constant = not hasattr(rhs, "resolve_expression") or _is_constant(rhs)
        return transformed(rhs), constant

    def _item(self, lookup: Any, value: Any, row: Row) -> Any:
        if hasattr(value, "resolve_expression"):
            return self._operand(lookup, value, row)
        return self.prep(lookup, value, lookup_kind(lookup))

    def _operand(self, lookup: Any, expr: Any, row: Row) -> Any:
        """An expression on a lookup's right: a Python value against JSON (see
        jsonvalues.operand), else a key's value as a scalar; ``in``'s list item by item."""
        if isinstance(expr, ExpressionList):
            return tuple(self._operand(lookup, e, row) for e in expr.get_source_expressions())
        value = self.value(expr, row)
        if jsonvalues.is_json(lookup.lhs):
            return jsonvalues.operand(expr, value)
        return jsonvalues.scalar(value)

    def prep(self, lookup: Any, value: Any, name: Any = None) -> Any:
        """A direct value as the lhs field stores it (dates, decimals, naive UTC...)."""
        if name is None:
            name = lookup_kind(lookup)
        if value is None or name in _PATTERN_LOOKUPS:
            return value
        if jsonvalues.is_json(lookup.lhs):
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

    # -- subqueries ------------------------------------------------------------------------

    def correlated(self, query: Any) -> bool:
        """Whether a subquery reads columns of enclosing queries (refused when one is an
        ``OuterRef`` never resolved to a column)."""
        from django_zerodb.translate import OUTER

        inner = getattr(query, "query", query)
        key = id(inner)
        if key not in self._references:
            references = outer_references(inner)
            if any(alias == OUTER for alias, _ in references):
                refuse_correlated(inner, "outside a query that gives its OuterRef a column")
            self._references[key] = references
        return bool(self._references[key])

    def subquery_rows(self, query: Any, row: Row) -> list:
        """A subquery's first column, run once, or once per distinct outer row it reads
        (correlated.py)."""
        correlated = self.correlated(query)
        key = (id(query), memo_key(self._references[id(query)], row) if correlated else ())
        if key not in self._subqueries:
            self._subqueries[key] = self.resolve_subquery(bind(query, row) if correlated else query)
        return self._subqueries[key]

    # -- values ----------------------------------------------------------------------------

    def value(self, expr: Any, row: Row) -> Any:
        if isinstance(expr, Aggregate):
            return _aggregate(self, expr, row)
        if isinstance(expr, Lookup):  # a lookup used as a value: annotate(x=GreaterThan(...))
            return self.lookup_truth(expr, row)
        handler = VALUES.find(type(expr))
        if own_sql(expr):
            raise unsupported(type(expr))
        return handler(self, expr, row)


# -- JSONField ----------------------------------------------------------------------------
# JSON is stored as its text. Key transforms parse it and walk keys in Python (see
# jsonvalues.py); lookups on JSON compare Python values (so key order and spacing never
# matter).

_HAS_KEY = frozenset({"has_key", "has_keys", "has_any_keys"})


def _key_transform(ev: Evaluator, expr: Any, row: Row) -> Any:
    found = jsonvalues.step(jsonvalues.document(ev.value(expr.lhs, row)), expr.key_name)
    if isinstance(expr, KeyTextTransform):
        if found is jsonvalues.MISSING or found is None:
            return None
        return json.dumps(found) if isinstance(found, dict | list) else found
    return jsonvalues.Parsed(found)


def _key_paths(rhs: Any) -> list[list[Any]]:
    """The paths a ``has_key``/``has_keys``/``has_any_keys`` asks for: a key transform
    on the right (``value__has_key=F("value__a__b")``) names its own path, as in SQL."""
    keys = rhs if isinstance(rhs, list | tuple) else [rhs]
    return [jsonvalues.key_path(k) if isinstance(k, KeyTransform) else [k] for k in keys]


def _warn_json_exact_none(lookup: Any) -> None:
    """Django's deprecation warning for ``json_field=None`` (meaning JSON null), which
    its SQL compilers give and this backend, compiling no SQL, gives here (Django 6.1 and
    later: older versions do not deprecate it)."""
    if JSON_NONE_DEPRECATION is None:
        return
    if isinstance(lookup, KeyTransformExact) or isinstance(lookup.lhs, KeyTransform):
        return
    from django.utils.deprecation import django_file_prefixes  # Django 6.0 and later

    warnings.warn(
        "Using None as the right-hand side of an exact lookup on JSONField to mean JSON "
        "scalar 'null' is deprecated. Use JSONNull() instead (or use the __isnull lookup "
        "if you meant SQL NULL).",
        JSON_NONE_DEPRECATION,
        skip_file_prefixes=(*django_file_prefixes(), os.path.dirname(__file__)),
    )


def _json_lookup(name: str, lhs: Any, rhs: Any) -> bool | None:
    """A lookup whose left side is JSON (a column or a key of one); ``rhs`` holds Python
    values (see ``Evaluator.rhs``)."""
    value = jsonvalues.document(lhs)
    if name == "isnull":
        return (value is jsonvalues.MISSING) == bool(rhs)
    if value is jsonvalues.MISSING:
        return None
    if name in _HAS_KEY:
        found = [jsonvalues.has_path(value, path) for path in rhs]
        return any(found) if name == "has_any_keys" else all(found)
    if name in ("exact", "iexact"):
        if name == "iexact" and isinstance(value, str) and isinstance(rhs, str):
            return value.lower() == rhs.lower()
        return jsonvalues.equal(value, rhs)
    if name == "in":
        return any(jsonvalues.equal(value, v) for v in rhs)
    if name in _PATTERN_LOOKUPS:
        if value is None:
            return None
        text_value = value if isinstance(value, str) else json.dumps(value)
        return lookup_test(name, text_value, rhs)
    if value is None:
        return None
    return lookup_test(name, value, rhs)


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
    return isinstance(value, Query | Subquery)


def _is_constant(expr: Any) -> bool:
    if isinstance(expr, Col | Ref | ResolvedOuterRef | OuterRef):
        return False
    if isinstance(expr, Subquery | Query) and outer_references(getattr(expr, "query", expr)):
        return False
    if not hasattr(expr, "get_source_expressions"):
        return True
    return all(_is_constant(e) for e in expr.get_source_expressions() if e is not None)


def outer_references(query: Any) -> set[tuple[Any, Any]]:
    """Columns of enclosing queries that a subquery reads anywhere (WHERE, selected
    columns, annotations, ordering, grouping): ``(alias, column)``; an ``OuterRef`` not
    resolved to a column counts as ``("outer", name)``."""
    from django_zerodb.translate import query_columns

    return {c for c in query_columns(query) if c[0] not in query.alias_map}


def refuse_correlated(query: Any, where: str) -> None:
    """A subquery that reads columns of the query around it cannot be run once: refuse
    it rather than answer as if those columns were NULL."""
    inner = getattr(query, "query", query)
    if outer_references(inner):
        raise NotSupportedError(
            f"a correlated subquery (OuterRef) {where} is not supported by the encrypted "
            "database: annotate with an aggregate across the relation (such as "
            "Max('employees__salary')), filter across the relation, or use "
            "prefetch_related()"
        )


# -- expression handlers ----------------------------------------------------------------------


def _col(ev: Evaluator, expr: Any, row: Row) -> Any:
    try:
        record = row[expr.alias]
    except KeyError:
        # Not a table of this query: a column of an enclosing one (an OuterRef that
        # reached here). Answering NULL would be a silent wrong answer.
        raise NotSupportedError(
            f"a column of an enclosing query ({expr.alias}.{expr.target.column}) is not "
            "supported here by the encrypted database: rewrite the subquery as a filter or "
            "an aggregate across the relation"
        ) from None
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
    """Arithmetic on numbers (and on durations with durations, both microseconds)."""
    a = ev.value(expr.lhs, row)
    b = ev.value(expr.rhs, row)
    if a is None or b is None:
        return None
    op = expr.connector
    with computing(f"the operator {op!r}"):
        try:
            return _arithmetic(op, a, b)
        except TypeError:
            if isinstance(a, float | int) and isinstance(b, decimal.Decimal | float | int):
                result = _combined_decimal(op, a, b)
                if result is not None:
                    return result
            raise


def _arithmetic(op: str, a: Any, b: Any) -> Any:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            return None  # as SQLite (PostgreSQL raises division by zero)
        if isinstance(a, int) and isinstance(b, int):
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
            return decimal.Decimal(a) / decimal.Decimal(b)
        return a / b
    if op in ("%%", "%"):
        return functions.sql_mod(a, b)
    if op == "^":
        return functions.sql_power(a, b)
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
    raise NotSupportedError(f"the operator {op!r} is not supported by the encrypted database")


def _combined_decimal(op: str, a: Any, b: Any) -> Any:
    a, b = decimal.Decimal(str(a)), decimal.Decimal(str(b))
    return {"+": a + b, "-": a - b, "*": a * b}.get(op)


def _wrapper(ev: Evaluator, expr: Any, row: Row) -> Any:
    """``ExpressionWrapper``: a key's value leaves JSON when the wrapper's type is not."""
    value = ev.value(expr.expression, row)
    return value if jsonvalues.is_json(expr) else jsonvalues.scalar(value)


def _case(ev: Evaluator, expr: Any, row: Row) -> Any:
    for when in expr.cases:
        if ev.truth(when.condition, row) is True:
            return ev.value(when.result, row)
    return ev.value(expr.default, row)


def _when_condition(ev: Evaluator, expr: Any, row: Row) -> Any:
    return ev.truth(expr.condition, row)


def _value(ev: Evaluator, expr: Any, row: Row) -> Any:
    from zerodb_core.api import QueryError

    value = expr.value
    field = getattr(expr, "_output_field_or_none", None)
    if value is None and jsonvalues.is_json(expr):
        # Value(None, JSONField()) is JSON's null, except inside an expression written
        # to a column (bulk_update's CASE), where Django's get_db_prep_save makes it NULL.
        return None if getattr(expr, "for_save", False) else "null"
    if value is not None and field is not None and hasattr(field, "get_db_prep_value"):
        try:
            return field.get_db_prep_value(value, ev.connection, prepared=False)
        except (TypeError, ValueError, decimal.InvalidOperation, QueryError):
            return value
    return value


def _scalar_subquery(ev: Evaluator, expr: Any, row: Row) -> Any:
    """``Subquery(...)`` used as a value: its first row's first column, or NULL."""
    found = ev.subquery_rows(getattr(expr, "query", expr), row)
    return found[0] if found else None


def _exists(ev: Evaluator, expr: Any, row: Row) -> Any:
    """``EXISTS (subquery)``, decorrelated once: the subquery runs without its
    ``inner = outer`` conditions, selecting the inner columns; a row passes when its
    outer values are among the results."""
    found = ev._exists.get(id(expr))
    if found is None:
        try:
            found = ev.decorrelate(expr.query)
        except NotSupportedError:
            if not ev.correlated(expr.query):
                raise
            found = _PER_ROW  # outer references other than inner = outer equalities
        ev._exists[id(expr)] = found
    if found is _PER_ROW:
        return bool(ev.subquery_rows(expr.query, row))
    outer, keys = found
    if not outer:
        return bool(keys)
    values = tuple(convert(ev.value(c, row)) for c, convert in outer)
    return None not in values and tuple(map(hashable, values)) in keys


def _same(value: Any) -> Any:
    return value


_PER_ROW: Any = object()  # an EXISTS that runs once per distinct outer row


# Django's words (ResolvedOuterRef.as_sql) for an OuterRef in a query run on its own.
OUTSIDE_SUBQUERY = (
    "This queryset contains a reference to an outer query and may only be used in a subquery."
)


def _unresolved(ev: Evaluator, expr: Any, row: Row) -> Any:
    if isinstance(expr, Q):
        raise NotSupportedError("unresolved Q object in an expression")
    raise ValueError(OUTSIDE_SUBQUERY)


for _klass, _handler in {
    ExpressionList: lambda ev, e, row: tuple(ev.value(x, row) for x in e.get_source_expressions()),
    KeyTransform: _key_transform,
    KeyTextTransform: _key_transform,
    Exists: _exists,
    Subquery: _scalar_subquery,
    Query: _scalar_subquery,
    Col: _col,
    ColPairs: _col_pairs,
    RawSQL: _raw_sql,
    ExtraWhere: _extra_where,
    Ref: _ref,
    PositionRef: _ref,
    Value: _value,
    # JSON's null (not SQL's NULL), stored as JSON text like every JSON value.
    JSONNull: lambda ev, e, row: "null",
    CombinedExpression: _combined,
    ExpressionWrapper: _wrapper,
    # ~Exists(...), ~F("flag")
    NegatedExpression: lambda ev, e, row: not3(ev.truth(e.expression, row)),
    When: _when_condition,
    WhereNode: lambda ev, e, row: ev.truth(e, row),
    NothingNode: lambda ev, e, row: False,
    ResolvedOuterRef: _unresolved,
    OuterRef: _unresolved,
}.items():
    VALUES.add(_klass, _handler)
VALUES.add(Case, _case)
VALUES.add(AggregateFilter, lambda ev, e, row: ev.truth(e.condition, row))


def _register_lookups() -> None:
    """The builtin lookups, by class (Django's per-field subclasses find them through
    the MRO, see registry.py), and this backend's full-text ``search``."""
    from django.db.models import lookups as builtin
    from django.db.models.fields import json as json_lookups

    from django_zerodb.lookups import Search

    for klass in (
        builtin.Exact,
        builtin.IExact,
        builtin.GreaterThan,
        builtin.GreaterThanOrEqual,
        builtin.LessThan,
        builtin.LessThanOrEqual,
        builtin.In,
        builtin.Contains,
        builtin.IContains,
        builtin.StartsWith,
        builtin.IStartsWith,
        builtin.EndsWith,
        builtin.IEndsWith,
        builtin.Range,
        builtin.IsNull,
        builtin.Regex,
        builtin.IRegex,
        json_lookups.HasKey,
        json_lookups.HasKeys,
        json_lookups.HasAnyKeys,
        Search,
    ):
        LOOKUPS.add(klass, klass.lookup_name)
    # JSON containment (supports_json_field_contains = False), in Django's words.
    for klass in (json_lookups.DataContains, json_lookups.ContainedBy):
        LOOKUPS.add(
            klass,
            Refused(
                f"{klass.lookup_name} lookup is not supported on this database backend. "
                "The encrypted database stores JSON as text: compare keys "
                "(value__key=...) instead"
            ),
        )


_register_lookups()
