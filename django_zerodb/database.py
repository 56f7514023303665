"""The DB-API "driver module" surface Django expects as ``DatabaseWrapper.Database``.

Django maps driver exceptions to its own by name (``Database.IntegrityError`` ->
``django.db.IntegrityError``) and wraps binary values with ``Database.Binary``.
"""

from __future__ import annotations

from django_zerodb.exceptions import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
)

# Binary values are stored as bytes (msgpack bin).
Binary = bytes

__all__ = [
    "Binary",
    "DataError",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
]
