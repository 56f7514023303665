"""End-to-end fixtures: the example site in a subprocess, and headless Chromium.

* ``site``: ``example_project/demo.py`` sets up a temporary ``HRSITE_VAR_DIR`` (both
  databases migrated, ``SEED_EMPLOYEES`` employees seeded, the superuser ``admin`` with a
  known password), then serves it with ``runserver`` on a free loopback port. The data
  the tests expect is read from the same store by ``manage.py shell`` first.
* ``browser``: Debian's Chromium (``/usr/bin/chromium``, or ``$ZERODB_E2E_CHROMIUM``)
  driven by Playwright. Playwright's own browser downloads are never used. Without
  Chromium or Playwright the tests fail, saying what to install: they are part of
  ``make test`` and are never skipped silently.

Screenshots of every step go to ``tests/e2e/artifacts/`` (ignored by git).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.children import clean_env, free_port, run_python

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_project"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = os.environ.get("ZERODB_E2E_CHROMIUM", "/usr/bin/chromium")
# What the probe of this machine kind found Chromium needs on a closed network, as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SEED_EMPLOYEES = 300
ADMIN_PASSWORD = "e2e-admin-password-7731"


def run(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    return run_python(*args, cwd=cwd, env=env, timeout=timeout).stdout


FACTS = """
import json
from hr.models import Department, Employee
from django.db.models import Count
departments = {d.name: d.n for d in Department.objects.annotate(n=Count("employees"))}
print(json.dumps({
    "employees": Employee.objects.count(),
    "departments": departments,
    "kubernetes": Employee.objects.search("kubernetes").count(),
    "engineering_kubernetes": Employee.objects.search("kubernetes")
        .filter(department__name="Engineering").count(),
}))
"""


@dataclasses.dataclass
class Site:
    url: str
    var_dir: Path
    facts: dict
    server: subprocess.Popen


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    var_dir = tmp_path_factory.mktemp("hrsite-var")
    env = clean_env(HRSITE_VAR_DIR=str(var_dir), ZERODB_DEMO_ADMIN_PASSWORD=ADMIN_PASSWORD)
    run("demo.py", "--no-server", "--employees", str(SEED_EMPLOYEES), cwd=EXAMPLE, env=env)
    output = run("manage.py", "shell", "-c", FACTS, cwd=EXAMPLE, env=env)
    facts = json.loads(output.strip().splitlines()[-1])
    assert facts["employees"] == SEED_EMPLOYEES
    port = free_port()
    log = open(var_dir / "server.log", "w+")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "demo.py", "--addr", f"127.0.0.1:{port}", "--employees", "0"],
        cwd=EXAMPLE,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/admin/login/", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise AssertionError(f"the example site did not start:\n{log.read()}") from None
                time.sleep(0.2)
        yield Site(url, var_dir, facts, server)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _chromium_missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return (
            f"Chromium is not installed at {CHROMIUM}: the end-to-end tests drive Debian's "
            "Chromium (`apt-get install -y chromium`; .ci/run installs it when missing), or "
            "set ZERODB_E2E_CHROMIUM to another Chromium binary"
        )
    return None


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the end-to-end tests need the Python package playwright: "
            "pip install -e '.[dev]' (its browsers are not needed: Debian's Chromium is used)",
            pytrace=False,
        )
    missing = _chromium_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=30_000
            )
        except Exception as exc:
            pytest.fail(f"Chromium ({CHROMIUM}) could not be started: {exc}", pytrace=False)
        yield browser
        browser.close()


class Steps:
    """Screenshots of a test's steps: ``artifacts/<test>/<nn>-<name>.png``."""

    def __init__(self, page, name: str) -> None:
        self.page = page
        self.dir = ARTIFACTS / name
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.count = 0

    def shot(self, name: str) -> Path:
        self.count += 1
        path = self.dir / f"{self.count:02d}-{name}.png"
        self.page.screenshot(path=path, full_page=True)
        return path


@pytest.fixture
def page(browser, site, request):
    context = browser.new_context(base_url=site.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.steps = Steps(page, request.node.name)
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the pages: {errors}"
