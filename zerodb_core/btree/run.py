"""Runs: immutable counted B+trees, built bottom-up once and only ever read.

A log-structured tree (:mod:`zerodb_core.lsm`) is a stack of runs. A commit adds a small
run holding what it changed; merges replace several runs by one. Runs are never changed
in place, so they need no copy-on-write path: :func:`build_run_of` packs sorted entries into
full leaves and builds the inner levels above them, and the readers here walk one run
level by level, yielding the node ids they need next (see ``Workspace.run``).

Ranges are half open, ``[lo, hi)`` on encoded keys, with ``lo=b""`` for "from the start"
and ``hi=None`` for "to the end".
"""

from __future__ import annotations

import builtins
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any

from zerodb_core.btree.blocks import BODY, CHANGES, Block
from zerodb_core.btree.filters import BloomFilter
from zerodb_core.btree.node import (
    ALL_PUT,
    CHILD_OVERHEAD,
    ENTRY_OVERHEAD,
    NODE_OVERHEAD,
    PUT,
    Inner,
    Leaf,
    Node,
    PostingsLeaf,
    Stored,
)
from zerodb_core.btree.workspace import Reader, new_id
from zerodb_core.crypto.padding import padded_size
from zerodb_core.encoding import key_after
from zerodb_core.exceptions import IntegrityError, QueryError

# Node budgets (estimated payload bytes), a little below a padding size class so a full
# node lands in it (the estimate may miss a byte per entry with keys over 255 bytes).
# Inner nodes and full-text postings are read a range at a time: big nodes mean few
# round trips and headers. Records and ordered-index entries are
# mostly read a few at a time (a page of rows, ``pk__in``, an equality): small leaves
# keep the bytes read per row near the row's own size (docs/architecture.md).
NODE_MAX_BYTES = 16 * 1024 - 256
RECORD_LEAF_BYTES = 1024 - 24
INDEX_LEAF_BYTES = 512 - 16
# Trigram postings are read a few terms at a time (the trigrams covering a needle), and a
# rare trigram's postings are a fraction of a leaf: smaller leaves than a full-text
# index's, whose words' postings are read whole for ranking.
TRIGRAM_LEAF_BYTES = 4096 - 64


@dataclass(frozen=True, slots=True)
class NodeSizes:
    """The node budgets of one database (tests scale them down to get deep trees)."""

    inner: int = NODE_MAX_BYTES
    records: int = RECORD_LEAF_BYTES
    index: int = INDEX_LEAF_BYTES
    text: int = NODE_MAX_BYTES
    trigram: int = TRIGRAM_LEAF_BYTES

    @classmethod
    def scaled(cls, node_bytes: int) -> NodeSizes:
        """Budgets with no node above ``node_bytes``."""
        return cls(
            node_bytes,
            min(RECORD_LEAF_BYTES, node_bytes),
            min(INDEX_LEAF_BYTES, node_bytes),
            node_bytes,
            min(TRIGRAM_LEAF_BYTES, node_bytes),
        )


# The msgpack of a block's head (seven small ints, a pk key) and framing, about.
BLOCK_HEAD_BYTES = 40

# What a sealed blob adds to its padded payload (header, nonce, tag): steers merges only.
BLOB_OVERHEAD = 66
# Fence keys longer than this are kept as a bound (a prefix, or the key after one).
MAX_FENCE = 32


@dataclass(frozen=True, slots=True)
class RunRef:
    """What the root record keeps of a run.

    ``count`` is the run's net change in live keys (PUT minus DELETE entries), ``dels``
    its DELETE entries, ``plain`` whether every entry is a PUT (then positions inside
    the run are positions among live keys). ``bytes`` is the sealed size of its nodes,
    which the merge policy weighs. ``first`` and ``last`` bound its keys (inclusive;
    None: unknown), so reads skip runs that cannot hold a key. ``filter`` is the blob id
    of its Bloom filter of values, if it has one (:mod:`zerodb_core.btree.filters`).
    ``newest`` is the seq of the newest commit whose entries the run holds (a merged
    run: its newest input's; None: not known, from a root written before it was kept),
    so a transaction can tell which runs hold changes made after its snapshot
    (:mod:`zerodb_core.isolation`).
    """

    root: bytes
    height: int
    count: int
    dels: int = 0
    bytes: int = 0
    # Below the field ``bytes``, the class body sees it instead of the builtin.
    first: builtins.bytes | None = None
    last: builtins.bytes | None = None
    plain: bool = True
    filter: builtins.bytes | None = None
    newest: int | None = None

    def to_payload(self) -> list[object]:
        payload: list[object] = [
            self.root,
            self.height,
            self.count,
            self.dels,
            self.bytes,
            self.first,
            self.last,
            self.plain,
            self.filter,
        ]
        if self.newest is not None:
            payload.append(self.newest)
        return payload

    @classmethod
    def from_payload(cls, payload: Any) -> RunRef:
        """Check and unpack a run reference of the root record (fail closed)."""
        newest = None
        try:
            if type(payload) is list and len(payload) == 10:
                *payload, newest = payload
            root, height, count, dels, size, first, last, plain, bloom = payload
        except (TypeError, ValueError):
            raise IntegrityError("malformed run reference in root record") from None
        if not (
            type(root) is bytes
            and len(root) == 16
            and type(height) is int
            and height > 0
            and type(count) is int
            and type(dels) is int
            and dels >= 0
            and count + dels >= 0
            and type(size) is int
            and size >= 0
            and (first is None or type(first) is bytes)
            and (last is None or type(last) is bytes)
            and type(plain) is bool
            and (not plain or dels == 0)
            and (bloom is None or (type(bloom) is bytes and len(bloom) == 16))
            and (newest is None or (type(newest) is int and newest > 0))
        ):
            raise IntegrityError("malformed run reference in root record")
        return cls(root, height, count, dels, size, first, last, plain, bloom, newest)

    def may_hold(self, key: builtins.bytes) -> bool:
        """Whether ``key`` can be in this run, by its fence keys alone (no I/O)."""
        return (self.first is None or key >= self.first) and (self.last is None or key <= self.last)

    def overlaps(self, lo: builtins.bytes, hi: builtins.bytes | None) -> bool:
        """Whether this run can hold keys of ``[lo, hi)``, by its fence keys alone."""
        return (self.last is None or self.last >= lo) and (
            hi is None or self.first is None or self.first < hi
        )


# -- building --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeptLeaf:
    """A leaf of another run, kept as it is and known from its parent alone: a merge of
    runs whose keys do not overlap (new records under growing keys, as a load makes
    them) reads only their inner nodes, and writes only new inner nodes above their
    leaves. ``last`` bounds the leaf's keys when it is the last of its run (else None:
    a later leaf bounds it); ``sealed`` is its share of its run's estimated bytes."""

    first: bytes
    id: bytes
    net: int
    dels: int
    plain: bool
    sealed: int
    last: bytes | None = None


# (keys, values, tags): values are bytes, or blocks of postings (a full-text index)
Segment = tuple[list[bytes], list[Any], bytes] | Leaf | PostingsLeaf | KeptLeaf


def build_run_of(
    segments: list[Segment],
    *,
    leaf_bytes: int,
    inner_bytes: int,
    postings: bool = False,
    filter_values: Iterable[bytes] | None = None,
    newest: int | None = None,
) -> tuple[RunRef, list[Stored]]:
    """A run of ``segments`` in key order: entries ``(keys, values, tags)`` to pack into
    new leaves, or leaves of other runs to keep as they are (a merge keeps the leaves no
    other input overlaps, and writes only new inner nodes above them). With
    ``filter_values``, the run gets a Bloom filter of them; ``newest`` is the seq of the
    newest commit whose entries it holds. Return its reference and its new nodes."""
    level: _Level = []
    nodes: list[Stored] = []
    reused: list[Leaf | PostingsLeaf] = []
    kept: list[KeptLeaf] = []
    for segment in segments:
        if isinstance(segment, KeptLeaf):
            kept.append(segment)
            level.append((segment.first, segment.id, segment.net, segment.dels, segment.sealed))
        elif isinstance(segment, tuple):
            keys, values, tags = segment
            if not keys:
                continue
            made = (
                _postings_leaves(keys, values, leaf_bytes)
                if postings
                else _leaves(keys, values, tags, leaf_bytes)
            )
            level += made[0]
            nodes += made[1]
        else:
            leaf, n = segment, len(segment.keys)
            reused.append(leaf)
            level.append(
                (
                    leaf.keys[0],
                    leaf.id,
                    leaf.net(0, n),
                    leaf.tombstones(),
                    _sealed(_leaf_size(leaf)),
                )
            )
    if not level:
        raise QueryError("a run holds at least one entry")
    leaves = [node for node in nodes if isinstance(node, Leaf | PostingsLeaf)] + reused
    plain = not any(map(_has_tags, leaves)) and all(leaf.plain for leaf in kept)
    first = level[0][0]
    lasts = [leaf.keys[-1] for leaf in leaves] + [leaf.last for leaf in kept if leaf.last]
    last = max(lasts) if lasts else None
    total_bytes = sum(item[4] for item in level)
    dels = sum(item[3] for item in level)
    height = 1
    while len(level) > 1:
        ends = _chunk_ends(
            [len(first) + CHILD_OVERHEAD for first, *_ in level], inner_bytes - NODE_OVERHEAD
        )
        above = []
        start = 0
        for end in ends:
            part = level[start:end]
            node = Inner(
                new_id(),
                [p[0] for p in part],
                [p[1] for p in part],
                [p[2] for p in part],
                # Without tombstone counts a node says every child adds keys.
                [p[3] for p in part] if any(p[3] or p[2] <= 0 for p in part) else None,
            )
            nodes.append(node)
            total_bytes += _inner_sealed(node)
            above.append((part[0][0], node.id, sum(p[2] for p in part), sum(p[3] for p in part), 0))
            start = end
        level = above
        height += 1
    _, root, count, _, _ = level[0]
    bloom = None if filter_values is None else BloomFilter.of(new_id(), filter_values)
    if bloom is not None:
        nodes.append(bloom)
        total_bytes += padded_size(len(bloom.bits) + 16) + BLOB_OVERHEAD
    ref = RunRef(
        root,
        height,
        count,
        dels,
        total_bytes,
        _lower_fence(first),
        None if last is None else _upper_fence(last),
        plain and not dels,
        None if bloom is None else bloom.id,
        newest,
    )
    return ref, nodes


def _sealed(payload: int) -> int:
    """The sealed size of a node of ``payload`` estimated bytes."""
    return padded_size(payload) + BLOB_OVERHEAD


def _inner_sealed(node: Inner) -> int:
    """The estimated sealed size of an inner node (as built here)."""
    return _sealed(NODE_OVERHEAD + sum(len(key) + CHILD_OVERHEAD for key in node.keys))


def _has_tags(leaf: Leaf | PostingsLeaf) -> bool:
    """Whether a leaf holds anything but puts (of keys, or of postings)."""
    if isinstance(leaf, PostingsLeaf):
        return any(block[CHANGES] for block in leaf.values)
    return bool(leaf.tags)


def _leaf_size(leaf: Leaf | PostingsLeaf) -> int:
    """The estimated payload of a leaf (as the leaf builders estimate it)."""
    n = len(leaf.keys)
    if isinstance(leaf, PostingsLeaf):
        bodies = sum(len(block[BODY]) for block in leaf.values)
        return NODE_OVERHEAD + len(b"".join(leaf.keys)) + bodies + BLOCK_HEAD_BYTES * n
    per_entry = ENTRY_OVERHEAD + (1 if leaf.tags else 0)
    return NODE_OVERHEAD + len(b"".join(leaf.keys)) + len(b"".join(leaf.values)) + per_entry * n


# (first key, node id, net count, tombstones, estimated sealed bytes) of each node
_Level = list[tuple[bytes, bytes, int, int, int]]


def _leaves(
    keys: list[bytes], values: list[bytes], tags: bytes, leaf_bytes: int
) -> tuple[_Level, list[Node]]:
    tagged = bool(tags) and any(tags)
    per_entry = ENTRY_OVERHEAD + (1 if tagged else 0)
    ends = _chunk_ends(
        [len(k) + len(v) + per_entry for k, v in zip(keys, values)], leaf_bytes - NODE_OVERHEAD
    )
    level: _Level = []
    nodes: list[Node] = []
    start = 0
    for end in ends:
        leaf_tags = bytes(tags[start:end]) if tagged else ALL_PUT
        leaf = Leaf(new_id(), keys[start:end], values[start:end], leaf_tags)
        nodes.append(leaf)
        size = _sealed(_leaf_size(leaf))
        level.append((keys[start], leaf.id, leaf.net(0, end - start), leaf.tombstones(), size))
        start = end
    return level, nodes


def _postings_leaves(
    keys: list[bytes], blocks: list[Block], leaf_bytes: int
) -> tuple[_Level, list[Node]]:
    sizes = [len(k) + len(b[BODY]) + BLOCK_HEAD_BYTES for k, b in zip(keys, blocks)]
    ends = _chunk_ends(sizes, leaf_bytes - NODE_OVERHEAD)
    level: _Level = []
    nodes: list[Node] = []
    start = 0
    for end in ends:
        leaf = PostingsLeaf(new_id(), keys[start:end], blocks[start:end])
        nodes.append(leaf)
        size = _sealed(NODE_OVERHEAD + sum(sizes[start:end]))
        level.append((keys[start], leaf.id, leaf.net(0, end - start), leaf.tombstones(), size))
        start = end
    return level, nodes


def _chunk_ends(sizes: list[int], budget: int) -> list[int]:
    """Cut a sequence of item sizes into consecutive chunks of at most ``budget`` bytes
    (at least one item each); return each chunk's end. One bisect per chunk."""
    cumulative = list(accumulate(sizes))
    n = len(cumulative)
    ends = []
    start = 0
    base = 0
    while start < n:
        end = bisect_right(cumulative, base + budget, start)
        if end == start:
            end = start + 1
        ends.append(end)
        base = cumulative[end - 1]
        start = end
    return ends


def _lower_fence(key: bytes) -> bytes:
    return key[:MAX_FENCE]


def _upper_fence(key: bytes) -> bytes | None:
    if len(key) <= MAX_FENCE:
        return key
    try:
        return key_after(key[:MAX_FENCE])
    except QueryError:  # a prefix of 0xFF bytes has no successor: no bound
        return None


# -- reading (generators for Workspace.run) ----------------------------------------------


class Run:
    """Readers of one run."""

    __slots__ = ("ref",)

    def __init__(self, ref: RunRef) -> None:
        self.ref = ref

    def get_many_reader(self, keys: list[bytes]) -> Reader:
        """Return ``{key: (tag, value)}`` for the keys this run holds an entry for;
        ``keys`` sorted and distinct. One fetch per level for all keys."""
        found: dict[bytes, tuple[int, bytes]] = {}
        if not keys:
            return found
        frontier = [(self.ref.root, keys)]
        while frontier:
            nodes = yield [node_id for node_id, _ in frontier]
            deeper = []
            for node_id, wanted in frontier:
                node = nodes[node_id]
                seps = node.keys
                if node.is_leaf:
                    # Only the wanted keys within the leaf's first and last key.
                    lo = bisect_left(wanted, seps[0])
                    tags, values = node.tags, node.values
                    for key in wanted[lo : bisect_right(wanted, seps[-1], lo)]:
                        i = bisect_left(seps, key)
                        if seps[i] == key:
                            found[key] = (tags[i] if tags else PUT, values[i])
                    continue
                # Each child takes the run of wanted keys below its right neighbour's
                # separator: a bisect per child reached, not per key.
                start, stop = 0, len(wanted)
                while start < stop:
                    i = bisect_right(seps, wanted[start]) - 1
                    if i < 0:
                        i = 0
                    end = stop if i + 1 == len(seps) else bisect_left(wanted, seps[i + 1], start)
                    deeper.append((node.children[i], wanted[start:end]))
                    start = end
            frontier = deeper
        return found

    def leaves_reader(self) -> Reader:
        """Return every leaf of the run, in key order."""
        items = yield from self._descend(b"", None, 0, None, False, exact=True)
        return [item[1] for item in items or ()]

    def entries_reader(self, lo: bytes = b"", hi: bytes | None = None) -> Reader:
        """Return every entry of ``[lo, hi)`` as parallel lists ``(keys, tags, values)``
        in key order, tags one byte per entry."""
        items = yield from self._descend(lo, hi, 0, None, False, exact=True)
        keys: list[bytes] = []
        tags = bytearray()
        values: list[bytes] = []
        for item in items or ():
            leaf = item[1]
            a, b = _leaf_span(leaf, lo, hi)
            keys += leaf.keys[a:b]
            values += leaf.values[a:b]
            if leaf.tags:
                tags += leaf.tags[a:b]
            else:
                tags += bytes(b - a)
        return keys, bytes(tags), values

    def scan_reader(
        self,
        lo: bytes = b"",
        hi: bytes | None = None,
        *,
        skip: int = 0,
        limit: int | None = None,
        reverse: bool = False,
    ) -> Reader:
        """Return ``[(key, value)]`` of ``[lo, hi)`` in key order (or reversed), after
        skipping ``skip`` entries and taking at most ``limit``; a plain run only (its
        positions are positions among live keys).

        Subtrees entirely inside the range and entirely outside the wanted window are
        never fetched: their counts stand in for them, so a deep offset costs one path.
        """
        if not self.ref.plain:
            raise QueryError("a positional scan needs a run of PUT entries")
        end = None if limit is None else skip + limit
        items = yield from self._descend(lo, hi, skip, end, reverse, exact=True)
        if items is None:
            return []
        out: list[tuple[bytes, bytes]] = []
        pos = 0
        for item in items:
            if item[0] == "gap":
                pos += item[1]
                continue
            leaf = item[1]
            a, b = _leaf_span(leaf, lo, hi)
            n = b - a
            if pos + n <= skip:
                pos += n
                continue
            first = max(skip - pos, 0)
            take = n - first if end is None else min(n - first, end - skip - len(out))
            if reverse:
                idx = range(b - 1 - first, b - 1 - first - take, -1)
            else:
                idx = range(a + first, a + first + take)
            keys, values = leaf.keys, leaf.values
            out.extend((keys[k], values[k]) for k in idx)
            pos += n
            if end is not None and len(out) >= end - skip:
                break
        return out

    def count_reader(
        self,
        lo: bytes = b"",
        hi: bytes | None = None,
        *,
        exact: bool = True,
        read_under: int = 0,
    ) -> Reader:
        """Return the net count (PUT minus DELETE entries) of ``[lo, hi)``.

        Exact: the two edge paths only. Not exact (an estimate for the planner): stops above
        the leaves and counts half of each edge leaf, so a warm cache answers with no I/O.
        ``read_under``: when the leaves between the edges hold at most this many entries,
        read them too, in the same round trip as the edges (a count followed by a read of
        the same small range, as ``list(result)`` does, then costs no extra round trip).
        """
        items = yield from self._descend(
            lo, hi, 0, None, False, exact=exact, count_only=True, read_under=read_under
        )
        total = 0
        for item in items or ():
            if item[0] == "gap":
                total += item[1]
                continue
            a, b = _leaf_span(item[1], lo, hi)
            total += item[1].net(a, b)
        return total

    def upper_reader(self) -> Reader:
        """Read every node of the run above its leaves, and its filter (returning
        nothing): what a long-running client ends up caching."""
        ref = self.ref
        level = [ref.root]
        filters: list[bytes] = (
            [] if ref.filter is None else [ref.filter]
        )  # read with the first level
        for _ in range(ref.height - 1):
            nodes = yield level + filters
            filters = []
            level = [child for node_id in level for child in nodes[node_id].children]
        if filters:
            yield filters
        return None

    def kept_leaves_reader(self) -> Reader:
        """Return the run's leaves in key order as :class:`KeptLeaf` items, reading only
        its inner nodes (a run of one leaf: that leaf, read)."""
        ref = self.ref
        if ref.height == 1:
            nodes = yield [ref.root]
            return [nodes[ref.root]]
        level, parents, inner_bytes = [ref.root], [], 0
        for _ in range(ref.height - 1):
            nodes = yield level
            parents = [nodes[node_id] for node_id in level]
            inner_bytes += sum(map(_inner_sealed, parents))
            level = [child for node in parents for child in node.children]
        share = max(ref.bytes - inner_bytes, 0) // len(level)
        out = []
        for node in parents:
            dels = node.dels or [0] * len(node.children)
            out += [
                KeptLeaf(key, child, count, dead, ref.plain, share)
                for key, child, count, dead in zip(node.keys, node.children, node.counts, dels)
            ]
        out[-1] = replace(out[-1], last=ref.last)
        return out

    def node_ids_reader(self) -> Reader:
        """Return the id of every node of the run, its filter included (only inner nodes
        are read: they name their children)."""
        ref = self.ref
        ids = [ref.root] if ref.filter is None else [ref.root, ref.filter]
        level = [ref.root]
        for _ in range(ref.height - 1):
            nodes = yield level
            level = [child for node_id in level for child in nodes[node_id].children]
            ids += level
        return ids

    def _descend(
        self,
        lo: bytes,
        hi: bytes | None,
        skip: int,
        end: int | None,
        reverse: bool,
        *,
        exact: bool,
        count_only: bool = False,
        read_under: int = 0,
    ) -> Reader:
        """Walk down level by level, keeping only the nodes the window may need.

        Yields lists of node ids; returns the leaf level as items ``("leaf", node)`` and
        ``("gap", net count)`` in scan order, or None for an empty range. Windows
        (``skip``, ``end``) are positions among the run's entries, so they are only
        asked of plain runs.
        """
        ref = self.ref
        if hi is not None and hi <= lo:
            return None
        # Windowed: only a window of positions is wanted (else every node in the range).
        windowed = skip > 0 or end is not None
        # ("node", id, lower bound, upper bound) | ("gap", net count)
        items: list[tuple[Any, ...]] = [("node", ref.root, b"", None)]
        depth = 0
        while True:
            ids = [item[1] for item in items if item[0] == "node"]
            nodes = yield ids
            if depth == ref.height - 1:
                return [(item[0], nodes[item[1]]) if item[0] == "node" else item for item in items]
            last_inner = depth == ref.height - 2
            depth += 1
            new: list[tuple[Any, ...]] = []
            before_min = before_max = 0
            for item in items:
                if item[0] == "gap":
                    new.append(item)
                    before_min += item[1]
                    before_max += item[1]
                    continue
                node = nodes[item[1]]
                for c_lo, c_hi, child, count in _children(node, item[2], item[3], reverse, lo, hi):
                    if (c_hi is not None and c_hi <= lo) or (hi is not None and c_lo >= hi):
                        continue
                    full = c_lo >= lo and (hi is None or (c_hi is not None and c_hi <= hi))
                    if full:
                        wanted = not count_only and (
                            not windowed
                            or (before_max + count > skip and (end is None or before_min < end))
                        )
                        if wanted:
                            new.append(("node", child, c_lo, c_hi))
                        elif last_inner:  # a leaf counted unread (read_under may read it)
                            new.append(("gap", count, child, c_lo, c_hi))
                        else:
                            new.append(("gap", count))
                        before_min += count
                    elif not exact and last_inner:
                        new.append(("gap", count // 2))
                    elif count_only or end is None or before_min < end:
                        new.append(("node", child, c_lo, c_hi))
                    before_max += count
            items = new
            if not exact and last_inner:
                return items
            if last_inner and read_under:
                unread = [item for item in items if item[0] == "gap"]
                if sum(item[1] for item in unread) <= read_under:
                    items = [("node", *item[2:]) if len(item) == 5 else item for item in items]


def _children(
    node: Inner,
    lo: bytes,
    hi: bytes | None,
    reverse: bool,
    want_lo: bytes = b"",
    want_hi: bytes | None = None,
) -> Iterator[tuple[bytes, bytes | None, bytes, int]]:
    """Yield ``(lower, upper, child id, net count)`` of the children of a node spanning
    ``[lo, hi)`` that may hold keys of ``[want_lo, want_hi)``, in scan order (found by
    bisecting the separators: a root of hundreds of children costs two bisects)."""
    keys, children, counts = node.keys, node.children, node.counts
    n = len(children)
    first = max(bisect_right(keys, want_lo, 1) - 1, 0) if want_lo else 0
    stop = n if want_hi is None else max(bisect_left(keys, want_hi, 1), 1)
    order = range(stop - 1, first - 1, -1) if reverse else range(first, stop)
    for i in order:
        yield (
            keys[i] if i else lo,
            keys[i + 1] if i + 1 < n else hi,
            children[i],
            counts[i],
        )


def _leaf_span(leaf: Leaf, lo: bytes, hi: bytes | None) -> tuple[int, int]:
    keys = leaf.keys
    return bisect_left(keys, lo), len(keys) if hi is None else bisect_left(keys, hi)
