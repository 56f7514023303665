"""What the ``zerodb_*`` management commands share: the ``--database`` and ``--progress``
options, model names, progress bars and error translation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections

from django_zerodb.exceptions import Error as BackendError
from django_zerodb.exceptions import translated
from django_zerodb.store import store_settings
from zerodb_core.api import ZeroDBError


def add_database_argument(parser) -> None:
    parser.add_argument(
        "--database",
        help="the DATABASES alias of the encrypted database (default: "
        "settings.ZERODB_DATABASE, else the first alias whose ENGINE is django_zerodb)",
    )


def add_progress_argument(parser) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help="show a progress bar on stderr even when stderr is not a terminal (by "
        "default one appears on a terminal, for work that takes more than a second)",
    )


def encrypted_connection(alias: str | None):
    """The connection of ``alias`` (default: the encrypted alias), checked to be one of
    this backend."""
    from django_zerodb.routers import encrypted_alias

    if alias is None:
        try:
            alias = encrypted_alias()
        except LookupError as exc:
            raise CommandError(str(exc)) from None
    if alias not in connections.settings:
        raise CommandError(f"no database {alias!r} in settings.DATABASES")
    connection = connections[alias]
    if connection.vendor != "zerodb":
        raise CommandError(
            f"DATABASES[{alias!r}] is not an encrypted database (ENGINE is "
            f"{connection.settings_dict.get('ENGINE')!r}, not 'django_zerodb')"
        )
    return connection


def connection_params(connection) -> dict[str, Any]:
    try:
        return store_settings(connection.settings_dict)
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from None


@contextlib.contextmanager
def command_errors(action: str) -> Iterator[None]:
    """Engine and database errors become a ``CommandError`` naming what failed."""
    try:
        with translated():
            yield
    except (DatabaseError, BackendError, ZeroDBError) as exc:
        raise CommandError(f"{action} failed: {exc}") from exc


def progress_bar(command: BaseCommand, options: dict, *, total: int | None, desc: str, unit: str):
    """A tqdm bar on the command's stderr: on a terminal for work longer than a second,
    always with ``--progress``; otherwise disabled (nothing is written)."""
    from tqdm import tqdm

    stream = getattr(command.stderr, "_out", command.stderr)
    forced = bool(options.get("progress"))
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=stream,
        disable=not on_terminal(command, options),
        delay=0 if forced else 1.0,
        leave=False,
        dynamic_ncols=tty,
    )


def on_terminal(command: BaseCommand, options: dict) -> bool:
    """Whether progress bars and status lines are shown: on a terminal, or with
    ``--progress``."""
    stream = getattr(command.stderr, "_out", command.stderr)
    return bool(options.get("progress")) or bool(getattr(stream, "isatty", lambda: False)())


def status(command: BaseCommand, options: dict, message: str) -> None:
    """A line on stderr before a step that takes seconds and has no progress to count
    (an Argon2id derivation), shown when a progress bar would be (``on_terminal``)."""
    if on_terminal(command, options):
        command.stderr.write(message)


def unlocked_session(command: BaseCommand, options: dict, connection):
    """``connection.session``, saying first that unlocking takes a few seconds (the
    Argon2id derivation from the passphrase is slow on purpose) when it is not open yet."""
    if connection.connection is None:
        status(
            command,
            options,
            f"unlocking {connection.alias!r} (Argon2id key derivation: a few seconds) ...",
        )
    return connection.session


def model_labels() -> dict[str, str]:
    """Catalog name (``db_table``) -> Django model label, for every installed model."""
    return {m._meta.db_table: m._meta.label for m in apps.get_models(include_auto_created=True)}


def catalog_names(names: list[str], catalog) -> list[str]:
    """Turn model labels (``app.Model``) or catalog names (``db_table``) into catalog
    names, refusing those the encrypted database does not hold."""
    out = []
    for name in names:
        table = name
        if name not in catalog.models and "." in name:
            with contextlib.suppress(LookupError, ValueError):
                table = apps.get_model(name)._meta.db_table
        if table not in catalog.models:
            known = ", ".join(sorted(catalog.models)) or "none"
            raise CommandError(
                f"the encrypted database holds no model {name!r} (it holds: {known})"
            )
        if table not in out:
            out.append(table)
    return out
