"""The client's only way to reach storage, and the place where round trips are counted.

The round trip is the unit of cost of this project (see docs/performance.md), so every
transport counts round trips, bytes sent and bytes received the same way, and can add a
fixed delay per round trip to make benchmarks show what a WAN would cost.

A commit larger than one request of the store (``Transport.limits``) is streamed: its
blobs go ahead in ``stage`` requests and the commit names them (see ``staging``). That
happens here, once for every transport, so the embedded and the remote store behave
alike and no legitimate transaction is refused for its size.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from blob_server.wire.storage import DEFAULT_RETENTION_SECONDS, CommitResult, RootRecord
from zerodb_core.exceptions import IntegrityError
from zerodb_core.transport.staging import (
    REFUSALS,
    Pending,
    RequestLimits,
    StagedBlobs,
    plan_commit,
)

# What a request costs on the wire besides its payload: op code, request id, lengths.
FRAME_OVERHEAD = 16
# Sequence numbers and ids are 63-bit: anything else from the store is a lie.
MAX_SEQ = 2**63


def _checked_root(root: RootRecord) -> RootRecord:
    """Refuse a root whose fields have the wrong type or range (fail closed: the store is
    not trusted, and what it sends is checked before anything uses it)."""
    if not (
        isinstance(root, RootRecord)
        and type(root.seq) is int
        and 0 <= root.seq < MAX_SEQ
        and type(root.data) is bytes
    ):
        raise IntegrityError("the store sent a malformed root record")
    return root


@dataclass(slots=True, eq=False)
class Lease:
    """This client's turn to commit to ``database``: a commit lease (``blob_server.leases``)
    granted after a lost race. Until a commit with it succeeds (which gives it back) or
    ``Transport.release_lease``, no other client that takes part in leases commits there.

    ``root`` is the root when it was granted, the one to replay the transaction on;
    ``token`` is the transport's own handle; ``held`` turns False once it is given back
    or known to be lost (it timed out and another client holds the lease now).
    """

    database: str
    token: object
    root: RootRecord
    held: bool = True


@dataclass(slots=True)
class TransportCounters:
    """Round trips and bytes since the transport was opened."""

    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    def snapshot(self) -> dict[str, int]:
        """Return the counters as a plain dict (for stats and explain output)."""
        return {
            "round_trips": self.round_trips,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
        }


class Transport(abc.ABC):
    """One method per storage operation; each call is exactly one round trip, except a
    commit too large for one request (one round trip per stage request, then the commit).

    Subclasses implement the ``_`` methods and ``limits``; the public methods count and
    delay, so the accounting cannot differ between the embedded and the remote store.
    """

    #: What one commit or stage request may carry (see ``staging.RequestLimits``).
    limits: RequestLimits
    #: Seconds the store keeps a blob after a commit replaced it (as far as this client
    #: knows): a snapshot at least this old may find blobs gone (``SnapshotTooOldError``),
    #: a younger one never (a missing blob is then an ``IntegrityError``).
    garbage_retention: float = DEFAULT_RETENTION_SECONDS

    def __init__(self, *, delay: float = 0.0) -> None:
        self.counters = TransportCounters()
        self.delay = delay
        self._staged = StagedBlobs()
        # Threads may share a transport (a pooled RemoteTransport runs their requests at
        # once): ``+=`` on an attribute is not atomic, so the counters take a lock.
        self._counters_lock = threading.Lock()

    def _account(self, sent: int, received: int) -> None:
        with self._counters_lock:
            self.counters.round_trips += 1
            self.counters.bytes_sent += FRAME_OVERHEAD + sent
            self.counters.bytes_received += FRAME_OVERHEAD + received
        if self.delay:
            time.sleep(self.delay)

    def get_blobs(self, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """Fetch many blobs in one round trip; missing ids are absent from the result."""
        found = self._get_blobs(database, ids)
        if type(found) is not dict or not all_bytes(found, found.values()):
            raise IntegrityError("the store answered a blob request with something not bytes")
        self._account(sum(map(len, ids)), sum(map(len, found)) + sum(map(len, found.values())))
        return found

    def get_root(self, database: str) -> RootRecord:
        """Read the current root record."""
        root = _checked_root(self._get_root(database))
        self._account(0, 8 + len(root.data))
        return root

    def commit(
        self,
        database: str,
        *,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: Iterable[bytes] = (),
        lease: Lease | None = None,
    ) -> CommitResult:
        """Commit atomically; on conflict the result carries the current root.

        With ``lease`` (held), the commit is made in this client's turn, and a success
        gives the lease back. Without one, a store with commit leases may answer
        ``wait`` (another client's turn; nothing was tried) with the current root.

        Blobs that do not fit one request go ahead in stage requests (each one counted
        round trip), and the commit names them. A retry of the commit from the same
        thread (after a conflict) names the blobs it staged before instead of sending
        them again, and releases (as garbage) those it no longer uses. An error that
        leaves the outcome unknown (``StoreUnavailableError``) forgets them: they may be
        live now, and those that are not expire in the store.
        """
        pending = self._staged.of(database)
        plan = plan_commit(blobs, root, list(garbage), pending, self.limits)
        if plan.stages:
            self._stage_all(database, plan.stages, pending)
        # the lease this client holds on the database, given back by the commit
        held = lease if lease is not None and lease.held and lease.database == database else None
        try:
            result = self._commit(
                database,
                expected_seq=expected_seq,
                root=root,
                blobs=plan.inline,
                garbage=plan.garbage,
                staged=plan.staged,
                lease=None if held is None else held.token,
            )
            _checked_root(result.root)
            if type(result.wait) is not bool or (result.wait and result.ok):
                raise IntegrityError("the store sent a malformed commit answer")
        except REFUSALS:
            raise  # nothing changed: what was staged stays pending for the next commit
        except BaseException:
            pending.forget()
            raise
        if result.ok:
            pending.forget()  # live, or released as garbage
        if held is not None and (result.ok or result.wait):  # given back, or timed out and lost
            held.held = False
        sent = 8 + len(root) + sum(len(k) + len(v) for k, v in plan.inline.items())
        sent += sum(map(len, plan.staged)) + sum(map(len, plan.garbage))
        self._account(sent, 8 + len(result.root.data))
        return result

    def _stage_all(self, database: str, chunks: list[dict[bytes, bytes]], pending: Pending) -> None:
        """Stage chunks (one counted round trip each), remembering every one the store
        confirms; raise the first refusal after taking in what was confirmed."""
        try:
            outcomes = self._stage(database, chunks)
        except BaseException:
            pending.doubt(chunks)  # maybe staged: released by the next commit, never reused
            raise
        refusal: BaseException | None = None
        for chunk, outcome in zip(chunks, outcomes, strict=False):
            self._account(sum(len(k) + len(v) for k, v in chunk.items()), 8)
            if outcome is None:
                pending.add(chunk)
            elif refusal is None:
                refusal = outcome
        if refusal is not None:
            raise refusal

    def acquire_lease(self, database: str) -> Lease | None:
        """Wait for this client's turn to commit to ``database`` (it lost a race): the
        lease, with the current root to replay on. None when the store has no commit
        leases (no round trip) or the turn did not come within the wait (the caller
        then races, as without leases). One counted round trip."""
        answer = self._acquire_lease(database)
        if answer is None:
            return None
        token, root = answer
        _checked_root(root)
        self._account(len(database), 8 + len(root.data))
        return None if token is None else Lease(database, token, root)

    def release_lease(self, lease: Lease) -> None:
        """Give a lease back without committing (the transaction failed or gave up); one
        counted round trip, none if it is no longer held."""
        if not lease.held:
            return
        lease.held = False
        self._release_lease(lease.database, lease.token)
        self._account(len(lease.database), 1)

    def _acquire_lease(self, database: str) -> tuple[object | None, RootRecord] | None:
        """Queue for the lease and wait for it: ``(token or None if the wait ran out,
        the current root)``, or None when this store has no commit leases."""
        return None

    def _release_lease(self, database: str, token: object) -> None:  # noqa: B027
        """Give the lease ``token`` back."""

    def allocate_ids(self, database: str, sequence: str, count: int) -> int:
        """Reserve ``count`` consecutive integers of a named counter; return the first."""
        first = self._allocate_ids(database, sequence, count)
        if type(first) is not int or not 1 <= first < MAX_SEQ:
            raise IntegrityError(f"the store allocated an impossible id {first!r}")
        self._account(len(sequence) + 8, 8)
        return first

    def get_keyring(self, database: str, name: str) -> bytes | None:
        """Read a keyring slot."""
        data = _checked_keyring(self._get_keyring(database, name))
        self._account(len(name), len(data or b""))
        return data

    def open_database(self, database: str, keyring: str) -> tuple[bytes | None, RootRecord]:
        """Read a keyring slot and the current root in one round trip: opening a
        database needs the keyring to unlock it and the root for its first query, and
        asking for both at once saves every cold client a round trip."""
        data, root = self._open_database(database, keyring)
        data, root = _checked_keyring(data), _checked_root(root)
        self._account(len(keyring), len(data or b"") + 8 + len(root.data))
        return data, root

    def put_keyring(self, database: str, name: str, data: bytes, *, expected: bytes | None) -> bool:
        """Compare-and-set a keyring slot."""
        done = self._put_keyring(database, name, data, expected=expected)
        self._account(len(name) + len(data) + len(expected or b""), 1)
        return done

    @abc.abstractmethod
    def _get_blobs(self, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]: ...

    @abc.abstractmethod
    def _get_root(self, database: str) -> RootRecord: ...

    @abc.abstractmethod
    def _open_database(self, database: str, keyring: str) -> tuple[bytes | None, RootRecord]:
        """The keyring slot and the root, in one exchange with the store."""

    @abc.abstractmethod
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
        """Commit (see ``commit``); ``lease`` is the token of the lease held, or None."""

    @abc.abstractmethod
    def _stage(self, database: str, chunks: list[dict[bytes, bytes]]) -> list[BaseException | None]:
        """Stage each chunk in a request of its own, in order; return one outcome per
        chunk sent: None (staged) or the refusal the store answered (one of
        ``staging.REFUSALS``). It may stop sending at the first refusal (then fewer
        outcomes than chunks come back); it raises when an outcome is unknown."""

    @abc.abstractmethod
    def _allocate_ids(self, database: str, sequence: str, count: int) -> int: ...

    @abc.abstractmethod
    def _get_keyring(self, database: str, name: str) -> bytes | None: ...

    @abc.abstractmethod
    def _put_keyring(
        self, database: str, name: str, data: bytes, *, expected: bytes | None
    ) -> bool: ...

    def durability(self) -> dict[str, str] | None:
        """What an acknowledged commit survives, as the store says: ``{"mode", "detail"}``
        (``mode`` one of ``blob_server.wire.storage.DURABILITY_MODES``), or None when it
        does not say. No round trip."""
        return None

    def known_root_seq(self, database: str) -> int | None:
        """The seq the root of ``database`` is known to have without asking the store, or
        None when unknown (always, here). A transport that returns a seq vouches that the
        store's root had it no earlier than the last change notice it took in; it must
        never make a round trip to answer (this is how a warm client skips the root read,
        so it is not counted)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


def _checked_keyring(data: object) -> bytes | None:
    if data is not None and type(data) is not bytes:
        raise IntegrityError("the store answered a keyring request with something not bytes")
    return data


def all_bytes(*collections: Iterable[object]) -> bool:
    """Whether every item is exactly ``bytes``; map() keeps the loop in C, since this runs
    for every node a query reads."""
    return set().union(*(map(type, items) for items in collections)) <= {bytes}
