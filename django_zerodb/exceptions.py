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

import django.db.utils as django_errors

import zerodb_core.exceptions as core


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
    """A concurrent commit changed rows this transaction read for update."""


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
    except core.QuotaExceededError as exc:
        raise OperationalError(str(exc)) from exc
    except core.ZeroDBError as exc:  # anything else of the engine: never a bare class
        raise DatabaseError(f"{type(exc).__name__}: {exc}") from exc
