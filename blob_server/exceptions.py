"""Every exception blob_server raises, in one place.

The storage layer only ever sees opaque bytes; its errors speak of ids, sizes and
sequence numbers, never of contents.
"""


class StorageError(Exception):
    """Base class of all storage errors."""


class BlobExistsError(StorageError):
    """A commit tried to write a blob id that already exists (blobs are write-once)."""


class NotStagedError(StorageError):
    """A commit named a staged blob id that is not pending for its (tenant, database):
    never staged there, already made live, released as garbage, or collected after the
    staging timeout. Nothing was changed."""


class InvalidRequestError(StorageError):
    """An argument is malformed: wrong type, wrong id length, negative count, ..."""


class StorageUnavailableError(StorageError):
    """The backend cannot be opened or reached."""


class PersistenceUnknownError(StorageError):
    """The backend will not tell what it persists: Redis with CONFIG renamed, disabled
    or forbidden by an ACL (managed Redis services do this). The server then refuses to
    guess; the message says which flag states what the operator knows."""


class VolatileStorageError(StorageError):
    """``serve`` refuses a storage that would lose acknowledged commits in a restart
    (Redis without the append-only file) unless ``--allow-volatile-redis`` is given."""


class QuotaExceededError(StorageError):
    """A write would take a tenant past its byte or blob quota; nothing was changed.

    ``resource`` is ``"bytes"`` or ``"blobs"``; ``used`` is the tenant's usage before the
    write, ``adding`` what the write would add, ``limit`` the quota. The message says all
    of it, because it travels to the client as text.
    """

    def __init__(self, tenant: str, resource: str, used: int, adding: int, limit: int) -> None:
        super().__init__(
            f"tenant {tenant!r} would exceed its quota of {limit} {resource}: "
            f"{used} used, the write adds {adding}"
        )
        self.tenant = tenant
        self.resource = resource
        self.used = used
        self.adding = adding
        self.limit = limit


class ServerFullError(Exception):
    """Every connection the server may hold is logged in: a newcomer is refused (``busy``)."""
