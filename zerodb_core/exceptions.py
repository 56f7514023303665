"""Every exception zerodb_core raises, in one place.

Callers (the Django backend, applications) catch these by class; nothing in the engine
raises a bare ``ValueError`` for a condition a user can cause.
"""


class ZeroDBError(Exception):
    """Base class of all zerodb_core errors."""


class IntegrityError(ZeroDBError):
    """A blob failed authentication or does not decode: tampered, truncated, swapped,
    moved, of the wrong kind, of an unknown suite or format, or sealed with another key.

    Raised before anything in the blob is deserialised (fail closed).
    """


class UnknownEpochError(IntegrityError):
    """A blob sealed under a key epoch this client's keyring does not hold (yet): the
    keyring is reloaded once (another client may have rotated); if the epoch is still
    unknown, it is an integrity failure like any other."""


class WrongPassphraseError(IntegrityError):
    """The keyring did not open: the passphrase (or key file) is not the right one."""


class FreshnessError(ZeroDBError):
    """The store served a root record older than one already seen (rollback) or a
    different root for a sequence number already seen (fork)."""


class ConflictError(ZeroDBError):
    """A commit kept meeting concurrent commits and gave up after its retries."""


class SerializationError(ConflictError):
    """A concurrent commit changed what this transaction wrote (isolation level
    "repeatable read") or read ("serializable") after its snapshot, so it may not be
    replayed on the newer data: run the whole transaction again (``DB.transactional``
    does, as PostgreSQL clients retry SQLSTATE 40001)."""


class UniqueViolation(ZeroDBError):
    """A write would give two records the same value of a unique index."""

    def __init__(self, index: str, value: object) -> None:
        super().__init__(f"duplicate value {value!r} for unique index {index!r}")
        self.index = index
        self.value = value


class AuthenticationError(ZeroDBError):
    """The store refused the credentials."""


class StoreUnavailableError(ZeroDBError):
    """The store cannot be reached or opened."""


class QuotaExceededError(ZeroDBError):
    """The blob server refused a write: it would take the tenant past its quota of bytes
    or blobs. Nothing was written; the message says what is used and what is allowed.
    Deleting data frees space only once garbage collection has run (copy-on-write: a
    delete writes new nodes first), so a tenant at its limit needs a larger quota."""


class CommitTooLargeError(ZeroDBError):
    """A single blob or root is larger than the store accepts at all (32 MiB on a blob
    server), or a commit would name more than 2**20 staged and garbage ids; nothing was
    written. A transaction merely larger than one request is never refused: its blobs
    are staged in several requests (``serve --max-commit-blobs/--max-commit-bytes`` bound
    a request, not a transaction)."""


class NotSupportedError(ZeroDBError):
    """The operation is not supported; the message names the alternative."""


class QueryError(ZeroDBError):
    """A query is malformed (unknown operator, field without the index it needs, ...)."""


class DoesNotExist(ZeroDBError, KeyError):
    """No record has the requested primary key."""
