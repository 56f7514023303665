"""Concurrent writers and crashes, through a real blob server subprocess.

* **Concurrency**: 4 client *processes* (multiprocessing ``spawn``, each with its own
  ``DB((host, port), key_file=...)``) commit small transactions to one database at
  once, through one server, on SQLite and on Redis storage. Every commit must succeed
  (conflicts are rebased on the root the server answers), and afterwards every
  acknowledged record is there, exactly once, and a full scan, ``len`` and every index
  agree.
* **Crashes**: a client commits in a loop while the server is killed with SIGKILL
  (SQLite storage, ``synchronous=FULL``), or its Redis (``appendonly yes``,
  ``appendfsync always``; or every node of a 3-master Redis Cluster so configured) is,
  or both are; then they are restarted on the same storage.
  The root must open, nothing partial may be visible (every blob the root reaches is
  there: a full scan and index queries over every record read every leaf of every tree
  and must agree), every acknowledged commit must be there, and the one commit in
  flight at the kill is there completely or not at all. The killed client itself goes
  on afterwards: its freshness check would call a lost acknowledged commit a rollback.
  On Redis, the usage is then what is stored, once garbage collection has aborted the
  operations the kills left open (``tests.server.crash``).
"""

from __future__ import annotations

import itertools
import multiprocessing
import random
import re
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from blob_server.tenants import TenantRegistry
from tests.core.hr import Employee
from tests.server.cluster import LocalCluster
from tests.server.crash import collect_as_if_timed_out, server_on
from tests.server.test_server_e2e import ServerProcess
from zerodb_core import DB, StoreUnavailableError
from zerodb_core.keyfile import KeyFile
from zerodb_core.query import Contains, Ge, InRange
from zerodb_core.verify import verify

PASSWORD = "correct horse battery staple"
TENANT = "acme"
WORKERS = 4
TRANSACTIONS = 25  # per worker
PER_TRANSACTION = 2  # 4 x 25 x 2 = 200 records, 100 commits racing
KILL_ROUNDS = 6
CRASH_BATCH = 20  # records per commit in the crash tests
FAILED_COMMIT = re.compile(rb"event=commit .*ok=False")


# -- setup -----------------------------------------------------------------------------------


@dataclass
class Deployment:
    """A tenants file with one tenant and its key file, and the server's log."""

    tmp: Path
    tenants: Path
    key_file: Path

    def server(self, storage: str, *flags: str) -> ServerProcess:
        server = ServerProcess(storage, self.tenants, self.tmp / "server.log")
        server.args += flags
        return server

    def open_db(self, port: int) -> DB:
        return DB(("127.0.0.1", port), password=PASSWORD, key_file=self.key_file, kdf="fast")


@pytest.fixture
def deployment(tmp_path) -> Deployment:
    return make_deployment(tmp_path)


def make_deployment(tmp_path: Path) -> Deployment:
    """Register tenant ``acme`` and one login key for it in ``tmp_path``."""
    registry = TenantRegistry(tmp_path / "tenants.json")
    registry.add_tenant(TENANT)
    key = KeyFile.create(TENANT)
    key.save(tmp_path / "acme.zdbkey", PASSWORD, kdf="fast")
    registry.add_key(TENANT, key.public_key)
    return Deployment(tmp_path, tmp_path / "tenants.json", tmp_path / "acme.zdbkey")


def _stop(server: ServerProcess) -> None:
    server.stop()
    log = server.log.read_text(errors="replace")
    for failure in ("Traceback", "event=op_failed", "event=connection_failed"):
        assert failure not in log, log[-4000:]


# -- checking a database -----------------------------------------------------------------------


def check_database(db: DB, acked: set[str], in_flight: list[set[str]] = ()) -> int:
    """Check that the database holds every acknowledged record exactly once, each commit
    in flight at a crash completely or not at all, nothing else, and that the full scan,
    ``len`` and every index agree. Return the number of records.

    Everything is read in one transaction, so from one snapshot: a commit whose client
    gave up on it may still land meanwhile (a cluster's server re-sends its steps for
    up to 20 s while its client, cut off, counts it as in flight)."""
    with db.transaction():
        staff = db[Employee]
        records = list(staff.all())  # reads every leaf of the record tree
        surnames = [e.surname for e in records]
        present = set(surnames)
        assert len(present) == len(surnames), "a record is stored twice"
        assert len(staff.all()) == len(records)  # counts kept in the inner nodes
        missing = acked - present
        assert not missing, (
            f"{len(missing)} acknowledged records are lost, e.g. {sorted(missing)[:5]}"
        )
        maybe: set[str] = set()
        for group in in_flight:
            assert present & group in (set(), group), "a commit is visible in part"
            maybe |= group
        stray = present - acked - maybe
        assert not stray, f"records nobody committed: {sorted(stray)[:5]}"
        # Each index holds exactly the records: reading them walks every leaf of the index.
        by_name = {e.surname for e in staff.query(name="crash")} | {
            e.surname for e in staff.query(InRange("name", "w", "x"))
        }
        assert by_name == present
        assert {e.surname for e in staff.query(InRange("salary", 0, 10**12))} == present
        assert {e.surname for e in staff.query(Contains("description", "kernel"))} == present
        ordered = [e.salary for e in staff.query(Ge("salary", 0), sort_index="salary")]
        assert ordered == sorted(e.salary for e in records)
        assert len(staff.query(Ge("salary", 0))) == len(records)
        return len(records)


# -- 4 processes, one database -------------------------------------------------------------


def _writer(port: int, key_file: str, worker: int, acks: str, start) -> None:
    """A client process: commit TRANSACTIONS small transactions, logging each
    acknowledged one (its record surnames) to ``acks``."""
    try:
        with DB(("127.0.0.1", port), password=PASSWORD, key_file=key_file, kdf="fast") as db:
            start.wait(60)
            with open(acks, "a") as log:
                for t in range(TRANSACTIONS):
                    batch = [
                        Employee(
                            name=f"w{worker}",
                            surname=f"w{worker}-{t}-{i}",
                            salary=worker * 10_000 + t * PER_TRANSACTION + i,
                            description=f"kernel worker{worker} txn{t}",
                        )
                        for i in range(PER_TRANSACTION)
                    ]
                    with db.transaction():
                        db.add(*batch)
                    log.write("".join(f"{e.surname}\n" for e in batch))
                    log.flush()
    except BaseException:
        Path(acks + ".error").write_text(traceback.format_exc())
        raise


def run_writers(deployment: Deployment, storage: str, *flags: str, cluster: bool = False) -> None:
    """4 writer processes through one server on ``storage`` (``--redis-cluster`` NODES
    with ``cluster``)."""
    server = deployment.server(storage)
    if cluster:
        server.args[server.args.index("--storage")] = "--redis-cluster"
    server.args += flags
    server.start()
    try:
        with deployment.open_db(server.port) as db:  # the keyring exists before the race
            assert len(db[Employee].all()) == 0
        ctx = multiprocessing.get_context("spawn")
        start = ctx.Barrier(WORKERS)
        acks = [str(deployment.tmp / f"acks-{w}.txt") for w in range(WORKERS)]
        workers = [
            ctx.Process(
                target=_writer,
                args=(server.port, str(deployment.key_file), w, acks[w], start),
                daemon=True,
            )
            for w in range(WORKERS)
        ]
        for process in workers:
            process.start()
        for process in workers:
            process.join(120)
        errors = [Path(a + ".error").read_text() for a in acks if Path(a + ".error").exists()]
        assert not errors, "\n".join(errors)
        assert [p.exitcode for p in workers] == [0] * WORKERS
        acked = {line for a in acks for line in Path(a).read_text().split()}
        assert len(acked) == WORKERS * TRANSACTIONS * PER_TRANSACTION
        with deployment.open_db(server.port) as db:
            assert check_database(db, acked) == len(acked)
            # A commit per transaction (rebased after conflicts, never doubled), plus the
            # merges of runs, which change no answer and leave the store consistent.
            assert db.read_root().seq >= WORKERS * TRANSACTIONS
            assert verify(db).ok
        rebased = len(FAILED_COMMIT.findall(server.log.read_bytes()))
        print(f"{storage.split(':')[0]}: {WORKERS * TRANSACTIONS} commits, {rebased} rebased")
    finally:
        _stop(server)


def test_four_processes_commit_to_one_database_sqlite(deployment):
    run_writers(deployment, f"sqlite:///{deployment.tmp}/blobs.zdb")


def test_four_processes_commit_to_one_database_redis(deployment, redis_server):
    admin = redis_server.client(3)
    admin.flushdb()
    admin.close()
    run_writers(deployment, redis_server.url(3), "--allow-volatile-redis")  # no AOF


# -- crashes -----------------------------------------------------------------------------------


@dataclass
class CommitLoop:
    """A client committing batches in a loop on a thread until its store fails."""

    db: DB
    acked: set[str]
    in_flight: list[set[str]]
    serial: itertools.count = field(default_factory=itertools.count)
    thread: threading.Thread | None = None
    commits: int = 0
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.commits = 0
        self.error = None
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            n = next(self.serial)
            batch = [
                Employee(
                    name="crash",
                    surname=f"c{n}-{i}",
                    salary=n * CRASH_BATCH + i,
                    description=f"kernel panic {n} " + "x" * 200,
                )
                for i in range(CRASH_BATCH)
            ]
            try:
                with self.db.transaction():
                    self.db.add(*batch)
            except StoreUnavailableError as exc:
                self.in_flight.append({e.surname for e in batch})  # outcome unknown
                self.error = exc
                return
            except BaseException as exc:
                self.error = exc
                return
            self.acked.update(e.surname for e in batch)
            self.commits += 1

    def wait_for(self, commits: int) -> None:
        deadline = time.monotonic() + 60
        while self.commits < commits:
            assert self.error is None, repr(self.error)
            assert time.monotonic() < deadline, "the client made no progress"
            time.sleep(0.002)

    def join(self) -> BaseException | None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(60)
        assert not self.thread.is_alive(), "the client hung after the crash"
        return self.error


def crash_rounds(deployment: Deployment, server: ServerProcess, kill, restart) -> None:
    """Kill and restart ``KILL_ROUNDS`` times while a client commits; check every time."""
    rng = random.Random()
    server.start()
    acked: set[str] = set()
    in_flight: list[set[str]] = []
    client = CommitLoop(deployment.open_db(server.port), acked, in_flight)
    try:
        for round_ in range(KILL_ROUNDS):
            client.start()
            client.wait_for(rng.randrange(2, 6))
            time.sleep(rng.uniform(0, 0.02))  # somewhere inside a commit, or between two
            kill(round_)
            error = client.join()
            assert error is None or isinstance(error, StoreUnavailableError), repr(error)
            restart(round_)
            with deployment.open_db(server.port) as fresh:  # a cold client
                count = check_database(fresh, acked, in_flight)
            outcome = "between commits" if error is None else f"in flight: {type(error).__name__}"
            print(f"kill {round_}: {len(acked)} acked, {count} stored, {outcome}")
            # The client that saw the crash goes on: it reconnects, and its freshness
            # check (highest seq and digest seen) would refuse a rolled-back root.
            check_database(client.db, acked, in_flight)
        client.start()
        client.wait_for(2)
        assert client.join() is None
        with deployment.open_db(server.port) as fresh:
            check_database(fresh, acked, in_flight)
    finally:
        client.stop.set()
        client.db.close()
        _stop(server)


def test_server_killed_during_commits_sqlite(deployment):
    server = deployment.server(f"sqlite:///{deployment.tmp}/blobs.zdb")

    def kill(_round):
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()

    crash_rounds(deployment, server, kill, lambda _round: server.start())


def test_server_and_redis_killed_during_commits(deployment, aof_store):
    store = aof_store
    server = server_on(store, deployment.tenants, deployment.tmp / "server.log")
    # Round 0: the blob server dies; round 1: Redis dies under a running server;
    # round 2: both die. A cluster comes back at once: its server re-sends idempotent
    # steps for 20 s (``ClusterStorage.retry_seconds``), so the commit in flight waits
    # for the restart and completes (or is cancelled) then, instead of failing at once.
    victims = [("server",), ("redis",), ("redis", "server")]
    at_once = isinstance(store, LocalCluster)

    def kill(round_):
        for victim in victims[round_ % len(victims)]:
            if victim == "redis":
                store.kill()
                if at_once:
                    store.start()
            else:
                server.process.send_signal(signal.SIGKILL)
                server.process.wait()

    def restart(round_):
        if "redis" in victims[round_ % len(victims)] and not at_once:
            store.start()
        if "server" in victims[round_ % len(victims)]:
            server.start()

    crash_rounds(deployment, server, kill, restart)
    usage, found_open = collect_as_if_timed_out(store, TENANT)
    print(f"usage {usage.blobs} blobs as stored after collecting {found_open} left open")
