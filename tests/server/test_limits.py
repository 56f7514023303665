"""Connection limits that keep one peer from locking everyone else out."""

from __future__ import annotations

import socket
import time

import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.storage.memory import MemoryStorage
from tests.server.wire import InProcessServer, Wire, registry_with

KEY = PrivateKey()


def wire_from(port: int, source: str) -> Wire:
    """A raw client connecting from another loopback address."""
    wire = Wire.__new__(Wire)
    wire.sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    wire.next_id = 1
    return wire


@pytest.fixture
def server(tmp_path):
    registry = registry_with(tmp_path / "tenants.json", acme=[KEY])
    running = InProcessServer(
        MemoryStorage(), Authenticator(registry), max_per_address=3, login_deadline=0.5
    )
    yield running
    running.stop()


def test_one_address_cannot_take_every_connection(server):
    held = [Wire(server.port) for _ in range(3)]
    for wire in held:
        assert wire.call("ping").ok
    refused = Wire(server.port)
    assert refused.recv().result[0] == "busy"
    refused.close()
    other = wire_from(server.port, "127.0.0.2")  # another address is still served
    assert other.call("ping").ok
    other.close()
    for wire in held:
        wire.close()


def test_anonymous_connections_must_log_in_soon(server):
    wire = Wire(server.port)
    assert wire.call("ping").ok
    time.sleep(0.7)
    answer = wire.recv()  # the server gave up on the connection unasked
    assert answer.result == ("bad_frame", "login timeout")
    wire.close()
    freed = [Wire(server.port) for _ in range(3)]  # its slot is free again
    assert all(w.call("ping").ok for w in freed)
