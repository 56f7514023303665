"""Test databases: a fresh in-memory store by default.

Django's test runner renames each database to ``test_<NAME>`` and migrates it. An
encrypted test database lives in ``TEST["STORE"]`` (default ``memory://``, thrown away
at the end, and unlocked with the fast Argon2id preset since nothing in it is kept), so
tests never touch the real store.
"""

from __future__ import annotations

from pathlib import Path

from django.db.backends.base.creation import BaseDatabaseCreation

from django_zerodb.store import forget_engines


class DatabaseCreation(BaseDatabaseCreation):
    def _test_store(self) -> str:
        return self.connection.settings_dict.get("TEST", {}).get("STORE") or "memory://"

    def _create_test_db(self, verbosity: int, autoclobber: bool, keepdb: bool = False) -> str:
        name = self._get_test_db_name()
        store = self._test_store()
        options = self.connection.settings_dict.setdefault("OPTIONS", {})
        options["STORE"] = store
        if store == "memory://":
            options.setdefault("KDF", "fast")
        elif not keepdb and store.startswith("sqlite:///"):
            _remove_store_files(store)
        return name

    def _destroy_test_db(self, test_database_name: str, verbosity: int) -> None:
        store = self._test_store()
        self.connection.close()
        forget_engines(store)
        if store.startswith("sqlite:///"):
            _remove_store_files(store)

    def _get_test_db_name(self) -> str:
        test_name = self.connection.settings_dict.get("TEST", {}).get("NAME")
        return test_name or f"test_{self.connection.settings_dict['NAME']}"

    def _clone_test_db(self, suffix: str, verbosity: int, keepdb: bool = False) -> None:
        pass

    def get_test_db_clone_settings(self, suffix: str) -> dict:
        settings_dict = super().get_test_db_clone_settings(suffix)
        settings_dict.setdefault("TEST", {})["STORE"] = self._test_store()
        return settings_dict

    def test_db_signature(self) -> tuple:
        # The test store, not OPTIONS["STORE"]: two aliases that differ only in their
        # TEST["STORE"] are two test databases, not mirrors of one.
        settings_dict = self.connection.settings_dict
        return (
            self._test_store(),
            self._get_test_db_name(),
            settings_dict.get("ENGINE"),
        )


def _remove_store_files(store: str) -> None:
    path = Path(store[len("sqlite:///") :])
    for suffix in ("", "-wal", "-shm", ".fresh", ".fresh.lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
