"""``DB``: the native API's entry point.

It opens a store, unlocks the keyring with the passphrase, reads and verifies root
records, and runs transactions. Everything else (trees, queries) works on the snapshot a
``DB`` hands out.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from blob_server.wire.storage import DEFAULT_RETENTION_SECONDS, RootRecord, Storage
from zerodb_core import gcpause
from zerodb_core.blobsource import BlobSource, open_after_reload
from zerodb_core.btree import Leaf, NodeSizes, Run, RunRef, build_run_of
from zerodb_core.btree.node import Stored
from zerodb_core.btree.run import Segment
from zerodb_core.cache import DEFAULT_CACHE_BYTES, BlobCache
from zerodb_core.collection import Collection
from zerodb_core.crypto import BlobKind, BlobSealer, Keyring, digest, slot_name
from zerodb_core.exceptions import (
    ConflictError,
    FreshnessError,
    IntegrityError,
    NotSupportedError,
    OperationalError,
    QueryError,
    SerializationError,
    UnknownEpochError,
)
from zerodb_core.freshness import FileFreshnessTracker, FreshnessTracker
from zerodb_core.isolation import SERIALIZABLE, check_level
from zerodb_core.lsm import (
    MERGE_FACTOR,
    merge_postings_reader,
    merge_reader,
    merge_windows,
    small_runs,
)
from zerodb_core.models import Model
from zerodb_core.records import Fields, RecordBlob, value_prefixes
from zerodb_core.rootstate import EMPTY_STATE, RootState, build_payload, parse_payload, root_blob_id
from zerodb_core.schema import IndexSpec
from zerodb_core.serialization import pack, unpack
from zerodb_core.transaction import (
    DeleteRecord,
    EnsureModel,
    MergeRuns,
    PutRecords,
    Savepoint,
    Transaction,
    View,
)
from zerodb_core.transport import Lease, LocalTransport, Transport, open_local_transport

if TYPE_CHECKING:
    import ssl

    from zerodb_core.keyfile import KeyFile

DEFAULT_DATABASE = "main"
T = TypeVar("T")

# What DB() opens: a URL, a blob server's (host, port), a storage or a transport.
type Store = str | tuple[str, int] | Storage | Transport
# A key file: its path (opened with the passphrase), or one already opened.
type KeyFileArg = str | os.PathLike[str] | KeyFile | None
# An open transaction block: (its transaction, the savepoint a nested block rolls back
# to; None for the outermost)
type _Block = tuple[Transaction, Savepoint | None]
# A merge: (tree, neighbouring runs, whether the oldest run of the tree is among them)
type _MergeJob = tuple[str, tuple[RunRef, ...], bool]
# Commits that meet a concurrent commit are replayed on the newer root this many times.
MAX_COMMIT_RETRIES = 32
# Before each replay a client waits a random time below 2 ms, 4 ms, ... 256 ms (full
# jitter). Without it a client committing in a loop wins every race (its next commit
# costs one round trip, a replay also reads the winner's new nodes) and starves the
# others into ConflictError (tests/server/test_concurrency.py).
CONFLICT_BACKOFF_FIRST = 0.002
CONFLICT_BACKOFF_MAX = 0.256
# DB.transactional runs a function again this many times after a serialization failure.
TRANSACTIONAL_RETRIES = 10
# Id blocks grow from this size while a model keeps asking for more, up to the maximum.
MIN_ID_BLOCK = 16
MAX_ID_BLOCK = 8192
# An embedded store is swept of old garbage after a commit at most this often (seconds);
# blobs are kept this long after they were replaced, for readers of older snapshots.
GARBAGE_INTERVAL = 60.0
GARBAGE_RETENTION = DEFAULT_RETENTION_SECONDS
# Merge rounds after one commit at most (each may complete a level for the next).
MAX_MERGE_ROUNDS = 8

logger = logging.getLogger(__name__)


class DB:
    """An encrypted database, reached through a store.

    ``store`` is ``"memory://"``, ``"sqlite:///path/file.zdb"``, a ``Storage``, a
    ``Transport``, or ``(host, port)`` of a blob server, reached as the tenant of
    ``key_file`` (a path opened with ``password``, or a ``KeyFile``; default
    ``$ZERODB_KEY_FILE``). ``kdf`` is the Argon2id preset used when the keyring is first
    created (``"moderate"``; ``"fast"`` only for tests; the ``ZERODB_KDF`` environment
    variable sets the default). ``freshness_path`` is where the highest root seen is remembered
    (default: beside an SQLite store, else in memory); ``freshness``, a
    ``FreshnessTracker``, replaces that choice. ``node_bytes`` caps the size of tree
    nodes (tests make it small to get deep trees from little data). ``merge_factor`` is
    how many runs of one size a tree's merges fold together (docs/architecture.md).
    ``isolation`` is the isolation level of its transactions: ``"serializable"`` (the
    default), ``"repeatable read"`` or ``"read committed"`` (:mod:`zerodb_core.isolation`;
    ``transaction()`` and ``begin()`` take another for one transaction).
    For a blob server only: ``tls`` (True, or an ``ssl.SSLContext``) and ``ca_file`` (the
    CA bundle that signed the server's certificate; implies TLS) encrypt the connection,
    ``timeout`` bounds connecting and each answer (seconds, default 30), ``pool_size``
    is the most connections threads may use at once (default 4).
    """

    def __init__(
        self,
        store: Store,
        username: str = "root",
        password: str | bytes | None = None,
        *,
        database: str = DEFAULT_DATABASE,
        kdf: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        freshness_path: str | os.PathLike[str] | None = None,
        delay: float = 0.0,
        node_bytes: int | None = None,
        merge_factor: int = MERGE_FACTOR,
        isolation: str = SERIALIZABLE,
        key_file: KeyFileArg = None,
        tls: bool | ssl.SSLContext | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        freshness: FreshnessTracker | None = None,
        pool_size: int | None = None,
    ) -> None:
        if not password:
            raise QueryError("a password (passphrase) is required to open an encrypted database")
        self.database = database
        self.sizes = NodeSizes() if node_bytes is None else NodeSizes.scaled(node_bytes)
        if type(merge_factor) is not int or merge_factor < 2:
            raise QueryError("merge_factor must be an int of at least 2")
        self.merge_factor = merge_factor
        self.isolation = check_level(isolation)
        remote = {"tls": tls, "ca_file": ca_file, "timeout": timeout, "pool_size": pool_size}
        self.transport = _open_transport(
            store, delay, key_file=key_file, password=password, remote=remote
        )
        self.freshness = (
            freshness if freshness is not None else _freshness_for(store, freshness_path, key_file)
        )
        # Kept in this process's memory only, to reopen the keyring after another client
        # rotated the key epoch (reload_keyring); it never leaves the client.
        self._username = username
        self._password = password
        self._keyring_lock = threading.Lock()
        self._opened_root: tuple[RootRecord, int | None] | None = None  # see _unlock
        self._root_checked = False  # whether a root from the store passed _open_root
        self.keyring = self._unlock(
            username, password, kdf or os.environ.get("ZERODB_KDF") or "moderate"
        )
        self.keys = self.keyring.hierarchy()
        tenant = getattr(self.transport, "tenant", "local")
        self.sealer = BlobSealer(self.keys, tenant, database)
        self.cache = BlobCache(cache_bytes)
        self.source = BlobSource(
            self.transport, database, self.sealer, self.cache, reload_keys=self.reload_keyring
        )
        self._latest: RootState = EMPTY_STATE
        self._local = threading.local()
        self._id_blocks: dict[str, list[int]] = {}
        self._id_lock = threading.Lock()
        self._last_collection = time.monotonic()
        # Merge commits, and the round trips and bytes they made (see stats()).
        self._merges = 0
        self._merge_cost = dict.fromkeys(("round_trips", "bytes_sent", "bytes_received"), 0)
        # The catalog each model class was last checked against (catalogs are immutable).
        self._checked_catalog: dict[type[Model], Any] = {}

    # -- opening -------------------------------------------------------------------------

    def _unlock(self, username: str, password: str | bytes, kdf: str) -> Keyring:
        tenant = getattr(self.transport, "tenant", "local")
        slot = slot_name(tenant, self.database, username)
        where = {"tenant": tenant, "database": self.database, "name": username}
        # The root comes with the keyring (one round trip) and serves the first query
        # if nothing was committed since (see read_root).
        floor = self.freshness.seen_seq(self.database)
        sealed, root = self.transport.open_database(self.database, slot)
        self._opened_root = (root, floor)
        if sealed is not None:
            return Keyring.open(sealed, password, **where)
        keyring = Keyring.create()
        blob = keyring.seal(password, kdf=kdf, **where)
        if self.transport.put_keyring(self.database, slot, blob, expected=None):
            return keyring
        # Someone created it meanwhile: use theirs.
        theirs = self.transport.get_keyring(self.database, slot)
        if theirs is None:
            raise IntegrityError("the store refused a new keyring but holds none")
        return Keyring.open(theirs, password, **where)

    def reload_keyring(self) -> None:
        """Read the keyring again (a key epoch was rotated): seal with its current epoch
        from now on, and open blobs of every epoch it holds. A keyring that lost an
        epoch this client knew is refused (that would be a rollback of the keyring)."""
        with self._keyring_lock:
            tenant = getattr(self.transport, "tenant", "local")
            slot = slot_name(tenant, self.database, self._username)
            sealed = self.transport.get_keyring(self.database, slot)
            if sealed is None:
                raise IntegrityError(f"the keyring of {self.database!r} is gone from the store")
            keyring = Keyring.open(
                sealed, self._password, tenant=tenant, database=self.database, name=self._username
            )
            if not set(self.keyring.epochs) <= set(keyring.epochs):
                raise IntegrityError(
                    f"the keyring of {self.database!r} lost key epochs "
                    f"{sorted(set(self.keyring.epochs) - set(keyring.epochs))} (rolled back?)"
                )
            self.keyring = keyring
            self.keys = keyring.hierarchy()
            self.sealer.use_keys(self.keys)

    def _open_root(self, record: RootRecord, floor: int | None = None) -> RootState:
        """Authenticate and check a root record from the store; reject rollbacks/forks.
        ``floor``: the highest seq seen when the record was asked for (threads share
        this DB, and one may commit while another's read is on its way)."""
        if record.seq == 0:
            if record.data:
                raise IntegrityError("root record with seq 0 must be empty")
            self.freshness.check(self.database, 0, None, None, floor=floor)
            self._root_checked = True
            return EMPTY_STATE
        root_digest = digest(record.data)
        latest = self._latest
        if latest.seq == record.seq and latest.digest == root_digest:
            return latest
        try:
            plaintext = self.sealer.open(BlobKind.ROOT, root_blob_id(record.seq), record.data)
        except UnknownEpochError:  # another client rotated the key epoch: learn it, once
            self.reload_keyring()
            plaintext = open_after_reload(
                self.sealer, BlobKind.ROOT, root_blob_id(record.seq), record.data
            )
        state, prev = parse_payload(unpack(plaintext), record.seq, root_digest)
        self.freshness.check(self.database, record.seq, root_digest, prev, floor=floor)
        self._root_checked = True
        if state.seq >= self._latest.seq:
            self._latest = state
        return state

    def read_root(self) -> RootState:
        """Read the current root (one round trip) and return it verified.

        No round trip when the transport vouches that the root still has the seq of the
        latest root this DB verified (read or committed), or of the root read with the
        keyring when this DB opened: that root is returned (verified first). A remote
        transport vouches through its subscription to root changes, an embedded one
        through its storage's ``root_marker``. Reads then reflect every commit whose
        change notice has reached this client (see ``RemoteTransport``); when unsure,
        the root is read.
        """
        known = self.transport.known_root_seq(self.database)
        # First the root read when this DB opened: until it is verified, the empty
        # state this DB starts from stands for nothing the store said.
        opened, self._opened_root = self._opened_root, None
        if opened is not None:
            if known == opened[0].seq:
                return self._open_root(*opened)
        elif known == self._latest.seq and self._root_checked:
            return self._latest
        floor = self.freshness.seen_seq(self.database)
        return self._open_root(self.transport.get_root(self.database), floor)

    # -- snapshots and transactions --------------------------------------------------------

    @property
    def _txn_stack(self) -> list[tuple[Transaction, Savepoint | None]]:
        """This thread's open transaction blocks: (the transaction, the savepoint a
        nested block rolls back to; None for the outermost)."""
        stack: list[tuple[Transaction, Savepoint | None]] | None = getattr(
            self._local, "stack", None
        )
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current_view(self) -> View:
        """The running transaction, or else a fresh snapshot of the latest root."""
        stack = self._txn_stack
        if stack:
            return stack[0][0]
        return View(self.source, self.read_root(), sizes=self.sizes)

    @contextlib.contextmanager
    def transaction(self, isolation: str | None = None) -> Iterator[Transaction]:
        """Commit at exit, roll back on an exception; nested blocks are savepoints (and
        keep the outer transaction's isolation level). A commit that meets a concurrent
        one replays the transaction's writes on the newer data if ``isolation`` (default:
        this DB's) allows, else raises ``SerializationError``."""
        stack = self._txn_stack
        if stack:
            txn = stack[0][0]
            sp = txn.savepoint()
            stack.append((txn, sp))
            try:
                yield txn
            except BaseException:
                txn.rollback_to(sp)
                raise
            finally:
                stack.pop()
            return
        txn = self.begin(isolation)
        stack.append((txn, None))
        try:
            yield txn
            self._commit(txn)
        finally:
            stack.pop()

    def begin(self, isolation: str | None = None) -> Transaction:
        """Start a transaction on the latest root, managed by the caller (the Django
        backend keeps one per connection): pass it to :meth:`commit` or drop it."""
        level = self.isolation if isolation is None else isolation
        return Transaction(self.source, self.read_root(), sizes=self.sizes, isolation=level)

    def transactional(
        self,
        fn: Callable[..., T] | None = None,
        *,
        retries: int = TRANSACTIONAL_RETRIES,
        isolation: str | None = None,
    ) -> Any:
        """Decorate ``fn`` to run in a transaction of its own, run again (after a short
        random backoff) when its commit raises ``SerializationError``, up to ``retries``
        more times, as FoundationDB's ``@fdb.transactional`` does. Called inside a
        transaction, ``fn`` just joins it (the outermost one retries).

        ``fn`` must be safe to run again: its effects outside the database happen once
        per attempt. ``@db.transactional`` and ``@db.transactional(retries=3)`` both work.
        """
        if fn is None:
            return functools.partial(self.transactional, retries=retries, isolation=isolation)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> T:
            if self._txn_stack:
                return fn(*args, **kwargs)
            for attempt in range(retries + 1):
                try:
                    with self.transaction(isolation):
                        return fn(*args, **kwargs)
                except SerializationError:
                    if attempt == retries:
                        raise
                    limit = CONFLICT_BACKOFF_FIRST * 2**attempt
                    time.sleep(random.uniform(0, min(limit, CONFLICT_BACKOFF_MAX)))
            raise AssertionError("unreachable")

        return run

    def snapshot(self) -> View:
        """A read-only snapshot of the latest root, outside any transaction."""
        return View(self.source, self.read_root(), sizes=self.sizes)

    def commit(self, txn: Transaction) -> None:
        """Commit a transaction from :meth:`begin`, replaying it on conflict."""
        self._commit(txn)

    def allocate_ids(self, model: str, count: int) -> list[int]:
        """``count`` new integer primary keys of ``model`` (see :meth:`allocate_id`)."""
        return [self.allocate_id(model) for _ in range(count)]

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Transaction]:
        """The running transaction (no savepoint: each write is all-or-nothing by itself,
        and a savepoint per call would make the next write copy the nodes it touches),
        or else a transaction of its own that commits at once."""
        stack = self._txn_stack
        if stack:
            yield stack[0][0]
            return
        with self.transaction() as txn:
            yield txn

    # -- the native API --------------------------------------------------------------------

    def __getitem__(self, model: type[Model]) -> Collection:
        if not (isinstance(model, type) and issubclass(model, Model)):
            raise QueryError(f"db[...] takes a Model subclass, not {model!r}")
        return Collection(self, model)

    def add(self, *objs: Model) -> None:
        """Store new objects (giving them a ``pk``) or save changed ones."""
        with gcpause.paused():  # a batch makes many records and entries, no cycles
            self._add(objs)

    def _add(self, objs: tuple[Model, ...]) -> None:
        by_model: dict[type[Model], dict[Any, Model]] = {}
        for obj in objs:
            if not isinstance(obj, Model):
                raise QueryError(f"db.add() takes Model instances, not {obj!r}")
            by_model.setdefault(type(obj), {})
        # One model's batch is all-or-nothing by itself; several need a savepoint.
        scope = self.transaction() if len(by_model) > 1 else self._writing()
        fresh = [obj for obj in objs if obj.pk is None]
        try:
            with scope as txn:
                for obj in objs:
                    if obj.pk is None:
                        obj.pk = self.allocate_id(type(obj).zerodb_name)
                    by_model[type(obj)][obj.pk] = obj  # the same object twice: saved once
                for model, batch in by_model.items():
                    self._ensure_model(txn, model)
                    rows = [(pk, obj.to_record()) for pk, obj in batch.items()]
                    new = frozenset(obj.pk for obj in fresh if type(obj) is model)
                    txn.apply(PutRecords(model.zerodb_name, rows, new))
                    for (_, fields), obj in zip(rows, batch.values()):
                        txn.loaded[id(obj)] = (obj, fields)
        except BaseException:
            for obj in fresh:  # not stored: leave them as they came
                obj.pk = None
            raise

    def remove(self, *objs: Model) -> None:
        """Delete objects (or every object of query results passed in)."""
        with self._writing() as txn:
            for item in objs:
                for obj in item if not isinstance(item, Model) else [item]:
                    txn.apply(DeleteRecord(type(obj).zerodb_name, obj.pk))
                    txn.loaded.pop(id(obj), None)

    def _ensure_model(self, txn: Transaction, model: type[Model]) -> None:
        if txn.catalog is self._checked_catalog.get(model):
            return
        spec = model.model_spec()
        current = txn.catalog.get(spec.name)
        if current is None or any(current.indexes.get(n) != i for n, i in spec.indexes.items()):
            txn.apply(EnsureModel(spec))
        self._checked_catalog[model] = txn.catalog

    def track_loaded(self, obj: Model, fields: Fields) -> None:
        """Remember objects read inside a transaction so changes to them are saved."""
        stack = self._txn_stack
        if stack:
            stack[0][0].loaded[id(obj)] = (obj, dict(fields))

    def allocate_id(self, model: str) -> int:
        """The next integer primary key of ``model``, from a block reserved in the store."""
        with self._id_lock:
            block = self._id_blocks.get(model)
            if block is None or block[0] >= block[1]:
                size = MIN_ID_BLOCK if block is None else min(block[2] * 2, MAX_ID_BLOCK)
                name = self.keys.opaque_name("sequence", f"{self.database}/{model}")
                first = self.transport.allocate_ids(self.database, name, size)
                block = self._id_blocks[model] = [first, first + size, size]
            block[0] += 1
            return block[0] - 1

    # -- committing ------------------------------------------------------------------------

    def _save_changed_objects(self, txn: Transaction) -> None:
        for obj, fields in list(txn.loaded.values()):
            now = obj.to_record()
            if now != fields:
                txn.apply(PutRecords(type(obj).zerodb_name, [(obj.pk, now)]))

    def _commit(self, txn: Transaction, *, merge: bool = True) -> None:
        with gcpause.paused():  # building and sealing runs makes many objects, no cycles
            self._commit_paused(txn, merge=merge)

    def _commit_paused(self, txn: Transaction, *, merge: bool) -> None:
        """Commit ``txn``, replaying it on the newer root each time it meets a concurrent
        commit (if its isolation level allows), at most ``MAX_COMMIT_RETRIES`` times.

        The first try races; after a lost race the client waits for its turn, the store's
        commit lease (``Transport.acquire_lease``), and replays on the root of its turn:
        then nobody else commits until it does. Without leases (a store that has none, or
        a turn that did not come) it sleeps a random backoff and races again. A store
        may also answer ``wait`` (another client's turn, nothing tried): the same, with
        nothing to replay. The lease changes who retries when, never whether a
        transaction is replayed: every root it meets is checked as after any lost race.
        """
        self._save_changed_objects(txn)
        if not txn.ops:
            return
        sealed: dict[bytes, bytes] = {}  # merged runs are the same on every attempt
        lease: Lease | None = None
        try:
            for attempt in range(MAX_COMMIT_RETRIES):
                if attempt and (lease is None or not lease.held):
                    floor = self.freshness.seen_seq(self.database)
                    lease = self.transport.acquire_lease(self.database)
                    if lease is not None:
                        self._replay_on(txn, lease.root, floor)
                    else:
                        limit = CONFLICT_BACKOFF_FIRST * 2 ** (attempt - 1)
                        time.sleep(random.uniform(0, min(limit, CONFLICT_BACKOFF_MAX)))
                if attempt and not merge and txn.runs == dict(txn.root.trees):
                    return  # a merge whose runs another client merged meanwhile: nothing left
                seq = txn.root.seq + 1
                trees, objects = txn.flush(seq)
                blobs = self._seal(objects, sealed)
                payload = build_payload(seq, txn.root.digest, trees, txn.catalog, txn.text_stats)
                sealed_root = self.sealer.seal(BlobKind.ROOT, root_blob_id(seq), pack(payload))
                floor = self.freshness.seen_seq(self.database)
                result = self.transport.commit(
                    self.database,
                    expected_seq=txn.root.seq,
                    root=sealed_root,
                    blobs=blobs,
                    garbage=txn.ws.garbage,
                    # Named only when held: a Transport subclass of before leases, with
                    # its own commit(), goes on working.
                    **({"lease": lease} if lease is not None and lease.held else {}),
                )
                if result.ok:
                    root_digest = digest(sealed_root)
                    self.freshness.check(
                        self.database, seq, root_digest, txn.root.digest, floor=floor
                    )
                    for obj in objects:
                        self.cache.put(obj.id, obj, len(blobs[obj.id]))
                    state = RootState(
                        seq,
                        root_digest,
                        trees,
                        txn.catalog,
                        dict(txn.text_stats),
                        payload["time"],
                    )
                    self._latest = state
                    self._maybe_collect_garbage()
                    if merge:
                        self._merge_runs(state)
                    return
                self._replay_on(txn, result.root, floor)
        finally:
            if lease is not None and lease.held:
                self._release_lease(lease)
        raise ConflictError(
            f"commit to {self.database!r} met a concurrent commit {MAX_COMMIT_RETRIES} times"
        )

    def _replay_on(self, txn: Transaction, record: RootRecord, floor: int | None) -> None:
        """Replay ``txn`` on the root ``record`` (verified first), which a commit met or a
        lease was granted with; raise ``SerializationError`` if its isolation level
        refuses. Nothing to do when it is the root ``txn`` is on already (a store that
        said ``wait``, or a turn with no commit in between)."""
        current = self._open_root(record, floor)
        if current.seq == txn.root.seq and current.digest == txn.root.digest:
            return
        why = txn.conflict(current)
        if why is not None:
            raise SerializationError(
                f"could not serialize access ({txn.isolation}): {why} after this "
                "transaction's snapshot; run the transaction again"
            )
        txn.rebase(current)

    def _release_lease(self, lease: Lease) -> None:
        """Give a lease back after a commit that failed; a store that cannot be reached
        lets it go by itself (on disconnect or timeout), so that is only logged."""
        try:
            self.transport.release_lease(lease)
        except (OperationalError, IntegrityError) as exc:
            logger.warning("commit lease of %r not given back: %s", self.database, exc)

    def _seal(
        self, objects: list[Stored | RecordBlob], sealed: dict[bytes, bytes]
    ) -> dict[bytes, bytes]:
        """Seal new nodes and record blobs (those sealed by an earlier attempt of the same
        commit are reused from ``sealed``)."""
        blobs: dict[bytes, bytes] = {}
        for obj in objects:
            blob = sealed.get(obj.id)
            if blob is None:
                if isinstance(obj, RecordBlob):
                    blob = self.sealer.seal(BlobKind.RECORD, obj.id, obj.data)
                else:
                    blob = self.sealer.seal(BlobKind.NODE, obj.id, pack(obj.to_payload()))
                sealed[obj.id] = blob
            blobs[obj.id] = blob
        return blobs

    def _merge_runs(self, state: RootState) -> None:
        """Merge runs of similar size while the merge policy finds some to merge.

        Each round is an ordinary commit (any client may run one; it rebases for free, as
        its inputs are immutable). A round that cannot commit (the store is unreachable
        or full, the database too busy: any ``OperationalError``) is left for after a
        later commit: merging only bounds the number of runs, and nothing depends on it.
        A store that misbehaves (a run that fails its integrity check) is logged as an
        error, not raised: the commit before it is durable, and must not look failed (a
        caller would make it again). Reads of what failed fail closed by themselves.
        """
        for _ in range(MAX_MERGE_ROUNDS):
            windows = {
                name: merge_windows(runs, self.merge_factor) for name, runs in state.trees.items()
            }
            if not any(windows.values()):
                return
            for name, runs in state.trees.items():
                small = small_runs(runs)
                if not windows[name] and small is not None:
                    windows[name] = [small]  # keep the trees in step (see small_runs)
            jobs = [
                (name, state.trees[name][start:stop], stop == len(state.trees[name]))
                for name, found in windows.items()
                for start, stop in found
            ]
            try:
                self._merge(state, jobs)
            except (ConflictError, OperationalError) as exc:  # busy, full, unreachable...
                logger.warning("merging runs of %r postponed: %s", self.database, exc)
                return
            except (IntegrityError, FreshnessError) as exc:  # the store misbehaves
                logger.error(
                    "merging runs of %r failed (the commit before it stands): %s: %s",
                    self.database,
                    type(exc).__name__,
                    exc,
                )
                return
            state = self._latest

    def warm_cache(self) -> None:
        """Read every inner node and filter of every tree into the cache (not the leaves):
        what a long-running application ends up caching, and what lets an indexed query
        cost its leaves only. About 2% of the bytes of a database."""
        view = self.current_view()
        view.run([Run(run).upper_reader() for runs in view.runs.values() for run in runs])

    def compact(self) -> int:
        """Merge every tree of more than one run into a single run (one commit); return
        how many trees were merged.

        Merges run by themselves after commits and keep the number of runs per tree
        logarithmic; compacting is for a database about to be read much and written
        little (after a bulk load, before a backup): each tree becomes one run, which
        reads fastest. It costs a rewrite of every tree it merges.
        """
        state = self.read_root()
        jobs = [(name, runs, True) for name, runs in state.trees.items() if len(runs) > 1]
        if jobs:
            self._merge(state, jobs)
        return len(jobs)

    def _merge(self, state: RootState, jobs: list[_MergeJob]) -> None:
        """Merge each ``(tree, neighbouring runs, whether the oldest is among them)``
        into one run, in one commit."""
        before = self.transport.counters.snapshot()
        try:
            self._merge_commit(state, jobs)
        finally:
            after = self.transport.counters.snapshot()
            for name in self._merge_cost:
                self._merge_cost[name] += after[name] - before[name]
        self._merges += 1

    def _merge_commit(self, state: RootState, jobs: list[_MergeJob]) -> None:
        txn = Transaction(self.source, state, sizes=self.sizes)
        readers = [
            (merge_postings_reader if txn.is_text(name) else merge_reader)(runs, bottom)
            for name, runs, bottom in jobs
        ]
        for (name, runs, _), (segments, garbage) in zip(jobs, txn.run(readers)):
            output: RunRef | None = None
            nodes: list[Stored] = []
            if segments:
                index = txn.filtered_index(name)
                output, nodes = build_run_of(
                    segments,
                    leaf_bytes=txn.leaf_bytes(name),
                    inner_bytes=self.sizes.inner,
                    postings=txn.is_text(name),
                    filter_values=None if index is None else _prefixes(index, segments),
                    newest=_newest(runs),
                )
            inputs = tuple(run.root for run in runs)
            txn.apply(MergeRuns(name, inputs, output, tuple(nodes), tuple(garbage)))
        self._commit(txn, merge=False)

    def collect_garbage(self, retention: float = GARBAGE_RETENTION) -> int:
        """Delete blobs that commits replaced more than ``retention`` seconds ago, in an
        embedded store (a blob server collects by itself); return how many."""
        collect = getattr(self.transport, "collect_garbage", None)
        self._last_collection = time.monotonic()
        return collect(retention) if collect is not None else 0

    def _maybe_collect_garbage(self) -> None:
        if time.monotonic() - self._last_collection >= GARBAGE_INTERVAL:
            self.collect_garbage()

    # -- inspection ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Round trips and bytes so far, cache behaviour, and the last root seen.

        ``merges`` counts merge commits, and the ``merge_*`` figures the share of the
        round trips and bytes that merges made (included in the totals; exact when one
        thread uses the DB, since the transport's counters are shared). ``durability``
        is what the store says an acknowledged commit survives (``"durable"``,
        ``"everysec"``, ``"os"``, ``"volatile"``, ``"unverified"``; None if it does not
        say): see docs/settings.md, "Durability".
        """
        return {
            **self.transport.counters.snapshot(),
            "merges": self._merges,
            **{f"merge_{name}": value for name, value in self._merge_cost.items()},
            "cache_hits": self.cache.hits,
            "cache_misses": self.cache.misses,
            "cache_bytes": self.cache.bytes,
            "cache_entries": len(self.cache),
            "seq": self._latest.seq,
            "durability": (self.transport.durability() or {}).get("mode"),
        }

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> DB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _newest(runs: tuple[RunRef, ...]) -> int | None:
    """The seq of the newest commit a merge of ``runs`` holds entries of (None: unknown)."""
    seqs = [run.newest for run in runs if run.newest is not None]
    return None if len(seqs) < len(runs) else max(seqs)


def _prefixes(index: IndexSpec, segments: list[Segment]) -> list[bytes] | None:
    """The values of a merged run of ``index`` (for its filter): of the new entries and
    of the leaves kept. None (no filter) when a leaf is kept unread: only runs without
    filters are merged so (``merge_reader``), and they lack one because their values
    were too many for it, as the merged run's are."""
    out: list[bytes] = []
    for segment in segments:
        if isinstance(segment, tuple):  # new entries
            keys, values = segment[0], segment[1]
        elif isinstance(segment, Leaf):  # a leaf kept, read
            keys, values = segment.keys, segment.values
        else:  # a leaf kept unread (KeptLeaf); postings are never filtered
            return None
        out += value_prefixes(index, keys, values)
    return out


def _open_transport(
    store: Store,
    delay: float,
    *,
    key_file: KeyFileArg = None,
    password: str | bytes,
    remote: dict[str, Any] | None = None,
) -> Transport:
    given = sorted(name for name, value in (remote or {}).items() if value is not None)
    if given and not isinstance(store, tuple):
        raise QueryError(f"{', '.join(given)}: for a blob server (host, port) only")
    if isinstance(store, Transport):
        return store
    if isinstance(store, Storage):
        return LocalTransport(store, delay=delay)
    if isinstance(store, tuple):
        return _open_remote(store, delay, key_file, password, remote or {})
    if isinstance(store, str):
        return open_local_transport(store, delay=delay)
    raise QueryError(f"unknown store {store!r}")


def _open_remote(
    address: tuple[str, int],
    delay: float,
    key_file: KeyFileArg,
    password: str | bytes,
    remote: dict[str, Any],
) -> Transport:
    """Log in to the blob server at ``(host, port)`` with the key file's login key.

    The key file (``key_file=`` or ``$ZERODB_KEY_FILE``) is a path opened with the
    database passphrase, or an already opened ``KeyFile``; it names the tenant and pins
    the server's id: a key file without one records the id of this first login (the file
    is re-sealed; an opened ``KeyFile`` is pinned in memory only).
    """
    # Imported here so ``python -m zerodb_core.keyfile`` does not import itself twice.
    from zerodb_core.keyfile import KeyFile, pin_server
    from zerodb_core.transport.connection import tls_context
    from zerodb_core.transport.remote import DEFAULT_POOL_SIZE, DEFAULT_TIMEOUT, RemoteTransport

    if len(address) != 2 or not isinstance(address[0], str) or type(address[1]) is not int:
        raise QueryError(f"a remote store is (host, port), not {address!r}")
    given = key_file if key_file is not None else os.environ.get("ZERODB_KEY_FILE")
    if given is None:
        raise NotSupportedError(
            "a blob server needs a key file: DB((host, port), ..., key_file=PATH) "
            "(create one with `python -m zerodb_core.keyfile create`)"
        )
    key_path = None if isinstance(given, KeyFile) else given
    key_file = given if isinstance(given, KeyFile) else KeyFile.load(given, password)
    transport = RemoteTransport(
        address[0],
        address[1],
        tenant=key_file.tenant,
        login_key=key_file.login_key,
        delay=delay,
        ssl=tls_context(remote.get("tls"), remote.get("ca_file")),
        timeout=DEFAULT_TIMEOUT if remote.get("timeout") is None else remote["timeout"],
        server_id=key_file.server_id,
        pool_size=DEFAULT_POOL_SIZE if remote.get("pool_size") is None else remote["pool_size"],
    )
    if key_file.server_id is None:
        try:
            pin_server(key_file, key_path, password, transport.server_id)
        except BaseException:
            transport.close()
            raise
    return transport


def _freshness_for(
    store: Store, path: str | os.PathLike[str] | None, key_file: KeyFileArg = None
) -> FreshnessTracker:
    """Where the highest root seen is remembered: the given path, else beside the SQLite
    file or the key file (both trusted local files of this client), else in memory."""
    if path is not None:
        return FileFreshnessTracker(path)
    if isinstance(store, str) and store.startswith("sqlite:///"):
        return FileFreshnessTracker(Path(store[len("sqlite:///") :] + ".fresh"))
    if isinstance(store, tuple):
        key_path = key_file or os.environ.get("ZERODB_KEY_FILE")
        if isinstance(key_path, str | os.PathLike):
            return FileFreshnessTracker(Path(f"{os.fspath(key_path)}.fresh"))
    return FreshnessTracker()
