"""Copy-on-write counted B+tree over byte keys.

Writes copy every node they change up to the root (or change it in place when the
transaction already owns it: see :class:`~zerodb_core.btree.workspace.Workspace`), so an
old root keeps describing an old, consistent tree: snapshots and savepoints cost nothing.

Reads are generators (``*_reader`` methods) run by ``Workspace.run``, which batches the
nodes they need level by level. Ranges are half open, ``[lo, hi)`` on encoded keys, with
``lo=b""`` for "from the start" and ``hi=None`` for "to the end".
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from zerodb_core.btree.node import CHILD_OVERHEAD, ENTRY_OVERHEAD, NODE_OVERHEAD, Inner, Leaf, Node
from zerodb_core.btree.workspace import Reader, Workspace, new_id
from zerodb_core.exceptions import IntegrityError

# Nodes are sized by bytes: split above this, so that a full node still pads into the
# 16 KiB size class of the blob format.
NODE_MAX_BYTES = 15 * 1024
# Merge a node with a sibling when it shrinks below this (and the two fit in one).
NODE_MIN_BYTES = NODE_MAX_BYTES // 4


@dataclass(frozen=True, slots=True)
class TreeRef:
    """What the root record keeps of a tree: its root node id, height and entry count."""

    root: bytes | None = None
    height: int = 0
    count: int = 0

    def to_payload(self) -> list:
        return [self.root, self.height, self.count]

    @classmethod
    def from_payload(cls, payload: Any) -> TreeRef:
        try:
            root, height, count = payload
        except (TypeError, ValueError):
            raise IntegrityError("malformed tree reference in root record") from None
        if (
            not (
                (root is None and height == 0 and count == 0)
                or (type(root) is bytes and len(root) == 16 and type(height) is int and height > 0)
            )
            or type(count) is not int
        ):
            raise IntegrityError("malformed tree reference in root record")
        return cls(root, height, count)


EMPTY_TREE = TreeRef()


class BTree:
    """One tree of a transaction: its reference lives in ``refs[name]`` (savepoints copy
    that dict), its nodes in the transaction's workspace."""

    def __init__(
        self,
        workspace: Workspace,
        refs: dict[str, TreeRef],
        name: str,
        *,
        max_bytes: int = NODE_MAX_BYTES,
    ) -> None:
        self.ws = workspace
        self.refs = refs
        self.name = name
        self.max_bytes = max_bytes
        self.min_bytes = max_bytes // 4

    @property
    def ref(self) -> TreeRef:
        return self.refs.get(self.name, EMPTY_TREE)

    def __len__(self) -> int:
        return self.ref.count

    # -- writes ------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes) -> bytes | None:
        """Insert or replace; return the value replaced, if any."""
        ref = self.ref
        ws = self.ws
        if ref.root is None:
            leaf = Leaf(new_id(), [key], [value], ws.gen)
            ws.add(leaf)
            self.refs[self.name] = TreeRef(leaf.id, 1, 1)
            return None
        path, leaf = self._path(key)
        leaf = ws.writable(leaf)
        keys = leaf.keys
        i = bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            old = leaf.values[i]
            leaf.values[i] = value
            leaf.size += len(value) - len(old)
            delta = 0
        else:
            old = None
            keys.insert(i, key)
            leaf.values.insert(i, value)
            leaf.size += len(key) + len(value) + ENTRY_OVERHEAD
            delta = 1
        rightmost = i == len(keys) - 1 and all(j == len(p.children) - 1 for p, j in path)
        self._grow(path, leaf, delta, rightmost)
        return old

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        """Insert or replace many entries, sorted by key (no key twice).

        One descent per leaf touched instead of one per key, and within a leaf each run
        of new keys that falls between two neighbouring keys (or after the last one) goes
        in as one slice: bulk loads, whose keys arrive in order at the end of a leaf or
        of a key prefix, cost a few C-level list operations per leaf rather than a
        ``list.insert`` per key. Leaves split exactly where inserting the entries one by
        one would split them (right after the entry that overflows).
        """
        self.put_sorted(list(map(itemgetter(0), items)), list(map(itemgetter(1), items)))

    def put_sorted(self, new_keys: list[bytes], new_values: list[bytes]) -> None:
        """:meth:`put_many` of parallel lists of keys (sorted, distinct) and values."""
        ws = self.ws
        n = len(new_keys)
        i = 0
        while i < n and self.ref.root is None:
            self.put(new_keys[i], new_values[i])
            i += 1
        max_bytes = self.max_bytes
        while i < n:
            path, leaf = self._path(new_keys[i])
            stop = n  # keys from here on belong to a leaf further right
            edge = True  # no leaf further right
            for parent, j in reversed(path):
                if j + 1 < len(parent.keys):
                    stop = bisect_left(new_keys, parent.keys[j + 1], i, n)
                    edge = False
                    break
            leaf = ws.writable(leaf)
            keys, values = leaf.keys, leaf.values
            count = initial = len(keys)
            size = leaf.size
            pos = last = 0
            while i < stop:
                key = new_keys[i]
                pos = bisect_left(keys, key, pos, count)
                if pos < count:
                    following = keys[pos]
                    if following == key:
                        value = new_values[i]
                        size += len(value) - len(values[pos])
                        values[pos] = value
                        last = pos
                        i += 1
                        if size > max_bytes:
                            break
                        continue
                    run_end = bisect_left(new_keys, following, i + 1, stop)
                else:
                    run_end = stop
                # new_keys[i:run_end] all go in before keys[pos]: as many as fit, up to
                # and including the one that overflows the leaf.
                end, added = _fit(new_keys, new_values, i, run_end, max_bytes - size)
                if end == i + 1:
                    keys.insert(pos, key)
                    values.insert(pos, new_values[i])
                else:
                    keys[pos:pos] = new_keys[i:end]
                    values[pos:pos] = new_values[i:end]
                size += added
                count += end - i
                pos += end - i
                last = pos - 1
                i = end
                if size > max_bytes:
                    break  # split now; the rest goes in by a new descent
            leaf.size = size
            self._grow(path, leaf, count - initial, edge and last == count - 1)

    def delete(self, key: bytes) -> bytes | None:
        """Remove ``key``; return its value, or None if it was absent."""
        if self.ref.root is None:
            return None
        path, leaf = self._path(key)
        i = bisect_left(leaf.keys, key)
        if i == len(leaf.keys) or leaf.keys[i] != key:
            return None
        leaf = self.ws.writable(leaf)
        del leaf.keys[i]
        old = leaf.values.pop(i)
        leaf.size -= len(key) + len(old) + ENTRY_OVERHEAD
        self._shrink(path, leaf)
        return old

    def _path(self, key: bytes) -> tuple[list[tuple[Inner, int]], Leaf]:
        node = self.ws.load(self.ref.root)
        path = []
        while not node.is_leaf:
            i = bisect_right(node.keys, key) - 1
            if i < 0:
                i = 0
            path.append((node, i))
            node = self.ws.load(node.children[i])
        return path, node

    def _grow(self, path, child: Node, delta: int, rightmost: bool) -> None:
        """Propagate an insert or replace from ``child`` up to the root, splitting."""
        ws = self.ws
        pieces = self._split(child, rightmost)
        for parent, i in reversed(path):
            if pieces is None and delta == 0 and parent.children[i] == child.id:
                return  # changed in place: nothing above needs to know
            parent = ws.writable(parent)
            if pieces is None:
                parent.children[i] = child.id
                parent.counts[i] += delta
            else:
                left, right = pieces
                parent.children[i] = left.id
                parent.counts[i] = left.count
                sep = right.keys[0]
                parent.keys.insert(i + 1, sep)
                parent.children.insert(i + 1, right.id)
                parent.counts.insert(i + 1, right.count)
                parent.size += len(sep) + CHILD_OVERHEAD
            child = parent
            pieces = self._split(child, rightmost) if pieces is not None else None
        ref = self.ref
        if pieces is not None:
            left, right = pieces
            root = Inner(
                new_id(),
                [left.keys[0], right.keys[0]],
                [left.id, right.id],
                [left.count, right.count],
                ws.gen,
            )
            ws.add(root)
            self.refs[self.name] = TreeRef(root.id, ref.height + 1, ref.count + delta)
        else:
            self.refs[self.name] = TreeRef(child.id, ref.height, ref.count + delta)

    def _split(self, node: Node, rightmost: bool) -> tuple[Node, Node] | None:
        """Split a writable node in two by bytes if it is too big; at the right edge of the
        tree keep the left one full (sequential loads, such as auto-increment keys, then
        fill nodes completely instead of leaving them half empty)."""
        n = len(node.keys)
        if node.size <= self.max_bytes or n < 2:
            return None
        if rightmost:
            cut = n - 1
        else:
            half = node.size // 2
            acc = 0
            cut = 1
            if node.is_leaf:
                # The first cut whose left part holds at least half the bytes.
                cut = _fit(node.keys, node.values, 0, n, half - 1)[0]
            else:
                for cut, k in enumerate(node.keys, 1):  # noqa: B007
                    acc += len(k) + CHILD_OVERHEAD
                    if acc >= half:
                        break
            cut = min(max(cut, 1), n - 1)
        gen = self.ws.gen
        if node.is_leaf:
            keys, values = node.keys, node.values
            right = Leaf(new_id(), keys[cut:], values[cut:], gen)
            left = Leaf(
                node.id, keys[:cut], values[:cut], gen, node.size - right.size + NODE_OVERHEAD
            )
        else:
            right = Inner(new_id(), node.keys[cut:], node.children[cut:], node.counts[cut:], gen)
            left = Inner(node.id, node.keys[:cut], node.children[:cut], node.counts[:cut], gen)
        self.ws.add(left)
        self.ws.add(right)
        return left, right

    def _shrink(self, path, child: Node) -> None:
        """Propagate a delete from ``child`` up to the root, merging small nodes."""
        ws = self.ws
        for parent, i in reversed(path):
            parent = ws.writable(parent)
            if not child.keys:  # an empty node leaves its parent
                ws.retire(child)
                parent.size -= len(parent.keys[i]) + CHILD_OVERHEAD
                del parent.keys[i], parent.children[i], parent.counts[i]
            else:
                parent.children[i] = child.id
                parent.counts[i] -= 1
                if child.size < self.min_bytes and len(parent.children) > 1:
                    self._merge_with_sibling(parent, i, child)
            child = parent
        ref = self.ref
        root = child
        height = ref.height
        while not root.is_leaf and len(root.children) == 1:
            ws.retire(root)
            root = ws.load(root.children[0])
            height -= 1
        if not root.keys:
            ws.retire(root)
            self.refs[self.name] = TreeRef()
        else:
            self.refs[self.name] = TreeRef(root.id, height, ref.count - 1)

    def _merge_with_sibling(self, parent: Inner, i: int, child: Node) -> None:
        j = i + 1 if i + 1 < len(parent.children) else i - 1
        sibling = self.ws.load(parent.children[j])
        if child.size + sibling.size > self.max_bytes:
            return
        li, ri = min(i, j), max(i, j)
        left = self.ws.writable(child if li == i else sibling)
        right = sibling if li == i else child
        if left.is_leaf:
            left.keys.extend(right.keys)
            left.values.extend(right.values)
        else:
            # right.keys[0] may be stale; the parent's separator is right's true bound.
            left.keys.append(parent.keys[ri])
            left.keys.extend(right.keys[1:])
            left.children.extend(right.children)
            left.counts.extend(right.counts)
        left.size += right.size
        self.ws.retire(right)
        parent.children[li] = left.id
        parent.counts[li] += parent.counts[ri]
        parent.size -= len(parent.keys[ri]) + CHILD_OVERHEAD
        del parent.keys[ri], parent.children[ri], parent.counts[ri]

    # -- reads (generators for Workspace.run) ---------------------------------------------

    def get_many_reader(self, keys: list[bytes]) -> Reader:
        """Return ``{key: value}`` for the keys present; one fetch per level for all keys."""
        root = self.ref.root
        found: dict[bytes, bytes] = {}
        if root is None or not keys:
            return found
        # Sorted, each key once (sorting keys that come in order costs one pass).
        frontier = [(root, list(dict.fromkeys(sorted(keys))))]
        while frontier:
            nodes = yield [node_id for node_id, _ in frontier]
            deeper = []
            for node_id, wanted in frontier:
                node = nodes[node_id]
                seps = node.keys
                if node.is_leaf:
                    if seps:  # only the wanted keys within the leaf's first and last key
                        lo = bisect_left(wanted, seps[0])
                        for key in wanted[lo : bisect_right(wanted, seps[-1], lo)]:
                            i = bisect_left(seps, key)
                            if seps[i] == key:
                                found[key] = node.values[i]
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

    def paths_reader(self, keys: list[bytes]) -> Reader:
        """Load every node on the paths to ``keys`` (sorted), level by level, and return
        nothing: writes then walk those paths without a round trip per node.

        Keys are split among children by bisecting the key list at each separator, so the
        cost is per node visited, not per key: a batch of 100,000 keys is cheap.
        """
        root = self.ref.root
        if root is None or not keys:
            return None
        frontier = [(root, 0, len(keys))]
        for _ in range(self.ref.height - 1):
            nodes = yield [node_id for node_id, _, _ in frontier]
            deeper = []
            for node_id, start, stop in frontier:
                node = nodes[node_id]
                seps = node.keys
                for i in range(len(node.children)):
                    end = (
                        stop if i + 1 == len(seps) else bisect_left(keys, seps[i + 1], start, stop)
                    )
                    if end > start:
                        deeper.append((node.children[i], start, end))
                        start = end
                    if start >= stop:
                        break
            frontier = deeper
        yield [node_id for node_id, _, _ in frontier]
        return None

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
        skipping ``skip`` entries and taking at most ``limit``.

        Subtrees entirely inside the range and entirely outside the wanted window are
        never fetched: their counts stand in for them, so a deep offset costs one path.
        """
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

    def count_reader(self, lo: bytes = b"", hi: bytes | None = None, *, exact: bool = True):
        """Return the number of keys in ``[lo, hi)``.

        Exact: the two edge paths only. Not exact (an estimate for the planner): stops above
        the leaves and counts half of each edge leaf, so a warm cache answers with no I/O.
        """
        items = yield from self._descend(lo, hi, 0, None, False, exact=exact, count_only=True)
        if items is None:
            return 0
        total = 0
        for item in items:
            if item[0] == "gap":
                total += item[1]
            else:
                a, b = _leaf_span(item[1], lo, hi)
                total += b - a
        return total

    def _descend(self, lo, hi, skip, end, reverse, *, exact, count_only=False):
        """Walk down level by level, keeping only the nodes the window may need.

        Yields lists of node ids; returns the leaf level as items ``("leaf", node)`` and
        ``("gap", count)`` in scan order, or None for an empty tree.
        """
        ref = self.ref
        if ref.root is None or (hi is not None and hi <= lo):
            return None
        # ("node", id, lower bound, upper bound) | ("gap", exact count)
        items: list[tuple] = [("node", ref.root, b"", None)]
        depth = 0
        while True:
            ids = [item[1] for item in items if item[0] == "node"]
            nodes = yield ids
            if depth == ref.height - 1:
                return [(item[0], nodes[item[1]]) if item[0] == "node" else item for item in items]
            last_inner = depth == ref.height - 2
            depth += 1
            new: list[tuple] = []
            before_min = before_max = 0
            for item in items:
                if item[0] == "gap":
                    new.append(item)
                    before_min += item[1]
                    before_max += item[1]
                    continue
                node = nodes[item[1]]
                for c_lo, c_hi, child, count in _children(node, item[2], item[3], reverse):
                    if (c_hi is not None and c_hi <= lo) or (hi is not None and c_lo >= hi):
                        continue
                    full = c_lo >= lo and (hi is None or (c_hi is not None and c_hi <= hi))
                    if full:
                        wanted = (
                            not count_only
                            and before_max + count > skip
                            and (end is None or before_min < end)
                        )
                        new.append(("node", child, c_lo, c_hi) if wanted else ("gap", count))
                        before_min += count
                    elif not exact and last_inner:
                        new.append(("gap", count // 2))
                    elif count_only or end is None or before_min < end:
                        new.append(("node", child, c_lo, c_hi))
                    before_max += count
            items = new
            if not exact and last_inner:
                return items


# Entries whose sizes _fit sums at once.
_FIT_BLOCK = 32


def _fit(keys: list[bytes], values: list[bytes], start: int, stop: int, room: int):
    """Return ``(end, size)``: entries ``start..end-1`` are those that go into a leaf with
    ``room`` bytes left, one by one, up to and including the first that overflows it (if
    any, ``size > room``), and ``size`` is what they add to the leaf.

    Sizes are summed 32 entries at a time (``b"".join`` is the cheapest length of many
    bytes), one by one only inside the block that overflows.
    """
    size = 0
    i = start
    while i < stop:
        j = stop if stop - i <= _FIT_BLOCK else i + _FIT_BLOCK
        block = (
            len(b"".join(keys[i:j])) + len(b"".join(values[i:j])) + ENTRY_OVERHEAD * (j - i)
            if j - i > 1
            else len(keys[i]) + len(values[i]) + ENTRY_OVERHEAD
        )
        if size + block <= room:
            size += block
            i = j
            continue
        while True:
            size += len(keys[i]) + len(values[i]) + ENTRY_OVERHEAD
            i += 1
            if size > room:
                return i, size
    return i, size


def _children(node: Inner, lo: bytes, hi: bytes | None, reverse: bool):
    """Yield ``(lower, upper, child id, count)`` of each child, in scan order."""
    keys, children, counts = node.keys, node.children, node.counts
    n = len(children)
    order = range(n - 1, -1, -1) if reverse else range(n)
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
