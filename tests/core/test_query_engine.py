"""The query engine against a plain-Python evaluation of every operator.

The reference below is written independently of the engine: ordinary Python comparisons
within one type, SQL's rule that missing values match no comparison, two-valued Not.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerodb_core.models import Field, Model, Text
from zerodb_core.query import (
    And,
    Any,
    Contains,
    DoesNotContain,
    Eq,
    Ge,
    Gt,
    InRange,
    IsNull,
    Le,
    Lt,
    Not,
    NotAny,
    NotEq,
    NotInRange,
    Or,
    StartsWith,
)
from zerodb_core.query.executor import Executor
from zerodb_core.query.result import BATCH

WORDS = ["alpha", "beta", "gamma", "delta", "panic"]


class Item(Model):
    a = Field()  # ints or None
    b = Field()  # short strings or None
    t = Text()


INTS = st.one_of(st.none(), st.integers(-3, 6))
STRS = st.one_of(st.none(), st.sampled_from(["", "a", "ab", "abc", "b", "ba", "c"]))
TEXTS = st.one_of(st.none(), st.lists(st.sampled_from(WORDS), max_size=5).map(" ".join))
RECORDS = st.lists(
    st.fixed_dictionaries({"a": INTS, "b": STRS, "t": TEXTS, "u": INTS}), max_size=40
)


def ref(expr, rec) -> bool:
    """Plain-Python meaning of each operator."""
    if isinstance(expr, And):
        return all(ref(e, rec) for e in expr.exprs)
    if isinstance(expr, Or):
        return any(ref(e, rec) for e in expr.exprs)
    if isinstance(expr, Not):
        return not ref(expr.expr, rec)
    v = rec.get(expr.field)
    match expr:
        case NotEq():
            return v is not None and v != expr.value
        case Eq():
            return v == expr.value
        case IsNull():
            return (v is None) == expr.isnull
        case Lt():
            return v is not None and v < expr.value
        case Le():
            return v is not None and v <= expr.value
        case Gt():
            return v is not None and v > expr.value
        case Ge():
            return v is not None and v >= expr.value
        case NotInRange():
            return v is not None and not expr.start <= v <= expr.end
        case InRange():
            return v is not None and expr.start <= v <= expr.end
        case NotAny():
            return v is not None and v not in expr.values
        case Any():
            return v in expr.values
        case StartsWith():
            return v is not None and v.startswith(expr.prefix)
        case DoesNotContain():
            return not (v is not None and all(_phrase(v.split(), g) for g in _groups(expr.text)))
        case Contains():
            return v is not None and all(_phrase(v.split(), g) for g in _groups(expr.text))
    raise AssertionError(expr)


def _groups(text):
    out, rest = [], text
    while '"' in rest:
        before, _, after = rest.partition('"')
        phrase, _, rest = after.partition('"')
        out += [[w] for w in before.split()] + ([phrase.split()] if phrase.split() else [])
    return out + [[w] for w in rest.split()]


def _phrase(tokens, phrase):
    n = len(phrase)
    return any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


def preds():
    ints = st.integers(-3, 6)
    strs = st.sampled_from(["", "a", "ab", "b", "c", "bz"])
    a_field = st.sampled_from(["a", "u"])
    return st.one_of(
        st.builds(Eq, a_field, st.one_of(st.none(), ints)),
        st.builds(NotEq, a_field, ints),
        st.builds(Lt, a_field, ints),
        st.builds(Le, a_field, ints),
        st.builds(Gt, a_field, ints),
        st.builds(Ge, a_field, ints),
        st.builds(InRange, a_field, ints, ints),
        st.builds(NotInRange, a_field, ints, ints),
        st.builds(Any, a_field, st.lists(st.one_of(st.none(), ints), max_size=3)),
        st.builds(NotAny, a_field, st.lists(ints, max_size=3)),
        st.builds(IsNull, st.sampled_from(["a", "b", "u"]), st.booleans()),
        st.builds(Eq, st.just("b"), st.one_of(st.none(), strs)),
        st.builds(Lt, st.just("b"), strs),
        st.builds(Ge, st.just("b"), strs),
        st.builds(StartsWith, st.just("b"), strs),
        st.builds(
            Contains,
            st.just("t"),
            st.sampled_from(
                ["alpha", "beta gamma", '"beta gamma"', "panic alpha", "zeta", '"alpha alpha"']
            ),
        ),
        st.builds(DoesNotContain, st.just("t"), st.sampled_from(["alpha", '"alpha beta"'])),
    )


EXPRS = st.recursive(
    preds(),
    lambda children: st.one_of(
        st.builds(lambda xs: And(*xs), st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda xs: Or(*xs), st.lists(children, min_size=1, max_size=3)),
        st.builds(Not, children),
    ),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def shared_db():
    from zerodb_core import DB

    return DB("memory://", password="p", kdf="fast", node_bytes=256)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    records=RECORDS,
    exprs=st.lists(EXPRS, min_size=1, max_size=4),
    sort=st.sampled_from([None, "a", "b"]),
    reverse=st.booleans(),
    skip=st.integers(0, 5),
    limit=st.one_of(st.none(), st.integers(0, 8)),
)
def test_engine_matches_python(shared_db, records, exprs, sort, reverse, skip, limit):
    db = shared_db
    with db.transaction():
        db.remove(db[Item].all())
        items = [Item(**r) for r in records]
        db.add(*items)
    expected_all = {i.pk for i, r in zip(items, records)}
    assert {x.pk for x in db[Item].all()} == expected_all
    for expr in exprs:
        expected = [(i.pk, r) for i, r in zip(items, records) if ref(expr, r)]
        result = db[Item].query(expr)
        assert len(result) == len(expected), expr
        assert sorted(x.pk for x in result) == sorted(pk for pk, _ in expected), expr
        if sort is not None:
            key = lambda pr: (pr[1][sort] is not None, pr[1][sort] or 0, pr[0])  # noqa: E731
            if sort == "b":
                key = lambda pr: (pr[1]["b"] is not None, pr[1]["b"] or "", pr[0])  # noqa: E731
            ordered = sorted(expected, key=key, reverse=reverse)
            window = ordered[skip:] if limit is None else ordered[skip : skip + limit]
            page = db[Item].query(expr, sort_index=sort, reverse=reverse, skip=skip, limit=limit)
            assert [x.pk for x in page] == [pk for pk, _ in window], (expr, sort)
            assert len(page) == len(window)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(st.lists(TEXTS, min_size=1, max_size=30), min_size=1, max_size=4),
    removed=st.lists(st.integers(0, 10**6), max_size=6),
    query=st.sampled_from(
        ["alpha", "panic", "beta gamma", '"alpha beta"', "delta panic", '"panic panic"']
    ),
    k=st.integers(1, 12),
)
def test_a_page_of_search_results_is_the_top_of_the_full_ranking(
    make_db, batches, removed, query, k
):
    """Pages of ranked results come from top-k (blocks read best first, or only the
    intersection scored), over several runs, updates and deletes: they must be exactly
    the start of the full ranking, ties by pk."""
    db = make_db(node_bytes=300)
    for batch in batches:  # one run per transaction
        with db.transaction():
            db.add(*(Item(t=text) for text in batch))
    items = sorted(db[Item].all(), key=lambda item: item.pk)
    for n in removed[: len(items) // 2]:
        victim = items.pop(n % len(items))
        db.remove(victim)
    for item in items[::3]:
        item.t = (item.t or "") + " alpha"
        db.add(item)
    full = [item.pk for item in db[Item].query(Contains("t", query))]
    assert [item.pk for item in db[Item].query(Contains("t", query), limit=k)] == full[:k]
    assert [item.pk for item in db[Item].query(Contains("t", query), skip=2, limit=k)] == (
        full[2 : 2 + k]
    )


def test_a_long_search_result_is_ranked_once(make_db, monkeypatch):
    """Iterating a search of several batches of results pages one ranking (counted first
    or not, limited or not), rather than ranking again for every batch."""
    db = make_db()
    n = 2 * BATCH + 10
    db.add(*(Item(t="alpha " * (1 + i % 5)) for i in range(n)))
    searches = []
    search = Executor._text_reader
    monkeypatch.setattr(
        Executor,
        "_text_reader",
        lambda self, *a, **kw: searches.append(a) or search(self, *a, **kw),
    )
    full = [x.pk for x in db[Item].query(Contains("t", "alpha"))]
    assert len(set(full)) == n and len(searches) == 1
    result = db[Item].query(Contains("t", "alpha"))
    assert len(result) == n and [x.pk for x in result] == full and len(searches) == 2
    page = db[Item].query(Contains("t", "alpha"), skip=3, limit=BATCH + 5)
    assert [x.pk for x in page] == full[3 : BATCH + 8] and len(searches) == 3


NEGATIONS = [
    (Eq("f", 3), NotEq("f", 3)),
    (InRange("f", 2, 4), NotInRange("f", 2, 4)),
    (Any("f", [1, 3]), NotAny("f", [1, 3])),
    (Contains("f", "red fox"), DoesNotContain("f", "red fox")),
]


@pytest.mark.parametrize(("positive", "negative"), NEGATIONS, ids=lambda p: type(p).__name__)
def test_a_negated_operator_is_a_sibling_of_what_it_negates(positive, negative):
    """``isinstance(p, Eq)`` must not hold for a ``NotEq`` (checks in any order dispatch
    right), and on present values each negation decides the opposite of its positive."""
    assert not isinstance(negative, type(positive))
    assert not isinstance(positive, type(negative))
    for value in [1, 2, 3, 4, 5, "the red fox", "a fox"]:
        if isinstance(positive, Contains) != isinstance(value, str):
            continue  # full text decides strings; comparisons decide numbers here
        assert negative.test(value) is not positive.test(value)
    assert not negative.whole_values()
