"""Commit and fetch throughput with 1, 2 and 4 ``zerodb-server`` processes in front of one
Redis, or of a Redis Cluster of 3 masters, the same clients spread over them as a TCP
balancer would (round robin).

Run ``python -m bench.scale_out`` (``make bench``; ``--masters 1 3`` by default,
``--processes 1 2 4``). For 1 master it starts its own redis-server (free loopback port,
nothing on disk) and the server processes (``zerodb-server serve --redis``, pushes on, as
deployed); for 3, a cluster of 3 masters without replicas on loopback
(``bench.local_cluster``, nothing on disk) and ``serve --redis-cluster``. It registers a
tenant and a login key through the CLI, and runs
``--clients`` client processes (``RemoteTransport``, the client every ``DB((host, port))``
uses), client ``i`` talking to server ``i mod N``:

* **commit**: each client commits 4 new 16 KiB blobs and a 512-byte root per commit, in
  its own database (no conflicts), for ``--seconds``;
* **fetch**: each client fetches the same 64 blobs of 4 KiB (one ``get_blobs`` request)
  again and again for ``--seconds``.

Besides the throughput it reports the CPU time per operation of Redis (all masters
together) and of all server processes together (from /proc), which does not depend on how
busy the machine is, and the load average when each run started. Results:
``bench/results/scale-out-<date>.json`` and the table between the markers in
``docs/performance.md`` (``--name NAME`` writes ``NAME-<date>.json`` and its own section
instead, e.g. for a comparison run with ``--no-doc``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from coincurve import PrivateKey
from tqdm import tqdm

from bench.local_cluster import LocalCluster, free_cluster_port, node_options, start_cluster
from bench.publish import machine, publish
from bench.server_vs_redis import (
    ENV_KEY,
    ID_BYTES,
    REPO,
    ROOT_BYTES,
    TENANT,
    cli,
    cpu_seconds,
    release_together,
    start_redis,
    start_server,
    stop,
)
from blob_server.cli import keep_freed_memory
from zerodb_core.transport.remote import RemoteTransport

PROCESSES = (1, 2, 4)
#: 1: one redis-server (``--redis``); more: a Redis Cluster of that many masters.
MASTERS = (1, 3)
FETCH_IDS = 64
FETCH_BLOB_BYTES = 4096
COMMIT_BLOBS = 4
COMMIT_BLOB_BYTES = 16384


def worker(args: argparse.Namespace) -> None:
    """One client: connect, say ``ready``, wait for ``go``, work for ``--seconds``, print
    a JSON summary (operations done and seconds taken)."""
    keep_freed_memory()  # as the blob server does
    remote = RemoteTransport(
        "127.0.0.1", args.port, tenant=TENANT, login_key=bytes.fromhex(os.environ[ENV_KEY])
    )
    database = args.database
    seq = remote.get_root(database).seq
    root = os.urandom(ROOT_BYTES)
    if args.worker == "fetch":
        ids = [bytes.fromhex(x) for x in args.ids.split(",")]

        def step(seq: int) -> int:
            if len(remote.get_blobs(database, ids)) != len(ids):
                raise SystemExit("a fetched blob is missing")
            return seq

    else:
        payloads = [os.urandom(COMMIT_BLOB_BYTES) for _ in range(COMMIT_BLOBS)]

        def step(seq: int) -> int:
            blobs = {os.urandom(ID_BYTES): data for data in payloads}
            done = remote.commit(database, expected_seq=seq, root=root, blobs=blobs)
            if not done.ok:
                raise SystemExit("a commit to a database of its own conflicted")
            return done.root.seq

    print("ready", flush=True)
    sys.stdin.readline()
    operations = 0
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        seq = step(seq)
        operations += 1
    print(json.dumps({"operations": operations, "seconds": time.perf_counter() - started}))
    remote.close()


def seed_fetch_blobs(port: int) -> list[bytes]:
    """Commit the blobs the fetch clients read; return their ids."""
    remote = RemoteTransport(
        "127.0.0.1", port, tenant=TENANT, login_key=bytes.fromhex(os.environ[ENV_KEY])
    )
    blobs = {os.urandom(ID_BYTES): os.urandom(FETCH_BLOB_BYTES) for _ in range(FETCH_IDS)}
    seq = remote.get_root("fetched").seq
    if not remote.commit("fetched", expected_seq=seq, root=b"r", blobs=blobs).ok:
        raise SystemExit("could not seed the fetched blobs")
    remote.close()
    return list(blobs)


@dataclass
class ClusterNode:
    """A node of the benchmark's cluster (``bench.local_cluster.Node``)."""

    process: subprocess.Popen
    port: int

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=5)

    def stop(self) -> None:
        stop(self.process)


@contextmanager
def redis_behind(masters: int, directory: Path) -> Iterator[tuple[str, str, dict[str, int]]]:
    """One redis-server (``masters`` 1) or a cluster of ``masters`` masters without
    replicas, on loopback; yield the server's option and its value, and the pids of the
    Redis processes (named ``redis...``)."""
    if masters == 1:
        process, port = start_redis(directory)
        try:
            yield "--redis", f"redis://127.0.0.1:{port}/0", {"redis": process.pid}
        finally:
            stop(process)
        return

    def start_node(index: int) -> ClusterNode:
        home = directory / f"node-{index}"
        home.mkdir()
        return ClusterNode(*start_redis(home, node_options(home), free_cluster_port))

    cluster = start_cluster(LocalCluster(), start_node, masters=masters)
    try:
        pids = {f"redis{i}": node.process.pid for i, node in enumerate(cluster.nodes)}
        yield "--redis-cluster", cluster.spec, pids
    finally:
        cluster.stop()


def run(
    kind: str, ports: list[int], pids: dict[str, int], args: argparse.Namespace, ids: list[bytes]
) -> dict[str, Any]:
    """Run ``--clients`` workers of ``kind`` spread over ``ports``; gather their results."""
    procs = []
    for i in range(args.clients):
        argv = [sys.executable, "-m", "bench.scale_out", "--worker", kind]
        argv += ["--port", str(ports[i % len(ports)]), "--seconds", str(args.seconds)]
        argv += ["--database", f"{kind}-{i}" if kind == "commit" else "fetched"]
        argv += ["--ids", ",".join(x.hex() for x in ids)]
        procs.append(
            subprocess.Popen(
                argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        )
    load = os.getloadavg()[0]
    try:
        results, before = release_together(procs, pids, args.seconds, kind)
    finally:
        for proc in procs:
            stop(proc)
    operations = sum(r["operations"] for r in results)
    used = {name: (cpu_seconds(pid) or 0.0) - (before[name] or 0.0) for name, pid in pids.items()}
    redis_cpu = sum(v for name, v in used.items() if name.startswith("redis"))
    servers = sum(v for name, v in used.items() if name.startswith("server"))
    return {
        "operations": operations,
        "per_second": sum(r["operations"] / r["seconds"] for r in results),
        "redis_cpu_ms_per_op": redis_cpu * 1000 / max(operations, 1),
        "servers_cpu_ms_per_op": servers * 1000 / max(operations, 1),
        "load_before": load,
    }


def markdown(report: dict[str, Any]) -> str:
    a = report["args"]
    lines = [
        f"{a['clients']} client processes, {a['seconds']} s per run, on {report['machine']['cpu']}"
        f" ({report['machine']['cores']} cores); load average "
        f"{report['load_before']:.2f} before the runs, and at the start of each (commit / fetch)"
        " in the last column. **Loaded machine**: the clients, every server process and every"
        " Redis process share these cores (with other work), so the throughput shows where the"
        " cores run out, not what the servers can do; the CPU per operation is the steadier"
        " figure (Redis: all masters together).",
        "",
        "| Redis | server processes | commits/s | server CPU ms/commit | Redis CPU ms/commit "
        "| fetches/s (64 x 4 KiB) | server CPU ms/fetch | Redis CPU ms/fetch | load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for masters, runs in report["runs"].items():
        redis_name = "1 redis-server" if masters == "1" else f"{masters} masters"
        for n, row in runs.items():
            c, f = row["commit"], row["fetch"]
            lines.append(
                f"| {redis_name} | {n} | {c['per_second']:.0f} | {c['servers_cpu_ms_per_op']:.2f} "
                f"| {c['redis_cpu_ms_per_op']:.2f} | {f['per_second']:.0f} "
                f"| {f['servers_cpu_ms_per_op']:.2f} | {f['redis_cpu_ms_per_op']:.2f} "
                f"| {c['load_before']:.1f} / {f['load_before']:.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each run")
    parser.add_argument("--clients", type=int, default=4, help="client processes per run")
    parser.add_argument(
        "--masters",
        type=int,
        nargs="+",
        default=list(MASTERS),
        help="1: one redis-server; more: a Redis Cluster of that many masters",
    )
    parser.add_argument("--processes", type=int, nargs="+", default=list(PROCESSES))
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--name", default="scale-out", help="results file and doc section")
    parser.add_argument("--no-doc", action="store_true", help="leave docs/performance.md")
    parser.add_argument("--worker", choices=("commit", "fetch"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return None
    key = PrivateKey()
    os.environ[ENV_KEY] = key.secret.hex()
    report: dict[str, Any] = {
        "args": {
            "seconds": args.seconds,
            "clients": args.clients,
            "masters": args.masters,
            "processes": args.processes,
        },
        "machine": machine(),
        "load_before": os.getloadavg()[0],
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        tenants = directory / "tenants.json"
        cli("add-tenant", TENANT, "--tenants", str(tenants))
        cli("add-key", TENANT, key.public_key.format().hex(), "--tenants", str(tenants))
        setups = [(m, n) for m in args.masters for n in args.processes]
        for masters, n in tqdm(setups, desc="masters x server processes", unit="setup"):
            home = directory / f"redis-{masters}-{n}"
            home.mkdir()
            with redis_behind(masters, home) as (flag, where, pids):
                servers = [
                    start_server(where, tenants, home / f"server-{i}.log", flag=flag)
                    for i in range(n)
                ]
                try:
                    ports = [port for _, port in servers]
                    pids |= {f"server{i}": p.pid for i, (p, _) in enumerate(servers)}
                    ids = seed_fetch_blobs(ports[0])
                    report["runs"].setdefault(str(masters), {})[str(n)] = {
                        kind: run(kind, ports, pids, args, ids) for kind in ("commit", "fetch")
                    }
                finally:
                    for process, _ in servers:
                        stop(process)
    day = dt.date.today().isoformat()
    publish(
        report,
        markdown(report),
        name=args.name,
        day=day,
        out=args.out,
        heading="Several server processes in front of one Redis or a Redis Cluster",
        update=not args.no_doc,
    )
    return report


if __name__ == "__main__":
    main()
