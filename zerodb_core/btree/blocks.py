"""Blocks of postings: how a full-text index stores many postings in one entry.

A full-text index holds a posting per (term, document): the document's length and the
positions of the term in it (its term frequency is the number of positions). One entry
per posting made the index three times the size of the text it indexes (a key of term
and primary key, a value repeating the primary key, and per-entry framing). So postings
are grouped, as Lucene does, into blocks of up to 128 postings of one term, in primary
key order, under the key ``encode_key(term) + encode_key(first primary key)``.

A block is a short list decoded with its leaf (the *head*), and a *body* of msgpack
bytes decoded only when its postings are needed (a search reads the heads of a term's
blocks and decodes the few that can enter its top k; a merge moves bodies unopened):

=====  ==========  =====================================================================
index  field       meaning
=====  ==========  =====================================================================
0      term_len    length of the term's part of the key
1      count       postings in the block
2      net         postings added minus removed (counts add up to document frequencies)
3      max_tf      largest term frequency of a live posting (0 if none)
4      min_dl      smallest document length of a live posting (0 if none)
5      dels        removed postings (tombstones)
6      changes     postings that are not ``PUT`` (0: the body has no tags)
7      last        the key (``encode_key``) of the last posting's pk
8      body        msgpack of ``[tags, pk_mode, pks, dls, positions]``
=====  ==========  =====================================================================

In the body, ``tags`` has one byte per posting (``PUT``, ``REPLACE``, ``DELETE``) or is
empty (all ``PUT``); ``pk_mode`` 0 keeps the primary keys as they are, 1 stores integers
as the first one and the differences from each to the next (one byte each, mostly);
``dls`` are the document lengths and ``positions`` a list per posting (empty for a
``DELETE``). The body is checked (fail closed) the first time it is decoded.

``max_tf`` and ``min_dl`` bound the BM25 weight of every posting of the block whatever the
average document length (the weight grows with the term frequency and shrinks with the
document length), so top-k search skips blocks that cannot enter the top k.
"""

from __future__ import annotations

import functools
from itertools import accumulate, chain
from operator import sub
from typing import Any

from zerodb_core.btree.tags import DELETE, PUT
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import IntegrityError
from zerodb_core.serialization import pack, unpack

TERM_LEN = 0
COUNT = 1
NET = 2
MAX_TF = 3
MIN_DL = 4
DELS = 5
CHANGES = 6
LAST = 7
BODY = 8
HEAD = 7  # the int fields of the head

RAW = 0
DELTAS = 1

# A block: the fields of the table above, by index (ints, then a key and a body). The
# primary keys inside are any values with a key encoding, hence Any.
Block = list[Any]
# (pks, tags, dls, positions) of a decoded body
Postings = tuple[list[Any], bytes, list[int], list[list[int]]]

# Postings per block (Lucene's block size): big enough that a block's bounds stand for
# many postings, small enough that a block decodes in microseconds.
BLOCK_POSTINGS = 128
# Decoded bodies kept (by their bytes, which name their content): hot terms' blocks.
DECODED_BODIES = 8192


def make_block(
    term_len: int, pks: list[Any], tags: bytes, dls: list[int], positions: list[list[int]]
) -> Block:
    """A block of postings in primary-key order (``tags`` empty: all ``PUT``); the lists
    are packed as they are, not kept."""
    if tags and not any(tags):
        tags = b""
    n = len(pks)
    if tags:
        live = [i for i, tag in enumerate(tags) if tag != DELETE]
        dels = tags.count(DELETE)
        net = tags.count(PUT) - dels
        changes = n - tags.count(PUT)
        max_tf = max((len(positions[i]) for i in live), default=0)
        min_dl = min((dls[i] for i in live), default=0)
    else:
        net, dels, changes = n, 0, 0
        max_tf = max(map(len, positions))
        min_dl = min(dls)
    if set(map(type, pks)) == {int}:
        stored = [pks[0], *map(sub, pks[1:], pks[:-1])]
        mode = DELTAS
    else:
        stored = list(pks)
        mode = RAW
    body = pack([bytes(tags), mode, stored, dls, positions])
    return [term_len, n, net, max_tf, min_dl, dels, changes, encode_key(pks[-1]), body]


def block_pks(block: Block) -> list[Any]:
    """The primary keys of a block."""
    return block_postings(block)[0]


def block_postings(block: Block) -> Postings:
    """``(pks, tags, dls, positions)`` of a block, tags one byte per posting (the
    lists are shared with other readers of the block: never change them)."""
    return _decode(block[BODY], block[COUNT])


def block_offsets(block: Block) -> dict[Any, int]:
    """Where each primary key of a block is in its lists (kept with the decoded body)."""
    return _offsets(block[BODY], block[COUNT])


@functools.lru_cache(maxsize=DECODED_BODIES)
def _offsets(body: bytes, count: int) -> dict[Any, int]:
    return {pk: i for i, pk in enumerate(_decode(body, count)[0])}


@functools.lru_cache(maxsize=DECODED_BODIES)
def _decode(body: bytes, count: int) -> Postings:
    try:
        tags, mode, stored, dls, positions = unpack(body)
    except (TypeError, ValueError):
        raise IntegrityError("a block of postings is not well formed") from None
    if not (
        type(tags) is bytes
        and (not tags or (len(tags) == count and max(tags) <= DELETE))
        and mode in (RAW, DELTAS)
        and type(stored) is list
        and len(stored) == count
        and (mode == RAW or set(map(type, stored)) == {int})
        and type(dls) is list
        and len(dls) == count
        and set(map(type, dls)) == {int}
        and type(positions) is list
        and len(positions) == count
        and set(map(type, positions)) == {list}
        and set(map(type, chain.from_iterable(positions))) <= {int}
    ):
        raise IntegrityError("a block of postings is not well formed")
    pks = list(accumulate(stored)) if mode == DELTAS else stored
    return pks, tags or bytes(count), dls, positions


def valid_block(block: Any) -> bool:
    """Whether the head of ``block`` has the layout above (its body is checked when it is
    decoded)."""
    return (
        type(block) is list
        and len(block) == BODY + 1
        and set(map(type, block[:HEAD])) == {int}
        and type(block[LAST]) is bytes
        and block[TERM_LEN] > 0
        and block[COUNT] > 0
        and min(block[MAX_TF:HEAD]) >= 0
        and block[DELS] <= block[CHANGES] <= block[COUNT]
        and block[NET] + block[DELS] >= 0
        and type(block[BODY]) is bytes
    )
