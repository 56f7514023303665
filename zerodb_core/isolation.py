"""Isolation levels: what a transaction checks when its commit meets a concurrent one.

A commit swaps the root only if nobody committed since the transaction's snapshot. When
somebody did, the transaction's writes (logical operations) are replayed on the newer
root (``Transaction.rebase``). Whether that replay is allowed is the isolation level,
named as Django's PostgreSQL backend names them:

* ``"read committed"``: always replayed (PostgreSQL's default behaviour): each write
  applies to the newest data, so a read-modify-write may lose a concurrent update.
* ``"repeatable read"``: snapshot isolation, first committer wins. The replay is refused
  (:class:`~zerodb_core.exceptions.SerializationError`) if a record this transaction
  wrote or deleted has another value in the newer root than in its snapshot. No lost
  updates; write skew (two transactions each read what the other writes) is possible.
* ``"serializable"``: also refused if anything it *read* changed: records and index
  entries read by key, and every range it read (scans, counts, ``exists()``, full-text
  terms), as FoundationDB checks read-conflict ranges. No write skew, no phantoms.

How a change is found (only when a commit met another, never on the fast path):

* keys read or written: their values in the snapshot and in the newer root, compared
  (exact: the same value written back is no change);
* ranges: the runs of the newer root that hold entries committed after the snapshot
  (``RunRef.newest``; a run of the snapshot, or a merge of its runs only, holds none).
  A small such run (a commit's) is read in the range, and any entry there is a change;
  a large one (a merge that took in a newer commit) overlapping the range counts as a
  change without reading it. Both err on the side of refusing: a refusal costs a retry,
  a missed change a wrong answer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from zerodb_core.btree import Reader, Run, RunRef, gather
from zerodb_core.exceptions import QueryError

if TYPE_CHECKING:
    from zerodb_core.rootstate import RootState

READ_COMMITTED = "read committed"
REPEATABLE_READ = "repeatable read"
SERIALIZABLE = "serializable"
LEVELS = (READ_COMMITTED, REPEATABLE_READ, SERIALIZABLE)

# Runs of at most this many entries that hold newer commits are read in a range to see
# whether they change it (a commit's run); larger ones count as a change if they overlap.
READ_RUNS_UP_TO = 4096


def check_level(level: str) -> str:
    """Return ``level`` if it names an isolation level, else raise ``QueryError``."""
    if level not in LEVELS:
        raise QueryError(
            f"unknown isolation level {level!r}: use one of {', '.join(map(repr, LEVELS))}"
        )
    return level


class ReadSet:
    """What a serializable transaction read, per tree: keys, and ranges ``[lo, hi)``.

    Reads are kept through savepoints and rollbacks (a read undone by a rollback still
    informed what the transaction did next)."""

    __slots__ = ("keys", "ranges")

    def __init__(self) -> None:
        self.keys: dict[str, set[bytes]] = defaultdict(set)
        self.ranges: dict[str, list[tuple[bytes, bytes | None]]] = defaultdict(list)

    def note_keys(self, tree: str, keys: Iterable[bytes]) -> None:
        self.keys[tree].update(keys)

    def note_range(self, tree: str, lo: bytes, hi: bytes | None) -> None:
        self.ranges[tree].append((lo, hi))


def newer_runs(snapshot: RootState, current: RootState, tree: str) -> list[RunRef]:
    """The runs of ``tree`` in ``current`` that may hold entries committed after
    ``snapshot``: those not in the snapshot whose newest commit is later (or unknown)."""
    before = {run.root for run in snapshot.trees.get(tree, ())}
    return [
        run
        for run in current.trees.get(tree, ())
        if run.root not in before and (run.newest is None or run.newest > snapshot.seq)
    ]


def changed_range_reader(
    snapshot: RootState, current: RootState, tree: str, ranges: list[tuple[bytes, bytes | None]]
) -> Reader:
    """Return a range of ``ranges`` that commits after ``snapshot`` may have changed in
    ``current`` (None: none did)."""
    if tree in snapshot.trees and tree not in current.trees:
        return ranges[0] if ranges else None  # the tree was dropped or emptied
    runs = newer_runs(snapshot, current, tree)
    reads: list[tuple[tuple[bytes, bytes | None], Reader]] = []
    for lo, hi in ranges:
        for run in runs:
            if not run.overlaps(lo, hi):
                continue
            if run.count + 2 * run.dels > READ_RUNS_UP_TO:
                return (lo, hi)
            reads.append(((lo, hi), Run(run).entries_reader(lo, hi)))
    found = yield from gather([reader for _, reader in reads])
    for (span, _), (keys, _, _) in zip(reads, found):
        if keys:
            return span
    return None
