"""The ``search`` lookup: full-text search served by a ``TextIndex``.

``Employee.objects.filter(bio__search="kernel panic")``: every word must occur; "quoted
phrases" must occur in order. The compiler translates it to the engine's full-text scan;
on other databases it refuses, since only this backend has the index.
"""

from __future__ import annotations

from django.db.models import CharField, Lookup, TextField

from django_zerodb.exceptions import NotSupportedError


class Search(Lookup):
    lookup_name = "search"
    prepare_rhs = False

    def as_sql(self, compiler, connection):
        raise NotSupportedError(
            "the 'search' lookup needs the encrypted database (django_zerodb) and a "
            "TextIndex on the field"
        )


def register() -> None:
    CharField.register_lookup(Search)
    TextField.register_lookup(Search)
