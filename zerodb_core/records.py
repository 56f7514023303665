"""Records of one model and the indexes that follow them.

A model's records live in its *record tree*: key ``encode_key(pk)``, value the msgpack of
``[pk, fields]``, inline in small leaves so that a row costs about its own size to read.
A record too large to share a leaf goes to a blob of its own (kind RECORD) and the leaf
keeps its id.

Trees are log-structured (:mod:`zerodb_core.lsm`): a write records exact changes (a key
added, replaced or removed), which it can because it reads the old record first. Every
write keeps every index of the catalog in step, and checks unique indexes before
anything is changed, so a refused write leaves no trace.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain, islice
from operator import itemgetter, lt
from typing import TYPE_CHECKING, Any

from zerodb_core.btree import BlobRequest, Reader
from zerodb_core.crypto import BlobKind
from zerodb_core.encoding import encode_key
from zerodb_core.exceptions import IntegrityError, QueryError, UniqueViolation
from zerodb_core.lsm.postings import TextTree
from zerodb_core.schema import FIELD, POSTINGS, TEXT, TRIGRAM, UNIQUE, IndexSpec, ModelSpec
from zerodb_core.serialization import pack, unpack
from zerodb_core.text import tokenize, trigrams

if TYPE_CHECKING:
    from zerodb_core.lsm import LogTree
    from zerodb_core.transaction import View

# An index build reports its progress every this many records.
BUILD_STEP = 2000

# Records larger than this get a blob of their own instead of a place in a leaf.
SPILL_BYTES = 4096
INLINE = b"\x00"
SPILLED = b"\x01"

_NONE_KEY = encode_key(None)


# A record's fields by name, as stored (and as a model's from_record takes them).
Fields = dict[str, Any]


@dataclass(slots=True)
class RecordBlob:
    """A record stored in a blob of its own; dirty until its transaction commits."""

    id: bytes
    data: bytes

    kind = BlobKind.RECORD


def decode_record(data: bytes) -> tuple[Any, Fields]:
    """Return ``(pk, fields)`` from a record payload, checking its shape."""
    value = unpack(data)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], dict)):
        raise IntegrityError("malformed record payload")
    return value[0], value[1]


def spilled_value_ids(values: Iterable[bytes]) -> list[bytes]:
    """The blob ids that record-tree values point to (records with a blob of their own)."""
    return [v[1:] for v in values if v[:1] == SPILLED and len(v) == 17]


def index_entries(index: IndexSpec, pk: Any, pk_key: bytes, fields: Fields) -> dict[bytes, Any]:
    """Return the ``{key: value}`` entries ``index`` keeps for one record (values are
    bytes, or postings for a full-text index)."""
    if index.kind in POSTINGS:
        return text_entries(index, pk, pk_key, fields)[0]
    key, with_pk = _field_key(index, fields)
    return {key + pk_key if with_pk else key: pack(pk)}


def filtered(index: IndexSpec) -> bool:
    """Whether runs of ``index`` keep a Bloom filter of its values: ordered indexes of one
    field, whose lookups by value (equality, ``in``, unique probes) name the part of the
    key before the pk exactly."""
    return index.kind not in POSTINGS and len(index.fields) == 1


def value_prefixes(index: IndexSpec, keys: Iterable[bytes], values: Iterable[bytes]) -> list[bytes]:
    """The value part of each entry's key (what the filter of a run of ``index`` holds):
    a field index's keys end with the pk's key, and so do a unique index's keys of None;
    every entry's value (a tombstone's too) is its packed pk."""
    if index.kind == UNIQUE:
        return [_NONE_KEY if key.startswith(_NONE_KEY) else key for key in keys]
    return [key[: len(key) - _pk_key_length(v)] for key, v in zip(keys, values)]


@functools.lru_cache(maxsize=1 << 16)
def _pk_key_length(packed_pk: bytes) -> int:
    """The length of the key of a packed pk (the same pk ends the keys of every index of
    its record, so each is worked out once)."""
    return len(encode_key(unpack(packed_pk)))


def _field_key(index: IndexSpec, fields: Fields) -> tuple[bytes, bool]:
    """Return the part of an ordered index's key before the pk, and whether the pk follows.

    Encodings are prefix-free, so keys order by this part first, then by pk.
    """
    values = [fields.get(name) for name in index.fields]
    try:
        key = encode_key(values[0]) if len(values) == 1 else b"".join(map(encode_key, values))
    except QueryError as exc:
        raise QueryError(f"index {index.name!r} cannot hold this value: {exc}") from None
    # A unique index lets NULLs repeat (as SQL does): they keep the pk in the key.
    return key, index.kind != UNIQUE or None in values


def text_entries(
    index: IndexSpec, pk: Any, pk_key: bytes, fields: Fields | None
) -> tuple[dict[bytes, tuple[Any, ...]], int]:
    """Return the postings of one document and its length in tokens (for BM25).

    A posting is ``term key + pk key -> (term key, pk, document length, positions)``:
    everything ranking and phrase matching need, without reading the record (the index
    stores them in blocks, :mod:`zerodb_core.btree.blocks`). The tokens of a trigram
    index are the trigrams of the folded text, at their character offsets.
    """
    text = fields.get(index.fields[0]) if fields is not None else None
    if not isinstance(text, str):
        return {}, 0
    tokens = TOKENS[index.kind](text)
    n = len(tokens)
    postings = {}
    for term, where in term_positions(tokens).items():
        term_key = _term_key(term)
        postings[term_key + pk_key] = (term_key, pk, n, where)
    return postings, n


def term_positions(tokens: list[str]) -> dict[str, list[int]]:
    """Each distinct term of a document's tokens with its positions, in first-seen order.

    Most terms occur once in a document, and a term seen once gets a shared list of its
    one position: a bulk load then keeps a list per term and document only for repeated
    terms, and the cyclic collector, once it runs again, has that much less to walk.
    Positions are never changed once made (as blocks' decoded lists are not).
    """
    positions: dict[str, list[int]] = {}
    for position, term in enumerate(tokens):
        where = positions.get(term)
        if where is None:
            positions[term] = _positions_from(position)
        elif len(where) == 1:
            positions[term] = [where[0], position]
        else:
            where.append(position)
    return positions


def _positions_from(position: int) -> list[int]:
    """The positions of a term first seen at ``position`` (shared: never change them)."""
    return _ONE_POSITION[position] if position < _SHARED else [position]


# Positions up to this have a shared one-position list (documents of up to this many words).
_SHARED = 4096
_ONE_POSITION = tuple([position] for position in range(_SHARED))


@functools.lru_cache(maxsize=65536)
def _term_key(term: str) -> bytes:
    """The key prefix of a term; vocabularies are small next to their use, so keep them."""
    return encode_key(term)


# The tokens each kind of posting index keeps of a text.
TOKENS = {TEXT: tokenize, TRIGRAM: trigrams}

# Types whose equal values have equal keys and which no value of another type equals.
_SAME = (str, int)
# How Table.put_many makes the entries of a new record for an index.
_TEXT = "text"
_ONE_FIELD = "one field"
_OTHER = "other"


class _IndexChanges:
    """What a batch of writes does to one index: keys to remove, and entries to add.

    Entries of new records are grouped by the part of their key before the pk (a term,
    or the indexed values): within a group they come in the order of the rows, so when
    the rows are in pk order, the groups in key order are the entries in key order, with
    no sort. New entries of updated records are kept aside and sorted in; entries whose
    key an updated record keeps with a new value are replacements.
    """

    __slots__ = (
        "docs",
        "extra",
        "field",
        "groups",
        "index",
        "kind",
        "one_field",
        "prefixes",
        "removed",
        "replaced",
        "tokens",
    )

    def __init__(self, index: IndexSpec) -> None:
        self.index = index
        self.kind = index.kind
        self.field = index.fields[0]
        # An ordered index on one field whose keys all end with the pk.
        self.one_field = index.kind == FIELD and len(index.fields) == 1
        # Entries are (key, value): a packed pk, or a posting of a full-text index.
        self.removed: list[tuple[bytes, Any]] = []
        # Entries of updated records whose key stays and whose value changes.
        self.replaced: list[tuple[bytes, Any]] = []
        # An ordered index's: key prefix -> (prefix, keys, packed pks); a full-text
        # index's: term -> its postings [(pk key, pk, length, positions)].
        self.groups: dict[Any, Any] = {}
        self.extra: list[tuple[bytes, Any]] = []
        # Keys of the values seen, for the types whose equal values encode alike (not
        # 1 and 1.0 and True, which are equal as dict keys: see _SAME).
        self.prefixes: dict[Any, bytes] = {}
        self.docs = 0  # text indexes: change in documents and in tokens
        self.tokens = 0

    def entries(self, in_order: bool) -> tuple[list[bytes], list[bytes]]:
        """The new keys and values, in key order (``in_order``: the rows were in pk
        order)."""
        groups = sorted(self.groups.values(), key=itemgetter(0))
        keys = list(chain.from_iterable(map(itemgetter(1), groups)))
        values = list(chain.from_iterable(map(itemgetter(2), groups)))
        if self.extra or not in_order:
            pairs = sorted([*zip(keys, values), *self.extra])
            keys = list(map(itemgetter(0), pairs))
            values = list(map(itemgetter(1), pairs))
        return keys, values


class Table:
    """The records and indexes of one model, within one transaction or snapshot."""

    def __init__(self, view: View, spec: ModelSpec) -> None:
        self.view = view
        self.spec = spec
        self.records = view.tree(spec.record_tree)

    def index_tree(self, index: IndexSpec) -> LogTree:
        """The tree of an ordered index."""
        tree: LogTree = self.view.tree(self.spec.index_tree(index))  # (View.tree: Any)
        return tree

    def text_tree(self, index: IndexSpec) -> TextTree:
        """The tree of a full-text or trigram index."""
        tree: TextTree = self.view.tree(self.spec.index_tree(index))
        return tree

    # -- reads -------------------------------------------------------------------------

    def get_many_reader(self, pks: list[Any]) -> Reader:
        """Return ``{pk: fields}`` for the pks that exist (batched, spilled ones included)."""
        by_key = {encode_key(pk): pk for pk in pks}
        raw = yield from self.records.get_many_reader(list(by_key))
        return (yield from self._decode_reader(raw.values()))

    def _decode_reader(self, values: Iterable[bytes]) -> Reader:
        out: dict[Any, Fields] = {}
        spilled: list[BlobRequest] = []
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

    def scan_reader(
        self, *, skip: int = 0, limit: int | None = None, reverse: bool = False
    ) -> Reader:
        """Return ``[(pk, fields)]`` in primary-key order."""
        raw = yield from self.records.scan_reader(skip=skip, limit=limit, reverse=reverse)
        decoded = yield from self._decode_reader(v for _, v in raw)
        return list(decoded.items())

    def get(self, pk: Any) -> Fields | None:
        found: dict[Any, Fields] = self.view.run([self.get_many_reader([pk])])[0]
        return found.get(pk)

    # -- writes ------------------------------------------------------------------------

    def put(self, pk: Any, fields: Fields) -> Fields | None:
        """Insert or replace the record ``pk``; return the fields it replaced, if any."""
        return self.put_many([(pk, fields)])[0]

    def put_many(
        self,
        rows: list[tuple[Any, Fields]],
        *,
        fresh: frozenset[Any] = frozenset(),
        insert: bool = False,
    ) -> list[Fields | None]:
        """Insert or replace records (distinct pks); return the fields each replaced.

        A pk in ``fresh`` was just allocated by the store and must be new: if a record has
        it already, the store's id counter went backwards, and overwriting would lose data.
        With ``insert`` every pk must be new (an SQL INSERT): an existing one is a unique
        violation of the primary key.

        The old records and every unique key the batch adds are read in one batched walk
        (none at all for new pks above every run of the record tree, such as allocated
        ids); the changes then go to the transaction's pending changes, in key order.
        """
        pk_keys = [encode_key(pk) for pk, _ in rows]
        if len(set(pk_keys)) != len(pk_keys):
            raise QueryError("a batch of records must not repeat a primary key")
        in_order = all(map(lt, pk_keys, islice(pk_keys, 1, None)))
        changes = [_IndexChanges(index) for index in self.spec.indexes.values()]
        # Per index: how entries of a new record are made (a full-text index, an ordered
        # index on one field that keeps the pk in its keys, or any other), and where they
        # go; unpacked once per record and index.
        plans = [
            (
                change,
                _TEXT if change.kind in POSTINGS else _ONE_FIELD if change.one_field else _OTHER,
                change.field,
                change.groups,
                change.prefixes,
            )
            for change in changes
        ]
        # The unique keys each row's new values need, read with the old records.
        probes: dict[IndexSpec, dict[bytes, tuple[Any, Fields]]] = defaultdict(dict)
        for pk, fields in rows:
            for change in changes:
                if change.kind == UNIQUE:
                    key, with_pk = _field_key(change.index, fields)
                    if not with_pk:
                        self._probe(probes, change.index, key, pk, fields)
        indexes = list(probes)
        found_raw, *held = self.view.run(
            [
                self.records.get_many_reader(pk_keys),
                *(self.index_tree(i).get_many_reader(list(probes[i])) for i in indexes),
            ]
        )
        found = self.view.run([self._decode_reader(found_raw.values())])[0] if found_raw else {}
        if found:
            self._refuse_existing(rows, found, fresh, insert)
        olds: list[Fields | None] = (
            [found.get(pk) for pk, _ in rows] if found else [None] * len(rows)
        )
        for index, holders in zip(indexes, held):
            for key, value in holders.items():
                pk, fields = probes[index][key]
                if unpack(value) != pk:
                    raise _violation(self.spec, index, fields)
        packed_pks = []
        one, shared = _ONE_POSITION, _SHARED  # see _positions_from
        for (pk, fields), pk_key, old in zip(rows, pk_keys, olds):
            packed_pk = pack(pk)
            packed_pks.append(packed_pk)
            for change, plan, field, groups, prefixes in plans:
                if old is not None:
                    self._diff_entries(change, pk, pk_key, fields, old)
                elif plan is _ONE_FIELD:
                    value = fields.get(field)
                    # Batches repeat values: str and int keys are encoded once each.
                    prefix = prefixes.get(value) if type(value) in _SAME else None
                    if prefix is None:
                        try:
                            prefix = encode_key(value)
                        except QueryError as exc:
                            raise QueryError(
                                f"index {change.index.name!r} cannot hold this value: {exc}"
                            ) from None
                        if type(value) in _SAME:
                            prefixes[value] = prefix
                    key = prefix + pk_key
                    group = groups.get(prefix)
                    if group is None:
                        groups[prefix] = (prefix, [key], [packed_pk])
                    else:
                        group[1].append(key)
                        group[2].append(packed_pk)
                elif plan is _TEXT:
                    text = fields.get(field)
                    if isinstance(text, str):
                        tokens = TOKENS[change.kind](text)
                        n = len(tokens)
                        change.docs += 1
                        change.tokens += n
                        # Per term, its postings (turned into parallel lists below:
                        # the commit cuts blocks from them). A term's last posting is
                        # this document's if the term was seen in it already.
                        for position, term in enumerate(tokens):
                            group = groups.get(term)
                            if group is None:
                                where = one[position] if position < shared else [position]
                                groups[term] = [(pk_key, pk, n, where)]
                                continue
                            last = group[-1]
                            if last[0] is pk_key:
                                group[-1] = (pk_key, pk, n, [*last[3], position])
                            else:
                                where = one[position] if position < shared else [position]
                                group.append((pk_key, pk, n, where))
                else:
                    prefix, with_pk = _field_key(change.index, fields)
                    key = prefix + pk_key if with_pk else prefix
                    group = groups.get(prefix)
                    if group is None:
                        groups[prefix] = (prefix, [key], [packed_pk])
                    else:
                        group[1].append(key)
                        group[2].append(packed_pk)
        if rows:
            for change in changes:
                if change.kind in POSTINGS:
                    self.view.add_text_stats(
                        self.spec.index_tree(change.index), change.docs, change.tokens
                    )
        new_keys, new_values = [], []
        for (_, fields), pk_key, packed_pk, old in zip(rows, pk_keys, packed_pks, olds):
            # pack([pk, fields]) is the fixarray header, the pk, then the fields.
            data = b"\x92" + packed_pk + pack(fields)
            if len(data) > SPILL_BYTES:
                blob = RecordBlob(self.view.new_id(), data)
                self.view.ws.add(blob)
                value = SPILLED + blob.id
            else:
                value = INLINE + data
            if old is None:
                new_keys.append(pk_key)
                new_values.append(value)
            else:
                self.records.put(pk_key, value, True)
        for value in found_raw.values():
            if value[:1] == SPILLED:
                self.view.retire_blob(value[1:])
        self.records.put_new(new_keys, new_values)
        for change in changes:
            tree: LogTree | TextTree = (
                self.text_tree(change.index)
                if change.kind in POSTINGS
                else self.index_tree(change.index)
            )
            for key, value in change.removed:
                tree.delete(key, value)  # a tombstone keeps its pk (or posting)
            for key, value in change.replaced:
                tree.put(key, value, True)
            if isinstance(tree, TextTree):  # (change.kind in POSTINGS)
                for key, value in change.extra:  # new postings of updated documents
                    tree.put(key, value, False)
                for term, postings in change.groups.items():
                    pk_keys, pks, dls, positions = map(list, zip(*postings))
                    tree.add_postings(_term_key(term), pk_keys, pks, dls, positions)
            else:
                tree.put_new(*change.entries(in_order))
        return olds

    def _probe(
        self,
        probes: dict[IndexSpec, dict[bytes, tuple[Any, Fields]]],
        index: IndexSpec,
        key: bytes,
        pk: Any,
        fields: Fields,
    ) -> None:
        """Note a unique key a row takes; two rows of one batch taking it is a violation."""
        index_probes = probes[index]
        if key in index_probes:
            raise _violation(self.spec, index, fields)
        index_probes[key] = (pk, fields)

    def _refuse_existing(
        self,
        rows: list[tuple[Any, Fields]],
        found: dict[Any, Fields],
        fresh: frozenset[Any],
        insert: bool,
    ) -> None:
        """Refuse a batch that would overwrite a record it must not."""
        for pk, _ in rows:
            if pk not in found:
                continue
            if insert and pk not in fresh:
                raise UniqueViolation(f"{self.spec.name}.pk", pk)
            if pk in fresh:
                raise IntegrityError(
                    f"the store allocated id {pk!r} of {self.spec.name}, which is in use: "
                    "its id counter was rewound"
                )

    def _diff_entries(
        self, change: _IndexChanges, pk: Any, pk_key: bytes, fields: Fields, old: Fields
    ) -> None:
        """Note what replacing the record ``old`` by ``fields`` does to one index."""
        index = change.index
        if index.kind in POSTINGS:
            new, length = text_entries(index, pk, pk_key, fields)
            before, old_length = text_entries(index, pk, pk_key, old)
            change.docs += _has_text(index, fields) - _has_text(index, old)
            change.tokens += length - old_length
        else:
            new = index_entries(index, pk, pk_key, fields)
            before = index_entries(index, pk, pk_key, old)
        change.removed.extend((k, v) for k, v in before.items() if k not in new)
        for key, value in new.items():
            kept = before.get(key)
            if kept is None:
                change.extra.append((key, value))
            elif kept != value:
                change.replaced.append((key, value))

    def delete(self, pk: Any) -> Fields | None:
        """Remove the record ``pk``; return its fields, or None if there was none."""
        pk_key = encode_key(pk)
        raw = self.view.run([self.records.get_many_reader([pk_key])])[0]
        if not raw:
            return None
        value = raw[pk_key]
        old: Fields = self.view.run([self._decode_reader([value])])[0][pk]
        self.records.delete(pk_key)
        if value[:1] == SPILLED:
            self.view.retire_blob(value[1:])
        for index in self.spec.indexes.values():
            if index.kind in POSTINGS:
                text = self.text_tree(index)
                postings, length = text_entries(index, pk, pk_key, old)
                for key, value in postings.items():
                    text.delete(key, value)
                self.view.add_text_stats(
                    self.spec.index_tree(index), -_has_text(index, old), -length
                )
            else:
                tree = self.index_tree(index)
                for key, value in index_entries(index, pk, pk_key, old).items():
                    tree.delete(key, value)
        return old

    def build_index(
        self, index: IndexSpec, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Fill a new index from every record; return how many records were indexed.
        ``progress(done, total)`` is told every ``BUILD_STEP`` records (a migration's
        progress bar)."""
        tree: LogTree | TextTree = (
            self.text_tree(index) if index.kind in POSTINGS else self.index_tree(index)
        )
        rows = self.view.run([self.scan_reader()])[0]
        entries: dict[bytes, Any] = {}  # packed pks, or postings
        for done, (pk, fields) in enumerate(rows):
            if progress is not None and done % BUILD_STEP == 0:
                progress(done, len(rows))
            if index.kind in POSTINGS:
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
        keys = sorted(entries)
        tree.put_new(keys, [entries[key] for key in keys])
        if progress is not None:
            progress(len(rows), len(rows))
        return len(rows)


def _violation(spec: ModelSpec, index: IndexSpec, fields: Fields) -> UniqueViolation:
    value = tuple(fields.get(f) for f in index.fields)
    return UniqueViolation(f"{spec.name}.{index.name}", value[0] if len(value) == 1 else value)


def _has_text(index: IndexSpec, fields: Fields | None) -> int:
    """1 if the record has a text value for ``index`` (a document for BM25), else 0."""
    return int(fields is not None and isinstance(fields.get(index.fields[0]), str))
