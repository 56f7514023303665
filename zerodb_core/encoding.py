"""Order-preserving encoding of typed values into ``bytes`` keys.

The B+tree compares plain ``bytes``, so every index key is the encoding of a value (or a
tuple of values) whose byte order equals the value order. FoundationDB's tuple layer is
the model: each value becomes a one-byte type tag followed by a body, and every element
encoding is *strictly prefix-free* (no encoding is a prefix of another), so concatenating
them (``encode_tuple``) orders by the first differing element, and a shorter tuple sorts
before its extensions.

Cross-type order (ours; Python has none), by tag::

    None < False < True < numbers (-inf < negatives < 0 < positives < +inf < NaN)
         < str < bytes < date < naive datetime < aware datetime < time < timedelta
         < UUID < nested tuple

Numbers (``int``, ``float``, ``Decimal``) share one order and equal numbers encode
identically (``1 == 1.0 == Decimal("1.00")``, ``-0.0 == 0``), because an index scan and a
Python comparison must agree. ``bool`` is *not* a number here (``True`` sorts before every
number). All NaNs encode alike and sort after ``+inf``.

Strings and bytes escape ``0x00`` as ``01 01`` and ``0x01`` as ``01 02`` and end with
``0x00``. (FoundationDB escapes ``0x00`` as ``00 FF`` instead, which makes ``"a"`` a byte
prefix of ``"a\\x00"``; then ``key_after(encode_key("a"))`` would also cover ``"a\\x00"``.
Our escape keeps every encoding strictly prefix-free, so ``[k, key_after(k))`` with
``k = encode_key(v)`` holds exactly the keys of tuples that start with ``v``, and dropping
the final terminator of a str key gives the prefix of every string that starts with it.)

There is no decoder: keys are one-way; payloads carry the values themselves.
"""

from __future__ import annotations

import datetime as _dt
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from zerodb_core.exceptions import QueryError

__all__ = ["MAX_KEY", "MIN_KEY", "encode_key", "encode_tuple", "key_after"]

# Type tags. 0x00 is reserved for terminators (nested tuples, str, bytes, numbers), so every
# tag is >= 0x01 and a terminator sorts before any following element. No tag is 0xFF.
NONE = 0x01
FALSE = 0x02
TRUE = 0x03
NUM_NEG_INF = 0x10
NUM_NEG = 0x11
NUM_ZERO = 0x12
NUM_POS = 0x13
NUM_POS_INF = 0x14
NUM_NAN = 0x15
STR = 0x20
BYTES = 0x21
DATE = 0x30
DATETIME = 0x31
DATETIME_AWARE = 0x32
TIME = 0x33
TIMEDELTA = 0x34
UUID = 0x40
TUPLE = 0x50

MIN_KEY = b""
# Greater than every encoded key (no tag is 0xFF); an open upper bound for scans.
MAX_KEY = b"\xff"

_NONE_KEY = bytes([NONE])
_FALSE_KEY = bytes([FALSE])
_TRUE_KEY = bytes([TRUE])
_ZERO_KEY = bytes([NUM_ZERO])
_POS_INF_KEY = bytes([NUM_POS_INF])
_NEG_INF_KEY = bytes([NUM_NEG_INF])
_NAN_KEY = bytes([NUM_NAN])
_POS = bytes([NUM_POS])
_NEG = bytes([NUM_NEG])
_STR = bytes([STR])
_BYTES = bytes([BYTES])
_TUPLE = bytes([TUPLE])

# Exponent of a number written 0.d1d2d3... x 10**E, stored as E + bias in 4 bytes.
_EXP_BIAS = 1 << 31
_EXP_MIN = -_EXP_BIAS
_EXP_MAX = (1 << 32) - 1 - _EXP_BIAS
_pack_u32 = struct.Struct(">I").pack
_pack_u64 = struct.Struct(">Q").pack
_U64_BIAS = 1 << 63

# Mantissa digits go two per byte as value + 1 (1..100), so 0x00 stays free for the
# terminator. bytes.fromhex reads a digit pair "ab" as 0xab; _PAIR maps it to ab + 1, and
# maps the pair "ff" (appended to the digits) to the 0x00 terminator, so one fromhex and one
# translate make the whole mantissa. A negative number is its magnitude's encoding with
# every byte inverted: _PAIR_NEG does both steps at once.
_PAIR_TABLE = bytearray(256)
for _hi in range(10):
    for _lo in range(10):
        _PAIR_TABLE[_hi * 16 + _lo] = _hi * 10 + _lo + 1
_PAIR = bytes(_PAIR_TABLE)
_PAIR_NEG = bytes(255 - b for b in _PAIR)
_INVERT = bytes(255 - i for i in range(256))
# Tag and exponent bytes of small positive exponents (numbers in [0.1, 10**40)).
_POS_HEAD = [_POS + _pack_u32(e + _EXP_BIAS) for e in range(41)]
_NEG_HEAD = [_NEG + _pack_u32(e + _EXP_BIAS).translate(_INVERT) for e in range(41)]

# datetime.toordinal() of 0001-01-01 is 1.
_US_PER_DAY = 86_400_000_000
_TIMEDELTA_BIAS = 1 << 79  # 10 bytes: |timedelta.max| is about 8.64e22 microseconds
_INF = float("inf")
_NEG_INF = float("-inf")


def _number(negative: bool, digits: str, exponent: int) -> bytes:
    """Return the key of the nonzero number -/+ 0.<digits> x 10**exponent.

    ``digits`` has no leading zero; trailing zeros are stripped here so that equal values
    (1, 1.0, Decimal("1.00")) give equal bytes.
    """
    digits = digits.rstrip("0")
    digits += "0ff" if len(digits) & 1 else "ff"
    if 0 <= exponent <= 40:
        head = _NEG_HEAD[exponent] if negative else _POS_HEAD[exponent]
    elif _EXP_MIN <= exponent <= _EXP_MAX:
        head = _pack_u32(exponent + _EXP_BIAS)
        head = _NEG + head.translate(_INVERT) if negative else _POS + head
    else:
        raise QueryError(f"number with decimal exponent {exponent} is out of the key range")
    return head + bytes.fromhex(digits).translate(_PAIR_NEG if negative else _PAIR)


def _encode_int(value: int) -> bytes:
    if value > 0:
        try:
            s = str(value)
        except ValueError:  # beyond sys.get_int_max_str_digits(): exact, just slower
            return _encode_decimal(Decimal(value))
        n = len(s)
        if n <= 40:  # inline fast path of _number
            s = s.rstrip("0")
            return _POS_HEAD[n] + bytes.fromhex(s + "0ff" if len(s) & 1 else s + "ff").translate(
                _PAIR
            )
        return _number(False, s, n)
    if value == 0:
        return _ZERO_KEY
    try:
        s = str(-value)
    except ValueError:
        return _encode_decimal(Decimal(value))
    return _number(True, s, len(s))


def _encode_float(value: float) -> bytes:
    if value == 0.0:
        return _ZERO_KEY  # -0.0 == 0
    if value != value:
        return _NAN_KEY
    if value == _INF:
        return _POS_INF_KEY
    if value == _NEG_INF:
        return _NEG_INF_KEY
    # Exact: value = n / 2**k = n * 5**k / 10**k. No Decimal, no rounding.
    n, d = value.as_integer_ratio()
    negative = n < 0
    if negative:
        n = -n
    if d == 1:
        s = str(n)
        return _number(negative, s, len(s))
    k = d.bit_length() - 1
    s = str(n * 5**k)
    return _number(negative, s, len(s) - k)


def _encode_decimal(value: Decimal) -> bytes:
    sign, digit_tuple, exponent = value.as_tuple()
    if exponent == "F":
        return _NEG_INF_KEY if sign else _POS_INF_KEY
    if isinstance(exponent, str):  # "n", "N": quiet and signalling NaN
        return _NAN_KEY
    s = "".join(map(str, digit_tuple)).lstrip("0")
    if not s:
        return _ZERO_KEY  # 0, -0, 0E+5, 0.000
    return _number(bool(sign), s, len(s) + exponent)


def _escape(raw: bytes) -> bytes:
    # ``int in bytes`` is a memchr; ``b"\x01" in bytes`` is several times slower.
    if 1 in raw:
        raw = raw.replace(b"\x01", b"\x01\x02")
    if 0 in raw:
        raw = raw.replace(b"\x00", b"\x01\x01")
    return raw


def _encode_str(value: str) -> bytes:
    # UTF-8 byte order is code point order, as is Python's str order; 'surrogatepass' keeps
    # lone surrogates (U+D800..U+DFFF) encodable and in their code point place.
    raw = value.encode("utf-8", "surrogatepass")
    if 1 in raw or 0 in raw:
        raw = _escape(raw)
    return _STR + raw + b"\x00"


def _encode_bytes(value: bytes) -> bytes:
    return _BYTES + _escape(bytes(value)) + b"\x00"


def _datetime_us(value: _dt.datetime) -> int:
    """Return microseconds since 0001-01-01 00:00 of the wall-clock fields."""
    return (
        (value.toordinal() - 1) * _US_PER_DAY
        + ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
        + value.microsecond
    )


def _timedelta_us(value: _dt.timedelta) -> int:
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def _encode_date(value: _dt.date) -> bytes:
    return bytes([DATE]) + _pack_u32(value.toordinal())


def _encode_datetime(value: _dt.datetime) -> bytes:
    offset = value.utcoffset()
    if offset is None:
        return bytes([DATETIME]) + _pack_u64(_datetime_us(value) + _U64_BIAS)
    # The instant in UTC, computed without astimezone() so 0001-01-01+01:00 cannot overflow;
    # the bias keeps the layout the same as naive datetimes (and allows slightly negative).
    us = _datetime_us(value) - _timedelta_us(offset)
    return bytes([DATETIME_AWARE]) + _pack_u64(us + _U64_BIAS)


def _encode_time(value: _dt.time) -> bytes:
    if value.tzinfo is not None:
        raise QueryError("aware time values cannot be index keys (their order needs a date)")
    us = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    return bytes([TIME]) + _pack_u64(us)


def _encode_timedelta(value: _dt.timedelta) -> bytes:
    return bytes([TIMEDELTA]) + (_timedelta_us(value) + _TIMEDELTA_BIAS).to_bytes(10, "big")


def _encode_uuid(value: uuid.UUID) -> bytes:
    return bytes([UUID]) + value.bytes


def _encode_nested(value: tuple[Any, ...]) -> bytes:
    # Every element starts with a tag >= 0x01, so the 0x00 terminator puts a tuple before
    # its extensions.
    return _TUPLE + b"".join(map(encode_key, value)) + b"\x00"


# The encoders take Any: each is looked up by the value's type, which is what it accepts.
_Encoder = Callable[[Any], bytes]

_ENCODERS: dict[type, _Encoder] = {
    type(None): lambda value: _NONE_KEY,
    bool: lambda value: _TRUE_KEY if value else _FALSE_KEY,
    int: _encode_int,
    str: _encode_str,
    float: _encode_float,
    Decimal: _encode_decimal,
    bytes: _encode_bytes,
    bytearray: _encode_bytes,
    memoryview: _encode_bytes,
    _dt.date: _encode_date,
    _dt.datetime: _encode_datetime,
    _dt.time: _encode_time,
    _dt.timedelta: _encode_timedelta,
    uuid.UUID: _encode_uuid,
    tuple: _encode_nested,
}

# For subclasses (IntEnum, str subclasses, ...): checked in order, datetime before date.
_SUBCLASS_ORDER: tuple[tuple[type | tuple[type, ...], _Encoder], ...] = (
    (int, _encode_int),
    (float, _encode_float),
    (Decimal, _encode_decimal),
    (str, _encode_str),
    ((bytes, bytearray, memoryview), _encode_bytes),
    (_dt.datetime, _encode_datetime),
    (_dt.date, _encode_date),
    (_dt.time, _encode_time),
    (_dt.timedelta, _encode_timedelta),
    (uuid.UUID, _encode_uuid),
    (tuple, _encode_nested),
)


def encode_key(value: Any) -> bytes:
    """Return the order-preserving, prefix-free encoding of one value.

    Raise ``QueryError`` (naming the type) for a value with no key order.
    """
    encoder = _ENCODERS.get(type(value))
    if encoder is not None:
        return encoder(value)
    for cls, encoder in _SUBCLASS_ORDER:
        if isinstance(value, cls):
            return encoder(value)
    raise QueryError(f"values of type {type(value).__qualname__} cannot be index keys")


def encode_tuple(values: tuple[Any, ...]) -> bytes:
    """Return the key of a composite value: the concatenation of its element encodings.

    A tuple's key is a byte prefix of the keys of its extensions, and sorts before them.
    """
    return b"".join(map(encode_key, values))


def key_after(prefix: bytes) -> bytes:
    """Return the smallest key greater than every key that starts with ``prefix``.

    ``[k, key_after(k))`` is the half-open range of keys starting with ``k``: with
    ``k = encode_key(v)`` (or ``encode_tuple``), exactly the entries whose leading value(s)
    equal ``v``. Raise ``QueryError`` for a prefix with no successor (empty or all 0xFF);
    use ``MAX_KEY`` or an open bound there.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise QueryError("no key follows every key with this prefix")
    return stripped[:-1] + bytes([stripped[-1] + 1])
