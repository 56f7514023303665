"""One connection to a blob server: the socket, logging in on it, and exchanging frames.

Connecting logs in with the random secp256k1 login key (challenge-response, see
``blob_server.auth``); the server then binds the connection to the key's tenant. The two
login round trips are connection setup and are not counted.

Requests are pipelined: sent back to back, their answers read in order; a push the
server sends between answers is handed to the caller's ``on_push`` (the primary
connection's subscriptions) or ignored (a pooled connection never subscribes).
Everything the server answers is checked before use (``answers``): a malformed frame, or
an answer out of order, drops the connection and raises ``IntegrityError``.

Server pinning: a login goes only to a server whose id (sent in the challenge, and part
of the signed login digest) is the pinned one when one is given; a server with another
id (a DNS or routing change, an attacker's server) raises ``AuthenticationError`` naming
both ids before anything is signed.

What to do when a connection drops (reconnect, retry, give up) is the transport's
(``remote``); here a drop is ``DroppedError``, saying whether the request may have
reached the server.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import socket
import ssl as ssl_module
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coincurve import PrivateKey

from blob_server.wire import protocol
from blob_server.wire.exceptions import InvalidRequestError
from zerodb_core.exceptions import (
    AuthenticationError,
    IntegrityError,
    QueryError,
    StoreUnavailableError,
)
from zerodb_core.transport import answers
from zerodb_core.transport.staging import RequestLimits

#: Called with each root push read on a connection that subscribed.
OnPush = Callable[[protocol.Push], None]


class DroppedError(Exception):
    """The connection failed; ``sent`` tells whether the request may have reached the server."""

    def __init__(self, cause: BaseException, *, sent: bool) -> None:
        super().__init__(str(cause))
        self.sent = sent


class ClosedByServerError(DroppedError):
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


def tls_context(
    tls: bool | ssl_module.SSLContext | None, ca_file: str | os.PathLike[str] | None = None
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


def open_socket(
    address: tuple[str, int],
    timeout: float,
    ssl: ssl_module.SSLContext | None,
    server_hostname: str,
) -> socket.socket:
    """Open a TCP connection (TLS with ``ssl``) without Nagle's delay."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl is not None:
            return ssl.wrap_socket(sock, server_hostname=server_hostname)
    except BaseException:
        sock.close()
        raise
    return sock


class Connection:
    """One socket (logged in once ``sock`` is set), its frame buffers and its request
    ids. Used by one thread at a time (``pool``). ``on_drop`` is called whenever the
    socket is given up (the primary's subscriptions go with it)."""

    __slots__ = ("epoch", "ids", "on_drop", "packer", "receiver", "sock")

    def __init__(self, epoch: int = 0, on_drop: Callable[[], None] | None = None) -> None:
        self.sock: socket.socket | None = None
        self.packer = protocol.FramePacker()
        self.receiver = protocol.FrameReceiver()
        self.ids = itertools.count(1)
        self.epoch = epoch  # the transport's close count when it was last given back
        self.on_drop = on_drop

    def drop(self) -> None:
        """Close the socket; the connection is opened again when next used."""
        if self.on_drop is not None:
            self.on_drop()
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def exchange(
        self, requests: list[tuple[str, dict[str, Any]]], on_push: OnPush | None
    ) -> list[protocol.Response]:
        """Send requests back to back, read their answers (taking in any pushes between
        them) and return them, errors included; raise ``DroppedError`` on network
        errors."""
        sock = self.sock
        if sock is None:
            raise DroppedError(ConnectionError("not connected"), sent=False)
        ids = [next(self.ids) for _ in requests]
        try:
            payload = b"".join(
                part
                for rid, (op, args) in zip(ids, requests, strict=True)
                for part in self.packer.request(rid, op, args)
            )
        except protocol.FrameTooLargeError as exc:
            raise InvalidRequestError(f"request too large for the protocol: {exc}") from None
        try:
            sock.sendall(payload)
        except OSError as exc:
            raise DroppedError(exc, sent=True) from None
        results = []
        for rid in ids:
            while True:
                try:
                    frame = protocol.parse_server_frame(self.receiver.recv(sock))
                except protocol.ProtocolError as exc:
                    self.drop()
                    raise IntegrityError(
                        f"the blob server sent a malformed answer: {exc}"
                    ) from None
                except OSError as exc:  # ConnectionError and timeouts are OSErrors
                    raise DroppedError(exc, sent=True) from None
                if not isinstance(frame, protocol.Push):
                    break
                if on_push is not None:
                    on_push(frame)
            if frame.request_id == protocol.PUSH_ID and not frame.ok:
                raise ClosedByServerError(*frame.result)
            if frame.request_id != rid:
                self.drop()
                raise IntegrityError("the blob server answered out of order")
            results.append(frame)
        return results

    def call(self, requests: list[tuple[str, dict[str, Any]]], on_push: OnPush | None) -> list[Any]:
        """``exchange``, raising the mapped exception on an error answer."""
        responses = self.exchange(requests, on_push)
        for response in responses:
            if not response.ok:
                raise answers.error(*response.result)
        return [response.result for response in responses]

    def drain(self, on_push: OnPush | None) -> bool:
        """Read, without waiting, whatever the server sent unasked; return whether the
        connection is still usable. Pushes go to ``on_push``; anything else (end of
        stream after a restart or idle timeout, an unsolicited error, a stray or
        malformed frame) drops the connection and returns False."""
        sock = self.sock
        if sock is None:
            return False
        while True:
            try:
                # A TLS socket may hold decrypted bytes that select() cannot see.
                pending = isinstance(sock, ssl_module.SSLSocket) and sock.pending() > 0
                if not pending and not select.select([sock], [], [], 0)[0]:
                    return True
                frame = protocol.parse_server_frame(self.receiver.recv(sock))
            except (protocol.ProtocolError, OSError, ValueError):
                frame = None
            if not isinstance(frame, protocol.Push):
                self.drop()
                return False
            if on_push is not None:
                on_push(frame)


@dataclass(frozen=True, slots=True)
class Login:
    """What a login answer announced: the server's id, per-request limits, garbage
    retention, commit lease timeout (None: no leases) and durability (None: not said)."""

    server_id: str
    limits: RequestLimits
    garbage_retention: float
    lease_timeout: float | None
    durability: dict[str, str] | None


def login(
    conn: Connection,
    key: PrivateKey,
    tenant: str,
    pinned: str | None,
    address: tuple[str, int],
) -> Login:
    """Log in on a freshly opened connection as ``tenant`` (challenge, then the signed
    login), to a server with id ``pinned`` when one is given."""
    challenge = conn.call([("challenge", {})], None)[0]
    if (
        type(challenge) is not dict
        or type(challenge.get("server_id")) is not str
        or type(challenge.get("nonce")) is not bytes
        or len(challenge["nonce"]) != protocol.NONCE_BYTES
    ):
        raise IntegrityError("the blob server sent a malformed challenge")
    server_id = challenge["server_id"]
    if pinned is not None and server_id != pinned:
        # Before signing anything: a login for another server is not ours to give.
        host, port = address
        raise AuthenticationError(
            f"the blob server at {host}:{port} has id {server_id!r}, but this "
            f"client is pinned to server id {pinned!r} (recorded in the key file "
            "at the first login): refusing to log in to a different server"
        )
    timestamp = int(time.time())
    public_key = key.public_key.format(compressed=True)
    digest = protocol.login_digest(server_id, tenant, public_key, challenge["nonce"], timestamp)
    args = {
        "tenant": tenant,
        "public_key": public_key,
        "time": timestamp,
        "signature": key.sign(digest, hasher=None),
    }
    answer = conn.call([("login", args)], None)[0]
    if type(answer) is not dict or answer.get("tenant") != tenant:
        raise IntegrityError("the blob server sent a malformed login answer")
    return Login(
        server_id=server_id,
        limits=answers.announced_limits(answer),
        garbage_retention=answers.announced_retention(answer),
        lease_timeout=answers.announced_lease(answer),
        durability=answers.announced_durability(answer),
    )
