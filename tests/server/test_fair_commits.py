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

import multiprocessing
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from blob_server.tenants import TenantRegistry
from tests.core.hr import Employee
from tests.server.conftest import PrivateRedis
from tests.server.test_server_e2e import ServerProcess
from zerodb_core import DB, ConflictError
from zerodb_core.keyfile import KeyFile

PASSWORD = "correct horse battery staple"
TENANT = "acme"
RUN_SECONDS = 6.0  # a fixed-time run lasts this long (only the counts are asserted)
FAIRNESS = 0.5  # the least busy writer commits at least this share of the busiest's


@dataclass
class Deployment:
    tmp: Path
    tenants: Path
    key_file: Path

    def server(self, storage: str, *flags: str) -> ServerProcess:
        server = ServerProcess(storage, self.tenants, self.tmp / "server.log")
        server.args += flags
        return server


@pytest.fixture
def deployment(tmp_path) -> Deployment:
    registry = TenantRegistry(tmp_path / "tenants.json")
    registry.add_tenant(TENANT)
    key = KeyFile.create(TENANT)
    key.save(tmp_path / "acme.zdbkey", PASSWORD, kdf="fast")
    registry.add_key(TENANT, key.public_key)
    return Deployment(tmp_path, tmp_path / "tenants.json", tmp_path / "acme.zdbkey")


def _open(store: str | int, key_file: str | None) -> DB:
    if isinstance(store, int):
        return DB(("127.0.0.1", store), password=PASSWORD, key_file=key_file, kdf="fast")
    return DB(store, password=PASSWORD, kdf="fast")


def _writer(store, key_file, worker: int, out: str, start, stop, commits: int | None) -> None:
    """Insert one record per transaction until ``stop`` is set (or ``commits`` are made);
    append each acknowledged surname to ``out``, each ConflictError to ``out.conflicts``."""
    try:
        with _open(store, key_file) as db, open(out, "a") as log:
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


@dataclass
class Outcome:
    counts: list[int]
    conflicts: int
    acked: set[str]


def run_writers(
    tmp: Path,
    store: str | int,
    key_file: Path | None,
    writers: int,
    *,
    commits: int | None = None,
    seconds: float = RUN_SECONDS,
) -> Outcome:
    """Run ``writers`` processes against ``store`` (a port of a blob server, or an
    embedded store's URL) for ``commits`` each, or for ``seconds``."""
    ctx = multiprocessing.get_context("spawn")
    start, stop = ctx.Barrier(writers + 1), ctx.Event()
    outs = [str(tmp / f"acks-{w}.txt") for w in range(writers)]
    key = None if key_file is None else str(key_file)
    processes = [
        ctx.Process(
            target=_writer, args=(store, key, w, outs[w], start, stop, commits), daemon=True
        )
        for w in range(writers)
    ]
    for process in processes:
        process.start()
    try:
        start.wait(120)
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
    conflicts = sum(
        len(Path(o + ".conflicts").read_text().splitlines())
        for o in outs
        if Path(o + ".conflicts").exists()
    )
    return Outcome([len(a) for a in acked], conflicts, {s for a in acked for s in a})


def check_stored(db: DB, acked: set[str]) -> None:
    stored = [e.surname for e in db[Employee].all()]
    assert len(stored) == len(set(stored)), "a record is stored twice"
    assert set(stored) == acked


def assert_fair(outcome: Outcome, label: str) -> None:
    counts = outcome.counts
    print(f"{label}: commits per writer {counts}, conflicts {outcome.conflicts}")
    assert outcome.conflicts == 0
    assert min(counts) > 0
    assert min(counts) / max(counts) >= FAIRNESS, counts


# -- through a blob server ----------------------------------------------------------------


def _served(deployment: Deployment, storage: str, *flags: str):
    server = deployment.server(storage, *flags)
    server.start()
    with _open(server.port, str(deployment.key_file)) as db:  # the keyring, before the race
        assert len(db[Employee].all()) == 0
    return server


def _stop(server: ServerProcess) -> str:
    server.stop()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log and "event=op_failed" not in log, log[-4000:]
    return log


@pytest.mark.parametrize("writers", [4])
def test_writers_through_a_server_on_sqlite_commit_fairly(deployment, writers):
    server = _served(deployment, f"sqlite:///{deployment.tmp}/blobs.zdb")
    try:
        outcome = run_writers(deployment.tmp, server.port, deployment.key_file, writers)
        assert_fair(outcome, f"server+sqlite, {writers} writers, {RUN_SECONDS:.0f} s")
        with _open(server.port, str(deployment.key_file)) as db:
            check_stored(db, outcome.acked)
    finally:
        _stop(server)


@pytest.mark.parametrize("writers", [6])
def test_writers_through_a_server_on_redis_commit_fairly(deployment, writers):
    store = PrivateRedis(deployment.tmp / "redis", appendfsync="everysec")
    store.start()
    try:
        server = _served(deployment, store.url)
        try:
            outcome = run_writers(deployment.tmp, server.port, deployment.key_file, writers)
            assert_fair(outcome, f"server+redis, {writers} writers, {RUN_SECONDS:.0f} s")
            with _open(server.port, str(deployment.key_file)) as db:
                check_stored(db, outcome.acked)
        finally:
            _stop(server)
    finally:
        store.kill()


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


@pytest.mark.parametrize("writers", [3])
def test_writers_on_an_embedded_sqlite_file_commit_fairly(tmp_path, writers):
    url = f"sqlite:///{tmp_path}/blobs.zdb"
    with _open(url, None) as db:
        assert len(db[Employee].all()) == 0
    outcome = run_writers(tmp_path, url, None, writers)
    assert_fair(outcome, f"embedded sqlite, {writers} writers, {RUN_SECONDS:.0f} s")
    with _open(url, None) as db:
        check_stored(db, outcome.acked)
