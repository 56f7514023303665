"""``django_zerodb.database_url``: DATABASES entries from URLs, checked by the backend's own
settings validation (``store_settings``) and, for an embedded store, used for real."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.utils import ConnectionHandler

from django_zerodb.checks import check_databases
from django_zerodb.database_url import config, parse, passphrase_from_env
from django_zerodb.store import store_settings


@pytest.mark.parametrize(
    "url, store, name",
    [
        ("zerodb://db.internal:9000/hr", "zerodb://db.internal:9000", "hr"),
        ("zerodb://db.internal/hr", "zerodb://db.internal:8001", "hr"),
        ("zerodb://[::1]:9000/", "zerodb://[::1]:9000", "main"),
        ("sqlite+zerodb:///var/hr.zdb?name=hr", "sqlite:///var/hr.zdb", "hr"),
        ("sqlite+zerodb:////srv/hr%20data.zdb", "sqlite:////srv/hr data.zdb", "main"),
        ("memory+zerodb://?name=x", "memory://", "x"),
    ],
)
def test_forms(url, store, name):
    entry = parse(url, passphrase="p")
    assert entry["ENGINE"] == "django_zerodb"
    assert (entry["OPTIONS"]["STORE"], entry["NAME"]) == (store, name)
    checked = store_settings(entry)
    assert (checked["store"], checked["database"], checked["passphrase"]) == (store, name, "p")


def test_options_are_typed():
    url = (
        "zerodb://app@h:1/hr?key_file=/k&pool_size=8&timeout=2.5&tls=true"
        "&isolation_level=repeatable+read&cache_bytes=1024"
    )
    entry = parse(url, passphrase="p")
    assert entry["USER"] == "app"
    assert entry["OPTIONS"] == {
        "STORE": "zerodb://h:1",
        "KEY_FILE": "/k",
        "POOL_SIZE": 8,
        "TIMEOUT": 2.5,
        "TLS": True,
        "ISOLATION_LEVEL": "repeatable read",
        "CACHE_BYTES": 1024,
        "PASSPHRASE": "p",
    }
    checked = store_settings(entry)
    assert checked["remote"] == {"pool_size": 8, "timeout": 2.5, "tls": True}
    assert checked["username"] == "app"


def test_passphrase_sources(monkeypatch):
    monkeypatch.setenv("ZERODB_PASSPHRASE", "from env")
    assert parse("memory+zerodb://")["OPTIONS"]["PASSPHRASE"] == "from env"
    assert parse("zerodb://u:from%20url@h/x")["OPTIONS"]["PASSPHRASE"] == "from url"
    assert parse("zerodb://u:from-url@h/x", passphrase="arg")["OPTIONS"]["PASSPHRASE"] == "arg"
    monkeypatch.delenv("ZERODB_PASSPHRASE")
    with pytest.raises(ImproperlyConfigured, match="set the environment variable ZERODB_PAS"):
        store_settings(parse("memory+zerodb://"))
    with pytest.raises(ImproperlyConfigured, match="export ZERODB_PASSPHRASE="):
        store_settings({"OPTIONS": {"STORE": "memory://", "PASSPHRASE": passphrase_from_env()}})


def test_an_unset_passphrase_is_a_system_check_error(monkeypatch, settings):
    """Settings import without $ZERODB_PASSPHRASE; every manage.py command then stops at
    the system checks with the one line that says what to do, not a traceback."""
    monkeypatch.delenv("ZERODB_PASSPHRASE", raising=False)
    missing = passphrase_from_env("ZERODB_PASSPHRASE")
    assert not missing and "ZERODB_PASSPHRASE" in repr(missing)
    entry = {"ENGINE": "django_zerodb", "OPTIONS": {"STORE": "memory://", "PASSPHRASE": missing}}
    monkeypatch.setitem(settings.DATABASES, "unset", entry)
    errors = [e for e in check_databases() if e.obj == "DATABASES['unset']"]
    assert [e.id for e in errors] == ["django_zerodb.E001"]
    assert "export ZERODB_PASSPHRASE='...'" in errors[0].msg
    monkeypatch.setenv("ZERODB_PASSPHRASE", "set now")
    assert passphrase_from_env("ZERODB_PASSPHRASE") == "set now"


def test_config_reads_the_environment(monkeypatch):
    monkeypatch.setenv("ZERODB_DATABASE_URL", "memory+zerodb://?name=env")
    assert config(passphrase="p")["NAME"] == "env"
    monkeypatch.delenv("ZERODB_DATABASE_URL")
    assert config(default="memory+zerodb://?name=fallback", passphrase="p")["NAME"] == "fallback"
    with pytest.raises(ImproperlyConfigured, match="ZERODB_DATABASE_URL"):
        config(passphrase="p")


@pytest.mark.parametrize(
    "url, message",
    [
        ("postgres://h/x", "unknown scheme 'postgres'"),
        ("zerodb:///x", "names a host"),
        ("zerodb://h/x?name=y", "the database name is the path"),
        ("sqlite+zerodb://host/x.zdb", "no host"),
        ("sqlite+zerodb:///", "names a file"),
        ("zerodb://h/x?pool_size=many", "pool_size must be a number"),
        ("zerodb://h/x?tls=maybe", "tls is true or false"),
        ("zerodb://u:secret@h/x?timeout=soon", r"zerodb://u:\*\*\*@h/x"),
    ],
)
def test_refused(url, message):
    with pytest.raises(ImproperlyConfigured, match=message) as refused:
        parse(url, passphrase="p")
    assert "secret" not in str(refused.value)


def test_an_unknown_option_is_refused_by_the_backend():
    with pytest.raises(ImproperlyConfigured, match=r"unknown OPTIONS.*NOPE"):
        store_settings(parse("memory+zerodb://?nope=1", passphrase="p"))


@pytest.mark.django_db(databases=["default"])
def test_an_embedded_url_opens_a_working_database():
    """The entry is a real DATABASES entry: a connection opens it and runs a query."""
    entry = parse("memory+zerodb://?name=url&kdf=fast", passphrase="p")
    handler = ConnectionHandler({"default": connections.settings["default"], "u": entry})
    connection = handler["u"]
    try:
        with connection.cursor():
            pass
        assert connection.vendor == "zerodb"
        assert connection.introspection.table_names() == []
    finally:
        connection.close()
