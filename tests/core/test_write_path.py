"""The whole write path against a plain-Python model, with crashes.

Random interleavings of inserts, updates and deletes (unique and full-text indexes
included), commits that trigger merges, forced merges, and crashes at every step: the
process "dies" (an exception nothing catches) at the k-th call to the store, before that
call reaches it. A fresh client must then see exactly what was acknowledged: every commit
that reached the store, nothing of the one that did not, and nothing lost by a merge cut
short. Answers are compared with the model after every step.
"""

from __future__ import annotations

import random

from hypothesis import event, given, settings
from hypothesis import strategies as st

from blob_server.storage.memory import MemoryStorage
from tests.conftest import PASSWORD
from zerodb_core import DB
from zerodb_core.exceptions import UniqueViolation
from zerodb_core.models import Field, Model, Text
from zerodb_core.query import Contains, Gt
from zerodb_core.transport import LocalTransport

WORDS = ["alpha", "beta", "gamma", "delta", "kernel", "panic", "queue", "zeta"]


class Person(Model):
    name = Field()
    email = Field(unique=True)
    salary = Field()
    bio = Text()


class Crash(BaseException):
    """The client process died (nothing in the engine may catch this)."""


class CrashingTransport(LocalTransport):
    """Dies at the ``crash_at``-th call to the store, before the call reaches it."""

    def __init__(self, storage) -> None:
        super().__init__(storage)
        self.calls = 0
        self.crash_at: int | None = None

    def _tick(self) -> None:
        self.calls += 1
        if self.crash_at is not None and self.calls >= self.crash_at:
            raise Crash

    def _get_blobs(self, database, ids):
        self._tick()
        return super()._get_blobs(database, ids)

    def _get_root(self, database):
        self._tick()
        return super()._get_root(database)

    def _commit(self, database, **kwargs):
        self._tick()
        return super()._commit(database, **kwargs)

    def close(self) -> None:
        pass  # the storage outlives every client


def open_client(storage) -> tuple[DB, CrashingTransport]:
    transport = CrashingTransport(storage)
    db = DB(transport, password=PASSWORD, kdf="fast", node_bytes=200, merge_factor=2)
    return db, transport


def person_fields(rng: random.Random, n: int) -> dict:
    return {
        "name": rng.choice(["ann", "bob", "cy", None]),
        "email": f"e{n}@x" if rng.random() < 0.8 else None,
        "salary": rng.randrange(0, 50) * 10,
        "bio": " ".join(rng.choices(WORDS, k=rng.randint(0, 12))),
    }


def check(db: DB, model: dict[int, dict]) -> None:
    people = db[Person]
    got = {p.pk: p.to_record() for p in people.all()}
    assert got == model
    assert len(people) == len(model)
    for name in ("ann", "bob"):
        expected = sorted(pk for pk, f in model.items() if f["name"] == name)
        assert sorted(p.pk for p in people.query(name=name)) == expected
    for pk, fields in list(model.items())[:3]:
        if fields["email"] is not None:
            assert [p.pk for p in people.query(email=fields["email"])] == [pk]
    ranked = sorted(
        (f["salary"], pk) for pk, f in model.items() if f["salary"] is not None and f["salary"] > 90
    )
    window = people.query(Gt("salary", 90), sort_index="salary", skip=3, limit=5)
    assert [p.pk for p in window] == [pk for _, pk in ranked[3:8]]
    assert len(people.query(Gt("salary", 90))) == len(ranked)
    expected = {pk for pk, f in model.items() if "kernel" in f["bio"].split()}
    assert {p.pk for p in people.query(Contains("bio", "kernel"))} == expected


op = st.one_of(
    st.tuples(st.just("insert"), st.integers(1, 25)),
    st.tuples(st.just("update"), st.integers(0, 10**6)),
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("compact"), st.just(0)),
)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(op, st.one_of(st.none(), st.integers(1, 30))), max_size=20),
    seed=st.integers(0, 2**16),
)
def test_answers_equal_the_model_through_writes_merges_and_crashes(ops, seed):
    rng = random.Random(seed)
    storage = MemoryStorage()
    db, transport = open_client(storage)
    model: dict[int, dict] = {}
    serial = 0
    for (kind, arg), crash_after in ops:
        seq_before = storage.get_root("local", "main").seq
        change: dict[int, dict | None] = {}
        transport.crash_at = None if crash_after is None else transport.calls + crash_after
        try:
            if kind == "insert":
                rows = []
                for _ in range(arg):
                    serial += 1
                    rows.append(Person(**person_fields(rng, serial)))
                    rows[-1].pk = serial  # known before the commit, which may die
                change = {p.pk: p.to_record() for p in rows}
                db.add(*rows)
            elif kind == "update" and model:
                pk = sorted(model)[arg % len(model)]
                person = _get(db, pk)
                serial += 1
                fields = person_fields(rng, serial)
                for name, value in fields.items():
                    setattr(person, name, value)
                change = {pk: fields}
                db.add(person)
            elif kind == "delete" and model:
                pk = sorted(model)[arg % len(model)]
                change = {pk: None}
                db.remove(_get(db, pk))
            elif kind == "compact":
                db.compact()
        except Crash:
            acknowledged = storage.get_root("local", "main").seq > seq_before
            event(f"crash in {kind}, {'after' if acknowledged else 'before'} a commit landed")
            _apply(model, change if acknowledged and kind != "compact" else {})
            db, transport = open_client(storage)  # a new process on the same store
            check(db, model)
            continue
        except UniqueViolation:  # emails are unique: a clash changes nothing
            transport.crash_at = None
            check(db, model)
            continue
        transport.crash_at = None
        _apply(model, change)
        check(db, model)
    fresh, _ = open_client(storage)
    check(fresh, model)


def _get(db: DB, pk: int) -> Person:
    (person,) = [p for p in db[Person].all() if p.pk == pk]
    return person


def _apply(model: dict, change: dict) -> None:
    for pk, fields in change.items():
        if fields is None:
            model.pop(pk, None)
        else:
            model[pk] = fields


def test_a_merge_killed_at_every_step_loses_nothing():
    """A new client's commit whose merge reads runs other commits wrote, killed at each of
    its calls to the store in turn (the root read, the commit, every read of the merge,
    the merge's commit): a new client sees that commit iff it reached the store, and
    everything before it, whatever the merge had done."""
    rng = random.Random(5)
    batches = [
        [Person(**person_fields(rng, 100 * b + i)) for i in range(1 + b % 3)] for b in range(8)
    ]
    for b, batch in enumerate(batches):
        for i, person in enumerate(batch):
            person.pk = 100 * b + i + 1
    last = {p.pk: p.to_record() for p in batches[-1]}
    before = {p.pk: p.to_record() for batch in batches[:-1] for p in batch}
    steps = None
    k = 1
    while steps is None or k <= steps:
        storage = MemoryStorage()
        db, transport = open_client(storage)
        for batch in batches[:-1]:
            db.add(*_copies(batch))
        db, transport = open_client(storage)  # its cache is cold: the merge must read
        start, seq = transport.calls, storage.get_root("local", "main").seq
        transport.crash_at = start + k
        try:
            db.add(*_copies(batches[-1]))
        except Crash:
            landed = storage.get_root("local", "main").seq > seq
            fresh, _ = open_client(storage)
            check(fresh, {**before, **last} if landed else before)
        else:
            steps = transport.calls - start  # the last commit and its merges, uncut
            transport.crash_at = None
            assert steps > 4, "the last commit should have read runs and merged them"
            check(db, {**before, **last})
        k += 1


def _copies(people: list[Person]) -> list[Person]:
    copies = []
    for person in people:
        copy = Person(**person.to_record())
        copy.pk = person.pk
        copies.append(copy)
    return copies
