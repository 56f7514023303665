"""Settings of the example project's own tests (``tests/example/site_tests``): the
project's settings with both databases in memory.

The encrypted database is the real backend on a ``memory://`` store (its test database is
``memory://`` too, unlocked with the fast KDF); nothing is written under
``example_project/var``.
"""

import os
import sys
import tempfile
from pathlib import Path

EXAMPLE_PROJECT = Path(__file__).resolve().parents[2] / "example_project"
if str(EXAMPLE_PROJECT) not in sys.path:
    sys.path.insert(0, str(EXAMPLE_PROJECT))
# What hrsite.settings reads at import: give it values so that it generates no file.
os.environ.setdefault("ZERODB_PASSPHRASE", "tests-only passphrase")
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only secret key")
os.environ.setdefault("HRSITE_VAR_DIR", str(Path(tempfile.gettempdir()) / "hrsite-tests-var"))
os.environ.pop("ZERODB_URL", None)

from hrsite.settings import *  # noqa: E402, F403

DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    "encrypted": {
        "ENGINE": "django_zerodb",
        "NAME": "hr",
        "OPTIONS": {
            "STORE": "memory://",
            "PASSPHRASE": "tests-only passphrase",
            "KDF": "fast",
            # As the project's own settings (hrsite/settings.py).
            "ISOLATION_LEVEL": "repeatable read",
        },
        "TEST": {"STORE": "memory://"},
    },
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEBUG = False
