"""System checks: a misconfigured encrypted database fails at startup, not in a query."""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

from django_zerodb.freshness import TABLE, default_database_problem, migrated
from django_zerodb.store import store_settings


def check_databases(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for alias, entry in settings.DATABASES.items():
        if entry.get("ENGINE") != "django_zerodb":
            continue
        try:
            params = store_settings(entry)
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(str(exc), id="django_zerodb.E001", obj=f"DATABASES[{alias!r}]")
            )
            continue
        problem = _freshness_problem(params)
        if problem is not None:
            errors.append(
                checks.Warning(
                    f"{problem}: the highest root seen of this encrypted database is kept "
                    "in memory only, so a store rolled back while no process runs goes "
                    "unnoticed",
                    hint="set OPTIONS['FRESHNESS'] to 'file' (with FRESHNESS_PATH), or give "
                    "the project a plaintext 'default' database",
                    id="django_zerodb.W002",
                    obj=f"DATABASES[{alias!r}]",
                )
            )
    routers = getattr(settings, "DATABASE_ROUTERS", [])
    if (
        getattr(settings, "ZERODB_APPS", None)
        and "django_zerodb.routers.ZeroDBRouter" not in routers
    ):
        errors.append(
            checks.Warning(
                "ZERODB_APPS is set but DATABASE_ROUTERS lacks "
                "'django_zerodb.routers.ZeroDBRouter': those apps' models would go to the "
                "default (plaintext) database",
                id="django_zerodb.W001",
            )
        )
    return errors


def _freshness_problem(params: dict) -> str | None:
    if params["freshness"] != "default" or params["store"].startswith("memory://"):
        return None
    return default_database_problem()


def check_freshness_table(app_configs=None, databases=None, **kwargs) -> list:
    """``FRESHNESS='default'`` needs the ``SeenRoot`` table in the default database
    (a database check: ``migrate`` and ``check --database default`` run it)."""
    if not databases or DEFAULT_DB_ALIAS not in databases:
        return []
    users = []
    for alias, entry in settings.DATABASES.items():
        if entry.get("ENGINE") != "django_zerodb":
            continue
        try:
            params = store_settings(entry)
        except ImproperlyConfigured:
            continue
        if params["freshness"] == "default" and not params["store"].startswith("memory://"):
            users.append(alias)
    if not users or default_database_problem() is not None:
        return []
    try:
        tables = connections[DEFAULT_DB_ALIAS].introspection.table_names()
    except Exception as exc:  # unreachable: the engine falls back the same way
        tables, reason = [], f"cannot be read ({exc})"
    else:
        reason = "does not exist yet"
    if TABLE in tables or not migrated(DEFAULT_DB_ALIAS):
        # Not migrated yet: `migrate` (which runs this check first) is what creates the
        # table, and Django itself reports unapplied migrations; no second warning.
        return []
    return [
        checks.Warning(
            f"the table {TABLE} of the default database {reason}: until `migrate` "
            f"creates it, the highest root seen of {', '.join(users)} is kept in memory "
            "only (a store rolled back while no process runs goes unnoticed)",
            hint="run `manage.py migrate django_zerodb` on the default database",
            id="django_zerodb.W003",
        )
    ]


def register() -> None:
    checks.register(check_databases)
    checks.register(check_freshness_table, checks.Tags.database)
