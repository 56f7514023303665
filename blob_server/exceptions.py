"""Every exception blob_server raises, in one place.

The errors of the storage interface are defined in ``blob_server.wire.exceptions`` (the
trusted client sees them too, and imports nothing of the server but ``blob_server.wire``)
and listed here with the server's own, so that the server's modules have one place to
import their errors from.
"""

from blob_server.wire.exceptions import (
    BlobExistsError,
    InvalidRequestError,
    NotStagedError,
    QuotaExceededError,
    StorageError,
    StorageUnavailableError,
)

__all__ = [
    "BlobExistsError",
    "InvalidRequestError",
    "NotStagedError",
    "PersistenceUnknownError",
    "QuotaExceededError",
    "ServerFullError",
    "StorageError",
    "StorageUnavailableError",
    "VolatileStorageError",
]


class PersistenceUnknownError(StorageError):
    """The backend will not tell what it persists: Redis with CONFIG renamed, disabled
    or forbidden by an ACL (managed Redis services do this). The server then refuses to
    guess; the message says which flag states what the operator knows."""


class VolatileStorageError(StorageError):
    """``serve`` refuses a storage that would lose acknowledged commits in a restart
    (Redis without the append-only file) unless ``--allow-volatile-redis`` is given."""


class ServerFullError(Exception):
    """Every connection the server may hold is logged in: a newcomer is refused (``busy``)."""
