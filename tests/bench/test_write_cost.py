"""``bench.write_cost`` keeps working: a tiny run end to end, and its refusal handling.

The benchmark is the instrument for the storage redesign, so it must run on any engine
that keeps the public API; these checks count, they never time.
"""

from __future__ import annotations

import json

from bench import write_cost
from blob_server.storage.memory import MemoryStorage
from zerodb_core import DB, CommitTooLargeError
from zerodb_core.demo import realistic_employees
from zerodb_core.transport import LocalTransport


class LimitedTransport(LocalTransport):
    """Refuses commits with more blob bytes than ``limit``, as a blob server does."""

    def __init__(self, limit: int) -> None:
        super().__init__(MemoryStorage())
        self.limit = limit
        self.sizes: list[int] = []  # the blob bytes of every commit tried

    def commit(self, database, *, expected_seq, root, blobs, garbage=(), lease=None):
        size = sum(map(len, blobs.values()))
        self.sizes.append(size)
        if size > self.limit:
            raise CommitTooLargeError(f"{size} bytes exceed {self.limit}")
        return super().commit(
            database,
            expected_seq=expected_seq,
            root=root,
            blobs=blobs,
            garbage=garbage,
            lease=lease,
        )


def test_a_small_run_reports_every_measure(tmp_path):
    args = ["--records", "1200", "--batch", "400", "--probe-at", "800", "--probe", "20"]
    args += ["--singles", "5", "--scattered", "5", "--ft-runs", "1", "--cold-runs", "1"]
    args += ["--no-server", "--no-doc", "--baseline", "none", "--out", str(tmp_path)]
    report = write_cost.main(args)

    emb = report["embedded"]
    assert [c["table"] for c in emb["load"]["commits"]] == [0, 400, 800]
    assert emb["load"]["completed"] and not emb["load"]["refusals"]
    assert emb["load"]["probe"]["records"] == 20 and emb["load"]["probe"]["table"] == 800
    assert all(c["bytes_sent"] > c["plaintext_bytes"] > 0 for c in emb["load"]["commits"])
    assert emb["single"]["transactions"] == 5
    assert emb["scattered"]["cold"]["rows"] == emb["scattered"]["warm"]["rows"] == 5
    assert set(emb["cold"]) == {key for key, _, _ in write_cost.COLD_SHAPES}
    assert set(emb["fulltext"]) == set(write_cost.fulltext_queries())
    assert len(write_cost.targets(report)) == 9
    (written,) = tmp_path.glob("write-cost-*.json")
    assert json.loads(written.read_text())["embedded"]["load"]["records"] == 1200


def first_commit_size(rows: list[dict]) -> int:
    """The blob bytes of a first commit of ``rows`` (as a load's first batch makes it)."""
    transport = LimitedTransport(limit=10**9)
    DB(transport, password="pw", kdf="fast").add(*(write_cost.Employee(**row) for row in rows))
    return transport.sizes[-1]


def test_a_refused_commit_is_recorded_and_retried_in_halves():
    rows = realistic_employees(400, seed=1)
    limit = 140_000
    # 50 records pass the limit and 100 do not, so a batch of 200 is refused, then its
    # first half, and the load goes on in quarters (no merges: they would make larger
    # commits of their own).
    assert first_commit_size(rows[:50]) <= limit < first_commit_size(rows[:100])
    db = DB(LimitedTransport(limit=limit), password="pw", kdf="fast", merge_factor=1000)
    run = write_cost.load(
        db, rows, batch=200, min_batch=50, probe_at=10**9, probe_rows=[], desc="test"
    )
    assert [(r["table"], r["records"]) for r in run["refusals"]] == [(0, 200), (0, 100)]
    assert [c["records"] for c in run["commits"]] == [50] * 8
    assert run["completed"] and run["records"] == 400
    assert len(db[write_cost.Employee]) == 400


def test_a_load_stops_when_even_the_smallest_batch_is_refused():
    rows = realistic_employees(100, seed=2)
    db = DB(LimitedTransport(limit=1_000), password="pw", kdf="fast")
    run = write_cost.load(
        db, rows, batch=50, min_batch=25, probe_at=10**9, probe_rows=[], desc="test"
    )
    assert [r["records"] for r in run["refusals"]] == [50, 25]
    assert run["records"] == 0 and not run["completed"] and not run["commits"]
