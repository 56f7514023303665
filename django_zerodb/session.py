"""The "raw connection" of the backend: one per Django connection (so per thread).

It holds the transaction of the connection over the shared engine. In autocommit mode
every write statement is a transaction of its own and every read a fresh snapshot; after
``set_autocommit(False)`` (``atomic()``), the first statement starts a transaction that
reads its own writes and pins one snapshot until ``commit()`` or ``rollback()``.
Transactions run at the connection's isolation level (``OPTIONS["ISOLATION_LEVEL"]``,
default ``"read committed"`` as on PostgreSQL; see :mod:`zerodb_core.isolation`): at
``"repeatable read"`` and ``"serializable"`` a commit that would overwrite a concurrent
change raises ``SerializationError`` (a ``django.db.OperationalError``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django_zerodb.exceptions import OperationalError
from zerodb_core.api import (
    DB,
    READ_COMMITTED,
    ExpectRecords,
    Savepoint,
    Transaction,
    View,
    WriteOp,
)


class StoreSession:
    """Transaction state of one connection to an encrypted database."""

    def __init__(self, engine: DB, isolation: str = READ_COMMITTED) -> None:
        self.engine = engine
        self.isolation = isolation
        self.autocommit = True
        self.txn: Transaction | None = None
        self.savepoints: dict[str, Savepoint] = {}
        self.closed = False

    # -- DB-API-like surface used by Django's BaseDatabaseWrapper --------------------------

    def set_autocommit(self, autocommit: bool) -> None:
        self.autocommit = autocommit

    def commit(self) -> None:
        txn, self.txn = self.txn, None
        self.savepoints.clear()
        if txn is not None and txn.ops:
            self.engine.commit(txn)

    def rollback(self) -> None:
        self.txn = None
        self.savepoints.clear()

    def close(self) -> None:
        self.rollback()
        self.closed = True

    # -- savepoints ------------------------------------------------------------------------

    def savepoint(self, sid: str) -> None:
        self.savepoints[sid] = self.transaction().savepoint()

    def rollback_to_savepoint(self, sid: str) -> None:
        """Undo everything since ``sid`` (later savepoints go, ``sid`` stays), as SQL."""
        self._forget_after(sid)
        self.txn.rollback_to(self.savepoints[sid])

    def release_savepoint(self, sid: str) -> None:
        """Forget ``sid`` and every savepoint made after it; keep the changes."""
        self._forget_after(sid)
        del self.savepoints[sid]

    def _forget_after(self, sid: str) -> None:
        if self.txn is None or sid not in self.savepoints:
            raise OperationalError(f"no such savepoint: {sid}")
        names = list(self.savepoints)
        for name in names[names.index(sid) + 1 :]:
            del self.savepoints[name]

    # -- reading and writing ---------------------------------------------------------------

    def transaction(self) -> Transaction:
        """The open transaction, started on the latest root if there is none."""
        if self.txn is None:
            self.txn = self.engine.begin(self.isolation)
        return self.txn

    def view(self) -> View:
        """What a read sees: the open transaction, or a fresh snapshot in autocommit."""
        if not self.autocommit:
            return self.transaction()
        return self.engine.snapshot()

    @contextlib.contextmanager
    def writing(self) -> Iterator[Transaction]:
        """The transaction a write statement goes into; in autocommit mode one of its own,
        committed when the statement is done (or dropped if it fails)."""
        if not self.autocommit:
            yield self.transaction()
            return
        txn = self.engine.begin(self.isolation)
        yield txn
        if txn.ops:
            self.engine.commit(txn)

    def lock_rows(self, table: str, rows: list[tuple[Any, dict]]) -> None:
        """``select_for_update()``: fail the commit if these rows change before it (in
        autocommit mode there is no commit to fail: nothing to do)."""
        if self.autocommit:
            return
        self.transaction().apply(ExpectRecords(table, tuple(rows)))

    def apply(self, op: WriteOp) -> Any:
        with self.writing() as txn:
            return txn.apply(op)
