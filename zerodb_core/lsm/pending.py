"""What one transaction changed in its trees, before the commit turns it into runs.

Changes are kept *exact* relative to the snapshot the transaction reads: a key that was
absent is a ``PUT``, a present key given a new value a ``REPLACE``, a present key removed
a ``DELETE``. Writers know which (they read the old record before changing it), and the
rules below keep it so when one transaction touches a key several times: a ``PUT`` then a
``DELETE`` leave nothing, a ``DELETE`` then a ``PUT`` are a ``REPLACE``. Because every
entry changes the live count by exactly +1, 0 or -1, counts stay exact without reading
what lies below.

Savepoints are an undo log (:class:`Changes`): each change records what it overwrote
while a savepoint may need it, so taking a savepoint costs nothing and rolling back costs
what was done since.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import repeat
from typing import Any, Protocol

from zerodb_core.btree.node import DELETE, PUT, REPLACE
from zerodb_core.exceptions import QueryError

# An entry: (tag, value); the value is a record's bytes, or a posting of a full-text
# index as a tuple (term key, pk, document length, positions) until blocks are cut.
Entry = tuple[int, Any]
# New postings of one term: (pk keys, pks, document lengths, positions)
Segment = tuple[list[bytes], list[Any], list[int], list[list[int]]]


class _Restorer(Protocol):
    """An owner of undo-log items: it puts back what it logged under ``key``."""

    def restore(self, key: Any, prior: Any, /) -> None: ...


# The undo log of a savepoint: (owner, key, what the key had before), oldest first.
UndoLog = list[tuple[_Restorer, Any, Any]]


class Pending:
    """The exact changes of one transaction to one tree: ``key -> (tag, value)``.

    New postings of a full-text index may also wait as *segments* (per term, parallel
    lists of pk keys, pks, document lengths and positions, see :meth:`add_postings`): a
    bulk load then makes no entry per posting, and the commit cuts blocks from the lists.
    Anything else that looks at the changes turns segments into entries first.
    """

    __slots__ = ("_added", "_entries", "_segments", "_sorted", "undo")

    def __init__(self, undo: UndoLog | None) -> None:
        self._entries: dict[bytes, Entry] = {}
        self._segments: dict[bytes, list[Segment]] = {}
        # Sorted keys, kept lazily: a bulk load adds many keys between two reads.
        self._sorted: list[bytes] | None = []
        self._added: list[bytes] = []
        # The transaction's undo log while a savepoint may roll back (else None).
        self.undo = undo

    def __len__(self) -> int:
        waiting = sum(len(batch[0]) for batches in self._segments.values() for batch in batches)
        return len(self._entries) + waiting

    @property
    def entries(self) -> dict[bytes, tuple[int, Any]]:
        """Every change, ``key -> (tag, value)`` (waiting segments included)."""
        if self._segments:
            self._materialize()
        return self._entries

    def get(self, key: bytes) -> tuple[int, Any] | None:
        return self.entries.get(key)

    # -- writes ---------------------------------------------------------------------

    def put(self, key: bytes, value: bytes | tuple[Any, ...], live: bool) -> None:
        """Set ``key`` to ``value``; ``live``: whether the key is live in the snapshot
        (only asked when this transaction has not touched the key yet)."""
        prior = self.entries.get(key)
        if prior is not None:  # what the snapshot holds is known from the prior change
            live = prior[0] != PUT
        tag = REPLACE if live else PUT
        self._set(key, prior, (tag, value))

    def delete(self, key: bytes, tombstone: Any = b"") -> None:
        """Remove ``key``, which must be live (in the snapshot or through this
        transaction); ``tombstone`` is the value the removal keeps."""
        prior = self.entries.get(key)
        if prior is None:
            self._set(key, None, (DELETE, tombstone))
        elif prior[0] == PUT:
            self._set(key, prior, None)
        elif prior[0] == REPLACE:
            self._set(key, prior, (DELETE, tombstone))
        else:
            raise QueryError("a key was deleted twice in one transaction")

    def add_postings(
        self,
        term_key: bytes,
        pk_keys: list[bytes],
        pks: list[Any],
        dls: list[int],
        positions: list[list[int]],
    ) -> None:
        """Add new postings of one term (of documents new to the snapshot), as lists; with
        a savepoint to honour, as entries."""
        if self.undo is not None:
            self.put_new(
                [term_key + k for k in pk_keys],
                [(term_key, pk, dl, at) for pk, dl, at in zip(pks, dls, positions)],
            )
            return
        self._segments.setdefault(term_key, []).append((pk_keys, pks, dls, positions))

    def only_segments(self) -> dict[bytes, list[Segment]] | None:
        """The waiting segments, if they are all the changes (else None). The commit
        cuts them into blocks and leaves them be: a commit that failed may be tried
        again, and the transaction still reads them."""
        if self._entries or not self._segments:
            return None
        return self._segments

    def _materialize(self) -> None:
        """Turn waiting segments into entries."""
        segments, self._segments = self._segments, {}
        for term_key, batches in segments.items():
            for pk_keys, pks, dls, positions in batches:
                self.put_new(
                    [term_key + k for k in pk_keys],
                    [(term_key, pk, dl, at) for pk, dl, at in zip(pks, dls, positions)],
                )

    def put_new(self, keys: list[bytes], values: list[Any]) -> None:
        """Add keys absent from the snapshot (a bulk insert), sorted or not."""
        entries = self.entries
        if entries and not entries.keys().isdisjoint(keys):
            for key, value in zip(keys, values):
                self.put(key, value, False)
            return
        if self.undo is not None:
            self.undo.extend(zip(repeat(self), keys, repeat(None)))
        entries.update(zip(keys, zip(repeat(PUT), values)))
        if self._sorted is not None:
            self._added += keys

    def _set(self, key: bytes, prior: Entry | None, new: Entry | None) -> None:
        if self.undo is not None:
            self.undo.append((self, key, prior))
        self.restore(key, new)

    def restore(self, key: bytes, entry: Entry | None) -> None:
        """Set ``key``'s entry (None: no entry), keeping the sorted view right."""
        entries = self.entries
        if entry is None:
            if entries.pop(key, None) is not None:
                self._sorted = None
            return
        if key not in entries and self._sorted is not None:
            self._added.append(key)
        entries[key] = entry

    # -- reads ----------------------------------------------------------------------

    def sorted_keys(self) -> list[bytes]:
        """Every key with an entry, in order."""
        if self._segments:
            self._materialize()
        if self._sorted is None:
            self._sorted = sorted(self.entries)
            self._added = []
        elif self._added:
            added = self._added
            self._added = []
            if len(added) < 16:
                for key in added:
                    keys = self._sorted
                    keys.insert(bisect_left(keys, key), key)
            else:
                self._sorted += sorted(added)
                self._sorted.sort()  # two sorted runs: one merge in C
        return self._sorted

    def span(self, lo: bytes, hi: bytes | None) -> tuple[list[bytes], int, int]:
        """The sorted keys and the index range of those in ``[lo, hi)``."""
        keys = self.sorted_keys()
        a = bisect_left(keys, lo) if lo else 0
        b = len(keys) if hi is None else bisect_left(keys, hi, a)
        return keys, a, b

    def touches(self, lo: bytes, hi: bytes | None) -> bool:
        """Whether any change falls in ``[lo, hi)``."""
        _, a, b = self.span(lo, hi)
        return b > a

    def net(self, lo: bytes = b"", hi: bytes | None = None) -> int:
        """The change in live keys within ``[lo, hi)``."""
        keys, a, b = self.span(lo, hi)
        entries = self.entries
        if a == 0 and b == len(keys):
            tags = [tag for tag, _ in entries.values()]
        else:
            tags = [entries[key][0] for key in keys[a:b]]
        return tags.count(PUT) - tags.count(DELETE)


class Changes:
    """A transaction's pending changes, by tree, and the undo log of its savepoints."""

    __slots__ = ("trees", "undo")

    def __init__(self) -> None:
        self.trees: dict[str, Pending] = {}
        self.undo: UndoLog | None = None

    def get(self, name: str) -> Pending | None:
        return self.trees.get(name)

    def writable(self, name: str) -> Pending:
        pending = self.trees.get(name)
        if pending is None:
            pending = self.trees[name] = Pending(self.undo)
            if self.undo is not None:
                self.undo.append((self, name, None))
        return pending

    def drop(self, name: str) -> None:
        """Forget the changes of a tree that is dropped as a whole."""
        pending = self.trees.pop(name, None)
        if pending is not None and self.undo is not None:
            self.undo.append((self, name, pending))

    def restore(self, name: str, pending: Pending | None) -> None:
        if pending is None:
            self.trees.pop(name, None)
        else:
            self.trees[name] = pending

    # -- savepoints -----------------------------------------------------------------

    def mark(self) -> int:
        """Start logging what changes overwrite; return a marker for ``rollback_to``."""
        if self.undo is None:
            self.undo = []
            for pending in self.trees.values():
                pending.entries  # noqa: B018 - segments become entries before logging starts
                pending.undo = self.undo
        return len(self.undo)

    def rollback_to(self, marker: int) -> None:
        """Undo every change made since ``marker``, newest first."""
        undo = self.undo
        assert undo is not None
        while len(undo) > marker:
            owner, key, prior = undo.pop()
            owner.restore(key, prior)
