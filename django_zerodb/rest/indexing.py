"""What the encrypted database serves from its indexes, as the REST layer needs to know.

The source of truth is the model's catalog entry, ``django_zerodb.indexes.model_spec``:
a field is *sortable* from an index when it is the primary key or has a single-field
ordered index (``db_index=True``, ``unique=True``, a ``ForeignKey``, or a one-field
``Meta.indexes`` entry); it is *searchable* when a ``TextIndex`` covers it.
"""

from __future__ import annotations

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models.lookups import Lookup
from django.db.models.sql.where import AND, WhereNode

from django_zerodb.compat import has_column
from django_zerodb.indexes import TextIndex, model_spec

# Lookups the index planner answers from an ordered index (docs/known-issues.md).
INDEXED_LOOKUPS = frozenset(
    {"exact", "in", "gt", "gte", "lt", "lte", "range", "isnull", "startswith"}
)


def text_fields(model: type[models.Model]) -> list[str]:
    """The names of the fields of ``model`` that have a ``TextIndex``."""
    return [index.fields[0] for index in model._meta.indexes if isinstance(index, TextIndex)]


def text_field(model: type[models.Model]) -> str:
    """The one ``TextIndex`` field of ``model``; ``LookupError`` (with a message for the
    client) when it has none or several."""
    fields = text_fields(model)
    if not fields:
        raise LookupError(f"{model._meta.object_name} has no full-text index (TextIndex)")
    if len(fields) > 1:
        raise LookupError(
            f"{model._meta.object_name} has several full-text indexes ({', '.join(fields)}): "
            "search one field"
        )
    return fields[0]


def has_text_index(field: models.Field) -> bool:
    """Whether ``field`` (of its own model) is covered by a ``TextIndex``."""
    model = getattr(field, "model", None)
    return model is not None and field.concrete and field.name in text_fields(model)


def model_field(model: type[models.Model], name: str) -> models.Field | None:
    """The concrete field ``name`` (or ``"pk"``) of ``model``, or None."""
    if name == "pk":
        return model._meta.pk
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    return field if has_column(field) else None


def is_sortable(model: type[models.Model], name: str) -> bool:
    """Whether the engine orders ``model`` by ``name`` (``-`` allowed) from an index."""
    field = model_field(model, name.removeprefix("-"))
    if field is None:
        return False
    if field.primary_key:
        return True
    return model_spec(model).ordered_index_for(field.column) is not None


def is_ranked(queryset: models.QuerySet) -> bool:
    """Whether ``queryset`` comes in full-text rank order: it has no ordering at all and
    a ``search`` lookup among the conditions that all rows must meet."""
    return not queryset.ordered and _has_search(queryset.query.where)


def _has_search(node: WhereNode) -> bool:
    if node.negated or (node.connector != AND and len(node.children) > 1):
        return False
    for child in node.children:
        if isinstance(child, WhereNode) and _has_search(child):
            return True
        if isinstance(child, Lookup) and child.lookup_name == "search":
            return True
    return False
