"""``zerodb_core.verify``: a sound database verifies clean; each kind of damage is found."""

from __future__ import annotations

from dataclasses import replace

import pytest

from blob_server.storage.memory import MemoryStorage
from zerodb_core.btree import PUT, Inner, new_id
from zerodb_core.btree.filters import BloomFilter
from zerodb_core.encoding import encode_key
from zerodb_core.models import Field, Model, Text
from zerodb_core.serialization import pack
from zerodb_core.verify import verify


class Person(Model):
    name = Field()
    email = Field(unique=True)
    bio = Text()


def _fill(db, n=300):
    db.add(
        *(
            Person(name=f"p{i % 17}", email=f"p{i}@x", bio=f"word{i % 5} kernel panic", n=i)
            for i in range(n)
        )
    )


def _tree(db, txn, index):
    spec = txn.catalog.get("Person")
    return txn.tree(spec.index_tree(spec.indexes[index]))


@pytest.fixture
def db(make_db):
    # Small nodes: deep trees with inner nodes from a few hundred records.
    database = make_db(MemoryStorage(), node_bytes=512)
    _fill(database)
    return database


def test_a_sound_database_verifies_clean(db):
    seen = []
    report = verify(db, progress=lambda advance, total: seen.append((advance, total)))
    assert report.ok, report.problems
    assert report.records == 300
    assert report.trees == 4  # records + three indexes
    assert report.blobs > 20  # every node, decrypted again from the store
    assert report.index_entries > 600
    assert seen[0][0] == 0 and seen[0][1] == sum(advance for advance, _ in seen[1:])
    assert report.to_dict()["ok"] is True


def test_an_empty_database_verifies_clean(make_db):
    report = verify(make_db())
    assert report.ok and report.seq == 0 and report.blobs == 0


def test_verify_after_deletes_and_updates(db):
    people = list(db[Person].all())
    db.remove(*people[:150:3])
    with db.transaction():
        for person in people[200:260]:
            person.name = "renamed"
            person.bio = "other words entirely"
    assert verify(db).ok


def test_a_wrong_index_entry_is_found(db):
    """An entry pointing at a record whose value is different (written through the
    BTree API, committed like any write)."""
    with db.transaction() as txn:
        tree = _tree(db, txn, "name")
        tree.put(encode_key("nobody") + encode_key(5), pack(5), False)
        txn.ops.append(_Nothing())  # make the commit happen
    report = verify(db)
    assert not report.ok
    assert any(
        "index Person.name" in str(p) and "does not match its value" in str(p)
        for p in report.problems
    ), report.problems


def test_a_missing_entry_and_a_dangling_entry_are_found(db):
    pk = next(p.pk for p in db[Person].all() if p.email == "p7@x")
    with db.transaction() as txn:
        tree = _tree(db, txn, "email")
        tree.delete(encode_key("p7@x"))
        tree.put(encode_key("ghost@x"), pack(99_999), False)
        txn.ops.append(_Nothing())
    messages = [str(p) for p in verify(db).problems]
    assert any(f"record {pk} has no entry" in m for m in messages), messages
    assert any("99999, which does not exist" in m for m in messages), messages


def test_a_unique_duplicate_is_found(db):
    people = {p.pk: p for p in db[Person].all()}
    with db.transaction() as txn:
        spec = txn.catalog.get("Person")
        records = txn.tree(spec.record_tree)
        record = dict(people[3].to_record(), email="p4@x")
        records.put(encode_key(3), b"\x00" + pack([3, record]), True)
        txn.ops.append(_Nothing())
    messages = [str(p) for p in verify(db).problems]
    assert any("duplicate" in m and "Person.email" in m for m in messages), messages


def _forge_run(txn, tree, change_root, **ref_changes):
    """Replace the newest run of ``tree`` by one whose root node ``change_root`` altered
    (a new node, written by the commit like a merge's)."""
    run = tree.runs[0]
    node = txn.run([_fetch(run.root)])[0]
    forged = Inner(new_id(), list(node.keys), list(node.children), list(node.counts))
    change_root(forged)
    txn.merged.append(forged)
    txn.runs[tree.name] = (replace(run, root=forged.id, **ref_changes), *tree.runs[1:])


def _fetch(blob_id):
    nodes = yield [blob_id]
    return nodes[blob_id]


def _problems_after(db, damage) -> list[str]:
    """Commit ``damage(txn, name index tree)`` as it is, then verify."""
    with db.transaction() as txn:
        damage(txn, _tree(db, txn, "name"))
        txn.ops.append(_Nothing())
    return [str(p) for p in verify(db).problems]


def test_a_wrong_count_in_an_inner_node_is_found(db):
    def damage(txn, tree):
        assert tree.runs[0].height >= 2
        count = tree.runs[0].count
        _forge_run(
            txn, tree, lambda root: root.counts.__setitem__(0, root.counts[0] + 1), count=count + 1
        )

    messages = _problems_after(db, damage)
    assert any("parent counts" in m for m in messages), messages


def test_runs_that_disagree_are_found(db):
    """A newer run that puts a key an older run holds (so counts would be off by one)."""

    def damage(txn, tree):
        key, value = txn.run([tree.scan_reader(limit=1)])[0][0]
        txn.changes.writable(tree.name).restore(key, (PUT, value))

    messages = _problems_after(db, damage)
    assert any("disagree with the older runs" in m for m in messages), messages


def test_tombstones_in_the_oldest_run_are_found(db):
    messages = _problems_after(
        db, lambda txn, tree: _forge_run(txn, tree, lambda r: None, plain=False)
    )
    assert any("oldest run of a tree holds more than puts" in m for m in messages), messages


def test_a_tampered_blob_is_found(make_db):
    storage = MemoryStorage()
    db = make_db(storage, node_bytes=512)
    _fill(db, 100)
    spec = db.snapshot().catalog.get("Person")
    root_id = db.snapshot().runs[spec.index_tree(spec.indexes["name"])][0].root
    blobs = storage._databases[("local", "main")].blobs  # test-only introspection
    sealed = bytearray(blobs[root_id])
    sealed[-1] ^= 1
    blobs[root_id] = bytes(sealed)
    del blobs[db.snapshot().runs[spec.record_tree][0].root]
    messages = [str(p) for p in verify(db).problems]
    assert any("authentication failed" in m for m in messages), messages
    assert any("missing from the store" in m for m in messages), messages


class _Nothing:
    """A no-op write operation: lets a transaction whose only changes are raw tree
    writes commit."""

    def apply(self, txn):
        return None


def test_models_limits_the_check(db):
    report = verify(db, models=["Person", "Missing"])
    assert [str(p) for p in report.problems] == ["Missing: no such model in the catalog"]


def test_a_filter_that_misses_a_value_is_found(db):
    """A run's filter that says no for one of its values would make lookups skip it."""

    def damage(txn, tree):
        run = tree.runs[0]
        bloom = txn.run([_fetch(run.filter)])[0]
        empty = BloomFilter(new_id(), bloom.size, bloom.probes, bytes(len(bloom.bits)))
        txn.merged.append(empty)
        txn.runs[tree.name] = (replace(run, filter=empty.id), *tree.runs[1:])

    messages = _problems_after(db, damage)
    assert any("filter misses" in m for m in messages), messages
