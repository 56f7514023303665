"""The catalog: which models a database holds and which indexes each one keeps.

The catalog lives inside the encrypted root record, so the server never learns model,
field or index names. Index maintenance is driven by the catalog, not by the Python class
that happens to be loaded: every write updates every index the catalog lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zerodb_core.exceptions import IntegrityError, QueryError

FIELD = "field"  # ordered index on (values..., pk): eq, range, in, prefix, isnull, ordering
UNIQUE = "unique"  # ordered index on (values...) that refuses a second pk for one value
TEXT = "text"  # inverted index: (term, pk) -> term frequency, document length, positions
TRIGRAM = "trigram"  # the same, of the lowered text's trigrams (substring search)
INDEX_KINDS = (FIELD, UNIQUE, TEXT, TRIGRAM)
# Kinds kept as blocks of postings (zerodb_core.lsm.postings), not as ordered entries.
POSTINGS = frozenset({TEXT, TRIGRAM})


@dataclass(frozen=True, slots=True)
class IndexSpec:
    """One index of a model: a name unique within the model, a kind and its fields."""

    name: str
    kind: str
    fields: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise QueryError(f"unknown index kind {self.kind!r}")
        if not self.fields or (self.kind in POSTINGS and len(self.fields) != 1):
            raise QueryError(f"index {self.name!r}: wrong number of fields")

    def to_payload(self) -> list[object]:
        return [self.name, self.kind, list(self.fields)]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model of the catalog: its name and indexes (by index name)."""

    name: str
    indexes: dict[str, IndexSpec] = field(default_factory=dict)

    @property
    def record_tree(self) -> str:
        return f"r/{self.name}"

    def index_tree(self, index: IndexSpec) -> str:
        return f"i/{self.name}/{index.name}"

    def ordered_index_for(self, field_name: str) -> IndexSpec | None:
        """The single-field ordered index of ``field_name`` (unique preferred), if any."""
        best = None
        for index in self.indexes.values():
            if index.kind not in POSTINGS and index.fields == (field_name,):
                if index.kind == UNIQUE:
                    return index
                best = index
        return best

    def text_index_for(self, field_name: str, kind: str = TEXT) -> IndexSpec | None:
        """The full-text (or, with ``kind=TRIGRAM``, trigram) index of a field, if any."""
        for index in self.indexes.values():
            if index.kind == kind and index.fields == (field_name,):
                return index
        return None

    def with_index(self, index: IndexSpec) -> ModelSpec:
        return ModelSpec(self.name, {**self.indexes, index.name: index})

    def without_index(self, name: str) -> ModelSpec:
        return ModelSpec(self.name, {k: v for k, v in self.indexes.items() if k != name})

    def to_payload(self) -> list[object]:
        return [self.name, [i.to_payload() for i in self.indexes.values()]]


class Catalog:
    """Immutable map of model name -> :class:`ModelSpec`; changes return a new catalog
    (so a savepoint can keep the old one by reference)."""

    __slots__ = ("models",)

    def __init__(self, models: dict[str, ModelSpec] | None = None) -> None:
        self.models: dict[str, ModelSpec] = dict(models or {})

    def get(self, name: str) -> ModelSpec | None:
        return self.models.get(name)

    def with_model(self, spec: ModelSpec) -> Catalog:
        return Catalog({**self.models, spec.name: spec})

    def without_model(self, name: str) -> Catalog:
        return Catalog({k: v for k, v in self.models.items() if k != name})

    def to_payload(self) -> list[object]:
        return [m.to_payload() for m in self.models.values()]

    @classmethod
    def from_payload(cls, payload: Any) -> Catalog:
        """Rebuild from the root record, checking the shape (fail closed)."""
        models = {}
        try:
            for name, indexes in payload:
                specs = {}
                for index_name, kind, fields in indexes:
                    if not (
                        isinstance(index_name, str) and all(isinstance(f, str) for f in fields)
                    ):
                        raise TypeError
                    specs[index_name] = IndexSpec(index_name, kind, tuple(fields))
                if not isinstance(name, str):
                    raise TypeError
                models[name] = ModelSpec(name, specs)
        except (TypeError, ValueError, QueryError):
            raise IntegrityError("malformed catalog in root record") from None
        return cls(models)
