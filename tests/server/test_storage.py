"""The Storage contract, run against every backend (memory is the reference)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from blob_server.exceptions import (
    BlobExistsError,
    InvalidRequestError,
    NotStagedError,
    QuotaExceededError,
    StorageUnavailableError,
)
from blob_server.storage import (
    EMPTY_ROOT,
    MemoryStorage,
    Quota,
    RedisStorage,
    RootRecord,
    SQLiteStorage,
    Storage,
    open_storage,
)
from blob_server.storage.cluster import ClusterStorage

T, D = "tenant", "db"


class FakeClock:
    """A clock the test moves by hand, so retention is tested without sleeping."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def new_id() -> bytes:
    return os.urandom(16)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class OnEventLoop:
    """A storage whose ``commit``, ``stage`` and ``get_blobs`` go through ``acommit``,
    ``astage`` and ``aget_blobs`` on an event loop of their own, as the server calls them;
    everything else is the storage's. The whole contract then runs on the asynchronous
    path too."""

    def __init__(self, store: Storage) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def commit(self, *args, **kwargs):
        return self._run(self.store.acommit(*args, **kwargs))

    def get_blobs(self, *args, **kwargs):
        return self._run(self.store.aget_blobs(*args, **kwargs))

    def stage(self, *args, **kwargs):
        return self._run(self.store.astage(*args, **kwargs))

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def close(self) -> None:
        self._run(self.store.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        self.store.close()


@pytest.fixture(
    params=["memory", "sqlite", "redis", "redis-async", "sqlite-async", "cluster", "cluster-async"]
)
def storage(request, tmp_path, clock):
    kind, _, path = request.param.partition("-")
    if kind == "memory":
        store: Storage = MemoryStorage(clock=clock)
    elif kind == "sqlite":
        store = SQLiteStorage(tmp_path / "store.zdb", clock=clock)
    elif kind == "cluster":  # the session's 3-master Redis Cluster, emptied first
        store = request.getfixturevalue("cluster_storage_factory")(clock=clock)
    else:  # the session's own redis-server (tests/server/conftest.py), emptied first
        store = request.getfixturevalue("redis_storage_factory")(clock=clock)
    if path == "async":
        store = OnEventLoop(store)
    yield store
    store.close()


def commit(
    store: Storage, seq: int, blobs=None, garbage=(), root=None, tenant=T, database=D, staged=()
):
    blobs = {new_id(): os.urandom(32)} if blobs is None else blobs
    root = f"root-{seq + 1}".encode() if root is None else root
    return store.commit(
        tenant, database, expected_seq=seq, root=root, blobs=blobs, garbage=garbage, staged=staged
    )


# -- roots and commits -------------------------------------------------------------------


def test_root_starts_empty(storage):
    assert storage.get_root(T, D) == EMPTY_ROOT
    assert storage.get_blobs(T, D, [new_id()]) == {}
    assert storage.stats(T, D)["seq"] == 0


def test_commit_increments_seq_and_stores_blobs(storage):
    blobs = {new_id(): b"a" * 100, new_id(): b"b" * 200}
    result = commit(storage, 0, blobs)
    assert result.ok and result.root == RootRecord(1, b"root-1")
    assert storage.get_root(T, D) == RootRecord(1, b"root-1")
    assert storage.get_blobs(T, D, list(blobs)) == blobs

    more = {new_id(): b"c"}
    assert commit(storage, 1, more).root.seq == 2
    assert storage.get_blobs(T, D, [*blobs, *more]) == {**blobs, **more}
    stats = storage.stats(T, D)
    assert (stats["seq"], stats["blobs"], stats["bytes"]) == (2, 3, 301)


def test_commit_without_blobs_only_moves_root(storage):
    assert commit(storage, 0, {}).ok
    assert storage.get_root(T, D).seq == 1


def test_conflict_returns_current_root_and_changes_nothing(storage):
    commit(storage, 0, root=b"first")
    stale_blob = new_id()
    result = commit(storage, 0, {stale_blob: b"x"}, garbage=[new_id()], root=b"stale")
    assert not result.ok
    assert result.root == RootRecord(1, b"first")
    assert storage.get_root(T, D) == RootRecord(1, b"first")
    assert storage.get_blobs(T, D, [stale_blob]) == {}
    assert storage.stats(T, D)["garbage"] == 0
    # A seq from the future conflicts too.
    assert not commit(storage, 5).ok


def test_existing_blob_id_rolls_back_the_whole_commit(storage):
    taken = new_id()
    commit(storage, 0, {taken: b"original"}, root=b"r1")
    fresh = [new_id() for _ in range(5)]
    blobs = {i: b"new" for i in fresh[:3]} | {taken: b"overwrite"} | {i: b"new" for i in fresh[3:]}
    with pytest.raises(BlobExistsError, match=taken.hex()):
        commit(storage, 1, blobs, garbage=[new_id()], root=b"r2")
    assert storage.get_root(T, D) == RootRecord(1, b"r1")
    assert storage.get_blobs(T, D, [taken, *fresh]) == {taken: b"original"}
    assert storage.stats(T, D)["garbage"] == 0
    assert commit(storage, 1, {i: b"new" for i in fresh}).ok  # nothing half-written


def test_get_blobs_omits_missing_ids_and_handles_big_batches(storage):
    present = {new_id(): os.urandom(64) for _ in range(1_300)}  # > several IN chunks
    commit(storage, 0, present)
    missing = [new_id() for _ in range(50)]
    asked = list(present)[:700] + missing + list(present)[700:]
    assert storage.get_blobs(T, D, asked) == present
    assert storage.get_blobs(T, D, missing) == {}
    assert storage.get_blobs(T, D, []) == {}
    some = list(present)[:3]
    assert storage.get_blobs(T, D, some + some) == {i: present[i] for i in some}
    assert storage.get_blobs(T, D, (i for i in some)) == {i: present[i] for i in some}


def test_threads_committing_with_retries_lose_nothing(storage):
    written: list[bytes] = []

    def worker():
        seq = storage.get_root(T, D).seq
        for _ in range(25):
            blob = new_id()
            while not (result := commit(storage, seq, {blob: b"x"})).ok:
                seq = result.root.seq
            seq = result.root.seq
            written.append(blob)  # list.append is atomic

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert storage.get_root(T, D).seq == 100
    assert len(storage.get_blobs(T, D, written)) == 100


# -- staging -----------------------------------------------------------------------------
# A transaction too large for one request stages its blobs first (pending: stored, counted,
# reached by no root) and its commit makes them live, atomically with the root swap.


def stage(store: Storage, blobs: dict, tenant=T, database=D, quota: Quota | None = None):
    return store.stage(tenant, database, blobs, **({} if quota is None else {"quota": quota}))


def test_staged_blobs_become_live_with_the_commit(storage):
    staged = {new_id(): b"s" * 100, new_id(): b"t" * 50}
    inline = {new_id(): b"i" * 10}
    assert stage(storage, staged) is None
    stats = storage.stats(T, D)
    assert (stats["seq"], stats["blobs"], stats["bytes"], stats["staged"]) == (0, 2, 150, 2)
    assert storage.get_root(T, D) == EMPTY_ROOT  # nothing reaches them yet
    assert storage.get_blobs(T, D, list(staged)) == staged  # readable by id, like any blob
    assert commit(storage, 0, inline, root=b"r1", staged=list(staged)).ok
    stats = storage.stats(T, D)
    assert (stats["seq"], stats["blobs"], stats["bytes"], stats["staged"]) == (1, 3, 160, 0)
    assert storage.get_blobs(T, D, [*staged, *inline]) == staged | inline
    # Live now: naming them as staged again is refused, and so is staging them again.
    with pytest.raises(NotStagedError):
        commit(storage, 1, {}, staged=list(staged)[:1])
    with pytest.raises(BlobExistsError):
        stage(storage, {next(iter(staged)): b"again"})
    assert stage(storage, {}) is None  # nothing to stage is no write at all
    assert storage.stats(T, D)["staged"] == 0


def test_an_unknown_staged_id_fails_the_commit_and_changes_nothing(storage):
    commit(storage, 0, {}, root=b"r1")
    pending = {new_id(): b"p" * 20 for _ in range(3)}
    stage(storage, pending)
    before = usage_of(storage)
    unknown, fresh, dead = new_id(), new_id(), new_id()
    with pytest.raises(NotStagedError, match=unknown.hex()):
        commit(storage, 1, {fresh: b"f"}, garbage=[dead], root=b"r2", staged=[*pending, unknown])
    assert storage.get_root(T, D) == RootRecord(1, b"r1")
    assert storage.get_blobs(T, D, [fresh]) == {}
    stats = storage.stats(T, D)
    assert (stats["staged"], stats["garbage"]) == (3, 0)  # still pending, for a retry
    assert usage_of(storage) == before
    assert commit(storage, 1, {fresh: b"f"}, root=b"r2", staged=list(pending)).ok


def test_a_staged_id_of_another_database_or_tenant_cannot_be_committed(storage):
    blob = new_id()
    stage(storage, {blob: b"mine"}, tenant="alice", database="db")
    for tenant, database in [("alice", "db2"), ("bob", "db")]:
        with pytest.raises(NotStagedError):
            commit(storage, 0, {}, staged=[blob], tenant=tenant, database=database)
        assert storage.get_root(tenant, database) == EMPTY_ROOT
        assert storage.get_blobs(tenant, database, [blob]) == {}
        assert storage.stats(tenant, database)["staged"] == 0
    assert commit(storage, 0, {}, staged=[blob], tenant="alice", database="db").ok


def test_a_stale_commit_keeps_its_staged_blobs_pending_for_the_retry(storage):
    commit(storage, 0, {}, root=b"r1")
    pending = {new_id(): b"p" * 30 for _ in range(4)}
    stage(storage, pending)
    ids = list(pending)
    # The seq is checked first: a stale commit is answered with the current root even
    # if a staged id is unknown.
    result = commit(storage, 0, {}, root=b"stale", staged=[*ids, new_id()])
    assert not result.ok and result.root == RootRecord(1, b"r1")
    assert storage.stats(T, D)["staged"] == 4
    # The retry reuses two of them and releases the other two as garbage.
    assert commit(storage, 1, {}, root=b"r2", staged=ids[:2], garbage=ids[2:]).ok
    stats = storage.stats(T, D)
    assert (stats["staged"], stats["garbage"], stats["blobs"]) == (0, 2, 4)
    with pytest.raises(NotStagedError):  # a released id is no longer pending
        commit(storage, 2, {}, staged=ids[2:3])


def test_a_taken_id_fails_the_stage_or_the_commit_and_changes_nothing(storage):
    live, pending = new_id(), new_id()
    commit(storage, 0, {live: b"live"}, root=b"r1")
    stage(storage, {pending: b"pending"})
    before = usage_of(storage), storage.stats(T, D)
    for taken in (live, pending):
        fresh = new_id()
        with pytest.raises(BlobExistsError, match=taken.hex()):
            stage(storage, {fresh: b"new", taken: b"overwrite"})
        with pytest.raises(BlobExistsError, match=taken.hex()):
            commit(storage, 1, {fresh: b"new", taken: b"overwrite"}, staged=[pending])
        assert storage.get_blobs(T, D, [fresh, taken]) == {
            taken: b"live" if taken == live else b"pending"
        }
    assert (usage_of(storage), storage.stats(T, D)) == before
    # A new blob that already exists is reported before an unknown staged id.
    with pytest.raises(BlobExistsError):
        commit(storage, 1, {live: b"x"}, staged=[new_id()])


def test_staged_blobs_count_toward_the_quota_when_staged(storage):
    quota = Quota(max_bytes=1000, max_blobs=5)
    first = {new_id(): b"a" * 300 for _ in range(3)}
    stage(storage, first, quota=quota)
    assert usage_of(storage) == (3, 900, 1)  # a database with pending blobs only
    refused = {new_id(): b"b" * 60, new_id(): b"c" * 50}
    with pytest.raises(QuotaExceededError, match="900 used, the write adds 110"):
        stage(storage, refused, quota=quota)
    assert storage.get_blobs(T, D, list(refused)) == {}
    assert storage.stats(T, D)["staged"] == 3 and usage_of(storage)[:2] == (3, 900)
    # Making them live adds nothing: only the root and the inline blob count now.
    assert quota_commit(
        storage, 0, {new_id(): b"i" * 90}, quota, root=b"r" * 10, staged=list(first)
    ).ok
    assert usage_of(storage)[:2] == (4, 1000)
    with pytest.raises(QuotaExceededError, match="quota of 1000 bytes"):
        stage(storage, {new_id(): b"x"}, quota=quota)
    # An unknown staged id is reported before the quota.
    with pytest.raises(NotStagedError):
        quota_commit(storage, 1, {new_id(): b"y" * 500}, quota, staged=[new_id()])


def test_pending_blobs_are_collected_after_the_staging_timeout(storage, clock):
    orphans = {new_id(): b"o" * 40 for _ in range(3)}
    kept = {new_id(): b"k" * 10}
    stage(storage, orphans, database="one")
    stage(storage, kept, database="two")
    clock.now += 50
    young = {new_id(): b"y" * 20}
    stage(storage, young, database="one")
    assert usage_of(storage) == (5, 150, 2)
    assert storage.collect_garbage(staging_timeout=51) == 0
    # Made live in time, a staged blob is never collected by the timeout.
    assert commit(storage, 0, {}, root=b"", staged=list(kept), database="two").ok
    assert storage.collect_garbage(staging_timeout=50) == 3  # exactly 50 s old is due
    assert storage.get_blobs(T, "one", [*orphans, *young]) == young
    assert storage.get_blobs(T, "two", list(kept)) == kept
    assert usage_of(storage) == (2, 30, 2)
    assert storage.stats(T, "one")["staged"] == 1
    with pytest.raises(NotStagedError):  # a collected orphan cannot be committed
        commit(storage, 0, {}, staged=list(orphans)[:1], database="one")
    clock.now += 3600
    assert storage.collect_garbage() == 1  # the default timeout is an hour
    assert usage_of(storage) == (1, 10, 1) and storage.stats(T, "one")["staged"] == 0


def test_a_released_pending_blob_waits_out_the_garbage_retention(storage, clock):
    unused = new_id()
    stage(storage, {unused: b"u" * 10})
    assert commit(storage, 0, {}, root=b"", garbage=[unused]).ok
    stats = storage.stats(T, D)
    assert (stats["staged"], stats["garbage"], stats["blobs"]) == (0, 1, 1)
    clock.now += 60
    assert storage.collect_garbage(retention=61, staging_timeout=0) == 0
    assert storage.collect_garbage(retention=60) == 1
    assert usage_of(storage)[:2] == (0, 0)


def test_bad_staging_arguments_are_refused(storage):
    for blobs in ([(new_id(), b"x")], {new_id(): "text"}, {b"short": b"x"}, None):
        with pytest.raises(InvalidRequestError):
            stage(storage, blobs)
    for staged in (new_id(), [b"short"], ["a" * 16], None):
        with pytest.raises(InvalidRequestError):
            commit(storage, 0, {}, staged=staged)
    with pytest.raises(InvalidRequestError):
        stage(storage, {new_id(): b"x"}, tenant="")
    for timeout in [-1, float("nan"), float("inf"), "60", None]:
        with pytest.raises(InvalidRequestError, match="staging_timeout"):
            storage.collect_garbage(staging_timeout=timeout)
    assert storage.get_root(T, D) == EMPTY_ROOT and usage_of(storage) == (0, 0, 0)


# -- id blocks ---------------------------------------------------------------------------


def test_id_blocks_are_contiguous_and_never_overlap(storage):
    assert storage.allocate_ids(T, D, "app.Employee", 10) == 1
    assert storage.allocate_ids(T, D, "app.Employee", 5) == 11
    assert storage.allocate_ids(T, D, "app.Employee", 1) == 16
    assert storage.allocate_ids(T, D, "app.Department", 3) == 1  # per sequence
    assert storage.allocate_ids(T, "other", "app.Employee", 2) == 1  # per database
    assert storage.allocate_ids(T, D, "app.Employee", 4) == 17


def test_id_blocks_from_threads_never_overlap(storage):
    taken: list[range] = []
    lock = threading.Lock()

    def worker():
        for _ in range(25):
            first = storage.allocate_ids(T, D, "seq", 7)
            with lock:
                taken.append(range(first, first + 7))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numbers = sorted(n for block in taken for n in block)
    assert numbers == list(range(1, 4 * 25 * 7 + 1))


# -- keyrings ----------------------------------------------------------------------------


def test_keyring_compare_and_set(storage):
    assert storage.get_keyring(T, D, "master") is None
    assert storage.put_keyring(T, D, "master", b"k1", expected=None)
    assert not storage.put_keyring(T, D, "master", b"k2", expected=None)  # slot not empty
    assert not storage.put_keyring(T, D, "master", b"k2", expected=b"wrong")
    assert storage.get_keyring(T, D, "master") == b"k1"
    assert storage.put_keyring(T, D, "master", b"k2", expected=b"k1")
    assert storage.get_keyring(T, D, "master") == b"k2"
    assert not storage.put_keyring(T, D, "other", b"x", expected=b"k2")  # slots are separate
    assert storage.get_keyring(T, D, "other") is None
    assert storage.stats(T, D)["keyrings"] == 1


# -- garbage -----------------------------------------------------------------------------


def test_garbage_is_deleted_only_after_retention(storage, clock):
    old, kept = new_id(), new_id()
    commit(storage, 0, {old: b"old", kept: b"kept"})
    clock.now += 5
    commit(storage, 1, {}, garbage=[old])
    assert storage.stats(T, D)["garbage"] == 1

    clock.now += 59
    assert storage.collect_garbage(retention=60) == 0
    assert storage.get_blobs(T, D, [old]) == {old: b"old"}  # old snapshots still readable

    clock.now += 1
    assert storage.collect_garbage(retention=60) == 1
    assert storage.get_blobs(T, D, [old, kept]) == {kept: b"kept"}
    assert storage.stats(T, D)["garbage"] == 0
    assert storage.collect_garbage(retention=0) == 0


def test_garbage_collection_across_databases_and_unknown_ids(storage, clock):
    a, b = new_id(), new_id()
    commit(storage, 0, {a: b"a"}, database="one")
    commit(storage, 0, {b: b"b"}, database="two")
    commit(storage, 1, {}, garbage=[a, new_id()], database="one")  # an id never written
    commit(storage, 1, {}, garbage=[b], database="two")
    clock.now += 10
    assert storage.collect_garbage(retention=5) == 2
    assert storage.get_blobs(T, "one", [a]) == {}
    assert storage.get_blobs(T, "two", [b]) == {}


def test_default_retention_keeps_fresh_garbage(storage):
    blob = new_id()
    commit(storage, 0, {blob: b"x"})
    commit(storage, 1, {}, garbage=[blob])
    assert storage.collect_garbage() == 0
    assert storage.get_blobs(T, D, [blob]) == {blob: b"x"}


# -- isolation ---------------------------------------------------------------------------


def test_tenants_and_databases_are_isolated(storage):
    blob = new_id()
    commit(storage, 0, {blob: b"mine"}, root=b"A", tenant="alice", database="db")
    storage.put_keyring("alice", "db", "master", b"ka", expected=None)
    storage.allocate_ids("alice", "db", "seq", 10)

    for tenant, database in [("bob", "db"), ("alice", "db2"), ("bob", "db2")]:
        assert storage.get_root(tenant, database) == EMPTY_ROOT
        assert storage.get_blobs(tenant, database, [blob]) == {}
        assert storage.get_keyring(tenant, database, "master") is None
        assert storage.allocate_ids(tenant, database, "seq", 1) == 1
        assert storage.stats(tenant, database)["blobs"] == 0

    # The same blob id may exist in another database: ids are scoped, not global.
    commit(storage, 0, {blob: b"theirs"}, root=b"B", tenant="bob", database="db")
    assert storage.get_blobs("alice", "db", [blob]) == {blob: b"mine"}
    assert storage.get_blobs("bob", "db", [blob]) == {blob: b"theirs"}
    # Garbage named by one database never deletes another's blob.
    commit(storage, 1, {}, garbage=[blob], tenant="bob", database="db")
    storage.collect_garbage(retention=0)
    assert storage.get_blobs("alice", "db", [blob]) == {blob: b"mine"}
    assert storage.get_root("alice", "db") == RootRecord(1, b"A")


def test_names_that_could_collide_when_joined_stay_apart(storage):
    commit(storage, 0, root=b"x", tenant="a:b", database="c")
    assert storage.get_root("a", "b:c") == EMPTY_ROOT


# -- invalid arguments -------------------------------------------------------------------

BAD_IDS = [b"short", b"x" * 17, "a" * 16, memoryview(bytes(16)), 16, None]
BAD_NAMES = ["", "x" * 256, None, b"bytes", 3, "nul\x00"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_blob_ids_are_refused(storage, bad):
    with pytest.raises(InvalidRequestError):
        storage.get_blobs(T, D, [bad])
    with pytest.raises(InvalidRequestError):
        commit(storage, 0, {bad: b"x"})
    with pytest.raises(InvalidRequestError):
        commit(storage, 0, {}, garbage=[bad])
    assert storage.get_root(T, D) == EMPTY_ROOT


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_names_are_refused(storage, bad):
    with pytest.raises(InvalidRequestError):
        storage.get_root(bad, D)
    with pytest.raises(InvalidRequestError):
        storage.get_blobs(T, bad, [new_id()])
    with pytest.raises(InvalidRequestError):
        commit(storage, 0, tenant=bad)
    with pytest.raises(InvalidRequestError):
        storage.allocate_ids(T, D, bad, 1)
    with pytest.raises(InvalidRequestError):
        storage.get_keyring(T, D, bad)
    with pytest.raises(InvalidRequestError):
        storage.put_keyring(T, D, bad, b"k", expected=None)


@pytest.mark.parametrize("count", [0, -1, 10**7, True, 1.0, "3", None])
def test_bad_counts_are_refused(storage, count):
    with pytest.raises(InvalidRequestError):
        storage.allocate_ids(T, D, "seq", count)
    assert storage.allocate_ids(T, D, "seq", 1) == 1  # nothing was reserved


def test_other_bad_arguments_are_refused(storage):
    for kwargs in [
        {"expected_seq": -1},
        {"expected_seq": "0"},
        {"expected_seq": None},
        {"root": "text"},
        {"root": None},
        {"blobs": [(new_id(), b"x")]},
        {"blobs": {new_id(): "text"}},
        {"garbage": new_id()},  # a lone id, not a collection of ids
    ]:
        args = {"expected_seq": 0, "root": b"r", "blobs": {}, "garbage": ()} | kwargs
        with pytest.raises(InvalidRequestError):
            storage.commit(T, D, **args)
    with pytest.raises(InvalidRequestError):
        storage.get_blobs(T, D, new_id())  # a lone id
    with pytest.raises(InvalidRequestError):
        storage.put_keyring(T, D, "k", "text", expected=None)
    with pytest.raises(InvalidRequestError):
        storage.put_keyring(T, D, "k", b"x", expected="text")
    for retention in [-1, float("nan"), float("inf"), "60", None]:
        with pytest.raises(InvalidRequestError):
            storage.collect_garbage(retention=retention)
    assert storage.get_root(T, D) == EMPTY_ROOT


# -- open_storage ------------------------------------------------------------------------


def test_open_storage_memory():
    store = open_storage("memory://")
    assert isinstance(store, MemoryStorage)
    assert open_storage("memory://") is not store  # every URL opens a fresh store


def test_open_storage_sqlite_creates_parent_dirs_and_persists(tmp_path):
    path = tmp_path / "nested" / "dir" / "store.zdb"
    store = open_storage(f"sqlite:///{path}")
    assert isinstance(store, SQLiteStorage)
    blob = new_id()
    commit(store, 0, {blob: b"kept"})
    store.close()
    with pytest.raises(StorageUnavailableError):
        store.get_root(T, D)
    again = open_storage(f"sqlite:///{path}")
    assert again.get_root(T, D).seq == 1
    assert again.get_blobs(T, D, [blob]) == {blob: b"kept"}
    again.close()


def test_open_storage_sqlite_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    open_storage("sqlite:///data/rel.zdb").close()
    assert (tmp_path / "data" / "rel.zdb").exists()


def test_open_storage_redis(redis_server, redis_storage_factory):  # the factory empties db 0
    redis_server.client(3).flushdb()
    store = open_storage(redis_server.url(3))
    assert isinstance(store, RedisStorage)
    blob = new_id()
    commit(store, 0, {blob: b"kept"})
    store.close()
    again = open_storage(redis_server.url(3))
    assert again.get_blobs(T, D, [blob]) == {blob: b"kept"}
    assert redis_server.client(0).dbsize() == 0  # the URL's database number is honoured
    redis_server.client(3).flushdb()
    again.close()


@pytest.mark.parametrize(
    "url",
    [
        "valkey://localhost",
        "postgres:///x",
        "",
        "memory://x",
        "sqlite://host/x",
        "sqlite:///",
        "redis://",
        "redis:localhost",
        "redis://localhost:notaport/0",
        "redis://localhost/notadb",
    ],
)
def test_open_storage_refuses_unknown_urls(url):
    with pytest.raises(StorageUnavailableError, match="URL"):
        open_storage(url)


def test_open_storage_refuses_unopenable_files(tmp_path):
    junk = tmp_path / "junk.zdb"
    junk.write_bytes(b"not a database" * 500)
    with pytest.raises(StorageUnavailableError, match="not a database"):
        open_storage(f"sqlite:///{junk}")
    with pytest.raises(StorageUnavailableError, match="directory"):
        open_storage(f"sqlite:///{tmp_path}")
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StorageUnavailableError):
        open_storage(f"sqlite:///{blocker}/sub/store.zdb")


# -- usage and quotas --------------------------------------------------------------------
#
# Usage per tenant = blobs stored, and bytes of blobs + roots + keyring slots; a quota is
# checked inside the same atomic write that changes the usage.


def usage_of(store: Storage, tenant: str = T) -> tuple[int, int, int]:
    usage = store.usage(tenant)
    return usage.blobs, usage.bytes, usage.databases


def quota_commit(store: Storage, seq: int, blobs: dict, quota: Quota, root=b"", **kwargs):
    return store.commit(
        kwargs.pop("tenant", T),
        kwargs.pop("database", D),
        expected_seq=seq,
        root=root,
        blobs=blobs,
        garbage=kwargs.pop("garbage", ()),
        quota=quota,
        staged=kwargs.pop("staged", ()),
    )


def test_usage_counts_blobs_and_the_bytes_of_blobs_roots_and_keyrings(storage):
    assert usage_of(storage) == (0, 0, 0)
    commit(storage, 0, {new_id(): b"x" * 100, new_id(): b"y" * 50}, root=b"r" * 10)
    assert usage_of(storage) == (2, 160, 1)
    commit(storage, 1, {new_id(): b"z" * 7}, root=b"r" * 4)  # the root shrinks by 6
    assert usage_of(storage) == (3, 161, 1)
    assert storage.put_keyring(T, D, "slot", b"k" * 30, expected=None)
    assert usage_of(storage) == (3, 191, 1)
    assert storage.put_keyring(T, D, "slot", b"k" * 20, expected=b"k" * 30)
    assert not storage.put_keyring(T, D, "slot", b"k" * 99, expected=b"wrong")
    assert usage_of(storage) == (3, 181, 1)
    assert not commit(storage, 0, {new_id(): b"stale"}).ok  # a conflict counts nothing
    storage.allocate_ids(T, D, "sequence", 5)  # counters are not counted
    assert usage_of(storage) == (3, 181, 1)

    commit(storage, 0, {new_id(): b"w" * 5}, root=b"", database="other")
    assert usage_of(storage) == (4, 186, 2)  # one tenant, two databases
    assert usage_of(storage, "someone-else") == (0, 0, 0)

    detail = storage.usage(T, detail=True).per_database
    figures = sorted((d.seq, d.blobs, d.bytes, d.garbage) for d in detail)
    assert figures == [(1, 1, 5, 0), (2, 3, 157, 0)]  # blob bytes only, per database
    backend = storage.store if isinstance(storage, OnEventLoop) else storage
    if isinstance(backend, (RedisStorage, ClusterStorage)):  # no names in Redis: opaque tags
        assert all(d.label.startswith("tag:") and len(d.label) == 36 for d in detail)
    else:
        assert sorted(d.label for d in detail) == [D, "other"]
        assert storage.tenant_names() == [T]


def test_a_commit_past_the_quota_is_refused_and_changes_nothing(storage):
    quota = Quota(max_bytes=1000, max_blobs=3)
    first = {new_id(): b"a" * 400, new_id(): b"b" * 400}
    assert quota_commit(storage, 0, first, quota, root=b"r" * 10).ok
    assert usage_of(storage)[:2] == (2, 810)

    refused = new_id()
    with pytest.raises(QuotaExceededError) as caught:
        quota_commit(storage, 1, {refused: b"c" * 200}, quota, root=b"s" * 10, garbage=[new_id()])
    error = caught.value
    assert (error.tenant, error.resource, error.used, error.adding, error.limit) == (
        T,
        "bytes",
        810,
        200,
        1000,
    )
    assert "quota of 1000 bytes" in str(error) and "810 used" in str(error)
    assert storage.get_root(T, D) == RootRecord(1, b"r" * 10)
    assert storage.get_blobs(T, D, [refused]) == {}
    assert storage.stats(T, D)["garbage"] == 0
    assert usage_of(storage)[:2] == (2, 810)

    # Exactly at the limit is allowed; then the blob limit refuses the next blob.
    assert quota_commit(storage, 1, {new_id(): b"c" * 190}, quota, root=b"s" * 10).ok
    assert usage_of(storage)[:2] == (3, 1000)
    with pytest.raises(QuotaExceededError, match="quota of 3 blobs") as caught:
        quota_commit(storage, 2, {new_id(): b""}, quota, root=b"")
    assert (caught.value.resource, caught.value.used, caught.value.adding) == ("blobs", 3, 1)
    # A commit that adds nothing (a smaller root, no blobs) still goes through at the limit.
    assert quota_commit(storage, 2, {}, quota, root=b"t").ok
    assert usage_of(storage)[:2] == (3, 991)
    # The seq is checked first: a stale commit gets the current root, not a quota error.
    assert not quota_commit(storage, 0, {new_id(): b"x" * 5000}, quota).ok


def test_an_existing_blob_id_is_reported_before_the_quota(storage):
    taken = new_id()
    commit(storage, 0, {taken: b"x"}, root=b"")
    with pytest.raises(BlobExistsError):
        quota_commit(storage, 1, {taken: b"y" * 100}, Quota(max_bytes=10))


def test_quota_is_per_tenant_across_its_databases(storage):
    quota = Quota(max_blobs=2)
    assert quota_commit(storage, 0, {new_id(): b"1"}, quota, database="one").ok
    assert quota_commit(storage, 0, {new_id(): b"2"}, quota, database="two").ok
    with pytest.raises(QuotaExceededError):
        quota_commit(storage, 0, {new_id(): b"3"}, quota, database="three")
    # Another tenant has a usage of its own.
    assert quota_commit(storage, 0, {new_id(): b"1", new_id(): b"2"}, quota, tenant="u2").ok
    assert usage_of(storage) == (2, 2, 2) and usage_of(storage, "u2") == (2, 2, 1)


def test_garbage_collection_gives_the_usage_back(storage, clock):
    quota = Quota(max_blobs=2, max_bytes=10_000)
    a, b = new_id(), new_id()
    assert quota_commit(storage, 0, {a: b"a" * 100, b: b"b" * 200}, quota, root=b"r").ok
    with pytest.raises(QuotaExceededError):
        quota_commit(storage, 1, {new_id(): b"c"}, quota, root=b"r")
    # Replacing them frees nothing yet: garbage stays (and counts) for its retention.
    assert quota_commit(storage, 1, {}, quota, root=b"r", garbage=[a, b, new_id()]).ok
    with pytest.raises(QuotaExceededError):
        quota_commit(storage, 2, {new_id(): b"c"}, quota, root=b"r")
    assert usage_of(storage)[:2] == (2, 301)
    clock.now += 61
    assert storage.collect_garbage(retention=60) == 2
    assert usage_of(storage)[:2] == (0, 1)  # the root is left
    assert quota_commit(storage, 2, {new_id(): b"c"}, quota, root=b"r").ok
    assert usage_of(storage)[:2] == (1, 2)


def test_keyring_slots_count_against_the_byte_quota(storage):
    quota = Quota(max_bytes=100)
    assert storage.put_keyring(T, D, "a", b"k" * 60, expected=None, quota=quota)
    with pytest.raises(QuotaExceededError, match="60 used"):
        storage.put_keyring(T, D, "b", b"k" * 50, expected=None, quota=quota)
    assert storage.get_keyring(T, D, "b") is None
    # Replacing a slot with one of the same size (a passphrase change) is always possible.
    assert storage.put_keyring(T, D, "a", b"j" * 60, expected=b"k" * 60, quota=quota)
    assert storage.put_keyring(T, D, "b", b"k" * 40, expected=None, quota=quota)
    assert usage_of(storage)[:2] == (0, 100)


def test_concurrent_commits_never_pass_the_quota(storage):
    """Eight threads race 40 commits of 100 bytes for a 1,500-byte quota: whatever the
    interleaving, exactly 15 are applied (a refusal needs 1,500 bytes used already)."""
    quota = Quota(max_bytes=1500)
    applied, refused = [], []

    def writer(worker: int) -> None:
        database = f"db{worker}"
        seq = 0
        for _ in range(5):
            try:
                result = quota_commit(
                    storage, seq, {new_id(): b"x" * 100}, quota, database=database
                )
            except QuotaExceededError:
                refused.append(worker)
                continue
            assert result.ok
            seq += 1
            applied.append(worker)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(applied), len(refused)) == (15, 25)
    assert usage_of(storage)[:2] == (15, 1500)


def test_quota_limits_are_checked(storage):
    for bad in (-1, 2**53 + 1, True, 1.5, "10"):
        with pytest.raises(InvalidRequestError):
            Quota(max_bytes=bad)
    assert Quota().unlimited and not Quota(max_blobs=0).unlimited
    with pytest.raises(QuotaExceededError):  # zero means nothing at all
        quota_commit(storage, 0, {new_id(): b""}, Quota(max_blobs=0))
