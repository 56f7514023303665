"""What the differential test modules share: the seeded rows on both databases, and
one queryset (or answer) made on each and compared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.django.difftest.test_differential import ENC, PLAIN, Data, insert, make_data, same


def load(seed: int, items: int | None = None) -> Data:
    """``test_differential``'s rows of ``seed``, in SQLite and in the encrypted database."""
    rows = make_data(seed) if items is None else make_data(seed, items=items)
    insert(rows, PLAIN)
    insert(rows, ENC)
    return rows


def both(make: Callable[[str], Any], compare: Callable[[Any, Any], bool] = same) -> Any:
    """The same queryset (or answer) on SQLite and on the encrypted database; equal."""
    plain, encrypted = make(PLAIN), make(ENC)
    plain = list(plain) if hasattr(plain, "query") else plain
    encrypted = list(encrypted) if hasattr(encrypted, "query") else encrypted
    assert compare(plain, encrypted), f"\nsqlite:    {plain!r}\nencrypted: {encrypted!r}"
    return encrypted
