"""The storage interface shared by the embedded store and the blob server.

Storage is deliberately dumb and untrusted: it keeps opaque blobs by id, one mutable root
record per (tenant, database), a few mutable keyring slots, and integer id counters. It
never sees a key or a plaintext, and nothing here imports zerodb_core's crypto.

Every method takes ``tenant`` first. In the embedded store the tenant is a constant; in the
blob server it always comes from the authenticated session, never from the request.

Usage and quotas: every backend keeps, per tenant and atomically with each write, the
number of stored blobs and the bytes stored: sealed blob bytes + current root bytes +
keyring slot bytes (everything a tenant can make grow by sending bytes; id counters are
a few dozen bytes each and are not counted). A blob counts until garbage collection
deletes it, so garbage still inside its retention window is counted. The limits are not
stored here: the server passes the tenant's ``Quota`` with each write, so changing a
quota needs no storage migration and the embedded store (no quota) pays nothing.

Staging: a transaction too large for one request is sent as several. ``stage`` writes
blobs that no root reaches yet and records them as *pending* (with the time); a later
``commit`` of the same (tenant, database) names them in ``staged`` and makes them live
atomically with its root swap. Pending blobs are stored blobs: they count toward the
quota from the moment they are staged, and ``get_blobs`` answers them by id like any
other (only the stager knows the random ids). A pending blob that no commit claims
within the staging timeout (its client died, or gave up) is deleted by
``collect_garbage``, and its usage given back; a commit that names a pending id as
garbage releases it at once (it then waits out the garbage retention like any other).

Root changes: every successful commit announces the database's new seq, and a server
process follows the databases its clients subscribed to through ``root_changes`` (one
``RootChanges`` per process, however many clients), so a commit through any process
reaches the subscribers of every process. Redis announces inside the commit script
(PUBLISH on an opaque channel, ``blob_server.storage.redis_changes``), so an
acknowledged commit has always been announced, even if its server dies right after; the
in-process backends (memory, SQLite) announce to the ``RootChanges`` of the same Python
process only (``blob_server.storage.local_changes``), as pushes always did.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from blob_server.exceptions import InvalidRequestError, QuotaExceededError

if TYPE_CHECKING:
    from blob_server.leases import CommitLeases

T = TypeVar("T")

#: ``on_change(tenant, database, seq)``: a database's root reached ``seq`` (called on the
#: event loop of the ``RootChanges``; seqs may repeat or arrive late, never wrong).
ChangeCallback = Callable[[str, str, int], None]
#: ``on_lost()``: changes may have been missed and the feed could not catch up at once;
#: whoever relied on it must read roots again (called on the event loop).
LostCallback = Callable[[], None]

BLOB_ID_SIZE = 16
DEFAULT_RETENTION_SECONDS = 600.0
#: How long a staged blob may stay pending before garbage collection deletes it: far
#: longer than any upload of one transaction, short enough that a dead client's orphans
#: do not hold a tenant's quota for long.
DEFAULT_STAGING_TIMEOUT = 3600.0
#: Largest quota: limits and usage travel through Redis' Lua as doubles, exact to 2**53.
MAX_QUOTA = 2**53


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's limits: most bytes and most blobs it may store (None: no limit).

    Only growth is checked: a write that adds nothing to a resource (a smaller root, a
    keyring of the same size) is allowed even when the tenant is over its limit (say,
    after the limit was lowered), so it can still shrink.
    """

    max_bytes: int | None = None
    max_blobs: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_blobs"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 0 <= value <= MAX_QUOTA):
                raise InvalidRequestError(f"{name} must be None or an int in [0, 2**53]")

    @property
    def unlimited(self) -> bool:
        """Whether neither resource has a limit (the storage may skip the check)."""
        return self.max_bytes is None and self.max_blobs is None

    def check(
        self, tenant: str, used_blobs: int, used_bytes: int, add_blobs: int, add_bytes: int
    ) -> None:
        """Raise ``QuotaExceededError`` if adding would take a resource past its limit."""
        if self.max_blobs is not None and add_blobs > 0 and used_blobs + add_blobs > self.max_blobs:
            raise QuotaExceededError(tenant, "blobs", used_blobs, add_blobs, self.max_blobs)
        if self.max_bytes is not None and add_bytes > 0 and used_bytes + add_bytes > self.max_bytes:
            raise QuotaExceededError(tenant, "bytes", used_bytes, add_bytes, self.max_bytes)


NO_QUOTA = Quota()


@dataclass(frozen=True, slots=True)
class DatabaseUsage:
    """What one database of a tenant holds (``Storage.usage(..., detail=True)``).

    ``label`` is the database name, except on Redis, which stores no names: there it is
    ``tag:<scope tag>``, the opaque tag in the database's key names.
    """

    label: str
    seq: int
    blobs: int
    bytes: int  # sealed blob bytes of this database (not its root or keyrings)
    garbage: int  # blobs waiting for garbage collection
    staged: int = 0  # pending blobs: staged, not yet made live by a commit


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """What a tenant stores: the figures its quota is checked against.

    ``bytes`` is sealed blobs (pending ones included) + roots + keyring slots;
    ``databases`` counts the databases with a root, a keyring slot or pending blobs;
    ``per_database`` is filled only on request (it costs one query per database, or a
    scan of the blobs on SQLite).
    """

    blobs: int
    bytes: int
    databases: int
    per_database: tuple[DatabaseUsage, ...] = ()


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
    another round trip. ``wait`` is True when the commit was not even tried because
    another client holds the database's commit lease (``blob_server.leases``): the
    client waits for its turn; a storage itself never sets it.
    """

    ok: bool
    root: RootRecord
    wait: bool = False


#: What an acknowledged commit survives (``Durability.mode``), strongest first.
#: ``durable``: it is on disk before it is acknowledged (SQLite with synchronous=FULL,
#: Redis with ``appendonly yes`` and ``appendfsync always``).
DURABLE = "durable"
#: Redis ``appendfsync everysec``: a crash of the machine (or of Redis while an fsync is
#: late) may lose the commits of about the last second (two at worst).
EVERYSEC = "everysec"
#: Redis ``appendfsync no``: the operating system writes when it likes (about 30 s on
#: Linux); a crash of Redis alone loses nothing, a crash of the machine that much.
OS_FLUSH = "os"
#: The storage keeps nothing across a restart: ``memory://``, Redis without the append-only
#: file (``appendonly no``; RDB snapshots, if any, lose everything since the last one).
VOLATILE = "volatile"
#: The storage would not say (Redis with CONFIG renamed or disabled, as managed services
#: do); the operator vouched for it with a flag.
UNVERIFIED = "unverified"
DURABILITY_MODES = (DURABLE, EVERYSEC, OS_FLUSH, VOLATILE, UNVERIFIED)


@dataclass(frozen=True, slots=True)
class Durability:
    """What an acknowledged commit survives: ``mode`` (one of ``DURABILITY_MODES``) and
    ``detail``, a sentence for operators and clients (the settings it was read from)."""

    mode: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        """The form the server tells clients at login and in ``stats``."""
        return {"mode": self.mode, "detail": self.detail}


class RootChanges(abc.ABC):
    """One server process's feed of the root changes of the databases it watches.

    Made by ``Storage.root_changes`` on the process's event loop, and used from it.
    Guarantee: once ``watch`` returned True, every later commit to that database (through
    any process sharing the storage) is delivered to ``on_change``, or ``on_lost`` is
    called; a feed that lost its connection and got it back at once delivers the current
    seq of every watched database instead (what was missed is then caught up).
    """

    @abc.abstractmethod
    async def watch(self, tenant: str, database: str) -> bool:
        """Count one more watcher of the database; return True once every later commit
        to it will be delivered, False if the feed cannot promise that now (the caller
        must then not vouch for a root). Every call is matched by one ``unwatch``."""

    @abc.abstractmethod
    def unwatch(self, tenant: str, database: str) -> None:
        """Count one watcher fewer; the last one stops the deliveries."""

    @abc.abstractmethod
    def stats(self) -> dict[str, int]:
        """Counters: ``watched`` databases, ``delivered`` changes, ``lost`` (times the feed
        lost its connection), ``caught_up`` (losses repaired by reading the seqs)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop the feed (no more callbacks)."""


class Storage(abc.ABC):
    """Write-once blobs, one root per database, atomic commits, id blocks, garbage.

    Implementations must make :meth:`commit` and :meth:`stage` atomic: either every new
    blob is written, the staged blobs made live, the root swapped and the garbage
    recorded (or every blob staged), or nothing changes.
    """

    @abc.abstractmethod
    def get_blobs(self, tenant: str, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """Return the blobs with these ids; ids that do not exist are absent from the result."""

    @abc.abstractmethod
    def get_root(self, tenant: str, database: str) -> RootRecord:
        """Return the current root (``EMPTY_ROOT`` if the database has none yet)."""

    def root_marker(self, tenant: str, database: str) -> Hashable | None:
        """A value, read without I/O, that changes whenever the root of the database may
        have changed, or None if this storage cannot tell (the default).

        An embedded client takes it before reading the root; while it stays the same,
        the root it read is still current, and its next query need not read it again
        (as a blob server's root-change pushes let a remote client skip that read).
        """
        return None

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
        quota: Quota = NO_QUOTA,
        staged: Sequence[bytes] = (),
    ) -> CommitResult:
        """Atomically write ``blobs``, make the ``staged`` blobs live (they stop being
        pending), set the root to ``root`` with ``seq = expected_seq + 1`` and record
        ``garbage`` (ids the new root no longer reaches; a pending id named there is
        released), if the current seq is ``expected_seq``. Otherwise change nothing and
        return the current root (staged blobs stay pending, so a retry can name them).

        Raises, changing nothing: ``BlobExistsError`` if any new blob id already exists
        (live or pending), then ``NotStagedError`` if a staged id is not pending for this
        (tenant, database), then ``QuotaExceededError`` if the new blobs and the growth of
        the root would take the tenant past ``quota`` (staged blobs were counted when
        staged). The seq is checked first, so a stale commit is answered with the current
        root whatever else is wrong with it.
        """

    @abc.abstractmethod
    def stage(
        self,
        tenant: str,
        database: str,
        blobs: Mapping[bytes, bytes],
        *,
        quota: Quota = NO_QUOTA,
    ) -> None:
        """Write ``blobs`` as pending: stored (and counted toward ``quota``) but reached by
        no root until a commit of the same (tenant, database) names them in ``staged``.

        Raises, changing nothing: ``BlobExistsError`` if any id already exists (live or
        pending), then ``QuotaExceededError`` if the blobs would take the tenant past
        ``quota``.
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
        self,
        tenant: str,
        database: str,
        name: str,
        data: bytes,
        *,
        expected: bytes | None,
        quota: Quota = NO_QUOTA,
    ) -> bool:
        """Set keyring slot ``name`` to ``data`` if it currently holds ``expected``
        (None: the slot must be empty). Return whether it was set.

        Raises ``QuotaExceededError`` (changing nothing) if the slot would grow the tenant
        past ``quota``'s bytes (slot names are free, so uncounted slots would be an
        unlimited store)."""

    @abc.abstractmethod
    def collect_garbage(
        self,
        *,
        retention: float = DEFAULT_RETENTION_SECONDS,
        staging_timeout: float = DEFAULT_STAGING_TIMEOUT,
    ) -> int:
        """Delete blobs that became garbage more than ``retention`` seconds ago and
        pending blobs staged more than ``staging_timeout`` seconds ago, giving their
        usage back; return how many blobs were deleted."""

    @abc.abstractmethod
    def durability(self) -> Durability:
        """What an acknowledged commit survives, read from the backend's settings; raise
        ``PersistenceUnknownError`` when the backend will not say (``StorageUnavailable
        Error`` when it cannot be reached)."""

    @abc.abstractmethod
    def stats(self, tenant: str, database: str) -> dict[str, int]:
        """Return at least ``seq``, ``blobs`` and ``bytes`` (pending blobs included),
        ``garbage`` (blobs waiting for collection) and ``staged`` (pending blobs)."""

    @abc.abstractmethod
    def usage(self, tenant: str, *, detail: bool = False) -> TenantUsage:
        """Return what ``tenant`` stores (the figures its quota is checked against), with
        one ``DatabaseUsage`` per database if ``detail``."""

    @abc.abstractmethod
    def tenant_names(self) -> list[str]:
        """Return the tenants this storage knows by name, sorted (Redis keeps no names in
        clear and returns none: the tenants file names them)."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing to free
        """Release resources (files, connections)."""

    # -- root changes ------------------------------------------------------------------------

    def root_changes(self, on_change: ChangeCallback, on_lost: LostCallback) -> RootChanges:
        """A feed of the root changes committed through this storage (call it on the event
        loop that will use it). The default hears the commits made through this storage
        object only (``blob_server.storage.local_changes``): right for memory and SQLite,
        whose other writers cannot be heard; Redis overrides it with pub/sub."""
        from blob_server.storage.local_changes import hub_of

        return hub_of(self).feed(on_change, on_lost)

    def commit_leases(self, timeout: float) -> CommitLeases:
        """The commit leases of the servers on this storage (``blob_server.leases``): in
        this process by default; shared by every process where the storage can (Redis)."""
        from blob_server.leases import MemoryCommitLeases

        return MemoryCommitLeases(timeout)

    def _announce(self, tenant: str, database: str, seq: int) -> None:
        """Tell this process's in-process feeds that a commit made the root ``seq`` (the
        in-process backends call it after each successful commit, from any thread)."""
        hub = self.__dict__.get("_root_hub")
        if hub is not None:
            hub.announce(tenant, database, seq)

    # -- the server's asynchronous path ------------------------------------------------------
    # Reads and commits are most of a server's requests. A backend with an asyncio client
    # (Redis) or no I/O at all (memory) answers them on the event loop; the default hands
    # the synchronous call to a worker thread, as the server does for every other operation
    # (the hand-off costs about 0.2 ms a request on a 2-core machine).

    #: A backend without I/O (memory) sets this: its calls run on the event loop at once.
    inline: bool = False

    async def _on_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.inline:
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def aget_blobs(
        self, tenant: str, database: str, ids: Sequence[bytes]
    ) -> dict[bytes, bytes | memoryview]:
        """:meth:`get_blobs` for an asyncio caller; a backend may answer read-only views
        instead of ``bytes`` (Redis does, to spare a copy; see ``storage.resp``)."""
        return await self._on_loop(self.get_blobs, tenant, database, ids)

    async def acommit(
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
        """:meth:`commit` for an asyncio caller."""
        return await self._on_loop(
            self.commit,
            tenant,
            database,
            expected_seq=expected_seq,
            root=root,
            blobs=blobs,
            garbage=garbage,
            quota=quota,
            staged=staged,
        )

    async def astage(
        self,
        tenant: str,
        database: str,
        blobs: Mapping[bytes, bytes],
        *,
        quota: Quota = NO_QUOTA,
    ) -> None:
        """:meth:`stage` for an asyncio caller."""
        await self._on_loop(self.stage, tenant, database, blobs, quota=quota)

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release what the asynchronous read path holds (called on the event loop)."""
