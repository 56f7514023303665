"""Running plans on a snapshot: batched index scans, set algebra, residual checks,
ordering and paging, with round trips kept to one per tree level.

Every index scan a plan needs is started at once and driven in lockstep by
``Workspace.run``, so an ``And`` of three indexed conditions costs as many round trips as
the deepest of the three trees, not the sum.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from operator import neg
from typing import Any

from zerodb_core.btree import Reader, gather
from zerodb_core.encoding import encode_key, key_after
from zerodb_core.exceptions import QueryError
from zerodb_core.lsm.postings import Posting, TermPostings
from zerodb_core.lsm.topk import Weight, top_of_all
from zerodb_core.query.operators import And, Expr, KeyRange
from zerodb_core.query.planner import (
    Complement,
    IndexScan,
    Intersect,
    Plan,
    Source,
    TextScan,
    TrigramScan,
    Union,
)
from zerodb_core.records import Table
from zerodb_core.schema import POSTINGS
from zerodb_core.serialization import unpack
from zerodb_core.text import bm25_idf, bm25_weight

# An And keeps reading an index only if it promises at most this many times the entries of
# the most selective one (plus a floor); the others are checked on the records instead.
INTERSECT_RATIO = 8
INTERSECT_FLOOR = 256

# A count about to be followed by a read of its range reads the range's leaves with it
# when they hold at most this many entries (a page of results).
READ_WITH_COUNT = 512

_NONE_KEY = encode_key(None)
# Stands for "every primary key" among the scans a plan needs (complements read it).
ALL_KEYS = None


def sort_key(value: Any) -> bytes:
    """Order values as an ordered index would (None first; unorderable values last)."""
    if value is None:
        return _NONE_KEY
    try:
        return encode_key(value)
    except QueryError:
        return b"\xff\xff"


# A scan a plan's source is made of, read by one reader.
_Leaf = IndexScan | TextScan | TrigramScan
# Primary keys in source order, and BM25 scores when a text scan takes part.
_Found = tuple[list[Any], dict[Any, float] | None]


class Executor:
    """Evaluate plans of one model on one snapshot."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.view = table.view
        self.spec = table.spec

    # -- choosing ------------------------------------------------------------------------

    def refine(self, plan: Plan) -> Plan:
        """Drop index and trigram scans of an ``And`` that would read far more entries
        than the most selective one; their conditions move to the residual check."""
        source = plan.source
        if not isinstance(source, Intersect):
            return plan
        scans = [p for p in source.parts if isinstance(p, IndexScan | TrigramScan)]
        if len(scans) < 2:
            return plan
        estimates = dict(zip(map(id, scans), self.estimate_many(scans)))
        smallest = min(estimates.values())
        limit = smallest * INTERSECT_RATIO + INTERSECT_FLOOR
        kept = [p for p in source.parts if estimates.get(id(p), 0) <= limit]
        moved = [  # (a scan of the whole index has no condition to move)
            p.predicate for p in scans if estimates[id(p)] > limit and p.predicate is not None
        ]
        if not moved:
            return plan
        residuals = moved + ([plan.residual] if plan.residual is not None else [])
        residual = residuals[0] if len(residuals) == 1 else And(*residuals)
        return Plan(kept[0] if len(kept) == 1 else Intersect(kept), residual)

    def estimate_many(self, scans: list[IndexScan | TrigramScan]) -> list[int]:
        """Estimated entries of each scan: an index scan's from inner nodes only (no leaf
        is read); a trigram scan's is the exact posting count of its rarest trigram,
        whose edge leaves hold the postings the scan reads next (small terms share a
        leaf with many others, so half a leaf would be no estimate at all)."""
        readers, owners = [], []
        for n, scan in enumerate(scans):
            tree = self.view.tree(scan.tree)
            trigrams = isinstance(scan, TrigramScan)
            ranges: list[KeyRange]
            if isinstance(scan, TrigramScan):
                ranges = [(k, key_after(k)) for k in map(encode_key, scan.predicate.terms)]
            else:
                ranges = scan.ranges
            for lo, hi in ranges:
                readers.append(tree.count_reader(lo, hi, exact=trigrams))
                owners.append(n)
        totals: list[int | None] = [None] * len(scans)
        for n, count in zip(owners, self.view.run(readers)):
            if isinstance(scans[n], TrigramScan):
                totals[n] = count if totals[n] is None else min(totals[n], count)
            else:
                totals[n] = (totals[n] or 0) + count
        return [total or 0 for total in totals]

    # -- counting ------------------------------------------------------------------------

    def count(self, plan: Plan, *, then_read: bool = False) -> int | None:
        """Exact count without reading records, or None if records must be checked.

        ``then_read``: the result will probably be read next (``list(result)`` counts
        first): a small range's leaves and the record tree's top are read in the count's
        round trips, so the read that follows needs none for them.
        """
        if plan.residual is not None:
            return None
        if plan.source is None:
            return len(self.table.records)
        if isinstance(plan.source, IndexScan):
            tree = self.view.tree(plan.source.tree)
            under = READ_WITH_COUNT if then_read else 0
            value = plan.source.whole_values
            readers = [
                tree.count_reader(lo, hi, read_under=under, value=value)
                for lo, hi in plan.source.ranges
            ]
            if then_read:
                self.table.records.prefetch()
            counts: list[int] = self.view.run(readers)
            return sum(counts)
        return len(self.primary_keys(plan.source, records=then_read)[0])

    # -- candidates ----------------------------------------------------------------------

    def primary_keys(
        self, source: Source, *, records: bool = True
    ) -> tuple[list[Any], dict[Any, float] | None]:
        """Materialise a source: its primary keys in source order, and BM25 scores if a
        text scan takes part. ``records``: the records will be read next."""
        leaves: list[_Leaf | None] = []
        _collect(source, leaves)
        if _needs_all(source):
            leaves.append(ALL_KEYS)  # every primary key, for complements
        readers = [self._scan_reader(leaf) for leaf in leaves]
        if records:
            self.table.records.prefetch()
        results = dict(zip(map(id, leaves), self.view.run(readers)))
        return self._combine(source, results)

    def _scan_reader(self, leaf: _Leaf | None) -> Reader:
        if leaf is ALL_KEYS:
            return self._all_pks_reader()
        if isinstance(leaf, TextScan):
            return self._text_reader(leaf)
        if isinstance(leaf, TrigramScan):
            return self._trigram_reader(leaf)
        return self._index_reader(leaf)

    def _index_reader(
        self, scan: IndexScan, skip: int = 0, limit: int | None = None, reverse: bool = False
    ) -> Reader:
        tree = self.view.tree(scan.tree)
        ranges = reversed(scan.ranges) if reverse else scan.ranges
        value = scan.whole_values
        scans = yield from gather(
            [tree.scan_reader(lo, hi, reverse=reverse, value=value) for lo, hi in ranges]
        )
        pks = [unpack(v) for entries in scans for _, v in entries]
        return pks[skip:] if limit is None else pks[skip : skip + limit]

    def _all_pks_reader(self) -> Reader:
        """Every primary key, from the smallest ordered index (every record has an entry
        in each, None included) or else from the records themselves."""
        ordered = [
            i for i in self.spec.indexes.values() if i.kind not in POSTINGS and len(i.fields) == 1
        ]
        if ordered:
            tree = self.view.tree(self.spec.index_tree(ordered[0]))
            entries = yield from tree.scan_reader()
            return [unpack(v) for _, v in entries]
        rows = yield from self.table.scan_reader()
        return [pk for pk, _ in rows]

    def _text_reader(self, scan: TextScan, top: int | None = None) -> Reader:
        """Documents holding every group of the search, ranked by BM25 (ties by pk), and
        their scores; with ``top``, only the ``top`` best.

        A search of one word with ``top`` reads blocks of postings in the order of their
        bounds and stops when none left can enter the top (``TextTree.top_reader``); of
        several words (no phrase), candidates of the rarest are weighed against the
        others' block bounds (MaxScore, :mod:`zerodb_core.lsm.topk`). Otherwise the
        postings of every word are read, the groups intersected (sets, in C) and only
        the documents left are scored.
        """
        terms = sorted({t for group in scan.predicate.groups for t in group})
        if not terms:
            return ([], {})
        tree = self.view.tree(scan.tree)
        n_docs, total_len = self.view.text_stats.get(scan.tree, (0, 0))
        avg_len = total_len / n_docs if n_docs else 0.0
        term_keys = [encode_key(term) for term in terms]
        if top is not None and len(terms) == 1 and all(len(g) == 1 for g in scan.predicate.groups):
            # One word (a phrase repeating it is not one: its positions must be checked).
            best = yield from tree.top_reader(
                term_keys[0], top, lambda df: _weight(df, n_docs, avg_len)
            )
            return ([pk for _, pk in best], {pk: score for score, pk in best})
        found = yield from tree.terms_reader(term_keys)
        by_term = dict(zip(terms, found))
        if (
            top is not None
            and all(len(g) == 1 for g in scan.predicate.groups)  # no phrase to check
            and all(by_term[t].live is None for t in terms)  # blocks of live postings only
        ):
            words = [(by_term[t].blocks, _weight(by_term[t].df, n_docs, avg_len)) for t in terms]
            best = top_of_all(words, top)
            return ([pk for _, pk in best], {pk: score for score, pk in best})
        groups = sorted(scan.predicate.groups, key=lambda g: min(by_term[t].df for t in g))
        docs, postings = _narrowed(by_term)
        for group in groups:
            if len(group) > 1:
                docs = {pk for pk in docs if _phrase_at(postings, group, pk)}
        scores = dict.fromkeys(docs, 0.0)
        for term in terms:
            idf = bm25_idf(by_term[term].df, n_docs)
            found = postings[term]
            weights: dict[tuple[int, int], float] = {}  # most documents share (tf, length)
            for pk, (doc_len, positions) in found.items():
                if pk not in scores:
                    continue  # found before a later word narrowed the documents down
                shape = (len(positions), doc_len)
                weight = weights.get(shape)
                if weight is None:
                    weight = weights[shape] = bm25_weight(shape[0], doc_len, avg_len, idf)
                scores[pk] += weight
        return (_rank(scores, top), scores)

    def _trigram_reader(self, scan: TrigramScan) -> Reader:
        """Documents whose folded text holds the needle, in key order, and no scores:
        the postings of the trigrams covering the needle, rarest first, each narrowing
        the documents down, then their positions checked."""
        parts = scan.predicate.parts
        terms = scan.predicate.terms
        tree = self.view.tree(scan.tree)
        found = yield from tree.terms_reader([encode_key(t) for t in terms])
        docs, postings = _narrowed(dict(zip(terms, found)))
        hits = [pk for pk in docs if _at_offsets(postings, parts, pk)]
        return (sorted(hits, key=sort_key), None)

    def top_text(self, scan: TextScan, k: int) -> list[Any]:
        """The ``k`` best documents of a search, best first."""
        self.table.records.prefetch()
        found: _Found = self.view.run([self._text_reader(scan, k)])[0]
        return found[0]

    def _combine(self, source: Source, results: dict[int, Any]) -> _Found:
        if isinstance(source, IndexScan):
            return results[id(source)], None
        if isinstance(source, TextScan | TrigramScan):
            found: _Found = results[id(source)]
            return found
        if isinstance(source, Complement):
            excluded = set(self._combine(source.part, results)[0])
            return [pk for pk in results[id(ALL_KEYS)] if pk not in excluded], None
        parts = [self._combine(p, results) for p in source.parts]
        scores = _merge_scores(s for _, s in parts)
        if isinstance(source, Intersect):
            keep = set.intersection(*(set(pks) for pks, _ in parts))
            base = next((pks for pks, s in parts if s is not None), parts[0][0])
            return [pk for pk in base if pk in keep], scores
        assert isinstance(source, Union)
        seen: dict[Any, None] = {}
        for pks, _ in parts:
            seen.update(dict.fromkeys(pks))
        return sorted(seen, key=sort_key), scores

    # -- records -------------------------------------------------------------------------

    def records(self, pks: list[Any]) -> list[tuple[Any, dict[str, Any]]]:
        """Fetch records for ``pks`` (one batched walk), in the given order."""
        if not pks:
            return []
        found = self.view.run([self.table.get_many_reader(pks)])[0]
        return [(pk, found[pk]) for pk in pks if pk in found]

    def index_window(
        self, scan: IndexScan, skip: int, limit: int | None, reverse: bool
    ) -> list[Any]:
        """Primary keys ``[skip:skip+limit]`` of an index scan, read from the index alone.

        One range: a single windowed descent. Several: count each range first, then read
        only the ranges the window falls in. The record tree's top is read on the way,
        since the records of the window are read next.
        """
        tree = self.view.tree(scan.tree)
        ranges = list(reversed(scan.ranges)) if reverse else scan.ranges
        value = scan.whole_values
        self.table.records.prefetch()
        if len(ranges) == 1:
            lo, hi = ranges[0]
            entries = self.view.run(
                [tree.scan_reader(lo, hi, skip=skip, limit=limit, reverse=reverse, value=value)]
            )[0]
            return [unpack(v) for _, v in entries]
        counts = self.view.run([tree.count_reader(lo, hi, value=value) for lo, hi in ranges])
        readers = []
        remaining = limit
        for (lo, hi), count in zip(ranges, counts):
            if skip >= count:
                skip -= count
                continue
            if remaining is not None and remaining <= 0:
                break
            readers.append(
                tree.scan_reader(lo, hi, skip=skip, limit=remaining, reverse=reverse, value=value)
            )
            taken = count - skip if remaining is None else min(count - skip, remaining)
            skip = 0
            if remaining is not None:
                remaining -= taken
        pks: list[Any] = []
        for entries in self.view.run(readers):
            pks.extend(unpack(v) for _, v in entries)
        return pks


def _weight(df: int, n_docs: int, avg_len: float) -> Weight:
    """The BM25 weight ``(tf, document length) -> float`` of a word held by ``df`` of
    ``n_docs`` documents."""
    idf = bm25_idf(df, n_docs)
    return lambda tf, dl: bm25_weight(tf, dl, avg_len, idf)


def _collect(source: Source, out: list[_Leaf | None]) -> None:
    if isinstance(source, IndexScan | TextScan | TrigramScan):
        out.append(source)
    elif isinstance(source, Complement):
        _collect(source.part, out)
    else:
        for part in source.parts:
            _collect(part, out)


def _needs_all(source: Source) -> bool:
    if isinstance(source, Complement):
        return True
    return isinstance(source, Intersect | Union) and any(_needs_all(p) for p in source.parts)


def _merge_scores(
    all_scores: Iterable[dict[Any, float] | None],
) -> dict[Any, float] | None:
    merged: dict[Any, float] | None = None
    for scores in all_scores:
        if scores is not None:
            merged = (
                dict(scores)
                if merged is None
                else {
                    pk: merged.get(pk, 0.0) + scores.get(pk, 0.0) for pk in merged.keys() | scores
                }
            )
    return merged


def _narrowed(
    by_term: dict[str, TermPostings],
) -> tuple[set[Any], dict[str, dict[Any, Posting]]]:
    """The documents holding every term, and each term's postings in them: the rarest
    term's documents first, each further term narrowing them down for the next."""
    by_df = sorted(by_term, key=lambda t: by_term[t].df)
    docs = by_term[by_df[0]].documents()
    postings: dict[str, dict[Any, Posting]] = {}
    for term in by_df[1:]:
        postings[term] = by_term[term].match(docs)
        docs = set(postings[term])
    postings[by_df[0]] = by_term[by_df[0]].match(docs)
    return docs, postings


def _at_offsets(
    postings: dict[str, dict[Any, Posting]], parts: list[tuple[int, str]], pk: Any
) -> bool:
    """Whether document ``pk`` holds each trigram of ``parts`` at one start plus its
    offset (the trigrams cover the needle, so it holds the needle there)."""
    (first_offset, first), *rest = parts
    wanted = [(offset - first_offset, set(postings[t][pk][1])) for offset, t in rest]
    return any(all(p + d in where for d, where in wanted) for p in postings[first][pk][1])


def _phrase_at(postings: dict[str, dict[Any, Posting]], group: list[str], pk: Any) -> bool:
    first = set(postings[group[0]][pk][1])
    rest = [set(postings[t][pk][1]) for t in group[1:]]
    return any(all(p + i + 1 in where for i, where in enumerate(rest)) for p in first)


def residual_filter(
    expr: Expr | None, rows: list[tuple[Any, dict[str, Any]]]
) -> list[tuple[Any, dict[str, Any]]]:
    if expr is None:
        return rows
    return [(pk, fields) for pk, fields in rows if expr.matches(fields)]


def _rank(scores: dict[Any, float], top: int | None = None) -> list[Any]:
    """Keys by descending score, ties by key (compared directly when they can be, which
    is the common case of integer keys and much cheaper than encoding each one); with
    ``top``, only the first ``top``."""
    try:
        if top is not None:  # (-score, key) pairs made and compared in C
            return [pk for _, pk in heapq.nsmallest(top, zip(map(neg, scores.values()), scores))]
        return sorted(scores, key=lambda pk: (-scores[pk], pk))
    except TypeError:  # keys of several types: ordered as an index would
        pairs = ((-score, sort_key(pk), pk) for pk, score in scores.items())
        if top is not None:
            return [pk for _, _, pk in heapq.nsmallest(top, pairs)]
        return [pk for _, _, pk in sorted(pairs)]
