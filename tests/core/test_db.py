"""The native API end to end on the embedded stores."""

from __future__ import annotations

import logging

import pytest

from blob_server.storage.memory import MemoryStorage
from tests.core.hr import Account, Employee
from zerodb_core import (
    DoesNotExist,
    NotSupportedError,
    QueryError,
    UniqueViolation,
)
from zerodb_core.btree import filters as filters_module
from zerodb_core.query import Contains, Eq, Gt, InRange
from zerodb_core.records import spilled_value_ids
from zerodb_core.transaction import DropModel

STORES = ["memory://", "sqlite:///{tmp}/hr.zdb"]


@pytest.fixture(params=STORES, ids=["memory", "sqlite"])
def db(request, make_db):
    return make_db(request.param)


def add_staff(db):
    with db.transaction():
        db.add(
            Employee(
                name="John", surname="Smith", salary=195500, description="kernel panic on boot"
            ),
            Employee(name="John", surname="Doe", salary=90000, description="writes the docs"),
            Employee(name="Ann", surname="Lee", salary=199000, description="fixes kernel bugs"),
            Employee(
                name="Bob", surname="Stone", salary=210000, description="a panic in the kernel"
            ),
        )


def test_readme_example(db):
    add_staff(db)
    rich_johns = db[Employee].query(InRange("salary", 195000, 200000), name="John")
    assert [e.surname for e in rich_johns] == ["Smith"]
    top = db[Employee].query(Gt("salary", 100000), sort_index="salary", reverse=True, limit=2)
    assert [e.salary for e in top] == [210000, 199000]
    hits = db[Employee].query(Contains("description", "kernel panic"), limit=10)
    assert {e.name for e in hits} == {"John", "Bob"}
    assert len(db[Employee]) == 4
    assert len(db[Employee].query(name="John")) == 2


def test_pk_get_and_remove(db):
    add_staff(db)
    john = db[Employee].query(surname="Smith")[0]
    assert isinstance(john.pk, int)
    assert db[Employee].get(john.pk).surname == "Smith"
    db.remove(john)
    with pytest.raises(DoesNotExist):
        db[Employee].get(john.pk)
    assert len(db[Employee]) == 3
    assert len(db[Employee].query(name="John")) == 1


def test_undeclared_attributes_are_stored_not_indexed(db):
    e = Employee(name="Zed", salary=1, nickname="zz")
    db.add(e)
    assert db[Employee].get(e.pk).nickname == "zz"
    assert [x.name for x in db[Employee].query(nickname="zz")] == ["Zed"]  # residual scan


def test_rollback_on_exception_and_savepoints(db):
    add_staff(db)
    with pytest.raises(RuntimeError), db.transaction():
        db.add(Employee(name="Ghost", salary=1))
        raise RuntimeError
    assert len(db[Employee].query(name="Ghost")) == 0
    with db.transaction():
        db.add(Employee(name="Kept", salary=2))
        with pytest.raises(RuntimeError), db.transaction():
            db.add(Employee(name="Inner", salary=3))
            assert len(db[Employee].query(name="Inner")) == 1  # read your own writes
            raise RuntimeError
        assert len(db[Employee].query(name="Inner")) == 0
    assert len(db[Employee].query(name="Kept")) == 1
    assert len(db[Employee]) == 5


def test_changed_objects_are_saved_at_commit(db):
    add_staff(db)
    with db.transaction():
        ann = db[Employee].query(name="Ann")[0]
        ann.salary = 1
    assert db[Employee].query(name="Ann")[0].salary == 1
    assert len(db[Employee].query(InRange("salary", 0, 10))) == 1


def test_unique_index(db):
    db.add(Account(email="a@x", balance=1))
    with pytest.raises(UniqueViolation):
        db.add(Account(email="a@x", balance=2))
    assert len(db[Account]) == 1
    db.add(Account(email=None), Account(email=None))  # NULLs may repeat, as in SQL
    assert len(db[Account]) == 3


def test_large_records_spill_to_their_own_blob(db):
    big = "word " * 5000
    e = Employee(name="Big", description=big)
    db.add(e)
    assert db[Employee].get(e.pk).description == big
    assert len(db[Employee].query(Contains("description", "word"))) == 1
    e.description = "small now"
    db.add(e)
    assert db[Employee].get(e.pk).description == "small now"


def test_concurrent_commits_rebase(make_db):
    storage = MemoryStorage()
    a = make_db(storage)
    b = make_db(storage)
    a.add(Account(email="seed", balance=0))
    with a.transaction():
        a.add(Account(email="from-a", balance=1))
        b.add(Account(email="from-b", balance=2))  # commits first
    emails = {x.email for x in b[Account].all()}
    assert emails == {"seed", "from-a", "from-b"}


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read", "serializable"])
def test_rebase_rechecks_unique(make_db, isolation):
    """Replayed on the newer root, the insert meets the other one's unique value (what
    an insert reads to check it is read again by the replay, at every level)."""
    storage = MemoryStorage()
    a = make_db(storage, isolation=isolation)
    b = make_db(storage)
    a.add(Account(email="seed"))
    with pytest.raises(UniqueViolation), a.transaction():
        a.add(Account(email="same"))
        b.add(Account(email="same"))
    assert len(b[Account].query(email="same")) == 1


def test_bad_input_is_refused_clearly(db):
    with pytest.raises(QueryError):
        db[Employee].query("salary > 5")
    with pytest.raises(QueryError):
        db[object]
    with pytest.raises(NotSupportedError):
        type(db)(("localhost", 8001), password="x", kdf="fast")


def test_sqlite_store_persists_across_processes_of_the_api(make_db, tmp_path):
    url = f"sqlite:///{tmp_path}/p.zdb"
    first = make_db(url)
    add_staff(first)
    first.close()
    again = make_db(url)
    assert len(again[Employee].query(name="John")) == 2


def test_failed_add_leaves_no_trace(db):
    db.add(Account(email="taken"))
    with db.transaction():
        fresh = Employee(name="Eve")
        dup = Account(email="taken")
        with pytest.raises(UniqueViolation):
            db.add(fresh, dup)  # two models: all or nothing, even inside a transaction
        assert fresh.pk is None and dup.pk is None
        db.add(Account(email="other"))
    assert len(db[Employee].query(name="Eve")) == 0
    assert {a.email for a in db[Account].all()} == {"taken", "other"}


def test_large_results_stream_in_batches(make_db):
    storage = MemoryStorage()
    writer = make_db(storage)
    writer.add(*(Employee(name=f"n{i % 7}", salary=i) for i in range(1500)))
    db = make_db(storage)  # a cold cache: every batch must be read from the store
    query = db[Employee].query(Gt("salary", 99), sort_index="salary")
    stream = iter(query)
    first = next(stream)
    before = db.stats()
    rest = list(stream)
    after = db.stats()
    assert [first.salary] + [e.salary for e in rest] == list(range(100, 1500))
    # 1,400 results in batches of 512: the first batch did not read everything, and
    # each further batch cost its own round trip.
    assert after["round_trips"] - before["round_trips"] >= 2
    assert after["bytes_received"] > before["bytes_received"]
    filtered = db[Employee].query(Gt("salary", 99), Eq("name", "n3"), sort_index="salary")
    assert [e.salary for e in filtered] == [s for s in range(100, 1500) if s % 7 == 3]


def test_embedded_store_collects_its_garbage(make_db):
    storage = MemoryStorage()
    db = make_db(storage)
    names = "abc"
    people = [Employee(name=name, salary=salary) for salary, name in enumerate(names)]
    for person in people:
        db.add(person)
    people[0].salary = 10  # the fourth commit merges the four runs; its change to a
    db.add(people[0])  # record an older run holds makes both runs' leaves garbage
    assert len(db.read_root().trees["r/Employee"]) == 1
    pending = storage.stats("local", "main")["garbage"]
    assert pending > 0
    assert db.collect_garbage(retention=3600) == 0  # too young: readers may need them
    assert db.collect_garbage(retention=0) == pending
    assert storage.stats("local", "main")["garbage"] == 0
    assert {e.name for e in db[Employee].all()} == set(names)  # nothing live was lost


def test_stats_count_merges_apart(make_db):
    db = make_db()
    for salary in range(3):
        db.add(Employee(name="a", salary=salary))
    quiet = db.stats()
    assert quiet["merges"] == 0 and quiet["merge_bytes_sent"] == 0
    db.add(Employee(name="a", salary=4))  # the fourth run of each tree: a merge
    after = db.stats()
    assert after["merges"] == 1
    assert 0 < after["merge_bytes_sent"] < after["bytes_sent"] - quiet["bytes_sent"]
    assert after["merge_round_trips"] == 1  # its inputs were this client's: only the commit


def test_an_equality_reads_one_leaf_of_the_runs_that_hold_its_value(make_db):
    """Runs of a one-field index keep Bloom filters of their values: an equality lookup
    reads the leaf of the one run holding the value, not one in every run."""
    from zerodb_core.btree import Run

    storage = MemoryStorage()
    db = make_db(storage, merge_factor=100, node_bytes=256)
    for batch in range(4):  # four runs of interleaved values
        with db.transaction():
            db.add(*(Employee(name=f"n{i:03d}", salary=i) for i in range(batch, 400, 4)))
    runs = db.read_root().trees["i/Employee/name"]
    assert len(runs) == 4 and all(run.filter for run in runs)
    view = db.current_view()
    leaves = [{leaf.id for leaf in view.run([Run(run).leaves_reader()])[0]} for run in runs]
    fresh = make_db(storage, merge_factor=100, node_bytes=256)
    fetched: list[bytes] = []
    get = fresh.transport._get_blobs
    fresh.transport._get_blobs = lambda database, ids: fetched.extend(ids) or get(database, ids)
    assert [e.salary for e in fresh[Employee].query(name="n201")] == [201]
    touched = [len(run_leaves & set(fetched)) for run_leaves in leaves]
    assert sorted(touched) == [0, 0, 0, 1]


def test_filters_serve_equalities_only(make_db):
    """A prefix range looks like an equality's (every key from one prefix on), but the
    filters hold whole values: prefix and range queries must read every run."""
    from zerodb_core.query import StartsWith

    db = make_db(merge_factor=100)
    for batch in ("", "ab", "abc", "b"):  # four runs, one name each
        db.add(Employee(name=batch, salary=len(batch)))
    assert len(db.read_root().trees["i/Employee/name"]) == 4
    assert sorted(e.name for e in db[Employee].query(StartsWith("name", ""))) == [
        "",
        "ab",
        "abc",
        "b",
    ]
    assert sorted(e.name for e in db[Employee].query(StartsWith("name", "ab"))) == ["ab", "abc"]
    assert [e.name for e in db[Employee].query(name="ab")] == ["ab"]
    assert len(db[Employee].query(name="abc")) == 1


def test_an_embedded_read_of_more_ids_than_one_storage_call_takes(make_db):
    """A merge of large runs reads every node of them at once: the embedded transport
    splits a read above the storage's limit of ids into calls, in one round trip."""
    from blob_server.storage.validation import MAX_IDS_PER_REQUEST

    storage = MemoryStorage()
    db = make_db(storage)
    db.add(Employee(name="a", salary=1))
    node = db.read_root().trees["r/Employee"][0].root
    ids = [node] + [bytes([1]) * 15 + i.to_bytes(1, "big") for i in range(3)]
    ids += [i.to_bytes(16, "big") for i in range(MAX_IDS_PER_REQUEST + 10)]
    before = db.stats()["round_trips"]
    found = db.transport.get_blobs("main", ids)
    assert set(found) == {node}
    assert db.stats()["round_trips"] == before + 1


def test_a_format_1_root_is_refused_with_the_way_across(make_db):
    """Format 1 (copy-on-write trees, full-text indexes of one entry per posting) is not
    read: the error says how to move the data, rather than answering wrongly."""
    from zerodb_core.crypto import BlobKind
    from zerodb_core.rootstate import root_blob_id
    from zerodb_core.serialization import pack

    storage = MemoryStorage()
    db = make_db(storage)
    old = {"v": 1, "seq": 1, "prev": None, "time": 0.0, "trees": {}, "catalog": [], "text": {}}
    root = db.sealer.seal(BlobKind.ROOT, root_blob_id(1), pack(old))
    assert storage.commit("local", "main", expected_seq=0, root=root, blobs={}).ok
    with pytest.raises(NotSupportedError, match=r"format 1.*dumpdata"):
        len(make_db(storage)[Employee])


def test_dropping_a_model_makes_its_large_records_garbage(make_db):
    db = make_db()
    db.add(*(Employee(name=f"Big {i}", description="word " * 2000) for i in range(3)))
    db.add(Employee(name="Small"))
    txn = db.begin()
    name = db[Employee].table().spec.record_tree
    rows = txn.run([txn.tree(name).scan_reader()])[0]
    spilled = set(spilled_value_ids(value for _, value in rows))
    assert len(spilled) == 3  # one blob per large record
    txn.apply(DropModel(db[Employee].table().spec.name))
    assert spilled <= set(txn.ws.garbage)
    db.commit(txn)
    assert db[Employee].table() is None


def test_a_commit_made_again_writes_the_same_postings(db):
    """Building the commit leaves the transaction as it was: a commit that failed (the
    store unreachable) can be tried again, and writes the new documents' postings."""
    with db.transaction() as txn:
        db.add(Employee(name="Ann", description="kernel panic at dawn"))
        spec = db[Employee].table().spec
        text = spec.index_tree(spec.indexes["description"])
        first, second = txn.flush()[0][text], txn.flush()[0][text]
        assert first[0].count == second[0].count == 4  # four words, one document
    assert [e.name for e in db[Employee].query(Contains("description", "panic"))] == ["Ann"]


def test_a_merge_that_fails_closed_leaves_its_commit_standing(make_db, caplog):
    """A merge runs after the commit that set it off is durable: a run it reads that
    fails its integrity check is logged, not raised as if the commit had failed."""
    storage = MemoryStorage()
    db = make_db(storage, merge_factor=2)
    db.add(Employee(name="Ann", salary=1))
    root = db.read_root()
    spec = db[Employee].table().spec
    (state,) = storage._databases.values()
    run = root.trees[spec.record_tree][0]
    blob = state.blobs[run.root]
    state.blobs[run.root] = blob[:-1] + bytes([blob[-1] ^ 1])  # the store flips a bit
    fresh = make_db(storage, merge_factor=2)  # nothing cached
    with caplog.at_level(logging.ERROR, logger="zerodb_core.db"):
        fresh.add(Employee(name="Bob", salary=2))  # two runs per tree: a merge
    assert fresh.read_root().seq == root.seq + 1  # the commit, and no merge
    assert "IntegrityError" in caplog.text and "the commit before it stands" in caplog.text
    assert [e.name for e in fresh[Employee].query(salary=2)] == ["Bob"]


def test_runs_of_an_index_without_filters_merge_by_concatenation(make_db, monkeypatch):
    """Runs of a one-field index whose filter would be too large have none; two such
    runs that do not overlap merge by keeping their leaves (read unopened), and the
    merged run has no filter either: its values are a superset of an input's, which were
    already too many (a kept leaf's values are not at hand: reading them raised
    AttributeError after the commit had stood)."""
    monkeypatch.setattr(filters_module, "MAX_FILTER_BYTES", 0)  # every filter too large
    storage = MemoryStorage()
    db = make_db(storage, merge_factor=2, node_bytes=256)
    for first in (0, 100):  # runs of several leaves (a run of one is read whole)
        with db.transaction():
            for salary in range(first, first + 100):
                db.add(Employee(name=f"E{salary}", salary=salary))
    spec = db[Employee].table().spec
    runs = db.read_root().trees[spec.index_tree(spec.indexes["salary"])]
    assert len(runs) == 1 and runs[0].height > 1 and runs[0].filter is None
    assert [e.name for e in db[Employee].query(salary=150)] == ["E150"]
    assert len(db[Employee].query(Gt("salary", 49))) == 150
