"""``ZeroManager``: the manager of encrypted models, with the store's extras.

* ``Employee.objects.search("kernel panic")``: ranked full-text search (BM25) on the
  model's ``TextIndex``; the best matches come first unless you order otherwise.
* ``str(queryset.query)`` shows the engine plan instead of SQL (there is none).
* ``queryset.explain()`` shows the plan, the indexes read, the estimated rows and the
  round trips the query took.
"""

from __future__ import annotations

from django.db import models
from django.db.models.sql import Query

from django_zerodb.exceptions import NotSupportedError
from django_zerodb.indexes import TextIndex


class PlanQuery(Query):
    """A Query whose ``str()`` is the plan on the encrypted database."""

    def sql_with_params(self):
        from django_zerodb.routers import encrypted_alias

        return self.get_compiler(encrypted_alias()).as_sql()


class ZeroQuerySet(models.QuerySet):
    def __init__(self, model=None, query=None, using=None, hints=None):
        super().__init__(model, query or PlanQuery(model), using, hints)

    def search(self, text: str, field: str | None = None) -> ZeroQuerySet:
        """Objects whose text field holds every word (and "quoted phrase") of ``text``,
        best BM25 match first."""
        field = field or _text_field(self.model)
        return self.filter(**{f"{field}__search": text}).order_by()


def _text_field(model) -> str:
    fields = [index.fields[0] for index in model._meta.indexes if isinstance(index, TextIndex)]
    if len(fields) != 1:
        raise NotSupportedError(
            f"{model._meta.label} has {len(fields)} TextIndex fields: pass field=... to "
            "search(), or add Meta.indexes = [TextIndex(fields=[...], name=...)]"
        )
    return fields[0]


class ZeroManager(models.Manager.from_queryset(ZeroQuerySet)):
    """The default manager for encrypted models (``objects = ZeroManager()``)."""
