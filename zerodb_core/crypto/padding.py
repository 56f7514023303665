"""Padding payloads to size classes before encryption.

The server sees blob sizes; padding makes it see a size class instead of an exact
length. Classes are the powers of two from 256 bytes to 16 KiB (256, 512, ..., 16384),
then every multiple of 16 KiB (32768, 49152, ...): fine steps where a rounded size
would waste a lot relative to the payload, coarse ones where a 16 KiB step costs at
most 50% and usually far less.

The padding is ISO/IEC 7816-4, byte for byte what libsodium's ``sodium_pad`` writes: a
0x80 byte then zeros, so it is unambiguous. It always adds at least one byte, so a
payload of exactly a class size moves up one class; B+tree nodes should aim for at most
``class - 1`` bytes of payload.

It is implemented here rather than by calling ``sodium_pad``/``sodium_unpad``: those are
constant-time loops over the whole block, which for a large size class cost more than
the encryption itself. Constant time buys nothing here: ``unpad`` only ever
sees plaintext whose tag has already verified (no padding oracle), and the payload
length is in any case visible to timing through its encoding. The tests check that the
output equals libsodium's.
"""

from __future__ import annotations

from zerodb_core.exceptions import IntegrityError

MIN_CLASS = 256
STEP = 16 * 1024


def padded_size(length: int) -> int:
    """Return the size class a payload of ``length`` bytes is padded to."""
    needed = length + 1  # the 0x80 marker
    if needed <= STEP:
        return max(MIN_CLASS, 1 << (needed - 1).bit_length())
    return -(-needed // STEP) * STEP


def is_size_class(size: int) -> bool:
    """Return whether ``size`` is one of the size classes."""
    if size < MIN_CLASS:
        return False
    if size <= STEP:
        return size & (size - 1) == 0
    return size % STEP == 0


def pad(payload: bytes) -> bytes:
    """Return ``payload`` padded to its size class."""
    length = len(payload)
    return b"".join((payload, b"\x80", bytes(padded_size(length) - length - 1)))


def unpad(padded: bytes) -> bytes:
    """Strip the padding; raise ``IntegrityError`` unless it is well formed and canonical."""
    size = len(padded)
    if not is_size_class(size):
        raise IntegrityError("padded payload is not a size class")
    # The marker is the last 0x80 and everything after it is zero (memrchr + memcmp:
    # far faster than a byte loop over up to 16 KiB of zeros).
    marker = padded.rfind(b"\x80")
    if marker < 0 or padded[marker + 1 :] != bytes(size - marker - 1):
        raise IntegrityError("payload padding is malformed")
    payload = padded[:marker]
    if padded_size(len(payload)) != size:
        raise IntegrityError("payload is padded to the wrong size class")
    return payload
