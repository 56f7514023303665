"""A Redis Cluster on loopback, for the tests (tests/server/cluster.py) and the benchmarks
(``bench.scale_out --masters``): nodes started by the caller's own way of starting a
redis-server, with ``node_options``, joined with ``redis-cli --cluster create``.

Ports are free loopback ports below 55536, so the cluster bus (port + 10000) fits too;
never 6379. Nodes keep no append-only file unless the caller asks (the failover tests
count on replicas and ``WAIT``, not on the disk).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import redis

INSTALL_HINT = (
    "redis-server and redis-cli are not installed (or not on PATH). Install them: "
    "`apt-get install redis-server` (Debian/Ubuntu), `dnf install redis`, `brew install redis`"
)


class ClusterError(RuntimeError):
    """The local cluster could not be made, or did not become ok in time."""


class Node(Protocol):
    """A running redis-server started with ``node_options``."""

    port: int
    process: subprocess.Popen | None

    def client(self) -> redis.Redis: ...

    def stop(self) -> None: ...


def node_options(directory: Path) -> dict[str, str]:
    """redis-server options of a node keeping its cluster state in ``directory``: a short
    node timeout (failovers in about 2 s), a replica always allowed to take over, no
    append-only file."""
    return {
        "cluster-enabled": "yes",
        "cluster-config-file": str(directory / "nodes.conf"),
        "cluster-node-timeout": "1000",
        "cluster-replica-validity-factor": "0",
        "appendonly": "no",
    }


def free_cluster_port() -> int:
    """A loopback port free now whose bus port (+10000) is free too."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port > 55535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise ClusterError("no free port pair for a cluster node")


@dataclass
class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, all on loopback."""

    nodes: list[Node] = field(default_factory=list)

    @property
    def spec(self) -> str:
        """``HOST:PORT,...`` as ``--redis-cluster`` takes it."""
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def masters(self) -> list[Node]:
        """The nodes that are masters now (a failover changes them)."""
        found = []
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            with contextlib.suppress(redis.RedisError):
                role = node.client().execute_command("ROLE")[0]
                if role in (b"master", "master"):
                    found.append(node)
        return found

    def flush(self) -> None:
        """Empty every master (replicas follow)."""
        for node in self.masters():
            node.client().flushall()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node says ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for node in self.nodes:
                if node.process is None or node.process.poll() is not None:
                    continue
                try:
                    states.append(node.client().cluster("info").get("cluster_state"))
                except redis.RedisError as exc:
                    states.append(str(exc))
            if all(s == "ok" for s in states):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster not ok: {states}")
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def start_cluster[Cluster: LocalCluster](
    cluster: Cluster,
    start_node: Callable[[int], Node],
    *,
    masters: int = 3,
    replicas: int = 0,
    cli_args: Sequence[str] = (),
) -> Cluster:
    """Start ``masters * (1 + replicas)`` nodes into ``cluster`` (``start_node(i)`` starts
    the i-th, with ``node_options``), create the cluster (``redis-cli`` with ``cli_args``,
    e.g. its login options), wait until it is ok and every replica is listed. On failure
    every node started is stopped."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise ClusterError(INSTALL_HINT)
    try:
        for index in range(masters * (1 + replicas)):
            cluster.nodes.append(start_node(index))
        argv = [cli, *cli_args, "--cluster", "create"]
        argv += [f"127.0.0.1:{n.port}" for n in cluster.nodes]
        argv += ["--cluster-replicas", str(replicas), "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode:
            raise ClusterError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        cluster.wait_ok()
        if replicas:  # replicas attach after the slots are ok
            deadline = time.monotonic() + 30
            while len(cluster.masters()) != masters or not all(
                len(entry) >= 3 + replicas  # CLUSTER SLOTS lists them: clients see them
                for node in cluster.nodes
                for entry in node.client().execute_command("CLUSTER", "SLOTS")
            ):
                if time.monotonic() > deadline:
                    raise ClusterError("replicas did not attach")
                time.sleep(0.1)
    except BaseException:
        cluster.stop()
        raise
    return cluster
