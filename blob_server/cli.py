"""``zerodb-server``: run the blob server and manage its tenants and keys.

Examples::

    zerodb-server add-tenant acme --max-bytes 10G --storage sqlite:///var/blobs.zdb
    zerodb-server add-key acme 02ab...  --storage sqlite:///var/blobs.zdb
    zerodb-server serve --bind 127.0.0.1:8001 --storage sqlite:///var/blobs.zdb
    zerodb-server set-limits acme --max-blobs 1000000 --rate 500 --storage sqlite:///var/blobs.zdb
    zerodb-server stats --storage sqlite:///var/blobs.zdb --json
    zerodb-server check --bind 127.0.0.1:8001

The tenants file defaults to ``<sqlite store>.tenants.json``; with any other storage,
``--tenants PATH`` is required. Sizes take binary suffixes (``512K``, ``10G``, ``1TiB``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import json
import logging
import re
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from blob_server.auth import FAILURE_WINDOW, MAX_ADDRESS_FAILURES
from blob_server.durability import ASSUMABLE
from blob_server.exceptions import PersistenceUnknownError, StorageError
from blob_server.frames import DEFAULT_FRAME_TIMEOUT
from blob_server.leases import DEFAULT_LEASE_TIMEOUT
from blob_server.limits import (
    DEFAULT_LOGIN_DEADLINE,
    DEFAULT_MAX_ANONYMOUS_PER_ADDRESS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_FRAME_MEMORY,
    DEFAULT_MAX_LOGIN_FAILURES,
    DEFAULT_TENANT_FRAME_MEMORY,
    FAIRNESS_KEYS,
    TenantLimits,
    default_tenant_connections,
)
from blob_server.tenants import DEFAULT, LIMIT_KEYS, Limit, TenantRegistry
from blob_server.wire import protocol
from blob_server.wire.storage import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STAGING_TIMEOUT,
    DURABLE,
    EVERYSEC,
    MAX_QUOTA,
    Quota,
    Storage,
)

_SQLITE = "sqlite:///"

# glibc's mallopt parameter number for M_TOP_PAD (malloc.h).
M_TOP_PAD = -2


def parse_bind(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[::1]:8001`` for IPv6)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


_SIZE = re.compile(r"([0-9]+)\s*([kmgt]?)(i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
UNLIMITED = "unlimited"


def parse_size(value: str) -> int:
    """Parse a byte count: digits with an optional binary suffix (``64K``, ``10G``,
    ``1TiB``; K = 1024), at most 2**53."""
    found = _SIZE.fullmatch(value.strip())
    if not found or (found.group(3) and not found.group(2) and found.group(3).lower() == "ib"):
        raise argparse.ArgumentTypeError(f"expected a size such as 1048576, 512K or 10G: {value!r}")
    size = int(found.group(1)) * _UNITS[found.group(2).lower()]
    if size > MAX_QUOTA:
        raise argparse.ArgumentTypeError(f"{value!r} is more than 2**53 bytes")
    return size


def parse_count(value: str) -> int:
    """Parse a count (of blobs, connections, requests: a non-negative int, at most 2**53)."""
    if not re.fullmatch(r"[0-9]+", value.strip()) or int(value) > MAX_QUOTA:
        raise argparse.ArgumentTypeError(f"expected a count, not {value!r}")
    return int(value)


def _limit_parser(parse: Callable[[str], int], *, default: bool) -> Callable[[str], Limit]:
    """A parser for quota options: a number, ``unlimited``, and (``set-quota``) ``default``."""

    def limit(value: str) -> Limit:
        word = value.strip().lower()
        if word == UNLIMITED:
            return None
        if default and word == DEFAULT:
            return DEFAULT
        return parse(value)

    return limit


def _storage_url(args: argparse.Namespace) -> str | None:
    if getattr(args, "redis", None):
        return args.redis
    if getattr(args, "redis_cluster", None):
        return "redis-cluster://" + args.redis_cluster
    return getattr(args, "storage", None)


def _non_negative_int(value: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return number


def read_password_file(path: str) -> str:
    """The password in ``path``: the file's text without its final line break (as
    ``echo secret > file`` writes it, or a mounted Kubernetes or Docker secret)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageError(f"cannot read the Redis password file: {exc}") from None
    password = text.removesuffix("\n").removesuffix("\r")
    if not password or "\n" in password:
        raise StorageError(f"the Redis password file {path} must hold one non-empty line")
    return password


def _open_storage(args: argparse.Namespace) -> Storage:
    """The storage the options name (``--redis-cluster`` with its replica options,
    ``--redis-password-file`` for either Redis)."""
    from blob_server.storage import open_storage

    spec = getattr(args, "redis_cluster", None)
    wait_ms = getattr(args, "replica_timeout", None)
    password_file = getattr(args, "redis_password_file", None)
    password = None if password_file is None else read_password_file(password_file)
    if spec:
        from blob_server.storage.cluster import ClusterStorage

        return ClusterStorage(
            spec,
            password=password,
            min_replicas=getattr(args, "min_replicas", None),
            replica_timeout=1.0 if wait_ms is None else wait_ms / 1000,
        )
    if getattr(args, "min_replicas", None) is not None or wait_ms is not None:
        raise StorageError("--min-replicas and --replica-timeout need --redis-cluster")
    url = _storage_url(args)
    if password is not None:
        if not getattr(args, "redis", None):
            raise StorageError("--redis-password-file needs --redis or --redis-cluster")
        from blob_server.storage.redis import url_with_password

        url = url_with_password(args.redis, password)
    return open_storage(url)


def tenants_path(args: argparse.Namespace) -> Path:
    """``--tenants``, or the file beside an SQLite store; exit with a message otherwise."""
    if args.tenants:
        return Path(args.tenants)
    url = _storage_url(args)
    if url and url.startswith(_SQLITE) and len(url) > len(_SQLITE):
        return Path(url[len(_SQLITE) :] + ".tenants.json")
    raise SystemExit("error: --tenants PATH is required unless the storage is sqlite:///path")


def _add_tenant_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenants", metavar="PATH", help="tenants file (default: <sqlite store>.tenants.json)"
    )
    parser.add_argument(
        "--storage", metavar="URL", help="storage URL, used to find the default tenants file"
    )


#: The per-tenant limit options of ``add-tenant`` and ``set-limits``: the tenants file key
#: (the dest), how a value parses, what it limits.
_LIMIT_OPTIONS: tuple[tuple[str, Callable[[str], int], str, str], ...] = (
    ("max_bytes", parse_size, "SIZE", "most bytes the tenant may store (blobs, roots, keyrings)"),
    ("max_blobs", parse_count, "N", "most blobs the tenant may store"),
    ("max_connections", parse_count, "N", "most connections the tenant may hold logged in"),
    (
        "max_frame_memory",
        parse_size,
        "SIZE",
        "most bytes of the tenant's frames being received at once (at least 64M)",
    ),
    ("rate", parse_count, "N", "most requests a second the tenant may send"),
    (
        "burst",
        parse_count,
        "N",
        "requests at once over the rate ('unlimited': as many as the rate)",
    ),
    (
        "max_login_failures",
        parse_count,
        "N",
        "failed logins as the tenant from one address within the failure window before "
        "that address is refused as the tenant for a while (others at it are not)",
    ),
)


#: The ``serve --tenant-*`` options of the fairness limits: their default, and what it is.
_TENANT_DEFAULTS: dict[str, tuple[object, str]] = {
    "max_connections": (argparse.SUPPRESS, "half of --max-connections"),
    "max_frame_memory": (DEFAULT_TENANT_FRAME_MEMORY, "64M, also the least"),
    "rate": (None, "unlimited"),
    "burst": (None, "one second's worth, the rate"),
    "max_login_failures": (DEFAULT_MAX_LOGIN_FAILURES, str(DEFAULT_MAX_LOGIN_FAILURES)),
}


def _add_limit_options(parser: argparse.ArgumentParser, *, default: bool) -> None:
    """The per-tenant limits (``_LIMIT_OPTIONS``). An option left out is absent from the
    namespace: ``set-limits`` keeps the limit, ``add-tenant`` leaves the server's default."""
    words = ", 'unlimited' or 'default' (the server's)" if default else " or 'unlimited'"
    for key, parse, metavar, what in _LIMIT_OPTIONS:
        parser.add_argument(
            "--" + key.replace("_", "-"),
            type=_limit_parser(parse, default=default),
            default=argparse.SUPPRESS,
            metavar=metavar,
            help=f"{what}: {'a size' if metavar == 'SIZE' else 'a count'}{words}",
        )


def _add_storage_options(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--storage",
        metavar="URL",
        default=default,
        help="memory:// (default), sqlite:///relative.zdb or sqlite:////absolute.zdb"
        if default
        else "sqlite:///relative.zdb or sqlite:////absolute.zdb",
    )
    where.add_argument(
        "--redis",
        metavar="URL",
        help="redis://[[user]:password@]host:6379/0, rediss:// for TLS (production storage)",
    )
    where.add_argument(
        "--redis-cluster",
        metavar="NODES",
        help="a Redis Cluster: some of its nodes (the others are discovered), as "
        "HOST:PORT[,HOST:PORT...] or redis://[[user]:password@]HOST:PORT[,HOST:PORT...] "
        "(rediss:// for TLS, with ?ssl_ca_certs=PEM, ssl_certfile=PEM&ssl_keyfile=PEM); "
        "a database's blobs spread over every node, its commits stay atomic "
        "(docs/architecture.md)",
    )
    parser.add_argument(
        "--redis-password-file",
        metavar="PATH",
        help="read the password of --redis or --redis-cluster from this file (its one "
        "line) instead of the URL, which other users of the machine can see",
    )
    parser.add_argument(
        "--tenants", metavar="PATH", help="tenants file (default: <sqlite store>.tenants.json)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerodb-server",
        description="The django-zerodb blob server: stores encrypted blobs it cannot read.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the server", description="Run the blob server.")
    serve.add_argument(
        "--bind", type=parse_bind, default=("127.0.0.1", 8001), help="HOST:PORT to listen on"
    )
    _add_storage_options(serve, default="memory://")
    serve.add_argument("--tls-cert", metavar="PEM", help="certificate chain for TLS")
    serve.add_argument("--tls-key", metavar="PEM", help="private key for TLS")
    serve.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="connections held at once; when all are taken, the oldest one that has not "
        f"logged in makes way for a newcomer (default: {DEFAULT_MAX_CONNECTIONS})",
    )
    serve.add_argument(
        "--max-anonymous-per-address",
        type=int,
        default=DEFAULT_MAX_ANONYMOUS_PER_ADDRESS,
        metavar="N",
        help="connections one client address may hold before they log in; a newer one "
        f"closes its oldest (default: {DEFAULT_MAX_ANONYMOUS_PER_ADDRESS})",
    )
    serve.add_argument(
        "--login-deadline",
        type=float,
        default=DEFAULT_LOGIN_DEADLINE,
        metavar="SECONDS",
        help="a connection that has not logged in this long after connecting is closed "
        f"(default: {DEFAULT_LOGIN_DEADLINE:g})",
    )
    serve.add_argument(
        "--max-frame-memory",
        type=parse_size,
        default=DEFAULT_MAX_FRAME_MEMORY,
        metavar="SIZE",
        help="bytes of frames being received at once, all tenants together; a frame that "
        "does not fit waits (default: 256M; at least 64M)",
    )
    serve.add_argument(
        "--frame-timeout",
        type=float,
        default=DEFAULT_FRAME_TIMEOUT,
        metavar="SECONDS",
        help="a frame must arrive whole (waiting for frame memory included) within this "
        "long after its header, or its connection is closed (default: "
        f"{DEFAULT_FRAME_TIMEOUT:g})",
    )
    for key, parse, metavar, what in _LIMIT_OPTIONS:
        if key in _TENANT_DEFAULTS:
            default, said = _TENANT_DEFAULTS[key]
            serve.add_argument(
                "--tenant-" + key.replace("_", "-"),
                type=_limit_parser(parse, default=False),
                default=default,
                metavar=metavar,
                help=f"{what}, unless the tenants file says otherwise: "
                f"{'a size' if metavar == 'SIZE' else 'a count'} or 'unlimited' (default: {said})",
            )
    serve.add_argument(
        "--max-address-login-failures",
        type=parse_count,
        default=MAX_ADDRESS_FAILURES,
        metavar="N",
        help="failed logins from one address, for any tenant names, within the failure "
        "window before that address is refused for a while: only an address trying many "
        f"tenant names gets there (default: {MAX_ADDRESS_FAILURES})",
    )
    serve.add_argument(
        "--login-failure-window",
        type=float,
        default=FAILURE_WINDOW,
        metavar="SECONDS",
        help="how long a failed login counts against its address and tenant "
        f"(default: {FAILURE_WINDOW:g})",
    )
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="seconds before an idle connection is closed (default: 300)",
    )
    serve.add_argument(
        "--gc-interval",
        type=float,
        default=60.0,
        help="seconds between garbage collections, which also read the storage's durability "
        "again (writes are refused while serve would refuse the storage; 0: neither)",
    )
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING")
    serve.add_argument(
        "--loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="event loop: uvloop (libuv, less CPU per request, see docs/performance.md) or "
        "asyncio's own; auto (default) takes uvloop where it is installed",
    )
    serve.add_argument(
        "--no-push",
        action="store_true",
        help="do not push root changes to subscribed clients (they read the root on every "
        "query); no longer needed for several servers on one Redis, whose commits reach "
        "every server through pub/sub; still needed for several servers on one SQLite file",
    )
    serve.add_argument(
        "--default-max-bytes",
        type=_limit_parser(parse_size, default=False),
        default=None,
        metavar="SIZE",
        help="quota of bytes for tenants without their own (default: unlimited)",
    )
    serve.add_argument(
        "--default-max-blobs",
        type=_limit_parser(parse_count, default=False),
        default=None,
        metavar="N",
        help="quota of blobs for tenants without their own (default: unlimited)",
    )
    serve.add_argument(
        "--max-commit-bytes",
        type=parse_size,
        default=protocol.MAX_RESPONSE_BLOB_BYTES,
        metavar="SIZE",
        help="most bytes of blobs (and root) in one commit or stage request (default: 48M; "
        "at most 64M). It bounds one request, not a transaction: clients send a larger "
        "one in several stage requests",
    )
    serve.add_argument(
        "--max-commit-blobs",
        type=parse_count,
        default=protocol.MAX_IDS_PER_REQUEST,
        metavar="N",
        help="most new blobs in one commit or stage request (default and most: "
        f"{protocol.MAX_IDS_PER_REQUEST}); like --max-commit-bytes, it bounds a request, "
        "not a transaction",
    )
    serve.add_argument(
        "--staging-timeout",
        type=float,
        default=DEFAULT_STAGING_TIMEOUT,
        metavar="SECONDS",
        help="delete staged blobs that no commit made live within this many seconds (a "
        "client that died mid-upload); longer than any transaction's upload (default: "
        f"{DEFAULT_STAGING_TIMEOUT:.0f})",
    )
    serve.add_argument(
        "--min-replicas",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="with --redis-cluster: acknowledge a commit only once N replicas of each master "
        "it wrote to confirmed it (WAIT). Default: 1 where the master has a replica, 0 "
        "where it has none; a master with fewer than N replicas fails every commit",
    )
    serve.add_argument(
        "--replica-timeout",
        type=_non_negative_int,
        default=None,
        metavar="MS",
        help="with --redis-cluster: how long a commit waits for its replicas (default: 1000); "
        "one not confirmed in time is answered 'storage unavailable' (outcome unknown)",
    )
    serve.add_argument(
        "--allow-volatile-redis",
        action="store_true",
        help="start on a Redis without the append-only file (appendonly no), or one that "
        "will not tell (CONFIG disabled): a restart of Redis may then lose acknowledged "
        "commits, which clients see as a rollback. Every client is told at login",
    )
    serve.add_argument(
        "--assume-redis-aof",
        choices=ASSUMABLE,
        metavar="FSYNC",
        help="for a Redis that will not tell its persistence settings (CONFIG renamed or "
        "disabled, as on managed Redis): state that it keeps an append-only file with "
        "appendfsync FSYNC (always or everysec), as its provider says. Clients are told "
        "it is unverified",
    )
    serve.add_argument(
        "--commit-lease-timeout",
        type=float,
        default=DEFAULT_LEASE_TIMEOUT,
        metavar="SECONDS",
        help="a client that lost a commit race queues for the database's commit lease, "
        "and holds it (nobody else commits) until it commits, disconnects or this many "
        f"seconds pass; 0 turns leases off: clients race (default: {DEFAULT_LEASE_TIMEOUT:g})",
    )
    serve.add_argument(
        "--garbage-retention",
        type=float,
        default=DEFAULT_RETENTION_SECONDS,
        metavar="SECONDS",
        help="keep blobs that commits replaced this long before deleting them, so that "
        "transactions and snapshots up to this old can still read them (older ones get "
        f"SnapshotTooOldError; default: {DEFAULT_RETENTION_SECONDS:.0f})",
    )

    add_tenant = sub.add_parser(
        "add-tenant",
        help="create a tenant",
        description="Create a tenant (with no keys), with its own quota if given; without "
        "one, the server's --default-max-bytes/--default-max-blobs apply.",
    )
    add_tenant.add_argument("name", help="1-64 letters, digits, '_', '.', '-'")
    _add_limit_options(add_tenant, default=False)
    _add_tenant_options(add_tenant)

    set_limits = sub.add_parser(
        "set-limits",
        aliases=["set-quota"],
        help="change a tenant's quota and limits",
        description="Change a tenant's quota or fairness limits; running servers apply "
        "them without a restart (a quota from the next write, the others within a second). "
        "An option left out keeps its value. (set-quota is its older name.)",
    )
    set_limits.add_argument("tenant")
    _add_limit_options(set_limits, default=True)
    _add_tenant_options(set_limits)

    add_key = sub.add_parser(
        "add-key",
        help="register a login public key",
        description="Register a secp256k1 public key (as printed by "
        "`python -m zerodb_core.keyfile create`) for a tenant.",
    )
    add_key.add_argument("tenant")
    add_key.add_argument("pubkey", metavar="PUBKEY_HEX", help="33-byte compressed key, in hex")
    _add_tenant_options(add_key)

    remove_key = sub.add_parser(
        "remove-key",
        help="revoke a login public key",
        description="Revoke a key: new logins with it are refused.",
    )
    remove_key.add_argument("tenant")
    remove_key.add_argument("pubkey", metavar="PUBKEY_HEX")
    _add_tenant_options(remove_key)

    list_tenants = sub.add_parser(
        "list-tenants",
        help="list tenants and keys",
        description="Print the server id, then each tenant with its limits and keys.",
    )
    _add_tenant_options(list_tenants)

    stats = sub.add_parser(
        "stats",
        help="print each tenant's usage",
        description="Print each tenant's usage (blobs; bytes of blobs, roots and keyrings), "
        "its quota and fairness limits (default: the server's) and its databases (seq, "
        "blobs, blob bytes, garbage waiting for collection, staged blobs no commit has made "
        "live yet), read from "
        "the storage. Tenants come from the tenants file and, for SQLite, the store itself; "
        "Redis keeps no names, so its databases are listed by their opaque tag.",
    )
    _add_storage_options(stats, default=None)
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")

    check = sub.add_parser(
        "check", help="ping a running server", description="Ping a running server; exit 0 if up."
    )
    check.add_argument("--bind", type=parse_bind, default=("127.0.0.1", 8001), help="HOST:PORT")
    check.add_argument("--timeout", type=float, default=5.0, help="seconds (default: 5)")
    return parser


# -- commands ------------------------------------------------------------------------------


def _tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise SystemExit("error: --tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


def keep_freed_memory() -> None:
    """Ask glibc to keep 64 MiB of freed heap instead of returning it to the kernel.

    Otherwise every answer of about 1 MiB is faulted in again page by page after the
    previous one was freed (docs/performance.md has the measurement). The benchmarks'
    measuring clients call it too, so that server and clients allocate alike. Other C
    libraries: nothing to do.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_TOP_PAD, 64 * 1024 * 1024)
    except (OSError, AttributeError):
        pass


def serve(args: argparse.Namespace) -> int:
    from blob_server.auth import Authenticator
    from blob_server.durability import admit
    from blob_server.server import BlobServer, log_event

    keep_freed_memory()
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    registry = TenantRegistry(tenants_path(args))
    try:
        storage = _open_storage(args)
    except StorageError as exc:
        raise SystemExit(f"error: {exc}") from None
    try:
        durability = admit(
            storage, allow_volatile=args.allow_volatile_redis, assume_aof=args.assume_redis_aof
        )
    except StorageError as exc:
        storage.close()
        raise SystemExit(f"error: {exc}") from None
    level = logging.INFO if durability.mode in (DURABLE, EVERYSEC) else logging.WARNING
    log_event(level, "durability", mode=durability.mode, detail=durability.detail)
    try:
        server = BlobServer(
            storage,
            Authenticator(
                registry,
                max_address_failures=args.max_address_login_failures,
                failure_window=args.login_failure_window,
            ),
            max_connections=args.max_connections,
            max_anonymous_per_address=args.max_anonymous_per_address,
            login_deadline=args.login_deadline,
            max_frame_memory=args.max_frame_memory,
            frame_timeout=args.frame_timeout,
            tenant_limits=TenantLimits(
                max_connections=default_tenant_connections(args.max_connections),
                **{
                    key: getattr(args, f"tenant_{key}")
                    for key in _TENANT_DEFAULTS
                    if f"tenant_{key}" in args
                },
            ),
            idle_timeout=args.idle_timeout,
            gc_interval=args.gc_interval,
            ssl=_tls_context(args),
            push=not args.no_push,
            default_quota=Quota(args.default_max_bytes, args.default_max_blobs),
            max_commit_blobs=args.max_commit_blobs,
            max_commit_bytes=args.max_commit_bytes,
            staging_timeout=args.staging_timeout,
            garbage_retention=args.garbage_retention,
            commit_lease_timeout=args.commit_lease_timeout,
            durability=durability,
            admit=functools.partial(
                admit,
                storage,
                allow_volatile=args.allow_volatile_redis,
                assume_aof=args.assume_redis_aof,
            ),
        )
    except (ValueError, StorageError) as exc:
        storage.close()
        raise SystemExit(f"error: {exc}") from None

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await server.start(*args.bind)
        await stop.wait()
        logging.getLogger("blob_server.server").info("event=stopping")
        await server.close()

    try:
        _event_loop_runner(args.loop)(run())
    finally:
        storage.close()
    return 0


def _event_loop_runner(choice: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """``uvloop.run`` or ``asyncio.run``, as ``--loop`` asks (uvloop is a dependency
    everywhere but Windows, which it does not support)."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit("error: --loop uvloop needs uvloop (pip install uvloop)") from None
        else:
            logging.getLogger("blob_server.server").info("event=loop name=uvloop")
            return uvloop.run
    logging.getLogger("blob_server.server").info("event=loop name=asyncio")
    return asyncio.run


def check(args: argparse.Namespace) -> int:
    host, port = args.bind
    try:
        with socket.create_connection((host, port), timeout=args.timeout) as sock:
            sock.sendall(protocol.request_frame(1, "ping", {}))
            response = protocol.parse_response(protocol.recv_frame(sock))
    except (OSError, protocol.ProtocolError) as exc:
        print(f"down: {host}:{port}: {exc}", file=sys.stderr)
        return 1
    if not response.ok or response.request_id != 1:
        print(f"unhealthy: {host}:{port}: {response.result}", file=sys.stderr)
        return 1
    print(f"ok: {host}:{port}")
    return 0


#: The limit columns of the ``stats`` table (the blob count beside the blobs column).
STATS_LIMITS = ("max_blobs", "max_bytes", *FAIRNESS_KEYS)


def _show_limit(value: Limit) -> str:
    return UNLIMITED if value is None else str(value)


def _show_limits(limits: dict[str, Limit], sep: str) -> str:
    return sep.join(f"{key} {_show_limit(limits[key])}" for key in LIMIT_KEYS)


def _limit_args(args: argparse.Namespace) -> dict[str, Limit]:
    """The limit options given (``_LIMIT_OPTIONS``), by tenants file key."""
    return {key: getattr(args, key) for key in LIMIT_KEYS if key in args}


def stats(args: argparse.Namespace) -> int:
    """Print every tenant's usage, quota and databases (``--json`` for machines)."""
    url = _storage_url(args)
    if not url:
        raise SystemExit("error: --storage URL, --redis URL or --redis-cluster NODES is required")
    if url.startswith(_SQLITE) and not Path(url[len(_SQLITE) :]).is_file():
        raise SystemExit(f"error: no store at {url[len(_SQLITE) :]}")
    registry = TenantRegistry(tenants_path(args))
    try:
        storage = _open_storage(args)
    except StorageError as exc:
        raise SystemExit(f"error: {exc}") from None
    try:
        try:
            durability = storage.durability().as_dict()
        except PersistenceUnknownError as exc:
            durability = {"mode": "unknown", "detail": str(exc)}
        known = registry.tenants()
        report = []
        for tenant in sorted(set(known) | set(storage.tenant_names())):
            usage = storage.usage(tenant, detail=True)
            limits = registry.limits(tenant) if tenant in known else {}
            report.append(
                {
                    "tenant": tenant,
                    "registered": tenant in known,
                    "blobs": usage.blobs,
                    "bytes": usage.bytes,
                    **{key: limits.get(key, DEFAULT) for key in LIMIT_KEYS},
                    "databases": [
                        {
                            "database": db.label,
                            "seq": db.seq,
                            "blobs": db.blobs,
                            "bytes": db.bytes,
                            "garbage": db.garbage,
                            "staged": db.staged,
                        }
                        for db in usage.per_database
                    ],
                }
            )
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        storage.close()
    if args.json:
        json.dump(
            {"server_id": registry.server_id, "durability": durability, "tenants": report},
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    header = ("tenant", "database", "seq", "blobs", "bytes", "garbage", "staged")
    rows = [(*header, *STATS_LIMITS)]
    for entry in report:
        count = len(entry["databases"])
        rows.append(
            (
                entry["tenant"],
                f"({count} database{'s' if count != 1 else ''})",
                "",
                str(entry["blobs"]),
                str(entry["bytes"]),
                "",
                "",
                *(_show_limit(entry[key]) for key in STATS_LIMITS),
            )
        )
        for db in entry["databases"]:
            rows.append(
                (
                    entry["tenant"],
                    db["database"],
                    str(db["seq"]),
                    str(db["blobs"]),
                    str(db["bytes"]),
                    str(db["garbage"]),
                    str(db["staged"]),
                    *("" for _ in STATS_LIMITS),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"server id: {registry.server_id or '-'}")
    print(f"durability: {durability['mode']} ({durability['detail']})")
    for row in rows:
        cells = [
            cell.ljust(width) if i < 2 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "check":
        return check(args)
    if args.command == "stats":
        return stats(args)
    registry = TenantRegistry(tenants_path(args))
    try:
        if args.command == "add-tenant":
            registry.add_tenant(args.name, **_limit_args(args))
            print(f"tenant {args.name} added ({registry.path})")
        elif args.command in ("set-limits", "set-quota"):
            changes = _limit_args(args)
            if not changes:
                options = ", ".join("--" + key.replace("_", "-") for key in LIMIT_KEYS)
                raise SystemExit(f"error: give at least one of {options}")
            limits = registry.set_limits(args.tenant, **changes)
            print(f"tenant {args.tenant}: {_show_limits(limits, ', ')}")
        elif args.command == "add-key":
            key = registry.add_key(args.tenant, args.pubkey)
            print(f"key {key} registered for tenant {args.tenant}")
        elif args.command == "remove-key":
            registry.remove_key(args.tenant, args.pubkey)
            print(f"key removed from tenant {args.tenant}")
        elif args.command == "list-tenants":
            print(f"server id: {registry.server_id or '-'}")
            for name, keys in registry.tenants().items():
                print(f"{name}  {_show_limits(registry.limits(name), '  ')}")
                for key in keys:
                    print(f"  {key}")
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
