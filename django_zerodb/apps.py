"""App config: registers the ``search`` lookup and the system checks."""

from __future__ import annotations

from django.apps import AppConfig


class ZeroDBConfig(AppConfig):
    name = "django_zerodb"
    verbose_name = "Encrypted store (ZeroDB)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_zerodb import checks, lookups

        lookups.register()
        checks.register()
