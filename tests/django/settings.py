"""Settings for the backend's own tests: ``default`` is plain SQLite (auth, sessions),
``encrypted`` is this backend; the ``testapp`` models live in the encrypted one.

``ZERODB_TEST_STORE`` picks the store of the encrypted test database (``memory://`` by
default; the SQLite store variant of the suite sets a ``sqlite:///`` path).
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
]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    "encrypted": {
        "ENGINE": "django_zerodb",
        "NAME": "tests",
        "OPTIONS": {"STORE": "memory://", "PASSPHRASE": "tests-only passphrase", "KDF": "fast"},
        "TEST": {"STORE": os.environ.get("ZERODB_TEST_STORE", "memory://")},
    },
}
DATABASE_ROUTERS = ["django_zerodb.routers.ZeroDBRouter"]
ZERODB_APPS = ["testapp"]
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
