"""Copy-on-write counted B+trees over byte keys, with level-by-level batched reads."""

from zerodb_core.btree.node import CLEAN, Inner, Leaf, Node, node_from_payload
from zerodb_core.btree.tree import EMPTY_TREE, NODE_MAX_BYTES, BTree, TreeRef
from zerodb_core.btree.workspace import (
    BlobRequest,
    NodeSource,
    Reader,
    Workspace,
    gather,
    new_id,
    reachable_dirty,
)

__all__ = [
    "CLEAN",
    "EMPTY_TREE",
    "NODE_MAX_BYTES",
    "BTree",
    "BlobRequest",
    "Inner",
    "Leaf",
    "Node",
    "NodeSource",
    "Reader",
    "TreeRef",
    "Workspace",
    "gather",
    "new_id",
    "node_from_payload",
    "reachable_dirty",
]
