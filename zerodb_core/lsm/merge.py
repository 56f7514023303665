"""Merging runs: which runs to fold together, and folding them.

Why tiered merges (Lucene's log merge policy, in bytes): a commit adds one small run per
tree it changed, so a commit costs what it changed. Runs must still be merged, or reads
would consult thousands of them. Folding each small run straight into one big run per
tree would rewrite that big run every time (today's cost again, only later); merging runs
of *similar size* instead, ``factor`` at a time, rewrites each entry once per level, and
there are ``log_factor(tree size / floor)`` levels: the bytes a merge writes per entry
stay small at any table size, and a tree has at most about ``factor - 1`` runs per level.

A merge reads its input runs whole (they are immutable, so it can be rebased on any newer
root that still holds them), combines the entries of each key newest-first, and builds
one run in their place. When the oldest run of the tree takes part, tombstones have
nothing left to delete and are dropped, and replacements become plain puts: the bottom
run of a tree holds only ``PUT`` entries.
"""

from __future__ import annotations

import math

from zerodb_core.btree import Reader, Run, RunRef, gather
from zerodb_core.btree.node import DELETE, PUT, REPLACE
from zerodb_core.exceptions import IntegrityError

# Runs merged at once, and the size ratio between levels.
MERGE_FACTOR = 4
# Runs below this many bytes all count as the lowest level (so single-record commits do
# not make a level per doubling of a few hundred bytes).
FLOOR_BYTES = 16 * 1024
# A level spans runs within this many levels (log base ``factor``) of its largest.
LEVEL_SPAN = 0.75


def merge_windows(
    runs: tuple[RunRef, ...], factor: int = MERGE_FACTOR, floor: int = FLOOR_BYTES
) -> list[tuple[int, int]]:
    """Return the ``(start, stop)`` slices of ``runs`` (newest first) to merge, each of
    ``factor`` neighbouring runs of one level, or ``[]``."""
    n = len(runs)
    if n < factor:
        return []
    # Lucene's LogMergePolicy, oldest first: a level is the runs from the oldest one left
    # up to the newest within LEVEL_SPAN of the largest left; smaller runs that ended up
    # between larger ones are swept into that level rather than stranded.
    scale = math.log(factor)
    levels = [math.log(max(run.bytes, floor) / floor) / scale for run in reversed(runs)]
    windows = []
    start = 0
    while start < n:
        top = max(levels[start:])
        bottom = top - LEVEL_SPAN if top > LEVEL_SPAN else -1.0
        upto = max(i for i in range(start, n) if levels[i] >= bottom)
        i = start
        while upto + 1 - i >= factor:
            windows.append((n - i - factor, n - i))
            i += factor
        start = upto + 1
    return sorted(windows)


def merge_reader(runs: tuple[RunRef, ...], bottom: bool) -> Reader:
    """Read ``runs`` (newest first, neighbours in their tree) whole and combine them.

    Returns ``(keys, values, tags, node ids)``: the merged entries in key order, and the
    ids of every node of the inputs (garbage once the merge commits). ``bottom``: the
    oldest of them is the oldest run of its tree.
    """
    parts = yield from gather(
        [Run(run).entries_reader() for run in runs] + [Run(run).node_ids_reader() for run in runs]
    )
    contents, ids = parts[: len(runs)], parts[len(runs) :]
    merged: dict[bytes, tuple[int, bytes]] = {}
    for keys, tags, values in reversed(contents):  # oldest first
        incoming = dict(zip(keys, zip(tags, values)))
        for key in merged.keys() & incoming.keys():
            combined = _combine(merged[key], incoming.pop(key))
            if combined is None:
                del merged[key]
            else:
                merged[key] = combined
        merged.update(incoming)
    keys = sorted(merged)
    if bottom:
        keys = [key for key in keys if merged[key][0] != DELETE]
        tags = b""
    else:
        tags = bytes(merged[key][0] for key in keys)
    values = [merged[key][1] for key in keys]
    return keys, values, tags, [node_id for part in ids for node_id in part]


def _combine(older: tuple[int, bytes], newer: tuple[int, bytes]) -> tuple[int, bytes] | None:
    """One key's entry after ``newer`` is applied over ``older`` (None: no entry)."""
    old, new = older[0], newer[0]
    if new == DELETE:
        if old == PUT:
            return None  # added and removed: as if never there
        if old == REPLACE:
            return newer
    elif old == DELETE:
        if new == PUT:
            return (REPLACE, newer[1])  # removed, then added again: a new value
    elif new == REPLACE:
        return (old, newer[1])  # a new value for an added or replaced key
    raise IntegrityError("runs of a tree disagree about whether a key exists")
