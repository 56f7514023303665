"""Write and read costs on realistic text, counted (never timed).

Employees whose descriptions are 40 words of a 5,000-word Zipf vocabulary
(``zerodb_core.demo.realistic_employees``), loaded in transactions of 10,000 into an
embedded store: the bytes a commit sends must follow the size of the commit, not of the
table, and a row read alone must cost about its own size. The bounds are the issue's:

* a 10,000-record commit sends at most 10 MB, the last at most 1.5 times the first, and
  at most 4 times the plaintext of its records;
* a 500-record commit on the loaded table sends at most 4 MB;
* a row picked by ``Any`` on a field the records are not ordered by costs at most 2 KiB
  received, with the inner nodes of the trees cached (a running application's state).

A commit's own bytes are counted: the merges it sets off are separate commits, counted
apart by ``db.stats()`` (their cost is bounded in the round-trip tests and published in
docs/performance.md).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests.conftest import PASSWORD
from zerodb_core import DB
from zerodb_core.demo import plaintext_bytes, realistic_employees
from zerodb_core.models import Field, Model, Text
from zerodb_core.query import Any

pytestmark = pytest.mark.xdist_group("write_cost")

BATCH = 10_000
BATCHES = 5
MB = 1_000_000


class Employee(Model):
    name = Field()
    surname = Field()
    salary = Field()
    description = Text()


def commit_cost(db: DB, rows: list[dict]) -> tuple[int, list[Employee]]:
    """Bytes the commit of ``rows`` sent itself (its merges apart), and the objects."""
    before = db.stats()
    objs = [Employee(**row) for row in rows]
    with db.transaction():
        db.add(*objs)
    after = db.stats()
    sent = after["bytes_sent"] - before["bytes_sent"]
    return sent - (after["merge_bytes_sent"] - before["merge_bytes_sent"]), objs


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    rows = realistic_employees(BATCH * BATCHES + 500, seed=11)
    store = f"sqlite:///{tmp_path_factory.mktemp('write_cost') / 'hr.zdb'}"
    db = DB(store, password=PASSWORD, kdf="fast")
    commits, stored = [], []
    for b in range(BATCHES):
        batch = rows[b * BATCH : (b + 1) * BATCH]
        sent, objs = commit_cost(db, batch)
        commits.append((sent, sum(map(plaintext_bytes, batch))))
        stored += [(o.pk, o.salary) for o in objs]
    probe, objs = commit_cost(db, rows[BATCH * BATCHES :])
    stored += [(o.pk, o.salary) for o in objs]
    yield db, store, commits, probe, stored
    db.close()


def test_commits_cost_what_they_change(loaded):
    _, _, commits, probe, _ = loaded
    print("commits (bytes sent, plaintext):", commits, "500 records:", probe)
    first, last = commits[0][0], commits[-1][0]
    assert all(sent <= 10 * MB for sent, _ in commits)
    assert last <= 1.5 * first
    assert all(sent <= 4 * plain for sent, plain in commits)
    assert probe <= 4 * MB


def test_a_scattered_row_costs_about_its_own_size(loaded):
    _, store, _, _, stored = loaded
    unique = sorted(s for s, n in Counter(s for _, s in stored).items() if n == 1)
    picked = random.Random(3).sample(unique, 100)
    with DB(store, password=PASSWORD, kdf="fast") as db:
        db.warm_cache()
        before = db.stats()["bytes_received"]
        rows = list(db[Employee].query(Any("salary", picked)))
        received = db.stats()["bytes_received"] - before
    assert sorted(e.salary for e in rows) == sorted(picked)
    print(f"{received / len(rows):.0f} bytes received per row")
    assert received / len(rows) <= 2 * 1024
