"""Pattern lookups answered from a ``TrigramIndex``: candidates, then the exact test.

``contains``, ``icontains``, ``endswith``, ``iendswith``, ``iexact``, and ``regex`` /
``iregex`` with literal fragments, on a field with a trigram index, become
``Substring(field, fold(fragment))`` for each fragment of 3 characters or more (the
trigram scan finds every record holding it, :func:`zerodb_core.text.fold`), and the
lookup itself checked on those records as the evaluator decides it. Nothing is
approximated: a fragment shorter than 3 characters, or a pattern whose required text
cannot be proved, leaves the lookup to the scan.

Why the candidates are complete, per lookup (``fold`` maps characters one by one):

* ``contains``/``endswith``: the value holds the fragment, so its fold holds the
  fragment's fold;
* ``icontains``/``iendswith``/``iexact`` (the evaluator's ``lower() in lower()``): fold
  is ``lower()`` followed by a map of characters, so the same holds;
* ``regex``: a run of literal characters at the top level of the pattern (outside any
  group, repetition or alternative) is matched by those characters, in order;
* ``iregex``: as ``regex``, only for characters whose every case-insensitive match in
  Python's ``re`` folds like them (ASCII letters other than i, k and s, digits,
  punctuation: ``re.IGNORECASE`` also matches dotless i (U+0131) to ``i``, the Kelvin
  sign (U+212A) to ``k`` and long s (U+017F) to ``s``, which ``lower()`` does not).

``icontains`` of a fragment without a sigma needs no check at all: there ``fold`` and
``lower()`` agree on every character the match covers, so the trigram scan's answer is
the lookup's, and ``count()`` reads postings only.
"""

from __future__ import annotations

import re
import string
from typing import Any

from django.db.models import CharField, Lookup, TextField
from django.db.models.expressions import Col

from django_zerodb.evaluate import lookup_kind, lookup_test
from django_zerodb.indexes import TrigramIndex
from django_zerodb.translate import direct_lookup
from zerodb_core.api import And, Expr, Match, Substring, fold

WHOLE = frozenset({"contains", "icontains", "endswith", "iendswith", "iexact"})
SIGMA = "\u03c3"
# Characters an iregex fragment may hold (see the module docstring).
IREGEX_SAFE = frozenset(string.digits + string.punctuation + " ") | frozenset(
    c for c in string.ascii_letters if c.lower() not in "iks"
)


def trigram_fields(model: Any) -> frozenset[str]:
    """The columns of ``model`` with a ``TrigramIndex``."""
    if model is None:
        return frozenset()
    opts = model._meta
    return frozenset(
        opts.get_field(name).column
        for index in opts.indexes
        if isinstance(index, TrigramIndex)
        for name in index.fields
    )


def trigram_served(model: Any, term: Any, ev: Any) -> Expr | None:
    """The engine expression for a top-level conjunct a trigram index can narrow down,
    or None (the caller translates it as usual)."""
    if not isinstance(term, Lookup) or not direct_lookup(term):
        return None
    lhs = term.lhs
    if type(lhs) is not Col or not isinstance(lhs.target, CharField | TextField):
        return None
    column = lhs.target.column
    if column not in trigram_fields(model):
        return None
    name = lookup_kind(term)  # the builtin lookup it is (a str: direct_lookup)
    value = ev.rhs(term, {})
    if not isinstance(value, str):
        return None
    needles = [fold(f) for f in fragments(name, value) or ()]
    needles = [n for n in needles if len(n) >= 3]
    if not needles:
        return None  # nothing provable, or too short: the scan answers
    substrings = [Substring(column, needle) for needle in needles]
    if name == "icontains" and SIGMA not in needles[0]:
        return substrings[0]
    check = Match(column, lambda v: lookup_test(name, v, value) is True, f"{name} {value!r}")
    return And(*substrings, check)


def fragments(name: str, value: str) -> list[str] | None:
    """Texts every value matching ``<name> value`` must hold (None: none provable)."""
    if name in WHOLE:
        return [value]
    if name in ("regex", "iregex"):
        return regex_fragments(value, name == "iregex")
    return None


def regex_fragments(pattern: str, ignore_case: bool) -> list[str] | None:
    """The runs of literal characters at the top level of a regular expression."""
    try:
        from re import _constants, _parser  # the stdlib's own parser, as re.compile uses

        parsed = _parser.parse(pattern)
    except Exception:  # an invalid pattern (the scan raises it), or another Python
        return None
    ignore_case = ignore_case or bool(parsed.state.flags & re.IGNORECASE)
    runs: list[str] = []
    current: list[str] = []
    for op, argument in parsed:
        if op is _constants.LITERAL:
            current.append(chr(argument))
            continue
        runs.append("".join(current))
        current = []
    runs.append("".join(current))
    if ignore_case:
        runs = [run for run in runs if IREGEX_SAFE.issuperset(run)]
    return [run for run in runs if run]
