"""msgpack payloads of records and index nodes, with ext types for Python's value types.

Never pickle: a payload is data, decoding it runs no code. ``unpack`` fails closed: any
malformed, truncated or over-long input, unknown ext code or invalid ext payload raises
``IntegrityError``, and nothing half-decoded escapes.

Round trip (``unpack(pack(x)) == x``, same types) holds for None, bool, int (any size),
float (NaN included), str (lone surrogates included), bytes, list, tuple, dict (any
hashable keys), date, time, datetime, timedelta, Decimal (exact: digits, exponent,
sign of zero, NaN, infinities) and UUID, nested freely. What changes:

* ``bytearray``/``memoryview`` come back as ``bytes``; subclasses of ``int``, ``float``,
  ``str``, ``bytes``, ``list``, ``dict`` (enums, Django's ``SafeString``, ``OrderedDict``)
  come back as the base type.
* Aware ``datetime``/``time`` keep their UTC offset as a fixed-offset ``timezone``; zone
  *names* (``zoneinfo.ZoneInfo("Europe/Paris")``) are not kept. An aware ``time`` whose
  zone cannot give an offset without a date raises ``QueryError``.
* Tuples stay tuples (ext type ``TUPLE``); lists stay lists.

Ext codes (stable: they are on disk): 1 naive datetime, 2 aware datetime, 3 date,
4 naive time, 5 aware time, 6 timedelta, 7 Decimal, 8 UUID, 9 tuple, 10 big int.
"""

from __future__ import annotations

import datetime as _dt
import struct
import threading
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgpack

from zerodb_core.exceptions import IntegrityError, QueryError

__all__ = ["pack", "unpack"]

EXT_DATETIME = 1
EXT_DATETIME_AWARE = 2
EXT_DATE = 3
EXT_TIME = 4
EXT_TIME_AWARE = 5
EXT_TIMEDELTA = 6
EXT_DECIMAL = 7
EXT_UUID = 8
EXT_TUPLE = 9
EXT_BIGINT = 10

# Tuples nest through ext payloads (each one a nested unpack); bound that recursion.
# msgpack itself bounds array/map nesting (its C stack) and packing depth.
MAX_TUPLE_DEPTH = 64
# A Decimal longer than this is not a value anyone stores; refuse to parse it.
MAX_DECIMAL_CHARS = 4096

_DATETIME = struct.Struct(">HBBBBBIB")  # year month day hour minute second micro fold
_OFFSET = struct.Struct(">q")  # UTC offset in microseconds
_DATE = struct.Struct(">HBB")
_TIME = struct.Struct(">BBBIB")  # hour minute second micro fold
_TIMEDELTA = struct.Struct(">iII")  # days seconds microseconds

_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1

_UTC = _dt.UTC


def _offset_us(offset: _dt.timedelta) -> int:
    return (offset.days * 86_400 + offset.seconds) * 1_000_000 + offset.microseconds


def _zone(offset_us: int) -> _dt.timezone:
    if offset_us == 0:
        return _UTC
    return _dt.timezone(_dt.timedelta(microseconds=offset_us))


class _BigInt:
    """An int outside msgpack's 64-bit range, marked for the BIGINT ext type."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


# --------------------------------------------------------------------------- pack


def _bigint_ext(value: int) -> msgpack.ExtType:
    length = (value.bit_length() + 8) // 8  # room for the sign bit
    return msgpack.ExtType(EXT_BIGINT, value.to_bytes(length, "big", signed=True))


def _default(obj: Any) -> Any:
    """Turn one object msgpack cannot pack natively into an ``ExtType`` (or a base type)."""
    cls = type(obj)
    if cls is _dt.datetime or isinstance(obj, _dt.datetime):
        head = _DATETIME.pack(
            obj.year, obj.month, obj.day, obj.hour, obj.minute, obj.second, obj.microsecond,
            obj.fold,
        )  # fmt: skip
        offset = obj.utcoffset()
        if offset is None:
            return msgpack.ExtType(EXT_DATETIME, head)
        return msgpack.ExtType(EXT_DATETIME_AWARE, head + _OFFSET.pack(_offset_us(offset)))
    if cls is Decimal or isinstance(obj, Decimal):
        return msgpack.ExtType(EXT_DECIMAL, str(obj).encode("ascii"))
    if cls is _dt.date or isinstance(obj, _dt.date):
        return msgpack.ExtType(EXT_DATE, _DATE.pack(obj.year, obj.month, obj.day))
    if cls is uuid.UUID or isinstance(obj, uuid.UUID):
        return msgpack.ExtType(EXT_UUID, obj.bytes)
    if cls is tuple or isinstance(obj, tuple):
        return msgpack.ExtType(EXT_TUPLE, _packer().pack(list(obj)))
    if cls is _dt.time or isinstance(obj, _dt.time):
        head = _TIME.pack(obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold)
        if obj.tzinfo is None:
            return msgpack.ExtType(EXT_TIME, head)
        offset = obj.utcoffset()
        if offset is None:
            raise QueryError(f"time {obj!r} has a zone with no fixed UTC offset")
        return msgpack.ExtType(EXT_TIME_AWARE, head + _OFFSET.pack(_offset_us(offset)))
    if cls is _dt.timedelta or isinstance(obj, _dt.timedelta):
        return msgpack.ExtType(
            EXT_TIMEDELTA, _TIMEDELTA.pack(obj.days, obj.seconds, obj.microseconds)
        )
    if cls is _BigInt:
        return _bigint_ext(obj.value)
    # strict_types sends subclasses of native types here: pack them as their base type.
    if isinstance(obj, int):  # bool cannot be subclassed; IntEnum and friends land here
        value = int(obj)
        return value if _INT_MIN <= value <= _INT_MAX else _bigint_ext(value)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, bytes):
        return bytes(obj)
    if isinstance(obj, list):
        return list(obj)
    if isinstance(obj, dict):
        return dict(obj)
    raise QueryError(f"values of type {cls.__qualname__} cannot be stored")


def _packer() -> msgpack.Packer:
    # strict_types: tuples and subclasses reach _default instead of being packed as lists
    # and base types silently. A Packer is cheap; a fresh one per call is re-entrant.
    return msgpack.Packer(
        default=_default,
        use_bin_type=True,
        strict_types=True,
        datetime=False,
        unicode_errors="surrogatepass",
    )


def _bigints(obj: Any) -> Any:
    """Return ``obj`` with every int outside 64 bits wrapped in ``_BigInt`` (slow path)."""
    cls = type(obj)
    if cls is int:
        return obj if _INT_MIN <= obj <= _INT_MAX else _BigInt(obj)
    if cls is list:
        return [_bigints(item) for item in obj]
    if cls is tuple:
        return tuple(_bigints(item) for item in obj)
    if cls is dict:
        return {_bigints(key): _bigints(value) for key, value in obj.items()}
    return obj


_local = threading.local()


def pack(obj: Any) -> bytes:
    """Return the msgpack bytes of ``obj``; raise ``QueryError`` for an unsupported type."""
    # One packer per thread: building a Packer costs more than packing a small value.
    # Nested values packed from ``_default`` use a fresh one, so reuse is re-entrant.
    try:
        packer: msgpack.Packer = _local.packer
    except AttributeError:
        packer = _local.packer = _packer()
    try:
        try:
            return packer.pack(obj)
        except OverflowError:
            # An int beyond 64 bits somewhere: msgpack refuses it before calling _default.
            return _packer().pack(_bigints(obj))
    except QueryError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise QueryError(f"cannot store value: {exc}") from None


# --------------------------------------------------------------------------- unpack


def _ext_decoder(depth: int) -> Callable[[int, bytes], Any]:
    def ext_hook(code: int, data: bytes) -> Any:
        if code == EXT_TUPLE:
            if depth >= MAX_TUPLE_DEPTH:
                raise IntegrityError("tuples nested too deep")
            value = _unpack(data, depth + 1)
            if type(value) is not list:
                raise IntegrityError("tuple ext does not hold an array")
            return tuple(value)
        decode = _EXT_DECODERS.get(code)
        if decode is None:
            raise IntegrityError(f"unknown ext type {code}")
        return decode(data)

    return ext_hook


def _decode_datetime(data: bytes) -> _dt.datetime:
    *fields, fold = _DATETIME.unpack(data)
    return _dt.datetime(*fields, fold=fold)


def _decode_datetime_aware(data: bytes) -> _dt.datetime:
    year, month, day, hour, minute, second, micro, fold = _DATETIME.unpack(data[: _DATETIME.size])
    (offset,) = _OFFSET.unpack(data[_DATETIME.size :])
    zone = _zone(offset)
    return _dt.datetime(year, month, day, hour, minute, second, micro, zone, fold=fold)


def _decode_time(data: bytes) -> _dt.time:
    *fields, fold = _TIME.unpack(data)
    return _dt.time(*fields, fold=fold)


def _decode_time_aware(data: bytes) -> _dt.time:
    hour, minute, second, micro, fold = _TIME.unpack(data[: _TIME.size])
    (offset,) = _OFFSET.unpack(data[_TIME.size :])
    return _dt.time(hour, minute, second, micro, _zone(offset), fold=fold)


def _decode_timedelta(data: bytes) -> _dt.timedelta:
    days, seconds, microseconds = _TIMEDELTA.unpack(data)
    # timedelta() would silently normalise out-of-range parts: accept canonical ones only.
    if seconds >= 86_400 or microseconds >= 1_000_000:
        raise IntegrityError("timedelta ext out of range")
    return _dt.timedelta(days, seconds, microseconds)


def _decode_decimal(data: bytes) -> Decimal:
    if len(data) > MAX_DECIMAL_CHARS:
        raise IntegrityError("Decimal ext too long")
    text = data.decode("ascii")
    value = Decimal(text)
    # Decimal() also accepts spaces, '_' and other spellings; pack writes str(value) only.
    if str(value) != text:
        raise IntegrityError("Decimal ext not canonical")
    return value


def _decode_uuid(data: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=data)  # ValueError unless exactly 16 bytes


def _decode_bigint(data: bytes) -> int:
    value = int.from_bytes(data, "big", signed=True)
    if _INT_MIN <= value <= _INT_MAX:
        raise IntegrityError("big int ext holds a 64-bit int")
    return value


_EXT_DECODERS: dict[int, Callable[[bytes], Any]] = {
    EXT_DATETIME: _decode_datetime,
    EXT_DATETIME_AWARE: _decode_datetime_aware,
    EXT_DATE: lambda data: _dt.date(*_DATE.unpack(data)),
    EXT_TIME: _decode_time,
    EXT_TIME_AWARE: _decode_time_aware,
    EXT_TIMEDELTA: _decode_timedelta,
    EXT_DECIMAL: _decode_decimal,
    EXT_UUID: _decode_uuid,
    EXT_BIGINT: _decode_bigint,
}  # EXT_TUPLE is decoded in ext_hook: it needs the nesting depth.
_HOOKS = [_ext_decoder(depth) for depth in range(MAX_TUPLE_DEPTH + 1)]

# msgpack decodes ext type -1 (its Timestamp) itself, without calling ext_hook, so the
# containers are checked for it as they are built. A Timestamp needs the byte 0xFF (its
# type code); ``255 in data`` is a memchr, so payloads without that byte skip the hooks.
_TIMESTAMP = msgpack.Timestamp


def _check_list(items: list[Any]) -> list[Any]:
    if _TIMESTAMP in map(type, items):
        raise IntegrityError("unknown ext type -1")
    return items


def _check_map(mapping: dict[Any, Any]) -> dict[Any, Any]:
    if _TIMESTAMP in map(type, mapping.values()) or _TIMESTAMP in map(type, mapping):
        raise IntegrityError("unknown ext type -1")
    return mapping


def _unpack(data: bytes, depth: int) -> Any:
    size = len(data)
    checked = 255 in data
    value = msgpack.unpackb(
        data,
        ext_hook=_HOOKS[depth],
        list_hook=_check_list if checked else None,
        object_hook=_check_map if checked else None,
        raw=False,
        strict_map_key=False,
        unicode_errors="surrogatepass",
        # No length can exceed the input: a claimed longer one is malformed, and these
        # limits stop msgpack from pre-allocating for it.
        max_str_len=size,
        max_bin_len=size,
        max_array_len=size,
        max_map_len=size,
        max_ext_len=size,
    )
    if type(value) is _TIMESTAMP:
        raise IntegrityError("unknown ext type -1")
    return value


def unpack(data: bytes) -> Any:
    """Return the value packed in ``data``; raise ``IntegrityError`` if it does not decode.

    Whatever goes wrong inside the decoder (msgpack's errors, a bad ext payload, a
    non-hashable map key, trailing bytes) is an integrity failure: the payload came from
    an authenticated blob, so it is corrupt or written by something else.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise IntegrityError(f"payload must be bytes, not {type(data).__qualname__}")
    if not data:
        raise IntegrityError("empty payload")
    try:
        return _unpack(bytes(data), 0)
    except IntegrityError:
        raise
    except Exception as exc:  # fail closed, see docstring
        raise IntegrityError(f"payload does not decode: {type(exc).__name__}") from None
