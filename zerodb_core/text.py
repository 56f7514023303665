"""Full-text helpers for the inverted index: tokenizer, query parser, BM25.

Documents and queries go through the same ``tokenize``, so a phrase query matches exactly
the token sequences the index stored (``"3.14"`` is the phrase ``["3", "14"]`` on both
sides).
"""

from __future__ import annotations

import itertools
import math
import re
import unicodedata

__all__ = [
    "MAX_TOKEN_LENGTH",
    "bm25",
    "bm25_idf",
    "bm25_weight",
    "fold",
    "parse_query",
    "tokenize",
    "trigrams",
]

# Longer tokens are dropped: they are almost always hashes, base64 or URLs, and they would
# bloat the index for no recall.
MAX_TOKEN_LENGTH = 64

# Typographic quotes count as '"' in queries (users paste them from word processors).
_QUOTES = str.maketrans(dict.fromkeys("\u201c\u201d\u201e\u201f\u00ab\u00bb", '"'))

_token_re: re.Pattern[str] | None = None


def _mark_class() -> str:
    """Return a regex class body of every combining mark (categories Mn, Mc, Me).

    The stdlib ``re`` has no ``\\p{M}``, and ``\\w`` excludes marks, which would split
    words of Devanagari, Thai, ... in the middle; so the class is built once, lazily.
    Marks live in planes 0, 1 and 14 (variation selectors) only; scanning just those
    keeps the first call short.
    """
    ranges: list[tuple[int, int]] = []
    category = unicodedata.category
    for cp in itertools.chain(range(0x300, 0x20000), range(0xE0000, 0xE1000)):
        if category(chr(cp))[0] == "M":
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    return "".join(f"{chr(a)}-{chr(b)}" if a != b else chr(a) for a, b in ranges)


def _pattern() -> re.Pattern[str]:
    global _token_re
    if _token_re is None:
        # A token starts with a letter or digit and goes on over letters, digits and marks.
        # '_' is excluded from \w: snake_case splits into words.
        _token_re = re.compile(f"[^\\W_](?:[^\\W_]|[{_mark_class()}])*")
    return _token_re


def _normalise(text: str) -> str:
    # NFKC, casefold, NFKC again: casefolding can denormalise (Unicode's NFKC_Casefold).
    text = unicodedata.normalize("NFKC", text).casefold()
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    return text


# ASCII text is its own NFKC form, casefolds as lower() does and holds no combining
# mark, so its tokens are the runs of [A-Za-z0-9], lowered: one byte table maps A-Z to
# a-z and every other non-alphanumeric byte to a space, and split() cuts the runs out.
# The same tokens as the general pattern, several times faster.
_ASCII_WORDS = bytes(
    c + 32 if 65 <= c <= 90 else c if 97 <= c <= 122 or 48 <= c <= 57 else 32 for c in range(256)
)


def tokenize(text: str) -> list[str]:
    """Return the word tokens of ``text``: NFKC-normalised, casefolded, in order.

    Tokens are runs of letters, digits and combining marks; punctuation, '_' and spaces
    separate them (``"don't"`` -> ``["don", "t"]``). Tokens over ``MAX_TOKEN_LENGTH``
    characters are dropped, and so do not count as positions.
    """
    if text.isascii():
        tokens = text.encode().translate(_ASCII_WORDS).decode().split()
        if len(text) <= MAX_TOKEN_LENGTH:  # no token can be too long
            return tokens
    else:
        tokens = _pattern().findall(_normalise(text))
    if tokens and max(map(len, tokens)) > MAX_TOKEN_LENGTH:
        tokens = [token for token in tokens if len(token) <= MAX_TOKEN_LENGTH]
    return tokens


def fold(text: str) -> str:
    """The text trigram indexes hold: ``lower()``, with final sigma as any sigma.

    ``str.lower()`` maps each character on its own except capital sigma, which lowers to
    final sigma (U+03C2) at the end of a word and sigma (U+03C3) elsewhere; mapping the
    first to the second afterwards makes ``fold`` a per-character map. So a substring of
    a text folds to a substring of the folded text, whatever the case, and a lowered
    substring (``icontains``) folds to a substring of it too: trigrams of the folded text
    find every candidate.
    """
    return text.lower().replace("\u03c2", "\u03c3")


def trigrams(text: str) -> list[str]:
    """The trigrams of ``fold(text)`` in order (position ``i`` starts at character
    ``i``), the "tokens" of a trigram index: a text of fewer than 3 characters has none."""
    folded = fold(text)
    return [folded[i : i + 3] for i in range(len(folded) - 2)]


def parse_query(query: str) -> list[list[str]]:
    """Return the required groups of a search query, each a phrase of consecutive terms.

    A bare word is a one-term group; ``"quoted words"`` form one multi-term group. An
    unmatched last quote is ignored (its words count as bare words). Repeated groups are
    kept once, in first-seen order. An empty or all-punctuation query gives ``[]``.
    """
    parts = query.translate(_QUOTES).split('"')
    if len(parts) % 2 == 0:  # odd number of quotes: the last one opens nothing
        parts[-2:] = [parts[-2] + " " + parts[-1]]
    groups: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for i, part in enumerate(parts):
        tokens = tokenize(part)
        candidates = [tokens] if i % 2 else [[token] for token in tokens]
        for group in candidates:
            key = tuple(group)
            if group and key not in seen:
                seen.add(key)
                groups.append(group)
    return groups


def bm25(
    tf: int,
    doc_len: int,
    df: int,
    n_docs: int,
    avg_doc_len: float,
    k1: float = 1.2,
    b: float = 0.75,
) -> float:
    """Return the Okapi BM25 score of one term in one document.

    ``idf = log(1 + (N - df + 0.5) / (df + 0.5))`` is never negative, so a term in most
    documents adds little instead of subtracting. ``df`` is clamped to ``[0, n_docs]``
    (statistics may lag the postings by a commit), and an ``avg_doc_len`` of 0 means no
    length normalisation.
    """
    return bm25_weight(tf, doc_len, avg_doc_len, bm25_idf(df, n_docs), k1, b)


def bm25_idf(df: int, n_docs: int) -> float:
    """The idf part of BM25, computed once per term of a query."""
    df = min(max(df, 0), max(n_docs, 0))
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def bm25_weight(
    tf: int, doc_len: int, avg_doc_len: float, idf: float, k1: float = 1.2, b: float = 0.75
) -> float:
    """The per-document part of BM25, given the term's ``idf``."""
    if tf <= 0:
        return 0.0
    norm = 1.0 - b + b * (doc_len / avg_doc_len) if avg_doc_len > 0 else 1.0
    return idf * tf * (k1 + 1.0) / (tf + k1 * norm)
