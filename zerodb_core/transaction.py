"""Snapshots and transactions.

A :class:`View` is a consistent snapshot: one verified root, the trees it names, and a
workspace for the nodes read through it. A :class:`Transaction` is a view that can also
write. Writes are *logical operations* (:class:`WriteOp`): applied at once, so the
transaction reads its own writes, and kept in order, so that when a commit meets a
concurrent one the transaction can be replayed on the newer root (rebase) instead of
failing. Replaying re-checks unique indexes against the newer data.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zerodb_core import gcpause
from zerodb_core.btree import NodeSizes, Reader, Run, RunRef, Workspace, build_run_of, new_id
from zerodb_core.btree.node import Stored
from zerodb_core.btree.run import Segment
from zerodb_core.exceptions import ConflictError, MissingBlobError, NotSupportedError, QueryError
from zerodb_core.isolation import (
    READ_COMMITTED,
    SERIALIZABLE,
    ReadSet,
    changed_range_reader,
    check_level,
)
from zerodb_core.lsm import Changes, LogTree, TextTree
from zerodb_core.records import (
    Fields,
    RecordBlob,
    Table,
    filtered,
    spilled_value_ids,
    value_prefixes,
)
from zerodb_core.rootstate import RootState
from zerodb_core.schema import POSTINGS, TRIGRAM, IndexSpec, ModelSpec

if TYPE_CHECKING:
    from zerodb_core.btree import NodeSource, Reader


class View:
    """A read-only snapshot of one database."""

    # What a serializable transaction read (see zerodb_core.isolation); a snapshot
    # checks nothing.
    reads: ReadSet | None = None

    def __init__(self, source: NodeSource, root: RootState, *, sizes: NodeSizes | None = None):
        self.source = source
        self.sizes = sizes or NodeSizes()
        self._reset(root)

    def _reset(self, root: RootState) -> None:
        self.root = root
        # When the root was in hand: how old the snapshot is, should a blob it reaches
        # have been collected (``run``).
        self.taken = time.monotonic()
        self.ws = Workspace(self.source)
        self.runs: dict[str, tuple[RunRef, ...]] = dict(root.trees)
        self.changes = Changes()
        self.catalog = root.catalog
        self.text_stats = dict(root.text_stats)
        # Nodes of runs that merges built, written at commit.
        self.merged: list[Stored] = []

    def tree(self, name: str) -> Any:
        """The tree ``name`` (a :class:`LogTree`, or a :class:`TextTree` for a full-text
        index)."""
        if self.is_text(name):
            return TextTree(self, name, self.leaf_bytes(name))
        return LogTree(self, name, self.leaf_bytes(name), self.filtered_index(name))

    def index_of(self, name: str) -> IndexSpec | None:
        """The index the tree ``name`` holds (None: a record tree, or an unknown one)."""
        if name.startswith("r/"):
            return None
        model, _, index_name = name[2:].rpartition("/")
        spec = self.catalog.get(model)
        return spec.indexes.get(index_name) if spec is not None else None

    def filtered_index(self, name: str) -> IndexSpec | None:
        """The index a tree holds, when its runs keep Bloom filters of its values."""
        index = self.index_of(name)
        return index if index is not None and filtered(index) else None

    def is_text(self, name: str) -> bool:
        """Whether the tree ``name`` is a full-text or trigram index (blocks of postings)."""
        index = self.index_of(name)
        return index is not None and index.kind in POSTINGS

    def leaf_bytes(self, name: str) -> int:
        """The leaf budget of a tree, by what it holds (records, postings, index keys)."""
        if name.startswith("r/"):
            return self.sizes.records
        index = self.index_of(name)
        if index is not None and index.kind == TRIGRAM:
            return self.sizes.trigram
        return self.sizes.text if self.is_text(name) else self.sizes.index

    def run(self, readers: list[Reader]) -> list[Any]:
        """Run read coroutines in lockstep: one batched fetch per step (with the cyclic
        collector paused: a read may make many short-lived objects, and a collection
        would walk every node in the cache)."""
        with gcpause.paused():
            try:
                return self.ws.run(readers)
            except MissingBlobError as exc:
                explain = getattr(self.source, "explain_missing", None)
                error = exc if explain is None else explain(exc, self.root.seq, self.taken)
                if error is exc:
                    raise
                raise error from exc

    def table(self, model: str) -> Table | None:
        """The records of ``model``, or None if the catalog does not know it."""
        spec = self.catalog.get(model)
        return Table(self, spec) if spec is not None else None

    def new_id(self) -> bytes:
        return new_id()

    # Writes below are only reachable through a Transaction's operations.

    def retire_blob(self, blob_id: bytes) -> None:
        if blob_id not in self.ws.dirty:
            self.ws.garbage.append(blob_id)

    def add_text_stats(self, tree: str, docs: int, length: int) -> None:
        old_docs, old_length = self.text_stats.get(tree, (0, 0))
        self.text_stats[tree] = (old_docs + docs, old_length + length)


class WriteOp:
    """A logical write: what to do, replayable on any newer snapshot."""

    def apply(self, txn: Transaction) -> Any:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class PutRecords(WriteOp):
    """Insert or replace records ``[(pk, fields), ...]`` of one model; ``fresh`` names the
    pks the store just allocated, which must not exist yet."""

    model: str
    rows: list[tuple[Any, Fields]]
    fresh: frozenset[Any] = frozenset()
    insert: bool = False

    def apply(self, txn: Transaction) -> Any:
        return txn.writable_table(self.model).put_many(
            self.rows, fresh=self.fresh, insert=self.insert
        )


@dataclass(frozen=True, slots=True)
class DeleteRecord(WriteOp):
    model: str
    pk: Any

    def apply(self, txn: Transaction) -> Any:
        table = txn.table(self.model)
        return table.delete(self.pk) if table is not None else None


@dataclass(frozen=True, slots=True)
class ExpectRecords(WriteOp):
    """Fail the commit if records read for update changed before it.

    Applied first when the rows are read, it always holds; replayed on a newer root (a
    commit met a concurrent one), it refuses to rebase a transaction whose rows were
    changed meanwhile, so a read-modify-write never silently overwrites another's write.
    ``rows`` is ``[(pk, fields or None)]`` as they were read.
    """

    model: str
    rows: tuple[tuple[Any, Fields | None], ...]

    def apply(self, txn: Transaction) -> Any:
        table = txn.table(self.model)
        pks = [pk for pk, _ in self.rows]
        found = txn.run([table.get_many_reader(pks)])[0] if table is not None else {}
        for pk, fields in self.rows:
            if found.get(pk) != fields:
                raise ConflictError(
                    f"record {pk!r} of {self.model} was changed by a concurrent commit "
                    "after it was read for update"
                )
        return None


@dataclass(frozen=True, slots=True)
class DropModel(WriteOp):
    """Remove a model: its records, every index, and its catalog entry."""

    model: str

    def apply(self, txn: Transaction) -> Any:
        spec = txn.catalog.get(self.model)
        if spec is None:
            return None
        for index in spec.indexes.values():
            txn.drop_tree(spec.index_tree(index))
            txn.text_stats.pop(spec.index_tree(index), None)
        txn.drop_tree(spec.record_tree)
        txn.catalog = txn.catalog.without_model(self.model)
        return None


@dataclass(frozen=True, slots=True)
class EnsureModel(WriteOp):
    """Add the model to the catalog if needed, and any index it lacks (built from the
    records already there). Indexes the catalog has and ``spec`` lacks are kept."""

    spec: ModelSpec
    # Told ``(records done, records)`` while an index is built (a progress bar).
    progress: Callable[[int, int], None] | None = None

    def apply(self, txn: Transaction) -> Any:
        current = txn.catalog.get(self.spec.name) or ModelSpec(self.spec.name)
        added = 0
        for index in self.spec.indexes.values():
            known = current.indexes.get(index.name)
            if known == index:
                continue
            if known is not None:
                raise NotSupportedError(
                    f"index {self.spec.name}.{index.name} changed from {known.kind} on "
                    f"{known.fields} to {index.kind} on {index.fields}; drop it first "
                    "(DropIndex) and add it under the new definition"
                )
            current = current.with_index(index)
            txn.catalog = txn.catalog.with_model(current)
            added += Table(txn, current).build_index(index, self.progress)
        if txn.catalog.get(self.spec.name) is None:
            txn.catalog = txn.catalog.with_model(current)
        return added


@dataclass(frozen=True, slots=True)
class DropIndex(WriteOp):
    model: str
    index: str

    def apply(self, txn: Transaction) -> Any:
        spec = txn.catalog.get(self.model)
        if spec is None or self.index not in spec.indexes:
            return None
        index = spec.indexes[self.index]
        txn.drop_tree(spec.index_tree(index))
        txn.text_stats.pop(spec.index_tree(index), None)
        txn.catalog = txn.catalog.with_model(spec.without_index(self.index))
        return None


@dataclass(frozen=True, slots=True)
class MergeRuns(WriteOp):
    """Replace neighbouring runs of a tree by the run merged from them.

    Its inputs are immutable, so replaying it on a newer root costs nothing: if the runs
    are still there, side by side, they are swapped for the same merged run (whose nodes
    were built once); if another client merged or dropped them meanwhile, it does nothing.
    """

    tree: str
    inputs: tuple[bytes, ...]  # root ids of the merged runs, newest first
    output: RunRef | None  # None: the entries cancelled out
    nodes: tuple[Stored, ...]
    garbage: tuple[bytes, ...]

    def apply(self, txn: Transaction) -> Any:
        runs = txn.runs.get(self.tree, ())
        roots = [run.root for run in runs]
        if self.inputs[0] not in roots:
            return False
        i = roots.index(self.inputs[0])
        j = i + len(self.inputs)
        if tuple(roots[i:j]) != self.inputs:
            return False
        if self.output is not None and not self.output.plain and j == len(runs):
            raise QueryError("a merge that kept tombstones cannot become the oldest run")
        merged = runs[:i] + ((self.output,) if self.output is not None else ()) + runs[j:]
        if merged:
            txn.runs[self.tree] = merged
        else:
            txn.runs.pop(self.tree, None)
        txn.merged.extend(self.nodes)
        for node in self.nodes:
            txn.ws.add(node)
        txn.ws.garbage.extend(self.garbage)
        return True


@dataclass(frozen=True, slots=True)
class Savepoint:
    runs: dict[str, tuple[RunRef, ...]]
    catalog: Any
    text_stats: dict[str, tuple[int, int]]
    changes: int
    garbage: int
    merged: int
    ops: int


class Transaction(View):
    """A snapshot that writes: ops are applied now and replayed on rebase, if its
    isolation level allows (see :mod:`zerodb_core.isolation`)."""

    def __init__(
        self,
        source: NodeSource,
        root: RootState,
        *,
        sizes: NodeSizes | None = None,
        isolation: str = READ_COMMITTED,
    ):
        super().__init__(source, root, sizes=sizes)
        self.isolation = check_level(isolation)
        self.reads = ReadSet() if isolation == SERIALIZABLE else None
        self.ops: list[WriteOp] = []
        # Objects read or added in this transaction, with the fields they had: changed
        # ones are saved at commit (as ZeroDB's persistent objects were).
        self.loaded: dict[int, tuple[Any, Fields]] = {}

    def apply(self, op: WriteOp) -> Any:
        # What an operation reads to do its work (old records, unique keys, rows of a new
        # index) is not a read of the transaction: a replay reads it again on the newer
        # root (and refuses what no longer holds), so it is not checked for changes.
        reads, self.reads = self.reads, None
        try:
            with gcpause.paused():  # writes build many objects and no cycles
                result = op.apply(self)
        finally:
            self.reads = reads
        self.ops.append(op)
        return result

    def writable_table(self, model: str) -> Table:
        table = self.table(model)
        if table is None:
            raise QueryError(f"model {model!r} is not in the catalog of this database")
        return table

    def drop_tree(self, name: str) -> None:
        """Forget a whole tree: every persisted node of it (and every record blob its
        live records point to) becomes garbage."""
        runs = self.runs.get(name, ())
        readers: list[Reader] = [Run(run).node_ids_reader() for run in runs]
        if name.startswith("r/") and runs:
            readers.append(self.tree(name).scan_reader())  # its live records' blobs
        results = self.run(readers) if readers else []
        self.runs.pop(name, None)
        for ids in results[: len(runs)]:
            for blob_id in ids:
                self.retire_blob(blob_id)
        if len(results) > len(runs):
            for blob_id in spilled_value_ids(v for _, v in results[-1]):
                self.retire_blob(blob_id)
        self.changes.drop(name)

    def savepoint(self) -> Savepoint:
        """Capture the state in O(number of trees): runs are immutable and pending
        changes keep an undo log."""
        return Savepoint(
            dict(self.runs),
            self.catalog,
            dict(self.text_stats),
            self.changes.mark(),
            self.ws.mark(),
            len(self.merged),
            len(self.ops),
        )

    def rollback_to(self, sp: Savepoint) -> None:
        self.runs = dict(sp.runs)
        self.catalog = sp.catalog
        self.text_stats = dict(sp.text_stats)
        self.changes.rollback_to(sp.changes)
        self.ws.rollback_to(sp.garbage)
        del self.merged[sp.merged :]
        del self.ops[sp.ops :]

    def conflict(self, current: RootState) -> str | None:
        """What keeps this transaction from being replayed on ``current`` at its
        isolation level (a sentence for the error), or None."""
        if self.isolation == READ_COMMITTED:
            return None
        keys: dict[str, set[bytes]] = {
            name: set(pending.entries)
            for name, pending in self.changes.trees.items()
            if name.startswith("r/") and pending
        }
        reads = self.reads
        if reads is not None:
            for name, read in reads.keys.items():
                keys.setdefault(name, set()).update(read)
        before = View(self.source, self.root, sizes=self.sizes)
        after = View(self.source, current, sizes=self.sizes)
        names = sorted(keys)
        old = before.run([before.tree(name).get_many_reader(sorted(keys[name])) for name in names])
        new = after.run([after.tree(name).get_many_reader(sorted(keys[name])) for name in names])
        for name, was, now in zip(names, old, new):
            if was != now:
                changed = {k for k in was.keys() | now.keys() if was.get(k) != now.get(k)}
                pending = self.changes.get(name) if name.startswith("r/") else None
                what = "wrote" if pending and changed & pending.entries.keys() else "read"
                return f"{len(changed)} key(s) this transaction {what} in {name!r} changed"
        if reads is not None:
            spans = after.run(
                [
                    changed_range_reader(self.root, current, name, ranges)
                    for name, ranges in reads.ranges.items()
                ]
            )
            for name, span in zip(reads.ranges, spans):
                if span is not None:
                    return f"a range this transaction read in {name!r} changed"
        return None

    def rebase(self, root: RootState) -> None:
        """Replay this transaction's operations on a newer root."""
        ops = self.ops
        self._reset(root)
        self.ops = []
        for op in ops:
            self.apply(op)

    def flush(
        self, seq: int | None = None
    ) -> tuple[dict[str, tuple[RunRef, ...]], list[Stored | RecordBlob]]:
        """Return the trees of the root this transaction would commit as ``seq`` (every
        tree's pending changes as one new run on top) and every new object to write."""
        trees = dict(self.runs)
        objects: list[Stored | RecordBlob] = list(self.merged)
        for name, pending in self.changes.trees.items():
            if not pending:
                continue
            postings = self.is_text(name)
            filter_values: list[bytes] | None = None
            spilled: list[bytes] = []  # record blobs the new run's values point to
            segment: Segment
            if postings:
                keys, blocks = TextTree(self, name, self.leaf_bytes(name)).pending_blocks()
                segment = (keys, blocks, b"")
            else:
                keys = pending.sorted_keys()
                entries = pending.entries
                values = [entries[key][1] for key in keys]
                segment = (keys, values, bytes(entries[key][0] for key in keys))
                index = self.filtered_index(name)
                if index is not None:
                    filter_values = value_prefixes(index, keys, values)
                if name.startswith("r/"):
                    spilled = spilled_value_ids(values)
            run, nodes = build_run_of(
                [segment],
                leaf_bytes=self.leaf_bytes(name),
                inner_bytes=self.sizes.inner,
                postings=postings,
                filter_values=filter_values,
                newest=seq,
            )
            trees[name] = (run, *trees.get(name, ()))
            objects += nodes
            if spilled:
                dirty = self.ws.dirty
                objects += [dirty[i] for i in spilled if i in dirty]
        return trees, objects
