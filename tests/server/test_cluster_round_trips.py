"""How many round trips to Redis a cluster commit waits for, counted, not timed.

A step of ``ClusterStorage`` whose keys live on several masters sends one pipeline per
master; the commit then waits for the slowest of them, not for their sum, only if every
pipeline is written before any answer is read. ``RoundTrips`` records what the storage
writes to each node and reads back, in order (a counting wrapper around redis-py's own
connections: the commands still go to the real nodes), and measures the depth: how many
times the storage waited for an answer before writing again.
"""

from __future__ import annotations

import os

import pytest
import redis
from redis.connection import AbstractConnection

from blob_server.storage import Quota
from blob_server.storage.cluster import ClusterStorage, _send

T = "tenant"
#: The steps of a commit with blobs (module doc of ``blob_server.storage.cluster``): the
#: checks (root and new ids), open, reserve, write the blobs, swap the root, settle.
COMMIT_STEPS = ("check", "open", "reserve", "write", "swap", "settle")


class RoundTrips:
    """The writes and reads on every redis-py connection while it is installed, in order,
    each with the node's port. A run of writes, each to its own node, followed by the
    reads of their answers is one round trip; a write after a read starts the next."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, int]] = []
        write, read = AbstractConnection.send_packed_command, AbstractConnection.read_response

        def writing(connection, *args, **kwargs):
            self.events.append(("write", connection.port))
            return write(connection, *args, **kwargs)

        def reading(connection, *args, **kwargs):
            self.events.append(("read", connection.port))
            return read(connection, *args, **kwargs)

        monkeypatch.setattr(AbstractConnection, "send_packed_command", writing)
        monkeypatch.setattr(AbstractConnection, "read_response", reading)

    def writes(self) -> list[list[int]]:
        """The ports of each run of writes (one round trip each)."""
        runs: list[list[int]] = []
        last = "read"
        for kind, port in self.events:
            if kind == "write":
                if last == "read":
                    runs.append([])
                runs[-1].append(port)
            last = kind
        return runs

    def depth(self) -> int:
        """The round trips waited for one after another."""
        return len(self.writes())

    def widest(self) -> set[int]:
        """The nodes of the largest run of writes sent together."""
        return set(max(self.writes(), key=len, default=[]))


def blobs_on_every_master(store: ClusterStorage, database: str) -> dict[bytes, bytes]:
    """A commit's worth of 16 KiB blobs whose keys land on every master, one per master."""
    cluster = store._client()
    masters = {node.name for node in cluster.get_primaries()}
    scope = store._scope(T, database)
    chosen: dict[str, bytes] = {}
    while set(chosen) != masters:
        blob_id = os.urandom(16)
        slot = cluster.keyslot(scope.blob(blob_id))
        chosen.setdefault(cluster.nodes_manager.get_node_from_slot(slot).name, blob_id)
    return {blob_id: os.urandom(16384) for blob_id in chosen.values()}


def test_a_commit_with_blobs_on_every_master_waits_one_round_trip_per_step(
    redis_cluster, cluster_storage_factory, monkeypatch
):
    store = cluster_storage_factory()
    assert store.commit(T, "db", expected_seq=0, root=b"r", blobs={}).ok  # scripts loaded
    blobs = blobs_on_every_master(store, "db")
    masters = {node.port for node in redis_cluster.masters()}
    assert len(masters) == len(blobs) > 1
    watch = RoundTrips(monkeypatch)
    assert store.commit(T, "db", expected_seq=1, root=b"r" * 512, blobs=blobs).ok
    monkeypatch.undo()
    assert watch.widest() == masters  # the blob writes (and the id checks) went out at once
    assert sum(map(len, watch.writes())) > len(COMMIT_STEPS)  # steps over several masters
    assert watch.depth() == len(COMMIT_STEPS)  # ... each one round trip
    assert store.get_blobs(T, "db", list(blobs)) == blobs


#: The steps of an abort (``ClusterStorage._abort``): cancel the op, give its reservation
#: back and delete its blobs, forget the op.
ABORT_STEPS = ("cancel", "undo", "forget")


def test_an_abort_of_blobs_on_every_master_waits_one_round_trip_per_step(
    redis_cluster, cluster_storage_factory, monkeypatch
):
    store = cluster_storage_factory()
    scope, owner = store._scope(T, "db"), store._tenant(T)

    def written() -> tuple[bytes, dict[bytes, bytes]]:
        """Steps 1 to 3 of a commit (open, reserve, write) whose swap never comes."""
        blobs = blobs_on_every_master(store, "db")
        op = store._open(scope, owner, list(blobs))
        size = sum(map(len, blobs.values()))
        store._reserve(T, scope, owner, op, len(blobs), size, size, Quota())
        assert store._write_blobs(scope, list(blobs.items())).created == list(blobs)
        return op, blobs

    assert store._abort(scope, owner, written()[0])  # scripts loaded on every master
    op, blobs = written()
    assert store.usage(T).blobs == len(blobs)
    watch = RoundTrips(monkeypatch)
    assert store._abort(scope, owner, op)
    monkeypatch.undo()
    assert watch.widest() == {node.port for node in redis_cluster.masters()}
    assert watch.depth() == len(ABORT_STEPS)
    assert (store.usage(T).blobs, store.usage(T).bytes) == (0, 0)
    assert store.get_blobs(T, "db", list(blobs)) == {}
    assert store._read([(scope.ops, ("HLEN", scope.ops))]) == [0]


def test_a_lost_answer_on_one_master_leaves_no_reply_unread(redis_cluster, cluster_storage_factory):
    """A step over two masters whose answer from one is lost (a socket timeout) still
    reads the other's replies to the end and reports each outcome in its place, and no
    connection goes back to its pool with a reply still to come."""
    store = cluster_storage_factory()
    cluster = store._client()
    first, second = cluster.get_primaries()[:2]

    def key_on(node) -> bytes:
        n = 0
        while cluster.nodes_manager.get_node_from_slot(cluster.keyslot(b"k%d" % n)) != node:
            n += 1
        return b"k%d" % n

    slow, fast = (redis.Redis(port=n.port, socket_timeout=0.3) for n in (first, second))
    waiting, written = key_on(first), key_on(second)
    outcomes = _send(
        [
            (slow, [("BLPOP", waiting, 3)]),  # answers after 3 s, past the socket timeout
            (fast, [("SET", written, b"v"), ("GET", written), ("HGET", written, b"f")]),
        ]
    )
    assert isinstance(outcomes[0], redis.TimeoutError)
    assert outcomes[1][:2] == [True, b"v"]
    assert isinstance(outcomes[1][2], redis.ResponseError)  # WRONGTYPE, in its place
    slow.rpush(waiting, b"x")  # a pooled connection would still wait for the BLPOP
    assert slow.lpop(waiting) == b"x"
    assert fast.get(written) == b"v"


def test_a_write_interrupted_on_one_master_leaves_no_connection_out_of_its_pool(
    redis_cluster, cluster_storage_factory, monkeypatch
):
    """A KeyboardInterrupt (not an ``Exception``) while a step writes to its second
    master: both connections are closed and back in their pools, none held for good."""
    cluster = cluster_storage_factory()._client()
    first, second = (redis.Redis(port=n.port) for n in cluster.get_primaries()[:2])
    assert first.ping() and second.ping()  # connected: the interrupt comes at the write
    write = AbstractConnection.send_packed_command

    def interrupted(connection, *args, **kwargs):
        if connection.port == second.connection_pool.connection_kwargs["port"]:
            raise KeyboardInterrupt
        return write(connection, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _send([(first, [("PING",)]), (second, [("PING",)])])
    monkeypatch.undo()
    for client in (first, second):
        assert client.connection_pool._in_use_connections == set()
        assert client.ping()
