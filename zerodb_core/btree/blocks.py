"""Blocks of postings: how a full-text index stores many postings in one entry.

A full-text index holds a posting per (term, document): the document's length and the
positions of the term in it (its term frequency is the number of positions). One entry
per posting made the index three times the size of the text it indexes (a key of term
and primary key, a value repeating the primary key, and per-entry framing). So postings
are grouped, as Lucene does, into blocks of up to 128 postings of one term, in primary
key order, under the key ``encode_key(term) + encode_key(first primary key)``.

A block is a plain list, decoded with its leaf:

=====  ==========  =====================================================================
index  field       meaning
=====  ==========  =====================================================================
0      term_len    length of the term's part of the key
1      net         postings added minus removed (counts add up to document frequencies)
2      max_tf      largest term frequency of a live posting (0 if none)
3      min_dl      smallest document length of a live posting (0 if none)
4      tags        one byte per posting (``PUT``, ``REPLACE``, ``DELETE``), or empty: all
                   ``PUT``
5      pk_mode     0: primary keys as they are; 1: integers, as the first one and the
                   differences from each to the next (small numbers, one byte each)
6      pks         the primary keys (as ``pk_mode`` says)
7      dls         document lengths
8      positions   a list of positions per posting (empty for a ``DELETE``)
=====  ==========  =====================================================================

``max_tf`` and ``min_dl`` bound the BM25 weight of every posting of the block whatever the
average document length (the weight grows with the term frequency and shrinks with the
document length), so top-k search skips blocks that cannot enter the top k.
"""

from __future__ import annotations

from itertools import accumulate, chain
from operator import sub
from typing import Any

from zerodb_core.btree.tags import DELETE, PUT

TERM_LEN = 0
NET = 1
MAX_TF = 2
MIN_DL = 3
TAGS = 4
PK_MODE = 5
PKS = 6
DLS = 7
POSITIONS = 8
FIELDS = 9

RAW = 0
DELTAS = 1

# Postings per block (Lucene's block size): big enough that a block's bounds stand for
# many postings, small enough that a block decodes in microseconds.
BLOCK_POSTINGS = 128


def make_block(
    term_len: int, pks: list, tags: bytes, dls: list[int], positions: list[list[int]]
) -> list:
    """A block of postings in primary-key order (``tags`` empty: all ``PUT``)."""
    if tags and not any(tags):
        tags = b""
    if tags:
        live = [i for i, tag in enumerate(tags) if tag != DELETE]
        net = tags.count(PUT) - tags.count(DELETE)
        max_tf = max((len(positions[i]) for i in live), default=0)
        min_dl = min((dls[i] for i in live), default=0)
    else:
        net = len(pks)
        max_tf = max(map(len, positions))
        min_dl = min(dls)
    if set(map(type, pks)) == {int}:
        stored = [pks[0], *map(sub, pks[1:], pks[:-1])]
        mode = DELTAS
    else:
        stored = list(pks)
        mode = RAW
    return [term_len, net, max_tf, min_dl, bytes(tags), mode, stored, list(dls), positions]


def block_pks(block: list) -> list:
    """The primary keys of a block."""
    stored = block[PKS]
    return list(accumulate(stored)) if block[PK_MODE] == DELTAS else stored


def block_postings(block: list) -> tuple[list, bytes, list[int], list[list[int]]]:
    """``(pks, tags, dls, positions)`` of a block, tags one byte per posting."""
    tags = block[TAGS] or bytes(len(block[DLS]))
    return block_pks(block), tags, block[DLS], block[POSITIONS]


def valid_block(block: Any) -> bool:
    """Whether ``block`` has the layout above (checked in C, element by element, as
    everything decoded from a blob is before use)."""
    if type(block) is not list or len(block) != FIELDS:
        return False
    term_len, net, max_tf, min_dl, tags, mode, pks, dls, positions = block
    n = len(dls) if type(dls) is list else -1
    return (
        n > 0
        and set(map(type, (term_len, net, max_tf, min_dl))) == {int}
        and term_len > 0
        and max_tf >= 0
        and min_dl >= 0
        and type(tags) is bytes
        and (not tags or (len(tags) == n and max(tags) <= DELETE))
        and mode in (RAW, DELTAS)
        and type(pks) is list
        and len(pks) == n
        and (mode == RAW or set(map(type, pks)) == {int})
        and set(map(type, dls)) == {int}
        and type(positions) is list
        and len(positions) == n
        and set(map(type, positions)) == {list}
        and set(map(type, chain.from_iterable(positions))) <= {int}
    )
