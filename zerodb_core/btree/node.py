"""B+tree nodes: plain parallel lists, ``bisect`` for search, sizes kept in bytes.

Following sortedcontainers, a node is a few Python lists and no per-key objects: search is
``bisect`` on a list of ``bytes`` (compared in C), inserts are ``list.insert``.

Inner nodes keep, per child, the number of entries below it (a *counted* B+tree), so the
count of any key range, a rank or an offset costs one root-to-leaf path, not a scan.
``keys[i]`` of an inner node is a lower bound of every key under ``children[i]``;
``keys[0]`` is never used for routing (a smaller key still goes to child 0).
"""

from __future__ import annotations

from zerodb_core.exceptions import IntegrityError

# Approximate msgpack framing per entry (bin headers, list slots). Sizes only steer splits.
ENTRY_OVERHEAD = 6
CHILD_OVERHEAD = 16 + 6 + 5  # id, bin header, count
NODE_OVERHEAD = 16

# Generation of a node that is persisted (clean): it may never be mutated again.
CLEAN = -1

LEAF = 0
INNER = 1


class Leaf:
    """Sorted keys with their values."""

    __slots__ = ("gen", "id", "keys", "size", "values")

    def __init__(
        self,
        node_id: bytes,
        keys: list[bytes],
        values: list[bytes],
        gen: int = CLEAN,
        size: int | None = None,
    ):
        self.id = node_id
        self.keys = keys
        self.values = values
        self.gen = gen
        if size is None:
            size = NODE_OVERHEAD + sum(map(len, keys)) + sum(map(len, values))
            size += ENTRY_OVERHEAD * len(keys)
        self.size = size

    is_leaf = True

    @property
    def count(self) -> int:
        return len(self.keys)

    def to_payload(self) -> list:
        return [LEAF, self.keys, self.values]


class Inner:
    """Children by id, their lower-bound keys and their entry counts."""

    __slots__ = ("children", "counts", "gen", "id", "keys", "size")

    def __init__(
        self,
        node_id: bytes,
        keys: list[bytes],
        children: list[bytes],
        counts: list[int],
        gen: int = CLEAN,
    ):
        self.id = node_id
        self.keys = keys
        self.children = children
        self.counts = counts
        self.gen = gen
        self.size = NODE_OVERHEAD + sum(map(len, keys)) + CHILD_OVERHEAD * len(keys)

    is_leaf = False

    @property
    def count(self) -> int:
        return sum(self.counts)

    def to_payload(self) -> list:
        return [INNER, self.keys, self.children, self.counts]


Node = Leaf | Inner


def node_from_payload(node_id: bytes, payload: object) -> Node:
    """Build a clean node from its decoded payload, checking its shape (fail closed)."""
    try:
        kind = payload[0]  # type: ignore[index]
        if kind == LEAF and len(payload) == 3:  # type: ignore[arg-type]
            _, keys, values = payload  # type: ignore[misc]
            if len(keys) == len(values) and _all_bytes(keys) and _all_bytes(values):
                return Leaf(node_id, keys, values)
        elif kind == INNER and len(payload) == 4:  # type: ignore[arg-type]
            _, keys, children, counts = payload  # type: ignore[misc]
            if (
                len(keys) == len(children) == len(counts) > 0
                and _all_bytes(keys)
                and _all_bytes(children)
                and all(type(c) is int and c > 0 for c in counts)
            ):
                return Inner(node_id, keys, children, counts)
    except (TypeError, IndexError, ValueError):
        pass
    raise IntegrityError(f"blob {node_id.hex()} is not a well-formed B+tree node")


def _all_bytes(items: object) -> bool:
    return isinstance(items, list) and all(type(x) is bytes for x in items)
