"""``make demo`` (until the Django example project lands): the native API on the
embedded SQLite store, printing what it stored, a query result and its round trips."""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from zerodb_core import DB
from zerodb_core.models import Field, Model, Text
from zerodb_core.query import Contains, Gt, InRange

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


def fake_employee(rng: random.Random, salary_step: int = 500) -> dict:
    """The fields of a made-up employee (the demo, the tests and the benchmark share it)."""
    return {
        "name": rng.choice(FIRST),
        "surname": rng.choice(LAST),
        "salary": rng.randrange(40_000, 250_000, salary_step),
        "description": f"Handled the {rng.choice(TOPICS)} and {rng.choice(TOPICS)}.",
    }


class Employee(Model):
    name = Field()
    surname = Field()
    salary = Field()
    description = Text()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--store", default="sqlite:///var/demo.zdb", help="store URL (default: %(default)s)"
    )
    parser.add_argument("--employees", type=int, default=5000)
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

    def measure(label, fn):
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
