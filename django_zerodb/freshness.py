"""Rollback detection across restarts, remembered in the default database.

The engine refuses a root older than the highest one it has seen (``zerodb_core.
freshness``). Kept in memory only, that floor is lost when the process restarts, so a
store rolled back meanwhile would go unnoticed. ``OPTIONS["FRESHNESS"]`` says where the
floor lives:

* ``"default"`` (the default): the :class:`~django_zerodb.models.SeenRoot` table of the
  *default* database (``migrate`` creates it), shared by every process of the project;
* ``"file"``: a JSON file, ``OPTIONS["FRESHNESS_PATH"]`` or the engine's default (beside
  an SQLite store or the key file);
* ``"memory"``: this process only.

A ``memory://`` store does not outlive its process, so its floor is always in memory.

The default database must not be the encrypted one (its own freshness would recurse):
then, or while the table does not exist yet (``migrate`` has not run), or when the default
database cannot be reached, the floor is kept in memory, a warning is logged, and the
system checks say so (``django_zerodb.W002``, ``W003``). Before the default database's
first ``migrate`` the missing table is expected, and said at INFO only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from zerodb_core.api import FileFreshnessTracker, FreshnessTracker

logger = logging.getLogger("django_zerodb")

TABLE = "django_zerodb_seenroot"


def default_database_problem(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """Why the default database cannot keep the floor (None if it can)."""
    entry = settings.DATABASES.get(using)
    if not entry:
        return f"there is no {using!r} database"
    if entry.get("ENGINE") == "django_zerodb":
        return (
            f"the {using!r} database is itself encrypted (django_zerodb): its freshness "
            "cannot be kept in itself"
        )
    if entry.get("ENGINE") == "django.db.backends.dummy":
        return f"the {using!r} database is not configured"
    return None


def store_identity(store: str, tenant: str | None = None) -> str:
    """What names a store in ``SeenRoot.store``: an SQLite store by its absolute path, a
    blob server by its address and tenant."""
    if store.startswith("sqlite:///"):
        store = "sqlite:///" + os.path.abspath(store[len("sqlite:///") :])
    if tenant and tenant != "local":
        store = f"{store}#tenant={tenant}"
    return store


def migrated(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether a migration of this app (the one creating ``SeenRoot``) is recorded as
    applied on ``using``."""
    from django.db.migrations.recorder import MigrationRecorder

    applied = MigrationRecorder(connections[using]).applied_migrations()
    return any(app == "django_zerodb" for app, _ in applied)


class ModelFreshnessTracker(FreshnessTracker):
    """The highest ``(seq, digest)`` per database of one store, in ``SeenRoot`` rows of
    the default database.

    Read once, at the first root the engine checks; every newer root is written with a
    conditional update (the row only moves forward, so concurrent processes keep the
    highest). If the table cannot be used the tracker keeps going in memory
    (``fallback`` says why): a failure to *remember* must never fail a commit that the
    store has already made.
    """

    def __init__(self, store: str, alias: str = "", using: str = DEFAULT_DB_ALIAS) -> None:
        super().__init__()
        self.store = store
        self.alias = alias
        self.using = using
        self.fallback: str | None = None

    def _rows(self):
        from django_zerodb.models import SeenRoot

        return SeenRoot.objects.using(self.using)

    def _fall_back(self, why: str, level: int = logging.WARNING) -> None:
        if self.fallback is None:
            self.fallback = why
            logger.log(
                level,
                "django_zerodb: the highest root seen of %s is kept in memory only (%s): "
                "a rollback of the store while this process is not running goes unnoticed",
                self.store,
                why,
            )

    def load(self) -> dict[str, tuple[int, bytes | None]]:
        try:
            rows = list(
                self._rows().filter(store=self.store).values_list("database", "seq", "digest")
            )
        except Exception as exc:  # not migrated, unreachable, access refused (tests) ...
            # Before the first `migrate` (`makemigrations` opens every database to check
            # its history) the table is missing by design and Django itself lists the
            # unapplied migration: said at INFO, as the system check W003 stays silent then.
            level = logging.INFO if self._not_migrated_yet() else logging.WARNING
            self._fall_back(f"cannot read {TABLE} of the {self.using!r} database: {exc}", level)
            return {}
        try:
            return {
                db: (seq, bytes.fromhex(digest) if digest else None) for db, seq, digest in rows
            }
        except ValueError:
            from zerodb_core.api import FreshnessError

            raise FreshnessError(f"{TABLE} holds a malformed digest for {self.store}") from None

    def _not_migrated_yet(self) -> bool:
        try:
            return not migrated(self.using)
        except Exception:  # the default database cannot be read at all: that is a warning
            return False

    def remember(self, database: str, seq: int, digest: bytes | None) -> None:
        if self.fallback is not None:
            return
        values = {"seq": seq, "digest": digest.hex() if digest else "", "alias": self.alias}
        try:
            with transaction.atomic(using=self.using):
                rows = self._rows().filter(store=self.store, database=database)
                if not rows.filter(seq__lt=seq).update(**values):
                    # No row yet, or one at least as high (another process got further).
                    self._rows().get_or_create(store=self.store, database=database, defaults=values)
        except Exception as exc:
            self._fall_back(f"cannot write {TABLE} of the {self.using!r} database: {exc}")

    def describe(self) -> str:
        where = f"{TABLE} in the {self.using!r} database"
        return f"{where} (fell back to memory: {self.fallback})" if self.fallback else where


def tracker_for(params: dict[str, Any]) -> FreshnessTracker | None:
    """The tracker of an engine opened with ``params`` (``store_settings``), or None to
    let the engine choose (``"file"``: ``freshness_path`` or beside the store)."""
    mode = params.get("freshness") or "default"
    if params["store"].startswith("memory://") or mode == "memory":
        return FreshnessTracker()
    if mode == "file":
        return None
    problem = default_database_problem()
    if problem is not None:
        logger.warning(
            "django_zerodb: FRESHNESS='default' but %s; the highest root seen is kept in memory",
            problem,
        )
        return FreshnessTracker()
    return ModelFreshnessTracker(store_identity(params["store"]), params.get("alias") or "")


def describe_tracker(tracker: FreshnessTracker) -> str:
    """Where a tracker keeps the highest root seen (for ``zerodb_status``)."""
    if isinstance(tracker, ModelFreshnessTracker):
        return tracker.describe()
    if isinstance(tracker, FileFreshnessTracker):
        return f"file {tracker.path}"
    return "memory (this process only)"
