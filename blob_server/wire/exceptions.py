"""The errors a storage raises, as every user of the storage interface sees them.

They belong to the interface (``blob_server.wire.storage``), not to the server: the
embedded store raises them in the client's process, and the remote client turns the
server's error codes back into them. The storage layer only ever sees opaque bytes; its
errors speak of ids, sizes and sequence numbers, never of contents.
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
