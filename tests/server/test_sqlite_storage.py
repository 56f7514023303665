"""SQLiteStorage under several OS processes: concurrent commits, and a writer killed mid-loop.

Workers write an *ack file* (one line per acknowledged commit: seq and blob ids, appended
with a single unbuffered ``os.write`` after ``commit`` returned ok), so the parent can check
what was promised against what the file holds, even for a worker it killed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path

from blob_server.storage import SQLiteStorage

T, D = "tenant", "db"
BLOBS_PER_COMMIT = 4

spawn = multiprocessing.get_context("spawn")


def commit_loop(path: str, ack_path: str, commits: int, blob_size: int, gate: str) -> None:
    """Commit ``commits`` times (retrying conflicts on the returned root), acking each.

    Touches ``<ack_path>.ready`` once set up, then waits for the file ``gate`` to exist,
    so that workers (whose interpreter start-up times differ) really race.
    """
    store = SQLiteStorage(path)
    ack = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    Path(ack_path + ".ready").touch()
    while not os.path.exists(gate):
        time.sleep(0.001)
    conflicts = 0
    seq = store.get_root(T, D).seq
    for _ in range(commits):
        blobs = {os.urandom(16): os.urandom(blob_size) for _ in range(BLOBS_PER_COMMIT)}
        root = b" ".join(i.hex().encode() for i in blobs)  # the root names its blobs
        while True:
            result = store.commit(T, D, expected_seq=seq, root=root, blobs=blobs)
            seq = result.root.seq
            if result.ok:
                break
            conflicts += 1
        os.write(ack, b"%d %s\n" % (seq, root))
    os.close(ack)
    Path(ack_path + ".conflicts").write_text(str(conflicts))
    store.close()


def read_acks(paths: list[Path]) -> dict[int, list[bytes]]:
    """Return seq -> blob ids of every acknowledged commit in these ack files."""
    acks: dict[int, list[bytes]] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_bytes().splitlines():
            seq, *ids = line.split()
            assert int(seq) not in acks, "two writers acknowledged the same seq"
            acks[int(seq)] = [bytes.fromhex(i.decode()) for i in ids]
    return acks


def assert_consistent(path: Path, acks: dict[int, list[bytes]], unacked_allowed: int) -> None:
    """Check the file against the acks: integrity, seq, acked blobs, no partial commits."""
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store = SQLiteStorage(path)
    root = store.get_root(T, D)
    assert len(acks) <= root.seq <= len(acks) + unacked_allowed
    assert not acks or max(acks) <= root.seq
    acked_ids = [i for ids in acks.values() for i in ids]
    assert len(store.get_blobs(T, D, acked_ids)) == len(acked_ids)
    # Every commit writes exactly BLOBS_PER_COMMIT blobs, so any blob of a commit that did
    # not take effect would show up here as an excess.
    assert store.stats(T, D)["blobs"] == root.seq * BLOBS_PER_COMMIT
    root_ids = [bytes.fromhex(i.decode()) for i in root.data.split()]
    assert len(store.get_blobs(T, D, root_ids)) == len(root_ids) == BLOBS_PER_COMMIT
    # The file is still writable: no lock or half transaction was left behind. (Another
    # database, so the counts above stay comparable round after round.)
    probe = store.get_root(T, "probe").seq
    assert store.commit(T, "probe", expected_seq=probe, root=b"p", blobs={os.urandom(16): b""}).ok
    store.close()


def start_together(path: Path, workers: list[tuple[Path, int, int]]) -> list:
    """Spawn one commit_loop per (ack path, commits, blob size); return once all run."""
    gate = path.with_name(f"{path.name}.{os.urandom(4).hex()}.go")
    processes = []
    for ack_path, commits, blob_size in workers:
        args = (str(path), str(ack_path), commits, blob_size, str(gate))
        processes.append(spawn.Process(target=commit_loop, args=args))
        processes[-1].start()
    deadline = time.monotonic() + 30
    while not all(Path(f"{ack}.ready").exists() for ack, _, _ in workers):
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.005)
    gate.touch()
    return processes


def conflicts(ack_paths: list[Path]) -> int:
    return sum(int(Path(f"{ack}.conflicts").read_text()) for ack in ack_paths)


def test_concurrent_processes_commit_every_acknowledged_write(tmp_path):
    path = tmp_path / "shared.zdb"
    SQLiteStorage(path).close()  # create the schema once, before the race
    workers, commits = 4, 40
    ack_paths = [tmp_path / f"acks-{n}" for n in range(workers)]
    processes = start_together(path, [(ack, commits, 256) for ack in ack_paths])
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    acks = read_acks(ack_paths)
    assert sorted(acks) == list(range(1, workers * commits + 1))
    # Not asserted (timing), but the race is real: typically dozens of conflicts here.
    print(f"{conflicts(ack_paths)} conflicts retried")
    assert_consistent(path, acks, unacked_allowed=0)


def test_writer_killed_mid_commit_leaves_a_consistent_file(tmp_path):
    path = tmp_path / "killed.zdb"
    SQLiteStorage(path).close()
    ack_paths: list[Path] = []
    for killed in range(1, 6):
        # A victim that would run forever (larger blobs: more time inside each commit),
        # beside a survivor that keeps committing through the kill.
        victim_acks = tmp_path / f"victim-{killed}"
        survivor_acks = tmp_path / f"survivor-{killed}"
        ack_paths += [victim_acks, survivor_acks]
        victim, survivor = start_together(
            path, [(victim_acks, 10**9, 16 * 1024), (survivor_acks, 30, 256)]
        )
        deadline = time.monotonic() + 30
        while not victim_acks.exists() or victim_acks.read_bytes().count(b"\n") < 5 + killed:
            assert time.monotonic() < deadline, "the victim never committed"
            time.sleep(0.005)
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=10)
        assert victim.exitcode == -signal.SIGKILL
        survivor.join(timeout=60)
        assert survivor.exitcode == 0
        # Each killed victim may have committed once without writing its ack.
        assert_consistent(path, read_acks(ack_paths), unacked_allowed=killed)


def test_a_file_from_before_quotas_gets_its_usage_counted(tmp_path):
    """Schema 1 had no usage table: opening such a file counts what each tenant holds."""
    path = tmp_path / "old.zdb"
    store = SQLiteStorage(path)
    for tenant, database in ((T, D), (T, "other"), ("second", D)):
        blobs = {os.urandom(16): os.urandom(100) for _ in range(3)}
        store.commit(tenant, database, expected_seq=0, root=b"r" * 7, blobs=blobs)
        store.put_keyring(tenant, database, "slot", b"k" * 11, expected=None)
    expected = {name: store.usage(name) for name in (T, "second")}
    assert (expected[T].blobs, expected[T].bytes) == (6, 2 * (300 + 7 + 11))
    store.close()
    conn = sqlite3.connect(path)  # make it a version 1 file again
    conn.execute("DROP TABLE usage")
    conn.execute("DROP TABLE staged")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()

    reopened = SQLiteStorage(path)
    try:
        assert {name: reopened.usage(name) for name in (T, "second")} == expected
        assert reopened.tenant_names() == ["second", T]
        version = reopened._connection().execute("PRAGMA user_version").fetchone()[0]
        assert version == 3
    finally:
        reopened.close()
    again = SQLiteStorage(path)  # a file already counted is not counted twice
    try:
        assert again.usage(T) == expected[T]
    finally:
        again.close()


def test_a_file_from_before_staging_gets_the_staged_table(tmp_path):
    """Schema 2 had no staged table: opening such a file adds it, and staging works."""
    path = tmp_path / "v2.zdb"
    store = SQLiteStorage(path)
    store.commit(T, D, expected_seq=0, root=b"r", blobs={os.urandom(16): b"x"})
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE staged")
    conn.execute("PRAGMA user_version=2")
    conn.commit()
    conn.close()

    reopened = SQLiteStorage(path)
    try:
        blob = os.urandom(16)
        reopened.stage(T, D, {blob: b"pending"})
        assert reopened.stats(T, D)["staged"] == 1
        assert reopened.commit(T, D, expected_seq=1, root=b"s", blobs={}, staged=[blob]).ok
        assert reopened.usage(T).blobs == 2
        assert reopened._connection().execute("PRAGMA user_version").fetchone()[0] == 3
    finally:
        reopened.close()
