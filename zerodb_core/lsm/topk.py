"""Top-k of a search for several words, without scoring every document that holds them.

A search for all of several words ranks the documents holding every one by the sum of
their BM25 weights. Scoring every such document costs a pass over the postings of the most
frequent word (a third of the table for a common one). MaxScore (Turtle and Flood, 1995),
with the per-block bounds Lucene's block-max WAND uses, does not:

* every block of postings bounds the weight of its postings by the weight of its largest
  term frequency at its smallest document length (``MAX_TF``, ``MIN_DL`` of its head), and
  each word's largest block bound bounds the word;
* candidates come from the rarest word only (a document must hold it), block by block in
  the order of their bounds, and a block whose bound plus the other words' bounds cannot
  beat the k-th score so far ends the search;
* a candidate is looked up in the other words' blocks (by the last key of each block, a
  bisection; the block decodes once and stays cached) only while what it has so far plus
  the bounds of the words left can still beat the k-th score.

Scores are summed in the same order as the exhaustive search sums them, so a document has
the very same score either way, and ties rank by primary key as everywhere else.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable
from itertools import islice
from operator import itemgetter, lt
from typing import Any

from zerodb_core.btree.blocks import (
    COUNT,
    LAST,
    MAX_TF,
    MIN_DL,
    Block,
    block_offsets,
    block_pks,
    block_postings,
)
from zerodb_core.encoding import encode_key

#: ``weight(tf, document length)`` of one word.
Weight = Callable[[int, int], float]

# Bounds are sums made in another order than the scores they bound: a candidate is dropped
# only when its bound is short of the k-th score by more than rounding can explain.
_ROUNDING = 1e-9


class DescendingKey:
    """A primary key that sorts descending (so among equal scores the smallest pk ranks
    first); its key is encoded once, when a tie first asks for it."""

    __slots__ = ("_encoded", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self._encoded: bytes | None = None

    @property
    def key(self) -> bytes:
        if self._encoded is None:
            self._encoded = encode_key(self.value)
        return self._encoded

    def __lt__(self, other: DescendingKey) -> bool:
        mine, theirs = self.value, other.value
        if type(mine) is int and type(theirs) is int:  # keys of ints order as the ints
            return theirs < mine
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DescendingKey) and self.value == other.value


class _Word:
    """One word of the search: its blocks in key order, their bounds, its bound."""

    __slots__ = ("blocks", "bound", "df", "lasts", "weight")

    def __init__(self, blocks: list[Block], weight: Weight) -> None:
        lasts = list(map(itemgetter(LAST), blocks))
        if not all(map(lt, lasts, islice(lasts, 1, None))):  # blocks of several runs
            blocks = sorted(blocks, key=itemgetter(LAST))
            lasts = list(map(itemgetter(LAST), blocks))
        self.blocks, self.lasts = blocks, lasts
        self.df = sum(map(itemgetter(COUNT), blocks))
        self.weight = _Cached(weight)
        # The weight grows with the tf and shrinks with the length: no posting weighs more.
        self.bound = self.weight(
            max(map(itemgetter(MAX_TF), blocks)), min(map(itemgetter(MIN_DL), blocks))
        )

    def weigh(self, candidates: set[Any], first: bytes, last: bytes) -> dict[Any, float]:
        """``{pk: weight}`` of the ``candidates`` holding the word, all of them between
        the keys ``first`` and ``last``: only the blocks spanning those keys are read
        (which candidates a block holds is a set intersection, in C)."""
        out: dict[Any, float] = {}
        weight = self.weight
        start = bisect_left(self.lasts, first)
        stop = bisect_left(self.lasts, last, start) + 1
        for block in self.blocks[start:stop]:
            hits = candidates.intersection(block_pks(block))
            if hits:
                offsets = block_offsets(block)
                _, _, dls, positions = block_postings(block)
                for pk in hits:
                    i = offsets[pk]
                    out[pk] = weight(len(positions[i]), dls[i])
        return out


class _Cached:
    """A word's weight, worked out once per (tf, document length): documents share few."""

    __slots__ = ("_known", "_weight")

    def __init__(self, weight: Weight) -> None:
        self._weight = weight
        self._known: dict[tuple[int, int], float] = {}

    def __call__(self, tf: int, dl: int) -> float:
        found = self._known.get((tf, dl))
        if found is None:
            found = self._known[(tf, dl)] = self._weight(tf, dl)
        return found

    def least_tf(self, dl: int, most: int, floor: float) -> int:
        """The smallest tf (up to ``most``) whose weight at length ``dl`` reaches ``floor``."""
        tf = 1
        while tf < most and self(tf, dl) < floor:
            tf += 1
        return tf


def top_of_all(words: list[tuple[list[Block], Weight]], k: int) -> list[tuple[float, Any]]:
    """The ``k`` best ``(score, pk)`` of the documents holding every word, best first
    (ties by pk), a document's score the sum of its weights in the order of ``words``.

    ``words`` are ``(blocks, weight)`` per word: blocks of live postings only (no
    tombstones, no replacements, no two blocks holding one document), as
    :class:`~zerodb_core.lsm.postings.TermPostings` keeps them when nothing else needs
    combining.
    """
    if not words or k <= 0 or not all(blocks for blocks, _ in words):
        return []
    parsed = [_Word(blocks, weight) for blocks, weight in words]
    lead = min(parsed, key=lambda word: word.df)
    # The other words, the rarest first: a candidate missing one is dropped soonest.
    others = sorted((word for word in parsed if word is not lead), key=lambda word: word.df)
    others_bound = sum(word.bound for word in others)
    bounds = [lead.weight(block[MAX_TF], block[MIN_DL]) for block in lead.blocks]
    order = sorted(range(len(lead.blocks)), key=lambda i: (-bounds[i], lead.lasts[i]))
    best: list[tuple[float, DescendingKey]] = []  # a heap of the k best, worst first
    for i in order:
        floor = _floor(best[0][0]) if len(best) == k else None
        if floor is not None and bounds[i] + others_bound < floor:
            break  # blocks come by bound: none left can enter the top
        block = lead.blocks[i]
        pks, _, dls, positions = block_postings(block)
        if floor is None or block[MAX_TF] == 1:
            candidates = set(pks)
        else:  # postings of too small a tf cannot make it, whatever the other words add
            need = lead.weight.least_tf(block[MIN_DL], block[MAX_TF], floor - others_bound)
            candidates = {pk for pk, at in zip(pks, positions) if len(at) >= need}
        first, last = encode_key(pks[0]), block[LAST]
        found = {}
        for word in others:
            if not candidates:
                break
            found[word] = word.weigh(candidates, first, last)
            candidates = set(found[word])
        if candidates:
            offsets = block_offsets(block)
            found[lead] = {
                pk: lead.weight(len(positions[offsets[pk]]), dls[offsets[pk]]) for pk in candidates
            }
        for pk in candidates:
            score = 0.0
            for word in parsed:  # in the order of ``words``, as the full search sums
                score += found[word][pk]
            entry = (score, DescendingKey(pk))
            if len(best) < k:
                heapq.heappush(best, entry)
            elif entry > best[0]:
                heapq.heapreplace(best, entry)
    return [(score, pk.value) for score, pk in sorted(best, reverse=True)]


def _floor(score: float) -> float:
    """What a bound must reach to possibly tie ``score`` (rounding allowed for)."""
    return score - _ROUNDING * (1.0 + abs(score))
