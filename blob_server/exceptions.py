"""Every exception blob_server raises, in one place.

The storage layer only ever sees opaque bytes; its errors speak of ids, sizes and
sequence numbers, never of contents.
"""


class StorageError(Exception):
    """Base class of all storage errors."""


class BlobExistsError(StorageError):
    """A commit tried to write a blob id that already exists (blobs are write-once)."""


class InvalidRequestError(StorageError):
    """An argument is malformed: wrong type, wrong id length, negative count, ..."""


class StorageUnavailableError(StorageError):
    """The backend cannot be opened or reached."""


class QuotaExceededError(StorageError):
    """A tenant would exceed its byte or blob quota."""
