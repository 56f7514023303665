"""Fair, conflict-free commits (issue 13, item 3): writer *processes* blind-inserting into
one database, through a real ``zerodb-server`` on SQLite and on a real redis-server, and
on an embedded SQLite file shared by the processes.

Each writer inserts one record per transaction. Run for a fixed number of commits, every
commit must succeed; run for a fixed time (the parent stops them), no writer may fall
below half of the busiest one's commits. Without the commit lease, 3 writers committed
1,232 / 330 / 1 in 20 s and some inserts failed with ``ConflictError`` after 32 retries.
Counts are asserted, never timings: the time only bounds how long the test runs.

A lease holder killed with SIGKILL (or stopped with SIGSTOP, so that only the lease's
timeout can release it) must not keep the others from committing.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from blob_server.storage import SQLiteStorage
from tests.core.hr import Employee
from tests.server.conftest import PrivateRedis
from tests.server.test_concurrency import Deployment, make_deployment
from tests.server.test_server_e2e import ServerProcess
from zerodb_core import DB, ConflictError
from zerodb_core.transport import LocalTransport
from zerodb_core.transport.leases import FileLeases

PASSWORD = "correct horse battery staple"
TENANT = "acme"
RUN_SECONDS = 6.0  # a fixed-time run lasts this long (only the counts are asserted)
FAIRNESS = 0.5  # the least busy writer commits at least this share of the busiest's


@pytest.fixture
def deployment(tmp_path) -> Deployment:
    return make_deployment(tmp_path)


def _open(store: str | int, key_file: str | None, *, patient: bool = False) -> DB:
    """A client of a blob server (``store`` is its port) or of an embedded store (a URL).
    ``patient``: an embedded client that waits up to a minute for a turn, and for a
    holder that keeps the lease (so that only a released lease lets it go on)."""
    if isinstance(store, int):
        return DB(("127.0.0.1", store), password=PASSWORD, key_file=key_file, kdf="fast")
    if patient:
        path = store[len("sqlite:///") :]
        leases = FileLeases(path, timeout=60, wait=60)
        transport = LocalTransport(SQLiteStorage(path), leases=leases)
        return DB(transport, password=PASSWORD, kdf="fast", freshness_path=f"{path}.fresh")
    return DB(store, password=PASSWORD, kdf="fast")


def _count_gave_up(db: DB, out: str) -> None:
    """Log to ``out.gave_up`` each time a turn did not come within the wait (the client
    then raced, as without leases)."""
    acquire = db.transport.acquire_lease

    def counted(database):
        lease = acquire(database)
        if lease is None:
            with open(out + ".gave_up", "a") as log:
                log.write("gave up\n")
        return lease

    db.transport.acquire_lease = counted


def _writer(
    store, key_file, worker: int, out: str, start, stop, commits: int | None, patient=False
) -> None:
    """Insert one record per transaction until ``stop`` is set (or ``commits`` are made);
    append each acknowledged surname to ``out``, each ConflictError to ``out.conflicts``."""
    try:
        with _open(store, key_file, patient=patient) as db, open(out, "a") as log:
            _count_gave_up(db, out)
            start.wait(60)
            n = 0
            while not stop.is_set() and (commits is None or n < commits):
                surname = f"w{worker}-{n}"
                try:
                    db.add(Employee(name=f"w{worker}", surname=surname, salary=n))
                except ConflictError as exc:
                    with open(out + ".conflicts", "a") as conflicts:
                        conflicts.write(f"{exc}\n")
                    continue
                finally:
                    n += 1
                log.write(surname + "\n")
                log.flush()
    except BaseException:
        Path(out + ".error").write_text(traceback.format_exc())
        raise


def _holder(store, key_file, ready: str) -> None:
    """Take the commit lease, say so in ``ready``, and keep it until killed or stopped."""
    with _open(store, key_file) as db:
        lease = db.transport.acquire_lease(db.database)
        assert lease is not None
        Path(ready).write_text("held")
        time.sleep(600)


@dataclass
class Outcome:
    counts: list[int]
    conflicts: int
    acked: set[str]
    gave_up: int  # turns that did not come within the wait


def run_writers(
    tmp: Path,
    store: str | int,
    key_file: Path | None,
    writers: int,
    *,
    commits: int | None = None,
    seconds: float = RUN_SECONDS,
    patient: bool = False,
    meanwhile=None,
) -> Outcome:
    """Run ``writers`` processes against ``store`` (a port of a blob server, or an
    embedded store's URL) for ``commits`` each, or for ``seconds``. ``meanwhile()`` runs
    once they have started."""
    ctx = multiprocessing.get_context("spawn")
    start, stop = ctx.Barrier(writers + 1), ctx.Event()
    outs = [str(tmp / f"acks-{w}.txt") for w in range(writers)]
    key = None if key_file is None else str(key_file)
    processes = [
        ctx.Process(
            target=_writer,
            args=(store, key, w, outs[w], start, stop, commits, patient),
            daemon=True,
        )
        for w in range(writers)
    ]
    for process in processes:
        process.start()
    try:
        start.wait(120)
        if meanwhile is not None:
            meanwhile()
        if commits is None:
            time.sleep(seconds)
            stop.set()
        for process in processes:
            process.join(180)
    finally:
        stop.set()
        for process in processes:
            if process.is_alive():
                process.kill()
    errors = [Path(o + ".error").read_text() for o in outs if Path(o + ".error").exists()]
    assert not errors, "\n".join(errors)
    assert [p.exitcode for p in processes] == [0] * writers
    acked = [Path(o).read_text().split() for o in outs]
    return Outcome(
        [len(a) for a in acked],
        _lines(outs, ".conflicts"),
        {s for a in acked for s in a},
        _lines(outs, ".gave_up"),
    )


def _lines(outs: list[str], suffix: str) -> int:
    return sum(
        len(Path(o + suffix).read_text().splitlines()) for o in outs if Path(o + suffix).exists()
    )


def check_stored(db: DB, acked: set[str]) -> None:
    stored = [e.surname for e in db[Employee].all()]
    assert len(stored) == len(set(stored)), "a record is stored twice"
    assert set(stored) == acked


def assert_fair(outcome: Outcome, label: str) -> None:
    counts = outcome.counts
    print(
        f"{label}: commits per writer {counts}, conflicts {outcome.conflicts}, "
        f"turns that did not come {outcome.gave_up}"
    )
    assert outcome.conflicts == 0
    assert min(counts) > 0
    assert min(counts) / max(counts) >= FAIRNESS, counts


# -- through a blob server ----------------------------------------------------------------


def _served(deployment: Deployment, storage: str, *flags: str, option: str = "--storage"):
    server = deployment.server(storage, *flags)
    server.args[server.args.index("--storage")] = option  # or --redis-cluster
    server.start()
    with _open(server.port, str(deployment.key_file)) as db:  # the keyring, before the race
        assert len(db[Employee].all()) == 0
    return server


def _stop(server: ServerProcess) -> str:
    server.stop()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log and "event=op_failed" not in log, log[-4000:]
    return log


# The issue's own target, 8 writers for 20 s, is slow: ``make test`` runs fewer for less.
LONG = pytest.param(8, 20.0, marks=pytest.mark.slow, id="8-writers-20s")


def _served_fairly(
    deployment, storage: str, writers: int, seconds: float, label: str, *flags: str, **where: str
) -> None:
    """Writers through a server on ``storage`` commit fairly, and every ack is stored."""
    server = _served(deployment, storage, *flags, **where)
    try:
        outcome = run_writers(
            deployment.tmp, server.port, deployment.key_file, writers, seconds=seconds
        )
        assert_fair(outcome, f"{label}, {writers} writers, {seconds:.0f} s")
        with _open(server.port, str(deployment.key_file)) as db:
            check_stored(db, outcome.acked)
    finally:
        _stop(server)


@pytest.mark.parametrize(("writers", "seconds"), [(4, RUN_SECONDS), LONG])
def test_writers_through_a_server_on_sqlite_commit_fairly(deployment, writers, seconds):
    storage = f"sqlite:///{deployment.tmp}/blobs.zdb"
    _served_fairly(deployment, storage, writers, seconds, "server+sqlite")


@pytest.mark.parametrize(("writers", "seconds"), [(6, RUN_SECONDS), LONG])
def test_writers_through_a_server_on_redis_commit_fairly(deployment, writers, seconds):
    store = PrivateRedis(deployment.tmp / "redis", appendfsync="everysec")
    store.start()
    try:
        _served_fairly(deployment, store.url, writers, seconds, "server+redis")
    finally:
        store.kill()


@pytest.mark.parametrize(("writers", "seconds"), [(6, RUN_SECONDS), LONG])
def test_writers_through_a_server_on_a_cluster_commit_fairly(
    deployment, redis_cluster, writers, seconds
):
    """On the session's 3-master cluster: the lease FIFO in the database's slot."""
    redis_cluster.flush()
    spec, flags = redis_cluster.spec, ("--allow-volatile-redis",)  # the nodes keep no AOF
    _served_fairly(
        deployment, spec, writers, seconds, "server+cluster", *flags, option="--redis-cluster"
    )


def test_writers_through_a_server_make_every_commit(deployment):
    server = _served(deployment, f"sqlite:///{deployment.tmp}/blobs.zdb")
    try:
        outcome = run_writers(deployment.tmp, server.port, deployment.key_file, 3, commits=40)
        assert outcome.counts == [40, 40, 40] and outcome.conflicts == 0
        with _open(server.port, str(deployment.key_file)) as db:
            check_stored(db, outcome.acked)
    finally:
        _stop(server)


# -- an embedded SQLite file shared by processes ---------------------------------------


@pytest.mark.parametrize(("writers", "seconds"), [(3, RUN_SECONDS), LONG])
def test_writers_on_an_embedded_sqlite_file_commit_fairly(tmp_path, writers, seconds):
    url = f"sqlite:///{tmp_path}/blobs.zdb"
    with _open(url, None) as db:
        assert len(db[Employee].all()) == 0
    outcome = run_writers(tmp_path, url, None, writers, seconds=seconds)
    assert_fair(outcome, f"embedded sqlite, {writers} writers, {seconds:.0f} s")
    with _open(url, None) as db:
        check_stored(db, outcome.acked)


# -- a lease holder that dies or hangs ---------------------------------------------------------

WRITERS_BEHIND = 3
COMMITS_BEHIND = 10


def _start_holder(store, key_file: str | None, tmp: Path):
    """A process holding the commit lease (it acquired it and sleeps)."""
    ready = tmp / "holder-ready"
    ctx = multiprocessing.get_context("spawn")
    holder = ctx.Process(target=_holder, args=(store, key_file, str(ready)), daemon=True)
    holder.start()
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert holder.is_alive(), "the lease holder died before taking the lease"
        assert time.monotonic() < deadline, "the lease holder never got the lease"
        time.sleep(0.01)
    return holder


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _queued_on_server(db: DB) -> bool:
    lease = db.transport.server_stats(db.database)["lease"]
    return lease == {"held": 1, "waiting": WRITERS_BEHIND}


def _lease_log(server: ServerProcess) -> tuple[int, int]:
    log = server.log.read_bytes()
    return len(re.findall(rb"event=lease_dropped", log)), len(
        re.findall(rb"event=lease_expired", log)
    )


def test_a_lease_holder_killed_by_sigkill_lets_the_queue_go_on(deployment):
    """The server lets go of a dead client's lease when its connection closes: the
    writers queued behind it all get their turns (none gives up waiting), and the lease
    was dropped for the disconnect, not expired (its timeout is longer than the test)."""
    server = _served(
        deployment, f"sqlite:///{deployment.tmp}/blobs.zdb", "--commit-lease-timeout", "60"
    )
    key = str(deployment.key_file)
    holder = None
    try:
        holder = _start_holder(server.port, key, deployment.tmp)
        with _open(server.port, key) as watcher:

            def kill_once_queued():
                _wait_until(lambda: _queued_on_server(watcher), "the writers never queued")
                holder.kill()

            outcome = run_writers(
                deployment.tmp,
                server.port,
                deployment.key_file,
                WRITERS_BEHIND,
                commits=COMMITS_BEHIND,
                meanwhile=kill_once_queued,
            )
        holder.join(10)
        assert outcome.counts == [COMMITS_BEHIND] * WRITERS_BEHIND
        assert outcome.conflicts == 0 and outcome.gave_up == 0
        assert _lease_log(server) == (1, 0)
        with _open(server.port, key) as db:
            check_stored(db, outcome.acked)
    finally:
        try:
            if holder is not None:
                holder.kill()
        finally:
            _stop(server)


def test_a_lease_holder_that_hangs_keeps_nobody_beyond_the_timeout(deployment):
    """A holder stopped with SIGSTOP keeps its connection open: only the lease timeout
    (1 s here) releases it; then the queue goes on (no writer's wait of 10 s runs out)."""
    server = _served(
        deployment, f"sqlite:///{deployment.tmp}/blobs.zdb", "--commit-lease-timeout", "1"
    )
    key = str(deployment.key_file)
    holder = None
    try:
        holder = _start_holder(server.port, key, deployment.tmp)
        os.kill(holder.pid, signal.SIGSTOP)
        outcome = run_writers(
            deployment.tmp, server.port, deployment.key_file, WRITERS_BEHIND, commits=COMMITS_BEHIND
        )
        assert outcome.counts == [COMMITS_BEHIND] * WRITERS_BEHIND
        assert outcome.conflicts == 0 and outcome.gave_up == 0
        dropped, expired = _lease_log(server)
        assert dropped == 0 and expired >= 1
        with _open(server.port, key) as db:
            check_stored(db, outcome.acked)
    finally:
        try:
            if holder is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(holder.pid, signal.SIGCONT)
                holder.kill()
        finally:
            _stop(server)


def _flock_holders(path: Path) -> int:
    """How many locks are granted on ``path`` now (Linux's /proc/locks)."""
    inode = os.stat(path).st_ino
    found = 0
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields and "FLOCK" in fields and fields[5].endswith(f":{inode}"):
            found += 1
    return found


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
def test_an_embedded_lease_holder_killed_by_sigkill_lets_the_queue_go_on(tmp_path):
    """On an SQLite file the lease is a file lock, which the kernel releases when the
    holder dies: the writers queued behind it (each would wait a minute for a live one)
    all get their turns."""
    url = f"sqlite:///{tmp_path}/blobs.zdb"
    with _open(url, None) as db:
        assert len(db[Employee].all()) == 0
    holder = _start_holder(url, None, tmp_path)
    queue = tmp_path / "blobs.zdb.queue"

    def kill_once_queued():  # the holder and every writer hold the queue file shared
        _wait_until(lambda: _flock_holders(queue) == WRITERS_BEHIND + 1, "no queue formed")
        holder.kill()

    try:
        outcome = run_writers(
            tmp_path,
            url,
            None,
            WRITERS_BEHIND,
            commits=COMMITS_BEHIND,
            patient=True,
            meanwhile=kill_once_queued,
        )
    finally:
        holder.kill()
    assert outcome.counts == [COMMITS_BEHIND] * WRITERS_BEHIND
    assert outcome.conflicts == 0 and outcome.gave_up == 0
    with _open(url, None) as db:
        check_stored(db, outcome.acked)
