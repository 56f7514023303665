"""From a Django model to the engine's catalog entry (``ModelSpec``), and ``TextIndex``.

Which indexes a model gets: every field with ``db_index=True`` or ``unique=True``, every
ForeignKey (Django indexes them by default), ``unique_together``, ``UniqueConstraint``
without a condition, everything in ``Meta.indexes``, and a full-text index for each
``TextIndex``. Index names are derived from the columns, so the same definition always
gives the same name and a migration can tell what changed.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models
from django.db.models.constants import LOOKUP_SEP

from django_zerodb.compat import has_column
from django_zerodb.exceptions import NotSupportedError
from zerodb_core.schema import FIELD, TEXT, UNIQUE, IndexSpec, ModelSpec


class TextIndex(models.Index):
    """A full-text index (BM25-ranked) on one text field.

    Used by the ``search`` lookup (``bio__search="kernel panic"``) and by
    ``ZeroManager.search()``; multiple words mean all of them, "quoted phrases" match in
    order. ``Meta.indexes = [TextIndex(fields=["bio"], name="employee_bio_text")]``.
    """

    suffix = "txt"

    def __init__(self, *, fields: Iterable[str] = (), name: str | None = None) -> None:
        fields = list(fields)
        if len(fields) != 1 or fields[0].startswith("-"):
            raise ValueError("TextIndex takes exactly one field, in ascending order")
        super().__init__(fields=fields, name=name)

    def deconstruct(self):
        _, args, kwargs = super().deconstruct()
        return "django_zerodb.indexes.TextIndex", args, kwargs


def index_name(kind: str, columns: Iterable[str]) -> str:
    prefix = {FIELD: "f", UNIQUE: "u", TEXT: "t"}[kind]
    return f"{prefix}:{','.join(columns)}"


def _spec(kind: str, columns: list[str]) -> IndexSpec:
    return IndexSpec(index_name(kind, columns), kind, tuple(columns))


def _columns(model: type[models.Model], names: Iterable[str]) -> list[str]:
    return [model._meta.get_field(name.lstrip("-")).column for name in names]


def field_indexes(field: models.Field) -> list[IndexSpec]:
    """The indexes one field asks for by itself."""
    if not has_column(field) or field.primary_key:
        return []
    if field.unique:
        return [_spec(UNIQUE, [field.column])]
    if field.db_index:
        return [_spec(FIELD, [field.column])]
    return []


def meta_index(model: type[models.Model], index: models.Index) -> IndexSpec:
    if index.expressions or index.condition is not None or index.include:
        raise NotSupportedError(
            f"index {index.name!r} of {model._meta.label}: expression, partial and covering "
            "indexes are not supported by the encrypted database; index plain fields"
        )
    kind = TEXT if isinstance(index, TextIndex) else FIELD
    return _spec(kind, _columns(model, index.fields))


def unique_constraint(model: type[models.Model], constraint) -> IndexSpec | None:
    if not isinstance(constraint, models.UniqueConstraint):
        return None  # check constraints are validated by Django's model validation only
    fields = list(constraint.fields) or _plain_fields(constraint.expressions)
    if constraint.condition is not None or constraint.include or not fields:
        raise NotSupportedError(
            f"constraint {constraint.name!r} of {model._meta.label}: conditional or "
            "expression unique constraints are not supported by the encrypted database; "
            "use a plain UniqueConstraint(fields=[...])"
        )
    return _spec(UNIQUE, _columns(model, fields))


def _plain_fields(expressions: Iterable) -> list[str]:
    """``UniqueConstraint(F("a"), "b")`` names plain fields: the same as ``fields=``.
    Anything else (a function, an ordering, a transform) gives no fields."""
    names = []
    for expression in expressions:
        if type(expression) is not models.F or LOOKUP_SEP in expression.name:
            return []
        names.append(expression.name)
    return names


def model_spec(model: type[models.Model]) -> ModelSpec:
    """The catalog entry for a Django model: its table name and every index it needs."""
    opts = model._meta
    specs: list[IndexSpec] = []
    for field in opts.local_concrete_fields:
        specs.extend(field_indexes(field))
    for fields in opts.unique_together:
        specs.append(_spec(UNIQUE, _columns(model, fields)))
    for index in opts.indexes:
        specs.append(meta_index(model, index))
    for constraint in opts.constraints:
        spec = unique_constraint(model, constraint)
        if spec is not None:
            specs.append(spec)
    return ModelSpec(opts.db_table, {s.name: s for s in specs})
