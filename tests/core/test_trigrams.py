"""Trigram indexes in the engine: ``Substring`` answered from postings, exactly.

Every answer is checked against plain Python (``needle in fold(text)``) on the same
data, after inserts, updates and deletes spread over several runs, with needles of every
length (under 3 characters the scan answers). Counts of a trigram scan read no record.
"""

from __future__ import annotations

import random

import pytest

from tests.core.test_round_trips import FetchLog, tree_ids
from zerodb_core.models import Field, Model, Trigram
from zerodb_core.query import Substring
from zerodb_core.query.planner import TrigramScan, plan
from zerodb_core.text import fold, trigrams

WORDS = ["Kernel", "panic", "ΣΟΦΙΑ", "σοφός", "straße", "İstanbul", "naïve", "a", "ab", "xyz"]


class Note(Model):
    title = Field()
    body = Trigram()


def text(rng: random.Random) -> str | None:
    if rng.random() < 0.1:
        return None
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6)))


def test_fold_is_a_map_of_characters():
    for sample in ["ΣΟΦΙΑΣ ΟΔΟΣ", "İstanbul", "Straße", "ǅemal"]:
        assert fold(sample) == "".join(fold(c) for c in sample)
    assert trigrams("AbCd") == ["abc", "bcd"]
    assert trigrams("ab") == []


@pytest.mark.parametrize("store", ["memory://", "sqlite:///{tmp}/t.zdb"])
def test_substring_from_trigrams_matches_python(make_db, store):
    rng = random.Random(7)
    db = make_db(store)
    notes = {}
    for batch in range(4):  # several runs: inserts, then updates and deletes
        with db.transaction():
            new = [Note(title=str(batch), body=text(rng)) for _ in range(60)]
            db.add(*new)
            for note in rng.sample(list(notes.values()), min(15, len(notes))):
                note.body = text(rng)
                db.add(note)
            for pk in rng.sample(sorted(notes), min(5, len(notes))):
                db.remove(notes.pop(pk))
        notes.update((n.pk, n) for n in new)
    spec = db.current_view().catalog.get(Note.zerodb_name)
    needles = [
        "ker",
        "kernel pa",
        "σοφ",
        "σοφια",
        "stras",
        "i̇st",
        "ïve",
        "a",
        "ab",
        "b x",
        "nothing",
    ]
    for needle in [fold(n) for n in needles]:
        query = Substring("body", needle)
        if len(needle) >= 3:
            assert isinstance(plan(query, spec).source, TrigramScan)
        expected = sorted(pk for pk, n in notes.items() if n.body and needle in fold(n.body))
        assert sorted(n.pk for n in db[Note].query(query)) == expected, needle
        assert db[Note].query(query).count() == len(expected)


def test_count_of_a_trigram_scan_reads_no_record(make_db):
    store = "sqlite:///{tmp}/count.zdb"
    writer = make_db(store)
    with writer.transaction():
        writer.add(*(Note(title=str(n), body=f"entry {n} of the log") for n in range(300)))
    writer.add(Note(title="rare", body="a quokka was here"))
    db = make_db(store)  # a cold cache: every node read is fetched
    fetched = FetchLog(db).ids
    query = Substring("body", "quokka")
    assert db[Note].query(query).count() == 1  # Django's count() is this one
    counted = set(fetched)
    assert [n.title for n in db[Note].query(query)] == ["rare"]
    listed = set(fetched) - counted
    records = tree_ids(db, "r/Note")
    assert counted and not counted & records
    assert listed & records  # listing them does read records


def test_and_keeps_the_cheaper_of_a_trigram_and_a_field_index(make_db):
    """Counted trees give each scan's size: the planner reads the smaller and checks the
    other condition on the records (same answers either way)."""
    from zerodb_core.query import And, Eq
    from zerodb_core.query.executor import Executor
    from zerodb_core.query.planner import IndexScan

    db = make_db()
    with db.transaction():
        db.add(
            *(Note(title="bulk" if n < 500 else f"t{n}", body="common text") for n in range(600))
        )
        db.add(*(Note(title="bulk", body="a quokka") for _ in range(3)))
    table = db.current_view().table(Note.zerodb_name)
    executor = Executor(table)

    def chosen(expr):
        refined = executor.refine(plan(expr, table.spec))
        return refined.source, len(db[Note].query(expr))

    # A common fragment and a rare title: the title's index is read, the text checked.
    source, found = chosen(And(Eq("title", "t550"), Substring("body", "common")))
    assert isinstance(source, IndexScan) and found == 1
    # A rare fragment and a common title: the trigram postings are read.
    source, found = chosen(And(Eq("title", "bulk"), Substring("body", "quokka")))
    assert isinstance(source, TrigramScan) and found == 3
