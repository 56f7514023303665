"""The write operations the compiler hands to a transaction.

A write operation (``zerodb_core``'s ``WriteOp``) is applied to the snapshot of the
transaction it goes into, and applied again on a rebase after a concurrent commit: an
UPDATE is therefore an operation that finds its rows and evaluates its expressions when
applied, not a list of rows computed beforehand. They live apart from ``compiler.py``
because they build on ``query.SelectQuery`` while the compilers only hand them over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_zerodb import generated
from django_zerodb.casts import assigned
from django_zerodb.constraints import check_record_writes
from django_zerodb.derived import add_derived
from django_zerodb.query import SelectQuery
from zerodb_core.api import WriteOp


@dataclass(frozen=True, slots=True)
class UpdateWhere(WriteOp):
    """Set values on every row a query matches, evaluated on the snapshot it is applied
    to: on a rebase the rows and the F() expressions are evaluated again."""

    compiler: Any
    values: tuple

    def apply(self, txn: Any) -> int:
        select = SelectQuery(self.compiler, view=txn)
        matched = select.base_records()
        if not matched:
            return 0
        changed = []
        for pk, record in matched:
            new = dict(record)
            row = {select.base_alias: record}
            for field, value in self.values:
                if is_expression(value):
                    value = assigned(field, select.ev.value(value, row))
                new[field.column] = value
            changed.append((pk, new))
        generated.fill(select.ev, select.query.model, [r for _, r in changed])
        fields = [f for f, _ in self.values]
        records = [r for _, r in changed]
        check_record_writes(select.query.model, select.ev, fields, records)
        add_derived(select.query.model, select.ev, records)
        txn.writable_table(select.table).put_many(changed)
        return len(changed)


def is_expression(value: Any) -> bool:
    """Whether ``value`` is a Django expression (evaluated per row) rather than a value."""
    return hasattr(value, "resolve_expression")
