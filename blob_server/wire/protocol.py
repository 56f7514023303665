"""The wire protocol of the blob server, shared by the server and the remote client.

A frame is a 4-byte big-endian body length followed by a msgpack body::

    request:   [request_id: int, op: str, args: map]
    response:  [request_id, "ok", result]
               [request_id, "error", {"code": str, "message": str}]

Request ids are chosen by the client and echoed by the server, so a client may send
several requests before reading the answers (pipelining); the server answers each
connection's requests in the order they arrived.

Request id 0 is reserved for frames the server sends unasked (clients number their
requests from 1): an error that ends the connection (idle timeout, busy, oversized frame)
and, after a ``subscribe`` request, root pushes::

    push:      [0, "root", {"database": str, "seq": int}]

A push says "a commit through this server set the root of this (tenant, database) to
``seq``"; it goes only to connections of the committing session's tenant that subscribed
to that database, and may arrive between any two answers. It carries the seq only, never
the root itself (see ``BlobServer`` for why).

Everything here treats its input as hostile: a frame longer than ``MAX_FRAME_BYTES`` is
refused from its header alone, and a body that does not decode, has the wrong shape or
wrong types raises ``ProtocolError`` (never anything else), which the server turns into
an error frame.

The login message (``login_digest``) lives here too, so that the server that checks a
signature and the client that makes it cannot disagree on the bytes signed. This module
imports nothing from ``zerodb_core``: the server cannot decrypt, and the imports show it.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack

PROTOCOL_VERSION: Final = 1

#: Largest frame body either side accepts (a commit of many 16 KiB nodes fits easily).
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
#: Largest frame accepted before login (a challenge or login is a few hundred bytes), so
#: an anonymous peer cannot make the server buffer 64 MiB.
MAX_PREAUTH_FRAME_BYTES: Final = 64 * 1024
#: Largest single blob or root the server accepts in a commit.
MAX_BLOB_BYTES: Final = 32 * 1024 * 1024
#: Most blob ids in one get_blobs request, or new blobs in one commit or stage.
MAX_IDS_PER_REQUEST: Final = 4096
#: Most staged and garbage ids (together) one commit may name: a transaction staged in
#: many requests is committed by one. At 18 bytes an id on the wire they take at most
#: 18 MiB, so they fit a frame beside a root of ``MAX_BLOB_BYTES``; 2**20 ids of 16 KiB
#: nodes are 16 GiB of blobs.
MAX_COMMIT_IDS: Final = 2**20
#: A get_blobs answer stops adding blobs past this many bytes and defers the rest.
MAX_RESPONSE_BLOB_BYTES: Final = 48 * 1024 * 1024
#: Request ids are unsigned 63-bit integers.
MAX_REQUEST_ID: Final = 2**63 - 1
#: Longest op name, error code or message.
MAX_OP_LENGTH: Final = 32
MAX_MESSAGE_LENGTH: Final = 1024

LENGTH: Final = struct.Struct(">I")
BIN8: Final = struct.Struct(">BB")
BIN16: Final = struct.Struct(">BH")
BIN32: Final = struct.Struct(">BI")
LOGIN_DOMAIN: Final = b"zerodb-login-v1"
NONCE_BYTES: Final = 32

OK: Final = "ok"
ERROR: Final = "error"
#: The request id of frames the server sends unasked; the kind of a root push.
PUSH_ID: Final = 0
PUSH_ROOT: Final = "root"
#: Most databases one connection may subscribe to.
MAX_SUBSCRIPTIONS: Final = 64

# Error codes (the client maps them to its own exceptions).
BAD_FRAME: Final = "bad_frame"
BAD_REQUEST: Final = "bad_request"
UNKNOWN_OP: Final = "unknown_op"
UNAUTHENTICATED: Final = "unauthenticated"
AUTH_FAILED: Final = "auth_failed"
RATE_LIMITED: Final = "rate_limited"
BLOB_EXISTS: Final = "blob_exists"
QUOTA: Final = "quota"
NOT_STAGED: Final = "not_staged"
TOO_LARGE: Final = "too_large"
BUSY: Final = "busy"
UNAVAILABLE: Final = "unavailable"
INTERNAL: Final = "internal"


class ProtocolError(Exception):
    """A frame or body is malformed. ``request_id`` is set if it could be read."""

    def __init__(self, message: str, *, code: str = BAD_FRAME, request_id: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


class FrameTooLargeError(ProtocolError):
    """A frame header announced more than the limit; the stream cannot be resynchronised."""


# A frame body: bytes, or the buffer a receiver read it into (decoded without a copy).
Body = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class Request:
    request_id: int
    op: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Response:
    request_id: int
    ok: bool
    result: Any  # the result, or (code, message) for an error


@dataclass(frozen=True, slots=True)
class Push:
    """An unasked frame from the server: the root of ``database`` is now ``seq``."""

    database: str
    seq: int


# -- encoding ------------------------------------------------------------------------------


def _checked(body: bytes) -> bytes:
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(
            f"frame of {len(body)} bytes exceeds the limit of {MAX_FRAME_BYTES}", code=TOO_LARGE
        )
    return body


def _pack(obj: object) -> bytes:
    body = _checked(msgpack.packb(obj, use_bin_type=True))
    return LENGTH.pack(len(body)) + body


class FramePacker:
    """Pack frames with one ``msgpack.Packer`` that is kept, the sending counterpart of
    ``FrameReceiver``.

    *Why:* ``msgpack.packb`` makes a new Packer per call, whose buffer starts at 256 KiB
    and is grown by doubling on every large answer, where a Packer whose buffer has
    already grown just writes (docs/performance.md; the buffer is kept across calls;
    one that grew past ``KEEP_BYTES`` is let go, so a rare huge frame does not pin its
    memory). Not thread-safe: the server keeps one per event loop, the client one per
    connection.
    """

    KEEP_BYTES: Final = 8 * 1024 * 1024

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True)

    def parts(self, obj: object) -> tuple[bytes, bytes]:
        """The length header and the body of a frame, apart: a sender that writes both
        saves copying a body of up to 48 MiB just to put 4 bytes before it."""
        body = self._packer.pack(obj)  # resets the buffer, also when packing fails
        if len(body) > self.KEEP_BYTES:
            self._packer = msgpack.Packer(use_bin_type=True)
        return LENGTH.pack(len(_checked(body))), body

    def request(self, request_id: int, op: str, args: dict[str, Any]) -> tuple[bytes, bytes]:
        """The frame of one request, as (header, body)."""
        return self.parts([request_id, op, args])

    def ok(self, request_id: int, result: object) -> tuple[bytes | memoryview, ...]:
        """The frame of a successful answer, as (header, body), or for a ``BlobsResult``
        as the header and the body in pieces (see ``blobs``)."""
        if type(result) is BlobsResult:
            return self.blobs(request_id, result)
        return self.parts([request_id, OK, result])

    def blobs(self, request_id: int, result: BlobsResult) -> tuple[bytes | memoryview, ...]:
        """The frame of a get_blobs answer as the header, then the body in pieces that
        refer to the blobs instead of copying them.

        *Why:* packing copies every blob into the body, and the body into a new ``bytes``:
        two 1 MiB copies per 64-blob answer, a sixth of the server's CPU on that request.
        The pieces are the bytes ``packb([request_id, "ok", {"blobs": ..., "deferred":
        ...}])`` gives (msgpack headers made here, blobs as they are); ``write_frame``
        sends them.
        """
        pack = self._packer.pack
        prefix = (
            self._packer.pack_array_header(3)
            + pack(request_id)
            + pack(OK)
            + self._packer.pack_map_header(2)
            + pack("blobs")
            + self._packer.pack_map_header(len(result.blobs))
        )
        heads = _entry_heads(result.blobs, pack)
        tail = pack("deferred") + pack(result.deferred)
        size = len(prefix) + sum(map(len, heads)) + len(tail)
        size += sum(map(len, result.blobs.values()))
        if heads:
            heads[0] = prefix + heads[0]
        else:
            tail = prefix + tail
        # the length header goes first; blobs are bytes or read-only views, as given
        pieces: list[bytes | memoryview] = [b""] * (2 * len(heads) + 2)
        pieces[1:-1:2] = heads
        pieces[2:-1:2] = result.blobs.values()
        pieces[-1] = tail
        if size > MAX_FRAME_BYTES:
            raise FrameTooLargeError(
                f"frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}", code=TOO_LARGE
            )
        pieces[0] = LENGTH.pack(size)
        return tuple(pieces)


@dataclass(frozen=True, slots=True)
class BlobsResult:
    """The result of get_blobs: found blobs by id, and the ids deferred to a later request.

    On the wire it is the map ``{"blobs": blobs, "deferred": deferred}``; a server
    handler returns this instead of the map so that ``FramePacker`` sends the blobs
    without copying them (as ``bytes`` or any read-only buffer, such as the views
    ``storage.resp`` reads into).
    """

    blobs: Mapping[bytes, bytes | memoryview]
    deferred: list[bytes]


def _entry_heads(
    blobs: Mapping[bytes, bytes | memoryview], pack: Callable[[object], bytes]
) -> list[bytes]:
    """The msgpack bytes before each blob of a blobs map: its key, packed, and its own
    ``bin`` header.

    *Why two ways:* this runs for every blob of every answer. The ids of one answer have
    one length, and its blobs are often all of one padded size class (full nodes); then
    the two headers are made once and each entry is one concatenation.
    """
    keys = list(blobs)
    key_sizes = set(map(len, keys))
    sizes = set(map(len, blobs.values()))
    if len(key_sizes) == 1 and len(sizes) == 1 and set(map(type, keys)) == {bytes}:
        key_head, value_head = _bin_header(key_sizes.pop()), _bin_header(sizes.pop())
        return [key_head + key + value_head for key in keys]
    return [pack(key) + _bin_header(len(data)) for key, data in blobs.items()]


def _bin_header(size: int) -> bytes:
    """The msgpack header of a ``bin`` of ``size`` bytes, in the shortest form, as
    msgpack writes it (msgpack's Packer has no public call for it)."""
    if size < 0x100:
        return BIN8.pack(0xC4, size)
    if size < 0x10000:
        return BIN16.pack(0xC5, size)
    return BIN32.pack(0xC6, size)


def request_frame(request_id: int, op: str, args: dict[str, Any]) -> bytes:
    """Return the frame of one request."""
    return _pack([request_id, op, args])


def error_frame(request_id: int, code: str, message: str) -> bytes:
    """Return the frame of an error answer (the message is truncated to a safe length)."""
    return _pack([request_id, ERROR, {"code": code, "message": message[:MAX_MESSAGE_LENGTH]}])


def push_frame(database: str, seq: int) -> bytes:
    """Return the frame of a root push (request id ``PUSH_ID``)."""
    return _pack([PUSH_ID, PUSH_ROOT, {"database": database, "seq": seq}])


# -- decoding ------------------------------------------------------------------------------


def _refuse_ext(code: int, data: bytes) -> object:
    raise ValueError(f"msgpack ext type {code} is not part of the protocol")


def decode_body(body: Body) -> object:
    """Decode one msgpack body strictly; raise ``ProtocolError`` on anything malformed."""
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError("frame too large", code=TOO_LARGE)
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            use_list=True,
            strict_map_key=True,  # map keys are str or bytes only
            ext_hook=_refuse_ext,
        )  # unpackb bounds every str/bin/array/map length by len(body)
    except Exception as exc:  # msgpack raises many types for malformed input
        raise ProtocolError(f"body does not decode ({type(exc).__name__})") from None


def _request_id(value: object) -> int | None:
    if type(value) is int and 0 <= value <= MAX_REQUEST_ID:
        return value
    return None


def parse_request(body: Body) -> Request:
    """Decode a request body; raise ``ProtocolError`` (with the request id if known)."""
    obj = decode_body(body)
    if type(obj) is not list or len(obj) != 3:
        raise ProtocolError("a request is [request_id, op, args]")
    request_id = _request_id(obj[0])
    if request_id is None:
        raise ProtocolError("request_id must be an int in [0, 2**63)")
    op, args = obj[1], obj[2]
    if type(op) is not str or not 0 < len(op) <= MAX_OP_LENGTH:
        raise ProtocolError("op must be a short str", request_id=request_id)
    if type(args) is not dict:
        raise ProtocolError("args must be a map", request_id=request_id)
    if not all(type(k) is str for k in args):
        raise ProtocolError("argument names must be str", request_id=request_id)
    return Request(request_id, op, args)


def parse_response(body: Body) -> Response:
    """Decode a response body; raise ``ProtocolError`` on any malformed shape (a push too)."""
    return _response(decode_body(body))


def parse_server_frame(body: Body) -> Response | Push:
    """Decode anything a server may send: an answer, or a root push (request id 0).

    Raise ``ProtocolError`` on any malformed shape, including a push whose fields have the
    wrong types or ranges.
    """
    obj = decode_body(body)
    if (
        type(obj) is list
        and len(obj) == 3
        and type(obj[0]) is int
        and obj[0] == PUSH_ID
        and obj[1] == PUSH_ROOT
    ):
        payload = obj[2]
        if (
            type(payload) is not dict
            or set(payload) != {"database", "seq"}
            or type(payload["database"]) is not str
            or not 0 < len(payload["database"]) <= MAX_MESSAGE_LENGTH
            or type(payload["seq"]) is not int
            or not 0 <= payload["seq"] <= MAX_REQUEST_ID
        ):
            raise ProtocolError("a root push is {database: str, seq: int}")
        return Push(payload["database"], payload["seq"])
    return _response(obj)


def _response(obj: object) -> Response:
    if type(obj) is not list or len(obj) != 3:
        raise ProtocolError("a response is [request_id, status, result]")
    request_id = _request_id(obj[0])
    if request_id is None:
        raise ProtocolError("response request_id must be an int in [0, 2**63)")
    status, result = obj[1], obj[2]
    if status == OK:
        return Response(request_id, True, result)
    if status == ERROR:
        if (
            type(result) is not dict
            or type(result.get("code")) is not str
            or type(result.get("message")) is not str
        ):
            raise ProtocolError("an error answer is {code: str, message: str}")
        return Response(request_id, False, (result["code"], result["message"]))
    raise ProtocolError("response status must be 'ok' or 'error'")


def check_length(header: bytes, limit: int = MAX_FRAME_BYTES) -> int:
    """Return the body length announced by a 4-byte header, refusing oversized frames."""
    length: int = LENGTH.unpack(header)[0]
    if length > limit:
        raise FrameTooLargeError(
            f"frame of {length} bytes exceeds the limit of {limit}", code=TOO_LARGE
        )
    return length


#: Frames up to this size are joined and sent with one write (larger ones by reference).
SMALL_FRAME_BYTES: Final = 64 * 1024


def write_frame(writer: asyncio.StreamWriter, frame: tuple[bytes | memoryview, ...]) -> bool:
    """Write a frame given in pieces (see ``FramePacker``); False if the connection is
    already going away. The caller then awaits ``drain()``.

    A small frame is joined: one send, and the peer wakes up once. A large one goes by
    reference, in two writes: ``writelines`` of all but the last two pieces (one
    ``sendmsg``), then one ``write`` of those two joined. Why that shape:

    * Python 3.12's ``writelines`` raises AttributeError on a transport the peer has just
      reset (found by the fuzz test), and uvloop's ``write`` raises RuntimeError on one
      the server closed (a subscribed connection cut off while its request was being
      answered): hence the check first, for every frame.
    * It never pauses the protocol either, so ``drain()`` would not wait for a slow
      reader; a ``write`` last does pause when the buffer is over its high-water mark.
    * That last write must carry more than a get_blobs answer's few closing bytes: sent
      alone they cost the peer one more wake-up (docs/performance.md). The last blob goes
      with them (copied, unless it is large).
    """
    if writer.transport.is_closing():
        return False
    if len(frame) == 1 or sum(map(len, frame)) <= SMALL_FRAME_BYTES:
        writer.write(b"".join(frame))
        return True
    split = -2 if len(frame[-2]) <= SMALL_FRAME_BYTES else -1
    writer.writelines(frame[:split])
    writer.write(b"".join(frame[split:]))
    return True


def recv_frame(sock: socket.socket, limit: int = MAX_FRAME_BYTES) -> bytes:
    """Read one frame body from a blocking socket; raise ``ConnectionError`` at EOF."""
    length = check_length(_recv_exactly(sock, LENGTH.size), limit)
    return _recv_exactly(sock, length)


class FrameReceiver:
    """Read frames from a blocking socket into one buffer that is reused.

    *Why:* a 64-blob answer is a 1 MiB frame; a fresh buffer per frame (zero-filled, then
    copied into ``bytes``) costs two 1 MiB copies and, above the allocator's mmap
    threshold, page faults on every answer. The frame returned is a view into the buffer,
    valid until the next ``recv``: decode it before reading another frame.
    """

    #: Frames up to this size reuse the buffer; larger ones (rare) get one of their own.
    KEEP_BYTES: Final = 8 * 1024 * 1024

    def __init__(self) -> None:
        self._buffer = bytearray(64 * 1024)

    def recv(self, sock: socket.socket, limit: int = MAX_FRAME_BYTES) -> memoryview:
        """Read one frame body; raise ``ConnectionError`` at EOF."""
        header = bytes(self._fill(sock, LENGTH.size))
        return self._fill(sock, check_length(header, limit))

    def _fill(self, sock: socket.socket, size: int) -> memoryview:
        if size > len(self._buffer):
            if size > self.KEEP_BYTES:
                return memoryview(_recv_exactly(sock, size))
            self._buffer = bytearray(max(size, 2 * len(self._buffer)))
        view = memoryview(self._buffer)[:size]
        got = 0
        while got < size:
            n = sock.recv_into(view[got:], size - got)
            if n == 0:
                raise ConnectionError("the server closed the connection")
            got += n
        return view


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], min(size - got, 1 << 20))
        if n == 0:
            raise ConnectionError("the server closed the connection")
        got += n
    return bytes(buf)


# -- login ---------------------------------------------------------------------------------


def _lp(value: bytes) -> bytes:
    return LENGTH.pack(len(value)) + value


def login_digest(
    server_id: str, tenant: str, public_key: bytes, nonce: bytes, timestamp: int
) -> bytes:
    """Return the 32-byte BLAKE2b digest a client signs to log in.

    The message is domain-separated and every field is length-prefixed, so no two
    different logins can sign the same bytes, and a signature for one server, tenant,
    key or nonce is worthless for another.
    """
    message = (
        LOGIN_DOMAIN
        + _lp(server_id.encode("utf-8"))
        + _lp(tenant.encode("utf-8"))
        + _lp(public_key)
        + _lp(nonce)
        + struct.pack(">q", timestamp)
    )
    return hashlib.blake2b(message, digest_size=32).digest()
