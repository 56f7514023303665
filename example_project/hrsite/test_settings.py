"""Settings of the project's own tests (``python manage.py test --settings=hrsite.test_settings``,
see docs/testing.md): the project's settings with the encrypted database in memory.

No real passphrase is needed (the project's settings read one, so a test one is set
first), nothing under ``var/`` is opened, and the keyring is derived with the fast KDF.
"""

import os

from django_zerodb.testing import TEST_PASSPHRASE, in_memory

os.environ.setdefault("ZERODB_PASSPHRASE", TEST_PASSPHRASE)
os.environ.setdefault("DJANGO_SECRET_KEY", "tests only")

from hrsite.settings import *  # noqa: F403
from hrsite.settings import DATABASES

DATABASES["default"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
DATABASES["encrypted"] = in_memory(DATABASES["encrypted"])
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins
