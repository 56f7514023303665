"""Argument checks shared by every storage backend.

The storage layer is the server's trust boundary: whatever reaches it may come from a
hostile client. Checking types and bounds in one place keeps every backend's behaviour
identical (the memory backend is the reference the others are tested against) and stops a
bad request before it takes a lock or opens a transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sized

from blob_server.exceptions import InvalidRequestError
from blob_server.wire.storage import (
    BLOB_ID_SIZE,
    MAX_BLOB_SIZE,
    MAX_COMMIT_IDS,
    MAX_IDS_PER_REQUEST,
)

MAX_NAME_LENGTH = 255
MAX_ALLOCATE = 1_000_000


def check_name(value: object, what: str) -> str:
    """Return ``value`` if it is a non-empty str of at most ``MAX_NAME_LENGTH`` characters."""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what} must be str, not {type(value).__name__}")
    if not 0 < len(value) <= MAX_NAME_LENGTH:
        raise InvalidRequestError(f"{what} must have 1 to {MAX_NAME_LENGTH} characters")
    if "\x00" in value:
        raise InvalidRequestError(f"{what} must not contain NUL")
    return value


def check_scope(tenant: object, database: object) -> tuple[str, str]:
    """Return ``(tenant, database)`` after checking both names."""
    return check_name(tenant, "tenant"), check_name(database, "database")


def are_blob_ids(values: list[object]) -> bool:
    """Whether every value is exactly ``BLOB_ID_SIZE`` bytes, checked in C (map, set):
    every id of every read and commit passes here."""
    return set(map(type, values)) <= {bytes} and set(map(len, values)) <= {BLOB_ID_SIZE}


def check_blob_id(value: object) -> bytes:
    """Return ``value`` if it is exactly ``BLOB_ID_SIZE`` bytes."""
    if type(value) is not bytes:
        raise InvalidRequestError(f"blob id must be bytes, not {type(value).__name__}")
    if len(value) != BLOB_ID_SIZE:
        raise InvalidRequestError(f"blob id must be {BLOB_ID_SIZE} bytes, not {len(value)}")
    return value


def check_data(value: object, what: str, *, limit: int = MAX_BLOB_SIZE) -> bytes:
    """Return ``value`` if it is bytes of at most ``limit`` bytes."""
    if type(value) is not bytes:
        raise InvalidRequestError(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > limit:
        raise InvalidRequestError(f"{what} is {len(value)} bytes, the limit is {limit}")
    return value


def check_int(value: object, what: str, *, low: int, high: int) -> int:
    """Return ``value`` if it is an int (not a bool) with ``low <= value <= high``."""
    if type(value) is not int:
        raise InvalidRequestError(f"{what} must be int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidRequestError(f"{what} must be between {low} and {high}, not {value}")
    return value


def check_ids(ids: object, what: str = "ids", *, limit: int = MAX_IDS_PER_REQUEST) -> list[bytes]:
    """Return a collection of at most ``limit`` blob ids, deduplicated, in first-seen order.

    A lone ``bytes`` is refused: iterating it would yield ints, and a caller who meant
    ``[blob_id]`` deserves an error, not an empty answer.
    """
    if isinstance(ids, bytes | bytearray | str) or not isinstance(ids, Iterable):
        raise InvalidRequestError(f"{what} must be a collection of blob ids")
    if isinstance(ids, Sized) and len(ids) > limit:
        raise InvalidRequestError(f"at most {limit} {what} per request")
    ids = list(ids)
    if not are_blob_ids(ids):
        for i in ids:
            check_blob_id(i)  # raises, naming the first bad id's fault
    checked = list(dict.fromkeys(ids))
    if len(checked) > limit:
        raise InvalidRequestError(f"at most {limit} {what} per request")
    return checked


def check_blobs(blobs: object) -> list[tuple[bytes, bytes]]:
    """Return the (id, data) pairs of a mapping of new blobs (a commit's or a stage's)."""
    if not isinstance(blobs, Mapping):
        raise InvalidRequestError("blobs must be a mapping of blob id to bytes")
    if len(blobs) > MAX_IDS_PER_REQUEST:
        raise InvalidRequestError(f"at most {MAX_IDS_PER_REQUEST} blobs per request")
    return [(check_blob_id(k), check_data(v, "blob")) for k, v in blobs.items()]


def check_seq(value: object, what: str = "expected_seq") -> int:
    """Return ``value`` if it is a root seq a client may name (0 to 2**62)."""
    return check_int(value, what, low=0, high=2**62)


def check_commit(
    expected_seq: object, root: object, blobs: object, garbage: object, staged: object = ()
) -> tuple[int, bytes, list[tuple[bytes, bytes]], list[bytes], list[bytes]]:
    """Return the checked arguments of a commit: seq, root, (id, data) pairs, garbage ids
    and staged ids."""
    seq = check_seq(expected_seq)
    root_data = check_data(root, "root")
    pairs = check_blobs(blobs)
    dead = check_ids(garbage, "garbage ids", limit=MAX_COMMIT_IDS)
    return seq, root_data, pairs, dead, check_ids(staged, "staged ids", limit=MAX_COMMIT_IDS)


def check_retention(value: object, what: str = "retention") -> float:
    """Return ``value`` as a float if it is a non-negative finite number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"{what} must be a number, not {type(value).__name__}")
    if not 0 <= value < float("inf"):
        raise InvalidRequestError(f"{what} must be finite and >= 0, not {value}")
    return float(value)
