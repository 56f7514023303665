"""Test helpers for the blob server: an in-process server on a thread, and a raw client
that speaks frames by hand (so tests can send exactly the bytes an attacker would)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.server import BlobServer
from blob_server.storage import Storage
from blob_server.tenants import TenantRegistry
from blob_server.wire import protocol


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class InProcessServer:
    """A BlobServer on its own event loop thread, listening on a free loopback port."""

    def __init__(self, storage: Storage, authenticator: Authenticator, **kwargs) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        kwargs.setdefault("gc_interval", 0)
        self.server = BlobServer(storage, authenticator, **kwargs)
        started = asyncio.run_coroutine_threadsafe(self.server.start("127.0.0.1", 0), self.loop)
        self.port = started.result(5).sockets[0].getsockname()[1]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Wire:
    """A raw protocol client: one socket, requests and answers by hand."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.next_id = 1

    def close(self) -> None:
        self.sock.close()

    def send(self, op: str, args: dict | None = None) -> int:
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(protocol.request_frame(rid, op, args or {}))
        return rid

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> protocol.Response:
        return protocol.parse_response(protocol.recv_frame(self.sock))

    def call(self, op: str, args: dict | None = None) -> protocol.Response:
        rid = self.send(op, args)
        response = self.recv()
        assert response.request_id == rid
        return response

    def closed_by_server(self) -> bool:
        """Whether the server closed the connection (EOF, after any pending frames)."""
        try:
            while True:
                protocol.recv_frame(self.sock)
        except (ConnectionError, OSError):
            return True

    def login_args(
        self, tenant: str, key: PrivateKey, *, server_id: str, nonce: bytes, at: int
    ) -> dict:
        public = key.public_key.format()
        digest = protocol.login_digest(server_id, tenant, public, nonce, at)
        return {
            "tenant": tenant,
            "public_key": public,
            "time": at,
            "signature": key.sign(digest, hasher=None),
        }

    def login(
        self, tenant: str, key: PrivateKey, *, at: int | None = None
    ) -> tuple[protocol.Response, dict]:
        """Challenge, sign, log in; return the login answer and the args sent."""
        challenge = self.call("challenge").result
        args = self.login_args(
            tenant,
            key,
            server_id=challenge["server_id"],
            nonce=challenge["nonce"],
            at=challenge["time"] if at is None else at,
        )
        return self.call("login", args), args


def registry_with(path, **tenants: list[PrivateKey]) -> TenantRegistry:
    """A registry file with these tenants and keys."""
    registry = TenantRegistry(path)
    for name, keys in tenants.items():
        registry.add_tenant(name)
        for key in keys:
            registry.add_key(name, key.public_key.format())
    return registry


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A throwaway P-256 certificate for localhost and 127.0.0.1 (and its key), made with
    ``openssl req`` (the ``cryptography`` package is not a dependency)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    command = (
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 "
        "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 "
        f"-keyout {key} -out {cert}"
    )
    subprocess.run([openssl, *command.split()], check=True, capture_output=True)
    return cert, key
