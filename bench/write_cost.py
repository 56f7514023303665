"""What writes cost in bytes on realistic text, embedded and through the blob server, next
to the targets of the log-structured index redesign, plus the reads that must not get
worse.

Run ``python -m bench.write_cost`` (``make bench``). Results: ``bench/results/
write-cost-<date>.json`` and the tables between the markers in ``docs/performance.md``.

The data are ``zerodb_core.demo.realistic_employees``: a 40-word description from a
5,000-word vocabulary with Zipf frequencies, full-text indexed. Only the public native API
is used (``DB``, ``db.add``, ``db.transaction()``, queries, ``db.stats()`` counters), so
the same benchmark measures the engine before and after its storage layer changes.

Refusals (a commit the blob server will not take) are results, not crashes: the batch is
halved down to ``--min-batch`` and the load goes on, or stops there and says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.native_load import (
    q_and,
    q_count,
    q_deep_offset,
    q_eq_name,
    q_eq_salary,
    q_order_limit,
    q_range,
    storage_report,
)
from bench.publish import REPO, machine, publish
from bench.server_vs_redis import cli, start_redis, start_server, stop
from blob_server.server import DEFAULT_MAX_COMMIT_BYTES
from zerodb_core import DB, CommitTooLargeError, QuotaExceededError
from zerodb_core.demo import (
    DESCRIPTION_WORDS,
    VOCABULARY,
    Employee,
    plaintext_bytes,
    realistic_employee,
    zipf_probability,
)
from zerodb_core.keyfile import KeyFile
from zerodb_core.query import Any as AnyOf
from zerodb_core.query import Contains

PASSWORD = "bench passphrase"
TENANT = "bench"
COUNTERS = ("round_trips", "bytes_sent", "bytes_received")
#: What an engine that merges in the background of commits reports of those merges (the
#: bytes above include them; an engine that does not report them counts 0).
MERGE_COUNTERS = ("merges", "merge_bytes_sent")
MB = 1_000_000
KIB = 1024
#: Refusals a load records instead of crashing: the store would not take the commit.
REFUSED = (CommitTooLargeError, QuotaExceededError)
#: Ranks (1 = most frequent) of the words full-text queries look for: one in about a
#: third of the descriptions, one in about 4%, one in about 0.4%.
WORD_RANKS = {"frequent": 10, "mid": 100, "rare": 1000}
CHART = REPO / "docs" / "img" / "write-cost-growth.png"
BASELINE = Path("bench/results/write-cost-baseline.json")

Row = dict[str, Any]


# -- counting ------------------------------------------------------------------------------


def counters(db: DB) -> dict[str, int]:
    """The transport's counters of ``db`` so far."""
    stats = db.stats()
    return {k: stats.get(k, 0) for k in COUNTERS + MERGE_COUNTERS}


@contextmanager
def counted(db: DB) -> Iterator[dict[str, Any]]:
    """Fill the yielded dict with the seconds and counter deltas of the block."""
    out: dict[str, Any] = {}
    before = counters(db)
    started = time.perf_counter()
    yield out
    out["seconds"] = time.perf_counter() - started
    after = counters(db)
    out.update({k: after[k] - before[k] for k in COUNTERS + MERGE_COUNTERS})


def commit_rows(db: DB, rows: list[Row]) -> tuple[dict[str, Any], list[Employee]]:
    """Add ``rows`` in one transaction; return its cost and the stored objects."""
    with counted(db) as cost:
        objs = [Employee(**row) for row in rows]
        with db.transaction():
            db.add(*objs)
    cost["records"] = len(rows)
    cost["plaintext_bytes"] = sum(map(plaintext_bytes, rows))
    # The commit's own bytes: the merges it set off are separate commits, counted apart
    # (and in every total of the load).
    cost["commit_bytes_sent"] = cost["bytes_sent"] - cost["merge_bytes_sent"]
    cost["sent_per_plaintext"] = cost["commit_bytes_sent"] / cost["plaintext_bytes"]
    return cost, objs


# -- the bulk load and its growth series ---------------------------------------------------


def load(
    db: DB,
    rows: list[Row],
    *,
    batch: int,
    min_batch: int,
    probe_at: int,
    probe_rows: list[Row],
    desc: str,
) -> dict[str, Any]:
    """Load ``rows`` in transactions of ``batch``, recording every commit, and once the
    table holds ``probe_at`` records, commit ``probe_rows`` on their own (not part of the
    load's rate or series). A refused commit is recorded and retried in halves, down to
    ``min_batch``; below that the load stops there."""
    commits: list[dict[str, Any]] = []
    refusals: list[dict[str, Any]] = []
    stored: list[tuple[int, int]] = []  # (pk, salary) of every record stored
    probe: dict[str, Any] | None = None
    done, size = 0, batch
    with tqdm(total=len(rows), unit="rec", desc=desc, smoothing=0) as bar:
        while done < len(rows):
            chunk = rows[done : done + size]
            try:
                cost, objs = commit_rows(db, chunk)
            except REFUSED as exc:
                refusals.append({"table": done, "records": len(chunk), "error": str(exc)})
                if size // 2 < min_batch:
                    break
                size //= 2
                continue
            commits.append({"table": done, **cost})
            stored += [(o.pk, o.salary) for o in objs]
            done += len(chunk)
            bar.update(len(chunk))
            if probe is None and probe_rows and done >= probe_at:
                try:
                    probe, objs = commit_rows(db, probe_rows)
                    probe["table"] = done
                    stored += [(o.pk, o.salary) for o in objs]
                except REFUSED as exc:
                    probe = {"table": done, "records": len(probe_rows), "refused": str(exc)}
    seconds = sum(c["seconds"] for c in commits)
    return {
        "batch": batch,
        "min_batch": min_batch,
        "records": done,
        "completed": done == len(rows),
        "seconds": seconds,
        "records_per_second": done / seconds if seconds else 0.0,
        "bytes_sent": sum(c["bytes_sent"] for c in commits),
        "round_trips": sum(c["round_trips"] for c in commits),
        "plaintext_bytes": sum(c["plaintext_bytes"] for c in commits),
        "commits": commits,
        "refusals": refusals,
        "probe": probe,
        "stored": stored,
    }


# -- single inserts ------------------------------------------------------------------------


def single_inserts(db: DB, rows: list[Row]) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """One transaction per row, on the DB that loaded the table (its cache warm, as in a
    long-running application). The mean is of everything the DB sent from the first
    transaction until it was closed, so merges or flushes it makes count too."""
    before = counters(db)
    samples = []
    stored = []
    for row in tqdm(rows, desc="single inserts", unit="txn"):
        cost, objs = commit_rows(db, [row])
        samples.append({k: cost[k] for k in ("seconds", *COUNTERS)})
        stored.append((objs[0].pk, objs[0].salary))
    db.close()  # anything it still sends on closing belongs to these inserts
    total = {k: counters(db)[k] - before[k] for k in COUNTERS + MERGE_COUNTERS}
    return {
        "transactions": len(rows),
        "bytes_sent_mean": total["bytes_sent"] / len(rows),
        "bytes_sent_max": max(s["bytes_sent"] for s in samples),
        "round_trips_median": statistics.median(s["round_trips"] for s in samples),
        "round_trips_max": max(s["round_trips"] for s in samples),
        "ms_median": statistics.median(s["seconds"] for s in samples) * 1000,
        "total": total,
        "samples": samples,
    }, stored


# -- reads ---------------------------------------------------------------------------------


def scattered_rows(
    store: str, stored: list[tuple[int, int]], rows: int, seed: int
) -> dict[str, Any]:
    """Bytes received per row of ``rows`` records picked by ``Any(salary, values)``, with
    salaries held by one record each, so the rows are spread over the whole record tree.
    Cold: a fresh DB, counted from its construction. Warm: the same DB then asks for
    other rows the same way (the inner nodes the first query read are cached). Inner
    cached: every inner node of the trees is in the cache (a running application's steady
    state: inner nodes are about 2% of the bytes), and it asks for other rows again."""
    counts = Counter(salary for _, salary in stored)
    unique = sorted(s for s, n in counts.items() if n == 1)
    picked = random.Random(seed).sample(unique, 3 * rows)
    out: dict[str, Any] = {}
    before = dict.fromkeys(COUNTERS, 0)
    db = DB(store, password=PASSWORD, kdf="fast")
    steps = (
        ("cold", picked[:rows]),
        ("warm", picked[rows : 2 * rows]),
        ("inner_cached", picked[2 * rows :]),
    )
    try:
        for label, values in steps:
            if label == "inner_cached":
                cache_inner_nodes(db)
                before = counters(db)
            started = time.perf_counter()
            found = len(list(db[Employee].query(AnyOf("salary", values))))
            took = time.perf_counter() - started
            after = counters(db)
            cost = {k: after[k] - before[k] for k in COUNTERS}
            out[label] = {
                "rows": found,
                "ms": took * 1000,
                **cost,
                "bytes_received_per_row": cost["bytes_received"] / found,
            }
            before = after
    finally:
        db.close()
    return out


def cache_inner_nodes(db: DB) -> None:
    """Read every inner node (and filter) of every tree into the cache, none of their
    leaves (an engine without ``DB.warm_cache`` is left as it is)."""
    warm = getattr(db, "warm_cache", None)
    if warm is not None:
        warm()


def fulltext_queries() -> dict[str, str]:
    """The 1-word and 2-word queries, keyed by a label naming the words' frequencies."""
    words = {k: VOCABULARY[rank - 1] for k, rank in WORD_RANKS.items()}
    one = {f"1 word, {k}": w for k, w in words.items()}
    two = {
        "2 words, frequent + mid": f"{words['frequent']} {words['mid']}",
        "2 words, mid + rare": f"{words['mid']} {words['rare']}",
        "2 words, frequent + rare": f"{words['frequent']} {words['rare']}",
    }
    return one | two


def fulltext(store: str, runs: int) -> dict[str, Any]:
    """Median ms of each top-10 ``Contains`` query, warm: one DB runs every query once,
    then each ``runs`` times more."""
    queries = fulltext_queries()
    out: dict[str, Any] = {}
    with DB(store, password=PASSWORD, kdf="fast") as db:
        people = db[Employee]
        for text in queries.values():
            list(people.query(Contains("description", text), limit=10))
        for label, text in tqdm(queries.items(), desc="full text, warm", unit="query"):
            samples = []
            for _ in range(runs):
                with counted(db) as cost:
                    cost["rows"] = len(list(people.query(Contains("description", text), limit=10)))
                samples.append(cost)
            out[label] = {
                "query": text,
                "ms": statistics.median(s["seconds"] for s in samples) * 1000,
                "round_trips": statistics.median(s["round_trips"] for s in samples),
                "rows": samples[0]["rows"],
                "samples_ms": [s["seconds"] * 1000 for s in samples],
            }
    return out


def q_fulltext(db: DB, i: int, rng: random.Random) -> int:
    """The 2-word query of a mid and a rare word, top 10."""
    text = fulltext_queries()["2 words, mid + rare"]
    return len(list(db[Employee].query(Contains("description", text), limit=10)))


def q_get(db: DB, i: int, rng: random.Random, *, pks: list[int]) -> int:
    """One record by a pk the run stored."""
    db[Employee].get(rng.choice(pks))
    return 1


def q_open(db: DB, i: int, rng: random.Random) -> int:
    """Nothing but what opening costs: the keyring (read at construction) and the root."""
    db.snapshot()
    return 0


#: The query shapes of bench.native_load, on this data: (key, label, query).
COLD_SHAPES: list[tuple[str, str, Callable]] = [
    ("eq_name", "equality `name=`, first 100", q_eq_name),
    ("eq_salary", "equality `salary=` (~5 results)", q_eq_salary),
    ("range", "range `InRange(salary)` (~100 results)", q_range),
    ("and", "range & equality (~50 results)", q_and),
    ("count", "`len()` of a range", q_count),
    ("order_limit", "`Gt(salary)`, sorted, reverse, limit 20", q_order_limit),
    ("deep_offset", "sorted by salary, skip 50,000, limit 10", q_deep_offset),
    ("fulltext", "`Contains(description, mid + rare word)`, limit 10", q_fulltext),
    ("get", "get by pk", q_get),
    ("open", "open: keyring + root read, no query", q_open),
]


def cold_round_trips(store: str, pks: list[int], runs: int, seed: int) -> dict[str, Any]:
    """Round trips of each query shape on a fresh DB, counted from its construction
    (keyring and root reads included), ``runs`` times with changing parameters."""
    out: dict[str, Any] = {}
    for key, label, fn in tqdm(COLD_SHAPES, desc="cold queries", unit="shape"):
        query = (lambda db, i, rng, f=fn: f(db, i, rng, pks=pks)) if key == "get" else fn
        rng = random.Random(seed)
        samples = []
        for i in range(runs):
            with DB(store, password=PASSWORD, kdf="fast") as db:
                rows = query(db, i, rng)
                samples.append({"rows": rows, **counters(db)})
        out[key] = {
            "label": label,
            "round_trips": statistics.median(s["round_trips"] for s in samples),
            "round_trips_max": max(s["round_trips"] for s in samples),
            "bytes_received": statistics.median(s["bytes_received"] for s in samples),
            "rows": statistics.median(s["rows"] for s in samples),
        }
    return out


# -- through the blob server ---------------------------------------------------------------


@contextmanager
def blob_server(directory: Path) -> Iterator[tuple[tuple[str, int], KeyFile, Callable, str]]:
    """A private redis-server and ``zerodb-server serve`` with its default settings (as
    ``bench.server_vs_redis`` starts them), a tenant and a login key; yields the address,
    the key file, a function returning the tenant's ``zerodb-server stats`` and the
    Redis URL."""
    redis_proc, redis_port = start_redis(directory)
    server = None
    try:
        url = f"redis://127.0.0.1:{redis_port}/0"
        tenants = directory / "tenants.json"
        key = KeyFile.create(TENANT)
        cli("add-tenant", TENANT, "--tenants", str(tenants))
        cli("add-key", TENANT, key.public_key.hex(), "--tenants", str(tenants))
        log = directory / "server.log"
        server, port = start_server(url, tenants, log, options=())

        def usage() -> dict[str, Any]:
            report = json.loads(cli("stats", "--redis", url, "--tenants", str(tenants), "--json"))
            return next(t for t in report["tenants"] if t["tenant"] == TENANT)

        yield ("127.0.0.1", port), key, usage, url
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            raise SystemExit(f"the blob server logged a failure:\n{text[-4000:]}")
    finally:
        if server is not None:
            stop(server)
        stop(redis_proc)


# -- the million-record run ----------------------------------------------------------------


def checkpoint_round_trips(store: str, rng: random.Random, runs: int = 5) -> tuple[float, float]:
    """Median round trips of a ``salary=`` query on a fresh DB (from its construction),
    ``runs`` times, then of ``runs`` more such queries on the last of those DBs (warm)."""
    cold = []
    for i in range(runs):
        with DB(store, password=PASSWORD, kdf="fast") as db:
            q_eq_salary(db, i, rng)
            cold.append(counters(db)["round_trips"])
    warm = []
    with DB(store, password=PASSWORD, kdf="fast") as db:
        q_eq_salary(db, 0, rng)
        for i in range(runs):
            with counted(db) as cost:
                q_eq_salary(db, i, rng)
            warm.append(cost["round_trips"])
    return statistics.median(cold), statistics.median(warm)


def million(path: Path, records: int, batch: int, every: int, seed: int) -> dict[str, Any]:
    """Load ``records`` embedded in transactions of ``batch`` (rows made batch by batch,
    not held), recording every commit; every ``every`` records, the round trips of
    ``salary=`` queries cold and warm (``checkpoint_round_trips``) and the file's size."""
    store = f"sqlite:///{path}"
    rng = random.Random(seed)
    commits, checkpoints = [], []
    started = time.perf_counter()
    with (
        DB(store, password=PASSWORD, kdf="fast") as db,
        tqdm(total=records, unit="rec", desc="million", smoothing=0) as bar,
    ):
        for done in range(0, records, batch):
            rows = [realistic_employee(rng) for _ in range(min(batch, records - done))]
            try:
                cost, _ = commit_rows(db, rows)
            except REFUSED as exc:
                commits.append({"table": done, "records": len(rows), "refused": str(exc)})
                break
            commits.append({"table": done, **cost})
            bar.update(len(rows))
            if (done + len(rows)) % every == 0:
                cold, warm = checkpoint_round_trips(store, random.Random(done))
                checkpoints.append(
                    {
                        "table": done + len(rows),
                        "cold_round_trips": cold,
                        "warm_round_trips": warm,
                        "commit_bytes_sent": cost["commit_bytes_sent"],
                        "elapsed_seconds": time.perf_counter() - started,
                        "file_bytes": storage_report(path)["file_bytes"],
                    }
                )
    return {
        "records": records,
        "batch": batch,
        "loaded": sum(c.get("records", 0) for c in commits if "refused" not in c),
        "seconds": time.perf_counter() - started,
        "commits": commits,
        "checkpoints": checkpoints,
    }


def chart(report: dict[str, Any], path: Path) -> None:
    """Bytes sent per commit against the table's size (the commit's own, which the
    target bounds, and with the merges it set off), and the round trips of the
    checkpoint queries, for the million-record run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = report["million"]
    done = [c for c in run["commits"] if "refused" not in c]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    sizes = [(c["table"] + c["records"]) / 1000 for c in done]
    top.plot(
        sizes,
        [c["bytes_sent"] / MB for c in done],
        label="with the merges it set off (separate commits)",
        color="#8c8c8c",
        linewidth=0.8,
    )
    top.plot(
        sizes,
        [c["commit_bytes_sent"] / MB for c in done],
        label=f"bytes sent by each {run['batch']:,}-record commit",
        color="#c44e52",
    )
    top.axhline(10, color="#55a868", linestyle="--", label="target: <= 10 MB, flat")
    top.axhline(
        DEFAULT_MAX_COMMIT_BYTES / MB,
        color="#4c72b0",
        linestyle=":",
        label="the blob server's default limit per commit (48 MiB)",
    )
    top.set_ylabel("MB sent per commit")
    top.set_yscale("log")
    top.grid(alpha=0.3)
    top.legend()
    marks = run["checkpoints"]
    xs = [m["table"] / 1000 for m in marks]
    bottom.plot(xs, [m["cold_round_trips"] for m in marks], "o-", label="cold salary= query")
    bottom.plot(xs, [m["warm_round_trips"] for m in marks], "s-", label="warm salary= query")
    bottom.set_ylabel("round trips (median of 5)")
    bottom.set_xlabel("records in the table (thousands)")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    bottom.legend()
    top.set_title(
        f"Realistic text, embedded store, {report['label']} ({report['date'][:10]})", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- targets and reporting -----------------------------------------------------------------


def _mb(n: float) -> str:
    return f"{n / MB:,.1f} MB"


def _kib(n: float) -> str:
    return f"{n / KIB:,.1f} KiB"


def _yes(ok: bool | None) -> str:
    return "-" if ok is None else ("**yes**" if ok else "**no**")


def _growth(run: dict[str, Any] | None) -> tuple[str, bool | None]:
    """The growth row's cell for one load: first and last full commit and their ratio."""
    if run is None:
        return "not run", None
    full = [c for c in run["commits"] if c["records"] == run["batch"]]
    refused = run["refusals"]
    if not full:
        return f"refused from the first commit ({refused[0]['error']})", False
    first, last = (c.get("commit_bytes_sent", c["bytes_sent"]) for c in (full[0], full[-1]))
    text = f"first {_mb(first)}, last {_mb(last)} ({last / first:.1f}x)"
    if refused:
        text += f"; refused at {refused[0]['table']:,} records"
    ok = run["completed"] and not refused and last <= 1.5 * first and last <= 10 * MB
    return text, ok


def targets(report: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(measure, target, measured, met) for the issue's table."""
    emb, srv = report["embedded"], report.get("server")
    rows: list[tuple[str, str, str, bool | None]] = []
    growth, ok_emb = _growth(emb["load"])
    server_growth, ok_srv = _growth(srv["load"] if srv else None)
    rows.append(
        (
            f"bytes sent per {emb['load']['batch']:,}-record commit as the table grows "
            f"0 -> {emb['load']['records']:,}",
            "flat (last <= 1.5x first), <= 10 MB",
            f"embedded: {growth}; server: {server_growth}",
            ok_emb and (ok_srv is not False),
        )
    )
    probe = emb["load"]["probe"]
    if probe:
        server_probe = srv["load"]["probe"] if srv else None
        rows.append(
            (
                f"{probe['records']:,}-record commit on a {probe['table']:,} table",
                "<= 4 MB",
                f"embedded: {_probe(probe)}; server: {_probe(server_probe)}",
                "refused" not in probe
                and probe["bytes_sent"] <= 4 * MB
                and (server_probe is None or "refused" not in server_probe),
            )
        )
    single = emb["single"]
    rows.append(
        (
            f"single insert + commit, mean over {single['transactions']:,} incl. merges",
            "<= 64 KiB",
            f"{_kib(single['bytes_sent_mean'])} (max {_kib(single['bytes_sent_max'])})",
            single["bytes_sent_mean"] <= 64 * KIB,
        )
    )
    rows.append(
        (
            "single insert round trips (median)",
            "<= 2",
            f"{single['round_trips_median']:g} (max {single['round_trips_max']})",
            single["round_trips_median"] <= 2,
        )
    )
    worst = max(emb["load"]["commits"], key=lambda c: c["sent_per_plaintext"])
    rows.append(
        (
            f"bytes sent by a {emb['load']['batch']:,}-record commit / plaintext bytes",
            "<= 4x at any size",
            f"{emb['load']['commits'][0]['sent_per_plaintext']:.1f}x on an empty table, "
            f"worst {worst['sent_per_plaintext']:.1f}x (table {worst['table']:,})",
            worst["sent_per_plaintext"] <= 4,
        )
    )
    ld, st = emb["load"], emb["storage"]
    sent_ratio = ld["bytes_sent"] / st["live_bytes"]
    text = (
        f"embedded: {ld['records_per_second']:,.0f} rec/s, {_mb(ld['bytes_sent'])} sent, "
        f"live {_mb(st['live_bytes'])} ({sent_ratio:.1f}x)"
    )
    ok = ld["completed"] and ld["records_per_second"] >= 10_000 and sent_ratio <= 3
    if srv:
        sl = srv["load"]
        if sl["completed"]:
            text += f"; server: {sl['records_per_second']:,.0f} rec/s"
        else:
            text += f"; server: stopped at {sl['records']:,} records (refused)"
        ok = ok and sl["completed"] and sl["records_per_second"] >= 7_400
    rows.append(
        (
            f"bulk load {ld['records']:,} in {ld['batch']:,} transactions",
            "completes; >= 10,000 rec/s embedded, >= 7,400 rec/s via server; "
            "bytes sent <= 3x final stored size",
            text,
            ok,
        )
    )
    sc = emb["scattered"]
    # Judged with every inner node cached (a running application's steady state), the
    # state the "~17 KiB per row" describes (a leaf per row, nothing above it).
    judged = sc.get("inner_cached", sc["warm"])
    measured = (
        f"cold {_kib(sc['cold']['bytes_received_per_row'])}, "
        f"warm {_kib(sc['warm']['bytes_received_per_row'])}"
    )
    if "inner_cached" in sc:
        measured += f", inner nodes cached {_kib(judged['bytes_received_per_row'])}"
    rows.append(
        (
            f"bytes received per scattered row ({sc['cold']['rows']} rows by `Any` on salary)",
            "<= 2 KiB (inner nodes cached)",
            measured,
            judged["bytes_received_per_row"] <= 2 * KIB,
        )
    )
    ft = emb["fulltext"]
    one = max(v["ms"] for k, v in ft.items() if k.startswith("1 word"))
    two = max(v["ms"] for k, v in ft.items() if k.startswith("2 words"))
    rows.append(
        (
            "warm full-text top-10, 1 word / 2 words (slowest of 3 each)",
            "<= 1 / <= 3 ms",
            f"{one:,.1f} / {two:,.1f} ms",
            one <= 1 and two <= 3,
        )
    )
    rows.append(("cold query round trips", "no worse", *_no_worse(report)))
    return rows


def _no_worse(report: dict[str, Any]) -> tuple[str, bool | None]:
    base = report.get("baseline")
    cold = report["embedded"]["cold"]
    total = f"{sum(v['round_trips'] for v in cold.values()):g} over {len(cold)} shapes"
    if base is None:
        return f"{total} (no baseline to compare with)", None
    if report.get("is_baseline"):
        return f"{total} (the reference: this run is the baseline)", None
    reference = base["cold"]
    worse = [
        k
        for k, v in cold.items()
        if k in reference and v["round_trips"] > reference[k]["round_trips"]
    ]
    text = "worse: " + ", ".join(worse) if worse else "none worse than the baseline"
    return text, not worse


def _target_table(report: dict[str, Any]) -> list[str]:
    """The issue's table; with a baseline, what the baseline measured beside each row
    (rows are matched by their target, which names the measure)."""
    before = (report.get("baseline") or {}).get("measured")
    if before is None or report.get("is_baseline"):
        return [
            "| measure | target | measured | met |",
            "| --- | --- | --- | :---: |",
            *(f"| {m} | {t} | {v} | {_yes(ok)} |" for m, t, v, ok in targets(report)),
        ]
    return [
        "| measure | target | measured | met | baseline |",
        "| --- | --- | --- | :---: | --- |",
        *(
            f"| {m} | {t} | {v} | {_yes(ok)} | {before.get(t, '-')} |"
            for m, t, v, ok in targets(report)
        ),
        "",
        f"Baseline: {report['baseline']['label']} (`{report['baseline']['file']}`).",
    ]


def markdown(report: dict[str, Any]) -> str:
    emb, srv = report["embedded"], report.get("server")
    lines = [
        f"**{report['label']}.** Run of {report['date']} on {report['machine']['summary']}: "
        f"`{report['command']}` (total {report['total_seconds'] / 60:.0f} min; load average "
        f"{report['load_average'][0]:.1f} at the start, {report['load_average'][1]:.1f} at "
        "the end, on a machine shared with other engineers: times are noisy, bytes and "
        "round trips are not).",
        "",
        *_target_table(report),
        "",
        "**Commits of the bulk load** (MB = 10^6 bytes; MB sent: the commit itself; then "
        "the merges it set off, separate commits made right after it; ratio: the commit's "
        "bytes / plaintext bytes of its records; s: both):",
        "",
        "| table before | records | embedded: MB sent | merges: MB sent | ratio | round trips "
        "| s | server: MB sent | server: s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in emb["load"]["commits"]:
        merged = c.get("merge_bytes_sent", 0)
        lines.append(
            f"| {c['table']:,} | {c['records']:,} "
            f"| {c.get('commit_bytes_sent', c['bytes_sent']) / MB:,.1f} | {merged / MB:,.1f} "
            f"| {c['sent_per_plaintext']:.1f}x | {c['round_trips']} | {c['seconds']:.1f} "
            f"| {_server_cells(srv, c) if srv else '- | -'} |"
        )
    if srv:
        lines += ["", f"**Through the blob server**: {_server_story(srv['load'])}."]
        usage = srv["usage"]
        lines.append(
            f"* `zerodb-server stats` afterwards: {usage['blobs']:,} blobs, "
            f"{_mb(usage['bytes'])} (garbage within the 600 s retention included)."
        )
    st = emb["storage"]
    lines += [
        "",
        f"**Embedded store after the load**: live blobs {_mb(st['live_bytes'])}, garbage "
        f"awaiting collection {_mb(st['garbage_bytes'])}, file {_mb(st['file_bytes'])}; "
        f"plaintext of the records {_mb(emb['load']['plaintext_bytes'])}.",
        "",
        f"**Warm full-text top 10** (median of {report['args']['ft_runs']} runs after a "
        f"warm-up run; the words: {_words()}):",
        "",
        "| query | words | results | median ms | round trips |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for label, r in emb["fulltext"].items():
        lines.append(
            f"| {label} | `{r['query']}` | {r['rows']} | {r['ms']:,.1f} | {r['round_trips']:g} |"
        )
    base = (report.get("baseline") or {}).get("cold", {})
    lines += [
        "",
        f"**Cold query round trips** (a fresh `DB`, counted from its construction; median "
        f"/ max of {report['args']['cold_runs']} runs):",
        "",
        "| query | round trips | baseline | KiB received |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, r in emb["cold"].items():
        b = base.get(key)
        lines.append(
            f"| {r['label']} | {r['round_trips']:g} / {r['round_trips_max']} "
            f"| {b['round_trips']:g} | {r['bytes_received'] / KIB:,.1f} |"
            if b
            else f"| {r['label']} | {r['round_trips']:g} / {r['round_trips_max']} | - "
            f"| {r['bytes_received'] / KIB:,.1f} |"
        )
    return "\n".join(lines)


def _probe(probe: dict[str, Any] | None) -> str:
    if probe is None:
        return "not run"
    return "refused" if "refused" in probe else _mb(probe["bytes_sent"])


def _server_cells(srv: dict[str, Any], embedded: dict[str, Any]) -> str:
    """What the server load did with the records of one embedded commit: the same commit
    (MB, s), the halves it was split into after a refusal, or refusals alone."""
    lo, hi = embedded["table"], embedded["table"] + embedded["records"]
    done = [c for c in srv["load"]["commits"] if lo <= c["table"] < hi]
    refused = [r["records"] for r in srv["load"]["refusals"] if lo <= r["table"] < hi]
    no = f"{' and '.join(f'{n:,}' for n in refused)} refused" if refused else ""
    if not done:
        return f"{no or 'not run'} | -"
    sent = " + ".join(f"{c.get('commit_bytes_sent', c['bytes_sent']) / MB:,.1f}" for c in done)
    if len(done) > 1 or no:
        sent += f" ({len(done)} of {done[0]['records']:,}{'; ' + no if no else ''})"
    return f"{sent} | {sum(c['seconds'] for c in done):.1f}"


def _words() -> str:
    """The query words' ranks and the share of descriptions that hold each."""
    return ", ".join(
        f"{kind} = rank {rank} (in {1 - (1 - zipf_probability(rank)) ** DESCRIPTION_WORDS:.1%} "
        "of descriptions)"
        for kind, rank in WORD_RANKS.items()
    )


def _server_story(sl: dict[str, Any]) -> str:
    if not sl["refusals"]:
        return f"all {sl['records']:,} records, {sl['records_per_second']:,.0f} records/s"
    first = sl["refusals"][0]
    end = (
        "the load completed"
        if sl["completed"]
        else f"the load stopped at {sl['records']:,} records"
    )
    return (
        f"first refusal: {first['records']:,} records on a {first['table']:,}-record table, "
        f"`{first['error']}`; batches halved down to {sl['min_batch']:,}; {end}"
    )


def million_markdown(report: dict[str, Any]) -> str:
    run = report["million"]
    lines = [
        f"**{report['label']}.** Run of {report['date']} on {report['machine']['summary']}: "
        f"`{report['command']}`: {run['loaded']:,} of {run['records']:,} records loaded in "
        f"transactions of {run['batch']:,} in {run['seconds'] / 60:.0f} min (load average "
        f"{report['load_average'][0]:.1f} at the start, {report['load_average'][1]:.1f} at "
        "the end). Round trips of a `salary=` query, medians of 5: cold, a fresh `DB` "
        "counted from its construction; warm, a `DB` that has already run one.",
        "",
        "![bytes sent per commit and round trips as the table grows](img/write-cost-growth.png)",
        "",
        _merges_line(run),
        "",
        "| records | MB sent by the last commit | cold / warm `salary=` round trips "
        "| file MB | minutes so far |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in run["checkpoints"]:
        lines.append(
            f"| {m['table']:,} | {m['commit_bytes_sent'] / MB:,.1f} | {m['cold_round_trips']:g} "
            f"/ {m['warm_round_trips']:g} | {m['file_bytes'] / MB:,.0f} "
            f"| {m['elapsed_seconds'] / 60:.1f} |"
        )
    return "\n".join(lines)


def _merges_line(run: dict[str, Any]) -> str:
    """What the merges of the million-record run cost: they are separate commits, made by
    the client after the commit that completes a level, before that call returns."""
    done = [c for c in run["commits"] if "refused" not in c]
    merging = [c for c in done if c["merges"]]
    if not merging:
        return "No commit set off a merge."
    worst = max(merging, key=lambda c: c["merge_bytes_sent"])
    total = sum(c["bytes_sent"] for c in done)
    merged = sum(c["merge_bytes_sent"] for c in done)
    return (
        f"Merges: {len(merging)} of {len(done)} commits set some off, sending "
        f"{merged / MB:,.0f} MB of the {total / MB:,.0f} MB the load sent; the largest "
        f"sent {worst['merge_bytes_sent'] / MB:,.0f} MB after the commit at "
        f"{worst['table'] + worst['records']:,} records (the grey line of the chart)."
    )


def _load_average() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records of the bulk load")
    parser.add_argument("--batch", type=int, default=10_000, help="records per transaction")
    parser.add_argument(
        "--min-batch",
        type=int,
        default=5_000,
        help="a refused commit is retried in halves down to this size, then the load stops",
    )
    parser.add_argument("--probe-at", type=int, default=50_000, help="table size of the probe")
    parser.add_argument(
        "--probe", type=int, default=500, help="records committed alone at --probe-at"
    )
    parser.add_argument("--singles", type=int, default=1_000, help="single-record transactions")
    parser.add_argument("--scattered", type=int, default=100, help="rows of the scattered read")
    parser.add_argument("--ft-runs", type=int, default=7, help="runs of each full-text query")
    parser.add_argument("--cold-runs", type=int, default=3, help="runs of each cold query")
    parser.add_argument("--no-server", action="store_true", help="embedded store only")
    parser.add_argument(
        "--million",
        type=int,
        nargs="?",
        const=1_000_000,
        default=0,
        metavar="N",
        help="instead of the rest, load N records (default 1,000,000) embedded in "
        "transactions of --batch, with checkpoints every --every records and a chart",
    )
    parser.add_argument("--every", type=int, default=100_000, help="checkpoints of --million")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--label",
        default="current code",
        help="what code this run measured (it heads the published tables)",
    )
    parser.add_argument(
        "--baseline",
        default=str(BASELINE),
        help="results JSON shown beside this run's (its cold round trips are the 'no worse' "
        f"reference); 'none' for none; 'self' makes this run the baseline (also written as "
        f"{BASELINE.name} in --out)",
    )
    parser.add_argument("--out", default="bench/results", help="directory for the JSON")
    parser.add_argument(
        "--no-doc", action="store_true", help="do not refresh the tables in docs/performance.md"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load_before = _load_average()
    if args.million:
        return run_million(args, started, load_before)

    rng = random.Random(args.seed)
    rows = [realistic_employee(rng) for _ in range(args.records)]
    probe_rows = [realistic_employee(rng) for _ in range(args.probe)]
    single_rows = [realistic_employee(rng) for _ in range(args.singles)]
    settings = {
        "batch": args.batch,
        "min_batch": args.min_batch,
        "probe_at": args.probe_at,
        "probe_rows": probe_rows,
    }
    report: dict[str, Any] = {"embedded": {}}
    emb = report["embedded"]
    with tempfile.TemporaryDirectory(prefix="zerodb-bench-write-") as tmp:
        tmp_path = Path(tmp)
        path = tmp_path / "write.zdb"
        store = f"sqlite:///{path}"
        db = DB(store, password=PASSWORD, kdf="fast")
        emb["load"] = load(db, rows, desc="embedded load", **settings)
        emb["storage"] = storage_report(path)
        emb["single"], singles = single_inserts(db, single_rows)
        stored = emb["load"].pop("stored") + singles
        emb["scattered"] = scattered_rows(store, stored, args.scattered, args.seed)
        emb["fulltext"] = fulltext(store, args.ft_runs)
        emb["cold"] = cold_round_trips(store, [pk for pk, _ in stored], args.cold_runs, args.seed)
        if not args.no_server:
            with blob_server(tmp_path) as (address, key, usage, _):
                with DB(address, password=PASSWORD, kdf="fast", key_file=key) as remote:
                    server_load = load(remote, rows, desc="server load", **settings)
                server_load.pop("stored")
                report["server"] = {"load": server_load, "usage": usage()}

    report |= _about(args, argv, started, load_before)
    report["data"] = {
        "vocabulary": len(VOCABULARY),
        "word_ranks": WORD_RANKS,
        "word_probabilities": {k: zipf_probability(r) for k, r in WORD_RANKS.items()},
        "plaintext_bytes_per_record": emb["load"]["plaintext_bytes"] / emb["load"]["records"],
    }
    if args.baseline == "self":
        report["is_baseline"] = True
        report["baseline"] = {"cold": emb["cold"]}
    elif args.baseline != "none" and Path(args.baseline).is_file():
        reference = json.loads(Path(args.baseline).read_text())
        report["baseline"] = {
            "file": args.baseline,
            "label": reference["label"],
            "cold": reference["embedded"]["cold"],
            "measured": {t: v for _, t, v, _ in targets(reference)},
        }
    publish(
        report,
        markdown(report),
        name="write-cost",
        day=report["date"][:10],
        out=args.out,
        heading="Write cost on realistic text",
        update=not args.no_doc,
    )
    if report.get("is_baseline"):
        (Path(args.out) / BASELINE.name).write_text(json.dumps(report, indent=1) + "\n")
    return report


def run_million(args: argparse.Namespace, started: float, load_before: float) -> dict[str, Any]:
    """``--million``: only the long growth run, published in its own section and chart."""
    with tempfile.TemporaryDirectory(prefix="zerodb-bench-million-") as tmp:
        run = million(Path(tmp) / "million.zdb", args.million, args.batch, args.every, args.seed)
    report = {"million": run} | _about(args, None, started, load_before)
    if not args.no_doc:
        chart(report, CHART)
    publish(
        report,
        million_markdown(report),
        name="write-cost-million",
        day=report["date"][:10],
        out=args.out,
        heading="Write cost on realistic text: growth to a million records",
        update=not args.no_doc,
    )
    return report


def _about(
    args: argparse.Namespace, argv: list[str] | None, started: float, load_before: float
) -> dict[str, Any]:
    """What every report says about its run: when, what, where, how busy the machine was."""
    return {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "label": args.label,
        "command": shlex.join(["python", "-m", "bench.write_cost", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "load_average": [load_before, _load_average()],
        "args": vars(args),
        "total_seconds": time.perf_counter() - started,
    }


if __name__ == "__main__":
    main()
