"""Commit leases of embedded stores (``zerodb_core.transport.leases``) and what ``DB`` does
with them: a turn after a lost race, replayed exactly as without leases (isolation levels
refuse what they refused), and given back whatever happens.

Processes sharing an SQLite file are in ``tests/server/test_fair_commits.py``; here two
``FileLeases`` on one file stand for two processes (``flock`` locks belong to open files,
so they exclude each other within a process too).
"""

from __future__ import annotations

import threading
import time

import pytest

from blob_server.storage import MemoryStorage
from tests.core.hr import Account, Employee
from zerodb_core import DB, SerializationError
from zerodb_core.transport import LocalTransport
from zerodb_core.transport.leases import FileLeases, ThreadLeases
from zerodb_core.transport.local import store_leases

PASSWORD = "lease passphrase"


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


# -- ThreadLeases ------------------------------------------------------------------------------


def test_thread_leases_hand_turns_out_in_the_order_asked():
    leases = ThreadLeases(timeout=30)
    first = leases.acquire("main")
    assert leases.busy("main", None) and not leases.busy("main", first)
    assert not leases.busy("other", None)
    order: list[int] = []

    def waiter(n: int) -> None:
        token = leases.acquire("main")
        order.append(n)
        leases.release("main", token)

    threads = []
    for n in range(4):
        threads.append(threading.Thread(target=waiter, args=(n,)))
        threads[-1].start()
        _wait_until(lambda n=n: len(leases._turns["main"].waiting) == n + 1, "not queued")
    leases.release("main", first)
    for thread in threads:
        thread.join(30)
    assert order == [0, 1, 2, 3]
    assert not leases.busy("main", None) and leases._turns == {}


def test_thread_leases_pass_on_a_turn_kept_past_the_timeout():
    leases = ThreadLeases(timeout=0.05)
    hung = leases.acquire("main")
    token = leases.acquire("main")  # waits for the timeout, not for a release
    assert token is not None and token is not hung
    assert leases.busy("main", hung)  # the late holder's commit must now wait
    leases.release("main", hung)  # no effect: it holds nothing
    assert leases.busy("main", None)


def test_thread_leases_give_up_a_wait_that_runs_out():
    leases = ThreadLeases(timeout=30, wait=0.01)
    held = leases.acquire("main")
    assert leases.acquire("main") is None
    assert list(leases._turns["main"].waiting) == []
    leases.release("main", held)
    assert leases._turns == {}


def test_every_transport_on_one_memory_store_shares_its_leases():
    storage = MemoryStorage()
    assert store_leases(storage) is store_leases(storage)
    assert store_leases(storage) is not store_leases(MemoryStorage())
    assert LocalTransport(storage).leases is store_leases(storage)
    assert LocalTransport(storage, leases=False).leases is None


# -- FileLeases --------------------------------------------------------------------------------


def test_file_leases_exclude_each_other_and_show_who_queues(tmp_path):
    store = str(tmp_path / "blobs.zdb")
    mine, theirs = FileLeases(store, timeout=60), FileLeases(store, timeout=60, wait=0.02)
    try:
        assert not mine.busy("main", None) and not theirs.busy("main", None)
        held = mine.acquire("main")
        assert held is not None
        assert not mine.busy("main", held)  # the holder commits in its turn
        assert theirs.busy("main", None) and theirs.busy("other", None)  # one lease a file
        assert theirs.acquire("main") is None  # its wait ran out
        mine.release("main", held)
        mine.release("main", held)  # once only
        assert not theirs.busy("main", None)
        again = theirs.acquire("main")
        assert again is not None and mine.busy("main", None)
        theirs.release("main", again)
    finally:
        mine.close()
        theirs.close()


def test_a_file_lease_kept_past_the_timeout_holds_nobody_back(tmp_path):
    store = str(tmp_path / "blobs.zdb")
    hung, other = FileLeases(store, timeout=0.05), FileLeases(store, timeout=0.05)
    try:
        held = hung.acquire("main")
        time.sleep(0.1)  # past its timeout: a lock cannot be taken from a live process...
        assert not other.busy("main", None)  # ...but nobody waits for it any more
        assert other.acquire("main") is None  # and a turn is not waited for: race
        hung.release("main", held)
        assert other.acquire("main") is not None
    finally:
        hung.close()
        other.close()


def test_an_sqlite_store_gets_file_leases_beside_it(tmp_path):
    db = DB(f"sqlite:///{tmp_path}/blobs.zdb", password=PASSWORD, kdf="fast")
    try:
        assert isinstance(db.transport.leases, FileLeases)
        assert db.transport.leases.lease_path == f"{tmp_path}/blobs.zdb.lease"
    finally:
        db.close()


# -- DB and leases -----------------------------------------------------------------------------


def _queued(storage: MemoryStorage, n: int) -> bool:
    turns = store_leases(storage)._turns.get("main")
    return turns is not None and len(turns.waiting) == n


def _raise_in_thread(db: DB, isolation: str, pk: int, balance: int):
    """Set an account's balance in a transaction (read-modify-write) on a thread."""
    outcome: list = []

    def run() -> None:
        try:
            with db.transaction(isolation):
                account = db[Account].get(pk)
                account.balance = balance
            outcome.append("committed")
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("isolation", ["repeatable read", "read committed"])
def test_a_turn_replays_as_a_lost_race_would(isolation):
    """A writes a record that an old client (no leases) changes while A waits for its
    turn: at repeatable read A's turn ends in ``SerializationError`` (and the lease is
    given back), at read committed A's write is replayed and wins; as without leases."""
    storage = MemoryStorage()
    a = DB(LocalTransport(storage), password=PASSWORD, kdf="fast")
    old = DB(LocalTransport(storage, leases=False), password=PASSWORD, kdf="fast")
    account = Account(email="x@y", balance=100)
    a.add(account)
    leases = store_leases(storage)
    holder = leases.acquire("main")  # somebody's turn: A's commit will wait
    thread, outcome = _raise_in_thread(a, isolation, account.pk, 150)
    _wait_until(lambda: _queued(storage, 1), "A never queued")
    theirs = old[Account].get(account.pk)
    theirs.balance = 99
    old.add(theirs)  # the old client ignores the lease
    leases.release("main", holder)  # A's turn: on the root with the old client's change
    thread.join(30)
    if isolation == "repeatable read":
        assert isinstance(outcome[0], SerializationError)
        assert a[Account].get(account.pk).balance == 99
    else:
        assert outcome == ["committed"]
        assert a[Account].get(account.pk).balance == 150
    assert not leases.busy("main", None) and leases._turns == {}  # given back either way


def test_threads_on_a_memory_store_all_commit():
    storage = MemoryStorage()
    dbs = [DB(LocalTransport(storage), password=PASSWORD, kdf="fast") for _ in range(4)]
    errors: list[BaseException] = []

    def insert(db: DB, worker: int) -> None:
        try:
            for n in range(25):
                db.add(Employee(name=f"t{worker}", surname=f"t{worker}-{n}", salary=n))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=insert, args=(db, w)) for w, db in enumerate(dbs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    surnames = [e.surname for e in dbs[0][Employee].all()]
    assert sorted(surnames) == sorted(f"t{w}-{n}" for w in range(4) for n in range(25))


def test_lock_files_that_cannot_be_opened_leave_the_client_racing(tmp_path, caplog):
    """A store in a directory this client may not create files in (or another user's
    lock files): no leases for it, a warning, and its commits go on as before leases."""
    store = tmp_path / "nowhere" / "blobs.zdb"  # the directory does not exist
    leases = FileLeases(str(store))
    assert not leases.busy("main", None)
    assert leases.acquire("main") is None
    assert sum("commit leases of" in r.getMessage() for r in caplog.records) == 1
