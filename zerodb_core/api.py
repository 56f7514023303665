"""The engine interface: everything a framework adapter (``django_zerodb``) may use.

``zerodb_core`` is an engine with many modules; an adapter that reached into any of
them would make every internal rename a breaking change and hide which parts of the
engine the Django layer really depends on. This module is the declared surface: the
adapter imports from here and nowhere else in ``zerodb_core`` (``tests/test_layering.py``
enforces it), so ``__all__`` below is the complete list of what the Django backend
builds on. Adding a name here is a design decision; keep it small.

The groups, in the order of ``__all__``:

- opening a database (``DB``) and its isolation levels;
- the schema a model declares (``ModelSpec``, ``IndexSpec`` and the index kinds);
- the query language (operators), its planner, executor and result;
- transactions, views and the write operations a transaction applies;
- key encoding and text folding (the adapter computes index keys for lookups);
- freshness trackers (rollback detection across processes);
- key files, passphrase changes and key rotation (management commands);
- status and verification (the admin page and ``zerodb_status``/``zerodb_verify``);
- the exceptions the engine raises.
"""

from __future__ import annotations

from zerodb_core import __version__
from zerodb_core.crypto import PRESETS
from zerodb_core.db import DB
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import (
    AuthenticationError,
    CommitTooLargeError,
    ConflictError,
    FreshnessError,
    IntegrityError,
    NotSupportedError,
    OperationalError,
    QueryError,
    QuotaExceededError,
    RateLimitedError,
    ServerBusyError,
    SnapshotTooOldError,
    StoreUnavailableError,
    UniqueViolation,
    WrongPassphraseError,
    ZeroDBError,
)
from zerodb_core.freshness import FileFreshnessTracker, FreshnessTracker
from zerodb_core.isolation import LEVELS, READ_COMMITTED
from zerodb_core.keyfile import KeyFile
from zerodb_core.query.executor import Executor
from zerodb_core.query.operators import (
    And,
    Any_,
    Contains,
    Eq,
    Expr,
    Ge,
    Gt,
    InRange,
    IsNull,
    Le,
    Lt,
    Match,
    NotAny,
    NotEq,
    NotInRange,
    Or,
    StartsWith,
    Substring,
)
from zerodb_core.query.planner import plan
from zerodb_core.query.result import QueryResult
from zerodb_core.rekey import change_passphrase, rotate_epoch
from zerodb_core.schema import FIELD, TEXT, TRIGRAM, UNIQUE, IndexSpec, ModelSpec
from zerodb_core.status import database_status
from zerodb_core.text import fold
from zerodb_core.transaction import (
    DeleteRecord,
    DropIndex,
    DropModel,
    EnsureModel,
    ExpectRecords,
    PutRecords,
    Savepoint,
    Transaction,
    View,
    WriteOp,
)
from zerodb_core.verify import verify

__all__ = [
    "DB",
    "FIELD",
    "LEVELS",
    "PRESETS",
    "READ_COMMITTED",
    "TEXT",
    "TRIGRAM",
    "UNIQUE",
    "And",
    "Any_",
    "AuthenticationError",
    "CommitTooLargeError",
    "ConflictError",
    "Contains",
    "DeleteRecord",
    "DropIndex",
    "DropModel",
    "EnsureModel",
    "Eq",
    "Executor",
    "ExpectRecords",
    "Expr",
    "FileFreshnessTracker",
    "FreshnessError",
    "FreshnessTracker",
    "Ge",
    "Gt",
    "InRange",
    "IndexSpec",
    "IntegrityError",
    "IsNull",
    "KeyFile",
    "Le",
    "Lt",
    "Match",
    "ModelSpec",
    "NotAny",
    "NotEq",
    "NotInRange",
    "NotSupportedError",
    "OperationalError",
    "Or",
    "PutRecords",
    "QueryError",
    "QueryResult",
    "QuotaExceededError",
    "RateLimitedError",
    "Savepoint",
    "ServerBusyError",
    "SnapshotTooOldError",
    "StartsWith",
    "StoreUnavailableError",
    "Substring",
    "Transaction",
    "UniqueViolation",
    "View",
    "WriteOp",
    "WrongPassphraseError",
    "ZeroDBError",
    "__version__",
    "change_passphrase",
    "database_status",
    "encode_key",
    "fold",
    "plan",
    "rotate_epoch",
    "verify",
]
