"""``zerodb-server``: run the blob server and manage its tenants and keys.

Examples::

    zerodb-server add-tenant acme --storage sqlite:///var/blobs.zdb
    zerodb-server add-key acme 02ab...  --storage sqlite:///var/blobs.zdb
    zerodb-server serve --bind 127.0.0.1:8001 --storage sqlite:///var/blobs.zdb
    zerodb-server check --bind 127.0.0.1:8001

The tenants file defaults to ``<sqlite store>.tenants.json``; with any other storage,
``--tenants PATH`` is required.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import signal
import socket
import ssl
import sys
from pathlib import Path

from blob_server import protocol
from blob_server.exceptions import StorageError
from blob_server.tenants import TenantRegistry

_SQLITE = "sqlite:///"

# glibc's mallopt parameter number for M_TOP_PAD (malloc.h).
M_TOP_PAD = -2


def parse_bind(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[::1]:8001`` for IPv6)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _storage_url(args: argparse.Namespace) -> str | None:
    if getattr(args, "redis", None):
        return args.redis
    return getattr(args, "storage", None)


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
    where = serve.add_mutually_exclusive_group()
    where.add_argument(
        "--storage",
        metavar="URL",
        default="memory://",
        help="memory:// (default), sqlite:///relative.zdb or sqlite:////absolute.zdb",
    )
    where.add_argument("--redis", metavar="URL", help="redis://host:6379/0 (production storage)")
    serve.add_argument(
        "--tenants", metavar="PATH", help="tenants file (default: <sqlite store>.tenants.json)"
    )
    serve.add_argument("--tls-cert", metavar="PEM", help="certificate chain for TLS")
    serve.add_argument("--tls-key", metavar="PEM", help="private key for TLS")
    serve.add_argument("--max-connections", type=int, default=256, help="default: 256")
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="seconds before an idle connection is closed (default: 300)",
    )
    serve.add_argument(
        "--gc-interval", type=float, default=60.0, help="seconds between garbage collections"
    )
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING")
    serve.add_argument(
        "--no-push",
        action="store_true",
        help="do not push root changes to subscribed clients; required when several "
        "servers share one storage (a push covers only commits through this process)",
    )

    add_tenant = sub.add_parser(
        "add-tenant", help="create a tenant", description="Create a tenant (with no keys)."
    )
    add_tenant.add_argument("name", help="1-64 letters, digits, '_', '.', '-'")
    _add_tenant_options(add_tenant)

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
        "list-tenants", help="list tenants and keys", description="List tenants and their keys."
    )
    _add_tenant_options(list_tenants)

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


def _keep_freed_memory() -> None:
    """Ask glibc to keep 64 MiB of freed heap instead of returning it to the kernel.

    Every answer of ~1 MiB was otherwise faulted in page by page again (481 faults and
    1.5 ms per pack of a 1 MiB answer; none and 0.09 ms with the pad). Other C libraries:
    nothing to do.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_TOP_PAD, 64 * 1024 * 1024)
    except (OSError, AttributeError):
        pass


def serve(args: argparse.Namespace) -> int:
    from blob_server.auth import Authenticator
    from blob_server.server import BlobServer
    from blob_server.storage import open_storage

    _keep_freed_memory()
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    url = _storage_url(args)
    registry = TenantRegistry(tenants_path(args))
    try:
        storage = open_storage(url)
    except StorageError as exc:
        raise SystemExit(f"error: {exc}") from None
    server = BlobServer(
        storage,
        Authenticator(registry),
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        gc_interval=args.gc_interval,
        ssl=_tls_context(args),
        push=not args.no_push,
    )

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
        asyncio.run(run())
    finally:
        storage.close()
    return 0


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "check":
        return check(args)
    registry = TenantRegistry(tenants_path(args))
    try:
        if args.command == "add-tenant":
            registry.add_tenant(args.name)
            print(f"tenant {args.name} added ({registry.path})")
        elif args.command == "add-key":
            key = registry.add_key(args.tenant, args.pubkey)
            print(f"key {key} registered for tenant {args.tenant}")
        elif args.command == "remove-key":
            registry.remove_key(args.tenant, args.pubkey)
            print(f"key removed from tenant {args.tenant}")
        elif args.command == "list-tenants":
            for name, keys in registry.tenants().items():
                print(name)
                for key in keys:
                    print(f"  {key}")
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
