"""``DATABASES`` entries from URLs, in the spirit of dj-database-url.

    from django_zerodb.database_url import config, parse

    DATABASES = {
        "default": {...},
        "encrypted": config(),  # $ZERODB_DATABASE_URL, passphrase from $ZERODB_PASSPHRASE
        # or spelled out:
        "encrypted": parse("sqlite+zerodb:///var/hr.zdb?name=hr&isolation_level=repeatable+read"),
    }

URL forms (docs/settings.md, "Database URLs"):

* ``zerodb://[user[:passphrase]@]host[:port]/name`` - a blob server (``KEY_FILE`` from
  ``?key_file=`` or ``$ZERODB_KEY_FILE``);
* ``sqlite+zerodb:///relative.zdb``, ``sqlite+zerodb:////absolute.zdb`` - an embedded
  file (``?name=`` names the database inside it, default ``main``);
* ``memory+zerodb://`` - in the process (``?name=`` as above).

Other query parameters are ``OPTIONS`` in lower case (``?isolation_level=serializable``,
``?pool_size=8``, ``?tls=true``). The passphrase comes from ``passphrase=``, else the URL,
else ``$ZERODB_PASSPHRASE``; without any, the system checks (``django_zerodb.E001``) and
opening the database say how to set it (``MissingPassphrase``; a settings file reading
``os.environ["ZERODB_PASSPHRASE"]`` would stop every command with a bare ``KeyError``).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

DEFAULT_ENV = "ZERODB_DATABASE_URL"
PASSPHRASE_ENV = "ZERODB_PASSPHRASE"
DEFAULT_PORT = 8001

# Query parameters that are not strings, by their OPTIONS key.
_INTS = {"POOL_SIZE", "CACHE_BYTES", "NODE_BYTES", "MERGE_FACTOR"}
_FLOATS = {"TIMEOUT", "DELAY"}
_BOOLS = {"TLS"}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class MissingPassphrase:
    """An unset passphrase variable, standing in the ``DATABASES`` entry.

    Raising while the settings are imported would bury the one useful line under forty
    lines of Django's settings machinery; this marker lets them import, and whatever
    needs the passphrase raises ``ImproperlyConfigured`` with ``message`` instead: the
    system checks of every ``manage.py`` command (``django_zerodb.E001``, printed without
    a traceback) and opening the database (``store.store_settings``).
    """

    def __init__(self, name: str) -> None:
        self.message = (
            f"the encrypted database needs its passphrase: set the environment variable "
            f"{name} (export {name}='...' in the shell that runs manage.py; keep it out of "
            "the repository)"
        )

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.message}>"


def passphrase_from_env(name: str = PASSPHRASE_ENV) -> str | MissingPassphrase:
    """Return ``$name``, or a :class:`MissingPassphrase` that says how to set it."""
    return os.environ.get(name) or MissingPassphrase(name)


def config(
    env: str = DEFAULT_ENV, default: str | None = None, *, passphrase: str | None = None
) -> dict[str, Any]:
    """Return the ``DATABASES`` entry of the URL in ``$env`` (else ``default``)."""
    url = os.environ.get(env) or default
    if not url:
        raise ImproperlyConfigured(
            f"set the environment variable {env} to the URL of the encrypted database, "
            "e.g. sqlite+zerodb:///var/app.zdb or zerodb://host:8001/app"
        )
    return parse(url, passphrase=passphrase)


def parse(url: str, *, passphrase: str | None = None) -> dict[str, Any]:
    """Return the ``DATABASES`` entry (``ENGINE`` ``django_zerodb``) ``url`` describes."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    params = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    entry: dict[str, Any] = {"ENGINE": "django_zerodb"}
    options: dict[str, Any] = {}
    if scheme == "zerodb":
        if not parts.hostname:
            raise ImproperlyConfigured(f"{_redacted(url)}: a zerodb:// URL names a host")
        options["STORE"] = f"zerodb://{_host(parts.hostname)}:{parts.port or DEFAULT_PORT}"
        entry["NAME"] = unquote(parts.path.lstrip("/")) or "main"
        if "name" in params:
            raise ImproperlyConfigured(f"{_redacted(url)}: the database name is the path")
    elif scheme in {"sqlite+zerodb", "memory+zerodb"}:
        if parts.netloc:
            raise ImproperlyConfigured(
                f"{_redacted(url)}: no host in a {scheme}:// URL "
                f"(sqlite+zerodb:///relative.zdb, sqlite+zerodb:////absolute.zdb)"
            )
        path = unquote(parts.path)
        if scheme == "sqlite+zerodb":
            if not path.lstrip("/"):
                raise ImproperlyConfigured(f"{url}: a sqlite+zerodb:/// URL names a file")
            options["STORE"] = "sqlite://" + path
        else:
            options["STORE"] = "memory://"
        entry["NAME"] = params.pop("name", "main")
    else:
        raise ImproperlyConfigured(
            f"{_redacted(url)}: unknown scheme {scheme!r}; django_zerodb takes zerodb://, "
            "sqlite+zerodb:/// and memory+zerodb://"
        )
    if parts.username:
        entry["USER"] = unquote(parts.username)
    for key, value in params.items():
        options[key.upper()] = _typed(key.upper(), value, url)
    if passphrase is None and parts.password is not None:
        passphrase = unquote(parts.password)
    options["PASSPHRASE"] = passphrase if passphrase is not None else passphrase_from_env()
    entry["OPTIONS"] = options
    return entry


def _typed(key: str, value: str, url: str) -> Any:
    try:
        if key in _INTS:
            return int(value)
        if key in _FLOATS:
            return float(value)
    except ValueError:
        raise ImproperlyConfigured(
            f"{_redacted(url)}: {key.lower()} must be a number, not {value!r}"
        ) from None
    if key in _BOOLS:
        if value.lower() not in _TRUE | _FALSE:
            raise ImproperlyConfigured(f"{_redacted(url)}: {key.lower()} is true or false")
        return value.lower() in _TRUE
    return value


def _host(hostname: str) -> str:
    return f"[{hostname}]" if ":" in hostname else hostname


def _redacted(url: str) -> str:
    """``url`` without its password, for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
