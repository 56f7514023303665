"""Lazy query results of the native API.

Nothing is read when a result is made. ``len()`` is answered from index counts whenever
the plan needs no check on the records; iteration and slicing fetch records in batches,
and a page ordered by an index is read from that index alone before its records.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from zerodb_core.exceptions import QueryError
from zerodb_core.query.executor import Executor, residual_filter, sort_key
from zerodb_core.query.operators import Expr
from zerodb_core.query.planner import (
    Complement,
    IndexScan,
    Intersect,
    Plan,
    Source,
    TextScan,
    TrigramScan,
    Union,
    plan,
)
from zerodb_core.records import Table

if TYPE_CHECKING:
    from zerodb_core.collection import Collection

# Records fetched per round trip while iterating a large result.
BATCH = 512


# A record as a query returns it: (primary key, fields)
Row = tuple[Any, dict[str, Any]]


class QueryResult:
    """The objects matching a query, read on demand from one snapshot."""

    def __init__(
        self,
        collection: Collection,
        expr: Expr | None,
        *,
        sort_index: str | None = None,
        reverse: bool = False,
        skip: int = 0,
        limit: int | None = None,
    ) -> None:
        if skip < 0 or (limit is not None and limit < 0):
            raise QueryError("skip and limit must not be negative")
        self.collection = collection
        self.expr = expr
        self.sort_index = sort_index
        self.reverse = reverse
        self.skip = skip
        self.limit = limit
        self._executor: Executor | None = None
        self._plan: Plan | None = None
        self._count: int | None = None
        self._rows: list[Row] | None = None
        # Kept between batches of one iteration: the ordered candidate keys, or the
        # filtered and sorted rows, of this result's snapshot.
        self._keys: list[Any] | None = None
        self._matches: list[Row] | None = None

    # -- public --------------------------------------------------------------------------

    def __len__(self) -> int:
        if self._count is None:
            if self._rows is not None or (self.limit is not None and self.limit <= BATCH):
                # A small page costs no more to read than to count, and ``list(result)``
                # asks for the length before it iterates: read it once.
                self._count = len(self._all_rows())
            else:
                self._count = self._counted(then_read=True)
        return self._count

    def count(self) -> int:
        """The number of results, when no rows will be read after it (``len()`` reads
        what the rows will need in the same round trips, as ``list()`` counts first)."""
        if self._count is None:
            self._count = self._counted(then_read=False)
        return self._count

    def __iter__(self) -> Iterator[Any]:
        if self._rows is not None or (self.limit is not None and self.limit <= BATCH):
            for pk, fields in self._all_rows():
                yield self.collection.make(pk, fields)
            return
        # A large result streams: one batch of records per round trip (after the first
        # batch, the index part of the plan is answered from memory).
        done = 0
        while self.limit is None or done < self.limit:
            want = BATCH if self.limit is None else min(BATCH, self.limit - done)
            rows = self._fetch(self.skip + done, want)
            for pk, fields in rows:
                yield self.collection.make(pk, fields)
            if len(rows) < want:
                return
            done += len(rows)

    def __getitem__(self, item: int | slice) -> Any:
        if isinstance(item, int):
            n = item if item >= 0 else len(self) + item
            rows = self._window(n, 1)
            if not rows:
                raise IndexError("query result index out of range")
            return self.collection.make(*rows[0])
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise QueryError("query results support indexes and slices without step")
        start, stop, _ = (
            item.indices(len(self)) if _negative(item) else (item.start or 0, item.stop, 1)
        )
        limit = None if stop is None else max(stop - start, 0)
        return [self.collection.make(pk, f) for pk, f in self._window(start, limit)]

    def explain(self) -> dict[str, Any]:
        """The plan, the indexes it reads and the estimated number of candidates."""
        executor, p = self._prepared()
        if executor is None:
            return {"plan": "EmptyModel", "indexes": [], "estimated_rows": 0}
        scans: list[IndexScan | TrigramScan] = []
        _scans(p.source, scans)
        estimates = executor.estimate_many(scans) if scans else []
        return {
            "plan": p.describe(),
            "indexes": [s.index.name for s in scans],
            "estimated_rows": min(estimates) if estimates else len(executor.table.records),
            "sort_index": self.sort_index,
        }

    # -- internals -----------------------------------------------------------------------

    def _prepared(self) -> tuple[Executor | None, Plan]:
        if self._plan is None:
            table: Table | None = self.collection.table()
            if table is None:  # nothing stored yet: nothing matches
                self._plan = Plan(None, None)
                return None, self._plan
            self._executor = Executor(table)
            self._plan = self._executor.refine(plan(self.expr, table.spec))
        return self._executor, self._plan

    def _counted(self, *, then_read: bool) -> int:
        executor, p = self._prepared()
        if executor is None:
            return 0
        if self._ranks(p):
            total: int | None = len(self._source_keys(executor, p))  # iteration pages them
        else:
            total = executor.count(p, then_read=then_read)
        if total is None:
            return len(self._all_rows())
        return _window_len(total, self.skip, self.limit)

    def _ranks(self, p: Plan) -> bool:
        """Whether the result is the ranking of a search (a text scan, nothing else)."""
        return isinstance(p.source, TextScan) and p.residual is None and self.sort_index is None

    def _source_keys(self, executor: Executor, p: Plan) -> list[Any]:
        """Every candidate key in its source's order (index, rank or key order), found
        once per result: the batches of one iteration page them."""
        if self._keys is None:
            assert p.source is not None  # a plan of candidates: every caller checks
            self._keys = executor.primary_keys(p.source)[0]
            if self.reverse:
                self._keys.reverse()
        return self._keys

    def _window(self, start: int, limit: int | None) -> list[Row]:
        """Rows ``[start:start+limit]`` of this result (relative to its own skip/limit)."""
        if self.limit is not None:
            available = max(self.limit - start, 0)
            limit = available if limit is None else min(limit, available)
        if self._rows is not None:
            return self._rows[start:] if limit is None else self._rows[start : start + limit]
        return self._fetch(self.skip + start, limit)

    def _all_rows(self) -> list[Row]:
        if self._rows is None:
            self._rows = self._fetch(self.skip, self.limit)
        return self._rows

    def _fetch(self, skip: int, limit: int | None) -> list[Row]:
        executor, p = self._prepared()
        if executor is None or limit == 0:
            return []
        ordered = self._index_order(executor, p)
        if ordered is not None:
            pks = executor.index_window(ordered, skip, limit, self.reverse)
            return executor.records(pks)
        if p.source is None and p.residual is None and self.sort_index is None:
            view = executor.view
            page: list[Row] = view.run(
                [executor.table.scan_reader(skip=skip, limit=limit, reverse=self.reverse)]
            )[0]
            return page
        if (
            self._ranks(p)
            and isinstance(p.source, TextScan)  # (what _ranks says)
            and not self.reverse
            and self.limit is not None
            and self._keys is None
        ):
            # A page of ranked search results: only the best skip + limit are ranked,
            # once for every batch of the page.
            self._keys = executor.top_text(p.source, self.skip + self.limit)
        if p.source is not None and p.residual is None and self.sort_index is None:
            # Exact candidates in their own order: page the keys, then read only the
            # records of the page.
            keys = self._source_keys(executor, p)
            pks = keys[skip:] if limit is None else keys[skip : skip + limit]
            return executor.records(pks)
        if self._matches is None:
            rows = residual_filter(p.residual, self._candidates(executor, p))
            if self.sort_index is not None:
                field = self.sort_index
                rows.sort(key=lambda r: (sort_key(r[1].get(field)), sort_key(r[0])))
            if self.reverse:
                rows.reverse()
            self._matches = rows
        rows = self._matches
        return rows[skip:] if limit is None else rows[skip : skip + limit]

    def _index_order(self, executor: Executor, p: Plan) -> IndexScan | None:
        """An index scan that yields the wanted page in order by itself, if there is one."""
        if p.residual is not None:
            return None
        spec = executor.spec
        if self.sort_index is None:
            return p.source if isinstance(p.source, IndexScan) else None
        index = spec.ordered_index_for(self.sort_index)
        if index is None:
            return None
        if p.source is None:
            return IndexScan(index, spec.index_tree(index), [(b"", None)], None)
        if isinstance(p.source, IndexScan) and p.source.index == index:
            return p.source
        return None

    def _candidates(self, executor: Executor, p: Plan) -> list[Row]:
        if p.source is None:
            every: list[Row] = executor.view.run([executor.table.scan_reader()])[0]
            return every
        pks, _ = executor.primary_keys(p.source)  # in rank order when a text scan ranks
        rows: list[Row] = []
        for n in range(0, len(pks), BATCH * 8):
            rows.extend(executor.records(pks[n : n + BATCH * 8]))
        return rows


def _window_len(total: int, skip: int, limit: int | None) -> int:
    n = max(total - skip, 0)
    return n if limit is None else min(n, limit)


def _negative(item: slice) -> bool:
    return (item.start is not None and item.start < 0) or (item.stop is not None and item.stop < 0)


def _scans(source: Source | None, out: list[IndexScan | TrigramScan]) -> None:
    if isinstance(source, IndexScan):
        out.append(source)
    elif isinstance(source, Intersect | Union):
        for part in source.parts:
            _scans(part, out)
    elif isinstance(source, Complement):
        _scans(source.part, out)
