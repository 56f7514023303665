"""The five compilers: Django's query objects in, engine operations out (never SQL).

``SQLCompiler`` runs a SELECT through :class:`~django_zerodb.query.SelectQuery`; inserts
allocate primary keys from the store's id blocks and write whole records; updates and
deletes are *replayable* write operations, so a commit that meets a concurrent one
re-evaluates them on the newer snapshot (``update(n=F("n") + 1)`` never loses an
increment).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.exceptions import FieldError
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import compiler
from django.db.models.sql.constants import CURSOR, MULTI, NO_RESULTS, ROW_COUNT, SINGLE
from django.db.transaction import TransactionManagementError

from django_zerodb import generated
from django_zerodb.casts import assigned
from django_zerodb.constraints import check_not_null, check_record_writes
from django_zerodb.derived import add_derived
from django_zerodb.evaluate import Evaluator, check_supported
from django_zerodb.exceptions import IntegrityError, NotSupportedError, translated
from django_zerodb.query import SelectQuery, refuse_composite_pk
from django_zerodb.writes import UpdateWhere, is_expression
from zerodb_core.api import DeleteRecord, PutRecords


class _Logged:
    """Run a statement with error translation, one ``connection.queries`` entry each."""

    def __init__(self, compiler_: Any, description: str) -> None:
        self.connection = compiler_.connection
        self.description = description

    def __enter__(self) -> None:
        self.started = time.monotonic()
        self.round_trips = self.connection.round_trips()
        self.errors = self.connection.wrap_database_errors
        self.errors.__enter__()
        self.translate = translated()
        self.translate.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        try:
            if self.translate.__exit__(*exc):
                return True
        except BaseException as translated_exc:
            if not self.errors.__exit__(type(translated_exc), translated_exc, None):
                raise
            return False
        finally:
            self.connection.log_query(
                self.description, self.started, self.connection.round_trips() - self.round_trips
            )
        return bool(self.errors.__exit__(*exc))


@contextmanager
def _references_kept(query: Any) -> Iterator[None]:
    """Put the query's alias reference counts back after planning it.

    Planning resolves the ordering and the selected columns, which joins their tables
    into the query (``setup_joins`` counts a reference to each); Django's SQL compiler
    resets the counts at the end of ``as_sql()`` so that a query that ran can still be
    combined or reused as if it had not. Without it, ``q1 & q2`` after running ``q2``
    would carry ``q2``'s ordering joins as if they were conditions.
    """
    before = query.alias_refcount.copy()
    try:
        yield
    finally:
        query.reset_refcounts(before)


class SQLCompiler(compiler.SQLCompiler):
    def select_query(self) -> SelectQuery:
        return SelectQuery(self)

    def execute_sql(self, result_type=MULTI, chunked_fetch=False, chunk_size=100):
        with _references_kept(self.query):
            return self._execute_sql(result_type)

    def _execute_sql(self, result_type):
        result_type = result_type or NO_RESULTS
        if result_type == CURSOR:
            raise NotSupportedError("the encrypted database has no cursors; iterate the QuerySet")
        if self.query.select_for_update and self.connection.get_autocommit():
            raise TransactionManagementError(  # as Django's SQL compiler says it
                "select_for_update cannot be used outside of a transaction."
            )
        select = self.select_query()
        if select.trivially_empty() and self.elide_empty:
            # Django asks to run it anyway (elide_empty=False) when an aggregate over
            # no rows has a value only the query knows: aggregate(n=Count("id") + 1).
            rows = []
        else:
            with _Logged(self, select.describe()):
                rows = select.rows()
        if result_type == MULTI:
            return [rows] if rows else []
        if result_type == SINGLE:
            return rows[0][: self.col_count] if rows else None
        if result_type == ROW_COUNT:
            return len(rows)
        return None

    def has_results(self) -> bool:
        with _references_kept(self.query):
            select = self.select_query()
            if select.trivially_empty():
                return False
            with _Logged(self, f"EXISTS {select.describe()}"):
                return select.exists()

    def as_sql(self, with_limits=True, with_col_aliases=False):
        """The plan, for ``str(queryset.query)`` (there is no SQL)."""
        with _references_kept(self.query):
            return self.select_query().describe().replace("%", "%%"), ()

    def explain_query(self):
        info = self.query.explain_info
        if info is not None:  # Django's checks of the format and options
            self.connection.ops.explain_query_prefix(info.format, **info.options)
        with _references_kept(self.query):
            select = self.select_query()
            with _Logged(self, f"EXPLAIN {select.describe()}"):
                lines = list(select.explain_lines())
        yield from lines


class SQLInsertCompiler(compiler.SQLInsertCompiler, SQLCompiler):
    def execute_sql(self, returning_fields=None):
        refuse_composite_pk(self.query.model)
        opts = self.query.get_meta()
        table = opts.db_table
        pk = opts.pk
        fields = self.query.fields
        ev = Evaluator(self.connection, _no_subquery, _no_subquery)
        rows = [
            {f.column: self._stored_value(ev, f, obj) for f in fields} for obj in self.query.objs
        ]
        with _Logged(self, f"INSERT {len(rows)} INTO {table}"):
            for record in rows:
                check_not_null(table, fields, record)
            session = self.connection.session
            fresh: list = []
            if pk.column not in (fields and [f.column for f in fields]):
                fresh = session.engine.allocate_ids(table, len(rows))
                for record, new_pk in zip(rows, fresh):
                    record[pk.column] = new_pk
            for record in rows:
                for f in opts.local_concrete_fields:
                    record.setdefault(f.column, None)
                if record[pk.column] is None:
                    raise IntegrityError(
                        f"NOT NULL constraint failed: {table}.{pk.column} (only integer auto "
                        "fields are allocated by the store; give other primary keys a value)"
                    )
            generated.fill(ev, self.query.model, rows)
            check_record_writes(self.query.model, ev, fields, rows)
            add_derived(self.query.model, ev, rows)
            with session.writing() as txn:
                txn.apply(
                    PutRecords(
                        table,
                        [(r[pk.column], r) for r in rows],
                        frozenset(fresh),
                        insert=True,
                    )
                )
        if not returning_fields:
            return []
        returning_fields = [f for f in returning_fields if f.column in rows[0]] if rows else []
        cols = [f.get_col(table) for f in returning_fields]
        returned = [tuple(r.get(f.column) for f in returning_fields) for r in rows]
        converters = self.get_converters(cols)
        if converters:
            returned = [tuple(r) for r in self.apply_converters(returned, converters)]
        return returned

    def _stored_value(self, ev: Evaluator, field: Any, obj: Any) -> Any:
        """The value an INSERT stores: ``db_default`` and expressions (``Now()``...)
        evaluated here, since there is no SQL DEFAULT to fall back on."""
        value = self.pre_save_val(field, obj)
        if isinstance(value, DatabaseDefault):
            value = field.db_default
        value = self.prepare_value(field, value)
        if is_expression(value):
            value = assigned(field, ev.value(value, {}))
            if value is not None and not is_expression(value):
                value = field.get_db_prep_save(value, connection=self.connection)
        return value


def _no_subquery(query: Any) -> Any:
    raise NotSupportedError("subqueries are not supported as values of an INSERT")


class SQLDeleteCompiler(compiler.SQLDeleteCompiler, SQLCompiler):
    def execute_sql(self, result_type=MULTI, chunked_fetch=False, chunk_size=100):
        select = SelectQuery(self)
        if select.trivially_empty():
            return 0 if result_type == ROW_COUNT else None
        with _Logged(self, select.describe("DELETE")):
            session = self.connection.session
            with session.writing() as txn:
                view_select = SelectQuery(self, view=txn)
                pks = [pk for pk, _ in view_select.base_records()]
                for pk in pks:
                    txn.apply(DeleteRecord(view_select.table, pk))
        return len(pks) if result_type == ROW_COUNT else None


class SQLUpdateCompiler(compiler.SQLUpdateCompiler, SQLCompiler):
    def execute_sql(self, result_type):
        self.pre_sql_setup()
        values = []
        for field, _model, val in self.query.values:
            if hasattr(val, "resolve_expression"):
                val = val.resolve_expression(self.query, allow_joins=False, for_save=True)
                if val.contains_aggregate:
                    raise FieldError(  # as Django says it on every backend
                        f"Aggregate functions are not allowed in this query ({field.name}={val!r})."
                    )
                if val.contains_over_clause:
                    raise FieldError(
                        f"Window expressions are not allowed in this query ({field.name}={val!r})."
                    )
            elif hasattr(val, "prepare_database_save"):
                if field.remote_field:
                    val = val.prepare_database_save(field)
                else:
                    raise TypeError(
                        f"Tried to update field {field} with a model instance, {val!r}. "
                        f"Use a value compatible with {field.__class__.__name__}."
                    )
            # As Django's UPDATE: the field prepares every value (an expression comes back
            # as it is, but a JSONField turns Value(None, JSONField()) into JSON null).
            val = field.get_db_prep_save(val, connection=self.connection)
            if is_expression(val):
                check_supported(val)  # refused even when no row matches
            values.append((field, val))
        count = 0
        if values and not SelectQuery(self).trivially_empty():
            select = SelectQuery(self)
            with (
                _Logged(self, select.describe("UPDATE")),
                self.connection.session.writing() as txn,
            ):
                count = txn.apply(UpdateWhere(self, tuple(values)))
        for query in self.query.get_related_updates():
            aux = query.get_compiler(self.using).execute_sql(result_type)
            if not count and aux:
                count = aux
        return count

    def execute_returning_sql(self, returning_fields):
        return [()] * self.execute_sql(ROW_COUNT)


class SQLAggregateCompiler(compiler.SQLAggregateCompiler, SQLCompiler):
    def select_query(self) -> SelectQuery:
        self.col_count = len(self.query.annotation_select)
        return SelectQuery(self, inner=self.query.inner_query)
