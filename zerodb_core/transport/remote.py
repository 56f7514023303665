"""The remote store: the blob server over one persistent TCP (optionally TLS) connection.

Connecting logs in with the random secp256k1 login key (challenge-response, see
``blob_server.auth``); the server then binds the connection to the key's tenant. The two
login round trips are connection setup and are not counted; every storage call is one
counted round trip, as with the embedded store (a ``get_blobs`` too large for one frame is
split into chunks that are pipelined: sent together, answered together).

A dropped connection is re-opened with backoff and a fresh login. Reads are retried once
on a new connection; a commit or keyring write whose answer was lost is not (its outcome
is unknown, and replaying a commit is not idempotent): it raises
``StoreUnavailableError``.

Everything the server answers is checked before use: a malformed answer raises
``IntegrityError`` and drops the connection (it cannot be trusted to be in step any more).

Server pinning: the transport logs in only to a server whose id (sent in the challenge,
and part of the signed login digest) is ``server_id`` when one is given (the key file
records it), and otherwise to the id its first login saw: a reconnect that reaches a
server with another id (a DNS or routing change, an attacker's server) raises
``AuthenticationError`` naming both ids before anything is signed.

Root pushes: the first root read of a database on a connection is sent as
``subscribe`` + ``get_root`` pipelined (one round trip). From then on the server pushes
``[0, "root", {database, seq}]`` after every commit through it by another connection of
this tenant; pushes are read wherever they turn up: between answers inside an exchange,
and before every request and every ``known_root_seq`` question (a non-blocking look at
the socket, ``_drain``). Per database the connection keeps the highest seq it knows from
pushes, root reads and commit answers since it subscribed; ``known_root_seq`` returns
it, and the ``DB`` skips the root read while it equals the root it last verified.

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
import os
import select
import socket
import ssl as ssl_module
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from coincurve import PrivateKey

from blob_server import protocol
from blob_server.exceptions import BlobExistsError, InvalidRequestError
from blob_server.storage.base import BLOB_ID_SIZE, CommitResult, RootRecord
from zerodb_core.exceptions import (
    AuthenticationError,
    CommitTooLargeError,
    IntegrityError,
    QueryError,
    QuotaExceededError,
    StoreUnavailableError,
)
from zerodb_core.transport.base import MAX_SEQ, Transport

DEFAULT_TIMEOUT = 30.0
CONNECT_ATTEMPTS = 5
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0

_AUTH_CODES = {protocol.AUTH_FAILED, protocol.RATE_LIMITED, protocol.UNAUTHENTICATED}
# msgpack overhead of a commit request besides its payload bytes: per blob (a map entry
# of a 16-byte key and a bin header), per garbage id, and for the rest of the frame.
_COMMIT_BLOB_OVERHEAD = BLOB_ID_SIZE + 8
_COMMIT_FRAME_OVERHEAD = 256


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


class RemoteTransport(Transport):
    """Reach a blob server at ``(host, port)`` as ``tenant`` with a 32-byte login key.

    ``ssl`` turns on TLS (``server_hostname`` is the name the certificate must carry,
    ``host`` by default); ``timeout`` bounds connecting and every answer; ``server_id``
    pins the server's id (see the module docstring).
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
    ) -> None:
        super().__init__(delay=delay)
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
        # The id every login must find: the pinned one, else the first one seen.
        self.server_id: str | None = server_id
        self.reconnects = 0  # connections opened after the first one
        self._connected = False
        self._sock: socket.socket | None = None
        # Per subscribed database of the current connection, the highest root seq known
        # since subscribing (None: subscribed, nothing known yet). Cleared with the socket.
        self._subs: dict[str, int | None] = {}
        self._no_push: set[str] = set()  # refused a subscription on this connection
        self.pushes = 0
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._receiver = protocol.FrameReceiver()
        self._connect()

    # -- connection ------------------------------------------------------------------------

    def _connect(self) -> None:
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
            self._sock = sock
            try:
                self._login()
            except _DroppedError as exc:
                self._drop()
                last = exc
                continue
            except BaseException:
                self._drop()
                raise
            if self._connected:
                self.reconnects += 1
            self._connected = True
            return
        raise StoreUnavailableError(
            f"cannot reach the blob server at {self.host}:{self.port}: {last}"
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

    def _login(self) -> None:
        challenge = self._exchange([("challenge", {})])[0]
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
        answer = self._exchange([("login", args)])[0]
        if type(answer) is not dict or answer.get("tenant") != self.tenant:
            raise IntegrityError("the blob server sent a malformed login answer")
        self.server_id = server_id

    def _drop(self) -> None:
        self._subs.clear()  # a new connection has no subscription: nothing is known
        self._no_push.clear()
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        with self._lock:
            self._drop()

    # -- requests --------------------------------------------------------------------------

    def _exchange(self, requests: list[tuple[str, dict]]) -> list[Any]:
        """Send requests back to back, read their answers; raise ``_DroppedError`` on network
        errors, the mapped exception on an error answer."""
        responses = self._exchange_responses(requests)
        for response in responses:
            if not response.ok:
                raise _error(*response.result)
        return [response.result for response in responses]

    def _exchange_responses(self, requests: list[tuple[str, dict]]) -> list[protocol.Response]:
        """Send requests back to back, read their answers (taking in any pushes between
        them) and return them, errors included; raise ``_DroppedError`` on network
        errors."""
        sock = self._sock
        if sock is None:
            raise _DroppedError(ConnectionError("not connected"), sent=False)
        ids = [next(self._ids) for _ in requests]
        try:
            payload = b"".join(
                protocol.request_frame(rid, op, args)
                for rid, (op, args) in zip(ids, requests, strict=True)
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
                    frame = protocol.parse_server_frame(self._receiver.recv(sock))
                except protocol.ProtocolError as exc:
                    self._drop()
                    raise IntegrityError(
                        f"the blob server sent a malformed answer: {exc}"
                    ) from None
                except OSError as exc:  # ConnectionError and timeouts are OSErrors
                    raise _DroppedError(exc, sent=True) from None
                if not isinstance(frame, protocol.Push):
                    break
                self._pushed(frame)
            if frame.request_id != rid:
                self._drop()
                raise IntegrityError("the blob server answered out of order")
            results.append(frame)
        return results

    def _pushed(self, push: protocol.Push) -> None:
        """Take in a root push (ignored unless this connection subscribed to it)."""
        self.pushes += 1
        if push.database in self._subs:
            self._note_root(push.database, push.seq)

    def _note_root(self, database: str, seq: int) -> None:
        """Remember a root seq seen on this connection after subscribing to ``database``."""
        if database in self._subs and type(seq) is int and 0 <= seq < MAX_SEQ:
            known = self._subs[database]
            self._subs[database] = seq if known is None else max(known, seq)

    def _stale(self) -> bool:
        """Whether the idle connection has something to read before we asked anything
        (a push, or the end of the stream after a restart or an idle timeout)."""
        sock = self._sock
        if sock is None:
            return True
        try:
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _drain(self) -> bool:
        """Read, without waiting, whatever the server sent unasked; return whether the
        connection is still usable. Pushes are taken in; anything else (end of stream
        after a restart or idle timeout, an unsolicited error, a stray or malformed frame)
        drops the connection and returns False."""
        sock = self._sock
        if sock is None:
            return False
        while True:
            try:
                # A TLS socket may hold decrypted bytes that select() cannot see.
                pending = isinstance(sock, ssl_module.SSLSocket) and sock.pending() > 0
                if not pending and not select.select([sock], [], [], 0)[0]:
                    return True
                frame = protocol.parse_server_frame(self._receiver.recv(sock))
            except (protocol.ProtocolError, OSError, ValueError):
                frame = None
            if not isinstance(frame, protocol.Push):
                self._drop()
                return False
            self._pushed(frame)

    def known_root_seq(self, database: str) -> int | None:
        """The root seq of ``database`` as far as this connection's subscription knows:
        every commit through the server since it subscribed has been pushed, so the root
        is this seq unless a newer push is still on its way. None when not subscribed
        (not yet, refused, or the connection was lost). No round trip."""
        with self._lock:
            if database not in self._subs or not self._drain():
                return None
            return self._subs.get(database)

    def _call_many(
        self, requests: list[tuple[str, dict]], *, idempotent: bool, raw: bool = False
    ) -> list[Any]:
        """Exchange requests on a live connection (reconnecting as needed); ``raw`` returns
        each ``protocol.Response`` instead of raising on an error answer."""
        exchange = self._exchange_responses if raw else self._exchange
        with self._lock:
            if self._sock is not None:
                self._drain()  # takes in pushes; drops a connection the server closed
            for attempt in range(2):
                if self._sock is None:
                    self._connect()
                try:
                    return exchange(requests)
                except _DroppedError as exc:
                    self._drop()
                    if exc.sent and not idempotent:
                        raise StoreUnavailableError(
                            "the connection to the blob server dropped during a write; its "
                            "outcome is unknown"
                        ) from None
                    if attempt:
                        raise StoreUnavailableError(
                            f"the blob server connection failed: {exc}"
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
        ``max_blobs``, ``max_bytes``; a limit of None means none)."""
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
        with self._lock:
            if self._sock is not None:
                self._drain()  # a dropped connection leaves no subscription behind
            if database in self._subs or database in self._no_push:
                root = _root(self._call("get_root", {"database": database}))
                self._note_root(database, root.seq)  # only if still subscribed (same socket)
                return root
            # Subscribe first, in the same round trip: every commit the root read misses is
            # then pushed. The entry exists before the exchange so that a push arriving
            # between the two answers is kept.
            self._subs[database] = None
            try:
                subscribed, answer = self._call_many(
                    [("subscribe", {"database": database}), ("get_root", {"database": database})],
                    idempotent=True,
                    raw=True,
                )
            except BaseException:
                self._subs.pop(database, None)
                raise
            if not answer.ok:
                self._subs.pop(database, None)
                raise _error(*answer.result)
            root = _root(answer.result)
            if (
                subscribed.ok
                and type(subscribed.result) is dict
                and subscribed.result.get("subscribed") is True
            ):
                # A no-op if the connection was replaced during the exchange (the entry
                # went with it): the next root read subscribes again.
                self._note_root(database, root.seq)
            else:  # pushes off, an old server, or too many subscriptions: read every time
                self._subs.pop(database, None)
                self._no_push.add(database)
            return root

    def _commit(
        self,
        database: str,
        *,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: list[bytes],
    ) -> CommitResult:
        size = (
            len(root)
            + sum(len(data) + _COMMIT_BLOB_OVERHEAD for data in blobs.values())
            + len(garbage) * _COMMIT_BLOB_OVERHEAD
            + _COMMIT_FRAME_OVERHEAD
        )
        if size > protocol.MAX_FRAME_BYTES or len(blobs) > protocol.MAX_IDS_PER_REQUEST:
            raise CommitTooLargeError(
                f"a commit of {len(blobs)} blobs and about {size} bytes does not fit one "
                f"request (at most {protocol.MAX_IDS_PER_REQUEST} blobs and "
                f"{protocol.MAX_FRAME_BYTES} bytes); split the transaction"
            )
        (response,) = self._call_many(
            [
                (
                    "commit",
                    {
                        "database": database,
                        "expected_seq": expected_seq,
                        "root": root,
                        "blobs": dict(blobs),
                        "garbage": list(garbage),
                    },
                )
            ],
            idempotent=False,
            raw=True,
        )
        if not response.ok:
            code, message = response.result
            if code == protocol.TOO_LARGE:
                raise CommitTooLargeError(f"blob server: {message} ({code})")
            raise _error(code, message)
        answer = response.result
        if type(answer) is not dict or type(answer.get("ok")) is not bool:
            raise IntegrityError("the blob server sent a malformed commit answer")
        result = CommitResult(answer["ok"], _root(answer))
        # Either way the answer names a root the store really had (the committer gets no
        # push of its own commit). Any seq the store is known to have reached is safe to
        # fold in: the subscription only has to vouch for commits after its root read.
        with self._lock:
            self._note_root(database, result.root.seq)
        return result

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
    if not all(type(k) is bytes and type(v) is bytes for k, v in blobs.items()) or not all(
        type(i) is bytes for i in deferred
    ):
        raise IntegrityError("the blob server sent a blob answer with something not bytes")
    return blobs, deferred


def _error(code: object, message: object) -> Exception:
    """Map an error answer to the exception a local store would have raised."""
    text = f"blob server: {message} ({code})"
    if code in _AUTH_CODES:
        return AuthenticationError(text)
    if code == protocol.BLOB_EXISTS:
        return BlobExistsError(text)
    if code == protocol.QUOTA:
        return QuotaExceededError(text)
    if code in (protocol.BAD_REQUEST, protocol.TOO_LARGE, protocol.UNKNOWN_OP):
        return InvalidRequestError(text)
    return StoreUnavailableError(text)
