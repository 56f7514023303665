"""Errors of the Django backend, shaped like a DB-API driver's.

Django maps a driver's ``Error``, ``IntegrityError``, ``OperationalError`` ... to its own
``django.db`` exceptions by name (``DatabaseErrorWrapper``), so the backend raises these
inside ``connection.wrap_database_errors`` and user code sees the usual Django classes.
:func:`translated` turns the engine's errors into them at the boundary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import django.db.utils as django_errors

import zerodb_core.exceptions as core


class Error(Exception):
    """Base class of the backend's errors (DB-API ``Error``)."""


class InterfaceError(Error):
    pass


class DatabaseError(Error):
    pass


class DataError(DatabaseError):
    pass


class OperationalError(DatabaseError):
    pass


class IntegrityError(DatabaseError):
    pass


class InternalError(DatabaseError):
    pass


class ProgrammingError(DatabaseError):
    pass


class NotSupportedError(DatabaseError, django_errors.NotSupportedError):
    """Something the encrypted store cannot do; the message names the alternative.

    Also a ``django.db.NotSupportedError`` itself: refusals raised outside a query (the
    schema editor, introspection, query setup) reach user code as Django's class too."""


class SerializationError(OperationalError):
    """A concurrent commit changed what this transaction wrote, read for update, or (at
    "serializable") read: run it again (``django_zerodb.transaction.retry_on_conflict``)."""


class ImproperlyConfiguredStore(OperationalError):
    """The store of an encrypted database cannot be opened with its settings."""


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
    except (core.StoreUnavailableError, core.AuthenticationError) as exc:
        raise OperationalError(str(exc)) from exc
    except (core.IntegrityError, core.FreshnessError) as exc:
        # Tampering, rollback or fork of the store: never a wrong answer, always loud.
        raise DatabaseError(f"{type(exc).__name__}: {exc}") from exc
    except core.QueryError as exc:
        raise ProgrammingError(str(exc)) from exc
