"""The remote store: the blob server over persistent TCP (optionally TLS) connections.

Connecting logs in with the random secp256k1 login key (challenge-response, see
``blob_server.auth``); the server then binds the connection to the key's tenant. The two
login round trips are connection setup and are not counted; every storage call is one
counted round trip, as with the embedded store (a ``get_blobs`` too large for one frame is
split into chunks that are pipelined: sent together, answered together).

A dropped connection is re-opened with backoff and a fresh login. Reads are retried once
on a new connection; a commit, stage or keyring write whose answer was lost is not (its
outcome is unknown, and replaying a commit is not idempotent): it raises
``StoreUnavailableError``.

Streamed commits: the login answer carries the server's per-request limits
(``max_commit_blobs``, ``max_commit_bytes``), so a commit larger than one request is
split without asking (``Transport.commit``, ``staging``). The limits bound exactly what
the client sums (new blobs; bytes of blobs and root), so the client uses them as they
are; only the frame gets a margin for msgpack's overhead. A server that announces none
gets requests of at most ``FALLBACK_LIMITS`` (256 blobs, 1 MiB), far below any setting
we ship. The stage requests of a commit are pipelined, up to ``STAGE_WINDOW_BYTES`` at a
time, on one connection; each is one counted round trip.

Commit leases: a server that has them says so at login (``commit_lease``); the client
then sends every commit with a ``lease`` argument (nil, or the token of the turn it
holds), and after a lost race asks for its turn (``acquire_lease``, waiting at most
``LEASE_WAIT`` seconds). See ``blob_server.leases``.

Everything the server answers is checked before use: a malformed answer raises
``IntegrityError`` and drops the connection (it cannot be trusted to be in step any more).

Server pinning: the transport logs in only to a server whose id (sent in the challenge,
and part of the signed login digest) is ``server_id`` when one is given (the key file
records it), and otherwise to the id its first login saw: a reconnect that reaches a
server with another id (a DNS or routing change, an attacker's server) raises
``AuthenticationError`` naming both ids before anything is signed.

Connection pool: threads sharing the transport run their requests at once on up to
``pool_size`` connections. One is the *primary*: it alone subscribes and reads pushes
(everything below about pushes is about it), and a thread uses it whenever it is free,
so a single thread always does. A thread that finds it busy takes a free pooled
connection, or opens one (lazily, logged in with the same key and held to the same
server id) while fewer than ``pool_size`` exist, or waits for one; it keeps it for one
exchange. A first root read of a database (which subscribes) waits for the primary;
later root reads, blob reads and commits go anywhere. A failed pooled connection is
closed and reopened on its next use (reads retried once, writes not, as on the primary).

Root pushes: the first root read of a database on a connection is sent as
``subscribe`` + ``get_root`` pipelined (one round trip). From then on the server pushes
``[0, "root", {database, seq}]`` after every commit through it by another connection of
this tenant; pushes are read wherever they turn up: between answers inside an exchange,
and before every request and every ``known_root_seq`` question (a non-blocking look at
the socket, ``_drain``). Per database the connection keeps the highest seq it knows from
pushes, root reads and commit answers since it subscribed; ``known_root_seq`` returns
it, and the ``DB`` skips the root read while it equals the root it last verified. The
root seqs that pooled connections see (root reads, commit answers) are folded in too, but
only once the subscription is established: one read elsewhere while it is under way may
predate commits it missed. While another thread uses the primary, ``known_root_seq``
answers None (its pushes cannot be read then): the caller reads the root, never waits.

Guarantee: a read reflects every commit whose push has arrived before the read began
(and every commit this client made). A commit by someone else whose acknowledgement has
reached them but whose push has not reached us yet may be missed by a read started in
that window (like any snapshot read taken a moment earlier); it is never missed once its
push has been read, and nothing older than a processed push is ever returned. A lost
connection drops every guarantee (no subscription on a new connection until the next
root read subscribes again). Pushes cover commits through the same server process only
(see ``blob_server.server``); a server started with pushes off answers the subscription
with ``subscribed: False`` and every query reads the root.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import socket
import ssl as ssl_module
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from coincurve import PrivateKey

from blob_server.wire import protocol
from blob_server.wire.exceptions import BlobExistsError, InvalidRequestError, NotStagedError
from blob_server.wire.storage import (
    DEFAULT_RETENTION_SECONDS,
    DURABLE,
    EVERYSEC,
    CommitResult,
    RootRecord,
)
from zerodb_core.exceptions import (
    AuthenticationError,
    CommitTooLargeError,
    IntegrityError,
    QueryError,
    QuotaExceededError,
    RateLimitedError,
    ServerBusyError,
    StoreUnavailableError,
)
from zerodb_core.transport.base import MAX_SEQ, Transport, all_bytes
from zerodb_core.transport.staging import REFUSALS, RequestLimits

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
#: Bytes of a lease token (``blob_server.leases.TOKEN_BYTES``).
LEASE_TOKEN_BYTES = 16

#: Stage requests sent back to back before their answers are read (the bytes of blobs).
STAGE_WINDOW_BYTES = 64 * 1024 * 1024

_AUTH_CODES = {protocol.AUTH_FAILED, protocol.UNAUTHENTICATED}
#: Said by every error that an outage or a limit of the moment caused, never the data.
RETRY_LATER = "retry later"


def request_limits(blobs: int, size: int) -> RequestLimits:
    """The limits of one request to a blob server that accepts ``blobs`` new blobs and
    ``size`` bytes per request (clamped to what the protocol allows at all)."""
    return RequestLimits(
        blobs=min(blobs, protocol.MAX_IDS_PER_REQUEST),
        bytes=min(size, protocol.MAX_FRAME_BYTES),
        blob=protocol.MAX_BLOB_BYTES,
        ids=protocol.MAX_COMMIT_IDS,
        frame=protocol.MAX_FRAME_BYTES,
    )


#: For a server whose login answer announces no limits: one from before streamed commits,
#: which has no ``stage`` op. A commit goes to it in one request, as it always did, up to
#: what such a server accepted by default.
FALLBACK_LIMITS = request_limits(protocol.MAX_IDS_PER_REQUEST, protocol.MAX_RESPONSE_BLOB_BYTES)


def tls_context(
    tls: bool | ssl_module.SSLContext | None, ca_file: str | os.PathLike | None = None
) -> ssl_module.SSLContext | None:
    """The client's TLS context: ``tls`` if it is one; else, when ``tls`` is True or a
    ``ca_file`` is given, one that verifies the server's certificate and host name against
    ``ca_file`` (the system's CAs without one), TLS 1.2 at least; None for plain TCP."""
    if isinstance(tls, ssl_module.SSLContext):
        if ca_file is not None:
            raise QueryError("give either an SSLContext as tls or a ca_file, not both")
        return tls
    if tls is False and ca_file is not None:
        raise QueryError("ca_file is for TLS, but tls=False")
    if not tls and ca_file is None:
        return None
    try:
        context = ssl_module.create_default_context(
            cafile=None if ca_file is None else os.fspath(ca_file)
        )
    except (OSError, ssl_module.SSLError) as exc:
        raise StoreUnavailableError(f"cannot load the CA file {ca_file}: {exc}") from None
    context.minimum_version = ssl_module.TLSVersion.TLSv1_2
    return context


class _DroppedError(Exception):
    """The connection failed; ``sent`` tells whether the request may have reached the server."""

    def __init__(self, cause: BaseException, *, sent: bool) -> None:
        super().__init__(str(cause))
        self.sent = sent


class _ClosedByServerError(_DroppedError):
    """The server sent an error nobody asked for (request id 0) and closed the connection:
    ``busy`` when it refuses a connection, or an idle timeout or an oversized frame.

    *Why its own class:* such a frame answers no request, and was taken for an answer out
    of order, i.e. for tampering (``IntegrityError``); a busy server is an outage."""

    def __init__(self, code: object, message: object) -> None:
        super().__init__(
            ConnectionError(f"the blob server closed the connection: {message} ({code})"),
            sent=True,
        )
        self.code = code


class _Connection:
    """One socket of the transport (logged in once ``sock`` is set), its frame buffers and
    its request ids. Used by one thread at a time: the primary under the transport's
    ``_lock``, a pooled one while taken from the pool."""

    __slots__ = ("epoch", "ids", "packer", "receiver", "sock")

    def __init__(self, epoch: int = 0) -> None:
        self.sock: socket.socket | None = None
        self.packer = protocol.FramePacker()
        self.receiver = protocol.FrameReceiver()
        self.ids = itertools.count(1)
        self.epoch = epoch  # the transport's close count when it was last given back


class RemoteTransport(Transport):
    """Reach a blob server at ``(host, port)`` as ``tenant`` with a 32-byte login key.

    ``ssl`` turns on TLS (``server_hostname`` is the name the certificate must carry,
    ``host`` by default); ``timeout`` bounds connecting and every answer; ``server_id``
    pins the server's id (see the module docstring); ``pool_size`` is the most
    connections open at once (the primary and up to ``pool_size - 1`` pooled ones, see
    the module docstring).
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
        self._connected = False
        # The primary connection: the only one that subscribes and reads pushes; guarded
        # by ``_lock`` (held for a whole exchange, and for a subscribing root read).
        self._primary = _Connection()
        self._lock = threading.RLock()
        # Per subscribed database of the primary connection, the highest root seq known
        # since subscribing (None: subscription under way, nothing known yet). Cleared
        # with the primary's socket. Read and written under ``_subs_lock`` (never held
        # during I/O), since pooled exchanges fold in the roots they see.
        self._subs: dict[str, int | None] = {}
        self._no_push: set[str] = set()  # refused a subscription on the primary
        self._subs_lock = threading.Lock()
        self.pushes = 0
        # Pooled connections: free ones, and how many exist (free or taken).
        self._pool: list[_Connection] = []
        self._pooled = 0
        self._pool_cond = threading.Condition(threading.Lock())
        self._epoch = 0  # close() calls so far: a pooled socket older than the last is closed
        self._connect(self._primary)

    @property
    def _sock(self) -> socket.socket | None:
        """The primary connection's socket (None while disconnected)."""
        return self._primary.sock

    @_sock.setter
    def _sock(self, sock: socket.socket | None) -> None:
        self._primary.sock = sock

    # -- connection ------------------------------------------------------------------------

    def _connect(self, conn: _Connection) -> None:
        """Open a connection and log in, retrying with backoff on network errors."""
        delay = BACKOFF_FIRST
        last: BaseException | None = None
        for attempt in range(CONNECT_ATTEMPTS):
            if attempt:
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
            try:
                sock = self._open_socket()
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
            except _DroppedError as exc:
                self._drop(conn)
                last = exc
                continue
            except BaseException:
                self._drop(conn)
                raise
            with self._pool_cond:
                self.connections_opened += 1
            if conn is self._primary:
                if self._connected:
                    self.reconnects += 1
                self._connected = True
            return
        if isinstance(last, _ClosedByServerError) and last.code == protocol.BUSY:
            raise ServerBusyError(
                f"the blob server at {self.host}:{self.port} is busy: it refused or closed "
                f"{CONNECT_ATTEMPTS} connections in a row before login (every connection it "
                "may hold, `serve --max-connections`, is logged in, or newer connections "
                f"from this address took their place); {RETRY_LATER}"
            ) from None
        raise StoreUnavailableError(
            f"cannot reach the blob server at {self.host}:{self.port}: {last}; {RETRY_LATER}"
        ) from None

    def _open_socket(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl is not None:
                return self.ssl.wrap_socket(sock, server_hostname=self.server_hostname)
        except BaseException:
            sock.close()
            raise
        return sock

    def _login(self, conn: _Connection) -> None:
        challenge = self._exchange([("challenge", {})], conn)[0]
        if (
            type(challenge) is not dict
            or type(challenge.get("server_id")) is not str
            or type(challenge.get("nonce")) is not bytes
            or len(challenge["nonce"]) != protocol.NONCE_BYTES
        ):
            raise IntegrityError("the blob server sent a malformed challenge")
        server_id = challenge["server_id"]
        if self.server_id is not None and server_id != self.server_id:
            # Before signing anything: a login for another server is not ours to give.
            raise AuthenticationError(
                f"the blob server at {self.host}:{self.port} has id {server_id!r}, but this "
                f"client is pinned to server id {self.server_id!r} (recorded in the key file "
                "at the first login): refusing to log in to a different server"
            )
        timestamp = int(time.time())
        digest = protocol.login_digest(
            server_id, self.tenant, self.public_key, challenge["nonce"], timestamp
        )
        args = {
            "tenant": self.tenant,
            "public_key": self.public_key,
            "time": timestamp,
            "signature": self._key.sign(digest, hasher=None),
        }
        answer = self._exchange([("login", args)], conn)[0]
        if type(answer) is not dict or answer.get("tenant") != self.tenant:
            raise IntegrityError("the blob server sent a malformed login answer")
        self.limits = _announced_limits(answer)
        self.garbage_retention = _announced_retention(answer)
        self.lease_timeout = _announced_lease(answer)
        self._told_durability(_announced_durability(answer))
        self.server_id = server_id

    def _told_durability(self, durability: dict[str, str] | None) -> None:
        """Keep what the login said of the server's storage; warn (once per transport,
        and again only if it changes) when a crash of it may lose acknowledged commits:
        this client would then take the store for one rolled back (FreshnessError)."""
        with self._pool_cond:
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

    def _drop(self, conn: _Connection | None = None) -> None:
        """Close a connection (the primary by default); it reconnects when next used."""
        conn = self._primary if conn is None else conn
        if conn is self._primary:
            with self._subs_lock:  # a new connection has no subscription: nothing is known
                self._subs.clear()
                self._no_push.clear()
        sock, conn.sock = conn.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        """Close every connection (those in use as they come back); like a dropped
        connection, each is opened again if the transport is used afterwards."""
        with self._pool_cond:
            self._epoch += 1
            for conn in self._pool:
                self._drop(conn)
                conn.epoch = self._epoch
        with self._lock:
            self._drop()

    # -- the pool ----------------------------------------------------------------------------

    def _take(self) -> _Connection:
        """The primary connection if it is free (or this thread holds it already), else a
        free pooled one, else a new pooled one (connected when first used) while fewer
        than ``pool_size - 1`` exist; else wait for one. Give it back with ``_give``."""
        if self.pool_size == 1:
            self._lock.acquire()
            return self._primary
        while True:
            if self._lock.acquire(blocking=False):
                return self._primary
            with self._pool_cond:
                if self._pool:
                    return self._pool.pop()
                if self._pooled < self.pool_size - 1:
                    self._pooled += 1
                    return _Connection(self._epoch)
                # Woken when a pooled connection comes back; the timeout looks at the
                # primary again (its lock cannot notify).
                self._pool_cond.wait(0.05)

    def _give(self, conn: _Connection) -> None:
        if conn is self._primary:
            self._lock.release()
            with self._pool_cond:
                self._pool_cond.notify()
            return
        with self._pool_cond:
            if conn.epoch != self._epoch:  # taken before close(): close it now
                self._drop(conn)
                conn.epoch = self._epoch
            self._pool.append(conn)
            self._pool_cond.notify()

    # -- requests --------------------------------------------------------------------------

    def _exchange(self, requests: list[tuple[str, dict]], conn: _Connection) -> list[Any]:
        """Send requests back to back, read their answers; raise ``_DroppedError`` on network
        errors, the mapped exception on an error answer."""
        responses = self._exchange_on(requests, conn)
        for response in responses:
            if not response.ok:
                raise _error(*response.result)
        return [response.result for response in responses]

    def _exchange_on(
        self, requests: list[tuple[str, dict]], conn: _Connection
    ) -> list[protocol.Response]:
        if conn is self._primary:
            return self._exchange_responses(requests)
        return self._exchange_responses_on(requests, conn)

    def _exchange_responses(self, requests: list[tuple[str, dict]]) -> list[protocol.Response]:
        """``_exchange_responses_on`` the primary connection."""
        return self._exchange_responses_on(requests, self._primary)

    def _exchange_responses_on(
        self, requests: list[tuple[str, dict]], conn: _Connection
    ) -> list[protocol.Response]:
        """Send requests back to back, read their answers (taking in any pushes between
        them) and return them, errors included; raise ``_DroppedError`` on network
        errors."""
        sock = conn.sock
        if sock is None:
            raise _DroppedError(ConnectionError("not connected"), sent=False)
        ids = [next(conn.ids) for _ in requests]
        try:
            payload = b"".join(
                part
                for rid, (op, args) in zip(ids, requests, strict=True)
                for part in conn.packer.request(rid, op, args)
            )
        except protocol.FrameTooLargeError as exc:
            raise InvalidRequestError(f"request too large for the protocol: {exc}") from None
        try:
            sock.sendall(payload)
        except OSError as exc:
            raise _DroppedError(exc, sent=True) from None
        results = []
        for rid in ids:
            while True:
                try:
                    frame = protocol.parse_server_frame(conn.receiver.recv(sock))
                except protocol.ProtocolError as exc:
                    self._drop(conn)
                    raise IntegrityError(
                        f"the blob server sent a malformed answer: {exc}"
                    ) from None
                except OSError as exc:  # ConnectionError and timeouts are OSErrors
                    raise _DroppedError(exc, sent=True) from None
                if not isinstance(frame, protocol.Push):
                    break
                if conn is self._primary:  # a pooled connection never subscribes
                    self._pushed(frame)
            if frame.request_id == protocol.PUSH_ID and not frame.ok:
                raise _ClosedByServerError(*frame.result)
            if frame.request_id != rid:
                self._drop(conn)
                raise IntegrityError("the blob server answered out of order")
            results.append(frame)
        return results

    def _pushed(self, push: protocol.Push) -> None:
        """Take in a root push (ignored unless the primary subscribed to it)."""
        self.pushes += 1
        self._note_root(push.database, push.seq, pending=True)

    def _note_root(self, database: str, seq: int, *, pending: bool = False) -> None:
        """Remember a root seq the store is known to have reached, if the primary has
        subscribed to ``database``. Only the primary's own subscribing root read, and the
        pushes it takes in meanwhile (``pending``), may fill in an entry whose subscription
        is still under way: an older seq seen elsewhere must not stand for a root that
        commits made before the subscription took effect may already have replaced."""
        if type(seq) is not int or not 0 <= seq < MAX_SEQ:
            return
        with self._subs_lock:
            if database not in self._subs:
                return
            known = self._subs[database]
            if known is None:
                if pending:
                    self._subs[database] = seq
            else:
                self._subs[database] = max(known, seq)

    def _stale(self) -> bool:
        """Whether the idle primary connection has something to read before we asked
        anything (a push, or the end of the stream after a restart or an idle timeout)."""
        sock = self._primary.sock
        if sock is None:
            return True
        try:
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _drain(self, conn: _Connection | None = None) -> bool:
        """Read, without waiting, whatever the server sent unasked on a connection (the
        primary by default); return whether it is still usable. Pushes are taken in (on
        the primary; a pooled connection never subscribed, so it ignores them); anything
        else (end of stream after a restart or idle timeout, an unsolicited error, a stray
        or malformed frame) drops the connection and returns False."""
        conn = self._primary if conn is None else conn
        sock = conn.sock
        if sock is None:
            return False
        while True:
            try:
                # A TLS socket may hold decrypted bytes that select() cannot see.
                pending = isinstance(sock, ssl_module.SSLSocket) and sock.pending() > 0
                if not pending and not select.select([sock], [], [], 0)[0]:
                    return True
                frame = protocol.parse_server_frame(conn.receiver.recv(sock))
            except (protocol.ProtocolError, OSError, ValueError):
                frame = None
            if not isinstance(frame, protocol.Push):
                self._drop(conn)
                return False
            if conn is self._primary:
                self._pushed(frame)

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
            with self._subs_lock:
                if database not in self._subs:
                    return None
            if not self._drain():
                return None
            with self._subs_lock:
                return self._subs.get(database)
        finally:
            self._lock.release()

    def _call_many(
        self, requests: list[tuple[str, dict]], *, idempotent: bool, raw: bool = False
    ) -> list[Any]:
        """Exchange requests on a live connection, the primary if it is free, else a pooled
        one (reconnecting as needed); ``raw`` returns each ``protocol.Response`` instead of
        raising on an error answer."""
        conn = self._take()
        try:
            return self._call_on(conn, requests, idempotent=idempotent, raw=raw)
        finally:
            self._give(conn)

    def _call_on(
        self,
        conn: _Connection,
        requests: list[tuple[str, dict]],
        *,
        idempotent: bool,
        raw: bool,
    ) -> list[Any]:
        if conn.sock is not None:
            self._drain(conn)  # takes in pushes; drops a connection the server closed
        for attempt in range(2):
            if conn.sock is None:
                self._connect(conn)
            try:
                if raw:
                    return self._exchange_on(requests, conn)
                return self._exchange(requests, conn)
            except _DroppedError as exc:
                self._drop(conn)
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

    def _call(self, op: str, args: dict, *, idempotent: bool = True) -> Any:
        return self._call_many([(op, args)], idempotent=idempotent)[0]

    def ping(self) -> dict:
        """Ask the server for its time (not counted as a storage round trip)."""
        return self._call("ping", {})

    def server_stats(self, database: str) -> dict:
        """Return the storage statistics of ``database`` (this tenant's only), with
        ``tenant``: the tenant's usage and quota (``blobs``, ``bytes``, ``databases``,
        ``max_blobs``, ``max_bytes``; a limit of None means none), on a server with
        commit leases, ``lease``: ``held`` (0 or 1) and ``waiting`` (clients queued), and
        on a server with fairness limits, ``fairness``: the tenant's ``max_connections``,
        ``max_frame_memory``, ``rate``, ``burst`` (None: no limit) and what it holds now,
        ``connections`` and ``frame_memory`` (bytes)."""
        return self._call("stats", {"database": database})

    # -- the storage operations --------------------------------------------------------------

    def _get_blobs(self, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        wanted = list(dict.fromkeys(ids))
        found: dict[bytes, bytes] = {}
        while wanted:
            step = protocol.MAX_IDS_PER_REQUEST
            chunks = [wanted[i : i + step] for i in range(0, len(wanted), step)]
            answers = self._call_many(
                [("get_blobs", {"database": database, "ids": chunk}) for chunk in chunks],
                idempotent=True,
            )
            deferred: list[bytes] = []
            for chunk, answer in zip(chunks, answers, strict=True):
                blobs, later = _blob_answer(answer)
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
        self, database: str, before: list[tuple[str, dict]]
    ) -> tuple[list[Any], RootRecord]:
        """Read the root, after the idempotent reads ``before`` in the same round trip;
        return their answers and the root."""
        if self._lock.acquire(blocking=False):
            try:
                return self._read_root_primary(database, before)
            finally:
                self._give(self._primary)
        with self._subs_lock:
            settled = type(self._subs.get(database)) is int or database in self._no_push
        if not settled:  # the first root read subscribes: on the primary, whose turn we await
            with self._lock:
                return self._read_root_primary(database, before)
        # Subscribed (or refused) already: any connection may read the root, and the seq
        # it finds is one the store reached, so it is folded in like a commit's.
        *answers, answer = self._call_many(
            [*before, ("get_root", {"database": database})], idempotent=True
        )
        root = _root(answer)
        self._note_root(database, root.seq)
        return answers, root

    def _read_root_primary(
        self, database: str, before: list[tuple[str, dict]]
    ) -> tuple[list[Any], RootRecord]:
        """Read the root on the primary connection (``_lock`` held), subscribing first if
        it has not subscribed to ``database`` yet."""
        if self._primary.sock is not None:
            self._drain()  # a dropped connection leaves no subscription behind
        with self._subs_lock:
            subscribed = database in self._subs or database in self._no_push
            if not subscribed:
                # The entry exists before the exchange so that a push arriving between
                # the two answers is kept.
                self._subs[database] = None
        if subscribed:
            *answers, answer = self._call_many(
                [*before, ("get_root", {"database": database})], idempotent=True
            )
            root = _root(answer)
            self._note_root(database, root.seq)  # only if still subscribed (same socket)
            return answers, root
        # Subscribe first, in the same round trip: every commit the root read misses is
        # then pushed.
        try:
            *answers, subscribed_answer, answer = self._call_many(
                [
                    *before,
                    ("subscribe", {"database": database}),
                    ("get_root", {"database": database}),
                ],
                idempotent=True,
                raw=True,
            )
        except BaseException:
            with self._subs_lock:
                self._subs.pop(database, None)
            raise
        if not answer.ok:
            with self._subs_lock:
                self._subs.pop(database, None)
            raise _error(*answer.result)
        root = _root(answer.result)
        if (
            subscribed_answer.ok
            and type(subscribed_answer.result) is dict
            and subscribed_answer.result.get("subscribed") is True
        ):
            # A no-op if the connection was replaced during the exchange (the entry
            # went with it): the next root read subscribes again.
            self._note_root(database, root.seq, pending=True)
        else:  # pushes off, an old server, or too many subscriptions: read every time
            with self._subs_lock:
                self._subs.pop(database, None)
                self._no_push.add(database)
        for other in answers:
            if not other.ok:
                raise _error(*other.result)
        return [other.result for other in answers], root

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
            raise _write_error(*response.result)
        answer = response.result
        if (
            type(answer) is not dict
            or type(answer.get("ok")) is not bool
            or type(answer.get("wait", False)) is not bool
        ):
            raise IntegrityError("the blob server sent a malformed commit answer")
        result = CommitResult(answer["ok"], _root(answer), answer.get("wait", False))
        # Either way the answer names a root the store really had (the committer gets no
        # push of its own commit). Any seq the store is known to have reached is safe to
        # fold in: the subscription only has to vouch for commits after its root read.
        # (A commit through a pooled connection is also pushed to the primary.)
        self._note_root(database, result.root.seq)
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
                error = _write_error(*response.result)
                if not isinstance(error, REFUSALS):
                    raise error
                outcomes.append(error)
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
            or (answer["granted"] and _lease_token(answer.get("token")) is None)
        ):
            raise IntegrityError("the blob server sent a malformed lease answer")
        root = _root(answer)
        self._note_root(database, root.seq)
        return (answer["token"] if answer["granted"] else None), root

    def _release_lease(self, database: str, token: object) -> None:
        answer = self._call("release_lease", {"database": database, "token": token})
        if type(answer) is not dict or type(answer.get("released")) is not bool:
            raise IntegrityError("the blob server sent a malformed lease answer")

    def _allocate_ids(self, database: str, sequence: str, count: int) -> int:
        # Retrying is safe: a lost block only leaves a gap in the ids.
        return self._call(
            "allocate_ids", {"database": database, "sequence": sequence, "count": count}
        )

    def _get_keyring(self, database: str, name: str) -> bytes | None:
        return self._call("get_keyring", {"database": database, "name": name})

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


def _root(answer: object) -> RootRecord:
    if type(answer) is not dict or type(answer.get("data")) is not bytes:
        raise IntegrityError("the blob server sent a malformed root")
    return RootRecord(answer.get("seq"), answer["data"])  # the base class checks seq


def _blob_answer(answer: object) -> tuple[dict[bytes, bytes], list[bytes]]:
    if type(answer) is not dict or set(answer) != {"blobs", "deferred"}:
        raise IntegrityError("the blob server sent a malformed blob answer")
    blobs, deferred = answer["blobs"], answer["deferred"]
    if type(blobs) is not dict or type(deferred) is not list:
        raise IntegrityError("the blob server sent a malformed blob answer")
    # The blobs' types are checked by Transport.get_blobs, with every store's.
    if not all_bytes(deferred):
        raise IntegrityError("the blob server sent a blob answer with something not bytes")
    return blobs, deferred


def _announced_limits(answer: dict) -> RequestLimits:
    """The per-request limits a login answer announces, or ``FALLBACK_LIMITS`` for a
    server that announces none; malformed ones are refused (fail closed)."""
    announced = answer.get("limits")
    if announced is None:
        return FALLBACK_LIMITS
    blobs = announced.get("max_commit_blobs") if type(announced) is dict else None
    size = announced.get("max_commit_bytes") if type(announced) is dict else None
    if type(blobs) is not int or type(size) is not int or blobs < 1 or size < 1:
        raise IntegrityError("the blob server announced malformed request limits")
    return request_limits(blobs, size)


def _announced_durability(answer: dict) -> dict[str, str] | None:
    """What a login answer says of the server's storage (None: it does not say); a
    malformed one is refused (fail closed)."""
    told = answer.get("durability")
    if told is None:
        return None
    if (
        type(told) is not dict
        or set(told) != {"mode", "detail"}
        or type(told["mode"]) is not str
        or type(told["detail"]) is not str
        or not 0 < len(told["mode"]) <= protocol.MAX_OP_LENGTH
        or len(told["detail"]) > protocol.MAX_MESSAGE_LENGTH
    ):
        raise IntegrityError("the blob server announced a malformed durability")
    return {"mode": told["mode"], "detail": told["detail"]}


def _lease_token(token: object) -> bytes | None:
    """A lease token from the server, or None if it is not one."""
    if type(token) is bytes and len(token) == LEASE_TOKEN_BYTES:
        return token
    return None


def _announced_lease(answer: dict) -> float | None:
    """How long a commit lease lasts, as a login answer announces it (None: the server
    has none); a malformed one is refused (fail closed)."""
    timeout = answer.get("commit_lease")
    if timeout is None:
        return None
    if type(timeout) not in (int, float) or not 0 < timeout < float("inf"):
        raise IntegrityError("the blob server announced a malformed commit lease")
    return float(timeout)


def _announced_retention(answer: dict) -> float:
    """The garbage retention a login answer announces, or the default that servers which
    announce none always used; a malformed one is refused (fail closed)."""
    retention = answer.get("garbage_retention", DEFAULT_RETENTION_SECONDS)
    if type(retention) not in (int, float) or not 0 <= retention < float("inf"):
        raise IntegrityError("the blob server announced a malformed garbage retention")
    return float(retention)


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


def _write_error(code: object, message: object) -> Exception:
    """Map the error answer to a commit or stage: ``too_large`` (the server's limits
    changed since login, or one blob is past them) is ``CommitTooLargeError``."""
    if code == protocol.TOO_LARGE:
        return CommitTooLargeError(f"blob server: {message} ({code})")
    return _error(code, message)


def _error(code: object, message: object) -> Exception:
    """Map an error answer to the exception a local store would have raised. Outages and
    limits of the moment are ``OperationalError`` subclasses saying "retry later"; only
    a malformed answer (raised where it is read) is an ``IntegrityError``."""
    text = f"blob server: {message} ({code})"
    if code == protocol.RATE_LIMITED:  # failed logins, or the tenant's request rate
        return RateLimitedError(f"{text}; {RETRY_LATER}")
    # At login: the tenant holds all the connections it may; or a request found no room
    # in the server's frame memory (it was not carried out).
    if code == protocol.BUSY:
        return ServerBusyError(f"{text}; {RETRY_LATER}")
    if code in _AUTH_CODES:
        return AuthenticationError(text)
    if code == protocol.BLOB_EXISTS:
        return BlobExistsError(text)
    if code == protocol.NOT_STAGED:
        return NotStagedError(text)
    if code == protocol.QUOTA:
        return QuotaExceededError(text)
    if code in (protocol.BAD_REQUEST, protocol.TOO_LARGE, protocol.UNKNOWN_OP):
        return InvalidRequestError(text)
    # ``unavailable`` (the server's storage, e.g. Redis, is down), ``internal`` (the
    # server failed; its log says why) and any code this client does not know.
    return StoreUnavailableError(f"{text}; {RETRY_LATER}")
