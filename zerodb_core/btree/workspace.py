"""Where a transaction's trees find their nodes, and how reads are batched.

A :class:`Workspace` belongs to one transaction. It holds the nodes the transaction made
(*dirty* nodes, mutable while their generation is current), the ids of persisted nodes the
transaction replaced (garbage at commit), and a :class:`NodeSource` for everything else.

Reads are written as generators that ``yield`` the list of blob ids they need next and
receive a dict of id -> object. :meth:`Workspace.run` drives several of them in lockstep
and merges what they need at each step into **one** request, so a query that walks three
trees level by level costs one round trip per level, not one per tree or per node.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from typing import Any, Protocol

from zerodb_core.btree.node import CLEAN, Node

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
    """Dirty nodes, replaced ids and batched reads of one transaction."""

    def __init__(self, source: NodeSource) -> None:
        self.source = source
        self.dirty: dict[bytes, Any] = {}
        self.garbage: list[bytes] = []
        # Nodes of the current generation may be changed in place; a savepoint starts a
        # new generation so that what it captured is copied before it is changed.
        self.gen = 0

    # -- savepoints ---------------------------------------------------------------------

    def mark(self) -> int:
        """Start a new generation and return a marker for :meth:`rollback_to`."""
        self.gen += 1
        return len(self.garbage)

    def rollback_to(self, marker: int) -> None:
        """Forget ids marked as garbage after ``marker`` (their nodes are live again)."""
        del self.garbage[marker:]
        self.gen += 1

    # -- node access ----------------------------------------------------------------------

    def add(self, obj: Any) -> None:
        """Register a new dirty object under its ``id``."""
        self.dirty[obj.id] = obj

    def retire(self, node: Node) -> None:
        """Note that ``node`` is replaced; if it was persisted it becomes garbage."""
        if node.gen == CLEAN:
            self.garbage.append(node.id)

    def writable(self, node: Node) -> Node:
        """Return ``node`` itself if this generation may change it, else a dirty copy."""
        if node.gen == self.gen:
            return node
        copy = _copy_node(node, new_id(), self.gen)
        self.retire(node)
        self.add(copy)
        return copy

    def load(self, blob_id: bytes) -> Any:
        """Return one node, fetching it (one round trip) if it is neither dirty nor cached.

        Writes walk one path at a time through here, so it avoids the reader machinery.
        """
        obj = self.dirty.get(blob_id)
        if obj is None:
            obj = self.source.lookup(blob_id)
            if obj is None:
                obj = self.source.fetch([blob_id])[blob_id]
        return obj

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


def _copy_node(node: Node, node_id: bytes, gen: int) -> Node:
    copy = object.__new__(type(node))
    for slot in type(node).__slots__:
        value = getattr(node, slot)
        setattr(copy, slot, value.copy() if isinstance(value, list) else value)
    copy.id = node_id
    copy.gen = gen
    return copy


def reachable_dirty(
    workspace: Workspace, roots: Sequence[bytes | None], leaf_refs=None
) -> list[Any]:
    """Return the dirty objects reachable from ``roots``: exactly what a commit must write.

    Dirty nodes that a later change replaced (or a savepoint rollback abandoned) are not
    reachable and are simply dropped. ``leaf_refs(leaf)`` may name further blob ids a leaf
    points to (records too large to live inline).
    """
    dirty = workspace.dirty
    out: list[Any] = []
    seen: set[bytes] = set()
    stack = [r for r in roots if r is not None and r in dirty]
    while stack:
        blob_id = stack.pop()
        if blob_id in seen:
            continue
        seen.add(blob_id)
        obj = dirty[blob_id]
        out.append(obj)
        children = getattr(obj, "children", None)
        if children is not None:
            stack.extend(c for c in children if c in dirty)
        elif leaf_refs is not None and getattr(obj, "is_leaf", False):
            stack.extend(r for r in leaf_refs(obj) if r in dirty)
    return out
