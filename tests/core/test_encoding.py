"""Key encoding: byte order must equal value order, and equal values must give equal keys."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from decimal import Decimal
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerodb_core.encoding import MAX_KEY, MIN_KEY, encode_key, encode_tuple, key_after
from zerodb_core.exceptions import QueryError

# --------------------------------------------------------------------------- strategies

# Decimals compare with floats exactly; keep exponents moderate so hypothesis stays fast.
decimals = st.decimals(allow_nan=False, allow_infinity=True, min_value=None, places=None).filter(
    lambda d: not d.is_finite() or -400 < d.adjusted() < 400
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False),
    decimals,
    st.sampled_from([0, -0.0, 1, 1.0, Decimal("1.00"), 10**30, 1e30, -1, Decimal("-0")]),
)
texts = st.text(st.characters(exclude_categories=()), max_size=12) | st.sampled_from(
    [
        "",
        "\x00",
        "\x00\xff",
        "\x01",
        "\x01\x02",
        "a",
        "a\x00",
        "a\x01",
        "\ud800",
        "\udfff",
        "\ue000",
    ]
)
blobs = st.binary(max_size=12) | st.sampled_from([b"", b"\x00", b"\x00\xff", b"\x01", b"\xff"])
offsets = st.timedeltas(
    min_value=dt.timedelta(hours=-23, minutes=-59), max_value=dt.timedelta(hours=23, minutes=59)
)
aware = st.datetimes(timezones=st.builds(dt.timezone, offsets))
same_type = {
    "number": numbers,
    "str": texts,
    "bytes": blobs,
    "date": st.dates(),
    "naive datetime": st.datetimes(),
    "aware datetime": aware,
    "time": st.times(),
    "timedelta": st.timedeltas(),
    "uuid": st.uuids(),
    "bool": st.booleans(),
}
scalars = st.one_of(st.none(), *same_type.values())
values = st.recursive(
    scalars, lambda inner: st.tuples(inner) | st.lists(inner, max_size=3).map(tuple), max_leaves=6
)


def model(value):
    """A plain-Python sort key implementing the documented cross-type order."""
    if value is None:
        return (0,)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, int | float | Decimal):
        return (2, value)
    if isinstance(value, str):
        return (3, value)
    if isinstance(value, bytes):
        return (4, value)
    if isinstance(value, dt.datetime):
        return (7, value) if value.utcoffset() is not None else (6, value)
    if isinstance(value, dt.date):
        return (5, value)
    if isinstance(value, dt.time):
        return (8, value)
    if isinstance(value, dt.timedelta):
        return (9, value)
    if isinstance(value, uuid.UUID):
        return (10, value)
    assert isinstance(value, tuple)
    return (11, tuple(model(item) for item in value))


def check_order(a, b, ka, kb):
    assert (ka < kb) == (a < b), (a, b, ka, kb)
    assert (ka == kb) == (a == b), (a, b, ka, kb)


# --------------------------------------------------------------------------- properties


@pytest.mark.parametrize("kind", sorted(same_type))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_same_type_order_matches_value_order(kind, data):
    items = data.draw(st.lists(same_type[kind], min_size=2, max_size=6))
    keys = [encode_key(item) for item in items]
    for a, ka in zip(items, keys, strict=True):
        for b, kb in zip(items, keys, strict=True):
            check_order(a, b, ka, kb)
    assert [encode_key(v) for v in sorted(items)] == sorted(keys)


@settings(max_examples=200, deadline=None)
@given(numbers, numbers)
def test_mixed_numbers_share_one_order(a, b):
    check_order(a, b, encode_key(a), encode_key(b))


@settings(max_examples=200, deadline=None)
@given(st.lists(values, max_size=4).map(tuple), st.lists(values, max_size=4).map(tuple))
def test_tuples_order_element_wise(a, b):
    ma, mb = model(a)[1], model(b)[1]
    check_order(ma, mb, encode_tuple(a), encode_tuple(b))
    check_order(ma, mb, encode_key(a), encode_key(b))


@settings(max_examples=200, deadline=None)
@given(values, values)
def test_any_values_follow_the_cross_type_order(a, b):
    check_order(model(a), model(b), encode_key(a), encode_key(b))


@settings(max_examples=200, deadline=None)
@given(values, values)
def test_encodings_are_prefix_free(a, b):
    ka, kb = encode_key(a), encode_key(b)
    if ka != kb:
        assert not kb.startswith(ka)


@settings(max_examples=200, deadline=None)
@given(values, values, values, st.booleans())
def test_key_after_bounds_exactly_the_entries_of_one_value(v, other, pk, same):
    w = v if same else other
    prefix = encode_key(v)
    entry = encode_tuple((w, pk))
    inside = prefix <= entry < key_after(prefix)
    assert inside == (model(v) == model(w))


@settings(max_examples=200, deadline=None)
@given(texts, texts)
def test_str_key_without_terminator_is_a_startswith_prefix(prefix, s):
    assert encode_key(s).startswith(encode_key(prefix)[:-1]) == s.startswith(prefix)


@settings(max_examples=200, deadline=None)
@given(aware, offsets)
def test_aware_datetimes_compare_as_instants(value, offset):
    shifted = (
        value.astimezone(dt.timezone(offset)) if dt.MINYEAR < value.year < dt.MAXYEAR else value
    )
    assert encode_key(shifted) == encode_key(value)


# --------------------------------------------------------------------------- known cases


def test_cross_type_order():
    ordered = [
        None,
        False,
        True,
        float("-inf"),
        -(10**100),
        -1.5,
        0,
        Decimal("1e-30"),
        10**100,
        float("inf"),
        float("nan"),
        "",
        "z",
        b"",
        dt.date(2020, 1, 1),
        dt.datetime(1, 1, 1),
        dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        dt.time(0),
        dt.timedelta(-1),
        uuid.UUID(int=0),
        (),
        (None,),
    ]
    keys = [encode_key(v) for v in ordered]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)


@pytest.mark.parametrize(
    "a, b",
    [
        (0, -0.0),
        (0, Decimal("-0.000")),
        (0, Decimal("0E+10")),
        (1, 1.0),
        (1, Decimal("1.00")),
        (Decimal("1.10"), Decimal("1.1")),
        (10**30, Decimal("1E+30")),
        (0.5, Decimal("0.5")),
        (Decimal.from_float(0.1), 0.1),
        (float("nan"), Decimal("NaN")),
        (Decimal("sNaN"), Decimal("-NaN")),
        (float("inf"), Decimal("Infinity")),
        (
            dt.datetime(2020, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            dt.datetime(2020, 1, 1, 10, tzinfo=dt.UTC),
        ),
    ],
)
def test_equal_values_encode_identically(a, b):
    assert encode_key(a) == encode_key(b)


def test_float_1e30_is_not_10_to_the_30():
    # 1e30 is 1000000000000000019884624838656 exactly.
    assert int(1e30) > 10**30
    assert encode_key(10**30) < encode_key(1e30) < encode_key(10**30 + 2 * 10**13)
    assert encode_key(Decimal.from_float(1e30)) == encode_key(1e30)


def test_nul_bytes_in_strings_sort_correctly():
    items = ["", "\x00", "\x00\x00", "\x00\xff", "\x01", "\x01\x00", "a", "a\x00", "a\x00b", "ab"]
    assert sorted(items) == items
    keys = [encode_key(s) for s in items]
    assert keys == sorted(keys)
    assert encode_key("a\x00") == b"\x20a\x01\x01\x00"


def test_surrogates_keep_code_point_order():
    items = ["\ud7ff", "\ud800", "\udbff\udc00", "\udfff", "\ue000", "\U00010000"]
    assert [encode_key(s) for s in items] == sorted(encode_key(s) for s in items)


def test_composite_prefix_sorts_first():
    assert encode_tuple(("a",)) < encode_tuple(("a", None)) < encode_tuple(("a", 0))
    assert encode_key(("a",)) < encode_key(("a", None)) < encode_key(("b",))
    assert encode_tuple(()) == MIN_KEY


def test_subclasses_encode_as_their_base_type():
    class Color(enum.IntEnum):
        RED = 3

    class Name(str):
        pass

    assert encode_key(Color.RED) == encode_key(3)
    assert encode_key(Name("x")) == encode_key("x")
    assert encode_key(bytearray(b"x")) == encode_key(b"x")


def test_huge_ints_beyond_str_limit():
    big = 10**5000 + 1
    assert encode_key(big - 1) < encode_key(big) < encode_key(big + 1)
    assert encode_key(-big) < encode_key(-big + 1)


def test_key_after():
    assert key_after(b"a") == b"b"
    assert key_after(b"a\xff\xff") == b"b"
    assert encode_key(10**99) < MAX_KEY
    with pytest.raises(QueryError):
        key_after(b"")
    with pytest.raises(QueryError):
        key_after(b"\xff")


@pytest.mark.parametrize(
    "value",
    [[1], {1: 2}, {1}, object(), 1j, dt.time(1, tzinfo=dt.UTC), Decimal("1e3000000000")],
)
def test_unsupported_values_raise_query_error(value):
    with pytest.raises(QueryError):
        encode_key(value)


def test_unsupported_type_is_named():
    with pytest.raises(QueryError, match="set"):
        encode_key({1})
    with pytest.raises(QueryError, match="list"):
        encode_tuple((1, [2]))


def test_keys_are_sorted_in_a_list():
    items = [3, -2.5, Decimal("7.25"), 0, 10**20, -(10**20)]
    assert [encode_key(v) for v in sorted(items)] == sorted(map(encode_key, items))
    assert all(a < b for a, b in pairwise(sorted(map(encode_key, items))))
