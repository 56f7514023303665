"""The in-process storage backend: plain dicts behind one lock.

It is the reference implementation the other backends are tested against (the same test
suite runs on all of them), and the store behind ``memory://``. One lock for everything is
simple and obviously atomic; contention does not matter for tests and demos.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from blob_server.exceptions import BlobExistsError, NotStagedError
from blob_server.storage import validation as v
from blob_server.storage.base import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STAGING_TIMEOUT,
    EMPTY_ROOT,
    NO_QUOTA,
    VOLATILE,
    CommitResult,
    DatabaseUsage,
    Durability,
    Quota,
    RootRecord,
    Storage,
    TenantUsage,
)


@dataclass(slots=True)
class _Database:
    """Everything stored for one (tenant, database)."""

    root: RootRecord = EMPTY_ROOT
    blobs: dict[bytes, bytes] = field(default_factory=dict)  # live and pending
    garbage: dict[bytes, float] = field(default_factory=dict)  # id -> time it became garbage
    pending: dict[bytes, float] = field(default_factory=dict)  # staged id -> time staged
    counters: dict[str, int] = field(default_factory=dict)  # name -> next free value
    keyrings: dict[str, bytes] = field(default_factory=dict)


class MemoryStorage(Storage):
    """Keep everything in dicts; nothing survives the process.

    ``clock`` returns the current time in seconds; tests inject a fake one to drive
    garbage collection without sleeping.
    """

    inline = True  # no I/O: the server's reads and commits run on its event loop

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._databases: dict[tuple[str, str], _Database] = {}
        self._usage: dict[str, list[int]] = {}  # tenant -> [blobs, bytes] (see base)

    def _add_usage(self, tenant: str, blobs: int, size: int) -> None:
        usage = self._usage.setdefault(tenant, [0, 0])
        usage[0] += blobs
        usage[1] += size

    def _used(self, tenant: str) -> tuple[int, int]:
        blobs, size = self._usage.get(tenant, (0, 0))
        return blobs, size

    def _peek(self, tenant: str, database: str) -> _Database | None:
        """Return the database's state without creating it (reads must not create)."""
        return self._databases.get(v.check_scope(tenant, database))

    def _state(self, tenant: str, database: str) -> _Database:
        """Return the database's state, creating it on first write."""
        return self._databases.setdefault(v.check_scope(tenant, database), _Database())

    def get_blobs(self, tenant: str, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """Return the blobs with these ids; missing ids are absent."""
        wanted = v.check_ids(ids)
        with self._lock:
            db = self._peek(tenant, database)
            if db is None:
                return {}
            blobs = db.blobs
            return {i: blobs[i] for i in wanted if i in blobs}

    def get_root(self, tenant: str, database: str) -> RootRecord:
        """Return the current root, ``EMPTY_ROOT`` for a database never committed to."""
        with self._lock:
            db = self._peek(tenant, database)
            return EMPTY_ROOT if db is None else db.root

    def root_marker(self, tenant: str, database: str) -> int:
        """The root's seq: in this process's memory, reading it is free and exact."""
        return self.get_root(tenant, database).seq

    def commit(
        self,
        tenant: str,
        database: str,
        *,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: Iterable[bytes] = (),
        quota: Quota = NO_QUOTA,
        staged: Sequence[bytes] = (),
    ) -> CommitResult:
        """Write blobs, make the staged ones live, swap the root and record garbage, or
        change nothing (see base)."""
        v.check_scope(tenant, database)
        seq, root_data, pairs, dead, claimed = v.check_commit(
            expected_seq, root, blobs, garbage, staged
        )
        with self._lock:
            db = self._state(tenant, database)
            if db.root.seq != seq:
                return CommitResult(False, db.root)
            self._check_new(db, pairs)
            for blob_id in claimed:
                if blob_id not in db.pending:
                    raise NotStagedError(f"blob {blob_id.hex()} is not staged")
            added = sum(len(data) for _, data in pairs) + len(root_data) - len(db.root.data)
            quota.check(tenant, *self._used(tenant), len(pairs), added)
            self._add_usage(tenant, len(pairs), added)
            db.blobs.update(pairs)
            for blob_id in claimed:
                del db.pending[blob_id]
            now = self._clock()
            for blob_id in dead:
                db.pending.pop(blob_id, None)  # a pending blob named garbage is released
                db.garbage.setdefault(blob_id, now)
            db.root = RootRecord(seq + 1, root_data)
            self._announce(tenant, database, db.root.seq)
            return CommitResult(True, db.root)

    def stage(
        self,
        tenant: str,
        database: str,
        blobs: Mapping[bytes, bytes],
        *,
        quota: Quota = NO_QUOTA,
    ) -> None:
        """Write blobs as pending, or change nothing (see base)."""
        v.check_scope(tenant, database)
        pairs = v.check_blobs(blobs)
        if not pairs:
            return
        with self._lock:
            db = self._state(tenant, database)
            self._check_new(db, pairs)
            added = sum(len(data) for _, data in pairs)
            quota.check(tenant, *self._used(tenant), len(pairs), added)
            self._add_usage(tenant, len(pairs), added)
            db.blobs.update(pairs)
            now = self._clock()
            db.pending.update((blob_id, now) for blob_id, _ in pairs)

    @staticmethod
    def _check_new(db: _Database, pairs: list[tuple[bytes, bytes]]) -> None:
        """Raise ``BlobExistsError`` if a new blob's id is taken (live or pending)."""
        for blob_id, _ in pairs:
            if blob_id in db.blobs:
                raise BlobExistsError(f"blob {blob_id.hex()} already exists")

    def allocate_ids(self, tenant: str, database: str, sequence: str, count: int) -> int:
        """Reserve ``count`` consecutive integers of ``sequence``; return the first."""
        v.check_scope(tenant, database)
        v.check_name(sequence, "sequence")
        v.check_int(count, "count", low=1, high=v.MAX_ALLOCATE)
        with self._lock:
            counters = self._state(tenant, database).counters
            first = counters.get(sequence, 1)
            counters[sequence] = first + count
            return first

    def get_keyring(self, tenant: str, database: str, name: str) -> bytes | None:
        """Return keyring slot ``name`` or None."""
        v.check_name(name, "keyring name")
        with self._lock:
            db = self._peek(tenant, database)
            return None if db is None else db.keyrings.get(name)

    def put_keyring(
        self,
        tenant: str,
        database: str,
        name: str,
        data: bytes,
        *,
        expected: bytes | None,
        quota: Quota = NO_QUOTA,
    ) -> bool:
        """Set keyring slot ``name`` if it holds ``expected``; return whether it was set."""
        v.check_scope(tenant, database)
        v.check_name(name, "keyring name")
        v.check_data(data, "keyring data")
        if expected is not None:
            v.check_data(expected, "expected keyring data")
        with self._lock:
            keyrings = self._state(tenant, database).keyrings
            if keyrings.get(name) != expected:
                return False
            added = len(data) - len(expected or b"")
            quota.check(tenant, *self._used(tenant), 0, added)
            self._add_usage(tenant, 0, added)
            keyrings[name] = data
            return True

    def collect_garbage(
        self,
        *,
        retention: float = DEFAULT_RETENTION_SECONDS,
        staging_timeout: float = DEFAULT_STAGING_TIMEOUT,
    ) -> int:
        """Delete blobs that became garbage at least ``retention`` seconds ago and pending
        blobs staged at least ``staging_timeout`` seconds ago."""
        now = self._clock()
        cutoff = now - v.check_retention(retention)
        stale = now - v.check_retention(staging_timeout, "staging_timeout")
        deleted = 0
        with self._lock:
            for (tenant, _), db in self._databases.items():
                for since_by_id, limit in ((db.garbage, cutoff), (db.pending, stale)):
                    due = [i for i, since in since_by_id.items() if since <= limit]
                    for blob_id in due:
                        del since_by_id[blob_id]
                        data = db.blobs.pop(blob_id, None)
                        if data is not None:
                            deleted += 1
                            self._add_usage(tenant, -1, -len(data))
        return deleted

    def durability(self) -> Durability:
        """Volatile: everything lives in this process and goes with it."""
        return Durability(VOLATILE, "memory:// keeps everything in the process: a restart loses it")

    def stats(self, tenant: str, database: str) -> dict[str, int]:
        """Return seq, blob count, blob bytes, garbage, staged, counters and keyrings."""
        with self._lock:
            db = self._peek(tenant, database) or _Database()
            return {
                "seq": db.root.seq,
                "blobs": len(db.blobs),
                "bytes": sum(map(len, db.blobs.values())),
                "garbage": len(db.garbage),
                "staged": len(db.pending),
                "counters": len(db.counters),
                "keyrings": len(db.keyrings),
            }

    def usage(self, tenant: str, *, detail: bool = False) -> TenantUsage:
        """Return the tenant's maintained usage (and, if asked, each database's)."""
        v.check_name(tenant, "tenant")
        with self._lock:
            blobs, size = self._used(tenant)
            mine = sorted(
                (database, db)
                for (owner, database), db in self._databases.items()
                if owner == tenant and (db.root.seq or db.keyrings or db.pending)
            )
            per_database = tuple(
                DatabaseUsage(
                    database,
                    db.root.seq,
                    len(db.blobs),
                    sum(map(len, db.blobs.values())),
                    len(db.garbage),
                    len(db.pending),
                )
                for database, db in mine
                if detail
            )
            return TenantUsage(blobs, size, len(mine), per_database)

    def tenant_names(self) -> list[str]:
        """Return every tenant that wrote something, sorted."""
        with self._lock:
            return sorted({tenant for tenant, _ in self._databases})
