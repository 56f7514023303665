"""Settings of the example HR site.

Two databases: ``default`` is ordinary SQLite (users, sessions, the admin log) and
``encrypted`` is django_zerodb, holding every model of the ``hr`` app (the router sends
the apps in ``ZERODB_APPS`` there). The encrypted store is an SQLite file under ``var/``
unless ``ZERODB_URL`` names a blob server.

Environment variables (all optional for the demo):

* ``ZERODB_PASSPHRASE``: the passphrase of the encrypted database. Unset, a random one is
  generated once and kept in ``var/passphrase`` (mode 0600): fine for a demo, not for real
  data, since whoever reads that file can decrypt the store.
* ``ZERODB_URL`` (``zerodb://host:port``) and ``ZERODB_KEY_FILE``: use a blob server
  instead of the embedded store.
* ``HRSITE_VAR_DIR``: where the demo's files live (default ``example_project/var``).
* ``DJANGO_SECRET_KEY`` (default: generated once into ``var/secret-key``), ``DJANGO_DEBUG``
  (default ``1``), ``DJANGO_ALLOWED_HOSTS`` (comma-separated; default local addresses).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("HRSITE_VAR_DIR") or BASE_DIR / "var")


def secret_file(name: str) -> str:
    """The content of ``var/<name>``, generated (random, mode 0600) the first time."""
    path = VAR_DIR / name
    if not path.exists():
        VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it meanwhile
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or secret_file("secret-key")
DEBUG = os.environ.get("DJANGO_DEBUG", "1").lower() not in {"0", "false", "no", ""}
ALLOWED_HOSTS = [
    host.strip()
    for host in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")
    if host.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc's files, served from here
    "django_zerodb",
    "hr",
]

# The API (hr/api.py) uses django_zerodb.rest's defaults (token and session
# authentication, model permissions, filters, counted pagination); throttling is DRF's
# DEFAULT_THROTTLE_RATES (docs/rest.md).
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
# The schema at /api/schema/, browsed with Swagger UI (/api/docs/) or Redoc (/api/redoc/).
SPECTACULAR_SETTINGS = {
    "TITLE": "HR API (django-zerodb example)",
    "VERSION": "1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

MIDDLEWARE = [
    # Round trips to the encrypted store per request (the admin's "Encrypted store" page).
    "django_zerodb.middleware.RoundTripsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "hrsite.urls"
WSGI_APPLICATION = "hrsite.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def encrypted_database() -> dict:
    """The ``DATABASES`` entry of the encrypted store."""
    url = os.environ.get("ZERODB_URL")
    options = {
        "STORE": url or f"sqlite:///{VAR_DIR / 'hr.zdb'}",
        "PASSPHRASE": os.environ.get("ZERODB_PASSPHRASE") or secret_file("passphrase"),
        # A save that would overwrite a concurrent change fails instead (docs/settings.md).
        "ISOLATION_LEVEL": os.environ.get("ZERODB_ISOLATION_LEVEL") or "repeatable read",
    }
    if url and os.environ.get("ZERODB_KEY_FILE"):
        options["KEY_FILE"] = os.environ["ZERODB_KEY_FILE"]
    if not url:
        VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    return {"ENGINE": "django_zerodb", "NAME": "hr", "OPTIONS": options}


DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": VAR_DIR / "default.sqlite3",
    },
    "encrypted": encrypted_database(),
}
DATABASE_ROUTERS = ["django_zerodb.routers.ZeroDBRouter"]
ZERODB_APPS = ["hr"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "admin:login"
