"""The fast paths of bulk writes give exactly what the plain ones give.

The ASCII tokenizer equals the general pattern, and a batch of records leaves the same
trees whatever order its rows come in.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.hr import Account, Employee
from zerodb_core.models import Field, Model
from zerodb_core.text import MAX_TOKEN_LENGTH, _normalise, _pattern, tokenize
from zerodb_core.transaction import PutRecords

pks = st.one_of(
    st.integers(-(2**70), 2**70),
    st.text(max_size=20),
    st.binary(max_size=10),
    st.tuples(st.integers(), st.text(max_size=3)),
)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_tokens_are_the_general_patterns(text):
    general = [t for t in _pattern().findall(_normalise(text)) if len(t) <= MAX_TOKEN_LENGTH]
    assert tokenize(text) == general
    long = text + " " + "Ab1" * 30 + " " + text
    general = [t for t in _pattern().findall(_normalise(long)) if len(t) <= MAX_TOKEN_LENGTH]
    assert tokenize(long) == general


# -- a batch leaves the same trees whatever the order of its rows --------------------------


def trees(db) -> dict:
    snap = db.snapshot()
    entries = {name: snap.run([snap.tree(name).scan_reader()])[0] for name in sorted(snap.runs)}
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
