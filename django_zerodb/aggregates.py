"""Django's aggregates over a group's values, as SQL computes them.

Each is registered for Django's exact class in ``registry.AGGREGATES`` and receives the
group's non-NULL values (after ``filter=`` and ``distinct=``, see ``query.py``). Over no
values SQL's aggregates are NULL, except COUNT which is 0; ``default=`` is Django's
``Coalesce`` around the aggregate and needs nothing here.
"""

from __future__ import annotations

import statistics
from typing import Any

from django.db.models import Avg, Count, Max, Min, StdDev, Sum, Variance

from django_zerodb.registry import AGGREGATES
from django_zerodb.values import Order, computing


def count(agg: Any, values: list) -> int:
    return len(values)


def total(agg: Any, values: list) -> Any:
    if not values:
        return None
    with computing("Sum"):
        return sum(values[1:], values[0])


def average(agg: Any, values: list) -> Any:
    if not values:
        return None
    with computing("Avg"):
        return sum(values[1:], values[0]) / len(values)


def minimum(agg: Any, values: list) -> Any:
    return min(values, key=Order) if values else None


def maximum(agg: Any, values: list) -> Any:
    return max(values, key=Order) if values else None


def spread(agg: Any, values: list) -> Any:
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


for _klass, _compute in {
    Count: count,
    Sum: total,
    Avg: average,
    Min: minimum,
    Max: maximum,
    StdDev: spread,
    Variance: spread,
}.items():
    AGGREGATES.add(_klass, _compute)
