"""The blob server installed without the ``[redis]`` extra (``memory://`` and
``sqlite://`` stores need no redis-py): ``zerodb-server`` still starts and explains itself.

A child process whose ``import redis`` (and hiredis, uvloop) fails, as in a virtualenv
with ``django-zerodb`` or ``django-zerodb[rest]`` only.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.children import clean_env
from tests.e2e.conftest import ROOT

WITHOUT_EXTRAS = (
    "import sys\n"
    "for name in ('redis', 'hiredis', 'uvloop'):\n"
    "    sys.modules[name] = None  # import fails: ModuleNotFoundError\n"
    "from blob_server.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"]])
def test_zerodb_server_help_needs_no_redis(argv):
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *argv],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: zerodb-server") and result.stderr == ""
