"""The embedded storage backend: one SQLite file, one row per blob.

Why it looks the way it does:

* **WAL mode** lets readers run while one writer commits, across threads and processes.
* **synchronous=FULL** by default: WAL + NORMAL already survives a *process* crash, but can
  lose the last commits on power loss or an OS crash. A lost acknowledged commit is worse
  here than elsewhere: the client remembers the highest ``seq`` it has seen and treats a
  lower one as a rollback attack, so durability loss would surface as a security alarm.
  FULL costs one fsync per commit, which is small next to a commit of hundreds of blobs.
* **One connection per thread** (created lazily, re-created after ``fork``): SQLite's own
  file locks then serialise writers the same way for threads and processes, readers never
  wait on a Python lock, and no connection is ever shared between threads.
* **BEGIN IMMEDIATE** for every write takes the write lock up front, so two writers never
  deadlock upgrading a read lock; the busy timeout makes the loser wait instead of failing.
* **Scopes**: each (tenant, database) gets a small integer id; every other row is keyed by
  it, so tenants and databases cannot see each other's blobs, counters or keyrings, and the
  blob index stays small (an int and 16 bytes per row, not two strings).
* **Usage** per tenant (blobs; bytes of blobs, roots and keyrings) is one row of
  ``usage``, updated in the transaction of every write and garbage collection, so a quota
  check reads one row instead of summing the tenant's blobs. Schema version 2 added it;
  a version 1 file gets the table filled from its data when it is first opened.
* **Staged blobs** are rows of ``blobs`` like any other, plus a row of ``staged`` (scope,
  id, time staged) while they are pending. Schema version 3 added the table; an older
  file gets it, empty, when first opened (older code refuses a version 3 file, which it
  would otherwise leave pending blobs in for ever).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from blob_server.exceptions import BlobExistsError, NotStagedError, StorageUnavailableError
from blob_server.storage import validation as v
from blob_server.storage.base import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STAGING_TIMEOUT,
    DURABLE,
    EMPTY_ROOT,
    NO_QUOTA,
    OS_FLUSH,
    CommitResult,
    DatabaseUsage,
    Durability,
    Quota,
    RootRecord,
    Storage,
    TenantUsage,
)

SCHEMA_VERSION = 3

# Blobs are rowid tables on purpose: WITHOUT ROWID is meant for small rows, and 16 KiB
# blobs would bloat the primary key b-tree. The (scope, id) primary key is the lookup index.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS scopes (
    scope INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    database TEXT NOT NULL,
    UNIQUE (tenant, database)
);
CREATE TABLE IF NOT EXISTS blobs (
    scope INTEGER NOT NULL,
    id BLOB NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (scope, id)
);
CREATE TABLE IF NOT EXISTS roots (
    scope INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    committed REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS keyrings (
    scope INTEGER NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    scope INTEGER NOT NULL,
    name TEXT NOT NULL,
    next INTEGER NOT NULL,
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS garbage (
    scope INTEGER NOT NULL,
    id BLOB NOT NULL,
    since REAL NOT NULL,
    PRIMARY KEY (scope, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS garbage_since ON garbage (since);
CREATE TABLE IF NOT EXISTS staged (
    scope INTEGER NOT NULL,
    id BLOB NOT NULL,
    since REAL NOT NULL,
    PRIMARY KEY (scope, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS staged_since ON staged (since);
CREATE TABLE IF NOT EXISTS usage (
    tenant TEXT PRIMARY KEY,
    blobs INTEGER NOT NULL,
    bytes INTEGER NOT NULL
) WITHOUT ROWID;
"""

# Version 1 -> 2: count what each tenant already stores (blobs, and bytes of blobs, roots
# and keyrings), once, in the transaction that creates the table.
_FILL_USAGE = """
INSERT INTO usage (tenant, blobs, bytes)
SELECT tenant, sum(n), sum(size) FROM (
    SELECT s.tenant AS tenant, count(*) AS n, coalesce(sum(length(b.data)), 0) AS size
        FROM blobs b JOIN scopes s ON s.scope = b.scope GROUP BY s.tenant
    UNION ALL
    SELECT s.tenant, 0, length(r.data) FROM roots r JOIN scopes s ON s.scope = r.scope
    UNION ALL
    SELECT s.tenant, 0, length(k.data) FROM keyrings k JOIN scopes s ON s.scope = k.scope
) GROUP BY tenant
"""
_ADD_USAGE = (
    "INSERT INTO usage (tenant, blobs, bytes) VALUES (?, ?, ?) ON CONFLICT (tenant) "
    "DO UPDATE SET blobs = blobs + excluded.blobs, bytes = bytes + excluded.bytes"
)

# get_blobs pads each IN (...) list to one of these sizes (repeating an id is harmless), so
# the statement cache holds a handful of prepared statements instead of one per batch size.
# 512 is far below SQLite's variable limit (999 before 3.32, 32766 after).
_IN_SIZES = (1, 4, 16, 64, 128, 256, 512)
_GC_BATCH = 5_000  # rows per GC transaction: keeps the write lock short for committers
_SYNCHRONOUS = ("FULL", "NORMAL")


def _in_size(n: int) -> int:
    """Return the smallest padded IN-list size that holds ``n`` ids."""
    return next(size for size in _IN_SIZES if size >= n)


class SQLiteStorage(Storage):
    """Store blobs, roots, keyrings, counters and garbage in one SQLite file.

    ``timeout`` is how long a writer waits for the write lock before giving up with
    ``StorageUnavailableError``. ``clock`` returns the current time in seconds (tests
    inject a fake one). ``synchronous`` is ``"FULL"`` (durable across power loss) or
    ``"NORMAL"`` (durable across process crashes only).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        synchronous: str = "FULL",
    ) -> None:
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, not {synchronous!r}")
        self.path = os.fspath(path)
        self._timeout = timeout
        self._clock = clock
        self._synchronous = synchronous
        self._local = threading.local()
        self._connections: list[tuple[int, sqlite3.Connection]] = []  # (pid, connection)
        self._connections_lock = threading.Lock()
        self._scopes: dict[tuple[str, str], int] = {}  # scope rows are never deleted
        # Write transactions begun through this object (see root_marker).
        self._writes = 0
        self._writes_lock = threading.Lock()
        self._closed = False
        try:
            with self._errors():
                self._create_schema(self._connection())
        except BaseException:
            self.close()
            raise

    # -- connections and transactions -------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """Return this thread's connection, opening it on first use (or after a fork)."""
        if self._closed:
            raise StorageUnavailableError(f"storage {self.path} is closed")
        conn = getattr(self._local, "conn", None)
        pid = os.getpid()
        if conn is not None and self._local.pid == pid:
            return conn
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, the module never does.
        # check_same_thread=False only so close() can close every thread's connection;
        # each connection is still used by the one thread that opened it.
        conn = sqlite3.connect(
            self.path,
            timeout=self._timeout,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=256,
        )
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        self._local.conn, self._local.pid = conn, pid
        with self._connections_lock:
            self._connections.append((pid, conn))
        return conn

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        """Switch to WAL and create the tables, refusing files from a newer version."""
        if conn.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() != "wal":
            raise StorageUnavailableError(f"{self.path}: cannot switch to WAL mode")
        with self._write() as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StorageUnavailableError(
                    f"{self.path} has schema version {version}; this code knows "
                    f"{SCHEMA_VERSION} and will not touch it"
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    c.execute(statement)
            if version < 2:  # a new file (nothing to count) or one from before quotas
                c.execute(_FILL_USAGE)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn SQLite's operational errors (locked, I/O, corrupt) into StorageUnavailable."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StorageUnavailableError(f"{self.path}: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """Run the block in a BEGIN IMMEDIATE transaction; roll back on any exception."""
        conn = self._connection()
        with self._writes_lock:
            self._writes += 1
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if conn.in_transaction:  # the block may have rolled back on purpose (conflict)
            try:
                conn.execute("COMMIT")
            except BaseException:
                # COMMIT can fail (disk full, I/O error); never leave the thread's
                # connection inside an open transaction holding the write lock.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _scope(self, conn: sqlite3.Connection, tenant: str, database: str) -> int | None:
        """Return the scope id of (tenant, database), or None if it was never written."""
        key = v.check_scope(tenant, database)
        scope = self._scopes.get(key)
        if scope is None:
            row = conn.execute(
                "SELECT scope FROM scopes WHERE tenant = ? AND database = ?", key
            ).fetchone()
            if row is None:
                return None
            scope = self._scopes[key] = row[0]
        return scope

    def _create_scope(self, conn: sqlite3.Connection, tenant: str, database: str) -> int:
        """Return the scope id of (tenant, database), creating it; call inside a write."""
        scope = self._scope(conn, tenant, database)
        if scope is None:
            cursor = conn.execute(
                "INSERT INTO scopes (tenant, database) VALUES (?, ?)", (tenant, database)
            )
            scope = cursor.lastrowid
            assert scope is not None
            # Not cached yet: the transaction may still roll back (see _remember_scope).
        return scope

    def _remember_scope(self, tenant: str, database: str, scope: int) -> None:
        """Cache a scope id once the transaction that created it has committed."""
        self._scopes[(tenant, database)] = scope

    # -- the Storage interface --------------------------------------------------------

    def get_blobs(self, tenant: str, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """Return the blobs with these ids; missing ids are absent.

        Reads run outside an explicit transaction: blobs are write-once, so chunks read at
        slightly different moments can only disagree about blobs garbage-collected between
        them, which a reader of a live snapshot never asks for.
        """
        wanted = v.check_ids(ids)
        found: dict[bytes, bytes] = {}
        with self._errors():
            conn = self._connection()
            scope = self._scope(conn, tenant, database)
            if scope is None or not wanted:
                return found
            step = _IN_SIZES[-1]
            for start in range(0, len(wanted), step):
                chunk = wanted[start : start + step]
                size = _in_size(len(chunk))
                chunk += [chunk[-1]] * (size - len(chunk))
                marks = ",".join("?" * size)
                found.update(
                    conn.execute(
                        f"SELECT id, data FROM blobs WHERE scope = ? AND id IN ({marks})",
                        (scope, *chunk),
                    )
                )
        return found

    def get_root(self, tenant: str, database: str) -> RootRecord:
        """Return the current root, ``EMPTY_ROOT`` for a database never committed to."""
        with self._errors():
            conn = self._connection()
            scope = self._scope(conn, tenant, database)
            if scope is None:
                return EMPTY_ROOT
            return self._read_root(conn, scope)

    def root_marker(self, tenant: str, database: str) -> tuple[int, int, int, int]:
        """This thread's connection, its ``PRAGMA data_version`` and the count of writes
        begun through this object.

        SQLite changes a connection's data_version when another connection commits
        (another thread's here, or another process's), and not for its own commits,
        which the count of writes covers (it grows before a write begins, so a write
        under way when the marker is taken changes the data_version when it commits).
        The pragma reads the shared WAL index, not the file. Any write moves the marker
        (a root swap or not): that only costs a root read.
        """
        with self._errors():
            version = self._connection().execute("PRAGMA data_version").fetchone()[0]
        return os.getpid(), threading.get_ident(), version, self._writes

    @staticmethod
    def _read_root(conn: sqlite3.Connection, scope: int) -> RootRecord:
        row = conn.execute("SELECT seq, data FROM roots WHERE scope = ?", (scope,)).fetchone()
        return EMPTY_ROOT if row is None else RootRecord(row[0], row[1])

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
        """Write blobs, make the staged ones live, swap the root and record garbage in one
        transaction (see base).

        The seq is checked first, so a stale commit is answered with the current root even
        if it also repeats an existing blob id.
        """
        tenant, database = v.check_scope(tenant, database)
        seq, root_data, pairs, dead, claimed = v.check_commit(
            expected_seq, root, blobs, garbage, staged
        )
        with self._errors(), self._write() as conn:
            scope = self._create_scope(conn, tenant, database)
            current = self._read_root(conn, scope)
            if current.seq != seq:
                conn.execute("ROLLBACK")
                return CommitResult(False, current)
            self._insert_blobs(conn, scope, pairs)
            if claimed:
                done = conn.executemany(
                    "DELETE FROM staged WHERE scope = ? AND id = ?",
                    [(scope, blob_id) for blob_id in claimed],
                ).rowcount
                if done != len(claimed):
                    conn.execute("ROLLBACK")
                    missing = self._first(conn, "staged", scope, claimed, present=False)
                    raise NotStagedError(f"blob {missing} is not staged")
            added = sum(len(data) for _, data in pairs) + len(root_data) - len(current.data)
            self._count(conn, tenant, quota, len(pairs), added)  # may raise: rolled back
            now = self._clock()
            conn.execute(
                "INSERT INTO roots (scope, seq, data, committed) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (scope) DO UPDATE SET "
                "seq = excluded.seq, data = excluded.data, committed = excluded.committed",
                (scope, seq + 1, root_data, now),
            )
            if dead:
                if conn.execute(
                    "SELECT 1 FROM staged WHERE scope = ? LIMIT 1", (scope,)
                ).fetchone():
                    # A pending blob named garbage is released (collected after retention).
                    conn.executemany(
                        "DELETE FROM staged WHERE scope = ? AND id = ?",
                        [(scope, blob_id) for blob_id in dead],
                    )
                conn.executemany(
                    "INSERT OR IGNORE INTO garbage (scope, id, since) VALUES (?, ?, ?)",
                    [(scope, blob_id, now) for blob_id in dead],
                )
        self._remember_scope(tenant, database, scope)
        self._announce(tenant, database, seq + 1)
        return CommitResult(True, RootRecord(seq + 1, root_data))

    def stage(
        self,
        tenant: str,
        database: str,
        blobs: Mapping[bytes, bytes],
        *,
        quota: Quota = NO_QUOTA,
    ) -> None:
        """Write blobs and their ``staged`` rows in one transaction (see base)."""
        tenant, database = v.check_scope(tenant, database)
        pairs = v.check_blobs(blobs)
        if not pairs:
            return
        with self._errors(), self._write() as conn:
            scope = self._create_scope(conn, tenant, database)
            self._insert_blobs(conn, scope, pairs)
            self._count(conn, tenant, quota, len(pairs), sum(len(data) for _, data in pairs))
            now = self._clock()
            conn.executemany(
                "INSERT INTO staged (scope, id, since) VALUES (?, ?, ?)",
                [(scope, blob_id, now) for blob_id, _ in pairs],
            )
        self._remember_scope(tenant, database, scope)

    def _insert_blobs(
        self, conn: sqlite3.Connection, scope: int, pairs: list[tuple[bytes, bytes]]
    ) -> None:
        """Insert new blobs (inside a write); an id already taken rolls back and raises
        ``BlobExistsError``."""
        try:
            conn.executemany(
                "INSERT INTO blobs (scope, id, data) VALUES (?, ?, ?)",
                [(scope, blob_id, data) for blob_id, data in pairs],
            )
        except sqlite3.IntegrityError:
            # Roll back first: the failed INSERT may have written some of our own rows,
            # which would otherwise be mistaken for the colliding ones.
            conn.execute("ROLLBACK")
            existing = self._first(conn, "blobs", scope, [i for i, _ in pairs], present=True)
            raise BlobExistsError(f"blob {existing} already exists") from None

    @staticmethod
    def _count(conn: sqlite3.Connection, tenant: str, quota: Quota, blobs: int, size: int) -> None:
        """Check ``quota`` against the tenant's usage and add to it (inside a write)."""
        if not quota.unlimited:
            row = conn.execute(
                "SELECT blobs, bytes FROM usage WHERE tenant = ?", (tenant,)
            ).fetchone()
            quota.check(tenant, *(row or (0, 0)), blobs, size)
        if blobs or size:
            conn.execute(_ADD_USAGE, (tenant, blobs, size))

    @staticmethod
    def _first(
        conn: sqlite3.Connection, table: str, scope: int, ids: list[bytes], *, present: bool
    ) -> str:
        """Name the first id that is (or is not) in ``table``, for the error message of a
        transaction already rolled back."""
        for blob_id in ids:
            found = conn.execute(
                f"SELECT 1 FROM {table} WHERE scope = ? AND id = ?", (scope, blob_id)
            ).fetchone()
            if bool(found) == present:
                return blob_id.hex()
        return "?"  # pragma: no cover - the failed statement implies one

    def allocate_ids(self, tenant: str, database: str, sequence: str, count: int) -> int:
        """Reserve ``count`` consecutive integers of ``sequence``; return the first."""
        tenant, database = v.check_scope(tenant, database)
        v.check_name(sequence, "sequence")
        v.check_int(count, "count", low=1, high=v.MAX_ALLOCATE)
        with self._errors(), self._write() as conn:
            scope = self._create_scope(conn, tenant, database)
            (after,) = conn.execute(
                "INSERT INTO counters (scope, name, next) VALUES (?, ?, 1 + ?) "
                "ON CONFLICT (scope, name) DO UPDATE SET next = next + excluded.next - 1 "
                "RETURNING next",
                (scope, sequence, count),
            ).fetchone()
        self._remember_scope(tenant, database, scope)
        return after - count

    def get_keyring(self, tenant: str, database: str, name: str) -> bytes | None:
        """Return keyring slot ``name`` or None."""
        v.check_name(name, "keyring name")
        with self._errors():
            conn = self._connection()
            scope = self._scope(conn, tenant, database)
            if scope is None:
                return None
            row = conn.execute(
                "SELECT data FROM keyrings WHERE scope = ? AND name = ?", (scope, name)
            ).fetchone()
        return None if row is None else row[0]

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
        tenant, database = v.check_scope(tenant, database)
        v.check_name(name, "keyring name")
        v.check_data(data, "keyring data")
        if expected is not None:
            v.check_data(expected, "expected keyring data")
        with self._errors(), self._write() as conn:
            scope = self._create_scope(conn, tenant, database)
            row = conn.execute(
                "SELECT data FROM keyrings WHERE scope = ? AND name = ?", (scope, name)
            ).fetchone()
            if (None if row is None else row[0]) != expected:
                conn.execute("ROLLBACK")
                return False
            self._count(conn, tenant, quota, 0, len(data) - len(expected or b""))
            conn.execute(
                "INSERT INTO keyrings (scope, name, data) VALUES (?, ?, ?) "
                "ON CONFLICT (scope, name) DO UPDATE SET data = excluded.data",
                (scope, name, data),
            )
        self._remember_scope(tenant, database, scope)
        return True

    def collect_garbage(
        self,
        *,
        retention: float = DEFAULT_RETENTION_SECONDS,
        staging_timeout: float = DEFAULT_STAGING_TIMEOUT,
    ) -> int:
        """Delete blobs that became garbage at least ``retention`` seconds ago and pending
        blobs staged at least ``staging_timeout`` seconds ago.

        Works in batches of a few thousand rows, one short transaction each, so commits
        from other processes are not held up behind a large collection.
        """
        now = self._clock()
        cutoff = now - v.check_retention(retention)
        stale = now - v.check_retention(staging_timeout, "staging_timeout")
        with self._errors():
            return self._collect("garbage", cutoff) + self._collect("staged", stale)

    def _collect(self, table: str, cutoff: float) -> int:
        """Delete the blobs whose row in ``table`` (garbage or staged) is older than
        ``cutoff``, with those rows; return how many blobs were deleted."""
        deleted = 0
        while True:
            with self._write() as conn:
                # The size of each due blob (NULL if it does not exist) and its tenant,
                # so usage goes down in the same transaction as the blobs.
                rows = conn.execute(
                    f"SELECT t.scope, t.id, length(b.data), s.tenant FROM {table} t "
                    "JOIN scopes s ON s.scope = t.scope "
                    "LEFT JOIN blobs b ON b.scope = t.scope AND b.id = t.id "
                    "WHERE t.since <= ? LIMIT ?",
                    (cutoff, _GC_BATCH),
                ).fetchall()
                due = [(scope, blob_id) for scope, blob_id, _, _ in rows]
                freed: dict[str, list[int]] = {}  # tenant -> [blobs, bytes]
                for _, _, size, tenant in rows:
                    if size is not None:
                        counts = freed.setdefault(tenant, [0, 0])
                        counts[0] += 1
                        counts[1] += size
                conn.executemany("DELETE FROM blobs WHERE scope = ? AND id = ?", due)
                conn.executemany(f"DELETE FROM {table} WHERE scope = ? AND id = ?", due)
                conn.executemany(
                    _ADD_USAGE, [(tenant, -n, -size) for tenant, (n, size) in freed.items()]
                )
                deleted += sum(n for n, _ in freed.values())
            if len(due) < _GC_BATCH:
                return deleted

    def durability(self) -> Durability:
        """Durable with synchronous=FULL (the default: WAL and an fsync per commit);
        with NORMAL a crash of the machine may lose the last commits."""
        if self._synchronous == "FULL":
            return Durability(DURABLE, f"SQLite {self.path} with synchronous=FULL")
        return Durability(
            OS_FLUSH,
            f"SQLite {self.path} with synchronous={self._synchronous}: the last "
            "commits before a crash of the machine may be lost",
        )

    def stats(self, tenant: str, database: str) -> dict[str, int]:
        """Return seq, blob count, blob bytes, garbage, staged, counters and keyrings.

        Counts are computed, not maintained: O(blobs of the database), meant for
        dashboards and tests, not for every request.
        """
        result = dict.fromkeys(
            ("seq", "blobs", "bytes", "garbage", "staged", "counters", "keyrings"), 0
        )
        with self._errors():
            conn = self._connection()
            scope = self._scope(conn, tenant, database)
            if scope is None:
                return result
            conn.execute("BEGIN")  # one snapshot for all the counts
            try:
                result["seq"] = self._read_root(conn, scope).seq
                result["blobs"], result["bytes"] = conn.execute(
                    "SELECT count(*), coalesce(sum(length(data)), 0) FROM blobs WHERE scope = ?",
                    (scope,),
                ).fetchone()
                for table in ("garbage", "staged", "counters", "keyrings"):
                    (result[table],) = conn.execute(
                        f"SELECT count(*) FROM {table} WHERE scope = ?", (scope,)
                    ).fetchone()
            finally:
                conn.execute("COMMIT")
        return result

    def usage(self, tenant: str, *, detail: bool = False) -> TenantUsage:
        """Return the tenant's usage row; with ``detail``, each database's figures (these
        are computed: O(blobs of the tenant), for the admin's ``stats``, not per request)."""
        v.check_name(tenant, "tenant")
        per_database: list[DatabaseUsage] = []
        with self._errors():
            conn = self._connection()
            conn.execute("BEGIN")  # one snapshot for all the figures
            try:
                row = conn.execute(
                    "SELECT blobs, bytes FROM usage WHERE tenant = ?", (tenant,)
                ).fetchone()
                scopes = conn.execute(
                    "SELECT scope, database FROM scopes s WHERE tenant = ? AND ("
                    "EXISTS (SELECT 1 FROM roots r WHERE r.scope = s.scope) OR "
                    "EXISTS (SELECT 1 FROM keyrings k WHERE k.scope = s.scope) OR "
                    "EXISTS (SELECT 1 FROM staged t WHERE t.scope = s.scope)) "
                    "ORDER BY database",
                    (tenant,),
                ).fetchall()
                for scope, database in scopes if detail else ():
                    blobs, size = conn.execute(
                        "SELECT count(*), coalesce(sum(length(data)), 0) FROM blobs "
                        "WHERE scope = ?",
                        (scope,),
                    ).fetchone()
                    garbage, staged = (
                        conn.execute(
                            f"SELECT count(*) FROM {table} WHERE scope = ?", (scope,)
                        ).fetchone()[0]
                        for table in ("garbage", "staged")
                    )
                    seq = self._read_root(conn, scope).seq
                    per_database.append(DatabaseUsage(database, seq, blobs, size, garbage, staged))
            finally:
                conn.execute("COMMIT")
        blobs, size = row or (0, 0)
        return TenantUsage(blobs, size, len(scopes), tuple(per_database))

    def tenant_names(self) -> list[str]:
        """Return every tenant with a scope in the file, sorted."""
        with self._errors():
            rows = self._connection().execute("SELECT DISTINCT tenant FROM scopes ORDER BY 1")
            return [tenant for (tenant,) in rows]

    def close(self) -> None:
        """Close every connection this object opened; later calls raise."""
        self._closed = True
        with self._connections_lock:
            connections, self._connections = self._connections, []
        pid = os.getpid()
        for owner, conn in connections:
            # A connection inherited through fork belongs to the parent: closing it here
            # could release the parent's file locks, so leave it alone.
            if owner == pid:
                conn.close()

    def __repr__(self) -> str:
        return f"SQLiteStorage({self.path!r})"
