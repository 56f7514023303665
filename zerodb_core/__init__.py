"""zerodb_core: the framework-free encrypted engine of django-zerodb.

Keys and crypto, the blob format, copy-on-write encrypted B+trees, records and indexes,
queries and transactions, and the native API::

    from zerodb_core import DB
    from zerodb_core.models import Model, Field, Text
    from zerodb_core.query import InRange, Gt, Contains
"""

__version__ = "0.1.0.dev0"  # the version of the django-zerodb distribution (setup.cfg)

from zerodb_core.db import DB
from zerodb_core.exceptions import (
    AuthenticationError,
    CommitTooLargeError,
    ConflictError,
    DoesNotExist,
    FreshnessError,
    IntegrityError,
    MissingBlobError,
    NotSupportedError,
    OperationalError,
    QueryError,
    QuotaExceededError,
    RateLimitedError,
    SerializationError,
    ServerBusyError,
    SnapshotTooOldError,
    StoreUnavailableError,
    UniqueViolation,
    WrongPassphraseError,
    ZeroDBError,
)

__all__ = [
    "DB",
    "AuthenticationError",
    "CommitTooLargeError",
    "ConflictError",
    "DoesNotExist",
    "FreshnessError",
    "IntegrityError",
    "MissingBlobError",
    "NotSupportedError",
    "OperationalError",
    "QueryError",
    "QuotaExceededError",
    "RateLimitedError",
    "SerializationError",
    "ServerBusyError",
    "SnapshotTooOldError",
    "StoreUnavailableError",
    "UniqueViolation",
    "WrongPassphraseError",
    "ZeroDBError",
    "__version__",
]
