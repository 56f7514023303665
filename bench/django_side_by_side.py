"""The same Django models and queries on this backend, on SQLite and on PostgreSQL, side by
side in one process: bulk-load rate, then median and p90 time of each kind of query, its
ratio to SQLite, and the round trips it takes on the encrypted store, at 0 ms and with a
simulated WAN delay per round trip.

Run ``python -m bench.django_side_by_side`` (``make bench``; ``--quick`` for a smoke run
of a few seconds). Results: ``bench/results/django-<date>.json``, the table between the
``bench:django`` markers in ``docs/performance.md`` and the chart
``docs/img/django-side-by-side.png``.

Databases (aliases), configured with ``settings.configure`` below, all holding the models
of ``bench/djangoapp`` (created with the schema editor, no migrations):

* ``sqlite``: ``django.db.backends.sqlite3``, a file in a temporary directory, Django's
  defaults (rollback journal, ``synchronous=FULL``);
* ``postgres``: ``django.db.backends.postgresql`` (psycopg 3) on ``127.0.0.1:5432``,
  database ``zerodb_bench`` (created if missing, its two tables dropped and recreated);
  if the server cannot be reached its column says "unavailable";
* ``zerodb``: ``django_zerodb`` on an embedded SQLite store file in the temporary
  directory (KDF ``fast``: it only changes how long unlocking takes);
* ``zerodb_25ms`` (one alias per non-zero ``--delays`` entry): the same store and
  database, ``OPTIONS["DELAY"] = 0.025``, so every round trip costs 25 ms more. It gets
  its own engine, hence its own (cold) cache, warmed up like the others.

Every database gets the same rows (seeded), loaded with ``bulk_create`` in chunks of
``--batch`` (one transaction each). Then every operation runs once per database to warm
up, and ``--repeat`` times more with parameters that change from run to run (the same
parameters on every database), the databases interleaved in rotating order so that noise
from the rest of the machine spreads over all of them, the garbage collector run (untimed)
before each. What the numbers mean: docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import django
from django.conf import settings

from bench.publish import REPO, machine, publish
from zerodb_core.demo import FIRST, LAST, TOPICS

PASSPHRASE = "bench passphrase"
CHART = REPO / "docs" / "img" / "django-side-by-side.png"
DEPARTMENTS = 20
TITLES = ["engineer", "analyst", "manager", "designer", "accountant", "recruiter", "support"]
# Substrings of LAST for the unindexed icontains (each matches about 1/9 of the rows).
FRAGMENTS = ["mit", "arc", "hen", "van", "row", "ate", "ull", "ilv"]
SQL_BACKENDS = ("sqlite", "postgres")
TABLES = ("benchapp_employee", "benchapp_department")


def zerodb_alias(delay: float) -> str:
    return "zerodb" if delay == 0 else f"zerodb_{delay * 1000:g}ms"


def is_zerodb(alias: str) -> bool:
    return alias.startswith("zerodb")


# -- the databases -------------------------------------------------------------------------


def postgres_params(args) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": args.pg_database,
        "USER": args.pg_user,
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": args.pg_host,
        "PORT": str(args.pg_port),
    }


def postgres_ready(args) -> str | None:
    """None if PostgreSQL is reachable (creating ``--pg-database`` if missing), else why
    not."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc})"
    try:
        with psycopg.connect(
            host=args.pg_host,
            port=args.pg_port,
            user=args.pg_user,
            password=os.environ.get("PGPASSWORD") or None,
            dbname="postgres",
            connect_timeout=3,
            autocommit=True,
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (args.pg_database,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{args.pg_database}"')
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return None


def configure(args, tmp: Path, delays: list[float], with_postgres: bool) -> list[str]:
    """``settings.configure`` with every database of the run; returns their aliases."""
    store = f"sqlite:///{tmp / 'bench.zdb'}"
    databases: dict[str, dict] = {
        # Nothing uses "default": every query names its database with .using().
        "default": {},
        "sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp / "bench.sqlite3")},
    }
    if with_postgres:
        databases["postgres"] = postgres_params(args)
    for delay in delays:
        databases[zerodb_alias(delay)] = {
            "ENGINE": "django_zerodb",
            "NAME": "bench",
            "OPTIONS": {
                "STORE": store,
                "PASSPHRASE": PASSPHRASE,
                "KDF": "fast",
                # The highest root seen, kept in a file beside the store (as the engine
                # does without Django), not in a table of the (absent) default database.
                "FRESHNESS": "file",
                "DELAY": delay,
            },
        }
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only",
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=["django_zerodb", "bench.djangoapp.apps.BenchAppConfig"],
        DATABASES=databases,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    return [alias for alias in databases if alias != "default"]


def create_tables(alias: str) -> None:
    """The two tables, fresh; on SQLite and PostgreSQL the ``TextIndex`` (a B-tree there)
    is replaced by what those databases would use for the search (nothing on SQLite, a
    GIN index on the tsvector on PostgreSQL)."""
    from django.db import connections

    from bench.djangoapp.models import Department, Employee

    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in TABLES:
                cursor.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    with connection.schema_editor() as editor:
        editor.create_model(Department)
        editor.create_model(Employee)
    index = Employee._meta.indexes[0].name
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"DROP INDEX {index}")
        elif connection.vendor == "postgresql":
            cursor.execute(f"DROP INDEX {index}")
            cursor.execute(
                f"CREATE INDEX {index} ON benchapp_employee "
                "USING gin (to_tsvector('english'::regconfig, COALESCE(bio, '')))"
            )


# -- the rows ------------------------------------------------------------------------------


def make_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """The employees every database gets (``dept`` is an index into the departments)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        rows.append(
            {
                "first_name": first,
                "last_name": last,
                "email": f"{first}.{last}.{i}@example.com".lower(),
                "title": rng.choice(TITLES),
                "salary": rng.randrange(40_000, 250_000, 10),
                "dept": rng.randrange(DEPARTMENTS),
                "bio": f"Handled the {rng.choice(TOPICS)} and {rng.choice(TOPICS)}.",
            }
        )
    return rows


def load(alias: str, rows: list[dict], batch: int) -> tuple[dict[str, Any], list[int]]:
    """bulk_create every row in chunks of ``batch``; only the bulk_create calls are timed
    (building the model instances is the same work for every database)."""
    from bench.djangoapp.models import Department, Employee

    departments = Department.objects.using(alias).bulk_create(
        [Department(name=f"Department {k}") for k in range(DEPARTMENTS)]
    )
    dept_pks = [d.pk for d in departments]
    pks: list[int] = []
    took = 0.0
    for start in range(0, len(rows), batch):
        objs = [
            Employee(
                department_id=dept_pks[r["dept"]],
                **{k: v for k, v in r.items() if k != "dept"},
            )
            for r in rows[start : start + batch]
        ]
        started = time.perf_counter()
        Employee.objects.using(alias).bulk_create(objs)
        took += time.perf_counter() - started
        pks.extend(o.pk for o in objs)
        print(f"  {alias}: {len(pks):,} / {len(rows):,} rows, {took:.1f} s", end="\r", flush=True)
    print()
    return {
        "rows": len(rows),
        "batch": batch,
        "seconds": took,
        "rows_per_second": len(rows) / took,
    }, pks


def analyze(alias: str) -> float:
    """Planner statistics, as a tuned deployment has them (timed, not part of the load)."""
    from django.db import connections

    connection = connections[alias]
    started = time.perf_counter()
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("ANALYZE")
        elif connection.vendor == "postgresql":
            for table in TABLES:
                cursor.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - started


def storage_bytes(alias: str, tmp: Path) -> int | None:
    from django.db import connections

    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) c",
                [list(TABLES)],
            )
            return int(cursor.fetchone()[0])
    stem = tmp / ("bench.sqlite3" if connection.vendor == "sqlite" else "bench.zdb")
    files = [Path(f"{stem}{suffix}") for suffix in ("", "-wal")]
    return sum(f.stat().st_size for f in files if f.exists())


# -- the operations ------------------------------------------------------------------------
# Each query builder takes (alias, rng, ctx) and returns a queryset; the operation's mode
# says what is done with it: "list" (fetch every object), "count", "get". The rng is
# seeded by (operation, run), so every database answers the same question.


def employees(alias: str):
    from bench.djangoapp.models import Employee

    return Employee.objects.using(alias)


def q_eq_email(alias, rng, ctx):
    return employees(alias).filter(email=ctx["rows"][rng.randrange(ctx["n"])]["email"])


def q_eq_name_salary(alias, rng, ctx):
    row = ctx["rows"][rng.randrange(ctx["n"])]
    return employees(alias).filter(first_name=row["first_name"], salary=row["salary"])


def q_range(alias, rng, ctx):
    lo = rng.randrange(40_000, 249_000, 10)
    return employees(alias).filter(salary__range=(lo, lo + 1_000))


def q_top(alias, rng, ctx):
    return employees(alias).order_by("-salary")[:20]


def q_middle_page(alias, rng, ctx):
    offset = ctx["n"] // 2 + rng.randrange(1_000)
    return employees(alias).order_by("-salary")[offset : offset + 20]


def q_count_range(alias, rng, ctx):
    lo = rng.randrange(40_000, 110_000, 10)
    return employees(alias).filter(salary__range=(lo, lo + 70_000))


def q_icontains(alias, rng, ctx):
    return employees(alias).filter(last_name__icontains=rng.choice(FRAGMENTS))


def search(alias: str, words: str):
    """Employees whose bio holds every word: the natural query on each database."""
    qs = employees(alias)
    if is_zerodb(alias):
        return qs.filter(bio__search=words)
    if alias == "postgres":
        from django.contrib.postgres.search import SearchQuery, SearchVector

        return qs.alias(document=SearchVector("bio", config="english")).filter(
            document=SearchQuery(words, config="english")
        )
    for word in words.split():
        qs = qs.filter(bio__icontains=word)
    return qs


def q_search_page(alias, rng, ctx):
    return search(alias, rng.choice(TOPICS))[:20]


def q_search_count(alias, rng, ctx):
    return search(alias, rng.choice(TOPICS))


def q_search_ranked(alias, rng, ctx):
    """The best 20 matches by relevance: BM25 on zerodb (``ZeroManager.search``),
    ``ts_rank`` on PostgreSQL; SQLite has no ranking without FTS5 (not run there)."""
    words = rng.choice(TOPICS)
    if is_zerodb(alias):
        return employees(alias).search(words)[:20]
    from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector

    vector = SearchVector("bio", config="english")
    query = SearchQuery(words, config="english")
    qs = employees(alias).alias(document=vector).filter(document=query)
    return qs.annotate(rank=SearchRank(vector, query)).order_by("-rank")[:20]


def q_get(alias, rng, ctx):
    return employees(alias).filter(pk=ctx["pks"][alias][rng.randrange(ctx["n"])])


def create(alias, rng, ctx):
    ctx["created"] += 1
    employees(alias).create(
        first_name=rng.choice(FIRST),
        last_name=rng.choice(LAST),
        email=f"new.{alias}.{ctx['created']}@example.com",
        title=rng.choice(TITLES),
        salary=rng.randrange(40_000, 250_000, 10),
        department_id=ctx["dept_pks"][alias][0],
        bio=f"Handled the {rng.choice(TOPICS)}.",
    )
    return 1


# (key, label, mode, query builder)
OPERATIONS: list[tuple[str, str, str, Callable | None]] = [
    ("eq_email", "equality `filter(email=...)` (unique)", "list", q_eq_email),
    ("eq_name_salary", "equality `filter(first_name=..., salary=...)`", "list", q_eq_name_salary),
    ("range", "`salary__range`, 1,000 wide (~0.5% of rows)", "list", q_range),
    ("top", '`order_by("-salary")[:20]`', "list", q_top),
    ("middle_page", '`order_by("-salary")[n/2 : n/2+20]`', "list", q_middle_page),
    ("count_range", "`count()` of a `salary__range` (~1/3 of rows)", "count", q_count_range),
    ("icontains", "`count()` of `last_name__icontains` (unindexed)", "count", q_icontains),
    ("search_page", "full-text search, two words, first 20 (id order)", "list", q_search_page),
    ("search_ranked", "full-text search, two words, best 20 by relevance", "list", q_search_ranked),
    ("search_count", "full-text search, two words, `count()`", "count", q_search_count),
    ("create", "`create()` one row (autocommit)", "create", None),
    ("get", "`get(pk=...)`", "get", q_get),
]
LABELS = {key: label for key, label, _, _ in OPERATIONS}
# Operations a database has no natural query for: not run there.
NOT_APPLICABLE = {"search_ranked": {"sqlite": "no ranking (Django has no FTS5 support)"}}


def runs_on(key: str, alias: str) -> bool:
    return alias not in NOT_APPLICABLE.get(key, {})


def run_once(mode: str, build: Callable | None, alias: str, rng, ctx) -> int:
    """Do the operation once; how many objects it produced (or counted)."""
    if mode == "create":
        return create(alias, rng, ctx)
    qs = build(alias, rng, ctx)
    if mode == "count":
        return qs.count()
    if mode == "get":
        qs.get()
        return 1
    return len(list(qs))


def plan(build: Callable | None, alias: str, rng, ctx) -> str | None:
    """The database's plan of the operation's queryset (for ``count`` the plan of the
    rows counted), kept in the JSON to read the timings against."""
    if build is None:
        return None
    try:
        return build(alias, rng, ctx).explain()
    except Exception as exc:
        return f"explain failed: {type(exc).__name__}: {exc}"


# -- measuring -----------------------------------------------------------------------------


def measure(alias: str, fn: Callable[[], int]) -> dict[str, Any]:
    from django.db import connections

    connection = connections[alias]
    zerodb = is_zerodb(alias)
    # Collect now, untimed: otherwise the garbage of one database's operation (the
    # encrypted store's decoded nodes) is collected during, and charged to, the next.
    gc.collect()
    if zerodb:
        connection.ensure_connection()
        engine = connection.connection.engine
        before = engine.stats()
    started = time.perf_counter()
    rows = fn()
    sample: dict[str, Any] = {"ms": (time.perf_counter() - started) * 1000, "rows": rows}
    if zerodb:
        after = engine.stats()
        for key in ("round_trips", "bytes_sent", "bytes_received"):
            sample[key] = after[key] - before[key]
    return sample


def p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def summarise(samples: list[dict]) -> dict[str, Any]:
    ms = [s["ms"] for s in samples]
    out: dict[str, Any] = {
        "runs": len(samples),
        "ms": statistics.median(ms),
        "p90_ms": p90(ms),
        "rows": statistics.median(s["rows"] for s in samples),
        "samples": samples,
    }
    if "round_trips" in samples[0]:
        for key in ("round_trips", "bytes_sent", "bytes_received"):
            out[key] = statistics.median(s[key] for s in samples)
        out["round_trips_max"] = max(s["round_trips"] for s in samples)
    return out


def run_operations(all_aliases: list[str], repeat: int, ctx: dict, seed: int) -> dict:
    results: dict[str, dict[str, Any]] = {alias: {} for alias in all_aliases}
    for key, label, mode, build in OPERATIONS:
        started = time.perf_counter()
        aliases = [alias for alias in all_aliases if runs_on(key, alias)]
        for alias in aliases:  # warm-up, with parameters no measured run uses
            run_once(mode, build, alias, random.Random(f"{seed}:{key}:warm-up"), ctx)
        samples: dict[str, list] = {alias: [] for alias in aliases}
        for i in range(repeat):
            shift = i % len(aliases)
            for alias in aliases[shift:] + aliases[:shift]:
                rng = random.Random(f"{seed}:{key}:{i}")
                once = lambda a=alias, r=rng, m=mode, b=build: run_once(m, b, a, r, ctx)  # noqa: E731
                samples[alias].append(measure(alias, once))
        for alias in aliases:
            results[alias][key] = summarise(samples[alias])
            results[alias][key]["plan"] = plan(
                build, alias, random.Random(f"{seed}:{key}:warm-up"), ctx
            )
        medians = ", ".join(f"{a} {results[a][key]['ms']:,.1f}" for a in aliases)
        print(f"{label}: {medians} ms ({time.perf_counter() - started:.0f} s)")
    return results


# -- reporting -----------------------------------------------------------------------------

NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "zerodb": "zerodb"}


def display(alias: str) -> str:
    if alias in NAMES:
        return NAMES[alias]
    return f"zerodb +{alias.removeprefix('zerodb_').removesuffix('ms')} ms/RT"


def _ms(value: float) -> str:
    return f"{value:,.2f}" if value < 10 else f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


def _ratio(value: float, base: float) -> str:
    ratio = value / base
    return f"{ratio:,.2f}" if ratio < 10 else f"{ratio:,.0f}"


def markdown(report: dict) -> str:
    aliases = report["aliases"]
    unavailable = report.get("unavailable", {})
    # Columns in the order sqlite, postgres, zerodb..., an unavailable database in its place.
    columns = sorted([*aliases, *unavailable], key=lambda a: (is_zerodb(a), a != "sqlite"))
    results = report["operations"]
    lines = [
        f"Run of {report['date']} on {report['machine']['summary']}, Django "
        f"{report['django']}, {report['postgres_version'] or 'PostgreSQL unavailable'}: "
        f"`{report['command']}` (total {report['total_seconds'] / 60:,.0f} min). "
        f"{report['rows']:,} rows; {report['repeat']} measured runs of each operation "
        "after one warm-up run. The machine is shared (other test runs; load average "
        f"{report['load_average'][0]:g} at the start, {report['load_average'][1]:g} at the "
        "end, on 2 cores), so single runs are noisy: read ratios and round trips, not "
        "milliseconds.",
        "",
        f"![ms per operation per backend, log scale]({report['chart']})",
        "",
        "**Bulk load** (`bulk_create`, chunks of "
        f"{report['batch']:,} rows, one transaction each; ANALYZE not included):",
        "",
        "| database | rows/s | seconds | time, ratio to SQLite | size on disk, MiB |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    base = report["load"].get("sqlite")
    for alias, ld in report["load"].items():
        ratio = _ratio(ld["seconds"], base["seconds"]) if base else "-"
        size = ld.get("bytes")
        size_text = f"{size / 2**20:,.1f}" if size is not None else "-"
        lines.append(
            f"| {display(alias)} | {ld['rows_per_second']:,.0f} | {ld['seconds']:,.1f} "
            f"| {ratio} | {size_text} |"
        )
    for alias in unavailable:
        lines.append(f"| {display(alias)} | unavailable | - | - | - |")
    header = ["operation", "rows"]
    for alias in columns:
        header.append(f"{display(alias)} ms, median / p90")
        if alias != "sqlite":
            header.append("ratio to SQLite")
        if is_zerodb(alias):
            header.append("round trips, median / max")
    lines += [
        "",
        "**Queries** (ms per operation, warm; rows = objects returned or counted):",
        "",
        "| " + " | ".join(header) + " |",
        "| --- | " + " | ".join("---:" for _ in header[1:]) + " |",
    ]
    for key, label, _, _ in OPERATIONS:
        ran = [a for a in aliases if key in results[a]]
        counts = {results[a][key]["rows"] for a in ran}
        rows = f"{results[ran[0]][key]['rows']:,g}" + ("" if len(counts) == 1 else " ¹")
        cells = [label, rows]
        base = results.get("sqlite", {}).get(key)
        base_ms = base["ms"] if base else None
        for alias in columns:
            if alias in unavailable or key not in results[alias]:
                cells.append("unavailable" if alias in unavailable else "n/a ²")
                if alias != "sqlite":
                    cells.append("-")
                if is_zerodb(alias):
                    cells.append("-")
                continue
            r = results[alias][key]
            cells.append(f"{_ms(r['ms'])} / {_ms(r['p90_ms'])}")
            if alias != "sqlite":
                cells.append(_ratio(r["ms"], base_ms) if base_ms else "-")
            if is_zerodb(alias):
                cells.append(f"{r['round_trips']:g} / {r['round_trips_max']}")
        lines.append("| " + " | ".join(cells) + " |")
    notes = []

    def disagree(k: str) -> bool:
        return len({results[a][k]["rows"] for a in aliases if k in results[a]}) > 1

    if any(disagree(k) for k in LABELS):
        detail = "; ".join(
            f"{LABELS[k]}: "
            + ", ".join(
                f"{display(a)} {results[a][k]['rows']:,g}" for a in aliases if k in results[a]
            )
            for k in LABELS
            if disagree(k)
        )
        notes.append(f"¹ The databases disagree on the median row count: {detail}.")
    for k, why in NOT_APPLICABLE.items():
        for alias, reason in why.items():
            if alias in aliases:
                notes.append(f"² {LABELS[k]}: not run on {display(alias)}: {reason}.")
    for alias, why in unavailable.items():
        notes.append(f"{display(alias)} unavailable: {why}.")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def chart(report: dict, path: Path) -> None:
    """Grouped bars, log scale: median ms per operation per database, p90 as whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aliases = report["aliases"]
    results = report["operations"]
    keys = [key for key, _, _, _ in OPERATIONS]
    width = 0.8 / len(aliases)
    colours = {"sqlite": "#4c72b0", "postgres": "#55a868", "zerodb": "#c44e52"}
    fig, ax = plt.subplots(figsize=(13, 5.5))
    for n, alias in enumerate(aliases):
        medians = [results[alias][k]["ms"] if k in results[alias] else math.nan for k in keys]
        p90s = [results[alias][k]["p90_ms"] if k in results[alias] else math.nan for k in keys]
        xs = [i + (n - (len(aliases) - 1) / 2) * width for i in range(len(keys))]
        ax.bar(
            xs,
            medians,
            width,
            label=display(alias),
            color=colours.get(alias, "#dd8452"),
            yerr=[[0] * len(keys), [p - m for p, m in zip(p90s, medians)]],
            capsize=2,
            error_kw={"elinewidth": 0.8},
        )
    ax.set_yscale("log")
    ax.set_ylabel("ms per operation (median; whisker: p90)")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels(keys, rotation=30, ha="right")
    ax.set_title(
        f"Django ORM, {report['rows']:,} rows: SQLite, PostgreSQL, django_zerodb "
        f"({report['date'][:10]}, shared 2-core machine)"
    )
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.legend(loc="upper left", ncol=len(aliases))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def postgres_version(alias_present: bool) -> str | None:
    if not alias_present:
        return None
    from django.db import connections

    with connections["postgres"].cursor() as cursor:
        cursor.execute("SHOW server_version")
        return f"PostgreSQL {cursor.fetchone()[0].split()[0]}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=25, help="measured runs per operation")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per bulk_create call")
    parser.add_argument(
        "--delays",
        default="0,0.025",
        help="seconds added per round trip on the encrypted store, comma-separated",
    )
    parser.add_argument("--seed", type=int, default=1200)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2,000 rows, 3 runs, results in a temporary directory, doc untouched",
    )
    parser.add_argument("--out", default=None, help="directory for the JSON (bench/results)")
    parser.add_argument("--chart", default=None, help=f"PNG path ({CHART.relative_to(REPO)})")
    parser.add_argument(
        "--no-doc", action="store_true", help="do not refresh the table in docs/performance.md"
    )
    parser.add_argument("--no-postgres", action="store_true", help="leave PostgreSQL out")
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres", help="password: $PGPASSWORD")
    parser.add_argument("--pg-database", default="zerodb_bench")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeat = min(args.rows, 2_000), min(args.repeat, 3)
        args.batch = min(args.batch, 1_000)
        args.no_doc = True
    quick_dir = Path(tempfile.gettempdir()) / "zerodb-bench-quick"
    out = Path(args.out or (quick_dir if args.quick else REPO / "bench" / "results"))
    chart_path = Path(args.chart) if args.chart else (out / CHART.name if args.no_doc else CHART)
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    if 0.0 not in delays:
        delays.insert(0, 0.0)
    started = time.perf_counter()
    load_before = os.getloadavg()

    unavailable: dict[str, str] = {}
    why = "--no-postgres" if args.no_postgres else postgres_ready(args)
    if why:
        unavailable["postgres"] = why
        print(f"PostgreSQL unavailable: {why}")

    with tempfile.TemporaryDirectory(prefix="zerodb-django-bench-") as tmp_name:
        tmp = Path(tmp_name)
        aliases = configure(args, tmp, delays, with_postgres="postgres" not in unavailable)
        from django.db import connections

        rows = make_rows(args.rows, args.seed)
        ctx: dict[str, Any] = {"rows": rows, "n": len(rows), "created": 0}
        ctx["pks"], ctx["dept_pks"], loads = {}, {}, {}
        # Load each database once (the delayed zerodb aliases share zerodb's store).
        for alias in aliases:
            if alias != "zerodb" and is_zerodb(alias):
                continue
            print(f"loading {alias}")
            create_tables(alias)
            loads[alias], ctx["pks"][alias] = load(alias, rows, args.batch)
            loads[alias]["analyze_seconds"] = analyze(alias)
            loads[alias]["bytes"] = storage_bytes(alias, tmp)
            if alias == "zerodb":
                # Queries start from a fresh engine (empty cache, like an application
                # process that did not just write everything), as the delayed aliases do.
                from django_zerodb.store import forget_engines

                connections[alias].close()
                forget_engines()
        from bench.djangoapp.models import Department

        for alias in aliases:
            source = "zerodb" if is_zerodb(alias) else alias
            ctx["pks"][alias] = ctx["pks"][source]
            ctx["dept_pks"][alias] = sorted(
                Department.objects.using(source).values_list("pk", flat=True)
            )
        pg_version = postgres_version("postgres" in aliases)
        gc.collect()
        gc.freeze()  # the rows and everything loaded: not rescanned by every collection
        operations = run_operations(aliases, args.repeat, ctx, args.seed + 1)
        for alias in aliases:
            connections[alias].close()

    now = dt.datetime.now().astimezone()
    report: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "command": (
            "python -m bench.django_side_by_side " + " ".join(argv or sys.argv[1:])
        ).strip(),
        "machine": machine(),
        "django": django.get_version(),
        "postgres_version": pg_version,
        "args": vars(args),
        "rows": args.rows,
        "repeat": args.repeat,
        "batch": args.batch,
        "aliases": aliases,
        "unavailable": unavailable,
        "queries": {key: label for key, label, _, _ in OPERATIONS},
        "load": loads,
        "operations": operations,
        "total_seconds": time.perf_counter() - started,
        # 1-minute load average of the machine, at the start and at the end of the run.
        "load_average": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
    }
    report["chart"] = (
        os.path.relpath(chart_path, REPO / "docs")
        if chart_path.resolve().is_relative_to(REPO / "docs")
        else str(chart_path)
    )
    chart(report, chart_path)
    print(f"wrote {chart_path}")
    publish(
        report,
        markdown(report),
        name="django",
        day=f"{now:%Y-%m-%d}",
        out=str(out),
        heading="Django: the backend side by side with SQLite and PostgreSQL",
        update=not args.no_doc,
    )
    return report


if __name__ == "__main__":
    main()
