"""Case-insensitive and substring search on the encrypted store (issue 15): warm times,
round trips and bytes of the queries the ``Lower`` and trigram indexes serve, next to the
scan they replace.

``python -m bench.indexes`` (``make bench``; ``--rows 2000`` for a smoke run). One
embedded SQLite store (KDF ``fast``) holding ``--rows`` employees of
``bench.djangoapp.IndexedEmployee`` (a ``Lower`` index on last_name and on email, a
``TrigramIndex`` on bio), loaded with ``bulk_create``; one employee in 5,000 has the rare
word "quokka" in its bio. Before each query the cache holds every inner node and no
leaf (``DB.warm_cache()``, a running application's steady state), except for the scan
it is compared with, which runs with every leaf cached (its best case); each query runs
``--repeat`` times with other parameters, and the median time is reported with the
round trips and bytes of one run. Results: ``bench/results/indexes-<date>.json`` and
the table between the ``bench:indexes`` markers of docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import django
from django.conf import settings

from bench.publish import machine, publish
from zerodb_core.demo import FIRST, LAST, TOPICS

ALIAS = "zerodb"
RARE = "quokka"
RARE_EVERY = 5000


def configure(tmp: Path) -> None:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only",
        USE_TZ=True,
        INSTALLED_APPS=["django_zerodb", "bench.djangoapp.apps.BenchAppConfig"],
        DATABASES={
            "default": {},
            ALIAS: {
                "ENGINE": "django_zerodb",
                "NAME": "bench",
                "OPTIONS": {
                    "STORE": f"sqlite:///{tmp / 'indexes.zdb'}",
                    "PASSPHRASE": "bench passphrase",
                    "KDF": "fast",
                    "FRESHNESS": "file",
                },
            },
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def make_rows(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        bio = f"Handled the {rng.choice(TOPICS)} and {rng.choice(TOPICS)}."
        if i % RARE_EVERY == RARE_EVERY // 2:
            bio += f" Keeps a {RARE.capitalize()}."
        rows.append(
            {
                "last_name": last,
                "email": f"{first}.{last}.{i}@Example.com",
                "title": f"{rng.choice(TOPICS)} lead",
                "bio": bio,
            }
        )
    return rows


def load(rows: list[dict], batch: int) -> float:
    from django.db import connections

    from bench.djangoapp.models import IndexedEmployee

    with connections[ALIAS].schema_editor() as editor:
        editor.create_model(IndexedEmployee)
    took = 0.0
    for start in range(0, len(rows), batch):
        objs = [IndexedEmployee(**row) for row in rows[start : start + batch]]
        started = time.perf_counter()
        IndexedEmployee.objects.using(ALIAS).bulk_create(objs)
        took += time.perf_counter() - started
        print(f"  loaded {start + len(objs):,} / {len(rows):,}, {took:.1f} s", end="\r")
    print()
    return took


def queries(rows: list[dict]) -> dict[str, Any]:
    """Name -> (rng -> a function running one query), with its plain-Python answer."""
    from bench.djangoapp.models import IndexedEmployee

    employees = IndexedEmployee.objects.using(ALIAS)
    rare = sum(RARE in r["bio"].lower() for r in rows)

    def last_name(rng):
        # A page of them (a common name matches thousands), in the index's order: one
        # value's entries are in pk order there.
        name = rng.choice(LAST).upper()
        return lambda: len(list(employees.filter(last_name__iexact=name)[:20]))

    def last_name_count(rng):
        name = rng.choice(LAST).swapcase()
        return lambda: employees.filter(last_name__iexact=name).count()

    def email(rng):
        address = rng.choice(rows)["email"].lower()
        return lambda: len(list(employees.filter(email__iexact=address)))

    def rare_icontains(rng):
        fragment = rng.choice(["QUOKK", "uokka", "Quokka", "okka."])
        return lambda: len(list(employees.filter(bio__icontains=fragment)))

    def rare_count(rng):
        return lambda: employees.filter(bio__icontains=RARE.upper()).count()

    def scan_icontains(rng):
        # title has no trigram index: the scan the trigram index replaces.
        fragment = rng.choice(TOPICS)[1:4].upper()
        return lambda: len(list(employees.filter(title__icontains=fragment)))

    return {
        "last_name__iexact, a page of 20 (Lower index)": (last_name, 20),
        "last_name__iexact .count() (Lower index)": (last_name_count, None),
        "email__iexact (Lower index)": (email, 1),
        "bio__icontains rare (trigrams)": (rare_icontains, rare),
        "bio__icontains rare .count()": (rare_count, rare),
        "title__icontains (no index: scan, every leaf cached)": (scan_icontains, None),
    }


def measure(make, expected, repeat: int, rng, *, cached: bool) -> dict[str, Any]:
    """``cached``: leave the cache as the previous run left it (the scan at its best:
    every leaf cached after its first run); else inner nodes only before each run."""
    from django.db import connections

    db = connections[ALIAS].session.engine
    times, cost = [], None
    for _ in range(repeat):
        run = make(rng)
        if not cached:
            db.cache.clear()
            db.warm_cache()
        before = db.stats()
        started = time.perf_counter()
        found = run()
        times.append(time.perf_counter() - started)
        after = db.stats()
        if expected is not None and found != expected:
            raise SystemExit(f"wrong answer: {found} != {expected}")
        cost = {k: after[k] - before[k] for k in ("round_trips", "bytes_received")}
    return {"median_ms": statistics.median(times) * 1000, **cost}


def table(results: dict[str, dict], rows: int) -> str:
    lines = [
        f"Warm queries on {rows:,} employees (embedded SQLite store; inner nodes cached)",
        "",
        "| query | median | round trips | bytes received |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['median_ms']:.1f} ms | {r['round_trips']} | {r['bytes_received']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--no-doc", action="store_true", help="do not update performance.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        configure(Path(tmp))
        rows = make_rows(args.rows, args.seed)
        load_seconds = load(rows, args.batch)
        rng = random.Random(args.seed)
        results = {
            name: measure(make, expected, args.repeat, rng, cached="scan" in name)
            for name, (make, expected) in queries(rows).items()
        }
    report = {
        "rows": args.rows,
        "load_seconds": load_seconds,
        "repeat": args.repeat,
        "results": results,
        "machine": machine(),
    }
    publish(
        report,
        table(results, args.rows),
        name="indexes",
        day=dt.date.today().isoformat(),
        out=args.out,
        heading="Case-insensitive and substring search (issue 15)",
        update=not args.no_doc,
    )


if __name__ == "__main__":
    main()
