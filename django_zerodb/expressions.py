"""Python implementations of your own functions, lookups and aggregates.

The encrypted database has no SQL engine: the app server evaluates every expression of
a query in Python, on decrypted rows. It knows Django's own functions, lookups and
aggregates (``docs/known-issues.md`` lists them); any other class is refused with
``NotSupportedError``, including a subclass of a known class that changes its SQL, since
its meaning is then in SQL this backend never runs. :func:`register` gives such a class
its meaning in Python::

    class Haversine(Func):
        function = "HAVERSINE"
        output_field = FloatField()

    @expressions.register(Haversine)
    def haversine(lat1, lon1, lat2, lon2):
        ...

*Why a registry and not a method on the class* (django-mongodb-backend's ``as_mql``):
Django calls ``as_<vendor>`` methods itself, and this backend's vendor is ``zerodb``, so
an ``as_zerodb`` method would be taken for the SQL of the expression; a registry also
works for classes you do not own.

Arguments are values as the database stores them: datetimes naive in UTC when
``USE_TZ`` is on, durations as integer microseconds, decimals as ``Decimal``, JSON as its
text. The result is taken as such a value too (Django's converters for the expression's
``output_field`` run afterwards, as on any backend).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db.models import Aggregate, Lookup
from django.db.models.expressions import BaseExpression

from django_zerodb.registry import AGGREGATES, LOOKUPS, VALUES

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["register", "unregister"]


class UserLookup:
    """A lookup evaluated by a registered function ``fn(lhs, rhs) -> bool | None``."""

    def __init__(self, fn: Callable[[Any, Any], bool | None], strict: bool) -> None:
        self.fn = fn
        self.strict = strict

    def test(self, lhs: Any, rhs: Any) -> bool | None:
        if self.strict and (lhs is None or rhs is None):
            return None
        result = self.fn(lhs, rhs)
        return None if result is None else bool(result)


def register(klass: type, *, strict: bool = True) -> Callable[[F], F]:
    """Evaluate instances of ``klass`` with the decorated function (returned unchanged).

    * a ``Func`` or ``Transform`` subclass: ``fn(*args)`` gets the values of the
      source expressions, in order, and returns the value;
    * a ``Lookup`` subclass: ``fn(lhs, rhs)`` returns True, False or None (unknown);
    * an ``Aggregate`` subclass: ``fn(values)`` gets the list of the group's values of
      the first source expression, NULLs left out, after ``filter=`` and ``distinct=``.

    ``strict`` (the default) is SQL's rule for functions and comparisons: the result is
    NULL, without calling ``fn``, when an argument is NULL (for an aggregate: when no
    value is left). A subclass of ``klass`` uses the same function unless it changes
    its SQL (``as_sql``, ``template``, ``function``...). Registering again replaces.
    """
    if not isinstance(klass, type) or not issubclass(klass, BaseExpression):
        raise TypeError(f"register() takes an expression class, not {klass!r}")

    def decorate(fn: F) -> F:
        if issubclass(klass, Lookup):
            LOOKUPS.add(klass, UserLookup(fn, strict))
        elif issubclass(klass, Aggregate):
            AGGREGATES.add(klass, _aggregate(fn, strict))
        else:
            VALUES.add(klass, _function(fn, strict))
        return fn

    return decorate


def unregister(klass: type) -> None:
    """Forget the implementation registered for ``klass`` (it is refused again)."""
    for registry in (VALUES, LOOKUPS, AGGREGATES):
        registry.remove(klass)


def _function(fn: Callable[..., Any], strict: bool) -> Callable[..., Any]:
    def handler(ev: Any, expr: Any, row: dict) -> Any:
        args = [ev.value(e, row) for e in expr.get_source_expressions()]
        if strict and any(a is None for a in args):
            return None
        return fn(*args)

    return handler


def _aggregate(fn: Callable[[list], Any], strict: bool) -> Callable[[Any, list, Any], Any]:
    def compute(agg: Any, values: list, ev: Any) -> Any:
        if strict and not values:
            return None
        return fn(values)

    return compute
