"""A private redis-server per test session (per xdist worker), and fresh RedisStorages on it.

The server listens on a free loopback port (never 6379: a developer's own Redis is never
touched), keeps nothing on disk, and is killed at the end of the session. A machine without
``redis-server`` fails these tests loudly instead of skipping them: the Redis backend is the
production one and must not go untested silently.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from blob_server.storage import RedisStorage
from blob_server.wire.storage import Storage

INSTALL_HINT = (
    "redis-server is not installed (or not on PATH); the Redis storage tests need it. "
    "Install it: `apt-get install redis-server` (Debian/Ubuntu), `dnf install redis`, "
    "`brew install redis`; .ci/run does this on CI."
)


@dataclass(frozen=True)
class RedisServer:
    """A running redis-server started by the tests."""

    port: int
    process: subprocess.Popen

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.url(db))


def free_port() -> int:
    """Return a loopback TCP port that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis_server(directory: Path, password: str | None = None) -> RedisServer:
    """Start redis-server on a free port and wait until it answers PING."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    last_error = ""
    for _ in range(5):  # another process may grab the free port before redis binds it
        port = free_port()
        log = directory / f"redis-{port}.log"
        options = {
            "port": str(port),
            "bind": "127.0.0.1",
            "save": "",
            "appendonly": "no",
            "dir": str(directory),
            "databases": "16",
            "loglevel": "warning",
            "logfile": str(log),
        }
        if password:
            options["requirepass"] = password
        argv = [binary, *(arg for name, value in options.items() for arg in (f"--{name}", value))]
        process = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(
            host="127.0.0.1", port=port, password=password, socket_connect_timeout=0.5
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if client.ping():
                    client.close()
                    return RedisServer(port, process)
            except redis.ConnectionError:
                time.sleep(0.02)
        client.close()
        stop_redis_server(process)
        last_error = log.read_text(errors="replace") if log.exists() else "(no log)"
    pytest.fail(f"redis-server did not start: {last_error}", pytrace=False)


def stop_redis_server(process: subprocess.Popen) -> None:
    """Terminate the server (kill it if it lingers) and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    """One redis-server for this session (each xdist worker starts its own)."""
    server = start_redis_server(tmp_path_factory.mktemp("redis"))
    yield server
    stop_redis_server(server.process)


@pytest.fixture
def redis_storage_factory(redis_server) -> Iterator:
    """Make RedisStorages on database 0, emptied before the test; closed after it."""
    admin = redis_server.client()
    admin.flushdb()
    opened: list[RedisStorage] = []

    def make(**kwargs) -> RedisStorage:
        store = RedisStorage(redis_server.url(), **kwargs)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
    admin.close()


@pytest.fixture
def redis_storage(redis_storage_factory) -> RedisStorage:
    """A fresh RedisStorage on an empty database."""
    return redis_storage_factory()


class PrivateRedis:
    """A redis-server of one test only, persisting with ``appendonly yes`` and
    ``appendfsync always`` unless ``options`` say otherwise (a value may be a tuple of
    words, e.g. ``{"rename-command": ("CONFIG", "")}``); it can be killed with SIGKILL
    and restarted on the same port and directory, which keeps its append-only file."""

    def __init__(self, directory: Path, **options: str | tuple[str, ...]) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.options = options
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=0.5)

    def serve_args(self) -> list[str]:
        """How ``zerodb-server serve`` is pointed at this Redis."""
        return ["--redis", self.url]

    def storage(self, **kwargs) -> RedisStorage:
        """A storage on this Redis (close it after use)."""
        return RedisStorage(self.url, **kwargs)

    def node_clients(self) -> list[redis.Redis]:
        """A client of every node holding data: this one."""
        return [self.client()]

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(INSTALL_HINT, pytrace=False)
        options = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "save": "",
            "appendonly": "yes",
            "appendfsync": "always",
            "dir": str(self.dir),
            "loglevel": "warning",
            "logfile": str(self.dir / "redis.log"),
            **{name.replace("_", "-"): value for name, value in self.options.items()},
        }
        argv = [binary]
        for name, value in options.items():
            argv += [f"--{name}", *((value,) if isinstance(value, str) else value)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + 20
        try:
            while time.monotonic() < deadline and self.process.poll() is None:
                with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
                    if client.ping():
                        return
                time.sleep(0.02)
        finally:
            client.close()
        self.kill()
        log = (self.dir / "redis.log").read_text(errors="replace")
        pytest.fail(f"redis-server did not start on port {self.port}: {log}", pytrace=False)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last fsync; what the append-only file holds is all."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_store(kind: str, directory: Path, **options: str | tuple[str, ...]):
    """A running deployment of one test: a ``PrivateRedis`` (``kind`` "redis") or a
    3-master ``tests.server.cluster.LocalCluster`` ("cluster"), every node persisting with
    ``appendonly yes`` and ``appendfsync always`` unless ``options`` say otherwise. Both
    can be SIGKILLed and restarted as a whole (``kill``, ``start``) and name themselves
    to ``serve`` (``serve_args``); ``storage`` and ``node_clients`` reach their data."""
    if kind == "redis":
        store = PrivateRedis(directory, **options)
        store.start()
        return store
    from tests.server.cluster import start_cluster

    return start_cluster(directory, **{"appendonly": "yes", "appendfsync": "always", **options})


@pytest.fixture(params=["redis", "cluster"])
def aof_store(request, tmp_path):
    """``start_store`` with its defaults: one Redis, then a cluster; killed after the test."""
    store = start_store(request.param, tmp_path / request.param)
    yield store
    store.kill()


@pytest.fixture
def servers() -> Iterator[list]:
    """``tests.server.test_server_e2e.ServerProcess``es a test started: stopped after it,
    and their logs checked for tracebacks and failed operations."""
    started: list = []
    yield started
    for server in started:
        server.stop()
        log = server.log.read_text(errors="replace")
        assert "Traceback" not in log and "event=op_failed" not in log, log[-3000:]


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """One 3-master Redis Cluster for this session (each xdist worker starts its own)."""
    from tests.server.cluster import start_cluster

    cluster = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_storage_factory(redis_cluster) -> Iterator:
    """Make ClusterStorages on the session's cluster, emptied before the test."""
    from blob_server.storage.cluster import ClusterStorage

    redis_cluster.flush()
    opened: list[ClusterStorage] = []

    def make(**kwargs) -> ClusterStorage:
        store = ClusterStorage(redis_cluster.spec, **kwargs)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@dataclass(frozen=True)
class ServerBackend:
    """Where an end-to-end ``zerodb-server`` keeps its data: one database of the session's
    redis-server (``--redis URL``) or the session's 3-master cluster (``--redis-cluster``).

    The end-to-end modules run once on each: what they check is the server's behaviour,
    which must not depend on the Redis deployment behind it."""

    name: str
    flag: str
    address: str
    flush: Callable[[], None]
    node_ports: Callable[[], list[int]]
    _client: Callable[[], redis.Redis | redis.RedisCluster]
    _storage: Callable[..., Storage]

    def client(self) -> redis.Redis | redis.RedisCluster:
        """A redis-py client for the keys the server wrote (a cluster client routes by slot;
        its ``scan_iter`` visits every master)."""
        return self._client()

    def storage(self, **kwargs) -> Storage:
        """A storage of the backend's kind on the server's data (close it after use)."""
        return self._storage(**kwargs)

    def cli_args(self) -> list[str]:
        """The options of ``zerodb-server stats`` (and other commands) naming it."""
        return [self.flag, self.address]

    def serve_on(self, server) -> None:
        """Point a ``tests.server.test_server_e2e.ServerProcess``'s ``--storage`` option at
        this backend (the tests' Redis keeps no AOF: ``--allow-volatile-redis``)."""
        at = server.args.index("--storage")
        server.args[at : at + 2] = self.cli_args()
        server.args.append("--allow-volatile-redis")


def _redis_backend(request, db: int) -> ServerBackend:
    server: RedisServer = request.getfixturevalue("redis_server")
    url = server.url(db)
    return ServerBackend(
        "redis",
        "--redis",
        url,
        lambda: server.client(db).flushdb(),
        lambda: [server.port],
        lambda: server.client(db),
        lambda **kwargs: RedisStorage(url, **kwargs),
    )


def _cluster_backend(request) -> ServerBackend:
    from blob_server.storage.cluster import ClusterStorage

    cluster = request.getfixturevalue("redis_cluster")
    nodes = [redis.cluster.ClusterNode("127.0.0.1", node.port) for node in cluster.nodes]
    return ServerBackend(
        "cluster",
        "--redis-cluster",
        cluster.spec,
        cluster.flush,
        lambda: [node.port for node in cluster.masters()],
        lambda: redis.RedisCluster(startup_nodes=nodes),
        lambda **kwargs: ClusterStorage(cluster.spec, **kwargs),
    )


@pytest.fixture(scope="module", params=["redis", "cluster"])
def server_backend(request) -> ServerBackend:
    """The module's end-to-end backend, emptied: its ``REDIS_DB`` of the session's
    redis-server, then the session's cluster. A module using it must be one xdist group
    (``pytestmark = pytest.mark.xdist_group(...)``): its tests then run back to back on
    one worker, so no other test's flush of the shared cluster lands between them."""
    if request.param == "redis":
        backend = _redis_backend(request, request.module.REDIS_DB)
    else:
        backend = _cluster_backend(request)
    backend.flush()
    return backend
