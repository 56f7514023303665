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
from collections.abc import Generator, Sequence
from typing import Any, Protocol

# What a reader asks for: a node id, or ``(blob id, blob kind)`` for other kinds of blob.
BlobRequest = bytes | tuple[bytes, int]
# A read coroutine: yields lists of requests, receives {request: object}, returns its result.
Reader = Generator[list[BlobRequest], dict[BlobRequest, Any], Any]


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
        """Drive the readers in lockstep, one batched fetch per step; return their results."""
        reader = gather(readers)
        answer = None
        try:
            while True:
                requests = reader.send(answer) if answer is not None else next(reader)
                answer = self._resolve(requests)
        except StopIteration as stop:
            return stop.value

    def _resolve(self, requests: list[BlobRequest]) -> dict[BlobRequest, Any]:
        """Answer requests from dirty nodes and the cache, fetching the rest at once."""
        answer: dict[BlobRequest, Any] = {}
        missing: list[BlobRequest] = []
        dirty, lookup = self.dirty, self.source.lookup
        for request in requests:
            blob_id = request if request.__class__ is bytes else request[0]
            obj = dirty.get(blob_id)
            if obj is None:
                obj = lookup(blob_id)
                if obj is None:
                    missing.append(request)
                    continue
            answer[request] = obj
        if missing:
            if self.wanted:
                asked = {r if r.__class__ is bytes else r[0] for r in missing}
                extra = [
                    i
                    for i in self.wanted
                    if i not in asked and i not in dirty and lookup(i) is None
                ]
                self.wanted = []
                fetched = self.source.fetch(missing + extra)  # cached by the source
                answer.update((r, fetched[r]) for r in missing)
            else:
                answer.update(self.source.fetch(missing))
        return answer


def gather(readers: Sequence[Reader]) -> Reader:
    """One reader made of several: each step asks for everything any of them needs now.

    Readers use it to walk several trees or ranges at once (``yield from gather(...)``);
    ``Workspace.run`` uses it to batch independent readers.
    """
    results: list[Any] = [None] * len(readers)
    waiting: list[tuple[int, Reader, list[BlobRequest]]] = []
    for index, reader in enumerate(readers):
        _step(index, reader, None, results, waiting)
    while waiting:
        merged = list(dict.fromkeys(r for _, _, requests in waiting for r in requests))
        answer = yield merged
        step, waiting = waiting, []
        for index, reader, requests in step:
            _step(index, reader, {r: answer[r] for r in requests}, results, waiting)
    return results


def _step(index, reader, answer, results, waiting) -> None:
    """Advance one reader until it asks for something (or finishes)."""
    while True:
        try:
            requests = reader.send(answer) if answer is not None else next(reader)
        except StopIteration as stop:
            results[index] = stop.value
            return
        if requests:
            waiting.append((index, reader, requests))
            return
        answer = {}  # a reader that needs nothing this step is answered at once
