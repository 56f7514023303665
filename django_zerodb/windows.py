"""Window functions (``Window(...)``, SQL's ``OVER``), computed on a query's rows.

They run where SQL runs them: after WHERE, GROUP BY and HAVING, before the query's own
ORDER BY, DISTINCT and LIMIT; a filter on a window (Django's QUALIFY) is applied right
after. For each ``Window``, rows are split by ``partition_by``, each partition sorted by
the window's ``order_by`` (stable, with SQL's NULL ordering), and the function computed
per row: ranking functions from the positions and the *peers* (rows equal in every
``order_by`` value), ``Lag``/``Lead`` from neighbours, and ``FirstValue``,
``LastValue``, ``NthValue`` and aggregates over the row's frame.

Frames as SQL defines them: ``RowRange`` counts rows, ``ValueRange`` (RANGE) counts
peers for ``CURRENT ROW`` and values for offsets (one numeric ``order_by`` value). Without
a frame: with ``order_by`` RANGE from the partition's start to the current row's last
peer, without it the whole partition. Frame exclusions are refused, and so is a RANGE
offset when the ordering value is NULL (databases differ on which rows that frame holds).
"""

from __future__ import annotations

import decimal
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from django.db.models import Aggregate
from django.db.models import functions as fn
from django.db.models.expressions import OrderBy, OrderByList, RowRange, ValueRange, Window

from django_zerodb.exceptions import NotSupportedError
from django_zerodb.jsonvalues import scalar, sortable
from django_zerodb.registry import VALUES, unsupported
from django_zerodb.values import hashable

# Row key: {id(window expression): its value for the row}.
WINDOWS = "__windows__"


def _value(ev: Any, expr: Any, row: dict) -> Any:
    found = row.get(WINDOWS)
    if found is None or id(expr) not in found:
        raise NotSupportedError(
            "a window expression is only supported in annotate(), order_by() and filters "
            "on annotations on the encrypted database"
        )
    return found[id(expr)]


VALUES.add(Window, _value)


def find(exprs: list[Any]) -> list[Window]:
    """The window expressions in ``exprs`` (not inside subqueries), each once."""
    found: dict[int, Window] = {}

    def walk(node: Any) -> None:
        if node is None:
            return
        if isinstance(node, Window):
            found.setdefault(id(node), node)
            return
        for child in getattr(node, "children", None) or []:
            walk(child)
        if hasattr(node, "lhs") and hasattr(node, "rhs"):
            walk(node.lhs)
            if hasattr(node.rhs, "resolve_expression"):
                walk(node.rhs)
        elif hasattr(node, "get_source_expressions"):
            for child in node.get_source_expressions():
                walk(child)

    for expr in exprs:
        walk(expr)
    return list(found.values())


def compute(query: Any, rows: list[dict], windows: list[Window]) -> None:
    """Store each window's value in every row (``row[WINDOWS]``); ``query`` is the
    SelectQuery (its evaluator, sorting and aggregates)."""
    for window in windows:
        function = window.source_expression
        compute_one = _function(function)
        for part in _partitions(query, rows, window):
            ordered = query._sorted(part, _orders(window)) if window.order_by else part
            keys = [_order_key(query, window, r) for r in ordered]
            values = compute_one(query, window, ordered, keys)
            for row, value in zip(ordered, values, strict=True):
                row.setdefault(WINDOWS, {})[id(window)] = value


def _orders(window: Window) -> list[OrderBy]:
    return [
        o if isinstance(o, OrderBy) else OrderBy(o)
        for o in window.order_by.get_source_expressions()
    ]


def _partitions(query: Any, rows: list[dict], window: Window) -> list[list[dict]]:
    if window.partition_by is None:
        return [rows]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    exprs = window.partition_by.get_source_expressions()
    for row in rows:
        groups[tuple(hashable(scalar(query.ev.value(e, row))) for e in exprs)].append(row)
    return list(groups.values())


def _order_key(query: Any, window: Window, row: dict) -> tuple:
    if not window.order_by:
        return ()
    return tuple(hashable(sortable(query.ev.value(o.expression, row))) for o in _orders(window))


def _peers(keys: list[tuple]) -> list[tuple[int, int]]:
    """For each position, the first and last position of its peers."""
    bounds: list[tuple[int, int]] = []
    start = 0
    for i in range(len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            bounds.extend([(start, i - 1)] * (i - start))
            start = i
    return bounds


# -- ranking and navigation ------------------------------------------------------------------

Compute = Callable[[Any, Window, list[dict], list[tuple]], list[Any]]


def _row_number(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
    return list(range(1, len(rows) + 1))


def _rank(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
    return [first + 1 for first, _ in _peers(keys)]


def _dense_rank(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
    out, rank = [], 0
    for i, key in enumerate(keys):
        if i == 0 or key != keys[i - 1]:
            rank += 1
        out.append(rank)
    return out


def _percent_rank(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
    n = len(rows)
    return [0.0 if n == 1 else first / (n - 1) for first, _ in _peers(keys)]


def _cume_dist(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
    n = len(rows)
    return [(last + 1) / n for _, last in _peers(keys)]


def _ntile(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
    buckets = query.ev.value(window.source_expression.get_source_expressions()[0], {})
    if buckets is None or int(buckets) <= 0:
        raise ValueError("num_buckets must be greater than 0.")
    n, buckets = len(rows), int(buckets)
    size, extra = divmod(n, buckets)
    out = []
    for bucket in range(buckets):
        out.extend([bucket + 1] * (size + (1 if bucket < extra else 0)))
    return out[:n]


def _shift(direction: int) -> Compute:
    """Lag (-1) and Lead (+1): the value ``offset`` rows away, else ``default``."""

    def compute(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
        ev = query.ev
        args = window.source_expression.get_source_expressions()
        offset = ev.value(args[1], {}) if len(args) > 1 else 1
        out = []
        for i, row in enumerate(rows):
            j = i + direction * int(offset)
            if 0 <= j < len(rows):
                out.append(ev.value(args[0], rows[j]))
            else:
                out.append(ev.value(args[2], row) if len(args) > 2 else None)
        return out

    return compute


# -- frames -----------------------------------------------------------------------------------


def _frames(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list[range]:
    """Each row's frame, as a range of positions in its sorted partition."""
    n = len(rows)
    frame = window.frame
    if frame is None:
        if not window.order_by:
            return [range(0, n)] * n
        return [range(0, last + 1) for _, last in _peers(keys)]
    if getattr(frame, "exclusion", None):
        raise NotSupportedError(
            "window frame exclusions are not supported by the encrypted database: compute "
            "the value in Python on the fetched rows"
        )
    start, end = frame.start.value, frame.end.value
    if isinstance(frame, RowRange):
        query.connection.ops.window_frame_rows_start_end(start, end)  # Django's checks
        return [
            range(
                0 if start is None else max(0, i + start),
                n if end is None else min(n, i + end + 1),
            )
            for i in range(n)
        ]
    if isinstance(frame, ValueRange):
        query.connection.ops.window_frame_range_start_end(start, end)
        return _value_frames(window, keys, start, end)
    raise unsupported(type(frame))


def _value_frames(window: Window, keys: list[tuple], start: Any, end: Any) -> list[range]:
    n = len(keys)
    peers = _peers(keys)
    offsets = any(b not in (None, 0) for b in (start, end))
    if offsets:
        if len(keys[0] if keys else ()) != 1 or any(k[0] is None for k in keys):
            raise NotSupportedError(
                "a RANGE frame with offsets needs exactly one non-NULL ordering value on the "
                "encrypted database: order by one column and exclude its NULLs"
            )
        descending = _orders(window)[0].descending
    frames = []
    for i in range(n):
        first, last = peers[i]
        lo = 0 if start is None else first
        hi = n - 1 if end is None else last
        if offsets:
            here = keys[i][0]
            inside = [j for j in range(n) if _within(keys[j][0] - here, start, end, descending)]
            if start is not None and start != 0:
                lo = inside[0] if inside else i + 1
            if end is not None and end != 0:
                hi = inside[-1] if inside else i - 1
        frames.append(range(lo, hi + 1))
    return frames


def _within(delta: Any, start: Any, end: Any, descending: bool) -> bool:
    """Whether a value ``delta`` away (in the order's direction) is in the frame."""
    if isinstance(delta, decimal.Decimal):
        delta = float(delta)
    if descending:
        delta = -delta
    return (start is None or delta >= start) and (end is None or delta <= end)


def _framed(pick: Callable[[list, Any, Any], Any]) -> Compute:
    """FirstValue, LastValue, NthValue: a value of the frame's rows."""

    def compute(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
        ev = query.ev
        args = window.source_expression.get_source_expressions()
        out = []
        for frame in _frames(query, window, rows, keys):
            members = [rows[j] for j in frame]
            out.append(pick(members, args, ev))
        return out

    return compute


def _nth(members: list, args: list, ev: Any) -> Any:
    nth = int(ev.value(args[1], {}))
    return ev.value(args[0], members[nth - 1]) if len(members) >= nth else None


def _aggregate(query: Any, window: Window, rows: list[dict], keys: list[tuple]) -> list:
    frames = _frames(query, window, rows, keys)
    return [query._aggregate(window.source_expression, [rows[j] for j in f]) for f in frames]


FUNCTIONS: dict[type, Compute] = {
    fn.RowNumber: _row_number,
    fn.Rank: _rank,
    fn.DenseRank: _dense_rank,
    fn.PercentRank: _percent_rank,
    fn.CumeDist: _cume_dist,
    fn.Ntile: _ntile,
    fn.Lag: _shift(-1),
    fn.Lead: _shift(1),
    fn.FirstValue: _framed(lambda m, a, ev: ev.value(a[0], m[0]) if m else None),
    fn.LastValue: _framed(lambda m, a, ev: ev.value(a[0], m[-1]) if m else None),
    fn.NthValue: _framed(_nth),
}


def _outside_window(ev: Any, expr: Any, row: dict) -> Any:
    raise NotSupportedError(
        f"{type(expr).__name__} is only supported inside Window(...) on the encrypted database"
    )


# Known (so checked as supported when a query is built), but only inside a Window: the
# functions, a window's ordering and its frames.
for _klass in (*FUNCTIONS, OrderByList, RowRange, ValueRange):
    VALUES.add(_klass, _outside_window)


def _function(function: Any) -> Compute:
    """What computes a window's function: by its exact class (a subclass may have other
    SQL), any aggregate this backend computes over the frame."""
    compute = FUNCTIONS.get(type(function))
    if compute is not None:
        return compute
    if isinstance(function, Aggregate):
        return _aggregate  # its own class is checked where it is computed
    raise unsupported(type(function))
