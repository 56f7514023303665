"""The storage interface shared by the embedded store and the blob server.

Storage is deliberately dumb and untrusted: it keeps opaque blobs by id, one mutable root
record per (tenant, database), a few mutable keyring slots, and integer id counters. It
never sees a key or a plaintext, and nothing here imports zerodb_core's crypto.

Every method takes ``tenant`` first. In the embedded store the tenant is a constant; in the
blob server it always comes from the authenticated session, never from the request.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

BLOB_ID_SIZE = 16
DEFAULT_RETENTION_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class RootRecord:
    """The one mutable thing of a database: an opaque (encrypted) root and its ``seq``.

    ``seq`` is 0 and ``data`` is empty for a database that has never been committed to.
    """

    seq: int
    data: bytes


EMPTY_ROOT = RootRecord(0, b"")


@dataclass(frozen=True, slots=True)
class CommitResult:
    """Outcome of :meth:`Storage.commit`.

    ``ok`` is True when the commit was applied; ``root`` is then the new root. On a conflict
    ``ok`` is False and ``root`` is the current root, so the client can rebase without
    another round trip.
    """

    ok: bool
    root: RootRecord


class Storage(abc.ABC):
    """Write-once blobs, one root per database, atomic commits, id blocks, garbage.

    Implementations must make :meth:`commit` atomic: either every new blob is written, the
    root is swapped and the garbage recorded, or nothing changes.
    """

    @abc.abstractmethod
    def get_blobs(self, tenant: str, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """Return the blobs with these ids; ids that do not exist are absent from the result."""

    @abc.abstractmethod
    def get_root(self, tenant: str, database: str) -> RootRecord:
        """Return the current root (``EMPTY_ROOT`` if the database has none yet)."""

    @abc.abstractmethod
    def commit(
        self,
        tenant: str,
        database: str,
        *,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: Iterable[bytes] = (),
    ) -> CommitResult:
        """Atomically write ``blobs``, set the root to ``root`` with ``seq = expected_seq + 1``
        and record ``garbage`` (ids the new root no longer reaches), if the current seq is
        ``expected_seq``. Otherwise change nothing and return the current root.

        Raises ``BlobExistsError`` (changing nothing) if any new blob id already exists.
        """

    @abc.abstractmethod
    def allocate_ids(self, tenant: str, database: str, sequence: str, count: int) -> int:
        """Reserve ``count`` consecutive integers of the named counter; return the first.

        Counters start at 1. ``sequence`` is an opaque name chosen by the client.
        """

    @abc.abstractmethod
    def get_keyring(self, tenant: str, database: str, name: str) -> bytes | None:
        """Return the keyring slot ``name`` (an opaque wrapped key blob), or None."""

    @abc.abstractmethod
    def put_keyring(
        self, tenant: str, database: str, name: str, data: bytes, *, expected: bytes | None
    ) -> bool:
        """Set keyring slot ``name`` to ``data`` if it currently holds ``expected``
        (None: the slot must be empty). Return whether it was set."""

    @abc.abstractmethod
    def collect_garbage(self, *, retention: float = DEFAULT_RETENTION_SECONDS) -> int:
        """Delete blobs that became garbage more than ``retention`` seconds ago; return
        how many were deleted."""

    @abc.abstractmethod
    def stats(self, tenant: str, database: str) -> dict[str, int]:
        """Return at least ``seq``, ``blobs``, ``bytes`` and ``garbage`` (pending) counts."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing to free
        """Release resources (files, connections)."""
