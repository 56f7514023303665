"""Records of one model and the indexes that follow them.

A model's records live in its *record tree*: key ``encode_key(pk)``, value the msgpack of
``[pk, fields]``, inline in the leaves so that fetching a hundred records costs a few
leaves in one round trip. A record too large to share a leaf goes to a blob of its own
(kind RECORD) and the leaf keeps its id.

Every write keeps every index of the catalog in step, and checks unique indexes before
anything is changed, so a refused write leaves no trace.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zerodb_core.btree import BTree, Reader
from zerodb_core.crypto import BlobKind
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import IntegrityError, QueryError, UniqueViolation
from zerodb_core.schema import TEXT, UNIQUE, IndexSpec, ModelSpec
from zerodb_core.serialization import pack, unpack
from zerodb_core.text import tokenize

if TYPE_CHECKING:
    from zerodb_core.transaction import View

# Records larger than this get a blob of their own instead of a place in a leaf.
SPILL_BYTES = 4096
INLINE = b"\x00"
SPILLED = b"\x01"

_NONE_KEY = encode_key(None)


@dataclass(slots=True)
class RecordBlob:
    """A record stored in a blob of its own; dirty until its transaction commits."""

    id: bytes
    data: bytes
    gen: int = -1

    kind = BlobKind.RECORD


def decode_record(data: bytes) -> tuple[Any, dict]:
    """Return ``(pk, fields)`` from a record payload, checking its shape."""
    value = unpack(data)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], dict)):
        raise IntegrityError("malformed record payload")
    return value[0], value[1]


def spilled_ids(leaf) -> list[bytes]:
    """Blob ids a record-tree leaf points to (for commit reachability)."""
    return [v[1:] for v in leaf.values if v[:1] == SPILLED and len(v) == 17]


def index_entries(index: IndexSpec, pk: Any, pk_key: bytes, fields: dict) -> dict[bytes, bytes]:
    """Return the ``{key: value}`` entries ``index`` keeps for one record."""
    if index.kind == TEXT:
        return text_entries(index, pk, pk_key, fields)[0]
    values = [fields.get(name) for name in index.fields]
    try:
        key = encode_key(values[0]) if len(values) == 1 else b"".join(map(encode_key, values))
    except QueryError as exc:
        raise QueryError(f"index {index.name!r} cannot hold this value: {exc}") from None
    # A unique index lets NULLs repeat (as SQL does): they keep the pk in the key.
    if index.kind != UNIQUE or None in values:
        key += pk_key
    return {key: pack(pk)}


def text_entries(
    index: IndexSpec, pk: Any, pk_key: bytes, fields: dict | None
) -> tuple[dict[bytes, bytes], int]:
    """Return the postings of one document and its length in tokens (for BM25).

    A posting is ``(term, pk) -> [pk, term frequency, document length, positions]``:
    everything ranking and phrase matching need, without reading the record.
    """
    text = fields.get(index.fields[0]) if fields is not None else None
    if not isinstance(text, str):
        return {}, 0
    tokens = tokenize(text)
    positions: dict[str, list[int]] = {}
    for position, term in enumerate(tokens):
        where = positions.get(term)
        if where is None:
            positions[term] = [position]
        else:
            where.append(position)
    doc_len = len(tokens)
    entries = {
        _term_key(term) + pk_key: pack([pk, len(where), doc_len, where])
        for term, where in positions.items()
    }
    return entries, doc_len


@functools.lru_cache(maxsize=65536)
def _term_key(term: str) -> bytes:
    """The key prefix of a term; vocabularies are small next to their use, so keep them."""
    return encode_key(term)


class Table:
    """The records and indexes of one model, within one transaction or snapshot."""

    def __init__(self, view: View, spec: ModelSpec) -> None:
        self.view = view
        self.spec = spec
        self.records = view.tree(spec.record_tree)

    def index_tree(self, index: IndexSpec) -> BTree:
        return self.view.tree(self.spec.index_tree(index))

    # -- reads -------------------------------------------------------------------------

    def get_many_reader(self, pks: list[Any]) -> Reader:
        """Return ``{pk: fields}`` for the pks that exist (batched, spilled ones included)."""
        by_key = {encode_key(pk): pk for pk in pks}
        raw = yield from self.records.get_many_reader(list(by_key))
        return (yield from self._decode_reader(raw.values()))

    def _decode_reader(self, values) -> Reader:
        out: dict[Any, dict] = {}
        spilled = []
        for value in values:
            if value[:1] == INLINE:
                pk, fields = decode_record(value[1:])
                out[pk] = fields
            elif value[:1] == SPILLED and len(value) == 17:
                spilled.append((value[1:], BlobKind.RECORD))
            else:
                raise IntegrityError("malformed record reference in record tree")
        if spilled:
            blobs = yield spilled
            for request in spilled:
                pk, fields = decode_record(blobs[request].data)
                out[pk] = fields
        return out

    def scan_reader(self, *, skip: int = 0, limit: int | None = None, reverse: bool = False):
        """Return ``[(pk, fields)]`` in primary-key order."""
        raw = yield from self.records.scan_reader(skip=skip, limit=limit, reverse=reverse)
        decoded = yield from self._decode_reader(v for _, v in raw)
        return list(decoded.items())

    def get(self, pk: Any) -> dict | None:
        return self.view.run([self.get_many_reader([pk])])[0].get(pk)

    # -- writes ------------------------------------------------------------------------

    def put(self, pk: Any, fields: dict) -> dict | None:
        """Insert or replace the record ``pk``; return the fields it replaced, if any."""
        return self.put_many([(pk, fields)])[0]

    def put_many(
        self, rows: list[tuple[Any, dict]], *, fresh: frozenset = frozenset(), insert: bool = False
    ) -> list[dict | None]:
        """Insert or replace records (distinct pks); return the fields each replaced.

        A pk in ``fresh`` was just allocated by the store and must be new: if a record has
        it already, the store's id counter went backwards, and overwriting would lose data.
        With ``insert`` every pk must be new (an SQL INSERT): an existing one is a unique
        violation of the primary key.

        The whole batch is read (old records, unique probes) in batched walks and written
        tree by tree in key order, so a bulk load costs one descent per leaf touched.
        """
        pk_keys = [encode_key(pk) for pk, _ in rows]
        if len(set(pk_keys)) != len(pk_keys):
            raise QueryError("a batch of records must not repeat a primary key")
        raw = self.view.run([self.records.get_many_reader(pk_keys)])[0]
        found = self.view.run([self._decode_reader(raw.values())])[0]
        olds = [found.get(pk) for pk, _ in rows]
        for (pk, _), old in zip(rows, olds):
            if old is not None and insert and pk not in fresh:
                raise UniqueViolation(f"{self.spec.name}.pk", pk)
            if old is not None and pk in fresh:
                raise IntegrityError(
                    f"the store allocated id {pk!r} of {self.spec.name}, which is in use: "
                    "its id counter was rewound"
                )
        changes: dict[IndexSpec, tuple[list[bytes], list[tuple[bytes, bytes]]]] = {
            index: ([], []) for index in self.spec.indexes.values()
        }
        probes: dict[IndexSpec, dict[bytes, tuple[Any, dict]]] = defaultdict(dict)
        text_stats: dict[IndexSpec, list[int]] = {}
        for (pk, fields), pk_key, old in zip(rows, pk_keys, olds):
            for index, (removed, added) in changes.items():
                if index.kind == TEXT:
                    new, length = text_entries(index, pk, pk_key, fields)
                    before, old_length = text_entries(index, pk, pk_key, old)
                    stats = text_stats.setdefault(index, [0, 0])
                    stats[0] += _has_text(index, fields) - _has_text(index, old)
                    stats[1] += length - old_length
                else:
                    new = index_entries(index, pk, pk_key, fields)
                    before = index_entries(index, pk, pk_key, old) if old is not None else None
                if not before:  # a new record: every entry is added
                    added.extend(new.items())
                else:
                    removed.extend(k for k in before if k not in new)
                    added.extend((k, v) for k, v in new.items() if before.get(k) != v)
                if index.kind == UNIQUE:
                    before = before or {}
                    for key in new.keys() - before.keys():
                        if key in probes[index]:
                            raise _violation(self.spec, index, fields)
                        probes[index][key] = (pk, fields)
        # Read every path the writes below will walk, all trees at once, one round trip
        # per level; the unique probes are then answered from memory.
        self.view.run(
            [
                self.index_tree(index).paths_reader(sorted([*removed, *(k for k, _ in added)]))
                for index, (removed, added) in changes.items()
                if removed or added
            ]
        )
        self._check_unique(probes)
        for index, (docs, length) in text_stats.items():
            self.view.add_text_stats(self.spec.index_tree(index), docs, length)
        records = []
        for (pk, fields), pk_key in zip(rows, pk_keys):
            data = pack([pk, fields])
            if len(data) > SPILL_BYTES:
                blob = RecordBlob(self.view.new_id(), data, self.view.ws.gen)
                self.view.ws.add(blob)
                records.append((pk_key, SPILLED + blob.id))
            else:
                records.append((pk_key, INLINE + data))
        for value in raw.values():
            if value[:1] == SPILLED:
                self.view.retire_blob(value[1:])
        records.sort()
        self.records.put_many(records)
        for index, (removed, added) in changes.items():
            if not removed and not added:
                continue
            tree = self.index_tree(index)
            for key in removed:
                tree.delete(key)
            added.sort()
            tree.put_many(added)
        return olds

    def delete(self, pk: Any) -> dict | None:
        """Remove the record ``pk``; return its fields, or None if there was none."""
        pk_key = encode_key(pk)
        old = self.get(pk)
        if old is None:
            return None
        replaced = self.records.delete(pk_key)
        if replaced is not None and replaced[:1] == SPILLED:
            self.view.retire_blob(replaced[1:])
        entries = {
            index: sorted(index_entries(index, pk, pk_key, old))
            for index in self.spec.indexes.values()
        }
        self.view.run([self.index_tree(i).paths_reader(keys) for i, keys in entries.items()])
        for index, keys in entries.items():
            tree = self.index_tree(index)
            for key in keys:
                tree.delete(key)
            if index.kind == TEXT:
                length = text_entries(index, pk, pk_key, old)[1]
                self.view.add_text_stats(
                    self.spec.index_tree(index), -_has_text(index, old), -length
                )
        return old

    def build_index(self, index: IndexSpec) -> int:
        """Fill a new index from every record; return how many records were indexed."""
        tree = self.index_tree(index)
        rows = self.view.run([self.scan_reader()])[0]
        entries: dict[bytes, bytes] = {}
        for pk, fields in rows:
            if index.kind == TEXT:
                postings, length = text_entries(index, pk, encode_key(pk), fields)
                entries.update(postings)
                self.view.add_text_stats(
                    self.spec.index_tree(index), _has_text(index, fields), length
                )
                continue
            for key, value in index_entries(index, pk, encode_key(pk), fields).items():
                if key in entries:
                    raise _violation(self.spec, index, fields)
                entries[key] = value
        tree.put_many(sorted(entries.items()))
        return len(rows)

    def _check_unique(self, probes: dict[IndexSpec, dict[bytes, tuple[Any, dict]]]) -> None:
        """Refuse the batch if a unique key it adds belongs to another record already."""
        if not probes:
            return
        indexes = list(probes)
        readers = [self.index_tree(i).get_many_reader(list(probes[i])) for i in indexes]
        for index, found in zip(indexes, self.view.run(readers)):
            for key, value in found.items():
                pk, fields = probes[index][key]
                if unpack(value) != pk:
                    raise _violation(self.spec, index, fields)


def _violation(spec: ModelSpec, index: IndexSpec, fields: dict) -> UniqueViolation:
    value = tuple(fields.get(f) for f in index.fields)
    return UniqueViolation(f"{spec.name}.{index.name}", value[0] if len(value) == 1 else value)


def _has_text(index: IndexSpec, fields: dict | None) -> int:
    """1 if the record has a text value for ``index`` (a document for BM25), else 0."""
    return int(fields is not None and isinstance(fields.get(index.fields[0]), str))
