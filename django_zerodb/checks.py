"""System checks: a misconfigured encrypted database fails at startup, not in a query."""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_zerodb.store import store_settings


def check_databases(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for alias, entry in settings.DATABASES.items():
        if entry.get("ENGINE") != "django_zerodb":
            continue
        try:
            store_settings(entry)
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(str(exc), id="django_zerodb.E001", obj=f"DATABASES[{alias!r}]")
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


def register() -> None:
    checks.register(check_databases)
