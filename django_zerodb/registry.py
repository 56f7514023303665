"""Dispatch on real classes: which Python implementation evaluates a Django expression,
lookup or aggregate, or a refusal that names it.

The backend evaluates Django's query objects in Python, so it must know what each one
*means*. A class is known by identity, never by its name: a user's ``class Now(Func)``
with another template is not Django's ``Now``. A subclass of a known class is evaluated
as its parent only when it cannot mean anything else, that is when it changes nothing of
how the parent is compiled to SQL: no ``as_sql``/``as_<vendor>`` method, no
``template``/``function``/``arg_joiner`` (and, for lookups, none of the methods that build
the right-hand side). Anything else is refused with ``NotSupportedError`` naming the
class and the way to make it work (:func:`django_zerodb.expressions.register`).

Django's own classes are trusted differently for lookups and for the rest. Lookups are
dispatched by the builtin lookup they derive from, through Django's own intermediate
classes (``IntegerFieldExact``, ``YearGt``, ``RelatedIn``, ``KeyTransformLt``...: Django
makes one per field type, and they keep the meaning of ``Exact``, ``GreaterThan``...
on every database). Functions, expressions and aggregates of Django must be registered
exactly: a new Django function is refused until this backend implements it.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Aggregate, Func, Lookup, Transform

from django_zerodb.exceptions import NotSupportedError

# What makes a subclass compile to other SQL than its parent (so mean something else).
SQL_ATTRIBUTES = frozenset({"template", "function", "arg_joiner", "sql_template"})
LOOKUP_SQL_ATTRIBUTES = SQL_ATTRIBUTES | {
    "process_lhs",
    "process_rhs",
    "get_db_prep_lookup",
    "get_rhs_op",
    "batch_process_rhs",
}
HOOK = "django_zerodb.expressions.register"


def is_django_class(klass: type) -> bool:
    return klass.__module__.split(".", 1)[0] == "django"


def sql_override(klass: type, attributes: frozenset[str]) -> str | None:
    """The first attribute ``klass`` itself defines that changes its SQL, if any."""
    for name in vars(klass):
        if name in attributes or name.startswith("as_"):
            return name
    return None


def own_sql(expression: object) -> bool:
    """An instance given its own SQL: ``Func(F("x"), function="UPPER")``,
    ``Sum("x", template=...)`` (Func keeps such keywords in ``extra``)."""
    extra = getattr(expression, "extra", None)
    return bool(extra) and not SQL_ATTRIBUTES.isdisjoint(extra)


def kind_of(klass: type) -> str:
    """How a refusal calls it: aggregate, lookup, transform, function or expression."""
    if issubclass(klass, Aggregate):
        return "aggregate"
    if issubclass(klass, Lookup):
        return "lookup"
    if issubclass(klass, Transform):
        return "transform"
    if issubclass(klass, Func):
        return "function"
    return "expression"


class Registry:
    """Entries keyed by class; :meth:`find` walks the MRO under the rules above."""

    def __init__(self, *, through_django: bool, attributes: frozenset[str]) -> None:
        self.through_django = through_django
        self.attributes = attributes
        self._entries: dict[type, Any] = {}
        # Only Django's classes are cached: a user's class may still be given methods
        # (Django's own tests add ``as_<vendor>`` to a class after using it).
        self._django_cache: dict[type, Any] = {}

    def add(self, klass: type | None, entry: Any) -> None:
        """Register ``entry`` for ``klass``; None is a class the running Django does not
        have (``compat.py``), which no query can hold: nothing to register."""
        if klass is None:
            return
        self._entries[klass] = entry
        self._django_cache.clear()

    def remove(self, klass: type) -> None:
        self._entries.pop(klass, None)
        self._django_cache.clear()

    def find(self, klass: type) -> Any:
        """The entry that evaluates instances of ``klass``; NotSupportedError naming it
        when there is none, or when ``klass`` may mean something else than the entry."""
        entry = self._entries.get(klass)
        if entry is not None:
            return entry
        cached = self._django_cache.get(klass)
        if cached is not None:
            return cached
        for parent in klass.__mro__:
            entry = self._entries.get(parent)
            if entry is not None:
                if is_django_class(klass):
                    self._django_cache[klass] = entry
                return entry
            if _is_base(parent):
                break  # Lookup, Func...: no builtin meaning on the way
            if is_django_class(parent):
                if self.through_django:
                    continue
                break  # a Django class this backend does not implement
            override = sql_override(parent, self.attributes)
            if override is not None:
                meant = next((c for c in klass.__mro__ if c in self._entries), None)
                raise unsupported(klass, override=(parent, override, meant))
        raise unsupported(klass)


def _is_base(klass: type) -> bool:
    """Django's abstract bases: reaching one means no builtin meaning was found."""
    from django.db.models.expressions import BaseExpression, Combinable, Expression

    return klass in (Lookup, Transform, Func, Aggregate, Expression, BaseExpression) or (
        klass in (Combinable, object)
    )


def unsupported(
    klass: type, *, override: tuple[type, str, type | None] | None = None, instead: str = ""
) -> NotSupportedError:
    """The refusal for ``klass``: what it is, why, and how to make it work."""
    name = klass.__name__
    kind = kind_of(klass)
    if override is not None and override[2] is not None:
        parent, attribute, meant = override
        why = (
            f"the {kind} {name} is not evaluated by the encrypted database: "
            f"{parent.__name__} defines {attribute}, so it may not mean what "
            f"{meant.__name__} means"
        )
    else:
        why = f"the {kind} {name} is not supported by the encrypted database"
    how = instead or "compute it in Python on the fetched objects"
    return NotSupportedError(
        f"{why}: {how}, or register a Python implementation with "
        f"{HOOK}({name}) (see docs/expressions.md)"
    )


# Values of expressions: ``handler(evaluator, expression, row) -> value``.
VALUES = Registry(through_django=False, attributes=SQL_ATTRIBUTES)
# Lookups: the builtin lookup's name (``"exact"``...) or a user's ``Lookup`` handler.
LOOKUPS = Registry(through_django=True, attributes=LOOKUP_SQL_ATTRIBUTES)
# Aggregates: ``compute(aggregate, values, evaluator) -> value`` over a group's non-NULL
# values.
AGGREGATES = Registry(through_django=False, attributes=SQL_ATTRIBUTES)
