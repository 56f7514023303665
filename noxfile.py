"""``make matrix``: the test suite over the supported Django and Python versions.

CI (``make test``) runs one combination; this runs each supported Django on Python 3.12
and 3.13, each in a virtualenv of its own under ``.nox/``: Django 5.2 LTS, 6.0 and 6.1
(``TESTED_DJANGO`` in ``django_zerodb/__init__.py``; what differs between them is in
``django_zerodb/compat.py``, the tests of features a version lacks are skipped there).
By default the tests that depend on Django (the backend, its REST package, the example
site); ``make matrix MATRIX_ARGS="tests/django/test_queries.py"`` runs others.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

DJANGO = {
    "5.2": "Django>=5.2,<5.3",
    "6.0": "Django>=6.0,<6.1",
    "6.1": "Django>=6.1,<6.2",
}
PYTHONS = ["3.12", "3.13"]
DEFAULT_TESTS = ["tests/django", "tests/example"]

nox.options.error_on_missing_interpreters = True
nox.options.reuse_existing_virtualenvs = True


def runs(command: str) -> bool:
    """Whether ``command`` on PATH is a working interpreter (a pyenv shim may not be)."""
    path = shutil.which(command)
    if path is None:
        return False
    return subprocess.run([path, "-c", ""], check=False, capture_output=True).returncode == 0


def find_pythons(versions: list[str]) -> None:
    """Put pyenv's ``python<version>`` on PATH where PATH has none that runs, so that nox
    finds every version by name."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for version in versions:
        found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
        if found and not runs(f"python{version}"):
            os.environ["PATH"] = os.path.dirname(found[-1]) + os.pathsep + os.environ["PATH"]


find_pythons(PYTHONS)


@nox.session(python=PYTHONS)
@nox.parametrize("django", list(DJANGO))
def tests(session: nox.Session, django: str) -> None:
    session.install("-e", ".[dev,example]", DJANGO[django])
    session.run("python", "-c", "import django; print('Django', django.get_version())")
    session.run(
        "python",
        "-m",
        "pytest",
        "-m",
        "not slow",
        "-q",
        "-p",
        "no:randomly",
        *(session.posargs or DEFAULT_TESTS),
    )
