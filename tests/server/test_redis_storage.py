"""What the Redis backends have to show beyond the Storage contract (which runs on one
Redis and on a cluster in test_storage.py).

On one Redis and on the session's 3-master cluster alike (``backend``): the keyed
namespace (stable, refused when corrupt), a Redis that evicts keys or forbids publishing
root changes refused, large commits, separate clients racing, garbage collection in
batches honouring the retention, a Redis that is down, commits on the event loop going
on after every node was killed and restarted (``aof_store``), the namespace key never
read on the event loop.

One Redis only, with why: its key layout (opaque names here, one hash slot per database
and its staged blobs: a cluster spreads blobs on purpose, its layout is test_cluster's
and its names are scanned by the end-to-end leak scans), its scripts reloaded after
SCRIPT FLUSH (the cluster's own test is in test_cluster), a password in the URL
(``ClusterStorage`` takes ``password=``, no URL), and data written before quotas
existed (no cluster ever held any).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from redis.crc import key_slot

from blob_server.exceptions import QuotaExceededError, StorageUnavailableError
from blob_server.storage import Quota, RedisStorage
from blob_server.storage import redis as redis_backend
from blob_server.storage.cluster import ClusterStorage
from blob_server.wire.storage import Storage
from tests.server.cluster import free_cluster_port
from tests.server.conftest import free_port, start_redis_server, stop_redis_server
from tests.server.test_storage import FakeClock, commit, new_id

T, D = "tenant", "db"
TAG = re.compile(rb"\{([0-9a-f]{32})\}")


def all_keys(redis_server) -> list[bytes]:
    return list(redis_server.client().scan_iter(count=1000))


@dataclass(frozen=True)
class Backend:
    """Fresh storages on one Redis or on the session's cluster (emptied first), a client
    routing keys, every node (for CONFIG and ACL), and the scope tags the collector
    will visit (``zdb:gc`` on one Redis, the 16 ``zdb:gc:<h>`` sets on a cluster)."""

    storage: Callable[..., Storage]
    client: redis.Redis | redis.RedisCluster
    nodes: Callable[[], list[redis.Redis]]
    gc_scopes: Callable[[Storage], set[bytes]]


@pytest.fixture(params=["redis", "cluster"])
def backend(request) -> Iterator[Backend]:
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        client = server.client()
        yield Backend(
            request.getfixturevalue("redis_storage_factory"),
            client,
            lambda: [server.client()],
            lambda _store: set(client.smembers(redis_backend.GC_SCOPES_KEY)),
        )
    else:
        cluster = request.getfixturevalue("redis_cluster")
        factory = request.getfixturevalue("cluster_storage_factory")  # empties it
        nodes = [redis.cluster.ClusterNode("127.0.0.1", node.port) for node in cluster.nodes]
        client = redis.RedisCluster(startup_nodes=nodes)
        yield Backend(
            factory,
            client,
            lambda: [node.client() for node in cluster.nodes],
            lambda store: set(store._members(b"gc")),
        )
    client.close()


def test_key_names_reveal_no_names(redis_server, redis_storage):
    tenant, database = "acme-corp-tenant", "payroll-database"
    blob = new_id()
    commit(redis_storage, 0, {blob: b"x"}, tenant=tenant, database=database)
    commit(redis_storage, 1, {}, garbage=[blob], tenant=tenant, database=database)
    redis_storage.allocate_ids(tenant, database, "app.Employee", 5)
    redis_storage.put_keyring(tenant, database, "keyring-alice", b"k", expected=None)

    keys = all_keys(redis_server)
    assert keys
    forbidden = ["acme", "corp", "tenant", "payroll", "database", "Employee", "alice"]
    for key in keys:
        assert key.startswith(b"zdb:")
        for word in forbidden:
            for form in (word.encode(), word.encode().hex().encode(), word.encode("utf-16-le")):
                assert form.lower() not in key.lower(), (word, key)
    # Counter and keyring names are hashed inside their hashes, too.
    client = redis_server.client()
    for key in keys:
        if client.type(key) == b"hash":
            for field in client.hkeys(key):
                assert field in (b"seq", b"data", b"blobs", b"bytes", b"t") or len(field) == 16


def test_every_key_of_a_database_shares_one_hash_slot(redis_server, redis_storage):
    for database in ("one", "two"):
        blobs = {new_id(): os.urandom(10) for _ in range(20)}
        commit(redis_storage, 0, blobs, database=database)
        commit(redis_storage, 1, {new_id(): b"y"}, garbage=list(blobs)[:5], database=database)
        redis_storage.allocate_ids(T, database, "seq", 1)
        redis_storage.put_keyring(T, database, "slot", b"k", expected=None)

    by_tag: dict[bytes, list[bytes]] = {}
    tenant_keys: set[bytes] = set()
    for key in all_keys(redis_server):
        if key in (redis_backend.NAMESPACE_KEY, redis_backend.GC_SCOPES_KEY):
            continue
        tags = TAG.findall(key)
        assert len(tags) == 1, key  # exactly one hash tag, so the slot is the tag's
        assert key.startswith(b"zdb:{" + tags[0] + b"}:")
        if key.endswith((b":u", b":d")):  # the tenant's usage and database set
            tenant_keys.add(key)
            continue
        by_tag.setdefault(tags[0], []).append(key)
    assert len(by_tag) == 2  # one scope per database
    # One tenant: its two keys share their own tag, which lists both databases.
    assert len({TAG.findall(k)[0] for k in tenant_keys}) == 1 and len(tenant_keys) == 2
    (members_key,) = (k for k in tenant_keys if k.endswith(b":d"))
    assert set(redis_server.client().smembers(members_key)) == set(by_tag)
    for keys in by_tag.values():
        assert len(keys) >= 20 + 6  # blobs, root, stats, garbage, counters, keyrings
        assert len({key_slot(k) for k in keys}) == 1
    assert set(redis_server.client().smembers(redis_backend.GC_SCOPES_KEY)) == set(by_tag)


def test_scope_tags_are_stable_across_instances_and_keyed(backend):
    first, second = backend.storage(), backend.storage()
    commit(first, 0, root=b"r")
    assert second.get_root(T, D).data == b"r"
    namespace = backend.client.get(redis_backend.NAMESPACE_KEY)
    assert len(namespace) == 32
    tag = first._scope(T, D).tag
    assert tag == second._scope(T, D).tag
    # Without the namespace key the tag cannot be recomputed from the names alone.
    backend.client.set(redis_backend.NAMESPACE_KEY, os.urandom(32))
    assert backend.storage()._scope(T, D).tag != tag


def test_a_corrupt_namespace_key_is_refused(backend):
    backend.client.set(redis_backend.NAMESPACE_KEY, b"short")
    with pytest.raises(StorageUnavailableError, match="namespace key"):
        backend.storage().get_root(T, D)


def test_a_redis_that_evicts_keys_is_refused(backend):
    """On a cluster one node that may evict is enough: it may hold any blob."""
    client = backend.nodes()[-1]
    client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(StorageUnavailableError, match="noeviction"):
            backend.storage().get_root(T, D)
    finally:
        client.config_set("maxmemory-policy", "noeviction")
    assert backend.storage().get_root(T, D).seq == 0


def test_commit_of_300_blobs_of_16_kib(backend):
    store = backend.storage()
    blobs = {new_id(): os.urandom(16 * 1024) for _ in range(300)}
    garbage = [new_id() for _ in range(300)]
    assert commit(store, 0, blobs, garbage=garbage).ok
    assert store.get_blobs(T, D, list(blobs)) == blobs
    stats = store.stats(T, D)
    assert (stats["blobs"], stats["bytes"], stats["garbage"]) == (300, 300 * 16384, 300)
    # The conflict answer of such a commit changes nothing either.
    more = {new_id(): os.urandom(16 * 1024) for _ in range(300)}
    assert not commit(store, 0, more).ok
    assert store.get_blobs(T, D, list(more)) == {}
    assert store.stats(T, D)["blobs"] == 300


def test_separate_clients_committing_from_threads_lose_nothing(backend):
    written: list[bytes] = []
    errors: list[BaseException] = []

    def worker():
        store = backend.storage()  # its own pool, as separate servers would have
        try:
            seq = store.get_root(T, D).seq
            previous: list[bytes] = []
            for _ in range(30):
                blobs = {new_id(): os.urandom(256) for _ in range(3)}
                while not (result := commit(store, seq, blobs, garbage=previous)).ok:
                    seq = result.root.seq
                seq = result.root.seq
                written.extend(blobs)
                previous = list(blobs)[:1]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store = backend.storage()
    assert store.get_root(T, D).seq == 180
    assert len(store.get_blobs(T, D, written)) == len(written) == 540
    stats = store.stats(T, D)
    assert (stats["blobs"], stats["bytes"], stats["garbage"]) == (540, 540 * 256, 174)


def test_garbage_collection_in_batches_honours_retention(backend):
    clock = FakeClock()
    store = backend.storage(clock=clock)
    size = redis_backend._GC_BATCH * 2 + 37  # several script runs
    old = {new_id(): b"o" * 10 for _ in range(size)}
    commit(store, 0, old)
    commit(store, 1, {}, garbage=list(old))
    clock.now += 30
    young = {new_id(): b"y" * 10 for _ in range(5)}
    commit(store, 2, young)
    commit(store, 3, {}, garbage=list(young))

    assert store.collect_garbage(retention=31) == 0
    assert store.collect_garbage(retention=30) == size  # boundary: exactly 30 s old is due
    assert store.get_blobs(T, D, list(old)) == {}
    assert store.get_blobs(T, D, list(young)) == young
    stats = store.stats(T, D)
    assert (stats["blobs"], stats["bytes"], stats["garbage"]) == (5, 50, 5)
    scope = store._scope(T, D).tag
    assert backend.gc_scopes(store) == {scope}  # young garbage still pending

    clock.now += 30
    assert store.collect_garbage(retention=30) == 5
    assert store.stats(T, D)["blobs"] == 0
    assert backend.gc_scopes(store) == set()  # nothing left to visit
    commit(store, 4, {}, garbage=[new_id()])  # a later commit registers the scope again
    assert backend.gc_scopes(store) == {scope}


def test_staged_blobs_share_their_slot_and_orphans_are_collected_in_batches(
    redis_server, redis_storage_factory
):
    clock = FakeClock()
    store = redis_storage_factory(clock=clock)
    size = redis_backend._GC_BATCH * 2 + 37  # several script runs
    orphans = {new_id(): b"o" * 10 for _ in range(size)}
    for start in range(0, size, 500):
        store.stage(T, D, dict(list(orphans.items())[start : start + 500]))
    kept = new_id()
    store.stage(T, D, {kept: b"k"})
    assert commit(store, 0, {}, garbage=[new_id()], staged=[kept]).ok
    scope = store._scope(T, D)
    client = redis_server.client()
    assert client.zcard(scope.pending) == size
    assert {key_slot(k) for k in all_keys(redis_server) if scope.tag in k} == {
        key_slot(scope.pending)
    }
    assert client.smembers(redis_backend.GC_SCOPES_KEY) == {scope.tag}

    clock.now += 100
    assert store.collect_garbage(retention=1000, staging_timeout=100) == size
    assert store.get_blobs(T, D, list(orphans)) == {}
    stats = store.stats(T, D)
    assert (stats["blobs"], stats["bytes"], stats["staged"], stats["garbage"]) == (1, 1, 0, 1)
    assert store.usage(T).blobs == 1
    assert client.smembers(redis_backend.GC_SCOPES_KEY) == {scope.tag}  # garbage is left
    clock.now += 1000
    assert store.collect_garbage(retention=1000) == 0  # the garbage id was never written
    assert client.scard(redis_backend.GC_SCOPES_KEY) == 0  # nothing left to visit
    store.stage(T, D, {new_id(): b"s"})  # a stage registers the scope again
    assert client.smembers(redis_backend.GC_SCOPES_KEY) == {scope.tag}


def test_stages_reload_their_script_after_script_flush(redis_server, redis_storage):
    first, second = new_id(), new_id()
    redis_server.client().script_flush()
    redis_storage.stage(T, D, {first: b"x"})

    async def on_loop() -> None:
        redis_server.client().script_flush()
        await redis_storage.astage(T, D, {second: b"y"})
        await redis_storage.aclose()

    asyncio.run(on_loop())
    assert commit(redis_storage, 0, {}, staged=[first, second]).ok


def test_scripts_are_reloaded_after_script_flush(redis_server, redis_storage):
    assert commit(redis_storage, 0).ok
    redis_server.client().script_flush()
    assert commit(redis_storage, 1, garbage=[new_id()]).ok  # pipelined EVALSHA path
    redis_server.client().script_flush()
    assert commit(redis_storage, 2).ok  # plain path
    redis_server.client().script_flush()
    assert redis_storage.put_keyring(T, D, "k", b"x", expected=None)
    assert redis_storage.get_root(T, D).seq == 3


def test_commits_on_the_event_loop_reload_scripts_after_script_flush(redis_server, redis_storage):
    async def commits() -> None:
        for seq, garbage in ((0, []), (1, [new_id()]), (2, [])):  # pipelined SADD, then not
            redis_server.client().script_flush()
            done = await redis_storage.acommit(
                T, D, expected_seq=seq, root=b"r", blobs={new_id(): b"x"}, garbage=garbage
            )
            assert done.ok
        await redis_storage.aclose()

    asyncio.run(commits())
    assert redis_storage.get_root(T, D).seq == 3


def test_commits_on_the_event_loop_survive_a_redis_restart(aof_store):
    """The pooled connections of the old Redis processes are replaced, not used for one
    failing commit each (redis-py's asyncio pool skips that check unless maintenance
    notifications are turned off; a cluster's commit must not meet a dead connection
    at its swap, which is not re-sent)."""
    redis = aof_store  # every node of a cluster killed and restarted
    storage = redis.storage()

    async def commits() -> None:
        assert (await storage.acommit(T, D, expected_seq=0, root=b"r", blobs={new_id(): b"x"})).ok
        redis.kill()
        redis.start()  # same port, same append-only file
        await asyncio.sleep(0.1)  # an idle server's loop sees the old connections close
        assert (await storage.acommit(T, D, expected_seq=1, root=b"r", blobs={new_id(): b"y"})).ok
        await storage.aclose()

    try:
        asyncio.run(commits())
    finally:
        storage.close()
        redis.kill()


@pytest.mark.parametrize("call", ["aget_blobs", "acommit"])
def test_the_namespace_key_is_never_read_on_the_event_loop(backend, call):
    """The first read or commit of a new storage reads the namespace key (a blocking
    Redis call) in a worker thread: on the loop it would stall every connection."""
    storage = backend.storage()
    on_loop: list[bool] = []
    read_key = storage._namespace_key

    def spied() -> bytes:
        if storage._namespace is None:  # this call asks Redis
            on_loop.append(asyncio._get_running_loop() is not None)
        return read_key()

    storage._namespace_key = spied

    async def first_use() -> None:
        if call == "aget_blobs":
            assert await storage.aget_blobs(T, D, [new_id()]) == {}
        else:
            assert (await storage.acommit(T, D, expected_seq=0, root=b"r", blobs={})).ok
        await storage.aclose()

    asyncio.run(first_use())
    assert on_loop == [False]


@pytest.mark.parametrize(
    "unreachable",
    [
        lambda: RedisStorage(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=2),
        lambda: ClusterStorage(f"127.0.0.1:{free_cluster_port()}", connect_timeout=2),
    ],
    ids=["redis", "cluster"],
)
def test_a_redis_that_is_down_raises_storage_unavailable(unreachable):
    store = unreachable()  # nothing listens there; building it does not connect
    url = store.url
    for call in (
        lambda: store.get_root(T, D),
        lambda: store.get_blobs(T, D, [new_id()]),
        lambda: commit(store, 0),
        lambda: store.collect_garbage(),
        lambda: store.stage(T, D, {new_id(): b"x"}),
        lambda: asyncio.run(store.aget_blobs(T, D, [new_id()])),
        lambda: asyncio.run(store.acommit(T, D, expected_seq=0, root=b"r", blobs={})),
        lambda: asyncio.run(store.astage(T, D, {new_id(): b"x"})),
    ):
        with pytest.raises(StorageUnavailableError, match=re.escape(url)):
            call()
    store.close()


def test_a_redis_that_goes_away_raises_and_passwords_stay_out(tmp_path):
    server = start_redis_server(tmp_path, password="s3cret-pw")
    try:
        store = RedisStorage(f"redis://:hunter2@127.0.0.1:{server.port}/0")
        assert "hunter2" not in repr(store)
        with pytest.raises(StorageUnavailableError) as info:  # a wrong password
            store.get_root(T, D)
        assert "hunter2" not in str(info.value)
        assert str(server.port) in str(info.value)
        store.close()

        store = RedisStorage(f"redis://:s3cret-pw@127.0.0.1:{server.port}/0")
        assert "s3cret-pw" not in repr(store)
        assert commit(store, 0).ok
    finally:
        stop_redis_server(server.process)
    with pytest.raises(StorageUnavailableError, match=str(server.port)):
        store.get_root(T, D)
    # The asynchronous paths too, now that the namespace is known and no sync call precedes.
    with pytest.raises(StorageUnavailableError, match=str(server.port)):
        asyncio.run(store.acommit(T, D, expected_seq=1, root=b"r", blobs={}))
    with pytest.raises(StorageUnavailableError, match=str(server.port)):
        asyncio.run(store.aget_blobs(T, D, [new_id()]))
    store.close()
    with pytest.raises(StorageUnavailableError, match="closed"):
        store.get_root(T, D)


def _forget_usage(redis_server, store: RedisStorage, tenant: str, *databases: str) -> None:
    """Make the tenant's data look written before quotas existed: no usage, no joins."""
    client = redis_server.client()
    owner = store._tenant(tenant)
    client.delete(owner.usage, owner.databases)
    for database in databases:
        client.hdel(store._scope(tenant, database).stats, "t")


def test_data_from_before_quotas_joins_the_usage_on_its_next_write(redis_server, redis_storage):
    commit(redis_storage, 0, {new_id(): b"a" * 100, new_id(): b"b" * 50}, root=b"r" * 10)
    redis_storage.put_keyring(T, D, "slot", b"k" * 20, expected=None)
    commit(redis_storage, 0, {new_id(): b"c" * 30}, root=b"s" * 5, database="second")
    before = redis_storage.usage(T)
    assert (before.blobs, before.bytes, before.databases) == (3, 215, 2)
    _forget_usage(redis_server, redis_storage, T, D, "second")
    assert redis_storage.usage(T).bytes == 0

    # The next commit to a database adopts what it already holds, and the quota sees it.
    with pytest.raises(QuotaExceededError, match="180 used"):
        redis_storage.commit(
            T,
            D,
            expected_seq=1,
            root=b"r" * 10,
            blobs={new_id(): b"d" * 30},
            quota=Quota(max_bytes=200),
        )
    assert redis_storage.usage(T).bytes == 0  # a refused commit wrote nothing
    assert commit(redis_storage, 1, {new_id(): b"d" * 40}, root=b"r" * 10).ok
    assert (redis_storage.usage(T).blobs, redis_storage.usage(T).bytes) == (3, 220)
    # A keyring write adopts its database too.
    assert redis_storage.put_keyring(T, "second", "slot", b"k" * 4, expected=None)
    usage = redis_storage.usage(T)
    assert (usage.blobs, usage.bytes, usage.databases) == (4, 220 + 35 + 4, 2)


def test_collecting_garbage_of_data_from_before_quotas(redis_server, redis_storage_factory):
    clock = FakeClock()
    store = redis_storage_factory(clock=clock)
    old, kept = new_id(), new_id()
    commit(store, 0, {old: b"o" * 100, kept: b"k" * 10}, root=b"")
    commit(store, 1, {}, garbage=[old], root=b"")
    _forget_usage(redis_server, store, T, D)
    clock.now += 10
    # Never counted, so nothing to give back: the usage stays at 0 instead of going below.
    assert store.collect_garbage(retention=5) == 1
    assert (store.usage(T).blobs, store.usage(T).bytes) == (0, 0)
    commit(store, 2, {}, root=b"")  # joins: adopts the blob that is left
    assert (store.usage(T).blobs, store.usage(T).bytes) == (1, 10)


def test_collection_notices_a_scope_that_joined_its_tenant_meanwhile(
    redis_server, redis_storage_factory, monkeypatch
):
    clock = FakeClock()
    store = redis_storage_factory(clock=clock)
    old = new_id()
    commit(store, 0, {old: b"o" * 100}, root=b"")
    commit(store, 1, {}, garbage=[old], root=b"")
    assert (store.usage(T).blobs, store.usage(T).bytes) == (1, 100)
    clock.now += 10
    # The collector reads the scope's tenant as missing (as if a commit joined it right
    # after the read): the script refuses to run without the usage key; the collector
    # reads again and gives the usage back.
    real_hget = store._redis.hget
    reads = []

    def stale_hget(*args):
        reads.append(args)
        return None if len(reads) == 1 else real_hget(*args)

    monkeypatch.setattr(store._redis, "hget", stale_hget)
    assert store.collect_garbage(retention=5) == 1
    assert len(reads) == 2  # read again after the script's refusal
    assert (store.usage(T).blobs, store.usage(T).bytes) == (0, 0)


def test_a_user_that_may_not_publish_root_changes_is_refused(backend):
    """Every commit publishes its seq from its script (SPUBLISH on a cluster), after the
    root swap, which Redis does not roll back: a user an ACL forbids that would have
    every commit applied and answered as failed, so the storage refuses it at once.
    The storages log in as ``default``; an ACL is per node, so every node says it."""

    def channels(*rules: str) -> None:
        for node in backend.nodes():
            node.execute_command("ACL", "SETUSER", "default", *rules)

    channels("resetchannels")
    try:
        with pytest.raises(StorageUnavailableError, match="&zdb:"):
            backend.storage().get_root(T, D)
        channels("&zdb:*")
        storage = backend.storage()
        assert commit(storage, 0).ok
        assert storage.get_root(T, D).seq == 1
    finally:
        channels("allchannels")


def test_the_key_names_remembered_are_bounded(backend):
    """A client may name any number of databases that do not exist: the names worked
    out for them are forgotten past ``NAMES_REMEMBERED``, not kept for ever."""
    store = backend.storage()
    limit = redis_backend.NAMES_REMEMBERED
    for i in range(limit + 10):
        assert store.get_root(T, f"made-up-{i}").seq == 0
        store.usage(f"tenant-{i}")
    assert 0 < len(store._scopes) <= limit
    assert 0 < len(store._tenants) <= limit
    assert store.get_root(T, "made-up-0").seq == 0  # worked out again


def test_a_password_given_as_a_url_option_is_never_shown(tmp_path):
    """redis-py takes ``?password=`` as well as ``user:password@``: the storage's url,
    repr and durability detail (sent to every tenant at login) hide it too, and a
    password file beside it is refused as given twice."""
    secret = "pw-SECRET-7"
    server = start_redis_server(tmp_path, password=secret)
    try:
        url = f"redis://127.0.0.1:{server.port}/0?password={secret}&socket_timeout=5"
        storage = RedisStorage(url)
        try:
            assert storage.get_root(T, D).seq == 0  # it did log in
            shown = [storage.url, repr(storage), storage.durability().detail]
            assert all(secret not in text for text in shown), shown
            assert "socket_timeout=5" in storage.url
        finally:
            storage.close()
        with pytest.raises(StorageUnavailableError, match="give it once"):
            redis_backend.url_with_password(url, "from-a-file")
    finally:
        stop_redis_server(server.process)
