"""What a database holds, from its root alone: no record or node is read.

The root record lists every tree's runs with their heights and net counts (runs are
counted B+trees of exact changes), and keeps the statistics of every text index, so a
status costs one root read (none when the latest root is known to be current).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerodb_core.btree import RunRef
from zerodb_core.rootstate import RootState
from zerodb_core.schema import POSTINGS

if TYPE_CHECKING:
    from zerodb_core.db import DB


def describe_root(state: RootState) -> dict[str, Any]:
    """Models, record counts, indexes (kind, fields, entries, height) and text index
    statistics of a root, as plain data (JSON-ready)."""
    models: dict[str, Any] = {}
    owned: set[str] = set()
    for name, spec in sorted(state.catalog.models.items()):
        records = state.trees.get(spec.record_tree, ())
        owned.add(spec.record_tree)
        indexes: dict[str, Any] = {}
        for index_name, index in sorted(spec.indexes.items()):
            tree = spec.index_tree(index)
            owned.add(tree)
            runs = state.trees.get(tree, ())
            entry: dict[str, Any] = {
                "kind": index.kind,
                "fields": list(index.fields),
                **_shape(runs),
            }
            if index.kind in POSTINGS:
                docs, tokens = state.text_stats.get(tree, (0, 0))
                entry["documents"] = docs
                entry["tokens"] = tokens
                entry["average_length"] = round(tokens / docs, 2) if docs else 0.0
            indexes[index_name] = entry
        shape = _shape(records)
        models[name] = {
            "records": shape["entries"],
            "height": shape["height"],
            "runs": shape["runs"],
            "indexes": indexes,
        }
    return {
        "seq": state.seq,
        "committed_at": state.time or None,
        "models": models,
        "unowned_trees": sorted(name for name in state.trees if name not in owned),
    }


def _shape(runs: tuple[RunRef, ...]) -> dict[str, int]:
    """Live entries, the height of the tallest run, runs and their sealed bytes."""
    return {
        "entries": sum(run.count for run in runs),
        "height": max((run.height for run in runs), default=0),
        "runs": len(runs),
        "bytes": sum(run.bytes for run in runs),
    }


def database_status(db: DB) -> dict[str, Any]:
    """:func:`describe_root` of the current root, with the database's name, tenant,
    key epochs, and the engine's counters (round trips, bytes, cache)."""
    state = db.read_root()
    return {
        "database": db.database,
        "tenant": getattr(db.transport, "tenant", None),
        "key_epochs": list(db.keys.epochs),
        "current_epoch": db.keys.current_epoch,
        **describe_root(state),
        "engine": db.stats(),
    }
