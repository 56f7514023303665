"""Rollback and fork detection of the freshness tracker, in memory and in a file."""

from __future__ import annotations

import pytest

from zerodb_core.exceptions import FreshnessError
from zerodb_core.freshness import FileFreshnessTracker, FreshnessTracker

D1, D2, D3, OTHER = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, b"\x09" * 32


@pytest.fixture(params=["memory", "file"])
def tracker(request, tmp_path):
    if request.param == "memory":
        return FreshnessTracker()
    return FileFreshnessTracker(tmp_path / "db.fresh")


def test_accepts_a_growing_chain(tracker):
    tracker.check("db", 0, None, None)
    tracker.check("db", 1, D1, None)
    tracker.check("db", 2, D2, D1)
    tracker.check("db", 2, D2, D1)  # the same root again is fine
    tracker.check("db", 5, D3, OTHER)  # a jump: intermediate roots were never seen


def test_rollback_is_refused(tracker):
    tracker.check("db", 3, D3, D2)
    with pytest.raises(FreshnessError, match="rollback"):
        tracker.check("db", 2, D2, D1)
    with pytest.raises(FreshnessError, match="rollback"):
        tracker.check("db", 0, None, None)


def test_forks_are_refused(tracker):
    tracker.check("db", 2, D2, D1)
    with pytest.raises(FreshnessError, match="fork"):
        tracker.check("db", 2, OTHER, D1)  # same seq, another root
    with pytest.raises(FreshnessError, match="fork"):
        tracker.check("db", 3, D3, OTHER)  # next seq, but not built on what we saw


def test_databases_are_tracked_apart(tracker):
    tracker.check("a", 7, D1, None)
    tracker.check("b", 1, D2, None)


def test_file_survives_a_restart_and_rejects_garbage(tmp_path):
    path = tmp_path / "db.fresh"
    FileFreshnessTracker(path).check("db", 4, D1, None)
    with pytest.raises(FreshnessError, match="rollback"):
        FileFreshnessTracker(path).check("db", 3, D2, None)
    path.write_text("{not json")
    with pytest.raises(FreshnessError, match="cannot read"):
        FileFreshnessTracker(path).check("db", 5, D3, D1)
    path.write_text('{"db": {"seq": "x"}}')
    with pytest.raises(FreshnessError, match="malformed"):
        FileFreshnessTracker(path).check("db", 5, D3, D1)


def test_a_root_current_when_asked_for_is_no_rollback(tracker):
    tracker.check("db", 5, D1, None)
    tracker.check("db", 6, D2, D1)
    tracker.check("db", 5, D1, None, floor=5)  # asked for when 5 was the newest seen
    with pytest.raises(FreshnessError, match="rollback"):
        tracker.check("db", 5, D1, None, floor=6)
    with pytest.raises(FreshnessError, match="rollback"):
        tracker.check("db", 4, D3, None, floor=5)


def test_a_commit_landing_while_a_read_is_on_its_way_is_no_rollback(make_db):
    """Threads share one DB: one may commit (and record seq n+1) while another's root
    read is on its way and returns seq n. That read is current, not a rollback."""
    from zerodb_core.models import Field, Model

    class Hit(Model):
        n = Field()

    db = make_db()
    db.add(Hit(n=1))
    read_root = db.transport.get_root
    interleaved = []

    def get_root(database):
        record = read_root(database)
        if not interleaved:
            interleaved.append(record.seq)
            db.add(Hit(n=2))  # "another thread" commits before this answer is checked
        return record

    db.transport.get_root = get_root
    assert len(db[Hit].query(n=1)) == 1
    assert interleaved and db.stats()["seq"] == interleaved[0] + 1
    assert len(db[Hit]) == 2
