"""``db[Model]``: the stored objects of one model class."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from zerodb_core.exceptions import DoesNotExist, QueryError
from zerodb_core.query.operators import And, Eq, Expr
from zerodb_core.query.result import QueryResult
from zerodb_core.records import Table

if TYPE_CHECKING:
    from zerodb_core.db import DB
    from zerodb_core.models import Model


class Collection:
    """Query, count and fetch the objects of one model."""

    def __init__(self, db: DB, model: type[Model]) -> None:
        self.db = db
        self.model = model

    def table(self) -> Table | None:
        return self.db.current_view().table(self.model.zerodb_name)

    def make(self, pk: Any, fields: dict[str, Any]) -> Model:
        obj = self.model.from_record(pk, fields)
        self.db.track_loaded(obj, fields)
        return obj

    def query(
        self,
        *exprs: Expr,
        sort_index: str | None = None,
        reverse: bool = False,
        skip: int = 0,
        limit: int | None = None,
        **equal: Any,
    ) -> QueryResult:
        """Objects matching every expression and ``field=value`` keyword (lazy)."""
        for e in exprs:
            if not isinstance(e, Expr):
                raise QueryError(f"not a query expression: {e!r}")
        terms = [*exprs, *(Eq(k, v) for k, v in equal.items())]
        expr = None if not terms else terms[0] if len(terms) == 1 else And(*terms)
        return QueryResult(
            self, expr, sort_index=sort_index, reverse=reverse, skip=skip, limit=limit
        )

    def all(self) -> QueryResult:
        return QueryResult(self, None)

    def __iter__(self) -> Iterator[Any]:  # objects of the model (as QueryResult)
        return iter(self.all())

    def __len__(self) -> int:
        """The number of objects, from the record tree's count (no record is read)."""
        table = self.table()
        return len(table.records) if table is not None else 0

    def get(self, pk: Any) -> Model:
        """The object with primary key ``pk``; ``DoesNotExist`` if there is none."""
        table = self.table()
        fields = table.get(pk) if table is not None else None
        if fields is None:
            raise DoesNotExist(f"{self.model.__name__} with pk {pk!r} does not exist")
        return self.make(pk, fields)

    def __repr__(self) -> str:
        return f"<Collection {self.model.__name__}>"
