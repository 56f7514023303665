"""Bloom filters of runs: which values a run of an ordered index may hold.

An equality or ``in`` lookup on an index reads, in every run whose fence keys allow the
value, the leaf where the value would be; with several runs most of those leaves do not
hold it. A run of a single-field index therefore keeps a Bloom filter of the values
(the part of its keys before the pk) in a blob of its own: a lookup skips the runs whose
filter says no, and reads about one leaf per value (RocksDB keeps one per table file for
the same reason). Ten bits per value and seven probes give about 1% false positives;
there are no false negatives.

Probes come from one BLAKE2b-128 digest per value (double hashing): the filter is sealed
like any blob, so the hash need not be secret, only stable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from zerodb_core.exceptions import IntegrityError

FILTER = 3  # node payload kind
BITS_PER_VALUE = 10
PROBES = 7
# A filter of a run of many values would be large: above this, the run goes without one.
MAX_FILTER_BYTES = 1 << 20


class BloomFilter:
    """A Bloom filter of byte strings, stored as a blob of the run it describes."""

    __slots__ = ("bits", "id", "probes", "size")

    is_leaf = False

    def __init__(self, node_id: bytes, size: int, probes: int, bits: bytes) -> None:
        self.id = node_id
        self.size = size  # in bits
        self.probes = probes
        self.bits = bits

    @classmethod
    def of(cls, node_id: bytes, values: Iterable[bytes]) -> BloomFilter | None:
        """A filter of ``values`` (None when it would be too large to be worth it)."""
        distinct = set(values)
        size = max(64, BITS_PER_VALUE * len(distinct))
        if size // 8 > MAX_FILTER_BYTES:
            return None
        bits = bytearray((size + 7) // 8)
        for value in distinct:
            for position in _positions(value, size, PROBES):
                bits[position >> 3] |= 1 << (position & 7)
        return cls(node_id, size, PROBES, bytes(bits))

    def may_hold(self, value: bytes) -> bool:
        """Whether ``value`` may be in the run (False: it is certainly not)."""
        bits = self.bits
        return all(bits[p >> 3] & (1 << (p & 7)) for p in _positions(value, self.size, self.probes))

    def to_payload(self) -> list[object]:
        return [FILTER, self.size, self.probes, self.bits]


def filter_from_payload(node_id: bytes, payload: list[Any]) -> BloomFilter:
    """Check and build a filter from its decoded payload (fail closed)."""
    try:
        _, size, probes, bits = payload
        if (
            type(size) is int
            and type(probes) is int
            and type(bits) is bytes
            and 0 < size <= 8 * MAX_FILTER_BYTES
            and 0 < probes <= 32
            and len(bits) == (size + 7) // 8
        ):
            return BloomFilter(node_id, size, probes, bits)
    except (TypeError, ValueError):
        pass
    raise IntegrityError(f"blob {node_id.hex()} is not a well-formed filter")


def _positions(value: bytes, size: int, probes: int) -> list[int]:
    digest = hashlib.blake2b(value, digest_size=16).digest()
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little") | 1
    return [(h1 + i * h2) % size for i in range(probes)]
