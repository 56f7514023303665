"""The example project from the outside, in subprocesses (see conftest.py for why):

* its own test suite (``site_tests``), run by pytest with the example's settings;
* ``manage.py check``, ``makemigrations --check``, ``migrate`` on both databases and
  ``seed_hr`` in a temporary copy of the project, on the real (SQLite) stores;
* ``demo.py``: set-up, the generated secrets (mode 0600), a second run that reuses the
  data, and the development server answering.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.children import clean_env, free_port, run_python
from tests.example.conftest import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_project"


def run(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    result = run_python(*args, cwd=cwd, env=env, timeout=timeout)
    return result.stdout + result.stderr


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of example_project without its var/ (a fresh clone's state)."""
    copy = tmp_path / "example_project"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("var", "__pycache__"))
    return copy


def test_site_suite():
    """tests/example/site_tests with the example's settings, in a pytest of its own."""
    output = run(
        "-m", "pytest", "tests/example/site_tests", f"--ds={SETTINGS}",
        "-p", "no:cacheprovider", "-q", "-W", "error::RuntimeWarning",
        cwd=ROOT, env=clean_env(), timeout=300,
    )  # fmt: skip
    summary = re.search(r"(\d+) passed", output)
    assert summary and int(summary.group(1)) >= 50, output
    assert " failed" not in output and " error" not in output, output


def test_the_projects_own_tests(project):
    """example_project/hr/tests, as its developers run them (docs/testing.md): Django's
    runner, the test settings (the encrypted database in memory), nothing under var/."""
    env = clean_env()  # a fresh shell: no ZERODB_PASSPHRASE, which the test settings set
    out = run("manage.py", "test", "hr", "--settings=hrsite.test_settings", cwd=project, env=env)
    ran = re.search(r"Ran (\d+) tests", out)
    assert ran and int(ran.group(1)) > 0 and "\nOK" in out, out
    assert not list(project.glob("var/*"))  # no store, no generated secret


def test_check_migrate_and_seed_in_a_copy(project):
    env = clean_env()
    assert "no issues" in run("manage.py", "check", cwd=project, env=env)
    run("manage.py", "makemigrations", "--check", "--dry-run", cwd=project, env=env)
    run("manage.py", "migrate", cwd=project, env=env)
    out = run("manage.py", "migrate", "--database", "encrypted", cwd=project, env=env)
    assert "Applying hr.0001_initial... OK" in out
    out = run("manage.py", "showmigrations", "hr", "--database", "encrypted", cwd=project, env=env)
    assert "[X] 0001_initial" in out

    var = project / "var"
    assert (var / "hr.zdb").exists() and (var / "default.sqlite3").exists()
    for secret in ("passphrase", "secret-key"):
        assert stat.S_IMODE((var / secret).stat().st_mode) == 0o600, secret
    assert stat.S_IMODE(var.stat().st_mode) == 0o700

    out = run("manage.py", "seed_hr", "--employees", "60", "--seed", "5", cwd=project, env=env)
    assert "Seeded 60 employees in 12 departments" in out
    assert "seeding" not in out  # stderr is a pipe: no progress bar
    out = run("manage.py", "seed_hr", "--if-empty", cwd=project, env=env)
    assert "60 employees already there: not seeding." in out
    # The store holds no plaintext: not a name, an email, a title or a word of a bio.
    count = run(
        "manage.py", "shell", "-c",
        "from hr.models import Employee; e = Employee.objects.order_by('pk').last(); "
        "print(Employee.objects.count(), e.email, e.last_name, sep='|')",
        cwd=project, env=env,
    ).strip().splitlines()[-1]  # fmt: skip
    total, email, last_name = count.split("|")
    assert total == "60"
    raw = b"".join(p.read_bytes() for p in var.glob("hr.zdb*") if p.is_file())
    assert email.encode() not in raw
    assert last_name.encode() not in raw
    assert b"Engineering" not in raw


INCREMENTER = """
from django_zerodb.transaction import retry_on_conflict
from hr.models import Employee

@retry_on_conflict(using="encrypted", retries=500)
def increment(pk):
    row = Employee.objects.get(pk=pk)
    row.salary += 1
    row.save()

for _ in range({saves}):
    increment({pk})
print("done")
"""


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_processes_doing_get_and_save_on_one_row_lose_nothing(project, isolation):
    """Six processes each get() + save() one row ten times, with the retry helper: every
    increment is counted (tests/core/test_isolation.py and
    tests/django/test_transactions.py show the lost update at "read committed")."""
    env = clean_env(ZERODB_ISOLATION_LEVEL=isolation)
    run("manage.py", "migrate", "--database", "encrypted", cwd=project, env=env)
    run("manage.py", "seed_hr", "--employees", "3", "--seed", "1", cwd=project, env=env)
    read = "from hr.models import Employee; e = Employee.objects.order_by('pk')[0]; "
    shown = run(
        "manage.py", "shell", "-c", read + "print('ROW', e.pk, e.salary)", cwd=project, env=env
    )
    pk, salary = map(int, re.search(r"ROW (\d+) (\d+)", shown).groups())
    writers, saves = 6, 10
    script = INCREMENTER.format(saves=saves, pk=pk)
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", script],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(writers)
    ]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    final = run(
        "manage.py", "shell", "-c", read + "print('ROW', e.pk, e.salary)", cwd=project, env=env
    )
    assert re.search(r"ROW (\d+) (\d+)", final).groups() == (str(pk), str(salary + writers * saves))


def test_check_with_a_blob_server_url_needs_no_local_store(project):
    env = clean_env(ZERODB_URL="zerodb://127.0.0.1:9", ZERODB_PASSPHRASE="x", DJANGO_SECRET_KEY="y")
    out = run(
        "manage.py", "shell", "-c",
        "from django.conf import settings; o = settings.DATABASES['encrypted']['OPTIONS']; "
        "print(o['STORE'], o.get('KEY_FILE'))",
        cwd=project, env={**env, "ZERODB_KEY_FILE": "/keys/hr.zdbkey"},
    )  # fmt: skip
    assert "zerodb://127.0.0.1:9 /keys/hr.zdbkey" in out
    assert not (project / "var" / "passphrase").exists()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_demo_sets_up_once_and_serves(project):
    env = clean_env()
    first = run("demo.py", "--no-server", "--employees", "45", cwd=project, env=env)
    assert "Seeded 45 employees" in first
    password = (project / "var" / "admin-password").read_text().strip()
    assert f"password {password}" in first
    assert stat.S_IMODE((project / "var" / "admin-password").stat().st_mode) == 0o600
    assert "unlocking the encrypted database" in first
    assert "no server started" in first and "http://" not in first  # no URL of no server

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "demo.py", "--addr", f"127.0.0.1:{port}", "--employees", "45"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                status, html = get(f"{base}/employees/")
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "the demo server did not start"
                time.sleep(0.2)
        assert status == 200
        assert "45 employees" in html
        status, html = get(f"{base}/employees/?salary_min=abc&page=999&ordering=evil")
        assert status == 200 and "Enter a whole number." in html
        assert get(f"{base}/admin/login/")[0] == 200
        assert get(f"{base}/api/employees/")[0] == 401  # the API wants credentials
        assert get(f"{base}/api/schema/")[0] == 200
        assert get(f"{base}/static/hr/style.css")[0] == 200
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    # The second run reused the data and the superuser, and printed no password.
    assert "45 employees already there: not seeding." in output
    assert "a superuser exists already" in output
    assert password not in output
    for url in ("/employees/", "/admin/", "/api/", "/api/docs/"):
        assert re.search(rf"http://127\.0\.0\.1:{port}{url}[\s)]", output), url
