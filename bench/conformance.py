"""Django's own test suite as an outside judge of the backend: run the installed Django's
``tests/runtests.py`` app by app against ``django_zerodb``, and against SQLite in memory
as the baseline, and report how many of the tests that pass on SQLite pass on ours.

Run ``python -m bench.conformance --backend sqlite|zerodb`` (``make conformance``). Our
own tests check what we meant to build; Django's suite checks what Django users will
assume, written by people who never saw this backend, so it cannot be tuned to agree.

What a run does:

1. reads the version of the Django this interpreter imports, downloads that version's
   source distribution once (``pip download --no-binary :all:``; the tests are not in
   the wheel) into ``var/conformance/`` (ignored by git), extracts it once, and reuses it;
2. checks that the backend loads (settings imported, a connection object built for each
   alias, as ``runtests.py`` does first); if it does not, every app is recorded as not
   run, with the error, instead of 40 copies of the same traceback;
3. runs ``runtests.py --settings tests.conformance.settings_<backend> --noinput
   --parallel N -v 2 <app>`` once per app, each in its own process (a crash or a hang
   costs one app, not the run) with a timeout, our repo root on ``PYTHONPATH``. The
   settings' test runner (``tests/conformance/runner.py``) writes every test's outcome to
   a JSON-lines file as it finishes, so nothing depends on parsing the verbose output,
   which goes to ``var/conformance/logs/<backend>/<app>.log`` for reading failures;
4. merges the outcomes into ``bench/results/conformance-<backend>.json`` (committed:
   per app its status, counts and every test's outcome, with the first line of each
   failure), after every app, so an interrupted run keeps what it measured;
5. rewrites the table in ``docs/conformance.md`` from both JSON files.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.publish import machine, update_doc

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "conformance.md"
CACHE = REPO / "var" / "conformance"
RESULTS = REPO / "bench" / "results"
SETTINGS = {
    "sqlite": "tests.conformance.settings_sqlite",
    "zerodb": "tests.conformance.settings_zerodb",
}
# Targets per suite: the share of the tests SQLite passes that pass here.
AIMS = {"A": 0.97, "B": 0.95}
NA = "-"  # a table cell with nothing measured
OUTCOMES_ENV = "CONFORMANCE_OUTCOMES"  # read by tests/conformance/runner.py

# Suite A: what a Django project's models, forms and admin rely on first.
SUITE_A = [
    "basic",
    "lookup",
    "ordering",
    "model_forms",
    "admin_changelist",
    "pagination",
    "get_or_create",
    "delete",
    "update",
    "or_lookups",
    "null_queries",
    "xor_lookups",
    "get_object_or_404",
    "get_earliest_or_latest",
    "save_delete_hooks",
    "update_only_fields",
    "force_insert_update",
    "custom_managers",
    "custom_pk",
    "model_formsets",
    "model_formsets_regress",
    "admin_ordering",
    "admin_utils",
    "admin_views",
    "admin_widgets",
    "modeladmin",
    "admin_checks",
    "empty",
    "max_lengths",
    "reserved_names",
    "string_lookup",
    "transactions",
    "transaction_hooks",
    "defer",
    "bulk_create",
    "validation",
    "model_fields",
    "from_db_value",
    "known_related_objects",
    "signals",
    "many_to_one",
    "one_to_one",
    "fixtures",
    "dates",
    "datetimes",
]
# Suite B: expressions, aggregation, subqueries, relations and time zones, where an
# evaluator that answers wrongly would show (model_fields is in both suites).
SUITE_B = [
    "aggregation",
    "annotations",
    "db_functions",
    "expressions",
    "expressions_case",
    "queries",
    "generic_relations",
    "prefetch_related",
    "timezones",
    "model_fields",
    "auth_tests",
]
SUITES = {"A": SUITE_A, "B": SUITE_B}
APPS = list(dict.fromkeys(SUITE_A + SUITE_B))

# A test recorded twice (a pass, then an error in Django's post-test teardown; several
# failing subtests) keeps its worst outcome.
SEVERITY = {
    "skipped": 0,
    "expected_failure": 1,
    "passed": 2,
    "unexpected_success": 3,
    "failed": 4,
    "error": 5,
}
COUNT_KEYS = {
    "passed": "passed",
    "failed": "failed",
    "error": "errors",
    "skipped": "skipped",
    "expected_failure": "expected_failures",
    "unexpected_success": "unexpected_successes",
}


# -- the Django source distribution --------------------------------------------------------


def installed_django() -> str:
    """The version of the Django this interpreter (the project's venv) imports: the tests
    must be that version's, or failures would be Django's own drift, not ours."""
    import django

    return django.get_version()


def django_tests_dir(version: str, cache: Path = CACHE) -> Path:
    """``tests/`` of Django ``version``'s sdist, downloaded and extracted at most once."""
    root = cache / f"django-{version}"
    marker = root / ".extracted"
    if marker.exists():
        return root / "tests"
    cache.mkdir(parents=True, exist_ok=True)
    tarball = next(iter(sorted(cache.glob(f"[Dd]jango-{version}.tar.gz"))), None)
    if tarball is None:
        tarball = download_sdist(version, cache)
    print(f"extracting {tarball.name}", flush=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".extract-") as tmp:
        with tarfile.open(tarball) as archive:
            archive.extractall(tmp, filter="data")
        (top,) = Path(tmp).iterdir()
        if not (top / "tests" / "runtests.py").exists():
            raise SystemExit(f"{tarball} has no tests/runtests.py")
        if root.exists():
            shutil.rmtree(root)  # a half-extracted earlier attempt
        top.rename(root)
    marker.write_text(f"{tarball.name}\n")
    return root / "tests"


def download_sdist(version: str, cache: Path) -> Path:
    """``pip download`` the sdist (pip, because it is the registry client this machine
    is set up for: certificates, indexes, timeouts)."""
    print(f"downloading the source distribution of Django {version}", flush=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--no-binary", ":all:", f"django=={version}", "--dest", tmp),
            ],
            check=True,
        )
        found = sorted(Path(tmp).glob(f"[Dd]jango-{version}.tar.gz"))
        if not found:
            raise SystemExit(f"pip download gave no Django {version} sdist: {os.listdir(tmp)}")
        target = cache / found[0].name
        found[0].rename(target)
    return target


# -- running --------------------------------------------------------------------------------


def child_env(outcomes: Path | None = None) -> dict[str, str]:
    """Our repo root on ``PYTHONPATH`` (runtests.py puts only Django's tests dir on
    ``sys.path``), so ``tests.conformance.*`` and the backend import."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop(OUTCOMES_ENV, None)
    if outcomes is not None:
        env[OUTCOMES_ENV] = str(outcomes)
    return env


PREFLIGHT = """
import sys, traceback
try:
    import django
    django.setup()
    from django.db import connections
    for alias in connections:
        connection = connections[alias]
        connection.features, connection.ops, connection.creation
except BaseException as exc:
    traceback.print_exc()
    root = exc
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    lines = str(root).strip().splitlines()
    where = [f for f in traceback.extract_tb(root.__traceback__) if not f.filename.startswith("<")]
    place = f" ({where[-1].filename}:{where[-1].lineno})" if where else ""
    print("PREFLIGHT:" + type(root).__name__ + (": " + lines[0] if lines else "") + place)
    sys.exit(1)
"""


def preflight(backend: str) -> str | None:
    """None if the backend loads as ``runtests.py`` first loads it, else the innermost
    error's first line (the ``ImproperlyConfigured`` Django wraps it in says only "check
    the above exception")."""
    env = child_env()
    env["DJANGO_SETTINGS_MODULE"] = SETTINGS[backend]
    proc = subprocess.run(
        [sys.executable, "-c", PREFLIGHT],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode == 0:
        return None
    for line in proc.stdout.splitlines():
        if line.startswith("PREFLIGHT:"):
            return line[len("PREFLIGHT:") :].replace(str(REPO) + os.sep, "")
    return error_line(proc.stderr + proc.stdout) or f"exit status {proc.returncode}"


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Configured|Interrupt)\b.*")


def error_line(text: str) -> str:
    """The last ``SomeError: message`` line of a log: what a crashed run died of. A
    message that goes on below (``SystemCheckError: ...issues:``) gets its first two
    details (``app.Model: (fields.E180) ...``), since they are what the reader needs."""
    lines = text.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        if not EXCEPTION_LINE.match(lines[index]):
            continue
        name, _, message = lines[index].strip().partition(":")
        short = name.rsplit(".", 1)[-1]
        message = message.strip().removeprefix(f"{short}:").strip()
        if message.endswith(":"):
            details = [
                line.strip()
                for line in lines[index + 1 :]
                if line.strip() and line.strip() not in ("ERRORS:", "WARNINGS:")
            ]
            message = " ".join([message, *details[:2]])
        return f"{short}: {message}"[:300]
    tail = [line.strip() for line in lines if line.strip()]
    return tail[-1][:300] if tail else ""


def read_outcomes(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Per test id: the worst outcome recorded, and its message."""
    tests: dict[str, str] = {}
    messages: dict[str, str] = {}
    if not path.exists():
        return tests, messages
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short by a killed process
        test, outcome = entry["test"], entry["outcome"]
        if test in tests and SEVERITY[tests[test]] >= SEVERITY[outcome]:
            continue
        tests[test] = outcome
        if entry.get("message"):
            messages[test] = entry["message"]
        else:
            messages.pop(test, None)
    return tests, messages


def counts(tests: dict[str, str]) -> dict[str, int]:
    """``run`` is every test with an outcome, skipped ones included (unittest's "Ran N"
    leaves out the tests of classes skipped whole, so it can be lower)."""
    tally = collections.Counter(tests.values())
    out = {"run": len(tests)}
    out.update({key: tally.get(outcome, 0) for outcome, key in COUNT_KEYS.items()})
    return out


def run_app(
    app: str, backend: str, tests_dir: Path, *, parallel: int, timeout: float, logs: Path
) -> dict[str, Any]:
    """One ``runtests.py <app>`` process; the process group is killed on timeout (the
    parallel runner's workers included)."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{app}.log"
    command = [
        sys.executable,
        "runtests.py",
        "--settings",
        SETTINGS[backend],
        "--noinput",
        "--parallel",
        str(parallel),
        "-v",
        "2",
        app,
    ]
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        outcomes = Path(tmp) / "outcomes.jsonl"
        started = time.perf_counter()
        with log.open("w") as out:
            proc = subprocess.Popen(
                command,
                cwd=tests_dir,
                env=child_env(outcomes),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.perf_counter() - started
        tests, messages = read_outcomes(outcomes)
    text = log.read_text(errors="replace")
    finished = re.search(r"^Ran \d+ tests? in ", text, re.MULTILINE) is not None
    if timed_out:
        status, error = "timeout", f"timed out after {timeout:.0f} s"
    elif finished:
        status, error = "completed", None
    else:
        status, error = "crashed", error_line(text) or f"exit status {proc.returncode}"
    return {
        "status": status,
        "error": error,
        "returncode": None if timed_out else proc.returncode,
        "seconds": round(seconds, 1),
        "date": now_iso(),
        "counts": counts(tests),
        "tests": dict(sorted(tests.items())),
        "messages": dict(sorted(messages.items())),
    }


def not_run(reason: str) -> dict[str, Any]:
    return {
        "status": "not run",
        "error": reason,
        "returncode": None,
        "seconds": 0.0,
        "date": now_iso(),
        "counts": counts({}),
        "tests": {},
        "messages": {},
    }


def progress_line(index: int, total: int, app: str, result: dict[str, Any]) -> str:
    c = result["counts"]
    line = (
        f"[{index:>2}/{total}] {app:<24} run {c['run']:>5}  passed {c['passed']:>5}  "
        f"failed {c['failed']:>4}  errors {c['errors']:>4}  skipped {c['skipped']:>4}  "
        f"xfail {c['expected_failures']:>3}  {result['seconds']:>7.1f} s"
    )
    if result["status"] != "completed":
        line += f"  {result['status'].upper()}: {result['error']}"
    return line


# -- results --------------------------------------------------------------------------------


def now_iso() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def code_version() -> dict[str, Any]:
    """The commit measured, and whether the backend (or the store under it) differed from
    it: results of uncommitted work must say so."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", "django_zerodb", "zerodb_core", "blob_server")
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "dirty": bool(changed)}


def optional_packages(tests_dir: Path) -> dict[str, str | None]:
    """Installed version (or None) of each package in Django's
    ``tests/requirements/py3.txt`` that applies here: without Pillow, PyYAML, jinja2, ...
    their tests are skipped on both backends, so the baseline depends on the venv."""
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    found: dict[str, str | None] = {}
    requirements = tests_dir / "requirements" / "py3.txt"
    if not requirements.exists():
        return found
    for line in requirements.read_text().splitlines():
        try:
            requirement = Requirement(line.split("#", 1)[0].strip())
        except InvalidRequirement:
            continue  # blank lines and comments
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            found[requirement.name] = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            found[requirement.name] = None
    return found


def results_path(backend: str, out: Path = RESULTS) -> Path:
    return out / f"conformance-{backend}.json"


def load_results(backend: str, out: Path = RESULTS) -> dict[str, Any] | None:
    path = results_path(backend, out)
    return json.loads(path.read_text()) if path.exists() else None


def save_results(report: dict[str, Any], out: Path = RESULTS) -> Path:
    """Atomically (``*.tmp`` then rename): a killed run never leaves half a file."""
    out.mkdir(parents=True, exist_ok=True)
    path = results_path(report["backend"], out)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


# -- the doc --------------------------------------------------------------------------------

INTRO = """# Conformance: Django's own test suite

Our tests check what we meant to build. Django's own test suite checks what Django users
will assume, and was written by people who never saw this backend, so it cannot be bent
to agree with it. `make conformance` runs the part of it that a project's models, forms
and admin depend on against `django_zerodb`, and against SQLite in memory as the
baseline, and counts **how many of the tests that pass on SQLite pass on our backend**.
The aim is 80 %.

## How to run

* `make conformance`: the SQLite baseline first if `bench/results/conformance-sqlite.json`
  is missing (or with `CONFORMANCE_BASELINE=1`), then `django_zerodb`; then it rewrites the
  table below. `CONFORMANCE_APPS="basic lookup"` runs a subset (results are merged per
  app into the JSON files).
* `python -m bench.conformance --backend sqlite|zerodb [--apps basic,lookup]
  [--parallel 1] [--timeout 1200] [--no-doc]` (see `--help`).

It downloads the source distribution of the Django installed in `.venv` (the tests are
not in the wheel) into `var/conformance/` once, and runs that version's
`tests/runtests.py` once per app, each app in its own process with a 20-minute timeout,
with the settings in `tests/conformance/` (`settings_sqlite.py` is Django's
`test_sqlite.py`; `settings_zerodb.py` puts `default` and `other` in a `memory://` store
with the fast test KDF). A recording test runner writes each test's outcome;
`bench/results/conformance-<backend>.json` keeps them all, with the first line of each
failure, and `var/conformance/logs/<backend>/<app>.log` the verbose output of the last
run. Each backend takes about a minute on 2 cores (`admin_views` is half of it; the
times of the last runs are below), plus a one-time download of 11 MB.

How to read the table: *run* counts every test the runner reported (skipped ones
included); *pass on SQLite* is the baseline; *of those, pass here* counts the tests that
pass on both, and *share* is that over the baseline. A test that does not run here (its
class failed in `setUpClass`, the app crashed or timed out) counts as not passing. Tests
that Django skips for a backend's declared features (`skipUnlessDBFeature`) or that the
backend lists in `DatabaseFeatures.django_test_skips` are skipped, not passed: they lower
the share, as they should.

## What the backend declares

* `DatabaseFeatures.django_test_skips` (`{reason: {test ids}}`) and
  `django_test_expected_failures` (`{test ids}`) take the ids as they appear in
  `bench/results/conformance-zerodb.json` (`app.module.Class.test_method`, or
  `app.module.Class` to skip a whole class). Django applies them only under `runtests.py` and
  only from `BaseDatabaseCreation.create_test_db()`, so `DatabaseCreation` overrides
  `_create_test_db()` and leaves `create_test_db()` alone. A listed test still counts as
  not passing: the lists say why, they do not raise the share.
* The test runner names the databases `test_default` and `test_other`; they must be two
  separate databases (the multi-database tests write to both), created empty and
  migrated for each app's process.
* `--parallel N` above 1 needs `DatabaseCreation._clone_test_db()` to give each worker
  process a copy of the migrated test database.
"""


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else NA


def passing(result: dict[str, Any] | None) -> set[str]:
    if not result:
        return set()
    return {test for test, outcome in result["tests"].items() if outcome == "passed"}


def suite_table(
    apps: list[str], sqlite: dict[str, Any] | None, zerodb: dict[str, Any] | None, aim: float | None
) -> list[str]:
    """One suite's per-app table, its totals and its share against ``aim``."""
    lines = [
        "| app | run | passed | failed | errors | skipped | pass on SQLite "
        "| of those, pass here | share | note |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    keys = ("run", "passed", "failed", "errors", "skipped")
    total: collections.Counter[str] = collections.Counter()
    base_total = both_total = unmeasured = 0
    for app in apps:
        base = (sqlite or {}).get("apps", {}).get(app)
        here = (zerodb or {}).get("apps", {}).get(app)
        base_pass = passing(base)
        both = base_pass & passing(here)
        cells = [NA] * len(keys)
        both_cell = share = NA
        if here is None:
            note = "not measured yet"
            unmeasured += 1
        else:
            # Attempted here: it counts, whatever happened (not run counts as 0 passing).
            if base:
                base_total += len(base_pass)
                both_total += len(both)
                both_cell, share = str(len(both)), pct(len(both), len(base_pass))
            c = here["counts"]
            if here["status"] != "not run":
                total.update(c)
                cells = [str(c[k]) for k in keys]
            if here["status"] != "completed":
                note = f"{here['status']}: {here['error']}"
                if here["status"] == "not run":
                    note = here["error"]
            else:
                note = ", ".join(
                    f"{c[k]} {k.replace('_', ' ')}"
                    for k in ("expected_failures", "unexpected_successes")
                    if c.get(k)
                )
        base_cell = str(len(base_pass)) if base else NA
        note = note.replace("|", "\\|")
        lines.append(f"| {app} | " + " | ".join([*cells, base_cell, both_cell, share, note]) + " |")
    if zerodb is None:
        runs = (sqlite or {}).get("apps", {})
        base_total = sum(len(passing(runs[a])) for a in apps if a in runs)
    cells = [str(total[k]) if total else NA for k in keys]
    share = pct(both_total, base_total) if zerodb else NA
    both_cell = str(both_total) if zerodb else NA
    lines.append(
        f"| **total** | {' | '.join(cells)} | {base_total} | {both_cell} | **{share}** | |"
    )
    lines.append("")
    if aim is None:
        return lines
    aim_text = f"{aim * 100:.0f} %"
    if zerodb is None or not base_total:
        lines.append(f"**Share**: not measured yet (aim {aim_text}).")
    else:
        needed = max(0, math.ceil(aim * base_total) - both_total)
        lines.append(
            f"**Share**: {both_total:,} of the {base_total:,} tests that pass on SQLite pass "
            f"on `django_zerodb`"
            + (f" (in the apps measured; {unmeasured} not measured yet)" if unmeasured else "")
            + f": **{share}**, aim {aim_text}: "
            + ("met." if not needed else f"not met ({needed:,} more tests must pass).")
        )
    return lines


def markdown(sqlite: dict[str, Any] | None, zerodb: dict[str, Any] | None) -> str:
    """Per-app table for the backend, next to the SQLite baseline, totals and the share."""
    apps = list(APPS)
    for report in (sqlite, zerodb):
        for app in (report or {}).get("apps", {}):
            if app not in apps:
                apps.append(app)
    lines: list[str] = []
    for name, report in (("SQLite baseline", sqlite), ("django_zerodb", zerodb)):
        if report is None:
            lines.append(f"* **{name}**: not measured yet.")
            continue
        dates = sorted(a["date"][:16].replace("T", " ") for a in report["apps"].values())
        seconds = sum(a["seconds"] for a in report["apps"].values())
        when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        code = report.get("code") or {}
        if code.get("commit"):
            when += f" at commit {code['commit']}"
            when += " with uncommitted changes" if code.get("dirty") else ""
        lines.append(
            f"* **{name}**: Django {report['django']}, {len(report['apps'])} apps, run {when} "
            f"on {report['machine']['summary']}, `--parallel {report['parallel']}`: "
            f"{duration(seconds)} of test processes."
        )
    packages = (sqlite or zerodb or {}).get("optional_packages")
    if packages:
        have = ", ".join(f"{n} {v}" for n, v in packages.items() if v) or "none"
        missing = ", ".join(n for n, v in packages.items() if not v) or "none"
        lines.append(
            f"* Optional packages of Django's test suite installed: {have}; missing (their "
            f"tests are skipped on both backends): {missing}."
        )
    if zerodb and zerodb.get("load_error"):
        lines.append(f"* **The backend failed to load**: `{zerodb['load_error']}`.")
    for suite, members in SUITES.items():
        lines += ["", f"### Suite {suite}", ""]
        lines += suite_table(members, sqlite, zerodb, AIMS[suite])
    extra = [a for a in apps if a not in APPS]
    if extra:
        lines += ["", "### Other apps", ""]
        lines += suite_table(extra, sqlite, zerodb, None)
    causes = collections.Counter(
        message
        for result in (zerodb or {}).get("apps", {}).values()
        for test, message in result["messages"].items()
        if result["tests"].get(test) in ("failed", "error")
    )
    if causes:
        lines += ["", "Most frequent failures here (first line of the error, tests):", ""]
        for message, n in causes.most_common(10):
            lines.append(f"* {n}: `{message.replace('`', "'")[:160]}`")
    return "\n".join(lines)


def write_doc(sqlite: dict[str, Any] | None, zerodb: dict[str, Any] | None) -> None:
    """The intro is written once (then it is the doc's, edit it freely); the table
    between the ``bench:conformance`` markers is rewritten on every run."""
    if not DOC.exists():
        DOC.write_text(INTRO)
    update_doc(markdown(sqlite, zerodb), name="conformance", heading="Results", doc=DOC)


# -- main -----------------------------------------------------------------------------------


def parse_apps(text: str | None) -> list[str]:
    if not text:
        return list(APPS)
    return [app for app in re.split(r"[,\s]+", text) if app]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend",
        choices=sorted(SETTINGS),
        default="zerodb",
        help="sqlite: the baseline; zerodb: django_zerodb (default)",
    )
    parser.add_argument(
        "--apps", help="Django test apps to run, comma- or space-separated (default: the list)"
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runtests.py --parallel (the backend must clone test databases for N > 1)",
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per app")
    parser.add_argument("--cache", type=Path, default=CACHE, help="sdist and logs")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON")
    parser.add_argument(
        "--no-doc", action="store_true", help="do not rewrite the table in docs/conformance.md"
    )
    parser.add_argument(
        "--doc-only",
        action="store_true",
        help="run nothing: rewrite docs/conformance.md from the JSON files in --out",
    )
    args = parser.parse_args(argv)
    if args.doc_only:
        write_doc(load_results("sqlite", args.out), load_results("zerodb", args.out))
        print(f"updated {DOC.relative_to(REPO)}")
        return 0
    apps = parse_apps(args.apps)
    started = time.perf_counter()

    version = installed_django()
    tests_dir = django_tests_dir(version, args.cache)
    unknown = [app for app in apps if not (tests_dir / app).is_dir()]
    if unknown:
        parser.error(f"not test apps of Django {version}: {', '.join(unknown)}")

    report = load_results(args.backend, args.out)
    if report is None or report.get("django") != version:
        report = {"backend": args.backend, "django": version, "apps": {}}
    report.update(
        {
            "settings": SETTINGS[args.backend],
            "command": "python -m bench.conformance " + " ".join(argv or sys.argv[1:]),
            "machine": machine(),
            "code": code_version(),
            "optional_packages": optional_packages(tests_dir),
            "parallel": args.parallel,
            "timeout": args.timeout,
            "date": now_iso(),
        }
    )
    print(f"Django {version} tests from {tests_dir}, backend {args.backend}", flush=True)
    load_error = preflight(args.backend)
    report["load_error"] = load_error
    if load_error:
        print(f"backend failed to load: {load_error}", flush=True)
    logs = args.cache / "logs" / args.backend
    for index, app in enumerate(apps, 1):
        if load_error:
            result = not_run(f"backend failed to load: {load_error}")
        else:
            result = run_app(
                app,
                args.backend,
                tests_dir,
                parallel=args.parallel,
                timeout=args.timeout,
                logs=logs,
            )
        report["apps"][app] = result
        save_results(report, args.out)
        print(progress_line(index, len(apps), app, result), flush=True)

    measured = [report["apps"][app] for app in apps]
    total = collections.Counter()
    for result in measured:
        total.update(result["counts"])
    print(
        f"\n{args.backend}: {len(apps)} apps in {time.perf_counter() - started:.0f} s: "
        f"run {total['run']}, passed {total['passed']}, failed {total['failed']}, "
        f"errors {total['errors']}, skipped {total['skipped']}, "
        f"expected failures {total['expected_failures']}"
    )
    print(f"wrote {results_path(args.backend, args.out)}")
    if not args.no_doc:
        write_doc(load_results("sqlite", args.out), load_results("zerodb", args.out))
        print(f"updated {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
