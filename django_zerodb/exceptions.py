"""Errors of the Django backend, shaped like a DB-API driver's.

Django maps a driver's ``Error``, ``IntegrityError``, ``OperationalError`` ... to its own
``django.db`` exceptions by name (``DatabaseErrorWrapper``), so the backend raises these
inside ``connection.wrap_database_errors`` and user code sees the usual Django classes.
Each class is also a subclass of its ``django.db`` twin, so an error raised where no
wrapper is active (query setup, the schema editor, a plan described before it runs) still
reaches user code as a ``django.db`` exception: ``except django.db.IntegrityError`` (which
``get_or_create`` relies on) never misses one. :func:`translated` turns the engine's
errors into them at the boundary, every one of them (``ZeroDBError`` is the catch-all).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import django.db.utils as django_errors

import zerodb_core.api as core


class Error(django_errors.Error):
    """Base class of the backend's errors (DB-API ``Error``)."""


class InterfaceError(Error, django_errors.InterfaceError):
    pass


class DatabaseError(Error, django_errors.DatabaseError):
    pass


class DataError(DatabaseError, django_errors.DataError):
    """A value the operation cannot take (bad input to a cast, a domain error of a
    function, an unknown time zone), as PostgreSQL's ``data_exception`` class."""


class OperationalError(DatabaseError, django_errors.OperationalError):
    pass


class IntegrityError(DatabaseError, django_errors.IntegrityError):
    pass


class InternalError(DatabaseError, django_errors.InternalError):
    pass


class ProgrammingError(DatabaseError, django_errors.ProgrammingError):
    pass


class NotSupportedError(DatabaseError, django_errors.NotSupportedError):
    """Something the encrypted store cannot do; the message names the alternative."""


class SerializationError(OperationalError):
    """A concurrent commit changed what this transaction wrote, read for update, or (at
    "serializable") read: run it again (``django_zerodb.transaction.retry_on_conflict``)."""


# The engine's operational errors (zerodb_core.OperationalError: an outage or a limit,
# never tampering), each also a ``django.db.OperationalError`` itself, so that user code
# can catch Django's class or the precise one; ``DatabaseErrorWrapper`` lets them through
# as they are.


class StoreUnavailableError(OperationalError):
    """The store cannot be reached, or its storage is down: retry later."""


class ServerBusyError(StoreUnavailableError):
    """The blob server refuses connections, it holds as many as it takes: retry later."""


class RateLimitedError(OperationalError):
    """The blob server refuses logins from this address for now: retry later."""


class QuotaExceededError(OperationalError):
    """The tenant's quota refused the write; nothing was written."""


class CommitTooLargeError(OperationalError):
    """One blob or root is past what the store accepts at all; nothing was written."""


class SnapshotTooOldError(OperationalError):
    """The transaction's snapshot outlived the store's garbage retention: retry it."""


# Most precise first: ``translated`` takes the first class in the error's MRO found here.
_OPERATIONAL: dict[type[core.OperationalError], type[OperationalError]] = {
    core.ServerBusyError: ServerBusyError,
    core.StoreUnavailableError: StoreUnavailableError,
    core.RateLimitedError: RateLimitedError,
    core.QuotaExceededError: QuotaExceededError,
    core.CommitTooLargeError: CommitTooLargeError,
    core.SnapshotTooOldError: SnapshotTooOldError,
    core.OperationalError: OperationalError,
}


class DatabaseErrorWrapper(django_errors.DatabaseErrorWrapper):
    """Django's wrapper, except that errors which already are Django's classes (the
    precise ones above, ``NotSupportedError``) go through as they are.

    *Why:* Django's wrapper re-raises every driver error as Django's base class of its
    kind (``django.db.OperationalError(*args)``), so a caller could not tell a full
    quota from a busy server without digging in ``__cause__``."""

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        ours_and_djangos = (
            exc_type is not None
            and issubclass(exc_type, Error)
            and issubclass(exc_type, django_errors.Error)
        )
        if not ours_and_djangos:
            super().__exit__(exc_type, exc_value, traceback)
        elif not issubclass(exc_type, django_errors.DataError | django_errors.IntegrityError):
            self.wrapper.errors_occurred = True  # as Django's wrapper does


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise the engine's errors as the DB-API errors Django expects."""
    try:
        yield
    except core.UniqueViolation as exc:
        raise IntegrityError(f"UNIQUE constraint failed: {exc}") from exc
    except core.WrongPassphraseError as exc:
        raise OperationalError(f"wrong passphrase for the encrypted database: {exc}") from exc
    except core.ConflictError as exc:
        raise SerializationError(str(exc)) from exc
    except core.NotSupportedError as exc:
        raise NotSupportedError(str(exc)) from exc
    except core.OperationalError as exc:  # an outage or a limit: never the tamper alarm
        kind = next(_OPERATIONAL[cls] for cls in type(exc).__mro__ if cls in _OPERATIONAL)
        raise kind(str(exc)) from exc
    except core.AuthenticationError as exc:
        raise OperationalError(str(exc)) from exc
    except (core.IntegrityError, core.FreshnessError) as exc:
        # Tampering, rollback or fork of the store: never a wrong answer, always loud.
        raise DatabaseError(f"{type(exc).__name__}: {exc}") from exc
    except core.QueryError as exc:
        raise ProgrammingError(str(exc)) from exc
    except core.QuotaExceededError as exc:
        raise OperationalError(str(exc)) from exc
    except core.ZeroDBError as exc:  # anything else of the engine: never a bare class
        raise DatabaseError(f"{type(exc).__name__}: {exc}") from exc
