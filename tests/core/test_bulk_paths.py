"""The fast paths of bulk writes give exactly what the plain ones give.

Postings written byte by byte equal ``pack``'s, the ASCII tokenizer equals the general
pattern, ``put_many`` splits leaves where inserting one entry at a time would, and a batch
of records leaves the same trees whatever order its rows come in.
"""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.hr import Account, Employee
from zerodb_core.btree import CLEAN, BTree, Workspace, reachable_dirty
from zerodb_core.btree.node import ENTRY_OVERHEAD, node_from_payload
from zerodb_core.models import Field, Model
from zerodb_core.records import _postings
from zerodb_core.serialization import pack
from zerodb_core.text import MAX_TOKEN_LENGTH, _normalise, _pattern, tokenize
from zerodb_core.transaction import PutRecords

pks = st.one_of(
    st.integers(-(2**70), 2**70),
    st.text(max_size=20),
    st.binary(max_size=10),
    st.tuples(st.integers(), st.text(max_size=3)),
)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.one_of(
        st.lists(st.sampled_from("abcdefgh"), max_size=40),
        st.lists(st.sampled_from("ab"), min_size=15, max_size=300),
        st.lists(st.text(min_size=1, max_size=3), max_size=140),
    ),
    pk=pks,
)
def test_postings_are_what_pack_writes(tokens, pk):
    positions: dict[str, list[int]] = {}
    for position, term in enumerate(tokens):
        positions.setdefault(term, []).append(position)
    expected = [(t, pack([pk, len(w), len(tokens), w])) for t, w in positions.items()]
    assert list(_postings(tokens, pk, pack(pk))) == expected


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_tokens_are_the_general_patterns(text):
    general = [t for t in _pattern().findall(_normalise(text)) if len(t) <= MAX_TOKEN_LENGTH]
    assert tokenize(text) == general
    long = text + " " + "Ab1" * 30 + " " + text
    general = [t for t in _pattern().findall(_normalise(long)) if len(t) <= MAX_TOKEN_LENGTH]
    assert tokenize(long) == general


# -- leaves split where one-by-one inserts split them ------------------------------------


def put_one_by_one(tree: BTree, items: list[tuple[bytes, bytes]]) -> None:
    """The plain algorithm: per leaf, insert entries one at a time, split on overflow."""
    ws, n, i = tree.ws, len(items), 0
    while i < n and tree.ref.root is None:
        tree.put(*items[i])
        i += 1
    while i < n:
        path, leaf = tree._path(items[i][0])
        hi = next(
            (p.keys[j + 1] for p, j in reversed(path) if j + 1 < len(p.keys)),
            None,
        )
        leaf = ws.writable(leaf)
        keys, values, delta, pos, size = leaf.keys, leaf.values, 0, 0, leaf.size
        while i < n:
            key, value = items[i]
            if hi is not None and key >= hi:
                break
            pos = bisect_left(keys, key, pos)
            if pos < len(keys) and keys[pos] == key:
                size += len(value) - len(values[pos])
                values[pos] = value
            else:
                keys.insert(pos, key)
                values.insert(pos, value)
                size += len(key) + len(value) + ENTRY_OVERHEAD
                delta += 1
            i += 1
            if size > tree.max_bytes:
                break
        leaf.size = size
        tree._grow(path, leaf, delta, hi is None and pos == len(keys) - 1)


class DictSource:
    def __init__(self) -> None:
        self.blobs: dict[bytes, list] = {}

    def lookup(self, blob_id):
        return None

    def fetch(self, blob_ids):
        return {i: node_from_payload(i, self.blobs[i]) for i in blob_ids}


def shape(ws: Workspace, refs: dict) -> list:
    out = []

    def walk(node_id):
        node = ws.load(node_id)
        out.append((node.is_leaf, node.keys, node.values if node.is_leaf else node.counts))
        for child in [] if node.is_leaf else node.children:
            walk(child)

    walk(refs["t"].root)
    return out


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), max_bytes=st.sampled_from([150, 300, 1000]))
def test_put_many_splits_where_one_by_one_inserts_split(seed, max_bytes):
    shapes = []
    for put in (BTree.put_many, put_one_by_one):
        rng = random.Random(seed)
        source, refs = DictSource(), {}
        ws = Workspace(source)
        for step in range(rng.randint(1, 5)):
            count = rng.randint(0, 300)
            kind = rng.random()
            if kind < 0.3:  # anywhere, some keys replaced
                keys = {rng.randbytes(rng.randint(0, 3)) for _ in range(count)}
            elif kind < 0.6:  # a few prefixes, each growing at its end (postings)
                keys = {bytes([rng.randint(1, 5)]) + (step * 999 + t).to_bytes(3, "big")
                        for t in range(count)}  # fmt: skip
            else:  # appended at the end of the tree (records)
                keys = {(step * 999 + t).to_bytes(3, "big") for t in range(count)}
            items = sorted((k, rng.randbytes(rng.randint(0, 40))) for k in keys)
            put(BTree(ws, refs, "t", max_bytes=max_bytes), items)
            # commit: later writes copy what they change (no tree yet after empty puts)
            if rng.random() < 0.5 and "t" in refs:
                for node in reachable_dirty(ws, [refs["t"].root]):
                    node.gen = CLEAN
                    source.blobs[node.id] = node.to_payload()
                ws = Workspace(source)
        shapes.append(shape(ws, refs) if "t" in refs else [])
    assert shapes[0] == shapes[1]


# -- a batch leaves the same trees whatever the order of its rows --------------------------


def trees(db) -> dict:
    snap = db.snapshot()
    entries = {name: snap.run([snap.tree(name).scan_reader()])[0] for name in sorted(snap.refs)}
    return entries | {"text_stats": sorted(snap.text_stats.items())}


def employees(rng, n, start):
    words = ["kernel", "panic", "Straße", "日本語", "x_y", "don't", "3.14", "a"]
    return [
        (
            start + i,
            {
                "name": rng.choice(["Ann", "Bob", None, 3, 3.0, True]),
                "surname": rng.choice(["Lee", "Li"]),
                "salary": rng.choice([10, 20, 10**30, 2.5]),
                "description": rng.choice(
                    [None, 7, " ".join(rng.choice(words) for _ in range(rng.randint(0, 140)))]
                ),
            },
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("order", ["sorted", "shuffled", "one by one"])
def test_row_order_leaves_the_same_trees(make_db, order):
    results = []
    for row_order in ("sorted", order):
        rng = random.Random(4)
        db = make_db("memory://", node_bytes=600)
        first, second = employees(rng, 400, 0), employees(rng, 300, 250)  # 150 replaced
        accounts = [(f"a{i}", {"email": f"{i % 97}@x" if i % 5 else None}) for i in range(97)]
        for rows, model in ((first, Employee), (second, Employee), (accounts, Account)):
            rows = list(rows)
            if row_order == "shuffled":
                random.Random(1).shuffle(rows)
            batches = [[row] for row in rows] if row_order == "one by one" else [rows]
            with db.transaction() as txn:
                db._ensure_model(txn, model)
                for batch in batches:
                    txn.apply(PutRecords(model.zerodb_name, batch))
        results.append(trees(db))
    assert results[0] == results[1]


def test_model_init_goes_through_overridden_attributes():
    class Base(Model):
        a = Field()
        b = Field()

    class Child(Base):
        @property
        def a(self):
            return self.__dict__["_a"] * 2

        @a.setter
        def a(self, value):
            self.__dict__["_a"] = value

    assert Base._plain_fields == {"a", "b"}
    assert Child._plain_fields == {"b"}
    child = Child(a=2, b=3, c=4)
    assert (child.a, child.b, child.c) == (4, 3, 4)
    assert child.to_record() == {"b": 3, "c": 4}
