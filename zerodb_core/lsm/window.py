"""A window of positions ``[start, stop)`` of the live keys of several runs at once.

One run answers an offset with one root-to-leaf path, because its inner nodes count the
entries below each child. Several runs (and a transaction's pending changes) interleave,
and the offset of a key is the sum over all of them, so no single run can be walked by
its counts. This walks them all in lockstep instead, one level per round trip:

* every source keeps a *frontier* of pieces covering the current key interval
  ``[a, b)``: nodes not read yet, with their net count (PUT minus DELETE entries below
  them) and their DELETE count, or entries once a leaf is read;
* after each level, every piece boundary inside ``[a, b)`` is a candidate; the live count
  below a candidate is known exactly for pieces entirely below it and within bounds for
  the one piece per source that straddles it (a straddling node adds at least minus its
  deletes, at most its puts), so the interval shrinks to the candidates that are sure
  to enclose the window;
* pieces that fall out of the interval add their exact counts to what lies before (or
  after) it, and the rest go one level deeper.

When every piece is entries, the window is cut out of their merge. The counts are exact
because every run records exact changes (see :mod:`zerodb_core.btree.node`), so the sum
of net counts below a key is the number of live keys below it, whatever the overlaps.
Reverse windows count positions from the top of the range the same way.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from zerodb_core.btree import Reader, RunRef
from zerodb_core.btree.node import DELETE, PUT, REPLACE, Inner, Leaf
from zerodb_core.lsm.pending import Pending

_NET = {PUT: 1, REPLACE: 0, DELETE: -1}
# Keys of an entries piece offered as candidates: about this many per piece.
_SAMPLES = 64


class _Piece:
    """Part of one source's frontier: an unread node, or entries."""

    __slots__ = ("dels", "hi", "inside", "keys", "lo", "net", "node", "prefix", "tags", "values")

    def __init__(self, lo: bytes, hi: bytes | None, inside: bool) -> None:
        self.lo = lo
        self.hi = hi
        self.inside = inside  # entirely within the scanned range [lo, hi)
        self.node: bytes | None = None
        self.net = 0
        self.dels = 0
        self.keys: list[bytes] = []
        self.tags: bytes = b""
        self.values: list[bytes] = []
        self.prefix: list[int] = []

    @classmethod
    def of_node(
        cls, node_id: bytes, lo: bytes, hi: bytes | None, net: int, dels: int, inside: bool
    ) -> _Piece:
        piece = cls(lo, hi, inside)
        piece.node = node_id
        piece.net = net
        piece.dels = dels
        return piece

    @classmethod
    def of_entries(
        cls, lo: bytes, hi: bytes | None, keys: list[bytes], tags: bytes, values: list[bytes]
    ) -> _Piece:
        """Entries already clipped to the scanned range; ``tags`` empty: all PUT."""
        piece = cls(lo, hi, True)
        piece.keys = keys
        piece.tags = tags
        piece.values = values
        if tags:
            piece.prefix = [0, *accumulate(_NET[t] for t in tags)]
        else:
            piece.prefix = list(range(len(keys) + 1))
        piece.net = piece.prefix[-1]
        return piece

    @property
    def exact(self) -> bool:
        """Whether what this piece adds within the scanned range is known exactly."""
        return self.node is None or self.inside

    def bounds(self) -> tuple[int, int]:
        """Least and most live keys this whole piece adds within the scanned range."""
        if self.exact:
            return self.net, self.net
        return -self.dels, self.net + self.dels

    def below(self, x: bytes) -> tuple[int, int]:
        """Bounds of what this piece adds below ``x`` (it starts below ``x``)."""
        if self.node is None:
            n = self.prefix[bisect_left(self.keys, x)]
            return n, n
        if self.inside and self.hi is not None and self.hi <= x:
            return self.net, self.net
        return -self.dels, self.net + self.dels

    def at_or_above(self, x: bytes) -> tuple[int, int]:
        """Bounds of what this piece adds at or above ``x`` (it starts below ``x``)."""
        if self.node is None:
            n = self.net - self.prefix[bisect_left(self.keys, x)]
            return n, n
        if self.hi is not None and self.hi <= x:
            return 0, 0
        return -self.dels, self.net + self.dels


def window_reader(
    runs: list[RunRef],
    pending: Pending | None,
    lo: bytes,
    hi: bytes | None,
    start: int,
    stop: int | None,
    reverse: bool,
) -> Reader:
    """Return ``[(key, value)]`` at live positions ``[start, stop)`` of ``[lo, hi)``, in
    key order or (``reverse``) from the top; ``runs`` newest first, after ``pending``."""
    sources: list[list[_Piece]] = []
    if pending is not None:
        keys, i, j = pending.span(lo, hi)
        if j > i:
            entries = pending.entries
            chosen = keys[i:j]
            tags = bytes(entries[k][0] for k in chosen)
            values = [entries[k][1] for k in chosen]
            sources.append([_Piece.of_entries(b"", None, chosen, tags, values)])
    for ref in runs:
        inside = lo == b"" and hi is None
        sources.append([_Piece.of_node(ref.root, b"", None, ref.count, ref.dels, inside)])
    before = after = 0  # exact live counts of [lo, a) and [b, hi) no piece holds any more
    a, b = lo, hi
    while True:
        unread = [p.node for source in sources for p in source if p.node is not None]
        if not unread:
            break
        nodes = yield unread
        for n, source in enumerate(sources):
            deeper: list[_Piece] = []
            for piece in source:
                if piece.node is None:
                    deeper.append(piece)
                else:
                    deeper += _expand(nodes[piece.node], piece, lo, hi)
            sources[n], below, above = _settle(deeper, a, b)
            before += below
            after += above
        a, b = _narrow(sources, a, b, before, after, start, stop, reverse)
        for n, source in enumerate(sources):
            sources[n], below, above = _settle(source, a, b)
            before += below
            after += above
    return _cut(sources, a, b, before, after, start, stop, reverse)


def _settle(pieces: list[_Piece], a: bytes, b: bytes | None) -> tuple[list[_Piece], int, int]:
    """Keep the pieces that reach into ``[a, b)``; of those entirely below or above it
    (and exactly counted), return what they add before and after it."""
    kept: list[_Piece] = []
    before = after = 0
    for piece in pieces:
        if piece.hi is not None and piece.hi <= a and piece.exact:
            before += piece.net
        elif b is not None and piece.lo >= b and piece.exact:
            after += piece.net
        else:
            kept.append(piece)
    return kept, before, after


def _expand(node: Leaf | Inner, piece: _Piece, lo: bytes, hi: bytes | None) -> list[_Piece]:
    """The pieces a read node stands for, within the scanned range."""
    if not isinstance(node, Inner):  # node.is_leaf
        keys = node.keys
        i = bisect_left(keys, lo) if lo else 0
        j = len(keys) if hi is None else bisect_left(keys, hi, i)
        if i == j:
            return []
        tags = node.tags[i:j] if node.tags else b""
        return [_Piece.of_entries(piece.lo, piece.hi, keys[i:j], tags, node.values[i:j])]
    keys, children, counts = node.keys, node.children, node.counts
    dels = node.dels
    out = []
    last = len(children) - 1
    for i, child in enumerate(children):
        c_lo = keys[i] if i else piece.lo
        c_hi = keys[i + 1] if i < last else piece.hi
        if (c_hi is not None and c_hi <= lo) or (hi is not None and c_lo >= hi):
            continue
        inside = c_lo >= lo and (hi is None or (c_hi is not None and c_hi <= hi))
        out.append(_Piece.of_node(child, c_lo, c_hi, counts[i], dels[i] if dels else 0, inside))
    return out


def _narrow(
    sources: list[list[_Piece]],
    a: bytes,
    b: bytes | None,
    before: int,
    after: int,
    start: int,
    stop: int | None,
    reverse: bool,
) -> tuple[bytes, bytes | None]:
    """The narrowest candidate interval sure to hold the window."""
    candidates: set[bytes] = set()
    for source in sources:
        for piece in source:
            if piece.node is None:
                step = max(1, len(piece.keys) // _SAMPLES)
                candidates.update(piece.keys[::step])
            else:
                candidates.add(piece.lo)
                if piece.hi is not None:
                    candidates.add(piece.hi)
    inside = sorted(x for x in candidates if x > a and (b is None or x < b))
    if not inside:
        return a, b
    tables = [_Table(source) for source in sources]
    new_a, new_b = a, b
    for x in inside:
        least = most = 0
        for table in tables:
            low, high = table.at_or_above(x) if reverse else table.below(x)
            least += low
            most += high
        if reverse:
            # Live keys at or above x: at most `start` means the window starts below x.
            if after + most <= start and (new_b is None or x < new_b):
                new_b = x
            if stop is not None and after + least >= stop:
                new_a = x
        else:
            if before + most <= start:
                new_a = x
            if stop is not None and before + least >= stop and (new_b is None or x < new_b):
                new_b = x
    return new_a, new_b


class _Table:
    """One source's pieces with prefix sums of their bounds, for fast candidate tests."""

    __slots__ = ("highs", "los", "lows", "pieces")

    def __init__(self, pieces: list[_Piece]) -> None:
        self.pieces = pieces
        self.los = [p.lo for p in pieces]
        bounds = [p.bounds() for p in pieces]
        self.lows = [0, *accumulate(low for low, _ in bounds)]
        self.highs = [0, *accumulate(high for _, high in bounds)]

    def below(self, x: bytes) -> tuple[int, int]:
        j = bisect_left(self.los, x)  # pieces[:j] start below x
        if j == 0:
            return 0, 0
        low, high = self.pieces[j - 1].below(x)
        return self.lows[j - 1] + low, self.highs[j - 1] + high

    def at_or_above(self, x: bytes) -> tuple[int, int]:
        j = bisect_left(self.los, x)
        low = self.lows[-1] - self.lows[j]
        high = self.highs[-1] - self.highs[j]
        if j:
            part_low, part_high = self.pieces[j - 1].at_or_above(x)
            low += part_low
            high += part_high
        return low, high


def _cut(
    sources: list[list[_Piece]],
    a: bytes,
    b: bytes | None,
    before: int,
    after: int,
    start: int,
    stop: int | None,
    reverse: bool,
) -> list[tuple[bytes, bytes]]:
    """Merge the entries of ``[a, b)`` (newest source wins) and cut the window out."""
    merged: dict[bytes, tuple[int, bytes]] = {}
    for source in reversed(sources):  # oldest first: newer entries overwrite
        for piece in source:
            keys = piece.keys
            i = bisect_left(keys, a) if a else 0
            j = len(keys) if b is None else bisect_left(keys, b, i)
            before += piece.prefix[i]
            after += piece.net - piece.prefix[j]
            tags = piece.tags
            if tags:
                merged.update(zip(keys[i:j], zip(tags[i:j], piece.values[i:j])))
            else:
                merged.update(zip(keys[i:j], zip(bytes(j - i), piece.values[i:j])))
    live = [(k, merged[k][1]) for k in sorted(merged) if merged[k][0] != DELETE]
    if reverse:
        live.reverse()
        offset = after
    else:
        offset = before
    first = start - offset
    last = None if stop is None else stop - offset
    return live[first:last]
