"""An executable SELECT built from a compiler's ``sql.Query`` (never from SQL text).

The WHERE clause is split into conjuncts (``translate.py``). Conjuncts on the base table
become one engine expression, planned on its indexes. Conjuncts on a table reached by
INNER joins are answered on that table first and turned into ``fk IN (...)`` on the table
that joins it (a semi-join), so ``filter(department__name="R&D")`` reads the department
index, then the employee FK index. Joins themselves are hash joins on decrypted rows.

Fast path: a query over one table (plus joins that attach at most one row, such as
``select_related``) with an index-compatible ordering is paged, ordered and counted by
the engine from its counted indexes. Everything else (residual conditions across tables,
grouping, DISTINCT, ordering by expressions) runs in Python on the matching rows.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Aggregate, Count
from django.db.models.expressions import Col, OrderBy, Ref, Star, Window
from django.db.models.lookups import IntegerFieldOverflow
from django.db.models.sql.compiler import SQLUpdateCompiler
from django.db.models.sql.datastructures import Join
from django.db.models.sql.query import Query
from django.db.models.sql.where import AND, NothingNode, WhereNode

from django_zerodb import combined, windows
from django_zerodb.affinity import coercions, join_coercions
from django_zerodb.derived import served, served_column
from django_zerodb.evaluate import (
    AGGREGATES,
    ANNOTATIONS,
    Evaluator,
    check_supported,
    outer_references,
)
from django_zerodb.exceptions import NotSupportedError
from django_zerodb.jsonvalues import exported, scalar, sortable
from django_zerodb.registry import AGGREGATES as AGGREGATE_FUNCTIONS
from django_zerodb.registry import own_sql, unsupported
from django_zerodb.substring import trigram_served
from django_zerodb.translate import (
    Never,
    aliases_of,
    combine,
    conjuncts,
    pushdown,
)
from django_zerodb.values import Order as _Order
from django_zerodb.values import hashable
from zerodb_core.api import And, Any_, Eq, Executor, Expr, QueryResult, View, encode_key, plan

Record = dict[str, Any]
# ``fetch(sort=PK_ORDER)``: order by primary key (not a column with an index).
PK_ORDER = "\x00pk"


class _Rows:
    """The minimal collection interface QueryResult needs, yielding ``(pk, record)``."""

    def __init__(self, view: View, table: str) -> None:
        self.view = view
        self.name = table

    def table(self):
        return self.view.table(self.name)

    def make(self, pk: Any, fields: Record) -> tuple[Any, Record]:
        return pk, fields


class SelectQuery:
    """One SELECT (or the row selection of an UPDATE/DELETE) on one snapshot."""

    def __init__(self, compiler: Any, *, view: View | None = None, inner: Any = None) -> None:
        self.compiler = compiler
        self.connection = compiler.connection
        self.query = compiler.query
        self.inner = inner
        self._view = view
        self.ev = Evaluator(self.connection, self._subquery, self._decorrelate)
        # ``Q(...).check(values)`` (model validation of check constraints) runs a SELECT
        # of values without any table: ``Query(None)``.
        refuse_composite_pk(self.query.model)
        self.tableless = self.query.model is None and not self.query.alias_map
        if self.tableless:
            self.base_alias, self.table, self.pk_column = None, None, None
        else:
            self.base_alias = _base_alias(self.query)
            self.table = self.query.alias_map[self.base_alias].table_name
            self.pk_column = _pk_columns().get(self.table, self.query.get_meta().pk.column)
        self._setup_done = False

    # -- setup -----------------------------------------------------------------------------

    @property
    def view(self) -> View:
        if self._view is None:
            self._view = self.connection.session.view()
        return self._view

    def _setup(self) -> None:
        if not self._setup_done:
            self._read_compiler()
            self._setup_done = True

    def _read_compiler(self) -> None:
        c = self.compiler
        self.qualify = None
        if self.inner is not None:
            self.where = None
            self.having = None
            self.order_by = []
            return
        if isinstance(c, SQLUpdateCompiler):
            self.where, self.having, self.order_by = self.query.where, None, []
            return
        columns = _extra_columns(self.query)
        if columns is None or self.query.extra_tables or self.query.extra_order_by:
            raise NotSupportedError(
                "QuerySet.extra() is not supported by the encrypted database: use "
                "annotate() with expressions, or filter in Python"
            )
        self.ev.raw_columns = columns
        _refuse_unsupported(self.query)
        if getattr(c, "_zerodb_setup", None) is None:
            _, order_by, _ = c.pre_sql_setup()
            c._zerodb_setup = (c.where, c.having, c.qualify, order_by)
        self.where, self.having, self.qualify, order_by = c._zerodb_setup
        if c._meta_ordering and self.query.group_by is not None:
            order_by = []  # as Django does: Meta.ordering never applies to a GROUP BY
        self.order_by = [expr for expr, _ in order_by]
        selected = (e for e, _, _ in c.select)
        for expr in (self.where, self.having, self.qualify, *self.order_by, *selected):
            check_supported(expr)

    def trivially_empty(self) -> bool:
        """True when the WHERE clause can match nothing whatever the data (``none()``,
        ``pk__in=[]``): like Django's ``EmptyResultSet``, no query is run (nor logged).
        A combined query's own WHERE is its first part's: its parts decide."""
        self._setup()
        q = self.query
        if q.combinator:
            empty = [
                SelectQuery(p.get_compiler(connection=self.connection)).trivially_empty()
                for p in q.combined_queries
            ]
            return combined.empty(q.combinator, empty)
        for term in conjuncts(self.where):
            if isinstance(term, NothingNode):
                return True
            if (
                getattr(term, "lookup_name", None) == "in"
                and isinstance(term.rhs, list | tuple | set | frozenset)
                and all(v is None for v in term.rhs)
            ):
                return True
            if _out_of_range(term, self.compiler, self.connection):
                return True
            if getattr(term, "lookup_name", None) == "in" and isinstance(term.rhs, Query):
                # pk__in=<a subquery that can match nothing>: Django's EmptyResultSet too.
                inner = term.rhs.get_compiler(connection=self.connection)
                if SelectQuery(inner, view=self._view).trivially_empty():
                    return True
        return False

    def _joins(self) -> list[Join]:
        q = self.query
        return [
            join
            for alias, join in q.alias_map.items()
            if alias != self.base_alias and isinstance(join, Join) and q.alias_refcount[alias]
        ]

    def _inner_chain(self, joins: list[Join]) -> set[str]:
        """Aliases reached from the base table by INNER joins only."""
        chain = {self.base_alias}
        for join in joins:
            if join.join_type == "INNER JOIN" and join.parent_alias in chain:
                chain.add(join.table_alias)
        return chain

    def _plan(self):
        self._setup()
        joins = self._joins()
        chain = self._inner_chain(joins)
        restrict: dict[str, list[Expr]] = defaultdict(list)
        residual = []
        terms = conjuncts(self.where)
        for term in terms:
            aliases = aliases_of(term)
            if not aliases:
                aliases = {self.base_alias}
            if len(aliases) == 1 and (alias := next(iter(aliases))) in chain:
                serve = self._serve(terms) if alias == self.base_alias else None
                restrict[alias].append(pushdown(term, alias, self.ev, serve=serve))
            else:
                residual.append(term)
        # Semi-joins, deepest first: rows of a restricted INNER-joined table restrict the
        # table that joins it.
        by_alias = {j.table_alias: j for j in joins}
        for join in reversed(joins):
            alias = join.table_alias
            if alias not in chain or not restrict.get(alias) or len(join.join_cols) != 1:
                continue
            on = self._on(join)
            if on is not None and aliases_of(on) != {alias}:
                continue
            to_parent, to_child = join_coercions(join)
            if to_parent is not None:  # text keys of the parent: matched in Python
                continue
            parent_col, child_col = join.join_cols[0]
            child = restrict[alias] + ([pushdown(on, alias, self.ev)] if on is not None else [])
            rows = self.fetch(join.table_name, combine(child))
            values = {(to_child or _same)(r.get(child_col)) for _, r in rows} - {None}
            restrict[join.parent_alias].append(Any_(parent_col, _sorted(values)))
        self.joins, self.by_alias = joins, by_alias
        self.restrict, self.residual = restrict, residual

    def _serve(self, terms: list) -> Any:
        """How lookups on the base table may be served by indexes of computed values: a
        ``Lower``/expression index or an implied partial index (``derived.served``, with
        the query's top-level conjuncts), else a trigram index."""
        model, ev = self.query.model, self.ev

        def serve(lookup: Any) -> Expr | None:
            return served(model, lookup, terms, ev) or trigram_served(model, lookup, ev)

        return serve

    # -- reading tables --------------------------------------------------------------------

    def fetch(
        self,
        table: str,
        expr: Expr | None,
        *,
        sort: str | None = None,
        reverse: bool = False,
        skip: int = 0,
        limit: int | None = None,
    ) -> list[tuple[Any, Record]]:
        """``(pk, record)`` of ``table`` matching ``expr``; ordered by ``sort`` (or pk)."""
        if any(isinstance(e, Never) for e in _top(expr)):
            return []
        if sort == PK_ORDER:
            return self._fetch_in_pk_order(table, expr, reverse, skip, limit)
        pks = _pk_candidates(expr, self._pk_column_of(table))
        if pks is not None:
            found = self.view.table(table)
            if found is None:
                return []
            records = self.view.run([found.get_many_reader(pks)])[0]
            rows = [(pk, records[pk]) for pk in _sorted(records)]
            rows = [r for r in rows if expr is None or expr.matches(r[1])]
            if sort is not None:
                rows.sort(key=lambda r: (_Order(r[1].get(sort)), _Order(r[0])))
            if reverse:
                rows.reverse()
            return rows[skip:] if limit is None else rows[skip : skip + limit]
        result = QueryResult(
            _Rows(self.view, table), expr, sort_index=sort, reverse=reverse, skip=skip, limit=limit
        )
        return list(result)

    def _fetch_in_pk_order(
        self, table: str, expr: Expr | None, reverse: bool, skip: int, limit: int | None
    ) -> list[tuple[Any, Record]]:
        """A page in primary-key order: when the indexes answer the filter exactly, sort
        the matching pks and read only the page's records (a full-text match of 20,000
        documents shown 20 at a time by id reads 20 records, not 20,000)."""
        found = self.view.table(table)
        if found is None:
            return []
        executor = Executor(found)
        p = executor.refine(plan(expr, found.spec)) if expr is not None else None
        if p is not None and p.source is not None and p.residual is None:
            pks = sorted(executor.primary_keys(p.source)[0], key=_Order, reverse=reverse)
            page = pks[skip:] if limit is None else pks[skip : skip + limit]
            return executor.records(page)
        rows = sorted(self.fetch(table, expr), key=lambda r: _Order(r[0]), reverse=reverse)
        return rows[skip:] if limit is None else rows[skip : skip + limit]

    def count(self, table: str, expr: Expr | None) -> int:
        if any(isinstance(e, Never) for e in _top(expr)):
            return 0
        if _pk_candidates(expr, self._pk_column_of(table)) is not None:
            return len(self.fetch(table, expr))
        return QueryResult(_Rows(self.view, table), expr).count()

    def _pk_column_of(self, table: str) -> str | None:
        return self.pk_column if table == self.table else _pk_columns().get(table)

    # -- the pipeline ----------------------------------------------------------------------

    def base_records(self) -> list[tuple[Any, Record]]:
        """``(pk, record)`` of the base table rows the WHERE clause selects (for UPDATE,
        DELETE and row locks)."""
        self._plan()
        base = self.fetch(self.table, combine(self.restrict[self.base_alias]))
        if not self.joins and not self.residual:
            return base
        joined = self._filtered(self._join([{self.base_alias: f} for _, f in base]))
        keep = {id(r[self.base_alias]) for r in joined}
        return [(pk, f) for pk, f in base if id(f) in keep]

    def exists(self) -> bool:
        return bool(self.rows(limit=1))

    def rows(self, limit: int | None = None) -> list[list[Any]]:
        if self.inner is not None:
            return self._outer_aggregate()
        if self.tableless:
            return self._tableless_rows()
        if self.query.combinator:
            return self._combined_rows(limit)
        self._plan()
        q = self.query
        low, high = q.low_mark, q.high_mark
        if limit is not None:
            high = low + limit if high is None else min(high, low + limit)
        aggregates = _aggregates(self.compiler, self.having, self.order_by)
        grouped = bool(aggregates) or q.group_by is not None
        over = windows.find(
            [*(e for e, _, _ in self.compiler.select), *self.order_by, self.qualify]
        )
        simple = not self.residual and not over and all(self._attaches(j) for j in self.joins)
        if grouped and simple and not q.distinct and _is_plain_count(self.compiler, q):
            n = self.count(self.table, combine(self.restrict[self.base_alias]))
            return [[n]]
        order = self._index_order() if simple and not grouped and not q.distinct else None
        if order is not None:
            sort, reverse = order
            base = self.fetch(
                self.table,
                combine(self.restrict[self.base_alias]),
                sort=sort,
                reverse=reverse,
                skip=low,
                limit=None if high is None else high - low,
            )
            rows = self._join([{self.base_alias: f} for _, f in base])
            self._lock(base)
            return [self._project(r) for r in rows]
        base = self.fetch(self.table, combine(self.restrict[self.base_alias]))
        rows = self._filtered(self._join([{self.base_alias: f} for _, f in base]))
        self._lock(base)
        if grouped:
            rows = self._group(rows, aggregates)
            if self.having is not None:
                rows = [r for r in rows if self.ev.truth(self.having, r) is True]
        if over:
            windows.compute(self, rows, over)
            if self.qualify is not None:  # a filter on a window (Django's QUALIFY)
                rows = [r for r in rows if self.ev.truth(self.qualify, r) is True]
        for row in rows:
            row[ANNOTATIONS] = self._annotations(row)
        rows = self._sorted(rows)
        if q.distinct_fields:
            rows = self._distinct_on(rows)
        projected = [self._project(r) for r in rows]
        if q.distinct and not q.distinct_fields:
            projected = _distinct(projected, self._distinct_extra(rows))
        return projected[low:] if high is None else projected[low:high]

    def _distinct_on(self, rows: list[dict]) -> list[dict]:
        """``distinct(*fields)`` (PostgreSQL's DISTINCT ON) on sorted rows: the first row
        of each set of rows equal in those fields. As PostgreSQL requires, the ordering
        must start with them (else which row is first is not defined): refused otherwise,
        and so are fields other than the model's own columns and annotations."""
        exprs = []
        for name in self.query.distinct_fields:
            if name in self.query.annotation_select:
                exprs.append(self.query.annotation_select[name])
                continue
            opts = self.query.get_meta()
            field = opts.pk if name == "pk" else opts._forward_fields_map.get(name)
            if field is None or not field.concrete or "__" in name:
                exprs = None  # across a relation, or a transform: refused below
                break
            exprs.append(field.get_col(self.base_alias))
        leading = [o.expression for o in self.order_by[: len(self.query.distinct_fields)]]
        plain = [e.source if isinstance(e, Ref) else e for e in leading]
        if exprs is None or len(plain) < len(exprs) or any(e not in plain for e in exprs):
            raise NotSupportedError(
                "distinct(*fields) is supported by the encrypted database only on the model's "
                "own fields and annotations, with order_by() starting with the same fields "
                "(as PostgreSQL requires)"
            )
        seen: set = set()
        kept = []
        for row in rows:
            key = tuple(_hashable(scalar(self.ev.value(e, row))) for e in exprs)
            if key not in seen:
                seen.add(key)
                kept.append(row)
        return kept

    def _distinct_extra(self, rows: list[dict]) -> list[list[Any]]:
        """Per row, the values of ordering expressions not selected: SELECT DISTINCT
        selects them too (Django's ``get_extra_select``), so rows that differ only in
        them stay apart."""
        selected = [e for e, _, _ in self.compiler.select]
        extra = [
            o.expression
            for o in self.order_by
            if not isinstance(o.expression, Ref) and o.expression not in selected
        ]
        return [[scalar(self.ev.value(e, r)) for e in extra] for r in rows]

    def _combined_rows(self, limit: int | None) -> list[list[Any]]:
        """``union()``/``intersection()``/``difference()`` (combined.py), then the
        combined query's ordering, by its selected columns, and slicing."""
        self._setup()
        q = self.query
        selects = []
        for part in q.combined_queries:
            if q.selected is not None and part.selected is None:
                part = part.clone()
                part.set_values(q.selected)
            compiler = part.get_compiler(connection=self.connection)
            combined.check_part(compiler)
            selects.append(SelectQuery(compiler, view=self._view))
        kept = combined.kept(q.combinator, [s.trivially_empty() for s in selects])
        parts = [s.rows() for s, keep in zip(selects, kept, strict=True) if keep]
        if len(parts) == 1:  # Django compiles the one part left alone: no set operation
            rows = parts[0]
        else:
            rows = combined.combine(q.combinator, q.combinator_all, parts, _hashable)
        width = len(self.compiler.select)
        if self.order_by:
            # By selected columns, and by the ones Django's get_order_by added to every
            # part for ordering only (``__orderbycolN``, after the selected ones).
            names = [alias or expr.target.column for expr, _, alias in self.compiler.select]
            names += [
                o.expression.refs
                for o in self.order_by
                if isinstance(o.expression, Ref) and o.expression.refs not in names
            ]
            keyed = [{ANNOTATIONS: dict(zip(names, row, strict=False)), "row": row} for row in rows]
            rows = [r["row"][:width] for r in self._sorted(keyed)]
        low, high = q.low_mark, q.high_mark
        if limit is not None:
            high = low + limit if high is None else min(high, low + limit)
        return rows[low:] if high is None else rows[low:high]

    def _tableless_rows(self) -> list[list[Any]]:
        """``SELECT <values> WHERE <condition>`` without a table: one row, if the
        condition is true of it (the values are annotations, read through ``Ref``)."""
        self._setup()
        row: dict = {}
        if self.where is not None and self.ev.truth(self.where, row) is not True:
            return []
        row[ANNOTATIONS] = self._annotations(row)
        return [self._project(row)]

    def _lock(self, base: list) -> None:
        if self.query.select_for_update and base:
            self.connection.session.lock_rows(self.table, base)

    def _attaches(self, join: Join) -> bool:
        """A join that adds at most one row per row: a key to the joined table's pk."""
        if len(join.join_cols) != 1 or self._on(join) is not None:
            return False
        return join.join_cols[0][1] == _pk_columns().get(join.table_name)

    def _index_order(self) -> tuple[str | None, bool] | None:
        """``(column, descending)`` when the engine can produce the wanted order itself."""
        if not self.order_by:
            return (None, False)
        keys = []
        for order in self.order_by:
            expr = order.expression
            if order.nulls_first or order.nulls_last:
                return None
            if isinstance(expr, Col) and expr.alias == self.base_alias:
                keys.append((expr.target.column, order.descending))
                continue
            # An expression an index keeps (order_by(Lower("last_name"))): its column.
            on_base = {c.alias for c in expr.flatten() if isinstance(c, Col)} == {self.base_alias}
            column = served_column(self.query.model, expr) if on_base else None
            if column is None:
                return None
            keys.append((column, order.descending))
        column, desc = keys[0]
        if any(d != desc for _, d in keys[1:]):
            return None
        rest = [c for c, _ in keys[1:]]
        if column == self.pk_column:
            if rest:
                return None
            # Unfiltered: the record tree is in pk order. Filtered: page the sorted pks.
            return (PK_ORDER if self.restrict[self.base_alias] else None, desc)
        if rest not in ([], [self.pk_column]):
            return None
        return (column, desc)

    # -- joins -----------------------------------------------------------------------------

    def _on(self, join: Join) -> Any:
        """The condition a join adds to its ON clause besides equal keys, or None: Django's
        ``get_extra_restriction`` (a generic relation's content type) and a
        ``FilteredRelation``'s condition."""
        conditions = []
        extra = join.join_field.get_extra_restriction(join.table_alias, join.parent_alias)
        if extra is not None:
            conditions.append(extra)
        relation = join.filtered_relation
        if relation is not None:
            if relation.resolved_condition is None:
                raise NotSupportedError(
                    "this FilteredRelation is not supported by the encrypted database: filter "
                    "the related objects in a separate query"
                )
            conditions.append(relation.resolved_condition)
        if not conditions:
            return None
        return conditions[0] if len(conditions) == 1 else WhereNode(conditions, connector=AND)

    def _join(self, rows: list[dict]) -> list[dict]:
        for join in self.joins:
            if len(join.join_cols) != 1:
                raise NotSupportedError("joins on composite keys are not supported")
            parent_col, child_col = join.join_cols[0]
            alias = join.table_alias
            on = self._on(join)
            # The ON clause's extra condition (a generic relation's content type): on the
            # joined table's fetch when it reads only that table, else per pair of rows.
            local = on is not None and aliases_of(on) == {alias}
            child = [pushdown(on, alias, self.ev)] if local else []
            # Keys of a number column and a text column compare as SQLite compares them.
            to_parent, to_child = join_coercions(join)
            parent_key, child_key = to_parent or _same, to_child or _same
            keys = {
                _hashable(parent_key(r[join.parent_alias].get(parent_col)))
                for r in rows
                if r.get(join.parent_alias) is not None
            } - {None}
            matches: dict[Any, list[Record]] = defaultdict(list)
            if keys:
                # Text keys of the joined table cannot be looked up by number.
                wanted = [Any_(child_col, _sorted(keys))] if to_child is None else []
                expr = combine([*wanted, *self.restrict.get(alias, []), *child])
                for _, record in self.fetch(join.table_name, expr):
                    matches[_hashable(child_key(record.get(child_col)))].append(record)
            outer = join.join_type != "INNER JOIN"
            joined = []
            for row in rows:
                parent = row.get(join.parent_alias)
                found = (
                    matches.get(_hashable(parent_key(parent.get(parent_col)))) if parent else None
                )
                if found and on is not None and not local:
                    found = [r for r in found if self.ev.truth(on, {**row, alias: r}) is True]
                if found:
                    for record in found:
                        joined.append({**row, alias: record})
                elif outer:
                    joined.append({**row, alias: None})
            rows = joined
        return rows

    def _filtered(self, rows: list[dict]) -> list[dict]:
        if not self.residual:
            return rows
        truth = self.ev.truth
        return [r for r in rows if all(truth(t, r) is True for t in self.residual)]

    # -- grouping, ordering, projection ----------------------------------------------------

    def _group(self, rows: list[dict], aggregates: list) -> list[dict]:
        c, q = self.compiler, self.query
        keys = [k for e, _, _ in c.select if not e.contains_aggregate for k in _group_keys(e)]
        if isinstance(q.group_by, tuple):
            keys.extend(e for e in q.group_by if not e.contains_aggregate)
        if not self.compiler._meta_ordering:  # Meta.ordering never splits groups
            # What ORDER BY adds to GROUP BY is its columns (Django's get_group_by_cols):
            # order_by("?") adds none, so it never splits groups.
            for o in self.order_by:
                if not o.contains_aggregate:
                    keys.extend(o.get_group_by_cols())
        if q.group_by is None and not keys:
            groups = {(): rows}
        else:
            groups = defaultdict(list)
            for row in rows:
                key = tuple(_hashable(scalar(self.ev.value(k, row))) for k in keys)
                groups[key].append(row)
        out = []
        for members in groups.values():
            # No rows at all: SQL still answers one row, every column of it NULL.
            first = dict(members[0]) if members else dict.fromkeys(self.query.alias_map)
            first[AGGREGATES] = {id(a): self._aggregate(a, members) for a in aggregates}
            out.append(first)
        return out

    def _aggregate(self, agg: Any, rows: list[dict]) -> Any:
        """One aggregate over a group: its non-NULL values (after ``filter=`` and
        ``distinct=``) handed to the implementation registered for its class."""
        compute = AGGREGATE_FUNCTIONS.find(type(agg))
        if own_sql(agg):  # Sum("x", function="MAX"): not a Sum any more
            raise unsupported(type(agg))
        if agg.filter is not None:
            rows = [r for r in rows if self.ev.truth(agg.filter, r) is True]
        if getattr(agg, "order_by", None) is not None:  # StringAgg(..., order_by=...)
            orders = [
                o if isinstance(o, OrderBy) else OrderBy(o)
                for o in agg.order_by.get_source_expressions()
            ]
            rows = self._sorted(rows, orders)
        source = agg.source_expressions[0]
        if isinstance(source, Star):
            values = [1] * len(rows)
        else:
            values = [scalar(self.ev.value(source, r)) for r in rows]
            values = [v for v in values if v is not None]
        if agg.distinct:
            seen = {}
            for v in values:
                seen.setdefault(_hashable(v), v)
            values = list(seen.values())
        return compute(agg, values, self.ev)

    def _annotations(self, row: dict) -> dict:
        out = {}
        for name, expr in self.query.annotation_select.items():
            out[name] = self.ev.value(expr, row)
        return out

    def _sorted(self, rows: list[dict], order_by: list | None = None) -> list[dict]:
        for order in reversed(self.order_by if order_by is None else order_by):
            expr = order.expression
            values = [sortable(self.ev.value(expr, r)) for r in rows]
            nulls_first = (
                True if order.nulls_first else False if order.nulls_last else not order.descending
            )
            desc = order.descending

            def key(i, values=values, nulls_first=nulls_first, desc=desc):
                v = values[i]
                if v is None:
                    return (0 if nulls_first != desc else 1, _Order(0))
                return (1 if nulls_first != desc else 0, _Order(v))

            index = sorted(range(len(rows)), key=key, reverse=desc)
            rows = [rows[i] for i in index]
        return rows

    def _project(self, row: dict) -> list[Any]:
        return [exported(self.ev.value(expr, row)) for expr, _, _ in self.compiler.select]

    # -- AggregateQuery --------------------------------------------------------------------

    def _outer_aggregate(self) -> list[list[Any]]:
        inner_compiler = self.inner.get_compiler(connection=self.connection)
        inner = SelectQuery(inner_compiler, view=self._view)
        values = inner.rows()
        aliases = [alias for _, _, alias in inner_compiler.select]
        rows = [{ANNOTATIONS: dict(zip(aliases, v))} for v in values]
        annotations = list(self.query.annotation_select.values())
        found: list = []
        for expr in annotations:
            _collect_aggregates(expr, found)
        group = {AGGREGATES: {id(a): self._aggregate(a, rows) for a in found}}
        return [[self.ev.value(expr, group) for expr in annotations]]

    # -- subqueries ------------------------------------------------------------------------

    def _subquery(self, query: Any) -> list:
        inner = getattr(query, "query", query)
        compiler = inner.get_compiler(connection=self.connection)
        # A subquery selecting nothing (EXISTS) still has its rows.
        return [row[0] if row else None for row in SelectQuery(compiler, view=self._view).rows()]

    def _decorrelate(self, query: Any) -> tuple[list, set]:
        """Run a correlated ``EXISTS`` subquery once, without its ``inner = outer``
        equalities: return the outer columns (each with what to apply to its values)
        and the set of inner value tuples."""
        inner = query.clone()
        inner.clear_limits()
        inner.clear_ordering(force=True)
        pairs, kept = [], []
        where = inner.where
        children = where.children if where.connector == "AND" and not where.negated else None
        for child in children if children is not None else [where]:
            pair = _correlation(child, inner.alias_map)
            if pair is not None and children is not None:
                pairs.append(pair)
            else:
                kept.append(child)
        if children is not None:
            where.children = kept
        if outer_references(inner):
            raise NotSupportedError(
                "this correlated subquery (OuterRef) is not supported by the encrypted "
                "database: only OuterRef equalities (field=OuterRef('pk')) can be used; "
                "filter across the relation instead"
            )
        inner.default_cols = False
        inner.select = tuple(i for i, _ in pairs) or (
            inner.get_meta().pk.get_col(inner.get_initial_alias()),
        )
        inner.set_annotation_mask(())
        inner.values_select = ()
        compiler = inner.get_compiler(connection=self.connection)
        rows = SelectQuery(compiler, view=self._view).rows()
        if not pairs:
            return [], {()} if rows else set()
        # A text column equal to a number column: compared as SQLite compares them.
        converters = [coercions(o.target, i.target) for i, o in pairs]
        keys = {
            tuple(hashable((c or _same)(v)) for (_, c), v in zip(converters, r, strict=False))
            for r in rows
        }
        return [(o, c or _same) for (_, o), (c, _) in zip(pairs, converters, strict=True)], keys

    # -- description -----------------------------------------------------------------------

    def describe(self, verb: str = "SELECT") -> str:
        """The plan in one line: ``SELECT FROM t WHERE <engine expression> ...``."""
        if self.tableless:
            return f"{verb} VALUES"
        try:
            self._plan()
        except NotSupportedError:
            return f"{verb} FROM {self.table} (not supported)"
        except Exception:  # raised again, translated, when the query runs
            return f"{verb} FROM {self.table} (no plan)"
        parts = [f"{verb} FROM {self.table}"]
        base = combine(self.restrict[self.base_alias])
        if base is not None:
            parts.append(f"WHERE {base!r}")
        for join in self.joins:
            parts.append(f"{join.join_type} {join.table_name} AS {join.table_alias}")
        if self.residual:
            parts.append(f"FILTER {len(self.residual)} condition(s) in Python")
        if self.order_by:
            parts.append(
                "ORDER BY "
                + ", ".join(
                    f"{'-' if o.descending else ''}{getattr(o.expression, 'target', o.expression)}"
                    for o in self.order_by
                )
            )
        if self.query.low_mark or self.query.high_mark is not None:
            parts.append(f"OFFSET {self.query.low_mark} LIMIT {self.query.high_mark}")
        return " ".join(parts)

    def explain_lines(self):
        """The plan, chosen indexes, estimated rows, and the round trips and rows of
        actually running the query (round trips are the unit of cost here)."""
        self._plan()
        result = QueryResult(_Rows(self.view, self.table), combine(self.restrict[self.base_alias]))
        info = result.explain()
        before = self.connection.round_trips()
        rows = self.rows()
        yield f"query: {self.describe()}"
        yield f"plan: {info['plan']}"
        yield f"indexes: {', '.join(info['indexes']) or 'none'}"
        yield f"estimated rows: {info['estimated_rows']}"
        yield f"rows: {len(rows)}"
        yield f"round trips: {self.connection.round_trips() - before}"


@functools.cache
def _pk_columns() -> dict[str, str]:
    """Primary-key column of every installed model's table."""
    from django.apps import apps

    return {m._meta.db_table: m._meta.pk.column for m in apps.get_models(include_auto_created=True)}


def _out_of_range(term: Any, compiler: Any, connection: Any) -> bool:
    """An integer comparison that Django itself knows can match nothing (a value
    outside the field's range): Django's own lookup says so by raising EmptyResultSet."""
    if not isinstance(term, IntegerFieldOverflow):
        return False
    try:
        term.process_rhs(compiler, connection)
    except EmptyResultSet:
        return True
    except Exception:  # FullResultSet and the rest: not provably empty
        return False
    return False


def refuse_composite_pk(model: Any) -> None:
    """Joins, lookups and subqueries here match one key column, so a model whose
    primary key is a ``CompositePrimaryKey`` is refused whenever it is read or written
    (its table may exist: a migration declaring it still runs)."""
    from django.db.models import CompositePrimaryKey

    if model is not None and isinstance(model._meta.pk, CompositePrimaryKey):
        raise NotSupportedError(
            f"{model._meta.label}: composite primary keys (CompositePrimaryKey) are not "
            "supported by the encrypted database; use a single-column primary key and a "
            "UniqueConstraint over the columns"
        )


def _refuse_unsupported(query: Any) -> None:
    """Refuse what Django's SQL compiler would have turned into SQL the store lacks, rather
    than answer something else."""
    if query.select_for_update and (
        query.select_for_update_nowait
        or query.select_for_update_skip_locked
        or query.select_for_update_of
        or query.select_for_no_key_update
    ):
        raise NotSupportedError(
            "select_for_update(nowait/skip_locked/of/no_key) is not supported by the encrypted "
            "database: use select_for_update(); a concurrent change of the rows makes the "
            "commit fail with OperationalError, to be retried"
        )


_QUALIFIED_COLUMN = re.compile(r'"(\w+)"\."(\w+)"')


def _extra_columns(query: Any) -> dict[str, tuple[str, str]] | None:
    """The ``extra(select=...)`` entries as ``sql -> (alias, column)``, when each is a
    plain ``"table"."column"`` reference (Django's own use: prefetching a many-to-many
    relation selects the through table's column this way); None for anything else."""
    columns = {}
    for sql, params in query.extra.values():
        match = _QUALIFIED_COLUMN.fullmatch(str(sql).strip())
        if match is None or params or match.group(1) not in query.alias_map:
            return None
        columns[sql] = (match.group(1), match.group(2))
    return columns


def _base_alias(query: Any) -> str:
    """The table the query reads from: its first base table still in use (Django may
    trim the start of a join chain, as ``exclude()`` across a relation does)."""
    for alias, table in query.alias_map.items():
        if not isinstance(table, Join) and query.alias_refcount.get(alias):
            return alias
    # get_initial_alias() references the first table (a side effect), so only now.
    return query.get_initial_alias()


def _correlation(node: Any, inner_aliases: dict) -> tuple[Any, Any] | None:
    """``(inner column, outer column)`` of an ``inner = outer`` condition, else None."""
    if getattr(node, "lookup_name", None) != "exact" or isinstance(node, type):
        return None
    lhs, rhs = node.lhs, node.rhs
    if not isinstance(lhs, Col) or not isinstance(rhs, Col):
        return None
    if lhs.alias in inner_aliases and rhs.alias not in inner_aliases:
        return lhs, rhs
    if rhs.alias in inner_aliases and lhs.alias not in inner_aliases:
        return rhs, lhs
    return None


def _top(expr: Expr | None) -> list[Expr]:
    if expr is None:
        return []
    return list(expr.exprs) if isinstance(expr, And) else [expr]


def _pk_candidates(expr: Expr | None, pk_column: str | None) -> list | None:
    """The primary keys a top-level ``pk = v`` / ``pk IN (...)`` allows, if any."""
    if pk_column is None:
        return None
    for e in _top(expr):
        if type(e) is Eq and e.field == pk_column:
            return [e.value]
        if type(e) is Any_ and e.field == pk_column:
            return list(e.values)
    return None


def _same(value: Any) -> Any:
    return value


def _sorted(values) -> list:
    return sorted(values, key=_Order)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return encode_key(value) if not isinstance(value, dict | list) else repr(value)


def _distinct(rows: list[list[Any]], extra: list[list[Any]] | None = None) -> list[list[Any]]:
    """The first of each set of equal rows (equal also in ``extra``, when given)."""
    seen = set()
    out = []
    for i, row in enumerate(rows):
        key = tuple(_hashable(v) for v in (row if extra is None else [*row, *extra[i]]))
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def _collect_aggregates(expr: Any, out: list) -> None:
    if expr is None:
        return
    if isinstance(expr, Window):
        # Its function is computed over its frame (windows.py), not over the group; what
        # the function reads, and the partitioning and ordering, may be group aggregates.
        function = expr.source_expression
        for child in [*function.get_source_expressions(), expr.partition_by, expr.order_by]:
            _collect_aggregates(child, out)
        return
    if getattr(expr, "contains_aggregate", False) and _is_aggregate(expr):
        out.append(expr)
        return
    if hasattr(expr, "get_source_expressions"):
        for child in expr.get_source_expressions():
            _collect_aggregates(child, out)
    if hasattr(expr, "children"):
        for child in expr.children:
            _collect_aggregates(child, out)
    if hasattr(expr, "lhs") and hasattr(expr, "rhs"):
        _collect_aggregates(expr.lhs, out)
        if hasattr(expr.rhs, "resolve_expression"):
            _collect_aggregates(expr.rhs, out)


def _group_keys(expr: Any) -> list:
    """What a selected expression adds to GROUP BY: itself, but for a window what it
    partitions and orders by (Django's ``Window.get_group_by_cols``)."""
    if not getattr(expr, "contains_over_clause", False):
        return [expr]
    if isinstance(expr, Window):
        return expr.get_group_by_cols()
    return [k for child in expr.get_source_expressions() if child for k in _group_keys(child)]


def _is_aggregate(expr: Any) -> bool:
    return isinstance(expr, Aggregate)


def _aggregates(compiler: Any, having: Any, order_by: list) -> list:
    found: list = []
    for expr, _, _ in compiler.select or []:
        _collect_aggregates(expr, found)
    _collect_aggregates(having, found)
    for order in order_by:
        _collect_aggregates(order, found)
    unique = {}
    for a in found:
        unique.setdefault(id(a), a)
    return list(unique.values())


def _is_plain_count(compiler: Any, query: Any) -> bool:
    """``SELECT COUNT(*)`` with no grouping: answerable from index counts."""
    if query.group_by is not None or not compiler.select:
        return False
    for expr, _, _ in compiler.select:
        if type(expr) is not Count or expr.distinct or expr.filter is not None:
            return False
        if not isinstance(expr.source_expressions[0], Star):
            return False
    return True
