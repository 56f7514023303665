"""Query operators of the native API (seed-compatible with ZeroDB's).

Each operator knows two things: how to decide a record in Python (``matches``), and which
ranges of an ordered index hold exactly the records it matches (``index_ranges``). The two
must agree, so both compare *encoded* values (``zerodb_core.encoding``): 1 == 1.0, strings
sort after numbers, and an index scan and a residual check can never disagree.

Missing values follow SQL: ``None`` (or an absent attribute) matches ``Eq(f, None)``,
``Any(f, [None, ...])`` and ``IsNull(f)``, and no comparison. ``Not`` is plain set
complement (two-valued); the Django layer adds the ``IS NOT NULL`` terms SQL would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from zerodb_core.encoding import encode_key, key_after
from zerodb_core.exceptions import QueryError
from zerodb_core.text import fold, parse_query, tokenize

# A range of encoded keys, half open: [lo, hi), hi None = to the end.
KeyRange = tuple[bytes, bytes | None]

_NONE_KEY = encode_key(None)
# Every non-None value sorts at or after this key.
_AFTER_NONE = key_after(_NONE_KEY)


def _key(value: Any) -> bytes | None:
    """Encode a stored value for comparison; values with no order (lists, dicts) -> None."""
    if value is None:
        return None
    try:
        return encode_key(value)
    except QueryError:
        return None


class Expr:
    """A query expression: combine with ``&``, ``|`` and ``~``."""

    def matches(self, record: dict[str, Any]) -> bool:
        raise NotImplementedError

    def fields(self) -> set[str]:
        """Names of the fields this expression reads."""
        raise NotImplementedError

    def __and__(self, other: Expr) -> Expr:
        return And(self, other)

    def __or__(self, other: Expr) -> Expr:
        return Or(self, other)

    def __invert__(self) -> Expr:
        return Not(self)


class Predicate(Expr):
    """A condition on one field."""

    field: str

    def fields(self) -> set[str]:
        return {self.field}

    def matches(self, record: dict[str, Any]) -> bool:
        return self.test(record.get(self.field))

    def test(self, value: Any) -> bool:
        """Decide one stored value."""
        raise NotImplementedError

    def whole_values(self) -> bool:
        """Whether each of ``index_ranges`` holds the entries of exactly one whole value
        (an equality, not a prefix or an interval): then runs whose Bloom filter rules
        the value out need not be read."""
        return False

    def index_ranges(self) -> list[KeyRange] | None:
        """Key ranges of an ordered index on ``field`` holding exactly the matches, in
        ascending order; None if an ordered index cannot serve this predicate."""
        return None

    def __repr__(self) -> str:
        args = ", ".join(repr(v) for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


def _point(key: bytes) -> KeyRange:
    return (key, key_after(key))


class ValuePredicate(Predicate):
    """A condition against one value (``Eq``, ``NotEq``).

    The negated operators are siblings of the ones they negate, never subclasses: an
    ``isinstance(p, Eq)`` must not hold for ``NotEq``, whatever order checks come in.
    """

    def __init__(self, field: str, value: Any) -> None:
        self.field = field
        self.value = value
        self._k = encode_key(value)


class Eq(ValuePredicate):
    def test(self, value: Any) -> bool:
        return (value is None and self.value is None) or _key(value) == self._k

    def index_ranges(self) -> list[KeyRange]:
        return [_point(self._k)]

    def whole_values(self) -> bool:
        return True


class IsNull(Predicate):
    """``IsNull(f)`` matches missing values; ``IsNull(f, False)`` every present one."""

    def __init__(self, field: str, isnull: bool = True) -> None:
        self.field = field
        self.isnull = bool(isnull)

    def test(self, value: Any) -> bool:
        return (value is None) == self.isnull

    def index_ranges(self) -> list[KeyRange]:
        return [_point(_NONE_KEY)] if self.isnull else [(_AFTER_NONE, None)]

    def whole_values(self) -> bool:
        return self.isnull


class _Bound(Predicate):
    """Comparison with one bound; subclasses say which side and whether it is included."""

    def __init__(self, field: str, value: Any) -> None:
        if value is None:
            raise QueryError(f"{type(self).__name__}({field!r}, None): nothing compares with None")
        self.field = field
        self.value = value
        self._k = encode_key(value)


class Lt(_Bound):
    def test(self, value: Any) -> bool:
        k = _key(value)
        return k is not None and k < self._k

    def index_ranges(self) -> list[KeyRange]:
        return [(_AFTER_NONE, self._k)]


class Le(_Bound):
    def test(self, value: Any) -> bool:
        k = _key(value)
        return k is not None and k <= self._k

    def index_ranges(self) -> list[KeyRange]:
        return [(_AFTER_NONE, key_after(self._k))]


class Gt(_Bound):
    def test(self, value: Any) -> bool:
        k = _key(value)
        return k is not None and k > self._k

    def index_ranges(self) -> list[KeyRange]:
        return [(key_after(self._k), None)]


class Ge(_Bound):
    def test(self, value: Any) -> bool:
        k = _key(value)
        return k is not None and k >= self._k

    def index_ranges(self) -> list[KeyRange]:
        return [(self._k, None)]


class RangePredicate(Predicate):
    """A condition against an interval with both ends included (``InRange``, ``NotInRange``)."""

    def __init__(self, field: str, start: Any, end: Any) -> None:
        if start is None or end is None:
            raise QueryError(f"{type(self).__name__}({field!r}, ...) needs two bounds, not None")
        self.field = field
        self.start = start
        self.end = end
        self._lo = encode_key(start)
        self._hi = encode_key(end)


class InRange(RangePredicate):
    """``start <= value <= end`` (both ends included, as in ZeroDB)."""

    def test(self, value: Any) -> bool:
        k = _key(value)
        return k is not None and self._lo <= k <= self._hi

    def index_ranges(self) -> list[KeyRange]:
        if self._hi < self._lo:
            return []
        return [(self._lo, key_after(self._hi))]


class NotInRange(RangePredicate):
    """A present value outside ``[start, end]``."""

    def test(self, value: Any) -> bool:
        k = _key(value)
        return k is not None and not self._lo <= k <= self._hi

    def index_ranges(self) -> list[KeyRange]:
        if self._hi < self._lo:
            return [(_AFTER_NONE, None)]
        return [(_AFTER_NONE, self._lo), (key_after(self._hi), None)]


class NotEq(ValuePredicate):
    """A present value different from ``value``."""

    def test(self, value: Any) -> bool:
        k = _key(value)
        return k is not None and k != self._k

    def index_ranges(self) -> list[KeyRange]:
        if self.value is None:
            return [(_AFTER_NONE, None)]
        return [(_AFTER_NONE, self._k), (key_after(self._k), None)]


class ValuesPredicate(Predicate):
    """A condition against a set of values (``Any_``, ``NotAny``)."""

    def __init__(self, field: str, values: Iterable[Any]) -> None:
        self.field = field
        self.values = list(values)
        self._keys = sorted({encode_key(v) for v in self.values})
        self._set = frozenset(self._keys)


class Any_(ValuesPredicate):
    """The value is one of ``values`` (SQL ``IN``); exported as ``Any``."""

    def test(self, value: Any) -> bool:
        if value is None:
            return _NONE_KEY in self._set
        return _key(value) in self._set

    def index_ranges(self) -> list[KeyRange]:
        return [_point(k) for k in self._keys]

    def whole_values(self) -> bool:
        return True


class NotAny(ValuesPredicate):
    """A present value that is none of ``values`` (SQL ``NOT IN`` on non-null values)."""

    def test(self, value: Any) -> bool:
        k = _key(value)
        return k is not None and k not in self._set

    def index_ranges(self) -> list[KeyRange]:
        ranges: list[KeyRange] = []
        lo = _AFTER_NONE
        for k in self._keys:
            if k == _NONE_KEY:
                continue
            if lo < k:
                ranges.append((lo, k))
            lo = key_after(k)
        ranges.append((lo, None))
        return ranges


class StartsWith(Predicate):
    """A string value beginning with ``prefix`` (served by the ordered index)."""

    def __init__(self, field: str, prefix: str) -> None:
        if not isinstance(prefix, str):
            raise QueryError(f"StartsWith({field!r}, ...) needs a str prefix")
        self.field = field
        self.prefix = prefix
        # The str encoding ends with a terminator; without it, it is a prefix of the key of
        # every string that starts with ``prefix``.
        self._p = encode_key(prefix)[:-1]

    def test(self, value: Any) -> bool:
        return isinstance(value, str) and value.startswith(self.prefix)

    def index_ranges(self) -> list[KeyRange]:
        return [(self._p, key_after(self._p))]


class Match(Predicate):
    """Any Python condition on one field; never index-served (evaluated on records)."""

    def __init__(self, field: str, test: Callable[[Any], bool], description: str = "") -> None:
        self.field = field
        self._test = test
        self.description = description or getattr(test, "__name__", "condition")

    def test(self, value: Any) -> bool:
        return bool(self._test(value))

    def __repr__(self) -> str:
        return f"Match({self.field!r}, {self.description})"


class PhrasePredicate(Predicate):
    """A full-text condition on the words and "quoted phrases" of ``text`` (``Contains``,
    ``DoesNotContain``); a field's text index serves both (the second as a complement)."""

    def __init__(self, field: str, text: str) -> None:
        if not isinstance(text, str):
            raise QueryError(f"{type(self).__name__}({field!r}, ...) needs a str")
        self.field = field
        self.text = text
        self.groups = parse_query(text)

    def contains(self, value: Any) -> bool:
        """Whether every word and phrase of ``text`` occurs in ``value``."""
        if not isinstance(value, str) or not self.groups:
            return False
        tokens = tokenize(value)
        return all(_has_phrase(tokens, group) for group in self.groups)


class Contains(PhrasePredicate):
    """Full-text: every word and every "quoted phrase" of ``text`` occurs in the field.

    Served by the field's text index (results ranked by BM25 when nothing else orders
    them); on a field without one it is evaluated on the records.
    """

    def test(self, value: Any) -> bool:
        return self.contains(value)


class DoesNotContain(PhrasePredicate):
    """The negation of :class:`Contains` (a missing value does not contain anything)."""

    def test(self, value: Any) -> bool:
        return not self.contains(value)


class Substring(Predicate):
    """The folded text of the field (:func:`zerodb_core.text.fold`) contains ``needle``
    (which must be folded already): ``icontains`` when the needle holds no sigma.

    Served exactly by a trigram index when the needle has at least 3 characters: the
    trigrams at offsets ``parts`` cover every character of it, and a document holds the
    needle at ``p`` exactly when it holds each of those trigrams at ``p + offset``.
    """

    def __init__(self, field: str, needle: str) -> None:
        if not isinstance(needle, str) or fold(needle) != needle:
            raise QueryError(f"Substring({field!r}, ...) needs a folded str")
        self.field = field
        self.needle = needle
        last = len(needle) - 3
        offsets = sorted({*range(0, last + 1, 3), last}) if last >= 0 else []
        self.parts = [(offset, needle[offset : offset + 3]) for offset in offsets]
        self.terms = sorted({trigram for _, trigram in self.parts})

    def test(self, value: Any) -> bool:
        return isinstance(value, str) and self.needle in fold(value)

    def __repr__(self) -> str:
        return f"Substring({self.field!r}, {self.needle!r})"


def _has_phrase(tokens: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    first = phrase[0]
    return any(
        tokens[i] == first and tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1)
    )


class And(Expr):
    def __init__(self, *exprs: Expr) -> None:
        self.exprs = _flatten(And, exprs)

    def matches(self, record: dict[str, Any]) -> bool:
        return all(e.matches(record) for e in self.exprs)

    def fields(self) -> set[str]:
        return set().union(*(e.fields() for e in self.exprs))

    def __repr__(self) -> str:
        return f"And({', '.join(map(repr, self.exprs))})"


class Or(Expr):
    def __init__(self, *exprs: Expr) -> None:
        self.exprs = _flatten(Or, exprs)
        if not self.exprs:
            raise QueryError("Or() needs at least one expression")

    def matches(self, record: dict[str, Any]) -> bool:
        return any(e.matches(record) for e in self.exprs)

    def fields(self) -> set[str]:
        return set().union(*(e.fields() for e in self.exprs))

    def __repr__(self) -> str:
        return f"Or({', '.join(map(repr, self.exprs))})"


class Not(Expr):
    def __init__(self, expr: Expr) -> None:
        _check(expr)
        self.expr = expr

    def matches(self, record: dict[str, Any]) -> bool:
        return not self.expr.matches(record)

    def fields(self) -> set[str]:
        return self.expr.fields()

    def __repr__(self) -> str:
        return f"Not({self.expr!r})"


def _check(expr: object) -> None:
    if not isinstance(expr, Expr):
        raise QueryError(f"not a query expression: {expr!r}")


def _flatten(kind: type[And | Or], exprs: Iterable[Expr]) -> list[Expr]:
    out: list[Expr] = []
    for e in exprs:
        _check(e)
        out.extend(e.exprs if type(e) is kind and isinstance(e, And | Or) else [e])
    return out
