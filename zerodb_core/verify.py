"""End-to-end verification of a database: the engine's ``fsck``.

:func:`verify` reads the current root and every blob it reaches **from the store** (not
from the cache of decrypted blobs, which would hide a blob changed since it was cached),
decrypts and authenticates each one, and checks:

* **trees**: every run of every tree is a well-formed counted B+tree: every node is of
  the kind its depth requires (inner above, leaves at the height the root names), keys
  are strictly ascending and inside the range the parent gives the node, the net and
  tombstone counts of every node equal those its parent keeps for it, the root record's
  counts and fence keys of the run match, and no node belongs to two places; the runs of
  a tree agree (a put adds an absent key, a replacement or a tombstone names a present
  one, the oldest run holds puts only);
* **records**: every record decodes (spilled records too) and sits under the key of its
  own primary key;
* **indexes**: every record has each entry its model's indexes (the catalog's) should
  hold, every entry points to an existing record whose value gives that entry, a unique
  index holds no value twice, and the statistics of a text index (documents, tokens)
  match its postings;
* **catalog**: every tree the root names belongs to a model of the catalog.

Nothing is written. Problems are collected, not raised, so one run lists them all; an
error reaching the store (``StoreUnavailableError``) still raises. Memory: the records of
one model and the entries of one of its indexes at a time.

    report = verify(db)
    if not report.ok:
        for problem in report.problems:
            print(problem)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from zerodb_core.blobsource import BlobSource
from zerodb_core.btree import PUT, REPLACE, BlobRequest, RunRef
from zerodb_core.btree.blocks import BODY, TERM_LEN, block_postings, make_block
from zerodb_core.btree.filters import BloomFilter
from zerodb_core.cache import BlobCache
from zerodb_core.crypto import BlobKind, digest
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import IntegrityError, QueryError
from zerodb_core.records import (
    INLINE,
    SPILLED,
    Fields,
    decode_record,
    filtered,
    index_entries,
    text_entries,
    value_prefixes,
)
from zerodb_core.rootstate import EMPTY_STATE, RootState, parse_payload, root_blob_id
from zerodb_core.schema import POSTINGS, UNIQUE, IndexSpec, ModelSpec
from zerodb_core.serialization import unpack

if TYPE_CHECKING:
    from zerodb_core.db import DB

# Blobs fetched per request while verifying (one round trip each).
VERIFY_BATCH = 256

# ``progress(advance, total)``: called with ``(0, total)`` once the root is read (total =
# entries of every tree to check), then with ``(entries checked since, 0)``.
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Problem:
    """One inconsistency: where (``root``, a tree, an index) and what is wrong."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify` checked and every problem it found."""

    database: str
    seq: int = 0
    problems: list[Problem] = field(default_factory=list)
    blobs: int = 0  # blobs fetched, decrypted and authenticated (the root included)
    trees: int = 0
    records: int = 0
    index_entries: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "seq": self.seq,
            "ok": self.ok,
            "blobs": self.blobs,
            "trees": self.trees,
            "records": self.records,
            "index_entries": self.index_entries,
            "problems": [{"where": p.where, "message": p.message} for p in self.problems],
        }


def verify(
    db: DB,
    *,
    models: Iterable[str] | None = None,
    progress: Progress | None = None,
    batch: int = VERIFY_BATCH,
) -> VerifyReport:
    """Verify the current root of ``db`` and everything it reaches (see the module doc).

    ``models`` limits the check to these catalog names (then trees of no model are not
    looked for). The root is checked for freshness like any root this ``DB`` reads.
    """
    report = VerifyReport(db.database)
    source = BlobSource(db.transport, db.database, db.sealer, BlobCache(0))
    state = _read_root(db, report)
    if state is None:
        return report
    checker = _Checker(source, state, report, progress, batch)
    checker.run(None if models is None else list(models))
    return report


def _read_root(db: DB, report: VerifyReport) -> RootState | None:
    """Fetch, decrypt and parse the current root (bypassing the DB's latest root)."""
    floor = db.freshness.seen_seq(db.database)  # as DB.read_root: threads may commit
    record = db.transport.get_root(db.database)
    report.seq = record.seq
    if record.seq == 0:
        if record.data:
            report.problems.append(Problem("root", "root record with seq 0 is not empty"))
            return None
        db.freshness.check(db.database, 0, None, None, floor=floor)
        return EMPTY_STATE
    root_digest = digest(record.data)
    try:
        plaintext = db.sealer.open(BlobKind.ROOT, root_blob_id(record.seq), record.data)
        state, prev = parse_payload(unpack(plaintext), record.seq, root_digest)
    except IntegrityError as exc:
        report.problems.append(Problem("root", str(exc)))
        return None
    report.blobs += 1
    db.freshness.check(db.database, record.seq, root_digest, prev, floor=floor)
    return state


class _Checker:
    def __init__(
        self,
        source: BlobSource,
        state: RootState,
        report: VerifyReport,
        progress: Progress | None,
        batch: int,
    ) -> None:
        self.source = source
        self.state = state
        self.report = report
        self.progress = progress
        self.batch = max(1, batch)
        self.seen: set[bytes] = set()

    def problem(self, where: str, message: str) -> None:
        self.report.problems.append(Problem(where, message))

    # -- the whole database ------------------------------------------------------------

    def run(self, models: list[str] | None) -> None:
        catalog = self.state.catalog
        trees = self.state.trees
        if models is None:
            specs = list(catalog.models.values())
            owned = {s.record_tree for s in specs}
            owned.update(s.index_tree(i) for s in specs for i in s.indexes.values())
            orphans = sorted(name for name in trees if name not in owned)
        else:
            specs = []
            for name in models:
                spec = catalog.get(name)
                if spec is None:
                    self.problem(name, "no such model in the catalog")
                else:
                    specs.append(spec)
            orphans = []
        if self.progress is not None:
            names = [s.record_tree for s in specs]
            names += [s.index_tree(i) for s in specs for i in s.indexes.values()]
            # Entries at least (replacements are not counted anywhere).
            total = sum(r.count + 2 * r.dels for n in names + orphans for r in trees.get(n, ()))
            self.progress(0, total)
        for spec in specs:
            self.check_model(spec)
        for name in orphans:
            self.problem(name, "the root names this tree but no model of the catalog owns it")
            self.walk(name)

    def check_model(self, spec: ModelSpec) -> None:
        rows = self.records(spec)
        for index in spec.indexes.values():
            self.check_index(spec, index, rows)

    # -- records -----------------------------------------------------------------------

    def records(self, spec: ModelSpec) -> dict[bytes, tuple[Any, Fields]]:
        """Decode every record of a model: ``{key: (pk, fields)}``."""
        where = spec.record_tree
        rows: dict[bytes, tuple[Any, Fields]] = {}
        spilled: list[tuple[bytes, bytes]] = []
        for key, value in self.walk(where):
            if value[:1] == INLINE:
                self.record(where, key, value[1:], rows)
            elif value[:1] == SPILLED and len(value) == 17:
                spilled.append((key, value[1:]))
            else:
                self.problem(where, f"malformed record reference under key {key.hex()}")
        for start in range(0, len(spilled), self.batch):
            chunk = spilled[start : start + self.batch]
            blobs = self.fetch(where, [(blob_id, BlobKind.RECORD) for _, blob_id in chunk])
            for key, blob_id in chunk:
                if blob_id in self.seen:
                    self.problem(where, f"record blob {blob_id.hex()} is referenced twice")
                self.seen.add(blob_id)
                blob = blobs.get((blob_id, BlobKind.RECORD))
                if blob is not None:
                    self.record(where, key, blob.data, rows)
        self.report.records += len(rows)
        return rows

    def record(
        self, where: str, key: bytes, data: bytes, rows: dict[bytes, tuple[Any, Fields]]
    ) -> None:
        try:
            pk, fields = decode_record(data)
            own_key = encode_key(pk)
        except (IntegrityError, QueryError) as exc:
            self.problem(where, f"record under key {key.hex()} does not decode: {exc}")
            return
        if own_key != key:
            self.problem(where, f"record {pk!r} is stored under the key of another primary key")
            return
        rows[key] = (pk, fields)

    # -- indexes -----------------------------------------------------------------------

    def check_index(
        self, spec: ModelSpec, index: IndexSpec, rows: dict[bytes, tuple[Any, Fields]]
    ) -> None:
        tree = spec.index_tree(index)
        where = f"index {spec.name}.{index.name}"
        actual = dict(self.walk(tree, index=index))
        self.report.index_entries += len(actual)
        expected: dict[bytes, Any] = {}  # packed pks, or postings of a text index
        owner: dict[bytes, Any] = {}
        docs = tokens = 0
        for pk_key, (pk, fields) in rows.items():
            try:
                if index.kind in POSTINGS:
                    entries, length = text_entries(index, pk, pk_key, fields)
                    docs += isinstance(fields.get(index.fields[0]), str)
                    tokens += length
                else:
                    entries = index_entries(index, pk, pk_key, fields)
            except QueryError as exc:
                self.problem(where, f"record {pk!r} has a value no index can hold: {exc}")
                continue
            for key, value in entries.items():
                if key in expected:
                    kind = "a unique index" if index.kind == UNIQUE else "the index"
                    self.problem(
                        where,
                        f"records {owner[key]!r} and {pk!r} have the same value, which "
                        f"{kind} holds only once (duplicate)",
                    )
                    continue
                expected[key] = value
                owner[key] = pk
        for key, value in expected.items():
            found = actual.get(key)
            if found is None:
                self.problem(where, f"record {owner[key]!r} has no entry in the index")
            elif found != value:
                self.problem(where, f"the entry of record {owner[key]!r} has a wrong value")
        for key in actual.keys() - expected.keys():
            pk = _entry_pk(index, actual[key])
            try:
                exists = pk is not _UNREADABLE and encode_key(pk) in rows
            except QueryError:
                exists = False
            if pk is _UNREADABLE:
                self.problem(where, f"entry {key.hex()} does not decode")
            elif exists:
                self.problem(
                    where, f"an entry points to record {pk!r} but does not match its value"
                )
            else:
                self.problem(where, f"an entry points to record {pk!r}, which does not exist")
        if index.kind in POSTINGS:
            stats = self.state.text_stats.get(tree, (0, 0))
            if stats != (docs, tokens):
                self.problem(
                    where,
                    f"text statistics say {stats[0]} documents and {stats[1]} tokens; the "
                    f"records give {docs} and {tokens}",
                )

    # -- trees -------------------------------------------------------------------------

    def walk(self, name: str, *, index: IndexSpec | None = None) -> list[tuple[bytes, Any]]:
        """Check every run of a tree (holding ``index``, if any) and return its live
        entries in key order: each key's newest entry, the runs applied oldest first. A
        full-text index's entries are blocks; its postings are returned, keyed by term
        key and pk key."""
        postings = index is not None and index.kind in POSTINGS
        self.report.trees += 1
        runs = self.state.trees.get(name, ())
        live: dict[bytes, Any] = {}
        for age, run in enumerate(reversed(runs)):
            where = f"{name} run {run.root.hex()}"
            if age == 0 and not run.plain:
                self.problem(where, "the oldest run of a tree holds more than puts")
            disagreements = 0
            entries = self.walk_run(where, run)
            if run.filter is not None:
                self.check_filter(where, run, index, entries)
            if postings:
                entries = self.unblock(where, entries)
            for key, tag, value in entries:
                if tag == PUT:
                    disagreements += key in live
                    live[key] = value
                elif tag == REPLACE:
                    disagreements += key not in live
                    live[key] = value
                else:
                    disagreements += live.pop(key, None) is None
            if disagreements:
                self.problem(
                    where,
                    f"{disagreements} entries disagree with the older runs (a put of a "
                    "present key, or a replacement or tombstone of an absent one)",
                )
        return sorted(live.items())

    def walk_run(self, name: str, run: RunRef) -> list[tuple[bytes, int, bytes]]:
        """Fetch every node of a run level by level, check its shape and counts, and
        return its entries ``(key, tag, value)`` in key order (of the parts that could
        be read)."""
        entries: list[tuple[bytes, int, bytes]] = []
        # (node id, lower bound or None, upper bound or None, net and tombstone counts
        # the parent keeps)
        level: list[tuple[bytes, bytes | None, bytes | None, tuple[int, int]]] = [
            (run.root, None, None, (run.count, run.dels))
        ]
        for depth in range(run.height):
            leaves = depth == run.height - 1
            deeper: list[tuple[bytes, bytes | None, bytes | None, tuple[int, int]]] = []
            for start in range(0, len(level), self.batch):
                chunk = level[start : start + self.batch]
                fresh = [item for item in chunk if self.visit(name, item[0])]
                nodes = self.fetch(name, [node_id for node_id, *_ in fresh])
                advance = 0
                for node_id, lo, hi, expected in fresh:
                    node = nodes.get(node_id)
                    if node is None:
                        continue
                    where = f"{name} node {node_id.hex()}"
                    if node.is_leaf != leaves:
                        kind = "a leaf" if node.is_leaf else "an inner node"
                        self.problem(
                            where, f"{kind} at depth {depth} of a run of height {run.height}"
                        )
                        continue
                    keys = node.keys
                    separators = keys if leaves else keys[1:]
                    if any(a >= b for a, b in pairwise(separators)):
                        self.problem(where, "keys are not in strictly ascending order")
                    if separators and (
                        (lo is not None and separators[0] < lo)
                        or (hi is not None and separators[-1] >= hi)
                    ):
                        self.problem(where, "keys lie outside the range its parent gives it")
                    if leaves:
                        counts = (node.net(0, len(keys)), node.tombstones())
                        entries.extend(zip(keys, node.tags or bytes(len(keys)), node.values))
                        advance += counts[0] + 2 * counts[1]  # as the total counts
                    else:
                        dels = node.dels or [0] * len(node.counts)
                        counts = (sum(node.counts), sum(dels))
                        n = len(node.children)
                        for i, child in enumerate(node.children):
                            bounds = (keys[i] if i else lo, keys[i + 1] if i + 1 < n else hi)
                            deeper.append((child, *bounds, (node.counts[i], dels[i])))
                    if counts != expected:
                        self.problem(
                            where,
                            f"holds {counts[0]} net entries and {counts[1]} tombstones but "
                            f"its parent counts {expected[0]} and {expected[1]}",
                        )
                if advance and self.progress is not None:
                    self.progress(advance, 0)
            level = deeper
        if entries and not (run.may_hold(entries[0][0]) and run.may_hold(entries[-1][0])):
            self.problem(name, "the root record's fence keys do not enclose the run's keys")
        if entries and run.plain and any(tag != PUT for _, tag, _ in entries):
            self.problem(name, "the root record says the run holds only puts, but it does not")
        return entries

    def check_filter(
        self,
        where: str,
        run: RunRef,
        index: IndexSpec | None,
        entries: list[tuple[bytes, int, Any]],
    ) -> None:
        """A run's Bloom filter must hold the value of every entry (a value it missed
        would make lookups skip the run: a wrong answer, not a slow one)."""
        bloom_id = run.filter
        if bloom_id is None or not self.visit(where, bloom_id):
            return
        if index is None or not filtered(index):
            self.problem(where, "the run has a filter, but its tree keeps none")
            return
        found = self.fetch(where, [bloom_id]).get(bloom_id)
        if found is None:
            return
        if not isinstance(found, BloomFilter):
            self.problem(where, "the run's filter is not a filter")
            return
        try:
            values = value_prefixes(index, [k for k, _, _ in entries], [v for _, _, v in entries])
        except IntegrityError:
            self.problem(where, "an entry's value is not a packed primary key")
            return
        missed = sum(not found.may_hold(value) for value in values)
        if missed:
            self.problem(where, f"the run's filter misses {missed} of its values")

    def unblock(self, where: str, blocks: list[tuple[bytes, int, Any]]) -> list[tuple[Any, ...]]:
        """The postings of a run's blocks, ``(term key + pk key, tag, posting)``, each
        block checked against what its postings say (key, order, counts, bounds)."""
        out: list[tuple[bytes, int, Any]] = []
        for key, _, block in blocks:
            term_len = block[TERM_LEN]
            term_key = key[:term_len]
            try:
                pks, tags, dls, positions = block_postings(block)
            except IntegrityError as exc:
                self.problem(where, f"block {key.hex()}: {exc}")
                continue
            try:
                pk_keys = [encode_key(pk) for pk in pks]
            except QueryError:
                self.problem(where, f"block {key.hex()} holds a primary key no key encodes")
                continue
            expected = make_block(term_len, pks, tags, dls, positions)
            if (
                key[term_len:] != pk_keys[0]
                or any(a >= b for a, b in pairwise(pk_keys))
                or expected[:BODY] != block[:BODY]
            ):
                self.problem(where, f"block {key.hex()} disagrees with its own postings")
            for pk_key, pk, tag, dl, at in zip(pk_keys, pks, tags, dls, positions):
                out.append((term_key + pk_key, tag, (term_key, pk, dl, at)))
        return out

    def visit(self, name: str, node_id: bytes) -> bool:
        if node_id in self.seen:
            self.problem(name, f"node {node_id.hex()} is reached twice")
            return False
        self.seen.add(node_id)
        return True

    def fetch(self, where: str, requests: list[BlobRequest]) -> dict[BlobRequest, Any]:
        """Fetch and decrypt blobs; a batch that fails is retried blob by blob, so every
        blob that fails authentication (or is missing) is reported."""
        if not requests:
            return {}
        try:
            found = self.source.fetch(requests)
        except IntegrityError:
            found = {}
            for request in requests:
                try:
                    found.update(self.source.fetch([request]))
                except IntegrityError as exc:
                    self.problem(where, str(exc))
        self.report.blobs += len(found)
        return found


_UNREADABLE = object()


def _entry_pk(index: IndexSpec, value: Any) -> Any:
    """The primary key an index entry's value names (or ``_UNREADABLE``)."""
    if index.kind in POSTINGS:
        return value[1]  # a posting: (term key, pk, document length, positions)
    try:
        return unpack(value)
    except IntegrityError:
        return _UNREADABLE
