"""The B+tree against a plain sorted dict, under random writes, commits and savepoints."""

from __future__ import annotations

from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerodb_core.btree import CLEAN, BTree, Workspace, reachable_dirty
from zerodb_core.btree.node import node_from_payload


class DictSource:
    """A node source over a dict of persisted payloads; counts fetches like a transport."""

    def __init__(self) -> None:
        self.blobs: dict[bytes, list] = {}
        self.fetches = 0

    def lookup(self, blob_id):
        return None  # no cache: every clean node costs a fetch, so counts are visible

    def fetch(self, blob_ids):
        self.fetches += 1
        return {i: node_from_payload(i, self.blobs[i]) for i in blob_ids}


def persist(ws: Workspace, refs: dict, source: DictSource) -> Workspace:
    """What a commit does for trees: write reachable dirty nodes, start a new workspace."""
    for node in reachable_dirty(ws, [ref.root for ref in refs.values()]):
        node.gen = CLEAN
        source.blobs[node.id] = node.to_payload()
    for blob_id in ws.garbage:
        source.blobs.pop(blob_id)
    return Workspace(source)


def make_tree(max_bytes=300):
    source = DictSource()
    refs: dict = {}
    ws = Workspace(source)
    return source, refs, ws, BTree(ws, refs, "t", max_bytes=max_bytes)


def run(ws, reader):
    return ws.run([reader])[0]


def model_range(model: dict, lo: bytes, hi: bytes | None):
    keys = sorted(model)
    a = bisect_left(keys, lo)
    b = len(keys) if hi is None else bisect_left(keys, hi)
    return [(k, model[k]) for k in keys[a:b]] if b > a else []


keys_st = st.binary(min_size=0, max_size=6)
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("put"), keys_st, st.binary(max_size=20)),
        st.tuples(st.just("del"), keys_st, st.none()),
        st.tuples(st.just("commit"), st.none(), st.none()),
        st.tuples(
            st.just("batch"),
            st.dictionaries(keys_st, st.binary(max_size=20), max_size=40),
            st.none(),
        ),
    ),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops_st, probes=st.lists(st.tuples(keys_st, st.one_of(st.none(), keys_st)), max_size=8))
def test_tree_matches_sorted_dict(ops, probes):
    source, refs, ws, tree = make_tree()
    model: dict[bytes, bytes] = {}
    for op, key, value in ops:
        if op == "put":
            assert tree.put(key, value) == model.get(key)
            model[key] = value
        elif op == "del":
            assert tree.delete(key) == model.pop(key, None)
        elif op == "batch":
            tree.put_many(sorted(key.items()))
            model.update(key)
        else:
            ws = persist(ws, refs, source)
            tree = BTree(ws, refs, "t", max_bytes=300)
        assert len(tree) == len(model)
    assert run(ws, tree.scan_reader()) == sorted(model.items())
    for lo, hi in probes:
        expected = model_range(model, lo, hi)
        assert run(ws, tree.scan_reader(lo, hi)) == expected
        assert run(ws, tree.count_reader(lo, hi)) == len(expected)
        assert run(ws, tree.scan_reader(lo, hi, reverse=True)) == expected[::-1]
    present = [*list(model)[:5], b"\xff\xff\xff\xff\xff\xff\xff"]
    assert run(ws, tree.get_many_reader(present)) == {k: model[k] for k in present if k in model}


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 400),
    lo=st.integers(-5, 405),
    hi=st.integers(-5, 405),
    skip=st.integers(0, 420),
    limit=st.one_of(st.none(), st.integers(0, 50)),
    reverse=st.booleans(),
)
def test_scan_window_and_counts(n, lo, hi, skip, limit, reverse):
    source, refs, ws, tree = make_tree(max_bytes=120)
    enc = lambda i: i.to_bytes(2, "big", signed=True) if i >= -5 else b""  # noqa: E731
    for i in range(n):
        tree.put(i.to_bytes(2, "big", signed=True), b"v%d" % i)
    ws = persist(ws, refs, source)
    tree = BTree(ws, refs, "t", max_bytes=120)
    lo_b, hi_b = enc(max(lo, 0)), enc(max(hi, 0))
    expected = [(k, v) for k, v in model_items(n) if lo_b <= k < hi_b]
    if reverse:
        expected.reverse()
    window = expected[skip:] if limit is None else expected[skip : skip + limit]
    assert run(ws, tree.scan_reader(lo_b, hi_b, skip=skip, limit=limit, reverse=reverse)) == window
    assert run(ws, tree.count_reader(lo_b, hi_b)) == len(expected)
    estimate = run(ws, tree.count_reader(lo_b, hi_b, exact=False))
    assert 0 <= estimate <= n


def model_items(n):
    return [(i.to_bytes(2, "big", signed=True), b"v%d" % i) for i in range(n)]


def test_fetches_are_batched_per_level():
    source, refs, ws, tree = make_tree(max_bytes=200)
    for i in range(3000):
        tree.put(i.to_bytes(4, "big"), b"x" * 8)
    ws = persist(ws, refs, source)
    tree = BTree(ws, refs, "t", max_bytes=200)
    height = refs["t"].height
    assert height >= 4
    source.fetches = 0
    got = run(ws, tree.scan_reader(b"", None))
    assert len(got) == 3000
    assert source.fetches == height  # one request per level, however many nodes
    source.fetches = 0
    assert run(ws, tree.count_reader((100).to_bytes(4, "big"), (2900).to_bytes(4, "big"))) == 2800
    assert source.fetches <= height
    source.fetches = 0
    deep = run(ws, tree.scan_reader(skip=2500, limit=3))
    assert [int.from_bytes(k, "big") for k, _ in deep] == [2500, 2501, 2502]
    assert source.fetches <= height
    source.fetches = 0
    run(ws, tree.count_reader(b"\x00\x00\x01", b"\x00\x00\x0a\x00", exact=False))
    assert source.fetches == height - 1  # estimates stop above the leaves


def test_sequential_load_fills_nodes():
    _, refs, ws, tree = make_tree(max_bytes=1000)
    for i in range(5000):
        tree.put(i.to_bytes(4, "big"), b"v" * 10)
    leaves = [n for n in ws.dirty.values() if n.is_leaf and n.keys]
    live = {n.id for n in reachable_dirty(ws, [refs["t"].root])}
    sizes = [n.size for n in leaves if n.id in live]
    assert sum(sizes) / len(sizes) > 0.9 * 1000


def test_savepoint_rollback_restores_tree():
    source, refs, ws, tree = make_tree()
    for i in range(200):
        tree.put(b"%03d" % i, b"a")
    ws = persist(ws, refs, source)
    tree = BTree(ws, refs, "t", max_bytes=300)
    saved = dict(refs)
    marker = ws.mark()
    for i in range(0, 200, 3):
        tree.delete(b"%03d" % i)
    tree.put(b"zzz", b"b")
    assert ws.garbage
    refs.clear()
    refs.update(saved)
    ws.rollback_to(marker)
    assert ws.garbage == []
    assert run(ws, tree.scan_reader()) == [(b"%03d" % i, b"a") for i in range(200)]


def test_delete_everything_empties_tree():
    source, refs, ws, tree = make_tree(max_bytes=100)
    for i in range(500):
        tree.put(b"%04d" % i, b"v")
    ws = persist(ws, refs, source)
    tree = BTree(ws, refs, "t", max_bytes=100)
    for i in range(500):
        assert tree.delete(b"%04d" % i) == b"v"
    assert refs["t"].root is None and len(tree) == 0
    ws = persist(ws, refs, source)
    assert source.blobs == {}  # every persisted node became garbage


@pytest.mark.parametrize("bad", [[9], [0, [b"a"], []], [1, [b"a"], [b"x" * 16], [0]], "x"])
def test_malformed_node_payload_fails_closed(bad):
    from zerodb_core.exceptions import IntegrityError

    with pytest.raises(IntegrityError):
        node_from_payload(b"\x00" * 16, bad)


def test_paths_reader_loads_what_writes_walk():
    source, refs, ws, tree = make_tree(max_bytes=200)
    for i in range(3000):
        tree.put(i.to_bytes(4, "big"), b"x" * 8)
    ws = persist(ws, refs, source)
    cache: dict = {}
    source.lookup = cache.get  # a cache, so that what the reader loads is kept
    real_fetch = source.fetch

    def fetch_and_keep(ids):
        found = real_fetch(ids)
        cache.update(found)
        return found

    source.fetch = fetch_and_keep
    tree = BTree(ws, refs, "t", max_bytes=200)
    keys = sorted(i.to_bytes(4, "big") for i in (5, 6, 700, 2999, 1500, 4000))  # 4000: absent
    source.fetches = 0
    run(ws, tree.paths_reader(keys))
    assert source.fetches == refs["t"].height  # one request per level, all paths at once
    for key in keys:
        tree.put(key, b"new")
    tree.delete(keys[0])
    assert source.fetches == refs["t"].height  # the writes needed nothing more
