"""Every exception zerodb_core raises, in one place.

Callers (the Django backend, applications) catch these by class; nothing in the engine
raises a bare ``ValueError`` for a condition a user can cause.

Two families matter to an operator and must never be confused:

* ``IntegrityError`` (and ``FreshnessError``) is the tamper alarm: the store served
  something that does not authenticate, does not decode, is missing from a snapshot it
  must still hold, or is older than what was seen. Alert on it.
* ``OperationalError`` is everything the store could not do for an ordinary reason: it
  is unreachable or busy, a limit refused the request (quota, rate, size), or a snapshot
  outlived the garbage retention. Nothing was tampered with; the message says whether to
  retry later or what to change.

docs/settings.md ("Errors") lists every exception, its cause and what to do.
"""


class ZeroDBError(Exception):
    """Base class of all zerodb_core errors."""


class IntegrityError(ZeroDBError):
    """A blob failed authentication or does not decode: tampered, truncated, swapped,
    moved, of the wrong kind, of an unknown suite or format, or sealed with another key.

    Raised before anything in the blob is deserialised (fail closed).
    """


class MissingBlobError(IntegrityError):
    """A blob a snapshot reaches is not in the store. From a snapshot the store must still
    hold (the current root, or one younger than the garbage retention) that is tampering
    or loss; a read of an older snapshot raises ``SnapshotTooOldError`` instead."""

    def __init__(self, blob_id: bytes) -> None:
        super().__init__(f"blob {blob_id.hex()} is missing from the store (deleted or withheld)")
        self.blob_id = blob_id


class UnknownEpochError(IntegrityError):
    """A blob sealed under a key epoch this client's keyring does not hold (yet): the
    keyring is reloaded once (another client may have rotated); if the epoch is still
    unknown, it is an integrity failure like any other."""


class WrongPassphraseError(IntegrityError):
    """The keyring did not open: the passphrase (or key file) is not the right one."""


class FreshnessError(ZeroDBError):
    """The store served a root record older than one already seen (rollback) or a
    different root for a sequence number already seen (fork)."""


class UniqueViolation(ZeroDBError):
    """A write would give two records the same value of a unique index."""

    def __init__(self, index: str, value: object) -> None:
        super().__init__(f"duplicate value {value!r} for unique index {index!r}")
        self.index = index
        self.value = value


class AuthenticationError(ZeroDBError):
    """The store refused the credentials."""


class OperationalError(ZeroDBError):
    """The store could not do it, for a reason outside the data: an outage, a limit, or
    a snapshot too old. Never a sign of tampering (that is ``IntegrityError``); the
    message says "retry later" or names the limit and the setting that changes it."""


class ConflictError(OperationalError):
    """A commit kept meeting concurrent commits and gave up after its retries (the
    database is busy: retry later). Its subclass ``SerializationError`` is the refusal of
    an isolation level."""


class SerializationError(ConflictError):
    """A concurrent commit changed what this transaction wrote (isolation level
    "repeatable read") or read ("serializable") after its snapshot, so it may not be
    replayed on the newer data: run the whole transaction again (``DB.transactional``
    does, as PostgreSQL clients retry SQLSTATE 40001)."""


class StoreUnavailableError(OperationalError):
    """The store cannot be reached or opened, or its own storage is unavailable: retry
    later. A write whose answer was lost this way has an unknown outcome (it may have
    committed): read before writing it again."""


class ServerBusyError(StoreUnavailableError):
    """The blob server refused a connection or a request for a limit of the moment: it
    holds as many connections as it takes (``serve --max-connections``), this tenant holds
    as many as it may (``max_connections`` in the tenants file, ``serve
    --tenant-max-connections``), or a request found no room in the memory for frames
    being received (``--max-frame-memory``, the tenant's ``max_frame_memory``) within the
    frame timeout; such a request was not carried out. The message says which. Retry
    later."""


class RateLimitedError(OperationalError):
    """The blob server refused for now: too many failed logins as this tenant from this
    address in the last minute (a wrong key, or someone else's attempts from the same
    address), or from this address for many tenant names; or the tenant sent more
    requests than its rate (``rate``/``burst`` in the tenants file, ``serve
    --tenant-rate``). The message says which, and how long to wait. Retry later."""


class SnapshotTooOldError(OperationalError):
    """A read of an old snapshot met a blob the store has already deleted: later commits
    replaced it and the garbage retention (``serve --garbage-retention``, 600 s by
    default) has passed since. Start a new transaction (retry); a transaction that must
    stay open longer needs a longer retention."""


class QuotaExceededError(OperationalError):
    """The blob server refused a write: it would take the tenant past its quota of bytes
    or blobs. Nothing was written; the message says what is used and what is allowed.
    Deleting data frees space only once garbage collection has run (copy-on-write: a
    delete writes new nodes first), so a tenant at its limit needs a larger quota."""


class CommitTooLargeError(OperationalError):
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
