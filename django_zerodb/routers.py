"""``ZeroDBRouter``: the apps in ``settings.ZERODB_APPS`` live in the encrypted database.

Reads and writes of their models go to the first database whose ENGINE is
``django_zerodb`` (or ``settings.ZERODB_DATABASE``); everything else stays where it
was. Relations may not cross between the two, since no query can join an encrypted table
with a plaintext one; migrations of those apps run only on the encrypted database.

The apps in ``settings.ZERODB_SHARED_APPS`` are migrated on every database, the encrypted
one included, and not routed: their queries pick a database with ``.using(alias)``. The
differential test (``tests/django/difftest``) keeps the same models in SQLite and in the
encrypted database this way.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connections


def encrypted_alias() -> str:
    """The alias of the encrypted database."""
    alias = getattr(settings, "ZERODB_DATABASE", None)
    if alias:
        return alias
    for name, entry in settings.DATABASES.items():
        if entry.get("ENGINE") == "django_zerodb":
            return name
    raise LookupError("no database in settings.DATABASES has ENGINE 'django_zerodb'")


def _encrypted_app(app_label: str) -> bool:
    return app_label in getattr(settings, "ZERODB_APPS", ())


def _shared_app(app_label: str) -> bool:
    return app_label in getattr(settings, "ZERODB_SHARED_APPS", ())


class ZeroDBRouter:
    def db_for_read(self, model, **hints):
        """The encrypted database, or the encrypted database an instance came from
        (``obj.delete()``, related managers of an object read with ``.using(...)``)."""
        if not _encrypted_app(model._meta.app_label):
            return None
        instance = hints.get("instance")
        db = getattr(getattr(instance, "_state", None), "db", None)
        if db is not None and connections[db].vendor == "zerodb":
            return db
        return encrypted_alias()

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        a = _encrypted_app(obj1._meta.app_label)
        b = _encrypted_app(obj2._meta.app_label)
        return None if a == b else False

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        encrypted_db = connections[db].vendor == "zerodb"
        if _shared_app(app_label):
            return True
        if _encrypted_app(app_label):
            return db == encrypted_alias()
        return False if encrypted_db else None
