"""From a Django model to the engine's catalog entry (``ModelSpec``); ``TextIndex`` and
``TrigramIndex``.

Which indexes a model gets: every field with ``db_index=True`` or ``unique=True``, every
ForeignKey (Django indexes them by default), ``unique_together``, every
``UniqueConstraint``, everything in ``Meta.indexes`` (a full-text index for a
``TextIndex``, a trigram index per field of a ``TrigramIndex``). Functional and partial
ones index derived columns (``derived.py``). Index names are derived from the columns,
so the same definition always gives the same name and a migration can tell what
changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from django.db import models
from django.db.models.constants import LOOKUP_SEP
from django.db.models.expressions import OrderBy

from django_zerodb.compat import has_column
from django_zerodb.exceptions import NotSupportedError
from zerodb_core.api import FIELD, TEXT, TRIGRAM, UNIQUE, IndexSpec, ModelSpec

# Derived columns (functional and partial indexes, django_zerodb/derived.py): a record
# column named PREFIX + a digest of the expression and condition.
PREFIX = "~"


@dataclass(frozen=True, slots=True)
class Derived:
    """One computed value an index needs: its hidden column, the expression and the
    condition (None: always), unresolved as the model declares them."""

    column: str
    expression: Any
    condition: Any


def derived(expression: Any, condition: Any) -> Derived:
    """The derived column of ``expression`` (an ``F`` for a plain field) under
    ``condition``; an ordering (``Lower("x").desc()``) indexes its expression."""
    if isinstance(expression, OrderBy):
        expression = expression.expression
    if isinstance(expression, str):
        expression = models.F(expression)
    digest = blake2b(f"{expression!r}|{condition!r}".encode(), digest_size=5).hexdigest()
    return Derived(PREFIX + digest, expression, condition)


def is_derived(column: str) -> bool:
    """Whether a record column is a derived one (``derived.py``)."""
    return column.startswith(PREFIX)


def model_derived(model: type[models.Model]) -> tuple[Derived, ...]:
    """Every derived column the indexes and unique constraints of ``model`` need."""
    found: dict[str, Derived] = {}
    opts = model._meta
    for item in (*opts.indexes, *opts.constraints):
        for part in index_parts(model, item):
            if isinstance(part, Derived):
                found[part.column] = part
    return tuple(found.values())


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


class TrigramIndex(models.Index):
    """An encrypted trigram index of text fields, for substring search in any case.

    Serves ``contains``, ``icontains``, ``endswith``, ``iendswith``, ``iexact`` and
    ``regex``/``iregex`` with literal fragments of at least 3 characters, by candidate
    generation and an exact check (``substring.py``). One index per field listed:
    ``Meta.indexes = [TrigramIndex(fields=["bio"], name="employee_bio_trgm")]``. Its
    posting lists reveal the most of any index kind (docs/threat-model.md).
    """

    suffix = "trgm"

    def __init__(self, *, fields: Iterable[str] = (), name: str | None = None) -> None:
        fields = list(fields)
        if not fields or any(f.startswith("-") for f in fields):
            raise ValueError("TrigramIndex takes one or more fields, in ascending order")
        super().__init__(fields=fields, name=name)

    def deconstruct(self):
        _, args, kwargs = super().deconstruct()
        return "django_zerodb.indexes.TrigramIndex", args, kwargs


def index_name(kind: str, columns: Iterable[str]) -> str:
    prefix = {FIELD: "f", UNIQUE: "u", TEXT: "t", TRIGRAM: "g"}[kind]
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


def meta_index(model: type[models.Model], index: models.Index) -> list[IndexSpec]:
    """The catalog entries of one ``Meta.indexes`` item (functional and partial included;
    a trigram index of several fields is one per field)."""
    columns = _stored(index_parts(model, index))
    if isinstance(index, TrigramIndex):
        return [_spec(TRIGRAM, [column]) for column in columns]
    return [_spec(TEXT if isinstance(index, TextIndex) else FIELD, columns)]


def unique_constraint(model: type[models.Model], constraint) -> IndexSpec | None:
    """The unique index of a ``UniqueConstraint`` (None for other constraints)."""
    if not isinstance(constraint, models.UniqueConstraint):
        return None  # check constraints are checked on writes (constraints.py)
    return _spec(UNIQUE, _stored(index_parts(model, constraint)))


def index_parts(model: type[models.Model], item) -> list[str | Derived]:
    """What an index or unique constraint keys on, in order: a plain field's column, or
    a :class:`~django_zerodb.derived.Derived` value (an expression, or a field under a
    condition). Covering and operator-class options mean nothing here and are refused."""
    if not isinstance(item, models.Index | models.UniqueConstraint):
        return []
    label = f"{type(item).__name__.lower()} {item.name!r} of {model._meta.label}"
    if item.include or item.opclasses:
        raise NotSupportedError(
            f"{label}: include= and opclasses= are not supported by the encrypted database "
            "(records are read whole and keys compare as bytes); remove them"
        )
    if getattr(item, "nulls_distinct", None) is False:
        raise NotSupportedError(
            f"{label}: nulls_distinct=False is not supported by the encrypted database; "
            "NULLs repeat in unique indexes, as SQL's default"
        )
    condition = item.condition
    if isinstance(item, TextIndex | TrigramIndex) and condition is not None:
        raise NotSupportedError(f"{label}: a text or trigram index takes no condition")
    if item.expressions:
        plain = [] if condition is not None else _plain_fields(item.expressions)
        if plain:
            return _columns(model, plain)
        return [derived(e, condition) for e in item.expressions]
    names = [name.lstrip("-") for name in item.fields]
    if condition is None:
        return _columns(model, names)
    return [derived(name, condition) for name in names]


def _stored(parts: list[str | Derived]) -> list[str]:
    return [part.column if isinstance(part, Derived) else part for part in parts]


def _plain_fields(expressions: Iterable) -> list[str]:
    """``UniqueConstraint(F("a"), "b")`` names plain fields: the same as ``fields=``.
    Anything else (a function, a transform) gives no fields."""
    names = []
    for expression in expressions:
        if isinstance(expression, OrderBy):
            expression = expression.expression
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
        specs.extend(meta_index(model, index))
    for constraint in opts.constraints:
        spec = unique_constraint(model, constraint)
        if spec is not None:
            specs.append(spec)
    return ModelSpec(opts.db_table, {s.name: s for s in specs})
