"""Django's test suite against ``django_zerodb``: ``tests/test_sqlite.py`` with both
databases moved to the encrypted backend.

``default`` and ``other`` are two databases (NAME) in the in-process ``memory://`` store,
unlocked with the test-only ``fast`` KDF. The test runner turns them into ``test_default``
and ``test_other`` through the backend's ``DatabaseCreation``; ``other`` is a database
of its own, not a mirror, because the multi-database tests write to both.
"""

DATABASES = {
    "default": {
        "ENGINE": "django_zerodb",
        "NAME": "default",
        "OPTIONS": {"STORE": "memory://", "PASSPHRASE": "conformance", "KDF": "fast"},
    },
    "other": {
        "ENGINE": "django_zerodb",
        "NAME": "other",
        "OPTIONS": {"STORE": "memory://", "PASSPHRASE": "conformance", "KDF": "fast"},
    },
}

SECRET_KEY = "django_tests_secret_key"

# Use a fast hasher to speed up tests.
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher",
]

USE_TZ = False

TEST_RUNNER = "tests.conformance.runner.RecordingRunner"
