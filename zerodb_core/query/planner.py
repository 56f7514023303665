"""From a query expression to a plan: which index scans give candidate primary keys, how
to combine them, and what is left to check on the decrypted records.

The plan is built without I/O. Choices that need numbers (which scans of an ``And`` are
worth reading) are made by the executor from counted-tree estimates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zerodb_core.query.operators import (
    And,
    Contains,
    DoesNotContain,
    Expr,
    KeyRange,
    Match,
    Not,
    Or,
    PhrasePredicate,
    Predicate,
    Substring,
)
from zerodb_core.schema import TRIGRAM, IndexSpec, ModelSpec


@dataclass(slots=True)
class IndexScan:
    """Primary keys of the entries of an ordered index within ``ranges`` (index order)."""

    index: IndexSpec
    tree: str
    ranges: list[KeyRange]
    predicate: Predicate | None  # None: every entry of the index (an ordering scan)

    @property
    def whole_values(self) -> bool:
        """Whether every range is the entries of one whole value (see Bloom filters)."""
        return self.predicate is not None and self.predicate.whole_values()

    def describe(self) -> str:
        return f"IndexScan({self.index.name}: {self.predicate!r})"


@dataclass(slots=True)
class TextScan:
    """Primary keys of documents holding every term group (phrase), with BM25 scores."""

    index: IndexSpec
    tree: str
    predicate: PhrasePredicate

    def describe(self) -> str:
        return f"TextScan({self.index.name}: {self.predicate.text!r})"


@dataclass(slots=True)
class TrigramScan:
    """Primary keys of documents whose folded text holds a substring, in key order:
    trigram postings intersected, then their positions checked (exact, no ranking)."""

    index: IndexSpec
    tree: str
    predicate: Substring

    def describe(self) -> str:
        return f"TrigramScan({self.index.name}: {self.predicate.needle!r})"


@dataclass(slots=True)
class Intersect:
    parts: list[Source] = field(default_factory=list)

    def describe(self) -> str:
        return f"Intersect({', '.join(p.describe() for p in self.parts)})"


@dataclass(slots=True)
class Union:
    parts: list[Source] = field(default_factory=list)

    def describe(self) -> str:
        return f"Union({', '.join(p.describe() for p in self.parts)})"


@dataclass(slots=True)
class Complement:
    """Every record except those of ``part``."""

    part: Source

    def describe(self) -> str:
        return f"AllExcept({self.part.describe()})"


Source = IndexScan | TextScan | TrigramScan | Intersect | Union | Complement


@dataclass(slots=True)
class Plan:
    """Candidates (``source``; None means every record) and the ``residual`` check that
    the decrypted records must pass (None means the candidates are exact)."""

    source: Source | None
    residual: Expr | None

    def describe(self) -> str:
        source = self.source.describe() if self.source is not None else "AllRecords"
        if self.residual is None:
            return source
        return f"Filter({source}, {self.residual!r})"


def plan(expr: Expr | None, spec: ModelSpec) -> Plan:
    """Plan ``expr`` (None: everything) against the indexes ``spec`` has."""
    if expr is None:
        return Plan(None, None)
    if isinstance(expr, Predicate):
        return _plan_predicate(expr, spec)
    if isinstance(expr, And):
        subplans = [plan(e, spec) for e in expr.exprs]
        positive = any(
            p.source is not None and not isinstance(p.source, Complement) for p in subplans
        )
        sources, residuals = [], []
        for e, p in zip(expr.exprs, subplans):
            if positive and isinstance(p.source, Complement):
                # Cheaper to check "not X" on the few candidates than to list everything.
                residuals.append(e)
                continue
            if p.source is not None:
                sources.append(p.source)
            if p.residual is not None:
                residuals.append(p.residual)
        residual = (
            None if not residuals else residuals[0] if len(residuals) == 1 else And(*residuals)
        )
        if not sources:
            return Plan(None, residual)
        return Plan(sources[0] if len(sources) == 1 else Intersect(sources), residual)
    if isinstance(expr, Or):
        subplans = [plan(e, spec) for e in expr.exprs]
        if any(p.source is None for p in subplans):
            return Plan(None, expr)
        exact = all(p.residual is None for p in subplans)
        sources = [p.source for p in subplans if p.source is not None]  # none is None
        return Plan(sources[0] if len(sources) == 1 else Union(sources), None if exact else expr)
    if isinstance(expr, Not):
        sub = plan(expr.expr, spec)
        if sub.source is not None and sub.residual is None:
            return Plan(Complement(sub.source), None)
        return Plan(None, expr)
    return Plan(None, expr)


def _plan_predicate(pred: Predicate, spec: ModelSpec) -> Plan:
    if isinstance(pred, Contains):
        index = spec.text_index_for(pred.field)
        if index is not None:
            return Plan(TextScan(index, spec.index_tree(index), pred), None)
        return Plan(None, pred)
    if isinstance(pred, DoesNotContain):
        index = spec.text_index_for(pred.field)
        if index is not None:
            return Plan(Complement(TextScan(index, spec.index_tree(index), pred)), None)
        return Plan(None, pred)
    if isinstance(pred, Substring):
        index = spec.text_index_for(pred.field, TRIGRAM)
        if index is not None and pred.parts:
            return Plan(TrigramScan(index, spec.index_tree(index), pred), None)
        return Plan(None, pred)  # under 3 characters: read and check every record
    if isinstance(pred, Match):
        return Plan(None, pred)
    index = spec.ordered_index_for(pred.field)
    ranges = pred.index_ranges() if index is not None else None
    if index is None or ranges is None:
        return Plan(None, pred)
    return Plan(IndexScan(index, spec.index_tree(index), ranges, pred), None)
