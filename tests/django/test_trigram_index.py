"""``TrigramIndex``: pattern lookups answered from trigram postings, exactly.

The same lookups are asked with the index and without it (the scan), after every write
path, and must agree; the plan shows when the index is read. Candidate completeness for
``iregex`` rests on a property of Python's ``re`` checked here over every code point.
"""

from __future__ import annotations

import re
import sys

import pytest
from django.db import migrations, models

from django_zerodb.indexes import TrigramIndex
from django_zerodb.substring import IREGEX_SAFE, regex_fragments
from tests.django.conftest import BOTH_STORES, db
from tests.django.test_functional_indexes import PEOPLE, person, person_state, plan_of, scratch
from tests.django.test_migrations import apply
from zerodb_core.text import fold

__all__ = ["scratch"]  # the fixture, used by name

BIOS = [
    "Kernel panic at boot",
    "kernel PANIC twice",
    "ΣΟΦΙΑ writes Greek",
    "a naïve café owner",
    "ends with KERNEL",
    "ab",
    None,
    "",
]
LOOKUPS = [
    ("contains", "kernel"),
    ("contains", "Kernel"),
    ("icontains", "KERNEL"),
    ("icontains", "ΣΟΦ"),
    ("icontains", "café"),
    ("icontains", "ab"),
    ("endswith", "KERNEL"),
    ("iendswith", "kernel"),
    ("iexact", "AB"),
    ("iexact", "kernel panic twice"),
    ("regex", "^Kern.*boot"),
    ("regex", "el (PAN|pan)"),
    ("iregex", "PANIC"),
    ("iregex", "naïve"),
]


def answers(Person) -> dict:
    return {
        (name, value): sorted(
            Person.objects.filter(**{f"bio__{name}": value}).values_list("pk", flat=True)
        )
        for name, value in LOOKUPS
    }


def bio_state(alias):
    state = person_state(alias)
    state = apply(alias, state, migrations.AddField("Person", "bio", models.TextField(null=True)))
    Person = person(state)
    for pk, bio in zip(sorted(Person.objects.values_list("pk", flat=True)), BIOS):
        Person.objects.filter(pk=pk).update(bio=bio)
    Person.objects.bulk_create(Person(bio=bio) for bio in BIOS[len(PEOPLE) :])
    return state


@db
@BOTH_STORES
def test_lookups_agree_with_the_scan_on_every_write_path(scratch):
    alias = scratch
    state = bio_state(alias)
    scanned = answers(person(state))
    index = TrigramIndex(fields=["bio"], name="person_bio_trgm")
    state = apply(alias, state, migrations.AddIndex("Person", index))
    Person = person(state)
    assert "TrigramScan" in plan_of(Person.objects.filter(bio__icontains="kernel"))
    assert "TrigramScan" not in plan_of(Person.objects.filter(bio__icontains="ke"))
    assert answers(Person) == scanned
    # Writes keep it exact.
    first = Person.objects.filter(bio__icontains="boot").get()
    first.bio = "rebooted the kernel"
    first.save()
    Person.objects.filter(bio__icontains="greek").update(bio="ΣΟΦΟΣ ΟΔΟΣ")
    Person.objects.filter(bio="ab").delete()
    Person.objects.bulk_create([Person(bio="another kernel")])
    moved = list(Person.objects.filter(bio__icontains="café"))
    for p in moved:
        p.bio = "tea"
    Person.objects.bulk_update(moved, ["bio"])
    indexed = answers(Person)
    state = apply(alias, state, migrations.RemoveIndex("Person", "person_bio_trgm"))
    Person = person(state)
    assert "TrigramScan" not in plan_of(Person.objects.filter(bio__icontains="kernel"))
    assert answers(Person) == indexed
    assert indexed[("icontains", "KERNEL")]  # something is found at all


def test_regex_fragments():
    assert regex_fragments("^Kern.*boot", False) == ["Kern", "boot"]
    assert regex_fragments("el (PAN|pan)", False) == ["el "]
    assert regex_fragments("a+bcd|x", False) == []  # an alternative at the top
    assert regex_fragments("(?i)abc", False) == ["abc"]
    assert regex_fragments("(?i)Kelvin", False) == []  # k, i and s are not safe
    assert regex_fragments("[", False) is None


@pytest.mark.slow
def test_iregex_safe_characters_match_only_what_folds_alike():
    """Every character ``re.IGNORECASE`` matches to a safe one folds like it."""
    safe = sorted(IREGEX_SAFE)
    pattern = re.compile("[" + "".join(map(re.escape, safe)) + "]", re.IGNORECASE)
    for code in range(sys.maxunicode + 1):
        d = chr(code)
        if pattern.fullmatch(d):
            matched = [c for c in safe if re.fullmatch(re.escape(c), d, re.IGNORECASE)]
            assert matched and all(fold(d) == fold(c) for c in matched), d
