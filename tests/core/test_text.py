"""Tokenizer, query parser and BM25 of the full-text index."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerodb_core.text import MAX_TOKEN_LENGTH, bm25, parse_query, tokenize


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("Hello, World!", ["hello", "world"]),
        ("  ", []),
        ("", []),
        ("snake_case and CamelCase", ["snake", "case", "and", "camelcase"]),
        ("version 3.14 of 2024", ["version", "3", "14", "of", "2024"]),
        ("don't", ["don", "t"]),
        ("Straße STRASSE", ["strasse", "strasse"]),  # casefold, not lower
        ("\ufb01le \uff26\uff55\uff4c\uff4c", ["file", "full"]),  # NFKC: ligature, fullwidth
        ("Cafe\u0301 café", ["café", "café"]),  # combining accent composes
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),  # marks stay inside words
        ("日本語 テキスト", ["日本語", "テキスト"]),
        ("x" * MAX_TOKEN_LENGTH + " y " + "z" * (MAX_TOKEN_LENGTH + 1), ["x" * 64, "y"]),
        ("½ ²", ["1", "2", "2"]),  # NFKC turns them into digits and '/'
    ],
)
def test_tokenize(text, tokens):
    assert tokenize(text) == tokens


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_tokens_are_normalised_and_stable(text):
    tokens = tokenize(text)
    for token in tokens:
        assert 0 < len(token) <= MAX_TOKEN_LENGTH
        assert tokenize(token) == [token]  # idempotent: a query term finds its document


@pytest.mark.parametrize(
    "query, groups",
    [
        ("", []),
        ("  !! ", []),
        ("Alice", [["alice"]]),
        ("alice bob", [["alice"], ["bob"]]),
        ('"alice bob" carol', [["alice", "bob"], ["carol"]]),
        ('x "new york" y "san francisco"', [["x"], ["new", "york"], ["y"], ["san", "francisco"]]),
        ('"unclosed phrase', [["unclosed"], ["phrase"]]),
        ('"a b" "c', [["a", "b"], ["c"]]),
        ('""', []),
        ('" "', []),
        ('"single"', [["single"]]),
        ("\u201csmart quotes\u201d here", [["smart", "quotes"], ["here"]]),
        ("a a A", [["a"]]),
        ('"3.14"', [["3", "14"]]),
    ],
)
def test_parse_query(query, groups):
    assert parse_query(query) == groups


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from('ab c"\u201c')))
def test_parse_query_keeps_every_token_once_per_group(query):
    groups = parse_query(query)
    assert all(groups)
    assert len(set(map(tuple, groups))) == len(groups)
    terms = {term for group in groups for term in group}
    assert terms == set(tokenize(query.replace('"', " ").replace("\u201c", " ")))


def test_bm25_matches_the_formula():
    tf, doc_len, df, n_docs, avg = 3, 120, 10, 1000, 100.0
    k1, b = 1.2, 0.75
    idf = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
    expected = idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_len / avg))
    assert bm25(tf, doc_len, df, n_docs, avg) == pytest.approx(expected)


def test_bm25_behaviour():
    base = bm25(2, 100, 10, 1000, 100.0)
    assert bm25(3, 100, 10, 1000, 100.0) > base  # more occurrences score higher
    assert bm25(2, 100, 100, 1000, 100.0) < base  # commoner terms score lower
    assert bm25(2, 400, 10, 1000, 100.0) < base  # longer documents score lower
    assert bm25(0, 100, 10, 1000, 100.0) == 0.0
    assert bm25(1, 10, 1000, 1000, 10.0) > 0.0  # idf never negative
    assert bm25(1, 10, 2000, 1000, 10.0) > 0.0  # df > N (stale stats) is clamped
    assert bm25(1, 0, 1, 1, 0.0) > 0.0  # empty corpus lengths: no normalisation
    assert bm25(2, 50, 10, 1000, 100.0, b=0.0) == pytest.approx(base)  # b=0 ignores length


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 100),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.floats(0, 10_000),
)
def test_bm25_is_finite_and_non_negative(tf, doc_len, df, n_docs, avg):
    score = bm25(tf, doc_len, df, n_docs, avg)
    assert math.isfinite(score)
    assert score >= 0.0
