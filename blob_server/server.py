"""The asyncio TCP blob server: frames in, storage calls, frames out.

One task per connection reads frames and answers them in order (a client may pipeline:
it sends several requests and matches the answers by request id). Storage backends are
synchronous, so every storage call runs in a worker thread (``asyncio.to_thread``).

Trust boundary: everything a client sends is hostile. Frames are size-checked from their
header, bodies are decoded strictly (``protocol.parse_request``), every argument is
type-checked here and again by the storage layer, and a failure of any kind becomes an
error frame (or, when the stream cannot be trusted any more, a closed connection); other
connections never notice. After login the session's tenant is the only tenant any
storage call ever sees: requests have no way to name one (an unknown argument is refused).

Root pushes: a connection may ``subscribe`` to databases of its tenant. After every
successful commit the server writes ``[0, "root", {"database", "seq"}]`` to every other
subscribed connection of the committing tenant (never another tenant's), *before* it
answers the committer, so once a commit is acknowledged its push is already on its way to
every subscriber. A push carries the seq only, not the sealed root: a subscriber that
cares reads the root once (it usually needs new nodes anyway, so it saves at most one of
two round trips), while pushing roots would send every root (kilobytes to megabytes:
refs, catalog, text statistics) to every subscriber on every commit whether it ever
reads again or not. Pushes cover the commits of *every* server process on the storage:
each process follows the databases its clients subscribed to through the storage's
feed (``Storage.root_changes``: Redis pub/sub, published by the commit script itself)
and relays what it hears; a change heard twice (its own commit, then from the feed) is
pushed once. When the feed may have missed commits and cannot catch up at once, every
subscribed connection is closed (``_changes_lost``), so no client goes on trusting a
stale root. With ``push=False``, ``subscribe`` answers ``{"subscribed": False}`` and
clients read the root every time (only needed now for several processes on one SQLite
file, whose commits cannot be heard across processes). A subscriber that stops reading
(more than ``PUSH_BUFFER_LIMIT`` unsent bytes) is disconnected rather than skipped: a
silently missed push would make its client trust a stale root.

Limits: one request (a ``commit`` or a ``stage``) may carry at most
``max_commit_blobs`` new blobs and ``max_commit_bytes`` of blobs + root (``too_large``
otherwise: the frame limit alone would let one request hold Redis' single thread for a
64 MiB script). They bound a request, not a user's transaction: a client whose
transaction is larger stages its blobs in several ``stage`` requests and then commits
naming them (``staged``), so no legitimate transaction is refused for its size. A
request holding a single item (one blob in a stage, a root alone in a commit) is never
refused for its bytes, only past the per-blob limit. The login answer tells the client
the limits, so it never needs a round trip to learn them. Every write is checked
against the tenant's quota (tenants file, else the server's ``default_quota``) inside the
storage's atomic write (``quota`` answers say what is used and allowed); staged blobs
count from the moment they are staged. Pending blobs no commit claims within
``staging_timeout`` seconds (a client died mid-upload) are deleted by the garbage
collection task, and their usage given back.

Fairness (``blob_server.limits``, ``blob_server.frames``): a connection counts against
its address's budget until it logs in (the oldest anonymous one makes way for a
newcomer) and against its tenant's after; a frame's announced length is reserved in the
frame memory (the server's and the tenant's) before its body is read, and a frame must
arrive within the frame timeout; a logged-in tenant's requests are counted against its
request rate (``rate_limited`` when over). Each limit is a ``serve`` default that the
tenant's entry in the tenants file may override.

Commit leases (``blob_server.leases``): a client whose commit lost a race asks for the
database's lease (``acquire_lease``) and waits in a FIFO for its turn; while one client
holds it, the commits of every other client that takes part in leases (they send a
``lease`` argument, nil or their token) are answered ``wait`` instead of being tried. A
turn ends with the holder's successful commit, ``release_lease``, the end of the
holder's connection, or ``commit_lease_timeout`` seconds.

Logs are ``key=value`` lines and never contain blob contents, roots, keyrings or
signatures: only ops, sizes, counts, peers and tenants.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl as ssl_module
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from blob_server.auth import Authenticator, Challenge, LoginRefusedError
from blob_server.exceptions import (
    BlobExistsError,
    InvalidRequestError,
    NotStagedError,
    QuotaExceededError,
    ServerFullError,
    StorageUnavailableError,
    VolatileStorageError,
)
from blob_server.frames import (
    CHUNK_BYTES,
    DEFAULT_FRAME_TIMEOUT,
    FrameMemory,
    discard_body,
    read_body,
)
from blob_server.leases import (
    DEFAULT_LEASE_TIMEOUT,
    MAX_LEASE_WAIT,
    TOKEN_BYTES,
    CommitLeases,
)
from blob_server.limits import (
    DEFAULT_LOGIN_DEADLINE,
    DEFAULT_MAX_ANONYMOUS_PER_ADDRESS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_FRAME_MEMORY,
    ConnectionTable,
    RequestRates,
    TenantLimits,
    default_tenant_connections,
)
from blob_server.storage import Storage
from blob_server.storage.validation import (
    MAX_NAME_LENGTH,
    are_blob_ids,
    check_retention,
    check_seq,
)
from blob_server.wire import protocol
from blob_server.wire.storage import (
    BLOB_ID_SIZE,
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STAGING_TIMEOUT,
    NO_QUOTA,
    Durability,
    Quota,
    RootChanges,
)

#: Seconds a tenant's fairness limits are taken from the tenants file before it is looked
#: at again (a stat): changes apply within this time, and no request pays for the stat.
LIMITS_REFRESH = 1.0
DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_GC_INTERVAL = 60.0
WRITE_TIMEOUT = 30.0
#: Most new blobs in one commit or stage request (at most the protocol's ids per request).
DEFAULT_MAX_COMMIT_BLOBS = protocol.MAX_IDS_PER_REQUEST
#: Most bytes of new blobs (+ root) in one commit or stage request: as much as a get_blobs
#: answer carries, leaving room in the 64 MiB frame for the rest of the request.
DEFAULT_MAX_COMMIT_BYTES = protocol.MAX_RESPONSE_BLOB_BYTES
#: A subscriber with more unsent bytes than this (one largest answer and then some) is
#: not reading: it is disconnected instead of being sent more pushes.
PUSH_BUFFER_LIMIT = protocol.MAX_FRAME_BYTES + (1 << 20)

log = logging.getLogger("blob_server.server")

_conn_ids = itertools.count(1)


def _fmt(event: str, fields: dict[str, Any]) -> str:
    parts = [f"event={event}"]
    for key, value in fields.items():
        text = str(value)
        if not text or any(c in text for c in ' ="\n'):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


#: Characters of a storage error's message kept in the log line.
LOGGED_DETAIL = 300


def log_event(level: int, event: str, **fields: Any) -> None:
    """Log one structured ``event=... key=value`` line (values only, never contents)."""
    if log.isEnabledFor(level):
        log.log(level, _fmt(event, fields))


class RequestError(Exception):
    """An error answer for one request; the connection goes on."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Session:
    """One connection: its peer, pending challenge, (after login) its tenant, and the
    databases it subscribed to."""

    conn_id: int
    peer: str
    address: str
    challenge: Challenge | None = None
    tenant: str | None = None
    requests: int = 0
    started: float = field(default_factory=time.monotonic)
    writer: asyncio.StreamWriter | None = None
    subscriptions: set[str] = field(default_factory=set)
    reader: asyncio.StreamReader | None = None

    def alive(self) -> bool:
        """Whether the peer may still read an answer (it has not closed the connection)."""
        return not (
            (self.reader is not None and self.reader.at_eof())
            or (self.writer is not None and self.writer.is_closing())
        )


# -- argument checks ------------------------------------------------------------------------


def _args(args: dict, required: dict[str, type], optional: dict[str, type] | None = None) -> dict:
    """Return ``args`` if it has exactly the required (and maybe the optional) names with
    the right types; an unknown name is an error (a request cannot smuggle a tenant)."""
    optional = optional or {}
    unknown = set(args) - set(required) - set(optional)
    if unknown:
        raise RequestError(protocol.BAD_REQUEST, f"unknown argument(s): {sorted(unknown)!r}")
    for name in required:
        if name not in args:
            raise RequestError(protocol.BAD_REQUEST, f"missing argument {name!r}")
    for name, kind in {**required, **optional}.items():
        if name in args and not _is(args[name], kind):
            raise RequestError(protocol.BAD_REQUEST, f"argument {name!r} has the wrong type")
    return args


def _is(value: object, kind: type) -> bool:
    if kind is object:
        return True
    if kind is int:
        return type(value) is int
    if kind is type(None):
        return value is None
    return type(value) is kind


def _database(args: dict) -> str:
    name = args["database"]
    if not 0 < len(name) <= MAX_NAME_LENGTH or "\x00" in name:
        raise RequestError(protocol.BAD_REQUEST, "bad database name")
    return name


def _id_list(value: list, what: str) -> list[bytes]:
    if len(value) > protocol.MAX_IDS_PER_REQUEST:
        raise RequestError(
            protocol.TOO_LARGE, f"at most {protocol.MAX_IDS_PER_REQUEST} {what} per request"
        )
    return _blob_ids(value, what)


def _lease_token(value: object) -> bytes | None:
    if value is not None and (type(value) is not bytes or len(value) != TOKEN_BYTES):
        raise RequestError(protocol.BAD_REQUEST, f"a lease token is {TOKEN_BYTES} bytes or nil")
    return value


def _blob_ids(value: list, what: str) -> list[bytes]:
    if not are_blob_ids(value):
        raise RequestError(protocol.BAD_REQUEST, f"{what} must be {BLOB_ID_SIZE}-byte ids")
    return value


# -- the server -----------------------------------------------------------------------------


class BlobServer:
    """Serve one ``Storage`` to authenticated tenants over TCP (optionally TLS)."""

    def __init__(
        self,
        storage: Storage,
        authenticator: Authenticator,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_anonymous_per_address: int = DEFAULT_MAX_ANONYMOUS_PER_ADDRESS,
        tenant_limits: TenantLimits | None = None,
        max_frame_memory: int = DEFAULT_MAX_FRAME_MEMORY,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        login_deadline: float = DEFAULT_LOGIN_DEADLINE,
        gc_interval: float = DEFAULT_GC_INTERVAL,
        ssl: ssl_module.SSLContext | None = None,
        push: bool = True,
        default_quota: Quota = NO_QUOTA,
        max_commit_blobs: int = DEFAULT_MAX_COMMIT_BLOBS,
        max_commit_bytes: int = DEFAULT_MAX_COMMIT_BYTES,
        staging_timeout: float = DEFAULT_STAGING_TIMEOUT,
        garbage_retention: float = DEFAULT_RETENTION_SECONDS,
        durability: Durability | None = None,
        admit: Callable[[], Durability] | None = None,
        commit_lease_timeout: float = DEFAULT_LEASE_TIMEOUT,
        leases: CommitLeases | None = None,
    ) -> None:
        if type(max_commit_blobs) is not int or not 1 <= max_commit_blobs <= (
            protocol.MAX_IDS_PER_REQUEST
        ):
            raise ValueError(
                f"max_commit_blobs must be between 1 and {protocol.MAX_IDS_PER_REQUEST}"
            )
        if type(max_commit_bytes) is not int or not 1 <= max_commit_bytes <= (
            protocol.MAX_FRAME_BYTES
        ):
            raise ValueError(f"max_commit_bytes must be between 1 and {protocol.MAX_FRAME_BYTES}")
        try:
            self.staging_timeout = check_retention(staging_timeout, "staging_timeout")
            self.garbage_retention = check_retention(garbage_retention, "garbage_retention")
        except InvalidRequestError as exc:
            raise ValueError(str(exc)) from None
        self.storage = storage
        # Whose turn it is to commit, once commits collided (``blob_server.leases``);
        # None: commit leases are off (``commit_lease_timeout`` 0), clients race.
        if leases is None and commit_lease_timeout:
            leases = storage.commit_leases(commit_lease_timeout)
        self.leases = leases
        # What acknowledged commits survive (``blob_server.durability.admit``), told to
        # every client at login and in ``stats``; None: not known (in-process servers).
        self.durability = durability
        # Re-reads the storage's durability with the garbage task (``check_durability``):
        # raises ``VolatileStorageError`` when serve would now refuse the storage.
        self._admit = admit
        # Why writes are refused (the storage lost what it was admitted with), or None.
        self._writes_refused: str | None = None
        self.push = push
        self.default_quota = default_quota
        self.max_commit_blobs = max_commit_blobs
        self.max_commit_bytes = max_commit_bytes
        self.auth = authenticator
        # Fairness (``blob_server.limits``, ``blob_server.frames``): who holds connections,
        # the frame memory, and each tenant's request rate; ``tenant_limits`` are the
        # defaults a tenant's entry in the tenants file may override.
        self.connections = ConnectionTable(max_connections, max_anonymous_per_address)
        self.tenant_limits = tenant_limits or TenantLimits(
            max_connections=default_tenant_connections(max_connections)
        )
        self.frames = FrameMemory(max_frame_memory)
        self.frame_timeout = frame_timeout
        self.rates = RequestRates()
        self._limits: dict[str, TenantLimits] = {}  # by tenant, as the file said at generation
        self._limits_generation = -1
        self._limits_checked = float("-inf")
        self._sessions: dict[int, Session] = {}
        self.idle_timeout = idle_timeout
        self.login_deadline = login_deadline
        self.gc_interval = gc_interval
        self.ssl = ssl
        self.total_requests = 0
        self.pushes_sent = 0
        # (tenant, database) -> the sessions subscribed to its root, by connection id.
        self._subscribers: dict[tuple[str, str], dict[int, Session]] = {}
        # (tenant, database) -> the highest seq pushed to its subscribers: a change heard
        # twice (our own commit, then from the storage's feed) is pushed once.
        self._pushed: dict[tuple[str, str], int] = {}
        # The storage's feed of root changes by any process (made by ``start``).
        self._changes: RootChanges | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._gc_task: asyncio.Task | None = None
        # Answers are packed on the event loop's thread only, so one packer serves all.
        self._packer = protocol.FramePacker()
        self._ops: dict[str, Callable[[Session, dict], Awaitable[object]]] = {
            "challenge": self._op_challenge,
            "hello": self._op_challenge,
            "login": self._op_login,
            "ping": self._op_ping,
            "get_blobs": self._op_get_blobs,
            "get_root": self._op_get_root,
            "commit": self._op_commit,
            "stage": self._op_stage,
            "allocate_ids": self._op_allocate_ids,
            "get_keyring": self._op_get_keyring,
            "put_keyring": self._op_put_keyring,
            "stats": self._op_stats,
            "subscribe": self._op_subscribe,
            "acquire_lease": self._op_acquire_lease,
            "release_lease": self._op_release_lease,
        }
        self._public_ops = {"challenge", "hello", "login", "ping"}

    async def start(self, host: str, port: int) -> asyncio.Server:
        """Start listening; return the asyncio server (its sockets give the bound port)."""
        self._server = await asyncio.start_server(
            self._handle, host, port, ssl=self.ssl, limit=2**16
        )
        if self.gc_interval > 0:
            self._gc_task = asyncio.create_task(self._collect_garbage())
        if self.push:
            self._changes = self.storage.root_changes(self._relay, self._changes_lost)
        bound = self._server.sockets[0].getsockname()
        log_event(
            logging.INFO,
            "listening",
            bind=f"{bound[0]}:{bound[1]}",
            tls="on" if self.ssl else "off",
            server_id=self.auth.server_id,
        )
        return self._server

    async def close(self) -> None:
        """Stop accepting, stop the garbage collector."""
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        if self._changes is not None:  # what the feed of root changes did, for operators
            log_event(
                logging.INFO, "root_changes", pushes=self.pushes_sent, **self._changes.stats()
            )
            with contextlib.suppress(Exception):
                await self._changes.aclose()
        with contextlib.suppress(Exception):
            await self.storage.aclose()
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):  # idle clients must not hold the shutdown
                writer.close()
            self.frames.close()  # nor frames waiting for room
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _collect_garbage(self) -> None:
        while True:
            await asyncio.sleep(self.gc_interval)
            await self.collect_garbage()
            await self.check_durability()

    async def check_durability(self) -> None:
        """Read the storage's durability again, as ``serve`` did when it started (the
        garbage task does it every ``gc_interval`` seconds).

        *Why:* a Redis restarted with another configuration, or told ``CONFIG SET
        appendonly no``, would otherwise go on acknowledging commits it may lose while
        clients were told they are durable. Until it is fixed, writes are answered
        ``unavailable`` ("retry later") and an error is logged; new logins are told
        what the storage says now. A storage that cannot be reached changes nothing
        (its writes fail by themselves)."""
        if self._admit is None:
            return
        try:
            durability = await asyncio.to_thread(self._admit)
        except VolatileStorageError as exc:
            if self._writes_refused is None:
                log_event(logging.ERROR, "durability_lost", detail=str(exc)[:300])
            self._writes_refused = (
                "the storage may lose acknowledged commits now (the server's log says why); "
                "writes are refused until it is fixed: retry later"
            )
            return
        except Exception as exc:
            log_event(logging.WARNING, "durability_check_failed", error=type(exc).__name__)
            return
        if self._writes_refused is not None or durability != self.durability:
            log_event(logging.WARNING, "durability", mode=durability.mode, detail=durability.detail)
        self._writes_refused = None
        self.durability = durability

    def _check_writable(self) -> None:
        """Refuse a write while the storage lost the durability it was admitted with."""
        if self._writes_refused is not None:
            raise RequestError(protocol.UNAVAILABLE, self._writes_refused)

    async def collect_garbage(self) -> int:
        """Run one garbage collection, as the task does every ``gc_interval`` seconds:
        delete garbage past its retention and staged blobs past ``staging_timeout``.
        Return how many blobs were deleted; a failure is logged (the task goes on)."""
        try:
            deleted = await asyncio.to_thread(
                self.storage.collect_garbage,
                retention=self.garbage_retention,
                staging_timeout=self.staging_timeout,
            )
        except Exception as exc:
            log_event(logging.ERROR, "garbage_failed", error=type(exc).__name__)
            return 0
        if deleted:
            log_event(logging.INFO, "garbage_collected", blobs=deleted)
        return deleted

    # -- connections -----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        address = str(peername[0]) if isinstance(peername, tuple) else str(peername)
        peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else address
        session = Session(next(_conn_ids), peer, address, writer=writer, reader=reader)
        try:
            victim = self.connections.open(session.conn_id, address)
        except ServerFullError:
            log_event(logging.WARNING, "refused", conn=session.conn_id, peer=peer, why="busy")
            await self._send_last(writer, protocol.error_frame(0, protocol.BUSY, "server busy"))
            return
        if victim is not None:
            self._make_way(victim)
        self._sessions[session.conn_id] = session
        self._writers.add(writer)
        log_event(logging.INFO, "connected", conn=session.conn_id, peer=peer)
        why = "eof"
        try:
            why = await self._serve(session, reader, writer)
        except Exception as exc:  # a bug must cost one connection, never the server
            why = "internal"
            # The exception's type only: a message could quote request data.
            log_event(
                logging.ERROR, "connection_failed", conn=session.conn_id, error=type(exc).__name__
            )
        finally:
            self.connections.close(session.conn_id)
            del self._sessions[session.conn_id]
            self._writers.discard(writer)
            self._unsubscribe_all(session)
            if self.leases is not None:
                with contextlib.suppress(Exception):
                    await self.leases.forget(session.conn_id)
            log_event(
                logging.INFO,
                "disconnected",
                conn=session.conn_id,
                peer=peer,
                tenant=session.tenant or "-",
                requests=session.requests,
                why=why,
            )
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2)

    def _make_way(self, conn_id: int) -> None:
        """Close the anonymous connection ``conn_id`` (the oldest of its address, or of
        all) for a newcomer: it is told ``busy``, and its task ends on the closed stream."""
        session = self._sessions.get(conn_id)
        if session is None or session.writer is None:
            return
        log_event(logging.WARNING, "made_way", conn=conn_id, peer=session.peer)
        with contextlib.suppress(Exception):
            session.writer.write(
                protocol.error_frame(
                    0, protocol.BUSY, "closed before login to make way for a newer connection"
                )
            )
        session.writer.close()

    async def _send_last(self, writer: asyncio.StreamWriter, frame: bytes) -> None:
        with contextlib.suppress(Exception):
            writer.write(frame)
            await asyncio.wait_for(writer.drain(), 2)
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 2)

    async def _serve(
        self, session: Session, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> str:
        """Answer frames until the peer leaves; return why the connection ended.

        A frame's header must come within the idle timeout (before login: by the login
        deadline), and its body is read only once its bytes are reserved in the frame
        memory (``blob_server.frames``). A frame larger than ``CHUNK_BYTES``, or one that
        waited for room, must arrive within the frame timeout after its header; a smaller
        one within the idle deadline.
        """
        loop = asyncio.get_running_loop()
        login_by = loop.time() + self.login_deadline
        while True:
            tenant = session.tenant
            timeout = self.idle_timeout
            if tenant is None:
                timeout = min(timeout, login_by - loop.time())
            limit = protocol.MAX_PREAUTH_FRAME_BYTES if tenant is None else protocol.MAX_FRAME_BYTES
            cap = None if tenant is None else self._tenant_limits(tenant).max_frame_memory
            length: int | None = None
            reserved = 0
            try:
                if timeout <= 0:  # (a timeout of 0 would let frames already buffered in)
                    raise TimeoutError
                async with asyncio.timeout(timeout) as deadline:
                    header = await reader.readexactly(protocol.LENGTH.size)
                    length = protocol.check_length(header, limit)
                    if self.frames.try_reserve(tenant, length, cap):
                        reserved = length
                    if length > CHUNK_BYTES or not reserved:
                        # A small frame read at once keeps the idle deadline: a second
                        # timer per request cost a fifth of a ping's CPU time.
                        deadline.reschedule(loop.time() + self.frame_timeout)
                    if not reserved:
                        await self.frames.reserve(tenant, length, cap)
                        reserved = length
                    body = await read_body(reader, length)
                frame = await self._answer(session, body)
                del body
            except TimeoutError:
                if length is None or reserved:
                    if length is not None:
                        why = "frame timeout"
                    elif tenant is None and loop.time() >= login_by:
                        why = "login timeout"
                    else:
                        why = "idle timeout"
                    writer.write(protocol.error_frame(0, protocol.BAD_FRAME, why))
                    return why.replace(" ", "_")
                refusal = await self._refuse_frame(session, reader, tenant, length, cap)
                if refusal is None:
                    writer.write(protocol.error_frame(0, protocol.BAD_FRAME, "frame timeout"))
                    return "frame_timeout"
                frame = refusal
            except protocol.FrameTooLargeError as exc:
                # The body was not read: the stream cannot be resynchronised. Answer and close.
                writer.write(protocol.error_frame(0, exc.code, str(exc)))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.drain(), 2)
                log_event(logging.WARNING, "frame_too_large", conn=session.conn_id)
                return "frame_too_large"
            except asyncio.IncompleteReadError as exc:
                return "eof" if length is None and not exc.partial else "reset"
            except (ConnectionError, OSError):
                return "reset"
            finally:
                if reserved:
                    self.frames.release(tenant, reserved)
            if not protocol.write_frame(writer, frame):
                return "reset"
            # Let go of the answer: its blobs may be views of a storage buffer, which is
            # reused once no view of it is left (blob_server.storage.resp).
            del frame
            try:
                await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
            except (TimeoutError, ConnectionError, OSError):
                return "write_failed"

    async def _refuse_frame(
        self,
        session: Session,
        reader: asyncio.StreamReader,
        tenant: str | None,
        length: int,
        cap: int | None,
    ) -> tuple[bytes | memoryview, ...] | None:
        """Answer ``busy`` to a frame that found no room in the frame memory within the
        frame timeout, after reading its body away (holding a chunk at most), so that
        the connection goes on; None if that fails too (the connection must end)."""
        why = self.frames.why_full(tenant, length, cap)
        log_event(logging.WARNING, "frame_refused", conn=session.conn_id, bytes=length)
        try:
            async with asyncio.timeout(self.frame_timeout):
                request_id = await discard_body(reader, length)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            return None
        return (protocol.error_frame(request_id, protocol.BUSY, why),)

    async def _answer(
        self, session: Session, body: bytes | bytearray
    ) -> tuple[bytes | memoryview, ...]:
        """Return the answer frame to one request body, in parts (never raise)."""
        session.requests += 1
        self.total_requests += 1
        started = time.perf_counter()
        request_id, op = 0, "-"
        try:
            request = protocol.parse_request(body)
            request_id, op = request.request_id, request.op
            handler = self._ops.get(op)
            if handler is None:
                raise RequestError(protocol.UNKNOWN_OP, f"unknown op {op[:32]!r}")
            if session.tenant is not None:
                self._check_rate(session.tenant)
            elif op not in self._public_ops:
                raise RequestError(protocol.UNAUTHENTICATED, "log in first")
            result = await handler(session, request.args)
            frame = self._packer.ok(request_id, result)
            status = "ok"
        except protocol.ProtocolError as exc:
            frame = (protocol.error_frame(exc.request_id, exc.code, str(exc)),)
            status = exc.code
        except RequestError as exc:
            frame = (protocol.error_frame(request_id, exc.code, str(exc)),)
            status = exc.code
        except Exception as exc:
            log_event(
                logging.ERROR, "op_failed", conn=session.conn_id, op=op, error=type(exc).__name__
            )
            frame = (protocol.error_frame(request_id, protocol.INTERNAL, "internal error"),)
            status = protocol.INTERNAL
        if log.isEnabledFor(logging.DEBUG):
            log_event(
                logging.DEBUG,
                "request",
                conn=session.conn_id,
                tenant=session.tenant or "-",
                op=op,
                status=status,
                bytes_in=len(body),
                bytes_out=sum(map(len, frame)),
                ms=f"{(time.perf_counter() - started) * 1000:.2f}",
            )
        return frame

    def _check_rate(self, tenant: str) -> None:
        """Count a request of ``tenant`` against its request rate; refuse it when over."""
        limits = self._tenant_limits(tenant)
        wait = self.rates.take(tenant, limits)
        if wait:
            retry = "" if wait == float("inf") else f"; retry in {wait:.2f} s"
            raise RequestError(
                protocol.RATE_LIMITED,
                f"tenant {tenant!r} is over its request rate of {limits.rate} a second "
                f"(burst {limits.bucket}){retry}",
            )

    def _refresh_tenants(self) -> None:
        """Re-read the tenants file if it changed (a stat)."""
        try:
            self.auth.registry.refresh()
        except Exception as exc:  # keep the last good registry; an admin must fix the file
            log_event(logging.ERROR, "tenants_reload_failed", error=type(exc).__name__)

    def _tenant_limits(self, tenant: str) -> TenantLimits:
        """The tenant's fairness limits: its own in the tenants file (looked at again at
        most every ``LIMITS_REFRESH`` seconds), else the server's defaults."""
        now = time.monotonic()
        if now >= self._limits_checked + LIMITS_REFRESH:
            self._limits_checked = now
            self._refresh_tenants()
        registry = self.auth.registry
        if registry.generation != self._limits_generation:
            self._limits.clear()
            self._limits_generation = registry.generation
        limits = self._limits.get(tenant)
        if limits is None:
            limits = self._limits[tenant] = registry.tenant_limits(tenant, self.tenant_limits)
        return limits

    def _quota(self, tenant: str) -> Quota:
        """The tenant's quota as the tenants file says now (a stat per call: a changed
        file is re-read, so ``set-limits`` needs no restart), else the server default."""
        self._refresh_tenants()
        return self.auth.registry.quota(tenant, self.default_quota)

    async def _storage(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a storage call in a worker thread; map its errors to error answers."""
        return await self._storage_async(asyncio.to_thread(fn, *args, **kwargs))

    async def _storage_async(self, call: Awaitable[Any]) -> Any:
        """Await a storage call; map its errors to error answers."""
        try:
            return await call
        except BlobExistsError as exc:
            raise RequestError(protocol.BLOB_EXISTS, str(exc)) from None
        except InvalidRequestError as exc:
            raise RequestError(protocol.BAD_REQUEST, str(exc)) from None
        except QuotaExceededError as exc:
            raise RequestError(protocol.QUOTA, str(exc)) from None
        except NotStagedError as exc:
            raise RequestError(protocol.NOT_STAGED, str(exc)) from None
        except StorageUnavailableError as exc:
            # The storage's message says why (addresses with passwords redacted, key
            # names opaque); the client is told only that it may retry.
            log_event(
                logging.ERROR,
                "storage_unavailable",
                error=type(exc).__name__,
                detail=str(exc)[:LOGGED_DETAIL],
            )
            raise RequestError(protocol.UNAVAILABLE, "storage unavailable") from None

    # -- operations ------------------------------------------------------------------------

    async def _op_challenge(self, session: Session, args: dict) -> object:
        _args(args, {})
        if session.tenant is not None:
            raise RequestError(protocol.BAD_REQUEST, "already logged in")
        session.challenge, answer = self.auth.challenge()
        return answer

    async def _op_login(self, session: Session, args: dict) -> object:
        if session.tenant is not None:
            raise RequestError(protocol.BAD_REQUEST, "already logged in")
        challenge, session.challenge = session.challenge, None  # single use, whatever happens
        try:
            tenant, public_key = self.auth.login(
                session.address,
                challenge,
                args,
                lambda claimed: self._tenant_limits(claimed).max_login_failures,
            )
        except LoginRefusedError as exc:
            log_event(
                logging.WARNING,
                "login_refused",
                conn=session.conn_id,
                peer=session.peer,
                code=exc.code,
                reason=exc.reason,
            )
            # A rate limit says which (its reason names no tenant or key); every other
            # refusal is the same answer, so it tells nothing about tenants or keys.
            message = exc.reason if exc.code == protocol.RATE_LIMITED else "login refused"
            raise RequestError(exc.code, message) from None
        max_connections = self._tenant_limits(tenant).max_connections
        if not self.connections.log_in(session.conn_id, tenant, max_connections):
            log_event(logging.WARNING, "login_busy", conn=session.conn_id, tenant=tenant)
            raise RequestError(
                protocol.BUSY,
                f"tenant {tenant!r} holds {self.connections.of_tenant(tenant)} connections, "
                f"its limit of {max_connections}",
            )
        session.tenant = tenant
        log_event(
            logging.INFO,
            "login",
            conn=session.conn_id,
            peer=session.peer,
            tenant=tenant,
            key=public_key.hex()[:16],
        )
        # The per-request limits, so that the client splits a large transaction into
        # stage requests that fit without a round trip to ask for them.
        limits = {
            "max_commit_blobs": self.max_commit_blobs,
            "max_commit_bytes": self.max_commit_bytes,
        }
        # The garbage retention, so that a client whose old snapshot meets a collected
        # blob can tell "too old" (SnapshotTooOldError) from a blob withheld (tampering).
        answer: dict[str, object] = {
            "tenant": tenant,
            "limits": limits,
            "garbage_retention": self.garbage_retention,
        }
        # What an acknowledged commit survives: a client of a volatile store warns, since
        # it would take a store that lost commits for one rolled back.
        if self.durability is not None:
            answer["durability"] = self.durability.as_dict()
        # Commit leases (seconds a turn lasts): a client that lost a race queues for its
        # turn instead of racing again (``acquire_lease``).
        if self.leases is not None:
            answer["commit_lease"] = self.leases.timeout
        return answer

    async def _op_ping(self, session: Session, args: dict) -> object:
        _args(args, {})
        return {"time": time.time(), "authenticated": session.tenant is not None}

    async def _op_get_blobs(self, session: Session, args: dict) -> protocol.BlobsResult:
        _args(args, {"database": str, "ids": list})
        ids = _id_list(args["ids"], "ids")
        found = await self._storage_async(
            self.storage.aget_blobs(session.tenant, _database(args), ids)
        )
        # Keep the answer under the frame limit: blobs past the budget are deferred and the
        # client asks for them again (at least one blob always goes out, so it progresses).
        if sum(map(len, found.values())) + len(found) * BLOB_ID_SIZE <= (
            protocol.MAX_RESPONSE_BLOB_BYTES
        ):
            return protocol.BlobsResult(found, [])  # the common case, summed in C
        blobs: dict[bytes, bytes] = {}
        deferred: list[bytes] = []
        size = 0
        for blob_id in ids:
            data = found.get(blob_id)
            if data is None:
                continue
            if blobs and size + len(data) > protocol.MAX_RESPONSE_BLOB_BYTES:
                deferred.append(blob_id)
                continue
            blobs[blob_id] = data
            size += len(data) + BLOB_ID_SIZE
        return protocol.BlobsResult(blobs, deferred)

    async def _op_get_root(self, session: Session, args: dict) -> object:
        _args(args, {"database": str})
        root = await self._storage(self.storage.get_root, session.tenant, _database(args))
        return {"seq": root.seq, "data": root.data}

    def _check_new_blobs(self, op: str, blobs: dict, root: bytes | None = None) -> int:
        """Check the new blobs of one ``commit`` (with its ``root``) or ``stage`` request
        against the per-request limits; return their bytes. A request of a single item
        (one blob staged, a root committed alone) may exceed ``max_commit_bytes``: it
        cannot be split, so only the per-blob limit bounds it."""
        if len(blobs) > self.max_commit_blobs:
            raise RequestError(
                protocol.TOO_LARGE,
                f"{op} of {len(blobs)} blobs exceeds the limit of {self.max_commit_blobs} "
                "blobs per request",
            )
        _id_list(list(blobs), "blob ids")
        for data in blobs.values():
            if type(data) is not bytes or len(data) > protocol.MAX_BLOB_BYTES:
                raise RequestError(protocol.BAD_REQUEST, "a blob is not bytes or too large")
        items = len(blobs) + (root is not None)
        size = sum(map(len, blobs.values())) + len(root or b"")
        if size > self.max_commit_bytes and items > 1:
            what = "blobs and root" if root is not None else "blobs"
            raise RequestError(
                protocol.TOO_LARGE,
                f"{op} of {size} bytes ({what}) exceeds the limit of {self.max_commit_bytes} "
                "bytes per request",
            )
        return size

    async def _op_stage(self, session: Session, args: dict) -> object:
        """Store blobs as pending for a later commit of the same database (``staged``)."""
        _args(args, {"database": str, "blobs": dict})
        self._check_writable()
        blobs = args["blobs"]
        size = self._check_new_blobs("stage", blobs)
        database = _database(args)
        await self._storage_async(
            self.storage.astage(session.tenant, database, blobs, quota=self._quota(session.tenant))
        )
        log_event(
            logging.DEBUG,
            "stage",
            conn=session.conn_id,
            tenant=session.tenant,
            blobs=len(blobs),
            bytes=size,
        )
        return {"staged": len(blobs)}

    async def _op_commit(self, session: Session, args: dict) -> object:
        """Swap the root if it is still ``expected_seq``'s; else answer the current one.

        ``lease`` (optional) says the client takes part in commit leases: nil, or the
        token of the lease it holds. While another client holds the database's lease,
        such a commit is not tried: the answer is ``wait`` (with the current root), and
        the client queues for its turn. A successful commit gives its lease back.
        """
        _args(
            args,
            {"database": str, "expected_seq": int, "root": bytes, "blobs": dict, "garbage": list},
            {"staged": list, "lease": object},
        )
        self._check_writable()
        token = _lease_token(args.get("lease"))
        blobs = args["blobs"]
        if len(args["root"]) > protocol.MAX_BLOB_BYTES:
            raise RequestError(protocol.TOO_LARGE, "root too large")
        self._check_new_blobs("commit", blobs, args["root"])
        staged = args.get("staged", [])
        if len(staged) + len(args["garbage"]) > protocol.MAX_COMMIT_IDS:
            raise RequestError(
                protocol.TOO_LARGE,
                f"at most {protocol.MAX_COMMIT_IDS} staged and garbage ids per commit",
            )
        staged = _blob_ids(staged, "staged ids")
        garbage = _blob_ids(args["garbage"], "garbage ids")
        database = _database(args)
        try:  # before the lease: a malformed commit is refused, never told to wait
            check_seq(args["expected_seq"])
        except InvalidRequestError as exc:
            raise RequestError(protocol.BAD_REQUEST, str(exc)) from None
        leases = self.leases if "lease" in args else None
        if leases is not None and await self._storage_async(
            leases.held_by_other(session.tenant, database, token)
        ):
            root = await self._storage(self.storage.get_root, session.tenant, database)
            return {"ok": False, "wait": True, "seq": root.seq, "data": root.data}
        result = await self._storage_async(
            self.storage.acommit(
                session.tenant,
                database,
                expected_seq=args["expected_seq"],
                root=args["root"],
                blobs=blobs,
                garbage=garbage,
                quota=self._quota(session.tenant),
                staged=staged,
            )
        )
        log_event(
            logging.DEBUG,  # per commit: at INFO it cost a seventh of the loop's time
            "commit",
            conn=session.conn_id,
            tenant=session.tenant,
            ok=result.ok,
            seq=result.root.seq,
            blobs=len(blobs),
            staged=len(staged),
            garbage=len(garbage),
        )
        if result.ok:
            self._push((session.tenant, database), result.root.seq, session)
            if leases is not None and token is not None:
                # The commit is done: a lease that cannot be given back runs out instead.
                with contextlib.suppress(StorageUnavailableError):
                    await leases.release(session.tenant, database, token)
        return {"ok": result.ok, "seq": result.root.seq, "data": result.root.data}

    async def _op_acquire_lease(self, session: Session, args: dict) -> object:
        """Queue for the database's commit lease (after a lost race) and wait at most
        ``wait`` seconds for it. Answer ``granted``, the ``token`` to commit with (nil
        when not granted) and the current root, which the holder replays its
        transaction on: nobody else commits until it does, or its lease times out."""
        _args(args, {"database": str, "wait": float})
        database = _database(args)
        wait = args["wait"]
        if not 0 <= wait <= MAX_LEASE_WAIT:
            raise RequestError(
                protocol.BAD_REQUEST, f"wait must be between 0 and {MAX_LEASE_WAIT:.0f} s"
            )
        token = None
        if self.leases is not None:
            if self.leases.claims_of(session.conn_id) >= protocol.MAX_SUBSCRIPTIONS:
                raise RequestError(
                    protocol.TOO_LARGE,
                    f"at most {protocol.MAX_SUBSCRIPTIONS} commit leases per connection",
                )
            token = await self._storage_async(
                self.leases.acquire(session.tenant, database, session.conn_id, wait, session.alive)
            )
        root = await self._storage(self.storage.get_root, session.tenant, database)
        log_event(
            logging.DEBUG,
            "lease",
            conn=session.conn_id,
            tenant=session.tenant,
            granted=token is not None,
            seq=root.seq,
        )
        return {"granted": token is not None, "token": token, "seq": root.seq, "data": root.data}

    async def _op_release_lease(self, session: Session, args: dict) -> object:
        """Give a commit lease back without committing (the transaction failed)."""
        _args(args, {"database": str, "token": bytes})
        database = _database(args)
        token = _lease_token(args["token"])
        released = False
        if self.leases is not None and token is not None:
            released = await self._storage_async(
                self.leases.release(session.tenant, database, token)
            )
        return {"released": released}

    async def _op_allocate_ids(self, session: Session, args: dict) -> object:
        _args(args, {"database": str, "sequence": str, "count": int})
        return await self._storage(
            self.storage.allocate_ids,
            session.tenant,
            _database(args),
            args["sequence"],
            args["count"],
        )

    async def _op_get_keyring(self, session: Session, args: dict) -> object:
        _args(args, {"database": str, "name": str})
        return await self._storage(
            self.storage.get_keyring, session.tenant, _database(args), args["name"]
        )

    async def _op_put_keyring(self, session: Session, args: dict) -> object:
        _args(args, {"database": str, "name": str, "data": bytes, "expected": object})
        self._check_writable()
        expected = args["expected"]
        if expected is not None and type(expected) is not bytes:
            raise RequestError(protocol.BAD_REQUEST, "expected must be bytes or nil")
        if len(args["data"]) > protocol.MAX_BLOB_BYTES:
            raise RequestError(protocol.TOO_LARGE, "keyring too large")
        return await self._storage(
            self.storage.put_keyring,
            session.tenant,
            _database(args),
            args["name"],
            args["data"],
            expected=expected,
            quota=self._quota(session.tenant),
        )

    async def _op_stats(self, session: Session, args: dict) -> object:
        """The database's figures, plus ``tenant``: the session's own tenant's usage and
        quota (``max_*`` nil: no limit), the figures a commit is checked against; and
        ``lease``: whether the database's commit lease is held, and how many wait."""
        _args(args, {"database": str})
        stats = await self._storage(self.storage.stats, session.tenant, _database(args))
        usage = await self._storage(self.storage.usage, session.tenant)
        quota = self._quota(session.tenant)
        answer: dict[str, object] = {k: v for k, v in stats.items() if type(v) is int}
        answer["tenant"] = {
            "blobs": usage.blobs,
            "bytes": usage.bytes,
            "databases": usage.databases,
            "max_blobs": quota.max_blobs,
            "max_bytes": quota.max_bytes,
        }
        if self.durability is not None:
            answer["durability"] = self.durability.as_dict()
        if self.leases is not None:  # this database's commit lease: held, clients queued
            answer["lease"] = await self._storage_async(
                self.leases.state(session.tenant, _database(args))
            )
        answer["fairness"] = self._fairness(session.tenant)
        return answer

    def _fairness(self, tenant: str) -> dict[str, int | None]:
        """The tenant's fairness limits and what it holds of them now."""
        return {
            **self._tenant_limits(tenant).as_dict(),
            "connections": self.connections.of_tenant(tenant),
            "frame_memory": self.frames.held_by(tenant),
        }

    # -- root pushes -----------------------------------------------------------------------

    async def _op_subscribe(self, session: Session, args: dict) -> object:
        """Push this connection every later change of the database's root.

        The subscription is registered before the answer (here, and in the storage's
        feed of every process's commits), so a ``get_root`` sent after it (or pipelined
        behind it) plus the pushes that follow cover every commit, through whichever
        server process. ``{"subscribed": False}`` when pushes are off, or when the feed
        cannot promise that now (Redis' pub/sub unreachable): the client then reads the
        root every time.
        """
        _args(args, {"database": str})
        database = _database(args)
        if not self.push:
            return {"subscribed": False}
        if database not in session.subscriptions:
            if len(session.subscriptions) >= protocol.MAX_SUBSCRIPTIONS:
                raise RequestError(
                    protocol.TOO_LARGE,
                    f"at most {protocol.MAX_SUBSCRIPTIONS} subscriptions per connection",
                )
            assert session.tenant is not None  # subscribe needs a login
            if self._changes is not None:
                if not await self._changes.watch(session.tenant, database):
                    return {"subscribed": False}
                if session.conn_id not in self._sessions:  # it closed meanwhile
                    self._changes.unwatch(session.tenant, database)
                    return {"subscribed": False}
            session.subscriptions.add(database)
            key = (session.tenant, database)
            self._subscribers.setdefault(key, {})[session.conn_id] = session
        return {"subscribed": True}

    def _unsubscribe_all(self, session: Session) -> None:
        for database in session.subscriptions:
            key = (session.tenant, database)
            subscribers = self._subscribers.get(key)
            if subscribers is not None:
                subscribers.pop(session.conn_id, None)
                if not subscribers:
                    del self._subscribers[key]
                    self._pushed.pop(key, None)
            if self._changes is not None and session.tenant is not None:
                self._changes.unwatch(session.tenant, database)
        session.subscriptions.clear()

    def _relay(self, tenant: str, database: str, seq: int) -> None:
        """Push a root change heard from the storage's feed (a commit through any
        process, this one included) to this process's subscribers."""
        self._push((tenant, database), seq, None)

    def _changes_lost(self) -> None:
        """The storage's feed may have missed commits and could not catch up: close every
        subscribed connection, so that its client stops trusting its pushes (it reads
        roots again, and subscribes again once the feed is back)."""
        sessions = {s.conn_id: s for subs in self._subscribers.values() for s in subs.values()}
        log_event(logging.WARNING, "root_changes_lost", subscribers=len(sessions))
        for session in sessions.values():
            self._unsubscribe_all(session)
            if session.writer is not None and not session.writer.is_closing():
                session.writer.write(
                    protocol.error_frame(
                        0, protocol.UNAVAILABLE, "root changes unavailable: read roots again"
                    )
                )
                session.writer.close()

    def _push(self, key: tuple[str, str], seq: int, committer: Session | None) -> None:
        """Queue a push of ``seq`` to the subscribers of ``key`` (tenant, database) but
        the committer, unless a seq as high was pushed already (synchronously: after a
        commit, it is queued before the committer is answered)."""
        subscribers = self._subscribers.get(key)
        if not subscribers or seq <= self._pushed.get(key, -1):
            return
        self._pushed[key] = seq
        frame = protocol.push_frame(key[1], seq)
        for session in list(subscribers.values()):
            writer = session.writer
            if session is committer or writer is None or writer.is_closing():
                continue  # the committer learns its seq from the commit answer
            if writer.transport.get_write_buffer_size() > PUSH_BUFFER_LIMIT:
                log_event(logging.WARNING, "push_overflow", conn=session.conn_id)
                self._unsubscribe_all(session)
                writer.transport.abort()  # the client reconnects and reads roots again
                continue
            writer.write(frame)
            self.pushes_sent += 1
