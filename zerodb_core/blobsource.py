"""The client side of blob reads: cache first, then one batched, authenticated fetch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zerodb_core.btree import BlobRequest, node_from_payload
from zerodb_core.btree.node import Stored
from zerodb_core.cache import BlobCache
from zerodb_core.crypto import BlobKind, BlobSealer
from zerodb_core.exceptions import (
    IntegrityError,
    MissingBlobError,
    UnknownEpochError,
    ZeroDBError,
)
from zerodb_core.records import RecordBlob
from zerodb_core.retention import explain_missing
from zerodb_core.serialization import unpack
from zerodb_core.transport import Transport


def open_after_reload(sealer: BlobSealer, kind: BlobKind, blob_id: bytes, sealed: bytes) -> bytes:
    """Open a blob again after the keyring was reloaded; an epoch still unknown is a
    plain integrity failure (a forged header), like any other."""
    return sealer.open(kind, blob_id, sealed, unknown_epoch=IntegrityError)


class BlobSource:
    """Resolve blob ids to decrypted, decoded objects for one database.

    Every blob is opened with the id and kind the client expects, so a blob the server
    swapped, moved or altered fails authentication before it is decoded.
    """

    def __init__(
        self,
        transport: Transport,
        database: str,
        sealer: BlobSealer,
        cache: BlobCache,
        reload_keys: Callable[[], None] | None = None,
    ) -> None:
        self.transport = transport
        self.database = database
        self.sealer = sealer
        self.cache = cache
        # Called once when a blob names a key epoch the keyring lacks (another client
        # rotated); the blob is then opened again, and fails for good if still unknown.
        self.reload_keys = reload_keys

    def explain_missing(self, error: MissingBlobError, seq: int, taken: float) -> ZeroDBError:
        """The error a read of the snapshot at ``seq`` (in hand since ``taken``, a
        ``time.monotonic()``) raises for a missing blob: ``SnapshotTooOldError`` if the
        snapshot outlived the garbage retention, else ``error`` (see ``retention``)."""
        return explain_missing(self.transport, self.database, seq, taken, error)

    def lookup(self, blob_id: bytes) -> Any | None:
        return self.cache.get(blob_id)

    def fetch(self, requests: Sequence[BlobRequest]) -> dict[BlobRequest, Any]:
        ids = [r if isinstance(r, bytes) else r[0] for r in requests]
        found = self.transport.get_blobs(self.database, ids)
        out: dict[BlobRequest, Any] = {}
        for request, blob_id in zip(requests, ids):
            sealed = found.get(blob_id)
            if sealed is None:
                raise MissingBlobError(blob_id)
            kind = BlobKind.NODE if isinstance(request, bytes) else request[1]
            try:
                payload = self.sealer.open(kind, blob_id, sealed)
            except UnknownEpochError:
                if self.reload_keys is None:
                    raise
                self.reload_keys()
                payload = open_after_reload(self.sealer, kind, blob_id, sealed)
            obj: Stored | RecordBlob
            if kind == BlobKind.NODE:
                obj = node_from_payload(blob_id, unpack(payload))
            else:
                obj = RecordBlob(blob_id, payload)
            self.cache.put(blob_id, obj, len(sealed))
            out[request] = obj
        return out
