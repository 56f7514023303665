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

from zerodb_core.btree import Leaf, Reader, Run, RunRef, gather
from zerodb_core.btree.node import DELETE, PUT, REPLACE
from zerodb_core.btree.run import Segment
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


def small_runs(runs: tuple[RunRef, ...], floor: int = FLOOR_BYTES) -> tuple[int, int] | None:
    """The newest runs of a tree that are all below ``floor`` bytes, when there are two
    or more: ``(0, stop)``, else None.

    A commit touches several trees, and each gets a small run; merged only when each tree
    reaches ``factor`` of them, trees whose runs grow at different rates fall out of step,
    and nearly every commit then sets off a merge in one of them (a round trip more for
    most single-record commits). So when one tree merges, every tree's small runs merge
    in the same commit: cheap (they are small), and the trees stay in step.
    """
    stop = 0
    while stop < len(runs) and runs[stop].bytes < floor:
        stop += 1
    return (0, stop) if stop >= 2 else None


def merge_reader(runs: tuple[RunRef, ...], bottom: bool) -> Reader:
    """Read ``runs`` (newest first, neighbours in their tree) whole and combine them.

    Returns ``(segments, node ids)``: the merged run's contents in key order for
    :func:`~zerodb_core.btree.run.build_run_of` (a leaf whose keys no other input's leaf
    overlaps is kept as it is; entries of overlapping leaves are combined), and the ids
    of the inputs' nodes that become garbage. ``bottom``: the oldest of them is the
    oldest run of its tree. Runs of new records under growing keys (a load, auto-
    incremented keys) overlap nowhere, so merging them writes only new inner nodes.
    """
    if _apart(runs) and (not bottom or all(run.plain for run in runs)):
        return (yield from _concatenate_reader(runs))
    return (yield from _combine_reader(runs, bottom))


def _combine_reader(runs: tuple[RunRef, ...], bottom: bool) -> Reader:
    """Merge runs by reading every leaf (see :func:`merge_reader`)."""
    parts = yield from gather(
        [Run(run).leaves_reader() for run in runs] + [Run(run).node_ids_reader() for run in runs]
    )
    leaves, ids = parts[: len(runs)], parts[len(runs) :]
    spans = sorted(
        (
            (leaf.keys[0], -age, leaf)
            for age, run_leaves in enumerate(leaves)
            for leaf in run_leaves
        ),
        key=lambda span: (span[0], span[1]),
    )
    segments: list[Segment] = []
    combined: list[tuple[int, Leaf]] = []  # overlapping leaves waiting to be combined
    kept: set[bytes] = set()
    group: list[tuple[int, Leaf]] = []
    group_last = b""
    for first, neg_age, leaf in spans:
        if group and first > group_last:
            _close(group, bottom, segments, combined, kept)
            group = []
        group.append((-neg_age, leaf))
        group_last = max(group_last, leaf.keys[-1]) if len(group) > 1 else leaf.keys[-1]
    if group:
        _close(group, bottom, segments, combined, kept)
    _flush(combined, bottom, segments)
    garbage = [node_id for part in ids for node_id in part if node_id not in kept]
    return segments, garbage


def _apart(runs: tuple[RunRef, ...]) -> bool:
    """Whether the runs' keys cannot overlap, by their fence keys (bounds of their first
    and last keys); runs with a filter of values are not taken apart from their
    entries (the merged run's filter needs them)."""
    spans: list[tuple[bytes, bytes]] = []
    for run in runs:
        if run.first is None or run.last is None or run.filter is not None:
            return False
        spans.append((run.first, run.last))
    spans.sort()
    return all(spans[i][1] < spans[i + 1][0] for i in range(len(spans) - 1))


def _concatenate_reader(runs: tuple[RunRef, ...]) -> Reader:
    """Merge runs whose keys do not overlap, reading only their inner nodes: every leaf
    is kept (nothing to combine; with no tombstone or replacement among them, nothing to
    drop at the bottom either), and only the inner nodes become garbage."""
    ordered = sorted(runs, key=lambda run: run.first or b"")  # apart: none is None
    parts = yield from gather(
        [Run(run).kept_leaves_reader() for run in ordered]
        + [Run(run).node_ids_reader() for run in ordered]
    )
    segments = [leaf for part in parts[: len(runs)] for leaf in part]
    kept = {leaf.id for leaf in segments}
    garbage = [node_id for part in parts[len(runs) :] for node_id in part if node_id not in kept]
    return segments, garbage


def _close(
    group: list[tuple[int, Leaf]],
    bottom: bool,
    segments: list[Segment],
    combined: list[tuple[int, Leaf]],
    kept: set[bytes],
) -> None:
    """End a group of leaves whose key ranges chain together: a lone leaf is kept as it
    is (unless tombstones must go, at the bottom); several are combined."""
    if len(group) == 1 and not (bottom and group[0][1].tags):
        _flush(combined, bottom, segments)
        leaf = group[0][1]
        segments.append(leaf)
        kept.add(leaf.id)
    else:
        combined.extend(group)


def _flush(combined: list[tuple[int, Leaf]], bottom: bool, segments: list[Segment]) -> None:
    """Combine waiting leaves (newest entry of each key wins, by the exact rules) into one
    segment of entries."""
    if not combined:
        return
    merged: dict[bytes, tuple[int, bytes]] = {}
    for _, leaf in sorted(combined, key=lambda item: -item[0]):  # oldest first
        incoming = dict(zip(leaf.keys, zip(leaf.tags or bytes(len(leaf.keys)), leaf.values)))
        for key in merged.keys() & incoming.keys():
            entry = _combine(merged[key], incoming.pop(key))
            if entry is None:
                del merged[key]
            else:
                merged[key] = entry
        merged.update(incoming)
    combined.clear()
    keys = sorted(merged)
    if bottom:
        keys = [key for key in keys if merged[key][0] != DELETE]
        tags = b""
    else:
        tags = bytes(merged[key][0] for key in keys)
    if keys:
        segments.append((keys, [merged[key][1] for key in keys], tags))


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
