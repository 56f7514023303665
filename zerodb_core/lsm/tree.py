"""A log-structured tree: a stack of immutable runs plus a transaction's pending changes.

Every record tree and index is one of these. The root record lists each tree's runs,
newest first; a commit turns the transaction's pending changes of a tree into one new
run on top (a few small blobs, whatever the size of the tree), and merges
(:mod:`zerodb_core.lsm.merge`) fold runs of similar size together.

Reads see the newest entry of every key: the pending change if there is one, else the
newest run that holds the key. Counts are sums of the runs' net counts (entries record
exact changes), so ``len()`` and counted ranges need no merge at all, and windows of
positions are found by :mod:`zerodb_core.lsm.window` in one round trip per level.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from zerodb_core.btree import Reader, Run, RunRef, gather
from zerodb_core.btree.filters import BloomFilter
from zerodb_core.btree.node import DELETE
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import QueryError
from zerodb_core.lsm.pending import Pending
from zerodb_core.lsm.window import window_reader
from zerodb_core.schema import UNIQUE

if TYPE_CHECKING:
    from zerodb_core.schema import IndexSpec
    from zerodb_core.transaction import View

_NONE_KEY = encode_key(None)


class TreeView:
    """What a snapshot or transaction holds of one tree: its runs and pending changes."""

    __slots__ = ("leaf_bytes", "name", "view")

    def __init__(self, view: View, name: str, leaf_bytes: int) -> None:
        self.view = view
        self.name = name
        self.leaf_bytes = leaf_bytes

    @property
    def runs(self) -> tuple[RunRef, ...]:
        return self.view.runs.get(self.name, ())

    @property
    def pending(self) -> Pending | None:
        pending = self.view.changes.get(self.name)
        return pending if pending else None

    def note_range(self, lo: bytes, hi: bytes | None) -> None:
        """Record a read of ``[lo, hi)`` (a serializable transaction checks its reads)."""
        reads = self.view.reads
        if reads is not None:
            reads.note_range(self.name, lo, hi)

    def _filtered_runs(self, runs: list[RunRef], value: bytes) -> Reader:
        """The runs that may hold entries of the whole value ``value``: only an ordered
        index's runs have filters of values (:class:`LogTree` overrides this)."""
        raise QueryError("only an ordered index counts the entries of one value")

    def count_reader(
        self,
        lo: bytes = b"",
        hi: bytes | None = None,
        *,
        exact: bool = True,
        read_under: int = 0,
        value: bool = False,
    ) -> Reader:
        """Return the number of live keys in ``[lo, hi)`` (an estimate with no leaf read
        when not ``exact``; ``read_under``: see ``Run.count_reader``); of a posting
        index, its postings. ``value``: the range holds the entries of one whole value
        ``lo`` (an equality; ordered indexes only, whose runs may have filters)."""
        self.note_range(lo, hi)
        runs = [run for run in self.runs if run.overlaps(lo, hi)]
        if value:
            runs = yield from self._filtered_runs(runs, lo)
        counts = yield from gather(
            [Run(run).count_reader(lo, hi, exact=exact, read_under=read_under) for run in runs]
        )
        pending = self.pending
        return sum(counts) + (pending.net(lo, hi) if pending is not None else 0)


class LogTree(TreeView):
    """One tree of keys and values as a snapshot or transaction sees it."""

    __slots__ = ("index",)

    def __init__(
        self, view: View, name: str, leaf_bytes: int, index: IndexSpec | None = None
    ) -> None:
        super().__init__(view, name, leaf_bytes)
        # The index whose runs keep filters of values (None: no filters to consult).
        self.index = index

    def __len__(self) -> int:
        self.note_range(b"", None)
        pending = self.pending
        return sum(run.count for run in self.runs) + (pending.net() if pending else 0)

    # -- writes (exact changes: the caller knows what is live) -----------------------

    def put(self, key: bytes, value: bytes, live: bool) -> None:
        """Set ``key``; ``live``: whether the key is live now (before this put)."""
        self.view.changes.writable(self.name).put(key, value, live)

    def put_new(self, keys: list[bytes], values: list[bytes]) -> None:
        """Add keys that are not live (sorted keys load fastest)."""
        if keys:
            self.view.changes.writable(self.name).put_new(keys, values)

    def delete(self, key: bytes, tombstone: bytes = b"") -> None:
        """Remove ``key``, which must be live; an index's tombstone keeps the entry's
        value (its packed pk: a run's filter is made from its entries' values)."""
        self.view.changes.writable(self.name).delete(key, tombstone)

    # -- reads (generators for Workspace.run) ---------------------------------------

    def get_many_reader(self, keys: list[bytes]) -> Reader:
        """Return ``{key: value}`` of the live keys among ``keys``; one fetch per level
        for every run at once."""
        wanted = sorted(set(keys))
        reads = self.view.reads
        if reads is not None:
            reads.note_keys(self.name, wanted)
        found: dict[bytes, bytes] = {}
        pending = self.pending
        if pending is not None:
            rest = []
            entries = pending.entries
            for key in wanted:
                entry = entries.get(key)
                if entry is None:
                    rest.append(key)
                elif entry[0] != DELETE:
                    found[key] = entry[1]
            wanted = rest
        runs = [(run, _fenced(wanted, run)) for run in self.runs]
        runs = [(run, keys) for run, keys in runs if keys]
        if self.index is not None and self.index.kind == UNIQUE and len(runs) > 1:
            filters = yield from _filters_reader([run for run, _ in runs])
            runs = [
                (run, [k for k in keys if _passes(filters, run, _value_of_unique(k))])
                for run, keys in runs
            ]
            runs = [(run, keys) for run, keys in runs if keys]
        if not runs:
            return found
        answers = yield from gather([Run(run).get_many_reader(keys) for run, keys in runs])
        if len(answers) == 1:
            found.update((k, v) for k, (tag, v) in answers[0].items() if tag != DELETE)
            return found
        decided: set[bytes] = set()
        for answer in answers:  # newest first: the first run holding a key decides
            for key, (tag, value) in answer.items():
                if key in decided:
                    continue
                decided.add(key)
                if tag != DELETE:
                    found[key] = value
        return found

    def scan_reader(
        self,
        lo: bytes = b"",
        hi: bytes | None = None,
        *,
        skip: int = 0,
        limit: int | None = None,
        reverse: bool = False,
        value: bool = False,
    ) -> Reader:
        """Return the live ``[(key, value)]`` of ``[lo, hi)`` in key order (or reversed),
        after skipping ``skip`` and taking at most ``limit``. ``value``: the range holds
        the entries of one whole value ``lo`` (an equality: runs whose filter rules it out
        are not read)."""
        if hi is not None and hi <= lo:
            return []
        self.note_range(lo, hi)
        runs = [run for run in self.runs if run.overlaps(lo, hi)]
        if value:
            runs = yield from self._filtered_runs(runs, lo)
        pending = self.pending
        if pending is not None and not pending.touches(lo, hi):
            pending = None
        if pending is None and len(runs) == 1 and runs[0].plain:
            return (
                yield from Run(runs[0]).scan_reader(lo, hi, skip=skip, limit=limit, reverse=reverse)
            )
        if pending is None and not runs:
            return []
        if skip == 0 and limit is None:
            items = yield from self._merged_reader(runs, pending, lo, hi)
            if reverse:
                items.reverse()
            return items
        stop = None if limit is None else skip + limit
        return (yield from window_reader(runs, pending, lo, hi, skip, stop, reverse))

    def _filtered_runs(self, runs: list[RunRef], value: bytes) -> Reader:
        """The runs that may hold entries of the whole value ``value`` (the key part
        before the pk): those whose filter rules it out are left out."""
        if self.index is None or len(runs) < 2:
            return runs
        filters = yield from _filters_reader(runs)
        return [run for run in runs if _passes(filters, run, value)]

    def _merged_reader(
        self, runs: list[RunRef], pending: Pending | None, lo: bytes, hi: bytes | None
    ) -> Reader:
        """Every live entry of ``[lo, hi)``, newest entry of each key winning."""
        parts = yield from gather([Run(run).entries_reader(lo, hi) for run in runs])
        if pending is None and len(parts) == 1:
            keys, tags, values = parts[0]
            if not tags.strip(b"\x00"):
                return list(zip(keys, values))
        merged: dict[bytes, tuple[int, bytes]] = {}
        for keys, tags, values in reversed(parts):  # oldest first: newer ones overwrite
            merged.update(zip(keys, zip(tags, values)))
        if pending is not None:
            keys, a, b = pending.span(lo, hi)
            entries = pending.entries
            merged.update((key, entries[key]) for key in keys[a:b])
        return [(key, merged[key][1]) for key in sorted(merged) if merged[key][0] != DELETE]

    def prefetch(self) -> None:
        """Have the root node of every run fetched with the next fetch of this view (a
        query that will read this tree after another one)."""
        self.view.ws.prefetch([run.root for run in self.runs])


def _filters_reader(runs: list[RunRef]) -> Reader:
    """Read the filters of ``runs`` (their roots too, which the reads after need)."""
    ids = [run.filter for run in runs if run.filter is not None]
    if not ids:
        return {}
    found = yield ids + [run.root for run in runs]
    return {blob_id: found[blob_id] for blob_id in ids}


def _passes(filters: dict[bytes, BloomFilter], run: RunRef, value: bytes) -> bool:
    return run.filter is None or filters[run.filter].may_hold(value)


def _value_of_unique(key: bytes) -> bytes:
    """The value part of a unique index's key (None keys end with a pk)."""
    return _NONE_KEY if key.startswith(_NONE_KEY) else key


def _fenced(keys: list[bytes], run: RunRef) -> list[bytes]:
    """The sorted ``keys`` that ``run`` may hold, by its fence keys."""
    a = bisect_left(keys, run.first) if run.first else 0
    b = len(keys) if run.last is None else bisect_right(keys, run.last, a)
    return keys[a:b]
