"""Blocks of postings: what goes in comes out, bounds hold, and malformed blocks fail."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerodb_core.btree import DELETE, PUT, REPLACE, node_from_payload
from zerodb_core.btree.blocks import (
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
    assert stored[MAX_TF] == max((len(positions[i]) for i in live), default=0)
    assert stored[MIN_DL] == min((dls[i] for i in live), default=0)


def test_integer_keys_are_stored_as_differences():
    block = make_block(2, [1000, 1001, 1005], b"", [3, 3, 3], [[0], [1], [2]])
    assert block[6] == [1000, 1, 4]
    assert len(pack(block)) < len(pack(make_block(2, ["a", "b", "c"], b"", [3] * 3, [[0]] * 3)))


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.__setitem__(0, 0),  # no term
        lambda b: b.__setitem__(4, b"\x07"),  # a tag that does not exist
        lambda b: b.__setitem__(7, [1, 2]),  # lengths disagree
        lambda b: b.__setitem__(8, [["x"]]),  # a position that is not an int
        lambda b: b.__setitem__(5, 3),  # an unknown key mode
        lambda b: b.__setitem__(6, ["a"]),  # differences that are not ints
        lambda b: b.append(0),  # a field too many
    ],
)
def test_malformed_blocks_fail_closed(change):
    block = make_block(2, [1], b"", [4], [[0]])
    change(block)
    assert not valid_block(block)
    with pytest.raises(IntegrityError, match="not a well-formed"):
        node_from_payload(bytes(16), [2, [b"k"], [block]])
