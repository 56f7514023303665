"""A Redis Cluster on loopback for the tests: ``bench.local_cluster`` (shared with the
benchmarks) with ``PrivateRedis`` nodes.

Ports are free loopback ports below 55536, so the cluster bus (port + 10000) fits too;
never 6379. Nodes keep no RDB; ``appendonly`` is off unless a test asks (the failover
tests count on replicas and ``WAIT``, not on the disk). A cluster can be SIGKILLed and
restarted whole (``kill``, ``start``): every node comes back on its port and directory,
with its ``nodes.conf`` (so the same node ids and slots) and its append-only file. A
``NodeLogin`` makes nodes that want an ACL user, or TLS (``port 0``, ``tls-port``,
``tls-cluster yes``): the helpers log in with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from bench import local_cluster
from bench.local_cluster import ClusterError, free_cluster_port, node_options
from blob_server.storage.cluster import ClusterStorage
from tests.server.conftest import PrivateRedis, stop_redis_server

__all__ = [
    "ClusterNodeProcess",
    "LocalCluster",
    "NodeLogin",
    "free_cluster_port",
    "move_slot",
    "start_cluster",
]


@dataclass(frozen=True)
class NodeLogin:
    """How the helpers log in to the nodes: an ACL user, and TLS (``tls``: the node
    options ``tls-cert-file``, ``tls-key-file``, ``tls-ca-cert-file``; clients trust that
    CA and present the node's certificate, which the tests' CA made for both uses)."""

    username: str | None = None
    password: str | None = None
    tls: dict[str, str] | None = None

    def client_options(self) -> dict[str, object]:
        """redis-py's keyword arguments."""
        options: dict[str, object] = {"username": self.username, "password": self.password}
        if self.tls:
            options.update(
                ssl=True,
                ssl_ca_certs=self.tls["tls-ca-cert-file"],
                ssl_certfile=self.tls["tls-cert-file"],
                ssl_keyfile=self.tls["tls-key-file"],
            )
        return options

    def cli_args(self) -> list[str]:
        """redis-cli's options."""
        args = (
            ["--user", self.username or "default", "--pass", self.password] if self.password else []
        )
        if self.tls:
            args += ["--tls", "--cacert", self.tls["tls-ca-cert-file"]]
            args += ["--cert", self.tls["tls-cert-file"], "--key", self.tls["tls-key-file"]]
        return args


class ClusterNodeProcess(PrivateRedis):
    """One node: ``PrivateRedis`` with ``node_options``, a port whose bus port is free,
    and ``login``'s user or TLS."""

    def __init__(self, directory: Path, login: NodeLogin | None = None, **options: str) -> None:
        self.login = login or NodeLogin()
        super().__init__(directory, **{**node_options(directory), **options})
        self.port = free_cluster_port()
        if self.login.password:  # replicas log in to their master as that user
            self.options.update(masteruser=self.login.username or "default")
            self.options.update(masterauth=self.login.password)
        if self.login.tls:  # TLS only, the cluster bus (tls-port + 10000) and replication too
            self.options.update({"port": "0", "tls-port": str(self.port), **self.login.tls})
            self.options.update({"tls-cluster": "yes", "tls-replication": "yes"})

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",  # the name the tests' certificates carry
            port=self.port,
            socket_connect_timeout=0.5,
            socket_timeout=5,
            **self.login.client_options(),  # type: ignore[arg-type]
        )

    def stop(self) -> None:
        if self.process is not None:
            stop_redis_server(self.process)


class LocalCluster(local_cluster.LocalCluster):
    """The shared ``LocalCluster``, of ``ClusterNodeProcess`` nodes here, with the crash
    tests' interface, shared with ``PrivateRedis`` (``kill``, ``start``, ``serve_args``):
    the whole deployment dies and comes back at once."""

    def kill(self) -> None:
        """SIGKILL every node: what each append-only file holds is all that survives."""
        for node in self.nodes:
            node.kill()

    def start(self) -> None:
        """Restart every node from its own directory (``nodes.conf``, AOF) on its port,
        and wait until every node says the cluster is ok (every slot served) again."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                node.start()
        self.wait_ok()

    def serve_args(self) -> list[str]:
        """How ``zerodb-server serve`` is pointed at this cluster."""
        return ["--redis-cluster", self.spec]

    def storage(self, **kwargs) -> ClusterStorage:
        """A storage on this cluster (close it after use)."""
        return ClusterStorage(self.spec, **kwargs)

    def node_clients(self) -> list[redis.Redis]:
        """A client of every node holding data: the masters."""
        return [node.client() for node in self.masters()]


def start_cluster(
    directory: Path,
    *,
    masters: int = 3,
    replicas: int = 0,
    login: NodeLogin | None = None,
    **options: str,
) -> LocalCluster:
    """Start the nodes, create the cluster, wait until it is ok (``login``: how to log in
    to nodes whose ``options`` ask for a user or TLS); a test fails if it cannot."""

    def start_node(index: int) -> ClusterNodeProcess:
        node = ClusterNodeProcess(directory / f"node-{index}", login, **options)
        node.start()
        return node

    try:
        return local_cluster.start_cluster(
            LocalCluster(),
            start_node,
            masters=masters,
            replicas=replicas,
            cli_args=(login or NodeLogin()).cli_args(),
        )
    except ClusterError as exc:
        pytest.fail(str(exc), pytrace=False)


def move_slot(cluster: LocalCluster, slot: int, target: ClusterNodeProcess) -> None:
    """Migrate one slot and its keys to ``target``, as ``redis-cli --cluster reshard``
    does it: IMPORTING/MIGRATING, MIGRATE the keys, then SETSLOT NODE everywhere."""
    masters = cluster.masters()
    ids = {n.port: _text(n.client().cluster("myid")) for n in masters}
    source = next(
        n
        for n in masters
        for first, last, owner, *_ in n.client().execute_command("CLUSTER", "SLOTS")
        if first <= slot <= last and owner[1] == n.port
    )
    assert source is not target, "the slot is already there"
    target.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
    source.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
    while keys := source.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        source.client().execute_command(
            "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
        )
    for node in (target, source, *masters):
        node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target.port])


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
