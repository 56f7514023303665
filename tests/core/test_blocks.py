"""Blocks of postings: what goes in comes out, bounds hold, and malformed blocks fail."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerodb_core.btree import DELETE, PUT, REPLACE, node_from_payload
from zerodb_core.btree.blocks import (
    BODY,
    CHANGES,
    COUNT,
    DELS,
    LAST,
    MAX_TF,
    MIN_DL,
    NET,
    block_postings,
    make_block,
    valid_block,
)
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import IntegrityError
from zerodb_core.serialization import pack, unpack

pk_lists = st.one_of(
    st.lists(st.integers(-(2**70), 2**70), min_size=1, max_size=40, unique=True),
    st.lists(st.text(max_size=6), min_size=1, max_size=40, unique=True),
)


@settings(max_examples=300, deadline=None)
@given(pks=pk_lists, data=st.data())
def test_a_block_gives_back_its_postings(pks, data):
    pks = sorted(pks, key=encode_key)
    n = len(pks)
    tags = bytes(
        data.draw(st.lists(st.sampled_from([PUT, REPLACE, DELETE]), min_size=n, max_size=n))
    )
    tags = data.draw(st.sampled_from([tags, b""]))
    dls = data.draw(st.lists(st.integers(0, 500), min_size=n, max_size=n))
    positions = [
        [] if tags and tag == DELETE else data.draw(st.lists(st.integers(0, 499), max_size=5))
        for tag in (tags or bytes(n))
    ]
    block = make_block(3, pks, tags, dls, positions)
    assert valid_block(block)
    stored = unpack(pack(block))  # as a leaf stores it
    assert valid_block(stored)
    got_pks, got_tags, got_dls, got_positions = block_postings(stored)
    assert got_pks == pks and got_dls == dls and got_positions == positions
    assert got_tags == (tags if any(tags) else bytes(n))
    live = [i for i, tag in enumerate(got_tags) if tag != DELETE]
    assert stored[NET] == got_tags.count(PUT) - got_tags.count(DELETE)
    assert stored[COUNT] == n and stored[DELS] == got_tags.count(DELETE)
    assert stored[CHANGES] == n - got_tags.count(PUT)
    assert stored[LAST] == encode_key(pks[-1])
    assert stored[MAX_TF] == max((len(positions[i]) for i in live), default=0)
    assert stored[MIN_DL] == min((dls[i] for i in live), default=0)


def test_integer_keys_are_stored_as_differences():
    block = make_block(2, [1000, 1001, 1005], b"", [3, 3, 3], [[0], [1], [2]])
    assert unpack(block[BODY])[2] == [1000, 1, 4]
    as_they_are = make_block(2, [1000, 1001, "x"], b"", [3] * 3, [[0]] * 3)
    assert unpack(as_they_are[BODY])[2] == [1000, 1001, "x"]  # not all ints: kept whole
    assert len(block[BODY]) < len(as_they_are[BODY])


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.__setitem__(0, 0),  # no term
        lambda b: b.__setitem__(1, 0),  # no postings
        lambda b: b.__setitem__(5, 2),  # more tombstones than changes
        lambda b: b.__setitem__(BODY, "body"),  # a body that is not bytes
        lambda b: b.__setitem__(LAST, 5),  # a last key that is not bytes
        lambda b: b.append(0),  # a field too many
    ],
)
def test_malformed_heads_fail_closed(change):
    block = make_block(2, [1], b"", [4], [[0]])
    change(block)
    assert not valid_block(block)
    with pytest.raises(IntegrityError, match="not a well-formed"):
        node_from_payload(bytes(16), [2, [b"k"], [block]])


@pytest.mark.parametrize(
    "body",
    [
        [b"\x07", 0, [1], [4], [[0]]],  # a tag that does not exist
        [b"", 0, [1], [4, 5], [[0]]],  # lengths disagree
        [b"", 0, [1], [4], [["x"]]],  # a position that is not an int
        [b"", 3, [1], [4], [[0]]],  # an unknown key mode
        [b"", 1, ["a"], [4], [[0]]],  # differences that are not ints
        [b"", 0, [1], [4]],  # a field missing
        "not a list",
    ],
)
def test_malformed_bodies_fail_closed_when_decoded(body):
    block = make_block(2, [1], b"", [4], [[0]])
    block[BODY] = pack(body)
    assert valid_block(block)  # the head is fine: the body is checked when decoded
    with pytest.raises(IntegrityError, match="not well formed"):
        block_postings(block)
