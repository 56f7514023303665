"""The JSON query language of ``POST <resource>/query/``, translated to ``Q`` objects.

In the spirit of ZeroDB's MongoDB-style API::

    {"filter": {"salary": {"$gte": 195000, "$lte": 200000}, "first_name": "John"},
     "order_by": ["-salary"], "limit": 20, "offset": 0}

``filter`` maps field names to conditions; several entries must all hold.

* A bare value means ``$eq``; ``null`` matches NULL (``{"salary": null}``).
* ``{"$eq": v}``, ``{"$ne": v}``, ``{"$lt": v}``, ``{"$lte": v}``, ``{"$gt": v}``,
  ``{"$gte": v}``; ``{"$in": [v, ...]}``, ``{"$nin": [v, ...]}``; ``{"$range": [low,
  high]}`` (both ends included); ``{"$text": "words \\"a phrase\\""}`` on a field with a
  ``TextIndex``; ``{"$icontains": "text"}``, ``{"$istartswith": "text"}`` on text fields
  (in any case; served by a ``TrigramIndex`` or a ``Lower`` index of the field when it
  has one); ``{"$not": <condition>}``. Several operators on one field must all hold.
* ``{"$and": [<filter>, ...]}``, ``{"$or": [<filter>, ...]}``, ``{"$not": <filter>}``
  combine whole filters; ``{"$text": "..."}`` at filter level searches the model's
  ``TextIndex`` field.

The ``Q`` objects are what ``QuerySet.filter()`` would get from hand-written code, so
the backend's planner serves them from the indexes in the same way (equality, ranges,
``in``, ``isnull`` and ``search`` on indexed fields; the rest is checked on decrypted
rows, see docs/known-issues.md).

Validation is strict, and every problem is a ``BadQuery`` (400) naming the JSON path of
the offending part: unknown members, fields that are not in the allow-list, unknown
operators, values of the wrong JSON type or that the model field's ``to_python()``
refuses, and the limits below. Subclass ``QueryParser`` to change them.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured, ValidationError
from django.db import models
from django.db.models import Q
from django.utils.timezone import is_naive, make_aware

from django_zerodb.rest.exceptions import BadQuery, join
from django_zerodb.rest.indexing import has_text_index, text_field

COMPARISONS = {"$lt": "lt", "$lte": "lte", "$gt": "gt", "$gte": "gte"}
# Case-insensitive patterns of text fields: served by a Lower index ($istartswith) or a
# TrigramIndex ($icontains) when the field has one, else checked on decrypted rows.
PATTERNS = {"$icontains": "icontains", "$istartswith": "istartswith"}
FIELD_OPERATORS = frozenset(
    {"$eq", "$ne", *COMPARISONS, *PATTERNS, "$in", "$nin", "$range", "$text", "$not"}
)
FILTER_OPERATORS = frozenset({"$and", "$or", "$not", "$text"})
MEMBERS = ("filter", "order_by", "limit", "offset")
POSITIVE = (
    models.PositiveIntegerField,
    models.PositiveSmallIntegerField,
    models.PositiveBigIntegerField,
)


@dataclasses.dataclass(frozen=True)
class ParsedQuery:
    """A validated query: ``queryset.filter(q).order_by(*order_by)[offset:offset+limit]``.

    ``ranked`` is true when a full-text condition must hold for every result and no
    ``order_by`` was given: the results then come in rank order (best match first).
    ``distinct`` is true when the filter follows a many-valued relation (a
    ``ManyToManyField``, a reverse foreign key), which would repeat objects."""

    q: Q
    order_by: tuple[str, ...]
    limit: int
    offset: int
    ranked: bool
    distinct: bool = False


@dataclasses.dataclass
class _State:
    conditions: int = 0
    fields: set[str] = dataclasses.field(default_factory=set)


class QueryParser:
    """Parses and validates a query body for one model.

    ``fields`` maps the names a client may use to ORM paths (``{"surname": "last_name",
    "department_name": "department__name"}``); nothing outside it can be filtered or
    ordered on. ``search_field`` is the field a filter-level ``$text`` searches (the
    model's only ``TextIndex`` field by default); it must be one of ``fields``' paths.
    """

    max_limit = 100  # the largest "limit"; also the default when "limit" is absent
    max_offset = 10_000  # deep offsets read every skipped row: use cursors beyond this
    max_depth = 4  # nesting of $and / $or / $not
    max_conditions = 32  # operator applications in one filter (a bare value is one)
    max_list_length = 1000  # values of one $in / $nin
    max_order_by = 3  # fields in order_by
    max_body_size = 16 * 1024  # bytes of the request body (checked by the view)

    def __init__(
        self,
        model: type[models.Model],
        fields: Mapping[str, str],
        *,
        search_field: str | None = None,
    ) -> None:
        self.model = model
        self.fields = dict(fields)
        self.search_field = search_field  # for {"$text": ...}: None, the one TextIndex
        self._resolved: dict[str, models.Field] = {}
        for name, orm_path in self.fields.items():
            self._resolved[name] = resolve(model, orm_path)

    def field(self, name: str) -> models.Field:
        """The model field that ``name`` (a key of ``fields``) ends on."""
        return self._resolved[name]

    # -- the body --------------------------------------------------------------------------

    def parse(self, body: Any) -> ParsedQuery:
        if not isinstance(body, dict):
            raise BadQuery(f"the body must be a JSON object, not {json_type(body)}", "")
        for key in body:
            if key not in MEMBERS:
                raise BadQuery(
                    f"unknown member {key!r}: expected {', '.join(MEMBERS)}", join("", key)
                )
        state = _State()
        node = body.get("filter", {})
        if not isinstance(node, dict):
            raise BadQuery(f"filter must be an object, not {json_type(node)}", "filter")
        q = self.parse_filter(node, "filter", 0, state)
        order_by = self.parse_order_by(body.get("order_by", []), "order_by")
        limit = self.parse_int(body.get("limit", self.max_limit), "limit", self.max_limit)
        offset = self.parse_int(body.get("offset", 0), "offset", self.max_offset)
        ranked = not order_by and self.is_ranked(node)
        distinct = any(spawns_duplicates(self.model, self.fields[f]) for f in state.fields)
        return ParsedQuery(q, order_by, limit, offset, ranked, distinct)

    def parse_int(self, value: Any, path: str, maximum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadQuery(f"{path} must be an integer, not {json_type(value)}", path)
        if not 0 <= value <= maximum:
            raise BadQuery(f"{path} must be between 0 and {maximum}", path)
        return value

    def parse_order_by(self, value: Any, path: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise BadQuery(
                f'order_by must be a list of field names ("name" or "-name"), not '
                f"{json_type(value)}",
                path,
            )
        if len(value) > self.max_order_by:
            raise BadQuery(f"order_by takes at most {self.max_order_by} fields", path)
        result = []
        for i, item in enumerate(value):
            item_path = join(path, i)
            if not isinstance(item, str):
                raise BadQuery(f"expected a field name, not {json_type(item)}", item_path)
            name = item.removeprefix("-")
            if name not in self.fields:
                raise BadQuery(f"unknown field {name!r}", item_path)
            result.append(("-" if item.startswith("-") else "") + self.fields[name])
        return tuple(result)

    # -- filters ---------------------------------------------------------------------------

    def parse_filter(self, node: Any, path: str, depth: int, state: _State) -> Q:
        """A filter object: every entry must hold."""
        if not isinstance(node, dict):
            raise BadQuery(f"expected a filter object, not {json_type(node)}", path)
        q = Q()
        for key, value in node.items():
            key_path = join(path, key)
            if key.startswith("$"):
                q &= self.parse_filter_operator(key, value, key_path, depth, state)
            elif key in self.fields:
                q &= self.parse_condition(key, value, key_path, depth, state)
            else:
                raise BadQuery(f"unknown field {key!r}", key_path)
        return q

    def parse_filter_operator(self, op: str, value: Any, path: str, depth: int, state) -> Q:
        if op not in FILTER_OPERATORS:
            hint = " (a field operator: put it inside a field)" if op in FIELD_OPERATORS else ""
            raise BadQuery(
                f"unknown operator {op!r}{hint}; filters take "
                f"{', '.join(sorted(FILTER_OPERATORS))} and field names",
                path,
            )
        if op == "$text":
            return self.text_condition(None, value, path, state)
        self.check_depth(depth + 1, path)
        if op == "$not":
            return ~self.parse_filter(value, path, depth + 1, state)
        if not isinstance(value, list) or not value:
            raise BadQuery(f"{op} takes a non-empty list of filters", path)
        parts = [self.parse_filter(f, join(path, i), depth + 1, state) for i, f in enumerate(value)]
        combined = parts[0]
        for part in parts[1:]:
            combined = (combined & part) if op == "$and" else (combined | part)
        return combined

    def parse_condition(self, name: str, value: Any, path: str, depth: int, state) -> Q:
        """The condition on field ``name``: a bare value or an object of operators."""
        if isinstance(value, list):
            raise BadQuery("a list needs an operator: $in, $nin or $range", path)
        if not isinstance(value, dict):
            return self.operator(name, "$eq", value, path, state)
        if not value:
            raise BadQuery("empty condition: give a value or operators", path)
        q = Q()
        for op, operand in value.items():
            op_path = join(path, op)
            if op not in FIELD_OPERATORS:
                raise BadQuery(
                    f"unknown operator {op!r}; fields take {', '.join(sorted(FIELD_OPERATORS))}",
                    op_path,
                )
            if op == "$not":
                self.check_depth(depth + 1, op_path)
                q &= ~self.parse_condition(name, operand, op_path, depth + 1, state)
            else:
                q &= self.operator(name, op, operand, op_path, state)
        return q

    def operator(self, name: str, op: str, value: Any, path: str, state: _State) -> Q:
        """One operator applied to field ``name`` (a key of ``self.fields``)."""
        self.count_condition(path, state)
        state.fields.add(name)
        if op == "$text":
            return self.text_condition(name, value, path, state, counted=True)
        orm_path = self.fields[name]
        field = self._resolved[name]
        if op in ("$eq", "$ne"):
            q = Q(**{orm_path: self.value(field, value, path, allow_null=True)})
            return ~q if op == "$ne" else q
        if op in COMPARISONS:
            return Q(**{f"{orm_path}__{COMPARISONS[op]}": self.value(field, value, path)})
        if op in PATTERNS:
            if not isinstance(target_field(field), models.CharField | models.TextField):
                raise BadQuery(f"{op} applies to text fields only", path)
            if not isinstance(value, str) or not value:
                raise BadQuery(f"{op} takes a non-empty string", path)
            return Q(**{f"{orm_path}__{PATTERNS[op]}": value})
        if op in ("$in", "$nin"):
            values = self.values(field, value, path, op)
            q = Q(**{f"{orm_path}__in": values})
            return ~q if op == "$nin" else q
        # $range
        if not isinstance(value, list) or len(value) != 2:
            raise BadQuery("$range takes a list of two values: [low, high]", path)
        low, high = (self.value(field, v, join(path, i)) for i, v in enumerate(value))
        return Q(**{f"{orm_path}__range": (low, high)})

    def search_path(self) -> str:
        """The field a filter-level ``{"$text": ...}`` searches; LookupError when there is
        none here (no TextIndex, or its field is not one of ``fields``)."""
        orm_path = self.search_field or text_field(self.model)
        if orm_path not in self.fields.values():
            raise LookupError(f"the text field {orm_path!r} is not queryable here")
        return orm_path

    def searchable(self) -> bool:
        """Whether a filter-level ``{"$text": ...}`` can be answered here."""
        try:
            self.search_path()
        except LookupError:
            return False
        return True

    def text_condition(self, name: str | None, value: Any, path: str, state, counted=False) -> Q:
        """Full-text search on field ``name``, or on the model's TextIndex field."""
        if not counted:
            self.count_condition(path, state)
        if name is None:
            try:
                orm_path = self.search_path()
            except LookupError as exc:
                raise BadQuery(str(exc), path) from None
        else:
            orm_path = self.fields[name]
            if not has_text_index(self._resolved[name]):
                raise BadQuery(f"{name!r} has no full-text index (TextIndex)", path)
        if not isinstance(value, str):
            raise BadQuery(f"$text takes a string, not {json_type(value)}", path)
        text = value.strip()
        if not text:
            raise BadQuery("$text needs at least one word", path)
        return Q(**{f"{orm_path}__search": text})

    # -- values ----------------------------------------------------------------------------

    def values(self, field: models.Field, value: Any, path: str, op: str) -> list:
        if not isinstance(value, list):
            raise BadQuery(f"{op} takes a list of values, not {json_type(value)}", path)
        if len(value) > self.max_list_length:
            raise BadQuery(f"{op} takes at most {self.max_list_length} values", path)
        return [self.value(field, v, join(path, i)) for i, v in enumerate(value)]

    def value(self, field: models.Field, value: Any, path: str, allow_null=False) -> Any:
        """``value`` as ``field`` holds it: the JSON type must suit the field, then the
        field's ``to_python()`` must accept it."""
        if value is None:
            if allow_null:
                return None
            raise BadQuery('null is not allowed here (use {"$eq": null})', path)
        target = target_field(field)
        expected = self.json_types(target)
        if isinstance(value, dict | list) or not isinstance(value, expected):
            names = sorted({JSON_NAMES[t] for t in expected})
            raise BadQuery(
                f"expected {' or '.join(names)} for {field.name!r}, not {json_type(value)}",
                path,
            )
        if isinstance(value, bool) and bool not in expected:
            raise BadQuery(f"expected a number for {field.name!r}, not a boolean", path)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise BadQuery("numbers must be finite", path)
            if isinstance(target, models.IntegerField) and not value.is_integer():
                raise BadQuery(f"expected an integer for {field.name!r}", path)
        try:
            result = target.to_python(value)
            for validator in self.validators(target):
                validator(result)
        except ValidationError as exc:
            raise BadQuery(
                f"invalid value for {field.name!r}: {'; '.join(exc.messages)}", path
            ) from None
        if isinstance(result, datetime.datetime) and settings.USE_TZ and is_naive(result):
            result = make_aware(result)  # in the current time zone, as forms do
        return result

    def json_types(self, field: models.Field) -> tuple[type, ...]:
        """The JSON types a value for ``field`` may have (before ``to_python()``)."""
        if isinstance(field, models.BooleanField):
            return (bool,)
        if isinstance(field, models.IntegerField):  # AutoFields included
            return (int, float)
        if isinstance(field, models.FloatField):
            return (int, float)
        if isinstance(field, models.DecimalField):
            return (int, float, str)
        return (str,)

    def validators(self, field: models.Field) -> list[Callable[[Any], None]]:
        """Checks on the coerced value: the integer range of integer fields (an
        out-of-range number matches nothing, and is a client mistake)."""
        if isinstance(field, models.IntegerField):
            low, high = -(2**63), 2**63 - 1
            if isinstance(field, POSITIVE):
                low = 0

            def in_range(v, low=low, high=high):
                if not low <= v <= high:
                    raise ValidationError(f"{v} is out of range [{low}, {high}]")

            return [in_range]
        return []

    # -- limits and helpers ----------------------------------------------------------------

    def check_depth(self, depth: int, path: str) -> None:
        if depth > self.max_depth:
            raise BadQuery(f"filters nest at most {self.max_depth} levels deep", path)

    def count_condition(self, path: str, state: _State) -> None:
        state.conditions += 1
        if state.conditions > self.max_conditions:
            raise BadQuery(f"a filter takes at most {self.max_conditions} conditions", path)

    def is_ranked(self, node: dict) -> bool:
        """Whether a ``$text`` on the model's own fields must hold for every result."""
        return any(self._ranks(key, value) for key, value in node.items())

    def _ranks(self, key: str, value: Any) -> bool:
        if key == "$text":
            return True
        if key == "$and":
            return any(isinstance(f, dict) and self.is_ranked(f) for f in value)
        local = key in self.fields and "__" not in self.fields[key]
        return local and isinstance(value, dict) and "$text" in value


def resolve(model: type[models.Model], orm_path: str) -> models.Field:
    """The field ``orm_path`` (``"salary"``, ``"department__name"``) ends on;
    ``ImproperlyConfigured`` when it is not a chain of relations ending on a field."""
    field = None
    current = model
    for part in orm_path.split("__"):
        if current is None:
            raise ImproperlyConfigured(f"query field {orm_path!r}: {part!r} follows a non-relation")
        try:
            field = current._meta.pk if part == "pk" else current._meta.get_field(part)
        except FieldDoesNotExist:
            raise ImproperlyConfigured(
                f"query field {orm_path!r}: {current._meta.label} has no field {part!r}"
            ) from None
        current = field.related_model if field.is_relation else None
    return field


def spawns_duplicates(model: type[models.Model], orm_path: str) -> bool:
    """Whether filtering on ``orm_path`` follows a many-valued relation."""
    current = model
    for part in orm_path.split("__"):
        if current is None or part == "pk":
            return False
        field = current._meta.get_field(part)
        if field.many_to_many or field.one_to_many:
            return True
        current = field.related_model if field.is_relation else None
    return False


def target_field(field: models.Field) -> models.Field:
    """The field whose values a condition on ``field`` compares: the pk of the related
    model for relations."""
    if field.is_relation:
        if getattr(field, "target_field", None) is not None and field.concrete:
            return field.target_field
        return field.related_model._meta.pk
    return field


JSON_NAMES = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
