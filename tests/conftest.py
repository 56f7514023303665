"""Shared fixtures: databases on the embedded stores, with the fast (test-only) KDF."""

from __future__ import annotations

import pytest

from blob_server.storage.memory import MemoryStorage
from zerodb_core import DB

PASSWORD = "correct horse battery staple"


@pytest.fixture
def storage():
    return MemoryStorage()


@pytest.fixture
def make_db(tmp_path):
    """Open DBs on a store; the same ``store`` object gives DBs that share data."""
    opened = []

    def make(store="memory://", **kwargs):
        kwargs.setdefault("password", PASSWORD)
        kwargs.setdefault("kdf", "fast")
        if isinstance(store, str) and store.startswith("sqlite:///") and "{tmp}" in store:
            store = store.replace("{tmp}", str(tmp_path))
        db = DB(store, **kwargs)
        opened.append(db)
        return db

    yield make
    for db in opened:
        db.close()
