"""The remote store: the blob server over persistent TCP (optionally TLS) connections.

Every storage call is one counted round trip, as with the embedded store (a
``get_blobs`` too large for one frame is split into chunks that are pipelined: sent
together, answered together). The parts, one module each:

- ``connection``: one socket, its login and its exchanges of frames (server pinning);
- ``pool``: the primary connection and the pooled ones, and which thread uses which;
- ``subscription``: root pushes, and what they tell of each database's root;
- ``answers``: what the server answers, checked, and its error codes as exceptions;
- this module: ``RemoteTransport``, which connects and retries, and maps every storage
  operation to requests.

Retries: a dropped connection is re-opened with backoff and a fresh login. Reads are
retried once on a new connection; a commit, stage or keyring write whose answer was lost
is not (its outcome is unknown, and replaying a commit is not idempotent): it raises
``StoreUnavailableError``.

Streamed commits: the login answer carries the server's per-request limits
(``max_commit_blobs``, ``max_commit_bytes``), so a commit larger than one request is
split without asking (``Transport.commit``, ``staging``). The limits bound exactly what
the client sums (new blobs; bytes of blobs and root), so the client uses them as they
are; only the frame gets a margin for msgpack's overhead. A server that announces none
gets requests of at most ``FALLBACK_LIMITS``, far below any setting we ship. The stage
requests of a commit are pipelined, up to ``STAGE_WINDOW_BYTES`` at a time, on one
connection; each is one counted round trip.

Commit leases: a server that has them says so at login (``commit_lease``); the client
then sends every commit with a ``lease`` argument (nil, or the token of the turn it
holds), and after a lost race asks for its turn (``acquire_lease``, waiting at most
``LEASE_WAIT`` seconds). See ``blob_server.leases``.

Root reads: a first root read of a database (which subscribes) waits for the primary
connection; later root reads, blob reads and commits go to any connection. While another
thread uses the primary, ``known_root_seq`` answers None (its pushes cannot be read
then): the caller reads the root, never waits.
"""

from __future__ import annotations

import logging
import socket
import ssl as ssl_module
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from coincurve import PrivateKey

from blob_server.wire import protocol
from blob_server.wire.storage import DURABLE, EVERYSEC, CommitResult, RootRecord
from zerodb_core.exceptions import (
    AuthenticationError,
    IntegrityError,
    QueryError,
    ServerBusyError,
    StoreUnavailableError,
)
from zerodb_core.transport import answers
from zerodb_core.transport.answers import FALLBACK_LIMITS, RETRY_LATER
from zerodb_core.transport.base import Transport
from zerodb_core.transport.connection import (
    ClosedByServerError,
    Connection,
    DroppedError,
    OnPush,
    login,
    open_socket,
)
from zerodb_core.transport.pool import ConnectionPool
from zerodb_core.transport.staging import REFUSALS
from zerodb_core.transport.subscription import Subscriptions

logger = logging.getLogger(__name__)

#: Durabilities a client does not warn about: on disk before the acknowledgement, or
#: within about a second of it.
SAFE_ENOUGH = (DURABLE, EVERYSEC)

DEFAULT_TIMEOUT = 30.0
CONNECT_ATTEMPTS = 5
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0
DEFAULT_POOL_SIZE = 4

#: Longest wait for a commit lease in one request (seconds; at most half the answer
#: timeout): a client whose turn has not come by then races, as without leases.
LEASE_WAIT = 10.0

#: Stage requests sent back to back before their answers are read (the bytes of blobs).
STAGE_WINDOW_BYTES = 64 * 1024 * 1024


class RemoteTransport(Transport):
    """Reach a blob server at ``(host, port)`` as ``tenant`` with a 32-byte login key.

    ``ssl`` turns on TLS (``server_hostname`` is the name the certificate must carry,
    ``host`` by default); ``timeout`` bounds connecting and every answer; ``server_id``
    pins the server's id (``connection``); ``pool_size`` is the most connections open at
    once (the primary and up to ``pool_size - 1`` pooled ones, ``pool``).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tenant: str,
        login_key: bytes,
        timeout: float = DEFAULT_TIMEOUT,
        delay: float = 0.0,
        ssl: ssl_module.SSLContext | None = None,
        server_hostname: str | None = None,
        server_id: str | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        super().__init__(delay=delay)
        if type(pool_size) is not int or pool_size < 1:
            raise QueryError(f"pool_size must be an int of at least 1, not {pool_size!r}")
        if type(login_key) is not bytes or len(login_key) != 32:
            raise AuthenticationError("the login key must be 32 bytes")
        try:
            self._key = PrivateKey(login_key)
        except Exception:
            raise AuthenticationError("the login key is not a valid secp256k1 key") from None
        self.public_key = self._key.public_key.format(compressed=True)
        self.host = host
        self.port = port
        self.tenant = tenant
        self.timeout = timeout
        self.ssl = ssl
        self.server_hostname = server_hostname or host
        self.pool_size = pool_size
        # The id every login must find: the pinned one, else the first one seen.
        self.server_id: str | None = server_id
        self.limits = FALLBACK_LIMITS  # until a login announces the server's
        # Seconds a commit lease lasts, as the last login announced; None: the server has
        # no commit leases (off, or older), and this client races as before.
        self.lease_timeout: float | None = None
        self._durability: dict[str, str] | None = None  # as the last login announced
        self.reconnects = 0  # primary connections opened after the first one
        self.connections_opened = 0  # logins that succeeded, primary and pooled
        self._counts_lock = threading.Lock()
        self._connected = False
        # The primary connection alone subscribes; losing it loses the subscriptions.
        self._subscriptions = Subscriptions()
        self._primary = Connection(on_drop=self._subscriptions.clear)
        self._pool = ConnectionPool(self._primary, pool_size)
        self._lock = self._pool.lock  # held: the primary connection is in use
        self._connect(self._primary)

    @property
    def _sock(self) -> socket.socket | None:
        """The primary connection's socket (None while disconnected)."""
        return self._primary.sock

    @_sock.setter
    def _sock(self, sock: socket.socket | None) -> None:
        self._primary.sock = sock

    @property
    def pushes(self) -> int:
        """Root pushes taken in so far."""
        return self._subscriptions.pushes

    # -- connection ------------------------------------------------------------------------

    def _connect(self, conn: Connection) -> None:
        """Open a connection and log in, retrying with backoff on network errors."""
        delay = BACKOFF_FIRST
        last: BaseException | None = None
        for attempt in range(CONNECT_ATTEMPTS):
            if attempt:
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
            try:
                sock = open_socket(
                    (self.host, self.port), self.timeout, self.ssl, self.server_hostname
                )
            except ssl_module.SSLCertVerificationError as exc:  # retrying will not help
                raise StoreUnavailableError(
                    f"the blob server at {self.host}:{self.port} failed TLS verification: {exc}"
                ) from None
            except OSError as exc:
                last = exc
                continue
            conn.sock = sock
            try:
                self._login(conn)
            except DroppedError as exc:
                conn.drop()
                last = exc
                continue
            except BaseException:
                conn.drop()
                raise
            with self._counts_lock:
                self.connections_opened += 1
            if conn is self._primary:
                if self._connected:
                    self.reconnects += 1
                self._connected = True
            return
        if isinstance(last, ClosedByServerError) and last.code == protocol.BUSY:
            raise ServerBusyError(
                f"the blob server at {self.host}:{self.port} is busy: it refused or closed "
                f"{CONNECT_ATTEMPTS} connections in a row before login (every connection it "
                "may hold, `serve --max-connections`, is logged in, or newer connections "
                f"from this address took their place); {RETRY_LATER}"
            ) from None
        raise StoreUnavailableError(
            f"cannot reach the blob server at {self.host}:{self.port}: {last}; {RETRY_LATER}"
        ) from None

    def _login(self, conn: Connection) -> None:
        done = login(conn, self._key, self.tenant, self.server_id, (self.host, self.port))
        self.limits = done.limits
        self.garbage_retention = done.garbage_retention
        self.lease_timeout = done.lease_timeout
        self._told_durability(done.durability)
        self.server_id = done.server_id

    def _told_durability(self, durability: dict[str, str] | None) -> None:
        """Keep what the login said of the server's storage; warn (once per transport,
        and again only if it changes) when a crash of it may lose acknowledged commits:
        this client would then take the store for one rolled back (FreshnessError)."""
        with self._counts_lock:
            changed = durability != self._durability
            self._durability = durability
        if changed and durability is not None and durability["mode"] not in SAFE_ENOUGH:
            logger.warning(
                "the blob server at %s:%s may lose acknowledged commits in a crash of its "
                "storage (durability %s: %s); this client would then refuse the store as "
                "rolled back (FreshnessError) until its freshness floor is reset",
                self.host,
                self.port,
                durability["mode"],
                durability["detail"],
            )

    def durability(self) -> dict[str, str] | None:
        """What the server's storage persists, as its last login said (see
        ``Transport.durability``)."""
        return self._durability

    def _drop(self) -> None:
        """Close the primary connection (and forget its subscriptions); it reconnects
        when next used."""
        self._primary.drop()

    def close(self) -> None:
        """Close every connection (those in use as they come back); like a dropped
        connection, each is opened again if the transport is used afterwards."""
        self._pool.close()

    # -- requests --------------------------------------------------------------------------

    def _on_push(self, conn: Connection) -> OnPush | None:
        """Where pushes read on ``conn`` go: the subscriptions for the primary; nowhere
        for a pooled connection (it never subscribes)."""
        return self._subscriptions.pushed if conn is self._primary else None

    def known_root_seq(self, database: str) -> int | None:
        """The root seq of ``database`` as far as the primary's subscription knows: every
        commit through the server since it subscribed has been pushed, so the root is
        this seq unless a newer push is still on its way. None when not subscribed (not
        yet, refused, or the connection was lost), and None while another thread uses the
        primary connection (its pushes cannot be read now: the caller reads the root
        instead of waiting). No round trip."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if not self._subscriptions.subscribed(database):
                return None
            if not self._primary.drain(self._subscriptions.pushed):
                return None
            return self._subscriptions.known(database)
        finally:
            self._lock.release()

    def _call_many(
        self, requests: list[tuple[str, dict[str, Any]]], *, idempotent: bool, raw: bool = False
    ) -> list[Any]:
        """Exchange requests on a live connection, the primary if it is free, else a pooled
        one (reconnecting as needed); ``raw`` returns each ``protocol.Response`` instead of
        raising on an error answer."""
        conn = self._pool.take()
        try:
            return self._call_on(conn, requests, idempotent=idempotent, raw=raw)
        finally:
            self._pool.give(conn)

    def _call_on(
        self,
        conn: Connection,
        requests: list[tuple[str, dict[str, Any]]],
        *,
        idempotent: bool,
        raw: bool,
    ) -> list[Any]:
        on_push = self._on_push(conn)
        if conn.sock is not None:
            conn.drain(on_push)  # takes in pushes; drops a connection the server closed
        for attempt in range(2):
            if conn.sock is None:
                self._connect(conn)
            try:
                if raw:
                    return conn.exchange(requests, on_push)
                return conn.call(requests, on_push)
            except DroppedError as exc:
                conn.drop()
                if exc.sent and not idempotent:
                    raise StoreUnavailableError(
                        f"the connection to the blob server dropped during a write ({exc}); "
                        f"its outcome is unknown: read before writing again; {RETRY_LATER}"
                    ) from None
                if attempt:
                    raise StoreUnavailableError(
                        f"the blob server connection failed: {exc}; {RETRY_LATER}"
                    ) from None
        raise AssertionError("unreachable")

    def _call(self, op: str, args: dict[str, Any], *, idempotent: bool = True) -> Any:
        return self._call_many([(op, args)], idempotent=idempotent)[0]

    def ping(self) -> dict[str, Any]:
        """Ask the server for its time (not counted as a storage round trip)."""
        answer: dict[str, Any] = self._call("ping", {})  # as the server sent it
        return answer

    def server_stats(self, database: str) -> dict[str, Any]:
        """Return the storage statistics of ``database`` (this tenant's only), with
        ``tenant``: the tenant's usage and quota (``blobs``, ``bytes``, ``databases``,
        ``max_blobs``, ``max_bytes``; a limit of None means none), on a server with
        commit leases, ``lease``: ``held`` (0 or 1) and ``waiting`` (clients queued), and
        on a server with fairness limits, ``fairness``: the tenant's ``max_connections``,
        ``max_frame_memory``, ``rate``, ``burst`` (None: no limit) and what it holds now,
        ``connections`` and ``frame_memory`` (bytes)."""
        answer: dict[str, Any] = self._call("stats", {"database": database})
        return answer  # as the server sent it

    # -- the storage operations --------------------------------------------------------------

    def _get_blobs(self, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        wanted = list(dict.fromkeys(ids))
        found: dict[bytes, bytes] = {}
        while wanted:
            step = protocol.MAX_IDS_PER_REQUEST
            chunks = [wanted[i : i + step] for i in range(0, len(wanted), step)]
            replies = self._call_many(
                [("get_blobs", {"database": database, "ids": chunk}) for chunk in chunks],
                idempotent=True,
            )
            deferred: list[bytes] = []
            for chunk, answer in zip(chunks, replies, strict=True):
                blobs, later = answers.blob_answer(answer)
                asked = set(chunk)
                if not asked.issuperset(blobs) or not asked.issuperset(later):
                    raise IntegrityError("the blob server answered ids that were not asked for")
                if later and not blobs:
                    raise IntegrityError("the blob server deferred a blob without progress")
                found.update(blobs)
                deferred.extend(later)
            wanted = deferred
        return found

    def _get_root(self, database: str) -> RootRecord:
        return self._read_root(database, [])[1]

    def _open_database(self, database: str, keyring: str) -> tuple[bytes | None, RootRecord]:
        (data,), root = self._read_root(
            database, [("get_keyring", {"database": database, "name": keyring})]
        )
        return data, root

    def _read_root(
        self, database: str, before: list[tuple[str, dict[str, Any]]]
    ) -> tuple[list[Any], RootRecord]:
        """Read the root, after the idempotent reads ``before`` in the same round trip;
        return their answers and the root."""
        if self._lock.acquire(blocking=False):
            try:
                return self._read_root_primary(database, before)
            finally:
                self._pool.give(self._primary)
        if not self._subscriptions.settled(database):
            # The first root read subscribes: on the primary, whose turn we await.
            with self._lock:
                return self._read_root_primary(database, before)
        # Subscribed (or refused) already: any connection may read the root, and the seq
        # it finds is one the store reached, so it is folded in like a commit's.
        *replies, reply = self._call_many(
            [*before, ("get_root", {"database": database})], idempotent=True
        )
        root = answers.root_answer(reply)
        self._subscriptions.note(database, root.seq)
        return replies, root

    def _read_root_primary(
        self, database: str, before: list[tuple[str, dict[str, Any]]]
    ) -> tuple[list[Any], RootRecord]:
        """Read the root on the primary connection (``_lock`` held), subscribing first if
        it has not subscribed to ``database`` yet."""
        if self._primary.sock is not None:
            # A dropped connection leaves no subscription behind.
            self._primary.drain(self._subscriptions.pushed)
        if not self._subscriptions.begin(database):  # subscribed (or refused) already
            *replies, reply = self._call_many(
                [*before, ("get_root", {"database": database})], idempotent=True
            )
            root = answers.root_answer(reply)
            self._subscriptions.note(database, root.seq)  # only if still subscribed
            return replies, root
        # Subscribe first, in the same round trip: every commit the root read misses is
        # then pushed.
        try:
            *responses, subscribed, response = self._call_many(
                [
                    *before,
                    ("subscribe", {"database": database}),
                    ("get_root", {"database": database}),
                ],
                idempotent=True,
                raw=True,
            )
        except BaseException:
            self._subscriptions.abandon(database)
            raise
        if not response.ok:
            self._subscriptions.abandon(database)
            raise answers.error(*response.result)
        root = answers.root_answer(response.result)
        if (
            subscribed.ok
            and type(subscribed.result) is dict
            and subscribed.result.get("subscribed") is True
        ):
            # A no-op if the connection was replaced during the exchange (the entry
            # went with it): the next root read subscribes again.
            self._subscriptions.note(database, root.seq, pending=True)
        else:  # pushes off, an old server, or too many subscriptions: read every time
            self._subscriptions.refuse(database)
        for other in responses:
            if not other.ok:
                raise answers.error(*other.result)
        return [other.result for other in responses], root

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
        args: dict[str, Any] = {
            "database": database,
            "expected_seq": expected_seq,
            "root": root,
            "blobs": dict(blobs),
            "garbage": list(garbage),
        }
        if staged:  # absent otherwise: a small commit is the request it always was
            args["staged"] = staged
        if self.lease_timeout is not None:  # taking part in leases: nil, or our token
            args["lease"] = lease
        (response,) = self._call_many([("commit", args)], idempotent=False, raw=True)
        if not response.ok:
            raise answers.write_error(*response.result)
        answer = response.result
        if (
            type(answer) is not dict
            or type(answer.get("ok")) is not bool
            or type(answer.get("wait", False)) is not bool
        ):
            raise IntegrityError("the blob server sent a malformed commit answer")
        result = CommitResult(answer["ok"], answers.root_answer(answer), answer.get("wait", False))
        # Either way the answer names a root the store really had (the committer gets no
        # push of its own commit). Any seq the store is known to have reached is safe to
        # fold in: the subscription only has to vouch for commits after its root read.
        # (A commit through a pooled connection is also pushed to the primary.)
        self._subscriptions.note(database, result.root.seq)
        return result

    def _stage(self, database: str, chunks: list[dict[bytes, bytes]]) -> list[BaseException | None]:
        """Send the stage requests pipelined, a window at a time, on one connection; stop
        after a window with a refusal. An answer that is neither a stage nor a refusal
        (the storage failed, a malformed answer) leaves the outcome unknown: raised."""
        outcomes: list[BaseException | None] = []
        for window in _windows(chunks):
            responses = self._call_many(
                [("stage", {"database": database, "blobs": chunk}) for chunk in window],
                idempotent=False,
                raw=True,
            )
            for chunk, response in zip(window, responses, strict=True):
                if response.ok:
                    if response.result != {"staged": len(chunk)}:
                        raise IntegrityError("the blob server sent a malformed stage answer")
                    outcomes.append(None)
                    continue
                refusal = answers.write_error(*response.result)
                if not isinstance(refusal, REFUSALS):
                    raise refusal
                outcomes.append(refusal)
            if any(outcome is not None for outcome in outcomes):
                break
        return outcomes

    def _acquire_lease(self, database: str) -> tuple[object | None, RootRecord] | None:
        """Queue for the commit lease on the server (``acquire_lease``) and wait for it,
        at most ``LEASE_WAIT`` seconds (half the answer timeout if that is shorter). If
        the answer is lost, the connection is dropped, and the server gives up whatever
        it granted on it: asking again is safe."""
        if self.lease_timeout is None:
            return None
        wait = float(min(LEASE_WAIT, self.timeout / 2))
        answer = self._call("acquire_lease", {"database": database, "wait": wait})
        if (
            type(answer) is not dict
            or type(answer.get("granted")) is not bool
            or (answer["granted"] and answers.lease_token(answer.get("token")) is None)
        ):
            raise IntegrityError("the blob server sent a malformed lease answer")
        root = answers.root_answer(answer)
        self._subscriptions.note(database, root.seq)
        return (answer["token"] if answer["granted"] else None), root

    def _release_lease(self, database: str, token: object) -> None:
        answer = self._call("release_lease", {"database": database, "token": token})
        if type(answer) is not dict or type(answer.get("released")) is not bool:
            raise IntegrityError("the blob server sent a malformed lease answer")

    def _allocate_ids(self, database: str, sequence: str, count: int) -> int:
        # Retrying is safe: a lost block only leaves a gap in the ids.
        first: int = self._call(  # checked by Transport.allocate_ids
            "allocate_ids", {"database": database, "sequence": sequence, "count": count}
        )
        return first

    def _get_keyring(self, database: str, name: str) -> bytes | None:
        data: bytes | None = self._call("get_keyring", {"database": database, "name": name})
        return data  # checked by Transport.get_keyring

    def _put_keyring(
        self, database: str, name: str, data: bytes, *, expected: bytes | None
    ) -> bool:
        done = self._call(
            "put_keyring",
            {"database": database, "name": name, "data": data, "expected": expected},
            idempotent=False,
        )
        if type(done) is not bool:
            raise IntegrityError("the blob server sent a malformed keyring answer")
        return done


def _windows(chunks: list[dict[bytes, bytes]]) -> list[list[dict[bytes, bytes]]]:
    """Group stage requests into windows of about ``STAGE_WINDOW_BYTES`` (at least one
    request each), sent back to back."""
    windows: list[list[dict[bytes, bytes]]] = []
    size = STAGE_WINDOW_BYTES
    for chunk in chunks:
        chunk_size = sum(map(len, chunk.values()))
        if size + chunk_size > STAGE_WINDOW_BYTES:
            windows.append([])
            size = 0
        windows[-1].append(chunk)
        size += chunk_size
    return windows
