"""What a blob server answers, checked before use, and its error codes as exceptions.

Everything the server says is untrusted: a malformed answer raises ``IntegrityError``
(the connection it came on is dropped where it is read: it cannot be trusted to be in
step any more). An error answer becomes the exception a local store would have raised;
outages and limits of the moment are ``OperationalError`` subclasses saying "retry later".
"""

from __future__ import annotations

from typing import Any

from blob_server.wire import protocol
from blob_server.wire.exceptions import BlobExistsError, InvalidRequestError, NotStagedError
from blob_server.wire.storage import DEFAULT_RETENTION_SECONDS, RootRecord
from zerodb_core.exceptions import (
    AuthenticationError,
    CommitTooLargeError,
    IntegrityError,
    QuotaExceededError,
    RateLimitedError,
    ServerBusyError,
    StoreUnavailableError,
)
from zerodb_core.transport.base import all_bytes
from zerodb_core.transport.staging import RequestLimits

#: Bytes of a lease token (``blob_server.leases.TOKEN_BYTES``).
LEASE_TOKEN_BYTES = 16

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


def root_answer(answer: object) -> RootRecord:
    if type(answer) is not dict or type(answer.get("data")) is not bytes:
        raise IntegrityError("the blob server sent a malformed root")
    # the base class checks seq (a missing one, -1, fails as any malformed one does)
    return RootRecord(answer.get("seq", -1), answer["data"])


def blob_answer(answer: object) -> tuple[dict[bytes, bytes], list[bytes]]:
    if type(answer) is not dict or set(answer) != {"blobs", "deferred"}:
        raise IntegrityError("the blob server sent a malformed blob answer")
    blobs, deferred = answer["blobs"], answer["deferred"]
    if type(blobs) is not dict or type(deferred) is not list:
        raise IntegrityError("the blob server sent a malformed blob answer")
    # The blobs' types are checked by Transport.get_blobs, with every store's.
    if not all_bytes(deferred):
        raise IntegrityError("the blob server sent a blob answer with something not bytes")
    return blobs, deferred


def announced_limits(answer: dict[str, Any]) -> RequestLimits:
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


def announced_durability(answer: dict[str, Any]) -> dict[str, str] | None:
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


def lease_token(token: object) -> bytes | None:
    """A lease token from the server, or None if it is not one."""
    if type(token) is bytes and len(token) == LEASE_TOKEN_BYTES:
        return token
    return None


def announced_lease(answer: dict[str, Any]) -> float | None:
    """How long a commit lease lasts, as a login answer announces it (None: the server
    has none); a malformed one is refused (fail closed)."""
    timeout = answer.get("commit_lease")
    if timeout is None:
        return None
    if type(timeout) not in (int, float) or not 0 < timeout < float("inf"):
        raise IntegrityError("the blob server announced a malformed commit lease")
    return float(timeout)


def announced_retention(answer: dict[str, Any]) -> float:
    """The garbage retention a login answer announces, or the default that servers which
    announce none always used; a malformed one is refused (fail closed)."""
    retention = answer.get("garbage_retention", DEFAULT_RETENTION_SECONDS)
    if type(retention) not in (int, float) or not 0 <= retention < float("inf"):
        raise IntegrityError("the blob server announced a malformed garbage retention")
    return float(retention)


def write_error(code: object, message: object) -> Exception:
    """Map the error answer to a commit or stage: ``too_large`` (the server's limits
    changed since login, or one blob is past them) is ``CommitTooLargeError``."""
    if code == protocol.TOO_LARGE:
        return CommitTooLargeError(f"blob server: {message} ({code})")
    return error(code, message)


def error(code: object, message: object) -> Exception:
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
