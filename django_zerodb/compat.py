"""What differs between the supported Django versions (5.2 LTS, 6.0 and 6.1), in one place.

The evaluator dispatches on Django's real classes (``registry.py``), and newer Django
versions add classes: a name is exposed here as Django's class, or None where the
running Django has no such class. ``Registry.add`` skips None, so no implementation is
registered for a class that cannot appear in a query (and nothing is registered under a
look-alike).

- Django 6.0 added the generic ``StringAgg`` (with its ``StringAggDelimiter``) and the
  wrapper expressions an aggregate's ``filter=`` and ``order_by=`` become
  (``AggregateFilter``, ``AggregateOrderBy``). Django 5.2 keeps ``filter=`` as a
  resolved ``Q`` (a ``WhereNode``, evaluated as such) and has no ``order_by=`` on
  its own aggregates.
- Django 5.2 calls a ``ManyToManyField`` *concrete* (it has a ``column`` of its name,
  though no table holds it); Django 6.0 and 6.1 do not. :func:`has_column` answers the
  question the backend asks, the same on all three.
- Django 6.1 added ``BitAnd``, ``BitOr``, ``BitXor``, ``JSONNull``, the ``UUID4`` and
  ``UUID7`` functions (the ``supports_uuid*`` features follow them) and the deprecation of
  ``json_field=None`` meaning JSON's null (:data:`JSON_NONE_DEPRECATION`).
"""

from __future__ import annotations

from typing import Any

from django.db.models import aggregates, expressions, functions
from django.utils import deprecation

__all__ = [
    "JSON_NONE_DEPRECATION",
    "UUID4",
    "UUID7",
    "AggregateFilter",
    "AggregateOrderBy",
    "BitAnd",
    "BitOr",
    "BitXor",
    "JSONNull",
    "StringAgg",
    "StringAggDelimiter",
    "has_column",
]

# Django 6.0.
AggregateFilter: type | None = getattr(aggregates, "AggregateFilter", None)
AggregateOrderBy: type | None = getattr(aggregates, "AggregateOrderBy", None)
StringAgg: type | None = getattr(aggregates, "StringAgg", None)
StringAggDelimiter: type | None = getattr(aggregates, "StringAggDelimiter", None)

# Django 6.1.
BitAnd: type | None = getattr(aggregates, "BitAnd", None)
BitOr: type | None = getattr(aggregates, "BitOr", None)
BitXor: type | None = getattr(aggregates, "BitXor", None)
JSONNull: type | None = getattr(expressions, "JSONNull", None)
UUID4: type | None = getattr(functions, "UUID4", None)
UUID7: type | None = getattr(functions, "UUID7", None)
# The warning Django 6.1 gives for ``json_field=None`` (still JSON's null), which came
# with JSONNull; older versions give none (6.0 has the warning class, for other
# deprecations), so neither does this backend there.
JSON_NONE_DEPRECATION: type[Warning] | None = (
    None if JSONNull is None else deprecation.RemovedInDjango2028Warning
)


def has_column(field: Any) -> bool:
    """Whether ``field`` is stored in a column of its model's table (``field.concrete``
    from Django 6.0: a many-to-many field is not, on every supported version)."""
    return field.concrete and not field.many_to_many
