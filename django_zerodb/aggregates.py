"""Django's aggregates over a group's values, as SQL computes them.

Each is registered for Django's exact class in ``registry.AGGREGATES`` and receives the
group's non-NULL values (after ``filter=`` and ``distinct=``, see ``query.py``). Over no
values SQL's aggregates are NULL, except COUNT which is 0; ``default=`` is Django's
``Coalesce`` around the aggregate and needs nothing here.
"""

from __future__ import annotations

import functools
import operator
import statistics
from typing import Any

from django.db.models import Avg, Count, Max, Min, StdDev, Sum, Variance

from django_zerodb.compat import BitAnd, BitOr, BitXor, StringAgg, StringAggDelimiter
from django_zerodb.exceptions import NotSupportedError
from django_zerodb.registry import AGGREGATES, VALUES
from django_zerodb.values import Order, computing


def count(agg: Any, values: list, ev: Any) -> int:
    return len(values)


def total(agg: Any, values: list, ev: Any) -> Any:
    if not values:
        return None
    with computing("Sum"):
        return sum(values[1:], values[0])


def average(agg: Any, values: list, ev: Any) -> Any:
    if not values:
        return None
    with computing("Avg"):
        return sum(values[1:], values[0]) / len(values)


def minimum(agg: Any, values: list, ev: Any) -> Any:
    return min(values, key=Order) if values else None


def maximum(agg: Any, values: list, ev: Any) -> Any:
    return max(values, key=Order) if values else None


def spread(agg: Any, values: list, ev: Any) -> Any:
    """StdDev and Variance, of the population or of a sample (``sample=True``)."""
    sample = agg.function.endswith("SAMP")
    if len(values) < (2 if sample else 1):
        return None
    deviation = isinstance(agg, StdDev)
    fn = {
        (True, True): statistics.stdev,
        (True, False): statistics.pstdev,
        (False, True): statistics.variance,
        (False, False): statistics.pvariance,
    }[(deviation, sample)]
    with computing(type(agg).__name__):
        return fn([float(v) for v in values])


def bitwise(operation: Any) -> Any:
    """BIT_AND, BIT_OR, BIT_XOR of integers (or booleans, as SQLite's Python ones)."""

    def compute(agg: Any, values: list, ev: Any) -> Any:
        if not values:
            return None
        with computing(type(agg).__name__):
            return functools.reduce(operation, values)

    return compute


def string_agg(agg: Any, values: list, ev: Any) -> Any:
    """STRING_AGG(x, delimiter): the texts joined, in the aggregate's ``order_by`` (the
    rows' order without one, which SQL leaves unspecified)."""
    if not values:
        return None
    delimiter = ev.value(agg.source_expressions[1], {})
    if any(isinstance(v, bool) or not isinstance(v, str | int) for v in values):
        raise NotSupportedError(
            "StringAgg of values other than text is not supported by the encrypted "
            "database (SQL databases write them differently): Cast them to text first"
        )
    return ("" if delimiter is None else str(delimiter)).join(map(str, values))


VALUES.add(StringAggDelimiter, lambda ev, e, row: ev.value(e.source_expressions[0], row))

for _klass, _compute in {
    Count: count,
    Sum: total,
    Avg: average,
    Min: minimum,
    Max: maximum,
    StdDev: spread,
    Variance: spread,
    BitAnd: bitwise(operator.and_),
    BitOr: bitwise(operator.or_),
    BitXor: bitwise(operator.xor),
    StringAgg: string_agg,
}.items():
    AGGREGATES.add(_klass, _compute)
