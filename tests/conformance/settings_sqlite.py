"""The SQLite baseline: Django's own ``tests/test_sqlite.py``, plus the recording runner.

Both databases are SQLite in memory, exactly as Django's CI runs its suite, so the
baseline says which tests this Django, on this machine, can pass at all.
"""

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
    },
    "other": {
        "ENGINE": "django.db.backends.sqlite3",
    },
}

SECRET_KEY = "django_tests_secret_key"

# Use a fast hasher to speed up tests.
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher",
]

USE_TZ = False

# Writes each test's outcome to $CONFORMANCE_OUTCOMES (and is plain DiscoverRunner
# without it), so results never depend on parsing the verbose output.
TEST_RUNNER = "tests.conformance.runner.RecordingRunner"
