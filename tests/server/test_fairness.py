"""One tenant cannot starve another: the denial-of-service findings of issue 14, replayed.

Each test runs ``zerodb-server serve`` as a subprocess on loopback (SQLite storage) and
attacks it with real sockets as tenant ``small`` (or with no login at all), then shows
that tenant ``acme`` still logs in, writes and queries through the real client:

* 40 idle sockets from one address (the oldest anonymous ones make way);
* one tenant holding every connection from 10 addresses (it stops at its own limit);
* 11 bad logins from a shared address (only that tenant, from there, is locked out);
* 8 stalled 48 MiB frames (the server's memory grows by at most the tenant's frame
  memory, measured as the server process's RSS; waiting and stalled frames time out);
* a tenant over its request rate (``rate_limited``, ``RateLimitedError``).
"""

from __future__ import annotations

import asyncio
import json
import queue
import random
import socket
import threading
import time
from pathlib import Path

import pytest
from coincurve import PrivateKey

from blob_server import protocol
from blob_server.auth import Authenticator
from blob_server.cli import main as cli_main
from blob_server.limits import (
    DEFAULT_MAX_ANONYMOUS_PER_ADDRESS,
    DEFAULT_TENANT_FRAME_MEMORY,
    default_tenant_connections,
)
from blob_server.storage import MemoryStorage
from blob_server.tenants import LIMIT_KEYS, TenantRegistry
from tests.core.hr import Employee
from tests.server.test_limits import wire_from
from tests.server.test_operational_errors import (
    MAX_BLOBS,
    PASSWORD,
    Deployment,
    employees,
    operational,
)
from tests.server.test_server_e2e import ServerProcess
from tests.server.wire import InProcessServer, Wire, registry_with
from zerodb_core import AuthenticationError, RateLimitedError, ServerBusyError
from zerodb_core.keyfile import KeyFile
from zerodb_core.query import InRange
from zerodb_core.transport.remote import RemoteTransport

#: The frames of the stalled-frame finding: as large as a get_blobs answer may be.
STALLED_FRAME = protocol.MAX_RESPONSE_BLOB_BYTES
STALLED_FRAMES = 8


@pytest.fixture
def dep(tmp_path) -> Deployment:
    return Deployment(tmp_path)


def start(dep: Deployment, servers: list, *flags: str) -> ServerProcess:
    server = dep.server(None, *flags)
    servers.append(server)
    return server


def login_key(dep: Deployment, tenant: str) -> PrivateKey:
    return PrivateKey(KeyFile.load(dep.keys[tenant], PASSWORD).login_key)


def acme_is_served(dep: Deployment, server: ServerProcess, batch: int = 0) -> None:
    """Tenant acme logs in, commits records and reads them back by an index."""
    rng = random.Random(batch)
    with dep.open(server) as db:
        db.add(*employees(5, rng, start=5 * batch))
        found = db[Employee].query(InRange("salary", 0, 10**6))
        assert len(found) == 5 * (batch + 1)


def made_way(server: ServerProcess) -> int:
    return server.log.read_text().count("event=made_way")


# -- connections -------------------------------------------------------------------------------


def test_idle_sockets_from_one_address_do_not_lock_another_tenant_out(dep, servers):
    server = start(dep, servers, "--login-deadline", "600")
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
    try:
        extra = len(idle) - DEFAULT_MAX_ANONYMOUS_PER_ADDRESS
        for sock in idle[:extra]:  # the oldest made way, told why
            sock.settimeout(10)
            answer = protocol.parse_response(protocol.recv_frame(sock))
            assert answer.result[0] == protocol.BUSY
        acme_is_served(dep, server)  # from the same address
        assert made_way(server) >= extra + 1  # acme's own connections took idle ones' place
    finally:
        for sock in idle:
            sock.close()


def test_one_tenant_on_ten_addresses_cannot_hold_every_connection(dep, servers):
    server = start(dep, servers, "--max-connections", "20", "--login-deadline", "600")
    key = login_key(dep, "small")
    wires = [wire_from(server.port, f"127.0.0.{2 + i % 10}") for i in range(20)]
    try:
        answers = [wire.login("small", key)[0] for wire in wires]
        limit = default_tenant_connections(20)
        assert sum(answer.ok for answer in answers) == limit
        refused = [answer.result for answer in answers if not answer.ok]
        assert {code for code, _ in refused} == {protocol.BUSY}
        assert f"its limit of {limit}" in refused[0][1]
        # The refused ones stay connected, anonymous: the server holds 20 of 20, yet acme
        # gets in (anonymous connections make way) and stays within its own budget.
        acme_is_served(dep, server)
        logged_in = next(wire for wire, answer in zip(wires, answers, strict=True) if answer.ok)
        fairness = logged_in.call("stats", {"database": "main"}).result["fairness"]
        assert (fairness["connections"], fairness["max_connections"]) == (limit, limit)
    finally:
        for wire in wires:
            wire.close()


def test_bad_logins_from_a_shared_address_lock_out_only_their_tenant(dep, servers):
    server = start(dep, servers)
    for _ in range(10):  # a key nobody registered, as acme, from 127.0.0.1
        with pytest.raises(AuthenticationError):
            dep.open(server, "stranger")
    with pytest.raises(RateLimitedError) as caught:  # the 11th: acme is locked out here
        dep.open(server)
    operational(caught.value, "as this tenant from this address", "retry later")
    with dep.open(server, "small") as db:  # another tenant at the same address is not
        db.add(*employees(3, random.Random(1)))
        assert len(db[Employee].all()) == 3


# -- frame memory ------------------------------------------------------------------------------


def rss(pid: int) -> int:
    """The resident memory of a process, in bytes (``VmRSS`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def queued_bytes(sock: socket.socket) -> int:
    """Bytes of this connection that the kernel holds, sent by the client and not yet read
    by the server (both ends' queues in /proc/net/tcp): 0 once the server read them all."""
    ends = {sock.getsockname()[1], sock.getpeername()[1]}
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
        if {local, remote} == ends:
            tx, rx = (int(n, 16) for n in fields[4].split(":"))
            total += tx + rx
    return total


def stall(sock: socket.socket, body: memoryview, done: queue.Queue, index: int) -> None:
    """Send a frame header and all of its body but the last byte; report when sent."""
    try:
        sock.sendall(protocol.LENGTH.pack(len(body)))
        sock.sendall(body[:-1])
    except OSError:
        return  # closed by the test (or the server) while the frame waited
    done.put(index)


def test_stalled_frames_hold_at_most_the_tenants_frame_memory(dep, servers):
    server = start(dep, servers, "--frame-timeout", "600", "--login-deadline", "600")
    key = login_key(dep, "small")
    wires = [Wire(server.port, timeout=60) for _ in range(STALLED_FRAMES + 1)]
    probe = wires.pop()  # asks for small's figures meanwhile
    body = memoryview(bytes(STALLED_FRAME))
    done: queue.Queue = queue.Queue()
    try:
        for wire in [*wires, probe]:
            assert wire.login("small", key)[0].ok
        acme_is_served(dep, server)  # the baseline: every code path warm
        before = rss(server.process.pid)
        for i, wire in enumerate(wires):
            threading.Thread(target=stall, args=(wire.sock, body, done, i), daemon=True).start()
        admitted = wires[done.get(timeout=120)]  # one frame fits the tenant's budget
        deadline = time.monotonic() + 120
        while queued_bytes(admitted.sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert queued_bytes(admitted.sock) == 0  # the server read all of it
        assert done.empty()  # the others wait, unread
        cap = DEFAULT_TENANT_FRAME_MEMORY
        grown = rss(server.process.pid) - before
        assert STALLED_FRAME // 2 < grown <= cap + cap // 2, grown  # held, and bounded
        acme_is_served(dep, server, batch=1)  # its frames have their own budget
        assert rss(server.process.pid) - before <= cap + cap // 2
        request = protocol.request_frame(probe.next_id, "stats", {"database": "main"})
        fairness = probe.call("stats", {"database": "main"}).result["fairness"]
        # The stalled frame, and the stats request itself while it is answered.
        assert fairness["frame_memory"] == STALLED_FRAME + len(request) - protocol.LENGTH.size
        assert fairness["max_frame_memory"] == cap
    finally:
        for wire in [*wires, probe]:
            wire.close()


def test_a_stalled_frame_times_out(dep, servers):
    server = start(dep, servers, "--frame-timeout", "1")
    stalled = Wire(server.port, timeout=60)
    assert stalled.login("small", login_key(dep, "small"))[0].ok
    done: queue.Queue = queue.Queue()
    body = memoryview(bytes(STALLED_FRAME))
    threading.Thread(target=stall, args=(stalled.sock, body, done, 0), daemon=True).start()
    answer = stalled.recv()  # unasked: the server gave up on the frame and the connection
    assert answer.result == (protocol.BAD_FRAME, "frame timeout")
    assert stalled.closed_by_server()
    stalled.close()
    assert "why=frame_timeout" in server.log.read_text()
    acme_is_served(dep, server)


def test_a_frame_without_room_is_answered_busy_and_the_connection_goes_on(tmp_path):
    """A frame waits for room in the frame memory; at the frame timeout it is read away
    unheld and answered ``busy``: ``ServerBusyError`` in the client, which goes on."""
    key = PrivateKey()
    registry = registry_with(tmp_path / "tenants.json", small=[key])
    server = InProcessServer(MemoryStorage(), Authenticator(registry), frame_timeout=0.5)
    transport = RemoteTransport("127.0.0.1", server.port, tenant="small", login_key=key.secret)
    frames = server.server.frames
    hold = DEFAULT_TENANT_FRAME_MEMORY  # another frame of small's holds all of its budget
    try:
        on_loop(server, frames.try_reserve, "small", hold, hold)
        with pytest.raises(ServerBusyError) as caught:
            transport.ping()
        operational(caught.value, "no room for a frame", f"this tenant's {hold}", "retry later")
        on_loop(server, frames.release, "small", hold)
        assert transport.ping()["authenticated"]  # the same connection, served again
        assert transport.connections_opened == 1
    finally:
        transport.close()
        server.stop()


def on_loop(server: InProcessServer, fn, *args):
    """Call ``fn`` on the server's event loop (frame memory is used on its thread only)."""

    async def call():
        return fn(*args)

    return asyncio.run_coroutine_threadsafe(call(), server.loop).result(5)


# -- request rate ------------------------------------------------------------------------------


def test_a_tenant_over_its_request_rate_is_refused_and_others_are_not(dep, servers):
    TenantRegistry(dep.tenants).set_limits("small", rate=2, burst=5)
    server = start(dep, servers)
    wire = Wire(server.port)
    assert wire.login("small", login_key(dep, "small"))[0].ok
    sent = 40
    began = time.monotonic()
    ids = [wire.send("get_root", {"database": "main"}) for _ in range(sent)]
    answers = [wire.recv() for _ in ids]
    elapsed = time.monotonic() - began
    served = [answer for answer in answers if answer.ok]
    refused = [answer.result for answer in answers if not answer.ok]
    assert 5 <= len(served) <= 5 + 2 * elapsed + 1  # the burst, then the rate
    assert {code for code, _ in refused} == {protocol.RATE_LIMITED}
    assert "request rate of 2 a second (burst 5); retry in" in refused[0][1]
    wire.close()
    acme_is_served(dep, server)  # acme has no rate of its own, nor the server a default
    with pytest.raises(RateLimitedError) as caught, dep.open(server, "small") as db:
        for _ in range(sent):
            db.read_root()
    operational(caught.value, "request rate", "retry later")


def test_stats_shows_each_tenants_limits(dep, servers, capsys):
    own = {
        "max_connections": 3,
        "max_frame_memory": 2 * DEFAULT_TENANT_FRAME_MEMORY,
        "max_login_failures": 4,
    }
    TenantRegistry(dep.tenants).set_limits("small", rate=2, burst=None, **own)
    with dep.open(start(dep, servers)) as db:  # a store to read
        db.add(*employees(1, random.Random(0)))
    store = f"sqlite:///{dep.tmp}/blobs.zdb"
    assert cli_main(["stats", "--storage", store, "--tenants", str(dep.tenants), "--json"]) == 0
    report = {entry["tenant"]: entry for entry in json.loads(capsys.readouterr().out)["tenants"]}
    assert {key: report["small"][key] for key in LIMIT_KEYS} == {
        "max_bytes": "default",
        "max_blobs": MAX_BLOBS,
        "rate": 2,
        "burst": None,
        **own,
    }
    assert all(report["acme"][key] == "default" for key in LIMIT_KEYS)
    assert cli_main(["stats", "--storage", store, "--tenants", str(dep.tenants)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[3:]}
    assert rows["small"][-len(LIMIT_KEYS) :] == [
        str(MAX_BLOBS),
        "default",
        str(own["max_connections"]),
        str(own["max_frame_memory"]),
        "2",
        "unlimited",
        str(own["max_login_failures"]),
    ]
