"""Where a transaction's trees find their nodes, and how reads are batched.

A :class:`Workspace` belongs to one transaction. It holds the objects the transaction made
(*dirty*: nodes of merged runs, records too large for a leaf), the ids of persisted blobs
the transaction made unreachable (garbage at commit), and a :class:`NodeSource` for
everything else.

Reads are written as generators that ``yield`` the list of blob ids they need next and
receive a dict of id -> object. :meth:`Workspace.run` drives several of them in lockstep
and merges what they need at each step into **one** request, so a query that walks three
trees level by level costs one round trip per level, not one per tree or per node.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Sequence
from contextvars import ContextVar
from typing import Any, Protocol

from zerodb_core.crypto.blobs import BlobKind

# What a reader asks for: a node id, or ``(blob id, blob kind)`` for other kinds of blob.
BlobRequest = bytes | tuple[bytes, BlobKind]
# A read coroutine: yields lists of requests, receives {request: object}, returns its result.
Reader = Generator[Sequence[BlobRequest], dict[BlobRequest, Any], Any]


class NodeSource(Protocol):
    """Fetches clean (persisted) blobs by id: cache first, then one batched request."""

    def lookup(self, blob_id: bytes) -> Any | None:
        """Return the object if it is cached, else None (no I/O)."""

    def fetch(self, requests: Sequence[BlobRequest]) -> dict[BlobRequest, Any]:
        """Fetch and decode all of these in one round trip (raising if any is missing)."""


def new_id() -> bytes:
    """A fresh random 128-bit blob id: write-once ids must never repeat."""
    return os.urandom(16)


class Workspace:
    """Dirty objects, replaced ids and batched reads of one transaction."""

    def __init__(self, source: NodeSource) -> None:
        self.source = source
        # Objects this transaction made (run nodes, record blobs), readable before commit.
        self.dirty: dict[bytes, Any] = {}
        # Persisted blobs this transaction makes unreachable (garbage at commit).
        self.garbage: list[bytes] = []
        # Nodes a read will probably want soon: fetched with the next fetch that happens
        # anyway, never by a round trip of their own.
        self.wanted: list[bytes] = []

    # -- savepoints ---------------------------------------------------------------------

    def mark(self) -> int:
        """Return a marker for :meth:`rollback_to`."""
        return len(self.garbage)

    def rollback_to(self, marker: int) -> None:
        """Forget ids marked as garbage after ``marker`` (their blobs are live again)."""
        del self.garbage[marker:]

    # -- access -----------------------------------------------------------------------------

    def prefetch(self, node_ids: list[bytes]) -> None:
        """Fetch these nodes along with the next fetch (if any): a query that will read
        records after an index reads the record tree's top in the index's round trips."""
        wanted = self.wanted
        for node_id in node_ids:  # only what is not at hand (and each id once)
            fresh = node_id not in wanted and node_id not in self.dirty
            if fresh and self.source.lookup(node_id) is None:
                wanted.append(node_id)

    def add(self, obj: Any) -> None:
        """Register a new dirty object under its ``id``."""
        self.dirty[obj.id] = obj

    def run(self, readers: Sequence[Reader]) -> list[Any]:
        """Drive the readers in lockstep, one batched fetch per step; return their results.

        While they run, every ``gather`` answers from this transaction's objects and the
        cache at once, so a reader only waits for blobs that must be fetched (see
        :func:`gather`)."""
        reader = gather(readers)
        token = _peek.set(self._peek)
        answer = None
        try:
            while True:
                requests = reader.send(answer) if answer is not None else next(reader)
                answer = self._resolve(requests)
        except StopIteration as stop:
            results: list[Any] = stop.value  # what gather returns
            return results
        finally:
            _peek.reset(token)

    def _peek(self, request: BlobRequest) -> Any | None:
        """The object of a request if it is at hand (this transaction's, or cached)."""
        blob_id = request if isinstance(request, bytes) else request[0]
        obj = self.dirty.get(blob_id)
        return obj if obj is not None else self.source.lookup(blob_id)

    def _resolve(self, requests: Sequence[BlobRequest]) -> dict[BlobRequest, Any]:
        """Fetch what the readers wait for (the gather answered what was at hand), with
        the nodes asked to come along (:meth:`prefetch`), in one request."""
        asked = {r if isinstance(r, bytes) else r[0] for r in requests}
        extra: list[BlobRequest] = [i for i in self.wanted if i not in asked]
        self.wanted = []
        fetched = self.source.fetch(list(requests) + extra)  # all cached by the source
        return {r: fetched[r] for r in requests}


# A reader waiting: (its index, itself, its requests, those of them already at hand)
_Waiting = tuple[int, Reader, Sequence[BlobRequest], dict[BlobRequest, Any]]
_Peek = Callable[[BlobRequest], Any | None]


# What Workspace.run answers without a fetch, for the gathers it drives (None: nothing).
_peek: ContextVar[_Peek | None] = ContextVar("peek", default=None)


def gather(readers: Sequence[Reader]) -> Reader:
    """One reader made of several: each step asks for everything any of them needs now.

    Readers use it to walk several trees or ranges at once (``yield from gather(...)``);
    ``Workspace.run`` uses it to batch independent readers. Under ``Workspace.run``, a
    reader whose requests are all at hand (cached) is answered and stepped at once, and
    only blobs to fetch are asked for: readers at different depths (runs of different
    heights, a tree whose top is cached and one whose is not) then meet in one fetch
    instead of taking turns.
    """
    peek = _peek.get()
    results: list[Any] = [None] * len(readers)
    waiting: list[_Waiting] = []
    for index, reader in enumerate(readers):
        _step(index, reader, None, results, waiting, peek)
    while waiting:
        merged = list(
            dict.fromkeys(r for _, _, requests, have in waiting for r in requests if r not in have)
        )
        answer = yield merged
        step, waiting = waiting, []
        for index, reader, requests, have in step:
            got = {r: have[r] if r in have else answer[r] for r in requests}
            _step(index, reader, got, results, waiting, peek)
    return results


def _step(
    index: int,
    reader: Reader,
    answer: dict[BlobRequest, Any] | None,
    results: list[Any],
    waiting: list[_Waiting],
    peek: _Peek | None,
) -> None:
    """Advance one reader until it asks for something not at hand (or finishes)."""
    while True:
        try:
            requests = reader.send(answer) if answer is not None else next(reader)
        except StopIteration as stop:
            results[index] = stop.value
            return
        have = {}
        if peek is not None:
            for request in requests:
                obj = peek(request)
                if obj is not None:
                    have[request] = obj
        if len(have) < len(requests):
            waiting.append((index, reader, requests, have))
            return
        answer = have  # everything at hand (or nothing asked): on at once
