"""Differential test: the same random querysets on SQLite and on the encrypted database.

The models of ``difftest`` exist in two databases, ``plain`` (ordinary SQLite, the
reference) and ``encrypted`` (this backend). A seeded generator makes the same rows in
both (same primary keys; NULLs, duplicates, mixed case, unicode, LIKE wildcards,
boundary numbers and dates), then a few hundred seeded random querysets run on each and
their answers must be identical: nested ``Q`` trees (depth <= 3, AND/OR/NOT) of every
lookup (exact, iexact, in, gt, gte, lt, lte, range, isnull, startswith, istartswith,
endswith, iendswith, contains, icontains, regex, iregex, the date, year, month, day, ...
transforms, pattern lookups on numbers and dates), across the foreign key
(``group__name``), across multi-valued relations (``group__items__n``, ``Group`` filtered
on ``items__...``), with ``F()`` comparisons, ``__in`` subqueries and ``Exists(OuterRef)``
now and then, some under ``timezone.override()``; ``filter()``/``exclude()``, ``order_by``
on one or two fields always ending with the primary key (so the order is total),
``reverse()``, slicing, then one of: the list of primary keys, ``count()``, ``exists()``,
``first()``/``last()``, ``aggregate()`` (``distinct=``, ``filter=``), ``values()``,
``values_list(flat=True)``, ``distinct()`` (and its count), a grouped
``values().annotate()``, ``annotate()`` across the reverse relation.

Shapes not generated, because the two databases may legitimately differ or Django refuses
them before any query: pattern lookups on decimals and booleans (SQLite matches the text
of its REAL and 0/1 storage: ``"12.3"`` for 12.30), ``range`` on a foreign key (no such
lookup), impossible values for date transforms (Django raises ``ValueError`` on SQLite
for ``year=-14`` while computing the bounds).

Normalisations, each a documented difference of SQLite, never of the backend under test:

* **Case-sensitive pattern lookups** (``contains``, ``startswith``, ``endswith``) are
  case-insensitive on SQLite, whose ``LIKE`` ignores ASCII case (Django documents this),
  and SQLite's case folding of the **i-lookups** (``iexact``, ``icontains``,
  ``istartswith``, ``iendswith``) covers ASCII only. So SQLite gets each of these lookups
  as the equivalent ``regex``/``iregex`` on ``re.escape(value)`` (``^...`` for a prefix,
  ``...\\Z`` for a suffix; Django's SQLite ``REGEXP`` is Python's ``re.search``), which
  is exactly the lookup's documented meaning; the encrypted database gets the lookup
  itself. The data's non-ASCII letters have one-to-one case mappings (é/É, ü/Ü, ж/Ж...;
  no ß, İ, ς), where ``re.IGNORECASE`` and ``str.lower()`` agree.
* **Avg** is compared as floats, within a relative 1e-9 (and 1e-6 absolute for
  decimals): SQLite averages in floating point, the backend divides exact sums.
* **Decimals** are compared by value (``Decimal("1.5") == Decimal("1.50")``), SQLite's
  rounded to the field's two places first: SQLite stores decimals as REAL and sums them
  as floats, so ``Sum("price")`` comes back as ``Decimal("-54.9900007629394")`` where the
  exact sum is -54.99. The data keep decimals below 1e6 in magnitude (the field allows
  1e10) so that the float error of a sum over the ~10^4 rows of a multi-valued join stays
  far below half a cent; with values near 1e10 SQLite's sums were off by up to 2.75.

Nothing else is normalised: NULL ordering (first ascending, last descending), three-valued
logic under ``exclude()``/``~Q``, duplicates of multi-valued joins, types of aggregates.

On a mismatch the failure names the data seed and the query number and prints the
queryset as code and both answers. ``make test`` runs ``SEEDS`` x ``QUERIES`` queries;
the slow variant runs ``ZERODB_DIFF_QUERIES`` (default 5000) per seed of
``ZERODB_DIFF_SEEDS`` (comma-separated, default 1..5)::

    ZERODB_DIFF_QUERIES=5000 .venv/bin/pytest -m slow tests/django/difftest

``ZERODB_DIFF_SEEDS=3 ZERODB_DIFF_ONLY=41`` reruns query 41 of seed 3 alone.
"""

from __future__ import annotations

import datetime
import decimal
import math
import os
import random
import re
import traceback
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db.models import Avg, Count, Exists, F, Max, Min, OuterRef, Q, Sum
from django.utils import timezone

from tests.django.difftest.models import Group, Item

ENC, PLAIN = "encrypted", "plain"
SEEDS = [1, 2, 3, 4]
QUERIES = 150
ITEMS = 300
UTC = datetime.UTC

# -- data -----------------------------------------------------------------------------------

WORDS = [
    "alpha", "Alpha", "ALPHA", "alphabet", "beta", "Beta", "gamma", "ab", "abc", "aBc",
    "a_b", "a%b", "a.b", "a*b", "back\\slash", "it's", "", " ", "  x ", "café", "CAFÉ",
    "Café", "über", "Über", "жук", "ЖУК", "Жук", "日本", "日本語", "€5", "😀x", "x😀",
    "12", "2", "10", "z", "Z", "zzz", "Ab", "aB",
]  # fmt: skip
ALPHABET = "aAbBzZ_%. é É ü Ü ж Ж 日 😀 \\ 1 9".replace(" ", "") + "  "
REGEXES = [
    "a", "^a", "A", "^A", "b$", "[0-9]", "^[a-z]+$", "é", "É", "b.c", "(ab|xy)", "^$",
    "\\.", "%", "_", "^.{3}$", "[^a-z]", "日", "😀", "^ ", "ü|Ж", "a.*b", "^[A-Z]",
    "z{2,}", "\\\\", "alpha", "^alp", "lph[a-z]", "(?i)ALPH", "caf", "жук", "lph.*bet",
    "bet|gam", "x?abc", "ALPHA",
]  # fmt: skip
GROUP_NAMES = ["Red", "red", "RED", "Blue", "blue", "Grün", "grün", "日本", "", None]
INT_EDGES = [0, 1, -1, 2, 7, 2**31 - 1, -(2**31), 2**40, -(2**40), 100, -100]
# Below 1e6: SQLite sums decimals as floats (see the module docstring).
DECIMAL_EDGES = ["0", "0.01", "-0.01", "1.00", "1.10", "999999.99", "-999999.99", "-0.50"]
DATE_EDGES = [
    datetime.date(2000, 1, 1), datetime.date(1999, 12, 31), datetime.date(2000, 2, 29),
    datetime.date(2000, 12, 31), datetime.date(2001, 1, 1), datetime.date(1970, 1, 1),
    datetime.date(1900, 3, 1), datetime.date(2038, 1, 19),
]  # fmt: skip


def _maybe(r: random.Random, p_null: float, make):
    return None if r.random() < p_null else make()


def _text(r: random.Random) -> str:
    if r.random() < 0.7:
        return r.choice(WORDS)
    return "".join(r.choice(ALPHABET) for _ in range(r.randint(0, 6)))


def _int(r: random.Random) -> int:
    return r.choice(INT_EDGES) if r.random() < 0.25 else r.randint(-20, 20)


def _decimal(r: random.Random) -> decimal.Decimal:
    if r.random() < 0.2:
        return decimal.Decimal(r.choice(DECIMAL_EDGES))
    return decimal.Decimal(r.randint(-50000, 50000)) / 100


def _date(r: random.Random) -> datetime.date:
    if r.random() < 0.25:
        return r.choice(DATE_EDGES)
    return datetime.date(1999, 11, 1) + datetime.timedelta(days=r.randint(0, 500))


def _datetime(r: random.Random) -> datetime.datetime:
    day = _date(r)
    if r.random() < 0.2:
        t = r.choice([datetime.time(0), datetime.time(23, 59, 59, 999999), datetime.time(12)])
    else:
        t = datetime.time(r.randint(0, 23), r.randint(0, 59), r.randint(0, 59))
        if r.random() < 0.3:
            t = t.replace(microsecond=r.randint(0, 999999))
    return datetime.datetime.combine(day, t, tzinfo=UTC)


@dataclass
class Data:
    groups: list[dict]
    items: list[dict]
    pools: dict[str, list] = field(default_factory=dict)


def make_data(seed: int, items: int = ITEMS) -> Data:
    r = random.Random(seed)
    groups = []
    for gpk in sorted(r.sample(range(1, 60), 9)):
        groups.append(
            {"id": gpk, "name": r.choice(GROUP_NAMES), "rank": _maybe(r, 0.2, lambda: _int(r))}
        )
    rows = []
    for pk in sorted(r.sample(range(1, items * 4), items)):
        group = r.choice(groups) if r.random() < 0.8 else None
        rows.append(
            {
                "id": pk,
                "name": _maybe(r, 0.15, lambda: _text(r)),
                "code": _maybe(r, 0.15, lambda: _text(r)),
                "n": _maybe(r, 0.15, lambda: _int(r)),
                "m": _maybe(r, 0.2, lambda: r.randint(-3, 3)),
                "price": _maybe(r, 0.15, lambda: _decimal(r)),
                "day": _maybe(r, 0.15, lambda: _date(r)),
                "at": _maybe(r, 0.15, lambda: _datetime(r)),
                "flag": r.random() < 0.5,
                "group_id": group["id"] if group else None,
            }
        )
    data = Data(groups, rows)
    by_id = {g["id"]: g for g in groups}
    for name in ("name", "code", "n", "m", "price", "day", "at", "flag"):
        data.pools[name] = [row[name] for row in rows if row[name] is not None]
    data.pools["pk"] = [row["id"] for row in rows]
    data.pools["group"] = list(by_id)
    data.pools["group__name"] = [g["name"] for g in groups if g["name"] is not None]
    data.pools["group__rank"] = [g["rank"] for g in groups if g["rank"] is not None]
    data.pools["group__items__name"] = data.pools["name"]
    data.pools["group__items__n"] = data.pools["n"]
    return data


def insert(data: Data, using: str) -> None:
    Group.objects.using(using).bulk_create([Group(**g) for g in data.groups])
    Item.objects.using(using).bulk_create([Item(**row) for row in data.items])


# -- queries --------------------------------------------------------------------------------

# Field path (from Item) -> kind of values.
ITEM_FIELDS = {
    "name": "str",
    "code": "str",
    "n": "int",
    "m": "int",
    "price": "dec",
    "day": "date",
    "at": "dt",
    "flag": "bool",
    "group": "fk",
    "pk": "pk",
    "group__name": "str",
    "group__rank": "int",
    # Multi-valued: the other items of the same group (duplicates rows, as SQL does).
    "group__items__name": "str",
    "group__items__n": "int",
}
STR_LOOKUPS = [
    "exact", "iexact", "in", "gt", "gte", "lt", "lte", "range", "isnull", "startswith",
    "istartswith", "endswith", "iendswith", "contains", "icontains", "regex", "iregex",
]  # fmt: skip
ORDERED_LOOKUPS = ["exact", "in", "gt", "gte", "lt", "lte", "range", "isnull"]
DATE_TRANSFORMS = ["year", "month", "day", "week_day", "quarter", "iso_year"]
DATETIME_TRANSFORMS = ["year", "month", "day", "hour", "minute", "week_day", "quarter"]
TRANSFORM_LOOKUPS = ["exact", "in", "gt", "gte", "lt", "lte", "range"]
# SQLite's LIKE ignores ASCII case and folds ASCII only (see the module docstring).
PLAIN_PATTERN = {
    "contains": ("regex", "{}"),
    "startswith": ("regex", "^{}"),
    "endswith": ("regex", "{}\\Z"),
    "iexact": ("iregex", "^{}\\Z"),
    "icontains": ("iregex", "{}"),
    "istartswith": ("iregex", "^{}"),
    "iendswith": ("iregex", "{}\\Z"),
}


@dataclass(frozen=True)
class Leaf:
    path: str
    lookup: str
    value: Any

    def kwargs(self, using: str) -> dict:
        lookup, value = self.lookup, self.value
        if hasattr(value, "render"):
            value = value.render(using)
        if using == PLAIN and lookup in PLAIN_PATTERN and isinstance(value, str):
            lookup, template = PLAIN_PATTERN[lookup]
            value = template.format(re.escape(value))
        return {f"{self.path}__{lookup}": value}

    def q(self, using: str) -> Q:
        return Q(**self.kwargs(using))

    def __repr__(self) -> str:
        return f"Q({self.path}__{self.lookup}={self.value!r})"


@dataclass(frozen=True)
class Node:
    op: str  # "and", "or", "not"
    children: tuple

    def q(self, using: str) -> Q:
        qs = [c.q(using) for c in self.children]
        if self.op == "not":
            return ~qs[0]
        out = qs[0]
        for q in qs[1:]:
            out = (out & q) if self.op == "and" else (out | q)
        return out

    def __repr__(self) -> str:
        if self.op == "not":
            return f"~{self.children[0]!r}"
        sep = " & " if self.op == "and" else " | "
        return "(" + sep.join(repr(c) for c in self.children) + ")"


@dataclass(frozen=True)
class FieldRef:
    """``F(name)`` as a leaf's value (a condition on two columns of a row)."""

    name: str

    def render(self, using: str) -> F:
        return F(self.name)

    def __repr__(self) -> str:
        return f"F({self.name!r})"


@dataclass(frozen=True)
class SubQuery:
    """``Group.objects.filter(tree)`` / ``Item.objects.filter(tree).values("pk")`` as the
    right-hand side of ``__in``."""

    model: str
    tree: Any

    def render(self, using: str):
        if self.model == "group":
            return Group.objects.using(using).filter(self.tree.q(using))
        return Item.objects.using(using).filter(self.tree.q(using)).values("pk")

    def __repr__(self) -> str:
        if self.model == "group":
            return f"Group.objects.filter({self.tree!r})"
        return f"Item.objects.filter({self.tree!r}).values('pk')"


@dataclass(frozen=True)
class ExistsItems:
    """``Exists(Item.objects.filter(group=OuterRef("pk")).filter(tree))`` on Group."""

    tree: Any

    def q(self, using: str) -> Q:
        items = Item.objects.using(using).filter(group=OuterRef("pk")).filter(self.tree.q(using))
        return Q(Exists(items))

    def __repr__(self) -> str:
        return f"Q(Exists(Item.objects.filter(group=OuterRef('pk')).filter({self.tree!r})))"


def _string_value(r: random.Random, pool: list, lookup: str) -> str:
    value = r.choice(pool) if pool and r.random() < 0.85 else _text(r)
    if lookup not in ("exact", "iexact", "gt", "gte", "lt", "lte") and value and r.random() < 0.6:
        i = r.randint(0, len(value) - 1)
        j = r.randint(i + 1, len(value))
        if lookup.endswith("startswith"):
            value = value[:j]
        elif lookup.endswith("endswith"):
            value = value[i:]
        else:
            value = value[i:j]
    if lookup.startswith("i") and r.random() < 0.4:
        value = r.choice([value.upper(), value.lower(), value.swapcase()])
    return value


def _typed_value(r: random.Random, kind: str, pool: list) -> Any:
    if pool and r.random() < 0.7:
        return r.choice(pool)
    return {
        "int": lambda: _int(r),
        "pk": lambda: r.randint(0, ITEMS * 4),
        "fk": lambda: r.randint(0, 60),
        "dec": lambda: _decimal(r),
        "date": lambda: _date(r),
        "dt": lambda: _datetime(r),
        "bool": lambda: r.random() < 0.5,
        "str": lambda: _text(r),
        "extract": lambda: r.choice(pool),
    }[kind]()


def _leaf(r: random.Random, fields: dict, pools: dict) -> Leaf:
    path = r.choice(list(fields))
    kind = fields[path]
    pool = pools.get(path, [])
    if kind == "str":
        lookup = r.choice(STR_LOOKUPS)
    elif kind in ("int", "pk", "date", "dt") and r.random() < 0.1:
        # A pattern lookup on a number or a date tests its text: "-12", "2000-02-29",
        # "2000-02-29 13:05:00.250000" (UTC) on both databases.
        lookup = r.choice([*PLAIN_PATTERN, "regex"])
        text = str(_typed_value(r, kind, pool))
        if kind == "dt":
            text = text.replace("+00:00", "")
        i = r.randint(0, len(text) - 1)
        return Leaf(path, lookup, text[i : r.randint(i + 1, len(text))])
    elif kind == "bool":
        lookup = r.choice(["exact", "exact", "in"])
    elif kind in ("date", "dt") and r.random() < 0.5:
        transforms = DATE_TRANSFORMS if kind == "date" else [*DATETIME_TRANSFORMS, "date"]
        transform = r.choice(transforms)
        lookup = r.choice(TRANSFORM_LOOKUPS)
        if transform == "date":
            day_pool = pools.get(path.replace("at", "day"), [])
            return _ordered_leaf(r, f"{path}__date", lookup, "date", day_pool)
        # Values from the transform's range only: Django itself raises ValueError on
        # SQLite for an impossible year (year_lookup_bounds), before any query runs.
        return _ordered_leaf(r, f"{path}__{transform}", lookup, "extract", _extracts(transform))
    else:
        lookup = r.choice(ORDERED_LOOKUPS)
    if kind == "pk" and lookup == "isnull":
        lookup = "exact"
    if kind == "fk" and lookup == "range":
        lookup = "in"  # Django has no range lookup on a ForeignKey
    if lookup == "isnull":
        return Leaf(path, "isnull", r.random() < 0.5)
    if kind == "str" and lookup in ("regex", "iregex"):
        return Leaf(path, lookup, r.choice(REGEXES))
    if kind == "str" and lookup not in ("in", "range"):
        if lookup == "exact" and r.random() < 0.05:
            return Leaf(path, "exact", None)
        return Leaf(path, lookup, _string_value(r, pool, lookup))
    return _ordered_leaf(r, path, lookup, kind, pool)


def _special(r: random.Random, data: Data, model: str, depth: int):
    """A leaf that is not a column against a constant: F(), a subquery, EXISTS."""
    roll = r.random()
    if model == "item":
        if roll < 0.4:
            ints = ["n", "m", "group__rank", "pk"]
            a, b = r.sample(ints, 2)
            return Leaf(a, r.choice(["exact", "gt", "gte", "lt", "lte"]), FieldRef(b))
        if roll < 0.7:
            tree = _tree(r, data, "group", depth + 1, special=False)
            return Leaf("group", "in", SubQuery("group", tree))
        tree = _tree(r, data, "item", depth + 1, special=False)
        return Leaf("pk", "in", SubQuery("item", tree))
    if roll < 0.6:
        return ExistsItems(_tree(r, data, "item", depth + 1, special=False))
    tree = _tree(r, data, "item", depth + 1, special=False)
    return Leaf("items", "in", SubQuery("item", tree))


def _ordered_leaf(r: random.Random, path: str, lookup: str, kind: str, pool: list) -> Leaf:
    def one():
        return _typed_value(r, kind, pool)

    if lookup == "in":
        values = [one() for _ in range(r.randint(0, 4))]
        if r.random() < 0.1:
            values.append(None)
        return Leaf(path, "in", tuple(values))
    if lookup == "range":
        a, b = one(), one()
        if r.random() < 0.85 and b < a:
            a, b = b, a
        return Leaf(path, "range", (a, b))
    return Leaf(path, lookup, one())


def _extracts(transform: str) -> list[int]:
    return {
        "year": [1900, 1970, 1999, 2000, 2001, 2038],
        "iso_year": [1999, 2000, 2001],
        "month": list(range(0, 14)),
        "day": list(range(0, 32)),
        "week_day": list(range(0, 9)),
        "quarter": list(range(0, 6)),
        "hour": list(range(0, 25)),
        "minute": [0, 1, 30, 59],
    }[transform]


def _tree(r: random.Random, data: Data, model: str, depth: int = 1, special: bool = True):
    """A random condition of depth <= 3 on ``model`` ("item", "group", or "group+items"
    for Group conditions that may cross to its items)."""
    if depth >= 3 or r.random() < 0.45:
        if special and r.random() < 0.08:
            return _special(r, data, model.split("+")[0], depth)
        fields, pools = _fields(data, model)
        return _leaf(r, fields, pools)
    op = r.choice(["and", "or", "or", "not"])
    if op == "not":
        return Node("not", (_tree(r, data, model, depth + 1, special),))
    children = tuple(_tree(r, data, model, depth + 1, special) for _ in range(r.randint(2, 3)))
    return Node(op, children)


def _fields(data: Data, model: str) -> tuple[dict, dict]:
    if model == "item":
        return ITEM_FIELDS, data.pools
    fields = {"name": "str", "rank": "int", "pk": "fk"}
    pools = {
        "name": [g["name"] for g in data.groups if g["name"] is not None],
        "rank": [g["rank"] for g in data.groups if g["rank"] is not None],
        "pk": [g["id"] for g in data.groups],
    }
    if model == "group+items":
        for path, kind in GROUP_ITEM_FIELDS.items():
            fields[f"items__{path}"] = kind
            pools[f"items__{path}"] = data.pools.get(path, [])
    return fields, pools


ITEM_ORDER = ["name", "code", "n", "m", "price", "day", "at", "flag", "group__name", "group__rank"]
ITEM_VALUES = ["name", "code", "n", "m", "price", "day", "at", "flag", "group", "group__name"]
AGGREGATES = {
    "Count": (Count, ["pk", "name", "n", "price", "day", "group", "group__name"]),
    "Sum": (Sum, ["n", "m", "price", "group__rank"]),
    "Min": (Min, ["name", "code", "n", "price", "day", "at", "group__name"]),
    "Max": (Max, ["name", "code", "n", "price", "day", "at", "group__name"]),
    "Avg": (Avg, ["n", "m", "price"]),
}
# Fields of Item seen from Group through the reverse relation (items__...).
GROUP_ITEM_FIELDS = {k: v for k, v in ITEM_FIELDS.items() if not k.startswith("group")}


@dataclass(frozen=True)
class Agg:
    """One aggregate: ``fn(arg, distinct=..., filter=...)``, named ``key``."""

    key: str  # starts with the function's name: "avg..." is compared approximately
    fn: Any
    arg: str
    distinct: bool = False
    where: Any = None

    def render(self, using: str):
        kwargs: dict[str, Any] = {"distinct": True} if self.distinct else {}
        if self.where is not None:
            kwargs["filter"] = self.where.q(using)
        return self.fn(self.arg, **kwargs)

    def __repr__(self) -> str:
        extra = ", distinct=True" if self.distinct else ""
        extra += "" if self.where is None else f", filter={self.where!r}"
        return f"{self.key}={self.fn.__name__}({self.arg!r}{extra})"


@dataclass
class Spec:
    model: str  # "item" or "group"
    steps: list  # [("filter" | "exclude", tree)]
    order: list[str]
    low: int | None
    high: int | None
    op: tuple
    tz: str | None = None  # run under timezone.override(tz): transforms of `at` shift

    def queryset(self, using: str):
        model = Item if self.model == "item" else Group
        qs = model.objects.using(using).all()
        for method, tree in self.steps:
            qs = getattr(qs, method)(tree.q(using))
        kind = self.op[0]
        if kind == "values":
            qs = qs.order_by(*self.order).values("pk", *self.op[1])
        elif kind == "flat":
            qs = qs.order_by(*self.order).values_list(self.op[1], flat=True)
        elif kind == "distinct":
            qs = qs.values_list(*self.op[1]).distinct().order_by(*self.op[1])
        elif kind == "group":
            agg = self.op[2]
            qs = qs.values(self.op[1]).annotate(**{agg.key: agg.render(using)})
            qs = qs.order_by(self.op[1])
        elif kind == "annotate":
            agg = self.op[1]
            qs = qs.annotate(**{agg.key: agg.render(using)})
            qs = qs.order_by(*self.order).values_list("pk", agg.key)
        elif kind == "distinct_pks":
            qs = qs.order_by(*self.order).distinct().values_list("pk", flat=True)
        else:
            qs = qs.order_by(*self.order)
            if kind == "reverse":
                qs = qs.reverse()
            if kind in ("pks", "reverse", "first", "last"):
                qs = qs.values_list("pk", flat=True)
        if self.low is not None or self.high is not None:
            qs = qs[self.low : self.high]
        return qs

    def run(self, using: str) -> Any:
        if self.tz is not None:
            with timezone.override(self.tz):
                return self._run(using)
        return self._run(using)

    def _run(self, using: str) -> Any:
        qs = self.queryset(using)
        kind = self.op[0]
        if kind in ("count", "exists", "first", "last"):
            return getattr(qs, kind)()
        if kind == "distinct" and self.op[2]:
            return qs.count()
        if kind == "aggregate":
            return qs.aggregate(**{agg.key: agg.render(using) for agg in self.op[1]})
        return list(qs)

    def __repr__(self) -> str:
        model = "Item" if self.model == "item" else "Group"
        code = f"{model}.objects"
        for method, tree in self.steps:
            code += f".{method}({tree!r})"
        kind = self.op[0]
        order = ", ".join(map(repr, self.order))
        if kind == "values":
            code += f".order_by({order}).values('pk', {', '.join(map(repr, self.op[1]))})"
        elif kind == "flat":
            code += f".order_by({order}).values_list({self.op[1]!r}, flat=True)"
        elif kind == "distinct":
            fields = ", ".join(map(repr, self.op[1]))
            code += f".values_list({fields}).distinct().order_by({fields})"
        elif kind == "group":
            code += f".values({self.op[1]!r}).annotate({self.op[2]!r}).order_by({self.op[1]!r})"
        elif kind == "annotate":
            code += f".annotate({self.op[1]!r}).order_by({order})"
            code += f".values_list('pk', {self.op[1].key!r})"
        elif kind == "distinct_pks":
            code += f".order_by({order}).distinct().values_list('pk', flat=True)"
        else:
            code += f".order_by({order})"
            if kind == "reverse":
                code += ".reverse()"
            if kind in ("pks", "reverse", "first", "last"):
                code += ".values_list('pk', flat=True)"
        if self.low is not None or self.high is not None:
            low = "" if self.low is None else self.low
            high = "" if self.high is None else self.high
            code += f"[{low}:{high}]"
        if kind in ("count", "exists", "first", "last") or (kind == "distinct" and self.op[2]):
            code += f".{'count' if kind == 'distinct' else kind}()"
        elif kind == "aggregate":
            code += f".aggregate({', '.join(map(repr, self.op[1]))})"
        if self.tz is not None:
            code = f"with timezone.override({self.tz!r}): {code}"
        return code


def _agg(r: random.Random, key: str, fields_of=None, prefix: str = "", where=None) -> Agg:
    name = r.choice(list(AGGREGATES) if fields_of is None else fields_of)
    fn, fields = AGGREGATES[name]
    fields = [f for f in fields if not (prefix and f.startswith("group"))]
    distinct = name in ("Count", "Sum", "Avg") and r.random() < 0.25
    return Agg(f"{name.lower()}{key}", fn, prefix + r.choice(fields), distinct, where)


def make_spec(data: Data, seed: int, index: int) -> Spec:
    r = random.Random(f"{seed}-{index}")
    if r.random() < 0.2:
        return _group_spec(r, data)
    steps = []
    for _ in range(r.choices([0, 1, 2], [1, 6, 3])[0]):
        method = "exclude" if r.random() < 0.3 else "filter"
        steps.append((method, _tree(r, data, "item")))
    order = []
    for path in r.sample(ITEM_ORDER, r.choice([0, 1, 1, 2])):
        order.append(("-" if r.random() < 0.5 else "") + path)
    order.append(r.choice(["pk", "-pk"]))
    low = high = None
    if r.random() < 0.35:
        low = r.choice([None, 0, 1, 5, 20])
        high = r.choice([None, (low or 0) + r.choice([0, 1, 3, 10, 50])])
        if low is None and high is None:
            high = 7
    kinds = {"pks": 5, "count": 2, "exists": 1, "aggregate": 3, "values": 2, "flat": 2}
    kinds |= {"distinct": 2, "group": 2, "reverse": 1, "first": 1, "last": 1}
    kind = r.choices(list(kinds), list(kinds.values()))[0]
    if kind == "last":
        low = high = None  # Django cannot reverse a sliced queryset
    if kind == "aggregate":
        op = ("aggregate", tuple(_agg(r, str(i)) for i in range(r.randint(1, 4))))
    elif kind == "values":
        op = ("values", tuple(r.sample(ITEM_VALUES, r.randint(1, 3))))
    elif kind == "flat":
        op = ("flat", r.choice(ITEM_VALUES))
    elif kind == "distinct":
        op = ("distinct", tuple(r.sample(ITEM_VALUES, r.randint(1, 2))), r.random() < 0.3)
    elif kind == "group":
        op = ("group", r.choice(ITEM_VALUES), _agg(r, ""))
    else:
        op = (kind,)
    return Spec("item", steps, order, low, high, op, _zone(r))


def _group_spec(r: random.Random, data: Data) -> Spec:
    """A query on Group across the multi-valued reverse relation ``items``."""
    steps = []
    for _ in range(r.choice([1, 1, 2])):
        method = "exclude" if r.random() < 0.4 else "filter"
        steps.append((method, _tree(r, data, "group+items")))
    order = [r.choice(["pk", "-pk"])]
    if r.random() < 0.4:
        order.insert(0, r.choice(["name", "-name", "rank", "-rank"]))
    kind = r.choice(["pks", "count", "distinct_pks", "annotate", "annotate"])
    if kind == "annotate":
        where = _tree(r, data, "group+items", 2, special=False) if r.random() < 0.3 else None
        op = ("annotate", _agg(r, "", ["Count", "Sum", "Min", "Max"], "items__", where))
    else:
        op = (kind,)
    return Spec("group", steps, order, None, None, op, _zone(r))


ZONES = ["Europe/Paris", "America/New_York", "Asia/Kathmandu", "Pacific/Kiritimati"]


def _zone(r: random.Random) -> str | None:
    return r.choice(ZONES) if r.random() < 0.15 else None


# -- comparing ------------------------------------------------------------------------------


CENT = decimal.Decimal("0.01")


def same(sqlite: Any, encrypted: Any, approximate: bool = False) -> bool:
    """Equal answers, up to the normalisations of the module docstring."""
    if isinstance(sqlite, dict) and isinstance(encrypted, dict):
        if sqlite.keys() != encrypted.keys():
            return False
        return all(same(sqlite[k], encrypted[k], k.startswith("avg")) for k in sqlite)
    if isinstance(sqlite, list | tuple) and isinstance(encrypted, list | tuple):
        if type(sqlite) is not type(encrypted) or len(sqlite) != len(encrypted):
            return False
        return all(same(a, b, approximate) for a, b in zip(sqlite, encrypted))
    if approximate and sqlite is not None and encrypted is not None:
        error = 1e-6 if isinstance(sqlite, decimal.Decimal) else 1e-9
        return math.isclose(float(sqlite), float(encrypted), rel_tol=1e-9, abs_tol=error)
    if isinstance(sqlite, decimal.Decimal) and sqlite.is_finite():
        # SQLite sums decimals as floats; the exact answer has the field's two places.
        sqlite = sqlite.quantize(CENT)
    return type(sqlite) is type(encrypted) and sqlite == encrypted


def _answer(spec: Spec, using: str) -> tuple[str, Any]:
    try:
        return "ok", spec.run(using)
    except Exception as exc:  # every error is a finding, reported by the caller
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return "error", f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"


def differences(data: Data, seed: int, indices) -> tuple[int, list[str]]:
    found = []
    ran = 0
    for index in indices:
        spec = make_spec(data, seed, index)
        ran += 1
        plain = _answer(spec, PLAIN)
        encrypted = _answer(spec, ENC)
        if plain[0] == encrypted[0] == "ok" and same(plain[1], encrypted[1]):
            continue
        found.append(
            f"seed={seed} query={index} (rerun: ZERODB_DIFF_SEEDS={seed} "
            f"ZERODB_DIFF_ONLY={index})\n  {spec!r}\n"
            f"  sqlite:    {_short(plain)}\n  encrypted: {_short(encrypted)}"
        )
    return ran, found


def _short(answer: tuple[str, Any]) -> str:
    text = repr(answer[1]) if answer[0] == "ok" else answer[1]
    return text if len(text) < 2000 else text[:2000] + "..."


def check(seed: int, queries: int) -> None:
    data = make_data(seed)
    insert(data, PLAIN)
    insert(data, ENC)
    only = os.environ.get("ZERODB_DIFF_ONLY")
    indices = [int(i) for i in only.split(",")] if only else range(queries)
    ran, found = differences(data, seed, indices)
    if found:
        shown = "\n\n".join(found[: int(os.environ.get("ZERODB_DIFF_SHOW", "8"))])
        pytest.fail(f"{len(found)} of {ran} querysets differ:\n\n{shown}", pytrace=False)


def _env_seeds(default: list[int], variable: str = "ZERODB_DIFF_SEEDS") -> list[int]:
    """The seeds to run: ``variable`` (comma-separated) if set, else ``default``."""
    raw = os.environ.get(variable)
    return [int(s) for s in raw.split(",")] if raw else default


@pytest.mark.django_db(databases=["default", ENC, PLAIN])
@pytest.mark.parametrize("seed", _env_seeds(SEEDS))
def test_same_answers(seed):
    check(seed, QUERIES)


@pytest.mark.slow
@pytest.mark.django_db(databases=["default", ENC, PLAIN])
@pytest.mark.parametrize("seed", _env_seeds([1, 2, 3, 4, 5]))
def test_same_answers_long(seed):
    check(seed, int(os.environ.get("ZERODB_DIFF_QUERIES", "5000")))


@pytest.mark.django_db(databases=["default", ENC, PLAIN])
def test_same_data_in_both():
    """The comparison is only meaningful if both databases hold the same rows."""
    data = make_data(0, items=50)
    insert(data, PLAIN)
    insert(data, ENC)
    fields = ["pk", "name", "code", "n", "m", "price", "day", "at", "flag", "group_id"]
    plain = list(Item.objects.using(PLAIN).order_by("pk").values_list(*fields))
    encrypted = list(Item.objects.using(ENC).order_by("pk").values_list(*fields))
    assert plain == encrypted
    assert len(plain) == 50
