"""The embedded mode: storage in the same process, reached through the same counted API."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Mapping, Sequence

from blob_server.wire import protocol
from blob_server.wire.exceptions import StorageError
from blob_server.wire.storage import (
    IN_PROCESS,
    MAX_BLOB_SIZE,
    MAX_COMMIT_IDS,
    MAX_IDS_PER_REQUEST,
    ON_MACHINE,
    CommitResult,
    RootRecord,
    Storage,
)
from zerodb_core.exceptions import StoreUnavailableError
from zerodb_core.transport.base import Transport
from zerodb_core.transport.leases import FILE_LOCKS, FileLeases, LocalLeases, ThreadLeases
from zerodb_core.transport.staging import REFUSALS, RequestLimits

# The embedded store has a single tenant: there is nobody to keep apart.
LOCAL_TENANT = "local"

#: One storage call carries at most what a blob server accepts by default in one request.
#: *Why stage in process at all:* a storage call is one SQLite write transaction (the
#: file's write lock) or one Redis script (Redis' only thread) when the embedded store
#: is a ``RedisStorage``; bounding it keeps other writers' waits, and the memory of one
#: call, bounded as on the server. A transaction above it is streamed exactly as over
#: the network, so both paths are the same code, tested by both.
LOCAL_LIMITS = RequestLimits(
    blobs=protocol.MAX_IDS_PER_REQUEST,
    bytes=protocol.MAX_RESPONSE_BLOB_BYTES,
    blob=MAX_BLOB_SIZE,
    ids=MAX_COMMIT_IDS,
)


#: The commit leases of each in-process store, shared by every transport on it.
_THREAD_LEASES: weakref.WeakKeyDictionary[Storage, ThreadLeases] = weakref.WeakKeyDictionary()
_THREAD_LEASES_LOCK = threading.Lock()


def store_leases(storage: Storage) -> LocalLeases | None:
    """The commit leases of an embedded store (``transport.leases``), by its ``reach``:
    shared in the process for an in-process store (memory), file locks beside a store in
    a file (SQLite); None for a networked one (a Redis used as an embedded store: its
    clients race, as before leases)."""
    if storage.reach == IN_PROCESS:
        with _THREAD_LEASES_LOCK:
            found = _THREAD_LEASES.get(storage)
            if found is None:
                found = _THREAD_LEASES[storage] = ThreadLeases()
            return found
    if storage.reach == ON_MACHINE and storage.path and FILE_LOCKS:
        return FileLeases(storage.path)
    return None


class LocalTransport(Transport):
    """Call a storage backend in-process; count round trips as if it were remote.

    ``leases``: the store's commit leases (True: ``store_leases``; False: none, this
    client races; or a ``LocalLeases``).
    """

    limits = LOCAL_LIMITS

    def __init__(
        self,
        storage: Storage,
        *,
        tenant: str = LOCAL_TENANT,
        delay: float = 0.0,
        leases: LocalLeases | bool = True,
    ):
        super().__init__(delay=delay)
        self.storage = storage
        self.tenant = tenant
        self.leases: LocalLeases | None = (
            store_leases(storage) if leases is True else leases or None
        )
        # Per database: the storage's root marker when the root was last read, and the
        # seq read then (see known_root_seq).
        self._markers: dict[str, tuple[Hashable, int]] = {}
        self._durability: dict[str, str] | None = None

    def durability(self) -> dict[str, str] | None:
        """What the storage says it persists (asked once: a Redis answers with a round
        trip), or None when it will not say or cannot be reached."""
        if self._durability is None:
            try:
                self._durability = self.storage.durability().as_dict()
            except StorageError:
                return None
        return self._durability

    def _get_blobs(self, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """One round trip, however many ids: a storage call takes at most
        ``MAX_IDS_PER_REQUEST`` of them (a merge of large runs reads more nodes at once),
        so larger reads go in several calls, as the remote transport pipelines frames."""
        if len(ids) <= MAX_IDS_PER_REQUEST:
            return self.storage.get_blobs(self.tenant, database, ids)
        found: dict[bytes, bytes] = {}
        for start in range(0, len(ids), MAX_IDS_PER_REQUEST):
            chunk = ids[start : start + MAX_IDS_PER_REQUEST]
            found.update(self.storage.get_blobs(self.tenant, database, chunk))
        return found

    def _get_root(self, database: str) -> RootRecord:
        # The marker is taken first: if it is the same later, no commit came after it,
        # so none came after this read either.
        marker = self.storage.root_marker(self.tenant, database)
        root = self.storage.get_root(self.tenant, database)
        if marker is not None:
            self._markers[database] = (marker, root.seq)
        return root

    def _open_database(self, database: str, keyring: str) -> tuple[bytes | None, RootRecord]:
        return self._get_keyring(database, keyring), self._get_root(database)

    def known_root_seq(self, database: str) -> int | None:
        """The seq of the root last read, while the storage's marker says no commit may
        have come since (see ``Storage.root_marker``); None when it cannot tell."""
        known = self._markers.get(database)
        if known is None:
            return None
        marker = self.storage.root_marker(self.tenant, database)
        return known[1] if marker is not None and marker == known[0] else None

    def _commit(
        self,
        database: str,
        *,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: list[bytes],
        staged: list[bytes],
        lease: object | None = None,
    ) -> CommitResult:
        leases = self.leases
        if leases is not None and leases.busy(database, lease):  # another client's turn
            return CommitResult(False, self._get_root(database), wait=True)
        result = self.storage.commit(
            self.tenant,
            database,
            expected_seq=expected_seq,
            root=root,
            blobs=blobs,
            garbage=garbage,
            staged=staged,
        )
        if result.ok and lease is not None and leases is not None:
            leases.release(database, lease)
        return result

    def _acquire_lease(self, database: str) -> tuple[object | None, RootRecord] | None:
        if self.leases is None:
            return None
        token = self.leases.acquire(database)
        return token, self._get_root(database)  # read in our turn: the one to replay on

    def _release_lease(self, database: str, token: object) -> None:
        if self.leases is not None:
            self.leases.release(database, token)

    def _stage(self, database: str, chunks: list[dict[bytes, bytes]]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = []
        for chunk in chunks:
            try:
                self.storage.stage(self.tenant, database, chunk)
            except REFUSALS as exc:
                outcomes.append(exc)
                break
            outcomes.append(None)
        return outcomes

    def _allocate_ids(self, database: str, sequence: str, count: int) -> int:
        return self.storage.allocate_ids(self.tenant, database, sequence, count)

    def _get_keyring(self, database: str, name: str) -> bytes | None:
        return self.storage.get_keyring(self.tenant, database, name)

    def _put_keyring(
        self, database: str, name: str, data: bytes, *, expected: bytes | None
    ) -> bool:
        return self.storage.put_keyring(self.tenant, database, name, data, expected=expected)

    def collect_garbage(self, retention: float) -> int:
        """Delete blobs replaced more than ``retention`` seconds ago, and staged blobs no
        commit claimed within the storage's default staging timeout (a process that died
        mid-commit). A server does this by itself; an embedded store has nobody else to
        do it, so the client does. A retention shorter than any used before becomes the
        one snapshots are judged by (``Transport.garbage_retention``)."""
        self.garbage_retention = min(self.garbage_retention, retention)
        return self.storage.collect_garbage(retention=retention)

    def close(self) -> None:
        if self.leases is not None:
            self.leases.close()
        self.storage.close()


def open_local_transport(url: str, *, delay: float = 0.0) -> LocalTransport:
    """Open ``memory://`` or ``sqlite:///path`` as an embedded store.

    ``blob_server.storage.open_storage`` is the one thing of the server package besides
    ``blob_server.wire`` that the client imports: an embedded store *is* a storage backend,
    running in this process on a file this process owns, so there is no trust boundary
    to keep; the factory is imported here, on first use, and nowhere else.
    """
    from blob_server.storage import open_storage

    try:
        storage = open_storage(url)
    except StorageError as exc:
        raise StoreUnavailableError(f"cannot open store {url!r}: {exc}") from exc
    return LocalTransport(storage, delay=delay)
