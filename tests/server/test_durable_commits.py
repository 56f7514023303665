"""Acknowledged means durable, under SIGKILL of Redis with several writers.

The production stack: a real ``redis-server`` with ``appendonly yes`` and ``appendfsync
always`` (accepted by ``serve`` without any flag), or a 3-master Redis Cluster whose every
node is so configured, ``zerodb-server serve --redis`` (``--redis-cluster``) as a
subprocess, and ``WRITERS`` client *processes*, each with its own ``DB`` and connection
pool, committing small transactions as fast as they can. Redis (every node of the
cluster) is killed with SIGKILL in the middle of that stream (no shutdown, no last fsync:
what its append-only file holds is all that survives), ``ROUNDS`` times, and restarted on
the same directory and port (a node with its ``nodes.conf``); the blob server stays up
and the writers reconnect by themselves. On a cluster the server re-sends its
idempotent steps for a while, so a commit caught by a quick restart may go through:
it is restarted once the server met the outage (a step re-sent or a request answered
unavailable), not only once a writer was told.

A writer records a transaction as *acknowledged* once its commit returned, and as *in
doubt* when it failed with ``StoreUnavailableError`` (the outage: its outcome is
unknown); one that lost every race (``ConflictError``) is known not to be committed.
Any other error ends the writer and fails the test: in particular a
``FreshnessError``, which is how a client sees an acknowledged commit that was lost (the
writers share the key file's freshness floor, ``<key file>.fresh``, so each would take
such a loss for a rollback).

Afterwards a fresh client must find: every acknowledged record, exactly once (0 lost);
each transaction in doubt completely or not at all, and nothing nobody committed (0 half
applied); the full scan, ``len`` and every index agreeing; and ``verify`` passing (every
blob the root reaches is there and authenticates). Then garbage collection, run as if
every operation the kills left open had timed out, leaves the usage equal to what the
nodes hold (``tests.server.crash``), and ``verify`` still passes.
"""

from __future__ import annotations

import multiprocessing
import random
import time
import traceback
from pathlib import Path

import pytest

from blob_server.tenants import TenantRegistry
from tests.core.hr import Employee
from tests.server.crash import collect_as_if_timed_out, outages_logged, server_on
from tests.server.test_concurrency import check_database
from zerodb_core import DB, ConflictError, StoreUnavailableError
from zerodb_core.keyfile import KeyFile
from zerodb_core.verify import verify

PASSWORD = "durable commits passphrase"
TENANT = "acme"
WRITERS = 3
ROUNDS = 3
BATCH = 4  # records per transaction
ACKS_PER_ROUND = 3  # each writer commits at least this many between two kills
PROGRESS_TIMEOUT = 120.0  # a writer that makes no progress this long has hung


def _writer(port: int, key_file: str, worker: int, out: str, start, stop) -> None:
    """A client process: commit transactions of BATCH records until ``stop``; append the
    surnames of each acknowledged one to ``acks-N`` and of each in doubt to ``doubt-N``."""
    try:
        with (
            DB(("127.0.0.1", port), password=PASSWORD, key_file=key_file, kdf="fast") as db,
            open(Path(out) / f"acks-{worker}", "a") as acks,
            open(Path(out) / f"doubt-{worker}", "a") as doubt,
        ):
            start.wait(60)
            rng = random.Random(worker)
            n = 0
            while not stop.is_set():
                batch = [
                    Employee(
                        name="crash",
                        surname=f"w{worker}-{n}-{i}",
                        salary=(worker * 1_000_000 + n) * BATCH + i,
                        description=f"kernel panic writer{worker} txn{n}",
                    )
                    for i in range(BATCH)
                ]
                n += 1
                line = " ".join(e.surname for e in batch) + "\n"
                try:
                    with db.transaction():
                        db.add(*batch)
                except StoreUnavailableError:  # Redis is down: the outcome is unknown
                    doubt.write(line)
                    doubt.flush()
                    time.sleep(0.02)
                    continue
                except ConflictError:
                    # Lost every race (writers starving each other is issue 13's item
                    # 3, not this test's): known not committed, so it must not be there.
                    continue
                acks.write(line)
                acks.flush()
                time.sleep(rng.uniform(0, 0.01))  # writers in step would only fight
    except BaseException:
        (Path(out) / f"error-{worker}").write_text(traceback.format_exc())
        raise


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_until(condition, what: str, out: Path) -> None:
    """Poll ``condition`` until it holds; fail (with the writers' errors) if it does not
    within PROGRESS_TIMEOUT: a hang guard, not a timed assertion."""
    deadline = time.monotonic() + PROGRESS_TIMEOUT
    while not condition():
        errors = [p.read_text() for p in out.glob("error-*")]
        assert not errors, "\n".join(errors)
        if time.monotonic() > deadline:
            pytest.fail(f"no progress: {what}")
        time.sleep(0.01)


def test_redis_killed_under_several_writers_loses_no_acknowledged_commit(tmp_path, aof_store):
    registry = TenantRegistry(tmp_path / "tenants.json")
    registry.add_tenant(TENANT)
    key = KeyFile.create(TENANT)
    key_file = tmp_path / "acme.zdbkey"
    key.save(key_file, PASSWORD, kdf="fast")
    registry.add_key(TENANT, key.public_key)
    store = aof_store
    server = server_on(store, registry.path, tmp_path / "server.log")  # no flag: AOF on
    out = tmp_path / "out"
    out.mkdir()
    ctx = multiprocessing.get_context("spawn")
    start, stop = ctx.Barrier(WRITERS), ctx.Event()
    workers = []
    try:
        server.start()
        assert "event=durability mode=durable" in server.log.read_text()
        with DB(("127.0.0.1", server.port), password=PASSWORD, key_file=key_file, kdf="fast"):
            pass  # the keyring exists before the writers race
        workers = [
            ctx.Process(
                target=_writer,
                args=(server.port, str(key_file), w, str(out), start, stop),
                daemon=True,
            )
            for w in range(WRITERS)
        ]
        for process in workers:
            process.start()

        def acked(w: int) -> int:
            return len(lines(out / f"acks-{w}"))

        def doubted() -> int:
            return sum(len(lines(out / f"doubt-{w}")) for w in range(WRITERS))

        for round_ in range(ROUNDS):
            floor = [acked(w) + ACKS_PER_ROUND for w in range(WRITERS)]
            wait_until(
                lambda f=floor: all(acked(w) >= f[w] for w in range(WRITERS)),
                f"round {round_}: every writer commits {ACKS_PER_ROUND} times",
                out,
            )
            before, met = doubted(), outages_logged(server)
            store.kill()  # SIGKILL, in the middle of the writers' commits
            wait_until(
                lambda b=before, m=met: doubted() > b or outages_logged(server) > m,
                "a writer meets the outage",
                out,
            )
            store.start()  # same directories and ports: Redis replays its append-only files
        floor = [acked(w) + ACKS_PER_ROUND for w in range(WRITERS)]
        wait_until(
            lambda: all(acked(w) >= floor[w] for w in range(WRITERS)),
            "every writer commits again after the last restart",
            out,
        )
        stop.set()
        for process in workers:
            process.join(60)
        errors = [p.read_text() for p in out.glob("error-*")]
        assert not errors, "\n".join(errors)
        assert [p.exitcode for p in workers] == [0] * WRITERS

        acks = [ln for w in range(WRITERS) for ln in lines(out / f"acks-{w}")]
        acknowledged = {surname for ln in acks for surname in ln.split()}
        in_doubt = [set(ln.split()) for w in range(WRITERS) for ln in lines(out / f"doubt-{w}")]
        fresh = tmp_path / "fresh.zdbkey.fresh"  # a client with no floor of its own
        with DB(
            ("127.0.0.1", server.port),
            password=PASSWORD,
            key_file=key_file,
            kdf="fast",
            freshness_path=fresh,
        ) as db:
            stored = check_database(db, acknowledged, in_doubt)  # 0 lost, 0 half applied
            report = verify(db)
            assert report.ok, report
            usage, found_open = collect_as_if_timed_out(store, TENANT)  # usage == stored
            report = verify(db)  # the collection took nothing the root reaches
            assert report.ok, report
        print(
            f"{len(acks)} acknowledged commits, {len(in_doubt)} in doubt, "
            f"{stored} records stored after {ROUNDS} kills of {store.serve_args()[0]}; "
            f"usage {usage.blobs} blobs, {usage.bytes} bytes as stored after collecting "
            f"{found_open} operations left open"
        )
    finally:
        stop.set()
        for process in workers:
            process.join(10)
            if process.is_alive():
                process.kill()
        server.stop()
        store.kill()
    log = server.log.read_text(errors="replace")
    for failure in ("Traceback", "event=op_failed", "event=connection_failed"):
        assert failure not in log, log[-4000:]
