"""Open the encrypted engine (a ``zerodb_core.DB``) for a ``DATABASES`` entry.

Unlocking the keyring runs Argon2id (hundreds of milliseconds by design), and an
in-memory store must be the same store for every thread, so one engine is shared by every
connection of the process that has the same settings. Django's connections are per
thread; each keeps its own transaction over the shared engine.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_zerodb.database_url import MissingPassphrase
from django_zerodb.freshness import ModelFreshnessTracker, store_identity, tracker_for
from zerodb_core.api import DB, LEVELS, READ_COMMITTED

_engines: dict[tuple, DB] = {}
_lock = threading.Lock()

# OPTIONS keys the backend understands (documented in docs/settings.md).
KNOWN_OPTIONS = frozenset(
    {
        "STORE",
        "PASSPHRASE",
        "KEY_FILE",
        "USERNAME",
        "KDF",
        "CACHE_BYTES",
        "FRESHNESS",
        "FRESHNESS_PATH",
        "DELAY",
        "NODE_BYTES",
        "MERGE_FACTOR",
        "ISOLATION_LEVEL",
        # The blob-server client (STORE "zerodb://host:port" only).
        "TLS",
        "CA_FILE",
        "TIMEOUT",
        "POOL_SIZE",
    }
)
REMOTE_OPTIONS = ("TLS", "CA_FILE", "TIMEOUT", "POOL_SIZE")


def store_settings(settings_dict: dict[str, Any]) -> dict[str, Any]:
    """Check a ``DATABASES`` entry and return what opening its engine needs."""
    options = dict(settings_dict.get("OPTIONS") or {})
    unknown = sorted(set(options) - KNOWN_OPTIONS)
    if unknown:
        raise ImproperlyConfigured(
            f"unknown OPTIONS for the django_zerodb database: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(KNOWN_OPTIONS))})"
        )
    store = options.get("STORE")
    host = settings_dict.get("HOST")
    if not store and host:
        store = f"zerodb://{host}:{settings_dict.get('PORT') or 8001}"
    if not store:
        raise ImproperlyConfigured(
            "the django_zerodb database needs OPTIONS['STORE'] "
            "('memory://', 'sqlite:///path/file.zdb' or 'zerodb://host:port') or HOST/PORT"
        )
    passphrase = options.get("PASSPHRASE") or settings_dict.get("PASSWORD")
    if isinstance(options.get("PASSPHRASE"), MissingPassphrase):
        raise ImproperlyConfigured(options["PASSPHRASE"].message)
    if not passphrase:
        raise ImproperlyConfigured(
            "the django_zerodb database needs a passphrase: OPTIONS['PASSPHRASE'] "
            "(for example from an environment variable) or PASSWORD"
        )
    parse_store(store)  # a malformed STORE is a configuration error, found at startup
    remote = {k.lower(): options[k] for k in REMOTE_OPTIONS if options.get(k) is not None}
    if remote and not store.startswith("zerodb://"):
        raise ImproperlyConfigured(
            f"OPTIONS {', '.join(sorted(k.upper() for k in remote))} apply to a blob-server "
            "STORE ('zerodb://host:port') only"
        )
    name = settings_dict.get("NAME") or "main"
    freshness = options.get("FRESHNESS") or ("file" if options.get("FRESHNESS_PATH") else "default")
    if freshness not in ("default", "file", "memory"):
        raise ImproperlyConfigured(
            f"OPTIONS['FRESHNESS'] is 'default' (the default database), 'file' or 'memory', "
            f"not {freshness!r}"
        )
    if options.get("FRESHNESS_PATH") and freshness != "file":
        raise ImproperlyConfigured("OPTIONS['FRESHNESS_PATH'] needs OPTIONS['FRESHNESS'] = 'file'")
    isolation = options.get("ISOLATION_LEVEL", READ_COMMITTED)
    if isolation not in LEVELS:
        raise ImproperlyConfigured(
            f"OPTIONS['ISOLATION_LEVEL'] is one of {', '.join(map(repr, LEVELS))}, "
            f"not {isolation!r}"
        )
    return {
        "store": store,
        "database": name,
        "isolation": isolation,
        "username": options.get("USERNAME") or settings_dict.get("USER") or "root",
        "passphrase": passphrase,
        "key_file": options.get("KEY_FILE"),
        "kdf": options.get("KDF"),
        "cache_bytes": options.get("CACHE_BYTES"),
        "freshness": freshness,
        "freshness_path": options.get("FRESHNESS_PATH"),
        "delay": float(options.get("DELAY") or 0.0),
        "node_bytes": options.get("NODE_BYTES"),
        "merge_factor": options.get("MERGE_FACTOR"),
        "remote": remote,
    }


def parse_store(store: str) -> str | tuple[str, int]:
    """``zerodb://host:port`` becomes ``(host, port)``; embedded URLs stay as they are."""
    if store.startswith("zerodb://"):
        address = store[len("zerodb://") :].rstrip("/")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ImproperlyConfigured(f"a blob server store is zerodb://host:port, not {store!r}")
        return (host.strip("[]"), int(port))
    if store.startswith(("memory://", "sqlite:///")):
        return store
    raise ImproperlyConfigured(
        f"unknown STORE {store!r}: use 'memory://', 'sqlite:///path' or 'zerodb://host:port'"
    )


def open_engine(params: dict[str, Any]) -> DB:
    """The shared engine for these settings, opened (and its keyring unlocked) once."""
    secret = hashlib.blake2b(str(params["passphrase"]).encode(), digest_size=16).digest()
    key = (
        params["store"],
        params["database"],
        params["username"],
        secret,
        str(params["key_file"]),
        params["delay"],
        params["node_bytes"],
        params.get("merge_factor"),
        params.get("freshness"),
        tuple(sorted((params.get("remote") or {}).items())),
    )
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            kwargs: dict[str, Any] = {"database": params["database"], "delay": params["delay"]}
            for name in ("kdf", "cache_bytes", "freshness_path", "node_bytes", "merge_factor"):
                if params[name] is not None:
                    kwargs[name] = params[name]
            if params["key_file"] is not None:
                kwargs["key_file"] = os.fspath(params["key_file"])
            tracker = tracker_for(params)
            engine = DB(
                parse_store(params["store"]),
                params["username"],
                params["passphrase"],
                freshness=tracker,
                **(params.get("remote") or {}),
                **kwargs,
            )
            if isinstance(tracker, ModelFreshnessTracker):  # nothing checked yet: name it
                tenant = getattr(engine.transport, "tenant", None)
                tracker.store = store_identity(params["store"], tenant)
            _engines[key] = engine
        return engine


def forget_engines(store: str | None = None) -> None:
    """Close and forget shared engines (of one store, or all): used when a test store
    is destroyed."""
    with _lock:
        for key in [k for k in _engines if store is None or k[0] == store]:
            _engines.pop(key).close()
