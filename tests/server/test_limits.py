"""Connection limits that keep one peer from locking everyone else out, and the pieces of
per-tenant fairness (``blob_server.limits``, the tenants file) on their own."""

from __future__ import annotations

import json
import socket
import time

import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.exceptions import InvalidRequestError
from blob_server.limits import ConnectionTable, RequestRates, ServerFullError, TenantLimits
from blob_server.storage.memory import MemoryStorage
from blob_server.tenants import TenantRegistry
from blob_server.wire import protocol
from tests.server.wire import FakeClock, InProcessServer, Wire, registry_with

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


# -- the pieces, on their own ------------------------------------------------------------------


def test_a_token_bucket_lets_a_burst_through_then_the_rate():
    clock = FakeClock()
    rates = RequestRates(clock)
    limits = TenantLimits(rate=2, burst=3)
    assert [rates.take("acme", limits) for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]
    clock.now += 0.5  # one token more
    assert rates.take("acme", limits) == 0.0
    assert rates.take("acme", limits) == 0.5
    assert rates.take("beta", limits) == 0.0  # every tenant has its own bucket
    assert rates.take("acme", TenantLimits(rate=2, burst=4)) == 0.0  # new limits: a new bucket
    assert rates.take("acme", TenantLimits(rate=None)) == 0.0
    assert rates.take("acme", TenantLimits(rate=0, burst=0)) == float("inf")
    assert TenantLimits(rate=5).bucket == 5  # no burst: one second's worth


def test_the_connection_table_keeps_the_budgets_apart():
    table = ConnectionTable(max_connections=4, max_anonymous_per_address=2)
    assert [table.open(i, "a") for i in (1, 2)] == [None, None]
    assert table.open(3, "a") == 1  # the address's oldest anonymous one makes way
    assert table.log_in(2, "acme", limit=1) and not table.log_in(3, "acme", limit=1)
    assert not table.log_in(1, "acme", limit=None)  # gone: it made way
    assert table.open(4, "b") is None and table.open(5, "c") is None
    assert table.total == 4
    assert table.open(6, "d") == 3  # full: the oldest anonymous one anywhere makes way
    for conn in (4, 5, 6):
        assert table.log_in(conn, f"t{conn}", limit=None)
    with pytest.raises(ServerFullError):  # every connection logged in
        table.open(7, "e")
    table.close(2)
    assert table.of_tenant("acme") == 0 and table.open(7, "e") is None


def test_tenant_limits_in_the_tenants_file_are_checked(tmp_path):
    path = tmp_path / "tenants.json"
    registry = registry_with(path, acme=[KEY])
    defaults = TenantLimits(max_connections=9, rate=100)
    registry.set_limits("acme", max_connections=2, burst=None)
    assert registry.tenant_limits("acme", defaults) == TenantLimits(
        max_connections=2, rate=100, burst=None
    )
    assert registry.tenant_limits("nobody", defaults) == defaults
    with pytest.raises(InvalidRequestError, match="at least"):
        registry.set_limits("acme", max_frame_memory=protocol.MAX_FRAME_BYTES - 1)
    with pytest.raises(InvalidRequestError, match="unknown limit"):
        registry.set_limits("acme", connections=2)
    data = json.loads(path.read_text())
    for bad in ("default", -1, 1.5, protocol.MAX_FRAME_BYTES - 1):
        data["tenants"]["acme"]["max_frame_memory"] = bad
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match="malformed max_frame_memory"):
            TenantRegistry(path)
