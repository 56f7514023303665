"""What the issue-15 indexes cost a query, counted with the transport's own counters.

On ``testapp.Contact`` (a ``Lower("last_name")`` index, a ``Lower("email")`` unique
constraint and a trigram index on ``bio``), committed, read in autocommit mode with the
inner nodes of every tree cached (``DB.warm_cache()``, a running application's steady
state):

* ``last_name__iexact`` and ``email__iexact``: at most 3 round trips (root, index leaf,
  record leaf), and the same bytes received at two table sizes;
* ``bio__icontains`` of a rare fragment: at most 4 round trips and at most 5 % of the
  bytes of reading every record;
* ``count()`` of it (a fragment without a sigma): postings only, no node of the record
  tree fetched.

Every answer is checked against plain Python on the rows as generated.
"""

from __future__ import annotations

import random

import pytest
from django.db import connections

from tests.core.test_round_trips import FetchLog, tree_ids
from tests.django.conftest import transactional_db
from tests.django.testapp.models import Contact

pytestmark = [transactional_db]

WORDS = [
    "the", "of", "and", "a", "to", "in", "is", "was", "for", "on", "that", "with", "as",
    "by", "at", "from", "his", "her", "report", "kernel", "budget", "meeting", "review",
]  # fmt: skip
RARE = "quokka"
SMALL, LARGE = 400, 2400


def make_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 20))]
        if i % 400 == 7:  # one row in 400
            words.insert(rng.randrange(len(words)), RARE.capitalize())
        rows.append(
            {
                "last_name": rng.choice(["Curry", "curry", "Smith", "Jones", "Ng"]) + str(i % 50),
                "email": f"Person.{i}@Example.org",
                "bio": " ".join(words),
            }
        )
    return rows


def load(alias: str, count: int) -> list[dict]:
    Contact.objects.using(alias).all().delete()
    rows = make_rows(count, count)
    Contact.objects.using(alias).bulk_create(Contact(**row) for row in rows)
    return rows


def engine(alias: str):
    return connections[alias].session.engine


def cost(alias: str, run) -> tuple[object, dict]:
    """Run ``run()`` on a cache holding every inner node and no leaf; return its result
    and what it cost."""
    db = engine(alias)
    db.cache.clear()
    db.warm_cache()
    before = db.stats()
    result = run()
    after = db.stats()
    return result, {k: after[k] - before[k] for k in ("round_trips", "bytes_received")}


@pytest.fixture
def alias():
    from django_zerodb.routers import encrypted_alias

    return encrypted_alias()


def test_iexact_from_lower_indexes(alias):
    spent = {}
    for size in (SMALL, LARGE):
        rows = load(alias, size)
        name = rows[size // 2]["last_name"]
        found, by_name = cost(
            alias, lambda n=name: list(Contact.objects.filter(last_name__iexact=n.upper()))
        )
        assert sorted(c.pk for c in found) == sorted(
            c.pk for c in Contact.objects.all() if c.last_name.lower() == name.lower()
        )
        email = rows[size // 3]["email"].lower()
        found, by_email = cost(alias, lambda e=email: list(Contact.objects.filter(email__iexact=e)))
        assert [c.email.lower() for c in found] == [email]
        assert by_name["round_trips"] <= 3 and by_email["round_trips"] <= 3
        spent[size] = by_email["bytes_received"]
    assert spent[LARGE] == spent[SMALL]


def test_rare_icontains_from_trigrams(alias):
    rows = load(alias, LARGE)
    expected = sum(RARE in row["bio"].lower() for row in rows)
    found, query = cost(alias, lambda: list(Contact.objects.filter(bio__icontains="QUOKK")))
    assert len(found) == expected > 0
    everything, scan = cost(alias, lambda: list(Contact.objects.all()))
    assert len(everything) == LARGE
    assert query["round_trips"] <= 4
    assert query["bytes_received"] <= 0.05 * scan["bytes_received"]
    # contains (case-sensitive) narrows down the same way, then checks the records.
    found, _ = cost(alias, lambda: list(Contact.objects.filter(bio__contains="Quokka")))
    assert len(found) == expected


def test_icontains_count_reads_no_record(alias):
    rows = load(alias, SMALL)
    db = engine(alias)
    db.cache.clear()
    fetched = FetchLog(db).ids
    try:
        count = Contact.objects.filter(bio__icontains=RARE).count()
        counted = set(fetched)
        listed = len(Contact.objects.filter(bio__icontains=RARE))
    finally:
        del db.transport._get_blobs
    assert count == listed == sum(RARE in row["bio"].lower() for row in rows)
    records = tree_ids(db, "r/testapp_contact")
    assert counted and not counted & records
    assert set(fetched) & records  # reading the rows does fetch records
