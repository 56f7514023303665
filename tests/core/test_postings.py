"""Full-text indexes as runs of posting blocks, against a plain dict of postings.

Random postings added, replaced and removed in transactions, commits, merges of random
neighbouring runs (blocks kept, joined or combined posting by posting), savepoints and
rollbacks; after every step the live postings, document frequencies and the top-k of a
term must be exactly what the dict gives.
"""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_lsm import StoreHarness
from zerodb_core.btree import NodeSizes
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import QueryError
from zerodb_core.lsm import merge_postings_reader
from zerodb_core.schema import TEXT, Catalog, IndexSpec, ModelSpec

NAME = "i/M/t"
CATALOG = Catalog({"M": ModelSpec("M", {"t": IndexSpec("t", TEXT, ("body",))})})
SIZES = NodeSizes(inner=160, records=70, index=70, text=300)
TERMS = ["a", "bb", "ccc", "kernel"]


def weight(tf: int, dl: int) -> float:
    """A BM25-shaped weight: grows with tf, shrinks with the document length."""
    return tf / (tf + 0.5 + dl / 8)


class Weighed:
    """A ``weight_for`` for ``top_reader``: ``weight`` whatever the document frequency,
    which it notes."""

    def __init__(self) -> None:
        self.frequencies: list[int] = []

    def __call__(self, df: int):
        self.frequencies.append(df)
        return weight


class Harness(StoreHarness):
    """A full-text index, and the dict of postings it must equal."""

    name = NAME
    catalog = CATALOG
    leaf_bytes = 300
    merge = staticmethod(merge_postings_reader)
    postings = True

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[tuple[str, int], tuple[int, list[int]]] = {}

    def put(self, term: str, pk: int, dl: int, positions: list[int]) -> None:
        term_key = encode_key(term)
        live = (term, pk) in self.model
        self.tree.put(term_key + encode_key(pk), (term_key, pk, dl, positions), live)
        self.model[term, pk] = (dl, positions)

    def delete(self, term: str, pk: int) -> None:
        term_key = encode_key(term)
        dl, positions = self.model.pop((term, pk))
        self.tree.delete(term_key + encode_key(pk), (term_key, pk, dl, positions))

    def check(self) -> None:
        tree, run = self.tree, self.txn.run
        term_keys = [encode_key(term) for term in TERMS]
        postings = run([tree.postings_reader(term_keys)])[0]
        for term, term_key, live in zip(TERMS, term_keys, postings):
            expected = {pk: v for (t, pk), v in self.model.items() if t == term}
            assert live == expected
            for k in (1, 3):
                best = heapq.nsmallest(
                    k, ((-weight(len(p), dl), pk) for pk, (dl, p) in expected.items())
                )
                weighed = Weighed()
                got = run([tree.top_reader(term_key, k, weighed)])[0]
                assert weighed.frequencies == [len(expected)]
                assert [(pk, round(s, 9)) for s, pk in got] == [
                    (pk, round(-s, 9)) for s, pk in best
                ]
        everything = run([tree.scan_reader()])[0]
        assert [(v[0], v[1]) for _, v in everything] == sorted(
            ((encode_key(t), pk) for t, pk in self.model), key=lambda tp: tp[0] + encode_key(tp[1])
        )


op_st = st.one_of(
    st.tuples(
        st.just("put"),
        st.sampled_from(TERMS),
        st.integers(0, 400),
        st.lists(st.integers(0, 30), min_size=1, max_size=4),
    ),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.none(), st.none()),
    st.tuples(st.just("bulk"), st.sampled_from(TERMS), st.integers(0, 400), st.integers(1, 300)),
    st.tuples(st.just("commit"), st.none(), st.none(), st.none()),
    st.tuples(st.just("merge"), st.integers(0, 5), st.integers(2, 5), st.none()),
    st.tuples(st.just("savepoint"), st.none(), st.none(), st.none()),
    st.tuples(st.just("rollback"), st.none(), st.none(), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op_st, max_size=40))
def test_postings_match_a_dict(ops):
    h = Harness()
    for op, a, b, c in ops:
        if op == "put":
            h.put(a, b, b % 50 + 1, c)
        elif op == "delete" and h.model:
            h.delete(*sorted(h.model)[a % len(h.model)])
        elif op == "bulk":  # many documents of one term, in pk order (a load)
            for pk in range(b, b + c):
                h.put(a, pk, pk % 40 + 1, [pk % 7])
        else:
            h.step(op, a, b)
        h.check()
    h.commit()
    runs = h.state.trees.get(NAME, ())
    h.merge_runs(0, len(runs))
    assert all(run.plain for run in h.state.trees.get(NAME, ()))
    h.check()


def test_a_common_term_reads_few_blocks_for_its_top_ten():
    """Top-k stops once no block left can beat the k-th score: for a term in 2,000
    documents, one of them with a much higher term frequency, the top one costs a few
    blocks, not 16."""
    h = Harness()
    for pk in range(2000):
        h.put("kernel", pk, 40, [0, 5, 9, 13, 17] if pk == 1234 else [pk % 40])
    h.commit()
    decoded = []
    from zerodb_core.lsm import postings

    original = postings.block_postings
    postings.block_postings = lambda block: decoded.append(block) or original(block)
    try:
        got = h.txn.run([h.tree.top_reader(encode_key("kernel"), 1, Weighed())])[0]
    finally:
        postings.block_postings = original
    assert got[0][1] == 1234
    assert len(decoded) == 1


def test_a_text_index_has_no_count_of_one_value():
    """``value=True`` counts the entries of one value of an ordered index, by its runs'
    filters; a full-text index has none, and says so (it raised AttributeError)."""
    harness = Harness()
    harness.put("a", 1, 3, [0])
    harness.commit()
    tree = harness.tree
    lo = encode_key("a")
    with pytest.raises(QueryError, match="ordered index"):
        harness.txn.run([tree.count_reader(lo, lo + b"\xff", value=True)])
    assert harness.txn.run([tree.count_reader(lo, lo + b"\xff")]) == [1]
