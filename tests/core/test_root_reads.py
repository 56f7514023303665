"""When an embedded client reads the root: once when it opens (with the keyring), and
again only when the storage's root marker says a commit may have come since.

Each case checks both halves: no root read while nothing changed (counted with a spy on
the transport), and the new data seen as soon as anyone commits: another ``DB`` on the
same storage object, another connection to the same SQLite file, another process.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from blob_server.storage.memory import MemoryStorage
from blob_server.storage.sqlite import SQLiteStorage
from tests.core.hr import Employee
from zerodb_core import DB

REPO = Path(__file__).resolve().parents[2]


def root_reads(db: DB) -> list[str]:
    """Record every root read of ``db``'s transport from now on."""
    reads: list[str] = []
    original = db.transport._get_root

    def spy(database: str):
        reads.append(database)
        return original(database)

    db.transport._get_root = spy
    return reads


def names(db: DB) -> list[str]:
    return sorted(e.name for e in db[Employee].query())


def add(db: DB, name: str) -> None:
    with db.transaction():
        db.add(Employee(name=name, surname="S", salary=1, description="d"))


@pytest.fixture(params=["memory", "sqlite"])
def shared_storage(request, tmp_path):
    storage = MemoryStorage() if request.param == "memory" else SQLiteStorage(tmp_path / "s.zdb")
    yield storage
    storage.close()


def test_opening_reads_the_keyring_and_the_root_in_one_round_trip(make_db, tmp_path):
    store = f"sqlite:///{tmp_path / 'one.zdb'}"
    add(make_db(store), "Ann")
    db = make_db(store)
    assert db.stats()["round_trips"] == 1
    reads = root_reads(db)
    assert names(db) == ["Ann"]
    assert reads == []  # the first query used the root read with the keyring


def test_the_root_read_at_open_is_not_used_once_a_commit_came_after(make_db, tmp_path):
    store = f"sqlite:///{tmp_path / 'late.zdb'}"
    writer = make_db(store)
    add(writer, "Ann")
    reader = make_db(store)
    add(writer, "Bob")  # after the reader opened
    reads = root_reads(reader)
    assert names(reader) == ["Ann", "Bob"]
    assert reads == ["main"]


def test_another_db_on_the_same_storage_object(make_db, shared_storage):
    """Same storage object: on SQLite the same thread's connection, which SQLite's
    data_version does not flag for its own commits (the count of writes does)."""
    reader, writer = make_db(shared_storage), make_db(shared_storage)
    add(writer, "Ann")
    assert names(reader) == ["Ann"]
    reads = root_reads(reader)
    assert names(reader) == ["Ann"]
    assert reads == []  # nothing changed: no root read
    add(writer, "Bob")
    assert names(reader) == ["Ann", "Bob"]
    assert reads == ["main"]


def test_another_thread_on_the_same_sqlite_storage(make_db, tmp_path):
    storage = SQLiteStorage(tmp_path / "threads.zdb")
    reader, writer = make_db(storage), make_db(storage)
    add(writer, "Ann")
    assert names(reader) == ["Ann"]
    thread = threading.Thread(target=add, args=(writer, "Bob"))
    thread.start()
    thread.join()
    assert names(reader) == ["Ann", "Bob"]
    storage.close()


def test_another_connection_to_the_same_file(make_db, tmp_path):
    store = f"sqlite:///{tmp_path / 'two.zdb'}"
    reader, writer = make_db(store), make_db(store)  # two SQLiteStorage objects
    add(writer, "Ann")
    assert names(reader) == ["Ann"]
    reads = root_reads(reader)
    assert names(reader) == ["Ann"]
    assert reads == []
    add(writer, "Bob")
    assert names(reader) == ["Ann", "Bob"]
    assert reads == ["main"]


def test_another_process_on_the_same_file(make_db, tmp_path):
    path = tmp_path / "procs.zdb"
    reader = make_db(f"sqlite:///{path}")
    add(reader, "Ann")
    assert names(reader) == ["Ann"]
    script = (
        "from tests.core.hr import Employee\n"
        "from tests.conftest import PASSWORD\n"
        "from zerodb_core import DB\n"
        f"with DB('sqlite:///{path}', password=PASSWORD, kdf='fast') as db:\n"
        "    with db.transaction():\n"
        "        db.add(Employee(name='Bob', surname='S', salary=1, description='d'))\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=120)
    assert names(reader) == ["Ann", "Bob"]


def test_a_store_that_cannot_tell_is_read_every_time(make_db):
    """A storage without a root marker (the default) gets a root read per query."""

    class Unmarked(MemoryStorage):
        def root_marker(self, tenant: str, database: str) -> None:
            return None

    db = make_db(Unmarked())
    add(db, "Ann")
    reads = root_reads(db)
    assert names(db) == ["Ann"] and names(db) == ["Ann"]
    assert reads == ["main", "main"]
