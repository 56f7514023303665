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
        MemoryStorage(), Authenticator(registry), max_anonymous_per_address=3, login_deadline=0.5
    )
    yield running
    running.stop()


def test_idle_anonymous_connections_make_way_for_newcomers(server):
    """One address holds at most 3 anonymous connections: a fourth closes the oldest, so
    idle sockets lock nobody out; logged-in ones leave the address's budget."""
    held = [Wire(server.port) for _ in range(3)]
    for wire in held:
        assert wire.call("ping").ok
    newcomer = Wire(server.port)
    assert held[0].recv().result[0] == "busy"  # the oldest made way
    assert held[0].closed_by_server()
    assert newcomer.login("acme", KEY)[0].ok
    more = [Wire(server.port), wire_from(server.port, "127.0.0.2")]
    assert all(wire.call("ping").ok for wire in [*held[1:], *more])  # nobody else closed
    for wire in [*held, newcomer, *more]:
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
