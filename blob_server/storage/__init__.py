"""Storage backends behind one interface, and ``open_storage`` to pick one by URL.

URLs follow the convention of dj-database-url and SQLAlchemy, so Django users already
know them:

* ``memory://`` - a new, empty in-process store (tests, demos).
* ``sqlite:///relative/path.zdb`` - a file relative to the working directory.
* ``sqlite:////absolute/path.zdb`` - an absolute path (note the fourth slash), so
  ``"sqlite:///" + str(path)`` is right for relative and absolute paths alike.
* ``redis://[:password@]host[:port][/db]`` (``rediss://`` for TLS) - a Redis server
  (redis-py's URL syntax). Nothing connects until the first call.

``RedisStorage`` is imported on first use: redis-py and hiredis are the optional extra
``django-zerodb[redis]``, which the embedded stores (and so ``zerodb_core``) never need.
"""

from __future__ import annotations

import os

from blob_server.exceptions import StorageUnavailableError
from blob_server.storage.memory import MemoryStorage
from blob_server.storage.sqlite import SQLiteStorage
from blob_server.wire.storage import (
    BLOB_ID_SIZE,
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STAGING_TIMEOUT,
    EMPTY_ROOT,
    MAX_QUOTA,
    NO_QUOTA,
    CommitResult,
    DatabaseUsage,
    Quota,
    RootRecord,
    Storage,
    TenantUsage,
)

__all__ = [
    "BLOB_ID_SIZE",
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_STAGING_TIMEOUT",
    "EMPTY_ROOT",
    "MAX_QUOTA",
    "NO_QUOTA",
    "CommitResult",
    "DatabaseUsage",
    "MemoryStorage",
    "Quota",
    "RedisStorage",
    "RootRecord",
    "SQLiteStorage",
    "Storage",
    "TenantUsage",
    "open_storage",
]

_SQLITE_PREFIX = "sqlite:///"
_REDIS_PREFIXES = ("redis://", "rediss://")


def open_storage(url: str) -> Storage:
    """Open the storage named by ``url`` (see the module docstring for the forms).

    Raise ``StorageUnavailableError`` for an unknown scheme, a malformed Redis URL, or a
    file that cannot be created or opened as a store; the parent directory of a SQLite
    file is created.
    """
    if not isinstance(url, str):
        raise StorageUnavailableError(f"storage URL must be str, not {type(url).__name__}")
    if url == "memory://":
        return MemoryStorage()
    if url.startswith(_SQLITE_PREFIX) and len(url) > len(_SQLITE_PREFIX):
        return _open_sqlite(url[len(_SQLITE_PREFIX) :])
    if url.startswith(("redis:", "rediss:")):
        if url.startswith(_REDIS_PREFIXES) and len(url) > url.index("//") + 2:
            return _redis_storage_class()(url)
        raise StorageUnavailableError(
            "bad Redis storage URL: use redis://host:port/db or rediss://host:port/db"
        )
    if url.startswith("sqlite:"):
        raise StorageUnavailableError(
            f"bad SQLite storage URL {url!r}: use sqlite:///relative/path.zdb "
            "or sqlite:////absolute/path.zdb"
        )
    scheme = url.partition(":")[0] if ":" in url else url
    raise StorageUnavailableError(
        f"unknown storage URL scheme {scheme!r} in {url!r}: expected memory://, sqlite:///path "
        "or redis://host:port/db"
    )


def __getattr__(name: str) -> type[Storage]:
    if name == "RedisStorage":
        return _redis_storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _redis_storage_class() -> type[Storage]:
    """``RedisStorage``, or ``StorageUnavailableError`` naming the extra to install."""
    try:
        from blob_server.storage.redis import RedisStorage
    except ImportError as exc:
        raise StorageUnavailableError(
            f"a redis:// store needs redis-py and hiredis ({exc}): "
            "pip install 'django-zerodb[redis]'"
        ) from exc
    return RedisStorage


def _open_sqlite(path: str) -> SQLiteStorage:
    """Create the parent directory if needed and open the file."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise StorageUnavailableError(f"cannot create directory {parent}: {exc}") from exc
    if os.path.isdir(path):
        raise StorageUnavailableError(f"{path} is a directory, not a storage file")
    return SQLiteStorage(path)
