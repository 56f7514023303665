"""``union()``, ``intersection()`` and ``difference()`` on the rows of their parts.

Each part is an ordinary query run on the same snapshot; the set operation works on
whole rows, as SQL's: ``UNION`` keeps one of each row (``UNION ALL`` every row),
``INTERSECT`` the distinct rows of the first part found in every other, ``EXCEPT`` the
distinct rows of the first found in none of the others. Rows compare as SQL's set
operations compare them: NULL equals NULL. Parts that can match nothing are left out
as Django leaves them out of the SQL (:func:`kept`). The combined query's ordering and slicing
apply to the result, by the selected columns. A part may be neither ordered nor sliced
(as on SQLite: ``supports_slicing_ordering_in_compound = False``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from django_zerodb.exceptions import NotSupportedError


def check_part(compiler: Any) -> None:
    """Django's words (on SQLite) for a part ordered or sliced on its own."""
    if compiler.query.is_sliced:
        raise DatabaseError("LIMIT/OFFSET not allowed in subqueries of compound statements.")
    if compiler.get_order_by():
        raise DatabaseError("ORDER BY not allowed in subqueries of compound statements.")


def combine(
    combinator: str, all_rows: bool, parts: list[list[list]], key: Callable[[Any], Any]
) -> list[list]:
    """The rows of ``parts`` combined; ``key`` makes one value hashable."""

    def row_key(row: list) -> tuple:
        return tuple(key(v) for v in row)

    if combinator == "union" and all_rows:
        return [row for part in parts for row in part]
    if combinator == "union":
        candidates = [row for part in parts for row in part]
        return _distinct(candidates, row_key)
    first = _distinct(parts[0], row_key) if parts else []
    others = [{row_key(r) for r in part} for part in parts[1:]]
    if combinator == "intersection":
        return [r for r in first if all(row_key(r) in o for o in others)]
    if combinator == "difference":
        return [r for r in first if not any(row_key(r) in o for o in others)]
    raise NotSupportedError(f"{combinator}() is not supported by the encrypted database")


def empty(combinator: str, parts_empty: list[bool]) -> bool:
    """Whether the combination is empty whatever the data, from which parts are."""
    if combinator == "union":
        return all(parts_empty)
    if combinator == "intersection":
        return any(parts_empty)
    return parts_empty[0]  # difference


def kept(combinator: str, parts_empty: list[bool]) -> list[bool]:
    """The parts Django's ``get_combinator_sql`` keeps: an empty part is left out of a
    union, and out of a difference after the first part (a single part left is
    then run alone, duplicates and all, as SQL would)."""
    if combinator == "union":
        return [not e for e in parts_empty]
    if combinator == "difference":
        return [True] + [not e for e in parts_empty[1:]]
    return [True] * len(parts_empty)


def _distinct(rows: list[list], row_key: Callable[[list], tuple]) -> list[list]:
    seen: set = set()
    out = []
    for row in rows:
        k = row_key(row)
        if k not in seen:
            seen.add(k)
            out.append(row)
    return out
