"""What the blob server adds on top of Redis: fetching 64 blobs of 16 KiB in one request
(next to raw redis-py doing the same Redis work), and commits per second for one and for
4 clients (next to ``RedisStorage.commit`` called in-process), all in one run against one
private redis-server.

Run ``python -m bench.server_vs_redis`` (``make bench``). It starts its own redis-server
(free loopback port, ``--save '' --appendonly no``) and ``zerodb-server serve --redis``
as a subprocess, with a tenant and a login key registered through the CLI. Results:
``bench/results/server-<date>.json`` and the table between the markers in
``docs/performance.md``.

Rows of each measurement:

* **raw redis-py** (fetches): one redis-py client (hiredis) talking to Redis directly,
  one ``MGET`` of the 64 keys: the same work in Redis, so the difference is the server
  alone.
* **RedisStorage in-process**: ``blob_server.storage.RedisStorage`` called directly (key
  derivation, argument checks, its commit script), no network hop of its own: where the
  server's time goes, and the baseline of the commit rows (the commit is measured through
  the storage's public ``commit``, never a copy of its script).
* **blob server**: ``RemoteTransport`` (the client every ``DB((host, port))`` uses) over
  TCP to the server, which logs in the tenant and calls the same storage.

Commit clients are separate processes (``--worker``), started together, each with its own
connection, committing 4 new 16 KiB blobs and a 512-byte root per commit for
``--seconds``. With 4 clients on 4 databases no commit conflicts; with 4 clients on one
database a client whose commit lost the race retries with the seq the conflict answer
carries (the rebase a ``DB`` does, without its client-side merge).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from coincurve import PrivateKey
from tqdm import tqdm

from bench.publish import machine, publish
from blob_server.cli import keep_freed_memory
from blob_server.storage import RedisStorage
from zerodb_core.transport.remote import RemoteTransport

REPO = Path(__file__).resolve().parents[1]
TENANT = "bench"
LISTENING = re.compile(rb"event=listening bind=127\.0\.0\.1:(\d+)")
ENV_KEY = "ZERODB_BENCH_LOGIN_KEY"  # the throwaway login key, for the worker processes
ID_BYTES = 16
ROOT_BYTES = 512
#: Fetches per way in a row, in the second fetch measurement.
RUN_LENGTH = 20


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cpu_ms_per(pids: dict[str, int], before: dict[str, float | None], count: int) -> dict:
    """CPU milliseconds per operation of each process since ``before`` (None if unknown)."""
    out: dict[str, float | None] = {}
    for name, pid in pids.items():
        now = cpu_seconds(pid)
        start = before.get(name)
        out[name] = None if now is None or start is None else (now - start) * 1000 / count
    return out


# -- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_redis(
    directory: Path,
    options: dict[str, str] | None = None,
    pick_port: Callable[[], int] = free_port,
) -> tuple[subprocess.Popen, int]:
    """A throwaway redis-server on a free loopback port (``pick_port``), nothing on disk;
    ``options`` are more of its settings (``bench.local_cluster.node_options``)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    settings = {"save": "", "appendonly": "no", "dir": str(directory), "loglevel": "warning"}
    settings |= options or {}
    for _ in range(5):  # another process may take the free port first
        port = pick_port()
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1"]
        argv += [arg for name, value in settings.items() for arg in (f"--{name}", value)]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if client.ping():
                    client.close()
                    return process, port
            except redis.ConnectionError:
                time.sleep(0.02)
        client.close()
        stop(process)
    raise SystemExit("redis-server did not start")


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "blob_server.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"zerodb-server {args[0]} failed: {done.stderr}")
    return done.stdout


def start_server(
    redis_url: str,
    tenants: Path,
    log: Path,
    options: tuple[str, ...] = ("--gc-interval", "0"),
    *,
    flag: str = "--redis",
) -> tuple[subprocess.Popen, int]:
    """``zerodb-server serve --redis`` on a free port (its log, INFO as deployed, to a file);
    ``flag="--redis-cluster"`` with a node list as ``redis_url`` for a Redis Cluster.

    ``options`` go on its command line; by default no garbage collection, whose sweeps
    would land in the middle of timed fetches (``bench.write_cost`` passes none: it
    measures the server as deployed).
    """
    argv = [sys.executable, "-m", "blob_server.cli", "serve", flag, redis_url]
    # The benchmark's Redis keeps no append-only file (``--appendonly no``, as measured).
    argv += ["--allow-volatile-redis"]
    argv += ["--tenants", str(tenants), *options, "--bind", "127.0.0.1:0"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    with open(log, "ab") as out:
        process = subprocess.Popen(
            argv, cwd=REPO, env=environ, stdout=subprocess.DEVNULL, stderr=out
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and process.poll() is None:
        found = LISTENING.search(log.read_bytes())
        if found:
            return process, int(found.group(1))
        time.sleep(0.05)
    stop(process)
    raise SystemExit(f"the blob server did not start:\n{log.read_text(errors='replace')}")


# -- fetching 64 blobs ---------------------------------------------------------------------


def ms_summary(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "runs": len(samples),
        "median_ms": statistics.median(samples),
        "p10_ms": ordered[len(ordered) // 10],
        "p90_ms": ordered[len(ordered) * 9 // 10],
        "samples_ms": [round(s, 4) for s in samples],
    }


def bench_fetch(
    raw: redis.Redis,
    storage: RedisStorage,
    remotes: dict[str, RemoteTransport],
    pids: dict[str, int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Median time of a 64-blob fetch and of a ping, each way, runs interleaved; then the
    CPU each server process and Redis spend per fetch."""
    remote = remotes["server"]
    blobs = {os.urandom(ID_BYTES): os.urandom(args.blob_bytes) for _ in range(args.fetch_blobs)}
    ids = list(blobs)
    root = remote.get_root("fetch")
    result = remote.commit("fetch", expected_seq=root.seq, root=b"r" * ROOT_BYTES, blobs=blobs)
    assert result.ok, "the fetch database was not empty"
    raw_keys = [b"raw:{fetch}:b:" + i.hex().encode() for i in ids]
    raw.mset(dict(zip(raw_keys, blobs.values(), strict=True)))
    # Everything is checked once (outside the timing): each way returns all 64 blobs.
    assert raw.mget(raw_keys) == list(blobs.values())
    assert storage.get_blobs(TENANT, "fetch", ids) == blobs
    for way in remotes.values():
        assert way.get_blobs("fetch", ids) == blobs

    ways = {
        "raw": lambda: raw.mget(raw_keys),
        "storage": lambda: storage.get_blobs(TENANT, "fetch", ids),
        **{name: (lambda r=r: r.get_blobs("fetch", ids)) for name, r in remotes.items()},
    }
    pings = {"raw": raw.ping, **{name: r.ping for name, r in remotes.items()}}
    for fn in [*ways.values(), *pings.values()] * 20:  # warm up
        fn()
    fetch: dict[str, list[float]] = {name: [] for name in ways}
    ping: dict[str, list[float]] = {name: [] for name in pings}
    for i in tqdm(range(args.runs), desc="fetch 64 x 16 KiB, alternating", unit="run"):
        for name, fn in _rotated(ways, i):
            fetch[name].append(_ms(fn))
        for name, fn in pings.items():
            ping[name].append(_ms(fn))
    # The same fetches in runs of RUN_LENGTH per way (the ways rotating between runs):
    # each process then has just served the same request, as a busy server has.
    in_runs: dict[str, list[float]] = {name: [] for name in ways}
    for i in tqdm(range(args.runs // RUN_LENGTH), desc=f"in runs of {RUN_LENGTH}", unit="run"):
        for name, fn in _rotated(ways, i):
            in_runs[name] += [_ms(fn) for _ in range(RUN_LENGTH)]
    out = {
        "fetch": {name: ms_summary(s) for name, s in fetch.items()},
        "fetch_in_runs": {name: ms_summary(s) for name, s in in_runs.items()},
        "ping": {name: ms_summary(s) for name, s in ping.items()},
    }
    for part in out.values():
        base = part["raw"]["median_ms"]
        for summary in part.values():
            summary["ratio"] = summary["median_ms"] / base
            summary["added_ms"] = summary["median_ms"] - base
    for name, way in remotes.items():  # one server at a time, so its CPU is its own
        count = max(50, args.runs // 2)
        watched = {"server": pids[name], "redis": pids["redis"]}
        before = {k: cpu_seconds(pid) for k, pid in watched.items()}
        for _ in range(count):
            way.get_blobs("fetch", ids)
        out["fetch"][name]["cpu_ms"] = cpu_ms_per(watched, before, count)
    return out


def _rotated(ways: dict[str, Any], i: int) -> list[tuple[str, Any]]:
    """The ways in the order of round ``i``: rotating, so that no way always follows the
    same one."""
    order = list(ways.items())
    return order[i % len(order) :] + order[: i % len(order)]


def _ms(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


# -- committing: one worker process per client ---------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """One committing client: connect, say ``ready``, wait for ``go`` on stdin, commit for
    ``--seconds``, print a JSON summary."""
    keep_freed_memory()  # as the blob server does
    database = args.database
    payloads = [os.urandom(args.blob_bytes) for _ in range(args.commit_blobs)]
    root = os.urandom(ROOT_BYTES)
    if args.worker == "storage":
        storage = RedisStorage(args.redis_url)
        seq = storage.get_root(TENANT, database).seq

        def commit(seq: int, root: bytes, blobs: dict[bytes, bytes]) -> tuple[bool, int]:
            done = storage.commit(TENANT, database, expected_seq=seq, root=root, blobs=blobs)
            return done.ok, done.root.seq
    else:
        remote = RemoteTransport(
            "127.0.0.1", args.port, tenant=TENANT, login_key=bytes.fromhex(os.environ[ENV_KEY])
        )
        seq = remote.get_root(database).seq

        def commit(seq: int, root: bytes, blobs: dict[bytes, bytes]) -> tuple[bool, int]:
            done = remote.commit(database, expected_seq=seq, root=root, blobs=blobs)
            return done.ok, done.root.seq

    print("ready", flush=True)
    sys.stdin.readline()
    latencies: list[float] = []  # of successful commits, conflicted attempts included
    conflicts = 0
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        blobs = {os.urandom(ID_BYTES): data for data in payloads}
        began = time.perf_counter()
        while True:
            ok, seq = commit(seq, root, blobs)
            if ok:
                break
            conflicts += 1
        latencies.append((time.perf_counter() - began) * 1000)
    took = time.perf_counter() - started
    print(
        json.dumps(
            {
                "commits": len(latencies),
                "conflicts": conflicts,
                "seconds": took,
                "latencies_ms": [round(x, 4) for x in latencies],
            }
        ),
        flush=True,
    )


def release_together(
    procs: list[subprocess.Popen], pids: dict[str, int], seconds: float, kind: str
) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """Wait for every worker's ``ready``, note the CPU time of ``pids``, start the workers
    together (``go``) and return their JSON summaries and the CPU times noted before."""
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"a {kind} worker failed to start")
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        ready, _, _ = select.select([proc.stdout], [], [], seconds + 60)
        if not ready:
            raise SystemExit(f"a {kind} worker hung")
        results.append(json.loads(proc.stdout.readline()))
    return results, before


def run_clients(
    kind: str,
    databases: list[str],
    args: argparse.Namespace,
    env: dict[str, str],
    port: int,
    pids: dict[str, int],
) -> dict[str, Any]:
    """Start one worker per database name, release them together, gather their summaries."""
    procs = []
    for database in databases:
        argv = [sys.executable, "-m", "bench.server_vs_redis", "--worker", kind]
        argv += ["--database", database, "--seconds", str(args.seconds)]
        argv += ["--redis-url", args.redis_url, "--port", str(port)]
        argv += ["--blob-bytes", str(args.blob_bytes), "--commit-blobs", str(args.commit_blobs)]
        procs.append(
            subprocess.Popen(
                argv,
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        watched = {"redis": pids["redis"]} | (
            {"server": pids["server"]} if kind == "server" else {}
        )
        results, before = release_together(procs, watched, args.seconds, kind)
        commits = sum(r["commits"] for r in results)
        cpu = cpu_ms_per(watched, before, max(commits, 1))
    finally:
        for proc in procs:
            stop(proc)
    latencies = [x for r in results for x in r["latencies_ms"]]
    return {
        "cpu_ms": cpu,
        "clients": len(databases),
        "databases": len(set(databases)),
        "commits": commits,
        "conflicts": sum(r["conflicts"] for r in results),
        "commits_per_second": sum(r["commits"] / r["seconds"] for r in results),
        "median_ms": statistics.median(latencies) if latencies else None,
        "p90_ms": sorted(latencies)[len(latencies) * 9 // 10] if latencies else None,
    }


def drop_blobs(url: str) -> None:
    """Unlink every blob key between commit runs, so
    Redis memory does not grow with every run (roots stay; nothing reads these again)."""
    client = redis.Redis.from_url(url)
    batch: list[bytes] = []
    for key in client.scan_iter(match="*:b:*", count=2000):
        batch.append(key)
        if len(batch) >= 2000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)
    client.close()


def bench_commits(
    args: argparse.Namespace, env: dict[str, str], port: int, pids: dict[str, int]
) -> dict[str, Any]:
    plan = [
        ("1 client", "storage", ["c1"]),
        ("1 client", "server", ["c1"]),
        ("4 clients, 4 databases", "storage", ["c4-0", "c4-1", "c4-2", "c4-3"]),
        ("4 clients, 4 databases", "server", ["c4-0", "c4-1", "c4-2", "c4-3"]),
        ("4 clients, 1 database", "storage", ["shared"] * 4),
        ("4 clients, 1 database", "server", ["shared"] * 4),
    ]
    out: dict[str, dict[str, Any]] = {}
    for label, kind, databases in tqdm(plan, desc="commit runs", unit="run"):
        out.setdefault(label, {})[kind] = run_clients(kind, databases, args, env, port, pids)
        drop_blobs(args.redis_url)
    for part in out.values():
        base = part["storage"]
        for summary in part.values():
            summary["throughput_ratio"] = (
                summary["commits_per_second"] / (base["commits_per_second"])
            )
            summary["latency_ratio"] = summary["median_ms"] / base["median_ms"]
    return out


# -- reporting -----------------------------------------------------------------------------

WAYS = {
    "raw": "raw redis-py",
    "storage": "`RedisStorage` in-process",
    "server": "blob server (`RemoteTransport`)",
}


def markdown(report: dict) -> str:
    a = report["args"]
    fetch, ping = report["fetch"]["fetch"], report["fetch"]["ping"]
    in_runs = report["fetch"]["fetch_in_runs"]
    lines = [
        f"Run of {report['date']} on {report['machine']['summary']}, Redis "
        f"{report['redis_version']}: `{report['command']}` (total "
        f"{report['total_seconds']:.0f} s). Client, server and Redis share the machine.",
        "",
        f"**Fetch {a['fetch_blobs']} blobs of {a['blob_bytes'] // 1024} KiB in one request**: "
        f"medians of {a['runs']} fetches each way, first alternating (one fetch per way in "
        f"turn), then in runs of {RUN_LENGTH} per way; ping: one empty request.",
        "",
        "| way | alternating: median ms | p10 / p90 ms | added over raw, ms | ratio to raw "
        f"| in runs of {RUN_LENGTH}: median ms | ratio to raw "
        "| ping median ms | server / Redis CPU ms per fetch |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in WAYS.items():
        r, warm = fetch[key], in_runs[key]
        p = f"{ping[key]['median_ms']:.3f}" if key in ping else "-"
        cpu = r.get("cpu_ms", {})
        lines.append(
            f"| {label} | {r['median_ms']:.3f} | {r['p10_ms']:.3f} / {r['p90_ms']:.3f} "
            f"| {r['added_ms']:+.3f} | **{r['ratio']:.2f}** | {warm['median_ms']:.3f} "
            f"| **{warm['ratio']:.2f}** | {p} "
            f"| {_cpu(cpu.get('server'))} / {_cpu(cpu.get('redis'))} |"
        )
    lines += [
        "",
        f"**Commits** of {a['commit_blobs']} new {a['blob_bytes'] // 1024} KiB blobs + a "
        f"{ROOT_BYTES}-byte root, each client for {a['seconds']:g} s (latency: from the first "
        "attempt to success, retries after a conflict included):",
        "",
        "| clients | way | commits/s | ratio to in-process | median ms | p90 ms | conflicts "
        "| server / Redis CPU ms per commit |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, part in report["commits"].items():
        for key, r in part.items():
            cpu = r["cpu_ms"]
            lines.append(
                f"| {label} | {WAYS[key]} | {r['commits_per_second']:,.0f} "
                f"| **{r['throughput_ratio']:.2f}** | {r['median_ms']:.3f} | {r['p90_ms']:.3f} "
                f"| {r['conflicts']:,} | {_cpu(cpu.get('server'))} / {_cpu(cpu.get('redis'))} |"
            )
    return "\n".join(lines)


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=400, help="fetch runs of each way")
    parser.add_argument("--seconds", type=float, default=5.0, help="of each commit run")
    parser.add_argument("--fetch-blobs", type=int, default=64)
    parser.add_argument("--commit-blobs", type=int, default=4, help="new blobs per commit")
    parser.add_argument("--blob-bytes", type=int, default=16 * 1024)
    parser.add_argument("--out", default="bench/results", help="directory for the JSON")
    parser.add_argument(
        "--no-doc", action="store_true", help="do not refresh the table in docs/performance.md"
    )
    # Internal: one committing client (see ``worker``).
    parser.add_argument("--worker", choices=["storage", "server"], help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return None

    started = time.perf_counter()
    keep_freed_memory()  # as the blob server does
    with tempfile.TemporaryDirectory(prefix="zerodb-bench-server-") as tmp:
        tmp_path = Path(tmp)
        redis_proc, redis_port = start_redis(tmp_path)
        servers: dict[str, subprocess.Popen] = {}
        try:
            args.redis_url = f"redis://127.0.0.1:{redis_port}/0"
            tenants = tmp_path / "tenants.json"
            login_key = PrivateKey()
            cli("add-tenant", TENANT, "--tenants", str(tenants))
            cli("add-key", TENANT, login_key.public_key.format().hex(), "--tenants", str(tenants))
            log = tmp_path / "server.log"
            servers["server"], port = start_server(args.redis_url, tenants, log)
            ports = {"server": port}
            pids = {"redis": redis_proc.pid, "server": servers["server"].pid}
            env = {**os.environ, ENV_KEY: login_key.secret.hex()}

            raw = redis.Redis.from_url(args.redis_url)
            storage = RedisStorage(args.redis_url)
            remotes = {
                name: RemoteTransport("127.0.0.1", port, tenant=TENANT, login_key=login_key.secret)
                for name, port in ports.items()
            }
            redis_version = raw.info("server")["redis_version"]
            fetch = bench_fetch(raw, storage, remotes, pids, args)
            for remote in remotes.values():
                remote.close()
            storage.close()
            raw.close()
            commits = bench_commits(args, env, ports["server"], pids)
            for name in servers:
                log = (tmp_path / f"{name}.log").read_text(errors="replace")
                if "Traceback" in log or "op_failed" in log:
                    raise SystemExit(f"the blob server logged a failure:\n{log[-4000:]}")
        finally:
            for process in servers.values():
                stop(process)
            stop(redis_proc)

    now = dt.datetime.now().astimezone()
    options = vars(args).copy()
    for internal in ("worker", "database", "redis_url", "port"):
        options.pop(internal)
    report = {
        "date": now.isoformat(timespec="seconds"),
        "command": ("python -m bench.server_vs_redis " + " ".join(argv or sys.argv[1:])).strip(),
        "machine": machine(),
        "redis_version": redis_version,
        "args": options,
        "fetch": fetch,
        "commits": commits,
        "total_seconds": time.perf_counter() - started,
    }
    publish(
        report,
        markdown(report),
        name="server",
        day=f"{now:%Y-%m-%d}",
        out=args.out,
        heading="Blob server against raw Redis",
        update=not args.no_doc,
    )
    return report


if __name__ == "__main__":
    main()
