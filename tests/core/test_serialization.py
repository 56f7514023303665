"""msgpack payloads: every supported value round-trips; anything malformed fails closed."""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import math
import uuid
from collections import OrderedDict
from decimal import Decimal
from zoneinfo import ZoneInfo

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerodb_core.exceptions import IntegrityError, QueryError
from zerodb_core.serialization import (
    EXT_DATE,
    EXT_DATETIME,
    EXT_DECIMAL,
    EXT_TIMEDELTA,
    EXT_TUPLE,
    EXT_UUID,
    pack,
    unpack,
)

offsets = st.timedeltas(
    min_value=dt.timedelta(hours=-23, minutes=-59, seconds=-59, microseconds=-999_999),
    max_value=dt.timedelta(hours=23, minutes=59, seconds=59, microseconds=999_999),
)
zones = st.builds(dt.timezone, offsets)


def scalar_values(decimals: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(st.characters(exclude_categories=())),
        st.binary(),
        st.dates(),
        st.times(),
        st.times(timezones=zones),
        st.datetimes(),
        st.datetimes(timezones=zones),
        st.timedeltas(),
        decimals,
        st.uuids(),
    )


scalars = scalar_values(st.decimals())
# Signalling NaN Decimals cannot be hashed, so they cannot be dict keys.
hashables = st.recursive(
    scalar_values(st.decimals(allow_nan=False)),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=5,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(hashables, inner, max_size=4),
    ),
    max_leaves=12,
)


def same(a, b) -> bool:
    """Equality that also demands equal types, NaN == NaN and the same UTC offset."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        pairs = zip(a.items(), b.items(), strict=True)
        return all(same(ka, kb) and same(va, vb) for (ka, va), (kb, vb) in pairs)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dt.datetime | dt.time):
        return a.utcoffset() == b.utcoffset() and a.replace(tzinfo=None) == b.replace(tzinfo=None)
    return a == b


@settings(max_examples=300, deadline=None)
@given(values)
def test_round_trip(value):
    assert same(unpack(pack(value)), value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_integrity_error(data):
    with contextlib.suppress(IntegrityError):
        unpack(data)


@settings(max_examples=300, deadline=None)
@given(values, st.data())
def test_mutated_payloads_decode_or_raise_integrity_error(value, data):
    payload = bytearray(pack(value))
    index = data.draw(st.integers(0, len(payload) - 1))
    payload[index] = data.draw(st.integers(0, 255))
    with contextlib.suppress(IntegrityError):
        unpack(bytes(payload))


@settings(max_examples=200, deadline=None)
@given(values)
def test_truncated_and_extended_payloads_raise(value):
    payload = pack(value)
    for cut in range(len(payload)):
        with pytest.raises(IntegrityError):
            unpack(payload[:cut])
    with pytest.raises(IntegrityError):
        unpack(payload + b"\xc0")


def test_aware_values_keep_offset_not_zone_name():
    paris = dt.datetime(2021, 7, 1, 12, tzinfo=ZoneInfo("Europe/Paris"))
    back = unpack(pack(paris))
    assert back == paris
    assert back.utcoffset() == dt.timedelta(hours=2)
    assert isinstance(back.tzinfo, dt.timezone)
    assert unpack(pack(dt.datetime(2021, 1, 1, tzinfo=dt.UTC))).tzinfo is dt.UTC
    assert unpack(pack(dt.time(1, tzinfo=dt.timezone(dt.timedelta(hours=-3))))).utcoffset() == (
        dt.timedelta(hours=-3)
    )
    with pytest.raises(QueryError):
        pack(dt.time(1, tzinfo=ZoneInfo("Europe/Paris")))  # offset depends on the date


def test_known_round_trips():
    class Color(enum.IntEnum):
        RED = 3

    class Name(str):
        pass

    record = {
        "name": Name("x"),
        "color": Color.RED,
        1: (1, [2, (3,)]),
        (1, "a"): None,
        "price": Decimal("-0.00"),
        "snan": Decimal("-sNaN12"),
        "inf": Decimal("-Infinity"),
        "big": -(2**200),
        "edge": [2**64 - 1, -(2**63), 2**64, -(2**63) - 1],
        "lone": "\ud800",
        "blob": bytearray(b"\x00\xff"),
        "od": OrderedDict(a=1),
        "max": dt.datetime.max,
        "min": dt.date.min,
        "fold": dt.datetime(2021, 10, 31, 2, 30, fold=1),
        "td": [dt.timedelta.min, dt.timedelta.max],
        "id": uuid.UUID(int=2**128 - 1),
    }
    back = unpack(pack(record))
    assert back == {**record, "blob": b"\x00\xff", "od": {"a": 1}, "snan": back["snan"]}
    assert type(back["name"]) is str
    assert type(back["color"]) is int
    assert type(back["od"]) is dict
    assert str(back["snan"]) == "-sNaN12"
    assert str(back["price"]) == "-0.00"
    assert back["fold"].fold == 1
    assert type(back[1]) is tuple
    assert type(back[1][1]) is list


@pytest.mark.parametrize("value", [object(), {1, 2}, frozenset(), 1j, range(3), [1, {2}]])
def test_unsupported_types_raise_query_error(value):
    with pytest.raises(QueryError, match=r"set|object|complex|range|frozenset"):
        pack(value)


def ext(code: int, payload: bytes) -> bytes:
    return msgpack.packb(msgpack.ExtType(code, payload))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used
        b"\x92\x01",  # array of 2 with 1 element
        b"\x01\x02",  # trailing data
        b"\xdd\xff\xff\xff\xff",  # array claims 4G elements
        b"\xc6\xff\xff\xff\xff",  # bin claims 4 GiB
        b"\xa1\xff",  # invalid UTF-8
        b"\x81\x91\x01\x02",  # list as a map key (unhashable)
        b"\x91" * 5000 + b"\x01",  # nested past msgpack's stack
        b"\xd6\xff\x00\x00\x00\x00",  # msgpack Timestamp (ext -1), top level
        b"\x91\xd6\xff\x00\x00\x00\x00",  # ... in an array
        b"\x81\x01\xd6\xff\x00\x00\x00\x00",  # ... as a map value
        b"\x81\xd6\xff\x00\x00\x00\x00\x01",  # ... as a map key
        ext(99, b""),  # unknown code
        b"\xd4\xfbx",  # ext -5 (negative codes are msgpack-reserved)
        ext(EXT_DATE, b"\x07\xe4\x02\x1e"),  # 2020-02-30
        ext(EXT_DATE, b"\x07\xe4\x01"),  # short
        ext(EXT_DATETIME, b"\x00" * 12),  # year 0
        ext(EXT_DATETIME, b"\x07\xe4\x01\x01\x00\x00\x00\x00\x00\x00\x00\x02"),  # fold 2
        ext(EXT_UUID, b"\x00" * 15),
        ext(EXT_DECIMAL, b"1_000"),  # Decimal() accepts it; not canonical
        ext(EXT_DECIMAL, b" 1"),
        ext(EXT_DECIMAL, b"abc"),
        ext(EXT_DECIMAL, b"\xff"),
        ext(EXT_TIMEDELTA, b"\x00\x00\x00\x00\x00\x01\x51\x80\x00\x00\x00\x00"),  # 86400 s
        ext(EXT_TUPLE, b"\x01"),  # not an array
        ext(EXT_TUPLE, b"\x91"),  # truncated inside
        ext(EXT_TUPLE, b"\x91\x01\x01"),  # trailing inside
        ext(10, b"\x01"),  # big int ext holding a small int
    ],
)
def test_malformed_payloads_raise_integrity_error(data):
    with pytest.raises(IntegrityError):
        unpack(data)


def test_deep_tuple_nesting_is_refused():
    value: tuple = ()
    for _ in range(100):
        value = (value,)
    with pytest.raises(IntegrityError):
        unpack(pack(value))
    shallow: tuple = ()
    for _ in range(30):
        shallow = (shallow,)
    assert unpack(pack(shallow)) == shallow


def test_non_bytes_input_raises_integrity_error():
    with pytest.raises(IntegrityError):
        unpack("abc")  # type: ignore[arg-type]
    assert unpack(bytearray(pack([1]))) == [1]
