"""Settings for the backend's own tests: ``default`` is plain SQLite (auth, sessions),
``encrypted`` is this backend; the ``testapp`` models live in the encrypted one.

``ZERODB_TEST_STORE`` picks the store of the encrypted test database (``memory://`` by
default). ``encrypted_sqlite`` is the same backend on an SQLite store, for the tests that
run on both stores (see tests/django/conftest.py).
"""

import os

SECRET_KEY = "tests-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django_zerodb",
    "tests.django.testapp",
    "tests.django.difftest",
    # django_zerodb.rest (tests/django/rest)
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    "encrypted": {
        "ENGINE": "django_zerodb",
        "NAME": "tests",
        "OPTIONS": {"STORE": "memory://", "PASSPHRASE": "tests-only passphrase", "KDF": "fast"},
        "TEST": {"STORE": os.environ.get("ZERODB_TEST_STORE", "memory://")},
    },
    # The same models on the SQLite store: tests/django/conftest.py sets its test STORE
    # (a file in pytest's temporary directory) and routes to it through ZERODB_DATABASE.
    "encrypted_sqlite": {
        "ENGINE": "django_zerodb",
        "NAME": "tests",
        "OPTIONS": {"STORE": "memory://", "PASSPHRASE": "tests-only passphrase", "KDF": "fast"},
        "TEST": {"STORE": "memory://"},
    },
    # The differential test's reference (tests/django/difftest): ordinary SQLite.
    "plain": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
DATABASE_ROUTERS = ["django_zerodb.routers.ZeroDBRouter"]
ZERODB_APPS = ["testapp"]
# Migrated on every database; the differential test picks one with .using().
ZERODB_SHARED_APPS = ["difftest"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ROOT_URLCONF = "tests.django.urls"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
# django_zerodb.rest (tests/django/rest): ZeroModelViewSet sets its own authentication,
# permissions, filters and pagination; the schema class is drf-spectacular's.
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {"TITLE": "django-zerodb tests", "VERSION": "0"}
