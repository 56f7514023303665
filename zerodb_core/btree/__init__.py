"""Immutable counted B+tree runs, with level-by-level batched reads."""

from zerodb_core.btree.node import (
    ALL_PUT,
    DELETE,
    PUT,
    REPLACE,
    Inner,
    Leaf,
    Node,
    node_from_payload,
)
from zerodb_core.btree.run import NodeSizes, Run, RunRef, build_run_of
from zerodb_core.btree.workspace import (
    BlobRequest,
    NodeSource,
    Reader,
    Workspace,
    gather,
    new_id,
)

__all__ = [
    "ALL_PUT",
    "DELETE",
    "PUT",
    "REPLACE",
    "BlobRequest",
    "Inner",
    "Leaf",
    "Node",
    "NodeSizes",
    "NodeSource",
    "Reader",
    "Run",
    "RunRef",
    "Workspace",
    "build_run_of",
    "gather",
    "new_id",
    "node_from_payload",
]
