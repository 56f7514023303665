"""Streamed commits: a transaction larger than one request, sent as several.

A store bounds what one request may carry (the blob server's ``serve
--max-commit-blobs/--max-commit-bytes``), not a transaction. ``Transport.commit`` keeps
its one-call signature and splits what does not fit: blobs go ahead in bounded ``stage``
requests (written as *pending*, reached by no root), then one commit carries the root,
the blobs that still fit beside it, and the ids of the staged ones, which it makes live
atomically with the root swap.

This module is the part without I/O: the limits of one request (``RequestLimits``), the
split (``plan_commit``) and what a thread has staged for a database and not committed
yet (``StagedBlobs``), so that the retry of a commit after a conflict uploads nothing
twice and releases what it no longer uses.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from blob_server.wire import exceptions as store_errors
from zerodb_core.exceptions import CommitTooLargeError, IntegrityError, QuotaExceededError

# msgpack around the payload of a request, for the frame estimate: per new blob a 16-byte
# key and two bin headers; per named id (staged, garbage) the id and its bin header; and
# the rest of the frame (request id, op, argument names, a database name of up to 255
# characters, the root's header).
BLOB_OVERHEAD = 24
ID_OVERHEAD = 18
REQUEST_OVERHEAD = 2048

#: Errors with which the store says it changed nothing: what was staged before them is
#: still pending (and is released by the next successful commit). Any other error of a
#: commit leaves its outcome unknown.
REFUSALS: tuple[type[BaseException], ...] = (
    store_errors.BlobExistsError,
    store_errors.NotStagedError,
    store_errors.InvalidRequestError,
    store_errors.QuotaExceededError,
    QuotaExceededError,
    CommitTooLargeError,
)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one commit or stage request may carry.

    ``blobs`` and ``bytes`` bound the new blobs of a request (a commit's bytes include its
    root), except that a request of a single item (one blob staged alone, a root
    committed without blobs) is bounded by ``blob`` only; ``ids`` bounds the staged and
    garbage ids one commit names; ``frame``, when set, is the largest request frame.
    """

    blobs: int
    bytes: int
    blob: int
    ids: int
    frame: int | None = None

    def fits(self, count: int, size: int, ids: int = 0) -> bool:
        """Whether a request of ``count`` new blobs, ``size`` bytes of blobs (and root)
        and ``ids`` named ids fits, as several items (the single-item case is the
        caller's)."""
        if count > self.blobs or size > self.bytes:
            return False
        frame = REQUEST_OVERHEAD + size + count * BLOB_OVERHEAD + ids * ID_OVERHEAD
        return self.frame is None or frame <= self.frame


@dataclass(slots=True)
class CommitPlan:
    """How one commit goes out: ``stages`` (one request each, in order), then a commit
    of ``inline`` blobs naming ``staged`` and ``garbage`` ids."""

    stages: list[dict[bytes, bytes]]
    inline: Mapping[bytes, bytes]
    staged: list[bytes]
    garbage: list[bytes]


@dataclass(slots=True)
class Pending:
    """What one thread staged for one database and no commit has made live yet.

    ``staged`` (id -> sealed length) is pending in the store for sure: a retry that
    passes the same id reuses it. ``doubtful`` ids went out in a stage whose answer was
    lost: maybe pending, so they are never reused, only named as garbage (released) by
    the next commit that succeeds.
    """

    staged: dict[bytes, int] = field(default_factory=dict)
    doubtful: set[bytes] = field(default_factory=set)

    def add(self, blobs: Mapping[bytes, bytes]) -> None:
        """Remember blobs the store confirmed as staged."""
        self.staged.update((blob_id, len(data)) for blob_id, data in blobs.items())

    def doubt(self, chunks: list[dict[bytes, bytes]]) -> None:
        """Remember ids whose stage has an unknown outcome."""
        for chunk in chunks:
            self.doubtful.update(i for i in chunk if i not in self.staged)

    def forget(self) -> None:
        """Drop everything: committed (live or released), or the commit's outcome is
        unknown (then the blobs may be live, and must never be named as garbage; those
        still pending are deleted by the store after its staging timeout)."""
        self.staged.clear()
        self.doubtful.clear()


class StagedBlobs:
    """``Pending`` per thread and database.

    *Why per thread:* a commit and its retries run in one thread (``DB._commit``), while
    threads sharing a transport commit on their own; one thread's release of ids it no
    longer uses must never touch the ids another thread is about to commit. A thread
    that ends takes its record along; what it left pending expires in the store.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def of(self, database: str) -> Pending:
        """This thread's record for ``database``."""
        records: dict[str, Pending] | None = getattr(self._local, "records", None)
        if records is None:
            records = self._local.records = {}
        return records.setdefault(database, Pending())


def plan_commit(
    blobs: Mapping[bytes, bytes],
    root: bytes,
    garbage: list[bytes],
    pending: Pending,
    limits: RequestLimits,
) -> CommitPlan:
    """Split a commit into stage requests and the commit itself, within ``limits``.

    Blobs this thread staged earlier are named, not sent again (a blob id names one
    content for ever, so the same id is the same blob; a different length proves
    otherwise and is refused); staged ids the commit no longer uses are added to its
    garbage, which releases them. When everything fits one request the plan is that one
    request, as before staging existed. Raise ``CommitTooLargeError`` (nothing sent) for
    a blob or root larger than ``limits.blob``, or more named ids than ``limits.ids``.
    """
    if len(root) > limits.blob:
        raise CommitTooLargeError(
            f"the root is {len(root)} bytes; the store accepts at most {limits.blob} per blob"
        )
    if not pending.staged and not pending.doubtful:
        # The usual commit: nothing staged before, and it fits one request. Checked by
        # sums in C, not per blob in Python (it runs on every commit).
        sizes = list(map(len, blobs.values()))
        if (
            max(sizes, default=0) <= limits.blob
            and limits.fits(len(sizes), sum(sizes) + len(root), len(garbage))
            and len(garbage) <= limits.ids
        ):
            return CommitPlan([], blobs, [], garbage)
    reused: list[bytes] = []
    fresh: list[tuple[bytes, bytes]] = []
    for blob_id, data in blobs.items():
        size = pending.staged.get(blob_id)
        if size is None:
            if len(data) > limits.blob:
                raise CommitTooLargeError(
                    f"blob {blob_id.hex()} is {len(data)} bytes; the store accepts at most "
                    f"{limits.blob} per blob"
                )
            fresh.append((blob_id, data))
        elif size == len(data):
            reused.append(blob_id)
        else:
            raise IntegrityError(
                f"blob {blob_id.hex()} was staged with {size} bytes and is now {len(data)}: "
                "one id must never name two contents"
            )
    used = set(reused)
    # A doubtful id sent again is staged again (or refused as existing), never released:
    # a blob must not be made live and named garbage by one commit.
    released = [i for i in pending.staged if i not in used]
    released += sorted(pending.doubtful.difference(blobs))
    garbage = [*garbage, *released]
    chunks = _chunks(fresh, limits)
    inline: list[tuple[bytes, bytes]] = []
    if chunks:
        # The last chunk rides in the commit when it fits beside the root and the ids.
        last = chunks[-1]
        named = len(reused) + sum(map(len, chunks[:-1])) + len(garbage)
        if limits.fits(len(last), len(root) + sum(len(d) for _, d in last), named):
            inline = chunks.pop()
    staged = reused + [blob_id for chunk in chunks for blob_id, _ in chunk]
    if len(staged) + len(garbage) > limits.ids:
        raise CommitTooLargeError(
            f"the commit would name {len(staged)} staged and {len(garbage)} garbage ids; "
            f"the store accepts at most {limits.ids} in one commit"
        )
    return CommitPlan([dict(chunk) for chunk in chunks], dict(inline), staged, garbage)


def _chunks(
    pairs: list[tuple[bytes, bytes]], limits: RequestLimits
) -> list[list[tuple[bytes, bytes]]]:
    """Group blobs, in order, into as few requests as ``limits`` allow (a blob too large
    to share a request goes alone)."""
    chunks: list[list[tuple[bytes, bytes]]] = []
    chunk: list[tuple[bytes, bytes]] = []
    size = 0
    for blob_id, data in pairs:
        if chunk and not limits.fits(len(chunk) + 1, size + len(data)):
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append((blob_id, data))
        size += len(data)
    if chunk:
        chunks.append(chunk)
    return chunks
