"""``make demo-native``: the native API on the embedded SQLite store, printing what it
stored, a query result and its round trips; and the made-up employees that the demo, the
tests and the benchmarks share.

Two kinds of employees: ``fake_employee`` writes a description naming two of eight
two-word topics (readable, and what the demo searches), ``realistic_employee`` one of 40
words drawn from a 5,000-word vocabulary with Zipf frequencies, as bios or ticket bodies
are. *Why both:* eight topics give the full-text index 16 terms, so every write touches
the same few leaves; with a realistic vocabulary a write touches a leaf per distinct word,
which is what made commits cost about the whole text index (``bench.write_cost``). They
live here, not in ``bench/``, because the tests assert byte counts on them and
``zerodb_core`` is what is installed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zerodb_core import DB
from zerodb_core.models import Field, Model, Text
from zerodb_core.query import Contains, Gt, InRange
from zerodb_core.serialization import pack

FIRST = ["John", "Ann", "Maria", "Wei", "Olga", "Sam", "Priya", "Tom", "Ines", "Kofi"]
LAST = ["Smith", "Lee", "Garcia", "Chen", "Ivanova", "Brown", "Patel", "Muller", "Silva"]
TOPICS = [
    "kernel panic",
    "payroll export",
    "database migration",
    "network outage",
    "quarterly audit",
    "printer jam",
    "disk encryption",
    "access review",
]


def fake_employee(rng: random.Random, salary_step: int = 500) -> dict[str, Any]:
    """The fields of a made-up employee (the demo, the tests and the benchmark share it)."""
    return {
        "name": rng.choice(FIRST),
        "surname": rng.choice(LAST),
        "salary": rng.randrange(40_000, 250_000, salary_step),
        "description": f"Handled the {rng.choice(TOPICS)} and {rng.choice(TOPICS)}.",
    }


# -- realistic text ----------------------------------------------------------------------

VOCABULARY_SIZE = 5000
DESCRIPTION_WORDS = 40
ZIPF_S = 1.0
# Syllables are onset + vowel + coda; the "" onset and codas make vowel-led and open ones.
# fmt: off
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "ch",
           "dr", "gr", "kl", "pl", "sh", "st", "tr", "")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "k", "nd", "st")
# fmt: on


def _vocabulary(size: int, seed: int = 5000) -> tuple[str, ...]:
    """Return ``size`` distinct pronounceable words, the shortest first.

    Made from syllables by a seeded generator, so the same on every machine and with no
    word list to ship. Shorter words take the frequent ranks (as in real languages, where
    frequent words are short), which keeps a description's bytes realistic; among words
    of one length the order is the generator's, so the frequent words are spread over
    the alphabet (and over the index's key space) instead of clustering at its start.
    """
    rng = random.Random(seed)
    words: dict[str, None] = {}
    while len(words) < size:
        syllables = rng.choice((1, 2, 2, 3, 3, 4))
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        )
        words.setdefault(word)
    return tuple(sorted(words, key=len))


#: The vocabulary of realistic descriptions, most frequent word first.
VOCABULARY = _vocabulary(VOCABULARY_SIZE)
#: Cumulative Zipf weights of ``VOCABULARY``: rank r has weight 1 / r**ZIPF_S.
_CUM_WEIGHTS: tuple[float, ...] = tuple(
    itertools.accumulate(1 / r**ZIPF_S for r in range(1, VOCABULARY_SIZE + 1))
)


def zipf_probability(rank: int) -> float:
    """The probability of the word of ``rank`` (1 = the most frequent) at each position."""
    weight: float = rank**-ZIPF_S  # (an int to a float power: typed Any)
    return weight / _CUM_WEIGHTS[-1]


def realistic_description(rng: random.Random, words: int = DESCRIPTION_WORDS) -> str:
    """``words`` words drawn independently with Zipf frequencies, as one sentence."""
    drawn = rng.choices(VOCABULARY, cum_weights=_CUM_WEIGHTS, k=words)
    return " ".join(drawn).capitalize() + "."


def realistic_employee(rng: random.Random) -> dict[str, Any]:
    """The fields of an employee with a realistic description (salaries in steps of 10,
    so a 200-wide salary range holds about 100 people in 100,000)."""
    return {
        "name": rng.choice(FIRST),
        "surname": rng.choice(LAST),
        "salary": rng.randrange(40_000, 250_000, 10),
        "description": realistic_description(rng),
    }


def realistic_employees(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` realistic employees, the same for the same seed."""
    rng = random.Random(seed)
    return [realistic_employee(rng) for _ in range(n)]


def plaintext_bytes(fields: dict[str, Any]) -> int:
    """The size of a record's fields as the store packs them before encryption (msgpack):
    what "bytes sent per plaintext byte" divides by."""
    return len(pack(fields))


class Employee(Model):
    name = Field()
    surname = Field()
    salary = Field()
    description = Text()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="zerodb-demo",
        description="The engine's native API, without Django: store made-up employees "
        "encrypted (once; a second run reuses them), run three queries (an index range, "
        "a sorted top 3, a ranked full-text search) and print each one's round trips.",
        epilog="The passphrase is $ZERODB_PASSPHRASE (default: a demo one; the store is "
        "only as safe as it). Unlocking a new store derives its key with Argon2id, which "
        "takes a few seconds on purpose. The Django example site is `make demo`.",
    )
    parser.add_argument(
        "--store",
        default="sqlite:///var/demo.zdb",
        help="memory:// or sqlite:///path.zdb (default: %(default)s)",
    )
    parser.add_argument(
        "--employees",
        type=int,
        default=5000,
        help="employees to store into an empty store (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.store.startswith("sqlite:///"):
        Path(args.store[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    password = os.environ.get("ZERODB_PASSPHRASE", "demo passphrase - change me")

    db = DB(args.store, username="root", password=password)
    people = db[Employee]
    if len(people) == 0:
        rng = random.Random(1)
        started = time.perf_counter()
        with db.transaction():
            for _ in range(args.employees):
                db.add(Employee(**fake_employee(rng)))
        took = time.perf_counter() - started
        print(
            f"stored {args.employees} encrypted employees in {took:.2f}s "
            f"({args.employees / took:,.0f} records/s) into {args.store}"
        )
    else:
        print(f"reusing {len(people)} encrypted employees in {args.store}")

    def measure(label: str, fn: Callable[[], object]) -> None:
        before = db.stats()["round_trips"]
        value = fn()
        print(f"  {label}: {value}   [{db.stats()['round_trips'] - before} round trips]")

    print("queries:")
    measure(
        "count of John with 195,000 <= salary <= 200,000",
        lambda: len(people.query(InRange("salary", 195_000, 200_000), name="John")),
    )
    measure(
        "top 3 salaries",
        lambda: [
            (e.name, e.surname, e.salary)
            for e in people.query(Gt("salary", 0), sort_index="salary", reverse=True, limit=3)
        ],
    )
    measure(
        'full text "kernel panic", best 2',
        lambda: [
            (e.name, e.description)
            for e in people.query(Contains("description", "kernel panic"), limit=2)
        ],
    )
    stats = db.stats()
    print(
        f"total: {stats['round_trips']} round trips, {stats['bytes_sent']:,} bytes sent, "
        f"{stats['bytes_received']:,} bytes received, cache {stats['cache_hits']} hits / "
        f"{stats['cache_misses']} misses"
    )
    db.close()


if __name__ == "__main__":
    main()
