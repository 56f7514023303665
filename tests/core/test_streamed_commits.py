"""Streamed commits in the embedded store: ``LocalTransport`` splits a commit larger than
one storage call (``LOCAL_LIMITS``, made small here) into ``stage`` calls and a commit
that names them, exactly as ``RemoteTransport`` splits one larger than a request (the
same code in ``Transport.commit``). Counted, never timed.

The remote side (limits announced at login, pipelined stage requests, a server started
with small limits) is in ``tests/server/test_quota.py`` and ``test_streamed_e2e.py``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from blob_server.exceptions import BlobExistsError
from blob_server.storage import MemoryStorage, SQLiteStorage
from tests.conftest import PASSWORD
from tests.core.hr import Employee
from zerodb_core import DB, CommitTooLargeError, IntegrityError
from zerodb_core.transport.local import LOCAL_LIMITS, LocalTransport
from zerodb_core.transport.staging import (
    BLOB_OVERHEAD,
    ID_OVERHEAD,
    REQUEST_OVERHEAD,
    Pending,
    RequestLimits,
    plan_commit,
)

REPO = Path(__file__).resolve().parents[2]
SMALL = dataclasses.replace(LOCAL_LIMITS, blobs=4, bytes=40_000)


class Recording(MemoryStorage):
    """A memory store that records every stage and commit call it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[bytes]]] = []

    def stage(self, tenant, database, blobs, **kwargs):
        self.calls.append(("stage", list(blobs)))
        return super().stage(tenant, database, blobs, **kwargs)

    def commit(self, tenant, database, **kwargs):
        self.calls.append(("commit", list(kwargs["blobs"])))
        return super().commit(tenant, database, **kwargs)

    def staged_ids(self) -> list[bytes]:
        return [i for op, ids in self.calls if op == "stage" for i in ids]


def small_transport(storage) -> LocalTransport:
    transport = LocalTransport(storage)
    transport.limits = SMALL
    return transport


def employees(n: int, start: int = 0) -> list[Employee]:
    return [
        Employee(name=f"N{i}", surname=f"S{i}", salary=i, description="word " * 40)
        for i in range(start, start + n)
    ]


def new_blobs(n: int, size: int = 100) -> dict[bytes, bytes]:
    return {os.urandom(16): os.urandom(size) for _ in range(n)}


# -- the split -------------------------------------------------------------------------------


def test_a_commit_that_fits_one_request_is_that_request():
    blobs = new_blobs(4)
    plan = plan_commit(blobs, b"root", [b"g" * 16], Pending(), SMALL)
    assert (plan.stages, plan.inline, plan.staged, plan.garbage) == ([], blobs, [], [b"g" * 16])


def test_blobs_are_grouped_by_count_and_bytes_and_the_last_group_rides_inline():
    big = new_blobs(1, 50_000)  # over the byte limit: alone in its request
    plan = plan_commit(new_blobs(9) | big | new_blobs(3), b"r", [], Pending(), SMALL)
    assert [len(chunk) for chunk in plan.stages] == [4, 4, 1, 1]
    assert list(plan.stages[3]) == list(big)
    assert len(plan.inline) == 3 and len(plan.staged) == 10
    # A last group that does not fit beside the root is staged too.
    plan = plan_commit(new_blobs(5, 10_000), b"r" * 30_001, [], Pending(), SMALL)
    assert [len(chunk) for chunk in plan.stages] == [4, 1] and plan.inline == {}


def test_the_frame_bounds_a_request_besides_the_limits():
    limits = RequestLimits(blobs=100, bytes=10_000, blob=10_000, ids=100, frame=4_000)
    per_blob = 100 + BLOB_OVERHEAD
    fit = (4_000 - REQUEST_OVERHEAD) // per_blob
    plan = plan_commit(new_blobs(fit + 1), b"", [], Pending(), limits)
    assert [len(chunk) for chunk in plan.stages] == [fit]
    assert limits.fits(fit, fit * 100) and not limits.fits(fit + 1, (fit + 1) * 100)
    assert not limits.fits(fit, fit * 100, ids=4_000 // ID_OVERHEAD)


def test_staged_blobs_are_named_and_unused_ones_released():
    pending = Pending()
    kept, dropped = new_blobs(2), new_blobs(2)
    pending.add(kept | dropped)
    pending.doubt([{b"d" * 16: b""}])
    fresh = new_blobs(1)
    plan = plan_commit(kept | fresh, b"r", [b"g" * 16], pending, SMALL)
    assert plan.stages == [] and plan.inline == fresh
    assert plan.staged == list(kept)
    assert plan.garbage == [b"g" * 16, *dropped, b"d" * 16]
    with pytest.raises(IntegrityError, match="one id must never name two contents"):
        plan_commit({next(iter(kept)): b"other length"}, b"r", [], pending, SMALL)
    # An id whose stage had an unknown outcome, passed again, is sent again, not released.
    again = {b"d" * 16: b"x"}
    plan = plan_commit(again, b"r", [], pending, SMALL)
    assert plan.inline == again and b"d" * 16 not in plan.garbage


def test_only_a_blob_past_the_per_blob_limit_or_too_many_ids_is_refused():
    limits = dataclasses.replace(SMALL, blob=1000, ids=10)
    with pytest.raises(CommitTooLargeError, match="at most 1000 per blob"):
        plan_commit(new_blobs(1, 1001), b"r", [], Pending(), limits)
    with pytest.raises(CommitTooLargeError, match="the root is 1001 bytes"):
        plan_commit({}, b"r" * 1001, [], Pending(), limits)
    with pytest.raises(CommitTooLargeError, match="8 staged and 5 garbage ids"):
        plan_commit(new_blobs(9, 1000), b"r", [b"g" * 16] * 5, Pending(), limits)


# -- through LocalTransport and DB -----------------------------------------------------------


def test_a_transaction_larger_than_a_storage_call_is_staged_and_counted():
    storage = Recording()
    transport = small_transport(storage)
    with DB(transport, password=PASSWORD, kdf="fast") as db:
        storage.calls.clear()
        trips = transport.counters.round_trips
        with db.transaction():
            db.add(*employees(300))
        stages = [ids for op, ids in storage.calls if op == "stage"]
        assert len(stages) >= 2 and all(len(ids) <= SMALL.blobs for ids in stages)
        # Each stage call is one counted round trip, the commit one more; the root read
        # and the id block allocations are the rest.
        others = transport.counters.round_trips - trips - len(stages) - 1
        assert 0 < others <= 10
        stats = storage.stats("local", "main")
        assert stats["staged"] == 0 and stats["blobs"] > SMALL.blobs
    with DB(storage, password=PASSWORD, kdf="fast") as cold:
        assert sorted(e.salary for e in cold[Employee].all()) == list(range(300))


def test_a_conflict_retry_releases_the_blobs_it_staged_before():
    storage = Recording()
    with (
        DB(small_transport(storage), password=PASSWORD, kdf="fast") as a,
        DB(storage, password=PASSWORD, kdf="fast") as b,
    ):
        a.add(Employee(name="first", surname="", salary=-1, description=""))
        storage.calls.clear()
        with a.transaction():
            a.add(*employees(100))
            b.add(Employee(name="rival", surname="", salary=-2, description=""))
        commits = [i for i, (op, _) in enumerate(storage.calls) if op == "commit"]
        assert len(commits) == 3  # b's, a's stale one, a's retry
        before_retry = {i for op, ids in storage.calls[: commits[1]] if op == "stage" for i in ids}
        assert before_retry  # a's first attempt staged its blobs, then met b's commit
        state = storage._databases[("local", "main")]
        assert not state.pending  # the retry made live or released every staged blob
        assert before_retry <= set(state.garbage)  # the engine made new nodes: released
        assert len(a[Employee]) == 102 and len(b[Employee]) == 102


def test_a_retry_of_the_same_blobs_stages_nothing_again():
    storage = Recording()
    transport = small_transport(storage)
    assert transport.commit("main", expected_seq=0, root=b"r", blobs={}).ok
    blobs = new_blobs(10)
    assert not transport.commit("main", expected_seq=0, root=b"s", blobs=blobs).ok
    staged = storage.staged_ids()
    assert len(staged) == 8  # two calls of 4; the last 2 rode in the stale commit
    storage.calls.clear()
    trips = transport.counters.round_trips
    assert transport.commit("main", expected_seq=1, root=b"s", blobs=blobs).ok
    assert storage.calls == [("commit", list(blobs)[8:])]
    assert transport.counters.round_trips - trips == 1
    assert storage.get_blobs("local", "main", list(blobs)) == blobs


def test_a_refused_commit_keeps_its_staged_blobs_for_release():
    storage = Recording()
    transport = small_transport(storage)
    taken = new_blobs(1)
    assert transport.commit("main", expected_seq=0, root=b"r", blobs=taken).ok
    with pytest.raises(BlobExistsError):  # the last, inline group repeats a live id
        transport.commit("main", expected_seq=1, root=b"s", blobs=new_blobs(8) | taken)
    assert storage.stats("local", "main")["staged"] == 8
    assert transport.commit("main", expected_seq=1, root=b"s", blobs={}).ok
    stats = storage.stats("local", "main")
    assert (stats["staged"], stats["garbage"]) == (0, 8)


def test_threads_keep_their_staged_blobs_apart():
    """One thread's release of what it no longer uses never touches another's."""
    storage = Recording()
    transport = small_transport(storage)
    mine = new_blobs(8)
    assert not transport.commit("main", expected_seq=5, root=b"r", blobs=mine).ok
    done = []

    def other() -> None:
        done.append(transport.commit("main", expected_seq=0, root=b"o", blobs={}).ok)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert done == [True]
    assert storage.stats("local", "main")["staged"] == 4  # still pending, still mine
    assert transport.commit("main", expected_seq=1, root=b"m", blobs=mine).ok


# -- a process killed mid-upload -------------------------------------------------------------


def stage_then_die(path: str) -> None:
    """The child of the next test: a DB on an SQLite store whose commit kills the process
    after the blobs were staged."""
    storage = SQLiteStorage(path)
    with DB(small_transport(storage), password=PASSWORD, kdf="fast") as db:

        def die(*args: object, **kwargs: object) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        storage.commit = die  # type: ignore[method-assign]
        db.add(*employees(300))


def test_orphans_of_a_killed_embedded_client_are_swept_after_the_timeout(tmp_path):
    path = tmp_path / "store.zdb"
    code = f"from {__name__} import stage_then_die; stage_then_die({str(path)!r})"
    child = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    offset = [0.0]
    storage = SQLiteStorage(path, clock=lambda: time.time() + offset[0])
    orphans = storage.stats("local", "main")["staged"]
    assert orphans > SMALL.blobs and storage.usage("local").blobs == orphans
    with DB(LocalTransport(storage), password=PASSWORD, kdf="fast") as db:
        assert db.collect_garbage() == 0  # the staging timeout has not passed
        offset[0] = 3600.0  # the storage's default timeout
        assert db.collect_garbage() == orphans
        assert storage.stats("local", "main")["staged"] == 0
        assert storage.usage("local").blobs == 0
        db.add(*employees(3))
        assert len(db[Employee]) == 3
