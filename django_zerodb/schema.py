"""Migrations on the encrypted store: catalog changes and record rewrites, no DDL.

Records are schemaless maps, so most field changes touch only the catalog (indexes).
Adding a field with a default, renaming a column or removing a field rewrites every
record of the model, in one transaction, with a progress bar on the terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from django_zerodb import generated
from django_zerodb.derived import deriver
from django_zerodb.exceptions import NotSupportedError, translated
from django_zerodb.indexes import (
    Derived,
    field_indexes,
    index_parts,
    is_derived,
    meta_index,
    model_derived,
    model_spec,
    unique_constraint,
)
from zerodb_core.api import DropIndex, DropModel, EnsureModel, ModelSpec, WriteOp

# Records rewritten per batch (each batch is one put into the trees).
REWRITE_BATCH = 2000


@dataclass(frozen=True, slots=True)
class RewriteRecords(WriteOp):
    """Apply ``change(fields) -> fields`` to every record of a model (replayable: a
    rebased migration rewrites the records of the newer snapshot)."""

    model: str
    change: Callable[[dict], dict]
    label: str = "rewriting records"

    def apply(self, txn: Any) -> int:
        table = txn.table(self.model)
        if table is None:
            return 0
        rows = txn.run([table.scan_reader()])[0]
        progress = _progress(len(rows), f"{self.model}: {self.label}")
        for start in range(0, len(rows), REWRITE_BATCH):
            batch = [(pk, self.change(dict(f))) for pk, f in rows[start : start + REWRITE_BATCH]]
            table.put_many(batch)
            progress.update(len(batch))
        progress.close()
        return len(rows)


@dataclass(frozen=True, slots=True)
class CopyModel(WriteOp):
    """Copy every record of one model to another (``RenameModel``)."""

    source: str
    target: str

    def apply(self, txn: Any) -> int:
        table = txn.table(self.source)
        if table is None:
            return 0
        rows = txn.run([table.scan_reader()])[0]
        if rows:
            txn.writable_table(self.target).put_many(rows)
        return len(rows)


def _progress(total: int, label: str):
    """A tqdm bar on an interactive terminal for long rewrites; silent otherwise."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=label,
        unit="rec",
        disable=total < REWRITE_BATCH or not sys.stderr.isatty(),
    )


class BuildProgress:
    """``progress(done, total)`` of an index build (``EnsureModel``) as a tqdm bar, made
    when the build first reports (only then is the number of records known)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = _progress(total, self.label)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.bar.close()
            self.bar = None  # a replayed build starts a new bar


def _derives(model, item) -> bool:
    """Whether an index or constraint keys on derived columns."""
    return any(isinstance(p, Derived) for p in index_parts(model, item))


def empty_tables(connection, tables: list[str]) -> None:
    """Remove every record of ``tables`` (``flush``), keeping their indexes defined."""
    session = connection.session
    with translated(), session.writing() as txn:
        for name in tables:
            spec = txn.catalog.get(name)
            if spec is not None:
                txn.apply(DropModel(name))
                txn.apply(EnsureModel(spec))


class DatabaseSchemaEditor(BaseDatabaseSchemaEditor):
    """Catalog operations for ``migrate``; SQL-only operations refuse clearly."""

    sql_create_table = ""

    def execute(self, sql, params=()):
        if sql is None or str(sql) == "":
            return
        raise NotSupportedError(
            "SQL cannot run on the encrypted database (RunSQL, raw DDL): write a "
            "RunPython migration that uses the ORM instead"
        )

    def quote_value(self, value):
        return repr(value)

    def _apply(self, *ops: WriteOp) -> None:
        session = self.connection.session
        with self.connection.wrap_database_errors, translated(), session.writing() as txn:
            for op in ops:
                txn.apply(op)

    def _ensure(self, model) -> None:
        self._apply(EnsureModel(model_spec(model)))

    # -- models ----------------------------------------------------------------------------

    def create_model(self, model) -> None:
        self._ensure(model)
        for field in model._meta.local_many_to_many:
            through = field.remote_field.through
            if through._meta.auto_created:
                self.create_model(through)

    def delete_model(self, model) -> None:
        self._apply(DropModel(model._meta.db_table))
        for field in model._meta.local_many_to_many:
            through = field.remote_field.through
            if through._meta.auto_created:
                self.delete_model(through)

    def alter_db_table(self, model, old_db_table, new_db_table) -> None:
        if old_db_table == new_db_table:
            return
        spec = model_spec(model)
        renamed = ModelSpec(new_db_table, spec.indexes)
        self._apply(
            EnsureModel(renamed), CopyModel(old_db_table, new_db_table), DropModel(old_db_table)
        )

    def alter_db_table_comment(self, model, old_db_table_comment, new_db_table_comment):
        pass

    def alter_db_tablespace(self, model, old_db_tablespace, new_db_tablespace):
        pass

    # -- fields ----------------------------------------------------------------------------

    def add_field(self, model, field) -> None:
        if field.many_to_many:
            if field.remote_field.through._meta.auto_created:
                self.create_model(field.remote_field.through)
            return
        if not field.concrete:
            return
        default = self.effective_default(field)
        column = field.column
        if field.generated:  # computed for the rows already stored
            ops: list[WriteOp] = [
                RewriteRecords(
                    model._meta.db_table,
                    generated.rewriter(self.connection, field),
                    f"computing {column}",
                )
            ]
        elif default is not None:
            ops: list[WriteOp] = [
                RewriteRecords(
                    model._meta.db_table,
                    lambda f: {**f, column: default} if f.get(column) is None else f,
                    f"adding {column}",
                )
            ]
        else:
            ops = []
        # AddField passes the model before the change; the field's model has it.
        after = getattr(field, "model", None) or model
        if default is not None:
            ops.extend(self._derive(after))
        self._apply(*ops, EnsureModel(model_spec(after)))

    def remove_field(self, model, field) -> None:
        if field.many_to_many:
            if field.remote_field.through._meta.auto_created:
                self.delete_model(field.remote_field.through)
            return
        if not field.concrete:
            return
        table = model._meta.db_table
        column = field.column
        ops: list[WriteOp] = [DropIndex(table, s.name) for s in self._indexes_on(table, column)]
        ops.append(
            RewriteRecords(
                table, lambda f: {k: v for k, v in f.items() if k != column}, f"removing {column}"
            )
        )
        self._apply(*ops)

    def alter_field(self, model, old_field, new_field, strict=False) -> None:
        if old_field.many_to_many or new_field.many_to_many:
            return
        table = model._meta.db_table
        ops: list[WriteOp] = []
        old_indexes = {s.name for s in field_indexes(old_field)} if old_field.concrete else set()
        new_indexes = {s.name for s in field_indexes(new_field)} if new_field.concrete else set()
        for name in old_indexes - new_indexes:
            ops.append(DropIndex(table, name))
        old_column, new_column = old_field.column, new_field.column
        if old_field.concrete and new_field.concrete and old_column != new_column:
            for spec in self._indexes_on(table, old_column):
                ops.append(DropIndex(table, spec.name))
            ops.append(
                RewriteRecords(
                    table,
                    lambda f: {(new_column if k == old_column else k): v for k, v in f.items()},
                    f"renaming {old_column} to {new_column}",
                )
            )
        if new_field.concrete and not new_field.null and old_field.null:
            default = self.effective_default(new_field)
            if default is not None:
                ops.append(
                    RewriteRecords(
                        table,
                        lambda f: {**f, new_column: default} if f.get(new_column) is None else f,
                        f"filling {new_column}",
                    )
                )
        if new_field.concrete and new_field.generated:  # its expression may have changed
            ops.append(
                RewriteRecords(
                    table, generated.rewriter(self.connection, new_field), f"computing {new_column}"
                )
            )
        # AlterField and RenameField pass the model before the change; the new field's
        # model is the one after it.
        after = getattr(new_field, "model", None) or model
        for spec in self._derived_indexes(table):
            ops.append(DropIndex(table, spec.name))  # computed from the field as it was
        ops.extend(self._derive(after))
        ops.append(EnsureModel(model_spec(after)))
        self._apply(*ops)

    def _indexes_on(self, table: str, column: str) -> list:
        spec = self.connection.session.view().catalog.get(table)
        if spec is None:
            return []
        return [i for i in spec.indexes.values() if column in i.fields]

    # -- indexes and constraints -----------------------------------------------------------

    def _derived_indexes(self, table: str) -> list:
        """The catalog's indexes on derived columns of ``table``."""
        spec = self.connection.session.view().catalog.get(table)
        if spec is None:
            return []
        return [i for i in spec.indexes.values() if any(map(is_derived, i.fields))]

    def _derive(self, model, without=None) -> list[WriteOp]:
        """Rewrite every record's derived columns (functional and partial indexes) as
        ``model`` declares them, less those only ``without`` (an index or constraint
        being removed) needs; nothing when the model has none and the records none."""
        wanted = model_derived(model)
        if without is not None:
            others = {
                p.column
                for item in (*model._meta.indexes, *model._meta.constraints)
                if item.name != without.name
                for p in index_parts(model, item)
                if isinstance(p, Derived)
            }
            wanted = tuple(p for p in wanted if p.column in others)
        if not wanted and not self._derived_indexes(model._meta.db_table) and without is None:
            return []
        keep = frozenset(p.column for p in wanted)
        change = deriver(self.connection, model, keep)
        return [RewriteRecords(model._meta.db_table, change, "computing index expressions")]

    def _build(self, model, specs: list, label: str) -> EnsureModel:
        """Add ``specs`` to the model's catalog entry, built with a progress bar."""
        table = model._meta.db_table
        return EnsureModel(
            ModelSpec(table, {s.name: s for s in specs}),
            BuildProgress(f"{table}: building {label}"),
        )

    def add_index(self, model, index) -> None:
        ops = self._derive(model) if _derives(model, index) else []
        self._apply(*ops, self._build(model, meta_index(model, index), index.name))

    def remove_index(self, model, index) -> None:
        table = model._meta.db_table
        ops = self._derive(model, without=index) if _derives(model, index) else []
        drops = [DropIndex(table, spec.name) for spec in meta_index(model, index)]
        self._apply(*drops, *ops)

    def rename_index(self, model, old_index, new_index) -> None:
        pass  # index names in the catalog come from the columns, not from Django's names

    def add_constraint(self, model, constraint) -> None:
        spec = unique_constraint(model, constraint)
        if spec is not None:
            ops = self._derive(model) if _derives(model, constraint) else []
            self._apply(*ops, self._build(model, [spec], constraint.name))

    def remove_constraint(self, model, constraint) -> None:
        spec = unique_constraint(model, constraint)
        if spec is not None:
            ops = self._derive(model, without=constraint) if _derives(model, constraint) else []
            self._apply(DropIndex(model._meta.db_table, spec.name), *ops)

    def alter_unique_together(self, model, old_unique_together, new_unique_together) -> None:
        self._realign(model)

    def alter_index_together(self, model, old_index_together, new_index_together) -> None:
        self._realign(model)

    def _realign(self, model) -> None:
        """Drop catalog indexes the model no longer declares, add the ones it lacks."""
        table = model._meta.db_table
        wanted = model_spec(model)
        current = self.connection.session.view().catalog.get(table)
        stale = [n for n in (current.indexes if current else {}) if n not in wanted.indexes]
        self._apply(*(DropIndex(table, n) for n in stale), EnsureModel(wanted))
