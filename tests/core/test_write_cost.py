"""Write and read costs on realistic text, counted (never timed).

Employees whose descriptions are 40 words of a 5,000-word Zipf vocabulary
(``zerodb_core.demo.realistic_employees``), loaded in transactions of 10,000 into an
embedded store, then added one per transaction: the bytes a commit sends must follow the
size of the commit, not of the table, and a row read alone must cost about its own size.
The bounds are the issue's:

* a 10,000-record commit sends at most 10 MB, the last at most 1.5 times the first, and
  at most 4 times the plaintext of its records;
* a 500-record commit on the loaded table sends at most 4 MB;
* the whole load, merges included, sends at most 3 times what it leaves stored;
* a single insert sends at most 64 KiB on average, merges included, in a median of at
  most 2 round trips;
* a row picked by ``Any`` on a field the records are not ordered by costs at most 2 KiB
  received, with the inner nodes of the trees cached (a running application's state).

A commit's own bytes are counted where a bound is per commit: the merges it sets off are
separate commits, whose cost the load's total and the single inserts' mean include.
The measures are the benchmark's own (``bench.write_cost``), on less data.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.native_load import storage_report
from bench.write_cost import commit_rows, single_inserts
from tests.conftest import PASSWORD
from zerodb_core import DB
from zerodb_core.demo import Employee, realistic_employees
from zerodb_core.query import Any

pytestmark = pytest.mark.xdist_group("write_cost")

BATCH = 10_000
BATCHES = 5
PROBE = 500
SINGLES = 1_000
MB = 1_000_000


@dataclass
class Loaded:
    path: Path
    commits: list[dict]  # the costs of the 10,000-record commits
    probe: dict  # of the 500-record commit after them
    stored_bytes: int  # the live blobs after those commits
    singles: dict  # of the single inserts after that
    stored: list[tuple[int, int]]  # (pk, salary) of every record

    @property
    def store(self) -> str:
        return f"sqlite:///{self.path}"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    rows = realistic_employees(BATCH * BATCHES + PROBE + SINGLES, seed=11)
    path = tmp_path_factory.mktemp("write_cost") / "hr.zdb"
    db = DB(f"sqlite:///{path}", password=PASSWORD, kdf="fast")
    loads = [rows[start : start + BATCH] for start in range(0, BATCH * BATCHES, BATCH)]
    loads.append(rows[BATCH * BATCHES : BATCH * BATCHES + PROBE])
    commits, stored = [], []
    for batch in loads:
        cost, objs = commit_rows(db, batch)
        commits.append(cost)
        stored += [(o.pk, o.salary) for o in objs]
    stored_bytes = storage_report(path)["live_bytes"]
    singles, added = single_inserts(db, rows[BATCH * BATCHES + PROBE :])  # closes db
    return Loaded(path, commits[:-1], commits[-1], stored_bytes, singles, stored + added)


def test_commits_cost_what_they_change(loaded):
    sent = [c["commit_bytes_sent"] for c in loaded.commits]
    print("commits (bytes sent):", sent, "500 records:", loaded.probe["commit_bytes_sent"])
    assert len(sent) == BATCHES and all(c["records"] == BATCH for c in loaded.commits)
    assert all(n <= 10 * MB for n in sent)
    assert sent[-1] <= 1.5 * sent[0]
    assert all(c["sent_per_plaintext"] <= 4 for c in loaded.commits)
    assert loaded.probe["records"] == PROBE and loaded.probe["commit_bytes_sent"] <= 4 * MB


def test_merges_keep_the_whole_load_within_three_times_what_it_stores(loaded):
    merges = sum(c["merges"] for c in loaded.commits)
    total = sum(c["bytes_sent"] for c in [*loaded.commits, loaded.probe])
    stored = loaded.stored_bytes
    print(f"{merges} merges; the load sent {total / MB:.1f} MB and stores {stored / MB:.1f} MB")
    assert merges > 0  # the load did merge: its total pays for them
    assert total <= 3 * stored


def test_a_single_insert_costs_what_it_changes(loaded):
    singles = loaded.singles
    print(f"single inserts: {singles['bytes_sent_mean']:.0f} bytes sent each (mean)")
    assert singles["transactions"] == SINGLES
    assert singles["total"]["merges"] > 0  # merges happened, and are in the mean
    assert singles["bytes_sent_mean"] <= 64 * 1024
    assert singles["round_trips_median"] <= 2


def test_a_scattered_row_costs_about_its_own_size(loaded):
    unique = sorted(s for s, n in Counter(s for _, s in loaded.stored).items() if n == 1)
    picked = random.Random(3).sample(unique, 100)
    with DB(loaded.store, password=PASSWORD, kdf="fast") as db:
        db.warm_cache()
        before = db.stats()["bytes_received"]
        rows = list(db[Employee].query(Any("salary", picked)))
        received = db.stats()["bytes_received"] - before
    assert sorted(e.salary for e in rows) == sorted(picked)
    print(f"{received / len(rows):.0f} bytes received per row")
    assert received / len(rows) <= 2 * 1024
