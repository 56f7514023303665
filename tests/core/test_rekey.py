"""``zerodb_core.rekey``: passphrase change re-wraps keyring and key file; no epoch rotation."""

from __future__ import annotations

import pytest

from blob_server.storage.memory import MemoryStorage
from zerodb_core import DB, IntegrityError, WrongPassphraseError
from zerodb_core.exceptions import ConflictError, QueryError
from zerodb_core.keyfile import KeyFile
from zerodb_core.models import Field, Model
from zerodb_core.rekey import change_passphrase, rotate_epoch
from zerodb_core.status import database_status, describe_root

OLD = "old passphrase"
NEW = "new passphrase"


class Item(Model):
    name = Field()


def test_change_passphrase_rewraps_keyring_and_key_file(tmp_path):
    storage = MemoryStorage()
    db = DB(storage, password=OLD, kdf="fast")
    db.add(Item(name="a"), Item(name="b"))
    key_path = tmp_path / "t.zdbkey"
    keyfile = KeyFile.create("acme")
    keyfile.save(key_path, OLD, kdf="fast")
    done = change_passphrase(db, OLD, NEW, key_file=key_path)
    assert done["keyring"] and done["key_file"] == str(key_path) and done["epochs"] == [1]
    assert (key_path.stat().st_mode & 0o777) == 0o600
    assert KeyFile.load(key_path, NEW).login_key == keyfile.login_key
    with pytest.raises(WrongPassphraseError):
        KeyFile.load(key_path, OLD)
    with pytest.raises(WrongPassphraseError):
        DB(storage, password=OLD)
    reopened = DB(storage, password=NEW)
    assert sorted(i.name for i in reopened[Item].all()) == ["a", "b"]
    assert [p.name for p in tmp_path.iterdir()] == ["t.zdbkey"]  # no staged file left


def test_a_wrong_old_passphrase_changes_nothing(tmp_path):
    storage = MemoryStorage()
    db = DB(storage, password=OLD, kdf="fast")
    with pytest.raises(WrongPassphraseError):
        change_passphrase(db, "wrong", NEW)
    DB(storage, password=OLD)


def test_a_concurrent_keyring_change_leaves_the_key_file_alone(tmp_path, monkeypatch):
    storage = MemoryStorage()
    db = DB(storage, password=OLD, kdf="fast")
    key_path = tmp_path / "t.zdbkey"
    KeyFile.create("acme").save(key_path, OLD, kdf="fast")
    monkeypatch.setattr(db.transport, "put_keyring", lambda *a, **k: False)
    with pytest.raises(ConflictError):
        change_passphrase(db, OLD, NEW, key_file=key_path)
    KeyFile.load(key_path, OLD)
    assert [p.name for p in tmp_path.iterdir()] == ["t.zdbkey"]


def test_same_or_empty_new_passphrase_is_refused():
    db = DB(MemoryStorage(), password=OLD, kdf="fast")
    for new in (OLD, ""):
        with pytest.raises(QueryError):
            change_passphrase(db, OLD, new)


def test_epoch_rotation_seals_new_blobs_under_a_new_epoch_that_others_learn():
    store = MemoryStorage()
    writer = DB(store, password=OLD, kdf="fast")
    reader = DB(store, password=OLD, kdf="fast")
    writer.add(*(Item(name=f"old{i}") for i in range(20)))
    assert len(reader[Item].query(name="old3")) == 1
    assert rotate_epoch(writer, OLD) == 2
    assert writer.keyring.epochs == (1, 2) and writer.keys.current_epoch == 2
    writer.add(*(Item(name=f"new{i}") for i in range(20)))
    sealed = store._databases[("local", "main")].blobs.values()  # what the store holds
    assert {int.from_bytes(b[6:10], "big") for b in sealed} == {1, 2}  # header: key epoch
    # The reader still holds epoch 1 only; it reloads the keyring on the first new blob.
    assert reader.keyring.epochs == (1,)
    assert {i.name for i in reader[Item].query(name="new7")} == {"new7"}
    assert reader.keyring.epochs == (1, 2)
    assert len(reader[Item]) == 40


def test_a_keyring_that_lost_an_epoch_is_refused():
    store = MemoryStorage()
    db = DB(store, password=OLD, kdf="fast")
    db.add(Item(name="a"))
    keyrings = store._databases[("local", "main")].keyrings
    before = dict(keyrings)
    rotate_epoch(db, OLD)
    db.add(Item(name="b"))
    keyrings.update(before)  # the server rolls the keyring back
    with pytest.raises(IntegrityError, match="lost key epochs"):
        db.reload_keyring()


def test_status_comes_from_the_root():
    db = DB(MemoryStorage(), password=OLD, kdf="fast")
    db.add(*(Item(name=str(i)) for i in range(10)))
    status = database_status(db)
    assert status["models"]["Item"]["records"] == 10
    name_index = status["models"]["Item"]["indexes"]["name"]
    runs = db.read_root().trees["i/Item/name"]
    assert name_index == {
        "kind": "field",
        "fields": ["name"],
        "entries": 10,
        "height": 1,
        "runs": 1,
        "bytes": runs[0].bytes,
    }
    assert runs[0].bytes > 0
    assert status["key_epochs"] == [1] and status["unowned_trees"] == []
    assert describe_root(db.snapshot().root)["seq"] == status["seq"] > 0
