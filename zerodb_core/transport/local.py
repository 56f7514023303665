"""The embedded mode: storage in the same process, reached through the same counted API."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from blob_server.exceptions import StorageError
from blob_server.storage import Storage
from blob_server.storage.base import CommitResult, RootRecord
from zerodb_core.exceptions import StoreUnavailableError
from zerodb_core.transport.base import Transport

# The embedded store has a single tenant: there is nobody to keep apart.
LOCAL_TENANT = "local"


class LocalTransport(Transport):
    """Call a storage backend in-process; count round trips as if it were remote."""

    def __init__(self, storage: Storage, *, tenant: str = LOCAL_TENANT, delay: float = 0.0):
        super().__init__(delay=delay)
        self.storage = storage
        self.tenant = tenant

    def _get_blobs(self, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        return self.storage.get_blobs(self.tenant, database, ids)

    def _get_root(self, database: str) -> RootRecord:
        return self.storage.get_root(self.tenant, database)

    def _commit(
        self,
        database: str,
        *,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: list[bytes],
    ) -> CommitResult:
        return self.storage.commit(
            self.tenant,
            database,
            expected_seq=expected_seq,
            root=root,
            blobs=blobs,
            garbage=garbage,
        )

    def _allocate_ids(self, database: str, sequence: str, count: int) -> int:
        return self.storage.allocate_ids(self.tenant, database, sequence, count)

    def _get_keyring(self, database: str, name: str) -> bytes | None:
        return self.storage.get_keyring(self.tenant, database, name)

    def _put_keyring(
        self, database: str, name: str, data: bytes, *, expected: bytes | None
    ) -> bool:
        return self.storage.put_keyring(self.tenant, database, name, data, expected=expected)

    def collect_garbage(self, retention: float) -> int:
        """Delete blobs replaced more than ``retention`` seconds ago. A server does this
        by itself; an embedded store has nobody else to do it, so the client does."""
        return self.storage.collect_garbage(retention=retention)

    def close(self) -> None:
        self.storage.close()


def open_local_transport(url: str, *, delay: float = 0.0) -> LocalTransport:
    """Open ``memory://`` or ``sqlite:///path`` as an embedded store."""
    from blob_server.storage import open_storage

    try:
        storage = open_storage(url)
    except StorageError as exc:
        raise StoreUnavailableError(f"cannot open store {url!r}: {exc}") from exc
    return LocalTransport(storage, delay=delay)
