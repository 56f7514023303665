"""Isolation levels, shown by the anomalies each one allows or prevents.

Two clients (two ``DB`` objects on one store) interleave deterministically: both take
their snapshot, one commits, then the other. Which anomalies each level lets through is
the table in docs/architecture.md ("Isolation levels"):

=================  ===========  ==========  =======  ===========
level              lost update  write skew  phantom  blind writes
=================  ===========  ==========  =======  ===========
read committed     happens      happens     happens  never fail
repeatable read    prevented    happens     happens  never fail
serializable       prevented    prevented   prevented  never fail
=================  ===========  ==========  =======  ===========

and ``DB.transactional`` turns a refusal into a retry, so concurrent read-modify-writes
in several processes count exactly.
"""

from __future__ import annotations

import multiprocessing
import traceback
from contextlib import nullcontext
from pathlib import Path

import pytest

from blob_server.storage.memory import MemoryStorage
from tests.conftest import PASSWORD
from tests.core.hr import Employee
from zerodb_core import DB, QueryError, SerializationError
from zerodb_core.query import InRange

LEVELS = ["read committed", "repeatable read", "serializable"]


def pair(make_db, isolation: str) -> tuple[DB, DB]:
    storage = MemoryStorage()
    return make_db(storage, isolation=isolation), make_db(storage, isolation=isolation)


def person(db: DB, name: str) -> Employee:
    (found,) = db[Employee].query(name=name)
    return found


def seed(db: DB, **salaries: int) -> None:
    with db.transaction():
        db.add(
            *[Employee(name=n, surname="s", salary=v, description="d") for n, v in salaries.items()]
        )


@pytest.mark.parametrize("isolation", LEVELS)
def test_lost_update(make_db, isolation):
    """Both read the counter at 0 and write it plus one; the second to commit either
    overwrites the first (one increment lost) or is refused."""
    a, b = pair(make_db, isolation)
    seed(a, counter=0)
    outcome = nullcontext() if isolation == "read committed" else pytest.raises(SerializationError)
    with outcome, a.transaction():
        mine = person(a, "counter")
        with b.transaction():
            theirs = person(b, "counter")
            theirs.salary += 1
        mine.salary += 1
    # b's increment only: a's was acknowledged and lost (read committed) or refused.
    assert person(b, "counter").salary == 1


@pytest.mark.parametrize("isolation", LEVELS)
def test_write_skew(make_db, isolation):
    """Two doctors on call; each checks that the other still is, and leaves. Only a
    serializable transaction sees that what it read (the other's row) changed."""
    a, b = pair(make_db, isolation)
    seed(a, alice=1, bob=1)
    outcome = nullcontext() if isolation != "serializable" else pytest.raises(SerializationError)
    with outcome, a.transaction():
        if person(a, "bob").salary == 1:
            with b.transaction():
                if person(b, "alice").salary == 1:
                    person(b, "bob").salary = 0
            person(a, "alice").salary = 0
    on_call = [e.name for e in b[Employee].query() if e.salary == 1]
    assert on_call == ([] if isolation != "serializable" else ["alice"])


@pytest.mark.parametrize("isolation", LEVELS)
def test_phantom(make_db, isolation):
    """A count of a range, then a write that depends on it; another client inserts
    into the range meanwhile."""
    a, b = pair(make_db, isolation)
    seed(a, x=10, y=20)
    outcome = nullcontext() if isolation != "serializable" else pytest.raises(SerializationError)
    with outcome, a.transaction():
        counted = len(a[Employee].query(InRange("salary", 0, 100)))
        seed(b, z=30)
        a.add(Employee(name="count", surname="s", salary=1000 + counted, description="d"))
    stored = [e.salary for e in b[Employee].query(name="count")]
    assert stored == ([1002] if isolation != "serializable" else [])


@pytest.mark.parametrize("isolation", LEVELS)
def test_blind_inserts_never_fail(make_db, isolation):
    a, b = pair(make_db, isolation)
    seed(a, first=1)
    with a.transaction():
        a.add(Employee(name="mine", surname="s", salary=2, description="d"))
        seed(b, theirs=3)
    assert sorted(e.name for e in b[Employee].query()) == ["first", "mine", "theirs"]


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_deleting_a_record_another_changed_is_refused(make_db, isolation):
    a, b = pair(make_db, isolation)
    seed(a, gone=1)
    with pytest.raises(SerializationError, match="wrote"), a.transaction():
        doomed = person(a, "gone")
        with b.transaction():
            person(b, "gone").salary = 2
        a.remove(doomed)
    assert person(b, "gone").salary == 2


def test_a_merge_of_older_runs_is_no_change(make_db):
    """Runs merged meanwhile hold nothing newer than the snapshot (their newest commit
    tells), so what was read did not change."""
    a, b = pair(make_db, "serializable")
    for n in range(3):  # three runs per tree, below the merge factor
        seed(a, **{f"p{n}": n})
    with a.transaction():
        seen = len(a[Employee].query(InRange("salary", 0, 100)))
        assert b.compact() > 0
        a.add(Employee(name="total", surname="s", salary=seen, description="d"))
    assert person(b, "total").salary == 3


def test_writes_to_other_records_are_not_a_change(make_db):
    a, b = pair(make_db, "serializable")
    seed(a, mine=1, other=1)
    with a.transaction():
        person(a, "mine").salary = 2
        with b.transaction():
            person(b, "other").salary = 5
    assert (person(b, "mine").salary, person(b, "other").salary) == (2, 5)


def test_transactional_retries_until_it_commits(make_db):
    a, b = pair(make_db, "serializable")
    seed(a, counter=0)
    attempts = []

    @a.transactional
    def increment() -> int:
        attempts.append(1)
        counter = person(a, "counter")
        if len(attempts) == 1:  # someone else increments in between, once
            with b.transaction():
                person(b, "counter").salary += 1
        counter.salary += 1
        return counter.salary

    assert increment() == 2
    assert len(attempts) == 2 and person(b, "counter").salary == 2


def test_transactional_gives_up_after_its_retries(make_db):
    a, b = pair(make_db, "serializable")
    seed(a, counter=0)

    @a.transactional(retries=2)
    def always_beaten() -> None:
        counter = person(a, "counter")
        with b.transaction():
            person(b, "counter").salary += 1
        counter.salary += 1

    with pytest.raises(SerializationError):
        always_beaten()
    assert person(b, "counter").salary == 3  # the other client's three increments


def test_unknown_levels_are_refused(make_db):
    with pytest.raises(QueryError, match="isolation level"):
        make_db(isolation="snapshot")
    db = make_db()
    with pytest.raises(QueryError, match="isolation level"), db.transaction("READ COMMITTED"):
        pass


# -- several processes -------------------------------------------------------------------

PROCESSES = 4
INCREMENTS = 12


def _incrementer(path: str, errors: str) -> None:
    try:
        with DB(f"sqlite:///{path}", password=PASSWORD, kdf="fast") as db:

            @db.transactional(retries=100)
            def increment() -> None:
                person(db, "counter").salary += 1

            for _ in range(INCREMENTS):
                increment()
    except BaseException:
        Path(errors).write_text(traceback.format_exc())
        raise


def test_read_modify_write_in_several_processes_counts_exactly(tmp_path):
    path = tmp_path / "counter.zdb"
    with DB(f"sqlite:///{path}", password=PASSWORD, kdf="fast") as db:
        seed(db, counter=0)
    ctx = multiprocessing.get_context("spawn")
    errors = [str(tmp_path / f"error-{i}") for i in range(PROCESSES)]
    procs = [ctx.Process(target=_incrementer, args=(str(path), e)) for e in errors]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(300)
    failures = [Path(e).read_text() for e in errors if Path(e).exists()]
    assert not failures, failures[0]
    assert all(proc.exitcode == 0 for proc in procs)
    with DB(f"sqlite:///{path}", password=PASSWORD, kdf="fast") as db:
        assert person(db, "counter").salary == PROCESSES * INCREMENTS
