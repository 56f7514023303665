"""Load N Employees through the native API into the embedded SQLite store, then time and
count the round trips and bytes of each kind of query, with no added latency and with a
simulated WAN delay per round trip.

Run ``python -m bench.native_load`` (``make bench``). Results: ``bench/results/
native-<date>.json`` and the table between the markers in ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.publish import machine, publish
from zerodb_core import DB
from zerodb_core.demo import FIRST, Employee, fake_employee
from zerodb_core.query import Contains, Gt, InRange

PASSWORD = "bench passphrase"
COUNTERS = ("round_trips", "bytes_sent", "bytes_received")


def person(rng: random.Random) -> dict:
    """An Employee as ``zerodb_core.demo`` makes them, salaries in steps of 10."""
    return fake_employee(rng, salary_step=10)


# -- query kinds -------------------------------------------------------------------------
# Each takes (db, run number, rng) and returns the number of objects it produced. The
# parameters change from run to run, so a run is answered from a warm cache (upper tree
# levels), not from the leaves the previous run left behind.


def q_eq_name(db, i, rng):
    return len(list(db[Employee].query(name=FIRST[i % len(FIRST)], limit=100)))


def q_eq_salary(db, i, rng):
    return len(list(db[Employee].query(salary=rng.randrange(40_000, 250_000, 10))))


def q_range(db, i, rng):
    lo = rng.randrange(40_000, 249_800, 10)
    return len(list(db[Employee].query(InRange("salary", lo, lo + 200))))


def q_and(db, i, rng):
    lo = rng.randrange(40_000, 249_000, 10)
    name = FIRST[i % len(FIRST)]
    return len(list(db[Employee].query(InRange("salary", lo, lo + 1000), name=name)))


def q_count(db, i, rng):
    lo = rng.randrange(40_000, 100_000, 10)
    return len(db[Employee].query(InRange("salary", lo, lo + 140_000)))


def q_order_limit(db, i, rng):
    floor = rng.randrange(40_000, 200_000, 10)
    result = db[Employee].query(Gt("salary", floor), sort_index="salary", reverse=True, limit=20)
    return len(list(result))


def q_deep_offset(db, i, rng):
    result = db[Employee].query(
        Gt("salary", 0), sort_index="salary", skip=50_000 + 997 * i, limit=10
    )
    return len(list(result))


def q_fulltext(db, i, rng):
    # Always the same phrase (about a quarter of all records match it): after the first
    # run its postings are cached, so the median is the client's ranking work.
    return len(list(db[Employee].query(Contains("description", "kernel panic"), limit=10)))


def q_get(db, i, rng, *, pks):
    db[Employee].get(rng.choice(pks))
    return 1


def q_add(db, i, rng):
    db.add(Employee(**person(rng)))
    return 1


KINDS: list[tuple[str, str, Callable]] = [
    ("eq_name", "equality `name=`, first 100 (of ~10,000)", q_eq_name),
    ("eq_salary", "equality `salary=` (~5 results)", q_eq_salary),
    ("range", "range `InRange(salary)` (~100 results)", q_range),
    ("and", "range & equality (~50 results)", q_and),
    ("count", "`len()` of a range (~67,000)", q_count),
    ("order_limit", "`Gt(salary)`, sorted by salary, reverse, limit 20", q_order_limit),
    ("deep_offset", "sorted by salary, skip 50,000, limit 10", q_deep_offset),
    ("fulltext", '`Contains(description, "kernel panic")`, limit 10', q_fulltext),
    ("get", "get by pk", q_get),
    ("add", "add one record (one transaction)", q_add),
]


# -- measuring ---------------------------------------------------------------------------


def measure(db: DB, fn: Callable[[], int]) -> dict[str, Any]:
    before = db.stats()
    started = time.perf_counter()
    rows = fn()
    took = time.perf_counter() - started
    after = db.stats()
    return {"ms": took * 1000, "rows": rows, **{k: after[k] - before[k] for k in COUNTERS}}


def summarise(samples: list[dict]) -> dict[str, Any]:
    out = {"runs": len(samples), "samples": samples}
    for key in ("ms", "rows", *COUNTERS):
        out[key] = statistics.median(s[key] for s in samples)
    out["round_trips_max"] = max(s["round_trips"] for s in samples)
    return out


def load(store: str, records: int, batch: int, seed: int) -> tuple[dict, list[int]]:
    rng = random.Random(seed)
    pks: list[int] = []
    with DB(store, password=PASSWORD, kdf="fast") as db:
        started = time.perf_counter()
        with tqdm(total=records, unit="rec", desc="loading", smoothing=0) as bar:
            for start in range(0, records, batch):
                objs = [Employee(**person(rng)) for _ in range(min(batch, records - start))]
                with db.transaction():
                    db.add(*objs)
                pks.extend(o.pk for o in objs)
                bar.update(len(objs))
        took = time.perf_counter() - started
        stats = db.stats()
    return {
        "records": records,
        "batch": batch,
        "seconds": took,
        "records_per_second": records / took,
        "round_trips": stats["round_trips"],
        "bytes_sent": stats["bytes_sent"],
    }, pks


def storage_report(path: Path) -> dict[str, int]:
    """File sizes, and blob bytes still reachable vs. pending garbage (read-only)."""
    files = {s: Path(f"{path}{s}") for s in ("", "-wal", "-shm")}
    sizes = {s: f.stat().st_size if f.exists() else 0 for s, f in files.items()}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        blobs, blob_bytes = conn.execute(
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM blobs"
        ).fetchone()
        garbage, garbage_bytes = conn.execute(
            "SELECT count(*), coalesce(sum(length(b.data)), 0) FROM garbage g "
            "JOIN blobs b ON b.scope = g.scope AND b.id = g.id"
        ).fetchone()
    finally:
        conn.close()
    return {
        "file_bytes": sizes[""] + sizes["-wal"],
        "db_bytes": sizes[""],
        "wal_bytes": sizes["-wal"],
        "blobs": blobs,
        "blob_bytes": blob_bytes,
        "live_bytes": blob_bytes - garbage_bytes,
        "garbage_blobs": garbage,
        "garbage_bytes": garbage_bytes,
    }


def run_queries(store: str, delay: float, runs: int, pks: list[int], seed: int) -> dict:
    kinds = [
        (key, (lambda db, i, rng, f=fn: f(db, i, rng, pks=pks)) if key == "get" else fn)
        for key, _, fn in KINDS
    ]
    results: dict[str, Any] = {}
    with DB(store, password=PASSWORD, kdf="fast", delay=delay) as db:
        # Warm up: every kind once, with parameters the measured runs do not use.
        for _, fn in kinds:
            fn(db, len(FIRST) + 3, random.Random(seed - 1))
        for key, fn in tqdm(kinds, desc=f"queries @{delay * 1000:g} ms", unit="kind"):
            rng = random.Random(seed)
            results[key] = summarise(
                [measure(db, lambda i=i, fn=fn, rng=rng: fn(db, i, rng)) for i in range(runs)]
            )
    # Cold: a fresh DB object (empty cache, nothing read yet), which is all a fresh
    # process adds; counted from construction, keyring and root reads included.
    rng = random.Random(seed)
    samples = []
    for i in range(runs):
        started = time.perf_counter()
        with DB(store, password=PASSWORD, kdf="fast", delay=delay) as db:
            rows = q_eq_salary(db, i, rng)
            stats = db.stats()
        took = time.perf_counter() - started
        samples.append({"ms": took * 1000, "rows": rows, **{k: stats[k] for k in COUNTERS}})
    results["cold"] = summarise(samples)
    return results


# -- reporting ---------------------------------------------------------------------------

LABELS = {key: label for key, label, _ in KINDS} | {
    "cold": "cold: open a fresh `DB` + `salary=` query",
}


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def markdown(report: dict) -> str:
    ld, st = report["load"], report["storage"]
    delays = list(report["queries"])
    lines = [
        f"Run of {report['date']} on {report['machine']['summary']}: "
        f"`{report['command']}` (total {report['total_seconds']:.0f} s).",
        "",
        f"* **Load**: {ld['records']:,} records in transactions of {ld['batch']:,}: "
        f"{ld['seconds']:.1f} s, **{ld['records_per_second']:,.0f} records/s** "
        f"({ld['round_trips']} round trips, {ld['bytes_sent'] / 2**20:,.1f} MiB sent).",
        *(
            f"* Load in transactions of {o['batch']:,}: {o['records_per_second']:,.0f} "
            f"records/s, file {o['file_bytes'] / 2**20:,.1f} MiB."
            for o in report.get("other_loads", [])
        ),
        f"* **File**: {st['file_bytes'] / 2**20:,.1f} MiB (.zdb {st['db_bytes'] / 2**20:,.1f} "
        f"MiB + -wal {st['wal_bytes'] / 2**20:,.1f} MiB); blobs {st['blobs']:,}, "
        f"{st['blob_bytes'] / 2**20:,.1f} MiB, of which live {st['live_bytes'] / 2**20:,.1f} "
        f"MiB and garbage awaiting collection {st['garbage_bytes'] / 2**20:,.1f} MiB "
        f"({st['garbage_blobs']:,} blobs).",
        "",
        "| query | rows | round trips (median / max) | KiB sent | KiB received | "
        + " | ".join(f"median ms, +{d} ms/RT" for d in delays)
        + " |",
        "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in delays) + " |",
    ]
    base = report["queries"][delays[0]]
    for key in base:
        r = base[key]
        times = " | ".join(f"{report['queries'][d][key]['ms']:,.1f}" for d in delays)
        lines.append(
            f"| {LABELS[key]} | {r['rows']:,g} | {r['round_trips']:g} / {r['round_trips_max']} "
            f"| {_kib(r['bytes_sent'])} | {_kib(r['bytes_received'])} | {times} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=25_000, help="records per transaction")
    parser.add_argument(
        "--also-batches",
        default="10000,1000",
        help="other transaction sizes to time the load with (separate stores), comma-separated",
    )
    parser.add_argument(
        "--delays", default="0,0.025", help="seconds added per round trip, comma-separated"
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each query kind")
    parser.add_argument("--out", default="bench/results", help="directory for the JSON")
    parser.add_argument("--seed", type=int, default=1200)
    parser.add_argument(
        "--no-doc", action="store_true", help="do not refresh the table in docs/performance.md"
    )
    args = parser.parse_args(argv)
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    started = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="zerodb-bench-") as tmp:
        path = Path(tmp) / "bench.zdb"
        store = f"sqlite:///{path}"
        load_report, pks = load(store, args.records, args.batch, args.seed)
        storage = storage_report(path)
        queries = {
            f"{d * 1000:g}": run_queries(store, d, args.runs, pks, args.seed + 1) for d in delays
        }
        storage_after = storage_report(path)
        other_loads = []
        for size in (int(b) for b in args.also_batches.split(",") if b.strip()):
            other = Path(tmp) / f"batch-{size}.zdb"
            report_for_size = load(f"sqlite:///{other}", args.records, size, args.seed)[0]
            report_for_size["file_bytes"] = storage_report(other)["file_bytes"]
            other_loads.append(report_for_size)

    now = dt.datetime.now().astimezone()
    report = {
        "date": now.isoformat(timespec="seconds"),
        "command": "python -m bench.native_load " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "args": vars(args),
        "load": load_report,
        "other_loads": other_loads,
        "storage": storage,
        "storage_after_queries": storage_after,
        "queries": queries,
        "total_seconds": time.perf_counter() - started,
    }
    report["command"] = report["command"].strip()
    publish(
        report,
        markdown(report),
        name="native",
        day=f"{now:%Y-%m-%d}",
        out=args.out,
        heading="Latest results",
        update=not args.no_doc,
    )
    return report


if __name__ == "__main__":
    main()
