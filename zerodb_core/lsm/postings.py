"""Full-text indexes as log-structured trees of posting blocks.

A full-text index is a stack of runs like any tree (:mod:`zerodb_core.lsm.tree`), but its
entries are blocks of postings (:mod:`zerodb_core.btree.blocks`), and what is exact per
key elsewhere is exact per posting here: a posting is added (``PUT``), given new
positions (``REPLACE``) or removed (``DELETE``), and the blocks of several runs are
combined posting by posting, newest first. Run counts are sums of postings, so the
document frequency of a term is one counted range per run, read from inner nodes.

A transaction's pending postings are kept under ``term key + primary key`` (values
``(term key, pk, document length, positions)``), and become blocks when it commits.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from itertools import chain, islice
from operator import lt
from typing import Any

from zerodb_core.btree import DELETE, PUT, REPLACE, Reader, Run, RunRef, gather
from zerodb_core.btree.blocks import (
    BLOCK_POSTINGS,
    CHANGES,
    COUNT,
    LAST,
    MAX_TF,
    MIN_DL,
    NET,
    TERM_LEN,
    Block,
    block_offsets,
    block_pks,
    block_postings,
    make_block,
)
from zerodb_core.encoding import encode_key, key_after
from zerodb_core.exceptions import IntegrityError
from zerodb_core.lsm.pending import Segment
from zerodb_core.lsm.topk import DescendingKey, Weight
from zerodb_core.lsm.tree import TreeView

# Blocks of fewer postings than this are joined with small neighbours when runs merge.
SMALL_BLOCK = BLOCK_POSTINGS // 4

# A posting as the engine hands it out: document length and positions (tf = their number).
Posting = tuple[int, list[int]]


# A block with the age of its run (0: the newest) and its key.
AgedBlock = tuple[int, bytes, Block]


class TextTree(TreeView):
    """One full-text index as a snapshot or transaction sees it."""

    __slots__ = ()

    # -- writes (exact changes, keys ``term key + pk key``) ----------------------------

    def put(self, key: bytes, value: tuple[Any, ...], live: bool) -> None:
        self.view.changes.writable(self.name).put(key, value, live)

    def put_new(self, keys: list[bytes], values: list[tuple[Any, ...]]) -> None:
        if keys:
            self.view.changes.writable(self.name).put_new(keys, values)

    def add_postings(
        self,
        term_key: bytes,
        pk_keys: list[bytes],
        pks: list[Any],
        dls: list[int],
        positions: list[list[int]],
    ) -> None:
        """Add the postings of one term in documents new to the snapshot (a load), as
        parallel lists: no entry per posting is made before the commit cuts blocks."""
        self.view.changes.writable(self.name).add_postings(term_key, pk_keys, pks, dls, positions)

    def delete(self, key: bytes, value: tuple[Any, ...]) -> None:
        """Remove a posting; ``value`` is the posting, which the tombstone keeps (its
        term and primary key) with no positions."""
        term_key, pk = value[0], value[1]
        self.view.changes.writable(self.name).delete(key, (term_key, pk, 0, []))

    # -- reads ------------------------------------------------------------------------

    def blocks_reader(self, term_keys: list[bytes]) -> Reader:
        """Return, per term, its blocks in every run: ``[[(age, key, block)], ...]``
        (age 0 the newest run)."""
        readers, owners = [], []
        for n, term_key in enumerate(term_keys):
            hi = key_after(term_key)
            self.note_range(term_key, hi)
            for age, run in enumerate(self.runs):
                if run.overlaps(term_key, hi):
                    readers.append(Run(run).entries_reader(term_key, hi))
                    owners.append((n, age))
        parts = yield from gather(readers)
        out: list[list[AgedBlock]] = [[] for _ in term_keys]
        for (n, age), (keys, _, blocks) in zip(owners, parts):
            out[n].extend((age, key, block) for key, block in zip(keys, blocks))
        return out

    def postings_reader(self, term_keys: list[bytes]) -> Reader:
        """Return, per term, its live postings ``{pk: (document length, positions)}``."""
        per_term = yield from self.blocks_reader(term_keys)
        pending = self.pending
        out = []
        for term_key, blocks in zip(term_keys, per_term):
            live = combine_postings(blocks)
            if pending is not None:
                keys, a, b = pending.span(term_key, key_after(term_key))
                entries = pending.entries
                for key in keys[a:b]:
                    tag, (_, pk, dl, positions) = entries[key]
                    if tag == DELETE:
                        live.pop(pk, None)
                    else:
                        live[pk] = (dl, positions)
            out.append(live)
        return out

    def scan_reader(self) -> Reader:
        """Return every live posting, ``[(term key + pk key, (term key, pk, document
        length, positions))]`` in key order (for checks and rebuilds, not queries)."""
        self.note_range(b"", None)
        parts = yield from gather([Run(run).entries_reader() for run in self.runs])
        by_term: dict[bytes, list[AgedBlock]] = {}
        for age, (keys, _, blocks) in enumerate(parts):
            for key, block in zip(keys, blocks):
                by_term.setdefault(key[: block[TERM_LEN]], []).append((age, key, block))
        pending = self.pending
        if pending is not None:
            for value in {value[0]: value for _, value in pending.entries.values()}.values():
                by_term.setdefault(value[0], [])
        found = yield from self.postings_reader(sorted(by_term))
        out: list[tuple[bytes, tuple[bytes, Any, int, list[int]]]] = []
        for term_key, live in zip(sorted(by_term), found):
            out.extend(
                (term_key + encode_key(pk), (term_key, pk, dl, at)) for pk, (dl, at) in live.items()
            )
        out.sort()
        return out

    def terms_reader(self, term_keys: list[bytes]) -> Reader:
        """Return a :class:`TermPostings` per term: its postings, decoded only as a
        search narrows its documents down."""
        per_term = yield from self.blocks_reader(term_keys)
        pending = self.pending
        out = []
        for term_key, blocks in zip(term_keys, per_term):
            touched = pending is not None and pending.touches(term_key, key_after(term_key))
            simple = not touched and not any(block[CHANGES] for _, _, block in blocks)
            if simple and len({age for age, _, _ in blocks}) > 1:
                simple = not _overlap(blocks)
            if simple:
                out.append(TermPostings([block for _, _, block in blocks], None))
            else:
                (live,) = yield from self.postings_reader([term_key])
                out.append(TermPostings([], live))
        return out

    def top_reader(self, term_key: bytes, k: int, weight_for: Callable[[int], Weight]) -> Reader:
        """Return the ``k`` best ``(score, pk)`` of one term, best first (ties by pk),
        with ``weight_for(document frequency)(tf, dl)`` its score: blocks are read in the
        order of their bound (the weight of their largest tf at their smallest length)
        until no block left can beat the k-th score, so a common term costs a few blocks,
        not its postings. The document frequency is the sum of the blocks' net counts
        (their heads, read anyway).

        Falls back to scoring every posting when pending changes touch the term.
        """
        pending = self.pending
        if pending is not None and pending.touches(term_key, key_after(term_key)):
            (live,) = yield from self.postings_reader([term_key])
            weight = weight_for(len(live))
            return _best(((weight(len(p), dl), pk) for pk, (dl, p) in live.items()), k)
        (blocks,) = yield from self.blocks_reader([term_key])
        weight = weight_for(sum(block[NET] for _, _, block in blocks))
        newer: _NewerRuns | None = None  # made when a block of an older run comes up
        # Best bound first; among equal bounds, smaller keys first (ties rank by pk).
        # Blocks share few (largest tf, smallest length) pairs: each bound is worked out once.
        bounds: dict[tuple[int, int], float] = {}
        order = []
        for n, (_, key, block) in enumerate(blocks):
            shape = (block[MAX_TF], block[MIN_DL])
            bound = bounds.get(shape)
            if bound is None:
                bound = bounds[shape] = -weight(*shape)
            order.append((bound, key[block[TERM_LEN] :], n))
        order.sort()
        best: list[tuple[float, Any]] = []  # a heap of the k best, worst first
        for neg_bound, first, n in order:
            if len(best) == k:
                worst_score, worst_pk = best[0]
                if -neg_bound < worst_score or (-neg_bound == worst_score and first > worst_pk.key):
                    break  # nothing left can enter the top (not even on a tie)
            age, _, block = blocks[n]
            pks, tags, dls, positions = block_postings(block)
            need = _least_tf(weight, block, best[0][0] if len(best) == k else None)
            if age and newer is None:
                newer = _NewerRuns(blocks)
            # the newer runs, when they may hold postings of this block
            covering = (
                newer
                if age and newer is not None and newer.overlaps(first, block[LAST], age)
                else None
            )
            for i, where in enumerate(positions):
                if len(where) < need or tags[i] == DELETE:
                    continue
                pk = pks[i]
                if covering is not None and covering.supersede(pk, age):
                    continue
                entry = (weight(len(where), dls[i]), DescendingKey(pk))
                if len(best) < k:
                    heapq.heappush(best, entry)
                elif entry > best[0]:
                    heapq.heapreplace(best, entry)
        return [(score, pk.value) for score, pk in sorted(best, reverse=True)]

    # -- commit -------------------------------------------------------------------------

    def pending_blocks(self) -> tuple[list[bytes], list[Block]]:
        """The keys and blocks of this transaction's pending postings."""
        pending = self.view.changes.get(self.name)
        assert pending is not None
        segments = pending.only_segments()
        if segments is not None:
            return _segment_blocks(segments)
        keys = pending.sorted_keys()
        entries = pending.entries
        out_keys: list[bytes] = []
        blocks: list[Block] = []
        i, n = 0, len(keys)
        while i < n:
            term_key = entries[keys[i]][1][0]
            end = bisect_left(keys, key_after(term_key), i)
            for start in range(i, end, BLOCK_POSTINGS):
                chunk = [entries[key] for key in keys[start : min(start + BLOCK_POSTINGS, end)]]
                out_keys.append(keys[start])
                blocks.append(
                    make_block(
                        len(term_key),
                        [value[1] for _, value in chunk],
                        bytes(tag for tag, _ in chunk),
                        [value[2] for _, value in chunk],
                        [value[3] for _, value in chunk],
                    )
                )
            i = end
        return out_keys, blocks


def _segment_blocks(segments: dict[bytes, list[Segment]]) -> tuple[list[bytes], list[Block]]:
    """Blocks cut from the postings of new documents, term by term (sorted by pk key
    only when they did not come in that order)."""
    out_keys: list[bytes] = []
    blocks: list[Block] = []
    for term_key in sorted(segments):
        batches = segments[term_key]
        if len(batches) == 1:
            pk_keys, pks, dls, positions = batches[0]
        else:
            pk_keys, pks, dls, positions = (
                list(chain.from_iterable(b[i] for b in batches)) for i in range(4)
            )
        if not all(map(lt, pk_keys, islice(pk_keys, 1, None))):
            order = sorted(range(len(pk_keys)), key=pk_keys.__getitem__)
            pk_keys = [pk_keys[i] for i in order]
            pks = [pks[i] for i in order]
            dls = [dls[i] for i in order]
            positions = [positions[i] for i in order]
        term_len = len(term_key)
        for start in range(0, len(pk_keys), BLOCK_POSTINGS):
            end = start + BLOCK_POSTINGS
            out_keys.append(term_key + pk_keys[start])
            blocks.append(
                make_block(term_len, pks[start:end], b"", dls[start:end], positions[start:end])
            )
    return out_keys, blocks


class TermPostings:
    """The live postings of one term for a search: its blocks, when they alone say what
    is live (no tombstones, no replacements, runs of disjoint documents: then nothing is
    decoded until the search asks for documents), or else a dict of them."""

    __slots__ = ("blocks", "live")

    def __init__(self, blocks: list[Block], live: dict[Any, Posting] | None) -> None:
        self.blocks = blocks
        self.live = live

    @property
    def df(self) -> int:
        """Documents holding the term."""
        if self.live is not None:
            return len(self.live)
        return sum(block[COUNT] for block in self.blocks)

    def documents(self) -> set[Any]:
        """Every document holding the term."""
        if self.live is not None:
            return set(self.live)
        return set(chain.from_iterable(map(block_pks, self.blocks)))

    def match(self, candidates: set[Any]) -> dict[Any, Posting]:
        """``{pk: (document length, positions)}`` of the ``candidates`` holding the term
        (block by block: which candidates a block holds is a set intersection, in C)."""
        if self.live is not None:
            live = self.live
            return {pk: live[pk] for pk in candidates.intersection(live)}
        out: dict[Any, Posting] = {}
        for block in self.blocks:
            hits = candidates.intersection(block_pks(block))
            if hits:
                offsets = block_offsets(block)
                _, _, dls, positions = block_postings(block)
                for pk in hits:
                    i = offsets[pk]
                    out[pk] = (dls[i], positions[i])
        return out


def combine_postings(blocks: Iterable[AgedBlock]) -> dict[Any, Posting]:
    """The live postings of one term's blocks from several runs (newest run first)."""
    blocks = sorted(blocks, key=lambda item: -item[0])  # oldest run first
    live: dict[Any, Posting] = {}
    for _, _, block in blocks:
        pks, tags, dls, positions = block_postings(block)
        if not block[CHANGES]:
            live.update(zip(pks, zip(dls, positions)))
            continue
        for pk, tag, dl, where in zip(pks, tags, dls, positions):
            if tag == DELETE:
                live.pop(pk, None)
            else:
                live[pk] = (dl, where)
    return live


def merge_postings_reader(runs: tuple[RunRef, ...], bottom: bool) -> Reader:
    """Read the runs of a full-text index (newest first, neighbours) whole and combine
    them: ``(segments, node ids)`` as :func:`zerodb_core.lsm.merge.merge_reader` answers
    (one segment of blocks, with no tags at the level of blocks).

    A term whose blocks from different runs cover disjoint ranges of primary keys (bulk
    loads: each run holds newer documents) keeps its blocks as they are, only small
    neighbours joined; postings are decoded and combined only where runs overlap.
    """
    parts = yield from gather(
        [Run(run).entries_reader() for run in runs] + [Run(run).node_ids_reader() for run in runs]
    )
    contents, ids = parts[: len(runs)], parts[len(runs) :]
    by_term: dict[bytes, list[AgedBlock]] = {}
    for age, (keys, _, blocks) in enumerate(contents):
        for key, block in zip(keys, blocks):
            by_term.setdefault(key[: block[TERM_LEN]], []).append((age, key, block))
    out_keys: list[bytes] = []
    out_blocks: list[Block] = []
    for term_key in sorted(by_term):
        for key, block in _merge_term(term_key, by_term[term_key], bottom):
            out_keys.append(key)
            out_blocks.append(block)
    segments = [(out_keys, out_blocks, b"")] if out_keys else []
    return segments, [node_id for part in ids for node_id in part]


def _merge_term(
    term_key: bytes, blocks: list[AgedBlock], bottom: bool
) -> list[tuple[bytes, Block]]:
    """One term's blocks after a merge, in key order."""
    ages = {age for age, _, _ in blocks}
    if len(ages) > 1 and _overlap(blocks):
        postings = _combine_exact(blocks)
        keyed = sorted((encode_key(pk), pk, entry) for pk, entry in postings.items())
        merged = []
        for start in range(0, len(keyed), BLOCK_POSTINGS):
            chunk = keyed[start : start + BLOCK_POSTINGS]
            block = make_block(
                len(term_key),
                [pk for _, pk, _ in chunk],
                bytes(tag for _, _, (tag, _, _) in chunk),
                [dl for _, _, (_, dl, _) in chunk],
                [where for _, _, (_, _, where) in chunk],
            )
            merged.append((term_key + chunk[0][0], block))
    else:
        merged = sorted((key, block) for _, key, block in blocks)
    if bottom:
        merged = [item for item in map(_as_bottom, merged) if item is not None]
    return _join_small(term_key, merged)


def _overlap(blocks: list[AgedBlock]) -> bool:
    """Whether the runs' ranges of primary keys for the term overlap (from the blocks'
    keys and heads: nothing is decoded)."""
    term_len = blocks[0][2][TERM_LEN]
    spans: dict[int, list[bytes]] = {}
    for age, key, block in blocks:
        span = spans.get(age)
        if span is None:
            spans[age] = [key[term_len:], block[LAST]]
        else:
            span[0] = min(span[0], key[term_len:])
            span[1] = max(span[1], block[LAST])
    ordered = sorted(spans.values())
    return any(ordered[i][1] >= ordered[i + 1][0] for i in range(len(ordered) - 1))


def _least_tf(weight: Weight, block: Block, threshold: float | None) -> int:
    """The smallest term frequency a posting of ``block`` needs to reach ``threshold``
    (its weight is at most ``weight(tf, smallest length of the block)``), so postings
    below it are skipped unscored."""
    if threshold is None:
        return 0
    tf = 1
    while tf < block[MAX_TF] and weight(tf, block[MIN_DL]) < threshold:
        tf += 1
    return tf


def _combine_exact(blocks: list[AgedBlock]) -> dict[Any, tuple[int, int, list[int]]]:
    """Postings of several runs combined by the exact rules: ``{pk: (tag, dl, positions)}``."""
    out: dict[Any, tuple[int, int, list[int]]] = {}
    for _, _, block in sorted(blocks, key=lambda item: -item[0]):  # oldest first
        pks, tags, dls, positions = block_postings(block)
        for pk, tag, dl, where in zip(pks, tags, dls, positions):
            older = out.get(pk)
            if older is None:
                out[pk] = (tag, dl, where)
                continue
            old = older[0]
            if tag == DELETE and old == PUT:
                del out[pk]
            elif tag == DELETE and old == REPLACE:
                out[pk] = (DELETE, 0, [])
            elif tag == PUT and old == DELETE:
                out[pk] = (REPLACE, dl, where)
            elif tag == REPLACE and old != DELETE:
                out[pk] = (old, dl, where)
            else:
                raise IntegrityError("runs of a full-text index disagree about a posting")
    return out


def _as_bottom(item: tuple[bytes, Block]) -> tuple[bytes, Block] | None:
    """A block of the oldest run: removed postings dropped, replacements made puts."""
    key, block = item
    if not block[CHANGES]:
        return item
    pks, tags, dls, positions = block_postings(block)
    keep = [i for i, tag in enumerate(tags) if tag != DELETE]
    if not keep:
        return None
    term_len = block[TERM_LEN]
    return key[:term_len] + encode_key(pks[keep[0]]), make_block(
        term_len,
        [pks[i] for i in keep],
        b"",
        [dls[i] for i in keep],
        [positions[i] for i in keep],
    )


def _join_small(term_key: bytes, merged: list[tuple[bytes, Block]]) -> list[tuple[bytes, Block]]:
    """Join runs of neighbouring small blocks into full ones (single-record commits leave
    blocks of a posting or two; merged runs should not keep them so). Blocks of a quarter
    full or more stay as they are: a load's blocks are moved, not decoded."""
    out: list[tuple[bytes, Block]] = []
    pending: list[tuple[bytes, Block]] = []  # neighbouring small blocks, to join
    size = 0
    last: list[tuple[bytes, Block | None]] = [(b"", None)]  # flushes what is pending
    for key, block in [*merged, *last]:
        small = block is not None and not block[CHANGES] and block[COUNT] < SMALL_BLOCK
        if small and block is not None and size + block[COUNT] <= BLOCK_POSTINGS:
            pending.append((key, block))
            size += block[COUNT]
            continue
        if len(pending) == 1:
            out.append(pending[0])
        elif pending:
            parts = [block_postings(b) for _, b in pending]
            out.append(
                (
                    pending[0][0],
                    make_block(
                        len(term_key),
                        [pk for part in parts for pk in part[0]],
                        b"",
                        [dl for part in parts for dl in part[2]],
                        [at for part in parts for at in part[3]],
                    ),
                )
            )
        pending, size = ([(key, block)], block[COUNT]) if small and block is not None else ([], 0)
        if block is not None and not small:
            out.append((key, block))
    return out


class _NewerRuns:
    """Which postings of older runs newer runs hold too (so only the newest counts)."""

    def __init__(self, blocks: list[AgedBlock]) -> None:
        self.by_age: dict[int, tuple[list[bytes], list[Block]]] = {}
        # Blocks come run by run, each run's in key order (as blocks_reader reads them):
        # sorted only if they do not.
        if any(a > b for a, b in zip(blocks, islice(blocks, 1, None)) if a[0] == b[0]):
            blocks = sorted(blocks, key=lambda item: (item[0], item[1]))
        for age, key, block in blocks:
            keys, items = self.by_age.setdefault(age, ([], []))
            keys.append(key[block[TERM_LEN] :])
            items.append(block)
        self.cache: dict[int, set[Any]] = {}

    def overlaps(self, first: bytes, last: bytes, age: int) -> bool:
        """Whether a run newer than ``age`` has a block of the term whose keys may fall
        in ``[first, last]`` (then postings of that range are checked one by one)."""
        for newer in range(age):
            found = self.by_age.get(newer)
            if found is None:
                continue
            keys, blocks = found
            i = bisect_right(keys, last) - 1  # the last block starting at or before last
            if i >= 0 and blocks[i][LAST] >= first:
                return True
        return False

    def supersede(self, pk: Any, age: int) -> bool:
        """Whether a run newer than ``age`` holds a posting of ``pk``."""
        pk_key = encode_key(pk)
        for newer in range(age):
            found = self.by_age.get(newer)
            if found is None:
                continue
            keys, blocks = found
            i = bisect_right(keys, pk_key) - 1  # the block that would hold it
            if i < 0:
                continue
            block = blocks[i]
            pks = self.cache.get(id(block))
            if pks is None:
                pks = self.cache[id(block)] = set(block_pks(block))
            if pk in pks:
                return True
        return False


def _best(scored: Iterable[tuple[float, Any]], k: int) -> list[tuple[float, Any]]:
    """The ``k`` best ``(score, pk)``, best first, ties by ascending pk."""
    return heapq.nsmallest(k, scored, key=lambda item: (-item[0], encode_key(item[1])))
