"""``DatabaseWrapper``: the connection of an encrypted database.

There is no SQL here. A connection opens (or shares) the encrypted engine for its
settings and keeps a :class:`~django_zerodb.session.StoreSession` as its "raw
connection"; the compilers (``compiler.py``) translate Django's query objects into
engine operations on that session.
"""

from __future__ import annotations

import time
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.functional import cached_property

from django_zerodb import database as Database
from django_zerodb.client import DatabaseClient
from django_zerodb.creation import DatabaseCreation
from django_zerodb.exceptions import DatabaseErrorWrapper, NotSupportedError, translated
from django_zerodb.features import DatabaseFeatures
from django_zerodb.introspection import DatabaseIntrospection
from django_zerodb.operations import DatabaseOperations
from django_zerodb.schema import DatabaseSchemaEditor
from django_zerodb.session import StoreSession
from django_zerodb.store import open_engine, store_settings

# Every field stores its Python value (msgpack keeps types); the names only tell Django
# that a field has a column.
_STORED = {
    name: name.removesuffix("Field").lower() or "value"
    for name in [
        "AutoField",
        "BigAutoField",
        "SmallAutoField",
        "BinaryField",
        "BooleanField",
        "CharField",
        "DateField",
        "DateTimeField",
        "DecimalField",
        "DurationField",
        "FileField",
        "FilePathField",
        "FloatField",
        "IntegerField",
        "BigIntegerField",
        "SmallIntegerField",
        "PositiveBigIntegerField",
        "PositiveIntegerField",
        "PositiveSmallIntegerField",
        "IPAddressField",
        "GenericIPAddressField",
        "JSONField",
        "SlugField",
        "TextField",
        "TimeField",
        "UUIDField",
    ]
}


class ZeroCursor:
    """What ``connection.cursor()`` returns: it exists (Django opens cursors for
    bookkeeping), but the encrypted store has no SQL, so executing anything refuses."""

    rowcount = -1
    lastrowid = None
    description = None

    def execute(self, sql: str, params: Any = None) -> None:
        raise NotSupportedError(
            "raw SQL is not supported by the encrypted database (django_zerodb): "
            "use the ORM (QuerySet methods) instead of cursor(), raw() or extra()"
        )

    executemany = execute

    def fetchone(self) -> None:
        return None

    def fetchmany(self, size: int = 1) -> list:
        return []

    def fetchall(self) -> list:
        return []

    def close(self) -> None:
        pass

    def __iter__(self):
        return iter(())


class DatabaseWrapper(BaseDatabaseWrapper):
    vendor = "zerodb"
    display_name = "ZeroDB (encrypted)"
    data_types = _STORED
    data_types_suffix: dict = {}
    data_type_check_constraints: dict = {}
    # Lookups are translated from query objects (lookups.py); these strings only exist
    # because Django's SQL-oriented code paths read them.
    operators = {
        "exact": "= %s",
        "iexact": "LIKE %s",
        "contains": "LIKE %s",
        "icontains": "LIKE %s",
        "regex": "REGEXP %s",
        "iregex": "REGEXP %s",
        "gt": "> %s",
        "gte": ">= %s",
        "lt": "< %s",
        "lte": "<= %s",
        "startswith": "LIKE %s",
        "endswith": "LIKE %s",
        "istartswith": "LIKE %s",
        "iendswith": "LIKE %s",
    }
    pattern_esc = ""
    pattern_ops: dict = {}

    Database = Database
    SchemaEditorClass = DatabaseSchemaEditor
    client_class = DatabaseClient
    creation_class = DatabaseCreation
    features_class = DatabaseFeatures
    introspection_class = DatabaseIntrospection
    ops_class = DatabaseOperations

    @cached_property
    def wrap_database_errors(self) -> DatabaseErrorWrapper:
        """Django's error wrapper, letting the backend's precise Django classes through
        (``QuotaExceededError``, ``SnapshotTooOldError``...: see ``exceptions``)."""
        return DatabaseErrorWrapper(self)

    # -- opening ---------------------------------------------------------------------------

    def get_connection_params(self) -> dict[str, Any]:
        return {**store_settings(self.settings_dict), "alias": self.alias}

    def get_new_connection(self, conn_params: dict[str, Any]) -> StoreSession:
        with translated():
            return StoreSession(open_engine(conn_params), conn_params["isolation"])

    def init_connection_state(self) -> None:
        pass

    def get_database_version(self) -> tuple[int, ...]:
        return (1,)

    def create_cursor(self, name: str | None = None) -> ZeroCursor:
        return ZeroCursor()

    def is_usable(self) -> bool:
        return self.connection is not None and not self.connection.closed

    def _set_autocommit(self, autocommit: bool) -> None:
        self.connection.set_autocommit(autocommit)

    def _savepoint(self, sid: str) -> None:
        with self.wrap_database_errors, translated():
            self.connection.savepoint(sid)

    def _savepoint_rollback(self, sid: str) -> None:
        with self.wrap_database_errors:
            self.connection.rollback_to_savepoint(sid)

    def _savepoint_commit(self, sid: str) -> None:
        with self.wrap_database_errors:
            self.connection.release_savepoint(sid)

    def _commit(self) -> None:
        if self.connection is not None:
            with self.wrap_database_errors, translated():
                self.connection.commit()

    # -- what the compilers use ------------------------------------------------------------

    @property
    def session(self) -> StoreSession:
        """The connection's session, connecting first if needed. Like ``cursor()`` on
        other backends, it refuses while an ``atomic`` block is marked for rollback.

        It goes through ``cursor()``, so that whatever guards cursors guards every query
        of the compilers too: Django's test cases (and pytest-django's ``django_db``)
        replace ``cursor`` on the connections a test did not ask for, and a test without
        this database in its ``databases`` must fail, not read or write it (its writes
        would outlive the test), also once another test has opened the connection."""
        self.cursor().close()
        self.validate_no_broken_transaction()
        return self.connection

    def log_query(self, description: str, started: float, round_trips: int) -> None:
        """One ``connection.queries`` entry per executed statement (``assertNumQueries``
        counts them), with the plan and the round trips it took."""
        if self.queries_logged:
            self.queries_log.append(
                {
                    "sql": description,
                    "time": f"{time.monotonic() - started:.3f}",
                    "round_trips": round_trips,
                }
            )

    def round_trips(self) -> int:
        return self.session.engine.transport.counters.round_trips
