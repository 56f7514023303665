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
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import ssl as ssl_module
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from coincurve import PrivateKey

from blob_server import protocol
from blob_server.exceptions import BlobExistsError, InvalidRequestError, QuotaExceededError
from blob_server.storage.base import CommitResult, RootRecord
from zerodb_core.exceptions import AuthenticationError, IntegrityError, StoreUnavailableError
from zerodb_core.transport.base import Transport

DEFAULT_TIMEOUT = 30.0
CONNECT_ATTEMPTS = 5
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0

_AUTH_CODES = {protocol.AUTH_FAILED, protocol.RATE_LIMITED, protocol.UNAUTHENTICATED}


class _DroppedError(Exception):
    """The connection failed; ``sent`` tells whether the request may have reached the server."""

    def __init__(self, cause: BaseException, *, sent: bool) -> None:
        super().__init__(str(cause))
        self.sent = sent


class RemoteTransport(Transport):
    """Reach a blob server at ``(host, port)`` as ``tenant`` with a 32-byte login key."""

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
        self.server_id: str | None = None
        self.reconnects = 0
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
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
        error: Exception | None = None
        for rid in ids:
            try:
                body = protocol.recv_frame(sock)
                response = protocol.parse_response(body)
            except protocol.ProtocolError as exc:
                self._drop()
                raise IntegrityError(f"the blob server sent a malformed answer: {exc}") from None
            except OSError as exc:  # ConnectionError and timeouts are OSErrors
                raise _DroppedError(exc, sent=True) from None
            if response.request_id != rid:
                self._drop()
                raise IntegrityError("the blob server answered out of order")
            if response.ok:
                results.append(response.result)
            elif error is None:
                error = _error(*response.result)
        if error is not None:
            raise error
        return results

    def _stale(self) -> bool:
        """Whether the idle connection has something to read before we asked anything: the
        server closed it (restart, idle timeout) or sent an unsolicited error."""
        sock = self._sock
        if sock is None:
            return True
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _call_many(self, requests: list[tuple[str, dict]], *, idempotent: bool) -> list[Any]:
        with self._lock:
            if self._sock is not None and self._stale():
                self._drop()
                self.reconnects += 1
            for attempt in range(2):
                if self._sock is None:
                    self._connect()
                    self.reconnects += attempt
                try:
                    return self._exchange(requests)
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
        """Return the storage statistics of ``database`` (this tenant's only)."""
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
        return _root(self._call("get_root", {"database": database}))

    def _commit(
        self,
        database: str,
        *,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: list[bytes],
    ) -> CommitResult:
        answer = self._call(
            "commit",
            {
                "database": database,
                "expected_seq": expected_seq,
                "root": root,
                "blobs": dict(blobs),
                "garbage": list(garbage),
            },
            idempotent=False,
        )
        if type(answer) is not dict or type(answer.get("ok")) is not bool:
            raise IntegrityError("the blob server sent a malformed commit answer")
        return CommitResult(answer["ok"], _root(answer))

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
