"""Top-k of a search for several words (MaxScore over block bounds), against scoring
every document that holds them all.

Random postings of a few words over several runs (commits, merges, deletes); whenever
the words' blocks hold only live postings (what the search hands ``top_of_all``), the
top-k must be exactly the exhaustive ranking: same documents, same scores (summed in the
same order), ties by primary key.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_postings import TERMS, Harness, weight
from zerodb_core.encoding import encode_key
from zerodb_core.lsm import topk


def exhaustive(model: dict, terms: list[str], weights: dict, k: int) -> list[tuple[float, int]]:
    """Every document holding all ``terms``, scored by summing in ``terms`` order."""
    docs = set.intersection(*({pk for (t, pk) in model if t == term} for term in terms))
    scores = {}
    for pk in docs:
        score = 0.0
        for term in terms:
            dl, positions = model[term, pk]
            score += weights[term](len(positions), dl)
        scores[pk] = score
    return [(scores[pk], pk) for pk in sorted(scores, key=lambda pk: (-scores[pk], pk))[:k]]


def term_weights(terms: list[str]) -> dict:
    """A different BM25-shaped weight per word (as idf makes them)."""
    return {term: (lambda tf, dl, f=n + 1: f * weight(tf, dl)) for n, term in enumerate(terms)}


def top(h: Harness, terms: list[str], weights: dict, k: int) -> list[tuple[float, int]] | None:
    """``top_of_all`` on the words' blocks, or None when some word's postings need
    combining (the search then scores every document instead)."""
    found = h.txn.run([h.tree.terms_reader([encode_key(t) for t in terms])])[0]
    if any(p.live is not None for p in found):
        return None
    return topk.top_of_all([(p.blocks, weights[t]) for t, p in zip(terms, found)], k)


op_st = st.one_of(
    st.tuples(
        st.just("put"),
        st.sampled_from(TERMS),
        st.integers(0, 300),
        st.lists(st.integers(0, 30), min_size=1, max_size=4),
    ),
    st.tuples(st.just("bulk"), st.sampled_from(TERMS), st.integers(0, 300), st.integers(1, 300)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.none(), st.none()),
    st.tuples(st.just("commit"), st.none(), st.none(), st.none()),
    st.tuples(st.just("merge"), st.integers(0, 5), st.integers(2, 5), st.none()),
)


@settings(max_examples=120, deadline=None)
@given(
    ops=st.lists(op_st, max_size=30),
    terms=st.lists(st.sampled_from(TERMS), min_size=2, max_size=3, unique=True),
    ks=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    same_length=st.booleans(),
)
def test_top_of_all_is_the_exhaustive_ranking(ops, terms, ks, same_length):
    h = Harness()
    for op, a, b, c in ops:
        if op == "put":  # one length for every document: many equal scores (ties by pk)
            h.put(a, b, 40 if same_length else b % 50 + 1, c)
        elif op == "bulk":
            for pk in range(b, b + c):
                h.put(a, pk, 40 if same_length else pk % 40 + 1, [pk % 7] * (1 + pk % 3))
        elif op == "delete" and h.model:
            h.delete(*sorted(h.model)[a % len(h.model)])
        else:
            h.step(op, a, b)
    h.commit()
    terms = sorted(terms)
    weights = term_weights(terms)
    for k in ks:
        got = top(h, terms, weights, k)
        if got is not None:
            assert got == exhaustive(h.model, terms, weights, k)
    h.merge_runs(0, len(h.state.trees.get(h.name, ())))  # one run: always comparable
    for k in ks:
        assert top(h, terms, weights, k) == exhaustive(h.model, terms, weights, k)


def test_a_word_missing_from_every_document_of_the_other_gives_nothing():
    h = Harness()
    for pk in range(300):
        h.put("a", pk, 40, [0])
        h.put("bb", pk + 1000, 40, [0])
    h.commit()
    weights = term_weights(["a", "bb"])
    assert top(h, ["a", "bb"], weights, 10) == []


def test_candidates_are_read_block_by_block_until_none_can_win(monkeypatch):
    """Two words in 3,000 documents; the rarer word's blocks of tf 1 cannot beat the
    documents where it occurs three times, so once those fill the top, the blocks left are
    never decoded: fewer blocks of the rarer word are read than it has."""
    h = Harness()
    for pk in range(3000):
        h.put("a", pk, 40, [0])
        if pk % 2 == 0:
            h.put("bb", pk, 40, [1, 2, 3] if pk < 256 else [1])
    h.commit()
    found = h.txn.run([h.tree.terms_reader([encode_key("a"), encode_key("bb")])])[0]
    rare_blocks = found[1].blocks
    decoded = []
    original = topk.block_postings
    monkeypatch.setattr(
        topk, "block_postings", lambda block: decoded.append(id(block)) or original(block)
    )
    weights = term_weights(["a", "bb"])
    got = topk.top_of_all([(found[0].blocks, weights["a"]), (found[1].blocks, weights["bb"])], 5)
    assert got == exhaustive(h.model, ["a", "bb"], weights, 5)
    rare_read = {id(block) for block in rare_blocks} & set(decoded)
    assert len(rare_blocks) > 2
    assert len(rare_read) < len(rare_blocks)
