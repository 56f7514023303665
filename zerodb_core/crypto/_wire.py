"""Byte encodings shared by the blob and keyring formats.

Associated data is a concatenation of several strings; each one is length-prefixed so
that no two different (tenant, database, name) tuples can encode to the same bytes
("ab" + "c" must not equal "a" + "bc").
"""

from __future__ import annotations

import struct

_U16 = struct.Struct(">H")


def length_prefixed(*parts: str) -> bytes:
    """Return each part as a big-endian u16 byte length followed by its UTF-8 bytes."""
    out = bytearray()
    for part in parts:
        if not isinstance(part, str):
            raise TypeError(f"expected str, got {type(part).__name__}")
        raw = part.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise ValueError("string too long for the associated data (max 65535 bytes)")
        out += _U16.pack(len(raw))
        out += raw
    return bytes(out)
