"""Rollback detection across restarts: the highest root seen, kept in the default database
(``SeenRoot``), in a file, or in memory (``OPTIONS["FRESHNESS"]``)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, OperationalError, connections
from django.db.migrations.recorder import MigrationRecorder

from django_zerodb.checks import check_freshness_table
from django_zerodb.freshness import (
    TABLE,
    ModelFreshnessTracker,
    default_database_problem,
    describe_tracker,
    store_identity,
    tracker_for,
)
from django_zerodb.models import SeenRoot
from django_zerodb.store import forget_engines, store_settings
from tests.django.testapp.models import Department
from zerodb_core.freshness import FileFreshnessTracker, FreshnessTracker

ALIAS = "zfresh"
PASSPHRASE = "freshness test passphrase"
db = pytest.mark.django_db(databases=["default", "encrypted", ALIAS], transaction=True)


@pytest.fixture(scope="module", autouse=True)
def alias(django_db_setup):
    """An extra encrypted alias, added after the test databases are set up."""
    entry = {"ENGINE": "django_zerodb", "NAME": "fresh", "OPTIONS": {}}
    configured = connections.configure_settings(
        {"default": dict(connections.settings["default"]), ALIAS: entry}
    )
    connections.settings[ALIAS] = configured[ALIAS]
    yield ALIAS
    connections[ALIAS].close()
    del connections[ALIAS]
    del connections.settings[ALIAS]


def use_store(store: str, **options) -> None:
    connections[ALIAS].close()
    current = connections[ALIAS].settings_dict["OPTIONS"]
    current.clear()
    current.update({"STORE": store, "PASSPHRASE": PASSPHRASE, "KDF": "fast", **options})


def restart(store: str) -> None:
    """What a process restart does to the engine: it is gone, with its memory."""
    connections[ALIAS].close()
    forget_engines(store)


@pytest.fixture(autouse=True)
def back_to_memory():
    """After each test the alias points at an empty memory store again, which the test
    case's final flush can empty (the SQLite store may be rolled back on purpose)."""
    yield
    use_store("memory://")


def store_files(path: Path) -> list[Path]:
    return [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]


def copy_store(path: Path, backup: Path) -> None:
    backup.mkdir()
    for file in store_files(path):
        if file.exists():
            shutil.copy2(file, backup / file.name)


def restore_store(path: Path, backup: Path) -> None:
    for file in store_files(path):
        file.unlink(missing_ok=True)
        if (backup / file.name).exists():
            shutil.copy2(backup / file.name, file)


def roll_back_the_store(tmp_path: Path, **options) -> str:
    """Commit, copy the store, commit more, restore the copy; each step in a new engine,
    as separate processes would. Return the store."""
    path = tmp_path / "fresh.zdb"
    store = f"sqlite:///{path}"
    use_store(store, **options)
    with connections[ALIAS].schema_editor() as editor:
        editor.create_model(Department)
    Department.objects.using(ALIAS).create(name="before the copy")
    restart(store)
    copy_store(path, tmp_path / "backup")
    Department.objects.using(ALIAS).create(name="after the copy")
    assert Department.objects.using(ALIAS).count() == 2
    restart(store)
    restore_store(path, tmp_path / "backup")
    return store


@db
def test_a_rolled_back_store_is_detected_across_restarts(tmp_path):
    store = roll_back_the_store(tmp_path)  # FRESHNESS defaults to "default"
    try:
        with pytest.raises(DatabaseError, match=r"rollback") as raised:
            Department.objects.using(ALIAS).count()
        assert "FreshnessError" in str(raised.value)
        assert describe_tracker(connections[ALIAS].session.engine.freshness).startswith(
            "django_zerodb_seenroot in the 'default' database"
        )
    finally:
        restart(store)


@db
def test_seen_root_rows_follow_the_commits(tmp_path):
    path = tmp_path / "rows.zdb"
    store = f"sqlite:///{path}"
    use_store(store)
    try:
        with connections[ALIAS].schema_editor() as editor:
            editor.create_model(Department)
        Department.objects.using(ALIAS).create(name="one")
        engine = connections[ALIAS].session.engine
        root = engine.read_root()
        row = SeenRoot.objects.using("default").get(store=store_identity(store), database="fresh")
        assert row.store == store_identity(store) == f"sqlite:///{path.resolve()}"
        assert (row.seq, row.digest, row.alias) == (root.seq, root.digest.hex(), ALIAS)
        Department.objects.using(ALIAS).create(name="two")
        row.refresh_from_db()
        assert row.seq == root.seq + 1
        assert SeenRoot.objects.using("default").count() >= 1
        assert str(row).endswith(f"fresh: seq {row.seq}")
        assert not Path(f"{path}.fresh").exists()  # no file beside the store
    finally:
        restart(store)


@db
def test_a_file_keeps_the_floor_too(tmp_path):
    fresh = tmp_path / "floor.json"
    store = roll_back_the_store(tmp_path, FRESHNESS="file", FRESHNESS_PATH=str(fresh))
    try:
        assert fresh.exists()
        with pytest.raises(DatabaseError, match=r"rollback"):
            Department.objects.using(ALIAS).count()
        assert isinstance(connections[ALIAS].session.engine.freshness, FileFreshnessTracker)
    finally:
        restart(store)


@db
def test_memory_forgets_at_restart(tmp_path):
    """The documented weakness of FRESHNESS='memory': a rollback between two runs goes
    unnoticed."""
    store = roll_back_the_store(tmp_path, FRESHNESS="memory")
    try:
        assert Department.objects.using(ALIAS).count() == 1
        assert not SeenRoot.objects.using("default").filter(database="fresh").exists()
    finally:
        restart(store)


def test_an_unusable_table_falls_back_to_memory(monkeypatch, caplog):
    tracker = ModelFreshnessTracker("sqlite:////nowhere.zdb", "x")

    def broken():
        raise OperationalError("no such table: django_zerodb_seenroot")

    monkeypatch.setattr(tracker, "_rows", broken)
    with caplog.at_level(logging.WARNING, logger="django_zerodb"):
        tracker.check("main", 3, b"d" * 32, None)  # no error: kept in memory
        tracker.check("main", 4, b"e" * 32, b"d" * 32)
    assert tracker.fallback and "no such table" in tracker.fallback
    # The database cannot tell whether it was migrated: a warning, not INFO.
    assert [r.levelno for r in caplog.records if "kept in memory" in r.getMessage()] == [
        logging.WARNING
    ]
    assert "fell back to memory" in describe_tracker(tracker)
    with pytest.raises(Exception, match="rollback"):
        tracker.check("main", 2, b"f" * 32, None)  # still checked within the process


@pytest.mark.django_db(databases=["default"])
def test_before_the_first_migrate_the_missing_table_is_no_warning(monkeypatch, caplog):
    """`makemigrations` on a new project opens the encrypted database before `migrate`
    has created the table: expected, so said at INFO (Django lists the migration)."""
    tracker = ModelFreshnessTracker("sqlite:////nowhere.zdb", "x")

    def missing():
        raise OperationalError(f"no such table: {TABLE}")

    monkeypatch.setattr(tracker, "_rows", missing)
    MigrationRecorder(connections["default"]).migration_qs.filter(app="django_zerodb").delete()
    with caplog.at_level(logging.INFO, logger="django_zerodb"):
        tracker.check("main", 3, b"d" * 32, None)
    (record,) = [r for r in caplog.records if "kept in memory only" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert "no such table" in tracker.fallback


@pytest.mark.django_db(databases=["default"])
def test_a_failed_write_never_fails_the_commit(monkeypatch):
    tracker = ModelFreshnessTracker("sqlite:////nowhere.zdb")
    monkeypatch.setattr(tracker, "load", lambda: {})

    def broken():
        raise DatabaseError("the default database went away")

    monkeypatch.setattr(tracker, "_rows", broken)
    tracker.check("main", 1, b"d" * 32, None)
    assert "went away" in tracker.fallback


def params(**options):
    entry = {"OPTIONS": {"STORE": "sqlite:///x.zdb", "PASSPHRASE": "p", **options}}
    return store_settings(entry)


def test_freshness_options():
    assert params()["freshness"] == "default"
    assert params(FRESHNESS_PATH="/tmp/f.json")["freshness"] == "file"
    assert params(FRESHNESS="memory")["freshness"] == "memory"
    with pytest.raises(ImproperlyConfigured, match="'default'"):
        params(FRESHNESS="redis")
    with pytest.raises(ImproperlyConfigured, match="FRESHNESS_PATH"):
        params(FRESHNESS="default", FRESHNESS_PATH="/tmp/f.json")
    assert isinstance(tracker_for(params()), ModelFreshnessTracker)
    assert type(tracker_for(params(FRESHNESS="memory"))) is FreshnessTracker
    assert tracker_for(params(FRESHNESS="file")) is None  # the engine's own choice
    memory = store_settings({"OPTIONS": {"STORE": "memory://", "PASSPHRASE": "p"}})
    assert type(tracker_for(memory)) is FreshnessTracker  # it does not outlive the process


def test_store_identity():
    assert store_identity("zerodb://h:8001", "acme") == "zerodb://h:8001#tenant=acme"
    assert store_identity("sqlite:////a/b.zdb", "local") == "sqlite:////a/b.zdb"


def test_the_default_database_must_be_plaintext():
    assert default_database_problem() is None
    assert "itself encrypted" in default_database_problem("encrypted")
    assert "no 'nope' database" in default_database_problem("nope")


@pytest.mark.django_db(databases=["default"])
def test_check_warns_while_the_table_is_missing(monkeypatch, settings):
    encrypted = dict(settings.DATABASES["encrypted"])
    encrypted["OPTIONS"] = {**encrypted["OPTIONS"], "STORE": "sqlite:///x.zdb"}
    monkeypatch.setitem(settings.DATABASES, "encrypted", encrypted)
    assert check_freshness_table(databases=["default"]) == []
    assert check_freshness_table(databases=None) == []
    introspection = connections["default"].introspection
    tables = introspection.table_names()
    monkeypatch.setattr(
        introspection, "table_names", lambda cursor=None: [t for t in tables if t != TABLE]
    )
    (warning,) = check_freshness_table(databases=["default"])
    assert warning.id == "django_zerodb.W003" and "migrate" in warning.hint
    # Before the first migrate (which runs the check, then creates the table): no warning.
    monkeypatch.setattr(MigrationRecorder, "applied_migrations", lambda self: {})
    assert check_freshness_table(databases=["default"]) == []
