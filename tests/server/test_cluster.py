"""The Redis Cluster backend beyond the storage contract (which ``test_storage`` and
``test_quota`` run on the session's 3-master cluster too):

* the layout: one database's blobs land on every master, its other keys on one slot;
* two-slot operations left behind by a crash are finished by garbage collection
  (an aborted commit gives its reservation back and its blobs are deleted; an applied
  one whose settle was lost keeps its blobs and gets its shrink given back);
* ``zerodb-server serve --redis-cluster`` end to end, 4 client processes racing;
* (slow) a master SIGKILLed while writers commit, its replica taking over, and a live
  slot migration (``redis-cli --cluster reshard``) under commits: every acknowledged
  commit is still there afterwards.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest

from blob_server.cli import main as cli_main
from blob_server.exceptions import BlobExistsError, StorageUnavailableError
from blob_server.storage import Quota, RootRecord
from blob_server.storage.cluster import OP_TIMEOUT, ClusterStorage
from blob_server.wire.storage import DURABLE, EVERYSEC, VOLATILE
from tests.core.hr import Employee
from tests.server import test_scale_out as scale_out
from tests.server.cluster import LocalCluster, move_slot, start_cluster
from tests.server.crash import collect_as_if_timed_out
from tests.server.test_concurrency import make_deployment, run_writers
from tests.server.test_push import eq_query, open_db, register, seed
from tests.server.test_server_e2e import ServerProcess

T = "tenant"


def blob_masters(cluster: LocalCluster, keys: list[bytes]) -> set[int]:
    """The ports of the masters holding any of ``keys`` (KEYS lists a node's own)."""
    return {n.port for n in cluster.masters() if set(n.client().keys(b"zdb:b:*")) & set(keys)}


def held(store: ClusterStorage) -> tuple[int, int]:
    usage = store.usage(T)
    return usage.blobs, usage.bytes


def test_a_databases_blobs_spread_over_every_master(redis_cluster, cluster_storage_factory):
    store = cluster_storage_factory()
    blobs = {os.urandom(16): b"x" * 10 for _ in range(60)}
    assert store.commit(T, "db", expected_seq=0, root=b"r", blobs=blobs).ok
    scope = store._scope(T, "db")
    keys = [scope.blob(i) for i in blobs]
    assert blob_masters(redis_cluster, keys) == {n.port for n in redis_cluster.masters()}
    slots = {store._client().keyslot(k) for k in (scope.root, scope.garbage, scope.ops)}
    assert len(slots) == 1  # the root swap is a single-slot script
    assert store.get_blobs(T, "db", list(blobs)) == blobs


def test_a_crashed_commit_is_aborted_by_garbage_collection(cluster_storage_factory):
    now = [1_000_000.0]
    store = cluster_storage_factory(clock=lambda: now[0])
    scope, owner = store._scope(T, "db"), store._tenant(T)
    pairs = [(os.urandom(16), b"a" * 100), (os.urandom(16), b"b" * 50)]
    op = store._open(scope, owner, [i for i, _ in pairs])
    store._reserve(T, scope, owner, op, 2, 150, 150, Quota(max_bytes=1000))
    assert store._write_blobs(scope, pairs).created == [i for i, _ in pairs]
    # ... and the server dies before the swap: the reservation holds the quota.
    assert held(store) == (2, 150)
    assert store.collect_garbage() == 0  # younger than OP_TIMEOUT: still in flight
    assert held(store) == (2, 150)
    now[0] += OP_TIMEOUT + 1
    store.collect_garbage()
    assert held(store) == (0, 0)
    assert store.get_blobs(T, "db", [i for i, _ in pairs]) == {}
    assert store.get_root(T, "db").seq == 0
    # A late swap of the aborted op is refused: it was cancelled.
    keys = [scope.root, scope.garbage, scope.pending, scope.ops]
    assert store._call(scope.root, "swap", keys, [op, "0", "1", b"r", "0", 0])[0] == 5
    assert store.usage(T).databases == 0  # holding nothing, it left its tenant's count


def test_an_applied_commit_whose_settle_was_lost_is_settled_by_garbage_collection(
    cluster_storage_factory,
):
    now = [1_000_000.0]
    store = cluster_storage_factory(clock=lambda: now[0])
    assert store.commit(T, "db", expected_seq=0, root=b"r" * 40, blobs={}).ok
    scope, owner = store._scope(T, "db"), store._tenant(T)
    blob = (os.urandom(16), b"c" * 30)
    op = store._open(scope, owner, [blob[0]])
    store._reserve(T, scope, owner, op, 1, 30, 30 + 5 - 40, Quota())  # root: 40 -> 5 bytes
    assert store._write_blobs(scope, [blob]).created == [blob[0]]
    keys = [scope.root, scope.garbage, scope.pending, scope.ops]
    assert store._call(scope.root, "swap", keys, [op, "1", "2", b"r" * 5, "0", 0]) == [1]
    # ... and the server dies before the settle: the shrink is not given back yet.
    assert held(store) == (1, 40)
    now[0] += OP_TIMEOUT + 1
    store.collect_garbage()
    assert held(store) == (1, 35)  # 30 blob bytes + 5 root bytes
    assert store.get_root(T, "db") == RootRecord(2, b"r" * 5)
    assert store.get_blobs(T, "db", [blob[0]]) == {blob[0]: blob[1]}


def commit_first_after_reserving(store: ClusterStorage, **winner) -> None:
    """Make the store's next commit lose a race: right after it reserved (its checks
    passed, its blobs not written yet) the commit ``winner`` goes through."""
    reserve = store._reserve

    def reserve_then_lose_the_race(*args, **kwargs):
        reserve(*args, **kwargs)
        store._reserve = reserve
        assert store.commit(T, "db", expected_seq=0, **winner).ok

    store._reserve = reserve_then_lose_the_race


def test_a_commit_that_finds_its_blob_written_by_another_never_deletes_it(
    cluster_storage_factory,
):
    """Two commits at one seq carrying the same blob (a client of this database re-using
    an id): the second finds the blob written by the first on its first attempt, so it is
    not its own, whatever its bytes. It fails without deleting the winner's blob, and
    gives its reservation back."""
    store = cluster_storage_factory()
    blob = {os.urandom(16): b"w" * 100}
    commit_first_after_reserving(store, root=b"winner", blobs=blob)
    with pytest.raises(BlobExistsError):
        store.commit(T, "db", expected_seq=0, root=b"loser", blobs=blob)
    assert store.get_root(T, "db") == RootRecord(1, b"winner")
    assert store.get_blobs(T, "db", list(blob)) == blob
    assert held(store) == (1, 100 + len(b"winner"))


def test_a_failed_commit_deletes_only_the_blobs_it_wrote(cluster_storage_factory):
    """A commit of 40 new blobs, two of which another commit writes first (one with the
    same bytes): refused, its 38 own blobs deleted, the other two kept, usage exact."""
    store = cluster_storage_factory()
    first = {os.urandom(16): b"a" * 10, os.urandom(16): b"b" * 10}
    commit_first_after_reserving(store, root=b"r", blobs=first)
    mine = {os.urandom(16): b"c" * 10 for _ in range(38)}
    again = dict(zip(first, (b"a" * 10, b"z" * 10), strict=True))
    with pytest.raises(BlobExistsError):
        store.commit(T, "db", expected_seq=0, root=b"s", blobs={**mine, **again})
    assert store.get_blobs(T, "db", list(first)) == first
    assert store.get_blobs(T, "db", list(mine)) == {}
    assert held(store) == (2, 20 + 1)
    assert store.get_root(T, "db") == RootRecord(1, b"r")


def test_a_first_commit_racing_the_collector_keeps_its_database_counted(
    cluster_storage_factory,
):
    """The collector finds a database empty (an op on it was aborted) and is about to
    take it out of its tenant's count when the database's first commit (no blobs) goes
    through: the database stays counted."""
    store = cluster_storage_factory()
    scope, owner = store._scope(T, "db"), store._tenant(T)
    store._abort(scope, owner, store._open(scope, owner, []))
    assert store.usage(T).databases == 0
    call = store._call

    def commit_before_dropping(key, script, keys, args):
        if script == "drop":
            assert store.commit(T, "db", expected_seq=0, root=b"first", blobs={}).ok
        return call(key, script, keys, args)

    store._call = commit_before_dropping
    store.collect_garbage()
    assert store.usage(T).databases == 1
    assert store.get_root(T, "db") == RootRecord(1, b"first")


def test_durability_is_the_weakest_node_and_says_how_commits_wait(
    redis_cluster, cluster_storage_factory
):
    store = cluster_storage_factory()
    found = store.durability()
    assert found.mode == VOLATILE and "3 nodes" in found.detail
    for node in redis_cluster.masters():
        node.client().config_set("appendonly", "yes")
    try:
        assert store.durability().mode == DURABLE  # the nodes' appendfsync always
        redis_cluster.masters()[1].client().config_set("appendfsync", "everysec")
        assert store.durability().mode == EVERYSEC
        redis_cluster.masters()[0].client().config_set("appendonly", "no")
        assert store.durability().mode == VOLATILE
    finally:
        for node in redis_cluster.masters():
            node.client().config_set("appendonly", "no")
            node.client().config_set("appendfsync", "always")


def test_serve_on_a_cluster_with_four_client_processes(tmp_path, redis_cluster):
    redis_cluster.flush()
    deployment = make_deployment(tmp_path)
    run_writers(deployment, redis_cluster.spec, "--allow-volatile-redis", cluster=True)


class ClusterServerProcess(ServerProcess):
    """``zerodb-server serve --redis-cluster NODES`` on the tests' cluster (no AOF)."""

    def __init__(self, spec: str, tenants, log) -> None:
        super().__init__(spec, tenants, log)
        self.args[self.args.index("--storage")] = "--redis-cluster"
        self.args.append("--allow-volatile-redis")


@pytest.fixture
def cluster_fleet(redis_cluster, tmp_path, servers):
    """Three server processes on the session's cluster (stopped and their logs checked
    by ``servers``), and key files for two tenants."""
    redis_cluster.flush()
    tenants, keys = register(tmp_path)
    public = scale_out.WIRE_KEY.public_key.format().hex()  # for scale_out.wire_on
    assert cli_main(["add-key", "acme", public, "--tenants", str(tenants)]) == 0
    for i in range(3):
        server = ClusterServerProcess(redis_cluster.spec, tenants, tmp_path / f"server{i}.log")
        servers.append(server)
        server.start()
    return servers, keys


def test_a_commit_through_one_process_is_pushed_to_the_others_on_a_cluster(cluster_fleet):
    """Sharded pub/sub: as ``test_scale_out`` on one Redis (0 round trips when warm)."""
    scale_out.test_a_commit_through_one_process_is_pushed_to_the_clients_of_the_others(
        cluster_fleet
    )


def test_pushes_stay_within_the_tenant_and_database_on_a_cluster(cluster_fleet):
    scale_out.test_pushes_across_processes_stay_within_the_tenant_and_database(cluster_fleet)


def test_a_killed_subscription_is_caught_up_on_a_cluster(cluster_fleet, redis_cluster):
    """Every master's sharded subscriptions killed, three times: no client is left stale."""
    scale_out.killed_subscriptions_are_caught_up(
        cluster_fleet,
        lambda: sum(scale_out.kill_subscribers(n.client()) for n in redis_cluster.masters()),
    )


def test_commit_leases_are_one_fifo_across_processes_on_a_cluster(cluster_fleet):
    """The lease FIFO lives in the database's slot ``{S}``: a lease taken through one
    process holds off the others, whose waiters get it in the order they asked."""
    scale_out.test_commit_leases_are_one_fifo_across_processes(cluster_fleet)


def owner_of(cluster: LocalCluster, tenant: str, database: str):
    """The master that owns the slot of a database's root (and its root channel) now."""
    probe = ClusterStorage(cluster.spec)
    try:
        slot = probe._client().keyslot(probe._scope(tenant, database).root)
        port = probe._client().nodes_manager.get_node_from_slot(slot).port
    finally:
        probe.close()
    return slot, next(n for n in cluster.masters() if n.port == port)


def test_a_feed_that_cannot_reconnect_makes_clients_read_roots_on_a_cluster(
    cluster_fleet, redis_cluster
):
    """The feeds are per master: the one owning the database's slot kills their
    subscriptions (CLIENT KILL TYPE pubsub) and takes no new connection (maxclients)."""
    _, owner = owner_of(redis_cluster, "acme", "cut")
    scale_out.feed_cannot_reconnect(cluster_fleet, owner.client())


def test_a_moved_slot_makes_subscribed_clients_read_the_root_again(cluster_fleet, redis_cluster):
    """The database's slot moves to another master: commits are published there now,
    where no feed listened. The reader's server hears Redis unsubscribe the channel and
    disconnects its subscribers, so the reader reads the root again instead of answering
    from a root it would wrongly think current (which it would do for ever)."""
    (a, b, _), keys = cluster_fleet
    with open_db(b, keys["acme"], "moving") as reader:
        with open_db(a, keys["acme"], "moving") as writer:
            seed(writer)
            expected = eq_query(writer)
        assert eq_query(reader) == expected  # subscribed through b
        slot, owner = owner_of(redis_cluster, "acme", "moving")
        move_slot(redis_cluster, slot, next(n for n in redis_cluster.masters() if n is not owner))
        deadline = time.monotonic() + 10
        while b"root_changes_moved" not in b.log.read_bytes():  # b heard Redis
            assert time.monotonic() < deadline, "no unsubscribe from Redis"
            time.sleep(0.05)
        with open_db(a, keys["acme"], "moving") as writer:  # connected after the move
            new = Employee(name="Ann", surname="Moved", salary=1, description="after the move")
            writer.add(new)
        expected = sorted([*expected, new.pk])
        while eq_query(reader) != expected:
            assert time.monotonic() < deadline, "the reader kept a stale root"
            time.sleep(0.05)


@pytest.mark.parametrize("spec", ["", "localhost", "host:port", "a:1,b", "h:70000"])
def test_a_bad_node_list_is_refused(spec):
    with pytest.raises(StorageUnavailableError, match="HOST:PORT"):
        ClusterStorage(spec)


def test_replica_options_need_a_cluster(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "blob_server.cli", "serve", "--storage", "memory://"]  # noqa: RUF005
        + ["--tenants", str(tmp_path / "t.json"), "--min-replicas", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "need --redis-cluster" in done.stderr


# -- chaos (slow) ------------------------------------------------------------------------------


class Writers:
    """Threads committing to a few databases (two writers per database, so they also
    conflict); every acknowledged commit is recorded with its seq, root and blob."""

    def __init__(
        self,
        store: ClusterStorage,
        databases: int = 4,
        per_database: int = 2,
        size: int = 64,
        *,
        replace: bool = False,
    ):
        self.store = store
        self.size = size
        #: Each commit names the writer's previous acknowledged blob as garbage, for a
        #: collector to delete while the cluster changes under it.
        self.replace = replace
        self.doubtful: set[bytes] = set()
        self.acked: list[tuple[str, int, bytes, bytes]] = []
        self.unknown = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(f"db{d}", w), daemon=True)
            for d in range(databases)
            for w in range(per_database)
        ]

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)

    def _run(self, database: str, writer: int) -> None:
        serial = 0
        previous: list[bytes] = []
        while not self.stop.is_set():
            try:
                seq = self.store.get_root(T, database).seq
                blob_id, root = os.urandom(16), f"{writer}:{serial}:{os.urandom(4).hex()}"
                result = self.store.commit(
                    T,
                    database,
                    expected_seq=seq,
                    root=root.encode(),
                    blobs={blob_id: os.urandom(self.size)},
                    garbage=previous,
                )
            except StorageUnavailableError:
                with self.lock:
                    self.unknown += 1
                    self.doubtful.update(previous)
                time.sleep(0.05)
                continue
            serial += 1
            if result.ok:
                with self.lock:
                    self.acked.append((database, seq + 1, root.encode(), blob_id))
                if self.replace:
                    previous = [blob_id]

    def check(self, store: ClusterStorage) -> int:
        """Every acknowledged commit is there: its blob is readable, its seq was never
        acknowledged twice (a lost commit's seq would be reused) and the database's
        seq did not go back below it."""
        by_database = defaultdict(list)
        for database, seq, root, blob in self.acked:
            by_database[database].append((seq, root, blob))
        for database, commits in by_database.items():
            seqs = [seq for seq, _, _ in commits]
            assert len(seqs) == len(set(seqs)), f"{database}: a seq acknowledged twice"
            final = store.get_root(T, database)
            assert final.seq >= max(seqs)
            top = max(commits)
            if final.seq == top[0]:
                assert final.data == top[1]
            ids = [blob for _, _, blob in commits]
            if self.replace:  # each writer's last blob is live, unless a commit whose
                # outcome is unknown named it garbage
                last = {root.split(b":")[0]: blob for _, root, blob in sorted(commits)}
                ids = [blob for blob in last.values() if blob not in self.doubtful]
            assert len(store.get_blobs(T, database, ids)) == len(ids), f"{database}: blobs lost"
        return len(self.acked)


class Collector:
    """A thread collecting garbage (retention 0) over and over while the cluster changes."""

    def __init__(self, store: ClusterStorage) -> None:
        self.store = store
        self.deleted = self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(120)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.deleted += self.store.collect_garbage(retention=0)
            except StorageUnavailableError:
                self.failed += 1
            time.sleep(0.05)


def replica_of(cluster: LocalCluster, master):
    """The node replicating ``master``."""
    for node in cluster.nodes:
        info = node.client().info("replication")
        if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
            return node
    raise AssertionError(f"no replica of {master.port}")


@pytest.mark.slow
def test_a_master_killed_during_commits_loses_no_acknowledged_commit(tmp_path, capsys):
    """A master dies while its replica lags (SIGSTOPped for 1.5 s under 8 writers of
    256 KiB blobs, more than the kernel's socket buffers hold), then the replica takes
    over. Acknowledged commits waited for the replica (WAIT), so none is lost; the same
    run with ``min_replicas=0`` lost acknowledged commits' blobs in 2 of 2 runs."""
    cluster = start_cluster(tmp_path, masters=3, replicas=1)
    try:
        store = ClusterStorage(
            cluster.spec, socket_timeout=2, connect_timeout=0.5, replica_timeout=0.2
        )
        with Writers(store, size=256 * 1024) as writers:
            time.sleep(1.5)
            before = len(writers.acked)
            victim = cluster.masters()[0]
            lagging = replica_of(cluster, victim)
            os.kill(lagging.process.pid, signal.SIGSTOP)
            try:
                time.sleep(1.5)
                victim.kill()
                time.sleep(0.2)
            finally:
                os.kill(lagging.process.pid, signal.SIGCONT)
            deadline = time.monotonic() + 30
            while len(cluster.masters()) < 3:  # the replica takes over
                assert time.monotonic() < deadline, "no failover"
                time.sleep(0.1)
            cluster.wait_ok()
            time.sleep(2)
            after = len(writers.acked)
        assert after > before > 0  # commits went on before and after the failover
        assert store.resent > 0 and writers.unknown > 0  # they ran into the lag and the kill
        kept = writers.check(ClusterStorage(cluster.spec))
        usage, _ = collect_as_if_timed_out(cluster, T)  # usage == what the masters hold
        with capsys.disabled():
            print(
                f"\nfailover: {kept}/{kept} acknowledged commits kept ({before} before the "
                f"lag; {store.redirects} MOVED/CLUSTERDOWN replies, {store.resent} steps "
                f"re-sent after a lost connection), {writers.unknown} answered unavailable; "
                f"usage {usage.blobs} blobs / {usage.bytes} bytes = what the masters hold"
            )
    finally:
        cluster.stop()


@pytest.mark.slow
def test_live_resharding_during_commits_loses_no_acknowledged_commit(tmp_path, capsys):
    cluster = start_cluster(tmp_path, masters=3)
    try:
        store = ClusterStorage(cluster.spec)
        ids = {}
        for node in cluster.nodes:
            ids[node.port] = node.client().cluster("myid")
            if isinstance(ids[node.port], bytes):
                ids[node.port] = ids[node.port].decode()
        first, second = cluster.nodes[0], cluster.nodes[1]
        collector = Collector(ClusterStorage(cluster.spec))
        with Writers(store, replace=True) as writers, collector:
            time.sleep(1)
            for source, target in ((first, second), (second, first)):
                done = subprocess.run(
                    ["redis-cli", "--cluster", "reshard", f"127.0.0.1:{first.port}"]  # noqa: RUF005
                    + ["--cluster-from", ids[source.port], "--cluster-to", ids[target.port]]
                    + ["--cluster-slots", "3000", "--cluster-yes"],
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                assert done.returncode == 0, done.stdout[-2000:] + done.stderr
            during = len(writers.acked)
            time.sleep(1)
        assert during > 0 and store.redirects > 0  # the commits ran into the migrations
        assert collector.deleted > 0  # garbage was deleted while the slots moved
        kept = writers.check(ClusterStorage(cluster.spec))
        usage, _ = collect_as_if_timed_out(cluster, T)  # usage == what the masters hold
        with capsys.disabled():
            print(
                f"\nreshard: {kept}/{kept} acknowledged commits kept ({during} during two "
                f"migrations of 3000 slots, {store.redirects} MOVED/ASK/TRYAGAIN replies), "
                f"{writers.unknown} answered unavailable; {collector.deleted} blobs "
                f"collected meanwhile ({collector.failed} passes failed); usage "
                f"{usage.blobs} blobs / {usage.bytes} bytes = what the masters hold"
            )
    finally:
        cluster.stop()


def test_scripts_are_reloaded_after_script_flush_on_every_master(
    redis_cluster, cluster_storage_factory
):
    """A master that lost its scripts (restarted, or ``SCRIPT FLUSH``) answers NOSCRIPT:
    every step (stage, commit, keyring, collection, the lease scripts) loads it again."""
    store = cluster_storage_factory()

    def flush() -> None:
        for node in redis_cluster.masters():
            node.client().script_flush()

    staged, replaced = os.urandom(16), os.urandom(16)
    flush()
    store.stage("acme", "main", {staged: b"s"})
    flush()
    first = store.commit("acme", "main", expected_seq=0, root=b"r1", blobs={replaced: b"x"})
    assert first.ok
    flush()
    blobs = {os.urandom(16): b"y"}
    second = store.commit(
        "acme", "main", expected_seq=1, root=b"r2", blobs=blobs, garbage=[replaced], staged=[staged]
    )
    assert second.ok
    flush()
    assert store.put_keyring("acme", "main", "k", b"ring", expected=None)
    flush()
    assert store.collect_garbage(retention=0) == 1  # the replaced blob
    assert store.get_root("acme", "main").seq == 2
    assert store.get_blobs("acme", "main", [replaced, staged]) == {staged: b"s"}

    async def lease() -> None:
        leases = store.commit_leases(5)
        flush()
        token = await leases.acquire("acme", "main", 1, 0, lambda: True)
        assert token is not None
        flush()
        assert await leases.release("acme", "main", token)
        await store.aclose()

    asyncio.run(lease())
