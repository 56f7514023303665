"""B+tree nodes of an immutable run: plain parallel lists, ``bisect`` for search.

Following sortedcontainers, a node is a few Python lists and no per-key objects: search is
``bisect`` on a list of ``bytes`` (compared in C).

A run (see :mod:`zerodb_core.btree.run`) is one immutable sorted layer of a log-structured
tree. Its entries carry a *tag* saying what they do to the layers below: ``PUT`` adds a
key that was absent, ``REPLACE`` gives a present key a new value, ``DELETE`` removes a
present key (a tombstone, with an empty value). Because writers only ever record exact
changes, a run's entries change the number of live keys by exactly ``+1``, ``0`` and
``-1``, and counts stay exact without reading the layers below.

Inner nodes keep, per child, that *net* count (``PUT`` minus ``DELETE`` entries below it)
and the number of ``DELETE`` entries, so the live count of any key range, a rank or an
offset costs edge paths, not a scan. ``keys[i]`` of an inner node is a lower bound of
every key under ``children[i]``; ``keys[0]`` is never used for routing.

A leaf without tags holds only ``PUT`` entries, and an inner node without ``dels`` none
below it (the payloads of runs of puts, the most common, stay as short as can be).
"""

from __future__ import annotations

from typing import Any

from zerodb_core.btree.blocks import DELS, NET, Block, valid_block
from zerodb_core.btree.filters import FILTER, BloomFilter, filter_from_payload
from zerodb_core.btree.tags import DELETE, PUT, REPLACE
from zerodb_core.exceptions import IntegrityError

__all__ = [
    "ALL_PUT",
    "DELETE",
    "PUT",
    "REPLACE",
    "Inner",
    "Leaf",
    "Node",
    "PostingsLeaf",
    "Stored",
    "node_from_payload",
]

# Approximate msgpack framing per entry (bin headers, list slots). Sizes only steer splits.
ENTRY_OVERHEAD = 6
CHILD_OVERHEAD = 16 + 4 + 5 + 5  # id, bin headers, net count, tombstone count
NODE_OVERHEAD = 16

# The tags of a leaf of PUT entries only (most leaves).
ALL_PUT = b""

LEAF = 0
INNER = 1
POSTINGS = 2


class Leaf:
    """Sorted keys with their values and tags (``ALL_PUT``, or one byte per entry)."""

    __slots__ = ("id", "keys", "tags", "values")

    def __init__(
        self, node_id: bytes, keys: list[bytes], values: list[bytes], tags: bytes = ALL_PUT
    ) -> None:
        self.id = node_id
        self.keys = keys
        self.values = values
        self.tags = tags

    is_leaf = True

    def net(self, a: int, b: int) -> int:
        """The change in live keys of entries ``a..b-1``."""
        if not self.tags:
            return b - a
        part = self.tags[a:b]
        return part.count(PUT) - part.count(DELETE)

    def tombstones(self) -> int:
        """The DELETE entries of this leaf."""
        return self.tags.count(DELETE)

    def to_payload(self) -> list[object]:
        if self.tags:
            return [LEAF, self.keys, self.values, self.tags]
        return [LEAF, self.keys, self.values]


class Inner:
    """Children by id, their lower-bound keys, net counts and tombstone counts."""

    __slots__ = ("children", "counts", "dels", "id", "keys")

    def __init__(
        self,
        node_id: bytes,
        keys: list[bytes],
        children: list[bytes],
        counts: list[int],
        dels: list[int] | None = None,
    ) -> None:
        self.id = node_id
        self.keys = keys
        self.children = children
        self.counts = counts
        # DELETE entries below each child; empty when there are none at all.
        self.dels = dels or []

    is_leaf = False

    def to_payload(self) -> list[object]:
        if self.dels:
            return [INNER, self.keys, self.children, self.counts, self.dels]
        return [INNER, self.keys, self.children, self.counts]


class PostingsLeaf:
    """Blocks of postings of a full-text index, keyed by term and first primary key.

    A block (see :mod:`zerodb_core.btree.blocks`) is a structured value, decoded with the
    leaf, so a query reads its bounds and postings without decoding anything else. Each
    block is a whole entry to the run (its key is unique), and counts the postings it
    adds: the net count of a term's range of blocks is the term's document frequency.
    """

    __slots__ = ("id", "keys", "values")

    def __init__(self, node_id: bytes, keys: list[bytes], values: list[Block]) -> None:
        self.id = node_id
        self.keys = keys
        self.values = values

    is_leaf = True
    tags = ALL_PUT

    def net(self, a: int, b: int) -> int:
        """The change in postings of blocks ``a..b-1``."""
        return sum(block[NET] for block in self.values[a:b])

    def tombstones(self) -> int:
        """The DELETE postings of this leaf's blocks."""
        return sum(block[DELS] for block in self.values)

    def to_payload(self) -> list[object]:
        return [POSTINGS, self.keys, self.values]


Node = Leaf | Inner | PostingsLeaf
# What a run writes and reads by id: its nodes and its Bloom filter.
Stored = Node | BloomFilter


def node_from_payload(node_id: bytes, payload: Any) -> Stored:
    """Build a node from its decoded payload (untrusted: Any), checking its shape (fail
    closed)."""
    try:
        kind = payload[0]
        size = len(payload)
        if kind == LEAF and size in (3, 4):
            keys, values = payload[1], payload[2]
            tags = payload[3] if size == 4 else ALL_PUT
            if (
                len(keys) == len(values)
                and _all_bytes(keys)
                and _all_bytes(values)
                and type(tags) is bytes
                and (size == 3 or (len(tags) == len(keys) and max(tags) <= DELETE))
            ):
                return Leaf(node_id, keys, values, tags)
        elif kind == POSTINGS and size == 3:
            keys, blocks = payload[1], payload[2]
            if len(keys) == len(blocks) and _all_bytes(keys) and _valid_blocks(blocks):
                return PostingsLeaf(node_id, keys, blocks)
        elif kind == FILTER:
            return filter_from_payload(node_id, payload)
        elif kind == INNER and size in (4, 5):
            keys, children, counts = payload[1], payload[2], payload[3]
            dels = payload[4] if size == 5 else []
            if (
                len(keys) == len(children) == len(counts) > 0
                and _all_bytes(keys)
                and _all_bytes(children)
                and all(type(c) is int for c in counts)
                and (size == 4 or _valid_dels(counts, dels))
                and (size == 5 or all(c > 0 for c in counts))
            ):
                return Inner(node_id, keys, children, counts, dels)
    except (TypeError, IndexError, ValueError):
        pass
    raise IntegrityError(f"blob {node_id.hex()} is not a well-formed B+tree node")


def _valid_blocks(blocks: object) -> bool:
    return isinstance(blocks, list) and all(map(valid_block, blocks))


def _valid_dels(counts: list[int], dels: object) -> bool:
    """Tombstone counts: one per child, never negative, never more puts than possible."""
    return (
        isinstance(dels, list)
        and len(dels) == len(counts)
        and all(type(d) is int and d >= 0 and c + d >= 0 for c, d in zip(counts, dels))
    )


def _all_bytes(items: object) -> bool:
    return isinstance(items, list) and set(map(type, items)) <= {bytes}
